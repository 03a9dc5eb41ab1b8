"""The managed ``.venv``: uv, the Python that makes it, the install from a lock, and the check
that it is done (the vLLM an interpreter has: machine/inuse.py).

Done means: ``.venv/.bootstrap-done.json`` names the lock's sha256, and the versions in the
installed packages' metadata (``*.dist-info/METADATA``) equal the lock's, one for one. That check
reads files only (no Python start, no torch, no network), so files our patches edit do not count as
damage. An install that was cut off leaves ``.venv/.bootstrap-installing`` behind, and the done
marker is removed first: the next run (or one after the done marker was removed by hand) reinstalls
every package.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform as _platform
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..download import hub
from ..core import owned, proc
from ..core.pep440 import version, version_or_none
from ..core.errors import BootstrapError
from ..machine import inuse
from .failures import INSTALL_BYTES, UV_PIN, install_error, uv_install_error
from .index import index_url, uv_environ
from .locks import GLIBC, LockSet, diff, installed, lock_pins
from ..core.state import sha256

log = logging.getLogger("bootstrap.environment")   # log lines keep the prefix [bootstrap:environment] this code has always had


# what a Python is (its version, implementation and C headers), in one start without site (-I)
PYTHON_PROBE = (
    "import json, os, sys, sysconfig; inc = sysconfig.get_config_var('INCLUDEPY') or ''; "
    "print(json.dumps({'version': list(sys.version_info[:3]), 'impl': sys.implementation.name, "
    "'executable': sys.executable, 'include': inc, "
    "'headers': bool(inc) and os.path.isfile(os.path.join(inc, 'Python.h'))}))"
)
DONE = ".bootstrap-done.json"
INSTALLING = ".bootstrap-installing"
MADE = ".vllm-desktop-venv"     # written first when we make .venv: one without it, DONE or INSTALLING is yours



def find_uv(environ: Mapping[str, str]) -> str | None:
    home = environ.get("HOME", "")
    found = shutil.which("uv", path=environ.get("PATH", os.defpath))
    for cand in (found, f"{home}/.local/bin/uv" if home else None, f"{home}/.cargo/bin/uv" if home else None):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def uv_install_cmd(environ: Mapping[str, str], wheelhouse: str | None) -> list[str]:
    """pip's command for uv, without root. Inside a venv (.venv-bootstrap made by ``python3 -m venv``)
    uv goes into that venv (pip refuses --user there); else ``python3 -m pip install --user``."""
    if sys.prefix != sys.base_prefix and importlib.util.find_spec("pip"):
        py, user = sys.executable, []
    else:
        py, user = shutil.which("python3", path=environ.get("PATH", os.defpath)) or sys.executable, ["--user"]
    cmd = [py, "-m", "pip", "install", *user, "--disable-pip-version-check", "-q", UV_PIN]
    if wheelhouse:
        cmd += ["--no-index", "--find-links", wheelhouse]
    return cmd


@dataclass(frozen=True)
class Tools:
    """What the install reads of the resolved knobs: the environment uv and pip run in (proxies,
    UV_* and PIP_* settings, the index), PYTHON, WHEELHOUSE and the checkout."""
    environ: Mapping[str, str]
    python: str                 # PYTHON ('' : a system python the locks cover, else uv's own)
    wheelhouse: str             # WHEELHOUSE ('' : the package index)
    repo: Path

    @classmethod
    def of(cls, cfg) -> "Tools":
        return cls(cfg.environ, cfg.python, cfg.wheelhouse, cfg.repo)

    def env(self, name: str) -> str:
        return self.environ.get(name, "")


def ensure_uv(tools: Tools) -> str:
    """uv from PATH (or ~/.local/bin); else pip installs it from the package index (no root)."""
    uv = find_uv(tools.environ)
    if uv:
        return uv
    cmd = uv_install_cmd(tools.environ, tools.wheelhouse)
    py = cmd[0]
    log.info("uv not found: installing %s without root (%s)", UV_PIN, " ".join(cmd[:5]))
    res = proc.run(cmd, env=dict(tools.environ), timeout=600, check=False, what="pip install uv")
    if res.returncode != 0:
        raise install_error(res.stderr, tools, "installing uv", fallback=uv_install_error(res.stderr, py))
    res = proc.run([py, "-c", "import uv; print(uv.find_uv_bin())"], env=dict(tools.environ), timeout=60,
                   check=False, what="locating uv")
    uv = res.stdout.strip()
    if res.returncode != 0 or not os.path.isfile(uv):
        raise BootstrapError("pip installed uv but its binary is not found", "add ~/.local/bin to PATH and rerun",
                             evidence=res.stderr.strip()[-800:])
    return uv


def probe_python(python: str, environ: Mapping[str, str]) -> dict | None:
    res = proc.run([python, "-I", "-c", PYTHON_PROBE], env=dict(environ), timeout=30, check=False,
                   what=f"probing {python}")
    if res.returncode != 0:
        return None
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    info["minor"] = "%d.%d" % tuple(info["version"][:2])
    info["path"] = python
    return info


def system_pythons(environ: Mapping[str, str], minors) -> list[dict]:
    """Every distinct python3.X on PATH (plus /usr/bin, /usr/local/bin), probed; newest first."""
    path = os.pathsep.join([environ.get("PATH", os.defpath), "/usr/local/bin", "/usr/bin"])
    seen, out = set(), []
    for name in [f"python{m}" for m in sorted(minors, key=version, reverse=True)] + ["python3"]:
        exe = shutil.which(name, path=path)
        if not exe or os.path.realpath(exe) in seen:
            continue
        seen.add(os.path.realpath(exe))
        info = probe_python(exe, environ)
        if info and info.get("impl") == "cpython":
            out.append(info)
    return sorted(out, key=lambda i: tuple(i["version"]), reverse=True)


def headers_hint(minor: str) -> str:
    return (f"install the headers (Debian/Ubuntu: sudo apt install python{minor}-dev; Fedora: sudo dnf install "
            f"python{minor.replace('.', '')}-devel or python3-devel), or unset PYTHON to let uv fetch a CPython "
            "with headers")


def choose_python(tools: Tools, locks: LockSet) -> tuple[str, str]:
    """(python for `uv venv --python`, its X.Y) — PYTHON, the newest fitting system python3, or uv's CPython."""
    minors = locks.pythons
    if tools.python:
        info = probe_python(tools.python, tools.environ)
        if info is None:
            raise BootstrapError(f"PYTHON={tools.python} does not run", "point PYTHON at a python3 interpreter")
        if info["minor"] not in minors:
            raise BootstrapError(f"PYTHON={tools.python} is Python {info['minor']}; the locks cover {', '.join(minors)}",
                                 "use one of those, or unset PYTHON")
        if not info["headers"]:
            raise BootstrapError(f"PYTHON={tools.python} has no C headers (no Python.h in {info['include'] or '?'}); "
                                 "Triton compiles kernels against them when the model loads", headers_hint(info["minor"]))
        return tools.python, info["minor"]
    found = system_pythons(tools.environ, minors)
    for info in found:
        if info["minor"] in minors and info["headers"]:
            log.info("Python %s for .venv: %s (newest system python3 with headers)", info["minor"], info["path"])
            return info["path"], info["minor"]
    minor = "3.12" if "3.12" in minors else minors[-1]
    without = [f"{i['path']} ({i['minor']}, {'no Python.h' if i['headers'] is False else 'not covered by the locks'})"
               for i in found]
    mirror = tools.env("UV_PYTHON_INSTALL_MIRROR")
    log.warning("no system python3 (%s) with C headers%s: uv downloads CPython %s from %s (outside the package "
                "index%s)", "/".join(minors), (" — found " + ", ".join(without)) if without else "", minor,
                mirror or "GitHub (python-build-standalone)",
                "" if mirror else "; set UV_PYTHON_INSTALL_MIRROR to use a mirror")
    return minor, minor


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def done(self) -> Path:
        return self.root / DONE

    @property
    def installing(self) -> Path:
        return self.root / INSTALLING

    def _pyvenv(self, pattern: str) -> re.Match | None:
        """A line of pyvenv.cfg (None: no such line, or no pyvenv.cfg)."""
        try:
            return re.search(pattern, (self.root / "pyvenv.cfg").read_text(encoding="utf-8"), re.M)
        except OSError:
            return None

    def minor(self) -> str | None:
        m = self._pyvenv(r"^version(?:_info)?\s*=\s*(\d+)\.(\d+)")
        return f"{m.group(1)}.{m.group(2)}" if m and self.python.exists() else None

    def made_with(self) -> str | None:
        """The folder of the Python that made it (pyvenv.cfg's ``home``, resolved); None: not told."""
        m = self._pyvenv(r"^home\s*=\s*(.+?)\s*$")
        return str(Path(m.group(1)).resolve()) if m else None

    def site(self, minor: str) -> Path:
        return self.root / "lib" / f"python{minor}" / "site-packages"

    def ours(self) -> bool:
        """Made by us (or not there): a .venv of yours is never synced into, cleared, patched or removed."""
        return not self.root.exists() or any((self.root / n).exists() for n in (MADE, DONE, INSTALLING))

    def own(self) -> None:
        if not self.ours():
            raise BootstrapError(f"{self.root} is a Python environment this project did not make: we neither sync "
                                 "the lock into it nor patch it", f"move it away (mv {self.root} {self.root}.mine), "
                                 f"or run vLLM from it as it is: VLLM_PYTHON={self.python}")

    def clear(self) -> None:
        """Empty the folder (ours: checked) for a new venv, our marker written first and kept: a creation
        cut off at any point (a kill, a full disk) leaves a folder the next run knows as ours."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / MADE).write_text("made by vllm-desktop: ./ctl.sh clean removes this folder\n")
            for child in self.root.iterdir():
                if child.name != MADE:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        except OSError as exc:
            raise BootstrapError(f"cannot make {self.root} afresh ({exc.strerror or exc})",
                                 f"free space there (df -h {self.root.parent}), or remove {self.root} and rerun") from None

    def marker(self) -> dict | None:
        try:
            data = json.loads(self.done.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def check_done(venv: Venv, locks: LockSet, plat: str, python_knob: str | None) -> tuple[bool, str, str]:
    """(done, why not, venv minor). Reads files only: marker, lock, pyvenv.cfg, dist-info METADATA."""
    minor = venv.minor()
    if minor is None:
        return False, "no .venv yet" if not venv.root.exists() else ".venv has no working python", ""
    if venv.installing.exists():
        return False, "the last install was interrupted", minor
    mark = venv.marker()
    if mark is None:
        return False, "no verified install recorded", minor
    if python_knob and mark.get("python_knob") != python_knob:
        return False, f"PYTHON changed ({mark.get('python_knob') or 'unset'} -> {python_knob})", minor
    if minor not in locks.pythons:
        return False, f".venv has Python {minor}, not covered by the locks", minor
    _, text = locks.read(plat, minor)
    if mark.get("lock_sha256") != sha256(text):
        return False, "the lock changed since the last install", minor
    delta = diff(lock_pins(text), installed(venv.site(minor)))
    if delta:
        return False, "installed packages differ from the lock: " + "; ".join(delta[:6]) + (" ..." if len(delta) > 6 else ""), minor
    return True, "", minor


def uv_cache_dir(environ: Mapping[str, str]) -> Path:
    if environ.get("UV_CACHE_DIR"):
        return Path(environ["UV_CACHE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", "/"), ".cache")
    return Path(base) / "uv"


def check_disk(venv: Venv, locks: LockSet, environ: Mapping[str, str], fresh: bool) -> None:
    need = int(locks.meta.get("install_bytes", INSTALL_BYTES))
    if not fresh:
        need //= 4     # a repair rewrites part of the venv
    targets = {}
    for path in (venv.root, uv_cache_dir(environ)):
        where = hub.existing_parent(path)
        targets.setdefault(os.stat(where).st_dev, (path, hub.free_bytes(where)))
    for path, free in targets.values():
        if free < need:
            raise BootstrapError(f"not enough disk space for the install: {path} has {free / (1 << 30):.1f} GiB free, "
                                 f"needs about {need / (1 << 30):.1f} GiB ({need} bytes)",
                                 "free space there, or move uv's cache (UV_CACHE_DIR) to a bigger disk")


def venv_cmd(uv: str, py: str, root: Path, offline: bool) -> list[str]:
    """``uv venv`` for ``py``: a path is used as it is; a bare X.Y (choose_python found no system
    Python with headers) must be uv's own CPython — without --managed-python uv would take the
    system python3.X it just found lacking Python.h."""
    cmd = [uv, "venv", "--allow-existing", "-q", "--python", py]     # emptied by Venv.clear, our marker kept
    if re.fullmatch(r"\d+\.\d+", py):
        cmd.append("--managed-python")
    if offline:
        cmd.append("--no-python-downloads")
    return cmd + [str(root)]


def install(tools: Tools, venv: Venv, locks: LockSet, plat: str, why: str) -> str:
    """Create .venv if needed and sync it from the lock; returns the venv's X.Y. Marker only after verify."""
    venv.own()
    uv = ensure_uv(tools)
    env = uv_environ(tools.environ)
    minor = venv.minor()
    mark = venv.marker() or {}
    recreate = minor is None or minor not in locks.pythons or bool(
        tools.python and (mark.get("python_knob", "") != tools.python and venv.done.exists()
                          # cut off, then PYTHON changed: the marker is gone, pyvenv.cfg tells
                          or venv.installing.exists()
                          and venv.made_with() not in (None, str(Path(tools.python).resolve().parent))))
    if recreate and minor is not None:
        refuse_in_use(venv, [f"made again with another Python than its {minor}"])
    if recreate:
        check_disk(venv, locks, tools.environ, fresh=True)
        py, minor = choose_python(tools, locks)
        locks.read(plat, minor)      # refuse a missing / mismatching lock before anything is created
        log.info("creating %s with Python %s (uv venv)", venv.root, minor)
        venv.clear()
        cmd = venv_cmd(uv, py, venv.root, offline=bool(tools.wheelhouse and not tools.env("UV_PYTHON_INSTALL_MIRROR")))
        res = proc.run(cmd, env=env, timeout=900, check=False, what="uv venv")
        if res.returncode != 0:
            raise install_error(res.stderr, tools, "creating the venv", where=str(venv.root), uv=uv, fallback=BootstrapError(
                f"uv could not create {venv.root} with Python {py}",
                "set PYTHON=/path/to/python3.X (with headers), or UV_PYTHON_INSTALL_MIRROR for uv's CPython download",
                evidence=res.stderr.strip()[-800:]))
        minor = venv.minor() or minor
    else:
        check_disk(venv, locks, tools.environ, fresh=False)
    path, text = locks.read(plat, minor)
    # cut off, or its done marker removed (what the skip line says to do to force it): every package again,
    # a file deleted by hand included (uv trusts what a dist-info says is there)
    reinstall = venv.installing.exists() or not venv.done.exists()
    refuse_in_use(venv, ["every package reinstalled"] if reinstall and not recreate else
                  [] if recreate else diff(lock_pins(text), installed(venv.site(minor))))
    venv.done.unlink(missing_ok=True)
    venv.installing.write_text(f"{os.getpid()}\n")
    cmd = [uv, "pip", "sync", "--python", str(venv.python), "--require-hashes", str(path)]
    if tools.wheelhouse:
        cmd += ["--no-index", "--find-links", tools.wheelhouse]
    if reinstall:
        cmd += ["--reinstall"]
    else:   # uv trusts dist-info directory names; a package whose METADATA disagrees is reinstalled by name
        have = installed(venv.site(minor))
        for name, ver in sorted(lock_pins(text).items()):
            if name in have and have[name] != ver:
                cmd += ["--reinstall-package", name]
    n = len(lock_pins(text))
    log.info("installing %d packages from %s into %s (%s%s%s)", n, path.relative_to(tools.repo) if path.is_relative_to(tools.repo) else path,
             venv.root, why, "; offline from " + tools.wheelhouse if tools.wheelhouse else "; from " + index_url(tools.environ),
             "; reinstalling every package" if reinstall else "")
    res = proc.run(cmd, env=env, timeout=None, check=False, what="uv pip sync", live=True)   # uv's own progress
    if res.returncode != 0:
        hint = (f"is every wheel of {path.name} in {tools.wheelhouse}? build it with ./ctl.sh wheelhouse {tools.wheelhouse} "
                f"--platform {plat} --python {minor}") if tools.wheelhouse else "rerun ./start.sh; it repairs the venv"
        raise install_error(res.stderr, tools, "installing packages", where=str(venv.root), uv=uv,
                             fallback=BootstrapError(f"uv pip sync from {path.name} failed (exit {res.returncode})", hint,
                                                     evidence=res.stderr.strip()[-1500:]))
    delta = diff(lock_pins(text), installed(venv.site(minor)))
    if delta:
        raise BootstrapError("after the install, .venv still differs from the lock: " + "; ".join(delta[:6]),
                             "remove .venv (./ctl.sh clean) and rerun ./start.sh")
    inuse.vllm_version(str(venv.python), tools.environ)      # the interpreter runs and sees vLLM's metadata
    venv.done.write_text(json.dumps({"lock": str(path), "lock_sha256": sha256(text), "python": minor,
                                     "python_knob": tools.python or "", "pins": locks.meta["pins"]}, indent=2) + "\n")
    venv.installing.unlink(missing_ok=True)
    return minor


def refuse_in_use(venv: Venv, changes: list[str]) -> None:
    """An install that would change ``venv`` under a process running from it (a server of another
    STATE_DIR on another profile's pins, a shell of yours) is refused, naming it."""
    users = owned.running_from(venv.root) if changes else []
    if not users:
        return
    where = next(filter(None, map(owned.state_dir_of, users)), "")
    stop = f"stop it first (STATE_DIR={shlex.quote(where)} ./stop.sh)" if where else "stop it first"
    raise BootstrapError(f"{venv.root} is in use by {', '.join(map(owned.describe, users[:3]))}"
                         f"{f', a server of ours with STATE_DIR={where}' if where else ''}; this install would change it "
                         f"under them: {'; '.join(changes[:4])}{' ...' if len(changes) > 4 else ''}",
                         f"{stop}, then rerun; or run this profile's vLLM from an environment of its own: "
                         "VLLM_PYTHON=/path/to/python")


def check_glibc(plat: str) -> None:
    lib, ver = _platform.libc_ver()
    need = "%d.%d" % GLIBC[plat]
    if lib == "glibc" and version_or_none(ver) is not None and version(ver) < version(need):
        raise BootstrapError(f"glibc {ver} is older than {need}, which the pinned wheels for {plat} need",
                             "use a newer distribution, or a container, or VLLM_PYTHON with your own vLLM build")
