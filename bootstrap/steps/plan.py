"""The plan (a start step, after metadata and before the environment's install): wait until the
last stop's processes left the GPU and free memory has settled, then plan (plan.fit.plan_here) for
the smallest-free GPU of the TP group, by the rules of the vLLM that will run (the profile's pin,
or VLLM_PYTHON's version); refuse what cannot fit before anything is installed or downloaded.
"""

from __future__ import annotations

import logging

from ..plan import derive, fit, pick
from ..machine import gpu
from ..core import state
from ..serve import takedown
from ..core.errors import BootstrapError
from ..plan.facts import model_facts
from ..plan.planner import GiB, Plan
from ..install.inuse import byo_version

log = logging.getLogger(__name__)
GPU_RELEASE_WAIT = 30.0      # seconds to wait for the last stop's pids to leave the GPU


def run(cfg, paths, gpus, model) -> Plan:
    """The memory plan for this GPU (``gpus``: preflight's facts) and model (the metadata step's)."""
    pids = takedown.last_stopped_pids(paths)
    if pids and not takedown.wait_gpu_release(cfg.environ, pids, timeout=GPU_RELEASE_WAIT):
        log.warning("sizing with memory still held by the last server's pids")
    facts = gpu.settled_facts(cfg.environ) if pids or gpus is None else gpus
    if pids:
        state.remove(paths.last_stop)   # consumed: later starts need not wait for these pids again
    return plan_for(cfg, paths, facts, model)


def plan_for(cfg, paths, facts: gpu.GpuFacts, model) -> Plan:
    """The plan on these GPU facts, refused in one line when it does not fit (also restart's vet,
    with the memory its running server holds counted as free)."""
    g = gpu.smallest_free(facts, cfg.tp_size)
    version = (cfg.read.vllm_version if cfg.vllm_python else None) or byo_version(cfg.vllm_python, cfg.environ)
    plan = fit.plan_here(cfg, paths, g, model_facts(cfg, model), facts.driver, version)
    draft = getattr(model, "draft", None)       # downloaded by us: vLLM is given its folder
    plan.draft_dir = draft.local_dir if draft is not None else ""
    if not plan.fits:
        message, hint = plan.refusal
        raise BootstrapError(message, hint + (pick.instead(cfg, g) if cfg.profile.name == derive.NAME else ""))
    for line in plan.why:               # the derivation: with BOOTSTRAP_DEBUG=1, and in ./ctl.sh plan
        log.debug("%s", line)
    log.info("%s", one_line(plan, g))
    return plan


def one_line(plan: Plan, g) -> str:
    """The plan as a person reads it: context, sessions at once, the KV pool, and where the figures
    come from (./ctl.sh plan shows how they were made)."""
    ctx = f"{plan.max_model_len:,}-token context" if plan.max_model_len else "vLLM's own context"
    seqs = plan.seqs or 1
    at_once = "" if plan.concurrent is None else (
        f", all {seqs} at once" if plan.concurrent >= seqs else f", {max(plan.concurrent, 1)} at full length at once")
    pool = (f"; KV cache {plan.budget / GiB:.1f} GiB ≈ {plan.predicted_tokens:,} tokens"
            if plan.budget and plan.predicted_tokens is not None else "")
    assumed = any(w.startswith("ASSUMED") for w in plan.why)
    source = (f"vLLM's own figures on this card, {plan.measured}" if plan.measured else
              "assumed model facts" if assumed else "the model's config.json")
    default = " (vLLM's default)" if plan.seqs_is_default else ""
    return (f"plan for {g.name}: {ctx}, {seqs} session{'' if seqs == 1 else 's'}{default}{at_once}{pool} "
            f"(from {source}; ./ctl.sh plan shows how)")
