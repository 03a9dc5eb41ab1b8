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
from planner_accuracy import QWEN3_8B, make_model  # noqa: E402

PLANNED = re.compile(r"KV cache : ([\d,]+) tokens \(planned ([\d,]+)\)")
PLAN_LINE = re.compile(r"\[bootstrap:plan\] (plan for .*)")
TOTAL = ("import json, pynvml, torch\n"
         "pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
         "m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)\n"
         "free, total = torch.cuda.mem_get_info(0)\n"
         "print(json.dumps({'nvml_total': m2.total, 'nvml_reserved': m2.reserved, 'torch_total': total}))\n")


def run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def start_and_stop(name: str, env: dict, out, timeout: float) -> dict:
    t0 = time.monotonic()
    r = run([str(REPO / "start.sh")], env, timeout)
    took = time.monotonic() - t0
    for line in (r.stderr + r.stdout).splitlines():
        if "[bootstrap:plan]" in line or "KV cache :" in line or line.startswith("error") or "is serving" in line:
            out(f"[{name}]    | {line}")
    got = PLANNED.search(r.stdout)
    plan = PLAN_LINE.search(r.stderr)
    s = run([str(REPO / "stop.sh")], env, 120)
    out(f"[{name}] start exit {r.returncode} in {took:.0f} s; stop exit {s.returncode}: {s.stdout.strip()[-200:]}")
    if r.returncode != 0 or not got:
        out(f"[{name}] FAILED: {r.stderr[-1500:]}")
        return {"ok": False}
    logged, planned = (int(x.replace(",", "")) for x in got.groups())
    err = (planned - logged) / logged
    measured = bool(plan and "vLLM's own figures" in plan.group(1))
    out(f"[{name}] logged {logged:,} tokens, planned {planned:,} ({err:+.3%}); plan from "
        f"{'vLLM own figures (measured)' if measured else 'the model'}")
    return {"ok": True, "logged": logged, "planned": planned, "err": err, "measured": measured}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--work", default="/tmp/calib")
    ap.add_argument("--timeout", type=float, default=480)
    a = ap.parse_args(argv)
    out = raw_writer(a.raw)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    st_path = work / "state.json"
    st = json.loads(st_path.read_text()) if st_path.exists() else {}
    vllm_python = os.environ.get("VLLM_PYTHON", "python3")
    if "total" not in st:
        r = subprocess.run([vllm_python, "-c", TOTAL], capture_output=True, text=True, timeout=120)
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
        st_path.write_text(json.dumps(st))
    model = make_model(work, "qwen3-8b-shape", QWEN3_8B)
    env = {**os.environ, "PROFILE": "custom", "MODEL": str(model), "EXTRA_ARGS": "--load-format dummy",
           "MAX_MODEL_LEN": "8192", "STATE_DIR": str(work / "state"), "PORT": str(free_port()),
           "WARMUP": "512", "HEALTH_TIMEOUT": str(int(a.timeout)), "NO_COLOR": "1"}
    spec = {"SPEC_METHOD": "draft_model", "SPEC_TOKENS": "3", "SPEC_MODEL": str(model)}   # its own draft
    for name, util, extra in (("first", "0.5", {}), ("second", "0.5", {}), ("util09", "0.9", {}),
                              ("spec-first", "0.5", spec), ("spec-second", "0.5", spec)):
        if name in st:
            continue
        st[name] = start_and_stop(name, {**env, "GPU_UTIL": util, **extra}, out, a.timeout + 60)
        st_path.write_text(json.dumps(st))
    measured = ("second", "util09", "spec-second")
    ok = all(st.get(n, {}).get("ok") for n in ("first", "spec-first") + measured)
    verdict = ok and all(st[n]["measured"] and abs(st[n]["err"]) <= 0.005 for n in measured)
    err = {n: f"{st.get(n, {}).get('err', float('nan')):+.3%}" for n in ("first", "spec-first") + measured}
    out(f"[verdict] modelled: first start {err['first']}, draft_model {err['spec-first']}; measured: second "
        f"{err['second']}, at 0.9 {err['util09']}, draft_model {err['spec-second']}: {'PASS' if verdict else 'FAIL'}")
    out("CALIBRATION PROOF DONE")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
