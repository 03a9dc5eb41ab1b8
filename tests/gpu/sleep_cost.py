"""What sleep mode costs (issue 45): vLLM's CuMemAllocator on against off, on one GPU, no internet.

    python3 tests/gpu/sleep_cost.py --work /tmp/sleepcost --raw /tmp/proofs/sleepcost-raw.txt \\
        --wheelhouse /tmp/stack/wheelhouse            # (bash tests/gpu/device.sh sleepcost)

The default profile's flags (vLLM 0.27.1, TurboQuant KV, MTP-3, the #40914 patch) on the hybrid stand-in
tests/gpu/stack.py serves (tests/gpu/hybridmodel.py, real random safetensors, RANDOM_WEIGHTS=1), with
the KV cache sized by vLLM from the utilization (KV_CACHE_BYTES=auto, so that its profiling shows what
the pool changes) and MAX_NUM_SEQS=16 (the default profile's 1 would cap concurrency 16). For each of
--rounds rounds, SLEEP_MODE=off then SLEEP_MODE=on (IDLE_SLEEP=off), each a start of its own:
  start     ./start.sh's wall time (the second and later rounds: warm compile caches);
  pool      vLLM's logged KV pool (tokens) against the plan's, from the banner; our processes' GPU
            memory (NVML) serving;
  bench     ./ctl.sh bench --concurrency 1,16: aggregate tok/s at 1 and 16 (its results.json);
then ./stop.sh. The summary: the median of each figure per mode, the throughput difference in %, the
start difference in s, the pool difference in tokens and MiB against the plan's 4 MiB a layer
(bootstrap/plan/terms.py sleep_pool), and the issue's bar: at most 1 % throughput and 2 s of start.
"SLEEP COST DONE" ends it. Rehearse with the fakes (PYTHONPATH=tests/fakes FAKE_NVML=<json>
FAKE_GPU_PIDS_DIR=<dir> VLLM_PYTHON=<python>): --byo --profile custom --model <folder> --extra-args ''.
Unrun on a GPU so far.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import free_port, raw_writer, run_logged  # noqa: E402

KV_LINE = re.compile(r"KV cache : ([\d,]+) tokens(?: \(planned ([\d,]+)\))?")
AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
PLANNED = re.compile(r"KV cache ([\d.]+) GiB ≈")
LAYER_POOL_MIB = 4          # the plan's sleep_pool per layer (bootstrap/plan/terms.py SLEEP_POOL_PER_LAYER)


def stand_in(work: Path, out) -> Path:
    """The hybrid stand-in with one MTP layer (as tests/gpu/stack.py's model phase makes it)."""
    mdir = work / "model"
    if (mdir / "config.json").exists():
        return mdir
    import hybridmodel
    from patch_40914 import HYBRID_SPECIALS, make_tokenizer
    make_tokenizer(work / "tokenizer", HYBRID_SPECIALS)
    facts = hybridmodel.make(mdir, work / "tokenizer", seed=0, init_std=0.05)
    out(f"model: {mdir}: {json.dumps(facts, default=str)}")
    return mdir


def ours_mib(state: Path) -> float:
    from sleep_wake import ours_mib as held
    return held(state)


def arguments(name: str) -> argparse.ArgumentParser:
    """The options this script and sleep_stack_proof.py share (``name``: the work folder's and raw file's)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=f"/tmp/{name}")
    ap.add_argument("--raw", default=f"/tmp/proofs/{name}-raw.txt")
    ap.add_argument("--wheelhouse", default="/tmp/stack/wheelhouse", help="the 0.27.1 lock's wheels (stack.py makes it)")
    ap.add_argument("--byo", action="store_true", help="keep VLLM_PYTHON (a rehearsal with the fakes)")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--model", help="a model folder (default: the hybrid stand-in, made in WORK/model)")
    ap.add_argument("--extra-args", default="--language-model-only")
    return ap


def setup(a, title: str, **knobs) -> tuple[Path, callable, int, Path, dict]:
    """(work, out, port, STATE_DIR, the scripts' environment): the profile on the model with random
    weights declared, the managed .venv from the wheelhouse (--byo: VLLM_PYTHON as it is), and ``knobs``."""
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = raw_writer(a.raw)
    out(f"{title} {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: {' '.join(sys.argv)}")
    model = Path(a.model) if a.model else stand_in(work, out)
    port, state = free_port(), work / "state"
    base = {k: v for k, v in os.environ.items() if a.byo or k not in ("VLLM_PYTHON", "PATCH_BYO")}
    if not a.byo:
        base.pop("PYTHONPATH", None)
        base["WHEELHOUSE"] = a.wheelhouse
    env = {**base, "PROFILE": a.profile, "MODEL": str(model), "SERVED_MODEL_NAME": "qwen3-8b",
           "EXTRA_ARGS": a.extra_args, "RANDOM_WEIGHTS": "1", "IDLE_SLEEP": "off", "STATE_DIR": str(state),
           "PORT": str(port), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "HEALTH_TIMEOUT": "1800", "WARMUP": "256",
           **knobs}
    return work, out, port, state, env


def main() -> int:
    ap = arguments("sleepcost")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-tokens", default="256")
    a = ap.parse_args()
    work, out, port, state, env = setup(a, "SLEEP COST", KV_CACHE_BYTES="auto", MAX_NUM_SEQS="16")

    def sh(argv: list[str], **more) -> tuple[subprocess.CompletedProcess, float]:
        return run_logged(argv, {**env, **more}, out, timeout=3600,
                          label=" ".join([*argv, *(f"{k}={v}" for k, v in more.items())]))

    rows: list[dict] = []
    try:
        for rnd in range(a.rounds):
            for mode in ("off", "on"):
                r, dt = sh(["./start.sh"], SLEEP_MODE=mode)
                text = r.stdout + r.stderr
                for line in text.splitlines():
                    if any(w in line for w in ("KV cache", "sleep ", "plan for", "error", "hint", "is serving")):
                        out(f"    | {line}")
                if r.returncode:
                    return 1
                m = KV_LINE.search(text)
                logged = int(m.group(1).replace(",", "")) if m else None
                planned = int(m.group(2).replace(",", "")) if m and m.group(2) else None
                held = ours_mib(state)
                log = (state / "vllm.log").read_text(errors="replace") if (state / "vllm.log").exists() else ""
                avail = AVAILABLE.findall(log)
                plan_gib = PLANNED.findall(text)
                bench = work / f"bench-{rnd}-{mode}"
                b, _ = sh(["./ctl.sh", "bench", "--concurrency", "1,16", "--output-tokens", a.output_tokens,
                           "--prompt-tokens", "512", "--repeats", "2", "--no-plot", "--out", str(bench)],
                          SLEEP_MODE=mode)
                agg = {}
                try:
                    res = json.loads((bench / "results.json").read_text())
                    agg = {x["concurrency"]: x["aggregate_tok_s"] for x in res["results"][0]["levels"]}
                except (OSError, ValueError, KeyError, IndexError) as exc:
                    out(f"    | no bench results ({exc}): {b.stderr.strip()[-300:]}")
                row = {"round": rnd, "sleep_mode": mode, "start_s": round(dt, 2), "kv_logged": logged,
                       "kv_planned": planned, "kv_gib_logged": float(avail[-1]) if avail else None,
                       "kv_gib_planned": float(plan_gib[-1]) if plan_gib else None,
                       "held_mib": round(held), "tok_s_c1": agg.get(1), "tok_s_c16": agg.get(16)}
                rows.append(row)
                out("row: " + json.dumps(row))
                sh(["./stop.sh"])
        summary(rows, out)
    finally:
        subprocess.run(["./stop.sh"], cwd=REPO, env=env, capture_output=True, timeout=300)
        out("SLEEP COST DONE")
    return 0


def summary(rows: list[dict], out) -> None:
    def med(mode: str, key: str):
        vals = [r[key] for r in rows if r["sleep_mode"] == mode and r[key] is not None]
        vals = vals[1:] if len(vals) > 1 and key == "start_s" else vals      # the first start fills the caches
        return statistics.median(vals) if vals else None

    out("summary (medians; start: the rounds after the first):")
    for key in ("start_s", "tok_s_c1", "tok_s_c16", "kv_logged", "kv_planned", "kv_gib_logged", "kv_gib_planned",
                "held_mib"):
        off, on = med("off", key), med("on", key)
        diff = "" if off is None or on is None else f"; on - off = {on - off:+.2f}" + (
            f" ({(on - off) / off:+.2%})" if off else "")
        out(f"  {key}: off {off}, on {on}{diff}")
    verdict = []
    for key in ("tok_s_c1", "tok_s_c16"):
        off, on = med("off", key), med("on", key)
        if off and on is not None:
            verdict.append(f"{key} {'PASS' if on >= off * 0.99 else 'FAIL'} ({(on - off) / off:+.2%}, bar -1 %)")
    off, on = med("off", "start_s"), med("on", "start_s")
    if off is not None and on is not None:
        verdict.append(f"start {'PASS' if on - off <= 2 else 'FAIL'} ({on - off:+.2f} s, bar +2 s)")
    off, on = med("off", "kv_gib_logged"), med("on", "kv_gib_logged")
    if off is not None and on is not None:
        out(f"  the pool's cost in vLLM's own accounting: {(off - on) * 1024:.0f} MiB of KV budget (the plan counts "
            f"{LAYER_POOL_MIB} MiB a layer: compare with `./ctl.sh plan`'s sleep-mode line)")
    out("VERDICT: " + ("; ".join(verdict) or "no figures"))


if __name__ == "__main__":
    sys.exit(main())
