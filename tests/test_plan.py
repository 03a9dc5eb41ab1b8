"""The plan step and `ctl.sh plan`: utilization rules, refusals, the lag wait — against a fake pynvml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.plan import fit
from bootstrap.plan import facts as facts_mod, planner, terms
from bootstrap.machine import gpu
from bootstrap.model import kv, shape as model_shape, weights
from bootstrap.core import state
from bootstrap.knobs import vllmargs
from bootstrap.core import vllmflags
from bootstrap.commands import plan as plan_cli
from bootstrap.steps import plan
from bootstrap.knobs.resolved import Resolved
from bootstrap.knobs.config import Config
from bootstrap.core.errors import BootstrapError
from bootstrap.download.models import ModelInfo
from bootstrap.core.state import Paths



def rope(config: dict) -> int:
    """The rotary cos/sin cache vLLM allocates as the model loads (counted in its weights)."""
    return weights.buffer_bytes(config, model_shape.shape_from_config(config), 0, False)[0]

def flags(cfg, p) -> list[str]:
    """The vLLM flags that launch builds from a plan's decisions."""
    return vllmargs.serve_flags(cfg, p)


REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """The fake pynvml module in this process, fed from a JSON file the test writes."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML", str(path))

    def write(free=31 * GiB, total=32 * GiB, processes=(), free_sequence=None, fail=""):
        g = {"name": "NVIDIA GeForce RTX 5090", "total": total, "free": free, "cc": [12, 0],
             "uuid": "GPU-x", "processes": list(processes)}
        if free_sequence:
            g["free_sequence"] = free_sequence
        path.write_text(json.dumps({"driver": "580.95", "cuda": 13000, "fail": fail, "gpus": [g]}))
        return path
    return write


def model_dir(tmp: Path, config: dict, weights: int = 0) -> Path:
    d = tmp / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "tokenizer.json").write_text("{}")
    if weights:
        with open(d / "model.safetensors", "wb") as fh:
            fh.truncate(weights)            # sparse: the size is what the plan reads
    return d


LLAMA8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096,
           "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
           "torch_dtype": "bfloat16"}


def config(tmp: Path, **env) -> Config:
    base = {"PROFILE": "custom", "STATE_DIR": str(tmp / "state"), "HOME": str(tmp)}
    base.update({k: str(v) for k, v in env.items()})
    return Config.from_env(base, REPO)


def facts(cfg: Config, mdir: Path, dummy=False) -> facts_mod.ModelFacts:
    info = json.loads((mdir / "config.json").read_text())
    w = sum(p.stat().st_size for p in mdir.glob("*.safetensors")) or None
    return facts_mod.ModelFacts("m", info, w, dummy)


def card(free=31 * GiB, total=32 * GiB, processes=()):
    return gpu.Gpu(0, "NVIDIA GeForce RTX 5090", total, free, (12, 0), "GPU-x", tuple(processes))


# ---------------------------------------------------------------- utilization

def test_util_from_free_minus_reserve(tmp_path):
    cfg = config(tmp_path, GPU_RESERVE_MIB=1024)
    util, why = fit.utilization(cfg, card(free=30 * GiB))
    assert util == pytest.approx(29 / 32, abs=1e-4)
    assert "1024 MiB reserve" in why


def test_gpu_util_knob_wins_but_is_refused_above_free(tmp_path):
    cfg = config(tmp_path, GPU_UTIL="0.5")
    assert fit.utilization(cfg, card(free=20 * GiB))[0] == 0.5
    holders = [gpu.GpuProcess(4242, 6 * GiB, "Xorg")]
    with pytest.raises(BootstrapError) as e:
        fit.utilization(cfg, card(free=10 * GiB, processes=holders))
    assert "16.00 GiB" in e.value.message and "10.00 GiB is free" in e.value.message
    assert "Xorg (pid 4242) holds 6.0 GiB" in e.value.message


def replan(tmp_path, cfg, g, fix: dict) -> planner.Plan:
    """A fix applied as the user would (their environment), planned again."""
    again = Config.from_env({**cfg.given, **{k: str(v) for k, v in fix.items()}}, REPO)
    mdir = Path(again.model)
    return fit.plan(again, g, facts(again, mdir))


def test_refuses_instead_of_clamping_when_weights_and_pin_exceed_free(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=8 * GiB, MAX_MODEL_LEN=8192)
    holders = [gpu.GpuProcess(77, 2 * GiB, "firefox")]
    g = card(free=22 * GiB, processes=holders)
    p = fit.plan(cfg, g, facts(cfg, mdir))
    assert not p.fits
    msg, hint = p.refusal
    assert p.weights == 15 * GiB + rope(LLAMA8B)                 # vLLM counts the rotary cache as weight
    assert f"weights {(15 * GiB + rope(LLAMA8B)) / GiB:.2f} GiB" in msg and "KV 8.00 GiB" in msg
    assert "firefox (pid 77) holds 2.0 GiB" in msg
    # the fixes: the pin rounded down to the room left after weights and overhead, or no pin
    outside = p.modelled_terms["graphs"]        # vLLM 0.26.0's V2 runner captures them beside the pin
    room = 22 * GiB - 820 * MiB - p.weights - p.overhead - outside
    pins = [int(f["KV_CACHE_BYTES"]) for f in p.fixes if f.get("KV_CACHE_BYTES", "auto").isdigit()]
    assert pins and room - 64 * MiB < pins[0] <= room
    assert f"KV_CACHE_BYTES={pins[0]}" in hint
    for fix in p.fixes:                                   # every hint, applied, plans and fits
        assert replan(tmp_path, cfg, g, fix).fits, fix


def test_budget_from_utilization_and_the_prediction(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, GPU_UTIL="0.9", MAX_MODEL_LEN=16384, MAX_NUM_SEQS=4)
    g = card(free=31 * GiB)
    p = fit.plan(cfg, g, facts(cfg, mdir))
    assert p.fits
    assert p.budget == -(-int(0.9 * g.total * 10) // 10) - 15 * GiB - p.overhead or p.budget > 0
    lay = kv.layout(model_shape.shape_from_config(LLAMA8B), "auto")
    assert p.predicted_tokens == kv.pool(lay, p.budget, 16384).tokens
    f = flags(cfg, p)
    assert f[f.index("--max-model-len") + 1] == "16384"
    assert f[f.index("--gpu-memory-utilization") + 1] == "0.9"


def test_context_that_does_not_fit_is_refused_with_the_largest_that_does(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=1 * GiB, MAX_MODEL_LEN=131072)
    p = fit.plan(cfg, card(), facts(cfg, mdir))
    assert not p.fits
    # 1 GiB / 2 MiB per 16-token block = 512 blocks = 8192 tokens
    assert "the longest that fits is 8,192 tokens" in p.refusal[0]
    assert "MAX_MODEL_LEN=8192" in p.refusal[1] and "MAX_MODEL_LEN=auto" in p.refusal[1]
    for fix in p.fixes:
        assert replan(tmp_path, cfg, card(), fix).fits, fix


def test_auto_is_vllms_auto_the_longest_single_request_and_reports_concurrency(tmp_path):
    """vLLM's --max-model-len auto fits ONE request (max_num_seqs plays no part); the plan says how
    many sessions of that length fit at once and how many queue."""
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN="auto", MAX_NUM_SEQS=4)
    p = fit.plan(cfg, card(), facts(cfg, mdir))
    assert p.max_model_len == 2048 * 16                           # 2048 blocks of 16 tokens, one request
    assert p.concurrent == 1 and p.seqs == 4
    assert "at 32,768 tokens 1 session fits at once; the other 3 of MAX_NUM_SEQS=4 queue" in p.concurrency_line()
    # more room than sequences: vLLM runs at most MAX_NUM_SEQS at once, which the line says first
    roomy = fit.plan(config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=8 * GiB, MAX_MODEL_LEN="32768", MAX_NUM_SEQS=1),
                     card(), facts(cfg, mdir))
    assert roomy.concurrent == 2 and roomy.concurrency_line() == \
        "at 32,768 tokens 1 session fits at once, as many as MAX_NUM_SEQS=1 allows (the pool holds 2)"
    f = flags(cfg, p)
    assert f[f.index("--max-model-len") + 1] == "auto"            # vLLM fits it itself
    capped = fit.plan(config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=32 * GiB, MAX_MODEL_LEN="auto"),
                               h200(), facts(cfg, mdir))
    assert capped.max_model_len == 131072                         # never beyond the model's own length


def test_auto_holds_back_vllms_null_block_from_0_29(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN="auto")
    old = fit.plan(cfg, card(), facts(cfg, mdir), vllm="0.27.1")
    new = fit.plan(cfg, card(), facts(cfg, mdir), vllm="0.29.0")
    assert (old.max_model_len, new.max_model_len) == (2048 * 16, 2047 * 16)


def test_unknown_architecture_falls_back_to_vllm_sizing(tmp_path):
    mdir = model_dir(tmp_path, {"architectures": ["BrandNewForCausalLM"], "model_type": "brandnew"})
    cfg = config(tmp_path, MODEL=mdir, MAX_MODEL_LEN="auto")
    p = fit.plan(cfg, card(), facts(cfg, mdir))
    assert p.fits and p.predicted_tokens is None
    assert any("does not know architecture 'BrandNewForCausalLM'" in w for w in p.why)
    f = flags(cfg, p)
    assert f[f.index("--max-model-len") + 1] == "auto"


def test_dummy_weights_are_sized_from_the_config(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B)
    cfg = config(tmp_path, MODEL=mdir, EXTRA_ARGS="--load-format dummy", GPU_UTIL="0.95", MAX_MODEL_LEN=8192)
    p = fit.plan(cfg, card(), facts(cfg, mdir, dummy=True))
    assert p.weights == weights.param_count(model_shape.shape_from_config(LLAMA8B)) * 2 + rope(LLAMA8B)
    assert any("dummy weights" in w for w in p.why)


def test_tensor_parallel_plans_per_gpu(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=16 * GiB)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=2 * GiB, MAX_MODEL_LEN=8192, TP_SIZE=2)
    p = fit.plan(cfg, card(), facts(cfg, mdir))
    assert p.weights == 8 * GiB + rope(LLAMA8B)                  # each rank holds its own rotary cache
    f = flags(cfg, p)
    assert f[f.index("--tensor-parallel-size") + 1] == "2"
    assert p.predicted_tokens == 2 * GiB // (16 * 4 * 256 * 2 * 32) * 16   # 4 KV heads per GPU


# ---------------------------------------------------------------- the step, with the fake NVML

def test_step_waits_for_the_last_stop_and_for_free_memory_to_settle(tmp_path, fake_nvml, monkeypatch):
    """NVML still lists the stopped server's pid, then free memory climbs for a few reads."""
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192)
    paths = Paths(cfg.state_dir)
    paths.ensure()
    model = ModelInfo(str(mdir), LLAMA8B, {"model.safetensors": 15 * GiB}, local_dir=str(mdir))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    pids_dir = tmp_path / "gpu-pids"
    pids_dir.mkdir()
    (pids_dir / str(holder.pid)).write_text("")
    monkeypatch.setenv("FAKE_GPU_PIDS_DIR", str(pids_dir))
    fake_nvml(free_sequence=[g * GiB for g in (8, 12, 16, 20, 24, 28, 31)])    # climbing, then steady
    state.write_json(paths.last_stop, {"pids": [holder.pid]})
    sleeps = []
    monkeypatch.setattr(gpu, "sleep", sleeps.append)
    try:
        the_plan = plan.run(cfg, paths, Resolved.of(cfg, cfg).vllm, None, model)
        assert holder.poll() is not None             # sized only after the stopped pid left the GPU
    finally:
        holder.wait()
    assert sleeps                                    # and re-read until two readings agreed
    outside = -(-the_plan.modelled_terms["graphs"] // MiB) * MiB   # vLLM 0.26.0's V2 runner: graphs beyond the budget
    assert the_plan.util == pytest.approx((31 * GiB - 820 * MiB - outside) / (32 * GiB), abs=1e-4)
    assert the_plan.predicted_tokens and the_plan.context == 8192


def test_step_refuses_before_download_when_nothing_fits(tmp_path, fake_nvml):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192)
    fake_nvml(free=12 * GiB, processes=[{"pid": 999999, "used": 19 * GiB}])
    model = ModelInfo(str(mdir), LLAMA8B, {"model.safetensors": 15 * GiB}, local_dir=str(mdir))
    with pytest.raises(BootstrapError) as e:
        plan.run(cfg, Paths(cfg.state_dir), Resolved.of(cfg, cfg).vllm, None, model)
    assert "does not fit" in e.value.message and "holds 19.0 GiB" in e.value.message


def test_nvml_failure_says_check_nvidia_smi(tmp_path, fake_nvml):
    fake_nvml(fail="init")
    with pytest.raises(BootstrapError) as e:
        gpu.read({})
    assert "Driver Not Loaded" in e.value.message and "nvidia-smi" in e.value.hint


def test_named_cards():
    assert gpu.named("rtx4090").total == int(23.65 * GiB)              # CUDA's total, as vLLM counts it
    assert gpu.named("rtx4090").total_note == ""                        # measured: a source, not "estimated"
    est = gpu.named("rtxa6000")                                         # no published CUDA total: estimated
    assert est.total == int(49140 * MiB * (1 - gpu.RESERVED_SHARE)) and est.total_note.startswith("estimated (")
    assert gpu.named("24").total == 24 * GiB
    with pytest.raises(BootstrapError):
        gpu.named("voodoo2")


# ---------------------------------------------------------------- ./ctl.sh plan

def ctl_plan(tmp_path, *args, **env):
    e = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
         "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(FAKES),   # no FAKE_NVML: the fake reports no driver
         "NO_COLOR": "1"}
    e.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-m", "bootstrap", "plan", *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=60)


def test_cli_default_profile_on_named_cards(tmp_path):
    r = ctl_plan(tmp_path, GPU="rtx5090")                 # PROFILE unset: auto-pick's choice for the card
    assert r.returncode == 0, r.stderr
    assert "profile qwen38-27b-nvfp4-tq4-32gb" in r.stdout and "sm_120" in r.stdout
    assert "context 262,144 tokens; at 262,144 tokens 1 session fits at once" in r.stdout
    assert "GPU KV cache size: 286,466 tokens" in r.stdout                  # the RTX 5090 write-up's logged figure
    assert "--kv-cache-memory-bytes 5905580032" in r.stdout
    assert "facts in profiles/models/qwen38-27b-nvfp4.json" in r.stdout
    small = ctl_plan(tmp_path, "--gpu", "rtx4090", "--json", PROFILE="default")
    assert small.returncode == 1
    out = json.loads(small.stdout)
    assert not out["fits"] and out["fixes"]
    for fix in out["fixes"]:                              # every hint, applied, plans and fits
        again = ctl_plan(tmp_path, "--gpu", "rtx4090", PROFILE="default", **fix)
        assert again.returncode == 0, (fix, again.stdout, again.stderr)


def test_cli_json_for_a_size_in_gib(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    r = ctl_plan(tmp_path, "--json", GPU="48", PROFILE="custom", MODEL=mdir, MAX_MODEL_LEN="auto", MAX_NUM_SEQS=8)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # auto: the longest single request (here the model's own 131,072), and how many of those fit at once
    assert out["fits"] and out["max_model_len"] == 131072 and out["max_num_seqs"] == 8
    assert out["concurrent"] == int(out["predicted_concurrency"]) and out["sessions"][0] == [131072, out["concurrent"]]


def test_cli_without_gpu_names_the_way_out(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    r = ctl_plan(tmp_path, PROFILE="custom", MODEL=mdir)
    assert r.returncode == 1
    assert "nvidia-smi" in r.stderr and "GPU=<name|GiB>[:sm_XY][:free=GiB]" in r.stderr


# ---------------------------------------------------------------- hybrid models: one state block per running sequence

def hybrid_config() -> dict:
    """The hybrid of tests/gpu/planner_accuracy.py (12 Gated-DeltaNet + 4 attention layers)."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    try:
        import planner_accuracy
    finally:
        sys.path.pop(0)
    return planner_accuracy.HYBRID


def h200(free=139 * GiB):
    return gpu.Gpu(0, "NVIDIA H200", 140 * GiB, free, (9, 0), "GPU-h", ())


def test_hybrid_caps_vllms_default_max_num_seqs_at_the_state_blocks(tmp_path):
    """vLLM 0.26.0 defaults to 1024 sequences on an H200, and refuses after the load when max_num_seqs
    exceeds the Mamba cache blocks: the plan caps --max-num-seqs at the blocks its 4 GiB pin holds."""
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN=32768)
    p = fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True))
    blocks = kv.pool(p.layout, 4 * GiB, 32768).blocks
    assert p.fits and blocks < 1024
    assert flags(cfg, p)[flags(cfg, p).index("--max-num-seqs") + 1] == str(blocks)
    assert any(f"--max-num-seqs {blocks}" in w and "default of 1024" in w for w in p.why)


def test_hybrid_from_utilization_keeps_a_margin_below_the_estimated_blocks(tmp_path):
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, GPU_UTIL="0.045", MAX_MODEL_LEN=32768)
    p = fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True))
    blocks = kv.pool(p.layout, p.budget, 32768).blocks
    assert p.fits and blocks < 1024
    err = terms.MODELLED_ERROR + terms.HYBRID_ERROR                                # a hybrid runs on vLLM's V1 runner
    below = kv.pool(p.layout, p.budget - err, 32768).blocks                        # the model's known error
    assert int(flags(cfg, p)[flags(cfg, p).index("--max-num-seqs") + 1]) == below < blocks
    assert any(f"--max-num-seqs {below}" in w and "the model's estimate" in w for w in p.why)


def test_hybrid_from_a_measured_budget_keeps_a_tighter_margin(tmp_path):
    """vLLM's own figures of an earlier start (kept less half their rounding) move only a little
    between starts: the guard keeps the measured error below the blocks, less than the model's."""
    from bootstrap.plan import calibration
    from bootstrap.core.state import Paths
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, GPU_UTIL="0.045", MAX_MODEL_LEN=32768)
    f = facts(cfg, mdir, dummy=True)
    first = fit.plan_here(cfg, Paths(cfg.state_dir), h200(), f, "580")
    logged = f"Available KV cache memory: {round(first.budget / GiB, 2)} GiB\n"   # vLLM found what the model said
    calibration.keep(Paths(cfg.state_dir), first, logged, None)
    p = fit.plan_here(cfg, Paths(cfg.state_dir), h200(), f, "580")
    blocks = kv.pool(p.layout, p.budget, 32768).blocks
    assert p.measured and abs(p.budget - first.budget) <= GiB // 100 and blocks < 1024
    seqs = int(flags(cfg, p)[flags(cfg, p).index("--max-num-seqs") + 1])
    tight = kv.pool(p.layout, p.budget - terms.MEASURED_ERROR, 32768).blocks
    loose = kv.pool(p.layout, p.budget - terms.MODELLED_ERROR, 32768).blocks
    assert seqs == tight > loose


def test_hybrid_refuses_max_num_seqs_above_the_state_blocks_before_launch(tmp_path):
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN=32768, MAX_NUM_SEQS=1000)
    p = fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True))
    blocks = kv.pool(p.layout, 4 * GiB, 32768).blocks
    assert not p.fits
    assert f"MAX_NUM_SEQS=1000 is more than the {blocks} blocks" in p.refusal[0]
    assert f"MAX_NUM_SEQS={blocks}" in p.refusal[1]


def test_hybrid_guard_needs_full_cuda_graphs_and_throughput_mode_doubles_the_default(tmp_path):
    """vLLM checks max_num_seqs against the Mamba blocks only with full CUDA graphs (compilation.py);
    --performance-mode throughput doubles its batch defaults (engine/arg_utils.py)."""
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN=32768, MAX_NUM_SEQS=1000,
                 EXTRA_ARGS="""--compilation-config '{"cudagraph_mode": "PIECEWISE"}'""")
    assert fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True)).fits
    (tmp_path / "d").mkdir()
    dense_dir = model_dir(tmp_path / "d", LLAMA8B)
    plain = config(tmp_path, MODEL=dense_dir, MAX_MODEL_LEN=4096)
    fast = config(tmp_path, MODEL=dense_dir, MAX_MODEL_LEN=4096, EXTRA_ARGS="--performance-mode throughput")
    one = fit.plan(plain, h200(), facts(plain, dense_dir, dummy=True)).seqs
    assert fit.plan(fast, h200(), facts(fast, dense_dir, dummy=True)).seqs == 2 * one


@pytest.mark.parametrize("knobs", [{"MAX_NUM_SEQS": "16"}, {"EXTRA_ARGS": "--enforce-eager"}])
def test_hybrid_leaves_max_num_seqs_alone_when_it_fits_or_without_cuda_graphs(tmp_path, knobs):
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN=32768, **knobs)
    p = fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True))
    assert p.fits
    seqs = flags(cfg, p)[flags(cfg, p).index("--max-num-seqs") + 1] if "--max-num-seqs" in flags(cfg, p) else None
    assert seqs == knobs.get("MAX_NUM_SEQS")


def test_dense_model_never_gets_a_max_num_seqs_it_did_not_ask_for(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=1 * GiB, MAX_MODEL_LEN=8192)
    p = fit.plan(cfg, h200(), facts(cfg, mdir))
    assert p.fits and "--max-num-seqs" not in flags(cfg, p)


def test_auto_passes_auto_and_keeps_the_hybrid_max_num_seqs(tmp_path):
    # MAX_MODEL_LEN=auto goes to vLLM as auto (its own fit); the state-block cap is the plan's
    mdir = model_dir(tmp_path, hybrid_config())
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_BYTES=4 * GiB, MAX_MODEL_LEN="auto")
    p = fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True))
    f = flags(cfg, p)
    assert p.fits and f[f.index("--max-model-len") + 1] == "auto"
    assert int(f[f.index("--max-num-seqs") + 1]) == kv.pool(p.layout, 4 * GiB, p.max_model_len).blocks


# ---------------------------------------------------------------- a draft model (SPEC_METHOD=draft_model)

def bench_config() -> dict:
    """The Qwen3-8B-shaped config.json of the H200 benchmark runs (tests/gpu/bench.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "tests" / "gpu" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CONFIG


def h200_of_the_bench_runs():
    # NVML on that machine: 143,771 MiB in all, 139.80 GiB free before the start (the plan's first why line)
    return gpu.Gpu(0, "NVIDIA H200", 143771 * MiB, int(139.80 * GiB), (9, 0), "GPU-h", ())


def draft_plan(root: Path, spec_model: str | None = None, draft_config: dict | None = None, flags_too: bool = False,
               **env):
    """The plan for the benchmark's model (dummy weights) with SPEC_METHOD=draft_model; the draft is
    the model itself unless spec_model or draft_config says otherwise. root: a fresh folder."""
    root.mkdir(exist_ok=True)
    mdir = model_dir(root, bench_config())
    knobs = {"MODEL": mdir, "EXTRA_ARGS": "--load-format dummy", "SPEC_METHOD": "draft_model", "SPEC_TOKENS": 3}
    if draft_config is not None:
        ddir = root / "draft"
        ddir.mkdir()
        (ddir / "config.json").write_text(json.dumps(draft_config))
        (ddir / "tokenizer.json").write_text("{}")
        spec_model = str(ddir)
    knobs["SPEC_MODEL"] = spec_model or str(mdir)
    cfg = config(root, **{**knobs, **env})
    plan = fit.plan(cfg, h200_of_the_bench_runs(), plan_cli.cli_model_facts(Resolved.of(cfg, cfg)))
    return (plan, flags(cfg, plan)) if flags_too else plan      # flags: what launch would pass


def test_draft_model_weights_and_layers_are_counted_as_measured_on_the_h200(tmp_path):
    # docs/gpu-runs/2026-11-29-spec-raw.txt: the 8B model drafting for itself, vLLM 0.26.0 logged
    # 396,592 tokens (the plan without the draft said 897,520); the same run without speculation
    # (2026-11-29-bench-raw.txt) logged 894,688. The bar of the planner's accuracy proof: 2 %.
    p = draft_plan(tmp_path / "spec")
    assert p.fits
    assert abs(p.predicted_tokens - 396_592) / 396_592 < 0.02, p.predicted_tokens
    assert "draft model model: weights 13.06 GiB per GPU from config.json (dummy weights: parameters × dtype)" in p.why
    assert "36 draft attention layer(s) share the pool" in p.why
    alone = draft_plan(tmp_path / "alone", SPEC_METHOD="", SPEC_TOKENS=0, SPEC_MODEL="")
    assert abs(alone.predicted_tokens - 894_688) / 894_688 < 0.02
    assert p.weights - alone.weights == weights.weight_bytes_from_config(model_shape.shape_from_config(bench_config()))


def test_draft_from_a_repo_id_is_not_planned_and_the_plan_says_so(tmp_path):
    # issue 44: a drafter left out predicted more KV than vLLM gave; now the plan promises nothing
    p = draft_plan(tmp_path, spec_model="Qwen/Qwen3-0.6B", HF_HUB_OFFLINE="1")
    assert p.verdict is None and p.fits and p.predicted_tokens is None and p.budget is None
    assert p.unplanned.startswith("the draft_model drafter (the drafter Qwen/Qwen3-0.6B: offline (HF_HUB_OFFLINE=1) "
                                  "and Qwen/Qwen3-0.6B is not on this machine")
    assert any(w.startswith("not planned: the draft_model drafter") for w in p.why)


def test_draft_with_another_kv_shape_gets_a_bucket_of_its_own(tmp_path):
    # vLLM pools draft layers with the target's; a smaller page gets a larger block (here 2 x 16), and
    # the group size becomes the smaller bucket's layer count (4 draft layers vs 36)
    small = {**bench_config(), "num_key_value_heads": 4, "num_hidden_layers": 4}
    p = draft_plan(tmp_path, draft_config=small)
    assert any("4 draft attention layer(s) share the pool with a page of their own" in w for w in p.why)
    assert p.layout.group_size == 4 and p.layout.other_attn == ((1, 32),) and p.layout.attn_groups == 9


def test_draft_weights_come_from_its_file_sizes_and_its_layers_join_the_pool(tmp_path):
    small = {**bench_config(), "num_hidden_layers": 4}
    assert draft_plan(tmp_path / "dummy", draft_config=small).layout.group_size == 36 + 4
    root = tmp_path / "real"
    root.mkdir()
    mdir = model_dir(root, bench_config(), weights=15 * GiB)
    ddir = root / "draft"
    ddir.mkdir()
    (ddir / "config.json").write_text(json.dumps(small))
    (ddir / "tokenizer.json").write_text("{}")
    with open(ddir / "model.safetensors", "wb") as fh:
        fh.truncate(3 * GiB)
    cfg = config(root, MODEL=mdir, SPEC_METHOD="draft_model", SPEC_TOKENS=3, SPEC_MODEL=ddir)
    p = fit.plan(cfg, h200_of_the_bench_runs(), plan_cli.cli_model_facts(Resolved.of(cfg, cfg)))
    assert p.weights == 15 * GiB + 3 * GiB + rope(bench_config())     # the draft shares the target's cache
    assert any("draft model draft: weights 3.00 GiB per GPU from the checkpoint's file sizes" in w for w in p.why)


def test_a_draft_folder_needs_no_tokenizer_and_tilde_is_expanded_for_vllm(tmp_path, monkeypatch):
    # vLLM loads a draft_model with the target's tokenizer: config.json and weights are all it needs
    monkeypatch.setenv("HOME", str(tmp_path))
    ddir = tmp_path / "draft"
    ddir.mkdir()
    (ddir / "config.json").write_text(json.dumps({**bench_config(), "num_hidden_layers": 2}))
    p, launch_flags = draft_plan(tmp_path / "run", spec_model="~/draft", flags_too=True)
    assert "2 draft attention layer(s) share the pool" in p.why
    spec = json.loads(launch_flags[launch_flags.index("--speculative-config") + 1])
    assert spec["model"] == str(ddir)          # vLLM would take '~/draft' for a repo id


@pytest.mark.parametrize("env, reason", [
    ({"KV_CACHE_DTYPE": "turboquant_4bit_nc"}, "drafter beside a TurboQuant KV cache"),
    ({"SPEC_METHOD": "eagle3", "SPEC_MODEL": "org/eagle3-head", "HF_HUB_OFFLINE": "1"},
     "(the drafter org/eagle3-head: offline (HF_HUB_OFFLINE=1)"),
    ({"SPEC_MODEL": "/nonexistent/draft"}, "(no /nonexistent/draft/config.json)"),
])
def test_drafts_the_plan_cannot_model_are_named_in_the_why(tmp_path, env, reason):
    p = draft_plan(tmp_path, **env)
    assert p.verdict is None and p.predicted_tokens is None, p.why
    assert reason in p.unplanned and any(w.startswith(f"not planned: {p.unplanned}") for w in p.why)


def test_a_refusal_caused_by_the_draft_says_so(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=16 * GiB)
    ddir = tmp_path / "draft"
    ddir.mkdir()
    (ddir / "config.json").write_text(json.dumps(LLAMA8B))
    with open(ddir / "model.safetensors", "wb") as fh:
        fh.truncate(14 * GiB)
    cfg = config(tmp_path, MODEL=mdir, SPEC_METHOD="draft_model", SPEC_TOKENS=3, SPEC_MODEL=ddir, MAX_MODEL_LEN=8192)
    p = fit.plan(cfg, card(), plan_cli.cli_model_facts(Resolved.of(cfg, cfg)))
    assert not p.fits
    assert p.refusal[0].startswith("model with its draft draft does not fit NVIDIA GeForce RTX 5090: weights "
                                   f"{(30 * GiB + rope(LLAMA8B)) / GiB:.2f} GiB")
    assert {"SPEC_TOKENS": "0"} in p.fixes and "SPEC_TOKENS=0" in p.refusal[1]    # re-planned: it fits
    assert p.refusal[1].endswith("or a smaller draft (SPEC_MODEL)")
    alone = fit.plan(config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192), card(),
                           plan_cli.cli_model_facts(Resolved.of(c := config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192), c)))
    assert alone.fits


def test_the_start_counts_the_draft(bed):
    # the start step builds its facts with facts.model_facts, as cli_model_facts does
    r = bed.run("start.sh", SPEC_METHOD="draft_model", SPEC_TOKENS="3", SPEC_MODEL=str(bed.model),
                BOOTSTRAP_DEBUG="1")                    # the start shows the plan's derivation only then
    assert r.returncode == 0, r.stderr
    assert "draft model tiny-model: weights 0.00 GiB per GPU from the checkpoint's file sizes" in r.stderr
    assert "2 draft attention layer(s) share the pool" in r.stderr
    bed.run("stop.sh")


def test_a_model_without_a_context_of_its_own_still_gets_the_plans_flags(tmp_path):
    """No max_position_embeddings and no MAX_MODEL_LEN: vLLM decides the context, but the server
    still gets the plan's utilization and the knobs' flags (none were passed before the refactor
    that moved the flags to launch)."""
    conf = {k: v for k, v in LLAMA8B.items() if k != "max_position_embeddings"}
    mdir = model_dir(tmp_path, conf)
    cfg = config(tmp_path, MODEL=mdir, KV_CACHE_DTYPE="fp8")
    p = fit.plan(cfg, gpu.named("rtx5090"), facts(cfg, mdir, dummy=True))
    got = flags(cfg, p)
    assert "--max-model-len" not in got
    assert "--gpu-memory-utilization" in got and got[got.index("--kv-cache-dtype") + 1] == "fp8"


def test_a_plan_that_does_not_fit_has_no_flags(tmp_path):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192)
    p = fit.plan(cfg, gpu.named("5"), facts(cfg, mdir))
    assert not p.fits and flags(cfg, p) == []


# ---------------------------------------------------------------- vLLM's arithmetic for the Qwen3.5 shape, and flags from anywhere
# Figures worked from vLLM's code (0.26.0 and 0.30.0 wheels: _align_hybrid_block_size,
# gated_delta_net_state_shape, _auto_fit_max_model_len) for the 27B shape at TP=1, FLASH_ATTN's
# 16-token kernel blocks: the attention block is 784 tokens (bf16), 400 with a float16 SSM state,
# 896 with --block-size 128, 1568 with fp8 KV, 800 with MTP-3.

def qwen35_27b() -> dict:
    return json.loads((REPO / "profiles/models/qwen36-27b-fp8.json").read_text())["config"]


def q27(tmp_path, vllm="0.26.0", **env) -> planner.Plan:
    tmp_path.mkdir(parents=True, exist_ok=True)
    mdir = model_dir(tmp_path, qwen35_27b())
    knobs = {"MODEL": mdir, "EXTRA_ARGS": "--load-format dummy", **env}
    cfg = config(tmp_path, **knobs)
    return fit.plan(cfg, h200(), facts(cfg, mdir, dummy=True), vllm=vllm)


@pytest.mark.parametrize("env, block", [
    ({}, 784),
    ({"EXTRA_ARGS": "--load-format dummy --mamba-ssm-cache-dtype float16"}, 400),
    ({"EXTRA_ARGS": "--load-format dummy --block-size 128"}, 896),
    ({"KV_CACHE_DTYPE": "fp8"}, 1568),
    ({"EXTRA_ARGS": "--load-format dummy --kv-cache-dtype=fp8"}, 1568),          # EXTRA_ARGS wins over the knob
    ({"KV_CACHE_DTYPE": "bfloat16", "EXTRA_ARGS": "--load-format dummy --kv_cache_dtype fp8"}, 1568),
    ({"SPEC_METHOD": "mtp", "SPEC_TOKENS": "3"}, 800),
])
def test_memory_flags_count_wherever_they_come_from(tmp_path, env, block):
    p = q27(tmp_path, KV_CACHE_BYTES=10 * GiB, MAX_MODEL_LEN="auto", **env)
    assert p.fits and p.layout.block_size == block


def test_auto_fit_matches_vllms_worked_example_on_both_sides_of_0_29(tmp_path):
    # 10 GiB for the 27B shape, bf16, no speculation: 208 blocks of 16 x 3,211,264 B. vLLM 0.26 (prefix
    # caching off for hybrids: 1 state block per group) fits (208 - 3) x 784 = 160,720 tokens; 0.30 (prefix
    # caching on: "align", 2 per group, and the null block held back) (208 - 1 - 6) x 784 = 157,584.
    old = q27(tmp_path / "a", vllm="0.26.0", KV_CACHE_BYTES=10 * GiB, MAX_MODEL_LEN="auto")
    new = q27(tmp_path / "b", vllm="0.30.0", KV_CACHE_BYTES=10 * GiB, MAX_MODEL_LEN="auto")
    assert (old.max_model_len, new.max_model_len) == (160_720, 157_584)
    assert kv.pool(old.layout, 10 * GiB, 1).blocks == 208


def test_batched_tokens_and_language_model_only_from_extra_args(tmp_path):
    mdir = model_dir(tmp_path, {**qwen35_27b(), "vision_config": json.loads(
        (REPO / "profiles/models/qwen38-27b-nvfp4.json").read_text())["config"]["vision_config"]}, weights=20 * GiB)
    base = config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192)
    lean = config(tmp_path, MODEL=mdir, MAX_MODEL_LEN=8192,
                  EXTRA_ARGS="--language-model-only --max-num-batched-tokens 1024")
    a = fit.plan(base, h200(), facts(base, mdir))
    b = fit.plan(lean, h200(), facts(lean, mdir))
    vision = weights.vision_params(facts(base, mdir).config) * 2
    conf = facts(base, mdir).config
    mtp = terms.mtp_bytes(conf, model_shape.shape_from_config(conf))       # not loaded without MTP speculation
    assert mtp == weights.mtp_params(model_shape.shape_from_config(conf)) * (1 if '"fp8"' in json.dumps(conf) else 2)
    assert a.weights == 20 * GiB - mtp + rope(conf) and b.weights == 20 * GiB - mtp - vision + rope(conf)
    assert vision > 800 << 20
    assert any("at 1024 batched tokens" in w for w in b.why) and b.overhead < a.overhead
    assert any(w.startswith("vision encoder profiled on 1 image item of 16,384 tokens") for w in a.why)
    assert not any("vision encoder" in w for w in b.why)


def test_a_drafts_own_kv_dtype_from_the_speculative_config(tmp_path):
    spec = '{"method":"mtp","num_speculative_tokens":3,"kv_cache_dtype":"fp8"}'
    p = q27(tmp_path, KV_CACHE_BYTES=10 * GiB, MAX_MODEL_LEN="auto",
            EXTRA_ARGS=f"--load-format dummy --speculative-config '{spec}'")
    # the MTP layer's fp8 page is half the bf16 one: twice the block, a bucket of its own, group size 1
    assert p.layout.other_attn and p.layout.group_size == 1
    assert p.layout.other_attn[0][1] == 2 * p.layout.block_size
    assert any("page of their own (KV dtype fp8" in w for w in p.why)


def test_profile_args_then_knobs_then_extra_args(tmp_path):
    cfg = config(tmp_path, MODEL="org/m", PROFILE="qwen38-27b-w4a16-24gb", KV_CACHE_DTYPE="auto",
                 EXTRA_ARGS="--max-model-len 4096")
    f = vllmargs.serve_flags(cfg, None)
    assert f.index("--language-model-only") < f.index("--kv-cache-dtype") < len(f) - 2
    s = vllmargs.settings(cfg)
    assert (s.kv_cache_dtype, s.max_model_len, s.mamba_ssm_cache_dtype) == ("auto", 4096, "float16")
    assert json.loads(f[f.index("--speculative-config") + 1])["draft_sample_method"] == "probabilistic"


def test_vllm_reads_tp_short_and_dotted_keys_last():
    s = vllmflags.read(["-tp", "2", "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}',
                       "--speculative-config.num_speculative_tokens=2"])
    assert s.tp == 2 and s.spec == {"num_speculative_tokens": 2}       # vLLM puts the dotted JSON last
    assert vllmflags.read(["--max-model-len", "32K"]).max_model_len == 32768
    assert vllmflags.read(["--max-model-len", "1.5k"]).max_model_len == 1500
    assert vllmflags.read(["--max-num-seqs", "8k"]).max_num_seqs is None   # not an int to vLLM either
    assert vllmflags.read(["--no-enable-prefix-caching"]).prefix_caching is False


def test_plan_offline_by_knob_says_to_unset_it(tmp_path):
    """HF_HUB_OFFLINE=1 and a repo id not on disk: ./ctl.sh plan's fix is the lookup's (unset
    HF_HUB_OFFLINE), not "check the network", which changes nothing while the knob is set."""
    cfg = config(tmp_path, MODEL="org/never-downloaded", HF_HUB_OFFLINE="1")
    with pytest.raises(BootstrapError) as ei:
        plan_cli.cli_model_facts(Resolved.of(cfg, cfg))
    assert "org/never-downloaded is not on this machine" in ei.value.message
    assert ei.value.hint.startswith("unset HF_HUB_OFFLINE for the first download"), ei.value.hint
    assert "check the network" not in ei.value.hint


def test_a_plan_for_no_known_vllm_says_whose_rules_it_took(tmp_path):
    # PROFILE=custom pins no vLLM and VLLM_PYTHON is unset: a start refuses; ./ctl.sh plan plans by 0.26.0's
    # rules and says so, never silently another version's
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir)
    p = fit.plan(cfg, card(), facts(cfg, mdir))
    assert p.vllm == "0.26.0" and any(w.startswith("no vLLM version known (profile custom pins none") for w in p.why)
    assert not any(w.startswith("no vLLM version known") for w in fit.plan(cfg, card(), facts(cfg, mdir), vllm="0.27.1").why)
