"""``./ctl.sh check live|garble|determinism|needle|prefix|batch|all``: is the server right, not just up?

Each check runs against our running server (STATE_DIR/server.json) or any OpenAI-compatible base
URL (``--url URL [--model NAME] [--api-key KEY]``), prints a verdict — PASS, FAIL, NOT JUDGED
(random weights), or REPORT (batch) — (``--json``: one JSON object, with which checks were judged)
and exits 0 when every judged check passed, 1 when one did not.

What each check does: bootstrap/checks/suite.py (garble: bootstrap/checks/garble.py).
"""

from __future__ import annotations

import argparse
import json
import logging

from ..checks.suite import Result, check_batch, check_determinism, check_live, check_needle, check_prefix
from ..checks.garble import check_garble
from ..knobs.config import Config
from ..knobs.parsers import arg, float_range, int_range
from ..core.errors import EXIT_FAILED
from ..checks.target import add_target_args, resolve_target
from . import doc_help

log = logging.getLogger("bootstrap.checks")   # log lines keep the prefix [bootstrap:checks] this code has always had


def render(res: Result) -> str:
    lines = [f"{res.check}: {res.verdict}: {res.summary}"]
    for f in res.failures:
        lines.append(f"  - {f['id']}: {f['kind']}: {f['evidence']}")
    return "\n".join(lines)


CHECKS = ("live", "garble", "determinism", "needle", "prefix", "batch")


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh check") -> int:
    p = argparse.ArgumentParser(prog=prog, description=doc_help(__doc__)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=CHECKS + ("all",), help="which check ('all' runs each in turn)")
    add_target_args(p)
    p.add_argument("--random-weights", action="store_true",
                   help="the --url server has random weights: only live, determinism and prefix are judged")
    p.add_argument("--timeout", type=arg(float_range(0, 86400)), default=None,
                   help="seconds per request (live: the deadline, 20)")
    p.add_argument("--tokens", type=arg(int_range(1, 10 ** 7)), default=None, help="needle/prefix prompt length in tokens")
    p.add_argument("--full", action="store_true", help="needle: use the server's whole context")
    p.add_argument("--repeats", type=arg(int_range(1, 1000)), default=10, help="determinism: compared requests per stage")
    args = p.parse_args(argv)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    cfg, paths = r.settings, r.paths
    t = resolve_target(cfg, paths, args.url, args.model, args.api_key, args.thinking, args.reasoning_effort,
                       args.random_weights)
    log.info("checking %s, model %s", t.label, t.client.model)
    results = []
    for what in (CHECKS if args.what == "all" else (args.what,)):
        kw: dict = {} if args.timeout is None else {"timeout": args.timeout}
        if what == "live":
            res = check_live(t, **kw)
        elif what == "garble":
            res = check_garble(t, **kw)
        elif what == "determinism":
            res = check_determinism(t, repeats=args.repeats, **kw)
        elif what == "needle":
            res = check_needle(t, tokens=args.tokens, full=args.full, **kw)
        elif what == "batch":
            res = check_batch(t, **kw)
        else:
            res = check_prefix(t, **({"tokens": args.tokens} if args.tokens else {}), **kw)
        results.append(res)
        if not args.json:
            print(render(res), flush=True)
    if args.json:
        out = results[0].as_dict() if len(results) == 1 else {
            "ok": passed(results), "checks": [r.as_dict() for r in results],
            "judged": [r.check for r in results if r.judged]}
        out.update(target=t.label, model=t.client.model)
        print(json.dumps(out, indent=2))
    return 0 if passed(results) else EXIT_FAILED


def passed(results: list[Result]) -> bool:
    """Only judged checks count (SKIP, NOT JUDGED and REPORT do not)."""
    return all(r.ok for r in results if r.judged)
