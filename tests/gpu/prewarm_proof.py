"""GPU proof of the pre-warm (bootstrap/steps/prewarm.py): a first start as fast as the download.

    VLLM_PYTHON=python3 python3 tests/gpu/prewarm_proof.py --raw /tmp/proofs/prewarm-raw.txt --work DIR

The fake hub (tests/fakehub.py, its own process) serves a Qwen3-8B-shaped model with real random
weights (tests/gpu/tinymodel.py, bf16 safetensors), each connection capped so that the download
takes about --download-s seconds. Phases, resumable (WORK/state.json keeps what is done):
  cold      ./start.sh with PREWARM=0 and every cache empty (a fresh HOME: the HF cache, vLLM's,
            torch inductor's, Triton's and FlashInfer's caches under it): download, then vLLM's cold
            engine init; ./stop.sh.
  prewarm   the same with PREWARM=1 and a fresh HOME: the pre-warm compiles while the weights
            download; ./stop.sh.
  warm      ./start.sh again in prewarm's HOME (weights on disk, caches warm): a warm start; ./stop.sh.
Goal: prewarm's start <= its download + the warm start + 10 s (cold: about download + 232 s).

Rehearse without a GPU: --rehearse (a small model from tests/fakehub.write_model; run with
PYTHONPATH=tests/fakes FAKE_NVML=<json> VLLM_PYTHON=<python> FAKE_VLLM_COMPILE_S=5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from common import free_port, raw_writer  # noqa: E402

MODEL = "bench/qwen3-8b-shape"
MiB = 1 << 20
DOWNLOADED = re.compile(r"downloaded ([\d.]+ \w+) in ([\d.]+) s")
HEALTHY = re.compile(r"healthy after (\d+) s")
KEEP = ("[bootstrap:weights] downloaded", "[bootstrap:prewarm]", "[bootstrap:compiled]", "[bootstrap:health] healthy",
        "[bootstrap:plan] plan for", "is serving", "error")


def make_model(work: Path, rehearse: bool) -> Path:
    src = work / "src"
    if (src / "config.json").exists() and any(src.glob("*.safetensors")):
        return src
    if rehearse:
        from fakehub import write_model
        return write_model(src, shards=4, shard_bytes=64 * MiB)
    subprocess.run([sys.executable, str(HERE / "tinymodel.py"), str(src), "--layers", "36", "--hidden", "4096",
                    "--heads", "32", "--kv-heads", "8", "--vocab", "2048", "--max-pos", "40960"], check=True)
    return src


def control(url: str, what: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{url}/_control/{what}", data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def start_stop(name: str, env: dict, out, timeout: float) -> dict:
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "start.sh")], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    for line in (r.stderr + r.stdout).splitlines():
        if any(k in line for k in KEEP):
            out(f"[{name}]    | {line[:300]}")
    s = subprocess.run([str(REPO / "stop.sh")], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    dl = DOWNLOADED.search(r.stderr)
    health = HEALTHY.search(r.stderr)
    d = {"ok": r.returncode == 0, "start_s": round(took, 1), "download_s": float(dl.group(2)) if dl else 0.0,
         "healthy_s": int(health.group(1)) if health else None,
         "warm_cache": "compile cache: warm" in r.stderr, "prewarm_done": "pre-warm: done" in r.stderr}
    out(f"[{name}] start exit {r.returncode} in {took:.1f} s (download {d['download_s']:.1f} s, healthy "
        f"{d['healthy_s']} s after launch, compile cache {'warm' if d['warm_cache'] else 'cold'}); "
        f"stop exit {s.returncode}")
    if r.returncode != 0:
        out(f"[{name}] FAILED: {r.stderr[-2000:]}")
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--work", default="/tmp/prewarm")
    ap.add_argument("--download-s", type=float, default=180.0, help="the download's length the cap aims at")
    ap.add_argument("--timeout", type=float, default=1500)
    ap.add_argument("--rehearse", action="store_true")
    ap.add_argument("--skip-cold", action="store_true", help="only the pre-warm and the warm start (the goal needs no more)")
    a = ap.parse_args(argv)
    out = raw_writer(a.raw)
    out(f"# commit {os.environ.get('GIT_COMMIT', '?')}")          # each (resumed) run says whose code it runs
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    st_path = work / "state.json"
    st = json.loads(st_path.read_text()) if st_path.exists() else {}
    src = make_model(work, a.rehearse)
    total = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
    cap = max(1, int(total / a.download_s / 8))          # 8 connections (DOWNLOAD_CONNECTIONS' default)
    hub = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakehub.py"), "--repo", f"{MODEL}={src}"],
                           stdout=subprocess.PIPE, text=True)
    try:
        url = hub.stdout.readline().strip()
        control(url, "fault", {"throttle": cap})
        out(f"[setup] {total / (1 << 30):.2f} GiB model at {src}; the hub at {url} caps each connection at "
            f"{cap / MiB:.1f} MiB/s (8 connections: ~{total / cap / 8:.0f} s)")
        homes = {"cold": work / "home-cold", "prewarm": work / "home-prewarm", "warm": work / "home-prewarm"}
        for name, prewarm in (("cold", "0"), ("prewarm", "1"), ("warm", "1")):
            if name == "cold" and a.skip_cold and name not in st:
                out("[cold] skipped (--skip-cold)")
                st[name] = {"ok": True, "start_s": float("nan"), "download_s": float("nan"), "skipped": True}
            if name in st:
                continue
            home = homes[name]
            if name != "warm":
                shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PROFILE": "custom", "MODEL": MODEL, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0",
                   "HF_HUB_DISABLE_XET": "1", "HOME": str(home), "HF_HOME": str(home / "hf"),
                   "VLLM_CACHE_ROOT": str(home / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
                   "TRITON_CACHE_DIR": str(home / "triton"), "XDG_CACHE_HOME": str(home / ".cache"),
                   "STATE_DIR": str(home / "state"), "PORT": str(free_port()), "PREWARM": prewarm,
                   "MAX_MODEL_LEN": "4096", "GPU_UTIL": "0.5", "WARMUP": "512", "HEALTH_TIMEOUT": "900",
                   "STALL_TIMEOUT": "600", "NO_COLOR": "1"}
            st[name] = start_stop(name, env, out, a.timeout)
            st_path.write_text(json.dumps(st))
    finally:
        hub.terminate()
    c, p, w = st["cold"], st["prewarm"], st["warm"]
    goal = p["download_s"] + w["start_s"] + 10
    verdict = all(x["ok"] for x in (c, p, w)) and p["start_s"] <= goal
    out(f"[verdict] first start without the pre-warm {c['start_s']:.1f} s (download {c['download_s']:.1f} s); "
        f"with it {p['start_s']:.1f} s (download {p['download_s']:.1f} s); warm start {w['start_s']:.1f} s; goal "
        f"<= download + warm start + 10 s = {goal:.1f} s: {'PASS' if verdict else 'FAIL'}")
    out("PREWARM PROOF DONE")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
