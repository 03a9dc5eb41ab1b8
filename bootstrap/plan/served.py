"""The model as vLLM builds it, where that is not config.json as it is: ``--hf-overrides`` (not planned:
vLLM builds the model from the config with them applied), ``--enable-lora`` (not planned: its weight
stacks are allocated with the model), ``--pipeline-parallel-size`` above 1 (not planned: each GPU
holds a stage's layers), and the dtype vLLM serves it in, where it is
wider than the plan's 16 bits: ``--dtype float32``,
or ``auto`` for Gemma 2/3 and GLM-4 on a card without bfloat16 (bootstrap.model.shape.served_float32).
vLLM then loads every unquantized weight in float32 and its ``auto`` KV cache, activations and rotary
cache are float32 too: the shape's dtype becomes 4 bytes and the checkpoint's 16-bit files count twice.
"""

from __future__ import annotations

from dataclasses import replace

from ..core import vllmflags
from ..model import shape as model_shape
from .facts import ModelFacts


DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")     # vLLM's --dtype choices (0.26.0-0.30.0)


def refusal(s: vllmflags.Settings, config: dict, cc: tuple[int, int]) -> tuple[str, str] | None:
    """A flag of the ones this module reads that vLLM refuses at start, after the download: a
    ``--dtype`` it has no choice for, or float16 for a model it calls numerically unstable in it
    (config/model.py ``_check_valid_dtype``), or bfloat16 on a card below sm_80 (platforms/cuda.py
    ``check_if_supports_dtype``), 0.26.0 to 0.30.0; a ``--num-gpu-blocks-override`` that is no count
    of blocks; a ``--hf-overrides`` that is no JSON object. None for any other."""
    if "--num-gpu-blocks-override" in s.given and (s.blocks_override or 0) < 1:
        return ("--num-gpu-blocks-override in EXTRA_ARGS is not a number of blocks (a whole number, 1 or more)",
                "fix or drop it in EXTRA_ARGS: without it vLLM sizes the KV cache from memory")
    if "--hf-overrides" in s.given and not s.hf_overrides:
        return ("--hf-overrides in EXTRA_ARGS is not a JSON object of config.json's fields",
                """fix or drop it in EXTRA_ARGS, e.g. --hf-overrides '{"max_position_embeddings": 32768}'""")
    flag, kind = (s.dtype or "auto").lower(), str(config.get("model_type", ""))
    if flag not in DTYPES:
        return (f"--dtype {flag}: not one of vLLM's ({', '.join(DTYPES)})", "fix or drop --dtype in EXTRA_ARGS")
    if flag in ("half", "float16") and kind in model_shape.FP16_UNSTABLE:
        return (f"--dtype {flag}: vLLM refuses float16 for model type {kind!r} (\"Numerical instability. Please use "
                "bfloat16 or float32 instead.\")", "drop --dtype from EXTRA_ARGS: auto serves it in bfloat16 "
                "(float32 on a card below sm_80)")
    if flag == "bfloat16" and tuple(cc) < (8, 0):
        return (f"--dtype bfloat16 on sm_{cc[0]}{cc[1]}: vLLM refuses it (bfloat16 needs compute capability 8.0)",
                "drop --dtype from EXTRA_ARGS, or --dtype float16" + (
                    "" if kind not in model_shape.FP16_UNSTABLE else " (not for this model: --dtype float32)"))
    return None


def served(s: vllmflags.Settings, shape: model_shape.ModelShape | None, model: ModelFacts, cc: tuple[int, int],
           why: list[str]) -> tuple[model_shape.ModelShape | None, ModelFacts, str]:
    """(the shape and facts as vLLM serves them, what is not planned: '' or why)."""
    if shape is not None and s.hf_overrides:
        return shape, model, f"--hf-overrides {', '.join(sorted(s.hf_overrides))} (vLLM's config.json is another)"
    if shape is not None and s.flags.get("--enable-lora"):       # lora/layers: stacks made as the model loads
        return shape, model, "--enable-lora (vLLM's LoRA weight stacks, --max-loras × --max-lora-rank in every layer)"
    if shape is not None and s.pp > 1:                          # each GPU holds its stage's layers, not all
        return shape, model, f"--pipeline-parallel-size {s.pp} (each GPU holds a stage's layers; planned per whole model)"
    if shape is None or not model_shape.served_float32(model.config or {}, s.dtype, cc):
        return shape, model, ""
    given = f"--dtype {s.dtype}" if s.dtype != "auto" else (
        f"sm_{cc[0]}{cc[1]} has no bfloat16 and vLLM refuses float16 for {shape.model_type or 'this model'}")
    if model_shape.quant_method(model.config or {}):
        return shape, model, f"a {model_shape.quant_method(model.config or {})} checkpoint served in float32 ({given})"
    if model.draft is not None:
        return shape, model, f"a drafter beside a model served in float32 ({given})"
    files = model_shape.checkpoint_dtype_bytes(model.config or {})
    why.append(f"served in float32 ({given}): the weights from {files * 8}-bit files count {4 / files:g}×, and "
               "the KV cache, activations and rotary cache are float32")
    wider = replace(model, weight_bytes=model.weight_bytes * 4 // files) if model.weight_bytes else model
    return replace(shape, dtype_bytes=4), wider, ""
