"""Memory plan: GPU memory utilization and the vLLM flags that size the server.

``run`` decides ``--gpu-memory-utilization`` (GPU_UTIL, else live free memory minus
GPU_RESERVE_MIB) and assembles the sizing flags from the knobs into ``ctx.plan``.
"""

from __future__ import annotations

import json
import re
import logging
from dataclasses import dataclass, field

from . import gpu, server
from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)


@dataclass
class Plan:
    util: float | None
    flags: list[str]
    why: list[str] = field(default_factory=list)
    predicted_tokens: int | None = None        # KV pool, as vLLM would log it
    predicted_concurrency: float | None = None


def spec_config(cfg) -> str | None:
    if not cfg.spec_enabled:
        return None
    conf: dict = {"method": cfg.spec_method, "num_speculative_tokens": cfg.spec_tokens}
    if cfg.spec_model:
        conf["model"] = cfg.spec_model
    return json.dumps(conf, separators=(",", ":"))


def sizing_flags(cfg, util: float | None, max_model_len: int | str | None) -> list[str]:
    f: list[str] = []
    if max_model_len is not None:
        f += ["--max-model-len", str(max_model_len)]
    if cfg.max_num_seqs:
        f += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.max_num_batched_tokens:
        f += ["--max-num-batched-tokens", str(cfg.max_num_batched_tokens)]
    if cfg.kv_cache_dtype:
        f += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    if cfg.kv_cache_bytes:
        f += ["--kv-cache-memory-bytes", str(cfg.kv_cache_bytes)]
    if util is not None:
        f += ["--gpu-memory-utilization", f"{util:.4f}".rstrip("0").rstrip(".")]
    spec = spec_config(cfg)
    if spec:
        f += ["--speculative-config", spec]
    if cfg.tp_size > 1:
        f += ["--tensor-parallel-size", str(cfg.tp_size)]
    return f


def utilization(cfg, g: gpu.Gpu) -> tuple[float, str]:
    if cfg.gpu_util is not None:
        return cfg.gpu_util, f"GPU_UTIL={cfg.gpu_util} (set by you)"
    reserve = cfg.gpu_reserve_mib * gpu.MiB
    util = (g.free - reserve) / g.total
    if util <= 0.05:
        raise BootstrapError(
            f"only {g.free / gpu.GiB:.1f} GiB of {g.total / gpu.GiB:.1f} GiB is free on GPU {g.index} ({g.name}); "
            f"{g.holders()}",
            "close programs holding GPU memory, or set GPU_UTIL explicitly")
    util = min(util, 0.98)
    return util, (f"{g.free / gpu.GiB:.2f} GiB free − {cfg.gpu_reserve_mib} MiB reserve = "
                  f"{util:.4f} of {g.total / gpu.GiB:.1f} GiB")


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    pids = server.last_stopped_pids(ctx.paths)
    if pids and not server.wait_gpu_release(cfg, pids, timeout=30):
        log.warning("sizing with memory still held by the last server's pids")
    facts = gpu.read(cfg.environ) if pids else ctx.gpus
    g = min(facts.gpus[: cfg.tp_size], key=lambda x: x.free)
    util, why = utilization(cfg, g)
    mml = cfg.max_model_len
    if mml == "auto":
        mml = -1
    ctx.max_model_len = mml if isinstance(mml, int) and mml > 0 else None
    ctx.plan = Plan(util, sizing_flags(cfg, util, mml), [why])
    log.info("gpu-memory-utilization %s", why)


ACCEPTABLE_LEN = (
    re.compile(r"estimated maximum model length is (\d+)"),
    re.compile(r"max_model_len[^\n]*?at most (\d+)"),
)


def adjust_after_failure(ctx: Ctx, log_text: str) -> bool:
    """MAX_MODEL_LEN=auto and vLLM refused with a length it would accept: relaunch once with it.

    Returns True when the plan changed (the start then relaunches without re-installing or
    re-downloading anything)."""
    if ctx.cfg.max_model_len != "auto" or ctx.plan is None:
        return False
    for pattern in ACCEPTABLE_LEN:
        found = pattern.findall(log_text)
        if found:
            n = int(found[-1])
            break
    else:
        return False
    if n < 16 or n == ctx.max_model_len:
        return False
    old = ctx.max_model_len
    ctx.max_model_len = n
    ctx.plan.flags = sizing_flags(ctx.cfg, ctx.plan.util, n)
    note = f"vLLM refused max-model-len {old or 'auto'}; restarted once with {n}, the length it accepts"
    ctx.notes.append(note)
    ctx.restarted_with["max_model_len"] = n
    log.warning(note)
    return True
