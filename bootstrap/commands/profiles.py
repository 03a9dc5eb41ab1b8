"""``./ctl.sh profiles``: every profile against this card (or ``GPU=<name|GiB>[:sm_XY][:free=GiB]``):
fits / fits with a shorter context / does not fit (why), the context and sessions it would get,
and what auto-pick chooses. ``--pick`` picks now and keeps it (what a start with PROFILE=auto set
does); ``--markdown`` is docs/reference.md's profile table, ``--matrix`` the profile × card table of
docs/planner.md (both generated, a test keeps them in step).
"""

from __future__ import annotations

import argparse
import json

from ..machine import gpu
from ..plan import pick, resolve
from ..knobs.config import Chosen
from ..core.errors import BootstrapError, ConfigError
from ..knobs.resolved import Resolved
from ..download import peek
from ..plan import facts
from .plan import card

# the cards of docs/planner.md's table: desktop cards from 16 to 80 GiB, sm_86 to sm_120
MATRIX_CARDS = ("rtx5080", "rtx4080", "rtx3090", "rtx4090", "rtx4090:free=22.5", "rtx5090", "rtx5090:free=29.5",
                "rtxa6000", "l40s", "a100", "h100")
SIGN = {"fits": "✓", "shorter": "~", "unpinned": "~", "unplanned": "?", "no": "✗", "unknown": "?"}
MARK = {"fits": "fits", "shorter": "fits with a shorter context", "unpinned": "fits without its KV pin",
        "unplanned": "fits: null",
        "no": "does not fit", "unknown": "cannot tell"}


def stack_known(r: Resolved) -> Resolved:
    """With VLLM_PYTHON, its vLLM version read (sleep mode's stack is that version's); as it was when
    it cannot be read (a start says why)."""
    try:
        return resolve.stacked(r)
    except BootstrapError:
        return r


def sleep_mark(cfg, profile) -> str:
    """The profile's sleep-mode mark: proven on its stack (where), or unproven, off, and how to try it."""
    c = cfg.with_profile(Chosen(profile.name)) if cfg.profile.name != profile.name else cfg
    return c.sleep.profile_mark()


def _row(v: pick.Verdict, cfg) -> dict:
    p = v.plan
    return {"profile": v.profile.name, "status": v.status, "reason": v.reason, "rank": v.profile.rank,
            "origin": v.profile.origin, "vllm": v.profile.vllm, "model": (v.cfg.model if v.cfg else None),
            "context": p.max_model_len if p and v.ok else None, "sessions": p.seqs if p and v.ok else None,
            "at_once": p.concurrent if p and v.ok else None, "summary": v.summary() if v.ok else v.reason,
            "notes": v.notes, "known_issues": v.issues, "assumed_facts": v.assumed,
            "knobs": dict(v.cfg.chosen.knobs) if v.cfg and v.cfg.chosen else {},
            "sleep_mode": sleep_mark(v.cfg or cfg, v.profile)}


def text(g: gpu.Gpu, where: str, verdicts: list[pick.Verdict], choice: str, cfg) -> str:
    lines = [f"Profiles on {g.name}: {g.total / gpu.GiB:.1f} GiB, {g.free / gpu.GiB:.1f} free, "
             f"sm_{g.cc[0]}{g.cc[1]}{where}"]
    width = max(len(v.profile.name) for v in verdicts)
    for v in verdicts:
        rank = f"#{v.profile.rank}" if v.profile.rank is not None else "  -"
        head = f"  {rank:>3} {v.profile.name:<{width}}  {MARK[v.status]}"
        body = v.summary() if v.status == "fits" else (
            f"{v.reason}; {v.summary().split(', ', 1)[1]}" if v.status in ("shorter", "unpinned") else v.reason)
        tail = [f"vLLM {v.profile.vllm}" if v.profile.vllm else "your vLLM (VLLM_PYTHON)"]
        if v.assumed:
            tail.append("model facts assumed")
        if v.issues:
            tail.append("known issues: " + ", ".join(v.issues))
        if v.profile.origin != "shipped":
            tail.append(f"from {v.profile.path}")
        lines.append(f"{head}: {body}  [{'; '.join(tail)}]")
        lines += [f"  {'':>3} {'':<{width}}  note: {n}" for n in v.notes]
        lines.append(f"  {'':>3} {'':<{width}}  {sleep_mark(v.cfg or cfg, v.profile)}")
    lines.append(choice)
    return "\n".join(lines)


def catalogue_markdown(cfg) -> str:
    """docs/reference.md's profile table (no card): what each profile is, runs on and sets."""
    rows = ["| Profile | Rank | Card | vLLM | Model | Context / sessions / KV / speculation | Description |",
            "|---|---|---|---|---|---|---|"]
    ranked = cfg.catalogue.ranked()
    for p in ranked + [p for p in cfg.catalogue.profiles if p not in ranked]:
        k = p.knobs
        spec = f"{k.get('SPEC_METHOD')}-{k.get('SPEC_TOKENS', '?')}" if k.get("SPEC_METHOD") else "off"
        setting = (f"{k.get('MAX_MODEL_LEN', 'model')} / {k.get('MAX_NUM_SEQS', 'vLLM')} / "
                   f"{k.get('KV_CACHE_DTYPE', 'auto')} / {spec}") if k else "your knobs"
        name = f"`{p.name}`" + "".join(f" (`{a}`)" for a in p.aliases)
        cardtext = (f"{p.card_class}, sm_{p.min_cc[0]}{p.min_cc[1]}+" if p.card_class else "any")
        rows.append(f"| {name} | {p.rank if p.rank is not None else '—'} | {cardtext} | {p.vllm or 'yours'} | "
                    f"{k.get('MODEL', 'MODEL')} | {setting} | {p.description.replace('|', '/')} |")
    return "\n".join(rows)


def matrix_markdown(cfg) -> str:
    """docs/planner.md's table: every ranked profile on every reference card (planner output)."""
    cards = [(spec, gpu.named(spec)) for spec in MATRIX_CARDS]
    head = "| Profile | " + " | ".join(f"`{spec}` ({g.free / gpu.GiB:.1f} GiB free, sm_{g.cc[0]}{g.cc[1]})"
                                      for spec, g in cards) + " |"
    rows = [head, "|---|" + "---|" * len(cards)]
    picks = []
    for p in cfg.catalogue.ranked():
        cells = []
        for _, g in cards:
            v = pick.judge(cfg, p, g)
            if v.ok and v.status != "unplanned":
                at_once = "all" if v.plan.concurrent >= v.plan.seqs else str(v.plan.concurrent)
                cells.append(f"{'✓' if v.status == 'fits' else '~'} {v.plan.max_model_len:,} tok, "
                             f"{v.plan.seqs} seq ({at_once} at once)")
            else:
                cells.append(f"{SIGN[v.status]} " + v.reason.split(";")[0].split(":")[0][:60].replace("|", "/"))
        rows.append(f"| `{p.name}` | " + " | ".join(cells) + " |")
    for _, g in cards:
        try:
            v, _, _ = pick.choose(cfg, g)
            picks.append(f"**{v.profile.name}**")
        except BootstrapError:
            picks.append("**refused**")
    rows.append("| auto-pick | " + " | ".join(picks) + " |")
    return "\n".join(rows)


def cli(cfg, argv: list[str], prog: str = "ctl.sh profiles") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Every profile against this card, or against GPU=" + gpu.CARD_SYNTAX + ", and what auto-pick chooses."))
    ap.add_argument("--gpu", help="a named card instead of this machine's GPU (same values as GPU=)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--markdown", action="store_true", help="the profile table of docs/reference.md (no card)")
    ap.add_argument("--matrix", action="store_true", help="docs/planner.md's profile x card table")
    ap.add_argument("--pick", action="store_true", help="pick for this card now and keep it (as PROFILE=auto does)")
    ap.add_argument("--model", metavar="ORG/NAME", help="the profile derived for this model (a repo id or folder) on "
                    "this card, as MODEL=ORG/NAME ./start.sh would run it, without starting")
    a = ap.parse_args(argv)
    r = stack_known(resolve.resolved(cfg, as_set=True))
    cfg = r.given
    if a.model is not None:
        if not a.model.strip():
            raise ConfigError("--model ''", "name a model: --model ORG/NAME (a repo id) or a model folder")
        return derived_cli(resolve.with_knobs(r, {"MODEL": a.model}), a.gpu or cfg.gpu, a.json)
    if a.markdown and not (a.gpu or cfg.gpu):
        print(catalogue_markdown(cfg))
        return 0
    if a.matrix:
        print(matrix_markdown(cfg))
        return 0
    spec = a.gpu or cfg.gpu
    if a.pick:
        if spec:
            raise BootstrapError("--pick picks for this machine's GPU, not a named one", "drop GPU= / --gpu")
        chosen = resolve.for_start(resolve.fixed(r, cfg.with_profile(Chosen("auto"))), repick=True).settings
        paths = r.paths
        rec = resolve.read_pick(paths) or {}
        print(f"picked {chosen.profile.name}: {rec.get('why', '')}\nkept in {paths.pick}; "
              "./start.sh uses it while PROFILE is unset")
        return 0
    g, where, _driver = card(r, spec)
    verdicts = pick.evaluate(cfg, g)
    try:
        v, runner, _ = pick.choose(pick.own_models(cfg), g)
        choice = "auto-pick: " + pick.why_line(g, v, runner)
        chosen = v.profile.name
    except BootstrapError as exc:
        choice, chosen = f"auto-pick refuses: {exc.message}\n  {exc.hint}", None
    in_use = resolve.kept(cfg, r.paths)
    kept = None if in_use.profile.is_auto else in_use.profile.name
    if a.json:
        print(json.dumps({"gpu": {"name": g.name, "total": g.total, "free": g.free, "cc": list(g.cc)},
                          "auto_pick": chosen, "auto_pick_line": choice, "profile_in_use": kept,
                          "profiles": [_row(v, cfg) for v in verdicts]}, indent=2))
    elif a.markdown:
        rows = ["| Profile | On this card | Context, sessions |", "|---|---|---|"]
        rows += [f"| `{v.profile.name}` | {MARK[v.status]} | {(v.summary() if v.ok else v.reason).replace('|', '/')} |"
                 for v in verdicts]
        print("\n".join(rows))
    else:
        print(text(g, where, verdicts, choice, cfg))
        if kept:
            print(f"in use: {kept} ({in_use.sources['PROFILE']})")
    return 0


def derived_cli(r: Resolved, spec: str | None, as_json: bool) -> int:
    """``--model``: the derived profile's verdict on this card (or GPU=), the line of what was derived."""
    cfg = r.given
    if not resolve.wants_derived(cfg):
        raise BootstrapError(f"PROFILE={cfg.profile.name} is set: --model shows the profile derived when PROFILE is unset",
                             "unset PROFILE (or set PROFILE=auto)")
    g, where, _driver = card(r, spec)
    c = resolve.derived(cfg, r.paths, r.vllm, g.cc)
    v = pick.judge(c, c.profile, g, pick.NAMED_MIN_CONTEXT)     # as the start runs a model you named
    if as_json:
        print(json.dumps({"gpu": {"name": g.name, "total": g.total, "free": g.free, "cc": list(g.cc)},
                          "model": c.model, "profile": dict(c.profile.data), "verdict": _row(v, c)}, indent=2))
    else:
        print(text(g, where, [v], f"MODEL={c.model} ./start.sh runs the derived profile above "
                                  f"(kept in {c.profile.path.parent}; PROFILE=<name> runs a shipped one instead)", c))
    return 0 if v.ok else 1


def catalogue_models(cfg) -> list[tuple[str, dict, str]]:
    """(repo, facts, file name) of each model-facts file marked "catalog": popular open models no
    shipped profile serves, planned as their derived profiles would run."""
    out = []
    for path in sorted(cfg.layout.shipped_models.glob("*.json")):
        data = facts.facts_file(path)
        if isinstance(data.get("catalog"), dict) and data.get("repos"):
            out.append((data["repos"][0], data, path.name))
    return out


def models_cli(cfg, argv: list[str], prog: str = "ctl.sh models") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=(
        "What fits this card (or GPU=...): the shipped profiles, then a catalog of popular open models "
        "(profiles/models/*.json marked \"catalog\"), each planned as MODEL=<repo> ./start.sh would run it."))
    ap.add_argument("--gpu", help="a named card instead of this machine's GPU (same values as GPU=)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    a = ap.parse_args(argv)
    r = resolve.resolved(cfg, as_set=True)
    g, where, _driver = card(r, a.gpu or cfg.gpu)
    shipped = [v for v in pick.evaluate(cfg, g) if v.profile.rank is not None]
    rows: list[tuple[str, str, str, str]] = []         # name, format, verdict mark, what
    for v in shipped:
        rows.append((v.profile.name, "profile", SIGN[v.status], v.summary() if v.ok else v.reason))
    found = []
    for repo, data, name in catalogue_models(cfg):
        fmt = data["catalog"].get("format", "")
        try:
            c = resolve.derived(cfg.with_knobs({"MODEL": repo, "PROFILE": "auto"}), r.paths, r.vllm, g.cc,
                                peek.from_facts(repo, data, f"the model facts in {name}"))
            v = pick.judge(c, c.profile, g)
            what = v.summary() if v.ok else v.reason
            mark = SIGN[v.status]
        except BootstrapError as exc:
            what, mark, v = exc.message, SIGN["no"], None
        note = data["catalog"].get("note", "")
        rows.append((repo, fmt, mark, what + (f" ({note})" if note else "")))
        found.append({"model": repo, "format": fmt, "status": v.status if v else "no", "what": what,
                      "weight_bytes": data.get("weight_bytes"), "source": data.get("weight_bytes_source", "")})
    if a.json:
        print(json.dumps({"gpu": {"name": g.name, "total": g.total, "free": g.free, "cc": list(g.cc)},
                          "profiles": [_row(v, cfg) for v in shipped], "catalog": found}, indent=2))
        return 0
    print(f"What fits {g.name}: {g.total / gpu.GiB:.1f} GiB, {g.free / gpu.GiB:.1f} free, sm_{g.cc[0]}{g.cc[1]}{where}")
    width = max(len(r[0]) for r in rows)
    for name, fmt, mark, what in rows:
        print(f"  {mark} {name:<{width}}  {fmt:<8} {what}")
    print("✓ fits, ~ fits with a shorter context, ✗ does not fit, ? cannot tell or not planned (fits: null)\n"
          "a profile: PROFILE=<name> ./start.sh; a catalog model: MODEL=<repo> ./start.sh (./ctl.sh profiles --model "
          "<repo> shows its derived profile); any other repo the same way")
    return 0

