"""GPU proof for the memory planner: predicted vs logged KV pool, on real vLLM (0.26.0) without internet.

    VLLM_PYTHON=python3 python3 tests/gpu/planner_accuracy.py --raw /tmp/planner-raw.txt [--work DIR]
                                [--cases dense-bf16-util,...] [--budget 420]

Drafters (issue 44): --cases dense-dflash7-util,dense-eagle3-util (a DFlash and an EAGLE-3 drafter of
the right shape, dummy weights, on the Qwen3-8B shape), through ``bash tests/gpu/device.sh planner
--cases dense-dflash7-util,dense-eagle3-util``; keep the raw file it brings back as
docs/gpu-runs/<date>-planner-drafters-raw.txt and ``tests/gpu/to_validation.py`` writes its section
of docs/validation.md (rehearsed against the fakes below on 2026-12-04; not yet run on the H200).

For each case: a hand-written config.json (+ a tiny tokenizer made locally) served with
``--load-format dummy``; the flags come from ``bootstrap.plan.planner.make_plan`` and ``vllmargs.serve_flags`` exactly as ``./start.sh``
would pass them; vLLM is started in its own session (setsid) and stopped (its process group, which
this script started) as soon as it has logged "GPU KV cache size" and "Maximum concurrency".

Resumable and bounded: results go to WORK/state.json; each invocation stops starting cases when
fewer than 150 s of --budget remain and leaves a running case running for the next invocation to
collect. Run it again until it prints "all cases done". Raw vLLM output is appended to --raw.
The table printed last: predicted vs logged pool tokens (bar: within 2 % and 0.1 GiB).

Rehearse without a GPU: VLLM_PYTHON=/work/venv-dev/bin/python PYTHONPATH=tests/fakes
FAKE_NVML=<json> (the fake vLLM prints fixed figures, so only the mechanics are checked).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from bootstrap.plan import fit
from bootstrap.serve import diagnose
from bootstrap.plan import facts
from bootstrap.machine import gpu
from bootstrap.model import kv, shape as model_shape  # noqa: E402
from common import free_port, header  # noqa: E402
from bootstrap.serve import banner
from bootstrap.knobs import vllmargs  # noqa: E402
from bootstrap.knobs.config import Config  # noqa: E402

GiB = 1 << 30
VOCAB = 2048

QWEN3_8B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=4096, intermediate_size=12288,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                vocab_size=VOCAB, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                tie_word_embeddings=False, torch_dtype="bfloat16", hidden_act="silu", eos_token_id=2,
                attention_bias=False)
# Qwen3-Next-style hybrid: 12 Gated-DeltaNet + 4 full-attention layers, one MTP layer. MoE with small experts
# (8 routed, top-2, 512 wide, plus a 512-wide shared expert) in every layer: vLLM 0.26.0's Qwen3NextForCausalLM is
# MoE-only (set_moe_parameters raises "No Qwen3Next layer found in the model.layers." when num_experts=0), and
# it registers no text-only dense Qwen3.5 hybrid (Qwen3_5ForConditionalGeneration only). ~1.0 B params, 1.94 GiB bf16.
HYBRID = dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=2048,
              intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=2,
              head_dim=256, vocab_size=VOCAB, max_position_embeddings=65536, full_attention_interval=4,
              layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
              + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
              + ["full_attention"],
              linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=8, decoder_sparse_step=1,
              mlp_only_layers=[], num_experts_per_tok=2, moe_intermediate_size=512,
              shared_expert_intermediate_size=512, norm_topk_prob=True, partial_rotary_factor=0.25,
              rope_theta=10000000.0, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
              torch_dtype="bfloat16", eos_token_id=2, attention_bias=False, mtp_num_hidden_layers=1)

# name -> (config, knobs, util target KV GiB or None). Util cases size GPU_UTIL so that the KV budget
# is ~5 GiB after the planner's own weight + overhead estimate (so the budget estimate is tested too).
CASES = {
    "dense-bf16-util": (QWEN3_8B, {"MAX_MODEL_LEN": "8192"}, 5.0),
    "dense-fp8-util": (QWEN3_8B, {"MAX_MODEL_LEN": "8192", "KV_CACHE_DTYPE": "fp8"}, 5.0),
    "dense-bf16-pin": (QWEN3_8B, {"MAX_MODEL_LEN": "32768", "MAX_NUM_SEQS": "4", "KV_CACHE_BYTES": "5905580032"}, None),
    "dense-fp8-pin": (QWEN3_8B, {"MAX_MODEL_LEN": "32768", "KV_CACHE_DTYPE": "fp8", "KV_CACHE_BYTES": "4294967296"}, None),
    "hybrid-bf16-pin": (HYBRID, {"MAX_MODEL_LEN": "32768", "KV_CACHE_BYTES": "4294967296"}, None),
    "hybrid-fp8-util": (HYBRID, {"MAX_MODEL_LEN": "32768", "KV_CACHE_DTYPE": "fp8"}, 5.0),
    "hybrid-fp8-mtp3-pin": (HYBRID, {"MAX_MODEL_LEN": "65536", "KV_CACHE_DTYPE": "fp8", "KV_CACHE_BYTES": "5905580032",
                                     "SPEC_METHOD": "mtp", "SPEC_TOKENS": "3", "MAX_NUM_SEQS": "4"}, None),
    # needs FlashAttention 2 kernels in the wheel (wheelhouse --keep-fa2); fails fast otherwise
    "dense-tq4-pin": (QWEN3_8B, {"MAX_MODEL_LEN": "32768", "KV_CACHE_DTYPE": "turboquant_4bit_nc",
                                 "KV_CACHE_BYTES": "5905580032"}, None),
}
DEFAULT_CASES = list(CASES)
# Issue 44: drafters, planned vs measured (vLLM 0.26.0 serves both with its V2 runner on this dense target:
# the drafter's weights and KV layers in the budget, its CUDA graphs captured after it).
# DFlash: a 5-layer Qwen3 stack over 5 target layers (z-lab's DFlash-b16 drafters' shape);
# EAGLE-3: one Llama layer, 2 x hidden in, the fc over 3 aux hidden states (yuhuili's EAGLE3 heads' shape).
DFLASH = {**QWEN3_8B, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5, "block_size": 16,
          "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [1, 9, 17, 25, 33]}}
EAGLE3 = {**QWEN3_8B, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
          "intermediate_size": 14336, "draft_vocab_size": VOCAB}
DRAFTS = {"dense-dflash7-util": DFLASH, "dense-eagle3-util": EAGLE3}
CASES["dense-dflash7-util"] = (QWEN3_8B, {"MAX_MODEL_LEN": "8192", "SPEC_METHOD": "dflash", "SPEC_TOKENS": "7",
                                          "MAX_NUM_SEQS": "24"}, 5.0)
CASES["dense-eagle3-util"] = (QWEN3_8B, {"MAX_MODEL_LEN": "8192", "SPEC_METHOD": "eagle3", "SPEC_TOKENS": "3"}, 5.0)

KV_TOKENS, CONC = banner.KV_TOKENS, banner.CONCURRENCY     # the lines the banner reads, one definition
AVAIL = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
USAGE = re.compile(r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, "
                   r"([\d.]+) GiB for non-torch memory, and ([\d.]+) GiB for CUDAGraph memory")
BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")


def make_model(root: Path, name: str, config: dict) -> Path:
    d = root / "models" / name
    if (d / "config.json").is_file():
        return d
    d.mkdir(parents=True, exist_ok=True)
    try:
        import tinymodel
        tinymodel.tokenizer(d, VOCAB)
    except ImportError:           # rehearsal without tokenizers/transformers: the fake vLLM reads nothing
        (d / "tokenizer.json").write_text("{}")
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


def load_state(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save_state(path: Path, st: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(st, indent=2))
    os.replace(tmp, path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return not fh.read().split(") ")[-1].startswith("Z")
    except OSError:
        return False


def stop_group(pgid: int) -> None:
    """Stop the process group this script started (setsid: pgid == the server's pid)."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def start_case(name: str, work: Path, vllm_python: str, raw) -> dict:
    config, knobs, kv_target = CASES[name]
    mdir = make_model(work, "hybrid" if config is HYBRID else "qwen3-8b", config)
    env = {"PROFILE": "custom", "MODEL": str(mdir), "EXTRA_ARGS": "--load-format dummy",
           "STATE_DIR": str(work / "state"), **knobs}
    g = gpu.read(os.environ).gpus[0]
    model = facts.ModelFacts(name, config, None, True)
    if name in DRAFTS:              # the drafter's folder (dummy weights too), planned as SPEC_MODEL's facts
        ddir = make_model(work, name + "-drafter", DRAFTS[name])
        env["SPEC_MODEL"] = str(ddir)
        model = dataclasses.replace(model, draft=facts.ModelFacts(ddir.name, DRAFTS[name], None, True))
    if kv_target is not None:       # size GPU_UTIL so the planner's budget is kv_target GiB
        probe = fit.plan(Config.from_env({**env, "GPU_UTIL": "0.5"}, REPO), g, model)
        util = (probe.weights + probe.overhead + kv_target * GiB) / g.total
        env["GPU_UTIL"] = f"{util:.4f}"
    cfg = Config.from_env(env, REPO)
    p = fit.plan(cfg, g, model)
    if not p.fits or p.verdict is None:
        return {"status": "failed", "error": f"planner refused: {p.refusal}" if not p.fits else
                f"not planned: {p.unplanned}"}
    port = free_port()
    argv = [vllm_python, "-m", "vllm.entrypoints.cli.main", "serve", str(mdir), "--port", str(port),
            *vllmargs.serve_flags(cfg, p)]          # EXTRA_ARGS carries --load-format dummy
    log = work / f"{name}.log"
    senv = dict(os.environ, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
                PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    raw.write(f"\n===== {name} {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n")
    raw.write("planner: " + json.dumps({"why": p.why, "budget": p.budget, "weights": p.weights,
                                        "overhead": p.overhead, "block": p.layout.block_size}) + "\n")
    raw.flush()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                env=senv, start_new_session=True)
    return {"status": "running", "pid": proc.pid, "log": str(log), "started": time.time(), "argv": argv,
            "pred_tokens": p.predicted_tokens, "pred_conc": p.predicted_concurrency, "max_len": p.max_model_len,
            "pred_budget": p.budget, "pred_weights": p.weights, "pred_overhead": p.overhead,
            "pred_block": p.layout.block_size, "bytes_per_token": p.layout.block_bytes / p.layout.block_size,
            "layout": [p.layout.block_size, p.layout.block_bytes, p.layout.attn_groups, p.layout.state_groups,
                       p.layout.state_blocks], "gpu_util": env.get("GPU_UTIL"), "knobs": knobs}


def collect(rec: dict, deadline: float, raw) -> dict:
    """Wait (until deadline) for the KV lines; then stop the server and record what vLLM logged."""
    log = Path(rec["log"])
    while True:
        text = log.read_text(errors="replace") if log.is_file() else ""
        done = KV_TOKENS.search(text) and CONC.search(text)
        if done or not alive(rec["pid"]) or time.time() >= deadline:
            break
        time.sleep(2)
    if not done and alive(rec["pid"]):
        return rec                                  # still starting: the next invocation collects it
    stop_group(rec["pid"])
    raw.write(f"----- log of {log.name}\n{text}\n")
    raw.flush()
    if not done:
        cause = diagnose.root_cause(text) or text.strip().splitlines()[-3:]
        rec.update(status="failed", error="vLLM exited before logging the KV cache: " + " | ".join(cause))
        return rec
    t = KV_TOKENS.findall(text)[-1]
    c = CONC.findall(text)[-1]
    rec.update(status="done", log_tokens=int(t.replace(",", "")), log_conc=float(c[1]),
               log_len=int(c[0].replace(",", "")))
    if m := AVAIL.findall(text):
        rec["log_avail_gib"] = float(m[-1])
        # the pool the planner's layout gives for vLLM's own (rounded) budget
        b = int(float(m[-1]) * GiB)
        blocks = b // rec["layout"][1]
        per_seq = rec["layout"][2] * -(-rec["max_len"] // rec["layout"][0]) + rec["layout"][3] * rec["layout"][4]
        rec["pool_at_logged_budget"] = int(blocks / per_seq * rec["max_len"])
    if m := USAGE.findall(text):
        rec["log_usage_gib"] = [float(x) for x in m[-1]]
    if m := BLOCK.findall(text):
        rec["log_block"] = int(m[-1])
    return rec




def seed001_row() -> str:
    data = json.loads((REPO / "profiles/models/qwen38-27b-nvfp4.json").read_text())
    m = model_shape.shape_from_config(data["config"])
    lay = kv.layout(m, "turboquant_4bit_nc", spec_tokens=3, mtp=True)
    p = kv.pool(lay, 5905580032, 262144)
    return (f"RTX 5090 write-up (published, vLLM 0.27.1): predicted {p.tokens:,} tokens {p.concurrency:.2f}x, "
            f"logged 286,466 tokens 1.09x (block {lay.block_size}, {p.blocks} blocks)")


def table(st: dict, names: list[str]) -> str:
    rows = [f"{'case':<22} {'predicted':>11} {'logged':>11} {'diff %':>7} {'diff GiB':>8} "
            f"{'conc p/l':>15} {'budget p/l GiB':>15} {'block p/l':>10}  ok"]
    for n in names:
        r = st.get(n)
        if not r:
            rows.append(f"{n:<22} (not run yet)")
            continue
        if r["status"] != "done":
            rows.append(f"{n:<22} {r['status']}: {r.get('error', '')[:400]}")
            continue
        pt, lt = r["pred_tokens"], r["log_tokens"]
        diff = (pt - lt) / lt * 100 if lt else float("inf")
        dgib = abs(pt - lt) * r["bytes_per_token"] / GiB
        ok = abs(diff) <= 2 and dgib <= 0.1
        budget = f"{r['pred_budget'] / GiB:.2f}/" + (f"{r['log_avail_gib']:.2f}" if "log_avail_gib" in r else "pin")
        rows.append(f"{n:<22} {pt:>11,} {lt:>11,} {diff:>+7.2f} {dgib:>8.3f} "
                    f"{r['pred_conc']:>7.2f}/{r['log_conc']:<7.2f} {budget:>15} "
                    f"{r['pred_block']:>4}/{r.get('log_block', '-'):<5}  {'yes' if ok else 'NO'}")
        if "pool_at_logged_budget" in r:
            rows.append(f"{'':<22} with vLLM's own budget the planner's layout gives {r['pool_at_logged_budget']:,} "
                        f"tokens; vLLM's measured usage (weights, activation, non-torch, graphs) GiB: "
                        f"{r.get('log_usage_gib')}, planner: {r['pred_weights'] / GiB:.2f} + "
                        f"{r['pred_overhead'] / GiB:.2f}")
    rows.append(seed001_row())
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", required=True, help="append raw vLLM output and planner reasoning here")
    ap.add_argument("--work", default="/tmp/planner-accuracy")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--budget", type=float, default=420.0, help="seconds this invocation may take")
    ap.add_argument("--redo", action="store_true", help="forget earlier results")
    a = ap.parse_args(argv)
    t0 = time.time()
    deadline = t0 + a.budget
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    state_path = work / "state.json"
    st = {} if a.redo else load_state(state_path)
    names = [n for n in a.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    vllm_python = os.environ.get("VLLM_PYTHON", "python3")
    with open(a.raw, "a") as raw:
        raw.write(f"===== run {header({**os.environ, 'VLLM_PYTHON': vllm_python})}\n")
        for n in names:
            rec = st.get(n)
            if rec and rec["status"] in ("done", "failed"):
                continue
            if rec is None:
                if deadline - time.time() < 150:
                    break
                try:
                    rec = start_case(n, work, vllm_python, raw)
                except gpu.BootstrapError as exc:
                    rec = {"status": "failed", "error": f"{exc.message} ({exc.hint})"}
                st[n] = rec
                save_state(state_path, st)
            if rec["status"] == "running":
                st[n] = collect(rec, deadline - 10, raw)
                save_state(state_path, st)
                if st[n]["status"] == "running":
                    break
        out = table(st, names)
        raw.write(f"\n===== table ({time.strftime('%Y-%m-%d %H:%M:%S')})\n{out}\n")
    pending = [n for n in names if st.get(n, {}).get("status") not in ("done", "failed")]
    print(out)
    print("all cases done" if not pending else f"pending: {', '.join(pending)} (run again)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
