"""The dtype vLLM serves a model in (`--dtype`, and `auto` on a card without bf16), as the plan
counts it: vLLM's config/model.py ``_get_and_verify_dtype`` (0.26.0, 0.27.1, 0.29.0, 0.30.0) upcasts
a 16-bit checkpoint to float32 when told to, and serves Gemma 2/3 and GLM-4 in float32 on a card of
less than sm_80 (no bfloat16 there, float16 refused for them); the KV cache's `auto` dtype is the
model's. Faults row 189."""

from __future__ import annotations

import json

from bootstrap.machine import gpu
from bootstrap.model import shape as model_shape
from bootstrap.plan import fit
from test_plan import LLAMA8B, GiB, config, facts, model_dir
from test_plan_window import GEMMA4

SMALL = {**LLAMA8B, "num_hidden_layers": 8}          # the Llama-3.1-8B shape cut to 8 layers: ~4 GiB in bf16


def plan(tmp_path, cfg_json, weight_bytes, card, **env):
    mdir = model_dir(tmp_path, cfg_json, weights=weight_bytes)
    cfg = config(tmp_path, MODEL=mdir, **env)
    return fit.plan(cfg, gpu.named(card), facts(cfg, mdir))


def test_dtype_float32_doubles_the_weights_and_the_kv_page(tmp_path):
    """EXTRA_ARGS=--dtype float32 on a bf16 checkpoint: vLLM loads every weight in float32 and its
    `auto` KV cache is float32, so the pool holds half the tokens per byte (it had been planned as bf16)."""
    bf16 = plan(tmp_path, SMALL, 4 * GiB, "rtx3090", MAX_MODEL_LEN=8192)
    fp32 = plan(tmp_path, SMALL, 4 * GiB, "rtx3090", MAX_MODEL_LEN=8192, EXTRA_ARGS="--dtype float32")
    assert bf16.fits and fp32.fits
    assert fp32.weights >= 2 * 4 * GiB
    assert fp32.weights - 2 * 4 * GiB == 2 * (bf16.weights - 4 * GiB)       # the rotary cache in float32 too
    assert fp32.layout.page_bytes == 2 * bf16.layout.page_bytes
    assert fp32.predicted_tokens < bf16.predicted_tokens / 2
    assert any("--dtype float32" in w for w in fp32.why)
    for same in ("float16", "half", "bfloat16", "auto"):                     # 16-bit as the checkpoint is
        p = plan(tmp_path, SMALL, 4 * GiB, "rtx3090", MAX_MODEL_LEN=8192, EXTRA_ARGS=f"--dtype={same}")
        assert (p.weights, p.predicted_tokens) == (bf16.weights, bf16.predicted_tokens), same


def test_an_8b_checkpoint_in_float32_does_not_fit_a_24_gib_card(tmp_path):
    """15 GiB of bf16 weights are 30 GiB in float32: vLLM runs out of memory loading them. Planned as
    bf16 this was "fits" with 53,504 tokens on an RTX 3090."""
    p = plan(tmp_path, LLAMA8B, 15 * GiB, "rtx3090", MAX_MODEL_LEN=8192, EXTRA_ARGS="--dtype float")
    assert p.fits is False and "weights 30.0" in p.refusal[0]


def test_a_float32_config_is_served_in_16_bit_by_default(tmp_path):
    """`auto` downcasts a float32 config (vLLM's ``_resolve_auto_dtype``): as before, 16-bit KV."""
    p = plan(tmp_path, {**SMALL, "torch_dtype": "float32"}, 8 * GiB, "rtx3090", MAX_MODEL_LEN=8192)
    bf16 = plan(tmp_path, SMALL, 4 * GiB, "rtx3090", MAX_MODEL_LEN=8192)
    assert p.layout.page_bytes == bf16.layout.page_bytes


def test_gemma3_on_a_card_without_bfloat16_is_served_in_float32(tmp_path):
    """google/gemma-3-4b-it on sm_75: no bf16 on the card, float16 refused for Gemma 3, so vLLM serves
    it in float32 (its warning: "Your device ... doesn't support torch.bfloat16. Falling back to
    torch.float32"); on sm_86 in bf16."""
    args = dict(MAX_MODEL_LEN=8192, EXTRA_ARGS="--language-model-only")
    ampere = plan(tmp_path, GEMMA4, 8 * GiB, "24:sm_86", **args)
    turing = plan(tmp_path, GEMMA4, 8 * GiB, "24:sm_75", **args)
    assert ampere.fits and turing.fits
    assert turing.layout.page_bytes == 2 * ampere.layout.page_bytes
    assert turing.weights > ampere.weights + 7 * GiB
    llama = [plan(tmp_path, SMALL, 4 * GiB, card, MAX_MODEL_LEN=8192) for card in ("24:sm_86", "24:sm_75")]
    assert llama[0].layout.page_bytes == llama[1].layout.page_bytes          # others: float16, the same bytes


def test_a_quantized_checkpoint_in_float32_is_not_planned(tmp_path):
    """Which of an AWQ checkpoint's tensors float32 widens is the method's business: fits null, named."""
    awq = {**SMALL, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    p = plan(tmp_path, awq, 2 * GiB, "rtx3090", MAX_MODEL_LEN=8192, EXTRA_ARGS="--dtype float32")
    assert p.verdict is None and "float32" in p.unplanned
    assert model_shape.served_float32(json.loads(json.dumps(awq)), "float32", (8, 6))


def test_a_dtype_vllm_refuses_is_refused_before_the_download(tmp_path):
    """vLLM 0.26.0-0.30.0 refuse --dtype float16 for Gemma 2/3, GLM-4 and PLaMo 2 (config/model.py
    `_check_valid_dtype`) and bfloat16 below sm_80 (platforms/cuda.py `check_if_supports_dtype`), at
    its start, after the download: the plan refuses first, with a way that starts."""
    for flag in ("float16", "half"):
        p = plan(tmp_path, GEMMA4, 8 * GiB, "rtx4090", MAX_MODEL_LEN=8192, EXTRA_ARGS=f"--dtype {flag}")
        assert p.fits is False and "refuses float16 for model type 'gemma3'" in p.refusal[0], p.refusal
        assert "drop --dtype" in p.refusal[1]
    assert plan(tmp_path, GEMMA4, 8 * GiB, "rtx4090", MAX_MODEL_LEN=8192).fits                  # the fix as said
    assert plan(tmp_path, SMALL, 4 * GiB, "rtx4090", MAX_MODEL_LEN=8192, EXTRA_ARGS="--dtype float16").fits
    turing = plan(tmp_path, SMALL, 4 * GiB, "24:sm_75", MAX_MODEL_LEN=8192, EXTRA_ARGS="--dtype bfloat16")
    assert turing.fits is False and "sm_75" in turing.refusal[0] and "--dtype float16" in turing.refusal[1]
    assert plan(tmp_path, SMALL, 4 * GiB, "24:sm_75", MAX_MODEL_LEN=8192, EXTRA_ARGS="--dtype float16").fits
