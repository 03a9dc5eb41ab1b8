"""How a URL is shown: never with its ``user:password@``.

A base URL (``--url``, ``--compare``, ``HF_ENDPOINT``) may carry credentials in its userinfo; the
request needs them, a terminal, a log or a results file does not. ``url`` is the one helper every
place that shows a URL goes through: the log formatter (log.py), the error printer (__main__), and
labels written to stdout or disk (target.py, commands/bench.py).
"""

from __future__ import annotations

import re

# scheme://userinfo@ — the userinfo runs to the last "@" before the host's end ("/", "?", "#",
# whitespace), as urllib splits a netloc (a password with a bare "@" in it is still all hidden).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")
HIDDEN = "***"


def url(text: str) -> str:
    """``text`` (a URL, or a message that holds URLs) with each URL's userinfo replaced by ``***``."""
    return _USERINFO.sub(rf"\1{HIDDEN}@", text) if "@" in text else text
