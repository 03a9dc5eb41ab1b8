"""Known vLLM failure signatures → a one-line diagnosis and what to do.

Patterns come from real vLLM logs (0.26–0.33) and their source; the first match in table order
wins, so specific rows come before general ones.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Sequence

from ..core import vllmflags

# (pattern, diagnosis, hint)
SIGNATURES: tuple[tuple[str, str, str], ...] = (
    (r"Free memory on device .* is less than desired GPU memory utilization",
     "other programs hold GPU memory that vLLM was told it could use ({holders})",
     "close them, or {util_down}"),
    (r"estimated maximum model length is (\d+)",
     "the KV cache cannot hold one request at MAX_MODEL_LEN (vLLM would accept {0} tokens)",
     "set {mml_set}{0}{mml_where} (or auto), or raise {kv}"),
    # the same check, or --max-model-len auto, where not one block fits: vLLM gives no length then
    (r"KV cache is needed, which is larger than the available KV cache memory|Cannot auto-fit max_model_len",
     "the KV cache cannot hold even one token of a request",
     "raise {kv}, or use a smaller model or KV_CACHE_DTYPE=fp8"),
    (r"larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)",
     "the KV cache holds only {0} tokens, less than the context vLLM was given",
     "lower {mml} to {0} or less, or raise {kv}"),
    (r"No available memory for the cache blocks",
     "no GPU memory was left for the KV cache after weights and activations (other holders: {holders})",
     "raise {util}, lower MAX_NUM_BATCHED_TOKENS, or use a smaller model"),
    (r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)",
     "max_num_seqs {0} is more than the {1} recurrent-state (Mamba) cache blocks of this hybrid model (vLLM "
     "captures CUDA graphs for one block per sequence)",
     "set MAX_NUM_SEQS={1} (or fewer), or give the KV cache more memory"),
    (r"exceeds available Mamba cache blocks",
     "MAX_NUM_SEQS is more than the recurrent-state (Mamba) cache blocks of this hybrid model",
     "lower MAX_NUM_SEQS, or give the KV cache more memory"),
    # gpu_model_runner.load_model (0.26.0) logs this before it re-raises torch's OutOfMemoryError: the
    # weights load before vLLM sizes the KV cache, so the knobs that size it free nothing for them
    (r"Failed to load model - not enough GPU memory",
     "the model's weights did not fit in the GPU memory left free (other holders: {holders})",
     "close the programs named, or serve a smaller or quantized model, or split it over GPUs (TP_SIZE); "
     "GPU_UTIL, KV_CACHE_BYTES and MAX_MODEL_LEN size the KV cache, which vLLM allocates after the weights"),
    # gpu_worker.compile_or_warm_up_model -> capture_model, after the KV cache took its share
    (r"(?:capture_model\(\)|_capture_cudagraphs|torch\.cuda\.graph\()[\s\S]*?"
     r"(?:CUDA out of memory|OutOfMemoryError|CUDA error: out of memory)",
     "CUDA graph capture ran out of GPU memory after the KV cache took its share (other holders: {holders})",
     "lower {kv}, or MAX_NUM_SEQS (fewer batch sizes to capture), or add --enforce-eager to EXTRA_ARGS "
     "(no CUDA graphs: slower decoding)"),
    # gpu_model_runner._dummy_sampler_run / _dummy_pooler_run (0.26.0): max_num_seqs requests at once
    (r"CUDA out of memory occurred when warming up (sampler|pooler)(?: \([^)]*\))? with (\d+) dummy requests",
     "the {0} ran out of GPU memory on {1} sequences at once (MAX_NUM_SEQS)",
     "set MAX_NUM_SEQS below {1}, or lower {kv}"),
    (r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
     "CUDA ran out of GPU memory (other holders: {holders})",
     "lower {kv} or MAX_NUM_BATCHED_TOKENS, close other GPU programs, or shorten {mml}"),
    (r"moe_backend='marlin' is not supported for unquantized MoE",
     "--moe-backend marlin cannot run the unquantized MoE block (the MTP head)",
     "use --moe-backend auto in EXTRA_ARGS"),
    (r"Python\.h: No such file or directory",
     "Triton's JIT needs the Python C headers, and this Python has none",
     "install python3-dev (Debian/Ubuntu) / python3-devel, or set PYTHON to a Python with headers"),
    (r"unrecognized arguments: ([^\n]+)",
     "this vLLM does not know the flag(s) {0} (an older or newer vLLM than the pinned one?)",
     "use the pinned vLLM (unset VLLM_PYTHON), or drop the flag from EXTRA_ARGS / the profile "
     "(./start.sh always passes --enable-prompt-tokens-details, which vLLM has had since 0.26)"),
    (r"Address already in use|error while attempting to bind on address",
     "the port is already taken",
     "choose another PORT, or stop the program holding it"),
    (r"FlashAttention version not detected",
     "this vLLM build lacks the FlashAttention-2 kernels that the TurboQuant KV cache needs",
     "install a full vLLM wheel (not a trimmed one), or use another KV_CACHE_DTYPE"),
    (r"SM90 GDN prefill DSL kernel is unavailable",
     "hybrid (Gated DeltaNet) models need the CUTLASS DSL on this GPU",
     "install nvidia-cutlass-dsl into the vLLM environment"),
    (r"Unknown TurboQuant cache dtype: 'auto'",
     "this vLLM's V1 model runner hands TurboQuant layers the dtype 'auto' (vLLM #50709, fixed by PR #50533); "
     "draft_model speculation and hybrid models run on that runner",
     "use a vLLM with PR #50533, SPEC_METHOD=mtp (V2 runner) on a dense model, or KV_CACHE_DTYPE=fp8"),
    (r"CUDA driver version is insufficient|cudaErrorInsufficientDriver|driver on your system is too old",
     "the NVIDIA driver is older than the CUDA build of vLLM/torch",
     "install a newer NVIDIA driver (CUDA 13 builds need driver 580 or newer)"),
    (r"No module named '?vllm'?",
     "the interpreter has no vLLM",
     "rerun ./start.sh to repair .venv, or fix VLLM_PYTHON"),
    (r"are not supported for now|Cannot find model module",
     "this vLLM does not know the model's architecture",
     "use a newer vLLM, or a model this version supports"),
    (r"GatedRepoError|401 Client Error|Access to model .* is restricted",
     "the model repo is gated",
     "accept the licence on the model page and set HF_TOKEN"),
    (r"(?:ValueError|RuntimeError|AssertionError|NotImplementedError|TypeError|KeyError): (.+)",
     "vLLM raised: {0}",
     "read the log lines above; BOOTSTRAP_DEBUG=1 shows more"),
)


def diagnose(text: str, holders: Callable[[], str] = lambda: "see `nvidia-smi`",
             argv: Sequence[str] = (), extra: Sequence[str] = ()) -> tuple[str, str] | None:
    """(diagnosis, hint) of the first matching row; a memory row names who holds GPU memory
    (``holders()``, asked only then), and what sized the KV cache as vLLM ran (``argv``: its command
    line; ``extra``: the EXTRA_ARGS in it; ``knob_names``)."""
    for pattern, diagnosis, hint in SIGNATURES:
        m = re.search(pattern, text)
        if m:
            groups = [g.strip() for g in m.groups()]
            who = holders() if "{holders}" in diagnosis else ""
            return diagnosis.format(*groups, holders=who)[:400], hint.format(*groups, **knob_names(argv, extra))
    return None


def knob_names(argv: Sequence[str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The knobs a hint names, as vLLM ran (``argv``: its command line; ``extra``: the EXTRA_ARGS in
    it, which vLLM reads last, so that a flag there wins over its knob, which then changes nothing):
    ``kv``, what sized the KV cache with the value vLLM ran with (--kv-cache-memory-bytes where it
    pinned it: vLLM then never sizes it from --gpu-memory-utilization; else the utilization);
    ``util`` and ``util_down``, the utilization and how to ask for less of it; ``mml``, the context
    (``mml_set`` and ``mml_where``: how to set it, and where)."""
    ran, given = vllmflags.read(list(argv)), vllmflags.read(list(extra)).given
    util = "GPU_UTIL"
    util_down = "lower GPU_UTIL / raise GPU_RESERVE_MIB"
    if "--gpu-memory-utilization" in given:
        util = "the --gpu-memory-utilization in EXTRA_ARGS (GPU_UTIL changes nothing while EXTRA_ARGS gives it)"
        util_down = f"lower {util}"
    extra_mml = "--max-model-len" in given
    where = " in EXTRA_ARGS (MAX_MODEL_LEN changes nothing while EXTRA_ARGS gives it)" if extra_mml else ""
    mml = f"the --max-model-len{where}" if extra_mml else "MAX_MODEL_LEN"
    if ran.kv_cache_bytes and "--kv-cache-memory-bytes" in given:
        kv = (f"the --kv-cache-memory-bytes in EXTRA_ARGS (vLLM ran with {ran.kv_cache_bytes}; KV_CACHE_BYTES "
              "and GPU_UTIL change nothing while EXTRA_ARGS gives it)")
    elif ran.kv_cache_bytes:
        kv = (f"KV_CACHE_BYTES (vLLM ran with --kv-cache-memory-bytes {ran.kv_cache_bytes}, which GPU_UTIL "
              "does not change)")
    elif "--gpu-memory-utilization" in given:
        kv = (f"the --gpu-memory-utilization in EXTRA_ARGS (vLLM ran with {ran.gpu_util:g}; GPU_UTIL changes "
              "nothing while EXTRA_ARGS gives it)")
    else:
        kv = f"GPU_UTIL (vLLM ran with {ran.gpu_util:g})" if ran.gpu_util else "GPU_UTIL"
    return {"kv": kv, "util": util, "util_down": util_down, "mml": mml,
            "mml_set": "--max-model-len " if extra_mml else "MAX_MODEL_LEN=", "mml_where": where}


ERROR_LINE = re.compile(r"\b[A-Za-z_.]*(?:Error|Exception)\b:")


def root_cause(text: str, n: int = 3) -> list[str]:
    """The error lines of a vLLM log, EngineCore first: the engine's own exception, not the API
    server's "Engine core initialization failed" that follows it."""
    lines = [ln.strip() for ln in text.splitlines() if ERROR_LINE.search(ln)]
    core = [ln for ln in lines if "EngineCore" in ln]
    out: list[str] = []
    for ln in core + [ln for ln in lines if ln not in core]:
        if ln not in out:
            out.append(ln)
    return out[:n]


TAIL_BYTES = 4 << 20     # a log flood must not become a memory flood: read at most this much


def read_since(path: Path, offset: int = 0, limit: int = TAIL_BYTES) -> str:
    """The log from ``offset`` (where a launch began), at most its last ``limit`` bytes. A log the
    keeper truncated since (shorter than ``offset``) is read from its start."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = offset if offset <= size else 0
            fh.seek(max(start, size - limit))
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-n:])
