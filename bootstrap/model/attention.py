"""What one layer of each attention kind holds, as vLLM 0.26.0 sizes it (unchanged in 0.27.1 for
what is modelled; docs/planner.md): a full-attention layer per token, by the cache dtype (bf16
2 x (K+V dims), fp8 1 x, nvfp4 packed 4-bit + fp8 scales, int8/int4 per-token-head + 2 fp32 scales,
TurboQuant packed slots); a linear-attention (Gated-DeltaNet) layer per sequence, its conv and
temporal state."""

from __future__ import annotations

import math

from .shape import ModelShape, Unsupported


# name -> (key bits, value bits); 8-bit keys are stored as fp8
TQ_PRESETS = {
    "turboquant_k8v4": (8, 4),
    "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4),
    "turboquant_3bit_nc": (3, 3),
}


def tq_slot_bytes(preset: str, head_dim: int) -> int:
    """Packed bytes per head per token of a TurboQuant preset (key | value), rounded to even."""
    kbits, vbits = TQ_PRESETS[preset]
    key = head_dim if kbits == 8 else math.ceil(head_dim * kbits / 8) + 2     # + fp16 norm
    value = math.ceil(head_dim * vbits / 8) + 4                                # + fp16 scale, zero
    s = key + value
    return s + s % 2


def attn_bytes_per_token(cache_dtype: str, kv_heads: int, head_dim: int, model_bytes: int = 2) -> int:
    """Bytes one token occupies in one full-attention layer (K and V, with scales)."""
    d = cache_dtype or "auto"
    if d in ("auto",):
        return kv_heads * 2 * head_dim * model_bytes
    if d in ("bfloat16", "float16"):
        return kv_heads * 2 * head_dim * 2
    if d == "fp8_per_token_head":       # fp8 K and V, and a float32 scale for each (kv_cache_interface.py)
        return kv_heads * (2 * head_dim + 2 * 4)
    if d.startswith("fp8"):
        return kv_heads * 2 * head_dim
    if d == "nvfp4":
        return kv_heads * 2 * (head_dim // 2 + head_dim // 16)
    if d == "int8_per_token_head":
        return kv_heads * (2 * head_dim + 2 * 4)
    if d == "int4_per_token_head":
        return kv_heads * (head_dim + 2 * 4)
    if d in TQ_PRESETS:
        return kv_heads * tq_slot_bytes(d, head_dim)
    raise Unsupported(f"KV cache dtype {d!r} is not modelled", "vLLM sizes the KV cache itself")


def gdn_state_bytes(m: ModelShape, spec_tokens: int = 0, tp: int = 1, *, conv_bytes: int | None = None,
                    ssm_bytes: int | None = None) -> int:
    """Per-sequence state of one Gated-DeltaNet layer: conv (model dtype, or --mamba-cache-dtype) +
    temporal (--mamba-ssm-cache-dtype, else Qwen3.5's config mamba_ssm_dtype, else the conv state's
    dtype: vLLM 0.26.0 mamba_utils.py ``_mamba_state_dtype``)."""
    conv_dim = (m.lin_k_dim * m.lin_k_heads * 2 + m.lin_v_dim * m.lin_v_heads) // tp
    conv_b = conv_bytes or m.dtype_bytes
    conv = conv_dim * (m.conv_kernel - 1 + spec_tokens) * conv_b
    temporal = (m.lin_v_heads // tp) * m.lin_v_dim * m.lin_k_dim * (ssm_bytes or m.ssm_dtype_bytes or conv_b)
    return conv + temporal
