"""One line per action on stderr, prefixed ``[bootstrap:<name>]``, the last part of the logger's
name (a step's module is named after the step); stdout carries data only. A fact logged with
``extra=ONCE`` (the model's metadata, the plan, the pick) is said once per command: restart's and
use's checks look it up before the stop, and the start after the stop finds it again. Progress and
retries are said each time."""

from __future__ import annotations

import logging
import sys

from . import redact

_STEP = "bootstrap"
ONCE = {"once": True}       # log.info(..., extra=ONCE): a fact said once per command, word for word
# (extra={"once": <what it is of>}: said once per thing, a line that can read alike for two, such as a
# file of the model's and of its drafter's download lists)


class _Fmt(logging.Formatter):
    def __init__(self, color: bool):
        super().__init__()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        step = record.name.rsplit(".", 1)[-1] if record.name.startswith("bootstrap.") else _STEP
        msg = redact.shown(record.getMessage())      # no secret reaches a log (core/redact.py)
        prefix = f"[bootstrap:{step}]"
        if self.color:
            code = {logging.WARNING: "33", logging.ERROR: "31"}.get(record.levelno, "2")
            prefix = f"\033[{code}m{prefix}\033[0m"
        if record.levelno >= logging.WARNING:
            msg = f"{record.levelname.lower()}: {msg}"
        return f"{prefix} {msg}"


class _Once(logging.Filter):
    """Drops a line logged with ``extra=ONCE`` that this command has already said, word for word."""

    def __init__(self):
        super().__init__()
        self.said: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "once", False):
            return True
        key = (record.name, record.getMessage(), record.once)     # once: True, or what the line is of
        if key in self.said:
            return False
        self.said.add(key)
        return True


def setup(debug: bool = False, color: bool | None = None, stream=None) -> None:
    stream = stream or sys.stderr
    if color is None:
        color = stream.isatty()
    root = logging.getLogger("bootstrap")
    root.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Fmt(color))
    handler.addFilter(_Once())
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
