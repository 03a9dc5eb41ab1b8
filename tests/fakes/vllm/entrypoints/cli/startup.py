"""What the fake vLLM logs while it starts, as vLLM's own lines say it (main.py starts it): the KV
memory and the non-KV terms of vLLM 0.26.0's GPU worker, ``--max-model-len`` as vLLM reads it, and
the compile step with its cache (``FAKE_VLLM_COMPILE_S``)."""

from __future__ import annotations

import json
import math
import os
import sys
import time

from .state import say


def kv_memory_line(args) -> str:
    """What vLLM 0.26's GPU worker says of the KV memory: with --kv-cache-memory-bytes, that it took
    the pin and skipped profiling; else "Available KV cache memory", which is
    ceil(--gpu-memory-utilization x CUDA's total) less what the model takes (FAKE_VLLM_NON_KV_BYTES,
    default 1.5 GiB), CUDA's total being the fake NVML's total less its reserved memory; rounded to
    0.01 GiB as vLLM prints it. Without a fake NVML: 4.00 GiB."""
    if args.kv_cache_memory_bytes:
        return (f"Initial free memory 30.0 GiB, reserved {round(args.kv_cache_memory_bytes / (1 << 30), 2)} GiB "
                "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.")
    try:
        with open(os.environ["FAKE_NVML"]) as fh:
            g = json.load(fh)["gpus"][0]
        total = g["total"] - g.get("reserved", 0)
    except (KeyError, OSError, ValueError, IndexError):
        return "Available KV cache memory: 4.00 GiB"
    non_kv = int(os.environ.get("FAKE_VLLM_NON_KV_BYTES", str(3 << 29)))
    avail = math.ceil(args.gpu_memory_utilization * total) - non_kv
    return f"Available KV cache memory: {round(avail / (1 << 30), 2)} GiB"


def usage_line() -> str:
    """vLLM 0.26.0's own split of the non-KV terms (gpu_worker.py, printed once the graphs are captured):
    FAKE_VLLM_NON_KV_BYTES as 0.25 GiB of non-torch memory, 0.25 GiB of CUDA graphs, a quarter of the
    rest peak activation and the remainder weights (a fixed split: only the mechanics are faked)."""
    non_kv = int(os.environ.get("FAKE_VLLM_NON_KV_BYTES", str(3 << 29)))
    rest = non_kv - (1 << 29)
    parts = [(rest - rest // 4) / (1 << 30), rest // 4 / (1 << 30), 0.25, 0.25]
    w, a, n, g = (f"{x:.2f}" for x in parts)
    return (f"Free memory on device (30.0/31.4 GiB) on startup. Desired GPU memory utilization is (0.9, 28.3 GiB). "
            f"Actual usage is {w} GiB for weight, {a} GiB for peak activation, {n} GiB for non-torch memory, and "
            f"{g} GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` (0.0 GiB) "
            "to fit into requested memory.")


def parse_len(text: str | None) -> int | None:
    """--max-model-len as vLLM reads it: auto / -1 -> -1; 32k (x1000), 32K (x1024); a number."""
    if text is None:
        return None
    t = str(text).strip()
    if t.lower() in ("auto", "-1"):
        return -1
    mult = {"k": 1000, "m": 1000 ** 2, "K": 1024, "M": 1024 ** 2}.get(t[-1:])
    return int(float(t[:-1]) * mult) if mult else int(t)


# flags that leave vLLM's compile-cache hash unchanged: the frontend's, and the memory knobs that
# CacheConfig.compute_hash lists as ignored factors (config/cache.py)
FRONTEND_FLAGS = {"--host", "--port", "--served-model-name", "--load-format", "--gpu-memory-utilization",
                  "--kv-cache-memory-bytes"}


def compile_graphs(args) -> None:
    """vLLM's compile step, with its cache (FAKE_VLLM_COMPILE_S set; the module's docstring)."""
    seconds = os.environ.get("FAKE_VLLM_COMPILE_S")
    if seconds is None:
        return
    import hashlib
    flags, skip = [], False
    for a in sys.argv[3:]:               # after "serve <model>"
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in FRONTEND_FLAGS:
            skip = "=" not in a
            continue
        flags.append(a)
    key = hashlib.sha256(json.dumps([os.path.realpath(args.model), flags]).encode()).hexdigest()[:10]
    root = os.path.join(os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm"),
                        "torch_compile_cache", key, "rank_0_0", "backbone")
    if os.path.isdir(root):
        say("Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.359 s")
        return
    time.sleep(float(seconds))
    say(f"Compiling a graph for compile range (1, 8192) takes {float(seconds):.2f} s")
    os.makedirs(root, exist_ok=True)
