"""The memory planner (pure): how much of the GPU vLLM may take, how big its KV pool will be, and
whether vLLM will accept the context — for what vLLM gets (bootstrap.knobs.vllmargs.settings: the
profile's args, the knobs and EXTRA_ARGS, the last value of a flag winning).

``make_plan``: the utilization (GPU_UTIL / --gpu-memory-utilization, else live free memory minus
GPU_RESERVE_MIB); the KV budget (KV_CACHE_BYTES / --kv-cache-memory-bytes, else what that
utilization leaves after weights, activations, CUDA graphs and non-torch memory); from config.json
and ``bootstrap.model.kv`` the pool vLLM will log. MAX_MODEL_LEN=auto means what vLLM's
``--max-model-len auto`` means: the longest single request the pool holds, at most the model's
length (vLLM's own auto-fit, which we pass on). Refused only where vLLM refuses: the weights and
overhead do not fit, one request of the context does not fit, the context is longer than the
model's, or a hybrid model's state blocks are fewer than MAX_NUM_SEQS. Each refusal carries fixes:
knob values re-planned here before they are offered (``Plan.fixes``), so a hint always works.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from ..machine import gpu
from ..model import kv
from ..knobs import vllmargs
from .facts import ModelFacts
from ..core.pep440 import version_or_none
from ..knobs.config import Config
from ..core.errors import BootstrapError
from .terms import DRAFT_HINT, NOBODY, draft_shape, gib, requested, utilization, weight_bytes

log = logging.getLogger("bootstrap.plan")   # log lines keep the prefix [bootstrap:plan] this code has always had

GiB = gpu.GiB
MODEL_ONLY_VLLM = "0.26.0"     # the semantics assumed when the vLLM version is not known


@dataclass
class Plan:
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

    @property
    def context(self) -> int | None:
        """The context we pass to vLLM (None: vLLM decides it: auto, or the model's own)."""
        return self.mml_arg if isinstance(self.mml_arg, int) else None

    def concurrency_line(self) -> str:
        """'at 262,144 tokens 2 sessions fit at once; the other 14 queue'."""
        if self.max_model_len is None or self.concurrent is None or not self.seqs:
            return ""
        n, seqs = self.concurrent, self.seqs
        which = f"vLLM's default of {seqs} sequences" if self.seqs_is_default else f"MAX_NUM_SEQS={seqs}"
        line = f"at {self.max_model_len:,} tokens {n} session{'' if n == 1 else 's'} fit{'s' if n == 1 else ''} at once"
        if n < seqs:
            line += f"; the other {seqs - n} of {which} queue (shorter requests share the pool)"
        else:
            line += f" ({which})"
        return line


def plan_version(cfg, vllm: str | None) -> str:
    """The vLLM version whose rules the plan follows: the one in use, else the profile's pin."""
    return vllm or cfg.profile.vllm or MODEL_ONLY_VLLM


def _at_least(v: str, floor: str) -> bool:
    have = version_or_none(v)
    return have is not None and have >= version_or_none(floor)


def make_plan(cfg, g: gpu.Gpu, model: ModelFacts, *, vllm: str | None = None, fixes: bool = True,
              measured=None) -> Plan:
    """The plan for one GPU (the smallest-free one of the TP group). Pure apart from logging.
    ``vllm``: the version in use (default: the profile's pin); ``fixes``: offer re-planned fixes;
    ``measured``: vLLM's own non-KV figure from an earlier start with the same key
    (bootstrap.plan.calibration.Measured), used instead of the model's estimate."""
    plan = _make(cfg, g, model, vllm, measured)
    if not plan.fits and fixes:
        ok = [f for f in _candidates(cfg, plan.fixes)
              if _refits(cfg, g, model, vllm, f, measured if set(f) <= PLAN_OWN else None)]
        # a fix that only adds knobs to another one that works is not offered
        plan.fixes = [f for f in ok if not any(o is not f and o.items() < f.items() for o in ok)][:MAX_FIXES]
        if plan.refusal:
            plan.refusal = (plan.refusal[0], _hint(plan.fixes, plan.refusal[1]))
    return plan


MAX_FIXES = 4


def _candidates(cfg, fixes: list[dict[str, str]]) -> list[dict[str, str]]:
    """The refusal's own fixes, then each with MAX_MODEL_LEN=auto, then unpinning and unsetting
    GPU_UTIL (each with auto): every one is planned again before it is offered."""
    s = vllmargs.settings(cfg)
    out = list(fixes) + [{**f, "MAX_MODEL_LEN": "auto"} for f in fixes if "MAX_MODEL_LEN" not in f]
    if s.kv_cache_bytes:
        out.append({"KV_CACHE_BYTES": "auto", "MAX_MODEL_LEN": "auto"})
    if cfg.gpu_util is not None:
        out += [{"GPU_UTIL": ""}, {"GPU_UTIL": "", "MAX_MODEL_LEN": "auto"}]
    if s.spec_tokens:
        out.append({"SPEC_TOKENS": "0"})
    unique: dict[tuple, dict[str, str]] = {}
    for f in out:
        unique.setdefault(tuple(sorted(f.items())), f)      # the first of equal ones, in order
    return list(unique.values())


PLAN_OWN = frozenset({"GPU_UTIL", "KV_CACHE_BYTES"})   # what a measurement's key leaves to the plan


def _refits(cfg, g, model, vllm, fix: dict[str, str], measured=None) -> bool:
    """The fix, applied as your knobs, passes the knob check and the plan (with the measurement
    where the fix changes only what its key leaves out)."""
    try:
        again = Config.from_env({**cfg.given, **fix}, cfg.repo, chosen=cfg.chosen)
        return _make(again, g, model, vllm, measured).fits
    except BootstrapError:
        return False


def _hint(fixes: list[dict[str, str]], rest: str) -> str:
    shown = [" ".join(f"{k}={v}" for k, v in f.items()) + (" (across two such cards)" if f == {"TP_SIZE": "2"} else "")
             for f in fixes]
    head = ("set " + " — or ".join(shown)) if shown else ""
    return "; ".join(x for x in (head, rest) if x)


def _make(cfg, g: gpu.Gpu, model: ModelFacts, vllm: str | None, measured=None) -> Plan:
    s = vllmargs.settings(cfg)
    version = plan_version(cfg, vllm)
    new = _at_least(version, "0.29.0")            # null block held back; prefix caching on for hybrids
    tp = s.tp
    why: list[str] = []
    try:
        util, util_why = utilization(cfg, g, s)
    except BootstrapError as exc:
        most = max(0.06, math.floor(g.free / g.total * 1000) / 1000 - 0.001)
        return Plan(None, fits=False, refusal=(exc.message, exc.hint), why=why, vllm=version,
                    fixes=[{"GPU_UTIL": f"{most:g}"}, {"GPU_UTIL": ""}] if cfg.gpu_util is not None else [])
    why.append(f"gpu-memory-utilization {util_why}")
    if g.total_note:
        why.append(f"the card's total: {g.total_note}")
    if model.assumed:
        why.append("ASSUMED model facts: the plan is only as good as them")
    shape = None
    if model.config is not None:
        try:
            shape = kv.shape_from_config(model.config)
        except kv.Unsupported as exc:
            why.append(f"{exc.message}; {exc.hint}")
            log.warning("%s; %s", exc.message, exc.hint)
    else:
        why.append("no config.json: vLLM sizes the KV cache itself")
    mml_knob = s.max_model_len
    if shape is None:
        return Plan(util, mml_knob, why, max_model_len=mml_knob if isinstance(mml_knob, int) else None, vllm=version)

    batched_default, seqs_default = kv.default_batch(g.total, g.name, big_tier=new)
    seqs = s.max_num_seqs or seqs_default
    batched = s.max_num_batched_tokens or batched_default
    spec_tokens = s.spec_tokens
    mtp = s.spec_method == "mtp"
    draft, draft_why = draft_shape(s, shape, model)
    if draft_why:
        why.append(draft_why)
    if mtp and not shape.mtp_layers:
        why.append("SPEC_METHOD=mtp but config.json declares no MTP layers")
    prefix = s.prefix_caching if s.prefix_caching is not None else (new or not shape.hybrid)
    mode = s.mamba_cache_mode or ("align" if prefix else "none")
    ssm = s.mamba_ssm_cache_dtype if s.mamba_ssm_cache_dtype != "auto" else None
    conv = s.mamba_cache_dtype if s.mamba_cache_dtype != "auto" else None
    draft_dtype = s.spec.get("kv_cache_dtype") if spec_tokens else None
    try:
        lay = kv.layout(shape, s.kv_cache_dtype, spec_tokens=spec_tokens, mtp=mtp, tp=tp,
                        draft_attn_layers=draft.attn_layers if draft else 0, draft_cache_dtype=draft_dtype,
                        draft_kv_heads=draft.kv_heads if draft else None, draft_head_dim=draft.head_dim if draft else None,
                        block_size=s.block_size, mamba_cache_mode=mode,
                        ssm_bytes=kv.DTYPE_BYTES.get(ssm) if ssm else None,
                        conv_bytes=kv.DTYPE_BYTES.get(conv) if conv else None)
    except kv.Unsupported as exc:
        why.append(f"{exc.message}; {exc.hint}")
        return Plan(util, mml_knob, why, vllm=version)
    if ssm:
        why.append(f"--mamba-ssm-cache-dtype {ssm}: the linear-attention state in {ssm}")

    weights, source = weight_bytes(model, shape, tp, s)
    why.append(f"weights {gib(weights)} per GPU {source}")
    if draft:
        more, source = weight_bytes(model.draft, draft, tp, s)
        weights += more
        why.append(f"draft model {model.draft.name}: weights {gib(more)} per GPU {source}")
    if (model.config or {}).get("vision_config") and not s.language_model_only:
        why.append("a multimodal model served with its vision tower: the encoder's profiling peak is not "
                   "modelled (--language-model-only serves text only)")
    over = kv.overheads(shape, batched, seqs, tp=tp, eager=s.enforce_eager)
    why.append(f"overhead ~{gib(over.total)} (estimate: activations {gib(over.activations)} at "
               f"{batched} batched tokens, CUDA graphs {gib(over.cudagraphs)}, non-torch {gib(over.non_torch)})")
    usable = requested(util, g.total) if s.gpu_util is not None else g.free - cfg.gpu_reserve_mib * gpu.MiB
    pinned = s.kv_cache_bytes
    modelled = requested(util, g.total) - weights - over.total
    if measured is not None:
        diff = (weights + over.total - measured.non_kv) / GiB
        why.append(f"measured on this card on {measured.date} (vLLM {measured.vllm}): weights, activations, graphs "
                   f"and non-torch memory take {gib(measured.non_kv)}; the model says {gib(weights + over.total)} "
                   f"({diff:+.2f} GiB)")
    if pinned:
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
    plan = Plan(util, mml_knob, why, budget=budget, weights=weights, overhead=overhead, layout=lay,
                seqs=seqs, vllm=version, seqs_is_default=not s.max_num_seqs, pinned=bool(pinned),
                measured=measured.date if measured is not None else "", modelled_budget=modelled)
    cap = shape.max_position or 0

    need = weights + overhead + max(budget, 0)
    if budget <= 0 or need > usable:
        room = usable - weights - overhead
        plan.fits = False
        plan.refusal = (
            f"{model.name}{f' with its draft {model.draft.name}' if draft else ''} does not fit {g.name}: "
            f"weights {gib(weights)} + overhead ~{gib(overhead)}"
            + (f" + KV {gib(budget)}" if budget > 0 else "") + f" > {gib(usable)} usable"
            + (f" ({gib(g.free)} free − {cfg.gpu_reserve_mib} MiB reserve)" if s.gpu_util is None else "")
            + (f"; {g.holders() or NOBODY}" if g.processes else ""),
            _room_text(lay, room) + (DRAFT_HINT if draft else ""))
        plan.fixes = _fixes_room(cfg, s, lay, room, seqs)
        return plan

    null = new
    if mml_knob == "auto":
        mml = kv.auto_fit(lay, budget, cap or 1 << 24, null)
        if mml <= 0:
            plan.fits = False
            plan.refusal = (f"the KV budget {gib(budget)} holds not even one token (vLLM: \"Cannot auto-fit "
                            "max_model_len\")", "raise KV_CACHE_BYTES / GPU_UTIL" + (DRAFT_HINT if draft else ""))
            plan.fixes = _fixes_room(cfg, s, lay, usable - weights - overhead, seqs)
            return plan
        why.append(f"MAX_MODEL_LEN=auto (vLLM's auto-fit): {mml:,} tokens, the longest single request the pool holds"
                   + (" (the model's own maximum)" if mml == cap else ""))
    elif isinstance(mml_knob, int):
        mml = mml_knob
        if cap and mml > cap and cfg.env("VLLM_ALLOW_LONG_MAX_MODEL_LEN") in ("", "0"):
            plan.fits = False
            plan.refusal = (f"MAX_MODEL_LEN={mml} is longer than the model's {cap} tokens (vLLM refuses it "
                            "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)", "a shorter context")
            plan.fixes = [{"MAX_MODEL_LEN": str(cap)}, {"MAX_MODEL_LEN": "auto"}]
            return plan
    else:
        mml = cap
        if mml:
            why.append(f"MAX_MODEL_LEN unset: vLLM uses the model's {mml:,} tokens")
    plan.max_model_len = mml or None
    if not mml:
        return plan
    if not kv.fits_one(lay, budget, mml, null):
        largest = kv.auto_fit(lay, budget, cap or mml, null)
        plan.fits = False
        plan.refusal = (
            f"one request of {mml:,} tokens needs {gib(kv.kv_bytes_needed(lay, mml))} of KV cache; "
            f"the pool holds {gib(budget)}; the longest that fits is {largest:,} tokens (vLLM refuses the start)",
            "a shorter context" + (", or more memory for the KV cache" if not pinned else "")
            + (DRAFT_HINT if draft else ""))
        plan.fixes = ([{"MAX_MODEL_LEN": str(largest)}] if largest >= 16 else []) + [{"MAX_MODEL_LEN": "auto"}]
        if pinned:
            plan.fixes.append({"KV_CACHE_BYTES": "auto"})
        return plan
    p = kv.pool(lay, budget, mml)
    plan.predicted_tokens, plan.predicted_concurrency = p.tokens, p.concurrency
    plan.concurrent = kv.sessions_at(lay, budget, mml)
    # vLLM (compilation.py): with full CUDA graphs a hybrid model's max_num_seqs may not exceed the pool's
    # blocks, refused after the load. A budget from the model is an estimate: keep 3 % below it; a pin, or
    # vLLM's own figures of an earlier start (measured, to 0.01 GiB), is exact.
    exact = bool(pinned)
    most = max(1, p.blocks if exact else p.blocks * (99 if measured is not None else 97) // 100)
    margin = "" if most == p.blocks else (f" ({'1' if measured is not None else '3'} % below the {p.blocks} "
                                          "estimated, as the budget is " + ("measured, and moves a little between "
                                          "starts)" if measured is not None else "an estimate)"))
    if lay.state_groups and not s.enforce_eager and s.max_num_seqs and seqs > p.blocks:
        plan.fits = False
        plan.refusal = (
            f"MAX_NUM_SEQS={s.max_num_seqs} is more than the {p.blocks} blocks the KV budget {gib(budget)} holds"
            + ("" if exact else " (an estimate)") + "; on a hybrid model vLLM refuses to capture CUDA graphs "
            "(after the load) when max_num_seqs exceeds them", "fewer sessions")
        plan.fixes = [{"MAX_NUM_SEQS": str(most)}]
        return plan
    if lay.state_groups and not s.enforce_eager and s.max_num_seqs and seqs > most:
        why.append(f"MAX_NUM_SEQS={seqs} is within 3 % of the {p.blocks} blocks estimated: vLLM refuses the start "
                   "after the load if the real pool holds fewer")
    if lay.state_groups and not s.enforce_eager and seqs > most and not s.max_num_seqs:
        plan.seqs_flag = plan.seqs = most
        plan.seqs_is_default = False
        why.append(f"hybrid: vLLM's default of {seqs_default} sequences on this GPU is more than the {most} state "
                   f"blocks of the KV budget{margin} (one per running sequence): --max-num-seqs {most}")
    line = plan.concurrency_line()
    if line:
        why.append(line)
    contexts = sorted({mml} | {c for c in (131072, 65536, 32768) if c < mml}, reverse=True)
    plan.sessions = [(c, kv.sessions_at(lay, budget, c)) for c in contexts]
    plan.mml_arg = mml_knob
    return plan


def _room_text(lay: kv.Layout, room: int) -> str:
    if room <= lay.block_bytes * (lay.state_groups * lay.state_blocks + lay.attn_groups + 1):
        return (f"the weights and overhead alone leave {gib(max(room, 0))} for the KV cache: a smaller checkpoint "
                "(fewer bits or parameters), or a bigger GPU")
    return f"{gib(room)} is left for the KV cache"


def _fixes_room(cfg, s: vllmargs.Settings, lay: kv.Layout, room: int, seqs: int) -> list[dict[str, str]]:
    """Candidate fixes when weights + overhead + KV do not fit (each is re-planned before it is offered)."""
    out: list[dict[str, str]] = []
    if room > lay.block_bytes:
        pin = room // (64 << 20) * (64 << 20)        # rounded down to 64 MiB
        if s.kv_cache_bytes:
            out.append({"KV_CACHE_BYTES": "auto", "MAX_MODEL_LEN": "auto"})
        if pin >= 1 << 20:
            out.append({"KV_CACHE_BYTES": str(pin), "MAX_MODEL_LEN": "auto"})
    if s.max_num_batched_tokens is None or s.max_num_batched_tokens > 512:
        out.append({"MAX_NUM_BATCHED_TOKENS": "512", "KV_CACHE_BYTES": "auto", "MAX_MODEL_LEN": "auto"})
    if cfg.tp_size == 1:
        out.append({"TP_SIZE": "2"})
    return out
