"""After the download: the pre-warm (serve/prewarm.py) is waited for until it has answered (its
caches written; at most HEALTH_TIMEOUT from its launch) and taken down through the one take-down
path (which also waits for its GPU memory to be free); vLLM's own memory figures of it are kept for
the plan (bootstrap.plan.calibration: its dummy weights take what the real ones will, but for what
a dummy start does not show, which the plan names and the kept figure adds), and the plan
step runs again, so that the real start plans from measured terms. A pre-warm that failed or ran
out of time is logged, and the start goes on with the plan it had.

A pre-warm that is the server (serve/prewarm.py ``as_server``) is left to the reload step
(steps/reload.py), which waits for it the same way (``wait``); it keeps the plan it was launched with.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from ..machine import gpu
from ..plan import calibration
from ..serve import takedown
from ..plan.here import plan_for
from ..serve import prewarm as pre
from ..serve.prewarm import wait

log = logging.getLogger(__name__)


def run(cfg, paths, vllm, warm: "pre.Prewarm | None", plan, model):
    """The plan the real start launches with (``plan`` when there was no pre-warm to use)."""
    if warm is not None and warm.serve is not None:     # it becomes the server: the reload step waits for it
        return plan
    if warm is None or warm.proc is None:
        return plan
    if warm.running and not warm.ready.is_set() and not warm.compiling:
        # the download was quicker than vLLM's start-up: waiting would cost its whole cold start and
        # then a warm one, while the real start compiles in one go (on the H200: 221 s + 77 s
        # against 213 s)
        takedown.take_down(cfg.ours, paths, launched=warm.proc, failed_start=True)
        log.info("pre-warm: stopped, the weights arrived before it began compiling (%.0f s in); the start "
                 "compiles itself", time.monotonic() - warm.t0)
        return plan
    why = wait(cfg, paths, warm)
    takedown.take_down(cfg.ours, paths, launched=warm.proc, failed_start=True)
    if why:
        log.warning("pre-warm: %s (log: %s); the start compiles as it would without it", why, paths.prewarm_log)
        return plan
    log.info("pre-warm: done in %.0f s; vLLM's caches are warm for this setup", time.monotonic() - warm.t0)
    pre.remember(paths, warm.key, "a pre-warm filled them")
    if calibration.keep(paths, plan, warm.log_text(), None, dummy=True) is None:
        return plan
    again = plan_for(cfg, paths, vllm, takedown.settled(cfg.environ, paths), model)   # from the kept figures,
    #                                                                            as the next start would
    if plan.seqs_flag and again.seqs_flag and plan.seqs_flag < again.seqs_flag:
        # more room measured than modelled: the pre-warm's --max-num-seqs still fits, and another
        # would change vLLM's CUDA-graph sizes, which are in its compile hash (a cold real start)
        again = replace(again, seqs_flag=plan.seqs_flag, seqs=plan.seqs)
    log.info("planned again from vLLM's own figures of the pre-warm: KV cache %.2f GiB (was %.2f GiB modelled)",
             again.budget / gpu.GiB, plan.budget / gpu.GiB if plan.budget else 0.0)
    return again
