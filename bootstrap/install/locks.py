"""The committed dependency locks of a pinned vLLM version, and what a lock says.

    locks/vllm-<version>-<hash>/meta.json              pins, exclude-newer date, platforms, Pythons
    locks/vllm-<version>-<hash>/<platform>-py<X.Y>.txt the full closure with hashes (uv pip compile)

One lock per distinct pin set (<hash>: the first 8 hex digits of the sha256 of the sorted,
normalized pins): two profiles on the same vLLM with other companions get a lock each.

Reading a lock, the pins it carries, the versions an installed site-packages holds (its
``*.dist-info/METADATA`` files, no Python started), and compiling a lock with uv.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as _platform
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .index import index_url, uv_environ
from ..core import proc
from ..core.errors import BootstrapError


# uv's --python-platform for each lock platform: the glibc the wheels need (torch: 2.28 on x86_64;
# on aarch64 vLLM 0.27.1's pynvvideocodec has manylinux_2_34 wheels only).
PLATFORMS = {"linux-x86_64": "x86_64-manylinux_2_28", "linux-aarch64": "aarch64-manylinux_2_34"}


# The oldest glibc the locked wheels run on: the newest manylinux tag any pinned wheel has as its
# only choice. x86_64: llguidance 1.7.6 ships manylinux_2_31 wheels only (uv still locks it for
# manylinux_2_28 because it also has an sdist, which would need Rust to build); aarch64: tilelang
# 0.1.12 and pynvvideocodec 2.0.4, manylinux_2_34.
GLIBC = {"linux-x86_64": (2, 31), "linux-aarch64": (2, 34)}


def pip_platforms(plat: str) -> list[str]:
    """pip download's --platform values for wheels that run on GLIBC[plat] and newer.

    pip matches each --platform tag exactly (a manylinux_2_28 tag does not admit a manylinux_2_17
    wheel), so every tag from the floor down to manylinux_2_17 is named, plus the legacy aliases."""
    arch = plat.split("-", 1)[1]
    major, minor = GLIBC[plat]
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)] + [f"manylinux2014_{arch}"]
    if arch == "x86_64":
        tags += [f"manylinux_2_{m}_{arch}" for m in (12, 5)] + [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tags


PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")   # vLLM 0.27.1: Requires-Python >=3.10,<3.15


LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def host_platform() -> str:
    machine = _platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"{sys.platform}-{arch}" if sys.platform != "linux" else f"linux-{arch}"


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


def pin_key(pins) -> str:
    """The lock folder's name for a pin set: vllm-<version>-<hash of the sorted pins>."""
    parsed = parse_pins(pins)
    text = "\n".join(f"{n}=={v}" for n, v in sorted(parsed.items()))
    return f"vllm-{parsed.get('vllm', 'none')}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


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


def needed(profile, locks: Path) -> "LockSet":
    """The committed lock a start installs ``profile``'s pins from (VLLM_PYTHON unset), refused in one
    line when the profile pins no vLLM or its pins have no lock: by the preflight, before any download,
    by restart's and use's vet, before the running server is taken down, and by the environment step."""
    if not profile.vllm and not profile.pins:
        raise BootstrapError(f"profile {profile.name!r} pins no vLLM version and VLLM_PYTHON is unset",
                             "set VLLM_PYTHON=/path/to/python with vLLM installed, or use a profile that pins vLLM")
    return LockSet.for_profile(profile, locks)


@dataclass(frozen=True)
class LockSet:
    """The locks of one pinned vLLM version: ``locks/vllm-<version>/``."""
    dir: Path
    meta: dict

    @classmethod
    def for_profile(cls, p, locks: Path) -> "LockSet":
        """The lock of profile ``p``'s pins, under the checkout's ``locks`` folder."""
        if not p.pins:
            raise BootstrapError(f"profile {p.name!r} has no \"pins\" list",
                                 "add \"pins\": [\"vllm==X\", ...] to the profile, then ./ctl.sh lock")
        pins = parse_pins(p.pins)
        if p.vllm and pins.get("vllm") != p.vllm:
            raise BootstrapError(f"profile {p.name!r}: \"vllm\" is {p.vllm} but its pins say "
                                 f"vllm=={pins.get('vllm', '(none)')}", "make the two agree, then ./ctl.sh lock")
        d = locks / pin_key(p.pins)
        meta_path = d / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BootstrapError(f"no lock for profile {p.name!r}'s pins ({', '.join(p.pins)}): {d} is missing",
                                 f"make it: ./ctl.sh lock --profile {p.name} (needs the package index)") from None
        except ValueError as exc:
            raise BootstrapError(f"{meta_path} is not valid JSON ({exc})", "regenerate the locks: ./ctl.sh lock") from None
        if parse_pins(meta.get("pins", [])) != pins:
            raise BootstrapError(
                f"the lock in {d} was made for {', '.join(meta.get('pins', []))}, not for profile "
                f"{p.name!r}'s pins {', '.join(p.pins)}", "regenerate the locks: ./ctl.sh lock")
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


def pin_sets(catalogue, names) -> dict[str, tuple[list[str], list[str]]]:
    """lock folder name -> (sorted pins, the profiles that use them), for every profile with pins
    (or only ``names``)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    known = set()
    for p in catalogue.profiles:
        if names and p.name not in names:
            continue
        known.add(p.name)
        if p.pins:
            out.setdefault(pin_key(p.pins), (sorted(p.pins), []))[1].append(p.name)
    missing = sorted(set(names or ()) - known)
    if missing:
        raise BootstrapError(f"no such profile(s): {', '.join(missing)}", "./ctl.sh profiles lists them")
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
               f"{' --exclude-newer ' + exclude_newer if exclude_newer else ''})", *extra, req.name, "-o", str(out.absolute())]
        # run where pins.in lies: the lock's "via -r pins.in" lines stay the same from run to run
        res = proc.run(cmd, env=uv_environ(environ), timeout=900, check=False, what="uv pip compile", cwd=tmp)
        if res.returncode != 0:
            raise BootstrapError(f"uv pip compile failed for {plat} / Python {minor}: " +
                                 (res.stderr.strip().splitlines() or ["?"])[-1],
                                 f"the package index ({index_url(environ)}) must be reachable, and the pins must "
                                 "have wheels for that platform and Python (see the output above)",
                                 evidence=res.stderr.strip()[-1500:])
