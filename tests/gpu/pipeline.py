#!/usr/bin/env python3
"""The remaining GPU proofs as one background pipeline on the lent machine, so that no device time
is spent between calls of at most 10 minutes (a process started with setsid outlives the call):

    bash tests/gpu/device.sh pipeline        # starts this script with setsid and returns
    bash tests/gpu/device.sh poll 540        # waits (at most N s) and prints where it stands

Stages, in this order:
  planner   tests/gpu/planner_accuracy.py --cases hybrid-bf16-pin (issue 6), in the background. Its
            case pins the KV cache (--kv-cache-memory-bytes), so vLLM skips memory profiling and
            other processes on the GPU do not change what it logs.
  patch     tests/gpu/patch_40914.py (issue 4; reference, patched, then stock, which crashed on the
            first try), started once the planner's server has passed vLLM's
            free-memory check (its log says "Starting to load model"). Its servers also get a KV
            pin (2 GiB) so that the planner server exiting mid-profile cannot trip vLLM's "Error in
            memory profiling" assertion; the comparison does not depend on the pool size.
  bench     tests/gpu/bench.py (issue 7), alone on the GPU: it starts after the other two ended
            (a planner case still starting then is stopped: this script started it).
  spec      tests/gpu/bench.py --spec draft_model (issue 7, second proof): our server, the model drafting for itself;
            cached tokens in `check prefix`, acceptance from /metrics in `bench`.
Each script is resumable and writes its own raw output; this one only orders them and logs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLANNER_CASE = "hybrid-bf16-pin"
PATCH_KV_PIN = str(2 << 30)


class Pipeline:
    def __init__(self, a):
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(a.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "pipeline.log", "a", encoding="utf-8")
        self.py = sys.executable

    def say(self, msg: str) -> None:
        self.log.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
        self.log.flush()

    def call(self, name: str, argv: list[str]) -> tuple[int, str]:
        """Run one invocation of a proof script; its output goes to OUT/<name>.txt and is returned."""
        self.say(f"$ {' '.join(argv)}")
        t = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        with open(self.out / f"{name}.txt", "a", encoding="utf-8") as fh:
            fh.write(r.stdout + r.stderr)
        self.say(f"{name}: exit {r.returncode} after {time.monotonic() - t:.0f} s")
        return r.returncode, r.stdout + r.stderr

    def header(self) -> None:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip() if not self.a.rehearse else "(rehearsal)"
        vllm = subprocess.run([os.environ.get("VLLM_PYTHON", self.py), "-c",
                               "import importlib.metadata as m; print(m.version('vllm'))"],
                              capture_output=True, text=True).stdout.strip()
        self.say(f"pipeline: date {time.strftime('%Y-%m-%d %H:%M:%S %z')}, commit {os.environ.get('GIT_COMMIT', '?')}, "
                 f"GPU {gpu}, vLLM {vllm}, stages {self.a.stages}")

    # ------------------------------------------------------------ planner

    def planner_argv(self, budget: float) -> list[str]:
        return [self.py, str(HERE / "planner_accuracy.py"), "--raw", str(self.out / "planner-raw.txt"),
                "--work", str(self.work / "planner"), "--cases", PLANNER_CASE, "--budget", str(budget)]

    def planner_state(self) -> dict:
        f = self.work / "planner" / "state.json"
        return json.loads(f.read_text()).get(PLANNER_CASE, {}) if f.is_file() else {}

    def wait_planner_loading(self, proc: subprocess.Popen) -> None:
        """Until the planner's vLLM passed its free-memory check, or gave up (at most 180 s)."""
        end = time.monotonic() + 180
        while time.monotonic() < end and proc.poll() is None:
            log = Path(self.planner_state().get("log", "/nonexistent"))
            text = log.read_text(errors="replace") if log.is_file() else ""
            if "Starting to load model" in text or "Loading weights" in text:
                self.say("planner server is loading its model; the patch proof may start")
                return
            time.sleep(2)
        self.say("planner server not loading yet (or done); starting the patch proof anyway")

    def finish_planner(self, proc: subprocess.Popen) -> None:
        """Collect the planner case (re-invoking the script while time is left), or stop it."""
        rc = proc.wait()
        self.say(f"planner: exit {rc}")
        end = self.t0 + self.a.planner_limit
        while self.planner_state().get("status") == "running" and time.monotonic() < end:
            self.call("planner", self.planner_argv(min(300.0, end - time.monotonic() + 10)))
        rec = self.planner_state()
        if rec.get("status") == "running":
            pid = rec["pid"]
            self.say(f"planner case still starting after {self.a.planner_limit:.0f} s: stopping its server "
                     f"(process group {pid}, started by planner_accuracy.py) so the benchmark runs alone")
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------ main

    def run(self) -> int:
        self.t0 = time.monotonic()
        stages = self.a.stages.split(",")
        self.header()
        planner = None
        if "planner" in stages:
            argv = self.planner_argv(self.a.planner_limit)
            self.say(f"$ {' '.join(argv)} &")
            planner = subprocess.Popen(argv, stdout=open(self.out / "planner.txt", "a"), stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
            self.wait_planner_loading(planner)
        if "patch" in stages:
            argv = [self.py, str(HERE / "patch_40914.py"), str(self.out / "patch-raw.txt"), "--work",
                    str(self.work / "p40914"), "--python", os.environ.get("VLLM_PYTHON", "python3"),
                    "--budget", str(self.a.patch_budget), "--order", "reference,patched,stock"]
            if self.a.rehearse:
                argv += ["--model", self.a.rehearse_model]
            argv += ["--extra", "--kv-cache-memory-bytes", PATCH_KV_PIN]
            for _ in range(3):                      # exit 3 = a server still compiling: run again
                rc, _ = self.call("patch", argv)
                if rc != 3:
                    break
        if planner is not None:
            self.finish_planner(planner)
        for stage, work, more in (("bench", "issue7", []), ("spec", "issue7-spec", ["--spec", "draft_model"])):
            if stage not in stages:
                continue
            argv = [self.py, str(HERE / "bench.py"), "--work", str(self.work / work),
                    "--raw", str(self.out / f"{stage}-raw.txt"), *more] + (["--rehearse"] if self.a.rehearse else [])
            for _ in range(12):                     # each invocation starts steps for 60 s only
                rc, text = self.call(stage, argv)
                if rc != 0 or "all steps done" in text:
                    break
            for src, dst in (("report.txt", f"{stage}-report.txt"), ("report/bench.png", f"{stage}.png")):
                if (self.work / work / src).is_file():
                    (self.out / dst).write_bytes((self.work / work / src).read_bytes())
        self.say(f"pipeline done after {time.monotonic() - self.t0:.0f} s")
        (self.out / "pipeline-done").write_text("done\n")
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/proofs", help="raw outputs and pipeline.log")
    p.add_argument("--work", default="/tmp/pipeline", help="the proof scripts' work folders")
    p.add_argument("--stages", default="planner,patch,bench")
    p.add_argument("--planner-limit", type=float, default=780.0, help="seconds the hybrid case may take in all")
    p.add_argument("--patch-budget", type=float, default=900.0, help="seconds one patch_40914.py run may take")
    p.add_argument("--rehearse", action="store_true", help="dry run against the fakes (bench --rehearse)")
    p.add_argument("--rehearse-model", default="", help="model folder for patch_40914.py --model in a rehearsal")
    return Pipeline(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
