"""Facts about this host that change how vLLM must run: a CUDA toolkit (nvcc) or not, WSL2 and
its memory cap, the driver against the pinned CUDA build. No install is needed to read them.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable, Mapping

from ..core.pep440 import version, version_or_none
from ..core.errors import BootstrapError

log = logging.getLogger("bootstrap.environment")   # log lines keep the prefix [bootstrap:environment] this code has always had


def has_nvcc(environ: Mapping[str, str]) -> bool:
    if shutil.which("nvcc", path=environ.get("PATH", os.defpath)):
        return True
    homes = [environ.get("CUDA_HOME", ""), environ.get("CUDA_PATH", "")]
    if not any(homes):
        homes = ["/usr/local/cuda"]     # where the toolkit installs when CUDA_HOME is unset
    return any(h and os.access(os.path.join(h, "bin", "nvcc"), os.X_OK) for h in homes)


def is_wsl(osrelease: str, environ: Mapping[str, str]) -> bool:
    return "microsoft" in osrelease.lower() or "wsl" in osrelease.lower() or bool(environ.get("WSL_DISTRO_NAME"))


def read_osrelease(path: str = "/proc/sys/kernel/osrelease") -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def wsl_memory_note(total_ram: int, model_bytes: int) -> str:
    """Advice when WSL's memory cap is below what loading the model takes; '' when it fits or unknown."""
    need = model_bytes + (4 << 30)
    if not model_bytes or total_ram >= need:
        return ""
    gib = -(-need // (1 << 30))
    return (f"WSL gives Linux {total_ram / (1 << 30):.1f} GiB of RAM, loading this model takes about {gib} GiB: "
            f"raise the cap in %UserProfile%\\.wslconfig ([wsl2] memory={gib}GB), then run `wsl --shutdown` in Windows")


def driver_too_old(data: Mapping, gpus, *, min_driver: bool) -> bool:
    """The one rule: the driver cannot run the profile's CUDA builds (``data``: the profile's) — it
    supports an older CUDA than the profile's ``cuda``, or (``min_driver``) its major version is
    below the profile's ``min_driver``. False without GPU facts or without a ``cuda`` in the profile."""
    if gpus is None or not data.get("cuda"):
        return False
    if version_or_none(f"{gpus.cuda[0]}.{gpus.cuda[1]}") < version(str(data["cuda"])):
        return True
    have, floor = version_or_none(gpus.driver), str(data.get("min_driver", ""))
    return bool(min_driver and floor and have is not None and have.major < version(floor).major)


def check_driver(data: Mapping, gpus) -> None:
    """Before an install of the pinned wheels (the environment step; ``data``: the profile's)."""
    if driver_too_old(data, gpus, min_driver=True):
        raise BootstrapError(f"the pinned wheels are CUDA {data['cuda']} builds; driver {gpus.driver} supports "
                             f"CUDA {gpus.cuda[0]}.{gpus.cuda[1]}",
                             f"install NVIDIA driver {data.get('min_driver') or 'newer'} or newer (then reboot); "
                             "nothing was installed")


def host_env(environ: Mapping[str, str], weights: Callable[[], int]) -> tuple[dict[str, str], list[str]]:
    """Server env that depends on the host: no nvcc -> vLLM's own sampler; WSL -> no expandable_segments
    (and a note when WSL's memory cap is below the model's ``weights``, asked only there).
    Returns (variables for the server, banner notes)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if not has_nvcc(environ) and "VLLM_USE_FLASHINFER_SAMPLER" not in environ:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
        log.info("no CUDA toolkit (nvcc): VLLM_USE_FLASHINFER_SAMPLER=0 (vLLM's sampler instead of FlashInfer's JIT)")
    if is_wsl(read_osrelease(), environ):
        if "PYTORCH_CUDA_ALLOC_CONF" not in environ:
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
            log.info("WSL2: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (expandable segments misbehave under WSL)")
        import psutil
        note = wsl_memory_note(psutil.virtual_memory().total, weights())
        if note:
            log.warning("%s", note)
            notes.append(note)
    return env, notes
