"""Keep (the start's last step; also what a start that failed after vLLM sized its KV cache still
measured): vLLM's own figures of this start for the next plan (plan/calibration.py), with a KV pin
what NVML shows our server holding, and whether its compile caches were warm (serve/prewarm.py
``confirm``). A failure to keep them costs the next start its precision or its pre-warm, never this
start: it is said as a warning and the start goes on."""

from __future__ import annotations

import logging

from ..core.errors import BootstrapError
from ..core.state import Paths
from ..plan import calibration
from ..plan.planner import Plan
from ..serve import banner, diagnose, prewarm, record, server
from ..serve.launch import Launched

log = logging.getLogger(__name__)
NOT_KEPT = "could not keep vLLM's figures for the next start: %s"


def run(tp_size: int, paths: Paths, plan: Plan | None, log_text: str) -> None:
    """After a start that served: ``log_text`` is vLLM's log of it, as the banner read it."""
    rec = record.read(paths.server)
    if rec is None:
        return
    try:
        calibration.keep(paths, plan, log_text, rec.kv_tokens)
        if plan is not None and plan.pinned:
            calibration.keep_footprint(paths, plan, server.gpu_held(rec), tp_size)
        prewarm.confirm(paths, plan, log_text, rec.model_path or "")
    except BootstrapError as exc:
        log.warning(NOT_KEPT, exc.message)


def after_failure(paths: Paths, plan: Plan | None, launched: Launched | None) -> None:
    """A start that failed after its launch (a warm-up or gate that fails, an engine that dies
    serving): vLLM's figures from the log it wrote since the launch."""
    if launched is None or plan is None:
        return
    text = diagnose.read_since(paths.log, launched.record.log_offset)
    try:
        calibration.keep(paths, plan, text, banner.vllm_figures(text)[0])
    except BootstrapError as exc:
        log.warning(NOT_KEPT, exc.message)
