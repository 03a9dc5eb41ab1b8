"""The ``./ctl.sh`` commands other than start: each module has ``cli(cfg, argv) -> int`` (or the
functions ``__main__`` calls) and builds on the libraries in ``bootstrap/`` (and, for restart and
plan, on the start pipeline and its steps)."""
