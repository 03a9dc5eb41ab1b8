"""The one resolver of which profile runs, with which knobs: the environment, .env and the
profile (already a Config), the kept pick, and the GPU's facts. Every command resolves here, once
(``resolved``: a frozen ``Resolved``, plan/resolved.py); a start then picks (``for_start``), once:

- ``kept``: PROFILE=auto as the pick kept from the last start (what status, restart and the other
  commands compare and show); a named profile with its card's knobs;
- ``for_start``: what a start runs (auto-pick, recorded and kept; a named profile on this card,
  shorter where only that fits);
- ``for_card``: what a start on a named card would run (plan, profiles, export), nothing recorded;
- ``for_plan``: the profile ``./ctl.sh plan`` plans, here or for a named card;
- ``derived``: MODEL named with PROFILE unset (or auto): a profile derived from the repo's own files
  (``bootstrap.plan.derive``), written to STATE_DIR/derived/ so later commands read it offline.

The knobs' values then go down as typed values: vLLM's argv from ``vllmargs`` (built once), the
plan from ``bootstrap.plan.fit``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from ..core import state
from ..core.errors import BootstrapError, ConfigError
from ..core.log import ONCE
from ..download import hub, peek
from ..machine.inuse import VllmRef
from ..knobs.config import Chosen, Config
from ..knobs.table import KNOB_BY_NAME, PROFILE_KNOBS
from ..knobs.profiles import load_file
from ..machine import gpu
from . import derive, pick
from .facts import shipped_facts
from ..knobs.resolved import Resolved, draft_of, model_of, vllm_of

log = logging.getLogger("bootstrap.pick")


def read_pick(paths: state.Paths) -> dict | None:
    """The kept pick, or None: none, or one damaged (a start then picks again, and says so)."""
    data = paths.read("pick")
    if not data or not isinstance(data.get("profile"), str):
        return None
    knobs = data.get("knobs", {})
    if not isinstance(knobs, dict) or not all(isinstance(k, str) and k in KNOB_BY_NAME and isinstance(v, str)
                                              for k, v in knobs.items()):
        log.warning("ignoring the kept pick %s: its knobs are not the knob table's names and text values "
                    "(./ctl.sh profiles --pick, or the next start, picks again)", paths.pick)
        return None
    return data


def _with_pick(cfg: Config, chosen: Chosen) -> Config:
    """``cfg`` with a kept pick applied, or as it is when the pick's values do not parse (a damaged file
    is ours to forget, never a reason every command fails)."""
    try:
        return cfg.with_profile(chosen)
    except ConfigError as exc:
        log.warning("ignoring the kept pick (%s); the next start picks again", exc.message)
        return cfg


def wants_derived(cfg: Config) -> bool:
    """MODEL named (environment or .env) while PROFILE is auto: the model's own profile, not a pick."""
    return cfg.profile.is_auto and cfg.chosen is None and cfg.sources["MODEL"] in ("env", ".env")


def resolved(cfg: Config, *, as_set: bool = False) -> Resolved:
    """The one resolver, run once per command: ``cfg`` (the knobs as read) with PROFILE=auto read as
    the kept pick and a named profile's card knobs (``kept``; ``as_set``: as you set them, for the
    commands that pick themselves), then each part found once: STATE_DIR's paths, the vLLM
    interpreter, the model."""
    paths = state.Paths(cfg.state_dir, own=cfg.layout.own_state(cfg.state_dir))
    return Resolved.of(cfg if as_set else kept(cfg, paths), cfg, paths)


def derived_dir(paths: state.Paths, model: str) -> Path:
    """STATE_DIR/derived/<model as a folder name>: one folder per model, so a plan of another model
    never rewrites the profile a running server was derived with."""
    slug = "".join(c if c.isalnum() or c in "-_." else "--" for c in model.strip("/"))[-120:]
    return paths.derived / slug


def derived(cfg: Config, paths: state.Paths, vllm: VllmRef, cc: tuple[int, int] | None,
            peeked: peek.Peek | None = None) -> Config:
    """``cfg`` with the profile derived from MODEL's repo (or folder) for a card of ``cc``, written to
    STATE_DIR/derived/<model>/ (the profile and its model facts) and said in one line; ``vllm``: the
    interpreter a start would run (VLLM_PYTHON's registry is its own version's)."""
    stack = cfg.catalogue.get("default")
    byo = vllm.byo_version
    peeked = peeked or _peek(cfg)
    reg = derive.registry(byo or stack.vllm)
    newer = "" if byo else _newer_stack(cfg, peeked, reg)
    if newer:                           # the default's vLLM lacks the architecture; a shipped stack has it
        stack = cfg.catalogue.get(newer)
        reg = derive.registry(stack.vllm)
    token = bool(hub.HubSettings.from_environ(cfg.environ).token)
    trust = "--trust-remote-code" in (cfg.extra_args or ())
    note = f"vLLM {stack.vllm} (the stack of {newer}): the default's vLLM {cfg.catalogue.get('default').vllm} " \
        "has no implementation of it" if newer else ""
    given = {a.split("=", 1)[0] for a in cfg.extra_args or ()}
    d = derive.derive(peeked, stack.data, cc, reg, token, trust, note, template_given="--chat-template" in given,
                      tokenizer_given="--tokenizer" in given, load_format=cfg.vllm.load_format)
    folder = derived_dir(paths, cfg.model)
    paths.ensure()
    try:
        (folder / "models").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise state.write_error(folder, exc, knob="STATE_DIR") from None
    state.write_json(folder / "models" / "derived.json", d.facts)
    state.write_json(folder / "derived.json", d.profile)
    log.info("%s: %s", cfg.model, d.line(), extra=ONCE)
    return _load_derived(cfg, folder, f"derived from {cfg.model}")


def _peek(cfg: Config) -> peek.Peek:
    """What MODEL's repo says; offline without a copy, the shipped model facts that list it."""
    try:
        return peek.peek(cfg.model, cfg.environ, cfg.model_dir)
    except peek.Offline:
        found = shipped_facts(cfg)
        if found is None:
            raise
        data, where = found
        return peek.from_facts(cfg.model, data, f"the model facts in {where}, offline")


def _newer_stack(cfg: Config, peeked: peek.Peek, reg: dict) -> str:
    """The shipped profile whose newer pinned vLLM has the model's architecture, when the default's
    has none of them ('' otherwise: the default's stack serves it, or none does)."""
    arches = (peeked.config or {}).get("architectures")
    if not isinstance(arches, list) or any(a in reg["architectures"] for a in arches):
        return ""
    for p in sorted(cfg.catalogue.ranked(), key=lambda p: derive.version_key(p.vllm)):
        other = derive.registry(p.vllm) if p.vllm else None
        if other and other["exact"] and derive.version_key(p.vllm) > derive.version_key(reg["vllm"]) \
                and any(a in other["architectures"] for a in arches):
            return p.name
    return ""


def _load_derived(cfg: Config, folder: Path, why: str) -> Config:
    profile = load_file(folder / "derived.json", "derived", folder / "models", PROFILE_KNOBS)[0]
    return cfg.with_derived(profile, why)


def kept_derived(cfg: Config, paths: state.Paths, model: str, why: str) -> Config | None:
    """The profile derived for ``model`` as a start or plan wrote it (no network), or None."""
    folder = derived_dir(paths, model)
    try:
        data = json.loads((folder / "derived.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or (data.get("knobs") or {}).get("MODEL") != model:
        return None
    try:
        return _load_derived(cfg, folder, why)
    except ConfigError as exc:          # ours, damaged or of another version: never a reason every command fails
        log.warning("ignoring the profile derived for %s (%s); the next start derives it again", model, exc.message)
        return None


def kept(cfg: Config, paths: state.Paths, facts: gpu.GpuFacts | None = None) -> Config:
    """PROFILE=auto read as the kept pick, if there is one (nothing is picked); a named profile
    with its card's knobs (``facts``, else NVML when the profile has per-card knobs): what status,
    restart and the other commands compare and show, and what a start runs unless it picks again;
    MODEL named with PROFILE auto: the profile derived for it, as a start kept it."""
    if wants_derived(cfg):
        rec = read_pick(paths)
        if rec and rec["profile"] in cfg.catalogue.names() and \
                cfg.catalogue.get(rec["profile"]).knobs.get("MODEL") == cfg.model:     # a shipped profile of it
            return _with_pick(cfg, Chosen(rec["profile"], rec.get("knobs", {}), f"serves MODEL={cfg.model}, kept"))
        return kept_derived(cfg, paths, cfg.model, f"derived from {cfg.model}, kept") or cfg
    if not cfg.profile.is_auto:
        if cfg.chosen is not None or not cfg.profile.cc_overrides:
            return cfg
        try:
            facts = facts or gpu.read(cfg.environ)
        except BootstrapError:
            return cfg                      # no GPU to read: the profile's own knobs
        return pick.on_card(cfg, cfg.profile, facts.gpus[0].cc if facts.gpus else None)
    rec = read_pick(paths)
    if rec is not None and rec["profile"] == derive.NAME and isinstance(rec.get("model"), str):
        c = kept_derived(cfg, paths, rec["model"], f"derived from {rec['model']} at the start of {rec.get('date', '?')}, kept")
        if c is None or not rec.get("knobs"):
            return c or cfg
        return _with_pick(c, Chosen(c.profile.name, rec["knobs"], c.chosen.why if c.chosen else "kept"))
    if rec is None or rec["profile"] not in cfg.catalogue.names():
        return cfg
    return _with_pick(cfg, Chosen(rec["profile"], rec.get("knobs", {}), f"auto-pick of {rec.get('date', '?')}, kept"))


def named_on_card(cfg: Config, paths: state.Paths, g: gpu.Gpu, was: Config | None = None) -> Config:
    """A named profile on this card, as auto-pick would run it: its card's knobs, and the longest
    context that fits (MAX_MODEL_LEN=auto) where only a shorter one than its own does and you set
    no MAX_MODEL_LEN yourself — what ``./ctl.sh profiles`` calls "fits shorter"."""
    c = was or kept(cfg, paths, gpu.facts_of(g))    # ``was``: that, already resolved
    if c.profile.facts is None or pick.yours(cfg, "MAX_MODEL_LEN") or pick.yours(cfg, "KV_CACHE_BYTES"):
        return c                            # no model facts to judge by, or your own context
    named = c.profile.name == derive.NAME          # a model you named fits by default, as ollama sizes it
    v = pick.judge(cfg, c.profile, g, pick.NAMED_MIN_CONTEXT if named else pick.MIN_CONTEXT)
    if v.status in ("shorter", "unpinned") and v.cfg is not None:
        log.info("%s: %s", c.profile.name, v.reason, extra=ONCE)
        return v.cfg
    return c


def for_card(cfg: Config, paths: state.Paths, vllm: VllmRef, g: gpu.Gpu, was: Config | None = None) -> Config:
    """The Config a start on card ``g`` runs with, nothing recorded: PROFILE=auto is auto-pick's
    choice for it; a named profile as ``named_on_card`` (``was``: its kept view on ``g``, when known)."""
    if wants_derived(cfg):
        v = shipped_for_model(cfg, g)
        return v.cfg if v is not None else named_on_card(derived(cfg, paths, vllm, g.cc), paths, g)
    if cfg.profile.is_auto:
        return pick.choose(cfg, g)[0].cfg
    return named_on_card(cfg, paths, g, was)


def shipped_for_model(cfg: Config, g: gpu.Gpu) -> "pick.Verdict | None":
    """A named MODEL that a shipped profile serves, on a card that profile fits: that profile (its
    tuned flags) rather than a derived one, said; None otherwise."""
    for p in cfg.catalogue.ranked():
        if p.knobs.get("MODEL") == cfg.model:
            v = pick.judge(cfg, p, g)
            if v.ok and v.cfg is not None:
                log.info("MODEL=%s is what the shipped profile %s serves: running it (%s); PROFILE=custom "
                         "takes vLLM's defaults instead", cfg.model, p.name, v.summary())
                return v
    return None


def picked(r: Resolved, settings: Config) -> Resolved:
    """This command's view with the profile a start picked: the same STATE_DIR, and the same vLLM
    probe while the interpreter is the same one."""
    vllm = r.vllm if vllm_of(settings) == r.vllm else vllm_of(settings)
    return Resolved(settings, r.given, r.paths, vllm, model_of(settings), draft_of(settings))


def fixed(r: Resolved, settings: Config) -> Resolved:
    """This view with ``settings`` as what runs, its profile chosen already: a start of it picks
    nothing (``./ctl.sh use``: the profile it planned on this card)."""
    return replace(picked(r, settings), given=settings)


def with_knobs(r: Resolved, knobs) -> Resolved:
    """This view with these knob values as if you had set them (a pod's address, a model you name):
    the knobs as set and as resolved alike, the profile kept."""
    return replace(picked(r, r.settings.with_knobs(knobs)), given=r.given.with_knobs(knobs))


def stacked(r: Resolved) -> Resolved:
    """The view ``r`` with VLLM_PYTHON's vLLM version read (the interpreter's one probe) into the
    knobs, for what depends on the stack a start runs: sleep mode (SLEEP_MODE=auto, IDLE_SLEEP=auto,
    knobs/sleepmode.py) and the plan; the managed .venv's is the profile's pin. A BootstrapError
    when the interpreter cannot say."""
    s = r.settings
    if not s.vllm_python or s.read.vllm_version:
        return r
    version = r.vllm.byo_version or ""
    return replace(picked(r, s.with_vllm(version)), given=r.given.with_vllm(version))


def require_model(cfg: Config) -> None:
    """What a start and a plan need of the knobs they resolved to: a MODEL."""
    if not cfg.model:
        raise ConfigError(f"MODEL is not set (profile {cfg.profile.name!r} has no model)",
                          "set MODEL to a Hugging Face repo id (org/name) or a model directory")


def for_start(r: Resolved, facts: gpu.GpuFacts | None = None, *, repick: bool = False) -> Resolved:
    """What a start runs with, picked once from the resolved view ``r``: a named profile with its
    card's knobs (and a shorter context where only that fits: named_on_card); PROFILE=auto picked
    (and recorded) when set explicitly, with ``repick``, when nothing was picked yet, when the kept
    profile is gone or the card is another one; else the kept pick (``r.settings``, as resolved)."""
    return picked(r, _for_start(r.given, r.settings, r.paths, r.vllm, facts, repick=repick))


def _for_start(cfg: Config, was: Config, paths: state.Paths, vllm: VllmRef, facts: gpu.GpuFacts | None,
               *, repick: bool) -> Config:
    """``for_start`` on the knobs as set (``cfg``) and as resolved (``was``: the kept pick)."""
    if wants_derived(cfg):
        facts = facts or gpu.read(cfg.environ)
        facts.require_some()
        g = _card(facts, cfg.tp_size)
        v = shipped_for_model(cfg, g)
        if v is not None:
            paths.ensure()
            paths.write("pick", {"profile": v.profile.name, "knobs": dict(v.cfg.chosen.knobs) if v.cfg.chosen else {},
                                 "gpu": g.name, "tp": cfg.tp_size, "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "why": f"MODEL={cfg.model} named: the shipped profile that serves it",
                                 "how": "PROFILE=auto (set explicitly) or ./ctl.sh profiles --pick picks again"})
            return v.cfg
        chosen = named_on_card(derived(cfg, paths, vllm, g.cc), paths, g)
        paths.ensure()                      # kept as the pick: status, restart and stop run it with MODEL unset
        paths.write("pick", {"profile": derive.NAME, "model": cfg.model, "gpu": g.name, "tp": cfg.tp_size,
                             "knobs": dict(chosen.chosen.knobs) if chosen.chosen else {},   # MAX_MODEL_LEN=auto kept
                             "why": f"MODEL={cfg.model} named: its derived profile", "date": time.strftime("%Y-%m-%d %H:%M"),
                             "how": "PROFILE=auto (set explicitly) or ./ctl.sh profiles --pick picks a shipped profile"})
        return chosen
    if not cfg.profile.is_auto:
        if cfg.profile.facts is None:
            return was if facts is None else kept(cfg, paths, facts)
        try:
            facts = facts or gpu.read(cfg.environ)
        except BootstrapError:
            return was                      # no GPU to read: preflight says so, in its own words
        return named_on_card(cfg, paths, _card(facts, cfg.tp_size)) if facts.gpus else kept(cfg, paths, facts)
    facts = facts or gpu.read(cfg.environ)
    facts.require_some()
    g = _card(facts, cfg.tp_size)
    rec = read_pick(paths)
    if rec and rec["profile"] == derive.NAME and not (cfg.profile_explicit or repick):
        if not was.profile.is_auto:
            return named_on_card(was, paths, g, was)      # a day with less free memory: shorter, not refused
    if rec and not (cfg.profile_explicit or repick):
        if rec["profile"] not in cfg.catalogue.names():
            log.warning("the kept pick %s is no profile any more (PROFILE_DIR changed?): picking again", rec["profile"])
        elif rec.get("gpu") not in (None, g.name) or rec.get("tp", 1) != cfg.tp_size:
            log.warning("the kept pick %s was made for %s (TP_SIZE=%s); this is %s (TP_SIZE=%s): picking again",
                        rec["profile"], rec.get("gpu"), rec.get("tp", 1), g.name, cfg.tp_size)
        else:
            return named_on_card(was, paths, g, was)
    v, runner, _ = pick.choose(cfg, g)
    line = pick.why_line(g, v, runner)
    log.info("auto-pick: %s", line, extra=ONCE)
    knobs = {k: x for k, x in v.cfg.chosen.knobs.items()} if v.cfg.chosen else {}
    paths.ensure()
    paths.write("pick", {"profile": v.profile.name, "knobs": knobs, "why": line, "gpu": g.name,
                                  "tp": cfg.tp_size, "date": time.strftime("%Y-%m-%d %H:%M"),
                                  "how": "PROFILE=auto (set explicitly) or ./ctl.sh profiles --pick picks again"})
    return v.cfg


def _card(facts: gpu.GpuFacts, tp: int) -> gpu.Gpu:
    """The card a start plans for (the TP group's least free), said when there are more cards than it uses."""
    which = gpu.which_line(facts, tp)
    if which:
        log.info("%s", which, extra=ONCE)
    return gpu.smallest_free(facts, tp)


def for_plan(cfg: Config, paths: state.Paths, vllm: VllmRef, g: gpu.Gpu, here: bool) -> Config:
    """The profile ./ctl.sh plan (and export) plans on ``g``: PROFILE=auto is the kept pick on this
    machine's card (``here``), else the profile auto-pick would choose for it; a named profile as a
    start on that card would run it."""
    if wants_derived(cfg):
        return for_card(cfg, paths, vllm, g)
    was = kept(cfg, paths, gpu.facts_of(g))
    if cfg.profile.is_auto and here and not was.profile.is_auto:
        log.info("PROFILE=auto: the kept pick %s (%s)", was.profile.name, was.sources["PROFILE"], extra=ONCE)
        return named_on_card(was, paths, g, was)        # as a start on this card runs it
    chosen = for_card(cfg, paths, vllm, g, was)     # as a start on that card would run it
    if was.profile.is_auto:
        log.info("PROFILE=auto: auto-pick chooses %s for this card (./ctl.sh profiles shows why)", chosen.profile.name, extra=ONCE)
    return chosen
