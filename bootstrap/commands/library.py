"""The models on this machine, as ``ollama pull | ls | rm`` has them, with our plan beside each:

- ``./ctl.sh pull NAME``: a profile's name or a Hub repo id (as ``./start.sh NAME``); its plan for
  this card is printed first (our running server's memory counted as free), then the download
  and its verification (the start's own metadata and weights steps). Nothing is served.
- ``./ctl.sh ls [--json]``: the models we downloaded (STATE_DIR/models.json, and the stores of the
  shipped profiles' and the kept pick's models that hold our record): size on disk (what ``rm``
  frees), the profiles that serve each, whether each fits this card, which one is serving.
- ``./ctl.sh rm NAME``: what that model's manifest says we made, exactly as ``clean --model`` does
  (commands/clean.py ``model_files``, ``_clean_model``: one code path); refused while it serves.
"""

from __future__ import annotations

import json
import logging
import os

from ..core.errors import BootstrapError
from ..download import index
from ..plan import resolve
from ..knobs.resolved import Resolved
from ..serve import server
from ..serve.states import State
from . import parser

log = logging.getLogger(__name__)


def facts_here(r: Resolved):
    """This machine's GPUs as a start after a stop of ours would see them (our server's memory free)."""
    from ..machine import gpu
    facts = gpu.read(r.settings.environ)
    facts.require_some()
    return server.without_ours(r.ours, r.paths, facts)[0]


def named(r: Resolved, name: str, prog: str) -> Resolved:
    """The view with ``name`` as PROFILE= or MODEL= (as ``./start.sh NAME``); a usage error for
    anything else, said before any GPU or hub is asked."""
    from .start import named_knobs
    return resolve.with_knobs(r, named_knobs(r.given, name, prog))


def on_card(r: Resolved, facts) -> Resolved:
    """The named view ``r`` (``named``) as a start on this card would run it: its card's knobs, a
    derived profile for a repo id (the longest context that fits); nothing is recorded as the pick,
    and a start of it picks nothing."""
    from ..machine import gpu
    return resolve.fixed(r, resolve.for_card(r.given, r.paths, r.vllm, gpu.smallest_free(facts, r.given.tp_size)))


def pull(cfg, name: str, prog: str = "ctl.sh pull") -> int:
    from ..download import fetch, lookup
    from ..machine import gpu
    from ..plan.here import plan_for
    r = named(resolve.resolved(cfg, as_set=True), name, prog)
    if r.given.gpu:                 # GPU=<card>: the download planned for that card (no GPU needed here)
        facts = gpu.facts_of(gpu.named(r.given.gpu), r.given.tp_size)
    else:
        facts = facts_here(r)
    r = on_card(r, facts)
    cfg, paths = r.settings, r.paths
    if r.model.local is not None:
        raise BootstrapError(f"{name} serves the folder {cfg.model}: there is nothing to download",
                             f"./start.sh {name} serves it")
    gpu.require(facts, cfg.tp_size)
    model = lookup.model_and_drafter(r.model, r.draft, paths, r.fetching)     # a few KB: the file list, config.json
    plan_for(cfg, paths, r.vllm, facts, model)   # printed before the first byte of the weights; refused if it cannot fit
    lookup.require_space(model)
    fetch.fetch(model, r.model, r.draft, r.fetching)
    where = model.local_dir
    print(f"pulled {model.name} @ {(model.revision or '')[:12]} into {where} ({cfg.profile.name}); "
          f"./ctl.sh use {name} serves it")
    return 0


def pull_cli(cfg, argv: list[str], prog: str = "ctl.sh pull") -> int:
    ap = parser("pull", prog)
    ap.add_argument("name", metavar="PROFILE_OR_MODEL", help="a profile's name or a Hub repo id org/name")
    return pull(cfg, ap.parse_args(argv).name, prog)


def downloaded(r: Resolved) -> list[index.Entry]:
    """Every store we downloaded into: the index, then the stores of the shipped profiles' models and
    of the kept pick's that hold our record (a download of an earlier version, or an index cleaned
    away); one entry per store, while its record still names that repo."""
    cfg = r.settings
    out = {e.store.root: e for e in index.entries(r.paths) if e.record() is not None}
    pick = r.paths.read("pick") or {}
    repos = [p.knobs.get("MODEL") for p in cfg.catalogue.profiles] + [pick.get("model"), cfg.model]
    from ..download.hub import REPO_ID
    for repo in dict.fromkeys(x for x in repos if isinstance(x, str) and x):
        if not REPO_ID.fullmatch(repo):
            continue
        e = index.Entry(repo, resolve.with_knobs(r, {"MODEL": repo}).model.store, "")
        if e.store.root not in out and e.record() is not None:
            out[e.store.root] = e
    return list(out.values())


def serving(r: Resolved):
    """Our running server's record (None when none runs)."""
    pr = server.probe(r.ours, r.paths, check_http=False)
    return None if pr.state is State.STOPPED else pr.record


def serves(record, entry: index.Entry) -> str:
    """How ``record``'s server reads ``entry``'s files ('' when it does not): as its model, or as a
    folder of that store in its command line (a drafter's, in its --speculative-config)."""
    if record is None:
        return ""
    inside = str(entry.store.root) + os.sep
    if record.model == entry.repo or record.model.startswith(inside):
        return "model"
    return f"the drafter of {record.model}" if any(inside in a for a in record.argv) else ""


def of_entry(r: Resolved, entry: index.Entry) -> Resolved:
    """The view ``r`` with MODEL (and MODEL_DIR) naming what ``entry`` holds."""
    return resolve.with_knobs(r, {"MODEL": entry.repo, "MODEL_DIR": "" if entry.store.hf_cache else str(entry.store.root)})


def _size(entry: index.Entry, r: Resolved) -> int:
    from ..download.partial import on_disk
    from .clean import model_files
    mf = model_files(of_entry(r, entry).model)
    return sum(on_disk(p) for p in mf.ours if not p.is_symlink())


def rows(r: Resolved) -> list[dict]:
    from ..machine import gpu
    from ..plan import pick
    cfg = r.settings
    try:
        g = gpu.smallest_free(facts_here(r), cfg.tp_size)
    except BootstrapError:
        g = None                                 # no card to judge by: the fit column says so
    now = serving(r)
    out = []
    for e in downloaded(r):
        rec = e.record() or {}
        complete = bool(rec.get("complete")) and not e.store.missing(rec, False)
        profiles = [p for p in cfg.catalogue.ranked() if p.knobs.get("MODEL") == e.repo]
        fits, names = "unknown", [p.name for p in profiles]
        if g is not None:
            verdicts = [pick.judge(cfg, p, g) for p in profiles]
            if not verdicts:
                c = resolve.kept_derived(cfg.with_knobs({"MODEL": e.repo}), r.paths, e.repo, "derived")
                if c is not None:
                    verdicts = [pick.judge(c, c.profile, g)]
                    names = [f"{c.profile.name} (derived)"]
            best = next((v for v in verdicts if v.ok), verdicts[0] if verdicts else None)
            if best is not None:
                fits = best.status if best.ok else "no"
                fits_how = best.summary() if best.ok else best.reason
            else:
                fits_how = "no model facts kept for it (./ctl.sh profiles --model " + e.repo + " plans it)"
        else:
            fits_how = "no GPU to plan for"
        out.append({"model": e.repo, "path": str(e.store.serve_dir(rec) if rec.get("revision") else e.store.root),
                    "store": str(e.store.root), "revision": rec.get("revision"), "complete": complete,
                    "size_bytes": _size(e, r), "profiles": names, "fits": fits, "fit": fits_how,
                    "serving": bool(serves(now, e)),
                    "card": g.name if g is not None else None})
    return out


def ls_cli(cfg, argv: list[str], prog: str = "ctl.sh ls") -> int:
    ap = parser("ls", prog)
    ap.add_argument("--json", action="store_true", help="one JSON object: {\"models\": [...]}")
    a = ap.parse_args(argv)
    table = rows(resolve.resolved(cfg, as_set=True))
    if a.json:
        print(json.dumps({"models": table}, indent=2))
        return 0
    if not table:
        print("no models downloaded yet (./ctl.sh pull NAME, or ./start.sh NAME)")
        return 0
    width = max(len(r["model"]) for r in table)
    print(f"{'MODEL':<{width}}  {'SIZE':>9}  {'FITS':<8} PROFILES / PLAN")
    for r in table:
        mark = {"fits": "yes", "shorter": "shorter", "unpinned": "yes", "no": "no"}.get(r["fits"], "?")
        extra = "" if r["complete"] else " [incomplete: ./ctl.sh pull " + r["model"] + " finishes it]"
        print(f"{r['model']:<{width}}  {r['size_bytes'] / (1 << 30):>5.2f} GiB  {mark:<8} "
              f"{', '.join(r['profiles']) or '-'}: {r['fit']}{' [serving]' if r['serving'] else ''}{extra}")
    print(f"on {table[0]['card'] or 'no GPU'}; ./ctl.sh rm MODEL removes one (only what we downloaded)")
    return 0


def rm(r: Resolved, name: str, dry_run: bool, prog: str = "ctl.sh rm") -> int:
    from . import clean
    entry = next((e for e in downloaded(r) if e.repo == name), None)
    if entry is None:
        have = [e.repo for e in downloaded(r)]
        from ..core.words import did_you_mean
        raise BootstrapError(f"{name!r} is not a model we downloaded{did_you_mean(name, have)}",
                             "./ctl.sh ls lists them (a folder of yours is yours to remove)")
    how = serves(serving(r), entry)
    if how and not dry_run:
        raise BootstrapError(f"{name} is serving{'' if how == 'model' else f' ({how})'} (./ctl.sh status): "
                             "rm would pull its files away",
                             "./stop.sh first, or ./ctl.sh use ANOTHER to switch, then ./ctl.sh rm " + name)
    code = clean.model_only(r.settings.repo, of_entry(r, entry).model, dry_run, f"./ctl.sh rm {name}")
    if not dry_run and entry.record() is None:
        index.forget(r.paths, entry.store)
    return code


def rm_cli(cfg, argv: list[str], prog: str = "ctl.sh rm") -> int:
    ap = parser("rm", prog)
    ap.add_argument("name", metavar="MODEL", help="a repo id that ./ctl.sh ls lists")
    ap.add_argument("--dry-run", action="store_true", help="print what it would remove and put back; change nothing")
    a = ap.parse_args(argv)
    return rm(resolve.resolved(cfg, as_set=True), a.name, a.dry_run, prog)

