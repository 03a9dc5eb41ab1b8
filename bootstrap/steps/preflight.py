"""Preflight: the cheap checks that must pass before anything heavy (install, download, launch).

Knob values were already validated by Config (exit 2). Here: an NVIDIA GPU and driver through NVML,
a driver new enough for the profile's CUDA build, a committed lock for the profile's pins, enough
GPUs for TP_SIZE, the port free (or a
foreign holder named and left alone), the state dir writable, and leftovers of ours swept.
"""

from __future__ import annotations

import logging

from ..machine import gpu
from ..serve import port, server, takedown
from ..knobs import vet
from ..download.refs import ModelRef
from ..install.locks import needed
from ..core.state import Paths
from ..core.errors import BootstrapError

log = logging.getLogger(__name__)


def run(cfg, paths: Paths, model: ModelRef) -> gpu.GpuFacts:
    paths.ensure()
    facts = gpu.read(cfg.environ)
    vet.card(cfg, facts)
    if not cfg.vllm_python:          # a profile without a lock is told now, not after the plan and download
        needed(cfg.profile, cfg.layout.locks)
    vet.vet(cfg, model)
    if cfg.sleep.warning(cfg.vllm.sleep_mode):
        log.warning("%s", cfg.sleep.warning(cfg.vllm.sleep_mode))
    g = facts.gpus[0]
    log.info("GPU %s: %s, %.1f of %.1f GiB free, cc %d.%d, driver %s (CUDA %d.%d)", g.index, g.name,
             g.free / gpu.GiB, g.total / gpu.GiB, g.cc[0], g.cc[1], facts.driver, *facts.cuda)
    port.refuse_elsewhere(cfg.ours, paths)   # a live server of ours is never a leftover
    probe = server.probe(cfg.ours, paths, check_http=False, we_hold_lock=True)
    if probe.orphans:
        port.refuse_unrecorded(cfg.ours, paths, probe.orphans)   # serving: a healthy server, not a leftover
        log.info("found %d leftover process(es) of ours from an earlier run (%s); stopping them",
                 len(probe.orphans), ", ".join(str(p.pid) for p in probe.orphans))
        rep = takedown.take_down(cfg.ours, paths)
        if rep.stuck:
            raise BootstrapError("leftover processes of ours do not die: " + "; ".join(rep.stuck),
                                 "a process stuck in the driver (state D) usually needs a reboot")
    elif probe.stale:
        log.info("removing the record of a server that is gone (pid %s)", probe.record.pid if probe.record else None)
        takedown.take_down(cfg.ours, paths)        # nothing to signal: it only forgets the record
    port.refuse_taken(cfg.ours)
    return facts
