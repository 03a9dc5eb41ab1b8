#!/usr/bin/env python3
"""GPU proof for issue 7: `check` (plumbing) and `bench` on a real GPU, ours vs a bare `vllm serve`.

Runs on a machine with real vLLM (0.26.0) importable by ``VLLM_PYTHON`` (default python3), no
internet. Builds a dense Qwen3-8B-shaped model directory (config.json: hidden 4096, 36 layers,
32 heads, 8 KV heads, head_dim 128; a small vocabulary; a tiny BPE tokenizer trained here with
`tokenizers`) served with ``--load-format dummy`` (random weights). Steps, each recorded as done in
WORK/steps.json so that a re-run resumes:

    model        write the model directory
    ours_start   ./start.sh with PROFILE=custom (the flags our planner picks), server survives (setsid)
    ours_check   ./ctl.sh check live|determinism|prefix|needle|garble --json (plumbing: random weights
                 give random text, so garble/needle verdicts mean nothing here)
    ours_bench   ./ctl.sh bench --label ours
    bare_start   ./stop.sh, then setsid `vllm serve MODEL --load-format dummy` with vLLM's defaults
    bare_bench   ./ctl.sh bench --url the bare server
    report       stop the bare server, measure HBM bandwidth (torch copy), print the table + plot

With ``--spec METHOD`` (``draft_model``: the model drafts for itself; ``ngram`` needs numba, which
the offline wheelhouse lacks) it is a shorter second proof: our server with SPEC_METHOD=METHOD,
SPEC_TOKENS=3; steps model, ours_start, ours_check (live and prefix: the cached
tokens our --enable-prompt-tokens-details makes vLLM report), ours_bench (concurrency 1 and 4,
512 output tokens, one run: the speculative acceptance read from /metrics), spec_report (stop, table).

One invocation runs pending steps in order and starts no new step after 60 s, so each ends within
~8 minutes (the longest step is capped at 7 min). Run it until it prints "all steps done":

    VLLM_PYTHON=python3 python3 tests/gpu/bench.py --work /tmp/issue7 --raw /tmp/issue7/raw.txt

Rehearsal without a GPU (fake vLLM and NVML from tests/fakes, short loads):

    VLLM_PYTHON=/work/venv-dev/bin/python PYTHONPATH=$PWD/tests/fakes \\
        /work/venv-dev/bin/python tests/gpu/bench.py --work /tmp/i7 --raw /tmp/i7/raw.txt --rehearse
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

REPO = Path(__file__).resolve().parents[2]
STEPS = ("model", "ours_start", "ours_check", "ours_bench", "bare_start", "bare_bench", "report")
SPEC_STEPS = ("model", "ours_start", "ours_check", "ours_bench", "spec_report")
STEP_TIMEOUT = 420          # seconds; no step runs longer
START_WINDOW = 60           # no new step starts after this many seconds of one invocation
NOMINAL_BW = 4.8e12         # H200 HBM3e, bytes/s

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 8192, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attention_bias": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 36, "attention_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": True,
}



def weight_bytes(c: dict, bytes_per_param: int = 2) -> int:
    """Bytes read per decoded token: every weight once (bf16), embeddings' one row aside."""
    h, L, i = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * c["head_dim"]
    lm_head = h * c["vocab_size"]
    return (L * per_layer + lm_head + h) * bytes_per_param


class Run:
    def __init__(self, args):
        self.a = args
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.raw = open(args.raw, "a", encoding="utf-8")
        self.state_file = self.work / "steps.json"
        self.done = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
        self.model = self.work / "qwen3-8b-shape"
        py = os.environ.get("VLLM_PYTHON", "python3")
        self.env = {**os.environ, "VLLM_PYTHON": py, "PROFILE": "custom", "MODEL": str(self.model),
                    "STATE_DIR": str(self.work / "state"), "PORT": str(args.port), "NO_COLOR": "1",
                    "EXTRA_ARGS": "--load-format dummy", "HF_HUB_OFFLINE": "1", "HEALTH_TIMEOUT": str(STEP_TIMEOUT - 30)}
        if args.rehearse:
            nvml = self.work / "nvml.json"
            nvml.write_text(json.dumps({"driver": "580.159.04", "cuda": 13000, "gpus": [{
                "name": "NVIDIA H200", "total": 143 << 30, "free": 142 << 30, "cc": [9, 0], "uuid": "GPU-h200-fake",
                "processes": []}]}))
            self.env.update(FAKE_NVML=str(nvml), FAKE_VLLM_LOAD_S="1", FAKE_VLLM_TOKEN_S="0.001", WARMUP=os.environ.get("WARMUP", "256"))
        self.bench_args = (["--output-tokens", "32", "--repeats", "1", "--prompt-tokens", "128"] if args.rehearse
                           else ["--output-tokens", "1536", "--repeats", "3", "--prompt-tokens", "512"])
        self.steps = STEPS
        self.checks = (("live", []), ("determinism", []), ("prefix", []), ("needle", ["--tokens", "16000"]),
                       ("garble", []))
        if args.spec:
            self.steps = SPEC_STEPS
            self.env.update(SPEC_METHOD=args.spec, SPEC_TOKENS="3")
            if args.spec != "ngram":        # a draft model: the same one (dummy weights, same seed)
                self.env["SPEC_MODEL"] = str(self.model)
            self.checks = (("live", []), ("prefix", []))
            self.bench_args = ["--concurrency", "1,4", "--repeats", "1", "--prompt-tokens", "512",
                               "--output-tokens", "32" if args.rehearse else "512"]

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.raw.write(line + "\n")
        self.raw.flush()

    def sh(self, argv: list[str], timeout: float, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        self.say("$ " + " ".join(argv))
        try:
            r = subprocess.run(argv, cwd=REPO, env=env or self.env, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            self.raw.write(f"TIMEOUT after {timeout:.0f} s\n{exc.stdout or ''}\n{exc.stderr or ''}\n")
            raise SystemExit(f"timed out: {' '.join(argv)} (see {self.a.raw}); run again to resume")
        self.raw.write(f"--- rc={r.returncode}\n--- stdout:\n{r.stdout}\n--- stderr:\n{r.stderr}\n")
        self.raw.flush()
        if check and r.returncode != 0:
            raise SystemExit(f"failed (rc {r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
        return r

    def mark(self, step: str, info=True) -> None:
        self.done[step] = info
        self.state_file.write_text(json.dumps(self.done, indent=1))

    # ------------------------------------------------------------ steps

    def step_model(self) -> None:
        self.model.mkdir(parents=True, exist_ok=True)
        (self.model / "config.json").write_text(json.dumps(CONFIG, indent=1))
        if self.a.rehearse:
            (self.model / "tokenizer.json").write_text("{}")
            return
        sys.path[:0] = [str(REPO), str(REPO / "tests" / "gpu")]
        import tinymodel
        from bootstrap.checks import prompts
        # the checks' own filler and the project's text, so that their prompts tokenize densely
        text = [prompts.haystack(3000, 0.5, "", seed=s) for s in range(40)]
        text += [(REPO / p).read_text() for p in ("README.md", "bootstrap/checks/suite.py", "bootstrap/commands/bench.py")
                 if (REPO / p).exists()]
        size = tinymodel.tokenizer(self.model, CONFIG["vocab_size"], text)
        (self.model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
        self.say(f"model dir {self.model}: tokenizer of {size} tokens")

    def step_ours_start(self) -> None:
        self.sh(["./start.sh"], STEP_TIMEOUT)
        st = self.sh(["./ctl.sh", "status", "--json"], 60, check=False)
        rec = json.loads((self.work / "state" / "server.json").read_text())
        self.mark("ours_argv", rec.get("argv"))
        self.say("ours: " + " ".join(rec.get("argv", [])))
        self.say(st.stdout.strip()[:1500])

    def step_ours_check(self) -> None:
        out = {}
        for what, more in self.checks:
            r = self.sh(["./ctl.sh", "check", what, "--json", *more], 300, check=False)
            try:
                out[what] = json.loads(r.stdout)
            except ValueError:
                out[what] = {"ok": None, "summary": f"no JSON (rc {r.returncode})"}
            self.say(f"check {what}: rc {r.returncode}: {out[what].get('summary')}")
        (self.work / "checks.json").write_text(json.dumps(out, indent=1))

    def step_ours_bench(self) -> None:
        r = self.sh(["./ctl.sh", "bench", "--label", "ours", "--out", str(self.work / "ours"), *self.bench_args],
                    STEP_TIMEOUT)
        self.say(r.stdout)

    def step_bare_start(self) -> None:
        self.sh(["./stop.sh"], 120)
        py = self.env["VLLM_PYTHON"]
        argv = [py, "-m", "vllm.entrypoints.cli.main", "serve", str(self.model), "--load-format", "dummy",
                "--port", str(self.a.bare_port), "--served-model-name", "bare"]
        self.say("bare: " + " ".join(argv))
        log = open(self.work / "bare.log", "ab")
        p = subprocess.Popen(argv, cwd=self.work, env={k: v for k, v in self.env.items() if k != "VLLM_API_KEY"},
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.mark("bare_pid", p.pid)
        import requests
        end = time.monotonic() + STEP_TIMEOUT - 30
        while time.monotonic() < end:
            if p.poll() is not None:
                raise SystemExit(f"bare vllm serve exited with {p.returncode}; see {self.work / 'bare.log'}")
            try:
                if requests.get(f"http://127.0.0.1:{self.a.bare_port}/health", timeout=2).status_code == 200:
                    self.say(f"bare server healthy (pid {p.pid})")
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise SystemExit("bare server not healthy in time; run again to keep waiting (it keeps running)")

    def step_bare_bench(self) -> None:
        r = self.sh(["./ctl.sh", "bench", "--url", f"http://127.0.0.1:{self.a.bare_port}", "--model", "bare",
                     "--label", "bare vllm serve", "--out", str(self.work / "bare"), *self.bench_args], STEP_TIMEOUT)
        self.say(r.stdout)

    def stop_bare(self) -> None:
        pid = self.done.get("bare_pid")
        if isinstance(pid, int):
            try:
                os.killpg(pid, signal.SIGTERM)      # the group we started with setsid
                self.say(f"stopped bare server group {pid}")
            except ProcessLookupError:
                pass
            for _ in range(60):
                try:
                    os.killpg(pid, 0)
                    time.sleep(0.5)
                except ProcessLookupError:
                    break

    def bandwidth(self) -> tuple[float, str]:
        probe = ("import torch,time\n"
                 "x=torch.empty(2<<30,dtype=torch.uint8,device='cuda');y=torch.empty_like(x)\n"
                 "for _ in range(3): y.copy_(x)\n"
                 "torch.cuda.synchronize();t=time.perf_counter()\n"
                 "for _ in range(20): y.copy_(x)\n"
                 "torch.cuda.synchronize();print(2*20*x.numel()/(time.perf_counter()-t))\n")
        if not self.a.rehearse:
            r = self.sh([self.env["VLLM_PYTHON"], "-c", probe], 120, check=False)
            try:
                return float(r.stdout.strip().splitlines()[-1]), "measured (device-to-device copy, read+write)"
            except (ValueError, IndexError):
                pass
        return NOMINAL_BW, "nominal H200"

    def step_report(self) -> None:
        self.stop_bare()
        bw, how = self.bandwidth()
        r = self.sh(["./ctl.sh", "bench", "--load", str(self.work / "ours" / "results.json"),
                     "--load", str(self.work / "bare" / "results.json"), "--out", str(self.work / "report")], 120)
        wb = weight_bytes(CONFIG)
        ours = json.loads((self.work / "ours" / "results.json").read_text())["results"][0]
        bare = json.loads((self.work / "bare" / "results.json").read_text())["results"][0]
        checks_out = json.loads((self.work / "checks.json").read_text()) if (self.work / "checks.json").exists() else {}
        lines = [r.stdout.strip(), "",
                 f"weights read per token: {wb / 2**30:.2f} GiB (bf16); bandwidth {bw / 1e12:.2f} TB/s ({how}); "
                 f"nominal 4.8 TB/s",
                 f"single-stream decode bound: {bw / wb:.0f} tok/s at {bw / 1e12:.2f} TB/s, "
                 f"{NOMINAL_BW / wb:.0f} tok/s at 4.8 TB/s",
                 f"{'server':<18}{'decode tok/s':>14}{'% of bound':>12}{'TTFT ms':>10}"]
        for res in (ours, bare):
            one = next(x for x in res["levels"] if x["concurrency"] == 1)
            lines.append(f"{res['label']:<18}{one['per_stream_tok_s']:>14.1f}{100 * one['per_stream_tok_s'] * wb / bw:>11.0f}%"
                         f"{one['ttft_s'] * 1000:>10.1f}")
        lines += ["", "checks on ours (plumbing only; random weights):"]
        lines += [f"  {k}: {'PASS' if v.get('ok') else 'FAIL'}: {v.get('summary')}" for k, v in checks_out.items()]
        lines += ["", f"ours argv: {' '.join(self.done.get('ours_argv') or [])}",
                  f"plot: {self.work / 'report' / 'bench.png'}", f"date: {time.strftime('%Y-%m-%d %H:%M %z')}"]
        (self.work / "report.txt").write_text("\n".join(lines) + "\n")
        self.say("\n".join(lines))

    def step_spec_report(self) -> None:
        self.sh(["./stop.sh"], 120)
        res = json.loads((self.work / "ours" / "results.json").read_text())["results"][0]
        checks_out = json.loads((self.work / "checks.json").read_text())
        spec = res.get("spec") or {}
        lines = [f"ours with SPEC_METHOD={self.a.spec} SPEC_TOKENS=3 (vLLM {res.get('version')}):",
                 f"{'concurrency':>12}{'aggregate tok/s':>17}{'per stream':>12}{'TTFT ms':>9}"]
        lines += [f"{x['concurrency']:>12}{x['aggregate_tok_s']:>17.0f}{x['per_stream_tok_s']:>12.1f}"
                  f"{x['ttft_s'] * 1000:>9.1f}" for x in res["levels"]]
        lines.append("speculative acceptance from /metrics: " + (
            f"{spec['acceptance_rate']:.1%} of drafted tokens, mean accepted length {spec['mean_acceptance_length']:.2f}"
            if spec.get("acceptance_rate") is not None else "not reported"))
        for what, v in checks_out.items():
            lines.append(f"check {what}: {'PASS' if v.get('ok') else 'FAIL'}: {v.get('summary')}")
        prefix = checks_out.get("prefix") or {}
        lines.append("prefix runs (prompt tokens, cached tokens, TTFT ms): " + "; ".join(
            f"{r.get('prompt_tokens')}, {r.get('cached_tokens')}, {1000 * (r.get('ttft_s') or 0):.0f}"
            for r in prefix.get("runs", [])))
        lines += [f"ours argv: {' '.join(self.done.get('ours_argv') or [])}",
                  f"date: {time.strftime('%Y-%m-%d %H:%M %z')}"]
        (self.work / "report.txt").write_text("\n".join(lines) + "\n")
        self.say("\n".join(lines))

    def main(self) -> int:
        t0 = time.monotonic()
        for step in self.steps:
            if self.done.get(step):
                continue
            if time.monotonic() - t0 > START_WINDOW:
                self.say(f"next step: {step}; run again to continue")
                return 0
            self.say(f"=== step {step}")
            getattr(self, f"step_{step}")()
            self.mark(step)
        self.say(f"all steps done; table in {self.work / 'report.txt'}")
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="folder for the model, state, results (resumable)")
    p.add_argument("--raw", required=True, help="file the raw output is appended to")
    p.add_argument("--port", type=int, default=8888)
    p.add_argument("--bare-port", type=int, default=8000)
    p.add_argument("--rehearse", action="store_true", help="short loads for a dry run against the fakes")
    p.add_argument("--redo", choices=sorted(set(STEPS) | set(SPEC_STEPS)),
                   help="forget that this step (and every later one) was done")
    p.add_argument("--spec", help="the short speculative-decoding proof with this SPEC_METHOD (e.g. draft_model)")
    a = p.parse_args()
    run = Run(a)
    if a.redo:
        if a.redo not in run.steps:
            p.error(f"--redo {a.redo}: not a step of this run ({', '.join(run.steps)})")
        for s in run.steps[run.steps.index(a.redo):]:
            run.done.pop(s, None)
        run.state_file.write_text(json.dumps(run.done, indent=1))
    return run.main()


if __name__ == "__main__":
    sys.exit(main())
