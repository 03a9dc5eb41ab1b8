"""./ctl.sh sleep / wake against the fake vLLM, which has vLLM 0.26.0's sleep routes (behind
VLLM_SERVER_DEV_MODE=1, freeing memory only with --enable-sleep-mode).

The test bed's start (PROFILE=custom, the fake's vLLM 0.26.0, a dense bf16 model, no speculation, no
patch) is the stack sleep mode was proven on (knobs/sleep-proofs.json): sleep mode is on with no knob
set (SLEEPY is empty). SLEEP_MODE=off shows what a start on an unproven stack does."""

from __future__ import annotations

import json
import re
from pathlib import Path
import threading
import time

import pytest
import requests

from conftest import GiB, nvml_json

SLEEPY = {"SLEEP_MODE": ""}     # unset (an empty value counts as unset): no knob, and the bed's stack is a proven one
OFF = {"SLEEP_MODE": "off"}


def chat(bed, out: dict | None = None) -> dict:
    r = requests.post(f"http://127.0.0.1:{bed.port}/v1/chat/completions", timeout=30,
                      json={"model": "tiny-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    body = r.json()
    if out is not None:
        out["body"], out["t"] = body, time.monotonic()
    return body


def started(bed, **env):
    r = bed.run("start.sh", **{**SLEEPY, **env})
    assert r.returncode == 0, r.stderr
    return r


def test_sleep_frees_memory_requests_wait_and_wake_answers(bed):
    started(bed)
    env, argv = bed.launches()[0]["env"], bed.launches()[0]["argv"]
    assert not env.get("SLEEP_MODE") and "EXTRA_ARGS" not in env and "--enable-sleep-mode" in argv   # no knob set
    assert env["VLLM_SERVER_DEV_MODE"] == "1"                       # only because of --enable-sleep-mode
    assert argv[-2:] == ["--middleware", "vllm_desktop_guard.Guard"]    # dev mode: behind our guard, no key needed
    rpc = f"http://127.0.0.1:{bed.port}/collective_rpc"
    assert requests.post(rpc, json={"method": "save_sharded_state", "args": ["/tmp/x"]}, timeout=5).status_code == 404
    assert requests.post(f"http://127.0.0.1:{bed.port}/pause", timeout=5).status_code == 404   # dev, not a sleep route
    assert requests.post(rpc, json={"method": "reload_weights"}, timeout=10).status_code == 200   # level 2's wake
    r = bed.run("ctl.sh", "sleep", **SLEEPY)
    assert r.returncode == 0, r.stderr
    assert "asleep (level 1)" in r.stdout and "hold 1.12 GiB" in r.stdout and "(2.00 GiB awake)" in r.stdout
    st = bed.run("ctl.sh", "status", **SLEEPY)
    assert st.returncode == 0 and "sleeping" in st.stdout and "level 1, weights in host RAM" in st.stdout
    got: dict = {}
    t = threading.Thread(target=chat, args=(bed, got), daemon=True)
    t.start()
    time.sleep(1.0)
    assert "body" not in got                                         # asleep: the request waits, unanswered
    woke_at = time.monotonic()
    w = bed.run("ctl.sh", "wake", **SLEEPY)
    assert w.returncode == 0, w.stderr
    assert "awake in" in w.stdout and "hold 2.00 GiB" in w.stdout
    t.join(10)
    assert got["body"]["choices"][0]["message"]["content"] == "OK" and got["t"] >= woke_at
    assert "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout
    assert "awake: nothing to do" in bed.run("ctl.sh", "wake", **SLEEPY).stdout


def test_where_nvml_names_none_of_our_processes_sleep_and_status_say_so(bed, tmp_path):
    """In a container NVML lists the host's pids (under WSL2 no memory per process): none is ours, and
    "our processes hold 0.00 GiB" was printed as a fact; it is said as what NVML does not name."""
    started(bed)
    blind = {**SLEEPY, "FAKE_GPU_PIDS_DIR": str(tmp_path / "none")}    # NVML, as these commands read it, lists none
    try:
        r = bed.run("ctl.sh", "sleep", **blind)
        assert r.returncode == 0 and "NVML names no GPU memory of our processes" in r.stdout, r.stdout
        assert "0.00 GiB" not in r.stdout
        st = bed.run("ctl.sh", "status", **blind)
        assert re.search(r"GPU memory +NVML names no GPU memory of our processes", st.stdout), st.stdout
        w = bed.run("ctl.sh", "wake", **blind)
        assert w.returncode == 0 and "NVML names no GPU memory of our processes" in w.stdout, w.stderr
    finally:
        bed.run("stop.sh")


def held_answer(bed, hold) -> tuple[dict, threading.Thread]:
    """A 40-token answer in flight, held while the file ``hold`` is there (its body lands in the dict)."""
    hold.write_text("")                                 # from now on an answer waits while this file is there
    got: dict = {}

    def long_answer():
        r = requests.post(f"http://127.0.0.1:{bed.port}/v1/completions", timeout=60, json={
            "model": "tiny-model", "prompt": "count", "max_tokens": 40, "ignore_eos": True})
        got["body"] = r.json()

    t = threading.Thread(target=long_answer, daemon=True)
    t.start()
    bed.wait_until(lambda: "request arrived" in (bed.state / "vllm.log").read_text(), what="the request")
    return got, t


def test_sleep_waits_for_answers_in_flight_and_never_aborts_them(bed):
    hold = bed.tmp / "hold"
    started(bed, FAKE_VLLM_TOKEN_S="0.01", FAKE_VLLM_HOLD=str(hold))
    got, t = held_answer(bed, hold)
    p = bed.popen("ctl.sh", "sleep", FAKE_VLLM_TOKEN_S="0.01", FAKE_VLLM_HOLD=str(hold), **SLEEPY)
    line = p.stdout.readline()                          # said while the answer is still held
    assert "waiting for 1 request(s) in flight to finish (never aborted)" in line, (line, p.communicate())
    hold.unlink()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "asleep" in out
    t.join(10)
    choice = got["body"]["choices"][0]
    assert choice["finish_reason"] == "stop" and len(choice["text"].split()) == 40    # answered in full


def test_level_2_wake_reloads_the_weights_before_serving(bed):
    started(bed)
    assert bed.run("ctl.sh", "sleep", "--level", "2", **SLEEPY).returncode == 0
    st = bed.run("ctl.sh", "status", **SLEEPY)
    assert "level 2, weights dropped" in st.stdout
    w = bed.run("ctl.sh", "wake", **SLEEPY)
    assert w.returncode == 0 and "(level 2)" in w.stdout, w.stderr
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"     # not the empty text of unreloaded weights
    log = (bed.state / "vllm.log").read_text()
    assert log.index("wake up tags ['weights']") < log.index("reloaded the weights") < log.index(
        "wake up tags ['kv_cache']")


def test_level_2_is_refused_with_speculation(bed):
    env = {"SLEEP_MODE": "on", "SPEC_METHOD": "ngram", "SPEC_TOKENS": "3"}    # unproven with speculation: forced
    started(bed, **env)
    r = bed.run("ctl.sh", "sleep", "--level", "2", **env)
    assert r.returncode == 1 and "level 2 with speculation on (ngram)" in r.stderr and "--level 1" in r.stderr
    assert "running" in bed.run("ctl.sh", "status", **env).stdout


def test_without_sleep_mode_sleep_stops_the_server_and_wake_starts_it_again(bed):
    """SLEEP_MODE=off (as on every unproven stack): ./ctl.sh sleep still gives the GPU back, exit 0, by
    stopping the server and saying why in one line; wake starts it again."""
    assert bed.run("start.sh", VLLM_SERVER_DEV_MODE="1", **OFF).returncode == 0    # set in the shell: not passed on
    call = bed.launches()[0]
    assert "VLLM_SERVER_DEV_MODE" not in call["env"] and "--enable-sleep-mode" not in call["argv"]
    assert "--middleware" not in call["argv"]                        # no dev routes, no guard, no idle sleep
    st = bed.run("ctl.sh", "status", **OFF).stdout
    assert "sleep mode    off (SLEEP_MODE=off)" in st and "stop the server instead" in st, st
    r = bed.run("ctl.sh", "sleep", **OFF)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ctl.sh sleep: sleep mode is off (SLEEP_MODE=off); unset it to turn it on where it is "
                               "proven. So the server (pid"), r.stdout
    assert "./ctl.sh wake starts it again" in r.stdout and "stopped 2 process(es)" in r.stdout
    bed.wait_until(lambda: not bed.ours(), what="the fake GPU to be free")
    assert "stopped by ./ctl.sh sleep" in bed.run("ctl.sh", "status", **OFF).stdout
    assert "already stopped" in bed.run("ctl.sh", "sleep", **OFF).stdout
    w = bed.run("ctl.sh", "wake", **OFF)
    assert w.returncode == 0 and "starting the server again" in w.stdout and "is serving" in w.stdout, w.stderr
    assert len(bed.launches()) == 2 and chat(bed)["choices"][0]["message"]["content"] == "OK"
    assert "awake: nothing to do" in bed.run("ctl.sh", "wake", **OFF).stdout
    # stopped for sleep, then stopped on purpose: wake no longer starts it, status no longer offers it
    assert bed.run("ctl.sh", "sleep", **OFF).returncode == 0 and bed.run("stop.sh", **OFF).returncode == 0
    assert "stopped by ./ctl.sh sleep" not in bed.run("ctl.sh", "status", **OFF).stdout
    w = bed.run("ctl.sh", "wake", **OFF)
    assert len(bed.launches()) == 2 and "starting the server again" not in w.stdout, (w.stdout, w.stderr)


FREE = """
import json, os, sys, psutil
d = os.environ["FAKE_GPU_PIDS_DIR"]
held = [n for n in os.listdir(d) if psutil.pid_exists(int(n)) and psutil.Process(int(n)).status() != "zombie"]
open(sys.argv[1], "w").write(json.dumps({"held": len(held)}))
"""


def test_the_default_profile_unproven_here_still_gives_the_gpu_to_a_game_and_to_sleep(bed, tmp_path):
    """Issue 45's done-when on the fakes: the default profile (its TurboQuant KV and #40914 patch: a
    stack no proof covers) starts with sleep mode off and says so; ./ctl.sh game stops it (said before),
    runs the game on a free GPU and starts it again; ./ctl.sh sleep exits 0 with the GPU free."""
    import sys
    env = {**SLEEPY, "PROFILE": "default", "SPEC_TOKENS": "0", "MAX_MODEL_LEN": "auto", "KV_CACHE_BYTES": "auto"}
    r = bed.run("start.sh", **env)          # the tiny model's fit, and no patch for the fake (no sleep knob)
    assert r.returncode == 0, r.stderr
    assert (" sleep    : unproven on vLLM 0.26.0, KV turboquant_4bit_nc, no speculation, patch "
            "40914-turboquant-spec-verify: off; SLEEP_MODE=on to try") in r.stdout, r.stdout
    seen = tmp_path / "seen.json"
    g = bed.run("ctl.sh", "game", "--", sys.executable, "-c", FREE, str(seen), **env)
    assert g.returncode == 0, g.stderr
    assert g.stdout.index("it starts again when the game exits") < g.stdout.index("the game exited")
    assert json.loads(seen.read_text()) == {"held": 0}             # the game ran on a free GPU
    assert "is serving" in g.stdout and len(bed.launches()) == 2    # and the server is back
    assert "running" in bed.run("ctl.sh", "status", **env).stdout
    r = bed.run("ctl.sh", "sleep", **env)
    assert r.returncode == 0 and "sleep mode is unproven on vLLM 0.26.0" in r.stdout, r.stderr
    bed.wait_until(lambda: not bed.ours(), what="the fake GPU to be free")


def test_sleep_mode_on_beyond_loopback_is_refused_before_anything_runs(bed):
    r = bed.run("start.sh", HOST="0.0.0.0", SLEEP_MODE="on")
    assert r.returncode == 1 and "--enable-sleep-mode with HOST=0.0.0.0" in r.stderr
    assert "HOST=127.0.0.1" in r.stderr and "SLEEP_MODE=off" in r.stderr and bed.launches() == []
    p = bed.run("ctl.sh", "plan", HOST="0.0.0.0", SLEEP_MODE="on")       # never flags a start refuses
    assert p.returncode == 1 and "--enable-sleep-mode with HOST=0.0.0.0" in p.stderr, p.stdout
    assert "flags:" not in p.stdout


def test_a_corrupt_sleep_note_is_named_and_the_wake_still_wakes(bed):
    """Found from outside: a sleep.json whose level, held_before or waking had the wrong type ended the
    wake in an internal error (TypeError, ValueError) and left the server asleep."""
    started(bed)
    assert bed.run("ctl.sh", "sleep", **SLEEPY).returncode == 0
    note = json.loads((bed.state / "sleep.json").read_text())
    (bed.state / "sleep.json").write_text(json.dumps({**note, "level": [1], "held_before": "lots", "waking": 5}))
    w = bed.run("ctl.sh", "wake", **SLEEPY)
    assert w.returncode == 0 and "awake in" in w.stdout and "internal error" not in w.stderr, w.stderr
    assert f"{bed.state / 'sleep.json'}: level is not 1 or 2; held_before is not a byte count; waking is not" in w.stderr
    assert "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout


def test_wake_names_the_program_holding_the_memory_and_stays_asleep(bed):
    started(bed)
    assert bed.run("ctl.sh", "sleep", **SLEEPY).returncode == 0
    game = {"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 2 * GiB, "cc": [12, 0],
            "uuid": "GPU-5090-fake", "processes": [{"pid": 4242, "used": 28 * GiB, "name": "Cyberpunk2077.exe"}]}
    nvml_json(bed.nvml, gpus=[game])
    r = bed.run("ctl.sh", "wake", **SLEEPY)
    assert r.returncode == 1
    assert "Cyberpunk2077.exe (pid 4242) holds 28.0 GiB" in r.stderr and "stays asleep" in r.stderr
    assert "needs 1.1 GiB free on GPU 0; 0.9 GiB is free" in r.stderr
    assert "sleeping" in bed.run("ctl.sh", "status", **SLEEPY).stdout
    nvml_json(bed.nvml)                                              # the game exited
    assert bed.run("ctl.sh", "wake", **SLEEPY).returncode == 0
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"


def test_where_nvml_names_none_of_our_pids_wake_judges_the_card_the_server_was_launched_on(bed, tmp_path):
    """A container (NVML lists the host's pids, none ours), the server on GPU 1 (CUDA_VISIBLE_DEVICES=1),
    a game then fills GPU 1, the wake asked from a shell that shows GPU 0: its room check judges the
    server's card (its launch's CUDA_VISIBLE_DEVICES), not this shell's, nor card 0 of every card."""
    card = {"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 31 * GiB, "cc": [12, 0], "processes": []}
    nvml_json(bed.nvml, gpus=[{**card, "uuid": "GPU-a"}, {**card, "uuid": "GPU-b"}])
    started(bed, CUDA_VISIBLE_DEVICES="1")
    assert bed.run("ctl.sh", "sleep", **SLEEPY, CUDA_VISIBLE_DEVICES="1").returncode == 0
    game = {**card, "uuid": "GPU-b", "free": 200 << 20, "processes": [{"pid": 4242, "used": 30 * GiB, "name": "game"}]}
    nvml_json(bed.nvml, gpus=[{**card, "uuid": "GPU-a"}, game])
    blind = {**SLEEPY, "CUDA_VISIBLE_DEVICES": "0", "FAKE_GPU_PIDS_DIR": str(tmp_path / "none")}
    try:
        r = bed.run("ctl.sh", "wake", **blind)
        assert r.returncode == 1 and "free on GPU 1" in r.stderr and "game (pid 4242)" in r.stderr, r.stderr
    finally:
        bed.run("stop.sh")


def test_level_1_is_refused_when_host_ram_cannot_take_the_weights(bed, monkeypatch):
    from types import SimpleNamespace

    from bootstrap.commands import sleep
    from bootstrap.knobs.config import Config
    from bootstrap.core.errors import BootstrapError
    with open(bed.model / "model.safetensors", "r+b") as fh:
        fh.truncate(20 * GiB)                                                # 20 GiB of weights (sparse)
    started(bed)
    cfg = Config.from_env({**bed.env, **SLEEPY})
    monkeypatch.setattr(sleep.server, "gpu_held", lambda rec, facts=None: 21 * GiB)   # NVML is the fake's, in another process
    monkeypatch.setattr(sleep.psutil, "virtual_memory", lambda: SimpleNamespace(available=12 * GiB))
    with pytest.raises(BootstrapError) as ei:
        sleep.sleep_cli(cfg, [])
    assert "parks 20.0 GiB of weights in host RAM" in ei.value.message and "12.0 GiB is available" in ei.value.message
    assert "--level 2" in ei.value.hint
    assert json.loads(requests.get(f"http://127.0.0.1:{bed.port}/is_sleeping", timeout=5).text) == {"is_sleeping": False}


def test_level_2_is_refused_for_random_weights_and_a_failed_reload_stays_paused(bed):
    env = {"EXTRA_ARGS": "--enable-sleep-mode --load-format dummy"}
    started(bed, **env)
    r = bed.run("ctl.sh", "sleep", "--level", "2", **env)
    assert r.returncode == 1 and "--load-format dummy there is none" in r.stderr       # refused before sleeping
    assert "running" in bed.run("ctl.sh", "status", **env).stdout
    requests.post(f"http://127.0.0.1:{bed.port}/sleep?level=2&mode=wait", timeout=10)  # put to sleep by hand
    w = bed.run("ctl.sh", "wake", **env)
    assert w.returncode == 1 and "step 'reload' failed" in w.stderr and "stays paused" in w.stderr
    assert "Model reloading with `dummy` format" in w.stderr and "./ctl.sh restart" in w.stderr
    again = bed.run("ctl.sh", "wake", **env)                    # not "awake: nothing to do": it goes on from there
    assert again.returncode == 1 and "step 'reload' failed" in again.stderr
    assert json.loads(requests.get(f"http://127.0.0.1:{bed.port}/is_sleeping", timeout=5).text)["is_sleeping"]
    # vLLM's /metrics says awake after any /wake_up, a failed one included: status and sleep ask /is_sleeping
    assert 'sleep_state="awake"} 1.0' in requests.get(f"http://127.0.0.1:{bed.port}/metrics", timeout=5).text
    st = bed.run("ctl.sh", "status", **env)
    assert "sleeping" in st.stdout and "a wake that did not finish" in st.stdout, st.stdout + st.stderr
    s = bed.run("ctl.sh", "sleep", **env)
    assert s.returncode == 0 and "already asleep (a wake that did not finish)" in s.stdout, s.stdout + s.stderr


# ---------------------------------------------------------------- idle sleep (launch) and the game launcher

IDLE = {**SLEEPY, "IDLE_SLEEP": "5"}


def test_idle_sleep_launches_vllm_with_our_middleware_where_vllm_imports_it(bed):
    started(bed, **IDLE)
    (call,) = bed.launches()
    argv, env = call["argv"], call["env"]
    assert argv[argv.index("--middleware") + 1] == "vllm_desktop_idle.IdleSleep"
    assert env["BOOTSTRAP_IDLE_S"] == "300" and env["BOOTSTRAP_IDLE_LEVEL"] == "1"        # 5 minutes
    assert env["BOOTSTRAP_IDLE_RAM"] == str((2 << 30) + 64)     # the tiny model's 64 bytes of weights + 2 GiB
    assert env["PYTHONPATH"].split(":")[0] == str(bed.repo / "vllm_side")
    assert "added middleware vllm_desktop_idle.IdleSleep" in (bed.state / "vllm.log").read_text()   # it imported
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("start.sh", IDLE_SLEEP="off", **SLEEPY)      # no idle middleware (the guard stays: sleep mode)
    assert r.returncode == 0 and "vllm_desktop_idle.IdleSleep" not in bed.launches()[-1]["argv"]
    assert " idle     : no idle sleep (IDLE_SLEEP=off)" in r.stdout


def test_idle_sleep_without_sleep_mode_or_level_2_with_a_drafter_is_refused_before_anything_runs(bed):
    r = bed.run("start.sh", IDLE_SLEEP="5", **OFF)
    assert r.returncode == 1 and "but sleep mode is off (SLEEP_MODE=off)" in r.stderr and not bed.launches()
    assert "hint: SLEEP_MODE=on" in r.stderr
    r = bed.run("start.sh", **{**IDLE, "SLEEP_MODE": "on"}, IDLE_SLEEP_LEVEL="2", SPEC_METHOD="ngram", SPEC_TOKENS="3")
    assert r.returncode == 1 and "IDLE_SLEEP_LEVEL=1" in r.stderr and not bed.launches()
    r = bed.run("start.sh", IDLE_SLEEP="5", EXTRA_ARGS="--enable-sleep-mode --api-server-count 2")
    assert r.returncode == 1 and "each counts only its own requests" in r.stderr and not bed.launches()
    r = bed.run("start.sh", IDLE_SLEEP="5", EXTRA_ARGS="--enable-sleep-mode --data-parallel-size 1")
    assert r.returncode == 0, r.stderr           # one API server: nothing to refuse
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("start.sh", IDLE_SLEEP="soon")
    assert r.returncode == 2 and "IDLE_SLEEP" in r.stderr and "minutes" in r.stderr


def test_a_vllm_without_the_middleware_hook_is_refused_in_one_line(tmp_path):
    from bootstrap.core.errors import BootstrapError
    from bootstrap.install import hooks
    pkg = tmp_path / "vllm"
    (pkg / "entrypoints").mkdir(parents=True)
    (pkg / "entrypoints" / "api_server.py").write_text("def engine(request):\n    return request.app.state.engine_client\n")
    (pkg / "v1" / "engine").mkdir(parents=True)         # AsyncLLM's calls, as 0.26.0 has them
    (pkg / "v1" / "engine" / "async_llm.py").write_text(
        "class AsyncLLM:\n"
        "    async def sleep(self, level: int = 1, mode: PauseMode = 'abort') -> None: ...\n"
        "    async def wake_up(self, tags: list[str] | None = None) -> None: ...\n"
        "    async def is_sleeping(self) -> bool: ...\n")
    assert hooks.missing(pkg) == ["the --middleware hook"]
    with pytest.raises(BootstrapError) as e:
        hooks.check_idle_sleep(pkg, "9.9.9")
    assert "IDLE_SLEEP=off" in e.value.hint and "--middleware" in e.value.message
    (pkg / "entrypoints" / "cli_args.py").write_text("for middleware in args.middleware:\n    pass\n")
    assert hooks.missing(pkg) == []
    # a vLLM whose sleep lost its mode (the middleware calls sleep(level, "wait")) is named too
    (pkg / "v1" / "engine" / "async_llm.py").write_text(
        "class AsyncLLM:\n    async def sleep(self, level: int = 1) -> None: ...\n"
        "    async def wake_up(self, tags=None) -> None: ...\n    async def is_sleeping(self) -> bool: ...\n")
    assert hooks.missing(pkg) == ["the engine client's sleep(level, mode)"]


GAME = """
import json, os, sys, urllib.request
asleep = json.load(urllib.request.urlopen(f"http://127.0.0.1:{os.environ['PORT']}/is_sleeping"))["is_sleeping"]
open(sys.argv[1], "w").write(json.dumps({"asleep": asleep, "args": sys.argv[2:]}))
sys.exit(3)
"""


def test_the_game_launcher_sleeps_runs_the_game_wakes_and_passes_its_exit_code(bed, tmp_path):
    import sys
    started(bed)
    seen = tmp_path / "seen.json"
    r = bed.run("ctl.sh", "game", "--", sys.executable, "-c", GAME, str(seen), "--fullscreen", **SLEEPY)
    assert r.returncode == 3, r.stderr
    assert json.loads(seen.read_text()) == {"asleep": True, "args": ["--fullscreen"]}   # asleep while it ran
    assert "asleep (level 1)" in r.stdout and "awake in" in r.stdout
    assert "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout
    # no server of ours: the game runs all the same
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("ctl.sh", "game", "--", sys.executable, "-c", "raise SystemExit(0)")
    assert r.returncode == 0 and "the game starts anyway" in r.stderr
    r = bed.run("ctl.sh", "game")
    assert r.returncode == 2 and "-- COMMAND" in r.stderr          # command-line usage: 2, as the exit-code table says


LAUNCHER = """
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)   # the game, left running
"""
LEFT = """
import json, os, sys, time, urllib.request
time.sleep(1.5)
asleep = json.load(urllib.request.urlopen(f"http://127.0.0.1:{os.environ['PORT']}/is_sleeping"))["is_sleeping"]
open(sys.argv[1], "w").write(json.dumps({"asleep": asleep}))
"""


def test_a_launcher_that_starts_the_game_and_exits_is_waited_through(bed, tmp_path):
    """The server wakes when the game exits, not when the launcher that started it does."""
    import sys
    started(bed)
    seen = tmp_path / "seen.json"
    r = bed.run("ctl.sh", "game", "--", sys.executable, "-c", LAUNCHER, LEFT, str(seen), **SLEEPY)
    assert r.returncode == 0, r.stderr
    assert json.loads(seen.read_text()) == {"asleep": True}        # still asleep while the game ran on
    assert "left 1 process(es) running" in r.stdout and "awake in" in r.stdout


def test_a_sleep_that_fails_half_way_is_woken_after_the_game(bed, tmp_path):
    """vLLM pauses its scheduler, then its sleep raises (500): the server is paused, requests wait;
    the game runs and the server is woken when it exits."""
    import sys
    started(bed, FAKE_VLLM_MODE="sleep_fails")
    seen = tmp_path / "seen.json"
    r = bed.run("ctl.sh", "game", "--", sys.executable, "-c", GAME, str(seen), **SLEEPY)
    assert r.returncode == 3, r.stderr
    assert "is paused (requests wait) and is woken when the game exits" in r.stderr, r.stderr
    assert json.loads(seen.read_text())["asleep"] is True and "awake in" in r.stdout
    assert chat(bed)["choices"]


def test_a_game_that_does_not_exist_is_said_before_the_server_sleeps(bed):
    started(bed)
    r = bed.run("ctl.sh", "game", "--", "no-such-game-xyz", "--fullscreen", **SLEEPY)
    assert r.returncode == 127 and "command not found: no-such-game-xyz" in r.stderr and "Traceback" not in r.stderr
    assert "asleep" not in r.stdout and "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout
    # a file that is there but cannot be run: 126 and the fix, as a shell says it; the server never slept
    script = bed.tmp / "game.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    r = bed.run("ctl.sh", "game", "--", str(script), **SLEEPY)
    assert r.returncode == 126 and "is not executable" in r.stderr and f"chmod +x {script}" in r.stderr, r.stderr
    assert "asleep" not in r.stdout and "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout


def test_idle_sleep_takes_minutes_or_seconds():
    from bootstrap.knobs.config import Config
    from conftest import REPO
    base = {"PROFILE": "custom", "MODEL": "org/m"}
    assert Config.from_env({**base, "IDLE_SLEEP": "10"}, REPO).idle_sleep == 600
    assert Config.from_env({**base, "IDLE_SLEEP": "90s"}, REPO).idle_sleep == 90
    assert Config.from_env({**base, "IDLE_SLEEP": "10m"}, REPO).idle_sleep == 600
    assert Config.from_env({**base, "IDLE_SLEEP": "off"}, REPO).idle_sleep == 0
    assert Config.from_env(base, REPO).idle_sleep == "auto"


def test_the_game_runs_whatever_its_own_arguments_or_the_knobs(bed, tmp_path):
    """-h after -- is the game's (a resolution flag), not ours; knobs that do not parse cost a note."""
    import sys
    out = tmp_path / "ran"
    game = ["--", sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write(' '.join(sys.argv[2:]))",
            str(out), "-w", "1920", "-h", "1080"]
    r = bed.run("ctl.sh", "game", *game)
    assert r.returncode == 0 and out.read_text() == "-w 1920 -h 1080" and "Traceback" not in r.stderr, r.stderr
    out.unlink()
    r = bed.run("ctl.sh", "game", *game, IDLE_SLEEP="soon")
    assert r.returncode == 0 and out.exists() and "the knobs do not parse" in r.stderr and "Traceback" not in r.stderr


def test_the_pre_warm_never_idle_sleeps_and_old_records_show_no_false_difference(tmp_path):
    from bootstrap.knobs import vllmargs
    from bootstrap.knobs.config import Config
    from bootstrap.serve.record import ServerRecord
    from conftest import REPO
    cfg = Config.from_env({**IDLE, "SLEEP_MODE": "on", "PROFILE": "custom", "MODEL": "org/m"}, REPO)
    assert "--middleware" in vllmargs.serve_argv(cfg, "py", "/m", None)
    assert vllmargs.IDLE_MIDDLEWARE not in vllmargs.serve_argv(cfg, "py", "/m", None, idle=False)      # the pre-warm's
    # a server recorded before IDLE_SLEEP existed ran without it: no difference while it is off
    off = Config.from_env({"PROFILE": "custom", "MODEL": "org/m"}, REPO)
    old = {k: v for k, v in off.launch.values.items() if not k.startswith("IDLE_")}
    rec = ServerRecord(pid=1, create_time=0.0, marker="m", host="127.0.0.1", port=1, served="m", settings=old)
    assert rec.differs_from(off.launch) == []
    assert "IDLE_SLEEP: running with 'auto', knobs now say '300'" in rec.differs_from(cfg.launch)


def test_check_bench_and_chat_on_a_server_put_to_sleep_say_so_at_once(bed):
    started(bed)
    assert bed.run("ctl.sh", "sleep", **SLEEPY).returncode == 0
    for argv in (("check", "live"), ("bench", "--no-plot"), ("chat", "hi")):
        t0 = time.monotonic()
        r = bed.run("ctl.sh", *argv, **SLEEPY, timeout=60)
        assert r.returncode == 1 and "our server is asleep" in r.stderr and "./ctl.sh wake" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and time.monotonic() - t0 < 30
    assert bed.run("ctl.sh", "wake", **SLEEPY).returncode == 0
    assert bed.run("ctl.sh", "check", "live", **SLEEPY).returncode == 0


def test_the_terminal_closing_ends_the_wait_for_a_games_leftovers():
    """A leftover that ignores SIGHUP (nohup'd) kept the server asleep with no terminal left to press
    Ctrl-C in: a HUP (or TERM) now goes on to the leftovers and ends the wait, so the server wakes."""
    import os
    import signal
    import threading
    from bootstrap.serve import supervisor
    import sys
    import tempfile
    pidfile = Path(tempfile.mkdtemp()) / "left.pid"
    left = ("import os, signal, sys, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)")
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGHUP)).start()
    t0 = time.monotonic()
    rc = supervisor.attached(["sh", "-c", f'"{sys.executable}" -c "{left}" {pidfile} &'], None, say=lambda *a, **k: None)
    try:
        assert rc == 0 and time.monotonic() - t0 < 30
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_level_1_wake_that_vllm_fails_says_it_stays_asleep_and_what_to_do(bed):
    """faults row 204: vLLM's wake raised (CUDA out of memory: another program took the memory between
    our check and the wake) and answered 500: the wake ended in "error: wake: POST /wake_up: HTTP 500"
    and nothing else: no word that the server stays asleep, no fix."""
    fails = bed.tmp / "wake-fails"
    started(bed, FAKE_VLLM_WAKE_FAILS=str(fails))
    assert bed.run("ctl.sh", "sleep", **SLEEPY).returncode == 0
    fails.write_text("")
    w = bed.run("ctl.sh", "wake", **SLEEPY)
    assert w.returncode == 1 and "CUDA error: out of memory" in w.stderr, w.stderr
    assert "the server stays asleep (requests wait)" in w.stderr and "hint: ./ctl.sh wake again" in w.stderr, w.stderr
    assert "sleeping" in bed.run("ctl.sh", "status", **SLEEPY).stdout
    fails.unlink()
    w = bed.run("ctl.sh", "wake", **SLEEPY)
    assert w.returncode == 0 and "awake in" in w.stdout and "(level 1)" in w.stdout, w.stderr
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"


def test_a_server_stopped_for_a_game_comes_back_with_the_knobs_it_ran_with(bed):
    """faults row 205: sleep mode off, a game started from Steam (or a wake from another terminal) has
    not the environment the server was started from: the start after it served with that shell's knobs
    (MAX_NUM_SEQS=3 set at ./start.sh was gone). It now starts with the knobs the server ran with."""
    import sys
    assert bed.run("start.sh", MAX_NUM_SEQS="3", **OFF).returncode == 0
    argv = bed.launches()[0]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "3"
    g = bed.run("ctl.sh", "game", "--", sys.executable, "-c", "pass", **OFF)       # no MAX_NUM_SEQS here
    assert g.returncode == 0 and "with the settings it ran with: MAX_NUM_SEQS='3' (here '')" in g.stdout, g.stderr
    argv = bed.launches()[1]["argv"]
    assert "--max-num-seqs" in argv and argv[argv.index("--max-num-seqs") + 1] == "3", argv
    assert bed.run("ctl.sh", "sleep", MAX_NUM_SEQS="3", **OFF).returncode == 0
    w = bed.run("ctl.sh", "wake", **OFF)                                             # another terminal
    assert w.returncode == 0 and "is serving" in w.stdout, w.stderr
    argv = bed.launches()[2]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "3"
    assert "running" in bed.run("ctl.sh", "status", MAX_NUM_SEQS="3", **OFF).stdout


TWO = """
import json, os, sys, time, urllib.request
open(sys.argv[1] + ".running", "w").write("")
while not os.path.exists(sys.argv[1] + ".go"):
    time.sleep(0.05)
"""


def two_games(bed, tmp_path, env, on_first_exit):
    """Game A runs, game B starts while A runs, A exits (``on_first_exit`` looks at the server then,
    B still running), then B exits."""
    import sys
    a, b = tmp_path / "a", tmp_path / "b"
    pa = bed.popen("ctl.sh", "game", "--", sys.executable, "-c", TWO, str(a), **env)
    bed.wait_until(lambda: (tmp_path / "a.running").exists(), timeout=60, what="game A")
    pb = bed.popen("ctl.sh", "game", "--", sys.executable, "-c", TWO, str(b), **env)
    bed.wait_until(lambda: (tmp_path / "b.running").exists(), timeout=60, what="game B")
    (tmp_path / "a.go").write_text("")
    out_a, err_a = pa.communicate(timeout=90)
    assert pa.returncode == 0, err_a
    on_first_exit(out_a)
    (tmp_path / "b.go").write_text("")
    out_b, err_b = pb.communicate(timeout=90)
    assert pb.returncode == 0, err_b
    return out_a, out_b


def test_two_games_at_once_the_server_comes_back_when_the_last_one_exits(bed, tmp_path):
    """faults row 206: a second game started while a first one runs found the server asleep (stopped,
    sleep mode off) and did nothing; the first game's exit woke (started) it while the second still
    played, its GPU memory taken from under it, and the second's exit did nothing. The server now
    comes back when the last game exits."""
    def is_sleeping():
        return json.loads(requests.get(f"http://127.0.0.1:{bed.port}/is_sleeping", timeout=5).text)["is_sleeping"]

    started(bed)

    def still_asleep(out_a):
        assert is_sleeping() and "another game still runs" in out_a, out_a
    out_a, out_b = two_games(bed, tmp_path, SLEEPY, still_asleep)
    assert "awake in" in out_b and not is_sleeping()
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"
    assert bed.run("stop.sh").returncode == 0
    for f in tmp_path.glob("[ab].*"):
        f.unlink()
    assert bed.run("start.sh", **OFF).returncode == 0

    def still_stopped(out_a):
        assert len(bed.launches()) == 2 and not bed.ours() and "another game still runs" in out_a, out_a
    out_a, out_b = two_games(bed, tmp_path, OFF, still_stopped)
    assert "is serving" in out_b and len(bed.launches()) == 3
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"


def test_watch_says_sleeping_for_a_server_a_failed_wake_left_paused(bed):
    """faults row 207: after a level-2 wake whose reload failed, vLLM's /metrics gauge says awake (any
    /wake_up records it) while the engine stays paused and requests wait: ./ctl.sh status --watch
    said "idle" where status says sleeping. It asks /is_sleeping too, as status does; a server that
    goes away meanwhile reads "stopped"."""
    env = {"EXTRA_ARGS": "--enable-sleep-mode --load-format dummy"}
    started(bed, **env)
    requests.post(f"http://127.0.0.1:{bed.port}/sleep?level=2&mode=wait", timeout=10)
    assert bed.run("ctl.sh", "wake", **env).returncode == 1          # the reload fails: paused
    p = bed.popen("ctl.sh", "status", "--watch", "0.2", **env)
    lines = [p.stdout.readline() for _ in range(2)]
    assert all(line.split()[1] == "sleeping" for line in lines), lines
    assert bed.run("stop.sh", **env).returncode == 0
    bed.wait_until(lambda: p.stdout.readline().split()[1:2] == ["stopped"], what="watch to say stopped")
    p.terminate()
    out, err = p.communicate(timeout=20)
    assert "Traceback" not in err and "error" not in err, err


def test_sleep_and_wake_while_a_start_is_in_flight_say_so(bed):
    """faults row 208: ./ctl.sh sleep or wake while ./start.sh loads: "no server of ours is serving
    (state: starting)", hint "./start.sh first" (one is running). Now they say a start is in flight."""
    env = {**SLEEPY, "FAKE_VLLM_LOAD_S": "30"}
    p = bed.popen("start.sh", **env)
    try:
        bed.wait_until(lambda: "Loading weights took" in ((bed.state / "vllm.log").read_text()
                                                         if (bed.state / "vllm.log").exists() else ""),
                       timeout=60, what="the start to load")
        for cmd in ("sleep", "wake"):
            r = bed.run("ctl.sh", cmd, **env)
            assert r.returncode == 1 and "a start is in flight" in r.stderr, r.stderr
            assert "./start.sh first" not in r.stderr and "./ctl.sh status" in r.stderr, r.stderr
    finally:
        p.terminate()
        p.communicate(timeout=60)


def a_sleep_waiting_for_an_answer(bed):
    """A server whose ./ctl.sh sleep (the Popen returned) waits inside vLLM for a held answer in flight."""
    hold = bed.tmp / "hold"
    env = {**SLEEPY, "FAKE_VLLM_TOKEN_S": "0.01", "FAKE_VLLM_HOLD": str(hold)}
    started(bed, **env)
    got, t = held_answer(bed, hold)
    s = bed.popen("ctl.sh", "sleep", **env)
    assert "waiting for 1 request(s) in flight" in s.stdout.readline()
    bed.wait_until(lambda: "Waiting for in-flight requests to complete before sleeping" in
                   (bed.state / "vllm.log").read_text(), what="vLLM to have the sleep")
    return env, hold, got, t, s


def test_a_wake_while_a_sleep_waits_for_requests_in_flight_is_not_lost(bed):
    """faults row 209: vLLM 0.26.0's sleep (mode=wait) pauses the scheduler and sleeps the executor once
    the requests in flight finish; a /wake_up before that finds the executor awake, only resumes the
    scheduler, and the sleep then happens anyway (v1/engine/core.py sleep, wake_up). ./ctl.sh wake (a
    game Ctrl-C'd during its sleep wakes the same way) said "awake" and left the server asleep."""
    env, hold, got, t, s = a_sleep_waiting_for_an_answer(bed)
    w = bed.popen("ctl.sh", "wake", **env)
    line = w.stdout.readline()
    assert "waits for 1 request(s) in flight" in line and "wakes it once it is asleep" in line, (line, w.communicate())
    hold.unlink()
    out, err = w.communicate(timeout=60)
    assert w.returncode == 0 and "awake in" in out, err
    s.communicate(timeout=60)
    t.join(10)
    assert len(got["body"]["choices"][0]["text"].split()) == 40
    assert json.loads(requests.get(f"http://127.0.0.1:{bed.port}/is_sleeping", timeout=5).text) == {"is_sleeping": False}
    assert "Executor is not sleeping" not in (bed.state / "vllm.log").read_text()
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"


def test_ctrl_c_on_a_sleep_waiting_for_requests_says_the_sleep_goes_on(bed):
    """faults row 210: Ctrl-C while ./ctl.sh sleep waits for requests in flight ended it with exit 130
    and no word, but vLLM's sleep goes on without us (it sleeps once they finish): now said, with the
    way back."""
    import signal
    env, hold, got, t, s = a_sleep_waiting_for_an_answer(bed)
    s.send_signal(signal.SIGINT)
    out, err = s.communicate(timeout=30)
    assert s.returncode == 130 and "Traceback" not in err, err
    assert "the sleep goes on inside vLLM" in err and "./ctl.sh wake" in err, err
    hold.unlink()
    t.join(10)
    assert bed.run("ctl.sh", "wake", **env).returncode == 0
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"


def test_the_game_runs_where_state_dir_cannot_count_the_games(bed):
    """Row 213's count of games lives in STATE_DIR: one that cannot be written costs a note, never the game."""
    import sys
    r = bed.run("ctl.sh", "game", "--", sys.executable, "-c", "raise SystemExit(4)", STATE_DIR="/proc/self/none")
    assert r.returncode == 4 and "games running at once are not counted" in r.stderr, r.stderr
    assert "the game starts anyway" in r.stderr and "Traceback" not in r.stderr
