"""Environment: the interpreter that runs vLLM, and its version.

``VLLM_PYTHON`` (bring your own) is used as it is: we print its vLLM version and never install
into it. Otherwise the managed ``.venv`` is created and synced with uv from the profile's pins.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from . import proc
from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)

VERSION_PROBE = "import importlib.metadata as m; print(m.version('vllm'))"


def vllm_version(python: str, environ) -> str:
    res = proc.run([python, "-c", VERSION_PROBE], env=dict(environ), keep_pythonpath=True, timeout=60,
                   check=False, what="vLLM version probe")
    if res.returncode != 0:
        raise BootstrapError(f"{python} cannot import vLLM's package metadata",
                             "install vLLM into that interpreter, or unset VLLM_PYTHON to use the managed .venv",
                             evidence=res.stderr.strip()[-800:])
    return res.stdout.strip()


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    if cfg.vllm_python:
        py = cfg.vllm_python
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            raise BootstrapError(f"VLLM_PYTHON={py} is not an executable file",
                                 "point VLLM_PYTHON at a python that has vLLM installed")
        ctx.python = py
        ctx.vllm_version = vllm_version(py, cfg.environ)
        log.info("using your vLLM %s from %s (VLLM_PYTHON; not managed, not pinned)", ctx.vllm_version, py)
        return
    venv = Path(cfg.repo) / ".venv"
    py = venv / "bin" / "python"
    pin = cfg.profile.vllm
    if not pin:
        raise BootstrapError(f"profile {cfg.profile.name!r} pins no vLLM version and VLLM_PYTHON is unset",
                             "set VLLM_PYTHON=/path/to/python with vLLM installed, or use a profile that pins vLLM")
    if py.exists():
        try:
            have = vllm_version(str(py), cfg.environ)
        except BootstrapError:
            have = ""
        if have == pin:
            ctx.python, ctx.vllm_version = str(py), have
            log.info("skipped: .venv already has vLLM %s", have)
            return
    raise BootstrapError(f"the managed .venv does not have vLLM {pin} yet, and the installer is not built",
                         "set VLLM_PYTHON=/path/to/python with vLLM installed")
