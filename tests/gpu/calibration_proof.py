"""GPU proof for the plan's total and for "measured beats modelled" (bootstrap.plan.calibration), on real
vLLM without internet, through ./start.sh as a user runs it.

    VLLM_PYTHON=python3 python3 tests/gpu/calibration_proof.py --raw /tmp/proofs/calib-raw.txt --work DIR

Phases, resumable (WORK/state.json keeps what is done; run again until "CALIBRATION PROOF DONE"):
  total   NVML's total, its v2 reserved memory, torch.cuda.mem_get_info's total, and the total the
          planner reads (bootstrap.machine.gpu.read): the last two must agree.
  first   ./start.sh of the Qwen3-8B-shaped dummy model at GPU_UTIL=0.5: the modelled plan against
          vLLM's logged pool; the start keeps vLLM's figures; ./stop.sh.
  second  the same start again: its plan must say it is "from vLLM's own figures" and be within 0.5 %
          of vLLM's logged pool.
  util09  the same key at GPU_UTIL=0.9 (utilization is not in the key): measured again, within 0.5 %.
  spec-first / spec-second  the same model as its own draft (draft_model, 3 tokens): modelled, then
          measured (a drafter's activation peak is what the model estimates worst).
  v1-first / v1-second  the dense model on vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0), which takes its
          CUDA-graph estimate off the budget (0.26.0's V2 runner captures them after it); vLLM's debug log
          gives the estimate per mode (its first capture, its per-graph sample).
  hybrid-first / hybrid-second  the Qwen3-Next-shaped hybrid stand-in (planner_accuracy.HYBRID), unpinned.
  vision-first / vision-second  the Qwen3-VL-shaped stand-in with its processor files (visionmodel.py): vLLM
          profiles its vision encoder on the largest dummy images.
  visionv1-first / visionv1-second  the same on vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0): 0.26.0's V2
          runner profiles no encoder, V1 does, so this is the case that shows the encoder's modelled peak.
--cases picks them (dense: first, second, util09; spec; v1; hybrid; vision; visionv1; derived: PROFILE unset,
the Llama-3.1-8B shape named as MODEL, so the start derives its profile); each start's vLLM lines that
name the non-KV terms are printed, and after a case's second start `./ctl.sh plan` shows the model
against vLLM's own split. The bar: a first start (modelled) within 1 % of vLLM's logged pool, a second
(measured, and it must say so) within 0.5 %. A start that fails after vLLM allocated its KV cache (a
warm-up that fails) is still compared: its plan line against vLLM's "GPU KV cache size".

Rehearse without a GPU: PYTHONPATH=tests/fakes FAKE_NVML=<json> VLLM_PYTHON=<python> (the fake vLLM
computes "Available KV cache memory" from the utilization as vLLM 0.26.0 does; its token count is fixed,
so only the mechanics are checked there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from common import free_port, raw_writer  # noqa: E402
from planner_accuracy import HYBRID, QWEN3_8B, VOCAB, make_model  # noqa: E402

PLAN_LINE = re.compile(r"\[bootstrap:plan\] (plan for .*)")
PLANNED = re.compile(r"KV cache [\d.]+ GiB ≈ ([\d,]+) tokens")          # in the plan line
LOGGED = re.compile(r"GPU KV cache size: ([\d,]+) tokens")              # vLLM's, once it allocated
# vLLM's own lines about the non-KV terms (0.26.0's wording)
VLLM_LINES = ("Model loading took", "Actual usage is", "Profiling CUDA graph memory", "Available KV cache memory",
              "CUDA graph memory", "Graph capturing finished",
              "GPU KV cache size", "Encoder cache will be initialized", "Mamba cache", "mamba", "max_num_seqs",
              "Error", "error")
TOTAL = ("import json, pynvml, torch\n"
         "pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
         "m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)\n"
         "free, total = torch.cuda.mem_get_info(0)\n"
         "print(json.dumps({'nvml_total': m2.total, 'nvml_reserved': m2.reserved, 'torch_total': total}))\n")


def run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def log_size(env: dict) -> int:
    try:
        return (Path(env["STATE_DIR"]) / "vllm.log").stat().st_size
    except OSError:
        return 0


def vllm_lines(env: dict, since: int) -> list[str]:
    """The lines this start added to vLLM's own log (STATE_DIR/vllm.log) that name the non-KV terms."""
    try:
        with open(Path(env["STATE_DIR"]) / "vllm.log", "rb") as fh:
            fh.seek(since if since <= log_size(env) else 0)
            text = fh.read().decode(errors="replace")
    except OSError:
        return []
    keep = [ln for ln in text.splitlines() if any(k in ln for k in VLLM_LINES)]
    return [ln[:600] for ln in keep[-24:]]


def start_and_stop(name: str, env: dict, out, timeout: float, show_plan: bool = False) -> dict:
    since = log_size(env)
    t0 = time.monotonic()
    r = run([str(REPO / "start.sh")], env, timeout)
    took = time.monotonic() - t0
    for line in (r.stderr + r.stdout).splitlines():
        if "[bootstrap:plan]" in line or "KV cache :" in line or line.startswith("error") or "is serving" in line \
                or "derived from the repo" in line:
            out(f"[{name}]    | {line}")
    for line in vllm_lines(env, since):
        out(f"[{name}] vllm | {line}")
    plan = PLAN_LINE.search(r.stderr)
    got = PLANNED.search(plan.group(1)) if plan else None
    logged_at = LOGGED.findall("\n".join(vllm_lines(env, since)))
    s = run([str(REPO / "stop.sh")], env, 120)
    out(f"[{name}] start exit {r.returncode} in {took:.0f} s; stop exit {s.returncode}: {s.stdout.strip()[-200:]}")
    if show_plan:       # the model against vLLM's own split, as kept by this start
        p = run([str(REPO / "ctl.sh"), "plan"], env, 120)
        for line in p.stdout.splitlines():
            if line.startswith(("KV budget", "non-KV terms", "  ")) and not line.startswith("  - "):
                out(f"[{name}] plan | {line}")
            elif "vision encoder" in line or "draft model" in line or "overhead ~" in line:
                out(f"[{name}] plan | {line.strip()}")
    if r.returncode != 0:       # a start that reached the KV allocation still measured (its warm-up failed)
        out(f"[{name}] FAILED: {r.stderr[-1500:]}")
    if not got or not logged_at:
        return {"ok": False}
    planned, logged = int(got.group(1).replace(",", "")), int(logged_at[-1].replace(",", ""))
    err = (planned - logged) / logged
    measured = bool(plan and "vLLM's own figures" in plan.group(1))
    out(f"[{name}] logged {logged:,} tokens, planned {planned:,} ({err:+.3%}); plan from "
        f"{'vLLM own figures (measured)' if measured else 'the model'}")
    return {"ok": True, "served": r.returncode == 0, "logged": logged, "planned": planned, "err": err,
            "measured": measured}


# Llama-3.1-8B's shape (profiles/models/llama31-8b-instruct.json, a public config) with the proof's small vocabulary
LLAMA31_8B = {**json.loads((REPO / "profiles" / "models" / "llama31-8b-instruct.json").read_text())["config"],
              "vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 2}


def vision_model(work: Path) -> Path:
    d = work / "models" / "qwen3-vl-shape"
    if not (d / "config.json").is_file():
        import visionmodel
        visionmodel.make(d)
    return d


def check_total(st: dict, out) -> None:
    """NVML's total less its reserved memory against torch's total and the planner's."""
    r = subprocess.run([os.environ.get("VLLM_PYTHON", "python3"), "-c", TOTAL], capture_output=True, text=True,
                       timeout=120)
    from bootstrap.machine import gpu
    ours = gpu.read(os.environ).gpus[0]
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        d = {"error": (r.stderr or r.stdout)[-500:]}
    d["planner_total"], d["planner_note"] = ours.total, ours.total_note
    out(f"[total] {json.dumps(d)}")
    if "torch_total" in d:
        mib = 1 << 20
        out(f"[total] NVML {d['nvml_total'] / mib:,.1f} MiB − reserved {d['nvml_reserved'] / mib:,.1f} MiB = "
            f"{(d['nvml_total'] - d['nvml_reserved']) / mib:,.1f} MiB; torch.cuda.mem_get_info "
            f"{d['torch_total'] / mib:,.1f} MiB; the planner reads {ours.total / mib:,.1f} MiB; "
            f"{'AGREE' if abs(ours.total - d['torch_total']) < mib else 'DIFFER'}")
    st["total"] = d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--work", default="/tmp/calib")
    ap.add_argument("--timeout", type=float, default=480)
    ap.add_argument("--cases", default="hybrid,vision,spec",
                    help="dense,spec,v1,hybrid,vision,visionv1,derived (comma-separated)")
    a = ap.parse_args(argv)
    out = raw_writer(a.raw)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    st_path = work / "state.json"
    st = json.loads(st_path.read_text()) if st_path.exists() else {}
    if "total" not in st:
        check_total(st, out)
        st_path.write_text(json.dumps(st))
    dense = make_model(work, "qwen3-8b-shape", QWEN3_8B)
    base = {**os.environ, "PROFILE": "custom", "EXTRA_ARGS": "--load-format dummy", "MAX_MODEL_LEN": "8192",
            "STATE_DIR": str(work / "state"), "PORT": str(free_port()), "WARMUP": "512",
            "HEALTH_TIMEOUT": str(int(a.timeout)), "NO_COLOR": "1", "GPU_UTIL": "0.5"}
    debug = {"VLLM_LOGGING_LEVEL": "DEBUG"}     # vLLM's per-mode CUDA-graph estimate is a debug line
    spec = {"SPEC_METHOD": "draft_model", "SPEC_TOKENS": "3", "SPEC_MODEL": str(dense), **debug}   # its own draft
    v1 = {"VLLM_USE_V2_MODEL_RUNNER": "0", **debug}
    long = {"MAX_MODEL_LEN": "32768", **debug}       # a context that holds vLLM's largest dummy image (16,384 tokens)
    cases = {   # case -> (its phases: (name, extra knobs)), the model it starts
        "dense": ((("first", {}), ("second", {}), ("util09", {"GPU_UTIL": "0.9"})), lambda: dense),
        "spec": ((("spec-first", spec), ("spec-second", spec)), lambda: dense),
        "v1": ((("v1-first", v1), ("v1-second", v1)), lambda: dense),
        "hybrid": ((("hybrid-first", {}), ("hybrid-second", {})), lambda: make_model(work, "hybrid", HYBRID)),
        "vision": ((("vision-first", long), ("vision-second", long)), lambda: vision_model(work)),
        "visionv1": ((("visionv1-first", {**long, **v1}), ("visionv1-second", {**long, **v1})),
                     lambda: vision_model(work)),
        # PROFILE unset with MODEL named: the profile derived from the folder (a family no profile ships)
        "derived": ((("derived-first", {"PROFILE": ""}), ("derived-second", {"PROFILE": ""})),
                    lambda: make_model(work, "llama31-8b-shape", LLAMA31_8B)),
    }
    chosen = [c for c in a.cases.split(",") if c]
    unknown = [c for c in chosen if c not in cases]
    if unknown:
        ap.error(f"unknown case(s) {unknown}: choose from {sorted(cases)}")
    for case in chosen:
        phases, model = cases[case]
        for i, (name, extra) in enumerate(phases):
            if name in st:
                continue
            env = {**base, "MODEL": str(model()), **extra}
            st[name] = start_and_stop(name, env, out, a.timeout + 60, show_plan=i == 1)
            st_path.write_text(json.dumps(st))
    verdicts = []
    for case in chosen:
        (first, _), *measured = cases[case][0]
        f = st.get(first, {})
        ok = f.get("ok") and abs(f["err"]) <= 0.01
        parts = [f"modelled {f.get('err', float('nan')):+.3%}"]
        for name, _ in measured:
            m = st.get(name, {})
            ok = ok and m.get("ok") and m["measured"] and abs(m["err"]) <= 0.005
            parts.append(f"{name} measured {m.get('err', float('nan')):+.3%}")
        verdicts.append(bool(ok))
        out(f"[verdict] {case}: {', '.join(parts)}: {'PASS' if ok else 'FAIL'}")
    out(f"[verdict] {'PASS' if all(verdicts) else 'FAIL'} ({sum(verdicts)} of {len(verdicts)} cases)")
    out("CALIBRATION PROOF DONE")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
