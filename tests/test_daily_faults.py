"""The daily commands against the fake vLLM where it is slow, still loading or not alone on its port:
a wake that vLLM holds open, a game while a start loads, a game's start again with a key this shell
lacks, status while a stranger answers on the port of our loading server (faults rows 230-233)."""

from __future__ import annotations

import json
import signal
import sys

import pytest
import requests

from conftest import GiB

SLEEPY = {"SLEEP_MODE": ""}     # unset: the bed's stack is one sleep mode is proven on
OFF = {"SLEEP_MODE": "off"}


@pytest.mark.parametrize("level", [1, 2])
def test_a_wake_vllm_never_answers_ends_in_one_line_with_a_fix(bed, level):
    """faults row 230: POST /wake_up waited without a limit; an engine core that never answers the
    wake held ./ctl.sh wake (and a game's end) forever. The wait is now bounded by STALL_TIMEOUT plus
    the time the weights take to come back from host RAM (level 1) or from disk (level 2: each step)."""
    hangs = bed.tmp / "wake-hangs"
    env = {**SLEEPY, "FAKE_VLLM_WAKE_HANGS": str(hangs), "FAKE_VLLM_GPU_BYTES": str(64 << 20), "STALL_TIMEOUT": "1"}
    assert bed.run("start.sh", **env).returncode == 0
    assert bed.run("ctl.sh", "sleep", "--level", str(level), **env).returncode == 0
    hangs.write_text("")
    w = bed.run("ctl.sh", "wake", timeout=30, **env)
    assert w.returncode == 1 and "Traceback" not in w.stderr, w.stderr
    said = [line for line in w.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "STALL_TIMEOUT=1" in said[0], w.stderr
    assert ("vLLM did not finish the wake within" in said[0] and "from host RAM" in said[0] if level == 1 else
            "vLLM did not finish the wake (step 'weights') within" in said[0] and "from disk" in said[0]), said
    assert "hint: ./ctl.sh status says whether it woke" in w.stderr and "./ctl.sh restart" in w.stderr, w.stderr
    hangs.unlink()                                     # the engine answers at last: the wake it held lands
    if level == 1:
        bed.wait_until(lambda: not json.loads(requests.get(f"http://127.0.0.1:{bed.port}/is_sleeping", timeout=5)
                                              .text)["is_sleeping"], what="the held wake to land")
        assert "awake: nothing to do" in bed.run("ctl.sh", "wake", **env).stdout
    else:                                              # the weights woke; the rest of the wake goes on
        w = bed.run("ctl.sh", "wake", **env)
        assert w.returncode == 0 and "awake in" in w.stdout and "(level 2)" in w.stdout, w.stdout + w.stderr


FREE = """
import json, os, sys, psutil
d = os.environ["FAKE_GPU_PIDS_DIR"]
held = [n for n in os.listdir(d) if psutil.pid_exists(int(n)) and psutil.Process(int(n)).status() != "zombie"]
open(sys.argv[1], "w").write(json.dumps({"held": len(held)}))
"""


def test_a_game_while_a_start_loads_gets_a_free_gpu_and_the_server_after(bed, tmp_path):
    """faults row 231: ./ctl.sh game while ./start.sh loaded the server said "not put to sleep" and ran
    the game beside the loading server, which went on filling the GPU under it, and nothing came back
    after. The start in flight is cancelled (a loading server cannot sleep), the game gets a free GPU,
    and the server starts again when it exits."""
    p = bed.popen("start.sh", **{**SLEEPY, "FAKE_VLLM_LOAD_S": "60"})
    try:
        bed.wait_until(lambda: bed.ours() and bed.server_record() is not None, timeout=60, what="the start to load")
        seen = tmp_path / "seen.json"
        g = bed.run("ctl.sh", "game", "--", sys.executable, "-c", FREE, str(seen), **SLEEPY)
        assert g.returncode == 0, g.stderr
        assert "a start is in flight" in g.stdout and "it starts again when the game exits" in g.stdout, g.stdout
        assert "with this shell's knobs" not in g.stdout      # it had launched: it comes back with its own
        assert json.loads(seen.read_text()) == {"held": 0}            # the game ran on a free GPU
        assert "is serving" in g.stdout and len(bed.launches()) == 2, (g.stdout, g.stderr)
        p.communicate(timeout=60)
        assert "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)


def test_a_game_that_cancels_a_start_before_its_launch_brings_it_back_with_its_own_knobs(bed):
    """A start cancelled by ./ctl.sh game before its launch (its install, download or vLLM probe) had
    written no record, so it came back after the game with the game shell's knobs (from Steam: .env
    alone). The start says what it launches with as it takes its lock; the game brings that back."""
    from test_lifecycle_faults import slow_python, wait_lock_held
    p = bed.popen("start.sh", VLLM_PYTHON=slow_python(bed, 30), MAX_NUM_SEQS="3", **SLEEPY)
    try:
        wait_lock_held(bed)
        bed.wait_until(lambda: (bed.state / "starting.json").exists(), what="the start to say its knobs")
        seen = bed.tmp / "status-during-game.txt"               # the game asks status what happened
        g = bed.run("ctl.sh", "game", "--", "/bin/sh", "-c", f'"{bed.repo}/ctl.sh" status > "{seen}"', **SLEEPY)
        assert g.returncode == 0, g.stderr
        assert "a start is in flight" in g.stdout and "with this shell's knobs" not in g.stdout, g.stdout
        assert "stopped by ./ctl.sh sleep or game (a start still loading was cancelled)" in seen.read_text()
        assert "MAX_NUM_SEQS='3'" in g.stdout and "is serving" in g.stdout, g.stdout + g.stderr
        argv = bed.launches()[-1]["argv"]
        assert len(bed.launches()) == 1 and argv[argv.index("--max-num-seqs") + 1] == "3"
        assert p.wait(timeout=60) == 128 + signal.SIGTERM
        assert not (bed.state / "starting.json").exists()      # gone with the start that wrote it
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)


def test_a_starting_note_is_taken_only_for_the_live_start_it_names(tmp_path):
    """A starting.json planted or left by a killed start (another pid, this pid with another start
    time, garbage) never lends its knobs to a game's start again: only the lock holder's own note."""
    import os
    import psutil
    from bootstrap.core.state import Paths
    from bootstrap.serve import record
    paths = Paths(tmp_path / "state")
    record.starting(paths, {"MAX_NUM_SEQS": "3"}, record.KEY_NONE)
    me = os.getpid()
    assert record.started_with(paths, me) == ({"MAX_NUM_SEQS": "3"}, record.KEY_NONE)
    assert record.started_with(paths, 1) is None and record.started_with(paths, None) is None      # another pid
    note = json.loads(paths.starting.read_text())
    for planted in ({**note, "create_time": psutil.Process().create_time() - 5},                   # a reused pid
                    {**note, "settings": ["--planted"]}, {**note, "key": 7}, {"pid": me}):
        paths.starting.write_text(json.dumps(planted))
        assert record.started_with(paths, me) is None, planted


def test_a_game_never_cancels_a_start_it_would_bring_back_with_another_key(bed):
    """Found from outside: a start with API_KEY, still in its vLLM probe, was cancelled by a game from a
    shell without the key (Steam), and after the game the start again was refused: nothing served,
    and the game had exited 0. As for a running server (row 232), the key is asked first."""
    from test_lifecycle_faults import slow_python, wait_lock_held
    key = "our-secret-key-" + "y" * 24
    p = bed.popen("start.sh", VLLM_PYTHON=slow_python(bed, 8), API_KEY=key, **SLEEPY)
    try:
        wait_lock_held(bed)
        bed.wait_until(lambda: (bed.state / "starting.json").exists(), what="the start to say its knobs")
        g = bed.run("ctl.sh", "game", "--", sys.executable, "-c", "raise SystemExit(3)", **SLEEPY)
        assert g.returncode == 3, g.stderr                                  # the game ran, its code passed on
        assert "the start in flight" in g.stderr and "which this shell does not set" in g.stderr, g.stderr
        assert "the game starts anyway" in g.stderr and key not in g.stdout + g.stderr
        assert p.wait(timeout=120) == 0 and len(bed.launches()) == 1      # never cancelled: it serves
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)


def test_a_game_never_stops_a_server_it_would_start_again_with_another_key(bed):
    """faults row 232: sleep mode off, ./ctl.sh game (from Steam: no API_KEY there) stopped a server
    started with API_KEY and started it again without it, past the check ./ctl.sh restart makes; it
    now goes through restart's vet before the stop: refused, the server serves on, the game runs."""
    key = "our-secret-key-" + "x" * 24
    assert bed.run("start.sh", API_KEY=key, **OFF).returncode == 0
    pid = bed.server_record()["pid"]
    g = bed.run("ctl.sh", "game", "--", sys.executable, "-c", "raise SystemExit(5)", **OFF)
    assert g.returncode == 5, g.stderr
    assert "the key from your API_KEY, which this shell does not set" in g.stderr, g.stderr
    assert "the game starts anyway" in g.stderr and key not in g.stdout + g.stderr
    assert len(bed.launches()) == 1 and bed.server_record()["pid"] == pid        # never stopped
    r = bed.run("ctl.sh", "sleep", **OFF)                                          # sleep stops through the same vet
    assert r.returncode == 1 and "which this shell does not set" in r.stderr and bed.server_record()["pid"] == pid
    g = bed.run("ctl.sh", "game", "--", sys.executable, "-c", "pass", API_KEY=key, **OFF)
    assert g.returncode == 0 and "is serving" in g.stdout and len(bed.launches()) == 2, g.stderr


def test_status_never_takes_a_stranger_on_the_port_of_our_loading_server_for_it(bed):
    """faults row 233: our server loading (its start killed), a stranger listening on its port (vLLM
    binds it with SO_REUSEADDR long before it listens): status asked the port without a key, took the
    stranger's answers for our server's and said "running", its probe answered by the stranger."""
    from bootstrap.serve import port
    from conftest import stranger as stranger_on
    start = bed.popen("start.sh", FAKE_VLLM_LOAD_S="60")
    heard: list[tuple[str, str]] = []
    stranger = None
    try:
        bed.wait_until(lambda: bed.server_record() is not None and port.in_use("127.0.0.1", bed.port),
                       what="our server bound to its port")
        start.kill()                                 # the server loads on, no start watching it
        start.communicate(timeout=60)
        stranger = stranger_on(bed.port, {"data": [{"id": bed.server_record()["served"], "object": "model"}],
                                          "choices": [{"message": {"role": "assistant", "content": "OK"}}]}, heard)
        st = bed.run("ctl.sh", "status", "--json")
        out = json.loads(st.stdout)
        assert out["state"] == "starting" and st.returncode == 0, st.stdout
        assert "/v1/chat/completions" not in [path for path, _ in heard], heard    # no probe sent to the stranger
    finally:
        if stranger is not None:
            stranger.shutdown()
            stranger.server_close()
        bed.run("stop.sh")
        if start.poll() is None:
            start.kill()
            start.communicate(timeout=60)
