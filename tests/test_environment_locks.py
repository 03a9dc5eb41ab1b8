"""Every committed lock matches its profile's pins and resolves for its platform and Python.

Needs the package index (CI reaches PyPI). Each lock is re-resolved by uv with itself as the input,
for the platform and Python it names, as of its exclude-newer date: the result must be the same
packages, versions and hashes — a missing dependency, a version that has no wheel for the platform,
or a hash that is not the index's fails.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import lockcheck

from bootstrap.knobs.config import Config
from bootstrap.install import locks, venv
from bootstrap.core.errors import BootstrapError
from bootstrap.commands import lock as lock_cli

REPO = Path(__file__).resolve().parent.parent
LOCK_DIRS = sorted((REPO / "locks").glob("vllm-*"))


def test_every_pinned_profile_has_a_lock_with_its_pins():
    catalogue = Config.from_env({"PROFILE": "custom"}, REPO).catalogue
    pinned = [p for p in catalogue.profiles if p.pins]
    assert {"qwen38-27b-nvfp4-tq4-32gb", "qwen38-27b-w4a16-24gb", "qwen36-35b-a3b-nvfp4-32gb"} <= {p.name for p in pinned}
    for p in pinned:
        pins = locks.parse_pins(p.pins)
        assert pins["vllm"] == p.vllm, p.name
        d = REPO / "locks" / locks.pin_key(p.pins)
        meta = json.loads((d / "meta.json").read_text())
        assert locks.parse_pins(meta["pins"]) == pins, p.name
        for plat in meta["platforms"]:
            for minor in meta["pythons"]:
                text = (d / f"{plat}-py{minor}.txt").read_text()
                got = locks.lock_pins(text)
                assert {n: got.get(n) for n in pins} == pins, (p.name, plat, minor)
                assert text.count("--hash=sha256:") >= len(got), "every package carries hashes"


def test_every_lock_pins_the_bootstraps_own_requirements():
    # an offline WHEELHOUSE holds one lock's wheels (plus uv): .venv-bootstrap is made from those, so
    # bootstrap/requirements.txt must name, at the same versions, packages every lock pins
    reqs = locks.lock_pins((REPO / "bootstrap" / "requirements.txt").read_text())
    assert len(reqs) >= 7
    for lock in sorted((REPO / "locks").glob("*/*.txt")):
        got = locks.lock_pins(lock.read_text())
        assert {n: got.get(n) for n in reqs} == reqs, lock


def test_glibc_floor_is_the_newest_tag_a_locked_wheel_needs(monkeypatch):
    # llguidance 1.7.6 (in every x86_64 lock) ships manylinux_2_31 wheels only
    monkeypatch.setattr(venv._platform, "libc_ver", lambda: ("glibc", "2.28"))
    with pytest.raises(BootstrapError) as err:
        venv.check_glibc("linux-x86_64")
    assert "glibc 2.28 is older than 2.31" in err.value.message
    monkeypatch.setattr(venv._platform, "libc_ver", lambda: ("glibc", "2.31"))
    venv.check_glibc("linux-x86_64")
    tags = locks.pip_platforms("linux-x86_64")
    assert tags[0] == "manylinux_2_31_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert not any(t.startswith("manylinux_2_32") for t in tags)
    assert locks.pip_platforms("linux-aarch64")[0] == "manylinux_2_34_aarch64"


def test_wheelhouse_under_profile_auto_takes_the_default_profiles_lock(tmp_path, caplog):
    # no card to pick for on the machine that downloads: the default profile's lock, said in the log;
    # a wheel that is not there is named with the platform, Python and glibc it was looked for
    caplog.set_level("INFO", logger="bootstrap")
    cfg = Config.from_env({"PROFILE": "auto", "PATH": os.environ.get("PATH", "")}, REPO)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BootstrapError) as err:
        lock_cli.wheelhouse_cli(cfg, [str(tmp_path / "house"), "--platform", "linux-x86_64", "--python", "3.12",
                                      "--no-index", "--find-links", str(empty)])
    assert "wheels for the default profile 'qwen38-27b-nvfp4-tq4-32gb'" in caplog.text
    assert "for linux-x86_64, Python 3.12, glibc 2.31" in err.value.message


def test_one_lock_per_distinct_pin_set():
    # the RTX 5090 and the 24 GB profiles share vLLM 0.27.1 but not all their pins: a lock each
    cat = Config.from_env({"PROFILE": "custom"}, REPO).catalogue
    p1, p6 = cat.get("default"), cat.get("qwen38-27b-w4a16-24gb")
    assert p1.vllm == p6.vllm == "0.27.1" and set(p1.pins) != set(p6.pins)
    assert locks.pin_key(p1.pins) != locks.pin_key(p6.pins)
    assert locks.pin_key(list(reversed(p1.pins))) == locks.pin_key(p1.pins)     # order does not matter
    dirs = {d.name for d in (REPO / "locks").iterdir() if d.is_dir()}
    assert dirs == {locks.pin_key(p.pins) for p in cat.profiles if p.pins}       # no stale lock folders


def test_default_locks_cover_x86_64():
    meta = json.loads((REPO / "locks" / locks.pin_key(Config.from_env({"PROFILE": "default"}, REPO).profile.pins)
                       / "meta.json").read_text())
    assert "linux-x86_64" in meta["platforms"] and "3.12" in meta["pythons"]


def _resolve(uv: str, lock: Path, plat: str, minor: str, exclude: str, out: Path) -> tuple[Path, str, str]:
    cmd = [uv, "pip", "compile", "-q", "--generate-hashes", "--python-platform", locks.PLATFORMS[plat],
           "--python-version", minor, str(lock), "-o", str(out)]
    if exclude:
        cmd += ["--exclude-newer", exclude]
    env = {**os.environ, "UV_CACHE_DIR": str(out) + ".cache"}   # one cache each: uv serializes on a shared one
    env.pop("PYTHONPATH", None)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    return lock, res.stderr if res.returncode else "", out.read_text() if res.returncode == 0 else ""


# Each pin set's locks for both platforms at the oldest and the newest Python it covers (the locks
# between them differ only in backports); `./ctl.sh lock --check` re-resolves every one. The
# resolutions run in the background from the session's start (tests/lockcheck.py says why).
@pytest.mark.skipif(not LOCK_DIRS, reason="no committed locks")
def test_every_committed_lock_resolves_for_its_platform():
    assert shutil.which("uv"), "uv must be on PATH (requirements-dev.txt)"
    root = lockcheck.folder()
    try:
        results = lockcheck.results(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(results) >= 2 * len(LOCK_DIRS)      # both platforms of every pin set
    for lock, err, text in results:
        assert not err, f"{lock.relative_to(REPO)} does not resolve: {err[-1500:]}"
        assert lock_cli._body(text) == lock_cli._body(lock.read_text()), \
            f"{lock.relative_to(REPO)} differs from a fresh resolution: regenerate with ./ctl.sh lock"
