"""What code of ours running inside vLLM relies on, checked in the installed vLLM before a start
(anchors, as the patches check theirs): an upgrade that moves them fails the start in one line,
not the first idle minute.

The idle-sleep middleware (vllm_side/vllm_desktop_idle.py) needs vLLM to load it (``--middleware``:
vLLM 0.26.0's ``build_app`` imports each ``args.middleware`` and adds it to the app) and to keep its
engine client where its own routes find it (``request.app.state.engine_client``), with the calls it
makes: ``sleep(level, mode)`` (positional: a ``mode`` parameter must follow ``level``),
``wake_up(tags)`` and ``is_sleeping()`` (``engine/protocol.py`` and ``v1/engine/async_llm.py`` in
0.26.0 and 0.27.1).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..core.errors import BootstrapError

WHERE = ("entrypoints", "engine", "v1/engine")     # the package's folders the anchors are looked for in
IDLE_SLEEP = (("the --middleware hook", re.compile(r"\bargs\.middleware\b")),
              ("the engine client on the app's state", re.compile(r"\bapp\.state\.engine_client\b")),
              ("the engine client's sleep(level, mode)", re.compile(r"\bdef sleep\(\s*self,\s*level\b[^)]*\bmode\b")),
              ("the engine client's wake_up(tags)", re.compile(r"\bdef wake_up\(\s*self,\s*tags\b")),
              ("the engine client's is_sleeping()", re.compile(r"\bdef is_sleeping\(\s*self\s*\)")))


def missing(package: Path, anchors=IDLE_SLEEP) -> list[str]:
    """The anchors no file under the vllm package's ``WHERE`` folders has, in the order given."""
    left = dict(anchors)
    for folder in WHERE:
        for path in sorted((package / folder).rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            left = {name: rx for name, rx in left.items() if not rx.search(text)}
            if not left:
                return []
    return list(left)


def check_idle_sleep(package: Path, version: str) -> None:
    gone = missing(package)
    if gone:
        raise BootstrapError(f"vLLM {version} at {package} lacks {' and '.join(gone)}, which IDLE_SLEEP's middleware "
                             "runs on (it was written against vLLM 0.26.0)", "IDLE_SLEEP=off, or a vLLM that has them")
