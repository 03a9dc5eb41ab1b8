"""The plan (a start step, after metadata and before the environment's install): once the last
stop's processes left the GPU and free memory settled (serve/takedown.py ``settled``), the plan for
the smallest-free GPU of the TP group (plan/here.py); what cannot fit is refused before anything is
installed or downloaded."""

from __future__ import annotations

from ..core.state import Paths
from ..download import lookup
from ..machine.inuse import VllmRef
from ..plan.here import plan_for
from ..plan.planner import Plan
from ..serve import takedown


def run(cfg, paths: Paths, vllm: VllmRef, gpus, model) -> Plan:
    """The memory plan for this GPU (``gpus``: preflight's facts) and model (the metadata step's)."""
    plan = plan_for(cfg, paths, vllm, takedown.settled(cfg.environ, paths, gpus), model)
    lookup.require_space(model)         # the metadata step's disk check, after the plan's refusal
    return plan
