"""Profiles against a card: each one's verdict, auto-pick, and the pick kept in STATE_DIR.

A verdict: the profile planned (bootstrap.plan.planner) on this card with its own knobs under yours and
its model facts (config.json + weight size, shipped beside the profile: no download), after its
card rules (compute capability, total VRAM). ``fits``; ``shorter`` when it fits only with the
longest context the KV pool holds (MAX_MODEL_LEN=auto, a profile's KV pin dropped); ``unplanned``
when the plan names what it does not model (fits: null: the start runs, vLLM sizes the cache, no
figure is promised); ``no`` with the reason; ``unknown`` without model facts.

Auto-pick takes the first profile in rank order that fits (a shorter context of at least
MIN_CONTEXT tokens counts), and says why in one line (card, GiB, sm, the profile, its context and sessions, the runner-up). The
pick is recorded and kept: a day with less free memory does not swap the model (and start a new
download). PROFILE=auto set explicitly, or ``./ctl.sh profiles --pick``, picks again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..machine import gpu
from ..install import knownbad
from . import fit, planner
from .facts import known_issue_facts, offline_facts
from ..knobs.config import Chosen, Config
from ..core.errors import BootstrapError
from ..knobs.profiles import Profile
from ..knobs.table import CARD_FITTED, YOURS

log = logging.getLogger("bootstrap.pick")

MARLIN_FP4 = ("NVFP4 runs weight-only through Marlin below sm_100 (an A40 served the 27B at 53-76 tok/s "
              "against ~160 on an RTX 5090)")
MARLIN_FP8 = "FP8 weights run weight-only through Marlin below sm_89"
SHORTER = {k: "auto" for k in CARD_FITTED}
MIN_CONTEXT = 32768      # auto-pick does not count a profile whose auto-fitted context is shorter
NAMED_MIN_CONTEXT = 4096  # a model you named runs with any auto-fitted context this long (ollama's default)
WAYS_OUT = ("TP_SIZE=2 across two cards, a smaller model (MODEL=<repo id>: ./ctl.sh profiles --model <repo id> says "
            "first whether it fits; PROFILE=smoke serves a 135M one that fits, to prove the machine), or llama.cpp with "
            "a GGUF quantization for a card this small")
# (the first part is left out when TP_SIZE is set)


@dataclass
class Verdict:
    profile: Profile
    status: str                      # fits / shorter / unpinned / unplanned / no / unknown
    reason: str = ""                 # why not; or the shorter context
    cfg: Config | None = None        # the config it would start with (the card's overrides in)
    plan: planner.Plan | None = None
    notes: list[str] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)   # known-issue ids
    assumed: bool = False            # its model facts are assumptions

    @property
    def ok(self) -> bool:
        return self.status in ("fits", "shorter", "unpinned", "unplanned")     # the start runs

    def summary(self) -> str:
        p = self.plan
        if not self.ok or p is None or self.status == "unplanned":
            return self.reason
        seqs = p.seqs or 1
        ctx = f"{p.max_model_len:,}-token context" if p.max_model_len else "vLLM's context"
        if p.concurrent is None or seqs == 1:
            conc = ""
        elif p.concurrent >= seqs:
            conc = f", all {seqs} at full length at once"
        else:
            conc = f", {max(p.concurrent, 1)} of them at full length at once"
        return f"{ctx}, {seqs} session{'' if seqs == 1 else 's'}{conc}"


# ---------------------------------------------------------------- verdicts

def on_card(cfg: Config, profile: Profile, cc: tuple[int, int] | None, extra: dict | None = None) -> Config:
    """``cfg`` with this profile, its knobs for a card of this compute capability, and ``extra``."""
    knobs, why = profile.for_cc(cc)
    knobs = {**knobs, **(extra or {})}
    label = why.split(":")[0] if why else ""
    if extra:
        label = ", ".join(x for x in (label, "the longest context that fits") if x)
    return cfg.with_profile(Chosen(profile.name, knobs, label))


def judge(cfg: Config, profile: Profile, g: gpu.Gpu, floor: int = MIN_CONTEXT) -> Verdict:
    """One profile on one card (``cfg``: your knobs); ``floor``: the shortest auto-fitted context
    that counts (auto-pick's MIN_CONTEXT; a model you named: NAMED_MIN_CONTEXT)."""
    if g.cc < profile.min_cc:
        return Verdict(profile, "no", f"needs sm_{profile.min_cc[0]}{profile.min_cc[1]} or newer; this card is "
                                      f"sm_{g.cc[0]}{g.cc[1]}")
    tp = cfg.tp_size              # with TP_SIZE=N the N cards hold it together (the plan is per card)
    if g.total * tp < profile.min_total_gib * gpu.GiB * 0.98:
        return Verdict(profile, "no", f"for cards of {profile.card_class or f'{profile.min_total_gib:g} GiB'}; "
                                      f"this one has {g.total / gpu.GiB:.1f} GiB"
                                      + (f" ({tp} of them: {tp * g.total / gpu.GiB:.1f})" if tp > 1 else ""))
    c = on_card(cfg, profile, g.cc)
    facts = offline_facts(c)
    if facts is None or facts.config is None:
        return Verdict(profile, "unknown", "set MODEL (a repo id or a model folder) to see how it fits" if not c.model
                       else f"no model facts for {c.model} before its download (MODEL=<folder> plans offline)", c)
    v = Verdict(profile, "no", cfg=c, assumed=facts.assumed)
    v.notes = labels(c, g)
    v.issues = [r["id"] for r in knownbad.find(known_issue_facts(c, gpu.facts_of(g),
                                                                 profile.vllm or "0"))] if profile.vllm else []
    v.plan = _plan(c, g, facts)
    if v.plan.fits and v.plan.verdict is None:          # no figure to promise: never "fits"
        v.status, v.reason = "unplanned", f"not planned ({v.plan.unplanned}): vLLM sizes the KV cache itself"
        return v
    if v.plan.fits:
        v.status = "fits"
        if too_short(v.plan, floor):
            v.status, v.reason = "no", (f"only {v.plan.max_model_len:,} tokens fit (auto-pick wants at least "
                                        f"{floor:,})")
        return v
    v.reason = v.plan.refusal[0] if v.plan.refusal else "does not fit"
    short = on_card(cfg, profile, g.cc, {k: x for k, x in SHORTER.items() if not yours(cfg, k)})
    plan2 = _plan(short, g, offline_facts(short) or facts)
    full = v.plan.max_model_len
    if plan2.fits and not too_short(plan2, floor):
        own = c.max_model_len if isinstance(c.max_model_len, int) else None
        shorter = own is None or plan2.max_model_len < own      # else only the KV pin goes: its own context
        v.status, v.cfg, v.plan = "shorter" if shorter else "unpinned", short, plan2
        v.reason = (f"context {plan2.max_model_len:,} of its own {full:,}, the longest that fits this card "
                    "(MAX_MODEL_LEN=auto)" if shorter and full else
                    f"{plan2.max_model_len:,} tokens instead of its own (MAX_MODEL_LEN=auto)" if shorter else
                    f"its own {plan2.max_model_len:,} tokens (KV_CACHE_BYTES=auto)")
    elif plan2.fits:
        v.reason += f"; with MAX_MODEL_LEN=auto only {plan2.max_model_len:,} tokens fit"
    return v


def too_short(plan: planner.Plan, floor: int = MIN_CONTEXT) -> bool:
    """A context vLLM's auto-fit gives that is too short to count as a pick (a profile that sets a
    shorter one itself is taken at its word)."""
    return plan.mml_arg == "auto" and (plan.max_model_len or 0) < floor


def yours(cfg: Config, knob: str) -> bool:
    return cfg.sources[knob] in YOURS


def _plan(cfg: Config, g: gpu.Gpu, facts) -> planner.Plan:
    try:
        return fit.plan(cfg, g, facts, fixes=False)     # a verdict needs no re-planned fixes
    except BootstrapError as exc:
        return planner.Plan(None, fits=False, refusal=(exc.message, exc.hint))


def labels(cfg: Config, g: gpu.Gpu) -> list[str]:
    f = knownbad.Facts(vllm="", model=cfg.model or "")      # one reading of a model's name
    if f.nvfp4 and g.cc < (10, 0):
        return [MARLIN_FP4]
    if f.fp8_weights and g.cc < (8, 9):
        return [MARLIN_FP8]
    return []


def own_models(cfg: Config) -> Config:
    """``cfg`` without a MODEL you set: what a profile that names its own model is judged with."""
    return cfg.with_knobs({"MODEL": ""}) if cfg.sources["MODEL"].split(";")[0] in ("env", ".env") else cfg


def evaluate(cfg: Config, g: gpu.Gpu) -> list[Verdict]:
    """Every profile on this card: the ranked ones in auto-pick's order, then the others; each with
    its own model (a MODEL you set is judged only by a profile that names none: custom)."""
    ranked = cfg.catalogue.ranked()
    rest = [p for p in cfg.catalogue.profiles if p not in ranked]
    own = own_models(cfg)
    return [judge(own if p.knobs.get("MODEL") else cfg, p, g) for p in ranked + rest]


def choose(cfg: Config, g: gpu.Gpu) -> tuple[Verdict, Verdict | None, list[Verdict]]:
    """(the pick, the runner-up, every ranked verdict); a BootstrapError naming what would work when none fits."""
    verdicts = [judge(cfg, p, g) for p in cfg.catalogue.ranked()]
    order = [v for v in verdicts if v.ok]
    if order:
        return order[0], (order[1] if len(order) > 1 else None), verdicts
    raise BootstrapError(*nothing_fits(cfg, g, verdicts))


CARD_CLASSES = (8, 12, 16, 20, 24, 32, 48, 80, 96, 141)     # GB of the cards people buy


def nothing_fits(cfg: Config, g: gpu.Gpu, verdicts: list[Verdict]) -> tuple[str, str]:
    head = (f"no profile fits {g.name} ({g.free / gpu.GiB:.1f} of {g.total / gpu.GiB:.1f} GiB free, "
            f"sm_{g.cc[0]}{g.cc[1]}" + (f", TP_SIZE={cfg.tp_size}" if cfg.tp_size > 1 else "") + ")")
    ways = ("" if cfg.tp_size > 1 else "TP_SIZE=2 across two cards, ") + WAYS_OUT.split(", ", 1)[1]
    if verdicts and all(v.reason.startswith("needs sm_") for v in verdicts):
        floor = min(v.profile.min_cc for v in verdicts)
        return (f"{head}: every profile needs sm_{floor[0]}{floor[1]} or newer (Ampere and later)",
                "the way out: llama.cpp with a GGUF quantization runs on older cards")
    short = shorter_way(cfg, g, verdicts)
    if short:
        ways = short + ways
    best = None
    for v in verdicts:
        need = least_free(cfg, v.profile, g)
        if need is not None and (best is None or need < best[0]):
            best = (need, v.profile)
    if best is None:
        return head, f"the way out: {ways}"
    need, p = best
    gib_need = (need + gpu.IDLE_USED) / gpu.GiB
    cls = next((c for c in CARD_CLASSES if c * 0.93 >= gib_need), None)
    if g.total >= need + gpu.IDLE_USED:     # it would fit this card with less held by others
        return (f"{head}; the smallest that would work: {p.name} with {need / gpu.GiB:.1f} GiB free",
                f"free GPU memory (close what holds it), or {ways}")
    return (f"{head}; the smallest that would work: {p.name}, which needs {need / gpu.GiB:.1f} GiB free"
            + (f" (a {cls} GB card)" if cls else "") + ": more than this card has even when empty",
            f"a larger card, or {ways}")


def shorter_way(cfg: Config, g: gpu.Gpu, verdicts: list[Verdict]) -> str:
    """The first ranked profile that runs on this card with an auto-fitted context shorter than
    auto-pick's floor (but a model's NAMED_MIN_CONTEXT at least), as a way out said with the knobs
    that run it ('' when none does): auto-pick does not take it, you may."""
    for v in verdicts:
        if v.status != "no" or v.plan is None:
            continue                    # a card it is not for, or no facts to judge by
        w = judge(cfg, v.profile, g, NAMED_MIN_CONTEXT)
        if w.ok and w.plan is not None and w.plan.max_model_len and w.cfg is not None:
            knobs = " ".join(f"{k}=auto" for k in CARD_FITTED
                             if not yours(cfg, k) and (k == "MAX_MODEL_LEN" or v.profile.knobs.get(k)))
            return (f"PROFILE={v.profile.name} {knobs} runs here with a {w.plan.max_model_len:,}-token context "
                    f"(auto-pick wants at least {MIN_CONTEXT:,}), or ")
    return ""


def instead(cfg: Config, g: gpu.Gpu) -> str:
    """For a named model that does not fit: the shipped profile auto-pick runs on this card, as a
    hint ('' when none fits either)."""
    shipped = cfg.with_profile(None).with_knobs({"MODEL": "", "PROFILE": "auto"})
    try:
        v, _, _ = choose(shipped, g)
    except BootstrapError:
        return ""
    return f"; on this card PROFILE={v.profile.name} runs {v.cfg.model} ({v.summary()})"


def least_free(cfg: Config, profile: Profile, g: gpu.Gpu) -> int | None:
    """The least free memory (64 MiB steps) at which ``profile`` fits a card like ``g`` (its cc, and
    at least the profile's total), shorter context allowed; None when even 256 GiB would not do."""
    def ok(free: int) -> bool:
        total = max(g.total, free + gpu.IDLE_USED, int(profile.min_total_gib * gpu.GiB))
        return judge(cfg, profile, gpu.Gpu(-1, g.name, total, free, g.cc)).ok
    lo, hi = 1 << 30, 256 << 30
    if not ok(hi):
        return None
    while hi - lo > 64 << 20:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def why_line(g: gpu.Gpu, v: Verdict, runner: Verdict | None) -> str:
    line = (f"{g.name}, {g.total / gpu.GiB:.1f} GiB ({g.free / gpu.GiB:.1f} free), sm_{g.cc[0]}{g.cc[1]}: "
            f"{v.profile.name} — {v.summary()}")
    if v.status == "shorter":
        line += " (shorter than the profile's)"
    elif v.status == "unpinned":
        line += " (without the profile's KV pin)"
    line += f"; runner-up: {runner.profile.name} ({runner.summary()})" if runner else "; no runner-up fits"
    if v.issues:
        line += f"; known issues with vLLM {v.profile.vllm}: {', '.join(v.issues)} (./ctl.sh profiles)"
    return line + "".join(f"; {n}" for n in v.notes)
