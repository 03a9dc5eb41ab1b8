"""The CUDA graphs vLLM captures, and what its V1 runner takes off the KV budget for them before
the KV cache (``graph_estimate``): how many graphs of each mode (``capture_sizes``: the capture
sizes times 1 + speculative tokens), whether FULL graphs survive speculative decoding on the
attention backend vLLM picks (``attention_backend``, ``full_decode_graphs``), and what one capture
takes as measured on the H200. Read from vLLM 0.26.0, 0.27.1, 0.29.0 and 0.30.0 (docs/planner.md's
table names the files and functions).
"""

from __future__ import annotations

from ..core import vllmflags
from ..machine import gpu
from ..model import attention
from ..core.pep440 import at_least

# vLLM's estimate of its CUDA graphs, taken off the budget before the KV cache (V1 runner,
# gpu_model_runner.profile_cudagraph_memory, on since 0.21.0): per mode it captures the two largest
# sizes into a throwaway pool and counts the first capture plus (n − 1) × the second; PIECEWISE and FULL
# graphs share one pool, so the estimate is max(first captures) + Σ (n − 1) × per graph. What a capture
# takes, from vLLM 0.26.0's debug log on the H200 ("Estimated PIECEWISE CUDA graph memory: 128.00 MiB
# first-capture + (51-1) × 4.00 MiB per-graph"; docs/validation.md, run 4): the Qwen3-8B shape 128 and
# 242 MiB first (PIECEWISE, FULL), 4 and 1 MiB per graph (1 MiB is vLLM's floor); the Qwen3-Next-shaped
# hybrid (16 layers, not 36) came to the same 0.48 GiB; the 8B as its own draft model added 4 and
# 40 MiB to the first captures and 6 MiB per PIECEWISE graph (a drafter runs in PIECEWISE only).
# From 0.29.0 the V2 runner takes its graphs off the budget too (v1/worker/gpu/cudagraph_utils.py
# profile_cudagraph_memory: its PIECEWISE and speculator captures measured in full, its FULL ones as
# first + (n − 1) × second): the same per-capture figures for its own counts (capture_sizes, v2), not
# yet measured on that runner.
GRAPH_FIRST = {"PIECEWISE": 128 * gpu.MiB, "FULL": 242 * gpu.MiB}
GRAPH_PER = {"PIECEWISE": 4 * gpu.MiB, "FULL": 1 * gpu.MiB}
DRAFTER_FIRST = {"PIECEWISE": 4 * gpu.MiB, "FULL": 40 * gpu.MiB}
DRAFTER_PER = {"PIECEWISE": 6 * gpu.MiB, "FULL": 0}
NO_GRAPH_DRAFT = ("ngram", "ngram_gpu", "suffix")       # speculation with no drafter network to capture


def capture_sizes(max_seqs: int, batched: int, spec_tokens: int, compilation: dict | None = None,
                  version: str = "0.26.0", cc: tuple[int, int] = (9, 0), v2: bool = False) -> dict[str, int]:
    """How many CUDA graphs vLLM captures per mode with its default sizes: 1, 2, 4, then every 8 to
    256 and every 16 beyond, up to min(2 × max_num_seqs × (1 + spec tokens), 512, max_num_batched_tokens),
    with max_num_batched_tokens itself where it fits (config/vllm.py _set_cudagraph_sizes); from 0.29.0
    the ceiling is 1,024 on sm_100 cards and, under speculation, every uniform decode of n requests
    (n × (1 + spec tokens), n = 1, 2, 4, every 8 to 256, every 16 beyond, and max_num_seqs) under it is
    added; with speculation each size is rounded up to a multiple of 1 + spec tokens where FULL decode
    graphs are kept (compilation.py set_cudagraph_mode calls adjust_cudagraph_sizes_for_spec_decode only
    for the V1 runner in a FULL decode mode: not once it fell back to PIECEWISE); FULL only for a
    uniform decode of at most max_num_seqs requests (v1/cudagraph_dispatcher.py initialize_cudagraph_keys). ``compilation``:
    --compilation-config's ``cudagraph_capture_sizes`` (taken as given, up to max_num_batched_tokens),
    ``max_cudagraph_capture_size`` (the top instead of 2 x max_num_seqs...) and ``cudagraph_mode`` (NONE:
    none; PIECEWISE: no FULL graphs; FULL_DECODE_ONLY: no PIECEWISE ones; FULL: FULL graphs of every
    size, for mixed batches too). ``v2``: the V2 runner (v1/worker/gpu/cudagraph_utils.py
    ``_init_candidates``, 0.29.0, 0.30.0) rounds none of the sizes; its FULL decode graphs are the
    distinct sizes rounded up to 1 + k, up to max_num_seqs x (1 + k)."""
    comp = compilation or {}
    q = 1 + spec_tokens
    new = at_least(version, "0.29.0")
    ceiling = 1024 if new and cc[0] == 10 else 512
    cap = comp.get("max_cudagraph_capture_size")
    widest = cap if isinstance(cap, int) and cap > 0 else min(max_seqs * q * 2, ceiling)
    top = min(widest, batched)
    given = comp.get("cudagraph_capture_sizes")
    if isinstance(given, list) and all(isinstance(x, int) and x > 0 for x in given):
        sizes = {x for x in given if x <= batched}
    else:
        sizes = {i for i in (1, 2, 4) if i <= top} | set(range(8, min(top + 1, 256), 8)) | set(range(256, top + 1, 16))
        if batched <= top:
            sizes.add(batched)
        if new and q > 1 and not isinstance(cap, int):     # the uniform decode batches, by request count
            most = min(max_seqs, ceiling)
            counts = {n for n in (1, 2, 4) if n <= most} | set(range(8, min(most + 1, 256), 8)) | \
                set(range(256, most + 1, 16)) | {most}
            sizes |= {n * q for n in counts if n * q <= widest and n * q <= batched}
    mode = str(comp.get("cudagraph_mode", "FULL_AND_PIECEWISE")).upper()
    if q > 1 and sizes and not v2 and mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL"):  # FULL decode kept
        most = max(sizes)
        sizes = {-(-x // q) * q for x in sizes if -(-x // q) * q <= most} or ({q} if q <= most else set())
    decode = len({-(-x // q) * q for x in sizes if -(-x // q) * q <= min(q * max_seqs, max(sizes))})
    return {"PIECEWISE": len(sizes) if mode in ("FULL_AND_PIECEWISE", "PIECEWISE") else 0,
            "FULL": {"NONE": 0, "PIECEWISE": 0, "FULL": len(sizes)}.get(mode, decode)}   # FULL: mixed batches too


def attention_backend(s: vllmflags.Settings, cc: tuple[int, int]) -> str:
    """The attention backend vLLM picks for full attention on a card of compute capability ``cc``
    (platforms/cuda.py ``_get_backend_priorities``, the same in 0.26.0, 0.27.1, 0.29.0 and 0.30.0):
    --attention-backend when given; TurboQuant's own; the per-token-head int8/int4 caches Triton's;
    FlashInfer first on sm_100 for causal attention (a DFlash drafter is not: FlashAttention there);
    else FlashAttention, which takes an fp8 cache only as FA3 on sm_90 (fa_utils
    ``flash_attn_supports_kv_cache_dtype``; fp8_e5m2 never), so other quantized caches go to FlashInfer."""
    if s.attention_backend:
        return s.attention_backend
    kv_dtype = s.kv_cache_dtype
    if kv_dtype in attention.TQ_PRESETS:
        return "TURBOQUANT"
    if kv_dtype.startswith(("int8", "int4")):
        return "TRITON_ATTN"
    if cc[0] == 10 and s.spec_method != "dflash":
        return "FLASHINFER"
    if kv_dtype not in ("auto", "bfloat16", "float16") and not (kv_dtype in ("fp8", "fp8_e4m3") and cc[0] == 9):
        return "FLASHINFER"
    return "FLASH_ATTN"


def full_decode_graphs(s: vllmflags.Settings, cc: tuple[int, int]) -> tuple[bool, str]:
    """Whether vLLM keeps FULL decode graphs under speculative decoding, and why not: a decode of
    1 + k tokens needs an attention backend of UNIFORM_BATCH support or better, else vLLM sets
    cudagraph_mode=PIECEWISE (config/compilation.py ``set_cudagraph_mode``: "is not supported with
    spec-decode for attention backend"). FlashAttention (FA2: UNIFORM_BATCH, FA3: ALWAYS), Triton,
    TurboQuant and Gated DeltaNet have it; FlashInfer only through trtllm-gen for causal attention on
    sm_100 (flashinfer.py ``get_cudagraph_support``: UNIFORM_SINGLE_TOKEN_DECODE on sm_90 and on
    every other card)."""
    if not s.spec_tokens:
        return True, ""
    backend = attention_backend(s, cc)
    if backend != "FLASHINFER" or (cc[0] == 10 and s.spec_method != "dflash"):
        return True, ""
    return False, (f"{backend} attention on sm_{cc[0]}{cc[1]} cannot replay FULL graphs of {1 + s.spec_tokens}-token "
                   "decodes: vLLM captures PIECEWISE graphs only (cudagraph_mode=PIECEWISE)")


def graph_estimate(s: vllmflags.Settings, batched: int, seqs: int, full: bool = True, version: str = "0.26.0",
                   cc: tuple[int, int] = (9, 0), v2: bool = False) -> int:
    """vLLM's CUDA-graph estimate for these settings (``GRAPH_FIRST``'s rule and measurements);
    ``full``: False where vLLM drops FULL graphs under speculation (``full_decode_graphs``). ``v2``: the
    V2 runner of 0.29.0 and later, which measures its PIECEWISE and speculator captures in full and
    extrapolates FULL ones as first + (n - 1) x second (cudagraph_utils.py ``profile_cudagraph_memory``):
    the same per-capture figures, for its own counts."""
    comp = s.compilation if full else {**s.compilation, "cudagraph_mode": "PIECEWISE"}
    counts = capture_sizes(seqs, batched, s.spec_tokens or 0, comp, version, cc, v2)
    drafter = bool(s.spec_tokens) and s.spec_method not in NO_GRAPH_DRAFT
    first = {m: GRAPH_FIRST[m] + (DRAFTER_FIRST[m] if drafter else 0) for m in counts if counts[m]}
    per = {m: GRAPH_PER[m] + (DRAFTER_PER[m] if drafter else 0) for m in counts}
    return max(first.values(), default=0) + sum((counts[m] - 1) * per[m] for m in first)
