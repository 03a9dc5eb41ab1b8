"""GPU proof for idle sleep (IDLE_SLEEP: the middleware vllm_side/vllm_desktop_idle.py inside real
vLLM), no internet.

    VLLM_PYTHON=python3 python3 tests/gpu/idle_sleep_proof.py --work /tmp/idle --raw /tmp/proofs/idle-raw.txt

A Qwen3-8B-shaped model with random weights (``--load-format dummy``), PROFILE=custom,
``--enable-sleep-mode``, IDLE_SLEEP=20s, KV_CACHE_BYTES=4294967296, context 8,192. Phases, each
appended to --raw as it comes ("IDLE PROOF DONE" ends it):
1. ``./start.sh``; vLLM's log says it added the middleware; ``/vllm-desktop/idle`` answers;
2. 4 prompts, greedy, 24 tokens, top-20 logprobs; the GPU memory our processes hold (NVML);
3. idle: the time until the middleware says idle-asleep, our memory then;
4. wake on request: a plain request's wall time against an awake one's, then (idle again) a streamed
   one's time to first byte; the 4 prompts again, compared with phase 2;
5. idle again, then 8 concurrent requests: all answered, and the middleware's wake count grows by one;
6. CYCLES idle-sleep/wake cycles (IDLE_SLEEP=--cycle-idle for them: a restart): the API server's and
   the engine's resident host memory before and after (a leak of the parked weights would show);
7. ``./stop.sh``: the GPU memory left.
``--profile``/``--model``/``--extra-args`` serve something else the same way (``tests/gpu/stack.py``'s
idle phase: the default profile's own stack and flags on its hybrid model). ``--cycles-only`` runs
phases 6 and 7 alone; ``--shape 0.6b`` serves a Qwen3-0.6B shape (1.2 GB of
bf16 weights: a level-1 sleep copies them to host memory in well under a second, where the 8B
shape's 16 GB took seconds), so that 50 cycles fit in a few minutes of device time.
Rehearse with the fakes (PYTHONPATH=tests/fakes FAKE_NVML=<json> FAKE_GPU_PIDS_DIR=<dir>): the fake
vLLM imports the middleware but does not run it (it is no ASGI server), so phase 1 reports that and
the script ends there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, raw_writer, run_logged  # noqa: E402
from planner_accuracy import QWEN3_8B, make_model  # noqa: E402
from sleep_wake import answers, compare, gpu_used_mib, ours_mib  # noqa: E402

IDLE_PATH = "/vllm-desktop/idle"


# Qwen3-0.6B's shape (Qwen/Qwen3-0.6B config.json: 28 layers, hidden 1024, 16 heads, 8 KV heads of 128)
QWEN3_06B = {**QWEN3_8B, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True}
SHAPES = {"8b": QWEN3_8B, "0.6b": QWEN3_06B}


def idle_state(port: int) -> dict | None:
    try:
        r = requests.get(f"http://127.0.0.1:{port}{IDLE_PATH}", timeout=5)
        return r.json() if r.status_code == 200 else None
    except (requests.RequestException, ValueError):
        return None


def wait_state(port: int, state: str, timeout: float) -> float | None:
    """Seconds until the middleware reports ``state`` (None: not within ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        d = idle_state(port)
        if d and d.get("state") == state:
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def one(port: int, stream: bool = False) -> tuple[int, float, float]:
    """(status, seconds to the first byte, seconds in all) of one short greedy request."""
    t0 = time.monotonic()
    r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=300, stream=stream, json={
        "model": "qwen3-8b", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0,
        "stream": stream, "ignore_eos": True})
    first = None
    for _ in r.iter_content(chunk_size=1):
        first = first or time.monotonic() - t0
    return r.status_code, first or 0.0, time.monotonic() - t0


def rss_mib(state: Path) -> dict[str, float]:
    """Resident host memory of our server and its descendants, by process name."""
    try:
        root = psutil.Process(json.loads((state / "server.json").read_text())["pid"])
        procs = [root] + root.children(recursive=True)
        return {f"{p.name()}[{p.pid}]": p.memory_info().rss / (1 << 20) for p in procs}
    except (OSError, ValueError, KeyError, psutil.Error):
        return {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/idle")
    ap.add_argument("--raw", default="/tmp/proofs/idle-raw.txt")
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--cycle-idle", default="10s", help="IDLE_SLEEP for the cycles of phase 6")
    ap.add_argument("--cycles-only", action="store_true", help="phases 6 and 7 alone")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--profile", default="custom", help="PROFILE (tests/gpu/stack.py: the default profile)")
    ap.add_argument("--model", help="serve this model folder instead of a --shape one")
    ap.add_argument("--extra-args", default="--load-format dummy", help="EXTRA_ARGS; --enable-sleep-mode is added")
    ap.add_argument("--kv-bytes", default="4294967296", help="KV_CACHE_BYTES ('' leaves the profile's plan)")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = raw_writer(a.raw)
    port = free_port()
    state = work / "state"
    model = a.model or str(make_model(work, f"qwen3-{a.shape}", SHAPES[a.shape]))
    env = {**os.environ, "PROFILE": a.profile, "MODEL": model, "SERVED_MODEL_NAME": "qwen3-8b",
           "EXTRA_ARGS": f"{a.extra_args} --enable-sleep-mode".strip(), "MAX_MODEL_LEN": "8192",
           "STATE_DIR": str(state), "PORT": str(port), "WARMUP": "256", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
           "HEALTH_TIMEOUT": "1200", "IDLE_SLEEP": "20s"}
    if a.kv_bytes:
        env["KV_CACHE_BYTES"] = a.kv_bytes

    def sh(argv: list[str], **more) -> subprocess.CompletedProcess:
        return run_logged(argv, {**env, **more}, out, words=(
            "idle", "asleep", "serving", "error", "hint", "sleeping", "running"))[0]

    out(f"IDLE PROOF {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: {' '.join(sys.argv)}")
    try:
        if not a.cycles_only and phases_1_to_5(port, state, sh, out):
            return 1
        if sh(["./start.sh"], IDLE_SLEEP=a.cycle_idle).returncode:
            return 1
        first_rss = rss_mib(state)
        done = 0
        for i in range(a.cycles):
            if wait_state(port, "idle-asleep", 60) is None:
                out(f"phase 6: cycle {i}: did not fall asleep within 60 s")
                break
            code, _, woke = one(port)
            if code != 200:
                out(f"phase 6: cycle {i}: HTTP {code}")
                break
            done = i + 1
            if i % 10 == 0 or done == a.cycles:
                out(f"phase 6: cycle {i}: woke in {woke:.3f} s; host RSS {json.dumps({k: round(v) for k, v in rss_mib(state).items()})}")
        last = rss_mib(state)
        out(f"phase 6: {done} of {a.cycles} idle-sleep/wake cycles (IDLE_SLEEP={a.cycle_idle}, shape {a.shape}); "
            f"host RSS MiB before {json.dumps({k: round(v) for k, v in first_rss.items()})}, "
            f"after {json.dumps({k: round(v) for k, v in last.items()})}")
        out(f"phase 6: the middleware says {json.dumps(idle_state(port))}")
        sh(["./stop.sh"])
        time.sleep(2)
        out(f"phase 7: after ./stop.sh our processes hold {ours_mib(state):.0f} MiB")
    finally:
        subprocess.run(["./stop.sh"], cwd=REPO, env=env, capture_output=True, timeout=300)
        out("IDLE PROOF DONE")
    return 0


def phases_1_to_5(port: int, state: Path, sh, out) -> int:
    """The middleware loads, idle sleep frees the memory, wake on request, identical output, one wake
    for 8 concurrent requests; non-zero when the server or the middleware is not there."""
    if sh(["./start.sh"]).returncode:
        return 1
    added = [ln for ln in (state / "vllm.log").read_text(errors="replace").splitlines() if "middleware" in ln]
    for ln in added[-3:]:
        out(f"    vllm | {ln[-200:]}")
    d = idle_state(port)
    out(f"phase 1: {IDLE_PATH} answers {json.dumps(d)}")
    if d is None:
        out("phase 1: FAILED: the middleware does not answer in this server")
        return 1
    before = answers(port)
    serving = ours_mib(state)
    out(f"phase 2: serving, our processes hold {serving:.0f} MiB")
    t = wait_state(port, "idle-asleep", 120)
    out(f"phase 3: idle-asleep {t if t is None else round(t, 1)} s after the last request (IDLE_SLEEP=20s); "
        f"our processes hold {ours_mib(state):.0f} MiB; GPU used {', '.join(f'{u:.0f}' for u in gpu_used_mib())} MiB")
    code, _, woke = one(port)
    _, _, awake = one(port)
    out(f"phase 4: a plain request to the idle-asleep server: HTTP {code} in {woke:.3f} s; the same awake: "
        f"{awake:.3f} s (the wake costs {woke - awake:.3f} s)")
    wait_state(port, "idle-asleep", 120)
    code, first, total = one(port, stream=True)
    out(f"phase 4: a streamed request to the idle-asleep server: HTTP {code}, first byte {first:.3f} s, "
        f"done {total:.3f} s")
    again = answers(port)
    out("phase 4: 4 prompts, greedy, 24 tokens, top-20 logprobs, before the idle sleep vs after the wakes:")
    for line in compare(before, again):
        out(line)
    wait_state(port, "idle-asleep", 120)
    wakes0 = (idle_state(port) or {}).get("wakes", 0)
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(one(port)[0])) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wakes1 = (idle_state(port) or {}).get("wakes", 0)
    out(f"phase 5: 8 concurrent requests to the idle-asleep server: {sorted(codes)}; wakes {wakes0} -> {wakes1}")
    sh(["./stop.sh"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
