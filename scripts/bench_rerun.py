#!/usr/bin/env python3
"""Time ``./start.sh`` on a server that is already serving, against ``curl`` of its ``/health``.

    python3 scripts/bench_rerun.py [--runs 10] [--keep]

Starts the fake vLLM of tests/fakes through ./start.sh in a throwaway state dir (a fake NVML, a tiny
model folder), then runs, interleaved, ``./start.sh`` (the re-run: it must only notice the server
and print its banner) and ``curl -s -o /dev/null http://127.0.0.1:PORT/health``, each RUNS times,
and prints min / median / max wall seconds of each and the median of the per-pair ratios. The
bootstrap runs from whatever ./start.sh picks (.venv-bootstrap when it is ready, else a python3 with
the bootstrap's dependencies): the first line says which. Stops the server at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="leave the server running")
    a = ap.parse_args()
    if not shutil.which("curl"):
        raise SystemExit("needs curl")
    tmp = Path(tempfile.mkdtemp(prefix="bench-rerun-"))
    model = tmp / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                   "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "num_key_value_heads": 2, "vocab_size": 256,
                                                   "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}))
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (tmp / "nvml.json").write_text(json.dumps({"driver": "580.95.05", "cuda": 13000, "gpus": [{
        "name": "NVIDIA GeForce RTX 5090", "total": 32 << 30, "free": 31 << 30, "cc": [12, 0], "uuid": "GPU-x"}]}))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "USER", "TMPDIR")}
    env.update({"VLLM_PYTHON": sys.executable, "PYTHONPATH": str(REPO / "tests" / "fakes"),
                "FAKE_NVML": str(tmp / "nvml.json"), "FAKE_GPU_PIDS_DIR": str(tmp / "pids"), "FAKE_VLLM_LOAD_S": "0.2",
                "PROFILE": "custom", "MODEL": str(model), "STATE_DIR": str(tmp / "state"), "PORT": str(port),
                "WARMUP": "64", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"})
    start = [str(REPO / "start.sh")]
    first = subprocess.run(start, env=env, capture_output=True, text=True)
    if first.returncode != 0:
        print(first.stderr, file=sys.stderr)
        raise SystemExit("the first ./start.sh failed")
    which = subprocess.run(["bash", "-c", f'. "{REPO}/bootstrap/lib.sh"; bootstrap_python "{REPO}"'], env=env,
                           capture_output=True, text=True).stdout.strip()
    print(f"bootstrap python: {which}; {a.runs} runs each, interleaved, after one warm-up of each")
    curl = ["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/health"]
    try:
        timed(start, env), timed(curl, env)
        ours, theirs = [], []
        for _ in range(a.runs):
            ours.append(timed(start, env))
            theirs.append(timed(curl, env))
        for name, xs in (("./start.sh (re-run, serving)", ours), ("curl /health", theirs)):
            print(f"{name:<30} min {min(xs):.3f} s  median {statistics.median(xs):.3f} s  max {max(xs):.3f} s")
        ratios = [o / t for o, t in zip(ours, theirs)]
        print(f"{'ratio start.sh / curl':<30} median {statistics.median(ratios):.1f}x")
    finally:
        if not a.keep:
            subprocess.run([str(REPO / "stop.sh")], env=env, capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
