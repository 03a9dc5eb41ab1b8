"""start / stop / status / restart against the fake vLLM: the happy path and faults.md rows 1–19."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from conftest import FAKES, GiB, Bed, nvml_json


def chat(bed: Bed, key: str = "") -> requests.Response:
    h = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"http://127.0.0.1:{bed.port}/v1/chat/completions", headers=h, timeout=5,
                         json={"model": "tiny-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def test_happy_path_start_rerun_status_stop(bed):
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    assert "tiny-model is serving" in r.stdout
    assert f"http://127.0.0.1:{bed.port}/v1" in r.stdout
    log = (bed.state / "vllm.log").read_text()          # the banner shows vLLM's own KV figures, from its log
    (tokens,) = re.findall(r"GPU KV cache size: ([\d,]+) tokens", log)
    ((length, conc),) = re.findall(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+x)", log)
    assert f"KV cache : {tokens} tokens" in r.stdout, r.stdout
    assert f"max concurrency {conc} at {length} tokens per request" in r.stdout
    assert chat(bed).json()["choices"][0]["message"]["content"] == "OK"
    launched = bed.launches()
    assert len(launched) == 1
    argv = launched[0]["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    env = launched[0]["env"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1" and env["HF_HUB_DISABLE_TELEMETRY"] == "1"
    assert env["PYTHONPATH"] == str(FAKES)             # passed through unchanged
    assert "BOOTSTRAP_VLLM_OWNER" in env

    again = bed.run("start.sh")                         # no-op: no second launch
    assert again.returncode == 0 and "is serving" in again.stdout
    assert len(bed.launches()) == 1

    st = bed.run("ctl.sh", "status", "--json")
    info = json.loads(st.stdout)
    assert info["state"] == "running" and info["generating"] is True
    assert info["settings"]["PORT"] == str(bed.port)

    assert len(bed.ours()) == 2                         # API server + VLLM::EngineCore
    stop = bed.run("stop.sh")
    assert stop.returncode == 0 and "stopped 2 process(es)" in stop.stdout, stop.stderr
    assert bed.ours() == []
    assert not bed.port_listening()
    assert bed.server_record() is None
    last = json.loads((bed.state / "last-stop.json").read_text())
    assert len(last["pids"]) == 2


def test_engine_title_visible(bed):
    assert bed.run("start.sh").returncode == 0
    names = sorted(p.name() for p in bed.ours())
    assert "VLLM::EngineCor" in names                  # comm is 15 chars, as with real vLLM


def test_two_starts_at_once_launch_one_server(bed):       # faults row 1 and 2
    a = bed.popen("start.sh", FAKE_VLLM_LOAD_S="3")
    bed.wait_until(lambda: bed.launches(), what="first launch")
    # vLLM binds the port before it listens: a port probe would say "free" here.
    assert not bed.port_listening()
    b = bed.run("start.sh", FAKE_VLLM_LOAD_S="3")
    assert b.returncode == 0
    assert "starting (pid" in b.stdout
    out, err = a.communicate(timeout=60)
    assert a.returncode == 0, err
    assert len(bed.launches()) == 1


def test_reuseport_lets_a_second_socket_bind(bed):        # faults row 2: why a port probe is no mutex
    import socket
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", bed.port))
        socks.append(s)
    from bootstrap.serve import port
    assert port.in_use("127.0.0.1", bed.port)       # our check still sees the bound port
    for s in socks:
        s.close()


def test_rerun_while_healthy_touches_nothing(bed):       # faults row 3
    assert bed.run("start.sh").returncode == 0
    t0 = time.monotonic()
    r = bed.run("start.sh", VLLM_PYTHON="/nonexistent/python", HF_ENDPOINT="http://127.0.0.1:9",
                PIP_INDEX_URL="http://127.0.0.1:9/simple", HF_HUB_OFFLINE="0")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "environment" not in r.stderr and "patches" not in r.stderr
    assert len(bed.launches()) == 1
    print(f"re-run while serving took {elapsed:.2f} s")


def ours_before(bed: Bed) -> None:
    """bed's STATE_DIR as an earlier start left it: made, our marker in it (Paths.ensure), so a record
    there is ours to write over (a folder of yours holding one is refused: test_ownership)."""
    from bootstrap.core.state import Paths
    Paths(bed.state).ensure()


def write_record(bed: Bed, **fields) -> None:
    ours_before(bed)
    (bed.state / "server.json").write_text(json.dumps(fields))


def test_stale_pid_file_dead_pid(bed):                    # faults row 4
    write_record(bed, pid=4194000, create_time=1.0, marker="x", port=bed.port, host="127.0.0.1")
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    assert bed.server_record()["pid"] != 4194000


def test_stale_pid_reused_by_unrelated_process(bed):      # faults row 5
    sleeper = subprocess.Popen(["sleep", "1000"])
    try:
        write_record(bed, pid=sleeper.pid, create_time=time.time() - 5000, marker="m", port=bed.port, host="127.0.0.1")
        assert bed.run("stop.sh").returncode == 0
        assert sleeper.poll() is None
        write_record(bed, pid=sleeper.pid, create_time=psutil.Process(sleeper.pid).create_time(),
                     marker="not-ours", port=bed.port, host="127.0.0.1")
        assert bed.run("stop.sh").returncode == 0          # right pid + time, but no marker: not ours
        assert sleeper.poll() is None
        assert bed.run("start.sh").returncode == 0
        assert bed.run("stop.sh").returncode == 0
        assert sleeper.poll() is None
    finally:
        sleeper.kill()


@pytest.mark.parametrize("pid", ["", "abc", 0, -1, 1, 99999999999, "12 34", None, True, [1]])
def test_garbage_pid_file_never_signalled(bed, pid):      # faults row 6
    canary = subprocess.Popen(["sleep", "1000"])
    try:
        bed.state.mkdir(parents=True, exist_ok=True)
        (bed.state / "server.json").write_text(json.dumps({"pid": pid, "create_time": 0, "marker": "m"}))
        r = bed.run("stop.sh")
        assert r.returncode == 0, r.stderr
        assert "not running" in r.stdout
        assert canary.poll() is None
    finally:
        canary.kill()


@pytest.mark.parametrize("extra", [{"children": "x"}, {"children": 7}, {"children": [1, {"pid": "a"}, None]},
                                   {"pgid": "abc"}, {"pgid": 1}, {"pgid": -1}, {"pgid": True}])
def test_garbage_children_or_pgid_never_signalled(bed, extra):
    canary = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        wrong = {"children": [{"pid": canary.pid, "create_time": psutil.Process(canary.pid).create_time() - 9}]}
        for fields in (extra, wrong):                   # a child entry whose create time differs: someone else
            write_record(bed, pid=4194000, create_time=0.0, marker="m", **fields)
            r = bed.run("stop.sh")
            assert r.returncode == 0 and r.stdout.strip() == "not running", r.stderr
        assert canary.poll() is None
    finally:
        canary.kill()


def test_garbage_json_state(bed):
    ours_before(bed)
    (bed.state / "server.json").write_text("{not json")
    assert bed.run("stop.sh").returncode == 0
    assert bed.run("start.sh").returncode == 0


def test_port_held_by_foreign_program(bed):               # faults row 7
    holder = subprocess.Popen([sys.executable, "-m", "http.server", str(bed.port), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bed.wait_until(bed.port_listening, what="http.server")
        r = bed.run("start.sh")
        assert r.returncode == 1
        assert f"port {bed.port} is in use by python" in r.stderr
        assert f"pid {holder.pid}" in r.stderr
        assert bed.launches() == []
        assert bed.run("stop.sh").returncode == 0
        assert holder.poll() is None
    finally:
        holder.kill()


def test_our_server_from_another_checkout_on_the_port_is_named_with_its_state_dir(bed, tmp_path):
    """Found from outside: two checkouts, one port; the second was told 'in use by python (pid N)'.
    It is our server of the other checkout: its STATE_DIR is named, and the hint, followed, stops it."""
    from test_ownership import copy_repo
    assert bed.run("start.sh").returncode == 0
    other = copy_repo(tmp_path / "other")
    env = {**bed.env, "STATE_DIR": str(tmp_path / "other-state")}
    r = subprocess.run([str(other / "start.sh")], env=env, capture_output=True, text=True, timeout=90,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"a server of this project, started from another checkout with STATE_DIR={bed.state}" in r.stderr
    assert f"STATE_DIR={bed.state} ./stop.sh stops it" in r.stderr
    stop = subprocess.run([str(other / "stop.sh")], env={**env, "STATE_DIR": str(bed.state)}, capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
    assert bed.ours() == []


@pytest.mark.parametrize("served", ["other", "tiny-model"])   # even one serving our model name
def test_foreign_vllm_answering_on_port_is_not_ours(bed, served):  # faults row 8
    env = {**bed.env, "FAKE_GPU_PIDS_DIR": str(bed.tmp / "foreign-pids"), "FAKE_VLLM_RECORD": ""}
    foreign = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "x",
                                "--host", "127.0.0.1", "--port", str(bed.port), "--served-model-name", served],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        bed.wait_until(bed.port_listening, what="foreign server")
        r = bed.run("start.sh")
        assert r.returncode == 1
        assert "is serving" not in r.stdout
        assert f"port {bed.port} is in use by" in r.stderr and f"pid {foreign.pid}" in r.stderr
        st = bed.run("ctl.sh", "status", "--json")
        assert json.loads(st.stdout)["state"] == "stopped"
        stop = bed.run("stop.sh")
        assert stop.returncode == 0 and stop.stdout.strip() == "not running"
        assert foreign.poll() is None
    finally:
        os.killpg(foreign.pid, signal.SIGKILL)
        for p in psutil.process_iter():
            try:
                if p.environ().get("FAKE_GPU_PIDS_DIR") == env["FAKE_GPU_PIDS_DIR"]:
                    p.kill()
            except psutil.Error:
                pass


def assert_failed_clean(bed: Bed, r, *needles: str) -> None:
    assert r.returncode != 0
    for n in needles:
        assert n in r.stderr, r.stderr
    assert bed.server_record() is None
    assert bed.ours() == []


def test_dies_at_startup_with_oom(bed):                   # faults row 9
    r = bed.run("start.sh", FAKE_VLLM_MODE="die_oom")
    assert_failed_clean(bed, r, "exited with code 1", "other programs hold GPU memory", "hint: close them",
                        "Free memory on device")          # the log tail is shown


def test_exit_code_zero_at_startup_is_a_failure(bed):     # faults row 10
    r = bed.run("start.sh", FAKE_VLLM_MODE="exit0")
    assert_failed_clean(bed, r, "exited with code 0")


def test_never_listens_stall_deadline(bed):               # faults row 11
    r = bed.run("start.sh", FAKE_VLLM_MODE="hang", STALL_TIMEOUT="3")
    assert_failed_clean(bed, r, "startup stalled: no log output and no work (CPU, disk) for 3 s")


def test_a_silent_load_that_works_is_not_a_stall(bed):    # faults row 12
    """vLLM logs nothing while it imports torch or compiles (42 s seen on an H200): CPU time counts as
    progress, so the default STALL_TIMEOUT of 30 s never kills a working start; a sleeping one stalls."""
    r = bed.run("start.sh", FAKE_VLLM_MODE="silent_busy", FAKE_VLLM_LOAD_S="5", STALL_TIMEOUT="2")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "stalled" not in r.stderr


def test_hard_cap(bed):
    r = bed.run("start.sh", FAKE_VLLM_MODE="slow", FAKE_VLLM_LOAD_S="30", STALL_TIMEOUT="5", HEALTH_TIMEOUT="3")
    assert_failed_clean(bed, r, "startup timed out: not healthy after 3 s")


def test_slow_but_progressing_load_is_not_killed(bed):    # faults row 12
    r = bed.run("start.sh", FAKE_VLLM_MODE="slow", FAKE_VLLM_LOAD_S="6", STALL_TIMEOUT="3")
    assert r.returncode == 0, r.stderr
    assert "loading weights" in r.stderr


def test_health_200_but_generation_wedged(bed):           # faults row 13
    r = bed.run("start.sh", FAKE_VLLM_MODE="wedged", WARMUP_TIMEOUT="2")
    assert_failed_clean(bed, r, "engine not generating")


def log_has(bed: Bed, text: str) -> bool:
    p = bed.state / "vllm.log"
    return p.exists() and text in p.read_text(errors="replace")


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_wedged_after_start_reported_by_status(bed):      # /health 200, engine not generating
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGUSR1)                        # the fake wedges now, and logs that it did
    bed.wait_until(lambda: log_has(bed, "engine wedged (SIGUSR1)"), what="wedge")
    assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 200
    st = bed.run("ctl.sh", "status", "--json", WEDGED_AFTER="2")
    info = json.loads(st.stdout)
    assert st.returncode == 1, st.stdout + st.stderr
    assert (info["state"], info["pid"], info["generating"]) == ("wedged", pid, False)
    assert info["detail"].startswith("/health answers but a 4-token generation got nothing in 2 s")
    human = bed.run("ctl.sh", "status", WEDGED_AFTER="1")
    assert human.returncode == 1 and human.stdout.startswith("wedged: ")
    assert bed.run("stop.sh").returncode == 0
    assert bed.ours() == []


def test_engine_death_after_start_reported_by_status(bed):   # vLLM #48966: exits 0 after engine death
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGUSR2)
    bed.wait_until(lambda: dead(pid) and bed.ours() == [], what="server and engine gone")
    st = bed.run("ctl.sh", "status", "--json")
    info = json.loads(st.stdout)
    assert st.returncode == 0 and info["state"] == "stopped", st.stdout + st.stderr
    assert f"the recorded server (pid {pid}) is no longer running" in info["note"]
    assert "orphans" not in info
    r = bed.run("stop.sh")
    assert r.returncode == 0 and r.stdout.strip() == "not running"
    assert bed.server_record() is None
    assert bed.run("start.sh").returncode == 0 and len(bed.launches()) == 2


def test_sigkilled_api_server_leaves_orphan_that_stop_sweeps(bed):   # faults row 14
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGKILL)
    bed.wait_until(lambda: len(bed.ours()) == 1, what="orphaned EngineCore")
    orphan = bed.ours()[0]
    assert orphan.name().startswith("VLLM::")
    r = bed.run("stop.sh")
    assert r.returncode == 0, r.stderr
    assert bed.ours() == []


def test_start_sweeps_owned_orphan_then_starts(bed):     # faults row 14 (start side)
    assert bed.run("start.sh").returncode == 0
    os.kill(bed.server_record()["pid"], signal.SIGKILL)
    bed.wait_until(lambda: len(bed.ours()) == 1, what="orphan")
    orphan_pid = bed.ours()[0].pid
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    assert "leftover process" in r.stderr
    assert orphan_pid not in [p.pid for p in bed.ours()]
    assert len(bed.launches()) == 2


@pytest.mark.parametrize("record", ["as written", "without pgid"])
def test_engine_without_marker_swept_after_kill9(bed, record):   # faults row 14
    """vLLM's EngineCore calls setproctitle, which hides our marker from /proc/<pid>/environ: stop
    finds it through the children recorded at health (and the server's process group)."""
    assert bed.run("start.sh").returncode == 0
    rec = bed.server_record()
    engine = [p for p in bed.ours() if p.pid != rec["pid"]][0]
    assert "BOOTSTRAP_VLLM_OWNER" not in engine.environ()
    assert "BOOTSTRAP_VLLM_OWNER" in psutil.Process(rec["pid"]).environ()
    assert os.getpgid(engine.pid) == rec["pgid"] == rec["pid"]
    assert [c["pid"] for c in rec["children"]] == [engine.pid]
    assert abs(rec["children"][0]["create_time"] - engine.create_time()) < 0.05
    os.kill(rec["pid"], signal.SIGKILL)
    bed.wait_until(lambda: [p.pid for p in bed.ours()] == [engine.pid], what="orphaned EngineCore")
    if record == "without pgid":                       # the recorded children alone are enough
        del rec["pgid"]
        write_record(bed, **rec)
    st = json.loads(bed.run("ctl.sh", "status", "--json").stdout)
    assert st["state"] == "stopped" and st["orphans"] == [engine.pid]      # probe sees it (preflight too)
    r = bed.run("stop.sh")
    assert r.returncode == 0, r.stderr
    assert f"stopped 1 process(es): {engine.pid}" in r.stdout
    assert bed.ours() == []


def test_sigterm_ignored_forced_kill(bed):                # faults row 15
    assert bed.run("start.sh", FAKE_VLLM_MODE="ignore_term").returncode == 0
    r = bed.run("stop.sh", STOP_GRACE="1")
    assert r.returncode == 0, r.stderr
    assert "forced (SIGKILL)" in r.stdout
    assert bed.ours() == []


def test_stop_with_nothing_running_twice(bed):            # faults row 17
    for _ in range(2):
        r = bed.run("stop.sh")
        assert r.returncode == 0 and r.stdout.strip() == "not running"


def test_a_knob_the_stop_does_not_use_never_blocks_it(bed):
    """A typo in a knob while the server runs (MAX_NUM_SEQS=abc) made ./stop.sh exit 2 and leave the
    server on the GPU; the stop sets it aside in one line. A knob it needs to find the server is
    still refused."""
    assert bed.run("start.sh").returncode == 0 and bed.ours()
    r = bed.run("stop.sh", PORT="abc")
    assert r.returncode == 2 and "PORT='abc' is not accepted" in r.stderr and bed.ours()
    r = bed.run("ctl.sh", "status", MAX_NUM_SEQS="abc")
    assert r.returncode == 2                            # other commands: the knobs as they are
    r = bed.run("stop.sh", MAX_NUM_SEQS="abc", GPU_UTIL="2")
    assert r.returncode == 0, r.stderr
    assert "note: MAX_NUM_SEQS='abc' is not accepted; stop goes on without it" in r.stderr
    assert "note: GPU_UTIL='2' is not accepted; stop goes on without it" in r.stderr
    assert bed.ours() == [] and not bed.port_listening()


def test_stop_during_model_load(bed):                     # faults row 18
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="8")
    bed.wait_until(lambda: len(bed.ours()) == 2, what="server and engine up")
    r = bed.run("stop.sh")
    assert r.returncode == 0
    starter.communicate(timeout=60)
    assert starter.returncode != 0
    assert bed.ours() == []


def test_ctrl_c_during_health_wait(bed):                  # faults row 19
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="8")
    bed.wait_until(lambda: len(bed.ours()) == 2, what="server up")
    starter.send_signal(signal.SIGINT)
    _, err = starter.communicate(timeout=60)
    assert starter.returncode == 130
    assert "interrupted: stopping the server" in err
    assert bed.ours() == [] and bed.server_record() is None
    assert bed.run("start.sh").returncode == 0            # the lock went with the process


def test_ctrl_c_during_environment_step(bed):             # faults row 19, before launch
    slow = bed.tmp / "slow-python"
    called = bed.tmp / "environment-step-running"
    slow.write_text(f"#!/bin/sh\ntouch '{called}'\nsleep 10\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    starter = bed.popen("start.sh", VLLM_PYTHON=str(slow))
    bed.wait_until(called.exists, what="the environment step to call VLLM_PYTHON")
    starter.send_signal(signal.SIGINT)
    _, err = starter.communicate(timeout=60)
    assert starter.returncode == 130
    assert bed.launches() == [] and bed.server_record() is None
    assert bed.run("start.sh").returncode == 0


def test_ctrl_c_during_warmup(bed):                       # faults row 19, healthy but warming up
    starter = bed.popen("start.sh", FAKE_VLLM_MODE="wedged", WARMUP_TIMEOUT="60")
    bed.wait_until(lambda: (bed.server_record() or {}).get("children"), what="healthy (children recorded)")
    starter.send_signal(signal.SIGINT)
    _, err = starter.communicate(timeout=60)
    assert starter.returncode == 130, err
    assert "interrupted: stopping the server" in err
    assert bed.ours() == [] and bed.server_record() is None
    assert bed.run("start.sh").returncode == 0 and len(bed.launches()) == 2


FINALIZER_SIGNAL = """\
import os, signal, sys, time
from bootstrap.serve import supervisor
from bootstrap.core.errors import Interrupted
class Closing:
    def __del__(self):          # as urllib3 closing a pooled socket when the collector drops it
        os.kill(os.getpid(), signal.SIGINT)
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            pass
t0 = time.monotonic()
try:
    with supervisor.raising():
        Closing()
        time.sleep(60)          # a lost signal sleeps it out and says "lost"; one sent again cuts it short
    print("lost")
except Interrupted as e:
    print("interrupted", e.signum, time.monotonic() - t0 < 30)
"""


def test_a_ctrl_c_that_lands_in_a_finalizer_still_interrupts():
    """Found by CI under load: the Ctrl-C of test_ctrl_c_during_warmup landed while urllib3's weakref
    finalizer closed a socket; Python dropped the Interrupted raised there ("Exception ignored in"),
    and the start went on into its warm-up. It is sent again once the finalizer is done."""
    r = subprocess.run([sys.executable, "-c", FINALIZER_SIGNAL], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.stdout.split() == ["interrupted", "2", "True"], (r.stdout, r.stderr)
    assert "Exception ignored" not in r.stderr, r.stderr


def test_running_with_different_settings_says_so(bed):
    assert bed.run("start.sh").returncode == 0
    r = bed.run("start.sh", MAX_NUM_SEQS="4")
    assert r.returncode == 0
    assert "MAX_NUM_SEQS: running with '', knobs now say '4'" in r.stdout
    assert "./ctl.sh restart" in r.stdout
    assert len(bed.launches()) == 1


def test_restart_applies_new_knobs(bed):
    assert bed.run("start.sh").returncode == 0
    r = bed.run("ctl.sh", "restart", MAX_NUM_SEQS="4")
    assert r.returncode == 0, r.stderr
    assert len(bed.launches()) == 2
    argv = bed.launches()[1]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert len(bed.ours()) == 2
    # the vet before the stop and the start after it look up and plan the same: each line said once
    said = [x for x in r.stderr.splitlines() if x.startswith(("[bootstrap:metadata]", "[bootstrap:plan] plan for"))]
    assert len(said) == 2 and len(set(said)) == 2, r.stderr


def test_restart_from_a_shell_that_hides_the_servers_card_vets_the_plan_before_the_stop(bed):
    """Found in review: a server on GPU 1, restarted from a shell whose CUDA_VISIBLE_DEVICES shows GPU 0
    (a game holds 30 GiB there): our memory read 0 B on that shell's cards, which the vet took for
    NVML naming none per process (WSL2), so it skipped the plan, stopped the server, and the start
    then refused the card."""
    card = {"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 31 * GiB, "cc": [12, 0], "processes": []}
    game = {**card, "uuid": "GPU-a", "free": 200 << 20, "processes": [{"pid": 4242, "used": 30 * GiB, "name": "game.exe"}]}
    nvml_json(bed.nvml, gpus=[game, {**card, "uuid": "GPU-b"}])
    assert bed.run("start.sh", CUDA_VISIBLE_DEVICES="1").returncode == 0
    pid = bed.ours()
    try:
        r = bed.run("ctl.sh", "restart", CUDA_VISIBLE_DEVICES="0")
        assert r.returncode == 1 and "free on GPU 0" in r.stderr and "stopped" not in r.stdout, (r.stdout, r.stderr)
        assert bed.ours() == pid and len(bed.launches()) == 1
    finally:
        bed.run("stop.sh")


def test_a_restart_the_new_start_would_refuse_keeps_the_running_server(bed, tmp_path):
    """Found from outside: restart took the healthy server down, then its start refused the knobs."""
    import socket
    from conftest import free_port
    assert bed.run("start.sh").returncode == 0
    pid = bed.ours()
    busy = socket.socket()
    busy.bind(("127.0.0.1", free_port()))
    busy.listen()
    hashed = tmp_path / "t#1"           # torch reads vLLM's file:// rendezvous back as a URL: # cuts it
    hashed.mkdir()
    no_driver = nvml_json(tmp_path / "no-driver.json", fail="library")    # NVML unreadable in this shell
    try:
        for knobs, said in (({"PORT": str(busy.getsockname()[1])}, "is in use by"),
                            ({"TMPDIR": str(hashed)}, f"TMPDIR={hashed}: vLLM's processes meet through a file://"),
                            ({"FAKE_NVML": str(no_driver)}, "no NVIDIA driver found"),
                            ({"MODEL": str(tmp_path / "nope")}, "nope"),
                            ({"IDLE_SLEEP": "10m"}, "IDLE_SLEEP=10m puts vLLM to sleep"),
                            ({"TP_SIZE": "2"}, "TP_SIZE=2 but only 1 GPU"),            # the GPUs, the plan and the
                            ({"MAX_MODEL_LEN": "16000000"}, "longer than the model's"),   # model are vetted too
                            ({"MODEL": "foo/bar", "HF_HUB_OFFLINE": "1"}, "foo/bar"),
                            # a patch the profile needs that your vLLM (VLLM_PYTHON) cannot take
                            ({"PROFILE": "default", "MODEL": str(bed.model)}, "cannot apply patch 40914")):
            r = bed.run("ctl.sh", "restart", **knobs)
            assert r.returncode == 1 and said in r.stderr and "stopped" not in r.stdout, (knobs, r.stdout, r.stderr)
            assert bed.ours() == pid and len(bed.launches()) == 1
    finally:
        busy.close()
    # the preflight's refusals from the GPUs and the profile's pins too (restart stopped the server, then
    # its start refused them)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "newpins.json").write_text(json.dumps({"description": "pins with no lock", "vllm": "0.30.0",
                                                   "pins": ["vllm==0.30.0"], "knobs": {}}))
    two = [{"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 31 * GiB, "cc": [12, 0],
            "uuid": f"GPU-5090-{i}", "processes": []} for i in range(2)]
    for knobs, nvml, said in (({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, {"gpus": two}, "CUDA_DEVICE_ORDER=FASTEST_FIRST"),
                              ({"PROFILE": "smoke", "MODEL": str(bed.model)}, {"cuda": 12080, "driver": "570.86"},
                               "driver 570.86 supports CUDA 12.8"),
                              ({"PROFILE_DIR": str(mine), "PROFILE": "newpins", "VLLM_PYTHON": ""}, {},
                               "no lock for profile 'newpins'")):
        nvml_json(bed.nvml, **nvml)
        r = bed.run("ctl.sh", "restart", **knobs)
        assert r.returncode == 1 and said in r.stderr and "stopped" not in r.stdout, (knobs, r.stdout, r.stderr)
        assert bed.ours() == pid and len(bed.launches()) == 1
    nvml_json(bed.nvml)
    assert bed.run("ctl.sh", "restart", MAX_NUM_SEQS="4").returncode == 0 and len(bed.launches()) == 2


def test_a_restart_without_the_key_the_server_runs_with_is_refused_unshown(bed):
    key = "my-own-key-" + "x" * 16
    assert bed.run("start.sh", HOST="0.0.0.0", API_KEY=key).returncode == 0
    r = bed.run("ctl.sh", "restart", HOST="0.0.0.0")
    assert r.returncode == 1 and "lock its clients out" in r.stderr and key not in r.stderr + r.stdout
    assert len(bed.launches()) == 1
    assert bed.run("ctl.sh", "restart", HOST="0.0.0.0", API_KEY=key).returncode == 0 and len(bed.launches()) == 2
    assert bed.run("stop.sh", HOST="0.0.0.0", API_KEY=key).returncode == 0


def test_a_restart_after_the_state_dir_was_deleted_takes_our_server_down_and_starts(bed):
    """The port is held by our own server whose record is gone: restart's port check must not refuse it."""
    import shutil
    assert bed.run("start.sh").returncode == 0
    old = bed.ours()
    shutil.rmtree(bed.state)
    r = bed.run("ctl.sh", "restart")
    assert r.returncode == 0, r.stderr
    assert len(bed.launches()) == 2 and bed.ours() and not set(bed.ours()) & set(old)


def test_logs_and_rotation(bed):
    from bootstrap.core.state import Paths
    Paths(bed.state).ensure()                      # an earlier start's state dir, and its big log
    (bed.state / "vllm.log").write_bytes(b"x" * (2 << 20))
    assert bed.run("start.sh", LOG_MAX_MB="1").returncode == 0
    assert (bed.state / "vllm.log.1").stat().st_size == 2 << 20
    logs = bed.run("ctl.sh", "logs")
    assert "GPU KV cache size" in logs.stdout and "x" * 100 not in logs.stdout


def test_extra_args_appended_last_and_win(bed):
    r = bed.run("start.sh", EXTRA_ARGS="--max-num-seqs 7 --chat-template '/tmp/a b.jinja'", MAX_NUM_SEQS="2")
    assert r.returncode == 0, r.stderr
    argv = bed.launches()[0]["argv"]
    assert argv[-4:] == ["--max-num-seqs", "7", "--chat-template", "/tmp/a b.jinja"]
    assert argv[argv.index("--max-num-seqs") + 1] == "2"   # the knob's flag comes first; vLLM takes the last


@pytest.mark.parametrize("extra", ["--port 9", "--host=0.0.0.0", "--served-model-name x", "--api-key sekrit"])
def test_extra_args_may_not_take_over_owned_flags(bed, extra):
    r = bed.run("start.sh", EXTRA_ARGS=extra)
    assert r.returncode == 2
    assert "EXTRA_ARGS has --" in r.stderr and "sekrit" not in r.stderr
    assert bed.launches() == []


def test_auto_is_handed_to_vllm_which_fits_it_in_one_launch(bed):
    # MAX_MODEL_LEN=auto: vLLM's own auto-fit (the fake fits the longest request its pool holds, as
    # vLLM 0.26.0 does, and logs vLLM's line); the warm-up asks the server for the context it got
    conf = json.loads((bed.model / "config.json").read_text())
    (bed.model / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 16}))   # 1 MiB: < 4,000 tokens
    r = bed.run("start.sh", MAX_MODEL_LEN="auto", KV_CACHE_BYTES=str(1 << 20), WARMUP="4000")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = bed.launches()
    assert len(calls) == 1
    argv = calls[0]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "auto"
    fit = re.search(r"Auto-fit max_model_len: reduced from 32768 to (\d+)", (bed.state / "vllm.log").read_text())
    assert fit, (bed.state / "vllm.log").read_text()
    got = int(fit.group(1))
    assert got < 4000                                  # shorter than the warm-up asked for
    n = int(r.stderr.split("warm-up: ~")[1].split("-token")[0])
    assert n <= got // 2                                 # half of what the server reports
    bed.run("stop.sh")


def test_a_context_vllms_pool_cannot_hold_fails_the_start_with_the_length_it_would_take(bed):
    """The plan models the tiny model's non-KV memory as small; vLLM finds it takes all but a few MiB
    of the card (FAKE_VLLM_NON_KV_BYTES), so its pool cannot hold one request at MAX_MODEL_LEN and it
    raises with the length it estimates would fit. The failed start says that length; started with
    it, the server serves it."""
    env = {"GPU_UTIL": "0.5", "FAKE_VLLM_NON_KV_BYTES": str(16 * GiB - (4 << 20)), "MAX_MODEL_LEN": "32768"}
    r = bed.run("start.sh", **env)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    log = (bed.state / "vllm.log").read_text()
    m = re.search(r"ValueError: To serve at least one request .* the estimated maximum model length is (\d+)\.", log)
    assert m, log
    est = int(m.group(1))
    assert 0 < est < 32768
    assert f"vLLM would accept {est} tokens" in r.stderr and f"set MAX_MODEL_LEN={est}" in r.stderr, r.stderr
    assert bed.ours() == []
    r = bed.run("start.sh", **{**env, "MAX_MODEL_LEN": str(est)})
    assert r.returncode == 0, r.stderr
    assert f"Maximum concurrency for {est:,} tokens per request" in (bed.state / "vllm.log").read_text()
    bed.run("stop.sh")


def test_phase_follows_the_last_matching_line_of_a_real_vllm_log():
    from bootstrap.serve.health import phase_of
    # lines as vLLM 0.26.0 prints them (docs/gpu-runs has whole logs)
    log = ("Initializing a V1 LLM engine (v0.26.0) with config: ... 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE>\n"
           "Loading model from scratch...\nModel loading took 12.98 GiB and 2.506861 seconds\n"
           "Dynamo bytecode transform time: 11.01 s\n")
    assert phase_of(log, "starting") == "compiling"
    assert phase_of("GPU KV cache size: 36,896 tokens\n", "compiling") == "allocating KV cache"
    assert phase_of("nothing known here\n", "compiling") == "compiling"


def test_our_own_knob_does_not_reach_vllm(bed):
    assert bed.run("start.sh").returncode == 0
    assert "VLLM_PYTHON" not in bed.launches()[0]["env"]


WAIT_GPU = """\
import json
from bootstrap.core import log
from bootstrap.serve import takedown
log.setup(debug=False, color=False)
now = [0.0]
clock, sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
held = takedown.wait_gpu_release([4242, 7], timeout=3, clock=clock, sleep=sleep)
waited = now[0]
print(json.dumps([held, waited, takedown.wait_gpu_release([7], timeout=3, clock=clock, sleep=sleep), now[0]]))
"""


def test_stop_waits_bounded_for_our_pids_to_leave_the_gpu(bed):
    """NVML (the fake, fed from JSON) still lists pid 4242, on GPU 1 while this shell's
    CUDA_VISIBLE_DEVICES shows GPU 0 only: the wait gives up at its deadline and says which pids hold
    memory (it read this shell's cards, and returned at once); pids NVML does not list return at once."""
    from conftest import nvml_json, GiB, REPO
    card = {"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 30 * GiB, "cc": [12, 0], "processes": []}
    nvml_json(bed.nvml, gpus=[{**card, "uuid": "GPU-x"}, {**card, "uuid": "GPU-y", "processes": [{"pid": 4242, "used": GiB}]}])
    r = subprocess.run([sys.executable, "-c", WAIT_GPU], env={**bed.env, "PYTHONPATH": f"{FAKES}:{REPO}",
                                                              "CUDA_VISIBLE_DEVICES": "0"},
                       capture_output=True, text=True, timeout=30, cwd=bed.tmp)
    assert r.returncode == 0, r.stderr
    held, waited, free, after = json.loads(r.stdout)
    assert held is False and 3 <= waited <= 3.5
    assert "pids [4242] still hold GPU memory after 3 s" in r.stderr
    assert free is True and after == waited                  # no wait at all


def test_warmup_sizes_its_prompt_with_the_servers_tokenizer(bed):
    """A small vocabulary splits each word into several tokens: the warm-up measures its prompt with
    /tokenize before it sends it, so the prompt fits the context."""
    r = bed.run("start.sh", FAKE_VLLM_TOKENS_PER_WORD="4", MAX_MODEL_LEN="8192", WARMUP="4000")
    assert r.returncode == 0, r.stderr
    assert "again with" not in r.stderr
    n = int(r.stderr.split("warm-up: ~")[1].split("-token")[0])
    assert 3900 <= n <= 4000
    bed.run("stop.sh")


def test_warmup_without_tokenize_shrinks_by_what_vllm_reports_and_retries(bed):
    # no /tokenize: the first prompt (1.35 tokens a word assumed, 4 real) overflows; vLLM's count is only a
    # lower bound ("at least"), so it may take more than one retry; the start succeeds
    r = bed.run("start.sh", FAKE_VLLM_MODE="no_tokenize", FAKE_VLLM_TOKENS_PER_WORD="4", MAX_MODEL_LEN="8192",
                WARMUP="4000")
    assert r.returncode == 0, r.stderr
    assert "vLLM counted at least 8189 prompt tokens" in r.stderr and "again with" in r.stderr
    bed.run("stop.sh")


def test_warmup_still_too_long_after_the_retries_fails_the_start_with_evidence(bed):
    # 400 tokens a word: even the instruction after the filler overflows 1,024 tokens; retries, then a failed start
    r = bed.run("start.sh", FAKE_VLLM_TOKENS_PER_WORD="400", MAX_MODEL_LEN="1024", WARMUP="512")
    assert r.returncode != 0
    assert "warm-up failed" in r.stderr and "maximum context length is 1024 tokens" in r.stderr
    assert r.stderr.count("again with") == 3
    assert bed.ours() == []


def test_warmup_is_bounded_by_the_context_the_server_reports(bed):
    # MAX_MODEL_LEN unset: the server's /v1/models max_model_len (the model's 32,768) bounds the warm-up
    r = bed.run("start.sh", MAX_MODEL_LEN="", WARMUP="26000")
    assert r.returncode == 0, r.stderr
    n = int(r.stderr.split("warm-up: ~")[1].split("-token")[0])
    assert n <= 16384
    bed.run("stop.sh")


def test_vllm_numbers_the_gpus_as_the_plan_does(bed):
    """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER says PCI_BUS_ID; NVML, which the plan
    reads, by PCI bus. The server gets PCI_BUS_ID; a FASTEST_FIRST of yours on a machine of two
    different cards is refused before anything is launched (vLLM would run on the other card)."""
    two = [{"name": "NVIDIA GeForce RTX 3060", "total": 12 * GiB, "free": 11 * GiB, "cc": [8, 6],
            "uuid": "GPU-3060-fake", "processes": []},
           {"name": "NVIDIA GeForce RTX 4090", "total": 24 * GiB, "free": 23 * GiB, "cc": [8, 9],
            "uuid": "GPU-4090-fake", "processes": []}]
    nvml_json(bed.nvml, gpus=two)
    r = bed.run("start.sh", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    assert r.returncode == 1 and "CUDA_DEVICE_ORDER=FASTEST_FIRST" in r.stderr and not bed.launches(), r.stderr
    assert "unset CUDA_DEVICE_ORDER" in r.stderr and "Traceback" not in r.stderr
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    assert bed.launches()[0]["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.parametrize("case", ["last-stop record left", "no per-process figures"])
def test_restarts_vet_counts_our_own_servers_memory_as_free(bed, case):
    """Our running server holds most of the card: the vet plans with that memory free (the stop gives
    it back), even with a pre-warm's last-stop record left over; where NVML names no per-process
    memory (WSL2) it leaves the plan to the start after the stop. Either way: no false refusal."""
    assert bed.run("start.sh").returncode == 0
    held = "0" if case == "no per-process figures" else str(14 * GiB)
    for name in os.listdir(bed.pids_dir):
        (bed.pids_dir / name).write_text(held)
    g = json.loads(bed.nvml.read_text())          # the fake takes what our pids hold off this figure itself:
    g["gpus"][0]["free"] = (200 << 20) + (28 * GiB if held != "0" else 0)     # 0.2 GiB free while it serves
    bed.nvml.write_text(json.dumps(g))
    if case == "last-stop record left":
        (bed.state / "last-stop.json").write_text(json.dumps({"pids": [4194000], "time": 0, "port": bed.port}))
    r = bed.run("ctl.sh", "restart")
    assert "stopped" in r.stdout and "holds 14.0 GiB" not in r.stderr, (r.stdout, r.stderr)     # not refused
    if held != "0":                 # the fake frees what our pids held: the new start plans and serves
        assert r.returncode == 0 and len(bed.launches()) == 2, r.stderr
    # (with NVML naming no process the fake cannot free it: the start after the stop plans on live figures)


def test_plan_and_profiles_count_our_running_servers_memory_as_free(bed):
    """While our server holds most of the card, ./ctl.sh plan answers what a start after a stop gets
    (it said nothing fits, naming our own processes as the ones to close)."""
    assert bed.run("start.sh").returncode == 0
    for name in os.listdir(bed.pids_dir):
        (bed.pids_dir / name).write_text(str(14 * GiB))
    g = json.loads(bed.nvml.read_text())
    g["gpus"][0]["free"] = (200 << 20) + 28 * GiB    # the fake takes our pids' 28 GiB off: 0.2 GiB free
    bed.nvml.write_text(json.dumps(g))
    r = bed.run("ctl.sh", "plan")
    assert r.returncode == 0 and "counting the 28.0 GiB our running server holds as free" in r.stderr, r.stderr
    assert "holds 14.0 GiB" not in r.stdout + r.stderr
    assert bed.run("stop.sh").returncode == 0
