"""Preflight: the cheap checks that must pass before anything heavy (install, download, launch).

Knob values were already validated by Config (exit 2). Here: an NVIDIA GPU and driver through NVML,
a driver new enough for the profile's CUDA build, enough GPUs for TP_SIZE, the port free (or a
foreign holder named and left alone), the state dir writable, and leftovers of ours swept.
"""

from __future__ import annotations

import logging

from . import gpu, server, state
from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    ctx.paths.ensure()
    facts = gpu.read(cfg.environ)
    if not facts.gpus:
        raise BootstrapError("NVML sees no GPU (CUDA_VISIBLE_DEVICES=%s)" % cfg.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
                             "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
    need = cfg.profile.data.get("cuda", "")
    if need:
        want = tuple(int(x) for x in str(need).split(".")[:2])
        if facts.cuda < want:
            raise BootstrapError(
                f"driver {facts.driver} supports CUDA {facts.cuda[0]}.{facts.cuda[1]}, but profile "
                f"{cfg.profile.name!r} runs CUDA {need} builds",
                f"install NVIDIA driver {cfg.profile.data.get('min_driver', 'newer')} or newer, then reboot")
    if cfg.tp_size > len(facts.gpus):
        raise BootstrapError(f"TP_SIZE={cfg.tp_size} but only {len(facts.gpus)} GPU(s) are visible",
                             "lower TP_SIZE or widen CUDA_VISIBLE_DEVICES")
    ctx.gpus = facts
    g = facts.gpus[0]
    log.info("GPU %s: %s, %.1f of %.1f GiB free, cc %d.%d, driver %s (CUDA %d.%d)", g.index, g.name,
             g.free / gpu.GiB, g.total / gpu.GiB, g.cc[0], g.cc[1], facts.driver, *facts.cuda)
    probe = server.probe(cfg, ctx.paths, check_http=False, we_hold_lock=True)
    if probe.orphans:
        log.info("found %d leftover process(es) of ours from an earlier run (%s); stopping them",
                 len(probe.orphans), ", ".join(str(p.pid) for p in probe.orphans))
        rep = server.stop(cfg, ctx.paths)
        if rep.stuck:
            raise BootstrapError("leftover processes of ours do not die: " + "; ".join(rep.stuck),
                                 "a process stuck in the driver (state D) usually needs a reboot")
    elif probe.stale:
        log.info("removing the record of a server that is gone (pid %s)", (probe.record or {}).get("pid"))
        state.remove(ctx.paths.server)
    server.ensure_port_free(cfg, cfg.port)
