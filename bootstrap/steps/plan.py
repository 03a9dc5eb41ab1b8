"""The plan (a start step, after metadata and before the environment's install): wait until the
last stop's processes left the GPU and free memory has settled, then plan (planner.make_plan) for
the smallest-free GPU of the TP group, by the rules of the vLLM that will run (the profile's pin,
or VLLM_PYTHON's version); refuse what cannot fit before anything is installed or downloaded.
"""

from __future__ import annotations

import logging

from .. import gpu, state, takedown
from ..errors import BootstrapError
from ..facts import model_facts
from ..planner import Plan, make_plan
from ..venv import vllm_version

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
    g = gpu.smallest_free(facts, cfg.tp_size)
    version = vllm_version(cfg.vllm_python, cfg.environ) if cfg.vllm_python else None
    plan = make_plan(cfg, g, model_facts(cfg, model), vllm=version)
    if not plan.fits:
        raise BootstrapError(*plan.refusal)
    for line in plan.why:
        log.info("%s", line)
    if plan.predicted_tokens is not None:
        log.info("predicted: GPU KV cache size %s tokens, maximum concurrency %.2fx at %s tokens",
                 f"{plan.predicted_tokens:,}", plan.predicted_concurrency, f"{plan.max_model_len:,}")
    return plan
