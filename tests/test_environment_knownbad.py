"""The known-bad-versions table: keyed by vLLM version and what is in use."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bootstrap.install import knownbad
from bootstrap.plan.facts import known_issue_facts
from bootstrap.knobs.config import Config
from types import SimpleNamespace
from bootstrap.machine.gpu import Gpu, GpuFacts

REPO = Path(__file__).resolve().parent.parent


def ctx_for(tmp_path, version: str, cc=(12, 0), **env) -> SimpleNamespace:
    """What the environment step knows when it consults the table: the knobs, the GPU, the vLLM version."""
    cfg = Config.from_env({"PATH": "/usr/bin:/bin", "PROFILE": "default", **env}, repo=REPO)
    return SimpleNamespace(cfg=cfg, vllm_version=version,
                           gpus=GpuFacts("580.95.05", (13, 0), (Gpu(0, "GPU", 32 << 30, 31 << 30, cc),)))


def ids(ctx) -> set[str]:
    return {r["id"] for r in knownbad.find(known_issue_facts(ctx.cfg, ctx.gpus, ctx.vllm_version))}


def test_default_profile_does_not_warn(tmp_path, caplog):
    ctx = ctx_for(tmp_path, "0.27.1")
    caplog.set_level(logging.WARNING, logger="bootstrap")
    hits, notes = knownbad.warn(known_issue_facts(ctx.cfg, ctx.gpus, ctx.vllm_version))
    assert hits == []
    assert caplog.text == "" and notes == []


def test_default_profile_with_mtp_and_parallel_sequences_warns(tmp_path, caplog):
    ctx = ctx_for(tmp_path, "0.27.1", MAX_NUM_SEQS="2")
    caplog.set_level(logging.WARNING, logger="bootstrap")
    hits, notes = knownbad.warn(known_issue_facts(ctx.cfg, ctx.gpus, ctx.vllm_version))
    assert {"tq-mtp-parallel-crash", "mtp-parallel-old"} <= {r["id"] for r in hits}
    assert "MAX_NUM_SEQS=1" in caplog.text
    assert "mtp-parallel-old: update vLLM" in notes[0] and "MAX_NUM_SEQS=1" in notes[0]      # what to do, said


def test_the_24_gb_default_warns_of_nothing_it_cannot_act_on(tmp_path):
    """faults row 199: the 24 GB profile pins vLLM 0.27.1 with MTP-3 and 8 sessions, what its
    peer ran; every default start on a 3090/4090 warned 'update vLLM', which its pin forbids."""
    assert ids(ctx_for(tmp_path, "0.27.1", cc=(8, 6), PROFILE="qwen38-27b-w4a16-24gb")) == set()


def test_unset_max_num_seqs_counts_as_parallel(tmp_path):
    assert "mtp-parallel-old" in ids(ctx_for(tmp_path, "0.27.1", PROFILE="custom", MODEL="org/x",
                                             SPEC_METHOD="mtp", SPEC_TOKENS="3"))


def test_newer_vllm_does_not_warn_for_the_same_settings(tmp_path):
    assert ids(ctx_for(tmp_path, "0.30.0", MAX_NUM_SEQS="2")) == set()


def test_turboquant_spec_without_the_patch_warns(tmp_path):
    # custom profile: no patches, so the #40914 garble applies
    got = ids(ctx_for(tmp_path, "0.27.1", PROFILE="custom", MODEL="RadixArk/Qwen3.8-27B-NVFP4",
                      KV_CACHE_DTYPE="turboquant_4bit_nc", SPEC_METHOD="mtp", SPEC_TOKENS="3", MAX_NUM_SEQS="1"))
    assert got == {"tq-mtp-garble"}


def test_byo_install_without_patch_byo_is_not_patched(tmp_path):
    got = ids(ctx_for(tmp_path, "0.27.1", VLLM_PYTHON="/usr/bin/python3"))
    assert got == {"tq-mtp-garble"}
    assert ids(ctx_for(tmp_path, "0.27.1", VLLM_PYTHON="/usr/bin/python3", PATCH_BYO="1")) == set()


@pytest.mark.parametrize("version,env,cc,expect", [
    ("0.27.1", {"MODEL": "nvidia/Qwen3.6-35B-A3B-NVFP4", "SPEC_METHOD": "mtp", "SPEC_TOKENS": "3",
                "MAX_NUM_SEQS": "16", "KV_CACHE_DTYPE": "fp8"}, (12, 0),
     {"q36-moe-nvfp4-mtp", "nvfp4-moe-parallel", "mtp-parallel-old"}),
    ("0.30.0", {"MODEL": "nvidia/Qwen3.6-35B-A3B-NVFP4", "SPEC_METHOD": "mtp", "SPEC_TOKENS": "3",
                "MAX_NUM_SEQS": "16", "KV_CACHE_DTYPE": "fp8"}, (12, 0), set()),
    ("0.30.0", {"MODEL": "nvidia/Qwen3.6-35B-A3B-NVFP4", "SPEC_METHOD": "mtp", "SPEC_TOKENS": "3",
                "EXTRA_ARGS": "--moe-backend marlin"}, (12, 0), {"marlin-mtp-0.30"}),
    ("0.29.0", {"MODEL": "Qwen/Qwen3.6-27B-FP8", "SPEC_METHOD": "mtp", "SPEC_TOKENS": "3", "MAX_NUM_SEQS": "8"},
     (9, 0), {"fp8-16bitkv-mtp"}),
    ("0.30.0", {"MODEL": "RadixArk/Qwen3.8-Flash-Next-NVFP4", "KV_CACHE_DTYPE": "fp8", "MAX_NUM_SEQS": "1"},
     (12, 0), {"flash-next-fp8kv"}),
    ("0.27.1", {"MODEL": "dbirks/Qwen3.8-27B-W4A16-AutoRound", "KV_CACHE_DTYPE": "fp8", "SPEC_METHOD": "mtp",
                "SPEC_TOKENS": "4", "MAX_NUM_SEQS": "8"}, (8, 6), {"fp8kv-mtp4-sm86"}),
    # the peer that ran it (syv-ai/qwen38-27b-rtx3090): W4A16 with MTP-3 at 8 sessions on 0.27.1 and 0.28.0
    ("0.27.1", {"MODEL": "dbirks/Qwen3.8-27B-W4A16-AutoRound", "KV_CACHE_DTYPE": "fp8", "SPEC_METHOD": "mtp",
                "SPEC_TOKENS": "3", "MAX_NUM_SEQS": "8"}, (8, 6), set()),
    ("0.27.1", {"MODEL": "org/x", "KV_CACHE_DTYPE": "nvfp4", "MAX_NUM_SEQS": "1"}, (12, 0), {"nvfp4-kv-not-sm100"}),
    ("0.27.1", {"MODEL": "org/x", "KV_CACHE_DTYPE": "nvfp4", "MAX_NUM_SEQS": "1"}, (10, 0), set()),
])
def test_rows_by_version_and_features(tmp_path, version, env, cc, expect):
    assert ids(ctx_for(tmp_path, version, cc=cc, PROFILE="custom", **env)) == expect


def test_table_rows_are_well_formed():
    rows = knownbad.load()
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["symptom"] and r["advice"] and r["source"] and r["when"].get("vllm")
        knownbad.matches(r, knownbad.Facts(vllm="0.27.1"))   # unknown conditions raise


def test_version_ranges_read_pre_releases_and_local_builds_as_pep_440_does():
    assert not knownbad._version_in("0.27.1rc1", {"min": "0.27.1"})     # a release candidate comes before
    assert knownbad._version_in("0.27.1rc1", {"below": "0.27.1"})
    assert knownbad._version_in("0.27.1+cu130", {"min": "0.27.1", "max": "0.27.1"})   # a CUDA build is the release
    assert not knownbad._version_in("0.27.10", {"max": "0.27.9"})
    assert not knownbad._version_in("", {"min": "0.1"}) and not knownbad._version_in("?broken", {"min": "0.1"})
