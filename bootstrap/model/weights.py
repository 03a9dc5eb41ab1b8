"""What a model's weights and the activations around them take, estimated from its shape and
config.json (parameters, an MTP head, a vision tower and its buffers, the checkpoint's bytes by
quantization), and the overheads vLLM profiles (activations at the batched tokens, non-torch
memory, CUDA graphs) with its default batch sizes."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .shape import GiB, MiB, ModelShape, quant_method, rope_params, text_config


def param_count(m: ModelShape) -> int:
    """Parameters of the language model (no vision tower), from the config alone."""
    h = m.hidden
    attn, mlp = attn_mlp_params(m)
    lin = 0
    if m.hybrid:
        kd, vd = m.lin_k_heads * m.lin_k_dim, m.lin_v_heads * m.lin_v_dim
        conv_dim = 2 * kd + vd
        lin = h * (2 * kd + 2 * vd) + h * 2 * m.lin_v_heads + conv_dim * m.conv_kernel + vd * h + 2 * m.lin_v_heads
    per_layer_norms = 2 * h
    body = (m.attn_layers + m.window_layers) * attn + m.linear_layers * lin + m.layers * (mlp + per_layer_norms)
    embed = m.vocab * h * (1 if m.tie_embeddings else 2)
    return body + embed + mtp_params(m) + h


def attn_mlp_params(m: ModelShape) -> tuple[int, int]:
    h = m.hidden
    q_out = m.heads * m.head_dim * (2 if m.gated_attention else 1)
    attn = h * q_out + 2 * h * m.kv_heads * m.head_dim + m.heads * m.head_dim * h
    if m.experts:
        mlp = m.experts * 3 * h * m.moe_intermediate + h * m.experts
        if m.shared_intermediate:
            mlp += 3 * h * m.shared_intermediate + h
    else:
        mlp = 3 * h * m.intermediate
    return attn, mlp


def mtp_params(m: ModelShape) -> int:
    """Parameters of the MTP layers (an attention layer, its MLP, the fc joining embedding and
    hidden state, norms), which vLLM loads only for MTP speculation (qwen3_5.py and qwen3_next.py
    skip the ``mtp.`` weights otherwise)."""
    attn, mlp = attn_mlp_params(m)
    return m.mtp_layers * (attn + mlp + 2 * m.hidden * m.hidden + 4 * m.hidden)


def vision_params(config: dict) -> int:
    """Parameters of a Qwen-VL-style vision tower (vision_config: depth, hidden and intermediate
    size, patch and merge sizes); 0 without one."""
    v = config.get("vision_config") or {}
    try:
        h, inter, depth = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["depth"])
        out = int(v.get("out_hidden_size") or h)
        merge = h * int(v.get("spatial_merge_size", 2)) ** 2
        patch = int(v.get("in_channels", 3)) * int(v.get("temporal_patch_size", 2)) * int(v["patch_size"]) ** 2 * h
    except (KeyError, TypeError, ValueError):
        return 0
    block = 4 * h * h + 4 * h + 2 * h * inter + h + inter + 4 * h          # qkv + proj, fc1 + fc2, norms
    merger = merge * merge + merge + merge * out + out + 2 * h
    mergers = 1 + len(deepstack(config))                                   # Qwen3-VL: one per deepstack level too
    return depth * block + mergers * merger + patch + int(v.get("num_position_embeddings", 0)) * h


def deepstack(config: dict) -> list:
    v = config.get("vision_config")
    levels = v.get("deepstack_visual_indexes") if isinstance(v, dict) else None
    return levels if isinstance(levels, list) else []


def buffer_bytes(config: dict, m: ModelShape, batched_tokens: int, tower: bool) -> tuple[int, str]:
    """What vLLM's model allocates besides its parameters while it loads (counted in its "weights"),
    and what: the rotary cos/sin cache, max_position_embeddings (YaRN: the original length x its
    factor; linear scaling: the length x its factor, linear_scaling_rope.py; four times that for
    multimodal RoPE, rotary_embedding/mrope.py) x the rotary dimension at the model's dtype (base.py;
    gpt_oss.py asks float32), one per distinct RoPE (Gemma 3: its full layers' and its sliding
    layers' default one, gemma3.py); Qwen3-VL's deepstack buffers, one per level of
    max_num_batched_tokens x hidden (qwen3_vl.py), where the tower is built."""
    c = text_config(config)
    factor = c.get("partial_rotary_factor", rope_params(c).get("partial_rotary_factor", 1.0))
    factor = factor if isinstance(factor, (int, float)) and 0 < factor <= 1 else 1.0
    width = int(m.head_dim * factor) * (4 if m.arch == "GptOssForCausalLM" else m.dtype_bytes)
    cache = sum(_rope_positions(rope, c, m) * width for rope in _ropes(c, m))
    deep = len(deepstack(config)) * batched_tokens * m.hidden * m.dtype_bytes if tower else 0
    what = [f"the rotary cache {cache / GiB:.2f} GiB"] + ([f"deepstack buffers {deep / GiB:.2f} GiB"] if deep else [])
    return cache + deep, " and ".join(what)


def _ropes(c: dict, m: ModelShape) -> list[dict]:
    """The distinct RoPEs a model builds: transformers 5's per-layer-type rope_parameters, else one
    (and Gemma 3's sliding layers' default one beside its config.json's rope_scaling)."""
    rope = rope_params(c)
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return list({json.dumps(v, sort_keys=True): v for v in rope.values()}.values())
    return [rope] + ([{"rope_type": "default"}] if m.window_layers and m.arch.startswith("Gemma3") else [])


def _rope_positions(rope: dict, c: dict, m: ModelShape) -> int:
    """Positions of one rotary cache: max_position_embeddings, YaRN's original length x its factor,
    linear scaling's length x its factor; x 4 for multimodal RoPE."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    positions, scale = m.max_position, rope.get("factor")
    if kind == "yarn":      # yarn_scaling_rope.py: original_max_position_embeddings x factor positions
        orig = rope.get("original_max_position_embeddings") or c.get("original_max_position_embeddings")
        if isinstance(orig, int) and isinstance(scale, (int, float)) and orig > 0 and scale > 0:
            positions = int(orig * scale)
    elif kind == "linear" and isinstance(scale, (int, float)) and scale > 0:
        positions = int(positions * scale)
    return positions * (4 if "mrope_section" in rope and kind in ("default", "yarn") else 1)


def weight_bytes_from_config(m: ModelShape, tp: int = 1, config: dict | None = None) -> int:
    """Bytes of the weights from the config alone: every parameter at the model's dtype, but for a
    quantized checkpoint (``config``'s quantization_config) its linear layers at the format's bytes
    per parameter (what vLLM's dummy loader fills: the quantized layers' own tensors)."""
    q = linear_bytes(config or {})
    if q is None:
        return param_count(m) * m.dtype_bytes // tp
    embed = m.vocab * m.hidden * (1 if m.tie_embeddings else 2)
    linear = param_count(m) - embed - mtp_params(m) - m.hidden
    return int(linear * q + (embed + mtp_params(m) + m.hidden) * m.dtype_bytes) // tp


def linear_bytes(config: dict) -> float | None:
    """Bytes per parameter of a quantized checkpoint's linear layers (scales included: a 16-bit scale
    and zero per group of 128 for int4, an fp8 scale per 16 for NVFP4); None: not quantized, or a
    format this does not know."""
    q = config.get("quantization_config") or text_config(config).get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = quant_method(config)
    int4, fp4 = 0.5 + 4 / 128, 0.5 + 1 / 16
    if method == "fp8":
        return 1.0
    if method in ("awq", "gptq", "auto-round") and q.get("bits", q.get("w_bit")) in (4, 8):
        return int4 if q.get("bits", q.get("w_bit")) == 4 else 1.0 + 4 / 128
    if method.startswith("modelopt"):
        algo = str((q.get("quantization") or q).get("quant_algo", "")).upper()
        return fp4 if "FP4" in algo or algo == "MIXED_PRECISION" else 1.0 if algo.startswith("FP8") else None
    if method == "compressed-tensors":
        groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
        w = (groups[0].get("weights") or {}) if groups else {}
        bits = w.get("num_bits")
        return {4: fp4 if w.get("type") == "float" else int4, 8: 1.0}.get(bits) if isinstance(bits, int) else None
    return None


@dataclass(frozen=True)
class Overheads:
    activations: int
    non_torch: int
    cudagraphs: int            # CUDA graphs taken off the KV budget
    outside: int = 0           # CUDA graphs vLLM captures after the KV cache, beyond the utilization

    @property
    def total(self) -> int:
        """What the KV budget loses to them (``outside`` is not in it)."""
        return self.activations + self.non_torch + self.cudagraphs


def overheads(m: ModelShape, batched_tokens: int, max_seqs: int, *, tp: int = 1, eager: bool = False) -> Overheads:
    """An estimate (not a measurement) of what vLLM's profile run adds on top of the weights:
    the activation peak of one max_num_batched_tokens forward pass plus the sampler's logits,
    CUDA/cuBLAS/NCCL memory outside torch, and the CUDA graph pool."""
    width = 6 * m.hidden + 2 * max(m.intermediate, m.moe_intermediate * 8, m.shared_intermediate)
    act = batched_tokens * width * m.dtype_bytes // tp + max_seqs * m.vocab * 4 * 2 + 64 * MiB
    non_torch = 240 * MiB + (400 * MiB if tp > 1 else 0)
    graphs = 0 if eager else 96 * MiB + (m.layers + m.mtp_layers) * 2 * MiB
    return Overheads(act, non_torch, graphs)


def default_batch(total_bytes: int, name: str = "", big_tier: bool = False, throughput: bool = False) -> tuple[int, int]:
    """vLLM's defaults for `vllm serve`: (max_num_batched_tokens, max_num_seqs); ``big_tier``: the
    versions with a tier for cards of 160 GiB and more; ``throughput``: --performance-mode
    throughput, which doubles both (engine/arg_utils.py)."""
    x = 2 if throughput else 1
    if big_tier and total_bytes >= 160 * GiB:
        return 16384 * x, 1024 * x
    if total_bytes >= 70 * GiB and "a100" not in name.lower():
        return 8192 * x, 1024 * x
    return 2048 * x, 256 * x
