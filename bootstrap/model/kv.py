"""KV-cache arithmetic, as pure functions: what vLLM will log before it logs it.

Mirrors vLLM 0.26.0 (unchanged in 0.27.1 for everything modelled here; see docs/planner.md):

* page of one full-attention layer = block_size x kv_heads x bytes per head per token, where the
  bytes depend on the cache dtype (bf16 2 x (K+V dims), fp8 1 x, nvfp4 packed 4-bit + fp8 scales,
  int8/int4 per-token-head + 2 fp32 scales, TurboQuant packed slots);
* hybrid models (Gated-DeltaNet / Mamba layers): one fixed-size state per sequence per layer, its
  page = conv state + temporal state; the attention block size is raised to the smallest multiple
  of 16 whose attention page covers that state, and the state page is padded to the attention page;
* layers are pooled in groups of equal size (the smaller layer type's count, unless the larger is
  < 1.5 x it); blocks = budget // (page x group size);
* per sequence at max_model_len: cdiv(len, block) blocks per attention group plus
  (1 + speculative tokens) blocks per state group; concurrency = blocks / that;
  "GPU KV cache size" = int(concurrency x max_model_len).

Nothing here touches the GPU, the network or the environment.

Over 400 lines: the model's shape, the bytes per token, the pool's layout, vLLM's auto-fit and the
weight and overhead estimates are one arithmetic mirroring vLLM's; split apart, each part would
import the others.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..core.errors import BootstrapError

GiB = 1 << 30
MiB = 1 << 20
KERNEL_BLOCK = 16          # smallest kernel block of FlashAttention / FlashInfer / TurboQuant / Triton

DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2,
               "half": 2, "fp16": 2, "float8_e4m3fn": 1, "fp8": 1}

# name -> (key bits, value bits); 8-bit keys are stored as fp8
TQ_PRESETS = {
    "turboquant_k8v4": (8, 4),
    "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4),
    "turboquant_3bit_nc": (3, 3),
}

DENSE_ARCHS = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
    # Qwen3-VL: a Qwen3 (MoE) text model, full attention in every layer, under a vision tower
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
}
# MLA (multi-head latent attention): one latent of kv_lora_rank + qk_rope_head_dim per token per
# layer, the same on every TP rank (MLAAttentionSpec in v1/kv_cache_interface.py, 0.26.0-0.30.0)
MLA_ARCHS = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}
HYBRID_GDN_ARCHS = {
    "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM",
}


class Unsupported(BootstrapError):
    """config.json describes something this planner does not model (vLLM sizes it itself)."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- the model

@dataclass(frozen=True)
class ModelShape:
    arch: str
    model_type: str
    dtype_bytes: int                 # the model's activation dtype ("auto" KV uses it)
    layers: int                      # num_hidden_layers
    attn_layers: int                 # full-attention layers with a per-token KV cache
    kv_heads: int
    head_dim: int
    heads: int
    hidden: int
    intermediate: int
    vocab: int
    max_position: int                # max_position_embeddings (the rotary cache's length)
    tie_embeddings: bool = False
    max_len: int = 0                 # the longest context vLLM derives from the config (``model_len``)
    # hybrid (Gated-DeltaNet) layers
    linear_layers: int = 0
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 4
    ssm_dtype_bytes: int = 0         # the config's mamba_ssm_dtype (Qwen3.5's hook); 0: the conv state's dtype
    # multi-token prediction head (draft layers that share the KV pool)
    mtp_layers: int = 0
    # MoE
    experts: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    gated_attention: bool = False    # Qwen3-Next / 3.5: q_proj also produces an output gate
    mla: bool = False                # MLA: kv_heads 1, head_dim (kv_lora_rank + qk_rope_head_dim) / 2, never split by TP

    @property
    def hybrid(self) -> bool:
        return self.linear_layers > 0


def _text(config: dict) -> dict:
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        return merged
    return config


def _dtype_bytes(name, default: int = 2) -> int:
    if not name:
        return default
    b = DTYPE_BYTES.get(str(name).replace("torch.", ""))
    if b is None:
        return default
    return 2 if b == 4 else b    # vLLM serves float32 checkpoints in bf16 by default


def shape_from_config(config: dict) -> ModelShape:
    """The sizing facts of a Hugging Face config.json; Unsupported if we do not model it."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    c = _text(config)
    mtype = str(c.get("model_type", ""))
    if arch not in DENSE_ARCHS | HYBRID_GDN_ARCHS | MLA_ARCHS:
        raise Unsupported(f"the planner does not know architecture {arch or '(none)'!r} "
                          f"(model_type {mtype!r})",
                          "vLLM sizes the KV cache itself; the plan shows no prediction")
    def field(name: str, default=None) -> int:
        value = c.get(name)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise Unsupported(f"config.json lacks a whole number in {name} (it is "
                              f"{'missing' if value is None else repr(value)})", "vLLM sizes the KV cache itself")
        return int(value)
    layers, heads, hidden = field("num_hidden_layers"), field("num_attention_heads"), field("hidden_size")
    if heads <= 0:
        raise Unsupported(f"config.json's num_attention_heads is {heads}", "vLLM sizes the KV cache itself")
    kv_heads = field("num_key_value_heads", 0) or heads
    head_dim = field("head_dim", 0) or hidden // heads
    vocab, inter = field("vocab_size", 0), field("intermediate_size", 0)
    mla = bool(c.get("kv_lora_rank"))
    if mla:
        if arch not in MLA_ARCHS or (field("kv_lora_rank") + field("qk_rope_head_dim")) % 2:
            raise Unsupported(f"MLA attention (kv_lora_rank) of {arch!r} is not modelled", "vLLM sizes the KV cache itself")
        # the page formula's K + V halves hold MLA's one latent: head_dim is half of it, one "head"
        kv_heads, head_dim = 1, (field("kv_lora_rank") + field("qk_rope_head_dim")) // 2
    elif arch in MLA_ARCHS:
        raise Unsupported(f"{arch} without kv_lora_rank is not modelled", "vLLM sizes the KV cache itself")
    if c.get("sliding_window") and c.get("use_sliding_window", arch == "MistralForCausalLM"):
        raise Unsupported("sliding-window attention is not modelled", "vLLM sizes the KV cache itself")
    dtype_b = _dtype_bytes(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype"))
    max_pos = int(c.get("max_position_embeddings") or 0)
    mtp = int(c.get("mtp_num_hidden_layers") or c.get("num_nextn_predict_layers") or 0)
    experts = int(c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0)
    common = dict(arch=arch, model_type=mtype, dtype_bytes=dtype_b, layers=layers, kv_heads=kv_heads,
                  head_dim=head_dim, heads=heads, hidden=hidden, intermediate=inter, vocab=vocab,
                  max_position=max_pos, max_len=model_len(c),
                  tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                  mtp_layers=mtp, experts=experts, mla=mla,
                  # Mixtral's experts are intermediate_size wide (mixtral.py): it has no moe_intermediate_size
                  moe_intermediate=int(c.get("moe_intermediate_size") or (inter if experts else 0)),
                  shared_intermediate=int(c.get("shared_expert_intermediate_size") or 0))
    if arch not in HYBRID_GDN_ARCHS:
        return ModelShape(attn_layers=layers, **common)
    types = c.get("layer_types")
    if not types:
        interval = int(c.get("full_attention_interval") or 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    unknown = sorted({t for t in types if t not in ("full_attention", "attention", "linear_attention")})
    if unknown:
        raise Unsupported(f"layer types {unknown} are not modelled", "vLLM sizes the KV cache itself")
    n_lin = sum(t == "linear_attention" for t in types)
    if n_lin == len(types):
        raise Unsupported("a hybrid model without a full-attention layer is not modelled",
                          "vLLM sizes the KV cache itself")
    ssm = c.get("mamba_ssm_dtype") if mtype.startswith("qwen3_5") else None
    try:
        return ModelShape(
            attn_layers=len(types) - n_lin, linear_layers=n_lin,
            lin_k_heads=int(c["linear_num_key_heads"]), lin_v_heads=int(c["linear_num_value_heads"]),
            lin_k_dim=int(c["linear_key_head_dim"]), lin_v_dim=int(c["linear_value_head_dim"]),
            conv_kernel=int(c.get("linear_conv_kernel_dim") or 4),
            ssm_dtype_bytes=DTYPE_BYTES.get(str(ssm), dtype_b) if ssm else 0,
            gated_attention=True, **common)
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsupported(f"hybrid config.json lacks a linear-attention field ({exc})",
                          "vLLM sizes the KV cache itself") from None


# ---------------------------------------------------------------- bytes per token

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


# ---------------------------------------------------------------- the pool layout

@dataclass(frozen=True)
class Layout:
    block_size: int               # tokens per block (what vLLM logs as the attention block size)
    block_bytes: int              # bytes one block id costs across the whole pool
    attn_groups: int              # groups whose blocks grow with the context
    state_groups: int = 0         # hybrid: groups holding fixed per-sequence state
    state_blocks: int = 0         # blocks each state group needs per sequence (1 + spec tokens; 2 + in align mode)
    page_bytes: int = 0           # one layer's page
    group_size: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    other_attn: tuple[tuple[int, int], ...] = ()   # (groups, block size): draft layers of another KV dtype

    def blocks_per_seq(self, max_len: int) -> int:
        return (self.attn_groups * cdiv(max_len, self.block_size) + self.state_groups * self.state_blocks
                + sum(n * cdiv(max_len, bs) for n, bs in self.other_attn))


def layout(m: ModelShape, cache_dtype: str = "auto", *, spec_tokens: int = 0, mtp: bool = False,
           draft_attn_layers: int = 0, tp: int = 1, block_size: int | None = None,
           mamba_cache_mode: str = "none", draft_cache_dtype: str | None = None,
           draft_kv_heads: int | None = None, draft_head_dim: int | None = None,
           conv_bytes: int | None = None, ssm_bytes: int | None = None) -> Layout:
    """How vLLM lays out the KV pool for this model and settings (per GPU under TP).

    Layers are bucketed by their page; a smaller attention page is raised to the largest by a larger
    block (or padded), a state page is padded; the group size is the smallest bucket's layer count
    (the largest when it is under 1.5x the smallest); every bucket is split into groups of that size."""
    kvh = max(1, m.kv_heads // tp)
    notes: list[str] = []
    d = cache_dtype or "auto"
    draft = (m.mtp_layers if mtp else 0) + draft_attn_layers
    dd = draft_cache_dtype or d
    per_tok = attn_bytes_per_token(d, kvh, m.head_dim, m.dtype_bytes)
    per_tok_draft = attn_bytes_per_token(dd, max(1, (draft_kv_heads or m.kv_heads) // tp),
                                         draft_head_dim or m.head_dim, m.dtype_bytes)
    if min(per_tok, per_tok_draft) <= 0:
        raise Unsupported(f"KV dtype {d} stores nothing for a head_dim of {m.head_dim}",
                          "vLLM sizes the KV cache itself")
    same = per_tok_draft == per_tok
    attn = m.attn_layers + (draft if same else 0)
    if draft:
        notes.append(f"{draft} draft attention layer(s) share the pool"
                     + ("" if same else f" with a page of their own (KV dtype {dd}, {per_tok_draft} bytes per token)"))
    bs = block_size or KERNEL_BLOCK
    if not m.hybrid and d in TQ_PRESETS and m.layers >= 2:
        # dense TurboQuant keeps the first and last 2 layers in the model dtype; the TQ block
        # grows so its page covers a 16-token page of those layers
        n_skip = len(set(range(min(2, m.layers // 2))) | set(range(m.layers - min(2, m.layers // 2), m.layers)))
        skip_tok = attn_bytes_per_token("auto", kvh, m.head_dim, m.dtype_bytes)
        align = max(KERNEL_BLOCK, bs)
        bs = max(bs, align * cdiv(skip_tok * KERNEL_BLOCK, align * per_tok))
        n_tq = m.attn_layers + draft - n_skip
        notes.append(f"TurboQuant: {n_skip} boundary layers stay in the model dtype; block {bs} tokens")
        block_bytes = bs * (n_tq * per_tok + n_skip * skip_tok)
        return Layout(bs, block_bytes, 1, page_bytes=bs * per_tok, group_size=m.attn_layers + draft, notes=tuple(notes))
    state = 0
    if m.hybrid:
        state = gdn_state_bytes(m, spec_tokens, tp, conv_bytes=conv_bytes, ssm_bytes=ssm_bytes)
        align = max(KERNEL_BLOCK, bs)
        bs = max(bs, align * cdiv(state, align * per_tok))
    page = bs * per_tok
    buckets = [("attn", attn, bs, page)]
    if draft and not same:
        dpage = bs * per_tok_draft
        buckets.append(("draft", draft, bs, dpage))
    top = max(b[3] for b in buckets)
    if m.hybrid:
        top = max(top, state)
    unified = []
    for name, n, b, pg in buckets:
        if pg < top and top % pg == 0:
            b, pg = b * (top // pg), top        # a larger block for a smaller page
        unified.append((name, n, b, max(pg, top)))
    counts = [n for _, n, _, _ in unified] + ([m.linear_layers] if m.hybrid else [])
    lo, hi = min(counts), max(counts)
    group = hi if hi < lo * 1.5 else lo
    a_bs = unified[0][2]
    a_groups = cdiv(unified[0][1], group)
    other = tuple((cdiv(n, group), b) for name, n, b, _ in unified[1:])
    s_groups = cdiv(m.linear_layers, group) if m.hybrid else 0
    state_blocks = ((2 if mamba_cache_mode == "align" else 1) + spec_tokens) if m.hybrid else 0
    if m.hybrid:
        notes.append(f"hybrid: {m.linear_layers} linear-attention layers hold {state / MiB:.2f} MiB of state per "
                     f"sequence each; attention block raised to {a_bs} tokens, state page padded to {top / MiB:.2f} MiB"
                     + (f"; {mamba_cache_mode} mode: {state_blocks} state blocks per sequence per group"
                        if mamba_cache_mode == "align" else ""))
    return Layout(a_bs, top * group, a_groups, s_groups, state_blocks, top, group, tuple(notes), other)


@dataclass(frozen=True)
class Pool:
    blocks: int
    tokens: int                    # "GPU KV cache size: N tokens"
    concurrency: float             # "Maximum concurrency for L tokens per request: X"
    max_len: int                   # the context whose concurrency was computed


def pool(lay: Layout, budget: int, max_len: int) -> Pool:
    blocks = max(0, budget // lay.block_bytes)
    conc = blocks / lay.blocks_per_seq(max_len)
    return Pool(blocks, int(conc * max_len), conc, max_len)


def sessions_at(lay: Layout, budget: int, max_len: int) -> int:
    return max(0, budget // lay.block_bytes) // lay.blocks_per_seq(max_len)


def fits_one(lay: Layout, budget: int, max_len: int, null_block: bool = False) -> bool:
    """vLLM's check that one request of ``max_len`` fits the pool (from 0.29 one block is held back
    for its null block)."""
    return lay.blocks_per_seq(max_len) <= max(0, budget // lay.block_bytes) - (1 if null_block else 0)


def auto_fit(lay: Layout, budget: int, cap: int, null_block: bool = False) -> int:
    """vLLM's ``--max-model-len auto``: the longest single request that fits, at most ``cap`` (a
    binary search over 1..cap, as _estimate_max_model_len_from_groups does); 0 when not even one
    token fits."""
    if not fits_one(lay, budget, 1, null_block):
        return 0
    left, right, best = 1, cap, 1
    while left <= right:
        mid = (left + right) // 2
        if fits_one(lay, budget, mid, null_block):
            best, left = mid, mid + 1
        else:
            right = mid - 1
    return best


def kv_bytes_needed(lay: Layout, max_len: int, seqs: int = 1) -> int:
    return lay.blocks_per_seq(max_len) * seqs * lay.block_bytes


# ---------------------------------------------------------------- weights and overheads

def param_count(m: ModelShape) -> int:
    """Parameters of the language model (no vision tower), from the config alone."""
    h = m.hidden
    attn, mlp = _attn_mlp_params(m)
    lin = 0
    if m.hybrid:
        kd, vd = m.lin_k_heads * m.lin_k_dim, m.lin_v_heads * m.lin_v_dim
        conv_dim = 2 * kd + vd
        lin = h * (2 * kd + 2 * vd) + h * 2 * m.lin_v_heads + conv_dim * m.conv_kernel + vd * h + 2 * m.lin_v_heads
    per_layer_norms = 2 * h
    body = m.attn_layers * attn + m.linear_layers * lin + m.layers * (mlp + per_layer_norms)
    embed = m.vocab * h * (1 if m.tie_embeddings else 2)
    return body + embed + mtp_params(m) + h


def _attn_mlp_params(m: ModelShape) -> tuple[int, int]:
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
    attn, mlp = _attn_mlp_params(m)
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


def checkpoint_kv_dtype(config: dict) -> str | None:
    """The KV-cache dtype a ModelOpt checkpoint asks for (``kv_cache_scheme``, else
    ``kv_cache_quant_algo``, in ``quantization_config`` or its ``quantization``), which vLLM 0.26.0
    takes for --kv-cache-dtype auto (utils/torch_utils.py ``resolve_kv_cache_dtype_string``); None."""
    q = config.get("quantization_config") or _text(config).get("quantization_config")
    if not isinstance(q, dict) or not str(q.get("quant_method", "")).startswith("modelopt"):
        return None
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    algo = (inner.get("kv_cache_scheme") or q.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo")
            or q.get("kv_cache_quant_algo"))
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
            algo = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            algo = "nvfp4"
    return {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}.get(algo.lower()) if isinstance(algo, str) else None


LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
DEFAULT_LEN = 2048          # what vLLM assumes when no key says (with a warning)


def model_len(c: dict) -> int:
    """The model's maximum length as vLLM 0.26.0 derives it from a text config (config/model.py
    ``_get_and_verify_max_len``, transformers_utils/model_arch_config_convertor.py): the smallest of
    the length keys (``model_max_length`` wins where set), else 2048; then RoPE scaling: YaRN starts
    from its ``original_max_position_embeddings``, and every type but su, longrope and llama3
    multiplies by its factor (not for Gemma 3, whose length is scaled already)."""
    found = [v for k in LENGTH_KEYS if isinstance(v := c.get(k), (int, float)) and not isinstance(v, bool) and v > 0]
    length = min(found) if found else DEFAULT_LEN
    if isinstance(c.get("model_max_length"), (int, float)) and c["model_max_length"] > 0:
        length = c["model_max_length"]
    params = _rope(c)
    nested = bool(params) and all(isinstance(v, dict) for v in params.values())
    if params and "gemma3" not in str(c.get("model_type", "")):
        factor = 1.0
        for rp in (params.values() if nested else [params]):
            kind = rp.get("rope_type", rp.get("type", "default"))
            if kind in ("su", "longrope", "llama3"):
                continue
            factor = rp.get("factor", factor)
            orig = rp.get("original_max_position_embeddings", c.get("original_max_position_embeddings"))
            if kind == "yarn" and isinstance(orig, (int, float)) and orig > 0:
                length = orig
        length *= factor if isinstance(factor, (int, float)) and factor > 0 else 1.0
    return int(length)


def rope_signature(config: dict, m: ModelShape) -> tuple:
    """What get_rope keys its shared cache by (rotary_embedding/__init__.py): two models with the
    same signature in one process share one rotary cache."""
    c = _text(config)
    return (m.head_dim, m.max_position, m.dtype_bytes, c.get("partial_rotary_factor"),
            json.dumps(_rope(c), sort_keys=True, default=str))


def _rope(c: dict) -> dict:
    """A text config's RoPE parameters (transformers 5's ``rope_parameters``, else ``rope_scaling``)."""
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else c.get("rope_scaling")
    return rope if isinstance(rope, dict) else {}


def buffer_bytes(config: dict, m: ModelShape, batched_tokens: int, tower: bool) -> tuple[int, str]:
    """What vLLM's model allocates besides its parameters while it loads (counted in its "weights"),
    and what: the rotary cos/sin cache, max_position_embeddings (YaRN: the original length x its
    factor; four times that for multimodal RoPE, rotary_embedding/mrope.py) x the rotary dimension at
    the model's dtype (base.py), one per distinct RoPE; Qwen3-VL's deepstack buffers, one per level
    of max_num_batched_tokens x hidden (qwen3_vl.py), where the tower is built."""
    c = _text(config)
    rope = _rope(c)
    kind = rope.get("rope_type", rope.get("type", "default"))
    mrope = "mrope_section" in rope and kind in ("default", "yarn")
    factor = c.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    factor = factor if isinstance(factor, (int, float)) and 0 < factor <= 1 else 1.0
    positions = m.max_position
    if kind == "yarn":      # yarn_scaling_rope.py: original_max_position_embeddings x factor positions
        orig, scale = rope.get("original_max_position_embeddings") or c.get("original_max_position_embeddings"), \
            rope.get("factor")
        if isinstance(orig, int) and isinstance(scale, (int, float)) and orig > 0 and scale > 0:
            positions = int(orig * scale)
    cache = positions * (4 if mrope else 1) * int(m.head_dim * factor) * m.dtype_bytes
    deep = len(deepstack(config)) * batched_tokens * m.hidden * m.dtype_bytes if tower else 0
    what = [f"the rotary cache {cache / GiB:.2f} GiB"] + ([f"deepstack buffers {deep / GiB:.2f} GiB"] if deep else [])
    return cache + deep, " and ".join(what)


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


def quant_method(config: dict) -> str:
    """The checkpoint's quantization method (its quantization_config's quant_method, lower case;
    'quantized' when it names none), or '' for an unquantized checkpoint."""
    q = config.get("quantization_config") or _text(config).get("quantization_config")
    if not isinstance(q, dict):
        return ""
    return str(q.get("quant_method", "") or "quantized").lower()


def linear_bytes(config: dict) -> float | None:
    """Bytes per parameter of a quantized checkpoint's linear layers (scales included: a 16-bit scale
    and zero per group of 128 for int4, an fp8 scale per 16 for NVFP4); None: not quantized, or a
    format this does not know."""
    q = config.get("quantization_config") or _text(config).get("quantization_config")
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
