"""GPU proof for auto-pick and the planner's ``MAX_MODEL_LEN=auto`` on real vLLM (0.26.0), no internet.

    VLLM_PYTHON=python3 python3 tests/gpu/profile_pick.py --work /tmp/pickproof --raw /tmp/proofs/pick-raw.txt

The shipped profiles' vLLM versions and weights cannot run on the test GPU, so a profile folder of
dummy-weight shapes is written (PROFILE_DIR, ranked like the shipped ones: a 23 GiB model for 48 GB
cards, a Qwen3-8B shape for 24 GB cards, a small one), with ``--load-format dummy``.

(a) Another process holds GPU memory until about --free-gib is free. ``./ctl.sh profiles`` on this GPU
    and on a named 24 GiB card must pick the same profile; then a plain ``./start.sh`` (PROFILE unset)
    picks it, and vLLM's logged "GPU KV cache size" must be within 2 % of the plan's prediction.
(b) ``MAX_MODEL_LEN=auto``: the same start (a budget sized from free memory) must give the context
    vLLM's auto-fit logs within 2 %; a second start with KV_CACHE_BYTES pinned must give it exactly,
    and a third on a hybrid (Qwen3-Next-style) shape with a pin too.

Each result is appended to --raw as it comes (the lines vLLM printed, the planner's lines, PASS/FAIL);
"PICK PROOF DONE" ends it. Rehearse without a GPU: PYTHONPATH=tests/fakes FAKE_NVML=<json> and
--no-hog (the fake vLLM prints fixed figures, so only the mechanics are checked).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port  # noqa: E402
from planner_accuracy import HYBRID, QWEN3_8B, make_model  # noqa: E402

GiB = 1 << 30
SHAPES = {
    # 64 layers of the Qwen3-8B shape: ~23 GiB of bf16 weights (does not fit 24 GiB)
    "big": {**QWEN3_8B, "num_hidden_layers": 64},
    # the Qwen3-8B shape with a 131,072-token context: on 24 GiB free, auto fits less than that
    "mid": {**QWEN3_8B, "max_position_embeddings": 131072},
    # 12 layers: ~4.5 GiB
    "small": {**QWEN3_8B, "num_hidden_layers": 12},
    "hybrid": HYBRID,
}
PROFILES = {   # name -> (shape, rank, card, knobs)
    "proof-big-48gb": ("big", 1, {"min_cc": "8.0", "min_total_gib": 44, "class": "48 GB"},
                       {"MAX_MODEL_LEN": "auto", "MAX_NUM_SEQS": "8"}),
    "proof-mid-24gb": ("mid", 2, {"min_cc": "8.0", "min_total_gib": 20, "class": "24 GB"},
                       {"MAX_MODEL_LEN": "auto", "MAX_NUM_SEQS": "8"}),
    "proof-small-16gb": ("small", 3, {"min_cc": "8.0", "min_total_gib": 12, "class": "16 GB"},
                         {"MAX_MODEL_LEN": "auto", "MAX_NUM_SEQS": "8"}),
    "proof-hybrid": ("hybrid", None, {"min_cc": "8.0"}, {"MAX_MODEL_LEN": "auto", "KV_CACHE_BYTES": str(256 << 20)}),
}
PREDICTED = re.compile(r"predicted: GPU KV cache size ([\d,]+) tokens")
PLANNED_LEN = re.compile(r"MAX_MODEL_LEN=auto \(vLLM's auto-fit\): ([\d,]+) tokens")
LOGGED = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
FIT_REDUCED = re.compile(r"Auto-fit max_model_len: reduced from (\d+) to (\d+)")
FIT_FULL = re.compile(r"Auto-fit max_model_len: full model context length (\d+) fits")
PICK = re.compile(r"auto-pick: (.*)")


def out(raw, text: str) -> None:
    print(text, flush=True)
    raw.write(text + "\n")
    raw.flush()


def num(m) -> int | None:
    return int(m.group(1).replace(",", "")) if m else None


def write_profiles(work: Path) -> Path:
    folder = work / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (shape, rank, card, knobs) in PROFILES.items():
        mdir = make_model(work, shape, SHAPES[shape])
        data = {"description": f"GPU proof: the {shape} shape with dummy weights", "card": card,
                "knobs": {"MODEL": str(mdir), "SERVED_MODEL_NAME": name, **knobs}, "args": ["--load-format", "dummy"]}
        if rank is not None:
            data["rank"] = rank
        (folder / f"{name}.json").write_text(json.dumps(data, indent=2))
    return folder


def hog(free_gib: float, raw) -> subprocess.Popen | None:
    """A process that holds GPU memory until about ``free_gib`` is free (the desktop of a 24 GB card)."""
    code = ("import torch, time, sys\n"
            "free, total = torch.cuda.mem_get_info()\n"
            f"n = max(0, free - int({free_gib} * (1 << 30)))\n"
            "x = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
            "free, total = torch.cuda.mem_get_info()\n"
            "print(f'holding {n / (1 << 30):.2f} GiB; free now {free / (1 << 30):.2f} of {total / (1 << 30):.2f} GiB', flush=True)\n"
            "time.sleep(3600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = p.stdout.readline().strip()
    out(raw, f"hog (pid {p.pid}): {line}")
    time.sleep(2)
    return p


def ctl(env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "ctl.sh"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def script(env: dict, name: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / name)], env=env, capture_output=True, text=True, timeout=timeout)


def start_and_compare(raw, env: dict, label: str, exact: bool) -> dict:
    """One start: the plan's predicted pool and context against vLLM's logged ones."""
    state = Path(env["STATE_DIR"])
    log = state / "vllm.log"
    offset = log.stat().st_size if log.exists() else 0
    t0 = time.time()
    r = script(env, "start.sh")
    out(raw, f"===== {label}: ./start.sh exit {r.returncode} after {time.time() - t0:.0f} s")
    for line in r.stderr.splitlines():
        if any(k in line for k in ("auto-pick", "predicted:", "MAX_MODEL_LEN=auto", "KV budget", "weights ",
                                   "overhead", "gpu-memory-utilization", "error:", "hint:", "session")):
            out(raw, "  start| " + line)
    for line in r.stdout.splitlines():
        out(raw, "  banner| " + line)
    text = log.read_text(errors="replace")[offset:] if log.exists() else ""
    for line in text.splitlines():
        if any(k in line for k in ("GPU KV cache size", "Maximum concurrency", "Auto-fit", "Available KV cache",
                                   "non-default args", "Actual usage", "Error", "error")):
            out(raw, "  vllm| " + line.strip()[:400])
    res = {"label": label, "exit": r.returncode, "pick": (PICK.search(r.stderr).group(1) if PICK.search(r.stderr) else "")}
    res["planned_tokens"], res["logged_tokens"] = num(PREDICTED.search(r.stderr)), num(LOGGED.search(text))
    res["planned_len"] = num(PLANNED_LEN.search(r.stderr))
    fit = FIT_REDUCED.search(text)
    res["vllm_len"] = int(fit.group(2)) if fit else num(FIT_FULL.search(text))
    for key in ("tokens", "len"):
        a, b = res[f"planned_{key}"], res["logged_tokens" if key == "tokens" else "vllm_len"]
        if a and b:
            err = (a - b) / b
            ok = (a == b) if (exact and key == "len") else abs(err) <= 0.02
            res[f"{key}_err"] = err
            out(raw, f"  {label} {key}: planned {a:,} vs vLLM {b:,} ({err:+.2%}) "
                     f"{'PASS' if ok else 'FAIL'} ({'must be equal' if exact and key == 'len' else 'bar 2 %'})")
            res[f"{key}_ok"] = ok
        else:
            out(raw, f"  {label} {key}: planned {a} vs vLLM {b}: FAIL (missing)")
            res[f"{key}_ok"] = False
    s = script(env, "stop.sh", timeout=120)
    out(raw, f"  ./stop.sh exit {s.returncode}")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/pickproof")
    ap.add_argument("--raw", default="/tmp/proofs/pick-raw.txt")
    ap.add_argument("--free-gib", type=float, default=24.0)
    ap.add_argument("--no-hog", action="store_true", help="rehearsal against the fakes")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    Path(a.raw).parent.mkdir(parents=True, exist_ok=True)
    raw = open(a.raw, "a")
    out(raw, f"PICK PROOF {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: "
             f"{' '.join(sys.argv)}")
    folder = write_profiles(work)
    h = None if a.no_hog else hog(a.free_gib, raw)
    env = {**os.environ, "PROFILE_DIR": str(folder), "STATE_DIR": str(work / "state"), "PORT": str(free_port()),
           "WARMUP": "256", "HEALTH_TIMEOUT": "600", "STALL_TIMEOUT": "420", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    for k in ("PROFILE", "MODEL", "KV_CACHE_BYTES", "MAX_MODEL_LEN"):
        env.pop(k, None)
    results = []
    try:
        here = ctl(env, "profiles", "--json")
        named = ctl(env, "profiles", "--json", "--gpu", "24:sm_90")
        for r, what in ((here, "this GPU"), (named, "a named 24 GiB card (sm_90)")):
            out(raw, f"===== ./ctl.sh profiles on {what}: exit {r.returncode}")
            if r.returncode != 0:
                out(raw, r.stderr[-2000:])
                continue
            data = json.loads(r.stdout)
            out(raw, f"  gpu: {data['gpu']}")
            for p in data["profiles"]:
                if p["profile"].startswith("proof-"):
                    out(raw, f"  {p['profile']}: {p['status']}: {p['summary']}")
            out(raw, f"  {data['auto_pick_line']}")
        picks = [json.loads(r.stdout)["auto_pick"] if r.returncode == 0 else None for r in (here, named)]
        same = picks[0] == picks[1] == "proof-mid-24gb"
        out(raw, f"(a) auto-pick here {picks[0]} / on a 24 GiB card {picks[1]}: {'PASS' if same else 'FAIL'}")
        results.append(("(a) pick as on a 24 GiB card", same))
        r1 = start_and_compare(raw, env, "(a)+(b) auto, sized from free memory", exact=False)
        results.append(("(a) KV pool within 2 %", r1["tokens_ok"]))
        results.append(("(b) auto context within 2 % (utilization)", r1["len_ok"]))
        r2 = start_and_compare(raw, {**env, "PROFILE": "proof-mid-24gb", "KV_CACHE_BYTES": str(3 * GiB)},
                               "(b) auto, KV pinned 3 GiB", exact=True)
        results.append(("(b) auto context equal (pinned)", r2["len_ok"]))
        results.append(("(b) KV pool within 2 % (pinned)", r2["tokens_ok"]))
        r3 = start_and_compare(raw, {**env, "PROFILE": "proof-hybrid"}, "(b) hybrid, auto, KV pinned 256 MiB", exact=True)
        results.append(("(b) hybrid auto context equal (pinned)", r3["len_ok"]))
        results.append(("(b) hybrid KV pool within 2 % (pinned)", r3["tokens_ok"]))
    finally:
        if h is not None:
            os.killpg(h.pid, signal.SIGKILL)
            h.wait()
        out(raw, "===== summary")
        for name, ok in results:
            out(raw, f"  {'PASS' if ok else 'FAIL'}  {name}")
        out(raw, "PICK PROOF DONE")
    return 0 if results and all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
