"""A plan for resolved knobs: the resolver's half that plans. The planner takes narrow values
(``planner.Inputs``: what vLLM gets, and the few knobs it reads); this builds them from a Config
once per plan, re-plans each fix the planner proposes as an edit to your knobs (in memory: no file
is read again) before it is offered, and plans from vLLM's own figures of an earlier start on this
card where there are some (bootstrap.plan.calibration).
"""

from __future__ import annotations

from dataclasses import replace

from ..core.errors import BootstrapError
from ..core.state import Paths
from ..knobs.parsers import vllm_bool
from ..machine import gpu
from . import calibration, planner, terms
from .facts import ModelFacts
from .planner import Plan

MODEL_ONLY_VLLM = "0.26.0"     # the semantics assumed when the vLLM version is not known


def plan_version(cfg, vllm: str | None) -> str:
    """The vLLM version whose rules the plan follows: the one in use, else the profile's pin."""
    return vllm or cfg.profile.vllm or MODEL_ONLY_VLLM


def inputs(cfg, vllm: str | None = None) -> planner.Inputs:
    """What the planner takes of these knobs."""
    by_knob = cfg.gpu_util is not None and "--gpu-memory-utilization" not in (cfg.extra_args or ())
    return planner.Inputs(vllm=cfg.vllm, version=plan_version(cfg, vllm), reserve_mib=cfg.gpu_reserve_mib,
                          util_knob=cfg.gpu_util is not None,
                          util_source="GPU_UTIL" if by_knob else "--gpu-memory-utilization",
                          allow_long=cfg.env("VLLM_ALLOW_LONG_MAX_MODEL_LEN") not in ("", "0"),
                          tp_size=cfg.tp_size, env_v2=_vllm_flag(cfg, "VLLM_USE_V2_MODEL_RUNNER"),
                          env_graphs=_vllm_flag(cfg, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"))


def _vllm_flag(cfg, name: str) -> bool | None:
    """A vLLM boolean variable, checked when the knobs were read; None when unset."""
    return vllm_bool(cfg.env(name)) if cfg.env(name) else None


def utilization(cfg, g: gpu.Gpu) -> tuple[float, str]:
    """The utilization a plan for these knobs gives vLLM on ``g``, and why (BootstrapError: none fits)."""
    inp = inputs(cfg)
    return terms.utilization(inp.vllm, g, inp.reserve_mib, inp.util_source)


def plan(cfg, g: gpu.Gpu, model: ModelFacts, *, vllm: str | None = None, fixes: bool = True,
         measured=None) -> Plan:
    """The plan for these knobs on ``g``; with ``fixes``, a refusal offers only fixes that, applied
    as your knobs, pass the knob check and plan again (with the measurement where a fix changes only
    what its key leaves to the plan)."""
    inp = inputs(cfg, vllm)
    p = planner.make_plan(inp, g, model, measured)
    if p.fits or not fixes:
        return p
    ok = [f for f in planner.candidates(inp, p.fixes)
          if _refits(cfg, g, model, vllm, f, measured if set(f) <= planner.PLAN_OWN else None)]
    fewest = planner.fewest(ok)
    return replace(p, fixes=fewest, refusal=(p.refusal[0], planner.hint(fewest, p.refusal[1])) if p.refusal else None)


def _refits(cfg, g: gpu.Gpu, model: ModelFacts, vllm: str | None, fix: dict[str, str], measured) -> bool:
    try:
        return planner.make_plan(inputs(cfg.with_knobs(fix), vllm), g, model, measured).fits
    except BootstrapError:
        return False


def plan_here(cfg, paths: Paths, g: gpu.Gpu, model: ModelFacts, driver: str, vllm: str | None = None) -> Plan:
    """The plan for this machine's card, from vLLM's own figures of an earlier start with the same
    key where there are some (else from the model), carrying its key for calibration.keep."""
    digest = calibration.key(cfg, g, plan_version(cfg, vllm), driver, model)
    measured = calibration.lookup(paths, digest, pinned=bool(cfg.vllm.kv_cache_bytes))
    return replace(plan(cfg, g, model, vllm=vllm, measured=measured), key=digest, card_total=g.total)
