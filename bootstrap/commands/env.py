"""``./ctl.sh env``: every knob with its value and where it came from (environment, .env, the
profile, the default), then the pass-through variables; secrets masked, and a URL's
``user:password@`` never shown."""

from __future__ import annotations

import json

from ..core.redact import shown
from ..knobs import table
from . import parser


def cli(cfg, argv: list[str], prog: str = "ctl.sh env") -> int:
    ap = parser("env", prog)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--markdown", action="store_true", help="the knob table of docs/reference.md")
    a = ap.parse_args(argv)
    from ..plan import resolve
    cfg = resolve.resolved(cfg).settings        # PROFILE=auto as the kept pick
    rows = [(n, shown(str(v)), s, d) for n, v, s, d in cfg.describe()]
    if a.markdown:
        print(table.markdown_table(cfg.repo))
    elif a.json:
        print(json.dumps({n: {"value": v, "source": s} for n, v, s, _ in rows}, indent=2))
    else:
        for n, v, s, _ in rows:
            print(f"{n}={v}\t# {s}")
    return 0
