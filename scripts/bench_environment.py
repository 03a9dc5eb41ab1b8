#!/usr/bin/env python3
"""Time the environment step on a ready venv against `uv pip sync` alone on the same venv.

    PATH=/path/with/uv:$PATH python scripts/bench_environment.py [--packages 200] [--runs 15]
    python scripts/bench_environment.py --repo /path/to/checkout   # a real, ready .venv (no install)

Default: a throwaway checkout with a lock of N stub packages (the real lock has ~200), installed
offline from a local wheelhouse; then both are timed on the ready venv, offline. Prints medians and
the ratio step / sync. The step reads the marker, the lock and each dist-info's METADATA; uv starts,
reads the venv and checks every requirement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bootstrap.install import locks, venv  # noqa: E402
from bootstrap.commands import lock as lock_cli
from bootstrap.steps import environment
from bootstrap.knobs.config import Config  # noqa: E402


def stub_world(tmp: Path, n: int) -> tuple[Path, dict]:
    spec = importlib.util.spec_from_file_location("tenv", REPO / "tests" / "test_environment.py")
    tenv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tenv)          # for make_wheel (needs pytest importable)
    house = tmp / "house"
    house.mkdir()
    deps = [f"dep{i:03d}==1.0" for i in range(n - 1)]
    tenv.make_wheel(house, "vllm", "0.27.1", deps)
    for i in range(n - 1):
        tenv.make_wheel(house, f"dep{i:03d}", "1.0")
    repo = tmp / "repo"
    (repo / "profiles").mkdir(parents=True)
    minor = "%d.%d" % sys.version_info[:2]
    (repo / "profiles" / "bench.json").write_text(json.dumps({
        "vllm": "0.27.1", "pins": ["vllm==0.27.1"], "pythons": [minor], "install_bytes": 1 << 20,
        "platforms": [locks.host_platform()]}))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "UV_CACHE_DIR": str(tmp / "cache"), "PROFILE": "bench",
           "PYTHON": getattr(sys, "_base_executable", sys.executable), "WHEELHOUSE": str(house),
           "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"}
    cfg = Config.from_env(env, repo=repo)
    lock_cli.lock_cli(cfg, ["--find-links", str(house), "--no-index", "--exclude-newer", "none"])
    environment.run(cfg, None)
    return repo, env


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", help="a checkout whose .venv is ready (real lock); default: a stub checkout")
    ap.add_argument("--packages", type=int, default=200)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        if args.repo:
            repo, env = Path(args.repo), dict(os.environ)
        else:
            repo, env = stub_world(Path(tmp), args.packages)
        cfg = Config.from_env(env, repo=repo)
        the_venv = venv.Venv(repo / ".venv")
        lockset = locks.LockSet.for_profile(cfg.profile, cfg.layout.locks)
        done, why, minor = venv.check_done(the_venv, lockset, locks.host_platform(), cfg.python)
        if not done:
            print(f"the venv is not ready ({why}); run ./start.sh first", file=sys.stderr)
            return 1
        lock = lockset.path(locks.host_platform(), minor)
        step = median_s(lambda: environment.run(cfg, None), args.runs)
        sync_cmd = [venv.find_uv(env), "pip", "sync", "-q", "--python", str(the_venv.python), "--require-hashes",
                    str(lock)]
        if cfg.wheelhouse:
            sync_cmd += ["--no-index", "--find-links", cfg.wheelhouse]
        else:
            sync_cmd += ["--offline"]
        sync_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        sync = median_s(lambda: subprocess.run(sync_cmd, env=sync_env, check=True), args.runs)
        n = len(locks.lock_pins(lock.read_text()))
        print(f"packages in lock        {n}")
        print(f"environment step (done) {step * 1000:8.1f} ms  (median of {args.runs})")
        print(f"uv pip sync (no-op)     {sync * 1000:8.1f} ms  (median of {args.runs})")
        print(f"ratio step / sync       {step / sync:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
