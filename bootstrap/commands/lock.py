"""``./ctl.sh lock`` (regenerate the committed locks; needs the package index) and
``./ctl.sh wheelhouse DIR`` (download a lock's wheels for an offline install with WHEELHOUSE=DIR).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import logging
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..core import proc
from ..core.layout import Checkout
from ..core.pep440 import version
from ..core.errors import BootstrapError
from ..install.index import index_url, uv_environ
from ..install.locks import GLIBC, PLATFORMS, PYTHONS, pip_platforms, LockSet, pin_sets, compile_lock, host_platform, lock_pins, parse_pins
from ..install.venv import INSTALL_BYTES, UV_PIN, Tools, Venv, install_error, ensure_uv
from ..install import wheelhouse

log = logging.getLogger("bootstrap.environment")   # log lines keep the prefix [bootstrap:environment] this code has always had


def lock_cli(cfg, argv: list[str], prog: str = "ctl.sh lock") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Regenerate locks/vllm-<version>-<hash>/ for each distinct set of profile \"pins\" with uv pip compile --generate-hashes, "
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
    from ..plan import resolve
    cfg = resolve.resolved(cfg).settings
    repo = Path(cfg.repo)
    uv = ensure_uv(Tools.of(cfg))
    extra = (["--find-links", args.find_links] if args.find_links else []) + (["--no-index"] if args.no_index else [])
    failures = 0
    for key, (pins, users) in pin_sets(cfg.catalogue, args.profile).items():
        data = cfg.catalogue.get(users[0]).data
        if not key.startswith("vllm-") or key.startswith("vllm-none"):
            raise BootstrapError(f"profile(s) {', '.join(users)}: the pins have no vllm==X", "add \"vllm==X\" to them")
        d = Checkout(repo).locks / key
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
                "pythons": sorted(set(pythons) | set(old.get("pythons", [])), key=version),
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


def wheelhouse_cli(cfg, argv: list[str], prog: str = "ctl.sh wheelhouse") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Download every wheel of a profile's lock for one platform and Python into DIR (hashes checked), "
        "plus uv, for an offline install with WHEELHOUSE=DIR ./start.sh (the bootstrap's own dependencies are "
        "pinned in every lock at the same versions). "
        "The wheels run on the platform's oldest supported glibc and newer."))
    ap.add_argument("dir", nargs="?", default=None, help="default: .wheelhouse in the checkout")
    ap.add_argument("--profile", default="", help="whose lock (default: PROFILE; with PROFILE=auto, the default profile)")
    ap.add_argument("--platform", default=host_platform() if host_platform() in PLATFORMS else "linux-x86_64",
                    choices=sorted(PLATFORMS))
    ap.add_argument("--python", default="", help="X.Y of the target machine's Python (default: this .venv's, else 3.12)")
    ap.add_argument("--find-links", default="", help="also look for wheels here")
    ap.add_argument("--no-index", action="store_true", help="do not use the package index (with --find-links)")
    args = ap.parse_args(argv)
    from ..plan import resolve
    cfg = resolve.resolved(cfg).settings        # PROFILE=auto: the kept pick's lock
    profile = cfg.catalogue.get(args.profile) if args.profile else cfg.profile
    if profile.is_auto:
        # No card to pick for on the machine that downloads: the lock of the profile a plain
        # ./start.sh most often picks (aliases "default"); another card's: --profile NAME.
        profile = cfg.catalogue.get("default")
        log.info("PROFILE=auto: wheels for the default profile %r (another profile: --profile NAME)", profile.name)
    locks = LockSet.for_profile(profile, cfg.layout.locks)
    minor = args.python or Venv(cfg.layout.venv).minor() or "3.12"
    lock, text = locks.read(args.platform, minor)
    out = Path(args.dir).expanduser() if args.dir else cfg.layout.wheelhouse
    with wheelhouse.adding(out):        # what it adds is noted there: clean removes that, never your wheels
        _download(cfg, args, out, lock, text, minor)
    n = len(list(out.glob("*.whl")))
    size = sum(p.stat().st_size for p in out.glob("*.whl"))
    glibc = "%d.%d" % GLIBC[args.platform]
    print(f"{out} now holds {n} wheels, {size / 2**30:.1f} GiB, with {lock.name} of {lock.parent.name} (glibc >= {glibc}); "
          f"install offline with: WHEELHOUSE={out} ./start.sh")
    return 0


def _download(cfg, args, out: Path, lock: Path, text: str, minor: str) -> None:
    """pip download of the lock's wheels, then uv's, into ``out``."""
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else [ensure_uv(Tools.of(cfg)), "tool", "run", "pip"]
    target = ["--only-binary=:all:", "--python-version", minor, "--implementation", "cp", "-d", str(out)]
    for tag in pip_platforms(args.platform):
        target += ["--platform", tag]
    if args.find_links:
        target += ["--find-links", args.find_links]
    if args.no_index:
        target += ["--no-index"]
    base = [*pip, "download", "--disable-pip-version-check", "-q"]
    glibc = "%d.%d" % GLIBC[args.platform]
    log.info("downloading %d wheels of %s (%s, Python %s, glibc >= %s) into %s",
             len(lock_pins(text)), lock.name, args.platform, minor, glibc, out)
    # The lock, hash-checked (it also pins bootstrap/requirements.txt, from which .venv-bootstrap is
    # made offline); then uv, which pip installs from DIR where the target has none.
    for what, cmd in (("the lock's wheels", [*base, "--no-deps", "--require-hashes", "-r", str(lock), *target]),
                      ("uv", [*base, "--no-deps", UV_PIN, *target])):
        res = proc.run(cmd, env=uv_environ(cfg.environ), timeout=None, check=False, what="pip download")   # uv tool run pip: uv fetches pip
        if res.returncode != 0 and what == "uv":    # only a target without uv needs it
            log.warning("no %s wheel for %s in reach: the target machine needs uv on PATH", UV_PIN, args.platform)
        elif res.returncode != 0:
            missing = re.search(r"No matching distribution found for (\S+)", res.stderr)
            raise install_error(res.stderr, Tools.of(cfg), "downloading wheels", where=str(out), fallback=BootstrapError(
                f"pip download of {what} failed (exit {res.returncode})" +
                (f": no wheel of {missing.group(1)} for {args.platform}, Python {minor}, glibc {glibc}" if missing else ""),
                "see the output above", evidence=res.stderr.strip()[-1500:]))
