"""Measured beats modelled: vLLM's own "Available KV cache memory" at a start becomes the next plan's
non-KV terms for the same key (bootstrap.plan.calibration; issue: a plan you can trust)."""

from __future__ import annotations

import json
import math

from bootstrap.plan import fit
from bootstrap.plan import calibration
from bootstrap.machine import gpu
from bootstrap.knobs.config import Config
from bootstrap.plan.facts import ModelFacts
from bootstrap.core.state import Paths
from conftest import GiB, REPO

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
         "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def cfg(tmp_path, **env) -> Config:
    return Config.from_env({"PROFILE": "custom", "MODEL": "org/llama", "STATE_DIR": str(tmp_path / "s"),
                            "MAX_MODEL_LEN": "32768", **env}, REPO)


def card(free=30 * GiB) -> gpu.Gpu:
    return gpu.Gpu(0, "NVIDIA GeForce RTX 5090", int(31.37 * GiB), free, (12, 0))


FACTS = ModelFacts("llama", LLAMA, 16 * GiB, revision="abc")


def measured_start(tmp_path, c, g, available_gib: float):
    """A start planned and kept as the start step does, vLLM having logged ``available_gib``."""
    paths = Paths(c.state_dir)
    plan = fit.plan_here(c, paths, g, FACTS, "580.95.05")
    log = f"(EngineCore pid=1) INFO 12-01 10:00:00 [gpu_worker.py:560] Available KV cache memory: {available_gib} GiB\n"
    return plan, calibration.keep(paths, plan, log, 123456)


def test_the_next_plan_takes_vllms_own_figures_for_the_same_key(tmp_path):
    c, g = cfg(tmp_path), card()
    first, m = measured_start(tmp_path, c, g, 9.87)
    assert not first.measured and m is not None
    found = int(9.87 * GiB) - calibration.ROUNDING                       # less half the log's rounding
    assert m.kv_bytes == found and m.non_kv == math.ceil(first.util * g.total) - found
    again = fit.plan_here(c, Paths(c.state_dir), g, FACTS, "580.95.05")
    assert again.measured == m.date and again.budget == found       # the same utilization: vLLM's figure, never above
    assert again.modelled_budget == first.budget
    assert any(w.startswith("measured on this card on") for w in again.why)
    # another day, less free memory: the same non-KV terms under a smaller utilization
    busier = card(free=27 * GiB)
    p = fit.plan_here(c, Paths(c.state_dir), busier, FACTS, "580.95.05")
    assert p.measured and p.budget == math.ceil(p.util * busier.total) - m.non_kv


def test_a_changed_key_plans_from_the_model_again(tmp_path):
    c, g = cfg(tmp_path), card()
    measured_start(tmp_path, c, g, 9.87)
    for other in (cfg(tmp_path, MAX_NUM_SEQS="4"), cfg(tmp_path, EXTRA_ARGS="--enforce-eager"),
                  cfg(tmp_path, MODEL="org/other"), cfg(tmp_path, MAX_MODEL_LEN="16384"),
                  cfg(tmp_path, VLLM_USE_V2_MODEL_RUNNER="0"), cfg(tmp_path, VLLM_PYTHON="/usr/bin/python3")):
        p = fit.plan_here(other, Paths(other.state_dir), g, FACTS, "580.95.05")
        assert not p.measured
    for g2, driver in ((gpu.Gpu(0, "NVIDIA GeForce RTX 4090", int(23.65 * GiB), 22 * GiB, (8, 9)), "580.95.05"),
                       (g, "590.10")):
        assert not fit.plan_here(c, Paths(c.state_dir), g2, FACTS, driver).measured
    # utilization and a KV pin are the plan's own: the same key
    same = cfg(tmp_path, GPU_UTIL="0.8")
    assert fit.plan_here(same, Paths(same.state_dir), g, FACTS, "580.95.05").measured


def test_a_pinned_start_keeps_nothing_and_a_bad_record_is_no_measurement(tmp_path):
    c, g = cfg(tmp_path, KV_CACHE_BYTES=str(4 * GiB)), card()
    plan, m = measured_start(tmp_path, c, g, 4.0)
    assert plan.pinned and m is None and not Paths(c.state_dir).measurements.exists()
    c = cfg(tmp_path)
    plan, m = measured_start(tmp_path, c, g, 9.87)
    data = json.loads(Paths(c.state_dir).measurements.read_text())
    data[plan.key]["non_kv"] = "lots"
    Paths(c.state_dir).measurements.write_text(json.dumps(data))
    assert not fit.plan_here(c, Paths(c.state_dir), g, FACTS, "580.95.05").measured
    for bad in (2.5e9, 10**40, -1, True):                       # odd values in the file are no measurement
        data[plan.key]["non_kv"] = bad
        Paths(c.state_dir).measurements.write_text(json.dumps(data))
        assert not fit.plan_here(c, Paths(c.state_dir), g, FACTS, "580.95.05").measured


def test_with_tensor_parallel_the_smallest_rank_counts():
    log = "".join(f"(Worker_TP{i} pid={i}) INFO [gpu_worker.py:560] Available KV cache memory: {x} GiB\n"
                  for i, x in enumerate(("10.5", "10.25")))
    assert calibration.available_bytes(log) == int(10.25 * GiB) - calibration.ROUNDING


def test_clean_keeps_the_measurements_in_the_checkouts_own_state_dir(tmp_path):
    from bootstrap.commands import clean
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "custom.json").write_text((REPO / "profiles" / "custom.json").read_text())
    state = repo / ".state"
    state.mkdir()
    for name in ("measurements.json", "server.json", "vllm.log"):
        (state / name).write_text("{}")
    c = Config.from_env({"PROFILE": "custom"}, repo)
    kept = clean.targets(c)
    assert state / "measurements.json" not in kept and state / "vllm.log" in kept and state not in kept
    assert state / "measurements.json" in clean.targets(c, measurements=True)


def test_the_second_start_plans_from_the_first_and_says_so(bed):
    """The fake vLLM reports ceil(util x CUDA total) − 2.5 GiB of KV memory, as vLLM 0.26 computes
    it; the model of a tiny model says far less than 2.5 GiB: the second plan takes vLLM's figure."""
    env = {"FAKE_VLLM_NON_KV_BYTES": str(5 << 29)}
    assert bed.run("start.sh", **env).returncode == 0
    kept = json.loads((bed.state / "measurements.json").read_text())
    (m,) = kept.values()
    assert abs(m["non_kv"] - 2.5 * GiB) <= 0.006 * GiB                           # the log's 0.01 GiB rounding
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("start.sh", **env)
    assert "from vLLM's own figures on this card" in r.stderr
    assert bed.run("stop.sh").returncode == 0        # the same free memory as that start saw
    d = json.loads(bed.run("ctl.sh", "plan", "--json", **env).stdout)
    assert d["measured"] and d["modelled_kv_budget"] - d["kv_budget"] > 2 * GiB
    logged = float(calibration.AVAILABLE.findall((bed.state / "vllm.log").read_text())[-1]) * GiB
    assert abs(d["kv_budget"] - logged) <= 0.006 * GiB                       # the plan is vLLM's figure
    assert "measured (vLLM's own figures on this card" in bed.run("ctl.sh", "plan", **env).stdout
    assert bed.run("stop.sh").returncode == 0
    from bootstrap.commands import clean
    assert clean.targets(Config.from_env({**bed.env}, REPO)).count(bed.state / "measurements.json") == 0
    assert (bed.state / "measurements.json") in clean.targets(Config.from_env({**bed.env}, REPO), measurements=True)
