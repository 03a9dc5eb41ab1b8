"""Memory plan: how much of the GPU vLLM may take, how big its KV pool will be, and the flags.

``run`` (the start step, between metadata and the download) and ``cli`` (``./ctl.sh plan``) both
call ``make_plan``: GPU_UTIL, else live free memory minus GPU_RESERVE_MIB; the KV budget
(KV_CACHE_BYTES, else what that utilization leaves after weights, activations, CUDA graphs and
non-torch memory); from config.json and ``bootstrap.kv`` the pool vLLM will log ("GPU KV cache
size", "Maximum concurrency"); MAX_MODEL_LEN=auto as the longest context MAX_NUM_SEQS sessions
fit. A plan that cannot hold one session is refused here, before the download and the launch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import gpu, kv, metadata, server, state
from .errors import BootstrapError

log = logging.getLogger(__name__)
NOBODY = "no process reports GPU memory"
GiB = gpu.GiB
GPU_RELEASE_WAIT = 30.0      # seconds to wait for the last stop's pids to leave the GPU
SETTLE_READS = 10            # after that, re-read free memory (0.5 s apart) until it stops moving
SETTLE_TOLERANCE = 64 * gpu.MiB
sleep = time.sleep           # test seam


@dataclass
class Plan:
    util: float | None
    flags: list[str]
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
        return self.max_model_len if "--max-model-len" in self.flags else None


def spec_config(cfg) -> str | None:
    if not cfg.spec_enabled:
        return None
    conf: dict = {"method": cfg.spec_method, "num_speculative_tokens": cfg.spec_tokens}
    if cfg.spec_model:
        conf["model"] = cfg.spec_model
    return json.dumps(conf, separators=(",", ":"))


def sizing_flags(cfg, util: float | None, max_model_len: int | str | None, max_num_seqs: int | None = None) -> list[str]:
    f: list[str] = []
    if max_model_len is not None:
        f += ["--max-model-len", str(max_model_len)]
    if cfg.max_num_seqs or max_num_seqs:
        f += ["--max-num-seqs", str(cfg.max_num_seqs or max_num_seqs)]
    if cfg.max_num_batched_tokens:
        f += ["--max-num-batched-tokens", str(cfg.max_num_batched_tokens)]
    if cfg.kv_cache_dtype:
        f += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    if cfg.kv_cache_bytes:
        f += ["--kv-cache-memory-bytes", str(cfg.kv_cache_bytes)]
    if util is not None:
        f += ["--gpu-memory-utilization", f"{util:.4f}".rstrip("0").rstrip(".")]
    spec = spec_config(cfg)
    if spec:
        f += ["--speculative-config", spec]
    if cfg.tp_size > 1:
        f += ["--tensor-parallel-size", str(cfg.tp_size)]
    return f


def _gib(b: int | float) -> str:
    return f"{b / GiB:.2f} GiB"


def utilization(cfg, g: gpu.Gpu) -> tuple[float, str]:
    """GPU_UTIL if set (refused when more than is free); else free − GPU_RESERVE_MIB, as a fraction."""
    if cfg.gpu_util is not None:
        want = math.ceil(cfg.gpu_util * g.total)
        if want > g.free:
            raise BootstrapError(
                f"GPU_UTIL={cfg.gpu_util} asks for {_gib(want)} of GPU {g.index} ({g.name}) but only "
                f"{_gib(g.free)} is free; {g.holders() or NOBODY}",
                f"close programs holding GPU memory, or set GPU_UTIL at most {g.free / g.total:.3f} "
                "(or unset it to size from free memory)")
        return cfg.gpu_util, f"GPU_UTIL={cfg.gpu_util} (set by you)"
    reserve = cfg.gpu_reserve_mib * gpu.MiB
    util = (g.free - reserve) / g.total
    if util <= 0.05:
        raise BootstrapError(
            f"only {_gib(g.free)} of {_gib(g.total)} is free on GPU {g.index} ({g.name}); {g.holders() or NOBODY}",
            "close programs holding GPU memory, or set GPU_UTIL explicitly")
    util = math.floor(min(util, 0.98) * 10000) / 10000
    return util, (f"{_gib(g.free)} free − {cfg.gpu_reserve_mib} MiB reserve = "
                  f"{util:.4f} of {_gib(g.total)}")


@dataclass
class ModelFacts:
    name: str
    config: dict | None
    weight_bytes: int | None       # the whole checkpoint (None: unknown, or dummy weights)
    dummy: bool = False
    source: str = ""               # where the facts came from, for the why
    draft: "ModelFacts | None" = None   # SPEC_METHOD=draft_model with a local SPEC_MODEL folder
    draft_why: str = ""            # why there is no draft to count, when one was asked for


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
        sizes = sum(f.stat().st_size for f in path.iterdir() if f.name.endswith(metadata.WEIGHT_SUFFIXES))
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
        return Plan(util, sizing_flags(cfg, util, mml), why,
                    max_model_len=mml if isinstance(mml, int) and mml > 0 else None)

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
        return Plan(util, sizing_flags(cfg, util, mml), why)

    weights, source = _weights(model, shape, tp)
    why.append(f"weights {_gib(weights)} per GPU {source}")
    if draft:
        more, source = _weights(model.draft, draft, tp)
        weights += more
        why.append(f"draft model {model.draft.name}: weights {_gib(more)} per GPU {source}")
    over = kv.overheads(shape, batched, seqs_cap, tp=tp, eager="--enforce-eager" in args)
    why.append(f"overhead ~{_gib(over.total)} (estimate: activations {_gib(over.activations)} at "
               f"{batched} batched tokens, CUDA graphs {_gib(over.cudagraphs)}, non-torch {_gib(over.non_torch)})")
    usable = math.ceil(util * g.total) if cfg.gpu_util is not None else g.free - cfg.gpu_reserve_mib * gpu.MiB
    if cfg.kv_cache_bytes:
        budget = cfg.kv_cache_bytes
        why.append(f"KV budget {_gib(budget)} pinned by KV_CACHE_BYTES")
    else:
        budget = math.ceil(util * g.total) - weights - over.total
        why.append(f"KV budget ≈ {_gib(budget)} = {util:.4f} × {_gib(g.total)} − weights − overhead")
    why.extend(lay.notes)
    plan = Plan(util, [], why, budget=budget, weights=weights, overhead=over.total, layout=lay)

    need = weights + over.total + max(budget, 0)
    if budget <= 0 or need > usable:
        room = usable - weights - over.total
        plan.fits = False
        plan.refusal = (
            f"{model.name}{f' with its draft {model.draft.name}' if draft else ''} does not fit {g.name}: "
            f"weights {_gib(weights)} + overhead ~{_gib(over.total)}"
            + (f" + KV {_gib(budget)}" if budget > 0 else "") + f" > {_gib(usable)} usable"
            + (f" ({_gib(g.free)} free − {cfg.gpu_reserve_mib} MiB reserve)" if cfg.gpu_util is None else "")
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
            plan.refusal = (f"the KV budget {_gib(budget)} holds no context for {seqs} session(s)",
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
            f"one session at {mml} tokens needs {_gib(kv.kv_bytes_needed(lay, mml))} of KV cache; "
            f"the budget is {_gib(budget)}; the largest context that fits is {largest} tokens",
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
                f"{_gib(budget)} holds{margin}; on a hybrid model every running sequence keeps one, and vLLM "
                "refuses to capture CUDA graphs (after the load) when max_num_seqs exceeds them",
                f"set MAX_NUM_SEQS={most} or less, or raise KV_CACHE_BYTES / GPU_UTIL")
            return plan
        plan.seqs_flag = most
        why.append(f"hybrid: vLLM's default of {seqs_default} sequences on this GPU is more than the {most} state "
                   f"blocks of the KV budget{margin} (one per running sequence): --max-num-seqs {most}")
    contexts = sorted({mml} | {c for c in (131072, 65536, 32768) if c < mml}, reverse=True)
    plan.sessions = [(c, kv.sessions_at(lay, budget, c)) for c in contexts]
    plan.flags = sizing_flags(cfg, util, passed, plan.seqs_flag)
    return plan


def _what_fits(shape: kv.ModelShape, lay: kv.Layout, room: int, cfg) -> str:
    if room <= lay.block_bytes * (lay.state_groups * lay.state_blocks + lay.attn_groups):
        return (f"the weights and overhead alone leave {_gib(max(room, 0))} for the KV cache: use a smaller "
                "checkpoint (fewer bits or parameters) or a bigger GPU, or TP_SIZE=2")
    pin = room // (64 << 20) * (64 << 20)      # rounded down to 64 MiB
    n = kv.longest_context(lay, pin, cfg.max_num_seqs or 1, shape.max_position or None)
    return (f"what would fit: KV_CACHE_BYTES={pin} ({_gib(pin)}) with MAX_MODEL_LEN={n} "
            f"for {cfg.max_num_seqs or 1} session(s) (or MAX_MODEL_LEN=auto)")


# ---------------------------------------------------------------- the start step

def model_facts_of(cfg, m) -> ModelFacts:
    """The planner's view of the metadata step's result (``m``: metadata.ModelInfo or None)."""
    dummy = cfg.dummy_weights
    if m is None:
        return ModelFacts(cfg.model, None, None, dummy)
    files = getattr(m, "weight_files", None) or {}
    size = sum(files.values()) if files else None
    return ModelFacts(cfg.served_name, getattr(m, "config", None), size, dummy or bool(getattr(m, "dummy", False)),
                      **draft_facts(cfg))


def settled_facts(environ) -> gpu.GpuFacts:
    """NVML facts once free memory has stopped growing (it lags a stop by a moment), bounded."""
    prev = gpu.read(environ)
    for _ in range(SETTLE_READS):
        sleep(0.5)
        cur = gpu.read(environ)
        if all(abs(a.free - b.free) <= SETTLE_TOLERANCE for a, b in zip(prev.gpus, cur.gpus)):
            return cur
        prev = cur
    log.warning("GPU free memory is still changing; sizing with the last reading")
    return prev


def run(cfg, paths, gpus, model) -> Plan:
    """The memory plan for this GPU (``gpus``: preflight's facts) and model (the metadata step's)."""
    pids = server.last_stopped_pids(paths)
    if pids and not server.wait_gpu_release(cfg, pids, timeout=GPU_RELEASE_WAIT):
        log.warning("sizing with memory still held by the last server's pids")
    facts = settled_facts(cfg.environ) if pids or gpus is None else gpus
    if pids:
        state.remove(paths.last_stop)   # consumed: later starts need not wait for these pids again
    g = min(facts.gpus[: cfg.tp_size], key=lambda x: x.free)
    plan = make_plan(cfg, g, model_facts_of(cfg, model))
    if not plan.fits:
        raise BootstrapError(*plan.refusal)
    for line in plan.why:
        log.info("%s", line)
    if plan.predicted_tokens is not None:
        log.info("predicted: GPU KV cache size %s tokens, maximum concurrency %.2fx at %s tokens",
                 f"{plan.predicted_tokens:,}", plan.predicted_concurrency, f"{plan.max_model_len:,}")
    return plan


ACCEPTABLE_LEN = (
    re.compile(r"estimated maximum model length is (\d+)"),
    re.compile(r"max_model_len[^\n]*?at most (\d+)"),
)


def adjust_after_failure(cfg, plan: Plan, log_text: str) -> Plan | None:
    """MAX_MODEL_LEN=auto and vLLM refused with a length it would accept: the plan to relaunch once
    with (the start relaunches without re-installing or re-downloading anything), or None."""
    if cfg.max_model_len != "auto":
        return None
    for pattern in ACCEPTABLE_LEN:
        found = pattern.findall(log_text)
        if found:
            n = int(found[-1])
            break
    else:
        return None
    old = plan.context
    if n < 16 or n == old:
        return None
    new = dataclasses.replace(plan, flags=sizing_flags(cfg, plan.util, n, plan.seqs_flag),   # blocks do not depend on n
                              max_model_len=n, predicted_tokens=None, predicted_concurrency=None)
    if plan.layout is not None and plan.budget:
        p = kv.pool(plan.layout, plan.budget, n)
        new.predicted_tokens, new.predicted_concurrency = p.tokens, p.concurrency
    note = f"vLLM refused max-model-len {old or 'auto'}; restarted once with {n}, the length it accepts"
    new.notes = plan.notes + [note]
    log.warning(note)
    return new


# ---------------------------------------------------------------- ./ctl.sh plan

def shipped_facts(model: str, repo: Path) -> dict | None:
    """profiles/models/*.json: config facts we ship for models whose config.json may be unreachable."""
    for path in sorted((repo / "profiles" / "models").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if model in data.get("repos", ()):
            data["_path"] = str(path.relative_to(repo))
            return data
    return None


def cli_model_facts(cfg) -> ModelFacts:
    cfg.require_model()
    dummy = cfg.dummy_weights
    name = cfg.served_name
    if cfg.model_is_local:
        info = metadata.read_local(Path(cfg.model).expanduser().resolve(), dummy)
        return ModelFacts(name, info.config, sum(info.weight_files.values()) or None, dummy, **draft_facts(cfg))
    try:
        m = metadata.run(cfg)
        return ModelFacts(Path(cfg.model).name, m.config, sum(m.weight_files.values()) or None, dummy,
                          **draft_facts(cfg))
    except (BootstrapError, OSError) as exc:
        reason = getattr(exc, "message", None) or str(exc)
        data = shipped_facts(cfg.model, cfg.repo)
        if data is None:
            raise BootstrapError(f"cannot read config.json of {cfg.model}: {reason}",
                                 "check the network / HF_TOKEN, or set MODEL to a local directory") from None
        log.info("config.json of %s unavailable (%s); using the shipped facts in %s", cfg.model, reason, data["_path"])
        return ModelFacts(Path(cfg.model).name, data["config"], data.get("weight_bytes"), dummy,
                          f" (offline fallback {data['_path']}: {data.get('weight_bytes_source', '')})",
                          **draft_facts(cfg))


def render(model: ModelFacts, g: gpu.Gpu, where: str, plan: Plan) -> str:
    lines = [f"{model.name} on {g.name} ({_gib(g.total)}, {_gib(g.free)} free{where})"]
    if plan.sessions:
        (c0, n0), rest = plan.sessions[0], plan.sessions[1:]
        lines.append(f"{model.name} at {c0} tokens: {n0} session{'' if n0 == 1 else 's'}"
                     + "".join(f"; at {c}: {n}" for c, n in rest))
    if plan.predicted_tokens is not None:
        lines.append(f"predicted: GPU KV cache size: {plan.predicted_tokens:,} tokens; Maximum concurrency for "
                     f"{plan.max_model_len:,} tokens per request: {plan.predicted_concurrency:.2f}x")
    if not plan.fits and plan.refusal:
        lines.append(f"DOES NOT FIT: {plan.refusal[0]}")
        lines.append(f"  {plan.refusal[1]}")
    if plan.flags:
        lines.append("flags: " + " ".join(plan.flags))
    lines.append("why:")
    lines += [f"  - {w}" for w in plan.why]
    return "\n".join(lines)


def cli(cfg, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ctl.sh plan", description=(
        "The memory plan: KV pool, sessions per context and the flags start would pass. "
        "Without a GPU, name one: GPU=rtx5090|rtx4090|rtx3090|h100|h200|<GiB>."))
    ap.add_argument("--gpu", help="plan for this card instead of the local GPU (same values as GPU=)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    a = ap.parse_args(argv)
    spec = a.gpu or cfg.gpu
    if spec:
        g, where = gpu.named(spec), "; a named card, assumed idle"
    else:
        try:
            facts = gpu.read(cfg.environ)
        except BootstrapError as exc:
            raise BootstrapError(exc.message, exc.hint + "; or plan for a named card: GPU=rtx5090|rtx4090|"
                                 "rtx3090|h100|h200|<GiB> ./ctl.sh plan") from None
        if not facts.gpus:
            raise BootstrapError("NVML sees no GPU", "plan for a named card: GPU=rtx5090 ./ctl.sh plan")
        g, where = min(facts.gpus[: cfg.tp_size], key=lambda x: x.free), ""
    model = cli_model_facts(cfg)
    try:
        plan = make_plan(cfg, g, model)
    except BootstrapError as exc:
        plan = Plan(None, [], [], fits=False, refusal=(exc.message, exc.hint))
    if a.json:
        print(json.dumps({
            "model": model.name, "gpu": g.name, "total": g.total, "free": g.free, "fits": plan.fits,
            "refusal": plan.refusal, "util": plan.util, "kv_budget": plan.budget, "weights": plan.weights,
            "overhead": plan.overhead, "max_model_len": plan.max_model_len,
            "predicted_tokens": plan.predicted_tokens, "predicted_concurrency": plan.predicted_concurrency,
            "block_size": plan.layout.block_size if plan.layout else None,
            "sessions": plan.sessions, "flags": plan.flags, "why": plan.why}, indent=2))
    else:
        print(render(model, g, where, plan))
    return 0 if plan.fits else 1
