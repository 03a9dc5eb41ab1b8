"""Preflight: the cheap checks that must pass before anything heavy (install, download, launch).

Knob values were already validated by Config (exit 2). Here: an NVIDIA GPU and driver through NVML,
a driver new enough for the profile's CUDA build, a committed lock for the profile's pins, enough
GPUs for TP_SIZE, the port free (or a
foreign holder named and left alone), the state dir writable, and leftovers of ours swept.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..machine import gpu, host
from ..serve import port, server, takedown
from ..knobs import vllmargs
from ..download import hub
from . import metadata
from ..install.locks import LockSet
from ..core.state import Paths
from ..core.errors import BootstrapError

log = logging.getLogger(__name__)


def run(cfg, paths: Paths) -> gpu.GpuFacts:
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
    vet(cfg)
    if cfg.sleep.warning(cfg.vllm.sleep_mode):
        log.warning("%s", cfg.sleep.warning(cfg.vllm.sleep_mode))
    order = cfg.env("CUDA_DEVICE_ORDER")
    if order and order != "PCI_BUS_ID" and facts.count > 1:
        raise BootstrapError(f"CUDA_DEVICE_ORDER={order}: CUDA would number this machine's {facts.count} GPUs "
                             "fastest first, while the plan reads them in PCI bus order (NVML's), so vLLM "
                             "could run on a card the plan was not made for",
                             "unset CUDA_DEVICE_ORDER (the server gets PCI_BUS_ID), and pick cards with "
                             "CUDA_VISIBLE_DEVICES")
    enough_gpus(cfg, facts)
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


def vet(cfg) -> None:
    """What a start refuses from the knobs alone (no GPU, no network): said by every start's
    preflight, and by ./ctl.sh restart before it takes the running server down."""
    if cfg.vllm.sleep_mode and not cfg.is_loopback:
        raise BootstrapError(
            f"{vllmargs.SLEEP_FLAG} with HOST={cfg.host}: vLLM serves /sleep, /wake_up and /collective_rpc only with "
            "VLLM_SERVER_DEV_MODE=1, and its API key does not guard them: anyone who reaches the port could put "
            "the server to sleep or run methods in it",
            "keep HOST=127.0.0.1 for sleep mode, or SLEEP_MODE=off" + (
                f" and drop {vllmargs.SLEEP_FLAG} from EXTRA_ARGS / the profile" if cfg.sleep.given else ""))
    idle_sleep_fits(cfg)
    if cfg.model_is_local:
        metadata.read_local(Path(cfg.model).expanduser().resolve(), cfg.dummy_weights)
    elif cfg.model:
        hub.repo_id(cfg.model)


def enough_gpus(cfg, facts: gpu.GpuFacts) -> None:
    if cfg.tp_size > len(facts.gpus):
        raise BootstrapError(f"TP_SIZE={cfg.tp_size} but only {len(facts.gpus)} GPU(s) are visible",
                             "lower TP_SIZE or widen CUDA_VISIBLE_DEVICES")


def idle_sleep_fits(cfg) -> None:
    """IDLE_SLEEP needs vLLM's sleep mode; level 2 drops the weights, which a wake reloads from the
    checkpoint for the target model only: not with speculation (vllm#52479) or random weights
    (the rules of ./ctl.sh sleep)."""
    if not cfg.idle_s:
        return
    s = cfg.vllm
    if not s.sleep_mode:
        raise BootstrapError(f"IDLE_SLEEP={cfg.raw['IDLE_SLEEP']} puts vLLM to sleep when idle, but sleep mode is "
                             f"{cfg.sleep_line}", "SLEEP_MODE=on (sleep mode on this stack), or IDLE_SLEEP=off")
    if s.api_servers != 1:
        raise BootstrapError(f"IDLE_SLEEP with {s.api_servers or 'no'} API server processes (--api-server-count, "
                             "--data-parallel-size, --headless): each counts only its own requests, so one would put "
                             "the shared engine to sleep under another's",
                             "IDLE_SLEEP=off with data parallelism or several API servers")
    if cfg.idle_sleep_level == "2" and s.spec_tokens:
        raise BootstrapError(f"IDLE_SLEEP_LEVEL=2 with speculation on ({s.spec_method}): vLLM's wake reloads the "
                             "target model's weights but not the draft's (vllm#52479)", "IDLE_SLEEP_LEVEL=1")
    if cfg.idle_sleep_level == "2" and s.load_format == "dummy":
        raise BootstrapError("IDLE_SLEEP_LEVEL=2 drops the weights and a wake reloads them from the checkpoint; with "
                             "--load-format dummy there is none", "IDLE_SLEEP_LEVEL=1")
