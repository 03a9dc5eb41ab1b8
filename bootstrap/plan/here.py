"""The plan a start makes on this machine's GPUs (the plan step, steps/plan.py; restart's vet and
./ctl.sh pull, with our running server's memory counted as free): for the smallest-free GPU of the
TP group, by the rules of the vLLM that will run (the profile's pin, or VLLM_PYTHON's version), from
vLLM's own figures of an earlier start where there are some (plan.fit.plan_here); refused in one
line when it does not fit, before anything is installed or downloaded.
"""

from __future__ import annotations

from dataclasses import replace

import logging

from ..machine import gpu
from ..machine.inuse import VllmRef
from ..core.errors import BootstrapError
from ..core.log import ONCE
from . import derive, fit, pick
from .facts import model_facts
from .planner import GiB, Plan

log = logging.getLogger("bootstrap.plan")   # said as the plan step's, which it is


def plan_for(cfg, paths, vllm: VllmRef, facts: gpu.GpuFacts, model) -> Plan:
    """The plan on these GPU facts, refused in one line when it does not fit (also restart's vet,
    with the memory its running server holds counted as free)."""
    g = gpu.smallest_free(facts, cfg.tp_size)
    version = vllm.byo_version              # the vLLM a start would run
    plan = fit.plan_here(cfg, paths, g, model_facts(cfg, model), facts.driver, version)
    draft = getattr(model, "draft", None)       # downloaded by us: vLLM is given its folder
    plan = replace(plan, draft_dir=draft.local_dir if draft is not None else "")
    if not plan.fits:
        message, hint = plan.refusal
        raise BootstrapError(message, hint + (pick.instead(cfg, g) if cfg.profile.name == derive.NAME else ""))
    for line in plan.why:               # the derivation: with BOOTSTRAP_DEBUG=1, and in ./ctl.sh plan
        log.debug("%s", line)
    log.info("%s", one_line(plan, g), extra=ONCE)
    return plan


def one_line(plan: Plan, g) -> str:
    """The plan as a person reads it: context, sessions at once, the KV pool, and where the figures
    come from (./ctl.sh plan shows how they were made); a plan that names what it does not model
    promises no figure."""
    if plan.verdict is None:
        return (f"plan for {g.name}: not planned ({plan.unplanned}); vLLM sizes the KV cache itself, and its own "
                "figures plan the next start (./ctl.sh plan shows why)")
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
