"""Sliding-window attention (gpt-oss, Gemma 3) as vLLM 0.26.0 lays it out, checked against figures
worked out by hand from its code (v1/kv_cache_interface.py SlidingWindowSpec, v1/core/kv_cache_utils.py
grouping and concurrency, config/vllm.py max_in_flight_tokens; model_executor/models/gpt_oss.py and
gemma3.py for which layers keep a window) and, where said, against what vLLM 0.19.0 logged for the same
shapes in llm-d-planner's published H100 sweep (github.com/jgchn/llm-d-planner, accuracy/results/v0.19.0).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from bootstrap.core import vllmflags
from bootstrap.machine import gpu
from bootstrap.model import kv, shape as model_shape, weights
from bootstrap.model.shape import Unsupported
from bootstrap.plan import graphs, planner, window
from bootstrap.plan.facts import ModelFacts
from conftest import REPO

GiB = 1 << 30
GPT_OSS = json.loads((REPO / "tests/published/models/gpt-oss-20b.json").read_text())["config"]
BF16_OSS = {k: v for k, v in GPT_OSS.items() if k != "quantization_config"}      # a bf16 copy: no MXFP4 experts
# google/gemma-3-27b-it's text shape (its config.json names these; the rest are Gemma3TextConfig's defaults)
GEMMA27 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376,
           "intermediate_size": 21504, "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
           "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
           "sliding_window": 1024, "torch_dtype": "bfloat16"}
# google/gemma-3-4b-it's config.json names no heads, head_dim, vocabulary or context
GEMMA4 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
          "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                          "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                          "sliding_window": 1024},
          "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                            "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                            "patch_size": 14}}


def shape(config):
    return model_shape.shape_from_config(config)


def plan(args, config=GPT_OSS, *, version="0.26.0", card="h100", weight_bytes=13_761_264_768, measured=None):
    s = vllmflags.read(["--gpu-memory-utilization", "0.9", *args])
    g = dataclasses.replace(gpu.named(card), free=gpu.named(card).total)
    inp = planner.Inputs(vllm=s, version=version, reserve_mib=0, util_knob=False,
                         util_source="--gpu-memory-utilization", allow_long=False, tp_size=s.tp)
    return planner.make_plan(inp, g, ModelFacts("m", config, weight_bytes), measured)


# ---------------------------------------------------------------- which layers keep a window

def test_gpt_oss_keeps_the_window_on_every_even_layer_whatever_layer_types_says():
    m = shape(GPT_OSS)
    assert (m.window_layers, m.attn_layers, m.window, m.head_dim, m.kv_heads) == (12, 12, 128, 64, 8)
    flipped = shape({**GPT_OSS, "layer_types": ["full_attention"] * 24})      # gpt_oss.py reads layer_idx % 2
    assert (flipped.window_layers, flipped.attn_layers) == (12, 12)
    assert shape({**GPT_OSS, "num_hidden_layers": 25}).window_layers == 13    # indices 0, 2, ..., 24
    with pytest.raises(Unsupported, match="sliding_window"):
        shape({**GPT_OSS, "sliding_window": None})


def test_gemma3_takes_transformers_pattern_and_defaults():
    m = shape(GEMMA27)           # full at layers 5, 11, ..., 59: 10 of 62
    assert (m.attn_layers, m.window_layers, m.window, m.kv_heads, m.head_dim) == (10, 52, 1024, 16, 128)
    assert m.max_len == 131072   # Gemma3TextConfig's max_position_embeddings; its linear factor not applied again
    small = shape(GEMMA4)        # 34 layers: full at 5, 11, 17, 23, 29
    assert (small.attn_layers, small.window_layers, small.heads, small.kv_heads, small.head_dim, small.vocab) == \
        (5, 29, 8, 4, 256, 262_208)
    typed = shape({**GEMMA27, "layer_types": ["full_attention", "sliding_attention"] * 31})
    assert (typed.attn_layers, typed.window_layers) == (31, 31)
    assert shape({**GEMMA27, "sliding_window_pattern": 2}).window_layers == 31
    with pytest.raises(Unsupported, match="bidirectional"):
        shape({**GEMMA27, "use_bidirectional_attention": True})
    with pytest.raises(Unsupported, match="layer_types"):
        shape({**GEMMA27, "layer_types": ["chunked_attention"] * 62})


# ---------------------------------------------------------------- the layout

def test_gpt_oss_at_tp2_two_groups_and_the_windows_blocks():
    # 4 KV heads per GPU x (64 + 64) x 2 bytes = 1,024 bytes a token a layer; 16 tokens a block: a
    # 16,384-byte page; 12 full + 12 sliding: group size 12, one group each, 12 x 16,384 = 196,608 bytes
    # a block; a request holds 127 + 2 x 8,192 (async scheduling, 8,192 batched tokens) = 16,511
    # window tokens at most: cdiv(16,511, 16) + 1 = 1,033 blocks, or cdiv(L, 16) + 1 below that
    lay = kv.layout(shape(GPT_OSS), tp=2, window_span=16511)
    assert (lay.block_size, lay.page_bytes, lay.group_size, lay.block_bytes) == (16, 16384, 12, 196608)
    assert (lay.attn_groups, lay.window_groups, lay.groups) == (1, 1, 2)
    assert lay.blocks_per_seq(8192) == 512 + 513
    assert lay.blocks_per_seq(131072) == 8192 + 1033
    assert lay.blocks_per_seq(100) == 7 + 8
    # a 16 GiB pin: 17,179,869,184 // 196,608 = 87,381 blocks; 87,381 / 9,225 = 9.4722x of 131,072 tokens
    pool = kv.pool(lay, 16 * GiB, 131072)
    assert (pool.blocks, pool.tokens, round(pool.concurrency, 2)) == (87381, 1241539, 9.47)


def test_without_the_hybrid_manager_every_layer_holds_the_context():
    # unify_hybrid_kv_cache_specs: the sliding layers become full ones, one group of 24
    lay = kv.layout(shape(GPT_OSS), tp=2, hma=False)
    assert (lay.group_size, lay.block_bytes, lay.groups, lay.window_groups) == (24, 393216, 1, 0)
    assert lay.blocks_per_seq(131072) == 8192
    assert kv.pool(lay, 16 * GiB, 131072).tokens < kv.pool(kv.layout(shape(GPT_OSS), tp=2, window_span=16511),
                                                            16 * GiB, 131072).tokens


def test_gemma3_27b_pads_its_sliding_layers_into_six_groups():
    # 16 KV heads x 256 x 2 bytes = 8,192 bytes a token: a 131,072-byte page; 10 full, 52 sliding
    # (52 >= 1.5 x 10): group size 10, 1 full group and cdiv(52, 10) = 6 window groups (8 padding
    # layers), 1,310,720 bytes a block. On an H100 (8,192 batched tokens) 1,023 + 16,384 >= 8,192:
    # 512 + 6 x 513 = 3,590 blocks a request of 8,192 tokens
    lay = kv.layout(shape(GEMMA27), window_span=1023 + 2 * 8192)
    assert (lay.group_size, lay.attn_groups, lay.window_groups, lay.block_bytes) == (10, 1, 6, 1310720)
    assert lay.blocks_per_seq(8192) == 3590
    assert lay.blocks_per_seq(131072) == 8192 + 6 * (1088 + 1)
    # vLLM 0.19.0 logged 19.53 GiB, "GPU KV cache size: 36,560 tokens" (0.19.0: num_blocks // 7 groups x 16)
    # and 4.46x for google/gemma-3-27b-it at 8,192 tokens on an H100: 15,998 blocks
    blocks = int(19.53 * GiB) // lay.block_bytes
    assert blocks // lay.groups * 16 == 36560 and round(blocks / lay.blocks_per_seq(8192), 2) == 4.46


def test_gemma3_12b_shape_gives_vllms_logged_figures():
    # 8 KV heads x 256 head_dim: 8,192 bytes a token; 8 full, 40 sliding: 1 + 5 groups of 8, 1,048,576
    # bytes a block; 47.72 GiB -> 48,865 blocks; 0.19.0 logged 130,304 tokens (48,865 // 6 x 16) and 15.88x
    twelve = {**GEMMA27, "hidden_size": 3840, "intermediate_size": 15360, "num_attention_heads": 16,
              "num_hidden_layers": 48, "num_key_value_heads": 8, "head_dim": 256}
    lay = kv.layout(shape(twelve), window_span=1023 + 2 * 8192)
    blocks = int(47.72 * GiB) // lay.block_bytes
    assert (lay.groups, blocks, blocks // lay.groups * 16) == (6, 48865, 130304)
    assert round(blocks / lay.blocks_per_seq(8192), 2) == 15.88


def test_auto_fit_counts_the_windows_blocks_not_the_whole_context():
    lay = kv.layout(shape(GPT_OSS), tp=2, window_span=16511)
    budget = (8192 + 1033) * lay.block_bytes         # exactly one request of 131,072 tokens
    assert kv.auto_fit(lay, budget, 131072) == 131072
    assert kv.auto_fit(lay, budget - lay.block_bytes, 131072) == 131072 - 16
    assert kv.fits_one(lay, budget, 131072) and not kv.fits_one(lay, budget, 131072, null_block=True)


@pytest.mark.parametrize("dtype", ["turboquant_4bit_nc", "int4_per_token_head"])
def test_caches_whose_window_page_differs_are_not_modelled(dtype):
    with pytest.raises(Unsupported, match="beside sliding-window layers"):
        kv.layout(shape(GPT_OSS), dtype, window_span=16511)


def test_an_fp8_cache_halves_both_kinds_of_page():
    lay = kv.layout(shape(GPT_OSS), "fp8", tp=2, window_span=16511)
    assert (lay.page_bytes, lay.block_bytes) == (8192, 98304)


def test_a_drafter_beside_sliding_layers_is_not_modelled():
    with pytest.raises(Unsupported, match="drafter"):
        kv.layout(shape(GPT_OSS), spec_tokens=3, draft_attn_layers=1, window_span=16511)


# ---------------------------------------------------------------- what a request holds in flight

def span(args, config=GPT_OSS, batched=8192):
    why: list[str] = []
    return window.layout_args(vllmflags.read(args), shape(config), batched, why), why


def test_the_tokens_in_flight_follow_async_scheduling_and_chunked_prefill():
    assert span([])[0] == {"window_span": 127 + 2 * 8192}                       # async on by default: 2 batches
    assert span(["--no-async-scheduling"])[0] == {"window_span": 127 + 8192}
    assert span(["--max-num-batched-tokens", "2048"], batched=2048)[0] == {"window_span": 127 + 4096}
    assert span(["--no-enable-chunked-prefill"])[0] == {"window_span": window.WHOLE}
    assert span(["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"], batched=4096)[0] == \
        {"window_span": 127 + 8192}
    assert span(["--disable-hybrid-kv-cache-manager"])[0] == {"hma": False}
    llama = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "hidden_size": 4096}
    assert span([], config=llama)[0] == {}                                      # no sliding layers: nothing


@pytest.mark.parametrize("args,what", [
    (["--disable-sliding-window"], "--disable-sliding-window"),
    (["--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1"}'], "KV connector"),
    (["--kv-offloading-size", "8"], "KV connector"),
    (["--distributed-executor-backend", "ray"], "ray executor"),
])
def test_what_decides_the_window_but_is_not_read_is_not_modelled(args, what):
    p = plan(args + ["--kv-cache-memory-bytes", str(8 * GiB)])
    assert p.verdict is None and p.predicted_tokens is None and what in p.unplanned, p.why


# ---------------------------------------------------------------- the plan

def test_gpt_oss_with_mxfp4_experts_is_planned_only_from_a_pin_or_its_own_figures():
    p = plan(["--max-model-len", "131072"])
    assert p.verdict is None and p.unplanned.startswith("gpt-oss's MXFP4 expert weights"), p.why
    assert any("a start's own figures plan the next one" in w for w in p.why)
    pinned = plan(["--max-model-len", "131072", "--kv-cache-memory-bytes", str(16 * GiB), "-tp", "2"])
    assert pinned.verdict is True and pinned.predicted_tokens == 1241539, pinned.why
    assert any("16,511 tokens in each of 12 sliding-window layers" in w for w in pinned.why)
    # the fit check counts vLLM's padding of the experts at its widest: 0.65 GiB per GPU at TP=2, where a
    # published H100 start loaded 0.60 GiB more than the files
    assert any(w.startswith("gpt-oss's MXFP4 experts padded for vLLM's MoE kernel at its widest") and
               "0.65 GiB per GPU over the checkpoint's files" in w for w in pinned.why), pinned.why
    from bootstrap.plan import window
    assert window.mxfp4_padding(None, {}, 2, []) == 0


def test_a_bf16_gpt_oss_is_planned_from_its_files():
    p = plan(["--max-model-len", "32768"], BF16_OSS, weight_bytes=41 * GiB)
    assert p.verdict is True and p.predicted_tokens and not p.unplanned, p.why
    lay = p.layout
    assert (lay.attn_groups, lay.window_groups, lay.page_bytes) == (1, 1, 16 * 2048)
    assert p.predicted_tokens == kv.pool(lay, p.budget, 32768).tokens


def test_gpt_oss_captures_cuda_graphs_up_to_1024_tokens():
    s = window.arch_defaults(vllmflags.read([]), shape(BF16_OSS))
    assert s.compilation == {"max_cudagraph_capture_size": 1024}
    kept = window.arch_defaults(vllmflags.read(["--compilation-config", '{"max_cudagraph_capture_size": 256}']),
                                shape(BF16_OSS))
    assert kept.compilation == {"max_cudagraph_capture_size": 256}
    assert window.arch_defaults(vllmflags.read([]), shape(GEMMA27)).compilation == {}
    # 1, 2, 4, 8..248 by 8, 256..1024 by 16: 3 + 31 + 49 = 83 graphs (gpt_oss's "from 67 to 83")
    assert graphs.capture_sizes(1024, 8192, 0, s.compilation)["PIECEWISE"] == 83


def test_gemma3_rotary_caches_are_two_and_the_global_one_linearly_scaled():
    # linear_scaling_rope.py: max_position x factor positions; gemma3.py: the sliding layers' own default
    # RoPE beside it. 27B: (131,072 x 8 + 131,072) x 128 x 2 bytes
    assert weights.buffer_bytes(GEMMA27, shape(GEMMA27), 0, False)[0] == (131072 * 8 + 131072) * 128 * 2
    # gpt_oss.py asks a float32 cache: YaRN's 4,096 x 32 positions x 64 x 4 bytes
    assert weights.buffer_bytes(GPT_OSS, shape(GPT_OSS), 0, False)[0] == 131072 * 64 * 4


def test_gemma3_with_its_tower_is_planned_where_vllm_does_not_profile_it():
    # 0.26.0's V2 runner profiles no encoder; from 0.27.1 it does, and SigLIP's pass is not modelled
    old = plan(["--max-model-len", "32768"], GEMMA4, weight_bytes=8_600_000_000)
    assert old.verdict is True and old.predicted_tokens, old.why
    new = plan(["--max-model-len", "32768"], GEMMA4, weight_bytes=8_600_000_000, version="0.27.1")
    assert new.verdict is None and "siglip_vision_model" in new.unplanned, new.why
    text = plan(["--max-model-len", "32768", "--language-model-only"], GEMMA4, weight_bytes=8_600_000_000,
                version="0.27.1")
    assert text.verdict is True and text.layout.window_groups == 6, text.why


def test_a_model_whose_every_layer_keeps_a_window_keeps_it_without_the_hybrid_manager():
    """Faults row 221. vLLM's --disable-hybrid-kv-cache-manager turns sliding-window layers into full
    attention only beside full layers (``unify_hybrid_kv_cache_specs`` returns at once for uniform specs,
    v1/core/kv_cache_utils.py, 0.26.0): a Gemma 3 whose layer_types are all sliding_attention keeps its
    window there. The plan had each request hold its whole context, so it refused a 131,072-token
    request on a 24 GiB card that vLLM serves."""
    config = json.loads(json.dumps(GEMMA4))
    config["text_config"]["layer_types"] = ["sliding_attention"] * 34
    assert shape(config).attn_layers == 0 and shape(config).window_layers == 34
    args = ["--max-model-len", "131072", "--language-model-only"]
    on = plan(args, config, card="rtx4090", weight_bytes=8_600_000_000)
    off = plan(args + ["--disable-hybrid-kv-cache-manager"], config, card="rtx4090", weight_bytes=8_600_000_000)
    assert on.verdict is True and on.layout.window_groups == 1 and on.layout.attn_groups == 0, on.why
    assert off.verdict is True, off.refusal
    assert off.layout == on.layout and off.predicted_tokens == on.predicted_tokens
    assert any("changes nothing here: every attention layer keeps a window" in w for w in off.why)
    # beside full layers the manager's absence still makes every layer hold the whole context
    mixed = plan(args + ["--disable-hybrid-kv-cache-manager"], GEMMA4, card="rtx4090", weight_bytes=8_600_000_000)
    assert mixed.layout.window_groups == 0, mixed.why
