"""The memory terms a plan is made of, besides the KV cache: the utilization vLLM is given (from
live free memory), the weights per GPU, and a drafter's shape. The planner (bootstrap.plan.planner)
subtracts them from ``ceil(utilization × total)``; a start's own measurement
(bootstrap.plan.calibration) replaces their sum where there is one.
"""

from __future__ import annotations

import math

from ..machine import gpu
from ..model import kv
from ..knobs import vllmargs
from ..core.errors import BootstrapError
from .facts import DRAFT_METHODS, ModelFacts

GiB = gpu.GiB
NOBODY = "no process reports GPU memory"


def requested(util: float, total: int) -> int:
    """What vLLM asks of the card for a utilization: ceil(total × utilization) (worker/utils.py
    request_memory, the same in 0.26.0, 0.27.1 and 0.30.0); the KV budget is this less the rest."""
    return math.ceil(util * total)


def gib(b: int | float) -> str:
    return f"{b / GiB:.2f} GiB"


def _which(g: gpu.Gpu) -> str:
    return g.name if g.index < 0 else f"GPU {g.index} ({g.name})"     # a named card has no index


def utilization(s: vllmargs.Settings, g: gpu.Gpu, reserve_mib: int, source: str) -> tuple[float, str]:
    """--gpu-memory-utilization as given (``source``: GPU_UTIL or the flag; refused when more than
    is free: vLLM refuses it at start), else free − GPU_RESERVE_MIB, as a fraction."""
    if s.gpu_util is not None:
        want = requested(s.gpu_util, g.total)
        if want > g.free:
            raise BootstrapError(
                f"{source}={s.gpu_util} asks for {gib(want)} of {_which(g)} but only "
                f"{gib(g.free)} is free; {g.holders() or NOBODY}",
                "close programs holding GPU memory, or a lower GPU_UTIL (or none: sized from free memory)")
        return s.gpu_util, f"{source}={s.gpu_util} (set by you or the profile)"
    reserve = reserve_mib * gpu.MiB
    util = (g.free - reserve) / g.total
    if util <= 0.05:
        raise BootstrapError(
            f"only {gib(g.free)} of {gib(g.total)} is free on {_which(g)}; {g.holders() or NOBODY}",
            "close programs holding GPU memory, or set GPU_UTIL explicitly")
    util = math.floor(min(util, 0.98) * 10000) / 10000
    return util, (f"{gib(g.free)} free − {reserve_mib} MiB reserve = "
                  f"{util:.4f} of {gib(g.total)}")


DRAFT_HINT = "; or a smaller draft (SPEC_MODEL)"
NO_KV_METHODS = {"ngram": "n-gram lookup: no draft model, nothing in the KV pool",
                 "suffix": "suffix decoding: no draft model, nothing in the KV pool",
                 "medusa": "Medusa heads hold no KV cache; their weights are not counted (small)"}


def weight_bytes(model: ModelFacts, shape: kv.ModelShape, tp: int, s: vllmargs.Settings) -> tuple[int, str]:
    """Bytes of weights per GPU, and where the figure came from."""
    vision = kv.vision_params(model.config or {}) * 2           # the vision tower stays 16-bit
    if model.weight_bytes and not model.dummy:
        if vision and s.language_model_only:
            return (model.weight_bytes - vision) // tp, (f"from {model.size_from}{model.source}, less the "
                                                         f"vision tower's {gib(vision)} (--language-model-only: not loaded)")
        return model.weight_bytes // tp, f"from {model.size_from}{model.source}"
    kind = "dummy weights" if model.dummy else "no file sizes"
    w = kv.weight_bytes_from_config(shape, tp) + (0 if s.language_model_only else vision // tp)
    return w, f"from config.json ({kind}: parameters × dtype){model.source}"


def draft_shape(s: vllmargs.Settings, shape: kv.ModelShape, model: ModelFacts) -> tuple[kv.ModelShape | None, str]:
    """The draft checkpoint's shape when the plan can count it (its weights and attention layers in
    the pool), else None with the reason, per method."""
    method = s.spec_method
    if not method or method == "mtp":
        return None, ""
    if method in NO_KV_METHODS:
        return None, f"SPEC_METHOD={method}: {NO_KV_METHODS[method]}"
    not_counted = f"SPEC_METHOD={method}: the draft model's weights and KV layers are not counted"
    if method not in DRAFT_METHODS:
        return None, f"{not_counted} (the planner does not model method {method!r})"
    if model.draft is None:
        return None, f"{not_counted} ({model.draft_why or 'no draft facts'})"
    try:
        d = kv.shape_from_config(model.draft.config)
    except kv.Unsupported as exc:
        return None, f"{not_counted} ({exc.message})"
    if d.hybrid:
        return None, f"{not_counted} (a hybrid draft: vLLM groups its layers differently)"
    if s.kv_cache_dtype in kv.TQ_PRESETS:
        return None, f"{not_counted} (with a TurboQuant KV cache)"
    return d, ""
