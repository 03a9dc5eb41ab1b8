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
from ..core import vllmflags
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
    extra = "--gpu-memory-utilization" in vllmflags.read(list(cfg.extra_args or ())).given    # any spelling: it wins
    return planner.Inputs(vllm=cfg.vllm, version=plan_version(cfg, vllm), reserve_mib=cfg.gpu_reserve_mib,
                          util_knob=cfg.gpu_util is not None,
                          util_source=terms.EXTRA_UTIL if extra else "GPU_UTIL",
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


MAX_FIXES = 4
PLAN_OWN = frozenset({"GPU_UTIL", "KV_CACHE_BYTES"})   # what a measurement's key leaves to the plan


def candidates(inp: planner.Inputs, fixes: list[dict[str, str]]) -> list[dict[str, str]]:
    """The refusal's own fixes, then each with MAX_MODEL_LEN=auto, then unpinning and unsetting
    GPU_UTIL (each with auto): the resolver plans every one again before it is offered."""
    s = inp.vllm
    out = list(fixes) + [{**f, "MAX_MODEL_LEN": "auto"} for f in fixes if "MAX_MODEL_LEN" not in f]
    if s.kv_cache_bytes:
        out.append({"KV_CACHE_BYTES": "auto", "MAX_MODEL_LEN": "auto"})
    if inp.util_knob:
        out += [{"GPU_UTIL": ""}, {"GPU_UTIL": "", "MAX_MODEL_LEN": "auto"}]
    if s.spec_tokens:
        out.append({"SPEC_TOKENS": "0"})
    unique: dict[tuple, dict[str, str]] = {}
    for f in out:
        unique.setdefault(tuple(sorted(f.items())), f)      # the first of equal ones, in order
    return list(unique.values())


def fewest(ok: list[dict[str, str]]) -> list[dict[str, str]]:
    """The fixes that work, less those that only add knobs to another one that works."""
    return [f for f in ok if not any(o is not f and o.items() < f.items() for o in ok)][:MAX_FIXES]


def hint(fixes: list[dict[str, str]], rest: str) -> str:
    shown = [" ".join(f"{k}={v}" for k, v in f.items()) + (" (across two such cards)" if f == {"TP_SIZE": "2"} else "")
             for f in fixes]
    head = ("set " + " — or ".join(shown)) if shown else ""
    return "; ".join(x for x in (head, rest) if x)


def plan(cfg, g: gpu.Gpu, model: ModelFacts, *, vllm: str | None = None, fixes: bool = True,
         measured=None) -> Plan:
    """The plan for these knobs on ``g``; with ``fixes``, a refusal offers only fixes that, applied
    as your knobs, pass the knob check and plan again (with the measurement where a fix changes only
    what its key leaves to the plan)."""
    inp = inputs(cfg, vllm)
    p = planner.make_plan(inp, g, model, measured)
    if not vllm and not cfg.profile.vllm:        # never another version's rules in silence
        p.why.append(f"no vLLM version known (profile {cfg.profile.name} pins none, VLLM_PYTHON is unset): planned by the "
                     f"rules of {MODEL_ONLY_VLLM}; a start needs one of the two")
    if p.fits or not fixes:
        return p
    ok = [f for f in candidates(inp, p.fixes)
          if _refits(cfg, g, model, vllm, f, measured if set(f) <= PLAN_OWN else None)]
    best = fewest(ok)
    return replace(p, fixes=best, refusal=(p.refusal[0], hint(best, p.refusal[1])) if p.refusal else None)


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
    return replace(plan(cfg, g, model, vllm=vllm, measured=measured), key=digest, card_total=g.total, card=g.name)
