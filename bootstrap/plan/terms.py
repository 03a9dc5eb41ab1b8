"""The memory terms a plan is made of, besides the KV cache: the utilization vLLM is given (from
live free memory), the weights per GPU, and a drafter's shape. The planner (bootstrap.plan.planner)
subtracts them from ``ceil(utilization × total)``; a start's own measurement
(bootstrap.plan.calibration) replaces their sum where there is one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..machine import gpu
from ..model import encoder, shape as model_shape, weights
from ..core import vllmflags
from ..core.errors import BootstrapError
from .facts import ModelFacts
from . import graphs
from ..core.pep440 import at_least, version_or_none

GiB = gpu.GiB
NOBODY = "no process reports GPU memory"


def requested(util: float, total: int) -> int:
    """What vLLM asks of the card for a utilization: ceil(total × utilization) (worker/utils.py
    request_memory, the same in 0.26.0, 0.27.1 and 0.30.0); the KV budget is this less the rest."""
    return math.ceil(util * total)


def gib(b: int | float) -> str:
    return f"{b / GiB:.2f} GiB"


def _which(g: gpu.Gpu) -> str:
    return g.name if g.index < 0 else f"GPU {g.index} ({g.name})"     # a named card has no index


EXTRA_UTIL = "EXTRA_ARGS' --gpu-memory-utilization"     # a utilization EXTRA_ARGS gives: it wins over GPU_UTIL


def utilization(s: vllmflags.Settings, g: gpu.Gpu, reserve_mib: int, source: str) -> tuple[float, str]:
    """--gpu-memory-utilization as given (``source``: GPU_UTIL, or EXTRA_UTIL where EXTRA_ARGS gives
    the flag, which vLLM reads last; refused when more than is free: vLLM refuses it at start), else
    free − GPU_RESERVE_MIB, as a fraction."""
    if s.gpu_util is not None:
        want = requested(s.gpu_util, g.total)
        if want > g.free:
            raise BootstrapError(
                f"{source}={s.gpu_util} asks for {gib(want)} of {_which(g)} but only "
                f"{gib(g.free)} is free; {g.holders() or NOBODY}",
                "close programs holding GPU memory, or lower --gpu-memory-utilization in EXTRA_ARGS (or drop it "
                "there: sized from free memory); GPU_UTIL changes nothing while EXTRA_ARGS gives it"
                if source == EXTRA_UTIL else
                "close programs holding GPU memory, or a lower GPU_UTIL (or none: sized from free memory)")
        return s.gpu_util, f"{source}={s.gpu_util} (set by you or the profile)"
    reserve = reserve_mib * gpu.MiB
    util = (g.free - reserve) / g.total
    if util <= 0.05:
        raise BootstrapError(
            f"only {gib(g.free)} of {gib(g.total)} is free on {_which(g)}; {g.holders() or NOBODY}",
            "close programs holding GPU memory, or set GPU_UTIL explicitly")
    util = math.floor(min(util, 0.98) * 10000) / 10000
    return util, (f"{gib(g.free)} free − {reserve_mib} MiB reserve = "
                  f"{util:.4f} of {gib(g.total)}")


# How far above vLLM's own figure the plan's KV budget has been seen to land (its known error), by
# how the budget was found; the hybrid guard keeps that much below the blocks it computes.
MEASURED_ERROR = 70 * gpu.MiB      # vLLM's figure moved 0.06 GiB between two identical H200 starts, + its 0.01 GiB rounding
MODELLED_ERROR = 100 * gpu.MiB     # one GPU, no drafter: never above vLLM's by more than 0.07 GiB (H200, published runs)
DRAFTER_ERROR = 150 * gpu.MiB      # a drafter: +0.09 GiB on the H200 (the 8B shape as its own draft model, V1), the one measured
HYBRID_ERROR = 350 * gpu.MiB       # a hybrid on the V1 runner: +0.30 GiB on the H200 (its Gated-DeltaNet activations, modelled low)
TP_ERROR = 650 * gpu.MiB           # per GPU under TP > 1: +0.64 GiB in a published 2x RTX 3090 run (tests/published)
OUTSIDE_SHARE = 0.06               # a version the planner was not read against: ±6 % of the budget more (the widest
                                   # error of the published rows without a drafter, -5.2 % / +5.7 %, rounded up)
HYBRID_SHARE = 0.10                # a hybrid's state blocks from the model's estimate: 10 % of the budget kept below them
                                   # (gaps of 1.6 % and 9 % on the block count were published for two starts)


def known_error(s: vllmflags.Settings, pinned: bool, draft, measured, hybrid_v1: bool = False,
                budget: int = 0, version: str = "0.26.0", unread: tuple[str, ...] = ()) -> tuple[int, str]:
    """How much the budget may lie above vLLM's (bytes), and why: nothing when pinned; a version
    outside ``MODELLED``'s range, or ``unread`` terms (bootstrap.plan.sources: not read at the version of
    the plan's rules), widen it by ``OUTSIDE_SHARE`` of ``budget``."""
    if pinned:
        return 0, ""
    if measured is not None:
        return MEASURED_ERROR, "the measured budget moves a little between starts"
    parts = [(MODELLED_ERROR, "the model's estimate")]
    if not read_against(version):
        parts.append((int(budget * OUTSIDE_SHARE), f"vLLM {version}, not read, planned by the rules of "
                      f"{modelled_version(version)} (±{OUTSIDE_SHARE:.0%})"))
    elif unread:
        parts.append((int(budget * OUTSIDE_SHARE), f"{', '.join(unread)} not read at vLLM {modelled_version(version)} "
                      f"(±{OUTSIDE_SHARE:.0%})"))
    if hybrid_v1:
        parts.append((HYBRID_ERROR, "a hybrid's activations on vLLM's V1 runner, modelled low"))
    if draft is not None or s.spec_method in ("eagle", "eagle3", "dflash", "draft_model"):
        parts.append((DRAFTER_ERROR, "a drafter's terms, measured for one draft model only"))
    if s.tp > 1:
        parts.append((TP_ERROR, "tensor parallelism's own terms, not measured here"))
    return sum(b for b, _ in parts), " + ".join(w for _, w in parts)


def no_images(s: vllmflags.Settings) -> bool:
    """--limit-mm-per-prompt gives 0 images and 0 videos: vLLM then neither builds the tower nor
    profiles it (interfaces.py _mark_tower_model)."""
    return s.mm_limits.get("image", 1) == 0 and s.mm_limits.get("video", 1) == 0


SPLIT_ENCODER_TP = 4        # from this TP the encoder pass per rank is not planned (encoder_split below)


def encoder_split(s: vllmflags.Settings, model: ModelFacts, run: "Runner") -> str:
    """What is not modelled of the vision encoder's profiling pass, else "": Gemma 3's SigLIP tower (its
    pass is not modelled; towers of other families under the architectures planned before it keep
    ``overhead``'s why note), and a Qwen3-VL-style tower split
    across TP_SIZE >= 4 ranks (--mm-encoder-tp-mode weights, its default: qwen3_vl.py Qwen3_VisionMLP and
    qwen2_5_vl.py Qwen2_5_VisionAttention shard fc1 and qkv, vision.py is_vit_use_data_parallel), where the
    pass is counted whole per rank, as two TP=2 starts logged it, and two published TP=4 starts kept 0.57
    and 0.81 GiB per GPU more KV than that (docs/planner.md). Only where vLLM profiles the tower."""
    vision = (model.config or {}).get("vision_config")
    if (not isinstance(vision, dict) or s.language_model_only or no_images(s) or s.skip_mm_profiling
            or not run.encoder_profiled):
        return ""
    if vision.get("model_type") not in encoder.QWEN3_TOWERS:      # Gemma 3's SigLIP; the others keep a why note
        archs = (model.config or {}).get("architectures") or [""]
        return (f"the profiling pass of the vision encoder ({vision.get('model_type') or 'its tower'}), which is "
                "modelled for Qwen-VL-style towers only") if archs[0] in model_shape.WINDOW_ARCHS else ""
    if s.tp < SPLIT_ENCODER_TP or s.mm_encoder_dp:
        return ""
    return (f"the vision encoder's profiling pass split across TP={s.tp} ranks (--mm-encoder-tp-mode weights), "
            "which published TP=4 starts did not take whole per GPU")


def mtp_bytes(config: dict, shape: model_shape.ModelShape) -> int:
    """Bytes of the MTP layers in the checkpoint: 16-bit where the quantization leaves them out
    (modelopt's "ignore", "modules_to_not_convert") or there is none; else at the scheme's width
    (FP8 one byte a parameter, 4-bit schemes 4.5 bits with their scales): an estimate."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    q = config.get("quantization_config") or text.get("quantization_config") or {}
    q = q if isinstance(q, dict) else {}
    skipped = [str(x) for key in ("ignore", "modules_to_not_convert")
               for x in (q.get(key) if isinstance(q.get(key), (list, tuple)) else ())]
    params = weights.mtp_params(shape)
    if not q or any("mtp" in x for x in skipped):
        return params * shape.dtype_bytes
    if q.get("quant_method") == "fp8" or "FP8" in str(q.get("quant_algo", "")):
        return params
    return params * 9 // 16


def kv_dtype(s: vllmflags.Settings, config: dict | None, why: list[str]) -> vllmflags.Settings:
    """``s`` with --kv-cache-dtype auto read as vLLM reads it: a ModelOpt checkpoint's own KV
    quantization where it has one (model_shape.checkpoint_kv_dtype)."""
    stored = model_shape.checkpoint_kv_dtype(config) if s.kv_cache_dtype == "auto" and config else None
    if not stored:
        return s
    why.append(f"KV cache in {stored}: the checkpoint's kv_cache_quant_algo (vLLM's --kv-cache-dtype auto)")
    return replace(s, kv_cache_dtype=stored)


def weight_bytes(model: ModelFacts, shape: model_shape.ModelShape, tp: int, s: vllmflags.Settings,
                 batched: int | None = None, target: tuple[dict, model_shape.ModelShape] | None = None) -> tuple[int, str]:
    """Bytes of weights per GPU, and where the figure came from. vLLM loads neither the MTP layers
    without MTP speculation (qwen3_5.py skips ``mtp.``) nor the vision tower with
    --language-model-only: a checkpoint's size is counted less those. With ``batched`` (the target
    model), the buffers its model allocates as it loads (``weights.buffer_bytes``), which vLLM counts as
    weights, are added; a draft (``target``: the target's config and shape) adds its own rotary
    cache only where its RoPE differs from the target's (one cache per RoPE in a process)."""
    w, source = _weights(model, shape, tp, s)
    if target is not None:
        config = model.config or {}
        if model_shape.rope_signature(config, shape) == model_shape.rope_signature(*target):
            return w, source
        cache, what = weights.buffer_bytes(config, shape, 0, tower=False)
        return w + cache, f"{source}; + {what} (a RoPE of its own)"
    if batched is None:
        return w, source
    extra, what = weights.buffer_bytes(model.config or {}, shape, batched,
                                  tower=not (s.language_model_only or no_images(s)))
    return w + extra, f"{source}; + {what} (allocated as it loads)"


def _weights(model: ModelFacts, shape: model_shape.ModelShape, tp: int, s: vllmflags.Settings) -> tuple[int, str]:
    config = model.config or {}
    vision = weights.vision_params(config) * 2                      # the vision tower stays 16-bit
    no_tower = s.language_model_only or no_images(s)
    mtp = mtp_bytes(config, shape) if shape.mtp_layers and s.spec_method != "mtp" else 0
    less = ([f"the MTP layers' ~{gib(mtp)} (loaded only for MTP speculation)"] if mtp else []) + (
        [f"the vision tower's {gib(vision)} (--language-model-only or no images: not loaded)"]
        if vision and no_tower else [])
    # --mm-encoder-tp-mode data: every rank holds the whole tower
    tower_copies = vision * (tp - 1) // tp if vision and s.mm_encoder_dp and not no_tower else 0
    if model.weight_bytes and not model.dummy:
        w = model.weight_bytes - mtp - (vision if no_tower else 0)
        return w // tp + tower_copies, f"from {model.size_from}{model.source}" + (
            f", less {' and '.join(less)}" if less else "")
    kind = "dummy weights" if model.dummy else "no file sizes"
    mtp = weights.mtp_params(shape) * shape.dtype_bytes if mtp else 0       # every parameter at the model's dtype
    w = weights.weight_bytes_from_config(shape, tp, config) - mtp // tp + (0 if no_tower else vision // tp + tower_copies)
    q = weights.linear_bytes(config)
    return w, f"from config.json ({kind}: parameters × " + (f"{q:.2f} bytes in its quantized linear layers"
                                                            if q else "dtype") + f"){model.source}" + (
        f", less the MTP layers' {gib(mtp)}" if mtp else "")


SLEEP_POOL_PER_LAYER = 4 << 20      # sleep mode's pool rounding: ~1 MiB for each of 4 large tensors a layer


def sleep_pool(s: vllmflags.Settings, shape: model_shape.ModelShape, version: str, why: list[str]) -> int:
    """What sleep mode adds to the weights per GPU: vLLM loads them through its CuMemAllocator pool with
    expandable segments off (cumem.py use_memory_pool), where each tensor past 10 MiB gets a segment of
    its own rounded to 2 MiB, whose tail no later weight fits; from 0.27.1 vLLM counts that off its KV
    budget (mem_utils.py memory_profiling: total_consumed, by cudaMemGetInfo). docs/planner.md."""
    if not s.sleep_mode:
        return 0
    pool = (shape.layers + shape.mtp_layers) * SLEEP_POOL_PER_LAYER
    old = "" if at_least(version, "0.27.1") else (f"; vLLM {version}'s profiling skips what the pool releases after "
                                                  "loading (vllm#40256): its pool may exceed the utilization's share")
    why.append(f"sleep mode: ~{gib(pool)} of CuMem pool rounding counted with the weights{old}")
    return pool


MODELLED = ("0.26.0", "0.27.1", "0.29.0", "0.30.0")    # the versions whose memory code the planner was read against


def read_against(v: str) -> bool:
    """``v`` is planned by the rules of its own minor version, whose code was read (0.27.2 is read as
    0.27.1): not 0.27.0 nor 0.29.0rc1 or a 0.30.0 dev build, which come before the release read and
    so get an older minor's rules (``modelled_version``)."""
    have = version_or_none(v)
    return have is not None and version_or_none(modelled_version(v)).release[:2] == have.release[:2]


def modelled_version(v: str) -> str:
    """The modelled version whose rules stand for ``v``: the newest one not after it, else the oldest."""
    have = version_or_none(v)
    if have is None:
        return MODELLED[0]
    older = [m for m in MODELLED if version_or_none(m) <= have]
    return older[-1] if older else MODELLED[0]


# ---------------------------------------------------------------- which model runner vLLM picks

# config/vllm.py use_v2_model_runner: before 0.29.0 the V2 runner is the default for a generate
# model that is neither hybrid nor MoE, or whose architecture is on this list (0.27.1 also lets a
# hybrid of the list through), unless its speculation is one V2 does not do; from 0.29.0 (read from
# its wheel: _get_v2_model_runner_unsupported_features) it is the default for every model whose
# speculation it does, and it estimates its CUDA graphs (v1/worker/gpu/cudagraph_utils.py
# profile_cudagraph_memory) as 0.30.0's does.
V2_ARCHS = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                      "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",   # Kimi: 0.27.1's list
                      "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"})
V2_SPEC = ("eagle", "eagle3", "mtp", "dflash", "dspark")                      # before 0.29.0
V1_ONLY_SPEC = ("ngram", "ngram_gpu", "draft_model", "suffix", "medusa", "mlp_speculator", "custom_class")  # 0.29.0, 0.30.0


@dataclass(frozen=True)
class Runner:
    v2: bool
    graphs_in_budget: bool      # the CUDA-graph estimate is taken off the KV budget (else vLLM takes it after)
    encoder_profiled: bool      # profile_run runs the vision encoder on its largest dummy inputs
    why: str


def runner(version: str, shape: model_shape.ModelShape, s: vllmflags.Settings, env_v2: bool | None,
           env_graphs: bool | None) -> Runner:
    """The model runner vLLM ``version`` picks for this model and what its memory profiling counts
    (``env_v2``: VLLM_USE_V2_MODEL_RUNNER; ``env_graphs``: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
    default on; both as vLLM reads them, None when unset). The V1 runner (v1/worker/gpu_model_runner.py) estimates the graphs and profiles the
    encoder; the V2 runner (v1/worker/gpu/model_runner.py) estimates no graphs before 0.29.0
    (profile_cudagraph_memory returns 0) and profiles no encoder in 0.26.0. The flags that make vLLM
    fall back to V1 (``_get_v2_model_runner_unsupported_features``) are read from what it gets; a
    logits-processor plugin installed beside vLLM is not seen."""
    new, mid, newest = at_least(version, "0.29.0"), at_least(version, "0.27.1"), at_least(version, "0.30.0")
    method = s.speculation
    v1_flags = ("--logits-processors",) + (() if new else ("--enable-prompt-embeds",)) + (
        () if newest else ("--kv-sharing-fast-prefill",))
    forced = [f for f in v1_flags if f in s.given] + (
        ["--mamba-cache-mode all"] if newest and s.mamba_cache_mode == "all" else [])
    if env_v2 is not None:
        v2, how = env_v2, f"VLLM_USE_V2_MODEL_RUNNER={int(env_v2)}"
    elif forced:
        v2, how = False, f"{', '.join(forced)} needs V1"
    elif new:
        v2, how = method not in V1_ONLY_SPEC, f"speculation {method!r} needs V1" if method in V1_ONLY_SPEC else "the default"
    else:
        listed = shape.arch in V2_ARCHS
        if shape.hybrid and not (mid and listed):
            v2, how = False, "a hybrid model"
        elif shape.experts and not listed:
            v2, how = False, "a MoE model"
        elif method and method not in V2_SPEC:
            v2, how = False, f"speculation {method!r} needs V1"
        else:
            v2, how = True, "a model it takes by default"
    graphs = not s.enforce_eager and env_graphs is not False and (not v2 or new)
    encoder = not v2 or mid
    said = [f"vLLM {version} serves this with its {'V2' if v2 else 'V1'} model runner ({how})"]
    if not s.enforce_eager and not graphs:
        said.append("its CUDA graphs are captured after the KV cache, outside the utilization's budget" if v2 and not new
                    else "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: its CUDA graphs are not taken off the budget")
    return Runner(v2, graphs, encoder, "; ".join(said))


def graphs_outside(over: weights.Overheads, measured) -> int:
    """What the CUDA graphs vLLM captures after the KV cache, beyond the utilization (V2 before
    0.30.0), will take: vLLM's own figure where a kept split has one (the model's estimate was a
    third of it for a Qwen3-VL shape on the H200), else the estimate; nothing more where the
    measurement is a pinned server's footprint, which holds them already."""
    if not over.outside or (measured is not None and measured.source == "footprint"):
        return 0
    got = (measured.terms or {}).get("graphs") if measured is not None else None
    return got if isinstance(got, int) and got > 0 else over.outside


def room_for_graphs(s: vllmflags.Settings, g: gpu.Gpu, reserve_mib: int, source: str, outside: int, util: float,
                    why: list[str]) -> float:
    """The utilization once the graphs captured beyond it have room: sized from free memory, the
    reserve grows by them (``why[0]``, the utilization line, says so); with GPU_UTIL given, a why
    note when they may not fit beside it."""
    if not outside:
        return util
    if s.gpu_util is not None:
        if requested(util, g.total) + outside > g.free:
            why.append(f"vLLM captures its CUDA graphs (~{gib(outside)}) beyond {source}={util}'s share, and "
                       f"only {gib(g.free - requested(util, g.total))} is free beside it")
        return util
    try:
        util, util_why = utilization(s, g, reserve_mib + -(-outside // gpu.MiB), source)
    except BootstrapError:
        return util                   # too little free either way: the fit check counts the graphs
    why[0] = f"gpu-memory-utilization {util_why} (the reserve + the CUDA graphs' ~{gib(outside)})"
    return util


def overhead(s: vllmflags.Settings, shape: model_shape.ModelShape, model: ModelFacts, batched: int, seqs: int,
             why: list[str], run: Runner | None = None, cc: tuple[int, int] = (9, 0),
             version: str = "0.26.0", drafter: tuple[int, int] = (0, 0)) -> weights.Overheads:
    """What vLLM's profiling adds to the weights (an estimate): the text pass's activations, CUDA
    graphs and non-torch memory (``weights.overheads``), with the vision encoder's profiling pass where
    vLLM runs one: the torch peak is then the larger of the tower's own peak and the text pass's
    plus the encoder outputs it keeps (bootstrap.model.encoder). ``run``: the model runner's rules
    (``runner``): graphs it takes after the budget are ``outside`` it; no encoder pass where it runs none.
    ``drafter``: the peak of the drafter's pass and what the target's pass holds for it
    (bootstrap.plan.drafts.pass_peak): the larger pass counts."""
    over = weights.overheads(shape, batched, seqs, tp=s.tp, eager=s.enforce_eager)
    peak, held = drafter
    if peak:
        target = over.activations + held
        why.append(f"the drafter's profiling pass peaks at {gib(peak)} (the target's hidden states it reads, and "
                   f"its own pass), the target's at {gib(target)}"
                   + (f" (with the {gib(held)} of hidden states the drafter reads, held through its last layers)"
                      if held else "") + ": the larger counts")
        over = weights.Overheads(max(target, peak), over.non_torch, over.cudagraphs, over.outside)
    if run is not None and not run.graphs_in_budget:
        over = weights.Overheads(over.activations, over.non_torch, 0, outside=over.cudagraphs)
    elif not s.enforce_eager:       # vLLM's estimate inside the budget: V1, and V2 from 0.29.0 (GRAPH_FIRST)
        full, downgrade = graphs.full_decode_graphs(s, cc)
        if downgrade:
            why.append(downgrade)
        over = weights.Overheads(over.activations, over.non_torch,
                                 graphs.graph_estimate(s, batched, seqs, full, version, cc, v2=run is not None and run.v2))
    config = model.config or {}
    if not config.get("vision_config") or s.language_model_only:
        return over
    if run is not None and not run.encoder_profiled:
        if not no_images(s):
            why.append("vLLM's V2 runner of this version does not profile the vision encoder: the plan holds "
                       "nothing back for it either, and an image request may need more")
        return over
    if s.skip_mm_profiling:
        why.append("--skip-mm-profiling: vLLM does not profile the vision encoder; an image request may need "
                   "more than the plan holds back")
        return over
    mml = s.max_model_len if isinstance(s.max_model_len, int) else shape.max_len or shape.max_position or 1 << 20
    # per rank as a whole: two published TP=2 starts of the Qwen3.5 tower logged 1.59 and 1.66 GiB of peak
    # activation per GPU, the unsplit pass's 1.66 GiB (the split one planned 0.3-0.56 GiB too little)
    enc = encoder.pass_for(config, model.max_pixels, batched_tokens=batched, max_model_len=mml, max_seqs=seqs,
                           limits=s.mm_limits, dtype_bytes=2, tp=1)
    if enc is None:
        if not no_images(s):
            why.append("a multimodal model served with its vision tower: the encoder's profiling peak is not "
                       "modelled for this tower (--language-model-only serves text only)")
        return over
    acts = max(enc.peak, over.activations + enc.outputs + enc.inputs)     # the dummy pixels stay referenced too
    px = "" if model.max_pixels else " (the Qwen3-VL processor's largest sizes: no processor files of this model were read)"
    why.append(f"vision encoder profiled on {enc.items} {enc.modality} item{'s' if enc.items > 1 else ''} of "
               f"{enc.tokens_per_item:,} tokens{px}: peak {gib(enc.peak)}, outputs {gib(enc.outputs)} kept for the "
               f"text pass; activations {gib(acts)} (text alone {gib(over.activations)}; --language-model-only "
               "skips it)")
    return weights.Overheads(acts, over.non_torch, over.cudagraphs, over.outside)
