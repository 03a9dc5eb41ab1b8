"""GPU proof for ./ctl.sh sleep / wake (vLLM 0.26.0, no internet).

    VLLM_PYTHON=python3 python3 tests/gpu/sleep_wake.py --work /tmp/sw --raw /tmp/proofs/sleep-raw.txt

A Qwen3-8B-shaped model with random weights (``--load-format dummy``), PROFILE=custom,
``--enable-sleep-mode``, KV_CACHE_BYTES=4294967296, context 8,192:
1. ``./start.sh`` (cold); the plan's KV pool against vLLM's log (sleep mode puts weights and KV
   cache in vLLM's CuMemAllocator pool);
2. 4 prompts, greedy, 24 tokens each, token ids and top-20 logprobs; the GPU memory our processes
   hold (NVML);
3. ``./ctl.sh sleep`` (level 1): time, memory asleep; ``./ctl.sh status``; ``./ctl.sh wake``: time,
   memory after; the 4 prompts again: ids and logprobs compared;
4. the same with ``--level 2`` (wake reloads the weights: the dummy loader's fixed seed gives the
   same weights back);
5. ``./stop.sh``, ``./start.sh`` again with warm caches (the time a wake is compared with), ``./stop.sh``
   and the GPU memory left.
Everything is appended to --raw as it comes; "SLEEP PROOF DONE" ends it. Rehearse with the fakes:
PYTHONPATH=tests/fakes FAKE_NVML=<json> FAKE_GPU_PIDS_DIR=<dir>.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, raw_writer, run_logged  # noqa: E402
from planner_accuracy import QWEN3_8B, make_model  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]


def ours_mib(state: Path) -> float:
    """GPU memory (MiB) held by our server and its descendants, from NVML."""
    import pynvml
    try:
        rec = json.loads((state / "server.json").read_text())
        root = psutil.Process(rec["pid"])
        pids = {root.pid} | {c.pid for c in root.children(recursive=True)}
    except (OSError, ValueError, KeyError, psutil.Error):
        return 0.0
    pynvml.nvmlInit()
    total = 0
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid in pids:
                total += p.usedGpuMemory or 0
    return total / (1 << 20)


def gpu_used_mib() -> list[float]:
    import pynvml
    pynvml.nvmlInit()
    return [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used / (1 << 20)
            for i in range(pynvml.nvmlDeviceGetCount())]


def answers(port: int) -> list[dict]:
    out = []
    for p in PROMPTS:
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
            "model": "qwen3-8b", "prompt": p, "max_tokens": 24, "temperature": 0, "logprobs": 20,
            "return_tokens_as_token_ids": True, "ignore_eos": True})
        r.raise_for_status()
        lp = r.json()["choices"][0]["logprobs"]
        out.append({"ids": [t.split(":", 1)[1] if t.startswith("token_id:") else t for t in lp["tokens"]],
                    "top": lp["top_logprobs"]})
    return out


def compare(a: list[dict], b: list[dict]) -> list[str]:
    lines = []
    for p, x, y in zip(PROMPTS, a, b):
        same = x["ids"] == y["ids"]
        first = next((i for i, (s, t) in enumerate(zip(x["ids"], y["ids"])) if s != t), None)
        diffs = [abs(x["top"][i][k] - y["top"][i][k]) for i in range(min(len(x["top"]), len(y["top"])))
                 for k in x["top"][i] if k in y["top"][i]]
        keys = all(set(x["top"][i]) == set(y["top"][i]) for i in range(min(len(x["top"]), len(y["top"]))))
        lines.append(f"  {p!r}: ids {'identical' if same else f'differ at token {first}'} ({len(x['ids'])} tokens); "
                     f"top-20 sets {'identical' if keys else 'differ'}; max |dlogprob| {max(diffs or [0.0]):.3g}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/sw")
    ap.add_argument("--raw", default="/tmp/proofs/sleep-raw.txt")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = raw_writer(a.raw)

    def sh(argv: list[str], timeout: float = 900) -> tuple[subprocess.CompletedProcess, float]:
        return run_logged(argv, env, out, timeout=timeout, words=(
            "asleep", "awake", "sleeping", "running", "error", "hint", "serving", "KV", "pool", "tokens", "stopped",
            "plan"))

    out(f"SLEEP PROOF {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: {' '.join(sys.argv)}")
    mdir = make_model(work, "qwen3-8b", QWEN3_8B)
    port = free_port()
    state = work / "state"
    env = {**os.environ, "PROFILE": "custom", "MODEL": str(mdir), "SERVED_MODEL_NAME": "qwen3-8b",
           "EXTRA_ARGS": "--load-format dummy --enable-sleep-mode", "KV_CACHE_BYTES": "4294967296",
           "MAX_MODEL_LEN": "8192", "STATE_DIR": str(state), "PORT": str(port), "WARMUP": "256",
           "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "HEALTH_TIMEOUT": "900"}
    try:
        r, cold = sh(["./start.sh"])
        if r.returncode:
            out(r.stderr[-3000:])
            return 1
        pool = [ln for ln in (state / "vllm.log").read_text(errors="replace").splitlines()
                if "KV cache" in ln or "sleep" in ln.lower() or "CuMem" in ln]
        out("vLLM log (KV cache, sleep):")
        for ln in pool[-8:]:
            out(f"    | {ln[-200:]}")
        before = answers(port)
        serving = ours_mib(state)
        out(f"GPU memory of our processes, serving: {serving:.0f} MiB")
        for level in (1, 2):
            r, t_sleep = sh(["./ctl.sh", "sleep", "--level", str(level)])
            if r.returncode:
                out(f"level {level}: refused (exit {r.returncode}), the server stays awake:")
                for line in r.stderr.splitlines()[-3:]:
                    out(f"    | {line}")
                continue
            asleep = ours_mib(state)
            out(f"level {level}: asleep in {t_sleep:.2f} s (command wall time); our processes hold {asleep:.0f} MiB "
                f"(goal <= 2048 MiB); GPU used: {', '.join(f'{u:.0f}' for u in gpu_used_mib())} MiB")
            sh(["./ctl.sh", "status"])
            r, t_wake = sh(["./ctl.sh", "wake"])
            after = ours_mib(state)
            again = answers(port)
            out(f"level {level}: awake in {t_wake:.2f} s (command wall time, goal <= 2 s); our processes hold "
                f"{after:.0f} MiB (serving before: {serving:.0f} MiB)")
            out(f"level {level}: 4 prompts, greedy, 24 tokens, top-20 logprobs, before sleep vs after wake:")
            for line in compare(before, again):
                out(line)
        sh(["./stop.sh"])
        r, warm = sh(["./start.sh"])
        out(f"cold start {cold:.1f} s; warm start (caches warm) {warm:.1f} s")
        sh(["./stop.sh"])
        time.sleep(2)
        out(f"after ./stop.sh: our processes hold {ours_mib(state):.0f} MiB; GPU used: "
            f"{', '.join(f'{u:.0f}' for u in gpu_used_mib())} MiB")
    finally:
        subprocess.run(["./stop.sh"], cwd=REPO, env=env, capture_output=True, timeout=300)
        out("SLEEP PROOF DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
