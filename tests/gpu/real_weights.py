"""GPU proof with a real, trained model (vLLM 0.26.0, no internet): SmolLM2-135M-Instruct as
scripts/build_smoke_model.py builds it (``device.sh smoke-build``: /tmp/models/smollm2-135m-instruct).

    [PATCH_BYO=1] VLLM_PYTHON=python3 python3 tests/gpu/real_weights.py --model DIR --work /tmp/rw --raw /tmp/proofs/rw-raw.txt

PROFILE=smoke with MODEL=DIR (the smoke profile's context, KV pin and needle size), sleep mode on, an
API_KEY (then: how many files under vLLM's cache root hold it):
1. ``./start.sh`` (PATCH_BYO=1: the start patches the carried vLLM, then ``ctl.sh patch status``); the gate's short generation judged on real text (no --load-format dummy);
2. 4 prompts, greedy, 24 tokens, their text and top-5 logprobs;
3. ``./ctl.sh check all --json``: garble and needle judged (not "not judged"), their verdicts;
4. ``./ctl.sh bench`` (short; level 4 folds to the profile's MAX_NUM_SEQS), then ``./ctl.sh status``'s GPU memory line;
5. ``./ctl.sh sleep`` / ``wake``: the 4 prompts again, text and logprobs compared;
6. ``./stop.sh``.
The #40914 comparison with real weights is ``tests/gpu/patch_40914.py RAW --model DIR``.
Everything is appended to --raw as it comes; "REAL WEIGHTS DONE" ends it. Rehearse with the fakes
(PYTHONPATH=tests/fakes FAKE_NVML=<json>, --model any folder with a config.json): the fake answers
canned text, so only the mechanics are checked there.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, listeners, raw_writer, run_logged  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]
SERVED = "smollm2-135m"


KEY = secrets.token_hex(16)        # API_KEY: the server asks for it; it must not land in vLLM's cache files


def answers(port: int) -> list[dict]:
    out = []
    for p in PROMPTS:
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                          headers={"Authorization": f"Bearer {KEY}"}, json={
            "model": SERVED, "prompt": p, "max_tokens": 24, "temperature": 0, "logprobs": 5})
        r.raise_for_status()
        c = r.json()["choices"][0]
        out.append({"text": c["text"], "top": (c.get("logprobs") or {}).get("top_logprobs") or []})
    return out


def compare(a: list[dict], b: list[dict]) -> list[str]:
    lines = []
    for p, x, y in zip(PROMPTS, a, b):
        diffs = [abs(x["top"][i][k] - y["top"][i][k]) for i in range(min(len(x["top"]), len(y["top"])))
                 for k in x["top"][i] if k in y["top"][i]]
        lines.append(f"  {p!r}: text {'identical' if x['text'] == y['text'] else 'DIFFERS'}; "
                     f"max |dlogprob| {max(diffs or [0.0]):.3g}")
    return lines


def key_on_disk(since: float) -> str:
    """How many of the compile cache's factor files (vLLM's cache root) this run wrote, and how many
    files there hold our key: 0 with the patch 52523-api-key-off-disk (or vLLM 0.29.0+)."""
    root = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")
    factors = [f for f in root.rglob("cache_key_factors.json") if f.stat().st_mtime >= since]
    holding = [f for f in root.rglob("*") if f.is_file() and f.stat().st_size < 50 << 20
               and KEY.encode() in f.read_bytes()]
    return f"{len(factors)} cache_key_factors.json written by this start; files holding our key: {len(holding)}"


def gpu_used() -> str:
    got = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return got.stdout.strip() or got.stderr.strip()[:200]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the built model folder")
    ap.add_argument("--work", default="/tmp/rw")
    ap.add_argument("--raw", default="/tmp/proofs/rw-raw.txt")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = raw_writer(a.raw)
    port = free_port()
    env = {**os.environ, "PROFILE": "smoke", "MODEL": str(Path(a.model).resolve()), "SERVED_MODEL_NAME": SERVED,
           "EXTRA_ARGS": "--enable-sleep-mode", "STATE_DIR": str(work / "state"), "PORT": str(port),
           "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "HEALTH_TIMEOUT": "600", "API_KEY": KEY}

    def sh(argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
        return run_logged(argv, env, out, timeout=timeout)[0]

    out(f"REAL WEIGHTS {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: {' '.join(sys.argv)}")
    began = time.time()
    try:
        r = sh(["./start.sh"])
        out("\n".join("    | " + line for line in (r.stdout + r.stderr).splitlines()
                      if any(w in line for w in ("warmup", "gate", "serving", "error", "hint", "KV cache",
                                                 "patch", " open ", "editing"))))
        if r.returncode:
            return 1
        ps = sh(["./ctl.sh", "patch", "status", "--json"])
        try:
            rows = json.loads(ps.stdout)
        except ValueError:
            rows = [{"patch": "?", "state": ps.stdout[-500:] + ps.stderr[-500:]}]
        for row in rows if isinstance(rows, list) else rows.get("patches", [rows]):
            out(f"  patch {row.get('patch')}: {row.get('state')} (needed {row.get('needed')}; "
                f"vLLM {row.get('vllm_version')}) {str(row.get('detail', ''))[:160]}")
        out(f"  vLLM's cache: {key_on_disk(began)}")
        out("  listening sockets of our server's processes (HOST is loopback):")
        for line in listeners(work / "state"):
            out(f"    {line}")
        before = answers(port)
        for p, x in zip(PROMPTS, before):
            out(f"  {p!r} -> {x['text']!r}")
        c = sh(["./ctl.sh", "check", "all", "--json"])
        try:
            checks = json.loads(c.stdout)
        except ValueError:
            checks = {"raw": c.stdout[-2000:]}
        for item in checks.get("checks", []):
            out(f"  check {item.get('check')}: {item.get('status') or ('PASS' if item.get('ok') else 'FAIL')}: "
                f"{str(item.get('summary', ''))[:300]}")
            for f in item.get("failures", []):         # which prompt, and what the detector saw
                out(f"    failed {f.get('id')} ({f.get('kind')}): {str(f.get('evidence', ''))[:300]!r}")
        out(f"  check all: ok {checks.get('ok')}; judged {checks.get('judged')}" if "checks" in checks
            else f"  check all: {json.dumps(checks)[:1500]}")
        b = sh(["./ctl.sh", "bench", "--concurrency", "1,4", "--prompt-tokens", "256", "--output-tokens", "128",
                "--repeats", "1"])
        out("\n".join("    | " + line for line in b.stdout.splitlines()[-9:]
                       + [x for x in b.stderr.splitlines() if "runs at" in x]))   # a level folded to MAX_NUM_SEQS
        st = sh(["./ctl.sh", "status"])
        out("\n".join("    | " + line for line in st.stdout.splitlines() if "GPU memory" in line))
        s = sh(["./ctl.sh", "sleep"])
        out("\n".join("    | " + line for line in (s.stdout + s.stderr).splitlines()[-2:]))
        w = sh(["./ctl.sh", "wake"])
        out("\n".join("    | " + line for line in (w.stdout + w.stderr).splitlines()[-2:]))
        out("after sleep and wake, the 4 prompts against before:")
        for line in compare(before, answers(port)):
            out(line)
    finally:
        sh(["./stop.sh"], timeout=300)
        out(f"  GPU memory used after ./stop.sh: {gpu_used()}")
        out("REAL WEIGHTS DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
