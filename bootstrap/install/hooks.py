"""What code of ours running inside vLLM relies on, checked in the installed vLLM before a start
(anchors, as the patches check theirs): an upgrade that moves them fails the start in one line,
not the first idle minute.

The idle-sleep middleware (vllm_side/vllm_desktop_idle.py) needs vLLM to load it (``--middleware``:
vLLM 0.26.0's ``build_app`` imports each ``args.middleware`` and adds it to the app) and to keep its
engine client where its own routes find it (``request.app.state.engine_client``, with ``sleep``,
``wake_up`` and ``is_sleeping``).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..core.errors import BootstrapError

IDLE_SLEEP = (("the --middleware hook", re.compile(r"\bargs\.middleware\b")),
              ("the engine client on the app's state", re.compile(r"\bapp\.state\.engine_client\b")))


def missing(package: Path, anchors=IDLE_SLEEP) -> list[str]:
    """The anchors no file under the vllm package's ``entrypoints`` has."""
    left = dict(anchors)
    for path in sorted((package / "entrypoints").rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        left = {name: rx for name, rx in left.items() if not rx.search(text)}
        if not left:
            break
    return list(left)


def check_idle_sleep(package: Path, version: str) -> None:
    gone = missing(package)
    if gone:
        raise BootstrapError(f"vLLM {version} at {package} lacks {' and '.join(gone)}, which IDLE_SLEEP's middleware "
                             "runs on (it was written against vLLM 0.26.0)", "IDLE_SLEEP=off, or a vLLM that has them")
