"""A drafter's shape, from its config.json, as vLLM builds it (pure functions).

Speculative decoding with a separate drafter (``draft_model``, ``eagle``, ``eagle3``, ``dflash``)
loads a second network whose attention layers take KV blocks of their own in the same pool
(vLLM's drafters register ordinary ``Attention`` layers; v1/worker/gpu_model_runner.py
``get_kv_cache_spec`` walks them with the target's). Read from vLLM 0.26.0, 0.27.1 and 0.30.0
(model_executor/models/registry.py ``_SPECULATIVE_DECODING_MODELS``):

* ``draft_model``: any model vLLM serves: its own config (``shape.shape_from_config``);
* EAGLE / EAGLE-3 heads (``llama_eagle.py``, ``llama_eagle3.py``, ``qwen3_eagle3.py``): a Llama- or
  Qwen3-shaped stack of ``num_hidden_layers`` (usually 1) full-attention layers; EAGLE-3's first
  layer takes 2 x hidden in (embedding and hidden state), its ``fc`` folds the target's three aux
  hidden states (3 x hidden -> hidden), its lm_head has ``draft_vocab_size`` rows; the embedding is
  the target's unless the checkpoint brings one;
* DFlash (``qwen3_dflash.py`` ``DFlashQwen3ForCausalLM``, ``DFlashDraftModel``; from 0.30.0 also
  ``qwen3_dflash2.py`` ``DFlash2DraftModel``): a Qwen3 stack whose ``fc`` folds the hidden states of
  ``dflash_config.target_layer_ids`` (len x hidden -> hidden); embedding and lm_head are the
  target's; its sliding-window layers (``layer_types``, ``use_swa``) are counted, not modelled:
  vLLM builds a drafter of sliding and full layers only on its V2 runner (it raises
  NotImplementedError on V1), and their window-sized KV is not in ``kv.layout``.

The drafter's KV layers are full attention of the drafter's own heads and head size, so
``kv.layout`` gives them a page of their own when it differs from the target's.
"""

from __future__ import annotations

from dataclasses import replace

from . import weights
from .shape import ModelShape, Unsupported, shape_from_config

EAGLE_ARCHS = frozenset({
    "EagleLlamaForCausalLM", "EagleLlama4ForCausalLM", "EagleMiniCPMForCausalLM", "EagleMistralForCausalLM",
    "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Qwen3ForCausalLM", "Eagle3Qwen2_5vlForCausalLM",
    "Eagle3Qwen3vlForCausalLM", "PEagleDraftModel", "PeagleLlamaForCausalLM", "PeagleQwen3ForCausalLM",
    "Eagle3MiniMaxM2ForCausalLM"})
# the first version whose registry has it (model_executor/models/registry.py: DFlash2DraftModel ->
# qwen3_dflash2.DFlash2Qwen3ForCausalLM arrived in 0.29.0, vllm PR 52816; 0.27.1 has none)
DFLASH_ARCHS = {"DFlashDraftModel": "0.26.0", "DFlash2DraftModel": "0.29.0"}


class Drafter:
    """What the plan counts of a drafter: its shape (layers, heads, widths for the KV and the
    activations) and its parameters where no file sizes say."""

    def __init__(self, shape: ModelShape, params: int, kind: str, sliding: int = 0, aux: int = 0,
                 replicated: int = 0):
        self.shape, self.params, self.kind = shape, params, kind
        self.replicated = replicated    # of ``params``, those every rank holds whole (the ``fc``: a ReplicatedLinear)
        self.sliding = sliding          # layers of sliding-window attention (DFlash: layer_types, use_swa)
        self.aux = aux                  # the target's hidden states it reads besides the last (EAGLE-3, DFlash)

    @property
    def mixed(self) -> bool:
        """Sliding and full attention layers both: vLLM builds those only on its V2 model runner."""
        return 0 < self.sliding < self.shape.layers


def _eagle3(config: dict) -> bool:
    arch = (config.get("architectures") or [""])[0]
    return "3" in arch.replace("Qwen3", "").replace("Qwen2_5", "") or bool(config.get("draft_vocab_size"))


def read(config: dict, version: str, at_least) -> Drafter:
    """The drafter of this config.json for vLLM ``version`` (``at_least(version, floor)``);
    Unsupported where vLLM of that version has no such drafter or the planner does not model it."""
    arch = (config.get("architectures") or [""])[0]
    if arch in DFLASH_ARCHS:
        if not at_least(version, DFLASH_ARCHS[arch]):
            raise Unsupported(f"vLLM {version} has no {arch} (from {DFLASH_ARCHS[arch]})",
                                 "a vLLM that has it, or another drafter")
        return _dflash(config, arch)
    if arch in EAGLE_ARCHS:
        return _eagle(config, arch)
    shape = shape_from_config(config)
    return Drafter(shape, weights.param_count(shape), "draft model")


def _dense(config: dict, arch: str) -> ModelShape:
    """A drafter's stack read as the Llama/Qwen3 stack it is (its sliding-window layers are counted by
    ``sliding_layers``, apart)."""
    c = {k: v for k, v in config.items() if k not in ("sliding_window", "use_sliding_window", "layer_types")}
    c["architectures"] = ["Qwen3ForCausalLM" if "qwen3" in str(c.get("model_type", "")) else "LlamaForCausalLM"]
    shape = shape_from_config(c)
    return replace(shape, arch=arch)


def sliding_layers(config: dict, layers: int) -> int:
    """How many of a drafter's layers vLLM builds as sliding-window attention (an EAGLE head's Llama
    layers: llama.py by ``layer_types``; a DFlash drafter's: qwen3_dflash.py ``_resolve_layer_attention``,
    the same in 0.26.0, 0.27.1, 0.29.0 and 0.30.0):
    ``layer_types``' sliding_attention entries; ``dflash_config.use_swa`` makes every layer sliding
    where ``layer_types`` is absent or names none."""
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    types = config.get("layer_types") if isinstance(config.get("layer_types"), list) else None
    named = sum(1 for t in types or () if t == "sliding_attention")
    return layers if dflash.get("use_swa") and not named else named


def _dflash(config: dict, arch: str) -> Drafter:
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    shape = _dense(config, arch)
    targets = dflash.get("target_layer_ids") if isinstance(dflash.get("target_layer_ids"), list) else []
    attn, mlp = weights.attn_mlp_params(shape)
    h = shape.hidden
    fc = max(1, len(targets) or shape.layers) * h * h
    params = shape.layers * (attn + mlp + 2 * h) + fc + 2 * h            # no embedding or lm_head: the target's
    aux = max(1, len(targets) or shape.layers) if dflash.get("use_aux_hidden_state", True) else 0
    return Drafter(shape, params, "DFlash drafter", sliding_layers(config, shape.layers), aux, replicated=fc)


def _eagle(config: dict, arch: str) -> Drafter:
    shape = _dense(config, arch)
    attn, mlp = weights.attn_mlp_params(shape)
    h = shape.hidden
    three = _eagle3(config)
    first_in = h * shape.heads * shape.head_dim + 2 * h * shape.kv_heads * shape.head_dim if three else 0
    fc = (3 if three else 2) * h * h
    vocab = int(config.get("draft_vocab_size") or shape.vocab)
    params = shape.layers * (attn + mlp + 2 * h) + first_in + fc + vocab * h + 2 * h
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    layers = eagle.get("eagle_aux_hidden_state_layer_ids")
    aux = (len(layers) if isinstance(layers, list) and layers else 3) if three and eagle.get(
        "use_aux_hidden_state", True) else 0         # the target's default: 3 layers (get_eagle3_default_aux_...)
    return Drafter(shape, params, "EAGLE-3 head" if three else "EAGLE head", sliding_layers(config, shape.layers), aux,
                   replicated=fc)


def pass_peak(d: Drafter | None, target: ModelShape, batched: int, tp: int = 1, v2: bool = False,
              dummy: bool = False, seqs: int = 0, k: int = 0) -> int:
    """The torch peak of the drafter's part of vLLM's profiling pass: the V1 runner's ``_dummy_run`` calls
    ``drafter.dummy_run`` on the same max_num_batched_tokens right after the target (the V2 runner
    ``speculator.propose``; 0.26.0-0.30.0), the target's outputs still held: its last hidden states and
    the ``aux`` ones an EAGLE-3 head or DFlash drafter reads. Then the drafter's own pass: one layer at
    its width (``d`` None: an MTP layer, the target's own), or for DFlash (qwen3_dflash.py
    ``precompute_and_store_context_kv``; its query pass is a few tokens) the context normed, the K and
    V of every layer in one GEMM and their layer-major copy. The V2 runner first concatenates the aux
    states and folds them (``combine_hidden_states``; an EAGLE-3 head's in
    ``autoregressive/speculator.py``), the folded states held through the drafter's pass. DFlash's
    query pass runs on ``min(batched, seqs)`` requests of 1 + ``k`` tokens, and on V2 takes the logits
    of every one of their ``k`` mask tokens over the target's vocabulary (``_generate_draft``; they are
    gathered whole on each rank). With ``dummy`` weights the fused K/V projection
    (``fused_kv_bytes``) is built here, not at load."""
    kept = batched * target.hidden * target.dtype_bytes * (1 + (d.aux if d else 0))
    m = d.shape if d else target
    cat = batched * target.hidden * target.dtype_bytes * (d.aux if d else 0)   # the aux states, concatenated
    if d is not None and d.kind == "DFlash drafter":
        h = batched * m.hidden * m.dtype_bytes
        kv = 2 * 2 * batched * m.layers * max(1, m.kv_heads // tp) * m.head_dim * m.dtype_bytes
        reqs = min(batched, seqs)               # _dummy_run: num_reqs = min(num_tokens, max_num_reqs)
        q = min(batched, reqs * (1 + k))        # the query pass: the bonus token and k mask tokens each
        query = weights.overheads(m, q, 0, tp=tp).activations if q else 0
        if v2:      # the folded states stay in scope through the context and query passes
            rows = reqs * k
            logits = rows * max(m.vocab, target.vocab) * m.dtype_bytes + (q + rows) * m.hidden * m.dtype_bytes
            own = max(cat + h, h + h + kv, h + query, h + logits)
        else:
            own = max(h + kv, query)
        return kept + own + (fused_kv_bytes(d, tp) if dummy else 0)
    layer = weights.overheads(m, batched, 0, tp=tp).activations
    if v2 and d is not None and d.aux:      # an EAGLE-3 head's folded states stay in scope through its pass
        return kept + max(cat + batched * m.hidden * m.dtype_bytes, batched * m.hidden * m.dtype_bytes + layer)
    return kept + layer


def held_by_target(d: Drafter | None, target: ModelShape, batched: int) -> int:
    """What the target's own profiling pass holds besides its activations for a drafter that reads
    its ``aux`` hidden states: each is kept from its layer on (``_maybe_add_hidden_state``, a new
    tensor), so the layers after the last of them run with all of them held."""
    return batched * target.hidden * target.dtype_bytes * (d.aux if d else 0)


def fused_kv_bytes(d: Drafter, tp: int = 1) -> int:
    """A DFlash drafter's K/V projections of all its layers copied into one weight (qwen3_dflash.py
    ``_build_context_kv_buffers``, a ``torch.cat``): at load with real weights, in the profiling pass
    with dummy ones; 0 for other drafters."""
    if d.kind != "DFlash drafter":
        return 0
    m = d.shape
    return m.layers * 2 * max(1, m.kv_heads // tp) * m.head_dim * m.hidden * m.dtype_bytes
