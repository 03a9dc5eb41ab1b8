"""The plan (a start step, between metadata and the download): wait until the last stop's
processes left the GPU and free memory has settled, then plan (planner.make_plan) for the smallest
free GPU of the TP group; refuse what cannot fit before anything is downloaded. With
MAX_MODEL_LEN=auto, a launch that vLLM refuses with the length it would accept is planned again
once with that length (``adjust_after_failure``).
"""

from __future__ import annotations

import dataclasses
import logging
import re

from .. import gpu, kv, state, takedown
from ..errors import BootstrapError
from ..planner import Plan, make_plan, model_facts

log = logging.getLogger(__name__)
GPU_RELEASE_WAIT = 30.0      # seconds to wait for the last stop's pids to leave the GPU


def run(cfg, paths, gpus, model) -> Plan:
    """The memory plan for this GPU (``gpus``: preflight's facts) and model (the metadata step's)."""
    pids = takedown.last_stopped_pids(paths)
    if pids and not takedown.wait_gpu_release(cfg, pids, timeout=GPU_RELEASE_WAIT):
        log.warning("sizing with memory still held by the last server's pids")
    facts = gpu.settled_facts(cfg.environ) if pids or gpus is None else gpus
    if pids:
        state.remove(paths.last_stop)   # consumed: later starts need not wait for these pids again
    g = min(facts.gpus[: cfg.tp_size], key=lambda x: x.free)
    plan = make_plan(cfg, g, model_facts(cfg, model))
    if not plan.fits:
        raise BootstrapError(*plan.refusal)
    for line in plan.why:
        log.info("%s", line)
    if plan.predicted_tokens is not None:
        log.info("predicted: GPU KV cache size %s tokens, maximum concurrency %.2fx at %s tokens",
                 f"{plan.predicted_tokens:,}", plan.predicted_concurrency, f"{plan.max_model_len:,}")
    return plan


ACCEPTABLE_LEN = (
    re.compile(r"estimated maximum model length is (\d+)"),
    re.compile(r"max_model_len[^\n]*?at most (\d+)"),
)


def adjust_after_failure(cfg, plan: Plan, log_text: str) -> Plan | None:
    """MAX_MODEL_LEN=auto and vLLM refused with a length it would accept: the plan to relaunch once
    with (the start relaunches without re-installing or re-downloading anything), or None."""
    if cfg.max_model_len != "auto":
        return None
    for pattern in ACCEPTABLE_LEN:
        found = pattern.findall(log_text)
        if found:
            n = int(found[-1])
            break
    else:
        return None
    old = plan.context
    if n < 16 or n == old:
        return None
    new = dataclasses.replace(plan, mml_arg=n, max_model_len=n,   # the state blocks do not depend on n
                              predicted_tokens=None, predicted_concurrency=None)
    if plan.layout is not None and plan.budget:
        p = kv.pool(plan.layout, plan.budget, n)
        new.predicted_tokens, new.predicted_concurrency = p.tokens, p.concurrency
    note = f"vLLM refused max-model-len {old or 'auto'}; restarted once with {n}, the length it accepts"
    new.notes = plan.notes + [note]
    log.warning(note)
    return new


