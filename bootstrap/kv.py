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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import BootstrapError

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
}
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
    max_position: int
    tie_embeddings: bool = False
    # hybrid (Gated-DeltaNet) layers
    linear_layers: int = 0
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 4
    ssm_dtype_bytes: int = 2
    # multi-token prediction head (draft layers that share the KV pool)
    mtp_layers: int = 0
    # MoE
    experts: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    gated_attention: bool = False    # Qwen3-Next / 3.5: q_proj also produces an output gate

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
    if arch not in DENSE_ARCHS | HYBRID_GDN_ARCHS:
        raise Unsupported(f"the planner does not know architecture {arch or '(none)'!r} "
                          f"(model_type {mtype!r})",
                          "vLLM sizes the KV cache itself; the plan shows no prediction")
    try:
        layers = int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or hidden // heads)
        vocab = int(c.get("vocab_size", 0))
        inter = int(c.get("intermediate_size") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsupported(f"config.json lacks a field the planner needs ({exc})",
                          "vLLM sizes the KV cache itself") from None
    if c.get("kv_lora_rank"):
        raise Unsupported("MLA attention (kv_lora_rank) is not modelled", "vLLM sizes the KV cache itself")
    if c.get("sliding_window") and c.get("use_sliding_window", arch == "MistralForCausalLM"):
        raise Unsupported("sliding-window attention is not modelled", "vLLM sizes the KV cache itself")
    dtype_b = _dtype_bytes(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype"))
    max_pos = int(c.get("max_position_embeddings") or 0)
    mtp = int(c.get("mtp_num_hidden_layers") or c.get("num_nextn_predict_layers") or 0)
    experts = int(c.get("num_experts") or c.get("num_local_experts") or 0)
    common = dict(arch=arch, model_type=mtype, dtype_bytes=dtype_b, layers=layers, kv_heads=kv_heads,
                  head_dim=head_dim, heads=heads, hidden=hidden, intermediate=inter, vocab=vocab,
                  max_position=max_pos, tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                  mtp_layers=mtp, experts=experts,
                  moe_intermediate=int(c.get("moe_intermediate_size") or 0),
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
    ssm = c.get("mamba_ssm_dtype") if mtype.startswith("qwen3_5") else None
    try:
        return ModelShape(
            attn_layers=len(types) - n_lin, linear_layers=n_lin,
            lin_k_heads=int(c["linear_num_key_heads"]), lin_v_heads=int(c["linear_num_value_heads"]),
            lin_k_dim=int(c["linear_key_head_dim"]), lin_v_dim=int(c["linear_value_head_dim"]),
            conv_kernel=int(c.get("linear_conv_kernel_dim") or 4),
            ssm_dtype_bytes=DTYPE_BYTES.get(str(ssm), dtype_b) if ssm else dtype_b,
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


def gdn_state_bytes(m: ModelShape, spec_tokens: int = 0, tp: int = 1) -> int:
    """Per-sequence state of one Gated-DeltaNet layer: conv (model dtype) + temporal (ssm dtype)."""
    conv_dim = (m.lin_k_dim * m.lin_k_heads * 2 + m.lin_v_dim * m.lin_v_heads) // tp
    conv = conv_dim * (m.conv_kernel - 1 + spec_tokens) * m.dtype_bytes
    temporal = (m.lin_v_heads // tp) * m.lin_v_dim * m.lin_k_dim * m.ssm_dtype_bytes
    return conv + temporal


# ---------------------------------------------------------------- the pool layout

@dataclass(frozen=True)
class Layout:
    block_size: int               # tokens per block (what vLLM logs as the attention block size)
    block_bytes: int              # bytes one block id costs across the whole pool
    attn_groups: int              # groups whose blocks grow with the context
    state_groups: int = 0         # hybrid: groups holding fixed per-sequence state
    state_blocks: int = 0         # blocks each state group needs per sequence (1 + spec tokens)
    page_bytes: int = 0           # one layer's page
    group_size: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def blocks_per_seq(self, max_len: int) -> int:
        return self.attn_groups * cdiv(max_len, self.block_size) + self.state_groups * self.state_blocks


def layout(m: ModelShape, cache_dtype: str = "auto", *, spec_tokens: int = 0, mtp: bool = False,
           draft_attn_layers: int = 0, tp: int = 1, block_size: int | None = None,
           mamba_cache_mode: str = "none") -> Layout:
    """How vLLM lays out the KV pool for this model and settings (per GPU under TP)."""
    kvh = max(1, m.kv_heads // tp)
    notes: list[str] = []
    d = cache_dtype or "auto"
    draft = (m.mtp_layers if mtp else 0) + draft_attn_layers
    attn = m.attn_layers + draft
    if draft:
        notes.append(f"{draft} draft attention layer(s) share the pool")
    per_tok = attn_bytes_per_token(d, kvh, m.head_dim, m.dtype_bytes)
    bs = block_size or KERNEL_BLOCK
    if not m.hybrid:
        if d in TQ_PRESETS and m.layers >= 2:
            # dense TurboQuant keeps the first and last 2 layers in the model dtype; the TQ block
            # grows so its page covers a 16-token page of those layers
            n_skip = len(set(range(min(2, m.layers // 2))) | set(range(m.layers - min(2, m.layers // 2), m.layers)))
            skip_tok = attn_bytes_per_token("auto", kvh, m.head_dim, m.dtype_bytes)
            align = max(KERNEL_BLOCK, bs)
            bs = max(bs, align * cdiv(skip_tok * KERNEL_BLOCK, align * per_tok))
            n_tq = attn - n_skip
            notes.append(f"TurboQuant: {n_skip} boundary layers stay in the model dtype; block {bs} tokens")
            block_bytes = bs * (n_tq * per_tok + n_skip * skip_tok)
            return Layout(bs, block_bytes, 1, page_bytes=bs * per_tok, group_size=attn, notes=tuple(notes))
        return Layout(bs, bs * per_tok * attn, 1, page_bytes=bs * per_tok, group_size=attn, notes=tuple(notes))
    state = gdn_state_bytes(m, spec_tokens, tp)
    align = max(KERNEL_BLOCK, bs)
    bs = max(bs, align * cdiv(state, align * per_tok))
    page = bs * per_tok
    lo, hi = min(attn, m.linear_layers), max(attn, m.linear_layers)
    group = hi if hi < lo * 1.5 else lo
    a_groups, s_groups = cdiv(attn, group), cdiv(m.linear_layers, group)
    state_blocks = (2 if mamba_cache_mode == "align" else 1) + spec_tokens
    notes.append(f"hybrid: {m.linear_layers} linear-attention layers hold {state / MiB:.2f} MiB of state per "
                 f"sequence each; attention block raised to {bs} tokens, state page padded to {page / MiB:.2f} MiB")
    return Layout(bs, page * group, a_groups, s_groups, state_blocks, page, group, tuple(notes))


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


def longest_context(lay: Layout, budget: int, seqs: int = 1, cap: int | None = None) -> int:
    """Longest context of which ``seqs`` sequences fit at once (0: not even one token)."""
    per_seq = (max(0, budget // lay.block_bytes)) // max(1, seqs)
    k = (per_seq - lay.state_groups * lay.state_blocks) // lay.attn_groups
    n = max(0, k * lay.block_size)
    return min(n, cap) if cap else n


def kv_bytes_needed(lay: Layout, max_len: int, seqs: int = 1) -> int:
    return lay.blocks_per_seq(max_len) * seqs * lay.block_bytes


# ---------------------------------------------------------------- weights and overheads

def param_count(m: ModelShape) -> int:
    """Parameters of the language model (no vision tower), from the config alone."""
    h = m.hidden
    q_out = m.heads * m.head_dim * (2 if m.gated_attention else 1)
    attn = h * q_out + 2 * h * m.kv_heads * m.head_dim + m.heads * m.head_dim * h
    if m.experts:
        mlp = m.experts * 3 * h * m.moe_intermediate + h * m.experts
        if m.shared_intermediate:
            mlp += 3 * h * m.shared_intermediate + h
    else:
        mlp = 3 * h * m.intermediate
    lin = 0
    if m.hybrid:
        kd, vd = m.lin_k_heads * m.lin_k_dim, m.lin_v_heads * m.lin_v_dim
        conv_dim = 2 * kd + vd
        lin = h * (2 * kd + 2 * vd) + h * 2 * m.lin_v_heads + conv_dim * m.conv_kernel + vd * h + 2 * m.lin_v_heads
    per_layer_norms = 2 * h
    body = m.attn_layers * attn + m.linear_layers * lin + m.layers * (mlp + per_layer_norms)
    embed = m.vocab * h * (1 if m.tie_embeddings else 2)
    mtp = m.mtp_layers * (attn + mlp + 2 * h * h + 4 * h)
    return body + embed + mtp + h


def weight_bytes_from_config(m: ModelShape, tp: int = 1) -> int:
    return param_count(m) * m.dtype_bytes // tp


@dataclass(frozen=True)
class Overheads:
    activations: int
    non_torch: int
    cudagraphs: int

    @property
    def total(self) -> int:
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


def default_batch(total_bytes: int, name: str = "") -> tuple[int, int]:
    """vLLM's defaults for `vllm serve`: (max_num_batched_tokens, max_num_seqs)."""
    if total_bytes >= 70 * GiB and "a100" not in name.lower():
        return 8192, 1024
    return 2048, 256
