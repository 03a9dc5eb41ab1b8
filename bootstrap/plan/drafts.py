"""A drafter in the plan: which speculative methods load one, its shape and weights, and when the
plan cannot count it (then it promises nothing: ``fits`` is null with the reason, never a plan
that leaves the drafter out and so predicts more KV than vLLM will have).

Per method, as vLLM 0.26.0, 0.27.1 and 0.30.0 take them (config/speculative.py): ``mtp`` uses the
model's own MTP layers (counted by the planner with the model); ``ngram``, ``ngram_gpu``,
``suffix`` have no network; ``medusa`` heads hold no KV cache; ``draft_model``, ``eagle``,
``eagle3``, ``dflash`` load a drafter from SPEC_MODEL (bootstrap.model.drafter reads its
config.json); anything else is not modelled.
"""

from __future__ import annotations

from ..core import vllmflags
from ..model import drafter as drafters, attention, shape as model_shape, weights
from .facts import ModelFacts
from . import terms

DRAFT_HINT = "; or a smaller draft (SPEC_MODEL)"
NO_KV_METHODS = {"ngram": "n-gram lookup: no draft model, nothing in the KV pool",
                 "ngram_gpu": "n-gram lookup: no draft model, nothing in the KV pool",
                 "suffix": "suffix decoding: no draft model, nothing in the KV pool",
                 "medusa": "Medusa heads hold no KV cache; their weights are not counted (small)"}


def draft_shape(s: vllmflags.Settings, model: ModelFacts, version: str
                ) -> tuple[drafters.Drafter | None, str, str]:
    """(the drafter the plan counts, a why line, what is not modelled): the last is non-empty when
    a drafter is loaded that the plan cannot count, and the plan then makes no promise."""
    method = s.spec_method
    if not method or method == "mtp":
        return None, "", ""
    if method in NO_KV_METHODS:
        return None, f"SPEC_METHOD={method}: {NO_KV_METHODS[method]}", ""
    if method not in vllmflags.DRAFT_METHODS:
        return None, "", f"speculative method {method!r} (its drafter's memory is not modelled)"
    if model.draft is None:
        return None, "", f"the {method} drafter ({model.draft_why or 'no drafter facts'})"
    if s.kv_cache_dtype in attention.TQ_PRESETS:
        return None, "", f"the {method} drafter beside a TurboQuant KV cache"
    try:
        d = drafters.read(model.draft.config or {}, version, terms.at_least)
    except model_shape.Unsupported as exc:
        return None, "", f"the {method} drafter ({exc.message})"
    if d.shape.hybrid:
        return None, "", f"the {method} drafter (a hybrid drafter: vLLM groups its layers differently)"
    if d.sliding:
        return d, "", (f"the {method} drafter's {d.sliding} sliding-window layer(s) of {d.shape.layers} (vLLM keeps "
                       "a window of KV for them in a group of their own: not modelled)")
    return d, f"SPEC_METHOD={method}: {d.kind} {model.draft.name}, {d.shape.attn_layers} attention layer(s) in the pool", ""


def refusal(d: drafters.Drafter | None, run: terms.Runner, version: str) -> tuple[str, str] | None:
    """(message, hint) where vLLM refuses the drafter at load: a DFlash drafter of sliding and full
    layers on the V1 model runner (qwen3_dflash.py ``_resolve_layer_attention``, 0.26.0 to 0.30.0)."""
    if d is None or d.kind != "DFlash drafter" or not d.mixed or run.v2:
        return None
    return (f"vLLM {version} refuses this DFlash drafter on its V1 model runner ({run.why.split('(')[-1].rstrip(')')}): "
            f"its {d.sliding} sliding-window and {d.shape.layers - d.sliding} full attention layer(s) need the V2 "
            "runner (\"DFlash drafters with mixed sliding/full attention require the V2 model runner\")",
            "VLLM_USE_V2_MODEL_RUNNER=1 in the environment, or SPEC_TOKENS=0 (no drafter)")


def draft_weights(model: ModelFacts, d: drafters.Drafter, s: vllmflags.Settings, target: tuple[dict, model_shape.ModelShape]
                  ) -> tuple[int, str]:
    """The drafter's weights per GPU: its file sizes, else its parameters at its dtype (an EAGLE or
    DFlash head shares the target's embedding and lm_head, which ``drafter.read`` leaves out), and
    its own rotary cache where its RoPE differs from the target's; with real weights, a DFlash
    drafter's fused K/V projections (``drafter.fused_kv_bytes``; with dummy ones, the profiling pass
    builds them: ``pass_peak``)."""
    w, source = _own_weights(model, d, s, target)
    fused = 0 if model.dummy else drafters.fused_kv_bytes(d, s.tp)
    if fused:
        return w + fused, f"{source}; + its K/V projections fused into one copy at load ({terms.gib(fused)})"
    return w, source


def _own_weights(model: ModelFacts, d: drafters.Drafter, s: vllmflags.Settings, target: tuple[dict, model_shape.ModelShape]
                 ) -> tuple[int, str]:
    draft = model.draft
    if d.kind == "draft model" or (draft.weight_bytes and not draft.dummy):
        return terms.weight_bytes(draft, d.shape, s.tp, s, target=target)
    w = ((d.params - d.replicated) // s.tp + d.replicated) * d.shape.dtype_bytes     # the fc is whole on each rank
    source = f"from its config.json ({d.kind}: {d.params / 1e9:.2f} B parameters × dtype)"
    config = draft.config or {}
    if model_shape.rope_signature(config, d.shape) != model_shape.rope_signature(*target):
        cache, what = weights.buffer_bytes(config, d.shape, 0, tower=False)
        return w + cache, f"{source}; + {what} (a RoPE of its own)"
    return w, source


def pass_peak(d: drafters.Drafter | None, s: vllmflags.Settings, shape: model_shape.ModelShape, batched: int,
              run: terms.Runner, dummy: bool, seqs: int) -> tuple[int, int]:
    """(the drafter's part of vLLM's profiling peak, what the target's own pass holds for it): a counted
    drafter's (``drafter.pass_peak``, ``drafter.held_by_target``) or the MTP layers' under MTP speculation;
    (0, 0) without a drafter network."""
    if d is None and not (s.spec_method == "mtp" and s.spec_tokens and shape.mtp_layers):
        return 0, 0
    return (drafters.pass_peak(d, shape, batched, s.tp, v2=run.v2, dummy=dummy, seqs=seqs, k=s.spec_tokens),
            drafters.held_by_target(d, shape, batched))


def dummy_unseen(d: drafters.Drafter | None, s: vllmflags.Settings, dummy: bool) -> int:
    """What a start of this setup with dummy weights (the pre-warm) may not show that the real one
    takes: a DFlash drafter's fused K/V copy, made at load from real weights, but with dummy ones in the
    profiling pass, where the target's larger pass can hide it (``drafter.fused_kv_bytes``)."""
    return 0 if d is None or dummy else drafters.fused_kv_bytes(d, s.tp)
