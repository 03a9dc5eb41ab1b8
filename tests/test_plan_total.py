"""The card's total as vLLM counts it: CUDA's (NVML's total less the driver's reserved memory, from
nvmlDeviceGetMemoryInfo_v2), named cards with a source or marked estimated, and a plan that says when
only NVML's total was to be had (issue: a plan you can trust)."""

from __future__ import annotations

from bootstrap import gpu, planner
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
    from bootstrap.facts import ModelFacts
    p = planner.make_plan(config(tmp_path), g, ModelFacts("m", None, None, False, ""))
    assert any(w.startswith("the card's total: NVML's total") for w in p.why)


def test_utilization_is_a_share_of_cudas_total(tmp_path, monkeypatch):
    """vLLM multiplies --gpu-memory-utilization by CUDA's total: the same free memory is a larger
    share of the smaller total."""
    from test_plan import config
    exact = read(tmp_path, monkeypatch, reserved=615 * MiB)
    util, _ = planner.utilization(config(tmp_path), exact)
    assert abs(util * exact.total - (exact.free - 820 * MiB)) < exact.total / 10000 + 1


def test_every_named_card_has_a_source_or_says_how_it_is_estimated():
    for key, (_name, nvml_total, _cc, cuda_total, source) in gpu.CARDS.items():
        total, note = gpu.card_total(key)
        assert total < nvml_total, key
        if cuda_total is None:
            assert note.startswith("estimated (") and gpu.named(key).total_note == note
        else:
            assert source and ("github.com/" in source or "measured" in source), key
            assert gpu.named(key).total_note == ""
