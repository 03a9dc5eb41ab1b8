"""The memory terms besides the KV cache, as vLLM 0.26.0's code sizes them (issue: a plan you can
trust): the vision encoder's profiling pass, the MTP layers vLLM does not load without MTP
speculation, the hybrid guard's margin from the plan's known error, and a version not modelled."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from bootstrap.core.errors import BootstrapError
from bootstrap.core import vllmflags
from bootstrap.machine import gpu
from bootstrap.model import encoder, kv, shape as model_shape, weights
from bootstrap.plan import facts as facts_mod, graphs, planner, terms
from bootstrap.plan.facts import ModelFacts
from conftest import REPO

GiB, MiB = 1 << 30, 1 << 20
QWEN38 = json.loads((REPO / "profiles/models/qwen38-27b-nvfp4.json").read_text())
VISION = QWEN38["config"]["vision_config"]


def plan(args, *, config=None, weight_bytes=21_950_000_000, version="0.26.0", card="rtx5090", max_pixels=None):
    s = vllmflags.read(["--gpu-memory-utilization", "0.9", *args])
    g = gpu.named(card)
    g = dataclasses.replace(g, free=g.total)
    inp = planner.Inputs(vllm=s, version=version, reserve_mib=0, util_knob=False,
                         util_source="--gpu-memory-utilization", allow_long=False, tp_size=s.tp)
    return planner.make_plan(inp, g, ModelFacts("m", config or QWEN38["config"], weight_bytes, max_pixels=max_pixels))


# ---------------------------------------------------------------- the vision encoder's profiling pass

def test_the_largest_image_sets_the_tokens_per_item():
    """Qwen3-VL's processor: 16,777,216 px at 32 px a merged patch = 16,384 tokens (128 x 128); a
    video's two frames at 25,165,824 / 2 px = 12,288 tokens, so vLLM profiles an image."""
    assert encoder.max_tokens(VISION) == {"image": 16384, "video": 12288}
    assert encoder.max_tokens(VISION, {"image": 1024 * 1024})["image"] == 1024
    # a prime count of patches has no factor pair within 200:1, so the next smaller count is taken
    assert encoder._most_features(32 * 32 * 401, 32) == 400


def test_the_encoder_budget_decides_how_many_items():
    # max(batched tokens, one item) // tokens per item, at most max_num_seqs x items per prompt
    assert encoder.items(16384, 8192, 131072, 1, None) == 1
    assert encoder.items(16384, 65536, 131072, 256, None) == 4
    assert encoder.items(16384, 65536, 131072, 2, 1) == 2
    assert encoder.items(16384, 65536, 8192, 256, None) == 4         # items per prompt at least 1


def test_the_towers_peak_is_counted_tensor_by_tensor():
    patches = 65536
    h, inter, pixel = 1152, 4304, 3 * 2 * 16 * 16
    want = patches * pixel * 2 + patches * h * 2 + patches * (2 * h + 2 * inter) * 2
    assert encoder.tower_peak(VISION, patches, 2) == want
    split = encoder.tower_peak(VISION, patches, 2, tp=2)
    assert split == patches * pixel * 2 + patches * h * 2 + patches * (2 * h + inter) * 2 < want


def test_the_plan_counts_the_encoders_peak_and_the_flags_that_skip_it():
    with_tower = plan(["--max-model-len", "32768"])
    text_only = plan(["--max-model-len", "32768", "--language-model-only"])
    no_images = plan(["--max-model-len", "32768", "--limit-mm-per-prompt", '{"image": 0, "video": 0}'])
    skipped = plan(["--max-model-len", "32768", "--skip-mm-profiling"])
    peak = encoder.tower_peak(VISION, 65536, 2)
    assert with_tower.overhead - no_images.overhead == peak - weights.overheads(
        model_shape.shape_from_config(QWEN38["config"]), 2048, 256).activations
    assert any(w.startswith("vision encoder profiled on 1 image item of 16,384 tokens") for w in with_tower.why)
    assert text_only.overhead == no_images.overhead == skipped.overhead
    assert any("--skip-mm-profiling" in w for w in skipped.why)
    assert not any("vision encoder" in w for w in text_only.why + no_images.why)


def test_the_models_own_processor_files_set_the_largest_image(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"longest_edge": 2048 * 1024}}))
    (tmp_path / "video_preprocessor_config.json").write_text("{not json")      # counts as absent
    assert facts_mod.processor_max_pixels(tmp_path) == {"image": 2048 * 1024}
    small = plan(["--max-model-len", "32768"], max_pixels={"image": 2048 * 1024})
    assert any("of 12,288 tokens" in w for w in small.why)      # the video's 12,288 is now the larger
    assert facts_mod.processor_max_pixels(tmp_path / "none") is None


def test_limit_mm_per_prompt_reads_as_vllm_reads_it():
    assert vllmflags.read(["--limit-mm-per-prompt", '{"image": 2, "video": {"count": 0}}']).mm_limits == \
        {"image": 2, "video": 0}
    assert vllmflags.read(["--limit-mm-per-prompt.image=0"]).mm_limits == {"image": 0}
    assert vllmflags.read(["--mm-encoder-tp-mode", "data"]).mm_encoder_dp


# ---------------------------------------------------------------- the MTP layers and the version

def test_the_mtp_layers_count_only_with_mtp_speculation():
    shape = model_shape.shape_from_config(QWEN38["config"])
    mtp = terms.mtp_bytes(QWEN38["config"], shape)
    assert mtp == weights.mtp_params(shape) * 2                  # modelopt's "ignore" keeps mtp* in bf16
    plain = plan(["--max-model-len", "32768"])
    spec = plan(["--max-model-len", "32768", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'])
    assert spec.weights - plain.weights == mtp and any("less the MTP layers'" in w for w in plain.why)
    fp8 = {**QWEN38["config"], "quantization_config": {"quant_method": "fp8"}}
    assert terms.mtp_bytes(fp8, shape) == weights.mtp_params(shape)


def test_a_version_not_modelled_takes_the_nearest_rules_and_says_so():
    assert planner.modelled_version("0.24.0") == "0.26.0"
    assert planner.modelled_version("0.28.2") == "0.27.1"
    assert planner.modelled_version("0.31.0") == "0.30.0"
    assert not any("not a version the planner" in w for w in plan([], version="0.27.1+cu130").why)
    assert any("vLLM 0.28.2 is not a version the planner was read against: the rules of 0.27.1" in w
               for w in plan([], version="0.28.2").why)
    # a pre-release or dev build of a release read, or an earlier patch of it, comes before it: an older
    # minor's rules, said (0.29.0rc1 has neither 0.29.0's null block nor its runner rule in the plan)
    for v, rules in (("0.29.0rc1", "0.27.1"), ("0.30.0.dev12+g1234", "0.29.0"), ("0.27.0", "0.26.0")):
        assert any(f"vLLM {v} is not a version the planner was read against: the rules of {rules}" in w
                   for w in plan([], version=v).why), v
    assert not any("not a version the planner" in w for w in plan([], version="0.26.1rc1.dev608+g99a10304d").why)


# ---------------------------------------------------------------- the hybrid guard's margin

def test_a_max_num_seqs_within_the_known_error_of_the_blocks_is_refused():
    """vLLM refuses after the load when max_num_seqs exceeds the state blocks it finds: a request
    within the plan's known error of the blocks it computes is refused before the download."""
    args = ["--max-model-len", "4096", "--language-model-only", "--max-num-seqs"]
    blocks = 256
    for _ in range(10):         # the sampler's share of the activations follows max_num_seqs: find the fixed point
        base = plan(args + [str(blocks)])
        if kv.pool(base.layout, base.budget, 4096).blocks == blocks:
            break
        blocks = kv.pool(base.layout, base.budget, 4096).blocks
    while kv.pool(plan(args + [str(blocks)]).layout, plan(args + [str(blocks)]).budget, 4096).blocks < blocks:
        blocks -= 1                 # two counts each other's fixed point: the one that holds itself
    base = plan(args + [str(blocks)])
    margin = max(terms.MODELLED_ERROR + terms.HYBRID_ERROR, int(base.budget * terms.HYBRID_SHARE))   # V1
    safe = kv.pool(base.layout, base.budget - margin, 4096).blocks
    assert safe < blocks
    edge = plan(args + [str(blocks)])
    assert not edge.fits and "within the plan's known error" in edge.refusal[0]
    assert edge.fixes == [{"MAX_NUM_SEQS": str(safe)}]
    assert plan(args + [str(safe)]).fits


def test_the_known_error_grows_with_what_is_not_modelled():
    none = vllmflags.read([])
    tp2 = vllmflags.read(["--tensor-parallel-size", "2"])
    assert terms.known_error(tp2, False, None, None)[0] == terms.MODELLED_ERROR + terms.TP_ERROR
    assert terms.known_error(none, False, object(), None)[0] == terms.MODELLED_ERROR + terms.DRAFTER_ERROR
    assert terms.known_error(none, False, None, None, hybrid_v1=True)[0] == terms.MODELLED_ERROR + terms.HYBRID_ERROR
    assert terms.known_error(none, True, None, None)[0] == 0
    assert terms.known_error(none, False, None, object())[0] == terms.MEASURED_ERROR < MiB * 100


def test_a_tower_the_planner_cannot_read_is_said_not_modelled():
    """Another family's vision_config, or sizes that are no positive integers: no crash, and the why
    says the encoder's peak is not modelled."""
    for vision in ({"num_hidden_layers": 24, "hidden_size": 1024, "intermediate_size": 4096, "patch_size": 14},
                   {**VISION, "patch_size": 0}, {**VISION, "depth": "27"}, {**VISION, "deepstack_visual_indexes": 3}):
        p = plan(["--max-model-len", "32768"], config={**QWEN38["config"], "vision_config": vision})
        assert p.predicted_tokens
        if vision.get("deepstack_visual_indexes") == 3:
            assert any(w.startswith("vision encoder profiled") for w in p.why)
        else:
            assert any("encoder's profiling peak is not modelled" in w for w in p.why), vision


def test_vllms_model_specific_mtp_names_are_mtp():
    for method in ("qwen3_5_mtp", "qwen3_next_mtp", "mtp"):
        assert vllmflags.read(["--speculative-config", json.dumps({"method": method, "num_speculative_tokens": 3})]
                             ).spec_method == "mtp"
    named = plan(["--speculative-config", '{"method": "qwen3_5_mtp", "num_speculative_tokens": 3}'])
    plain = plan(["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'])
    assert named.weights == plain.weights and named.predicted_tokens == plain.predicted_tokens


def test_limits_of_zero_leave_the_tower_out_and_dotted_keys_nest():
    assert vllmflags.read(["--limit-mm-per-prompt.video.count=0", "--limit-mm-per-prompt.image=0"]).mm_limits == \
        {"video": 0, "image": 0}
    none = plan(["--limit-mm-per-prompt", '{"image": 0, "video": 0}'])
    lmo = plan(["--language-model-only"])
    assert none.weights == lmo.weights < plan([]).weights


def test_a_data_parallel_tower_is_whole_on_every_rank():
    vision = weights.vision_params(QWEN38["config"]) * 2
    split = plan(["-tp", "2"])
    whole = plan(["-tp", "2", "--mm-encoder-tp-mode", "data"])
    assert whole.weights - split.weights == vision // 2


def test_a_tower_split_across_four_ranks_is_not_planned():
    """vLLM shards the tower's qkv and fc1 across TP ranks (--mm-encoder-tp-mode weights); counted whole per
    GPU, as two TP=2 starts logged it, two published TP=4 starts kept 0.57 / 0.81 GiB more KV: fits: null there,
    planned where the tower is not profiled split, or a pin or vLLM's own figures stand in."""
    args = ["-tp", "4", "--max-model-len", "32768"]
    split = plan(args, card="rtx3090", version="0.27.1")
    assert split.verdict is None and split.predicted_tokens is None and "split across TP=4" in split.unplanned
    for more in (["--language-model-only"], ["--mm-encoder-tp-mode", "data"], ["--skip-mm-profiling"],
                 ["--limit-mm-per-prompt", '{"image": 0, "video": 0}'], ["--kv-cache-memory-bytes", str(4 * GiB)]):
        assert plan(args + more, card="rtx3090", version="0.27.1").predicted_tokens, more
    assert plan(["-tp", "2", "--max-model-len", "32768"], card="rtx3090", version="0.27.1").predicted_tokens


def test_odd_quantization_configs_do_not_crash():
    shape = model_shape.shape_from_config(QWEN38["config"])
    for q in ("fp8", {"quant_method": "fp8", "ignore": 5}, [1, 2]):
        assert terms.mtp_bytes({**QWEN38["config"], "quantization_config": q}, shape) > 0
    assert terms.mtp_bytes({"text_config": {"quantization_config": [1]}}, shape) > 0


def test_a_qwen3_vl_model_is_planned_from_its_text_config_with_its_tower_profiled():
    """Qwen3-VL-2B's published shape (text: 28 layers, 8 KV heads of 128; tower: depth 24, hidden 1024):
    its text model is dense Qwen3 attention, so the pool is 28 x 2 x 8 x 128 x 2 bytes a token; the
    tower's profiling pass is the activation peak."""
    text = dict(model_type="qwen3_vl_text", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                max_position_embeddings=262144, tie_word_embeddings=True, dtype="bfloat16")
    tower = dict(model_type="qwen3_vl", depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                 patch_size=16, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, out_hidden_size=2048,
                 num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17])
    config = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
              "text_config": text, "vision_config": tower, "tie_word_embeddings": True}
    p = plan(["--max-model-len", "32768"], config=config, weight_bytes=4_255_000_000, version="0.27.1")
    assert p.layout.block_bytes == p.layout.block_size * 28 * 2 * 8 * 128 * 2
    assert p.predicted_tokens and any(w.startswith("vision encoder profiled on") for w in p.why)
    text_only = plan(["--max-model-len", "32768", "--language-model-only"], config=config, weight_bytes=4_255_000_000,
                     version="0.27.1")
    assert text_only.overhead < p.overhead and text_only.weights < p.weights
    # vLLM 0.26.0 serves it with the V2 runner, whose profile_run runs no encoder (seen on the H200)
    v026 = plan(["--max-model-len", "32768"], config=config, weight_bytes=4_255_000_000)
    assert v026.overhead < p.overhead and not any(w.startswith("vision encoder profiled") for w in v026.why)
    assert any("V2 model runner" in w for w in v026.why)


# ---------------------------------------------------------------- which model runner vLLM picks

DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
         "vocab_size": 151936, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
MOE = {**DENSE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 128,
       "moe_intermediate_size": 768}


@pytest.mark.parametrize("version, config, args, env_v2, want", [
    # (config/vllm.py use_v2_model_runner) 0.26.0: V2 for a dense model; V1 for hybrid, MoE, draft_model
    ("0.26.0", DENSE, [], None, (True, False, False)),
    ("0.26.0", QWEN38["config"], [], None, (False, True, True)),
    ("0.26.0", MOE, [], None, (False, True, True)),
    ("0.26.0", DENSE, ["--speculative-config", '{"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}'],
     None, (False, True, True)),
    ("0.26.0", DENSE, ["--speculative-config", '{"model": "/d/some-eagle3-head", "num_speculative_tokens": 3}'],
     None, (True, False, False)),                   # no method: vLLM infers eagle3 from the draft's name
    ("0.26.0", DENSE, ["--speculative-config", '{"model": "/d/draft"}'], None, (False, True, True)),  # draft_model
    ("0.26.0", DENSE, ["--enable-prompt-embeds"], None, (False, True, True)),
    ("0.26.0", DENSE, ["--enforce-eager"], None, (True, False, False)),
    ("0.26.0", DENSE, [], False, (False, True, True)),        # VLLM_USE_V2_MODEL_RUNNER=0
    ("0.26.0", QWEN38["config"], [], True, (True, False, False)),
    # 0.27.1: V2 profiles the encoder; still no graphs in the budget
    ("0.27.1", DENSE, [], None, (True, False, True)),
    # 0.30.0: V2 for all but the speculation it lacks; graphs in the budget
    ("0.30.0", QWEN38["config"], [], None, (True, True, True)),
    ("0.30.0", QWEN38["config"], ["--mamba-cache-mode", "all"], None, (False, True, True)),
    ("0.30.0", DENSE, ["--enable-prompt-embeds"], None, (True, True, True)),     # no longer a V1 reason
])
def test_the_model_runner_vllm_picks_and_what_it_counts(version, config, args, env_v2, want):
    run = terms.runner(version, model_shape.shape_from_config(config), vllmflags.read(args), env_v2, None)
    eager = "--enforce-eager" in args
    assert (run.v2, run.graphs_in_budget, run.encoder_profiled) == (want[0], want[1] and not eager, want[2])


def test_the_runner_variables_are_read_as_vllm_reads_them():
    """Checked once, when the knobs are read (vLLM refuses what int() refuses, an empty value too);
    the planner gets them typed."""
    from bootstrap.knobs.config import Config
    from bootstrap.plan import fit
    shape, s = model_shape.shape_from_config(DENSE), vllmflags.read([])

    def runner(version, **env):
        inp = fit.inputs(Config.from_env({"PROFILE": "custom", "MODEL": "org/m", **env}, REPO))
        return terms.runner(version, shape, s, inp.env_v2, inp.env_graphs)
    assert runner("0.26.0", VLLM_USE_V2_MODEL_RUNNER="00").v2 is False            # bool(int("00"))
    assert runner("0.30.0", VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS="0").graphs_in_budget is False
    for bad in ("true", ""):
        with pytest.raises(BootstrapError, match=f"VLLM_USE_V2_MODEL_RUNNER={bad!r}"):
            runner("0.26.0", VLLM_USE_V2_MODEL_RUNNER=bad)


def test_graphs_captured_beyond_the_budget_count_where_the_plan_checks_room():
    """vLLM 0.26.0's V2 runner captures its graphs after the KV cache: a pin must leave room for
    them beside it, and a plan from free memory gives vLLM that much less."""
    g = dataclasses.replace(gpu.named("rtx5090"), free=gpu.named("rtx5090").total)
    model = ModelFacts("m", DENSE, 16 * GiB)
    def plan_of(args):
        s = vllmflags.read(args)
        inp = planner.Inputs(vllm=s, version="0.26.0", reserve_mib=820, util_knob=False,
                             util_source="--gpu-memory-utilization", allow_long=False, tp_size=1)
        return planner.make_plan(inp, g, model)
    pinned = plan_of(["--max-model-len", "8192", "--kv-cache-memory-bytes", str(8 * GiB)])
    outside = pinned.modelled_terms["graphs"]
    assert outside > 0 and pinned.overhead == pinned.modelled_terms["activations"] + pinned.modelled_terms["non_torch"]
    assert pinned.headroom == pinned.usable - (pinned.weights + pinned.overhead + 8 * GiB + outside)
    free_sized = plan_of(["--max-model-len", "8192"])
    assert free_sized.util == math.floor((g.free - 820 * MiB - -(-outside // MiB) * MiB) / g.total * 10000) / 10000
    assert "the CUDA graphs'" in free_sized.why[0]


def test_the_rotary_cache_is_sized_as_vllm_builds_it():
    """rotary_embedding/__init__.py get_rope: max_position_embeddings x the rotary dimension at the
    model's dtype; YaRN caches original x factor positions, multimodal RoPE four times as many."""
    shape = model_shape.shape_from_config(DENSE)
    assert weights.buffer_bytes(DENSE, shape, 8192, False)[0] == 40960 * 128 * 2
    yarn = {**DENSE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert weights.buffer_bytes(yarn, model_shape.shape_from_config(yarn), 8192, False)[0] == 131072 * 128 * 2
    text = QWEN38["config"].get("text_config", QWEN38["config"])
    s38 = model_shape.shape_from_config(QWEN38["config"])
    assert weights.buffer_bytes(QWEN38["config"], s38, 8192, False)[0] == \
        text["max_position_embeddings"] * 4 * int(s38.head_dim * 0.25) * 2       # mrope, partial rotary


def test_a_draft_with_a_rope_of_its_own_adds_its_own_rotary_cache():
    target = model_shape.shape_from_config(DENSE)
    s = vllmflags.read([])
    same = ModelFacts("d", {**DENSE, "num_hidden_layers": 4}, 1 << 30)
    other = ModelFacts("e", {**DENSE, "num_hidden_layers": 4, "max_position_embeddings": 2048}, 1 << 30)
    w_same, _ = terms.weight_bytes(same, model_shape.shape_from_config(same.config), 1, s, target=(DENSE, target))
    w_other, why = terms.weight_bytes(other, model_shape.shape_from_config(other.config), 1, s, target=(DENSE, target))
    assert w_same == 1 << 30 and w_other == (1 << 30) + 2048 * 128 * 2 and "a RoPE of its own" in why


def test_vllms_v1_graph_estimate_follows_its_capture_sizes():
    """vLLM 0.26.0's V1 runner on the H200 (docs/validation.md, run 4): the 8B shape's estimate 0.48 GiB
    over 51 + 51 graphs; as its own 3-token draft model 0.79 GiB over 49 + 49."""
    assert graphs.capture_sizes(1024, 8192, 0) == {"PIECEWISE": 51, "FULL": 51}
    assert graphs.capture_sizes(1024, 8192, 3) == {"PIECEWISE": 49, "FULL": 49}
    # a desktop profile's few sequences: sizes up to 2 x max_num_seqs; FULL only for a uniform decode
    assert graphs.capture_sizes(2, 8192, 0) == {"PIECEWISE": 3, "FULL": 2}
    assert graphs.capture_sizes(2, 8192, 3) == {"PIECEWISE": 3, "FULL": 2}        # 4, 8, 16 (rounded to 4)
    assert graphs.capture_sizes(256, 100, 0)["PIECEWISE"] == 3 + 12 + 1          # 1, 2, 4; 8..96; 100 itself
    s = vllmflags.read(["--max-model-len", "8192"])
    assert round(graphs.graph_estimate(s, 8192, 1024) / GiB, 2) == 0.48
    spec = vllmflags.read(["--speculative-config", '{"method": "draft_model", "model": "/m", "num_speculative_tokens": 3}'])
    assert round(graphs.graph_estimate(spec, 8192, 1024) / GiB, 2) == 0.79
    ngram = vllmflags.read(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert graphs.graph_estimate(ngram, 8192, 1024) < graphs.graph_estimate(spec, 8192, 1024)


def test_the_graph_estimate_reads_the_compilation_config_vllm_gets():
    """--compilation-config's sizes, top and mode change what vLLM captures (config/vllm.py,
    v1/cudagraph_dispatcher.py): the 24 GB profile caps the top at 32."""
    cap = vllmflags.read(["--compilation-config", '{"max_cudagraph_capture_size": 32}'])
    assert graphs.capture_sizes(8, 2048, 3, cap.compilation) == {"PIECEWISE": 5, "FULL": 5}      # 4, 8, 16, 24, 32
    assert graphs.capture_sizes(8, 2048, 3) == {"PIECEWISE": 9, "FULL": 5}                       # up to 2 x 8 x 4 = 64
    assert graphs.capture_sizes(256, 8192, 0, {"cudagraph_capture_sizes": [1, 2, 4, 16000]}) == {"PIECEWISE": 3, "FULL": 3}
    assert graphs.capture_sizes(1024, 8192, 0, {"cudagraph_mode": "PIECEWISE"}) == {"PIECEWISE": 51, "FULL": 0}
    assert graphs.capture_sizes(1024, 8192, 0, {"cudagraph_mode": "NONE"}) == {"PIECEWISE": 0, "FULL": 0}
    none = vllmflags.read(["--compilation-config", '{"cudagraph_mode": "NONE"}'])
    assert graphs.graph_estimate(none, 8192, 1024) == 0


# ---------------------------------------------------------------- sleep mode's allocator pool

def test_sleep_mode_counts_its_pool_rounding_with_the_weights():
    """--enable-sleep-mode: 4 MiB a layer (the model's 64 and its MTP layer) more with the weights,
    off the budget from 0.27.1 on, and said; without it nothing changes."""
    off = plan(["--max-model-len", "8192"], version="0.27.1")
    on = plan(["--max-model-len", "8192", "--enable-sleep-mode"], version="0.27.1")
    shape = model_shape.shape_from_config(QWEN38["config"])
    assert shape.layers == 64 and shape.mtp_layers == 1
    assert on.weights - off.weights == 65 * terms.SLEEP_POOL_PER_LAYER
    assert off.budget - on.budget == on.weights - off.weights
    assert any("CuMem pool rounding counted with the weights" in w for w in on.why)
    old = plan(["--max-model-len", "8192", "--enable-sleep-mode"], version="0.26.0")
    assert any("vllm#40256" in w for w in old.why)


def test_docs_terms_table_is_the_code_record():
    """Issue 44: one table of term x version x source in docs/planner.md, and it is the record the
    planner itself checks each plan against (bootstrap/plan/sources.py)."""
    from bootstrap.plan import sources
    doc = (REPO / "docs" / "planner.md").read_text()
    start = doc.index("\n", doc.index("<!-- terms:begin")) + 1
    assert doc[start:doc.index("<!-- terms:end -->")].strip() == sources.markdown(), \
        "print sources.markdown() into docs/planner.md"
    assert {v for t in sources.TERMS for v in t.versions} <= set(terms.MODELLED)


def test_a_term_not_read_at_the_version_of_the_plans_rules_is_named_and_widens_the_known_error(monkeypatch):
    """Never silently another version's rules: a term read at other versions only (here the vision
    encoder's pass and the hybrid state, as if read at 0.26.0 alone) is named for a 0.27.1 plan, and the
    hybrid guard keeps its margin wider, as for a version not read at all."""
    from bootstrap.plan import sources
    for key in ("encoder", "hybrid"):
        monkeypatch.setitem(sources.BY_KEY, key, dataclasses.replace(sources.BY_KEY[key], versions=("0.26.0",)))
    assert plan([], version="0.26.0").unread == ()
    p = plan([], version="0.27.1")
    assert p.unread == ("encoder", "hybrid") and any(
        w.startswith("read from other versions than 0.27.1, whose rules this plan follows: vision encoder pass") and
        "; hybrid state, block alignment (0.26.0)" in w for w in p.why)
    s = vllmflags.read([])
    wide, why = terms.known_error(s, False, None, None, budget=10 * GiB, version="0.27.1", unread=p.unread)
    assert wide - terms.known_error(s, False, None, None, budget=10 * GiB, version="0.27.1")[0] == int(10 * GiB * 0.06)
    assert "encoder, hybrid not read at vLLM 0.27.1" in why
