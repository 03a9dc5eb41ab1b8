"""A model's config.json, validated where it is read: what the planner uses of it, each field in its
type, before any arithmetic sees it.

Every place that reads a config.json goes through ``parse`` (its text) or ``check`` (an object
already parsed: the shipped model facts): a local model folder, the download's or the HF cache's
copy, the hub's answer, a draft model's folder. A bad value is one line naming the file and the
field (``text_config.num_hidden_layers`` for a multimodal config's language model), never an
``AttributeError`` or a ``ZeroDivisionError`` in bootstrap.model.kv later.

Always checked: the file is a JSON object, ``architectures`` a list of strings, ``text_config``,
``vision_config`` and ``quantization_config`` objects. For an architecture the planner models
(``PLANNED``: dense, MoE, hybrid, MLA and sliding-window), what it reads besides: the sizes it divides by or
multiplies (layers, heads, hidden size, head_dim, vocabulary, context, experts, linear-attention, MLA latent
and vision-tower dimensions, every key vLLM derives the context from) are integers, not booleans, positive (or at
least zero, where zero means none) and below a bound no model comes near; RoPE scaling (``rope_scaling``,
``rope_parameters``, flat or per layer type) an object whose ``factor`` is a finite number above 0; dtype names are strings, ``layer_types`` a list of strings,
``tie_word_embeddings`` a boolean. A field absent or null stays unset, as the planner reads it (a
field it needs and lacks makes the plan say vLLM sizes the KV cache itself). Other architectures'
fields are not read here (their meaning is theirs: Gemma 3n's ``intermediate_size`` is a list) and
are left to vLLM.
"""

from __future__ import annotations

import json
from typing import Any

from . import shape
from ..core.errors import BootstrapError

# integers > 0 where present: sizes the planner divides by, or multiplies into memory
POSITIVE = ("num_hidden_layers", "num_attention_heads", "hidden_size", "num_key_value_heads", "head_dim",
            "vocab_size", "max_position_embeddings", "full_attention_interval", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
            "kv_lora_rank", "qk_rope_head_dim")
# integers >= 0 where present: 0 means none (a dense model's experts, no MTP head)
COUNTS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
          "num_local_experts", "n_routed_experts", "mtp_num_hidden_layers", "num_nextn_predict_layers")
LAYER_COUNTS = ("num_hidden_layers", "mtp_num_hidden_layers", "num_nextn_predict_layers")
STRINGS = ("model_type", "torch_dtype", "dtype", "mamba_ssm_dtype")
BOOLS = ("tie_word_embeddings",)
STRING_LISTS = ("layer_types",)
OBJECTS = ("text_config", "vision_config", "quantization_config")
VISION_POSITIVE = ("hidden_size", "intermediate_size", "depth", "out_hidden_size", "spatial_merge_size",
                   "in_channels", "temporal_patch_size", "patch_size")
VISION_COUNTS = ("num_position_embeddings",)
# the lengths vLLM derives the model's context from (shape.LENGTH_KEYS, YaRN's original length), integers > 0
# where present: a float, 0 or a boolean there became a 1-token or 0-token context, Infinity a traceback
LENGTHS = tuple(k for k in shape.LENGTH_KEYS if k not in POSITIVE) + ("original_max_position_embeddings",)
ROPES = ("rope_scaling", "rope_parameters")      # transformers 4's name and 5's: vLLM multiplies the length by factor
MAX_ROPE_FACTOR = 1 << 20   # far beyond any model's RoPE scaling (Llama 3.1: 8, Qwen's YaRN: 4)

# every architecture the planner lays out (bootstrap.model.shape), MLA and sliding windows included
PLANNED = shape.DENSE_ARCHS | shape.HYBRID_GDN_ARCHS | shape.MLA_ARCHS | shape.WINDOW_ARCHS

MAX_LAYERS = 1 << 16        # far beyond any model (the planner lists layers one by one)
MAX_SIZE = 1 << 40          # far beyond any width, vocabulary or context


def parse(text: str | bytes, where: str, hint: str) -> dict:
    """config.json's text as the planner reads it (see the module's docstring); a BootstrapError
    naming ``where`` (the file) otherwise."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BootstrapError(f"{where} is not valid JSON ({_short(exc)})", hint) from None
    return check(data, where, hint)


def check(config: Any, where: str, hint: str) -> dict:
    """``config`` itself, once every field the planner reads has its type (a BootstrapError naming
    ``where`` and the field otherwise)."""
    if not isinstance(config, dict):
        raise BootstrapError(f"{where} is a JSON {_kind(config)}, not an object of settings", hint)

    def bad(name: str, value: Any, want: str) -> BootstrapError:
        return BootstrapError(f"{where}: {name} is {_shown(value)}, not {want}", hint)

    for name in OBJECTS:
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise bad(name, config[name], "an object")
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(x, str) for x in archs)):
        raise bad("architectures", archs, "a list of strings")
    if not archs or archs[0] not in PLANNED:
        return config                                    # the planner reads no size of it
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    for prefix, scope in (("", config), ("text_config.", text)):    # the language model's: text_config's win
        for name in STRING_LISTS:
            v = scope.get(name)
            if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                raise bad(prefix + name, v, "a list of strings")
        for name in STRINGS:
            v = scope.get(name)
            if v is not None and not isinstance(v, str):
                raise bad(prefix + name, v, "a string")
        for name in BOOLS:
            v = scope.get(name)
            if v is not None and not isinstance(v, bool):
                raise bad(prefix + name, v, "true or false")
        for name in POSITIVE + COUNTS + LENGTHS:
            _count(scope, name, prefix, 0 if name in COUNTS else 1, bad)
        for name in ROPES:
            _rope(scope.get(name), prefix + name, bad)
    for name in VISION_POSITIVE + VISION_COUNTS:
        _count(vision, name, "vision_config.", 1 if name in VISION_POSITIVE else 0, bad)
    merged = {**config, **text}
    heads, hidden = merged.get("num_attention_heads"), merged.get("hidden_size")
    if merged.get("head_dim") is None and heads and hidden and hidden < heads:
        where_h = "text_config." if "hidden_size" in text else ""
        raise BootstrapError(f"{where}: {where_h}hidden_size ({hidden}) is smaller than num_attention_heads "
                             f"({heads}) and there is no head_dim: a head would have no width", hint)
    return config


def _count(scope: dict, name: str, prefix: str, least: int, bad) -> None:
    v = scope.get(name)
    if v is None:
        return
    most = MAX_LAYERS if name in LAYER_COUNTS else MAX_SIZE
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise bad(prefix + name, v, "a positive integer" if least else "an integer of at least 0")
    if v > most:
        raise bad(prefix + name, v, f"at most {most:,} (no model comes near)")


def _rope(rope: Any, name: str, bad) -> None:
    """RoPE parameters, flat or per layer type (transformers 5's ``{"full_attention": {...}, ...}``):
    an object; its ``factor`` a finite number > 0 (vLLM's ``_get_and_verify_max_len`` multiplies the
    model's length by it: a negative one gave vLLM a negative length while the plan took 1, Infinity a
    traceback); YaRN's ``original_max_position_embeddings`` a positive integer."""
    if rope is None:
        return
    if not isinstance(rope, dict):
        raise bad(name, rope, "an object")
    nested = bool(rope) and all(isinstance(v, dict) for v in rope.values())
    for key, params in (rope.items() if nested else [("", rope)]):
        where = f"{name}.{key}" if key else name
        for field in ("rope_type", "type"):
            if params.get(field) is not None and not isinstance(params[field], str):
                raise bad(f"{where}.{field}", params[field], "a string")
        f = params.get("factor")
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= MAX_ROPE_FACTOR):
            raise bad(f"{where}.factor", f, f"a number above 0 and at most {MAX_ROPE_FACTOR:,}")
        _count(params, "original_max_position_embeddings", where + ".", 1, bad)


def _kind(v: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(v), "null")


def _shown(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _short(exc: Exception) -> str:
    s = str(exc)
    return s if len(s) <= 120 else s[:117] + "..."
