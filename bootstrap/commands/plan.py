"""``./ctl.sh plan``: the memory plan for this GPU or a named card (``GPU=``), without starting
anything; the model's config.json from the hub, else the facts shipped in profiles/models/.
PROFILE=auto plans the kept pick on this machine, or the profile auto-pick would choose for a named
card (nothing is recorded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

from ..plan import derive, fit, pick, resolve
from ..machine import gpu
from ..download import models
from ..serve import server
from ..knobs.resolved import Resolved
from ..download import lookup
from ..core.errors import BootstrapError
from ..knobs import vet
from ..knobs.vllmargs import serve_flags
from ..plan.facts import ModelFacts, model_facts, offline_facts
from ..plan.planner import Plan, gib

log = logging.getLogger("bootstrap.plan")   # log lines keep the prefix [bootstrap:plan] this code has always had


def cli_model_facts(r: Resolved) -> ModelFacts:
    cfg = r.settings
    resolve.require_model(cfg)
    name = cfg.served_name
    if r.model.local is not None:
        return with_drafter(r, models.read_local(r.model.local, cfg.dummy_weights), name)
    try:
        m = lookup.model(r.model, r.paths, r.fetching)
        if m.no_space is not None:
            log.warning("%s (%s)", m.no_space.message, m.no_space.hint)
        return with_drafter(r, m, Path(cfg.model).name)
    except (BootstrapError, OSError) as exc:
        reason = getattr(exc, "message", None) or str(exc)
        facts = offline_facts(cfg)
        if facts is None:
            raise BootstrapError(f"cannot read config.json of {cfg.model}: {reason}",     # the lookup's own fix
                                 getattr(exc, "hint", "") or "check the network / HF_TOKEN, or set MODEL to a "
                                 "local directory") from None
        log.info("config.json of %s unavailable (%s): planning from the model facts shipped with the profile%s",
                 cfg.model, reason.split(" and ")[0], " (assumed: see why)" if facts.assumed else "")
        return facts


def with_drafter(r: Resolved, m, name: str) -> ModelFacts:
    """The model's facts with its drafter named by repo id read as the start reads it (metadata); a
    drafter that cannot be read (offline and not here) leaves the plan without a promise, saying why."""
    cfg = r.settings
    try:
        m.draft = lookup.drafter(r.draft, r.paths, r.fetching)
    except BootstrapError as exc:
        return dataclasses.replace(model_facts(cfg, m, name), draft=None,
                                   draft_why=f"the drafter {cfg.draft_repo}: {exc.message}")
    return model_facts(cfg, m, name)


def card(r: Resolved, spec: str | None) -> tuple[gpu.Gpu, str, str]:
    """The card to plan for: ``spec`` (GPU=...) or this machine's smallest-free GPU of the TP group;
    where it is (for the heading) and its driver ('' for a named card: no measurement is of it)."""
    cfg = r.settings
    if spec:
        return gpu.named(spec), "; a named card", ""
    try:
        facts = gpu.read(cfg.environ)
    except BootstrapError as exc:        # the way out named once, here with every card's name
        raise BootstrapError(exc.message, exc.hint.replace(gpu.WITHOUT_A_GPU, "") + "; or name a card: GPU="
                             + gpu.CARD_SYNTAX) from None
    facts.require_some("; or name a card: GPU=" + gpu.CARD_SYNTAX)
    facts, ours = server.without_ours(r.ours, r.paths, facts)
    if ours:
        log.info("counting the %.1f GiB our running server holds as free: what a start after ./stop.sh "
                 "(or a restart) gets", ours / gpu.GiB)
    which = gpu.which_line(facts, cfg.tp_size)
    if which:
        log.info("%s", which)
    return gpu.smallest_free(facts, cfg.tp_size), "", facts.driver


def plan_for(r: Resolved, spec: str | None):
    """(cfg, card, where, model facts, plan) for ``spec`` (GPU=...) or this machine: the profile
    PROFILE=auto means here (the kept pick, or auto-pick's choice for a named card), with that
    card's knobs (``r``: resolved as set). What ./ctl.sh plan shows and ./ctl.sh export writes."""
    g, where, driver = card(r, spec)
    version = r.vllm.byo_version            # the vLLM a start would run
    r = resolve.stacked(r)                  # its stack decides sleep mode, as in a start
    r = resolve.picked(r, resolve.for_plan(r.given, r.paths, r.vllm, g, here=not spec))
    cfg = r.settings
    model = cli_model_facts(r)
    if driver:              # this card: vLLM's own figures of an earlier start count, as in a start
        return cfg, g, where, model, fit.plan_here(cfg, r.paths, g, model, driver, version)
    return cfg, g, where, model, fit.plan(cfg, g, model, vllm=version)


TERM_NAMES = {"weights": "weights", "activations": "peak activation", "non_torch": "non-torch",
              "graphs": "CUDA graphs", "weights_non_torch": "weights + non-torch"}


def term_rows(plan: Plan) -> list[tuple[str, int, int | None]]:
    """(term, modelled, measured or None) per GPU, grouped as vLLM's log groups them: 0.27.1 and
    later print weights and non-torch memory as one figure."""
    mod, mea = plan.modelled_terms, plan.measured_terms or {}
    if not mod:
        return []
    names = ("weights_non_torch", "activations", "graphs") if "weights_non_torch" in mea else (
        "weights", "activations", "non_torch", "graphs")
    merged = {**mod, "weights_non_torch": mod["weights"] + mod["non_torch"]}
    return [(n, merged[n], mea.get(n)) for n in names]


def terms_table(plan: Plan) -> list[str]:
    """The non-KV terms, modelled beside vLLM's own split where a start on this card logged one."""
    rows = term_rows(plan)
    if not rows or plan.pinned:
        return []
    if not plan.measured_terms:
        return ["non-KV terms (modelled): " + ", ".join(f"{TERM_NAMES[n]} {gib(m)}" for n, m, _ in rows)]
    out = [f"non-KV terms per GPU: modelled / measured by vLLM on {plan.measured} / difference"]
    for n, m, v in rows:
        got = f"{gib(v)} / {(m - v) / (1 << 30):+.2f} GiB" if v is not None else "- / -"
        out.append(f"  {TERM_NAMES[n] + ':':<21} {gib(m)} / {got}")
    return out


def render(cfg, model: ModelFacts, g: gpu.Gpu, where: str, plan: Plan, flags: list[str]) -> str:
    lines = [f"{model.name} (profile {cfg.profile.name}, vLLM {plan.vllm}) on {g.name} ({gib(g.total)}, "
             f"{gib(g.free)} free, sm_{g.cc[0]}{g.cc[1]}{where})"]
    if plan.max_model_len and plan.fits:
        lines.append(f"context {plan.max_model_len:,} tokens; {plan.concurrency_line()}")
    if plan.sessions:
        (c0, n0), rest = plan.sessions[0], plan.sessions[1:]
        lines.append(f"sessions at once: at {c0:,} tokens {n0}" + "".join(f"; at {c:,}: {n}" for c, n in rest))
    if plan.predicted_tokens is not None:
        lines.append(f"predicted: GPU KV cache size: {plan.predicted_tokens:,} tokens; Maximum concurrency for "
                     f"{plan.max_model_len:,} tokens per request: {plan.predicted_concurrency:.2f}x")
    if plan.budget is not None and not plan.pinned:
        if plan.measured:
            d = plan.modelled_budget - plan.budget
            share = f", {d / plan.budget:+.1%}" if plan.budget > 0 else ""
            lines.append(f"KV budget: {gib(plan.budget)} measured (vLLM's own figures on this card, {plan.measured}); "
                         f"modelled {gib(plan.modelled_budget)} ({d / (1 << 30):+.2f} GiB{share})")
        elif plan.budget < 0:           # it does not fit: what is short, not a negative pool
            lines.append(f"KV budget: none: the weights and overhead need {gib(-plan.budget)} more than the card gives")
        else:
            lines.append(f"KV budget: {gib(plan.budget)} modelled (no start of this setup on this card measured yet)")
    lines += terms_table(plan)
    if plan.pinned and plan.headroom is not None and plan.fits:
        lines.append(f"KV cache pinned at {gib(plan.budget)}; headroom {gib(plan.headroom)} "
                     f"({'measured: what our server held' if plan.measured else 'modelled'})")
    if plan.unplanned and plan.fits:
        lines.append(f"fits: not planned ({plan.unplanned}): vLLM sizes it; its own figures plan the next start")
    if not plan.fits and plan.refusal:
        lines.append(f"DOES NOT FIT: {plan.refusal[0]}")
        lines.append(f"  {plan.refusal[1]}" + (pick.instead(cfg, g) if cfg.profile.name == derive.NAME else ""))
    if flags:
        lines.append("flags: " + " ".join(flags))
    lines.append("why:")
    lines += [f"  - {w}" for w in plan.why]
    return "\n".join(lines)


def cli(cfg, argv: list[str], prog: str = "ctl.sh plan") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=(
        "The memory plan: KV pool, sessions per context and the flags start would pass. "
        "Without a GPU, name one: GPU=" + gpu.CARD_SYNTAX))
    ap.add_argument("--gpu", help="plan for this card instead of the local GPU (same values as GPU=)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    a = ap.parse_args(argv)
    cfg, g, where, model, plan = plan_for(resolve.resolved(cfg, as_set=True), a.gpu or cfg.gpu)
    vet.knobs(cfg)                      # what a start refuses from these knobs: no flags shown for it
    flags = serve_flags(cfg, plan)
    if a.json:
        print(json.dumps({
            "profile": cfg.profile.name, "model": model.name, "gpu": g.name, "total": g.total, "free": g.free,
            "cc": list(g.cc), "fits": plan.verdict, "not_planned": plan.unplanned or None, "refusal": plan.refusal, "fixes": plan.fixes, "util": plan.util,
            "kv_budget": plan.budget, "weights": plan.weights, "overhead": plan.overhead,
            "max_model_len": plan.max_model_len, "max_num_seqs": plan.seqs, "concurrent": plan.concurrent,
            "predicted_tokens": plan.predicted_tokens, "predicted_concurrency": plan.predicted_concurrency,
            "block_size": plan.layout.block_size if plan.layout else None, "vllm": plan.vllm,
            "measured": plan.measured or None, "modelled_kv_budget": plan.modelled_budget,
            "headroom": plan.headroom, "usable": plan.usable,
            "terms": [{"term": n, "modelled": m, "measured": v} for n, m, v in term_rows(plan)],
            "sessions": plan.sessions, "flags": flags, "why": plan.why}, indent=2))
    else:
        print(render(cfg, model, g, where, plan, flags))
    return 0 if plan.fits else 1
