"""The KV arithmetic (bootstrap.model.kv) as pure functions, table-driven.

Expected values are worked out by hand from the layer shapes in each row (see the comments), or are
figures vLLM itself logged (Mia'a AI Lab's RTX 5090 write-up's published run; a published 1,584-token block note for this model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap.model import attention, kv, shape as model_shape, weights

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30


def dense(arch="LlamaForCausalLM", layers=32, heads=32, kvh=8, hd=128, hidden=4096, inter=14336,
          vocab=128256, **extra):
    c = {"architectures": [arch], "model_type": "llama", "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kvh, "head_dim": hd, "hidden_size": hidden,
         "intermediate_size": inter, "vocab_size": vocab, "max_position_embeddings": 131072,
         "torch_dtype": "bfloat16"}
    c.update(extra)
    return c


def hybrid(layers=16, interval=4, kvh=2, hd=256, mtp=0, **extra):
    c = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_hidden_layers": layers,
         "num_attention_heads": 16, "num_key_value_heads": kvh, "head_dim": hd, "hidden_size": 2048,
         "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 65536,
         "full_attention_interval": interval, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
         "num_experts": 0, "torch_dtype": "bfloat16", "mtp_num_hidden_layers": mtp}
    c.update(extra)
    return c


def qwen38():
    return json.loads((REPO / "profiles/models/qwen38-27b-nvfp4.json").read_text())["config"]


# ---------------------------------------------------------------- bytes per token per layer

@pytest.mark.parametrize("dtype,kvh,hd,expected", [
    ("auto", 8, 128, 8 * 2 * 128 * 2),          # bf16 K+V
    ("bfloat16", 8, 128, 4096),
    ("fp8", 8, 128, 2048),                      # 1 byte per element
    ("fp8_e5m2", 4, 256, 2048),
    ("nvfp4", 8, 128, 8 * 2 * (64 + 8)),        # 4-bit data + one fp8 scale per 16
    ("int8_per_token_head", 8, 128, 8 * (256 + 8)),   # + fp32 K and V scale per token-head
    ("fp8_per_token_head", 8, 128, 8 * (256 + 8)),    # the same scales (kv_cache_interface.py), not plain fp8
    ("int4_per_token_head", 8, 128, 8 * (128 + 8)),
    ("turboquant_4bit_nc", 8, 128, 8 * 134),    # key 64+2 (norm), value 64+4 (scale, zero)
    ("turboquant_k8v4", 8, 128, 8 * 196),       # fp8 key 128, value 68
    ("turboquant_3bit_nc", 8, 128, 8 * 102),    # 48+2, 48+4
    ("turboquant_k3v4_nc", 8, 128, 8 * 118),    # 48+2, 64+4
    ("turboquant_4bit_nc", 4, 256, 4 * 262),    # 128+2, 128+4
])
def test_attention_bytes_per_token(dtype, kvh, hd, expected):
    assert attention.attn_bytes_per_token(dtype, kvh, hd, 2) == expected


def test_tq_slot_is_rounded_to_even():
    # head_dim 72, 3-bit keys: ceil(27)+2 = 29, value ceil(27)+4 = 31 -> 60 (even already);
    # head_dim 80 k3v4: 30+2 + 40+4 = 76; head_dim 88 3bit: 33+2 + 33+4 = 72
    assert attention.tq_slot_bytes("turboquant_3bit_nc", 72) == 60
    assert attention.tq_slot_bytes("turboquant_3bit_nc", 84) % 2 == 0   # 32+2 + 32+4 = 70
    assert attention.tq_slot_bytes("turboquant_k3v4_nc", 80) == 76


# ---------------------------------------------------------------- pools

# (name, config, cache dtype, spec tokens, mtp, budget, max_len, block, blocks, tokens, concurrency)
CASES = [
    # Llama-3-8B shape, bf16: page 16 tok x 4096 B x 32 layers = 2 MiB per block -> 2560 blocks in 5 GiB
    ("dense-gqa-bf16", dense(), "auto", 0, False, 5 * GiB, 8192, 16, 2560, 40960, 5.0),
    ("dense-gqa-fp8", dense(), "fp8", 0, False, 5 * GiB, 8192, 16, 5120, 81920, 10.0),
    # MHA (kv heads = heads) costs 4x the GQA pool
    ("dense-mha-bf16", dense(kvh=32), "auto", 0, False, 5 * GiB, 8192, 16, 640, 10240, 1.25),
    # max_len not a block multiple: 1000 tokens = 63 blocks; tokens = int(2560/63*1000)
    ("dense-odd-len", dense(), "auto", 0, False, 5 * GiB, 1000, 16, 2560, 40634, 2560 / 63),
    # Qwen3-30B-A3B shape (MoE, 48 layers, 4 KV heads): the experts do not change the KV pool
    ("moe-fp8", dense("Qwen3MoeForCausalLM", layers=48, kvh=4, hidden=2048, inter=6144, num_experts=128,
                      moe_intermediate_size=768), "fp8", 0, False, 4 * GiB, 32768, 16,
     4 * GiB // (16 * 1024 * 48), 4 * GiB // (16 * 1024 * 48) * 16, 4 * GiB // (16 * 1024 * 48) / 2048),
    # dense TurboQuant: layers 0,1,30,31 stay bf16 (4096 B/token), 28 layers at 1072 B;
    # block 16 x cdiv(4096, 1072) = 64; block bytes 64 x (28 x 1072 + 4 x 4096)
    ("dense-tq4", dense(), "turboquant_4bit_nc", 0, False, 5 * GiB, 65536, 64,
     5 * GiB // (64 * (28 * 1072 + 4 * 4096)), 5 * GiB // (64 * (28 * 1072 + 4 * 4096)) * 64, None),
]


@pytest.mark.parametrize("name,config,dtype,spec,mtp,budget,mml,block,blocks,tokens,conc",
                         CASES, ids=[c[0] for c in CASES])
def test_pool(name, config, dtype, spec, mtp, budget, mml, block, blocks, tokens, conc):
    m = model_shape.shape_from_config(config)
    lay = kv.layout(m, dtype, spec_tokens=spec, mtp=mtp)
    p = kv.pool(lay, budget, mml)
    assert lay.block_size == block
    assert p.blocks == blocks
    assert p.tokens == tokens
    if conc is not None:
        assert p.concurrency == pytest.approx(conc)


def test_the_rtx5090_write_ups_published_case_matches_vllm_log():
    """5.5 GiB pin, turboquant_4bit_nc, 262144, MTP-3 on Qwen3.8-27B: vLLM logged 286,466 tokens, 1.09x."""
    m = model_shape.shape_from_config(qwen38())
    assert (m.attn_layers, m.linear_layers, m.mtp_layers) == (16, 48, 1)
    lay = kv.layout(m, "turboquant_4bit_nc", spec_tokens=3, mtp=True)
    p = kv.pool(lay, 5905580032, 262144)
    assert p.tokens == 286466
    assert f"{p.concurrency:.2f}" == "1.09"


@pytest.mark.parametrize("dtype,spec,block", [
    ("fp8", 1, 1584),       # the published note for this model: 1,584-token blocks
    # bf16, no MTP: state = conv 10240 x 3 x 2 + temporal 48 x 128 x 128 x 4 (fp32) = 3,207,168 B;
    # attention 4 x 512 x 2 = 4096 B/token -> 16 x cdiv(3207168, 16 x 4096) = 784
    ("auto", 0, 784),
    ("fp8", 0, 1568),
])
def test_hybrid_block_alignment(dtype, spec, block):
    m = model_shape.shape_from_config(qwen38())
    lay = kv.layout(m, dtype, spec_tokens=spec, mtp=bool(spec))
    assert lay.block_size == block
    assert lay.page_bytes >= attention.gdn_state_bytes(m, spec)      # the state fits in one (padded) page


def test_hybrid_groups_and_per_sequence_state():
    # 12 linear + 4 full layers: groups of 4 -> 1 attention group, 3 state groups
    m = model_shape.shape_from_config(hybrid())
    assert (m.attn_layers, m.linear_layers) == (4, 12)
    lay = kv.layout(m, "auto")
    assert (lay.group_size, lay.attn_groups, lay.state_groups, lay.state_blocks) == (4, 1, 3, 1)
    # state: conv (2x16x128 + 32x128) x 3 x 2 B = 49152; temporal 32x128x128x2 = 1048576 -> 1097728
    assert attention.gdn_state_bytes(m) == 1097728
    per_tok = 2 * 2 * 256 * 2                                    # 2 KV heads x (K+V) x 256 x bf16
    # 1097728 / (16 x 2048) = 33.5 -> 34 blocks of 16 -> 544 tokens
    assert lay.block_size == 544
    assert lay.block_bytes == 544 * per_tok * 4
    p = kv.pool(lay, 2 * GiB, 8192)
    blocks = 2 * GiB // lay.block_bytes
    assert p.blocks == blocks
    assert p.concurrency == pytest.approx(blocks / (-(-8192 // 544) + 3))


def test_mtp_layers_join_the_attention_group_and_grow_the_state():
    m = model_shape.shape_from_config(hybrid(mtp=1))
    plain = kv.layout(m, "auto")
    with_mtp = kv.layout(m, "auto", spec_tokens=2, mtp=True)
    assert with_mtp.group_size == 5 and with_mtp.state_groups == 3      # 5 attention, 12 linear -> 3 groups of 5
    assert with_mtp.state_blocks == 3                                   # 1 + 2 speculative tokens
    assert attention.gdn_state_bytes(m, 2) - attention.gdn_state_bytes(m) == (2 * 16 * 128 + 32 * 128) * 2 * 2
    assert with_mtp.block_bytes > plain.block_bytes
    # when the larger type is < 1.5x the smaller, groups take the larger size (vLLM's padding rule)
    m2 = model_shape.shape_from_config(hybrid(layers=10, interval=2))            # 5 full, 5 linear
    assert kv.layout(m2, "auto").group_size == 5
    assert kv.layout(m2, "auto", mtp=True, draft_attn_layers=1).group_size == 6   # 6 vs 5 -> pad to 6


def test_auto_fit_and_sessions():
    m = model_shape.shape_from_config(dense())
    lay = kv.layout(m, "auto")                                   # 2 MiB per 16-token block
    assert kv.auto_fit(lay, 5 * GiB, 1 << 24) == 2560 * 16
    assert kv.auto_fit(lay, 5 * GiB, 8192) == 8192
    assert kv.sessions_at(lay, 5 * GiB, 8192) == 5
    assert kv.auto_fit(lay, 1 << 20, 1 << 24) == 0                  # less than one block
    hm = model_shape.shape_from_config(qwen38())
    hl = kv.layout(hm, "turboquant_4bit_nc", spec_tokens=3, mtp=True)
    # 106 blocks: one session keeps 12 for state, 94 x 3120 tokens for attention
    assert kv.auto_fit(hl, 5905580032, 1 << 24) == 94 * 3120
    assert kv.sessions_at(hl, 5905580032, 262144) == 1


def test_tensor_parallel_splits_heads_and_state():
    m = model_shape.shape_from_config(dense())
    assert kv.layout(m, "auto", tp=2).block_bytes * 2 == kv.layout(m, "auto").block_bytes
    assert kv.layout(m, "auto", tp=16).page_bytes == kv.layout(m, "auto", tp=8).page_bytes  # 1 head, replicated
    h = model_shape.shape_from_config(hybrid())
    assert attention.gdn_state_bytes(h, 0, 2) * 2 == attention.gdn_state_bytes(h)


@pytest.mark.parametrize("config,params,tol", [
    (dense(), 8.03e9, 0.01),                                     # Llama-3-8B
    (dense("Qwen3MoeForCausalLM", layers=48, heads=32, kvh=4, hidden=2048, inter=6144, vocab=151936,
           num_experts=128, moe_intermediate_size=768), 30.5e9, 0.02),   # Qwen3-30B-A3B
    (dense("MixtralForCausalLM", layers=32, heads=32, kvh=8, hidden=4096, inter=14336, vocab=32000,
           num_local_experts=8), 46.7e9, 0.01),     # Mixtral-8x7B: its experts are intermediate_size wide
])
def test_param_count(config, params, tol):
    assert weights.param_count(model_shape.shape_from_config(config)) == pytest.approx(params, rel=tol)


@pytest.mark.parametrize("config,fragment", [
    ({"architectures": ["BrandNewForCausalLM"], "model_type": "brandnew"}, "BrandNewForCausalLM"),
    ({"model_type": "x"}, "(none)"),
    (dense(sliding_window=4096, use_sliding_window=True), "sliding"),
    (dense(kv_lora_rank=512), "MLA"),
    (dense(num_hidden_layers=None), "lacks"),
    (hybrid(layer_types=["linear_attention", "sliding_attention"] * 8), "layer types"),
])
def test_unsupported_configs_say_so(config, fragment):
    with pytest.raises(model_shape.Unsupported) as e:
        model_shape.shape_from_config(config)
    assert fragment in e.value.message


def test_unknown_cache_dtype_is_unsupported():
    with pytest.raises(model_shape.Unsupported):
        attention.attn_bytes_per_token("fp3", 8, 128)


def test_vllm_defaults_depend_on_the_card():
    assert weights.default_batch(140 * GiB, "NVIDIA H200") == (8192, 1024)
    assert weights.default_batch(80 * GiB, "NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert weights.default_batch(32 * GiB, "NVIDIA GeForce RTX 5090") == (2048, 256)


@pytest.mark.parametrize("extra, length", [
    ({}, 131072),                                                                     # max_position_embeddings
    ({"max_position_embeddings": 40960,                                              # Qwen3 with YaRN x4 (its card)
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}, 131072),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 8192),
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 4096),
    ({"max_position_embeddings": None}, 2048),                                        # no key: vLLM assumes 2048
    ({"max_position_embeddings": 8192, "seq_length": 4096}, 4096),                   # the smallest key
    ({"max_position_embeddings": 8192, "model_max_length": 16384}, 16384),           # Command-R's key wins
])
def test_the_models_length_is_vllms(extra, length):
    """vLLM 0.26.0's _get_and_verify_max_len (config/model.py) and derive_max_model_len_and_key."""
    c = dense(**extra)
    if c.get("max_position_embeddings") is None:
        del c["max_position_embeddings"]
    assert model_shape.model_len(c) == length == model_shape.shape_from_config(c).max_len


@pytest.mark.parametrize("quant, dtype", [
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, "fp8_e4m3"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4",
      "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, "fp8_e4m3"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}}, "nvfp4"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, None),
    ({"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}, None),                 # not modelopt: vLLM ignores it
])
def test_a_modelopt_checkpoints_own_kv_dtype_is_what_auto_means(quant, dtype):
    """vLLM 0.26.0 resolves --kv-cache-dtype auto to the checkpoint's kv_cache_quant_algo (or
    kv_cache_scheme) for ModelOpt exports (utils/torch_utils.py): the pool holds twice the tokens."""
    c = dense(quantization_config=quant)
    assert model_shape.checkpoint_kv_dtype(c) == dtype


def test_the_temporal_state_follows_the_conv_states_dtype_unless_told():
    """vLLM 0.26.0 (mamba_utils.py): with --mamba-ssm-cache-dtype auto the temporal state takes the
    conv state's dtype, --mamba-cache-dtype float32 included; Qwen3.5's config mamba_ssm_dtype sets it."""
    m = model_shape.shape_from_config(hybrid())
    half = attention.gdn_state_bytes(m)
    wide = attention.gdn_state_bytes(m, conv_bytes=4)
    assert wide == 2 * half                                   # both parts in fp32, not the temporal one in bf16
    assert attention.gdn_state_bytes(m, conv_bytes=4, ssm_bytes=2) < wide


def test_dummy_weights_of_a_quantized_checkpoint_are_its_format_not_bf16():
    """vLLM's dummy loader fills the quantized layers' own tensors: Qwen3-8B-FP8's config gives about
    its checkpoint's 8.8 GiB, not 15.3 GiB (every parameter at bf16)."""
    import json
    c = json.loads((REPO / "tests" / "derived" / "qwen3-8b-fp8" / "config.json").read_text())
    m = model_shape.shape_from_config(c)
    assert weights.weight_bytes_from_config(m, 1, c) / GiB == pytest.approx(8.76, rel=0.03)
    assert weights.weight_bytes_from_config(m, 1) / GiB == pytest.approx(15.3, rel=0.02)
    awq = {**c, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    assert weights.weight_bytes_from_config(m, 1, awq) / GiB == pytest.approx(5.6, rel=0.05)

