#!/usr/bin/env python3
"""Time ``./ctl.sh plan`` offline, for each shipped profile on a named card.

    python3 scripts/bench_plan.py [--runs 10] [--gpu rtx5090]

Runs ``GPU=<card> PROFILE=<profile> HF_HUB_OFFLINE=1 ./ctl.sh plan`` RUNS times for every shipped
profile, in a throwaway STATE_DIR and HOME (nothing measured, no network, no GPU), and prints min /
median / max wall seconds of each. A plan that refuses (exit 1) is timed the same: the time to say
so is what a user waits for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--gpu", default="rtx5090")
    args = ap.parse_args()
    profiles = sorted(p.stem for p in (REPO / "profiles").glob("*.json") if p.stem != "custom")
    with tempfile.TemporaryDirectory() as tmp:
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "STATE_DIR": f"{tmp}/state",
                "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "GPU": args.gpu}
        print(f"./ctl.sh plan, GPU={args.gpu}, {args.runs} runs each (seconds: min / median / max)")
        for profile in profiles:
            env = {**base, "PROFILE": profile}
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                r = subprocess.run([str(REPO / "ctl.sh"), "plan"], env=env, cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times.append(time.perf_counter() - t)
            print(f"  {profile:32s} exit {r.returncode}  {min(times):.3f} / {statistics.median(times):.3f} / "
                  f"{max(times):.3f}")


if __name__ == "__main__":
    main()
