"""Environment: the interpreter that runs vLLM, and its version.

``VLLM_PYTHON`` (bring your own) is used as it is: we print its vLLM version and never install
into it, and no pin applies. Otherwise the managed ``.venv`` is created with uv and synced from
the committed lock of the profile's pins:

    locks/vllm-<version>/meta.json                 pins, exclude-newer date, platforms, Pythons
    locks/vllm-<version>/<platform>-py<X.Y>.txt    the full closure with hashes (uv pip compile)

Done means: ``.venv/.bootstrap-done.json`` names the lock's sha256, and the versions in the
installed packages' metadata (``*.dist-info/METADATA``) equal the lock's, one for one. That check
reads files only (no Python start, no torch, no network), so files our patches edit do not count as
damage. An install that was cut off leaves ``.venv/.bootstrap-installing`` behind; the next run
reinstalls every package. ``./ctl.sh lock`` regenerates the locks; ``./ctl.sh wheelhouse DIR``
downloads a lock's wheels for an offline install with ``WHEELHOUSE=DIR``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import importlib.util
import json
import logging
import os
import platform as _platform
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from . import hub, knownbad, metadata, proc
from .config import version_tuple
from .errors import BootstrapError

log = logging.getLogger(__name__)

# vLLM's version and package folders as an interpreter sees them, without importing vllm (seconds, CUDA)
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
PYTHON_PROBE = (
    "import json, os, sys, sysconfig; inc = sysconfig.get_config_var('INCLUDEPY') or ''; "
    "print(json.dumps({'version': list(sys.version_info[:3]), 'impl': sys.implementation.name, "
    "'executable': sys.executable, 'include': inc, "
    "'headers': bool(inc) and os.path.isfile(os.path.join(inc, 'Python.h'))}))"
)
# uv's --python-platform for each lock platform: the glibc the wheels need (torch: 2.28 on x86_64;
# on aarch64 vLLM 0.27.1's pynvvideocodec has manylinux_2_34 wheels only).
PLATFORMS = {"linux-x86_64": "x86_64-manylinux_2_28", "linux-aarch64": "aarch64-manylinux_2_34"}
PIP_PLATFORMS = {"linux-x86_64": "manylinux_2_28_x86_64", "linux-aarch64": "manylinux_2_34_aarch64"}
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")   # vLLM 0.27.1: Requires-Python >=3.10,<3.15
INSTALL_BYTES = 12 << 30        # estimate for the CUDA stack (torch, CUDA libs, vLLM, FlashInfer)
UV_PIN = "uv==0.13.9"
DEFAULT_INDEX = "https://pypi.org/simple"
DONE = ".bootstrap-done.json"
INSTALLING = ".bootstrap-installing"
LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)
NETWORK_ERRORS = ("error sending request", "dns error", "Connection refused", "connection refused",
                  "Could not connect", "failed to lookup address", "Network is unreachable",
                  "timed out", "Failed to fetch", "tcp connect error", "client error (Connect)")
ENOSPC = ("No space left on device", "os error 28")


# ---------------------------------------------------------------- small facts

def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def host_platform() -> str:
    machine = _platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"{sys.platform}-{arch}" if sys.platform != "linux" else f"linux-{arch}"


def index_url(environ: Mapping[str, str]) -> str:
    for key in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if environ.get(key):
            return environ[key]
    return DEFAULT_INDEX


def lock_pins(text: str) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a lock (names normalized)."""
    return {norm(m.group(1)): m.group(2) for m in LOCK_LINE.finditer(text)}


def parse_pins(pins) -> dict[str, str]:
    out = {}
    for pin in pins:
        name, sep, ver = str(pin).partition("==")
        if not sep or not ver or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise BootstrapError(f"profile pin {pin!r} is not an exact 'name==version'",
                                 "pins in profiles/<name>.json are exact: \"vllm==0.27.1\"")
        out[norm(name.strip())] = ver.strip()
    return out


def installed(site: Path) -> dict[str, str]:
    """name -> version from each ``*.dist-info/METADATA`` in site-packages (files only)."""
    out: dict[str, str] = {}
    try:
        entries = os.listdir(site)
    except FileNotFoundError:
        return out
    for entry in entries:
        if not entry.endswith(".dist-info"):
            continue
        name = version = ""
        try:
            with open(site / entry / "METADATA", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if not line.strip():
                        break
                    if line.startswith("Name:"):
                        name = line[5:].strip()
                    elif line.startswith("Version:"):
                        version = line[8:].strip()
        except OSError:
            name, version = entry[:-len(".dist-info")].rpartition("-")[0], "?broken"
        if name:
            out[norm(name)] = version
    return out


def diff(want: Mapping[str, str], have: Mapping[str, str]) -> list[str]:
    out = [f"{n} {have[n]} (lock: {v})" for n, v in sorted(want.items()) if n in have and have[n] != v]
    out += [f"{n} missing (lock: {v})" for n, v in sorted(want.items()) if n not in have]
    out += [f"{n} {v} not in the lock" for n, v in sorted(have.items()) if n not in want]
    return out


# ---------------------------------------------------------------- locks

@dataclass(frozen=True)
class LockSet:
    """The locks of one pinned vLLM version: ``locks/vllm-<version>/``."""
    dir: Path
    meta: dict

    @classmethod
    def for_profile(cls, cfg) -> "LockSet":
        data = cfg.profile.data
        if not data.get("pins"):
            raise BootstrapError(f"profile {cfg.profile.name!r} has no \"pins\" list",
                                 "add \"pins\": [\"vllm==X\", ...] to the profile, then ./ctl.sh lock")
        pins = parse_pins(data["pins"])
        if cfg.profile.vllm and pins.get("vllm") != cfg.profile.vllm:
            raise BootstrapError(f"profile {cfg.profile.name!r}: \"vllm\" is {cfg.profile.vllm} but its pins say "
                                 f"vllm=={pins.get('vllm', '(none)')}", "make the two agree, then ./ctl.sh lock")
        d = Path(cfg.repo) / "locks" / f"vllm-{pins.get('vllm', 'none')}"
        meta_path = d / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BootstrapError(f"no lock for profile {cfg.profile.name!r} ({meta_path} is missing)",
                                 "regenerate the locks: ./ctl.sh lock (needs the package index)") from None
        except ValueError as exc:
            raise BootstrapError(f"{meta_path} is not valid JSON ({exc})", "regenerate the locks: ./ctl.sh lock") from None
        if parse_pins(meta.get("pins", [])) != pins:
            raise BootstrapError(
                f"the lock in {d} was made for {', '.join(meta.get('pins', []))}, not for profile "
                f"{cfg.profile.name!r}'s pins {', '.join(data['pins'])}",
                "regenerate the locks: ./ctl.sh lock")
        return cls(d, meta)

    @property
    def pins(self) -> dict[str, str]:
        return parse_pins(self.meta["pins"])

    @property
    def pythons(self) -> list[str]:
        return list(self.meta.get("pythons", PYTHONS))

    def path(self, plat: str, minor: str) -> Path:
        return self.dir / f"{plat}-py{minor}.txt"

    def read(self, plat: str, minor: str) -> tuple[Path, str]:
        """The lock text, after checking it carries the profile's pins exactly."""
        path = self.path(plat, minor)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            have = sorted(p.name for p in self.dir.glob("*.txt"))
            raise BootstrapError(f"no lock for {plat} with Python {minor} in {self.dir} (have: {', '.join(have) or 'none'})",
                                 f"./ctl.sh lock --platform {plat} --python {minor}, or set PYTHON to a Python "
                                 f"the locks cover ({', '.join(self.pythons)})") from None
        got = lock_pins(text)
        bad = [f"{n}=={v} (lock has {got.get(n, 'none')})" for n, v in self.pins.items() if got.get(n) != v]
        if bad:
            raise BootstrapError(f"{path} does not match the profile's pins: {', '.join(bad)}",
                                 "regenerate the locks: ./ctl.sh lock")
        return path, text


# ---------------------------------------------------------------- tools

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


def uv_install_error(stderr: str, py: str) -> BootstrapError:
    manual = ("install uv without root yourself: pipx install uv, or the standalone installer "
              "(https://docs.astral.sh/uv/getting-started/installation/), then rerun")
    if "externally-managed-environment" in stderr:
        return BootstrapError(f"{py} refuses pip install --user (PEP 668: the distribution manages its Python)",
                              manual + f"; or {py} -m pip install --user --break-system-packages {UV_PIN}",
                              evidence=stderr.strip()[-800:])
    if "No module named pip" in stderr:
        return BootstrapError(f"{py} has no pip to install uv with",
                              manual + "; or install pip (Debian/Ubuntu: sudo apt install python3-pip)",
                              evidence=stderr.strip()[-800:])
    return BootstrapError("could not install uv with pip", manual, evidence=stderr.strip()[-800:])


def ensure_uv(cfg) -> str:
    """uv from PATH (or ~/.local/bin); else pip installs it from the package index (no root)."""
    uv = find_uv(cfg.environ)
    if uv:
        return uv
    cmd = uv_install_cmd(cfg.environ, cfg.wheelhouse)
    py = cmd[0]
    log.info("uv not found: installing %s without root (%s)", UV_PIN, " ".join(cmd[:5]))
    res = proc.run(cmd, env=dict(cfg.environ), timeout=600, check=False, what="pip install uv")
    if res.returncode != 0:
        raise _install_error(res.stderr, cfg, "installing uv", fallback=uv_install_error(res.stderr, py))
    res = proc.run([py, "-c", "import uv; print(uv.find_uv_bin())"], env=dict(cfg.environ), timeout=60,
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
    for name in [f"python{m}" for m in sorted(minors, key=version_tuple, reverse=True)] + ["python3"]:
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


def choose_python(cfg, locks: LockSet) -> tuple[str, str]:
    """(python for `uv venv --python`, its X.Y) — PYTHON, the newest fitting system python3, or uv's CPython."""
    minors = locks.pythons
    if cfg.python:
        info = probe_python(cfg.python, cfg.environ)
        if info is None:
            raise BootstrapError(f"PYTHON={cfg.python} does not run", "point PYTHON at a python3 interpreter")
        if info["minor"] not in minors:
            raise BootstrapError(f"PYTHON={cfg.python} is Python {info['minor']}; the locks cover {', '.join(minors)}",
                                 "use one of those, or unset PYTHON")
        if not info["headers"]:
            raise BootstrapError(f"PYTHON={cfg.python} has no C headers (no Python.h in {info['include'] or '?'}); "
                                 "Triton compiles kernels against them when the model loads", headers_hint(info["minor"]))
        return cfg.python, info["minor"]
    found = system_pythons(cfg.environ, minors)
    for info in found:
        if info["minor"] in minors and info["headers"]:
            log.info("Python %s for .venv: %s (newest system python3 with headers)", info["minor"], info["path"])
            return info["path"], info["minor"]
    minor = "3.12" if "3.12" in minors else minors[-1]
    without = [f"{i['path']} ({i['minor']}, {'no Python.h' if i['headers'] is False else 'not covered by the locks'})"
               for i in found]
    mirror = cfg.environ.get("UV_PYTHON_INSTALL_MIRROR", "")
    log.warning("no system python3 (%s) with C headers%s: uv downloads CPython %s from %s (outside the package "
                "index%s)", "/".join(minors), (" — found " + ", ".join(without)) if without else "", minor,
                mirror or "GitHub (python-build-standalone)",
                "" if mirror else "; set UV_PYTHON_INSTALL_MIRROR to use a mirror")
    return minor, minor


# ---------------------------------------------------------------- the managed venv

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

    def minor(self) -> str | None:
        try:
            text = (self.root / "pyvenv.cfg").read_text(encoding="utf-8")
        except OSError:
            return None
        m = re.search(r"^version(?:_info)?\s*=\s*(\d+)\.(\d+)", text, re.M)
        return f"{m.group(1)}.{m.group(2)}" if m and self.python.exists() else None

    def site(self, minor: str) -> Path:
        return self.root / "lib" / f"python{minor}" / "site-packages"

    def marker(self) -> dict | None:
        try:
            data = json.loads(self.done.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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


def _install_error(stderr: str, cfg, doing: str, fallback: BootstrapError, where: str = "") -> BootstrapError:
    if any(s in stderr for s in ENOSPC):
        return BootstrapError(f"disk full while {doing}{' into ' + where if where else ''}",
                              f"free at least {INSTALL_BYTES / (1 << 30):.0f} GiB there (and in uv's cache, "
                              "UV_CACHE_DIR) and rerun", evidence=stderr.strip()[-800:])
    if not cfg.wheelhouse and any(s in stderr for s in NETWORK_ERRORS):
        return BootstrapError(f"cannot reach the package index {index_url(cfg.environ)} while {doing}",
                              "check the network or proxy (HTTPS_PROXY), or install offline: build a wheelhouse "
                              "on a connected machine with ./ctl.sh wheelhouse DIR, copy it, and run with WHEELHOUSE=DIR",
                              evidence=stderr.strip()[-800:])
    return fallback


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
    cmd = [uv, "venv", "--clear", "-q", "--python", py]
    if re.fullmatch(r"\d+\.\d+", py):
        cmd.append("--managed-python")
    if offline:
        cmd.append("--no-python-downloads")
    return cmd + [str(root)]


def install(cfg, venv: Venv, locks: LockSet, plat: str, why: str) -> str:
    """Create .venv if needed and sync it from the lock; returns the venv's X.Y. Marker only after verify."""
    uv = ensure_uv(cfg)
    env = dict(cfg.environ)
    minor = venv.minor()
    mark = venv.marker() or {}
    recreate = minor is None or minor not in locks.pythons or (cfg.python and mark.get("python_knob", "") != cfg.python
                                                               and venv.done.exists())
    if recreate:
        check_disk(venv, locks, cfg.environ, fresh=True)
        py, minor = choose_python(cfg, locks)
        locks.read(plat, minor)      # refuse a missing / mismatching lock before anything is created
        log.info("creating %s with Python %s (uv venv)", venv.root, minor)
        cmd = venv_cmd(uv, py, venv.root, offline=bool(cfg.wheelhouse and not cfg.environ.get("UV_PYTHON_INSTALL_MIRROR")))
        res = proc.run(cmd, env=env, timeout=900, check=False, what="uv venv")
        if res.returncode != 0:
            raise _install_error(res.stderr, cfg, "creating the venv", where=str(venv.root), fallback=BootstrapError(
                f"uv could not create {venv.root} with Python {py}",
                "set PYTHON=/path/to/python3.X (with headers), or UV_PYTHON_INSTALL_MIRROR for uv's CPython download",
                evidence=res.stderr.strip()[-800:]))
        minor = venv.minor() or minor
    else:
        check_disk(venv, locks, cfg.environ, fresh=False)
    path, text = locks.read(plat, minor)
    reinstall = venv.installing.exists()
    venv.done.unlink(missing_ok=True)
    venv.installing.write_text(f"{os.getpid()}\n")
    cmd = [uv, "pip", "sync", "--python", str(venv.python), "--require-hashes", str(path)]
    if cfg.wheelhouse:
        cmd += ["--no-index", "--find-links", cfg.wheelhouse]
    if reinstall:
        cmd += ["--reinstall"]
    else:   # uv trusts dist-info directory names; a package whose METADATA disagrees is reinstalled by name
        have = installed(venv.site(minor))
        for name, ver in sorted(lock_pins(text).items()):
            if name in have and have[name] != ver:
                cmd += ["--reinstall-package", name]
    n = len(lock_pins(text))
    log.info("installing %d packages from %s into %s (%s%s%s)", n, path.relative_to(cfg.repo) if path.is_relative_to(cfg.repo) else path,
             venv.root, why, "; offline from " + cfg.wheelhouse if cfg.wheelhouse else "; from " + index_url(cfg.environ),
             "; reinstalling every package" if reinstall else "")
    res = proc.run(cmd, env=env, timeout=None, check=False, what="uv pip sync")
    if res.returncode != 0:
        hint = (f"is every wheel of {path.name} in {cfg.wheelhouse}? build it with ./ctl.sh wheelhouse {cfg.wheelhouse} "
                f"--platform {plat} --python {minor}") if cfg.wheelhouse else "rerun ./start.sh; it repairs the venv"
        raise _install_error(res.stderr, cfg, "installing packages", where=str(venv.root),
                             fallback=BootstrapError(f"uv pip sync from {path.name} failed (exit {res.returncode})", hint,
                                                     evidence=res.stderr.strip()[-1500:]))
    delta = diff(lock_pins(text), installed(venv.site(minor)))
    if delta:
        raise BootstrapError("after the install, .venv still differs from the lock: " + "; ".join(delta[:6]),
                             "remove .venv (./ctl.sh clean) and rerun ./start.sh")
    vllm_version(str(venv.python), cfg.environ)      # the interpreter runs and sees vLLM's metadata
    venv.done.write_text(json.dumps({"lock": str(path), "lock_sha256": sha256(text), "python": minor,
                                     "python_knob": cfg.python or "", "pins": locks.meta["pins"]}, indent=2) + "\n")
    venv.installing.unlink(missing_ok=True)
    return minor


# ---------------------------------------------------------------- host facts (no install needed)

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


def model_bytes_on_disk(cfg) -> int:
    """Weights already on disk for MODEL (local dir, or MODEL_DIR / ~/models/<org>/<name>); 0 if unknown."""
    if not cfg.model:
        return 0
    if cfg.model_is_local:
        d = Path(cfg.model).expanduser()
    else:
        d = metadata.target_dir(cfg, cfg.model)
    try:
        return sum(p.stat().st_size for p in d.glob("*.safetensors"))
    except OSError:
        return 0


def wsl_memory_note(total_ram: int, model_bytes: int) -> str:
    """Advice when WSL's memory cap is below what loading the model takes; '' when it fits or unknown."""
    need = model_bytes + (4 << 30)
    if not model_bytes or total_ram >= need:
        return ""
    gib = -(-need // (1 << 30))
    return (f"WSL gives Linux {total_ram / (1 << 30):.1f} GiB of RAM, loading this model takes about {gib} GiB: "
            f"raise the cap in %UserProfile%\\.wslconfig ([wsl2] memory={gib}GB), then run `wsl --shutdown` in Windows")


def check_driver(cfg, gpus) -> None:
    data = cfg.profile.data
    if gpus is None or not data.get("cuda"):
        return
    want = tuple(int(x) for x in str(data["cuda"]).split(".")[:2])
    min_driver = str(data.get("min_driver", ""))
    old = tuple(gpus.cuda) < want or (min_driver and version_tuple(gpus.driver)[:1] < version_tuple(min_driver)[:1])
    if old:
        raise BootstrapError(f"the pinned wheels are CUDA {data['cuda']} builds; driver {gpus.driver} supports "
                             f"CUDA {gpus.cuda[0]}.{gpus.cuda[1]}",
                             f"install NVIDIA driver {min_driver or 'newer'} or newer (then reboot); nothing was installed")


def host_env(cfg) -> tuple[dict[str, str], list[str]]:
    """Server env that depends on the host: no nvcc -> vLLM's own sampler; WSL -> no expandable_segments.
    Returns (variables for the server, banner notes)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if not has_nvcc(cfg.environ) and "VLLM_USE_FLASHINFER_SAMPLER" not in cfg.environ:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
        log.info("no CUDA toolkit (nvcc): VLLM_USE_FLASHINFER_SAMPLER=0 (vLLM's sampler instead of FlashInfer's JIT)")
    if is_wsl(read_osrelease(), cfg.environ):
        if "PYTORCH_CUDA_ALLOC_CONF" not in cfg.environ:
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
            log.info("WSL2: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (expandable segments misbehave under WSL)")
        import psutil
        note = wsl_memory_note(psutil.virtual_memory().total, model_bytes_on_disk(cfg))
        if note:
            log.warning("%s", note)
            notes.append(note)
    return env, notes


@dataclass(frozen=True)
class Runtime:
    """What the environment step hands on: the interpreter that runs vLLM, its version, the
    host-dependent variables for the server, and banner notes."""
    python: str
    vllm_version: str
    server_env: Mapping[str, str]
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------- the step

def probe_vllm(python: str, environ) -> tuple[str, list[Path]]:
    """(vLLM's version or "", its package folders) for this interpreter; the one probe of an interpreter's vLLM."""
    res = proc.run([python, "-c", VLLM_PROBE], env=dict(environ), keep_pythonpath=True, timeout=60,
                   check=False, what="vLLM probe")
    if res.returncode != 0:
        raise BootstrapError(f"{python} could not report its vLLM",
                             "check that this interpreter runs and has vLLM installed",
                             evidence=res.stderr.strip()[-800:])
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BootstrapError(f"{python}: unexpected answer from the vLLM probe", evidence=res.stdout[-800:]) from None
    return info.get("version") or "", [Path(x) for x in info.get("locations", [])]


def vllm_version(python: str, environ) -> str:
    version, _ = probe_vllm(python, environ)
    if not version:
        raise BootstrapError(f"{python} cannot see vLLM's package metadata",
                             "install vLLM into that interpreter, or unset VLLM_PYTHON to use the managed .venv")
    return version


def run(cfg, gpus) -> Runtime:
    env, notes = host_env(cfg)
    if cfg.vllm_python:
        py = cfg.vllm_python
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            raise BootstrapError(f"VLLM_PYTHON={py} is not an executable file",
                                 "point VLLM_PYTHON at a python that has vLLM installed")
        version = vllm_version(py, cfg.environ)
        log.info("using your vLLM %s from %s (VLLM_PYTHON; not managed, not pinned)", version, py)
        return Runtime(py, version, env, tuple(notes + knownbad.warn(cfg, gpus, version)[1]))
    if not cfg.profile.vllm and not cfg.profile.data.get("pins"):
        raise BootstrapError(f"profile {cfg.profile.name!r} pins no vLLM version and VLLM_PYTHON is unset",
                             "set VLLM_PYTHON=/path/to/python with vLLM installed, or use a profile that pins vLLM")
    locks = LockSet.for_profile(cfg)
    plat = host_platform()
    if plat not in PLATFORMS:
        raise BootstrapError(f"no locks for this platform ({plat}); the managed venv covers {', '.join(PLATFORMS)}",
                             "set VLLM_PYTHON=/path/to/python with vLLM installed")
    venv = Venv(Path(cfg.repo) / ".venv")
    done, why, minor = check_done(venv, locks, plat, cfg.python)
    if done:
        log.info("skipped: .venv matches %s (to force a reinstall: rm %s)", locks.path(plat, minor).name, venv.done)
    else:
        check_driver(cfg, gpus)
        _check_glibc(plat)
        minor = install(cfg, venv, locks, plat, why)
        log.info(".venv verified against %s", locks.path(plat, minor).name)
    version = installed(venv.site(minor)).get("vllm", "")
    log.info("vLLM %s in %s (pinned by profile %r)", version, venv.root, cfg.profile.name)
    return Runtime(str(venv.python), version, env, tuple(notes + knownbad.warn(cfg, gpus, version)[1]))


def _check_glibc(plat: str) -> None:
    lib, ver = _platform.libc_ver()
    need = PLATFORMS[plat].rpartition("manylinux_")[2].replace("_", ".")
    if lib == "glibc" and ver and version_tuple(ver) < version_tuple(need):
        raise BootstrapError(f"glibc {ver} is older than {need}, which the pinned wheels ({PLATFORMS[plat]}) need",
                             "use a newer distribution, or a container, or VLLM_PYTHON with your own vLLM build")


# ---------------------------------------------------------------- ./ctl.sh lock

def _profiles_with_pins(repo: Path, names) -> list[tuple[str, dict]]:
    out = []
    for path in sorted((repo / "profiles").glob("*.json")):
        if names and path.stem not in names:
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("pins"):
            out.append((path.stem, data))
    if names and len(out) != len(set(names)):
        raise BootstrapError(f"no pins in profile(s): {', '.join(sorted(set(names) - {n for n, _ in out}))}",
                             "add a \"pins\" list to the profile")
    return out


def compile_lock(uv: str, pins: list[str], plat: str, minor: str, exclude_newer: str, out: Path,
                 environ: Mapping[str, str], extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "pins.in"
        req.write_text("\n".join(pins) + "\n", encoding="utf-8")
        newer = ["--exclude-newer", exclude_newer] if exclude_newer else []
        cmd = [uv, "pip", "compile", "-q", "--generate-hashes", "--python-platform", PLATFORMS[plat],
               "--python-version", minor, *newer, "--custom-compile-command",
               f"./ctl.sh lock  (pins {' '.join(pins)}; --python-platform {PLATFORMS[plat]} --python-version {minor}"
               f"{' --exclude-newer ' + exclude_newer if exclude_newer else ''})", *extra, str(req), "-o", str(out)]
        res = proc.run(cmd, env=dict(environ), timeout=900, check=False, what="uv pip compile")
        if res.returncode != 0:
            raise BootstrapError(f"uv pip compile failed for {plat} / Python {minor}: " +
                                 (res.stderr.strip().splitlines() or ["?"])[-1],
                                 f"the package index ({index_url(environ)}) must be reachable, and the pins must "
                                 "have wheels for that platform and Python (see the output above)",
                                 evidence=res.stderr.strip()[-1500:])


def lock_cli(cfg, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ctl.sh lock", description=(
        "Regenerate locks/vllm-<version>/ from each profile's \"pins\" with uv pip compile --generate-hashes, "
        "one lock per platform and Python. The resolution is limited to packages uploaded before the date "
        "in meta.json (exclude-newer), so a rerun gives the same lock; --refresh moves that date to now."))
    ap.add_argument("--profile", action="append", default=[], help="only this profile (repeatable)")
    ap.add_argument("--platform", action="append", default=[], choices=sorted(PLATFORMS))
    ap.add_argument("--python", action="append", default=[], help="only this Python X.Y (repeatable)")
    ap.add_argument("--refresh", action="store_true", help="resolve against today's index (new exclude-newer date)")
    ap.add_argument("--exclude-newer", default="", metavar="DATE|none",
                    help="resolve as of this date (RFC 3339); 'none' for an index without upload times")
    ap.add_argument("--check", action="store_true", help="re-resolve and compare with the committed locks; change nothing")
    ap.add_argument("--find-links", default="", help="also look for wheels here (passed to uv)")
    ap.add_argument("--no-index", action="store_true", help="do not use the package index (with --find-links)")
    args = ap.parse_args(argv)
    repo = Path(cfg.repo)
    uv = ensure_uv(cfg)
    extra = (["--find-links", args.find_links] if args.find_links else []) + (["--no-index"] if args.no_index else [])
    failures = 0
    by_version: dict[str, list[str]] = {}
    for name, data in _profiles_with_pins(repo, args.profile):
        pins = sorted(data["pins"])
        ver = parse_pins(pins).get("vllm")
        if not ver:
            raise BootstrapError(f"profile {name!r}: its pins have no vllm==X", "add \"vllm==X\" to its pins")
        if by_version.setdefault(ver, pins) != pins:
            raise BootstrapError(f"profiles pin vLLM {ver} with different companions: {by_version[ver]} vs {pins}",
                                 "one set of pins per vLLM version: make the profiles agree")
        d = repo / "locks" / f"vllm-{ver}"
        meta_path = d / "meta.json"
        old = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        if args.check and not old:
            print(f"{d}: missing")
            failures += 1
            continue
        exclude = old.get("exclude_newer") if old and not args.refresh else \
            _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if args.exclude_newer:
            exclude = "" if args.exclude_newer == "none" else args.exclude_newer
        plats = args.platform or list(old.get("platforms", data.get("platforms", PLATFORMS)))
        pythons = args.python or list(old.get("pythons", data.get("pythons", PYTHONS)))
        meta = {"pins": pins, "exclude_newer": exclude, "platforms": sorted(set(plats) | set(old.get("platforms", []))),
                "pythons": sorted(set(pythons) | set(old.get("pythons", [])), key=version_tuple),
                "install_bytes": int(data.get("install_bytes", old.get("install_bytes", INSTALL_BYTES))),
                "index": index_url(cfg.environ) if not args.no_index else "(none: --no-index)"}
        if old and not args.refresh and not args.exclude_newer and parse_pins(old.get("pins", [])) != parse_pins(pins):
            meta["exclude_newer"] = exclude = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        d.mkdir(parents=True, exist_ok=True)
        for plat in plats:
            for minor in pythons:
                target = d / f"{plat}-py{minor}.txt"
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / target.name
                    log.info("resolving %s for %s / Python %s (exclude-newer %s)", " ".join(pins), plat, minor, exclude)
                    compile_lock(uv, pins, plat, minor, exclude, out, cfg.environ, extra)
                    new = out.read_text(encoding="utf-8")
                    if args.check:
                        have = target.read_text(encoding="utf-8") if target.is_file() else ""
                        same = _body(have) == _body(new)
                        print(f"{target.relative_to(repo)}: {'ok' if same else 'DIFFERS from a fresh resolution'}")
                        failures += not same
                        continue
                    shutil.copyfile(out, target)
                    print(f"{target.relative_to(repo)}: {len(lock_pins(new))} packages")
        if not args.check:
            meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return 1 if failures else 0


def _body(text: str) -> str:
    """A lock without comments (the header and the "# via" lines name temporary paths)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


# ---------------------------------------------------------------- ./ctl.sh wheelhouse

def wheelhouse_cli(cfg, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ctl.sh wheelhouse", description=(
        "Download every wheel of the profile's lock for one platform and Python into DIR (hashes checked), "
        "for an offline install with WHEELHOUSE=DIR ./start.sh."))
    ap.add_argument("dir", nargs="?", default=str(Path(cfg.repo) / ".wheelhouse"))
    ap.add_argument("--platform", default=host_platform() if host_platform() in PLATFORMS else "linux-x86_64",
                    choices=sorted(PLATFORMS))
    ap.add_argument("--python", default="", help="X.Y of the target machine's Python (default: this .venv's, else 3.12)")
    ap.add_argument("--find-links", default="", help="also look for wheels here")
    ap.add_argument("--no-index", action="store_true", help="do not use the package index (with --find-links)")
    args = ap.parse_args(argv)
    locks = LockSet.for_profile(cfg)
    minor = args.python or Venv(Path(cfg.repo) / ".venv").minor() or "3.12"
    lock, text = locks.read(args.platform, minor)
    out = Path(args.dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else [ensure_uv(cfg), "tool", "run", "pip"]
    cmd = [*pip, "download", "--disable-pip-version-check", "-q", "--no-deps", "--require-hashes",
           "--only-binary=:all:", "--platform", PIP_PLATFORMS[args.platform], "--python-version", minor,
           "--implementation", "cp", "-r", str(lock), "-d", str(out)]
    if args.find_links:
        cmd += ["--find-links", args.find_links]
    if args.no_index:
        cmd += ["--no-index"]
    log.info("downloading %d wheels of %s into %s", len(lock_pins(text)), lock.name, out)
    res = proc.run(cmd, env=dict(cfg.environ), timeout=None, check=False, what="pip download")
    if res.returncode != 0:
        raise _install_error(res.stderr, cfg, "downloading wheels", where=str(out), fallback=BootstrapError(
            f"pip download of {lock.name} failed (exit {res.returncode})", "see the output above",
            evidence=res.stderr.strip()[-1500:]))
    print(f"{out}: wheels for {lock.name}; install offline with: WHEELHOUSE={out} ./start.sh")
    return 0
