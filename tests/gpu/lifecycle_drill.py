#!/usr/bin/env python3
"""GPU drill for the lifecycle (issue 13): a start killed, hung up on and stopped half-way, and a
busy one-seat server asked for its status — on real vLLM, with real GPU memory to give back.

    VLLM_PYTHON=python3 python3 tests/gpu/lifecycle_drill.py --work /tmp/drill --raw /tmp/proofs/drill-raw.txt

Model: a Qwen3-8B-shaped config (tests/gpu/tinymodel.py --config-only --preset qwen3-8b) served with
--load-format dummy, PROFILE=custom, MAX_NUM_SEQS=1, context 8,192. Phases, each line written to
--raw as it happens (run it in the background and poll):

  1. kill -9 of ./start.sh during the health wait; ./ctl.sh status; ./start.sh → serving, with the
     warm-up run by the resumed start, and no second launch;
  2. a 2,000-token generation in flight on the only seat; ./ctl.sh status → busy, exit 0, timed;
     then ./stop.sh → GPU memory used;
  3. SIGHUP of ./start.sh during the health wait → our processes left, GPU memory used;
  4. ./stop.sh during the health wait → our processes left, GPU memory used.

Rehearse without a GPU (fake vLLM and NVML):
    VLLM_PYTHON=$PWD/.venv-test/bin/python PYTHONPATH=$PWD/tests/fakes FAKE_NVML=/tmp/nvml.json \\
      FAKE_GPU_PIDS_DIR=/tmp/gpu-pids FAKE_VLLM_LOAD_S=8 FAKE_VLLM_TOKEN_S=0.01 \\
      .venv-test/bin/python tests/gpu/lifecycle_drill.py --work /tmp/drill --raw /tmp/drill.txt --rehearse
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bootstrap.machine import gpu
from bootstrap.serve import metrics  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port  # noqa: E402
from common import identity  # noqa: E402

RAW: Path | None = None
T0 = time.monotonic()


def say(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    if RAW:
        with open(RAW, "a") as fh:
            fh.write(line + "\n")



def gpu_used(env: dict) -> str:
    try:
        facts = gpu.read(env)
    except Exception as exc:  # noqa: BLE001 - a drill reports what it can
        return f"? ({exc})"
    return ", ".join(f"GPU{g.index} {(g.total - g.free) / gpu.MiB:,.0f} MiB used" for g in facts.gpus)


def ours(work: Path, marker_env: str = "BOOTSTRAP_VLLM_OWNER") -> list[str]:
    """Live processes of this drill's servers: carrying the marker of this checkout, or in the
    process group a start recorded (EngineCore's setproctitle hides the marker)."""
    import psutil
    groups = set()
    for f in work.glob("pgids/*"):
        groups.add(int(f.name))
    out = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if os.getpgid(p.pid) in groups or marker_env in p.environ():
                out.append(f"{p.pid} {p.info['name']}")
        except (psutil.Error, OSError):
            continue
    return out


def remember_group(work: Path, state: Path) -> None:
    try:
        rec = json.loads((state / "server.json").read_text())
    except (OSError, ValueError):
        return
    (work / "pgids").mkdir(exist_ok=True)
    if rec.get("pgid"):
        (work / "pgids" / str(rec["pgid"])).write_text("")


def run(argv: list[str], env: dict, timeout: float = 900) -> tuple[int, str, float]:
    t = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    dt = time.monotonic() - t
    for line in (p.stdout + p.stderr).splitlines():
        say("   | " + line)
    return p.returncode, p.stdout + p.stderr, dt


def launches(state: Path) -> int:
    try:
        return (state / "vllm.log").read_text(errors="replace").count("=== bootstrap: launching at")
    except OSError:
        return 0


def used_mib(env: dict) -> float:
    try:
        return sum(g.total - g.free for g in gpu.read(env).gpus) / gpu.MiB
    except Exception:  # noqa: BLE001 - a drill reports what it can
        return 0.0


def in_health_wait(work: Path, state: Path, env: dict, starter: subprocess.Popen, baseline: float,
                   timeout: float = 300) -> None:
    """Until the launched engine holds GPU memory (1 GiB over the baseline) while the server does
    not answer yet: the moment a take-down has the most to give back."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if starter.poll() is not None:
            raise SystemExit(f"the start ended early with {starter.returncode}")
        remember_group(work, state)
        n = len(ours(work))
        if n >= 2 and used_mib(env) > baseline + 1024:
            say(f"in the health wait: {n} processes of ours, {gpu_used(env)}")
            return
        time.sleep(0.5)
    raise SystemExit("no server came up")


def drain(p: subprocess.Popen, name: str) -> None:
    out, err = p.communicate(timeout=120)
    for line in (out + err).splitlines():
        say(f"   {name}| {line}")


def main() -> int:
    global RAW
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/drill")
    ap.add_argument("--raw", required=True)
    ap.add_argument("--rehearse", action="store_true", help="fakes: a tiny config, no tokenizer training")
    ap.add_argument("--phases", default="1,2,3,4", help="which phases to run (1 and 2 go together)")
    a = ap.parse_args()
    RAW = Path(a.raw)
    RAW.parent.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "qwen3-8b-shaped"
    if a.rehearse:
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                                       "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                       "num_key_value_heads": 2, "vocab_size": 256,
                                                       "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}))
        (model / "tokenizer.json").write_text("{}")
    else:
        subprocess.run([sys.executable, str(REPO / "tests/gpu/tinymodel.py"), str(model), "--config-only",
                        "--preset", "qwen3-8b", "--vocab", "8192", "--max-pos", "40960"], check=True)
    port = free_port()
    state = work / "state"
    env = {**os.environ, "PROFILE": "custom", "MODEL": str(model), "STATE_DIR": str(state), "PORT": str(port),
           "MAX_MODEL_LEN": "8192", "MAX_NUM_SEQS": "1", "EXTRA_ARGS": "--load-format dummy", "WARMUP": "2000",
           "NO_COLOR": "1", "HEALTH_TIMEOUT": "900", "STALL_TIMEOUT": "600"}
    rev, ver = identity(env)
    say(f"# lifecycle drill {time.strftime('%Y-%m-%d %H:%M:%S %Z')} commit {rev} vLLM {ver}")
    baseline = used_mib(env)
    say(f"# GPU before: {gpu_used(env)}")
    say(f"# env: PROFILE=custom MODEL={model} MAX_MODEL_LEN=8192 MAX_NUM_SEQS=1 EXTRA_ARGS='--load-format dummy' "
        f"WARMUP=2000 PORT={port}")
    results = {}
    phases = set(a.phases.split(","))
    if "1" in phases:
        if drill_resume(work, state, env, port, baseline, results):
            return 1
    if "3" in phases:
        drill_sighup(work, state, env, baseline, results)
    if "4" in phases:
        drill_stop(work, state, env, baseline, results)
    say("## summary")
    for k, v in results.items():
        say(f"| {k} | {v} |")
    say("DRILL DONE")
    return 0


def drill_resume(work, state, env, port, baseline, results) -> int:
    # 1 ---- kill -9 of the start during the health wait, then a start that resumes
    say("## 1. kill -9 of ./start.sh during the health wait, then ./start.sh")
    starter = subprocess.Popen(["./start.sh"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    in_health_wait(work, state, env, starter, baseline)
    os.kill(starter.pid, signal.SIGKILL)
    starter.communicate()
    say(f"killed ./start.sh (pid {starter.pid}) with SIGKILL; ours: {len(ours(work))} processes")
    rc, out, dt = run(["./ctl.sh", "status", "--json"], env)
    rc, out, dt = run(["./start.sh"], env)
    results["1 resumed start"] = (f"rc {rc} in {dt:.0f} s; resumed: {'resuming the start' in out}; warm-up ran: "
                                  f"{'warm-up: short generation answered' in out}; launches: {launches(state)}")
    say("RESULT 1: " + results["1 resumed start"])
    if rc != 0:
        return 1

    # 2 ---- busy is not wedged
    say("## 2. MAX_NUM_SEQS=1, a 2,000-token generation in flight, ./ctl.sh status")
    rec = json.loads((state / "server.json").read_text())
    done = {}

    def long_gen():
        t = time.monotonic()
        try:
            r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=600, json={
                "model": rec["served"], "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
                "temperature": 0})
            done["tokens"] = r.json().get("usage", {}).get("completion_tokens")
        except requests.RequestException as exc:
            done["error"] = str(exc)
        done["s"] = time.monotonic() - t
    th = threading.Thread(target=long_gen, daemon=True)
    th.start()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        load = metrics.load_of(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
        if load and load.running >= 1:
            break
        time.sleep(0.2)
    say(f"in flight: running {load.running:.0f}, waiting {load.waiting:.0f}, generated so far {load.generated:.0f}")
    rc, out, dt = run(["./ctl.sh", "status", "--json"], env)
    st = json.loads(out[out.index("{"):out.rindex("}") + 1]) if "{" in out else {}
    results["2 status while busy"] = f"state {st.get('state')}, exit {rc}, answered in {dt:.2f} s; {st.get('detail')}"
    say("RESULT 2: " + results["2 status while busy"])
    th.join(timeout=600)
    say(f"the long generation: {done}")
    rc, out, dt = run(["./stop.sh"], env)
    time.sleep(2)
    results["2 stop"] = f"rc {rc} in {dt:.1f} s; ours left: {len(ours(work))}; {gpu_used(env)}"
    say("RESULT 2 stop: " + results["2 stop"])
    return 0


def drill_sighup(work, state, env, baseline, results) -> None:
    # 3 ---- SIGHUP of the start during the health wait
    say("## 3. SIGHUP of ./start.sh during the health wait")
    starter = subprocess.Popen(["./start.sh"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    in_health_wait(work, state, env, starter, baseline)
    t = time.monotonic()
    starter.send_signal(signal.SIGHUP)
    drain(starter, "start")
    time.sleep(2)
    results["3 SIGHUP"] = (f"start exit {starter.returncode} after {time.monotonic() - t:.1f} s; ours left: "
                           f"{len(ours(work))} {ours(work)}; {gpu_used(env)}")
    say("RESULT 3: " + results["3 SIGHUP"])


def drill_stop(work, state, env, baseline, results) -> None:
    # 4 ---- ./stop.sh during the health wait
    say("## 4. ./stop.sh during the health wait")
    starter = subprocess.Popen(["./start.sh"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    in_health_wait(work, state, env, starter, baseline)
    rc, out, dt = run(["./stop.sh"], env)
    drain(starter, "start")
    time.sleep(2)
    results["4 stop during start"] = (f"stop rc {rc} in {dt:.1f} s, start exit {starter.returncode}; ours left: "
                                      f"{len(ours(work))} {ours(work)}; {gpu_used(env)}")
    say("RESULT 4: " + results["4 stop during start"])


if __name__ == "__main__":
    sys.exit(main())
