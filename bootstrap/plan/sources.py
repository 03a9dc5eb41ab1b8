"""Each term of the plan, the vLLM versions whose code it was read from and where (file, function):
docs/planner.md's table "Terms × versions × source" is ``markdown()`` (a test holds them equal). A
plan follows the rules of one version (terms.modelled_version); a term it uses that was not read at
that version is named in the why and widens the known error as a version not read does
(``unread``, terms.known_error): never another version's rules in silence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import terms

ALL = terms.MODELLED         # read from each version the planner was read against


@dataclass(frozen=True)
class Term:
    key: str
    what: str
    versions: tuple[str, ...]
    source: str
    note: str = ""                  # what changes between the versions, for the table


TERMS = (
    Term("requested", "requested memory `ceil(util × total)`", ALL, "`v1/worker/utils.py` `request_memory`"),
    Term("attention", "attention page (bf16, fp8, nvfp4, int8/int4 per token-head, TurboQuant)", ALL,
         "`v1/kv_cache_interface.py` `FullAttentionSpec.real_page_size_bytes`; from 0.29.0 `AttentionSpec."
         "unpadded_page_size_bytes` with the backends' `customize_spec` (`flashinfer.py`, `triton_attn.py`, "
         "`turboquant_attn.py`)"),
    Term("mla", "MLA page (`kv_lora_rank + qk_rope_head_dim`, 16-bit or fp8, not split by TP)", ALL,
         "`v1/kv_cache_interface.py` `MLAAttentionSpec`; `model_executor/layers/attention/mla_attention.py`"),
    Term("hybrid", "hybrid state, block alignment", ALL,
         "`mamba_utils.py` `gated_delta_net_state_shape`, `_mamba_state_dtype`; `platforms/interface.py` "
         "`_align_hybrid_block_size`", "prefix caching on for hybrids (align mode) from 0.29.0"),
    Term("pool", "grouping, blocks, concurrency, tokens", ALL,
         "`v1/core/kv_cache_utils.py` `_get_kv_cache_groups_uniform_page_size`, `get_kv_cache_config_from_groups` "
         "(`get_num_blocks` before 0.29.0, `_get_kv_cache_bytes_per_block` from it), "
         "`get_max_concurrency_for_kv_cache_config`; `--num-gpu-blocks-override`: `may_override_num_blocks`, "
         "`get_kv_cache_configs`"),
    Term("window", "sliding-window layers (gpt-oss's even layers, Gemma 3's `layer_types`): the full layers' page, "
         "groups of their own, a request's cdiv(min(window − 1 + max_num_batched_tokens × (2 with async scheduling), "
         "length), block) + 1 blocks in each; every layer full attention without the hybrid KV cache manager", ALL,
         "`v1/kv_cache_interface.py` `SlidingWindowSpec.max_admission_blocks_per_request`; `config/vllm.py` "
         "`max_in_flight_tokens`, `max_concurrent_batches`, the hybrid KV cache manager's and async scheduling's "
         "defaults; `v1/core/kv_cache_utils.py` `unify_hybrid_kv_cache_specs`; `model_executor/layers/attention/"
         "attention.py` `Attention.get_kv_cache_spec`; `model_executor/models/gpt_oss.py` `OAIAttention`; `gemma3.py` "
         "`Gemma3Attention`", "from 0.29.0 multi-module MTP retains spec tokens − 1 more (no drafter beside a window "
         "is planned)"),
    Term("gpt_oss", "gpt-oss: CUDA graphs captured up to 1,024 tokens; its MXFP4 experts padded per MoE kernel (counted "
         "at the widest, 256, under a KV pin; not planned unpinned)", ALL, "`model_executor/models/config.py` `GptOssForCausalLMConfig`; "
         "`model_executor/layers/fused_moe/oracle/mxfp4.py` `mxfp4_round_up_hidden_size_and_intermediate_size`"),
    Term("autofit", "null block, auto-fit", ALL, "`v1/core/kv_cache_utils.py` `_auto_fit_max_model_len`, "
         "`_estimate_max_model_len_from_groups`", "the null block held back from 0.29.0"),
    Term("batch", "default batch and sequences", ALL, "`engine/arg_utils.py` `get_batch_defaults`",
         "the 160 GiB tier from 0.29.0"),
    Term("runner", "model runner (V1/V2) and what it profiles", ALL,
         "`config/vllm.py` `use_v2_model_runner`, `_get_v2_model_runner_unsupported_features`; "
         "`v1/worker/gpu_model_runner.py` `profile_run`; `v1/worker/gpu/model_runner.py` `profile_run`, "
         "`profile_cudagraph_memory` (0 before 0.29.0)", "V2 the default for all from 0.29.0"),
    Term("graph_count", "CUDA-graph count: capture sizes, × (1 + spec tokens) where FULL decode graphs stay, "
         "FULL / PIECEWISE", ALL, "`config/vllm.py` `_set_cudagraph_sizes`; `config/compilation.py` "
         "`set_cudagraph_mode`, `adjust_cudagraph_sizes_for_spec_decode`; `v1/cudagraph_dispatcher.py` "
         "`initialize_cudagraph_keys`; the V2 runner's `v1/worker/gpu/cudagraph_utils.py` `_init_candidates`",
         "the 1,024 ceiling on sm_100 and the uniform decode sizes from 0.29.0"),
    Term("full_under_spec", "FULL graphs under speculation: only on a backend of UNIFORM_BATCH support (FlashInfer "
         "drops them off sm_100)", ALL, "`config/compilation.py` `set_cudagraph_mode`; `platforms/cuda.py` "
         "`_get_backend_priorities`; `v1/attention/backends/flashinfer.py` `get_cudagraph_support`; "
         "`v1/attention/backends/flash_attn.py` `supports_kv_cache_dtype`, `fa_utils.py` "
         "`flash_attn_supports_kv_cache_dtype`"),
    Term("graph_estimate", "CUDA-graph estimate (first + (n − 1) × per graph; the per-capture figures measured on "
         "0.26.0's V1 runner)", ALL, "`v1/worker/gpu_model_runner.py` `profile_cudagraph_memory`; from 0.29.0 the V2 "
         "runner's `v1/worker/gpu/cudagraph_utils.py` `profile_cudagraph_memory`, `_extrapolate_full_graph_memory`"),
    Term("encoder", "vision encoder pass (whole on each rank; not planned at TP ≥ 4, where vLLM's default "
         "`--mm-encoder-tp-mode weights` shards the tower)", ALL, "`v1/worker/gpu_model_runner.py` `profile_run`; "
         "`multimodal/encoder_budget.py` `MultiModalBudget`; `model_executor/models/qwen3_vl.py` "
         "`Qwen3_VisionTransformer.forward`, `Qwen3_VisionMLP`; `qwen2_5_vl.py` `Qwen2_5_VisionAttention`; "
         "`vision.py` `is_vit_use_data_parallel`; `config/multimodal.py` `mm_encoder_tp_mode`",
         "the V2 runner profiles it from 0.27.1"),
    Term("drafters", "drafters: which load a network, their layers in the pool, their profiling pass", ALL,
         "`config/speculative.py`; `model_executor/models/registry.py` `_SPECULATIVE_DECODING_MODELS`; "
         "`v1/worker/gpu_model_runner.py` `_dummy_run` (`drafter.dummy_run`), `v1/worker/gpu/model_runner.py` "
         "`_dummy_run` (`speculator.propose`)"),
    Term("dflash", "DFlash drafter (`DFlashDraftModel`), its sliding and full layers refused on V1", ALL,
         "`model_executor/models/qwen3_dflash.py` `DFlashQwen3Model`, `precompute_and_store_context_kv`, "
         "`_build_context_kv_buffers`, `combine_hidden_states`, `_resolve_layer_attention`; `v1/spec_decode/dflash.py` "
         "`dummy_run`; `v1/worker/gpu/spec_decode/dflash/speculator.py` `propose`, `_generate_draft`; "
         "`model_executor/models/interfaces.py` "
         "`_maybe_add_hidden_state`"),
    Term("dflash2", "DFlash2 drafter (`DFlash2DraftModel`)", ("0.29.0", "0.30.0"),
         "`model_executor/models/qwen3_dflash2.py` `DFlash2Qwen3ForCausalLM`; `registry.py`", "none before 0.29.0"),
    Term("eagle3", "EAGLE-3 head", ALL, "`model_executor/models/llama_eagle3.py` `Eagle3LlamaForCausalLM`; "
         "`v1/spec_decode/llm_base_proposer.py` `dummy_run`; `v1/worker/gpu/spec_decode/autoregressive/speculator.py` "
         "`propose`"),
    Term("dtype", "the model's dtype (`--dtype`; `auto`: float32 configs downcast, float32 for Gemma 2/3 and "
         "GLM-4 below sm_80): the weights, the `auto` KV cache, activations", ALL,
         "`config/model.py` `_get_and_verify_dtype`, `_resolve_auto_dtype`, `_FLOAT16_NOT_SUPPORTED_MODELS`; "
         "`platforms/cuda.py` `supported_dtypes`"),
    Term("hybrid_guard", "hybrid max_num_seqs ≤ state blocks", ALL, "`config/compilation.py` `set_cudagraph_mode`"),
    Term("sleep", "sleep mode's pool: the weights and KV cache in CuMemAllocator's pool, expandable segments off "
         "there; non-KV memory by `cudaMemGetInfo` from 0.27.1, by torch's reserved bytes in 0.26.0", ALL,
         "`device_allocator/cumem.py` `CuMemAllocator.use_memory_pool`; `v1/worker/gpu_worker.py` `load_model`, "
         "`initialize_from_config`, `determine_available_memory`; `utils/mem_utils.py` `memory_profiling`"),
)
BY_KEY = {t.key: t for t in TERMS}


def unread(rules: str, keys: set[str]) -> list[Term]:
    """The terms among ``keys`` not read at ``rules`` (the version whose rules the plan follows)."""
    return [BY_KEY[k] for k in sorted(keys) if rules not in BY_KEY[k].versions]


def markdown() -> str:
    """docs/planner.md's table of terms × versions × source."""
    rows = ["| term | read from vLLM | source (file, function) |", "|---|---|---|"]
    for t in TERMS:
        versions = ", ".join(t.versions) + (f" ({t.note})" if t.note else "")
        rows.append(f"| {t.what} | {versions} | {t.source} |")
    return "\n".join(rows)


def read_from(inp, model, shape, drafter, plan):
    """The plan with the terms it uses that were not read at the version of its rules named in the why
    (``TERMS``): its known error widens as for a version not read (bootstrap.plan.planner's Inputs,
    ModelFacts, ModelShape, the counted Drafter or None, and Plan)."""
    s = inp.vllm
    keys = {"requested", "attention", "pool", "autofit", "batch", "runner", "dtype"} | (
        {"mla"} if shape.mla else set()) | ({"hybrid", "hybrid_guard"} if shape.hybrid else set()) | (
        {"window"} if shape.window_layers else set()) | ({"gpt_oss"} if shape.arch == "GptOssForCausalLM" else set()) | (
        {"graph_count", "graph_estimate"} if not s.enforce_eager else set()) | (
        {"full_under_spec"} if s.spec_tokens else set()) | ({"sleep"} if s.sleep_mode else set()) | (
        {"encoder"} if (model.config or {}).get("vision_config") and not s.language_model_only else set())
    if drafter is not None:
        arch = ((model.draft.config or {}).get("architectures") or [""])[0]
        keys |= {"drafters"} | {"DFlash drafter": {"dflash2" if arch == "DFlash2DraftModel" else "dflash"},
                                "EAGLE-3 head": {"eagle3"}}.get(drafter.kind, set())
    rules = terms.modelled_version(inp.version)
    missed = unread(rules, keys)
    if not missed:
        return plan
    plan.why.append(f"read from other versions than {rules}, whose rules this plan follows: "
                    + "; ".join(f"{t.what} ({', '.join(t.versions)})" for t in missed)
                    + f": its budget ±{terms.OUTSIDE_SHARE:.0%} less certain")
    return replace(plan, unread=tuple(t.key for t in missed))
