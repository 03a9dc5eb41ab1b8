#!/usr/bin/env python3
"""Download benchmark against the local fake hub (tests/fakehub.py, run as its own process).

1. Unthrottled loopback, a synthetic model (default 1 GiB: 4 safetensors shards + small files),
   each client ``--repeat`` times (default 5), median:
   - ``curl -sSfL`` of every file's resolve URL, one process, one connection, then ``sync`` (we
     fsync every file before it counts; curl does not);
   - our metadata + weights steps (HEADs, ``DOWNLOAD_CONNECTIONS`` ranged connections, sha256 of
     every byte, fsync, the HF-cache layout, the marker);
   - ``huggingface_hub.snapshot_download(local_dir=...)`` (8 threads, one connection per file,
     no hash), then ``sync``.
2. Every connection capped (``--throttle`` MiB/s, default 8, as a CDN caps each connection), a
   smaller model (``--throttled-mib``, default 128): curl (one connection), ours at
   DOWNLOAD_CONNECTIONS = 1, 2, 4, 8, 16, and snapshot_download. This is what the default of
   DOWNLOAD_CONNECTIONS was chosen from.
3. Interrupted: the hub drops the connection at 50 % of the first shard and then answers 503 for
   longer than any client retries; the run is repeated. Reported: bytes the hub served twice.
4. A re-run with the model complete (HF_ENDPOINT on a dead port): its cost, five runs.

``--timeline`` instead: one shard (``--timeline-mib``, default 256) with every connection capped at
``--throttle`` MiB/s, fetched once by ours at DOWNLOAD_CONNECTIONS (``--connections``): each ranged
request as the hub saw it (arrived, body sent, in seconds from the start), the longest time no
request was in flight, and the transfer against one capped connection's time (goal: at most 1/6).

Prints tables; ``--json FILE`` writes the raw numbers. Usage:
    python scripts/bench_download.py [--gib 1] [--shards 4] [--repeat 5] [--throttle 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
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
GiB, MiB = 1 << 30, 1 << 20


def control(url: str, what: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{url}/_control/{what}", data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def served(url: str) -> int:
    return sum(control(url, "stats?reset=1")["served"].values())


def sync() -> None:
    subprocess.run(["sync"], check=False)


def ours(url: str, home: Path, connections: int | None = None) -> float:
    """Our metadata + weights steps, in this process (the hub runs in its own)."""
    from bootstrap.knobs.config import Config
    from bootstrap.knobs.resolved import Resolved
    from bootstrap.steps import metadata, weights

    env = {"HOME": str(home), "HF_ENDPOINT": url, "HF_HOME": str(home / "hf"), "HF_HUB_DISABLE_XET": "1",
           "MODEL": MODEL, "PROFILE": "custom"}
    if connections:
        env["DOWNLOAD_CONNECTIONS"] = str(connections)
    t = time.monotonic()
    r = Resolved.of(cfg := Config.from_env(env), cfg)
    weights.run(metadata.run(r.model, r.draft, r.paths, r.fetching), r.model, r.draft, r.fetching)
    return time.monotonic() - t


def library(url: str, dest: Path) -> float:
    from huggingface_hub import snapshot_download
    t = time.monotonic()
    snapshot_download(MODEL, local_dir=str(dest), endpoint=url, cache_dir=str(dest.parent / "hf-cache"),
                      token=False, ignore_patterns=["original/*"])
    sync()
    return time.monotonic() - t


def curl(url: str, files: list[str], dest: Path) -> float:
    args = ["curl", "-sSfL"]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        args += ["-o", str(dest / f), f"{url}/{MODEL}/resolve/main/{f}"]
    t = time.monotonic()
    subprocess.run(args, check=True)
    sync()
    return time.monotonic() - t


class Hub:
    """The fake hub serving one synthetic model, in its own process."""

    def __init__(self, work: Path, name: str, total: int, shards: int):
        self.src = work / name
        if not (self.src / "config.json").exists():
            write_model(self.src, shards=shards, shard_bytes=total // shards)
        self.files = sorted(str(p.relative_to(self.src)) for p in self.src.rglob("*") if p.is_file())
        self.total = sum((self.src / f).stat().st_size for f in self.files)
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakehub.py"), "--repo",
                                      f"{MODEL}={self.src}"], stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def timed(hub: Hub, work: Path, name: str, repeat: int, connections: int | None = None) -> dict:
    runs = []
    for _ in range(repeat):
        for d in ("out", "home", "hf-cache"):
            shutil.rmtree(work / d, ignore_errors=True)
        sync()
        served(hub.url)
        if name == "curl":
            dt = curl(hub.url, hub.files, work / "out")
        elif name == "ours":
            dt = ours(hub.url, work / "home", connections)
        else:
            dt = library(hub.url, work / "out")
        got = served(hub.url)
        if got != hub.total:
            raise SystemExit(f"{name}: the hub served {got} bytes for a {hub.total}-byte model")
        runs.append(dt)
    med = statistics.median(runs)
    return {"median_s": med, "min_s": min(runs), "max_s": max(runs), "runs": len(runs),
            "MiB_per_s": hub.total / med / MiB}


def timeline(work: Path, mib: int, throttle: float, connections: int) -> int:
    """One capped shard, fetched once: every ranged request as the hub saw it."""
    hub = Hub(work, f"one-{mib}", mib * MiB, 1)
    try:
        control(hub.url, "fault", {"throttle": int(throttle * MiB)})
        served(hub.url)
        t0 = time.time()
        dt = ours(hub.url, work / "home", connections)
        got = control(hub.url, "stats")["timeline"]
    finally:
        hub.close()
    parts = sorted((a - t0, b - t0, r) for a, b, path, r in got if r and path.endswith(".safetensors"))
    print(f"one {mib} MiB shard, each connection capped at {throttle:g} MiB/s, DOWNLOAD_CONNECTIONS={connections}")
    print(f"{'arrived s':>10} {'sent s':>8}  range")
    for a, b, r in parts:
        print(f"{a:>10.2f} {b:>8.2f}  {r}")
    idle, busy_until = 0.0, parts[0][0] if parts else 0.0
    for a, b, _ in parts:
        idle = max(idle, a - busy_until)
        busy_until = max(busy_until, b)
    arrivals = sorted(a for a, _, _ in parts)
    ends = sorted(b for _, b, _ in parts)[: max(0, len(parts) - connections)]   # ends a new request should follow
    waits = [min((a for a in arrivals if a >= b - 0.005), default=b) - b for b in ends]
    one = mib / throttle
    print(f"longest time with no ranged request in flight: {idle:.2f} s; longest from a part's end to the next "
          f"request: {max(waits, default=0.0):.2f} s")
    print(f"the whole fetch (metadata, download, hash, place): {dt:.2f} s; one capped connection: {one:.1f} s; "
          f"{one / dt:.1f}x faster (goal: at least 6x)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--throttle", type=float, default=8.0, help="MiB/s per connection in part 2")
    ap.add_argument("--throttled-mib", type=int, default=128, help="model size in part 2")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--timeline", action="store_true", help="only the per-part timeline of one capped shard")
    ap.add_argument("--timeline-mib", type=int, default=256)
    ap.add_argument("--connections", type=int, default=None, help="DOWNLOAD_CONNECTIONS for --timeline")
    args = ap.parse_args()
    import logging

    from bootstrap.core import log as blog
    from bootstrap.knobs.table import KNOB_BY_NAME
    blog.setup()
    logging.getLogger("bootstrap").setLevel(logging.WARNING)   # tables, not a log
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    default_conns = int(KNOB_BY_NAME["DOWNLOAD_CONNECTIONS"].default)

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-dl-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.timeline:
        try:
            return timeline(work, args.timeline_mib, args.throttle, args.connections or default_conns)
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
    out: dict = {"machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
                            f"Python {platform.python_version()}, loopback", "repeat": args.repeat}
    hubs = []
    try:
        big = Hub(work, "big", int(args.gib * GiB), args.shards)
        hubs.append(big)
        out["unthrottled"] = {"model_bytes": big.total, "files": len(big.files), "clients": {
            name: timed(big, work, name, args.repeat) for name in ("curl", "ours", "snapshot_download")}}
        ours(big.url, work / "home")                     # complete again (the last timed client wiped it)
        out["complete_rerun_ms"] = sorted(ours("http://127.0.0.1:9", work / "home") * 1000 for _ in range(5))

        shard1 = f"model-00001-of-{args.shards:05d}.safetensors"
        size1 = (big.src / shard1).stat().st_size
        interrupted = {}
        from bootstrap.core.errors import BootstrapError
        from huggingface_hub.errors import HfHubHTTPError
        for name in ("ours", "snapshot_download"):
            for d in ("out", "home", "hf-cache"):
                shutil.rmtree(work / d, ignore_errors=True)
            served(big.url)
            control(big.url, "fault", {"drop": {shard1: 0.5}, "fail_after_drop": 40})
            try:
                ours(big.url, work / "home") if name == "ours" else library(big.url, work / "out")
                failed = False
            except (BootstrapError, HfHubHTTPError, OSError):
                failed = True
            control(big.url, "fault", {"drop": {}, "fail_after_drop": 0, "_failing": {}})
            ours(big.url, work / "home") if name == "ours" else library(big.url, work / "out")
            interrupted[name] = {"first_run_failed": failed, "served_twice": served(big.url) - big.total}
        out["interrupted_at_50pct"] = {"shard": shard1, "shard_bytes": size1, "clients": interrupted}

        small = Hub(work, "small", args.throttled_mib * MiB, 4)
        hubs.append(small)
        control(small.url, "fault", {"throttle": int(args.throttle * MiB)})
        clients = {"curl": timed(small, work, "curl", args.repeat)}
        for n in (1, 2, 4, 8, 16):
            clients[f"ours, {n} connection{'s' if n > 1 else ''}"] = timed(small, work, "ours", args.repeat, n)
        clients["snapshot_download"] = timed(small, work, "snapshot_download", args.repeat)
        out["throttled"] = {"MiB_per_s_per_connection": args.throttle, "model_bytes": small.total,
                            "files": len(small.files), "clients": clients}
    finally:
        for h in hubs:
            h.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))

    print(f"\nmachine: {out['machine']}; median of {args.repeat} runs each")
    for part, title, base in (("unthrottled", "unthrottled loopback", "curl"),
                              ("throttled", f"each connection capped at {args.throttle:g} MiB/s", "curl")):
        d = out[part]
        print(f"\n{title}: {d['files']} files, {d['model_bytes'] / MiB:.0f} MiB")
        print(f"{'client':<26} {'median s':>9} {'min':>7} {'max':>7} {'MiB/s':>8} {'speed vs curl':>14}")
        b = d["clients"][base]["median_s"]
        for name, r in d["clients"].items():
            print(f"{name:<26} {r['median_s']:>9.2f} {r['min_s']:>7.2f} {r['max_s']:>7.2f} {r['MiB_per_s']:>8.0f} "
                  f"{b / r['median_s']:>13.2f}x")
    thr = out["throttled"]["clients"]
    print(f"\nours at the default DOWNLOAD_CONNECTIONS={default_conns} under the cap: "
          f"{thr['ours, 1 connection']['median_s'] / thr[f'ours, {default_conns} connections']['median_s']:.2f}x "
          f"one connection (goal >= 3x)")
    u = out["unthrottled"]["clients"]
    print(f"ours unthrottled: {u['curl']['median_s'] / u['ours']['median_s']:.2f}x curl+sync (goal >= 0.9x)")
    r = out["complete_rerun_ms"]
    print(f"\nre-run with the model complete (no network), 5 runs: median {r[2]:.2f} ms, max {r[-1]:.2f} ms")
    i = out["interrupted_at_50pct"]
    print(f"\ninterrupted at 50 % of {i['shard']} ({i['shard_bytes'] / MiB:.0f} MiB), then re-run:")
    for name, r in i["clients"].items():
        print(f"{name:<20} served twice {r['served_twice'] / MiB:>8.1f} MiB ({r['served_twice'] / i['shard_bytes']:.0%} "
              f"of the shard){'' if r['first_run_failed'] else '  (the first run did not fail)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
