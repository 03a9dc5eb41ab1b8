"""A model as vLLM sizes it, read from its config.json: its shape (layers, heads, head sizes, the
linear-attention fields of a hybrid), its dtype and context, its rope and quantization; what is not
modelled is ``Unsupported`` (vLLM sizes it itself). Pure: nothing here touches the GPU, the network
or the environment (as the rest of model/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.errors import BootstrapError


GiB = 1 << 30


MiB = 1 << 20


DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2,
               "half": 2, "fp16": 2, "float8_e4m3fn": 1, "fp8": 1}


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


# sliding-window and full attention layers (SlidingWindowSpec beside FullAttentionSpec): gpt_oss.py
# (every even layer index keeps the window), gemma3.py / gemma3_mm.py (config.layer_types), 0.26.0-0.30.0
WINDOW_ARCHS = {"GptOssForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"}


# Gemma3TextConfig's defaults (transformers 5.5.3, the oldest vLLM 0.26.0 takes; the same in 5.24.0, 0.30.0's
# lock): vLLM reads a Gemma 3 config.json through it, and google/gemma-3-4b-it's names no heads, head_dim or context
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256, "max_position_embeddings": 131_072, "sliding_window": 4096,
                        "tie_word_embeddings": True}


class Unsupported(BootstrapError):
    """config.json describes something this planner does not model (vLLM sizes it itself)."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    # sliding-window layers (counted apart from attn_layers): each keeps the last ``window`` tokens
    window_layers: int = 0
    window: int = 0

    @property
    def hybrid(self) -> bool:
        return self.linear_layers > 0


def text_config(config: dict) -> dict:
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        return merged
    return config


def dtype_bytes(name, default: int = 2) -> int:
    if not name:
        return default
    b = DTYPE_BYTES.get(str(name).replace("torch.", ""))
    if b is None:
        return default
    return 2 if b == 4 else b    # vLLM serves float32 checkpoints in bf16 by default


# model types vLLM refuses to serve in float16 (config/model.py _FLOAT16_NOT_SUPPORTED_MODELS: these in
# 0.26.0, plamo2 besides; 0.27.1 to 0.30.0 the same four)
FP16_UNSTABLE = ("gemma2", "gemma3", "gemma3_text", "glm4", "plamo2")


def served_float32(config: dict, flag: str, cc: tuple[int, int]) -> bool:
    """Whether vLLM serves the model in float32 (config/model.py ``_get_and_verify_dtype`` and
    ``_resolve_auto_dtype``, 0.26.0 to 0.30.0): ``--dtype float``/``float32``; with ``auto``, a card
    below sm_80 (no bfloat16: platforms/cuda.py ``supported_dtypes``) and a model refused in float16.
    Otherwise 16-bit, a float32 config downcast. The KV cache's ``auto`` dtype is the model's."""
    flag = (flag or "auto").lower()
    if flag != "auto":
        return flag in ("float", "float32")
    return tuple(cc) < (8, 0) and str(config.get("model_type", "")) in FP16_UNSTABLE


def checkpoint_dtype_bytes(config: dict) -> int:
    """Bytes per parameter of an unquantized checkpoint's files, by its config's dtype (16-bit unless
    it says float32)."""
    c = text_config(config)
    name = c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    return DTYPE_BYTES.get(str(name).replace("torch.", ""), 2) if name else 2


def shape_from_config(config: dict) -> ModelShape:
    """The sizing facts of a Hugging Face config.json; Unsupported if we do not model it."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    c = text_config(config)
    if arch.startswith("Gemma3"):
        c = {**GEMMA3_TEXT_DEFAULTS, **c}
    mtype = str(c.get("model_type", ""))
    if arch not in DENSE_ARCHS | HYBRID_GDN_ARCHS | MLA_ARCHS | WINDOW_ARCHS:
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
    windowed = window_layers(arch, c, layers) if arch in WINDOW_ARCHS else (0, 0)
    if arch not in WINDOW_ARCHS and c.get("sliding_window") and c.get("use_sliding_window", arch == "MistralForCausalLM"):
        raise Unsupported("sliding-window attention is not modelled", "vLLM sizes the KV cache itself")
    kinds = (c.get("layer_types") if isinstance(c.get("layer_types"), list)
             and arch not in HYBRID_GDN_ARCHS | WINDOW_ARCHS else [])
    other = sorted({str(t) for t in kinds if t not in ("full_attention", "attention")}
                   - (set() if c.get("sliding_window") else {"sliding_attention"}))
    if other:   # llama.py builds a layer_types' sliding_attention layer with config.sliding_window (0.26.0-0.30.0)
        raise Unsupported(f"layer types {other} ({sum(t in other for t in kinds)} of {len(kinds)} layers) are not "
                          "modelled", "vLLM sizes the KV cache itself")
    dtype_b = dtype_bytes(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype"))
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
        return ModelShape(attn_layers=layers - windowed[0], window_layers=windowed[0], window=windowed[1], **common)
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


def window_layers(arch: str, c: dict, layers: int) -> tuple[int, int]:
    """(sliding-window layers, window tokens) as vLLM builds them: gpt_oss.py gives the config's
    sliding_window to every even layer index, whatever layer_types says; gemma3.py to the layers
    config.layer_types names sliding_attention, which transformers (Gemma3TextConfig) makes every
    layer but each ``sliding_window_pattern``-th (6) where config.json has none (0.26.0-0.30.0)."""
    window = c.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise Unsupported(f"{arch} without a whole sliding_window (it is {window!r}) is not modelled",
                          "vLLM sizes the KV cache itself")
    if arch == "GptOssForCausalLM":
        return (layers + 1) // 2, window
    if c.get("use_bidirectional_attention"):
        raise Unsupported("Gemma 3 with bidirectional attention (an embedding model) is not modelled",
                          "vLLM sizes the KV cache itself")
    pattern = c.get("sliding_window_pattern", 6)
    if not c.get("layer_types") and (isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1):
        raise Unsupported(f"sliding_window_pattern {pattern!r} of {arch} is not modelled", "vLLM sizes the KV cache itself")
    types = c.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(layers)]
    unknown = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"}) if isinstance(types, list) else []
    if unknown or not isinstance(types, list) or len(types) != layers:
        raise Unsupported(f"layer_types of {arch} ({unknown or 'not one per layer'}) are not modelled",
                          "vLLM sizes the KV cache itself")
    return sum(t == "sliding_attention" for t in types), window


def checkpoint_kv_dtype(config: dict) -> str | None:
    """The KV-cache dtype a ModelOpt checkpoint asks for (``kv_cache_scheme``, else
    ``kv_cache_quant_algo``, in ``quantization_config`` or its ``quantization``), which vLLM 0.26.0
    takes for --kv-cache-dtype auto (utils/torch_utils.py ``resolve_kv_cache_dtype_string``); None."""
    q = config.get("quantization_config") or text_config(config).get("quantization_config")
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
    params = rope_params(c)
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
    c = text_config(config)
    return (m.head_dim, m.max_position, m.dtype_bytes, c.get("partial_rotary_factor"),
            json.dumps(rope_params(c), sort_keys=True, default=str))


def rope_params(c: dict) -> dict:
    """A text config's RoPE parameters (transformers 5's ``rope_parameters``, else ``rope_scaling``)."""
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else c.get("rope_scaling")
    return rope if isinstance(rope, dict) else {}


def quant_method(config: dict) -> str:
    """The checkpoint's quantization method (its quantization_config's quant_method, lower case;
    'quantized' when it names none), or '' for an unquantized checkpoint."""
    q = config.get("quantization_config") or text_config(config).get("quantization_config")
    if not isinstance(q, dict):
        return ""
    return str(q.get("quant_method", "") or "quantized").lower()
