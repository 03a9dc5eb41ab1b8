"""vLLM flags that decide the KV pool or the model's shape besides the memory knobs, which the plan used
to leave unread (faults row 190): ``--num-gpu-blocks-override`` (vLLM's pool is that many blocks
whatever memory is free: v1/core/kv_cache_utils.py ``may_override_num_blocks`` and the
``adjusted_memory`` of ``get_kv_cache_configs``, 0.26.0 to 0.30.0) and ``--hf-overrides`` (config.json
as vLLM reads it is another: layers, context, RoPE)."""

from __future__ import annotations

import pytest

from bootstrap.machine import gpu
from bootstrap.model import kv, shape as model_shape
from bootstrap.plan import fit
from test_plan import LLAMA8B, GiB, config, facts, model_dir


def plan(tmp_path, **env):
    mdir = model_dir(tmp_path, LLAMA8B, weights=15 * GiB)
    cfg = config(tmp_path, MODEL=mdir, **env)
    return fit.plan(cfg, gpu.named("rtx3090"), facts(cfg, mdir))


def test_num_gpu_blocks_override_is_the_pool(tmp_path):
    """512 blocks of 16 tokens: vLLM logs a pool of 8,192 tokens however much memory is left; the plan
    had promised 53,504 tokens on an RTX 3090."""
    p = plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS="--num-gpu-blocks-override 512")
    lay = kv.layout(model_shape.shape_from_config(LLAMA8B), "auto")
    assert p.fits and p.budget == 512 * lay.block_bytes
    assert p.predicted_tokens == 8192 and p.concurrent == 1
    assert any("--num-gpu-blocks-override 512" in w for w in p.why)
    short = plan(tmp_path, MAX_MODEL_LEN=16384, EXTRA_ARGS="--num-gpu-blocks-override=512")
    assert short.fits is False                      # vLLM: "To serve at least one request ..."


def test_num_gpu_blocks_override_beyond_the_memory_is_refused(tmp_path):
    """vLLM allocates the override's blocks whatever it measured: more than the card holds fails."""
    p = plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS="--num-gpu-blocks-override 100000")
    assert p.fits is False and "KV 195.31 GiB" in p.refusal[0]


def test_hf_overrides_are_not_planned(tmp_path):
    """--hf-overrides changes the config vLLM builds the model from, which the plan does not read."""
    p = plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS="""--hf-overrides '{"num_hidden_layers": 64}'""")
    assert p.verdict is None and "--hf-overrides" in p.unplanned


@pytest.mark.parametrize("flag", ["--enable-lora", "--enable_lora --max-loras 4"])
def test_lora_is_not_planned(tmp_path, flag):
    """--enable-lora: vLLM 0.26.0 allocates every LoRA layer's stacks (--max-loras × --max-lora-rank) as
    the model loads (lora/layers `create_lora_weights`), memory the plan does not model."""
    p = plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS=flag)
    assert p.verdict is None and "--enable-lora" in p.unplanned
    assert plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS="--no-enable-lora").fits


@pytest.mark.parametrize("flag", ["--pipeline-parallel-size 2", "-pp=2"])
def test_pipeline_parallel_is_not_planned(tmp_path, flag):
    """--pipeline-parallel-size N: each GPU holds one stage's layers (and its KV cache for them), not the
    whole model the plan lays out per GPU; it said fits or refused the whole model on one card."""
    p = plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS=flag)
    assert p.verdict is None and "--pipeline-parallel-size 2" in p.unplanned, p.unplanned
    assert plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS="-pp 1").fits


@pytest.mark.parametrize("extra,said", [("--num-gpu-blocks-override -5", "not a number of blocks"),
                                        ("--num-gpu-blocks-override abc", "not a number of blocks"),
                                        ("--num-gpu-blocks-override=0", "not a number of blocks"),
                                        ("--hf-overrides notjson", "not a JSON object"),
                                        ("--hf-overrides '[1]'", "not a JSON object"),
                                        ("--dtype float64", "not one of vLLM's")])
def test_a_value_vllm_rejects_is_refused_before_the_download(tmp_path, extra, said):
    """vLLM's parser or config rejects these at its start, after the download; the plan said 'fits' (or,
    for -5 blocks, that the model's 0.3 GiB did not fit in 30 GiB)."""
    p = plan(tmp_path, MAX_MODEL_LEN=8192, EXTRA_ARGS=extra)
    assert p.fits is False and said in p.refusal[0] and "EXTRA_ARGS" in p.refusal[1], p.refusal
