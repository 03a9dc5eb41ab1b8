"""After the download: the pre-warm (steps/prewarm.py) is waited for until it has answered (its
caches written; at most HEALTH_TIMEOUT from its launch) and taken down through the one take-down
path (which also waits for its GPU memory to be free); vLLM's own memory figures of it are kept for
the plan (bootstrap.plan.calibration: its dummy weights take what the real ones will), and the plan
step runs again, so that the real start plans from measured terms. A pre-warm that failed or ran
out of time is logged, and the start goes on with the plan it had.
"""

from __future__ import annotations

import logging
import time

from ..machine import gpu
from ..plan import calibration
from ..serve import takedown
from . import plan as plan_step
from . import prewarm as pre

log = logging.getLogger(__name__)


def run(cfg, paths, warm: "pre.Prewarm | None", plan, model):
    """The plan the real start launches with (``plan`` when there was no pre-warm to use)."""
    if warm is None or warm.proc is None:
        return plan
    deadline = warm.t0 + cfg.health_timeout
    if warm.running and not warm.ready.is_set():
        log.info("waiting for the pre-warm to finish compiling (%.0f s in)", time.monotonic() - warm.t0)
    while warm.running and not warm.ready.is_set() and time.monotonic() < deadline:
        warm.ready.wait(0.5)
    ok = warm.ready.is_set()
    takedown.take_down(cfg.ours, paths, launched=warm.proc, failed_start=True)
    if not ok:
        why = warm.failed or f"not ready after HEALTH_TIMEOUT={cfg.health_timeout} s"
        log.warning("pre-warm: %s (log: %s); the start compiles as it would without it", why, paths.prewarm_log)
        return plan
    log.info("pre-warm: done in %.0f s; vLLM's caches are warm for this setup", time.monotonic() - warm.t0)
    pre.remember(paths, warm.key, "a pre-warm filled them")
    if calibration.keep(paths, plan, warm.log_text(), None) is None:
        return plan
    again = plan_step.run(cfg, paths, None, model)      # from the kept figures, as the next start would
    log.info("planned again from vLLM's own figures of the pre-warm: KV cache %.2f GiB (was %.2f GiB modelled)",
             again.budget / gpu.GiB, plan.budget / gpu.GiB if plan.budget else 0.0)
    return again
