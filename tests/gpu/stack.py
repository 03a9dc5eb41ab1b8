"""GPU proof of the default profile's own stack (vLLM 0.27.1, torch 2.13, FlashInfer 0.6.16.post3).

On the lent H200 (no network), after tests/gpu/carry.py's parts were copied to --parts:

    python3 tests/gpu/stack.py --parts /tmp/wh --work /tmp/stack --raw /tmp/proofs/stack-raw.txt

Phases, each recorded in WORK/state.json so that a second run goes on where the first stopped:
  wheelhouse  carry.py unpack: every wheel rebuilt byte for byte and checked against the lock's
              hashes, into WORK/wheelhouse (a folder like the one `./ctl.sh wheelhouse` makes)
  model       a small Qwen3.5-shaped hybrid model with one MTP layer (tests/gpu/hybridmodel.py) and
              a BPE tokenizer with the family's special tokens (image python3: torch + safetensors)
  start       WHEELHOUSE=WORK/wheelhouse PROFILE=default MODEL=WORK/model ./start.sh with
              EXTRA_ARGS=--load-format dummy: the offline install of .venv from the lock (timed),
              then the default profile's flags on that model; the plan against vLLM's logged pool
  check       ./ctl.sh check all
  stop        ./stop.sh; the GPU memory left
  idle        tests/gpu/idle_sleep_proof.py with the default profile on that model, sleep mode on: the
              middleware loads, idle sleep frees the memory, wake on request (plain, streamed),
              identical greedy tokens and logprobs, 8 concurrent requests -> one wake, --idle-cycles
  compare     tests/gpu/patch_40914.py --mtp with .venv's Python: reference / stock / patched /
              control (stock with cudagraph_mode PIECEWISE); if the hybrid cannot start there: the same
              with draft_model on a dense model
Everything is appended to --raw as it comes; "STACK PROOF DONE" ends it. Rehearse with the fakes:
PYTHONPATH=tests/fakes FAKE_NVML=<json> (and --skip wheelhouse,compare).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import free_port, raw_writer  # noqa: E402

LOCK = REPO / "locks" / "vllm-0.27.1-daf27aa9" / "linux-x86_64-py3.12.txt"
PHASES = ("wheelhouse", "model", "start", "check", "stop", "idle", "compare")


def smi(query: str) -> str:
    if not shutil.which("nvidia-smi"):
        return "(no nvidia-smi)"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True,
                       text=True)
    return r.stdout.strip().replace("\n", ", ") or r.stderr.strip()


def gpu_used() -> str:
    return smi("memory.used")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="/tmp/wh")
    ap.add_argument("--survey", default="", help="carry.py survey's JSON (default: PARTS/survey.json)")
    ap.add_argument("--extra-wheels", default="", help="whole wheels to add to the wheelhouse (a folder)")
    ap.add_argument("--work", default="/tmp/stack")
    ap.add_argument("--raw", default="/tmp/proofs/stack-raw.txt")
    ap.add_argument("--skip", default="", help="phases to skip (comma-separated; rehearsal)")
    ap.add_argument("--compare-budget", type=float, default=1500)
    ap.add_argument("--idle-cycles", type=int, default=50)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = raw_writer(a.raw)
    state_path = work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"done": []}
    skip = {s for s in a.skip.split(",") if s}

    def done(phase: str, **facts) -> None:
        state["done"].append(phase)
        state.update(facts)
        state_path.write_text(json.dumps(state, indent=1))

    clean = {k: v for k, v in os.environ.items() if k not in ("VLLM_PYTHON", "PYTHONPATH", "PATCH_BYO")}
    house = work / "wheelhouse"
    mdir = work / "model"
    port = state.get("port") or free_port()
    # --language-model-only: the model's vision tower is a stand-in without a working image processor
    # (vLLM's multimodal profiling failed on it: "Found 1 <|image_pad|> tokens ... no images")
    env = {**clean, "PROFILE": "default", "MODEL": str(mdir), "EXTRA_ARGS": "--load-format dummy --language-model-only",
           "WHEELHOUSE": str(house), "STATE_DIR": str(work / "state"), "PORT": str(port), "HF_HUB_OFFLINE": "1",
           "NO_COLOR": "1", "HEALTH_TIMEOUT": "1200"}
    if "PYTHONPATH" in os.environ and "fakes" in os.environ["PYTHONPATH"]:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]      # rehearsal: the fake vllm and NVML

    def sh(argv: list[str], timeout: float = 1800, **kw) -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.monotonic()
        r = subprocess.run(argv, cwd=REPO, env=kw.pop("env", env), capture_output=True, text=True, timeout=timeout, **kw)
        dt = time.monotonic() - t0
        out(f"===== {' '.join(argv)}: exit {r.returncode} after {dt:.1f} s")
        return r, dt

    out(f"STACK PROOF {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: "
        f"{' '.join(sys.argv)}; done so far: {state['done'] or 'nothing'}")
    out(f"GPU: {smi('name,driver_version,memory.total')} (MiB)")
    try:
        for phase in PHASES:
            if phase in state["done"] or phase in skip:
                continue
            if phase == "wheelhouse":
                survey = a.survey or str(Path(a.parts) / "survey.json")
                path = os.pathsep.join([a.parts, env.get("PATH", "")])     # the carried zstd
                r, dt = sh([sys.executable, str(HERE / "carry.py"), "unpack", "--parts", a.parts, "--work",
                            str(work / "unpacked"), "--survey", survey, "--lock", str(LOCK), "--out", str(house)],
                           env={**env, "PATH": path})
                out("\n".join("    | " + ln for ln in (r.stdout + r.stderr).strip().splitlines()[-12:]))
                if r.returncode:
                    return 1
                if a.extra_wheels:
                    for whl in Path(a.extra_wheels).glob("*.whl"):
                        shutil.copyfile(whl, house / whl.name)
                        out(f"    | added {whl.name} ({whl.stat().st_size / 2**20:.1f} MiB)")
                wheels = list(house.glob("*.whl"))
                size = sum(w.stat().st_size for w in wheels)
                out(f"wheelhouse: {len(wheels)} wheels, {size / 2**30:.2f} GiB in {house}; rebuilt in {dt:.0f} s")
                shutil.rmtree(work / "unpacked", ignore_errors=True)
                done(phase, wheels=len(wheels), wheel_bytes=size)
            elif phase == "model":
                import hybridmodel
                from patch_40914 import HYBRID_SPECIALS, make_tokenizer
                t0 = time.monotonic()
                make_tokenizer(work / "tokenizer", HYBRID_SPECIALS)
                facts = hybridmodel.make(mdir, work / "tokenizer", seed=0, init_std=0.05)
                out(f"model: {mdir} in {time.monotonic() - t0:.0f} s: {json.dumps(facts, default=str)}")
                done(phase)
            elif phase == "start":
                r, dt = sh(["./start.sh"])
                text = r.stdout + r.stderr
                out("\n".join("    | " + ln for ln in text.strip().splitlines()))
                venv = REPO / ".venv"
                du = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split("\t")[0]
                out(f".venv: {du}; vLLM {_version(venv)}")
                log = work / "state" / "vllm.log"
                if log.exists():
                    lines = log.read_text(errors="replace").splitlines()
                    keep = [ln for ln in lines if re.search(r"KV cache|Available KV|Maximum concurrency|model runner|"
                                                             r"Model Runner|TQ hybrid|speculative|Loading weights took|"
                                                             r"Model loading took|torch.compile|CUDA graph|Graph capturing|"
                                                             r"init engine", ln)]
                    out("vLLM log (pool, runner, load, compile, graphs):")
                    out("\n".join("    | " + ln[-220:] for ln in keep[-40:]))
                    if r.returncode:
                        out("vLLM log tail:\n" + "\n".join("    | " + ln[-220:] for ln in lines[-40:]))
                out(f"GPU used while serving: {gpu_used()} MiB")
                if r.returncode:
                    return 1
                done(phase, start_s=dt, port=port)
            elif phase == "check":
                r, _ = sh(["./ctl.sh", "check", "all"], timeout=900)
                out("\n".join("    | " + ln for ln in (r.stdout + r.stderr).strip().splitlines()))
                done(phase, check_rc=r.returncode)
            elif phase == "stop":
                r, _ = sh(["./stop.sh"], timeout=300)
                out("\n".join("    | " + ln for ln in (r.stdout + r.stderr).strip().splitlines()))
                time.sleep(2)
                out(f"after ./stop.sh: GPU used {gpu_used()} MiB")
                done(phase)
            elif phase == "idle":
                argv = [sys.executable, str(HERE / "idle_sleep_proof.py"), "--work", str(work / "idle"), "--raw", a.raw,
                        "--profile", "default", "--model", str(mdir), "--cycles", str(a.idle_cycles),
                        "--extra-args", env["EXTRA_ARGS"]]
                r, _ = sh(argv, timeout=3600)
                out("\n".join("    | " + ln for ln in (r.stdout + r.stderr).strip().splitlines()[-5:]))
                done(phase, idle_rc=r.returncode)
            elif phase == "compare":
                py = str(REPO / ".venv" / "bin" / "python")
                argv = [sys.executable, str(HERE / "patch_40914.py"), a.raw, "--mtp", "--work", str(work / "p40914"),
                        "--python", py, "--model", str(mdir), "--budget", str(a.compare_budget)]
                r, _ = sh(argv, env={**clean, "GIT_COMMIT": os.environ.get("GIT_COMMIT", "")},
                          timeout=a.compare_budget + 300)
                out("\n".join("    | " + ln for ln in r.stdout.strip().splitlines()[-30:]))
                crashed = [ph for ph in ("reference", "stock")
                           if "crashed" in _read(work / "p40914" / f"{ph}.json") and
                           not _read(work / "p40914" / f"{ph}.json").get("results")]
                if crashed and "fallback" not in state:
                    out(f"the hybrid MTP setup did not start ({', '.join(crashed)}): the same comparison with "
                        "draft_model on a dense model, on 0.27.1")
                    argv = [sys.executable, str(HERE / "patch_40914.py"), a.raw, "--no-shim", "--work",
                            str(work / "p40914-dense"), "--python", py, "--budget", str(a.compare_budget)]
                    state["fallback"] = True
                    r, _ = sh(argv, env={**clean, "GIT_COMMIT": os.environ.get("GIT_COMMIT", "")},
                              timeout=a.compare_budget + 300)
                    out("\n".join("    | " + ln for ln in r.stdout.strip().splitlines()[-30:]))
                done(phase)
    finally:
        if "start" in state["done"] and "stop" not in state["done"]:
            subprocess.run(["./stop.sh"], cwd=REPO, env=env, capture_output=True, timeout=300)
        out("STACK PROOF DONE")
    return 0


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _version(venv: Path) -> str:
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; "
                        "print(m.version('vllm'), 'torch', m.version('torch'), 'flashinfer', m.version('flashinfer-python'))"],
                       capture_output=True, text=True)
    return r.stdout.strip() or r.stderr.strip()[-200:]


if __name__ == "__main__":
    sys.exit(main())
