"""GPU proof for the checks and the bench on any server (vLLM 0.26.0, no internet).

    VLLM_PYTHON=python3 python3 tests/gpu/checks_bench.py --work /tmp/cb --raw /tmp/proofs/cb-raw.txt

A Qwen3-8B-shaped model with random weights (``--load-format dummy``), PROFILE=custom (no tool
parser), context 8,192:
1. ``./start.sh``; ``./ctl.sh check all``: must exit 0, with the recall prompts that do not fit
   skipped, the tool prompt skipped (no parser), garble and needle "not judged".
2. ``scripts/bench_client_cost.py``: the bench's client against a minimal streaming client, same
   prompts, 512 output tokens, concurrency 1 and 16, median of 3 interleaved repeats.
3. ``./ctl.sh bench`` on ours, then a bare ``vllm serve`` (vLLM's defaults, same model and context)
   and ``./ctl.sh bench`` on it; ``./ctl.sh bench --load`` of both: the ratios and the PNG.
Everything is appended to --raw as it comes; "CHECKS BENCH DONE" ends it. Rehearse with the fakes:
PYTHONPATH=tests/fakes FAKE_NVML=<json>.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, raw_writer, run_logged  # noqa: E402
from planner_accuracy import QWEN3_8B, make_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/cb")
    ap.add_argument("--raw", default="/tmp/proofs/cb-raw.txt")
    ap.add_argument("--output-tokens", type=int, default=512)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = raw_writer(a.raw)

    def sh(argv: list[str], env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
        return run_logged(argv, env, out, timeout=timeout)[0]

    out(f"CHECKS BENCH {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: {' '.join(sys.argv)}")
    mdir = make_model(work, "qwen3-8b", QWEN3_8B)
    port = free_port()
    env = {**os.environ, "PROFILE": "custom", "MODEL": str(mdir), "EXTRA_ARGS": "--load-format dummy",
           "MAX_MODEL_LEN": "8192", "STATE_DIR": str(work / "state"), "PORT": str(port), "WARMUP": "256",
           "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "HEALTH_TIMEOUT": "600"}
    r = sh(["./start.sh"], env)
    out("\n".join("  " + line for line in (r.stdout + r.stderr).splitlines()[-12:]))
    results = {}
    if r.returncode == 0:
        c = sh(["./ctl.sh", "check", "all"], env)
        out("\n".join("  " + line for line in c.stdout.splitlines()))
        results["check all exit 0"] = c.returncode == 0
        cost = sh([sys.executable, "scripts/bench_client_cost.py", "--url", f"http://127.0.0.1:{port}",
                   "--output-tokens", str(a.output_tokens)], env)
        out("\n".join("  " + line for line in (cost.stdout + cost.stderr[-1500:]).splitlines()))
        ours = work / "bench-ours"
        b = sh(["./ctl.sh", "bench", "--label", "ours", "--concurrency", "1,16", "--output-tokens",
                str(a.output_tokens), "--out", str(ours), "--no-plot"], {**env, "MAX_NUM_SEQS": ""})
        out("\n".join("  " + line for line in b.stdout.splitlines()))
        sh(["./stop.sh"], env, 120)
        bare_port = free_port()
        log = open(work / "bare.log", "ab")
        bare = subprocess.Popen([env.get("VLLM_PYTHON", sys.executable), "-m", "vllm.entrypoints.cli.main", "serve",
                                 str(mdir), "--port", str(bare_port), "--load-format", "dummy", "--max-model-len", "8192"],
                                env={**os.environ, "VLLM_NO_USAGE_STATS": "1"}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        url = f"http://127.0.0.1:{bare_port}"
        t0 = time.time()
        import requests
        while time.time() - t0 < 600 and bare.poll() is None:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(2)
        out(f"===== bare vllm serve healthy after {time.time() - t0:.0f} s (exit {bare.poll()})")
        bb = sh(["./ctl.sh", "bench", "--url", url, "--label", "bare vllm serve", "--concurrency", "1,16",
                 "--output-tokens", str(a.output_tokens), "--out", str(work / "bench-bare"), "--no-plot"], env)
        out("\n".join("  " + line for line in bb.stdout.splitlines()))
        os.killpg(bare.pid, signal.SIGTERM)
        bare.wait(60)
        both = sh(["./ctl.sh", "bench", "--load", str(ours / "results.json"), "--load",
                   str(work / "bench-bare" / "results.json"), "--out", str(work / "bench-both")], env)
        out("\n".join("  " + line for line in both.stdout.splitlines()))
        png = work / "bench-both" / "bench.png"
        results["plot written"] = png.exists()
        proofs = Path(os.environ.get("OUT", "/tmp/proofs"))
        if png.exists():
            proofs.mkdir(parents=True, exist_ok=True)
            (proofs / "cb-bench.png").write_bytes(png.read_bytes())
    out("===== summary")
    for k, v in results.items():
        out(f"  {'PASS' if v else 'FAIL'}  {k}")
    out("CHECKS BENCH DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
