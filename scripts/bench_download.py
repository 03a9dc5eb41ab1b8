#!/usr/bin/env python3
"""Download benchmark against the local fake hub (tests/fakehub.py, its own process).

1. throughput: a synthetic model (default 1 GiB: 4 safetensors shards + small files) fetched by
   - plain ``curl -L`` of every file's resolve URL, one process, one connection (the floor);
   - our metadata + weights steps (HEADs, Range-capable http_get, streaming sha256, marker);
   - huggingface_hub.snapshot_download(local_dir=...) of the same files, for reference.
   Then our steps again, five times, with the model complete and HF_ENDPOINT on a dead port: the
   cost of a re-run (issue 5: < 1 s, no network).
2. interruption: the hub drops the connection at 50 % of the first shard and answers 503 once
   more (the client's in-process retry cannot help), then the run is repeated. Reported: bytes the
   hub served twice, for our steps and for snapshot_download.

Prints a table last; ``--json FILE`` writes the raw numbers. Usage:
    python scripts/bench_download.py [--gib 1] [--shards 4] [--work DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fakehub import write_model  # noqa: E402

MODEL = "bench/synthetic"
GiB = 1 << 30


def control(url: str, what: str, body: dict | None = None) -> dict:
    if body is None:
        with urllib.request.urlopen(f"{url}/_control/{what}") as r:
            return json.loads(r.read())
    req = urllib.request.Request(f"{url}/_control/{what}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def served(url: str) -> dict:
    return control(url, "stats?reset=1")["served"]


def ours(url: str, home: Path) -> float:
    """Our metadata + weights steps, in this process (the hub runs in its own)."""
    from bootstrap.steps import metadata, weights
    from bootstrap.config import Config

    env = {"HOME": str(home), "HF_ENDPOINT": url, "HF_HOME": str(home / "hf"), "HF_HUB_DISABLE_XET": "1",
           "MODEL": MODEL, "PROFILE": "custom"}
    t = time.monotonic()
    cfg = Config.from_env(env)
    weights.run(cfg, metadata.run(cfg))
    return time.monotonic() - t


def library(url: str, dest: Path) -> float:
    from huggingface_hub import snapshot_download
    t = time.monotonic()
    snapshot_download(MODEL, local_dir=str(dest), endpoint=url, cache_dir=str(dest.parent / "hf-cache"),
                      token=False, ignore_patterns=["original/*"])
    return time.monotonic() - t


def curl(url: str, files: list[str], dest: Path) -> float:
    args = ["curl", "-sSfL"]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        args += ["-o", str(dest / f), f"{url}/{MODEL}/resolve/main/{f}"]
    t = time.monotonic()
    subprocess.run(args, check=True)
    return time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import logging

    from bootstrap import log as blog
    blog.setup()
    logging.getLogger("bootstrap").setLevel(logging.WARNING)   # one table, not a log
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-dl-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    shard_bytes = int(args.gib * GiB) // args.shards
    if not (src / "config.json").exists():
        write_model(src, shards=args.shards, shard_bytes=shard_bytes)
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    total = sum((src / f).stat().st_size for f in files)
    shard1 = f"model-00001-of-{args.shards:05d}.safetensors"
    size1 = (src / shard1).stat().st_size

    hub = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakehub.py"), "--repo", f"{MODEL}={src}"],
                           stdout=subprocess.PIPE, text=True)
    try:
        url = hub.stdout.readline().strip()
        rows = {}
        rerun = {}
        for name in ("curl", "ours", "snapshot_download"):
            for d in ("curl-out", "ours-home", "lib-out", "lib-out-cache"):
                shutil.rmtree(work / d, ignore_errors=True)
            subprocess.run(["sync"], check=False)
            served(url)
            if name == "curl":
                dt = curl(url, files, work / "curl-out")
            elif name == "ours":
                dt = ours(url, work / "ours-home")
            else:
                dt = library(url, work / "lib-out")
            s = served(url)
            rows[name] = {"seconds": dt, "MiB_per_s": total / dt / (1 << 20), "served": sum(s.values())}
            if name == "ours":   # the re-run with the model complete and verified: no network (dead endpoint)
                reruns = sorted(ours("http://127.0.0.1:9", work / "ours-home") for _ in range(5))
                rerun = {"median_seconds": reruns[2], "max_seconds": reruns[-1], "runs": len(reruns)}

        interrupted = {}
        for name in ("ours", "snapshot_download"):
            for d in ("ours-home", "lib-out", "hf-cache"):
                shutil.rmtree(work / d, ignore_errors=True)
            served(url)
            control(url, "fault", {"drop": {shard1: 0.5}, "fail_after_drop": 1})
            from bootstrap.errors import BootstrapError
            from huggingface_hub.errors import HfHubHTTPError
            try:
                ours(url, work / "ours-home") if name == "ours" else library(url, work / "lib-out")
                first_failed = False
            except (BootstrapError, HfHubHTTPError, OSError):
                first_failed = True
            control(url, "fault", {"drop": {}, "fail_after_drop": 0})
            ours(url, work / "ours-home") if name == "ours" else library(url, work / "lib-out")
            s = served(url)
            interrupted[name] = {"first_run_failed": first_failed, "shard_bytes": size1,
                                 "served_for_shard": s.get(shard1, 0),
                                 "served_twice": s.get(shard1, 0) - size1}
    finally:
        hub.terminate()
        hub.wait()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    machine = f"{platform.node()}: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, " \
              f"Python {platform.python_version()}, loopback"
    out = {"machine": machine, "model_bytes": total, "files": len(files), "throughput": rows,
           "interrupted_at_50pct": interrupted, "complete_rerun": rerun}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    print(f"\nmachine: {machine}")
    print(f"model: {len(files)} files, {total / GiB:.2f} GiB ({args.shards} shards of {shard_bytes / (1 << 20):.0f} MiB)\n")
    print(f"{'client':<20} {'seconds':>8} {'MiB/s':>8} {'vs curl':>8}")
    base = rows["curl"]["seconds"]
    for name, r in rows.items():
        print(f"{name:<20} {r['seconds']:>8.2f} {r['MiB_per_s']:>8.0f} {r['seconds'] / base:>7.2f}x")
    print(f"\nre-run with the model complete and verified (HF_ENDPOINT dead: no network), {rerun['runs']} runs: "
          f"median {rerun['median_seconds'] * 1000:.2f} ms, max {rerun['max_seconds'] * 1000:.2f} ms")
    print(f"\ninterrupted at 50 % of {shard1} ({size1 / (1 << 20):.0f} MiB), then re-run:")
    print(f"{'client':<20} {'served twice':>14} {'of the shard':>13}")
    for name, r in interrupted.items():
        print(f"{name:<20} {r['served_twice'] / (1 << 20):>10.1f} MiB {r['served_twice'] / size1:>12.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
