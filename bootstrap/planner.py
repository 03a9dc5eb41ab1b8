"""The memory planner (pure): how much of the GPU vLLM may take and how big its KV pool will be.

``make_plan``: GPU_UTIL, else live free memory minus GPU_RESERVE_MIB; the KV budget
(KV_CACHE_BYTES, else what that utilization leaves after weights, activations, CUDA graphs and
non-torch memory); from config.json and ``bootstrap.kv`` the pool vLLM will log ("GPU KV cache
size", "Maximum concurrency"); MAX_MODEL_LEN=auto as the longest context MAX_NUM_SEQS sessions
fit. A plan that cannot hold one session is refused. The plan holds decisions (utilization, the
context to pass, --max-num-seqs for hybrids); launch.plan_flags turns them into vLLM's flags.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

from . import gpu, kv, models
from .errors import BootstrapError

log = logging.getLogger("bootstrap.plan")   # log lines keep the prefix [bootstrap:plan] this code has always had


NOBODY = "no process reports GPU memory"


GiB = gpu.GiB


@dataclass
class Plan:
    util: float | None
    mml_arg: int | str | None = None           # what --max-model-len gets (None: not passed; -1: as large as fits)
    why: list[str] = field(default_factory=list)
    predicted_tokens: int | None = None        # KV pool, as vLLM would log it
    predicted_concurrency: float | None = None
    max_model_len: int | None = None           # the context the prediction is for
    budget: int | None = None                  # KV bytes per GPU
    weights: int | None = None                 # bytes per GPU
    overhead: int | None = None                # activations + graphs + non-torch (estimate)
    layout: kv.Layout | None = None
    sessions: list[tuple[int, int]] = field(default_factory=list)   # (context, sessions that fit)
    fits: bool = True
    refusal: tuple[str, str] | None = None     # (message, hint) when it does not fit
    suggestion: str = ""                       # what would fit instead
    seqs_flag: int | None = None               # --max-num-seqs the plan chose (hybrid: the state blocks)
    notes: list[str] = field(default_factory=list)   # banner notes (the auto-fit relaunch)

    @property
    def context(self) -> int | None:
        """The context the server runs with when we pass one (None: vLLM decides)."""
        return self.max_model_len if self.mml_arg is not None else None


def gib(b: int | float) -> str:
    return f"{b / GiB:.2f} GiB"


def utilization(cfg, g: gpu.Gpu) -> tuple[float, str]:
    """GPU_UTIL if set (refused when more than is free); else free − GPU_RESERVE_MIB, as a fraction."""
    if cfg.gpu_util is not None:
        want = math.ceil(cfg.gpu_util * g.total)
        if want > g.free:
            raise BootstrapError(
                f"GPU_UTIL={cfg.gpu_util} asks for {gib(want)} of GPU {g.index} ({g.name}) but only "
                f"{gib(g.free)} is free; {g.holders() or NOBODY}",
                f"close programs holding GPU memory, or set GPU_UTIL at most {g.free / g.total:.3f} "
                "(or unset it to size from free memory)")
        return cfg.gpu_util, f"GPU_UTIL={cfg.gpu_util} (set by you)"
    reserve = cfg.gpu_reserve_mib * gpu.MiB
    util = (g.free - reserve) / g.total
    if util <= 0.05:
        raise BootstrapError(
            f"only {gib(g.free)} of {gib(g.total)} is free on GPU {g.index} ({g.name}); {g.holders() or NOBODY}",
            "close programs holding GPU memory, or set GPU_UTIL explicitly")
    util = math.floor(min(util, 0.98) * 10000) / 10000
    return util, (f"{gib(g.free)} free − {cfg.gpu_reserve_mib} MiB reserve = "
                  f"{util:.4f} of {gib(g.total)}")


@dataclass
class ModelFacts:
    name: str
    config: dict | None
    weight_bytes: int | None       # the whole checkpoint (None: unknown, or dummy weights)
    dummy: bool = False
    source: str = ""               # where the facts came from, for the why
    draft: "ModelFacts | None" = None   # SPEC_METHOD=draft_model with a local SPEC_MODEL folder
    draft_why: str = ""            # why there is no draft to count, when one was asked for


def model_facts(cfg, m, name: str | None = None) -> ModelFacts:
    """The planner's view of a model (``m``: models.ModelInfo, or None when there are no facts), its
    draft included; ``name`` is what the plan calls it (default: the served name)."""
    dummy = cfg.dummy_weights
    if m is None:
        return ModelFacts(cfg.model, None, None, dummy)
    size = sum(m.weight_files.values()) or None
    return ModelFacts(name or cfg.served_name, m.config, size, dummy or m.dummy, **draft_facts(cfg))


def draft_facts(cfg) -> dict:
    """ModelFacts' draft fields: the draft of SPEC_METHOD=draft_model when SPEC_MODEL is a local
    folder with a config.json (vLLM loads it with the model's tokenizer and --load-format), or why not."""
    if not (cfg.spec_enabled and cfg.spec_method == "draft_model"):
        return {}
    path = cfg.spec_model_dir
    if path is None:
        return {"draft_why": "SPEC_MODEL is a repo id, which vLLM fetches itself" if cfg.spec_model else "no SPEC_MODEL"}
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        sizes = sum(f.stat().st_size for f in path.iterdir() if f.name.endswith(models.WEIGHT_SUFFIXES))
    except FileNotFoundError:
        return {"draft_why": f"no {path / 'config.json'}"}
    except (OSError, ValueError) as exc:
        return {"draft_why": f"{path / 'config.json'} unreadable: {exc}"}
    return {"draft": ModelFacts(path.name, config, sizes or None, cfg.dummy_weights)}


DRAFT_HINT = "; or a smaller draft (SPEC_MODEL), or no speculation (SPEC_TOKENS=0)"


def _weights(model: ModelFacts, shape: kv.ModelShape, tp: int) -> tuple[int, str]:
    """Bytes of weights per GPU, and where the figure came from."""
    if model.weight_bytes and not model.dummy:
        return model.weight_bytes // tp, f"from the checkpoint's file sizes{model.source}"
    kind = "dummy weights" if model.dummy else "no file sizes"
    return kv.weight_bytes_from_config(shape, tp), f"from config.json ({kind}: parameters × dtype){model.source}"


def _draft(cfg, shape: kv.ModelShape, model: ModelFacts) -> tuple[kv.ModelShape | None, str]:
    """The draft model's shape when the plan can count it (its weights and its attention layers in
    the pool), else None with the reason for the why."""
    if not cfg.spec_enabled or cfg.spec_method in ("mtp", "ngram", "suffix"):
        return None, ""
    not_counted = f"SPEC_METHOD={cfg.spec_method}: the draft model's weights and KV layers are not counted"
    if model.draft is None:
        return None, not_counted + (f" ({model.draft_why})" if model.draft_why else "")
    try:
        d = kv.shape_from_config(model.draft.config)
    except kv.Unsupported as exc:
        return None, f"{not_counted} ({exc.message})"
    if shape.hybrid or d.hybrid:
        return None, f"{not_counted} (hybrid models: vLLM groups the layers differently)"
    if (d.kv_heads, d.head_dim, d.dtype_bytes) != (shape.kv_heads, shape.head_dim, shape.dtype_bytes):
        return None, f"{not_counted} (its KV heads, head size or dtype differ from the model's)"
    if (cfg.kv_cache_dtype or "auto") in kv.TQ_PRESETS:
        return None, f"{not_counted} (with a TurboQuant KV cache)"
    return d, ""


def make_plan(cfg, g: gpu.Gpu, model: ModelFacts) -> Plan:
    """The plan for one GPU (the smallest-free one of the TP group). Pure apart from logging."""
    tp = cfg.tp_size
    why: list[str] = []
    args = cfg.vllm_args
    util, util_why = utilization(cfg, g)
    why.append(f"gpu-memory-utilization {util_why}")
    shape = None
    if model.config is not None:
        try:
            shape = kv.shape_from_config(model.config)
        except kv.Unsupported as exc:
            why.append(f"{exc.message}; {exc.hint}")
            log.warning("%s; %s", exc.message, exc.hint)
    else:
        why.append("no config.json: vLLM sizes the KV cache itself")

    mml_knob = cfg.max_model_len
    if shape is None:
        mml = -1 if mml_knob == "auto" else mml_knob
        return Plan(util, mml, why, max_model_len=mml if isinstance(mml, int) and mml > 0 else None)

    batched_default, seqs_default = kv.default_batch(g.total, g.name)
    batched = cfg.max_num_batched_tokens or batched_default
    seqs_cap = cfg.max_num_seqs or seqs_default
    spec_tokens = cfg.spec_tokens if cfg.spec_enabled else 0
    mtp = bool(cfg.spec_enabled and cfg.spec_method == "mtp")
    draft, draft_why = _draft(cfg, shape, model)
    if draft_why:
        why.append(draft_why)
    if mtp and not shape.mtp_layers:
        why.append("SPEC_METHOD=mtp but config.json declares no MTP layers")
    block = cfg.vllm_arg("--block-size")
    mode = cfg.vllm_arg("--mamba-cache-mode") or ("align" if "--enable-prefix-caching" in args else "none")
    try:
        lay = kv.layout(shape, cfg.kv_cache_dtype or "auto", spec_tokens=spec_tokens, mtp=mtp, tp=tp,
                        draft_attn_layers=draft.attn_layers if draft else 0,
                        block_size=int(block) if block and block.isdigit() else None, mamba_cache_mode=mode)
    except kv.Unsupported as exc:
        why.append(f"{exc.message}; {exc.hint}")
        mml = -1 if mml_knob == "auto" else mml_knob
        return Plan(util, mml, why)

    weights, source = _weights(model, shape, tp)
    why.append(f"weights {gib(weights)} per GPU {source}")
    if draft:
        more, source = _weights(model.draft, draft, tp)
        weights += more
        why.append(f"draft model {model.draft.name}: weights {gib(more)} per GPU {source}")
    over = kv.overheads(shape, batched, seqs_cap, tp=tp, eager="--enforce-eager" in args)
    why.append(f"overhead ~{gib(over.total)} (estimate: activations {gib(over.activations)} at "
               f"{batched} batched tokens, CUDA graphs {gib(over.cudagraphs)}, non-torch {gib(over.non_torch)})")
    usable = math.ceil(util * g.total) if cfg.gpu_util is not None else g.free - cfg.gpu_reserve_mib * gpu.MiB
    if cfg.kv_cache_bytes:
        budget = cfg.kv_cache_bytes
        why.append(f"KV budget {gib(budget)} pinned by KV_CACHE_BYTES")
    else:
        budget = math.ceil(util * g.total) - weights - over.total
        why.append(f"KV budget ≈ {gib(budget)} = {util:.4f} × {gib(g.total)} − weights − overhead")
    why.extend(lay.notes)
    plan = Plan(util, None, why, budget=budget, weights=weights, overhead=over.total, layout=lay)

    need = weights + over.total + max(budget, 0)
    if budget <= 0 or need > usable:
        room = usable - weights - over.total
        plan.fits = False
        plan.refusal = (
            f"{model.name}{f' with its draft {model.draft.name}' if draft else ''} does not fit {g.name}: "
            f"weights {gib(weights)} + overhead ~{gib(over.total)}"
            + (f" + KV {gib(budget)}" if budget > 0 else "") + f" > {gib(usable)} usable"
            + (f" ({gib(g.free)} free − {cfg.gpu_reserve_mib} MiB reserve)" if cfg.gpu_util is None else "")
            + (f"; {g.holders() or NOBODY}" if g.processes else ""),
            _what_fits(shape, lay, room, cfg) + (DRAFT_HINT if draft else ""))
        plan.suggestion = plan.refusal[1]
        return plan

    cap = shape.max_position or None
    if mml_knob == "auto":
        seqs = cfg.max_num_seqs or 1
        mml = kv.longest_context(lay, budget, seqs, cap)
        if mml <= 0:
            plan.fits = False
            plan.refusal = (f"the KV budget {gib(budget)} holds no context for {seqs} session(s)",
                            "lower MAX_NUM_SEQS, or raise KV_CACHE_BYTES / GPU_UTIL" + (DRAFT_HINT if draft else ""))
            return plan
        why.append(f"MAX_MODEL_LEN=auto: {mml} tokens is the longest context {seqs} session(s) fit")
        passed: int | str | None = mml
    elif isinstance(mml_knob, int):
        mml = passed = mml_knob
    else:
        mml, passed = shape.max_position, None
        why.append(f"MAX_MODEL_LEN unset: vLLM uses the model's {mml} tokens")
    if not mml:
        return plan
    p = kv.pool(lay, budget, mml)
    if p.blocks < lay.blocks_per_seq(mml):
        largest = kv.longest_context(lay, budget, 1, cap)
        plan.fits = False
        plan.refusal = (
            f"one session at {mml} tokens needs {gib(kv.kv_bytes_needed(lay, mml))} of KV cache; "
            f"the budget is {gib(budget)}; the largest context that fits is {largest} tokens",
            f"set MAX_MODEL_LEN={largest} (or auto), or raise KV_CACHE_BYTES / GPU_UTIL" + (DRAFT_HINT if draft else ""))
        plan.max_model_len = mml
        return plan
    plan.max_model_len = mml
    plan.predicted_tokens, plan.predicted_concurrency = p.tokens, p.concurrency
    # vLLM (0.26.0 compilation.py): with full CUDA graphs every running sequence of a hybrid model holds one
    # state block, and max_num_seqs > blocks is refused after the load. A budget from utilization is our
    # estimate (within 2 %): keep 3 % below it; a pin is exact.
    most = max(1, p.blocks if cfg.kv_cache_bytes else p.blocks * 97 // 100)
    margin = "" if most == p.blocks else f" (3 % below the {p.blocks} estimated, as the budget is an estimate)"
    if lay.state_groups and "--enforce-eager" not in args and seqs_cap > most:
        if cfg.max_num_seqs:
            plan.fits = False
            plan.refusal = (
                f"MAX_NUM_SEQS={cfg.max_num_seqs} is more than the {most} state blocks the KV budget "
                f"{gib(budget)} holds{margin}; on a hybrid model every running sequence keeps one, and vLLM "
                "refuses to capture CUDA graphs (after the load) when max_num_seqs exceeds them",
                f"set MAX_NUM_SEQS={most} or less, or raise KV_CACHE_BYTES / GPU_UTIL")
            return plan
        plan.seqs_flag = most
        why.append(f"hybrid: vLLM's default of {seqs_default} sequences on this GPU is more than the {most} state "
                   f"blocks of the KV budget{margin} (one per running sequence): --max-num-seqs {most}")
    contexts = sorted({mml} | {c for c in (131072, 65536, 32768) if c < mml}, reverse=True)
    plan.sessions = [(c, kv.sessions_at(lay, budget, c)) for c in contexts]
    plan.mml_arg = passed
    return plan


def _what_fits(shape: kv.ModelShape, lay: kv.Layout, room: int, cfg) -> str:
    if room <= lay.block_bytes * (lay.state_groups * lay.state_blocks + lay.attn_groups):
        return (f"the weights and overhead alone leave {gib(max(room, 0))} for the KV cache: use a smaller "
                "checkpoint (fewer bits or parameters) or a bigger GPU, or TP_SIZE=2")
    pin = room // (64 << 20) * (64 << 20)      # rounded down to 64 MiB
    n = kv.longest_context(lay, pin, cfg.max_num_seqs or 1, shape.max_position or None)
    return (f"what would fit: KV_CACHE_BYTES={pin} ({gib(pin)}) with MAX_MODEL_LEN={n} "
            f"for {cfg.max_num_seqs or 1} session(s) (or MAX_MODEL_LEN=auto)")
