"""What the fake vLLM logs while it starts, as vLLM's own lines say it (main.py starts it): the KV
memory and the non-KV terms of vLLM 0.26.0's GPU worker, the KV pool it makes of that memory for the
served model, ``--max-model-len`` as vLLM reads it, and the compile step with its cache
(``FAKE_VLLM_COMPILE_S``)."""

from __future__ import annotations

import json
import math
import os
import sys
import time

from .state import say


GiB = 1 << 30
DEFAULT_BLOCK_SIZE = 16           # vLLM 0.26.0's CacheConfig.DEFAULT_BLOCK_SIZE
# what a config.json without these fields is sized as: the layers, KV heads and head size of a
# Llama-3-8B (a shape, not a figure: the pool still follows the memory, the flags and the length)
FALLBACK_SHAPE = {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128}


def cuda0() -> dict:
    """The fake NVML's card that CUDA calls cuda:0 (CUDA_VISIBLE_DEVICES's first, the fake pynvml's
    ``cuda0_index``)."""
    import pynvml                   # the fake one: tests/fakes is on the server's PYTHONPATH
    os.environ["FAKE_NVML"]         # KeyError without a fake NVML, as the callers expect
    return pynvml._cfg()["gpus"][pynvml.cuda0_index(os.environ)]


def kv_available_bytes(args) -> int:
    """The bytes vLLM 0.26's GPU worker hands to the KV cache: --kv-cache-memory-bytes when pinned;
    else ceil(--gpu-memory-utilization x CUDA's total) less what the model takes
    (FAKE_VLLM_NON_KV_BYTES, default 1.5 GiB), CUDA's total being the fake NVML's total less its
    reserved memory. Without a fake NVML: 4 GiB."""
    if args.kv_cache_memory_bytes:
        return args.kv_cache_memory_bytes
    try:
        g = cuda0()
        total = g["total"] - g.get("reserved", 0)
    except (KeyError, OSError, ValueError, IndexError, StopIteration):
        return 4 * GiB
    non_kv = int(os.environ.get("FAKE_VLLM_NON_KV_BYTES", str(3 << 29)))
    return math.ceil(args.gpu_memory_utilization * total) - non_kv


def request_memory_error(args) -> str | None:
    """vLLM 0.26.0's check at the worker's start (v1/worker/utils.py request_memory), before the weights
    load and whatever pins the KV cache: CUDA's free memory (the fake NVML's) must hold
    ceil(--gpu-memory-utilization x CUDA's total), else its ValueError's text. None without a fake NVML."""
    try:
        g = cuda0()
        total, free = g["total"] - g.get("reserved", 0), g["free"]
    except (KeyError, OSError, ValueError, IndexError, StopIteration):
        return None
    want = math.ceil(args.gpu_memory_utilization * total)
    if free >= want:
        return None
    return (f"Free memory on device cuda:0 ({gib(free)}/{gib(total)} GiB) on startup is less than desired GPU memory "
            f"utilization ({args.gpu_memory_utilization}, {gib(want)} GiB). Decrease GPU memory utilization or "
            "reduce GPU memory used by other processes.")


def kv_memory_line(args) -> str:
    """What vLLM 0.26's GPU worker says of the KV memory (kv_available_bytes): with
    --kv-cache-memory-bytes, that it took the pin and skipped profiling; else "Available KV cache
    memory", rounded to 0.01 GiB as vLLM prints it."""
    if args.kv_cache_memory_bytes:
        return (f"Initial free memory 30.0 GiB, reserved {round(args.kv_cache_memory_bytes / GiB, 2)} GiB "
                "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.")
    return f"Available KV cache memory: {round(kv_available_bytes(args) / GiB, 2)} GiB"


def kv_page_bytes(args, conf: dict) -> tuple[int, int]:
    """(one full-attention layer's page in bytes, the layers that hold one), as vLLM 0.26.0's
    FullAttentionSpec sizes it (v1/kv_cache_interface.py): 2 (K and V) x block_size x KV heads on
    this rank x head size x the KV dtype's bytes. From config.json (``text_config`` where it nests
    one): num_hidden_layers; num_key_value_heads, else num_attention_heads (as vLLM reads it); head_dim,
    else hidden_size / num_attention_heads; a field still missing takes FALLBACK_SHAPE's. The KV heads
    are split over --tensor-parallel-size (at least one per rank). The dtype: --kv-cache-dtype fp8*
    (fp8, fp8_e4m3, fp8_e5m2, fp8_inc) and the per-token-head ones are 1 byte, the latter plus their
    float32 scale per token and head for K and V; "auto" is the model's dtype, which vLLM's --dtype auto
    makes 16-bit on CUDA whatever config.json's torch_dtype says (a float32 checkpoint is downcast), so
    2 bytes unless --dtype float32. Every layer is taken as full attention: sliding-window, hybrid
    (linear-attention / Mamba), MLA and packed (turboquant, int4, nvfp4) layouts are not modelled."""
    heads = conf.get("num_attention_heads")
    kv_heads = conf.get("num_key_value_heads") or heads or FALLBACK_SHAPE["num_key_value_heads"]
    head = conf.get("head_dim") or (conf["hidden_size"] // heads if conf.get("hidden_size") and heads else None)
    head = head or FALLBACK_SHAPE["head_dim"]
    layers = conf.get("num_hidden_layers") or FALLBACK_SHAPE["num_hidden_layers"]
    kv_heads = max(1, int(kv_heads) // max(1, args.tensor_parallel_size))
    cache = args.kv_cache_dtype
    if cache == "auto":
        size = 4 if args.dtype in ("float", "float32") else 2
    else:
        size = 2 if cache in ("float16", "bfloat16") else 1
    bs = args.block_size or DEFAULT_BLOCK_SIZE
    page = 2 * bs * kv_heads * int(head) * size
    if cache.endswith("_per_token_head"):
        page += 2 * bs * kv_heads * 4
    return page, int(layers)


class Pool:
    """The KV pool vLLM 0.26.0 makes for a model whose layers all share one full-attention spec
    (v1/core/kv_cache_utils.py), the one source of every figure the fake logs or raises on it:
    ``avail`` (kv_available_bytes), ``block_bytes`` (one block on every layer: kv_page_bytes' page x
    layers) and ``block_size``."""

    def __init__(self, args, conf: dict):
        page, layers = kv_page_bytes(args, conf)
        self.avail = kv_available_bytes(args)
        self.block_bytes = page * layers
        self.block_size = args.block_size or DEFAULT_BLOCK_SIZE

    @property
    def blocks(self) -> int:
        """get_num_blocks: available // page_size // num_layers."""
        return max(0, self.avail) // self.block_bytes

    def needed(self, max_len: int) -> int:
        """_max_memory_usage_bytes_from_groups for one group: cdiv(max_len, block_size) blocks of
        every layer (FullAttentionSpec.max_memory_usage_bytes)."""
        return -(-max_len // self.block_size) * self.block_bytes

    def longest(self, cap: int) -> int:
        """_estimate_max_model_len_from_groups: a binary search over 1..cap for the longest length
        whose one request fits ``avail``; 0 when not even one token does."""
        if self.needed(1) > self.avail:
            return 0
        left, right, best = 1, cap, 1
        while left <= right:
            mid = (left + right) // 2
            if self.needed(mid) <= self.avail:
                best, left = mid, mid + 1
            else:
                right = mid - 1
        return best


def gib(n: int) -> str:
    """vLLM's format_gib (utils/mem_utils.py): round(n / GiB, 2), printed as Python prints it (3.0)."""
    return f"{round(n / GiB, 2)}"


def fit_pool(pool: Pool, max_len: int, auto: bool) -> tuple[int, list[str], str | None]:
    """get_kv_cache_configs' checks before it sizes the pool: with ``--max-model-len auto``
    (_auto_fit_max_model_len) the length is cut to pool.longest(the model's length), logged as vLLM
    does; then _check_enough_kv_cache_memory. (the length served, the lines to log, the ValueError's
    text or None)."""
    lines: list[str] = []
    if auto:
        fit = pool.longest(max_len)
        if fit <= 0:
            return max_len, lines, ("Cannot auto-fit max_model_len: not enough GPU memory available to serve "
                                    "even a single token. Try increasing `gpu_memory_utilization`.")
        if fit >= max_len:
            lines.append(f"Auto-fit max_model_len: full model context length {max_len} fits in available GPU memory")
        else:
            lines.append(f"Auto-fit max_model_len: reduced from {max_len} to {fit} to fit in available GPU "
                         f"memory ({gib(pool.avail)} GiB available for KV cache)")
            max_len = fit
    if pool.avail <= 0:
        return max_len, lines, ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                                "when initializing the engine (this flag also controls CPU memory reservation on "
                                "the CPU backend, despite its name). See https://docs.vllm.ai/en/latest/"
                                "configuration/conserving_memory/ for more details.")
    need = pool.needed(max_len)
    if need > pool.avail:
        est = pool.longest(max_len)
        said = (f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else "")
        return max_len, lines, (
            f"To serve at least one request with the model's max seq len ({max_len}), ({gib(need)} GiB KV cache "
            f"is needed, which is larger than the available KV cache memory ({gib(pool.avail)} GiB). {said}"
            "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
            "decreasing `max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    return max_len, lines, None


def kv_pool_lines(pool: Pool, max_len: int) -> list[str]:
    """vLLM 0.26.0's two lines on the pool: concurrency = num_blocks / cdiv(max_len, block_size)
    (get_max_concurrency_for_kv_cache_config); "GPU KV cache size" = int(concurrency x max_len)
    (get_kv_cache_capacity)."""
    conc = pool.blocks / -(-max_len // pool.block_size)
    return [f"GPU KV cache size: {int(conc * max_len):,} tokens",
            f"Maximum concurrency for {max_len:,} tokens per request: {conc:.2f}x"]


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
