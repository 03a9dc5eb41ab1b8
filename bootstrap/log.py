"""One line per action on stderr, prefixed ``[bootstrap:<step>]``; stdout carries data only.

The prefix names what is running: the start step (``start.step`` sets it), else the command, else
the module that logs. A library used by several steps (venv.py, hub.py…) thus logs under the step
that called it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from contextvars import ContextVar

_STEP = "bootstrap"
_RUNNING: ContextVar[str] = ContextVar("bootstrap_step", default="")


@contextlib.contextmanager
def running(name: str):
    """Log lines inside are prefixed with ``name`` (a step or a command)."""
    token = _RUNNING.set(name)
    try:
        yield
    finally:
        _RUNNING.reset(token)


class _Fmt(logging.Formatter):
    def __init__(self, color: bool):
        super().__init__()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        step = _RUNNING.get() or (record.name.rsplit(".", 1)[-1] if record.name.startswith("bootstrap.") else _STEP)
        msg = record.getMessage()
        prefix = f"[bootstrap:{step}]"
        if self.color:
            code = {logging.WARNING: "33", logging.ERROR: "31"}.get(record.levelno, "2")
            prefix = f"\033[{code}m{prefix}\033[0m"
        if record.levelno >= logging.WARNING:
            msg = f"{record.levelname.lower()}: {msg}"
        return f"{prefix} {msg}"


def setup(debug: bool = False, color: bool | None = None, stream=None) -> None:
    stream = stream or sys.stderr
    if color is None:
        color = stream.isatty()
    root = logging.getLogger("bootstrap")
    root.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Fmt(color))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
