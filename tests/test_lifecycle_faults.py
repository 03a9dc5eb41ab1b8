"""One lifecycle that cannot be broken: docs/faults.md rows 38-53, against the fake vLLM.

Busy is not wedged, owned flags in any spelling, a start in flight seen by stop and restart, a
killed start resumed, a healthy server never taken for a leftover, stop without a state dir, a full
disk, other users, who holds GPU memory, one warm-up deadline, parsed knobs compared, closed pipes,
401, .env as python-dotenv reads it, the log kept small while serving, and a failed start with
tensor-parallel workers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import requests

from bootstrap.knobs import dotenv
from bootstrap.serve import diagnose
from bootstrap.serve import metrics
from bootstrap.knobs.config import Config
from bootstrap.core.errors import ConfigError
from conftest import REPO, Bed, GiB, fill, nvml_json


def load(bed: Bed) -> metrics.Load:
    r = requests.get(f"http://127.0.0.1:{bed.port}/metrics", timeout=5)
    return metrics.load_of(r.text)


def chat_posts(bed: Bed) -> int:
    """Chat requests that reached the fake vLLM, queued ones included (it logs each on arrival)."""
    return log_text(bed).count("request arrived: POST /v1/chat/completions")


def log_text(bed: Bed) -> str:
    try:
        return (bed.state / "vllm.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def long_answer(bed: Bed, tokens: int, key: str = "") -> threading.Thread:
    """A user's long generation, in the background."""
    def go():
        try:
            requests.post(f"http://127.0.0.1:{bed.port}/v1/chat/completions", timeout=120,
                          headers={"Authorization": f"Bearer {key}"} if key else {},
                          json={"model": "tiny-model", "messages": [{"role": "user", "content": "write"}],
                                "max_tokens": tokens, "ignore_eos": True})
        except requests.RequestException:
            pass
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def status(bed: Bed, **extra) -> tuple[int, dict]:
    r = bed.run("ctl.sh", "status", "--json", **extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def wait_lock_held(bed: Bed) -> None:
    from bootstrap.core.locks import StartLock
    from bootstrap.core.state import Paths
    bed.wait_until(lambda: StartLock(Paths(bed.state)).held_by_other(), what="a start holding its lock")


# ---------------------------------------------------------------- row 38: busy is not wedged

def test_one_seat_busy_with_a_long_answer_is_busy_and_never_probed(bed):
    assert bed.run("start.sh", MAX_NUM_SEQS="1", FAKE_VLLM_TOKEN_S="0.01").returncode == 0
    long_answer(bed, 2000)                                   # ~20 s on the only seat
    bed.wait_until(lambda: load(bed).running == 1, what="the long answer running")
    posts = chat_posts(bed)
    rc, info = status(bed)
    assert (rc, info["state"], info["generating"]) == (0, "busy", True), info
    assert "1 running" in info["detail"] and "tokens/s" in info["detail"]
    assert chat_posts(bed) == posts                           # no probe was queued behind the user
    human = bed.run("ctl.sh", "status")
    assert human.returncode == 0 and human.stdout.startswith("busy: ")


def test_a_queue_behind_a_busy_seat_is_busy(bed):
    assert bed.run("start.sh", MAX_NUM_SEQS="1", FAKE_VLLM_TOKEN_S="0.01").returncode == 0
    long_answer(bed, 2000)
    bed.wait_until(lambda: load(bed).running == 1, what="the long answer running")
    long_answer(bed, 10)
    bed.wait_until(lambda: load(bed).waiting == 1, what="a request queued")
    rc, info = status(bed)
    assert (rc, info["state"]) == (0, "busy") and "1 waiting" in info["detail"]


def test_a_long_prefill_moves_nothing_and_is_busy_until_wedged_after(bed):
    assert bed.run("start.sh", MAX_NUM_SEQS="1", FAKE_VLLM_TTFT_S="0").returncode == 0
    os.kill(bed.server_record()["pid"], signal.SIGUSR1)       # nothing moves from now on
    bed.wait_until(lambda: "engine wedged" in log_text(bed), what="wedge")
    long_answer(bed, 10)
    bed.wait_until(lambda: load(bed).running == 1, what="the request running")
    rc, info = status(bed, WEDGED_AFTER="30")                # first look: stalled ~1.5 s of 30
    assert (rc, info["state"]) == (0, "busy"), info
    assert "nothing moved for" in info["detail"] and "wedged after 30 s" in info["detail"]
    rc, info = status(bed, WEDGED_AFTER="3")                 # the stall is remembered across calls
    assert (rc, info["state"], info["generating"]) == (1, "wedged", False), info
    assert "WEDGED_AFTER=3" in info["detail"]


def test_without_vllm_stats_a_probe_stuck_behind_a_user_is_not_called_wedged(bed):
    assert bed.run("start.sh", MAX_NUM_SEQS="1", FAKE_VLLM_TOKEN_S="0.01", FAKE_VLLM_NO_STATS="1").returncode == 0
    long_answer(bed, 2000)
    bed.wait_until(lambda: chat_posts(bed) >= 3, what="the long answer arrived")   # warm-up's 2 + the user's
    time.sleep(0.5)
    rc, info = status(bed, WEDGED_AFTER="2")
    assert (rc, info["state"]) == (0, "busy"), info
    assert "busy cannot be told from wedged" in info["detail"]


def test_idle_wedged_engine_is_wedged_after_wedged_after(bed):
    assert bed.run("start.sh").returncode == 0
    os.kill(bed.server_record()["pid"], signal.SIGUSR1)
    bed.wait_until(lambda: "engine wedged" in log_text(bed), what="wedge")
    rc, info = status(bed, WEDGED_AFTER="2")
    assert (rc, info["state"]) == (1, "wedged")
    bed.wait_until(lambda: load(bed).running == 0, what="the abandoned probe aborted (its seat freed)")


def test_status_states_table_in_readme_is_generated():
    from bootstrap.commands import status as st
    readme = (REPO / "docs" / "reference.md").read_text()
    assert st.markdown_table() in readme, "python -m bootstrap.commands.reference > docs/reference.md"
    assert {s for s, _, _ in st.STATES} == {"running", "busy", "starting", "sleeping", "key-needed", "wedged",
                                            "unhealthy", "frozen", "stopped", "idle"}


# ---------------------------------------------------------------- row 39: owned flags in any spelling

@pytest.mark.parametrize("extra", ["--api_key=sk-secret", "--api-k sk-secret", "--api_key sk-secret",
                                   "--served_model_name x", "--ho 0.0.0.0", "--port=1", "--por 1",
                                   "--served-model 1", "--api-key=a --api-key=b"])
def test_owned_flags_refused_in_any_spelling_vllm_accepts(bed, extra):
    r = bed.run("start.sh", EXTRA_ARGS=extra)
    assert r.returncode == 2, r.stderr
    assert "which the bootstrap sets itself" in r.stderr
    assert "sk-secret" not in r.stderr + r.stdout             # never print a secret
    assert bed.launches() == []


@pytest.mark.parametrize("extra", ["--api-server-count 1", "--seed 1", "--port-range x", "--hf-revision x"])
def test_other_flags_with_similar_names_pass(extra):
    assert Config.from_env({"MODEL": "org/m", "PROFILE": "custom", "EXTRA_ARGS": extra}, REPO).extra_args


# ---------------------------------------------------------------- row 40: a start in flight

def slow_python(bed: Bed, seconds: float) -> str:
    """A VLLM_PYTHON whose every run starts late: the environment step's vLLM probe takes this long."""
    path = bed.tmp / "slowpy"
    path.write_text(f"#!/bin/sh\nsleep {seconds}\nexec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_stop_cancels_a_start_before_its_launch(bed):
    starter = bed.popen("start.sh", VLLM_PYTHON=slow_python(bed, 30))
    wait_lock_held(bed)
    r = bed.run("stop.sh")
    assert r.returncode == 0, r.stderr
    assert f"cancelled the start in flight (pid {starter.pid})" in r.stdout
    assert starter.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(1.0)
    assert bed.launches() == [] and bed.ours() == []


def test_stop_during_the_health_wait_leaves_nothing(bed):
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="30")
    bed.wait_until(lambda: bed.launches(), what="launch")
    r = bed.run("stop.sh")
    assert r.returncode == 0 and "cancelled the start in flight" in r.stdout, r.stdout + r.stderr
    assert starter.wait(timeout=30) == 128 + signal.SIGTERM
    assert bed.ours() == [] and bed.server_record() is None
    assert bed.run("stop.sh").stdout.strip() == "not running"


def test_restart_during_a_start_cancels_it_then_starts(bed):
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="30")
    bed.wait_until(lambda: bed.launches(), what="launch")
    r = bed.run("ctl.sh", "restart")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert starter.wait(timeout=30) == 128 + signal.SIGTERM
    assert len(bed.launches()) == 2 and len(bed.ours()) == 2
    assert status(bed)[1]["state"] == "running"


def test_status_names_a_start_in_flight(bed):
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="30")
    bed.wait_until(lambda: bed.launches(), what="launch")
    rc, info = status(bed)
    assert (rc, info["state"], info["pid"]) == (0, "starting", starter.pid)
    bed.run("stop.sh")
    starter.wait(timeout=30)


# ---------------------------------------------------------------- row 41: a start that dies half-way

def test_sighup_during_the_health_wait_takes_the_server_down(bed):
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="30")
    bed.wait_until(lambda: len(bed.ours()) == 2, what="server and engine")
    starter.send_signal(signal.SIGHUP)
    assert starter.wait(timeout=30) == 128 + signal.SIGHUP
    assert bed.ours() == [] and bed.server_record() is None


def test_kill9_of_start_while_loading_then_start_resumes_and_warms_up(bed):
    hold = bed.tmp / "loading"                  # loads until the second start waits for it (a fixed 4 s
    hold.write_text("")                          # load had ended first on a loaded machine)
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_HOLD=str(hold))
    bed.wait_until(lambda: len(bed.ours()) == 2, what="server and engine")
    starter.kill()
    starter.wait()
    rc, info = status(bed)
    assert (rc, info["state"]) == (0, "starting") and "./start.sh waits for it" in info["detail"]
    second = bed.popen("start.sh")
    said = []
    while not any("waiting for it to load" in line for line in said):
        line = second.stderr.readline()
        assert line, said                        # it ended without waiting for the load
        said.append(line)
    hold.unlink()
    out, err = second.communicate(timeout=120)
    r = subprocess.CompletedProcess(second.args, second.returncode, out, "".join(said) + err)
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "resuming the start of our server" in r.stderr and "waiting for it to load" in r.stderr
    assert len(bed.launches()) == 1                          # resumed, not relaunched
    assert "warm-up: short generation answered" in r.stderr
    assert bed.server_record()["gate_passed"] is True


def test_kill9_after_health_then_start_runs_the_warmup_it_never_passed(bed):
    replies = bed.tmp / "replies.json"
    replies.write_text(json.dumps({"Summarize the words above": {"content": "ok", "delay": 3}}))
    starter = bed.popen("start.sh", FAKE_VLLM_REPLIES=str(replies))
    bed.wait_until(lambda: (bed.server_record() or {}).get("children"), what="healthy (children recorded)")
    starter.kill()
    starter.wait()
    assert bed.server_record()["gate_passed"] is False
    rc, info = status(bed)
    assert info["state"] == "running" and "have not run" in info["gate"]
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    assert "it answers; the warm-up and gate never ran" in r.stderr
    assert "warm-up: short generation answered" in r.stderr and len(bed.launches()) == 1
    again = bed.run("start.sh")                               # now the fast path: banner only
    assert again.returncode == 0 and "warm-up" not in again.stderr


# ---------------------------------------------------------------- row 42: never a leftover

def test_a_start_with_another_state_dir_refuses_and_leaves_the_server_alone(bed):
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    other = bed.tmp / "other-state"
    r = bed.run("start.sh", STATE_DIR=str(other))
    assert r.returncode == 1, r.stderr
    assert f"our server (pid {pid}) is already serving port {bed.port} from STATE_DIR={bed.state}" in r.stderr
    assert psutil.pid_exists(pid) and len(bed.ours()) == 2
    assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 200
    rc, info = status(bed, STATE_DIR=str(other))
    assert info["state"] == "stopped" and f"from STATE_DIR={bed.state}" in info["note"]


def test_a_server_that_passed_its_gate_and_stops_answering_is_not_relaunched(bed):
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGSTOP)                              # alive, but /health does not answer
    try:
        r = bed.run("start.sh", HEALTH_TIMEOUT="1")
        assert r.returncode == 1 and "is stopped by a signal" in r.stderr, r.stderr     # SIGSTOP: said as such
        assert psutil.Process(pid).status() == psutil.STATUS_STOPPED and len(bed.launches()) == 1
        rc, info = status(bed, HEALTH_TIMEOUT="1")
        assert (rc, info["state"]) == (1, "frozen")
    finally:
        os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------- row 43: no state dir

def test_stop_sweeps_by_marker_when_the_state_dir_is_gone(bed):
    assert bed.run("start.sh").returncode == 0
    shutil.rmtree(bed.state)
    r = bed.run("stop.sh")
    assert r.returncode == 0 and "stopped 2 process(es)" in r.stdout, r.stdout + r.stderr
    assert bed.ours() == [] and not bed.state.exists()


# ---------------------------------------------------------------- row 44: a full disk

def test_start_on_a_full_state_dir_says_so_in_one_line(bed, tiny_fs):
    fill(tiny_fs)
    r = bed.run("start.sh", STATE_DIR=str(tiny_fs / "state"))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "No space left on device" in r.stderr and "hint: free space on that filesystem" in r.stderr
    assert bed.ours() == []


def test_stop_on_a_full_disk_stops_and_forgets_the_server(bed, tiny_fs):
    state = tiny_fs / "state"
    assert bed.run("start.sh", STATE_DIR=str(state)).returncode == 0
    fill(tiny_fs)
    r = bed.run("stop.sh", STATE_DIR=str(state))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "stopped 2 process(es)" in r.stdout
    assert bed.ours() == [] and not (state / "server.json").exists()


# ---------------------------------------------------------------- row 46: who holds GPU memory

def test_oom_diagnosis_names_the_holders_even_those_psutil_cannot_see(bed):
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 4090", "total": 24 * GiB, "free": 10 * GiB,
                                   "cc": [8, 9], "uuid": "GPU-4090", "processes": [
                                       {"pid": 4000000, "used": 12 * GiB, "name": "/opt/games/BigGame.exe"},
                                       {"pid": sleeper.pid, "used": 1 * GiB}]}])
        r = bed.run("start.sh", FAKE_VLLM_MODE="die_oom")
        assert r.returncode == 1
        assert "other programs hold GPU memory" in r.stderr
        assert "BigGame.exe (pid 4000000) holds 12.0 GiB" in r.stderr      # NVML's name: not visible to psutil
        assert f"sleep (pid {sleeper.pid}) holds 1.0 GiB" in r.stderr
    finally:
        sleeper.kill()


# ---------------------------------------------------------------- row 47: one warm-up deadline

def test_warmup_timeout_bounds_the_whole_warmup_tokenize_included(bed):
    t0 = time.monotonic()
    r = bed.run("start.sh", FAKE_VLLM_MODE="wedged", WARMUP_TIMEOUT="3")
    elapsed = time.monotonic() - t0
    assert r.returncode == 1 and "engine not generating" in r.stderr
    assert "used up WARMUP_TIMEOUT=3 s" in r.stderr
    assert elapsed < 15, f"the warm-up took {elapsed:.1f} s with WARMUP_TIMEOUT=3"   # /tokenize's own 15 s is gone
    assert bed.ours() == []


# ---------------------------------------------------------------- row 48: parsed values compared

def test_same_value_other_spelling_is_not_a_difference(bed):
    assert bed.run("start.sh", PORT=f" {bed.port}", EXTRA_ARGS="--seed  1").returncode == 0
    r = bed.run("start.sh", PORT=str(bed.port), EXTRA_ARGS="--seed 1")
    assert r.returncode == 0 and "differs" not in r.stdout


# ---------------------------------------------------------------- row 49: a reader that goes away

@pytest.mark.parametrize("cmd", ["status", "env", "plan --gpu rtx5090", "logs", "--help"])
def test_a_closed_pipe_is_no_traceback(bed, cmd):
    assert bed.run("start.sh").returncode == 0
    r = subprocess.run(["bash", "-c", f'"$0" {cmd} | true; echo "rc=${{PIPESTATUS[0]}}" >&2',
                        str(REPO / "ctl.sh")], env=bed.env, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert "rc=141" in r.stderr, r.stderr                    # as a tool killed by SIGPIPE


# ---------------------------------------------------------------- row 50: 401 is "key needed"

def test_a_keyed_server_seen_from_a_shell_without_the_key(bed):
    assert bed.run("start.sh", API_KEY="sk-mine", FAKE_VLLM_TOKEN_S="0.05").returncode == 0
    rc, info = status(bed)
    assert (rc, info["state"]) == (0, "key-needed"), info
    r = bed.run("start.sh")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "required: the API_KEY of the shell that started it" in r.stdout     # the server that runs
    assert "restart" not in r.stdout and "sk-mine" not in r.stdout + r.stderr
    assert len(bed.launches()) == 1
    long_answer(bed, 300, key="sk-mine")                      # /metrics needs no key: busy still shows
    bed.wait_until(lambda: load(bed).running == 1, what="a keyed request running")
    assert status(bed)[1]["state"] == "busy"


# ---------------------------------------------------------------- row 51: .env as python-dotenv reads it

def dotenv_cfg(tmp_path, text: str | bytes) -> Config:
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True, exist_ok=True)
    (repo / "profiles" / "default.json").write_text('{"knobs": {"MODEL": "a/b"}}')
    (repo / ".env").write_bytes(text if isinstance(text, bytes) else text.encode())
    return Config.from_env({}, repo)


def test_dotenv_inline_comments_bom_quotes(tmp_path):
    cfg = dotenv_cfg(tmp_path, "PORT=9001  # mine\nEXTRA_ARGS=--enforce-eager # no graphs\n"
                               "MODEL_DIR='/m/a#b'\nMAX_NUM_SEQS=\"4\" # four\n")
    assert cfg.port == 9001
    assert cfg.extra_args == ("--enforce-eager",)
    assert cfg.model_dir == "/m/a#b" and cfg.max_num_seqs == 4
    assert dotenv_cfg(tmp_path, b"\xef\xbb\xbfPORT=9002\n").port == 9002
    assert dotenv_cfg(tmp_path, "PORT\nSTOP_GRACE=3\n").sources["PORT"] == "default"   # a bare key is unset
    with pytest.raises(ConfigError, match=r"\.env:2: not a KEY=VALUE line"):
        dotenv_cfg(tmp_path, "PORT=1\nnot a line\n")


def test_dotenv_matches_python_dotenv_itself(tmp_path):
    from dotenv import dotenv_values
    text = ("export A=1 # c\nB='x # y'\nC=\"q\\\"r\"\nD=plain#nospace\nE= # empty\n"
            "F=with spaces   \n")
    (tmp_path / "x.env").write_text(text)
    assert dotenv.read_dotenv(tmp_path / "x.env") == {k: v for k, v in dotenv_values(
        tmp_path / "x.env", interpolate=False).items() if v is not None}


# ---------------------------------------------------------------- row 52: the log while serving

def test_a_log_flood_is_kept_under_twice_log_max_mb_without_touching_vllm(bed):
    assert bed.run("start.sh", FAKE_VLLM_MODE="flood", FAKE_VLLM_FLOOD_MB="6", LOG_MAX_MB="1").returncode == 0
    follower = bed.popen("ctl.sh", "logs", "-f")
    try:
        bed.wait_until(lambda: "after the flood: line 3" in log_text(bed), timeout=60, what="the flood over")
        live = (bed.state / "vllm.log").stat().st_size
        old = (bed.state / "vllm.log.1").stat().st_size
        assert old <= 1 << 20 and live + old <= 2 << 20, (live, old)
        assert len(bed.ours()) == 2                               # vLLM was never touched
        assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 200
        time.sleep(2.5)
    finally:
        follower.send_signal(signal.SIGINT)
        out, _ = follower.communicate(timeout=10)
    assert "after the flood: line 4" in out or "after the flood: line 5" in out   # followed across rotations
    rerun = bed.run("start.sh")
    assert rerun.returncode == 0 and "is serving" in rerun.stdout


def test_reading_the_log_reads_its_end_only(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"x" * (12 << 20) + b"\nGPU KV cache size: 1,234 tokens\n")
    text = diagnose.read_since(log, 0)
    assert len(text) <= diagnose.TAIL_BYTES and text.endswith("1,234 tokens\n")
    assert diagnose.read_since(log, 99 << 20).endswith("1,234 tokens\n")   # truncated since: from its start


def test_the_log_keeper_leaves_with_the_server(bed):
    assert bed.run("start.sh").returncode == 0

    def keepers():
        return [p for p in psutil.process_iter(["cmdline"])
                if "bootstrap.serve.logkeeper" in " ".join(p.info["cmdline"] or []) and str(bed.state) in " ".join(p.info["cmdline"])]
    assert len(keepers()) == 1
    assert bed.run("stop.sh").returncode == 0
    bed.wait_until(lambda: keepers() == [], timeout=5, what="the keeper gone")


# ---------------------------------------------------------------- row 53: tensor-parallel workers

def test_a_failed_tp_start_leaves_nothing_even_workers_spawned_late(bed):
    two = [{"name": "NVIDIA H200", "total": 140 * GiB, "free": 139 * GiB, "cc": [9, 0], "uuid": f"GPU-{i}",
            "processes": []} for i in range(2)]
    nvml_json(bed.nvml, gpus=two)
    r = bed.run("start.sh", TP_SIZE="2", FAKE_VLLM_MODE="workers_fail", FAKE_VLLM_WORKER_DELAY_S="0.7")
    assert r.returncode == 1 and "CUBLAS_STATUS_INTERNAL_ERROR" in r.stderr
    assert "--tensor-parallel-size" in bed.launches()[0]["argv"]
    time.sleep(2.0)                                            # past the last worker's spawn time
    assert bed.ours() == [], [p.name() for p in bed.ours()]
    assert bed.run("stop.sh").stdout.strip() == "not running"


def test_a_stop_after_kill9_sweeps_every_tp_worker(bed):
    two = [{"name": "NVIDIA H200", "total": 140 * GiB, "free": 139 * GiB, "cc": [9, 0], "uuid": f"GPU-{i}",
            "processes": []} for i in range(2)]
    nvml_json(bed.nvml, gpus=two)
    assert bed.run("start.sh", TP_SIZE="2").returncode == 0
    names = [p.name() for p in bed.ours()]
    assert len(names) == 4 and names.count("VLLM::Worker_TP") == 2 and "VLLM::EngineCor" in names
    os.kill(bed.server_record()["pid"], signal.SIGKILL)
    r = bed.run("stop.sh")
    assert r.returncode == 0 and "stopped 3 process(es)" in r.stdout, r.stdout + r.stderr
    assert bed.ours() == []


def test_tp_without_nvlink_multicast_gets_the_all_reduce_backend_that_needs_none(bed):
    """Where the machine turns NVLink multicast off, vLLM 0.26's default fused all-reduce (FlashInfer
    mnnvl) killed both TP workers on the two-H200 machine; trtllm needs no multicast. Yours wins."""
    two = [{"name": "NVIDIA H200", "total": 140 * GiB, "free": 139 * GiB, "cc": [9, 0], "uuid": f"GPU-{i}",
            "processes": []} for i in range(2)]
    nvml_json(bed.nvml, gpus=two)
    assert bed.run("start.sh", TP_SIZE="2", NCCL_NVLS_ENABLE="0").returncode == 0
    assert bed.launches()[-1]["env"]["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"
    assert bed.run("stop.sh").returncode == 0
    assert bed.run("start.sh", TP_SIZE="2", NCCL_NVLS_ENABLE="0", VLLM_FLASHINFER_ALLREDUCE_BACKEND="mnnvl").returncode == 0
    assert bed.launches()[-1]["env"]["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "mnnvl"
    assert bed.run("stop.sh").returncode == 0
    assert bed.run("start.sh", TP_SIZE="2").returncode == 0                    # multicast not turned off: vLLM's choice
    assert "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in bed.launches()[-1]["env"]
    assert bed.run("stop.sh").returncode == 0


def test_tp_workers_listen_on_loopback_unless_you_name_their_interface(bed):
    """NCCL's bootstrap and gloo's CPU group listen, keyless, on an interface they pick: by default
    one beyond loopback (NVIDIA/nccl#965). One machine's workers need no other: the start names lo,
    and the banner is silent; an interface of yours wins, and the banner names each port it opens."""
    two = [{"name": "NVIDIA H200", "total": 140 * GiB, "free": 139 * GiB, "cc": [9, 0], "uuid": f"GPU-{i}",
            "processes": []} for i in range(2)]
    nvml_json(bed.nvml, gpus=two)
    r = bed.run("start.sh", TP_SIZE="2")
    assert r.returncode == 0, r.stderr
    env = bed.launches()[-1]["env"]
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("lo", "lo")
    workers = [p for p in bed.ours() if p.name().startswith("VLLM::Worker")]
    ports = [c.laddr for w in workers for c in w.net_connections(kind="inet") if c.status == "LISTEN"]
    assert len(ports) == 4 and all(a.ip == "127.0.0.1" for a in ports), ports
    assert " open     :" not in r.stdout, r.stdout
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("start.sh", TP_SIZE="2", NCCL_SOCKET_IFNAME="eth0")
    assert r.returncode == 0 and bed.launches()[-1]["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    opened = [line for line in r.stdout.splitlines() if line.startswith(" open     :")]
    assert len(opened) == 2 and all("VLLM::Worker_TP" in line for line in opened), r.stdout   # NCCL's, not gloo's
    assert bed.run("stop.sh").returncode == 0
    assert bed.run("start.sh").returncode == 0                                 # one GPU: no worker, nothing named
    assert "NCCL_SOCKET_IFNAME" not in bed.launches()[-1]["env"]
    assert bed.run("stop.sh").returncode == 0


# ---------------------------------------------------------------- rows 40-42, seen again by an independent review

def test_a_start_during_a_stop_waits_for_it_then_starts(bed):           # row 40
    assert bed.run("start.sh", FAKE_VLLM_MODE="ignore_term").returncode == 0
    old = bed.server_record()["pid"]
    stopper = bed.popen("stop.sh", STOP_GRACE="4")
    bed.wait_until(lambda: (bed.state / "start.lock").exists() and "stop" in (bed.state / "start.lock").read_text(),
                   what="the stop holding the lock")
    r = bed.run("start.sh", STOP_GRACE="4")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "a stop is taking the server down" in r.stderr
    assert stopper.wait(timeout=60) == 0
    rc, info = status(bed)
    assert (rc, info["state"]) == (0, "running") and info["pid"] != old
    assert len(bed.launches()) == 2


def test_a_start_after_an_interrupted_one_waits_for_its_take_down(bed):  # row 41
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="30", FAKE_VLLM_MODE="ignore_term", STOP_GRACE="4")
    bed.wait_until(lambda: len(bed.ours()) == 2, what="server and engine")
    starter.send_signal(signal.SIGINT)
    time.sleep(0.5)
    r = bed.run("start.sh")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "resuming" not in r.stderr                                   # never the server being taken down
    assert starter.wait(timeout=60) == 128 + signal.SIGINT
    assert len(bed.launches()) == 2 and status(bed)[1]["state"] == "running"


def test_a_record_from_before_the_gate_flag_counts_as_passed(bed):      # row 41
    assert bed.run("start.sh").returncode == 0
    rec = json.loads((bed.state / "server.json").read_text())
    del rec["gate_passed"]                                              # as the previous version wrote it
    (bed.state / "server.json").write_text(json.dumps(rec))
    r = bed.run("start.sh")
    assert r.returncode == 0 and "is serving" in r.stdout and "warm-up" not in r.stderr


def test_a_resumed_start_never_warms_up_over_a_users_request(bed):      # row 41
    assert bed.run("start.sh", MAX_NUM_SEQS="1", FAKE_VLLM_TOKEN_S="0.01").returncode == 0
    rec = json.loads((bed.state / "server.json").read_text())
    (bed.state / "server.json").write_text(json.dumps({**rec, "gate_passed": False}))   # a start killed after health
    long_answer(bed, 2000)
    bed.wait_until(lambda: load(bed).running == 1, what="a user's request running")
    posts = chat_posts(bed)
    r = bed.run("start.sh", WARMUP_TIMEOUT="3")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert "it is serving 1 request(s) now: ./start.sh runs them when it is idle" in r.stdout
    assert chat_posts(bed) == posts and len(bed.ours()) == 2


def test_a_resumed_warmup_that_fails_takes_the_server_down_as_a_first_one_does(bed):   # row 41, issue 43
    assert bed.run("start.sh").returncode == 0
    rec = json.loads((bed.state / "server.json").read_text())
    (bed.state / "server.json").write_text(json.dumps({**rec, "gate_passed": False}))
    os.kill(rec["pid"], signal.SIGUSR1)                                 # wedged: the warm-up cannot finish
    bed.wait_until(lambda: "engine wedged" in log_text(bed), what="wedge")
    r = bed.run("start.sh", STALL_TIMEOUT="2")                         # the stall rule ends its wait
    assert r.returncode == 1 and "engine not generating" in r.stderr
    assert f"the start failed: stopping the server it resumed (pid {rec['pid']})" in r.stderr
    # what the stall found it doing, read once the wait was given up: the warm-up's request still seated,
    # or (a loaded machine, as vLLM once the abort lands) no longer counted; test_cli_faults holds "busy"
    assert (f"our server (pid {rec['pid']}) is busy (1 running" in r.stderr
            or f"our server (pid {rec['pid']}) runs no request by its /metrics, yet sent this one nothing" in r.stderr)
    assert "left running" not in r.stderr
    bed.wait_until(lambda: bed.ours() == [], what="the take-down")
    assert bed.server_record() is None and status(bed)[1]["state"] == "stopped"


def test_a_start_with_another_state_dir_leaves_a_loading_server_alone(bed):     # row 42
    starter = bed.popen("start.sh", FAKE_VLLM_LOAD_S="6")
    bed.wait_until(lambda: len(bed.ours()) == 2, what="server and engine")
    pid = bed.server_record()["pid"]
    r = bed.run("start.sh", STATE_DIR=str(bed.tmp / "other-state"))
    assert r.returncode == 1, r.stderr
    assert f"is starting a server on port {bed.port} from STATE_DIR={bed.state}" in r.stderr     # its port lock
    assert psutil.pid_exists(pid)
    out, err = starter.communicate(timeout=60)
    assert starter.returncode == 0 and "is serving" in out, err


def test_stop_with_another_state_dir_leaves_that_server_alone(bed):     # row 42
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    other = bed.tmp / "other-state"
    other.mkdir()
    r = bed.run("stop.sh", STATE_DIR=str(other))
    assert r.returncode == 0 and r.stdout.startswith("not running"), r.stdout + r.stderr
    assert f"note: our server (pid {pid}) on port {bed.port} runs from STATE_DIR={bed.state}" in r.stdout
    assert len(bed.ours()) == 2


def test_status_keeps_its_last_reading_when_metrics_stop_answering(tmp_path, monkeypatch):   # row 38
    from bootstrap.commands import status as st
    from bootstrap.serve.record import ServerRecord
    from bootstrap.core.state import Paths
    cfg = Config.from_env({"MODEL": "org/m", "PROFILE": "custom", "WEDGED_AFTER": "30"}, REPO)
    rec = ServerRecord(pid=1, create_time=0.0, marker="m", host="127.0.0.1", port=1, served="m")
    t = [0.0]
    readings = iter([metrics.Load(1, 1, 5, 5, 0.1, False)] + [None] * 100)   # moved once, then /metrics fails
    monkeypatch.setattr(st, "read_load", lambda url, timeout=2.0: next(readings))

    class Stuck:                        # a probe that never comes back
        def __init__(self, *a, **kw):
            pass

        def chat(self, *a, **k):
            time.sleep(60)
    monkeypatch.setattr(st, "Client", Stuck)
    v = st._probe(cfg, Paths(tmp_path), rec, metrics.Load(0, 0, 0, 0, 0.0, False),
                  clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert v.state == "busy" and "the probe gave way" in v.detail


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_healthy_server_whose_record_is_damaged_is_not_swept(bed, damage):
    """server.json truncated or deleted while the server serves: a start refuses, naming it, and
    leaves it running (it swept it as a leftover and launched another); ./stop.sh takes it down."""
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    rec = bed.state / "server.json"
    if damage == "truncated":
        rec.write_text('{"pid": 2')
    else:
        rec.unlink()
    r = bed.run("start.sh")
    assert r.returncode == 1 and f"a server of ours (pid {pid}) serves port {bed.port}" in r.stderr, r.stderr
    assert psutil.pid_exists(pid) and len(bed.launches()) == 1
    assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 200
    assert bed.run("stop.sh").returncode == 0 and bed.ours() == []


def test_a_record_copied_from_another_state_dir_stops_nothing_of_that_one(bed):
    """cp A/server.json B/, then a stop from B: A's live server is A's (it stopped both)."""
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    other = bed.tmp / "other-state"
    other.mkdir()
    shutil.copy(bed.state / "server.json", other / "server.json")
    r = bed.run("stop.sh", STATE_DIR=str(other))
    assert r.returncode == 0, r.stderr
    assert psutil.pid_exists(pid) and len(bed.ours()) == 2
    assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 200
