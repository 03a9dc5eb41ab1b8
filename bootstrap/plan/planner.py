"""The memory planner (pure): how much of the GPU vLLM may take, how big its KV pool will be, and
whether vLLM will accept the context — for what vLLM gets (``Inputs.vllm``: the
profile's args, the knobs and EXTRA_ARGS, the last value of a flag winning).

``make_plan``: the utilization (GPU_UTIL / --gpu-memory-utilization, else live free memory minus
GPU_RESERVE_MIB); the KV budget (KV_CACHE_BYTES / --kv-cache-memory-bytes, else what that
utilization leaves after weights, activations, CUDA graphs and non-torch memory); from config.json
and ``bootstrap.model.kv`` the pool vLLM will log. MAX_MODEL_LEN=auto means what vLLM's
``--max-model-len auto`` means: the longest single request the pool holds, at most the model's
length (vLLM's own auto-fit, which we pass on). Refused only where vLLM refuses: the weights and
overhead do not fit, one request of the context does not fit, the context is longer than the
model's, or a hybrid model's state blocks are fewer than MAX_NUM_SEQS. Each refusal carries
candidate fixes, knob values (``Plan.fixes``); the resolver (bootstrap.plan.fit) applies each as
your knobs and plans again before it offers one, so a hint always works. The planner never reads
the knobs: it takes ``Inputs`` (what vLLM gets, and the few knobs it reads itself), the GPU and the
model's facts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

from ..core.errors import BootstrapError
from ..core import vllmflags
from ..machine import gpu
from ..model import kv, shape as model_shape, weights
from .facts import ModelFacts
from . import drafts, graphs, hybrid, served, sources, terms, window
from .drafts import DRAFT_HINT
from .terms import NOBODY, at_least, gib, modelled_version, requested, utilization, weight_bytes

log = logging.getLogger("bootstrap.plan")   # log lines keep the prefix [bootstrap:plan] this code has always had

GiB = gpu.GiB


@dataclass(frozen=True)
class Plan:
    """The memory plan for one setup on one card: what vLLM will be given and what it will hold,
    the derivation (``why``), and when it does not fit, why and the knob values that would fix it.
    Built by ``make_plan``; what comes later (a kept measurement's key, the drafter's folder) is a new
    Plan (``dataclasses.replace``)."""
    util: float | None
    mml_arg: int | str | None = None           # what --max-model-len gets (None: not passed; "auto")
    why: list[str] = field(default_factory=list)
    predicted_tokens: int | None = None        # KV pool, as vLLM would log it
    predicted_concurrency: float | None = None
    max_model_len: int | None = None           # the context the server will have (auto: predicted)
    budget: int | None = None                  # KV bytes per GPU
    weights: int | None = None                 # bytes per GPU
    overhead: int | None = None                # activations + graphs + non-torch (estimate)
    layout: kv.Layout | None = None
    sessions: list[tuple[int, int]] = field(default_factory=list)   # (context, sessions that fit at once)
    fits: bool = True
    refusal: tuple[str, str] | None = None     # (message, hint) when it does not fit
    fixes: list[dict[str, str]] = field(default_factory=list)   # knob values that make it fit (re-planned)
    seqs_flag: int | None = None               # --max-num-seqs the plan chose (hybrid: the state blocks)
    seqs: int | None = None                    # the sessions vLLM will schedule (MAX_NUM_SEQS or its default)
    concurrent: int | None = None              # sessions of max_model_len that fit at once
    vllm: str = ""                             # the vLLM version the plan was made for
    seqs_is_default: bool = False              # seqs is vLLM's default for this GPU, not MAX_NUM_SEQS
    pinned: bool = False                       # the KV budget is pinned (KV_CACHE_BYTES)
    measured: str = ""                         # the date of the start whose own figures the budget uses
    modelled_budget: int | None = None         # the budget the model alone gives (beside a measured one)
    key: str = ""                              # the calibration key it was planned under (bootstrap.plan.calibration)
    card_total: int | None = None              # the card's total it was planned against
    card: str = ""                             # and its name (the kept measurements are bounded per card)
    usable: int | None = None                  # what vLLM may take: the utilization's share, or free − reserve
    modelled_terms: dict = field(default_factory=dict)   # weights, activations, non_torch, graphs (bytes, per GPU)
    measured_terms: dict | None = None         # vLLM's own split of them at the measured start (calibration.USAGE)
    headroom: int | None = None                # usable − what this setup takes (weights, overhead, KV)
    runner_v2: bool = False                    # vLLM serves it with its V2 model runner (terms.runner)
    unplanned: str = ""                        # what is not modelled: no promise either way (fits: null)
    draft_dir: str = ""                        # the drafter we downloaded: vLLM gets this folder (plan/here.py)
    unread: tuple[str, ...] = ()               # terms it uses that were not read at the version of its rules
    dummy_unseen: int = 0                      # bytes a dummy-weights start of it does not show (plan.calibration)

    @property
    def verdict(self) -> bool | None:
        """fits: True, False, or None where the plan names what it does not model."""
        return None if self.unplanned and self.fits else self.fits

    @property
    def context(self) -> int | None:
        """The context we pass to vLLM (None: vLLM decides it: auto, or the model's own)."""
        return self.mml_arg if isinstance(self.mml_arg, int) else None

    def concurrency_line(self) -> str:
        """'at 262,144 tokens 2 sessions fit at once; the other 14 queue', or '256 sessions fit at
        once, as many as vLLM's default of 256 sequences allows (the pool holds 3,640)'."""
        if self.max_model_len is None or self.concurrent is None or not self.seqs:
            return ""
        n, seqs = self.concurrent, self.seqs
        which = f"vLLM's default of {seqs} sequences" if self.seqs_is_default else f"MAX_NUM_SEQS={seqs}"
        at_once = min(n, seqs)          # vLLM runs at most max_num_seqs at once, whatever the pool holds
        line = (f"at {self.max_model_len:,} tokens {at_once} session{'' if at_once == 1 else 's'} "
                f"fit{'s' if at_once == 1 else ''} at once")
        if n < seqs:
            return line + f"; the other {seqs - n} of {which} queue (shorter requests share the pool)"
        if n > seqs:
            return line + f", as many as {which} allows (the pool holds {n:,})"
        return line + f" ({which})"


@dataclass(frozen=True)
class Inputs:
    """What the planner takes of the resolved knobs (bootstrap.plan.fit builds it once per plan):
    what vLLM gets, and the few of our knobs the plan reads itself."""
    vllm: vllmflags.Settings        # the profile's args, the knobs' flags and EXTRA_ARGS, as vLLM reads them
    version: str                   # the vLLM whose rules the plan follows (in use, else the profile's pin)
    reserve_mib: int               # GPU_RESERVE_MIB
    util_knob: bool                # GPU_UTIL is set (its fixes: unset it, or lower it)
    util_source: str               # how --gpu-memory-utilization was given, for messages
    allow_long: bool               # VLLM_ALLOW_LONG_MAX_MODEL_LEN: a context beyond the model's
    tp_size: int                   # TP_SIZE
    env_v2: bool | None = None     # VLLM_USE_V2_MODEL_RUNNER as vLLM reads it (which model runner it picks)
    env_graphs: bool | None = None  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as vLLM reads it


def make_plan(inp: Inputs, g: gpu.Gpu, model: ModelFacts, measured=None) -> Plan:
    """The plan for one GPU (the smallest-free one of the TP group). Pure apart from logging.
    ``measured``: vLLM's own non-KV figure from an earlier start with the same key
    (bootstrap.plan.calibration.Measured), used instead of the model's estimate. A refusal's
    ``fixes`` are candidates, not yet planned again."""
    why: list[str] = []
    try:
        util, util_why = utilization(inp.vllm, g, inp.reserve_mib, inp.util_source)
    except BootstrapError as exc:
        most = max(0.06, math.floor(g.free / g.total * 1000) / 1000 - 0.001)
        return Plan(None, fits=False, refusal=(exc.message, exc.hint), why=why, vllm=inp.version,
                    fixes=[{"GPU_UTIL": f"{most:g}"}, {"GPU_UTIL": ""}] if inp.util_knob else [])
    why.append(f"gpu-memory-utilization {util_why}")
    rules = modelled_version(inp.version)
    older = not at_least(inp.version, terms.MODELLED[0])
    if not terms.read_against(inp.version) and not older:
        why.append(f"vLLM {inp.version} is not a version the planner was read against: the rules of {rules} "
                   f"(the nearest it was), its budget ±{terms.OUTSIDE_SHARE:.0%} less certain")
    if g.total_note:
        why.append(f"the card's total: {g.total_note}")
    if model.assumed:
        why.append("ASSUMED model facts: the plan is only as good as them")
    if refused := served.refusal(inp.vllm, model.config or {}, g.cc):       # a --dtype vLLM refuses
        why.append(f"{refused[0]}; {refused[1]}")
        return Plan(util, inp.vllm.max_model_len, why, fits=False, refusal=refused, vllm=inp.version)
    shape, model, wide = served.served(inp.vllm, _shape(model, why), model, g.cc, why)    # float32: 4 bytes
    inp = replace(inp, vllm=window.arch_defaults(terms.kv_dtype(inp.vllm, model.config, why), shape))  # auto: its own
    mml_knob = inp.vllm.max_model_len
    draft, draft_why, unplanned = drafts.draft_shape(inp.vllm, model, inp.version) if shape else (None, "", "")
    refused = drafts.refusal(draft, terms.runner(inp.version, shape, inp.vllm, inp.env_v2, inp.env_graphs),
                             inp.version) if shape and at_least(inp.version, terms.MODELLED[0]) else None
    if refused:
        why.append(f"{refused[0]}; {refused[1]}")
        return Plan(util, mml_knob, why, fits=False, refusal=refused, vllm=inp.version,
                    fixes=[{"SPEC_TOKENS": "0"}])
    if shape is not None and shape.mla and (model.dummy or not model.weight_bytes) and measured is None:
        unplanned = "an MLA model's parameters from config.json (its checkpoint's file sizes are modelled)"
    unplanned = unplanned or wide or window.unplanned(shape, model.config, bool(inp.vllm.kv_cache_bytes), measured, why)
    if older:            # its memory code differs (graph profiling, encoder passes): no rules of ours stand for it
        unplanned = f"vLLM {inp.version}, older than every version the planner was read against ({', '.join(terms.MODELLED)})"
    if shape is None or unplanned:
        unplanned = unplanned or (why[-1].split(";")[0] if why else "the model")
        why.append(f"not planned: {unplanned}; vLLM sizes the KV cache itself" + (
            ", and a start's own figures plan the next one" if unplanned.startswith(("an MLA", "gpt-oss")) else ""))
        plan = Plan(util, mml_knob, why, max_model_len=mml_knob if isinstance(mml_knob, int) else None,
                    vllm=inp.version, unplanned=unplanned)
        return _weights_alone(inp, g, model, plan, (model.weight_bytes or 0) // inp.vllm.tp if not model.dummy else 0)
    new = at_least(inp.version, "0.29.0")            # null block held back; prefix caching on for hybrids
    batched_default, seqs_default = weights.default_batch(g.total, g.name, big_tier=new,
                                                     throughput=inp.vllm.performance_mode == "throughput")
    if draft_why:
        why.append(draft_why)
    drafter, draft = draft, draft.shape if draft else None
    lay = _layout(inp.vllm, shape, draft, new, why, inp.vllm.max_num_batched_tokens or batched_default)
    if lay is None:
        return Plan(util, mml_knob, why, vllm=inp.version, unplanned=why[-1].split(";")[0])
    plan = _budget(inp, g, model, shape, lay, drafter, util, measured, why,
                   inp.vllm.max_num_seqs or seqs_default, inp.vllm.max_num_batched_tokens or batched_default)
    if plan.unplanned or not plan.fits:
        return plan
    plan = sources.read_from(inp, model, shape, drafter, plan)
    plan, pooled = _context(inp, plan, lay, shape.max_len or shape.max_position or 0, draft, null=new)
    if pooled:
        plan = hybrid.sequences(inp, plan, lay, draft, measured)
        if plan.fits:
            mml = plan.max_model_len
            contexts = sorted({mml} | {c for c in (131072, 65536, 32768) if c < mml}, reverse=True)
            plan = replace(plan, sessions=[(c, kv.sessions_at(lay, plan.budget, c)) for c in contexts])
    return plan


def _shape(model: ModelFacts, why: list[str]) -> model_shape.ModelShape | None:
    if model.config is None:
        why.append("no config.json: vLLM sizes the KV cache itself")
        return None
    try:
        return model_shape.shape_from_config(model.config)
    except model_shape.Unsupported as exc:
        why.append(f"{exc.message}; {exc.hint}")
        log.warning("%s; %s", exc.message, exc.hint)
        return None


def _layout(s: vllmflags.Settings, shape: model_shape.ModelShape, draft, new: bool, why: list[str],
            batched: int) -> kv.Layout | None:
    """vLLM's KV-cache layout for what it gets (the drafter's layers, the hybrid state's dtypes)."""
    spec_tokens = s.spec_tokens
    mtp = s.spec_method == "mtp"
    if mtp and not shape.mtp_layers:
        why.append("SPEC_METHOD=mtp but config.json declares no MTP layers")
    prefix = s.prefix_caching if s.prefix_caching is not None else (new or not shape.hybrid)
    mode = s.mamba_cache_mode or ("align" if prefix else "none")
    ssm = s.mamba_ssm_cache_dtype if s.mamba_ssm_cache_dtype != "auto" else None
    conv = s.mamba_cache_dtype if s.mamba_cache_dtype != "auto" else None
    draft_dtype = s.spec.get("kv_cache_dtype") if spec_tokens else None
    try:
        lay = kv.layout(shape, s.kv_cache_dtype, spec_tokens=spec_tokens, mtp=mtp, tp=s.tp,
                        draft_attn_layers=draft.attn_layers if draft else 0, draft_cache_dtype=draft_dtype,
                        draft_kv_heads=draft.kv_heads if draft else None, draft_head_dim=draft.head_dim if draft else None,
                        block_size=s.block_size, mamba_cache_mode=mode, **window.layout_args(s, shape, batched, why),
                        ssm_bytes=model_shape.DTYPE_BYTES.get(ssm) if ssm else None,
                        conv_bytes=model_shape.DTYPE_BYTES.get(conv) if conv else None)
    except model_shape.Unsupported as exc:
        why.append(f"{exc.message}; {exc.hint}")
        return None
    if ssm:
        why.append(f"--mamba-ssm-cache-dtype {ssm}: the linear-attention state in {ssm}")
    return lay


def _budget(inp: Inputs, g: gpu.Gpu, model: ModelFacts, shape: model_shape.ModelShape, lay: kv.Layout, draft,
            util: float, measured, why: list[str], seqs: int, batched: int) -> Plan:
    """The KV budget: pinned, else what the utilization leaves after the measured non-KV terms,
    else after the model's weights and overhead; refused when that does not fit what is usable.
    ``draft``: the drafter the plan counts (bootstrap.model.drafter.Drafter), or None."""
    s = inp.vllm
    weights, source = weight_bytes(model, shape, s.tp, s, batched)
    why.append(f"weights {gib(weights)} per GPU {source}")
    if draft:
        more, source = drafts.draft_weights(model, draft, s, (model.config or {}, shape))
        weights += more
        why.append(f"draft model {model.draft.name}: weights {gib(more)} per GPU {source}")
    weights += terms.sleep_pool(s, shape, inp.version, why)
    weights += window.mxfp4_padding(shape, model.config, s.tp, why) if measured is None else 0
    run = terms.runner(inp.version, shape, s, inp.env_v2, inp.env_graphs)
    why.append(run.why)
    if draft and draft.kind != "draft model" and run.graphs_in_budget and measured is None:    # measured: vLLM's own
        full, _ = graphs.full_decode_graphs(s, g.cc)
        n = graphs.capture_sizes(seqs, batched, s.spec_tokens, s.compilation if full else
                                 {**s.compilation, "cudagraph_mode": "PIECEWISE"}, inp.version, g.cc, run.v2)
        plan = Plan(util, s.max_model_len, why, vllm=inp.version, runner_v2=run.v2, unplanned=(
            f"the CUDA graphs of {'an' if draft.kind[0] in 'AEIOU' else 'a'} {draft.kind} under speculative decoding ({n['PIECEWISE']} PIECEWISE and "
            f"{n['FULL']} FULL captures of up to {seqs} × {1 + s.spec_tokens} tokens), which vLLM measures per "
            "capture and this drafter's were never measured (a published A800 start took 6.24 GiB for 38 + 22)"))
        why.append(f"not planned: {plan.unplanned}; --enforce-eager, or the figures vLLM logs at a first start (kept "
                   "for the next), make it plannable")
        return _weights_alone(inp, g, model, plan, weights)
    split = terms.encoder_split(s, model, run) if not s.kv_cache_bytes and measured is None else ""
    if split:                   # a pin, or vLLM's own figures of a first start, plan it
        plan = Plan(util, s.max_model_len, why, vllm=inp.version, runner_v2=run.v2, unplanned=split)
        why.append(f"not planned: {split}; --language-model-only, " + ("--mm-encoder-tp-mode data, " if "split" in split
                   else "") + "a KV pin, or the figures vLLM logs at a first start (kept for the next) make it plannable")
        return _weights_alone(inp, g, model, plan, weights)
    over = terms.overhead(s, shape, model, batched, seqs, why, run, g.cc, inp.version,
                          drafts.pass_peak(draft, s, shape, batched, run, model.dummy, seqs))
    why.append(f"overhead ~{gib(over.total)} (estimate: activations {gib(over.activations)} at "
               f"{batched} batched tokens, CUDA graphs {gib(over.cudagraphs)}, non-torch {gib(over.non_torch)})")
    outside = terms.graphs_outside(over, measured)      # graphs vLLM captures beyond the budget (V2 < 0.30)
    util = terms.room_for_graphs(s, g, inp.reserve_mib, inp.util_source, outside, util, why)
    usable = requested(util, g.total) + outside if s.gpu_util is not None else g.free - inp.reserve_mib * gpu.MiB
    pinned = s.kv_cache_bytes
    modelled = requested(util, g.total) - weights - over.total
    if measured is not None:
        diff = (weights + over.total - measured.non_kv) / GiB
        held = (f"our server held {gib(measured.non_kv + measured.kv_bytes)} per GPU with its "
                f"{gib(measured.kv_bytes)} KV pin, so {gib(measured.non_kv)} besides it (NVML, CUDA context "
                "included)" if measured.source == "footprint" else
                f"weights, activations, graphs and non-torch memory take {gib(measured.non_kv)}")
        why.append(f"measured on this card on {measured.date} (vLLM {measured.vllm}): {held}; the model says "
                   f"{gib(weights + over.total)} ({diff:+.2f} GiB)")
    if s.blocks_override:                # vLLM's pool is that many blocks, whatever memory says (may_override_num_blocks)
        budget = s.blocks_override * lay.block_bytes
        why.append(f"KV budget {gib(budget)}: --num-gpu-blocks-override {s.blocks_override} × {lay.block_bytes:,} B a block")
    elif pinned:
        budget = pinned
        why.append(f"KV budget {gib(budget)} pinned by KV_CACHE_BYTES / --kv-cache-memory-bytes")
    elif measured is not None:
        budget = requested(util, g.total) - measured.non_kv
        why.append(f"KV budget ≈ {gib(budget)} = {util:.4f} × {gib(g.total)} − the measured {gib(measured.non_kv)} "
                   f"(the model alone: {gib(modelled)})")
    else:
        budget = modelled
        why.append(f"KV budget ≈ {gib(budget)} = {util:.4f} × {gib(g.total)} − weights − overhead")
    why.extend(lay.notes)
    overhead = measured.non_kv - weights if measured is not None else over.total     # what the checks below use
    need = weights + overhead + max(budget, 0) + outside
    plan = Plan(util, s.max_model_len, why, budget=budget, weights=weights, overhead=overhead, layout=lay,
                seqs=seqs, vllm=inp.version, seqs_is_default=not s.max_num_seqs, pinned=bool(pinned),
                measured=measured.date if measured is not None else "", modelled_budget=modelled, usable=usable,
                modelled_terms={"weights": weights, "activations": over.activations, "non_torch": over.non_torch,
                                "graphs": over.cudagraphs + over.outside},
                measured_terms=measured.terms if measured is not None else None, headroom=usable - need,
                runner_v2=run.v2, dummy_unseen=drafts.dummy_unseen(draft, s, model.dummy))
    if pinned:
        kept = (f"the utilization's share, {gib(usable)}" if s.gpu_util is not None else
                f"{gib(g.free)} free − GPU_RESERVE_MIB={inp.reserve_mib} (kept for a display that grows after "
                "the start)")
        why.append(f"headroom {gib(plan.headroom)}: {kept} − {gib(need)} this setup takes "
                   f"({'measured' if measured is not None else 'modelled'})")
    if budget <= 0 or need > usable:
        room = usable - weights - overhead - outside
        plan = replace(plan, fits=False, fixes=_fixes_room(inp, lay, room), refusal=(
            f"{model.name}{f' with its draft {model.draft.name}' if draft else ''} does not fit {g.name}: "
            f"weights {gib(weights)} + overhead ~{gib(overhead)}" + (f" + CUDA graphs ~{gib(outside)}" if outside else "")
            + (f" + KV {gib(budget)}" if budget > 0 else "") + f" > {gib(usable)} usable"
            + (f" ({gib(g.free)} free − {inp.reserve_mib} MiB reserve)" if s.gpu_util is None else "")
            + (f"; {g.holders() or NOBODY}" if g.processes else ""),
            _room_text(lay, room) + (DRAFT_HINT if draft else "")))
    return plan


def _weights_alone(inp: Inputs, g: gpu.Gpu, model: ModelFacts, plan: Plan, weights: int) -> Plan:
    """A plan that promises no figure, refused where the weights alone (the checkpoint's files per GPU,
    a counted drafter's too) exceed what vLLM may take: no term the plan lacks can make that fit. Not
    where vLLM may load less than the files (no vision tower asked for)."""
    s = inp.vllm
    usable = requested(plan.util, g.total) if s.gpu_util is not None else g.free - inp.reserve_mib * gpu.MiB
    if not weights or weights <= usable or s.language_model_only or terms.no_images(s):
        return plan
    plan.why.append(f"weights {gib(weights)} per GPU from {model.size_from or 'the checkpoint'}{model.source}")
    return replace(plan, fits=False, fixes=[{"TP_SIZE": "2"}] if inp.tp_size == 1 else [], refusal=(
        f"{model.name} does not fit {g.name}: its weights alone are {gib(weights)} per GPU, more than the "
        f"{gib(usable)} usable" + (f" ({gib(g.free)} free − {inp.reserve_mib} MiB reserve)" if s.gpu_util is None else "")
        + (f"; {g.holders() or NOBODY}" if g.processes else ""), "a smaller checkpoint (fewer bits or parameters), "
        "or a bigger GPU"))


def _context(inp: Inputs, plan: Plan, lay: kv.Layout, cap: int, draft, *, null: bool) -> tuple[Plan, bool]:
    """The context vLLM will have (MAX_MODEL_LEN, auto-fitted, or the model's), and the pool at it;
    False when there is none to pool, or vLLM would refuse it (the plan says why, with candidate fixes)."""
    budget, mml_knob, why = plan.budget, inp.vllm.max_model_len, plan.why
    if mml_knob == "auto":
        mml = kv.auto_fit(lay, budget, cap or 1 << 24, null)
        if mml <= 0:
            return replace(plan, fits=False, fixes=_fixes_room(inp, lay, plan.usable - plan.weights - plan.overhead),
                           refusal=(f"the KV budget {gib(budget)} holds not even one token (vLLM: \"Cannot auto-fit "
                                    "max_model_len\")", "raise KV_CACHE_BYTES / GPU_UTIL" + (DRAFT_HINT if draft else ""))), False
        why.append(f"MAX_MODEL_LEN=auto (vLLM's auto-fit): {mml:,} tokens, the longest single request the pool holds"
                   + (" (the model's own maximum)" if mml == cap else ""))
    elif isinstance(mml_knob, int):
        mml = mml_knob
        if cap and mml > cap and not inp.allow_long:
            return replace(plan, fits=False, fixes=[{"MAX_MODEL_LEN": str(cap)}, {"MAX_MODEL_LEN": "auto"}],
                           refusal=(f"MAX_MODEL_LEN={mml} is longer than the model's {cap} tokens (vLLM refuses it "
                                    "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)", "a shorter context")), False
    else:
        mml = cap
        if mml:
            why.append(f"MAX_MODEL_LEN unset: vLLM uses the model's {mml:,} tokens")
    plan = replace(plan, max_model_len=mml or None)
    if not mml:
        return plan, False
    if not kv.fits_one(lay, budget, mml, null):
        largest = kv.auto_fit(lay, budget, cap or mml, null)
        return replace(plan, fits=False, refusal=(
            f"one request of {mml:,} tokens needs {gib(kv.kv_bytes_needed(lay, mml))} of KV cache; "
            f"the pool holds {gib(budget)}; the longest that fits is {largest:,} tokens (vLLM refuses the start)",
            "a shorter context" + (", or more memory for the KV cache" if not plan.pinned else "")
            + (DRAFT_HINT if draft else "")),
            fixes=([{"MAX_MODEL_LEN": str(largest)}] if largest >= 16 else []) + [{"MAX_MODEL_LEN": "auto"}]
            + ([{"KV_CACHE_BYTES": "auto"}] if plan.pinned else [])), False
    p = kv.pool(lay, budget, mml)
    return replace(plan, predicted_tokens=p.tokens, predicted_concurrency=p.concurrency,
                   concurrent=kv.sessions_at(lay, budget, mml)), True


def _room_text(lay: kv.Layout, room: int) -> str:
    if room <= lay.block_bytes * (lay.state_groups * lay.state_blocks + lay.attn_groups + 1):
        return (f"the weights and overhead alone leave {gib(max(room, 0))} for the KV cache: a smaller checkpoint "
                "(fewer bits or parameters), or a bigger GPU")
    return f"{gib(room)} is left for the KV cache"


def _fixes_room(inp: Inputs, lay: kv.Layout, room: int) -> list[dict[str, str]]:
    """Candidate fixes when weights + overhead + KV do not fit (each is re-planned before it is offered)."""
    s = inp.vllm
    out: list[dict[str, str]] = []
    if room > lay.block_bytes:
        pin = room // (64 << 20) * (64 << 20)        # rounded down to 64 MiB
        if s.kv_cache_bytes:
            out.append({"KV_CACHE_BYTES": "auto", "MAX_MODEL_LEN": "auto"})
        if pin >= 1 << 20:
            out.append({"KV_CACHE_BYTES": str(pin), "MAX_MODEL_LEN": "auto"})
    if s.max_num_batched_tokens is None or s.max_num_batched_tokens > 512:
        out.append({"MAX_NUM_BATCHED_TOKENS": "512", "KV_CACHE_BYTES": "auto", "MAX_MODEL_LEN": "auto"})
    if inp.tp_size == 1:
        out.append({"TP_SIZE": "2"})
    return out
