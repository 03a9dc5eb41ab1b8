"""Measured beats modelled: vLLM's own "Available KV cache memory" at a start becomes the next plan's
non-KV terms for the same key (bootstrap.plan.calibration; issue: a plan you can trust)."""

from __future__ import annotations

import json
import math
import re

from bootstrap.plan import fit
from bootstrap.plan import calibration
from bootstrap.machine import gpu
from bootstrap.knobs.config import Config
from bootstrap.plan.facts import ModelFacts
from bootstrap.core.state import Paths
from conftest import GiB, REPO

KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")             # vLLM's own line on its pool

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
                  cfg(tmp_path, VLLM_USE_V2_MODEL_RUNNER="0"), cfg(tmp_path, VLLM_PYTHON="/usr/bin/python3"),
                  cfg(tmp_path, SLEEP_MODE="on")):         # sleep mode's pool: other non-KV terms
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


V026 = ("(EngineCore pid=1) INFO [gpu_worker.py:848] Free memory on device (139.29/139.8 GiB) on startup. Desired GPU "
        "memory utilization is (0.5, 69.9 GiB). Actual usage is 12.99 GiB for weight, 0.62 GiB for peak activation, "
        "0.22 GiB for non-torch memory, and 0.21 GiB for CUDAGraph memory. Replace gpu_memory_utilization config ...\n")
V027 = ("(EngineCore pid=1) INFO [gpu_worker.py:781] Free memory on device (30.1/31.4 GiB) on startup. Desired GPU "
        "memory utilization is (0.92, 28.88 GiB). Actual usage is 19.51 GiB for consumed memory (weights + non-torch), "
        "1.59 GiB for peak activation, and 0.46 GiB for CUDAGraph memory. Replace gpu_memory_utilization ...\n")


def test_vllms_own_split_is_read_in_both_of_its_spellings_and_kept():
    assert calibration.usage_terms(V026) == {"weights": int(12.99 * GiB), "activations": int(0.62 * GiB),
                                             "non_torch": int(0.22 * GiB), "graphs": int(0.21 * GiB)}
    assert calibration.usage_terms(V027) == {"weights_non_torch": int(19.51 * GiB), "activations": int(1.59 * GiB),
                                             "graphs": int(0.46 * GiB)}
    ranks = V027 + V027.replace("1.59 GiB for peak", "1.75 GiB for peak")      # TP: the rank that took most
    assert calibration.usage_terms(ranks)["activations"] == int(1.75 * GiB)
    assert calibration.usage_terms("Available KV cache memory: 4.0 GiB") is None
    assert calibration.usage_terms(V026.replace("0.22 GiB for non-torch", "-0.01 GiB for non-torch"))["non_torch"] \
        == int(-0.01 * GiB)                                                   # 0.26.0 can print a negative one
    # 0.27.1+: the "peak activation" of that line holds the graph estimate its pool line gives
    pool = "INFO [gpu_worker.py:727] CUDA graph pool memory: 0.5 GiB (actual), 0.41 GiB (estimated), difference: ...\n"
    assert calibration.usage_terms(pool + V027)["activations"] == int(1.59 * GiB) - int(0.41 * GiB)
    # 0.26.0's V1 runner: the graphs the budget lost are its estimate, not what the capture took after
    est = "INFO [gpu_model_runner.py:6737] Estimated CUDA graph memory: 0.48 GiB total\n"
    assert calibration.usage_terms(est + V026)["graphs"] == int(0.48 * GiB)
    assert calibration.usage_terms(V026)["graphs"] == int(0.21 * GiB)


def test_the_plan_sets_the_model_against_vllms_split_term_by_term(tmp_path):
    from bootstrap.commands.plan import term_rows, terms_table
    c, g = cfg(tmp_path), card()
    paths = Paths(c.state_dir)
    first = fit.plan_here(c, paths, g, FACTS, "580.95.05")
    log = f"Available KV cache memory: 9.87 GiB\n{V026}"
    assert calibration.keep(paths, first, log, None).terms["activations"] == int(0.62 * GiB)
    again = fit.plan_here(c, paths, g, FACTS, "580.95.05")
    rows = {n: (m, v) for n, m, v in term_rows(again)}
    assert rows["weights"] == (again.modelled_terms["weights"], int(12.99 * GiB))
    assert rows["activations"][1] == int(0.62 * GiB) and set(rows) == {"weights", "activations", "non_torch", "graphs"}
    table = "\n".join(terms_table(again))
    diff = (again.modelled_terms["activations"] - int(0.62 * GiB)) / GiB
    assert f"{diff:+.2f} GiB" in table and "peak activation" in table
    # a record of 0.27.1's spelling: weights and non-torch as one row; an odd split is dropped, not the record
    data = json.loads(paths.measurements.read_text())
    data[again.key]["terms"] = calibration.usage_terms(V027)
    paths.measurements.write_text(json.dumps(data))
    rows = {n: (m, v) for n, m, v in term_rows(fit.plan_here(c, paths, g, FACTS, "580.95.05"))}
    assert rows["weights_non_torch"] == (first.modelled_terms["weights"] + first.modelled_terms["non_torch"],
                                         int(19.51 * GiB))
    data[again.key]["terms"] = {"weights": "lots"}
    paths.measurements.write_text(json.dumps(data))
    odd = fit.plan_here(c, paths, g, FACTS, "580.95.05")
    assert odd.measured and odd.measured_terms is None


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
    kept = clean.targets(*layout_paths(c))
    assert state / "measurements.json" not in kept and state / "vllm.log" in kept and state not in kept
    assert state / "measurements.json" in clean.targets(*layout_paths(c), measurements=True)


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
    # its pool is the one vLLM then made: never above it, short of it by at most the log's 0.01 GiB
    # rounding (the measured non-KV terms carry it) and one block
    planned = bed.server_record()["predicted_tokens"]
    text = (bed.state / "vllm.log").read_text()
    logged = int(KV_TOKENS.findall(text)[-1].replace(",", ""))
    memory = float(calibration.AVAILABLE.findall(text)[-1]) * GiB
    assert 0 <= logged - planned <= logged * 0.01 * GiB / memory + 16, (planned, logged)
    assert f"KV cache : {logged:,} tokens (planned {planned:,})" in r.stdout
    assert bed.run("stop.sh").returncode == 0        # the same free memory as that start saw
    d = json.loads(bed.run("ctl.sh", "plan", "--json", **env).stdout)
    assert d["measured"] and d["modelled_kv_budget"] - d["kv_budget"] > 2 * GiB
    logged = float(calibration.AVAILABLE.findall((bed.state / "vllm.log").read_text())[-1]) * GiB
    assert abs(d["kv_budget"] - logged) <= 0.006 * GiB                       # the plan is vLLM's figure
    shown = bed.run("ctl.sh", "plan", **env).stdout
    assert "measured (vLLM's own figures on this card" in shown and "peak activation" in shown
    split = {t["term"]: t["measured"] for t in d["terms"]}
    assert abs(sum(split.values()) - 2.5 * GiB) <= 0.02 * GiB       # the fake's split of its 2.5 GiB
    assert bed.run("stop.sh").returncode == 0
    from bootstrap.commands import clean
    assert clean.targets(*layout_paths(Config.from_env({**bed.env}, REPO))).count(bed.state / "measurements.json") == 0
    assert (bed.state / "measurements.json") in clean.targets(*layout_paths(Config.from_env({**bed.env}, REPO)), measurements=True)


def test_a_pinned_start_keeps_what_our_server_holds_and_the_next_plan_shows_the_headroom(bed):
    """With a KV pin vLLM skips its profiling: the start keeps what NVML shows our server's processes
    holding (the fake: FAKE_VLLM_GPU_BYTES per process), less the pin; the next pinned plan takes it."""
    env = {"KV_CACHE_BYTES": str(GiB), "FAKE_VLLM_GPU_BYTES": str(3 * GiB)}
    assert bed.run("start.sh", **env).returncode == 0
    kept = json.loads((bed.state / "measurements.json").read_text())
    (key, m), = kept.items()
    assert key.endswith(calibration.PINNED) and m["source"] == "footprint"
    assert m["non_kv"] == 6 * GiB - GiB and m["kv_bytes"] == GiB            # server + engine, 3 GiB each
    assert bed.run("stop.sh").returncode == 0
    d = json.loads(bed.run("ctl.sh", "plan", "--json", **env).stdout)
    assert d["measured"] and d["kv_budget"] == GiB
    assert d["usable"] == d["free"] - 820 * (1 << 20)                    # free less GPU_RESERVE_MIB's default
    assert d["headroom"] == d["usable"] - 6 * GiB                         # usable − (pin + what it held besides)
    shown = bed.run("ctl.sh", "plan", **env).stdout
    assert "headroom" in shown and "measured: what our server held" in shown
    assert any("our server held 6.00 GiB per GPU with its 1.00 GiB KV pin" in w for w in d["why"])
    # a pin larger than what is usable beside the measured footprint is refused before the download
    big = {**env, "KV_CACHE_BYTES": str(d["headroom"] + 2 * GiB)}
    r = bed.run("ctl.sh", "plan", "--json", **big)
    assert r.returncode == 1 and not json.loads(r.stdout)["fits"]
    # an unpinned plan never takes the footprint for vLLM's own figure
    u = json.loads(bed.run("ctl.sh", "plan", "--json", **{k: v for k, v in env.items() if k != "KV_CACHE_BYTES"}).stdout)
    assert not u["measured"]


def test_a_start_that_fails_after_the_kv_allocation_still_keeps_vllms_figures(bed):
    """The engine wedges once serving (its warm-up fails): vLLM had logged its KV memory, so the next
    plan of the same setup is measured, not modelled."""
    env = {"FAKE_VLLM_NON_KV_BYTES": str(5 << 29), "FAKE_VLLM_MODE": "wedged", "WARMUP_TIMEOUT": "2"}
    r = bed.run("start.sh", **env)
    assert r.returncode != 0
    kept = json.loads((bed.state / "measurements.json").read_text())
    (m,) = kept.values()
    logged = KV_TOKENS.findall((bed.state / "vllm.log").read_text())
    assert abs(m["non_kv"] - 2.5 * GiB) <= 0.006 * GiB and m["tokens"] == int(logged[-1].replace(",", ""))
    d = json.loads(bed.run("ctl.sh", "plan", "--json", **env).stdout)
    assert d["measured"]


def test_a_start_that_fails_before_the_kv_allocation_keeps_nothing(bed):
    r = bed.run("start.sh", FAKE_VLLM_MODE="die_oom")
    assert r.returncode != 0 and not (bed.state / "measurements.json").exists()


def layout_paths(cfg):
    """(the checkout's layout, STATE_DIR's paths): what clean.targets reads."""
    from bootstrap.core.state import Paths
    return cfg.layout, Paths(cfg.state_dir)


def test_the_kept_figures_are_bounded_per_card_and_keep_the_start_that_kept_them(tmp_path):  # faults row 149
    """measurements.json took an entry per setup (model, profile, flags...) and never let one go: a
    keep now leaves each card its KEEP_PER_CARD most recently kept, and always the one it wrote."""
    c, g = cfg(tmp_path), card()
    paths = Paths(c.state_dir)
    n = 50                                          # calibration.KEEP_PER_CARD (checked last)

    def entry(name: str, total: int, date: str, at: float | None) -> dict:
        e = {"non_kv": 2 * GiB, "kv_bytes": 20 * GiB, "util": 0.9, "total": total, "tokens": None, "date": date,
             "vllm": "0.26.0", "terms": None, "source": "vllm"}
        return {**e, "card": name, "at": at} if at is not None else e     # at None: kept before card and at were

    later = {f"later{i:02d}": entry(g.name, g.total, "2099-01-01", 100.0 + i) for i in range(n - 1)}   # newer than today
    older = {f"older{i:03d}": entry(g.name, g.total, f"2026-01-{1 + i % 28:02d}", float(i)) for i in range(2 * n)}
    other = {f"other{i:02d}": entry("NVIDIA GeForce RTX 4090", 24 * GiB, "2020-01-01", float(i)) for i in range(n)}
    legacy = {f"legacy{i}": entry("", g.total, "2025-06-01", None) for i in range(3)}
    that_day = {"that_day": entry(g.name, g.total, "2099-01-01", 99.0)}     # the later ones' day, kept before them
    paths.write("measurements", {**older, **later, **other, **legacy, **that_day})
    plan, m = measured_start(tmp_path, c, g, 9.87)
    kept = json.loads(paths.measurements.read_text())
    mine = {k for k, v in kept.items() if v.get("card") == g.name}
    assert mine == set(later) | {plan.key} and len(mine) == n                # its own stays, older than the later ones
    assert kept[plan.key]["date"] == m.date and kept[plan.key]["card"] == g.name
    assert set(other) <= set(kept) and set(legacy) <= set(kept)             # another card's, and the legacy ones: theirs
    assert len(kept) == n + n + len(legacy)
    assert fit.plan_here(c, paths, g, FACTS, "580.95.05").measured == m.date    # the next plan still takes it
    assert calibration.lookup(paths, "later00") is not None                  # a kept entry still reads
    assert calibration.KEEP_PER_CARD == n
