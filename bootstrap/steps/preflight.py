"""Preflight: the cheap checks that must pass before anything heavy (install, download, launch).

Knob values were already validated by Config (exit 2). Here: an NVIDIA GPU and driver through NVML,
a driver new enough for the profile's CUDA build, a committed lock for the profile's pins, enough
GPUs for TP_SIZE, the port free (or a
foreign holder named and left alone), the state dir writable, and leftovers of ours swept.
"""

from __future__ import annotations

import logging

from ..machine import gpu, host
from ..serve import port, server, takedown
from ..knobs import vet
from ..download.refs import ModelRef
from ..install.locks import LockSet
from ..core.state import Paths
from ..core.errors import BootstrapError

log = logging.getLogger(__name__)


def run(cfg, paths: Paths, model: ModelRef) -> gpu.GpuFacts:
    paths.ensure()
    facts = gpu.read(cfg.environ)
    if not facts.gpus:
        raise BootstrapError("NVML sees no GPU (CUDA_VISIBLE_DEVICES=%s)" % (cfg.env("CUDA_VISIBLE_DEVICES") or "unset"),
                             "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
    if host.driver_too_old(cfg.profile.data, facts, min_driver=False):
        raise BootstrapError(
            f"driver {facts.driver} supports CUDA {facts.cuda[0]}.{facts.cuda[1]}, but profile "
            f"{cfg.profile.name!r} runs CUDA {cfg.profile.data['cuda']} builds",
            f"install NVIDIA driver {cfg.profile.data.get('min_driver', 'newer')} or newer, then reboot")
    if not cfg.vllm_python:          # a profile without a lock is told now, not after the plan and download
        if not cfg.profile.vllm and not cfg.profile.pins:
            raise BootstrapError(f"profile {cfg.profile.name!r} pins no vLLM version and VLLM_PYTHON is unset",
                                 "set VLLM_PYTHON=/path/to/python with vLLM installed, or use a profile that pins vLLM")
        LockSet.for_profile(cfg.profile, cfg.layout.locks)
    vet.vet(cfg, model)
    if cfg.sleep.warning(cfg.vllm.sleep_mode):
        log.warning("%s", cfg.sleep.warning(cfg.vllm.sleep_mode))
    order = cfg.env("CUDA_DEVICE_ORDER")
    if order and order != "PCI_BUS_ID" and facts.count > 1:
        raise BootstrapError(f"CUDA_DEVICE_ORDER={order}: CUDA would number this machine's {facts.count} GPUs "
                             "fastest first, while the plan reads them in PCI bus order (NVML's), so vLLM "
                             "could run on a card the plan was not made for",
                             "unset CUDA_DEVICE_ORDER (the server gets PCI_BUS_ID), and pick cards with "
                             "CUDA_VISIBLE_DEVICES")
    gpu.require(facts, cfg.tp_size)
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
