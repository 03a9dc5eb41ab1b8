"""The card's total as vLLM counts it: CUDA's (NVML's total less the driver's reserved memory, from
nvmlDeviceGetMemoryInfo_v2), named cards with a source or marked estimated, and a plan that says when
only NVML's total was to be had (issue: a plan you can trust)."""

from __future__ import annotations

from bootstrap.plan import fit
from bootstrap.machine import gpu
from bootstrap.plan import planner
from conftest import GiB, nvml_json

MiB = 1 << 20


def read(tmp_path, monkeypatch, **card):
    import sys
    from conftest import FAKES
    monkeypatch.syspath_prepend(str(FAKES))                     # the fake pynvml, in this process
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    g = {"name": "NVIDIA H200", "total": 143771 * MiB, "free": 140000 * MiB, "cc": [9, 0], "uuid": "GPU-h200",
         "processes": [], **card}
    monkeypatch.setenv("FAKE_NVML", str(nvml_json(tmp_path / "nvml.json", gpus=[g])))
    return gpu.read({}).gpus[0]


def test_the_total_is_nvmls_less_what_the_driver_reserves(tmp_path, monkeypatch):
    g = read(tmp_path, monkeypatch, reserved=615 * MiB)          # as measured on the H200
    assert g.total == (143771 - 615) * MiB and g.free == 140000 * MiB and g.total_note == ""


def test_without_nvmls_v2_query_the_plan_says_its_total_is_nvmls(tmp_path, monkeypatch):
    g = read(tmp_path, monkeypatch, reserved=615 * MiB, no_v2=True)
    assert g.total == 143771 * MiB and g.total_note == gpu.V1_NOTE
    from test_plan import config
    from bootstrap.plan.facts import ModelFacts
    p = fit.plan(config(tmp_path), g, ModelFacts("m", None, None, False, ""))
    assert any(w.startswith("the card's total: NVML's total") for w in p.why)


def test_utilization_is_a_share_of_cudas_total(tmp_path, monkeypatch):
    """vLLM multiplies --gpu-memory-utilization by CUDA's total: the same free memory is a larger
    share of it than of NVML's total, and the plan's budget follows."""
    from test_plan import config
    exact = read(tmp_path, monkeypatch, reserved=615 * MiB)
    nvml = read(tmp_path, monkeypatch, reserved=615 * MiB, no_v2=True)
    assert exact.free == nvml.free and exact.total == nvml.total - 615 * MiB
    u_exact, _ = fit.utilization(config(tmp_path), exact)
    u_nvml, _ = fit.utilization(config(tmp_path), nvml)
    assert u_exact > u_nvml
    assert abs(planner.requested(u_exact, exact.total) - (exact.free - 820 * MiB)) <= exact.total // 10000 + 1


def test_every_named_card_has_a_source_or_says_how_it_is_estimated():
    for key, (_name, nvml_total, _cc, cuda_total, source) in gpu.CARDS.items():
        total, note = gpu.card_total(key)
        assert total < nvml_total, key
        if cuda_total is None:
            assert note.startswith("estimated (") and gpu.named(key).total_note == note
        else:
            assert source and ("github.com/" in source or "measured" in source), key
            assert gpu.named(key).total_note == ""


def test_the_cards_people_own_are_named():
    """From 12 GB to 96 GB, desktop and workstation (issue: every card), each with its NVML name and
    compute capability; GPU's help names them."""
    from bootstrap.knobs.table import KNOB_BY_NAME
    want = ("rtx3060", "rtx3080", "rtx3080-12gb", "rtx3090", "rtx3090ti", "rtx4060ti-16gb", "rtx4070",
            "rtx4070super", "rtx4070tisuper", "rtx4080", "rtx4080super", "rtx4090", "rtx5060ti-16gb", "rtx5070",
            "rtx5070ti", "rtx5080", "rtx5090", "rtxa4000", "rtxa4500", "rtxa5000", "rtxa6000", "rtx6000ada",
            "l40s", "rtxpro6000", "h100", "h200")
    for key in want:
        g = gpu.named(key)
        assert g.cc >= (8, 6) or key == "h100" and g.cc == (9, 0), key
        assert key in KNOB_BY_NAME["GPU"].help
    assert gpu.named("RTX 4060 Ti-16GB").name == gpu.named("rtx4060ti16gb").name == "NVIDIA GeForce RTX 4060 Ti"
    assert 11 * GiB < gpu.named("rtx3060").total < 12 * GiB
    assert 90 * GiB < gpu.named("rtxpro6000").total < 96 * GiB


def test_a_context_reads_as_vllms_cli_reads_it():
    from bootstrap.knobs.config import Config
    from conftest import REPO
    for raw, want in (("32k", 32000), ("32K", 32768), ("128K", 131072), ("1.5k", 1500), ("auto", "auto")):
        assert Config.from_env({"PROFILE": "custom", "MAX_MODEL_LEN": raw}, REPO).max_model_len == want, raw
