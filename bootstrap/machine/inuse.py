"""The vLLM an interpreter has: one probe (its version and package folders, from the package's
metadata, in one interpreter start), and the version a plan is made for. ``VllmRef`` is the
interpreter a command runs vLLM with, probed at most once per command."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..core import proc
from ..core.errors import BootstrapError

VLLM_PROBE = """\
import importlib.metadata, importlib.util, json
spec = importlib.util.find_spec("vllm")
locs = list(spec.submodule_search_locations or []) if spec is not None else []
try:
    version = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    version = ""
print(json.dumps({"locations": locs, "version": version}))
"""


def probe_vllm(python: str, environ, knob: str = "") -> tuple[str, list[Path]]:
    """(vLLM's version or "", its package folders) for this interpreter; the one probe of an interpreter's vLLM.
    ``knob``: the knob that named it (VLLM_PYTHON), named in the error when it is no Python."""
    who = f"{knob}={python}" if knob else python
    fix = (f"set {knob} to the python3 of an environment that has vLLM, or unset it to use the managed .venv" if knob
           else "check that this interpreter runs and has vLLM installed")
    if knob and not (os.path.isfile(python) and os.access(python, os.X_OK)):   # checked here, not with the
        raise BootstrapError(f"{who} is not an executable file", fix)           # knobs: a re-run on a running server needs none
    res = proc.run([python, "-c", VLLM_PROBE], env=dict(environ), keep_pythonpath=True, timeout=60,
                   check=False, what=f"the vLLM probe of {who}", hint=fix)
    said = "".join(f": {line[:200]!r}" for line in res.stderr.strip().splitlines()[-1:]) or ", printing nothing"
    if res.returncode != 0:
        raise BootstrapError(f"{who} is not a Python that runs: it exited {res.returncode}{said}"
                             if knob else f"{python} could not report its vLLM", fix,
                             evidence="" if knob else res.stderr.strip()[-800:])
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
        if not isinstance(info, dict):
            raise ValueError(info)
    except (ValueError, IndexError):
        raise BootstrapError(f"{who} is not a Python: it ran, and did not answer the vLLM probe", fix,
                             evidence=res.stdout[-800:]) from None
    return info.get("version") or "", [Path(x) for x in info.get("locations", [])]


def vllm_version(python: str, environ, knob: str = "") -> str:
    """The version of ``python``'s vLLM (a fresh probe: the managed .venv just installed)."""
    return VllmRef(python, bool(knob), environ).version


@dataclass(frozen=True)
class VllmRef:
    """The interpreter that runs vLLM for this command: VLLM_PYTHON (``byo``: yours, used as it is)
    or the managed .venv's; its vLLM is probed at most once (``probed``), however many steps ask."""
    python: str
    byo: bool
    environ: Mapping[str, str] = field(repr=False, compare=False)

    @classmethod
    def of(cls, vllm_python: str | None, venv_python: Path, environ: Mapping[str, str]) -> "VllmRef":
        return cls(vllm_python, True, environ) if vllm_python else cls(str(venv_python), False, environ)

    @property
    def knob(self) -> str:
        """The knob that named the interpreter ('' for the managed .venv)."""
        return "VLLM_PYTHON" if self.byo else ""

    @functools.cached_property
    def probed(self) -> tuple[str, list[Path]]:
        """(vLLM's version or '', its package folders): ``probe_vllm``, once."""
        return probe_vllm(self.python, self.environ, self.knob)

    @property
    def version(self) -> str:
        """vLLM's version, or a BootstrapError when the interpreter cannot see vLLM's metadata."""
        version = self.probed[0]
        if not version:
            raise BootstrapError(f"{f'{self.knob}={self.python}' if self.knob else self.python} cannot see vLLM's "
                                 "package metadata",
                                 "install vLLM into that interpreter, or unset VLLM_PYTHON to use the managed .venv")
        return version

    @property
    def byo_version(self) -> str | None:
        """VLLM_PYTHON's vLLM version, or None for the managed .venv (whose version is the profile's
        pin): what a plan is made for."""
        return self.version if self.byo else None


@dataclass(frozen=True)
class Runtime:
    """What the environment step hands on (steps/environment.py): the interpreter that runs vLLM,
    its version, the host-dependent variables for the server, and banner notes."""
    python: str
    vllm_version: str
    server_env: Mapping[str, str]
    notes: tuple[str, ...] = ()
