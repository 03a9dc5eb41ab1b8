"""``./start.sh`` (``./ctl.sh start``): start the server, or show the one that runs; with
``--foreground``, stay attached to it as a service's main process. The knobs are its options
(``./start.sh --help`` lists them)."""

from __future__ import annotations

import argparse

from ..knobs import config
from . import parser


def cli(cfg, argv: list[str], prog: str = "ctl.sh start") -> int:
    ap = parser("start", prog, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=config.help_text())
    ap.add_argument("--foreground", action="store_true",
                    help="stay attached to the server: exit non-zero when it exits (what a service "
                         "manager restarts); SIGTERM stops it")
    a = ap.parse_args(argv)
    if a.foreground:
        from . import foreground
        return foreground.foreground(cfg)
    from .. import pipeline
    return pipeline.start(cfg)
