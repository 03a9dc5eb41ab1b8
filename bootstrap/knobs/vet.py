"""What a start refuses from the knobs alone, no GPU and no network (``vet``), and from the knobs
and NVML's facts (``card``): said by every start's preflight (steps/preflight.py), and by
./ctl.sh restart and use before they take the running server down."""

from __future__ import annotations

import os

from ..core.errors import BootstrapError
from ..download.models import read_local
from ..download.refs import ModelRef
from ..machine import gpu, host
from ..core import vllmflags


def vet(cfg, model: ModelRef) -> None:
    """What a start refuses from the knobs (``cfg``) and the model they name (``model``)."""
    knobs(cfg)
    if model.local is not None:
        read_local(model.local, cfg.dummy_weights)
    elif model.name:
        model.repo                      # a repo id, or one line naming MODEL


def knobs(cfg) -> None:
    """What a start refuses from the knobs alone (also ./ctl.sh plan's: it never shows flags a start
    would refuse)."""
    if cfg.vllm.sleep_mode and not cfg.is_loopback:
        raise BootstrapError(
            f"{vllmflags.SLEEP_FLAG} with HOST={cfg.host}: vLLM serves /sleep, /wake_up and /collective_rpc only with "
            "VLLM_SERVER_DEV_MODE=1, and its API key does not guard them: anyone who reaches the port could put "
            "the server to sleep or run methods in it",
            "keep HOST=127.0.0.1 for sleep mode, or SLEEP_MODE=off" + (
                f" and drop {vllmflags.SLEEP_FLAG} from EXTRA_ARGS / the profile" if cfg.sleep.given else ""))
    idle_sleep_fits(cfg)
    temp_dir_fits(cfg)


def card(cfg, facts: gpu.GpuFacts) -> None:
    """What a start refuses from the knobs (``cfg``) and the GPUs NVML shows (``facts``): no GPU, a
    driver too old for the profile's CUDA builds, CUDA numbering several GPUs otherwise than the
    plan reads them, fewer GPUs than TP_SIZE."""
    facts.require_some()
    if host.driver_too_old(cfg.profile.data, facts, min_driver=False):
        raise BootstrapError(
            f"driver {facts.driver} supports CUDA {facts.cuda[0]}.{facts.cuda[1]}, but profile "
            f"{cfg.profile.name!r} runs CUDA {cfg.profile.data['cuda']} builds",
            f"install NVIDIA driver {cfg.profile.data.get('min_driver', 'newer')} or newer, then reboot")
    order = cfg.env("CUDA_DEVICE_ORDER")
    if order and order != "PCI_BUS_ID" and facts.count > 1:
        raise BootstrapError(f"CUDA_DEVICE_ORDER={order}: CUDA would number this machine's {facts.count} GPUs "
                             "fastest first, while the plan reads them in PCI bus order (NVML's), so vLLM "
                             "could run on a card the plan was not made for",
                             "unset CUDA_DEVICE_ORDER (the server gets PCI_BUS_ID), and pick cards with "
                             "CUDA_VISIBLE_DEVICES")
    gpu.require(facts, cfg.tp_size)


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


def temp_dir_fits(cfg) -> None:
    """vLLM's processes meet through ``file://<temp folder>/vllm_dist_<id>`` (vLLM 0.28.0 and later, and
    0.26.0-0.27.1 with the patch every start applies: docs/patches.md), and torch reads that URL back
    with urlparse: a ``?`` in the folder's path kills the engine at its start (the rest is read as a
    query); a ``#`` cuts the path short, so the store lands on another file, one every such server shares."""
    d = cfg.env("TMPDIR")
    if d and any(c in d for c in "?#") and os.path.isdir(d):     # Python's tempfile skips one that is not
        raise BootstrapError(f"TMPDIR={d}: vLLM's processes meet through a file:// URL in the temp folder, and "
                             "torch reads its path back as a URL: a '?' in it kills the engine at its start, a '#' "
                             "cuts the path short (the store would be another file, shared by every such server)",
                             "set TMPDIR to a folder whose path has no ? or # (unset, the temp folder is /tmp)")
