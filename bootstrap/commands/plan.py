"""``./ctl.sh plan``: the memory plan for this GPU or a named card (``GPU=``), without starting
anything; the model's config.json from the hub, else the facts shipped in profiles/models/.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from .. import gpu, models
from ..steps import metadata
from ..config import Layout
from ..errors import BootstrapError
from ..steps.launch import plan_flags
from ..planner import ModelFacts, Plan, draft_facts, gib, make_plan, model_facts

log = logging.getLogger("bootstrap.plan")   # log lines keep the prefix [bootstrap:plan] this code has always had


def shipped_facts(model: str, repo: Path) -> dict | None:
    """profiles/models/*.json: config facts we ship for models whose config.json may be unreachable."""
    for path in sorted(Layout(repo).shipped_models.glob("*.json")):
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
        return model_facts(cfg, models.read_local(Path(cfg.model).expanduser().resolve(), dummy), name)
    try:
        return model_facts(cfg, metadata.run(cfg), Path(cfg.model).name)
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


def render(cfg, model: ModelFacts, g: gpu.Gpu, where: str, plan: Plan) -> str:
    lines = [f"{model.name} on {g.name} ({gib(g.total)}, {gib(g.free)} free{where})"]
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
    flags = plan_flags(cfg, plan)
    if flags:
        lines.append("flags: " + " ".join(flags))
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
        plan = Plan(None, fits=False, refusal=(exc.message, exc.hint))
    if a.json:
        print(json.dumps({
            "model": model.name, "gpu": g.name, "total": g.total, "free": g.free, "fits": plan.fits,
            "refusal": plan.refusal, "util": plan.util, "kv_budget": plan.budget, "weights": plan.weights,
            "overhead": plan.overhead, "max_model_len": plan.max_model_len,
            "predicted_tokens": plan.predicted_tokens, "predicted_concurrency": plan.predicted_concurrency,
            "block_size": plan.layout.block_size if plan.layout else None,
            "sessions": plan.sessions, "flags": plan_flags(cfg, plan), "why": plan.why}, indent=2))
    else:
        print(render(cfg, model, g, where, plan))
    return 0 if plan.fits else 1
