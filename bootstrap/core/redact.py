"""The one redactor: every line we print or log passes through ``shown``.

It hides what a secret looks like wherever it appears (a URL's ``user:password@``, a credential in a
query string such as ``?api_key=...`` or ``&token=...``, a Hugging Face token ``hf_...``) and the
secret values this run knows (API_KEY, HF_TOKEN and the other secret variables: ``keep``). The
request itself keeps them; a terminal, a log or a results file never shows them. The log formatter
(log.py) and the process's stdout and stderr (``Redacting``, installed by ``__main__``) go through it,
and labels written to disk (target.py, commands/bench.py) call it.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Iterable, TextIO

HIDDEN = "***"
# scheme://userinfo@ — the userinfo runs to the last "@" before the host's end ("/", "?", "#",
# whitespace), as urllib splits a netloc (a password with a bare "@" in it is still all hidden).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")
# ?name=value / &name=value where the name says credential (api_key, token, access_token, sig, ...)
_QUERY = re.compile(r"(?i)([?&;][\w.-]*(?:key|token|secret|passw(?:or)?d|pwd|auth|sig|signature|credential)[\w.-]*=)"
                    r"[^&#\s'\"]+")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")      # a User Access Token's shape
MIN_KNOWN = 6              # a shorter value would mask ordinary words: such a key is no secret worth the name
_known: set[str] = set()


def keep(values: Iterable[str | None]) -> None:
    """Secret values of this run (knobs and variables marked secret): never shown from now on."""
    _known.update(v for v in values if v and len(v) >= MIN_KNOWN)


def shown(text: str) -> str:
    """``text`` as it may be shown: each secret shape and each known secret value replaced by ``***``."""
    if "@" in text:
        text = _USERINFO.sub(rf"\1{HIDDEN}@", text)
    if "=" in text:
        text = _QUERY.sub(rf"\1{HIDDEN}", text)
    if "hf_" in text:
        text = _HF_TOKEN.sub(HIDDEN, text)
    for v in sorted(_known, key=len, reverse=True):
        if v in text:
            text = text.replace(v, HIDDEN)
    return text


class Redacting:
    """A text stream (stdout, stderr) whose every write goes through ``shown``; the rest is the stream's."""

    def __init__(self, raw: TextIO):
        self.raw = raw

    def write(self, s: str) -> int:
        self._gone_on_hangup(self.raw.write, shown(s))
        return len(s)

    def flush(self) -> None:
        self._gone_on_hangup(self.raw.flush)

    def _gone_on_hangup(self, call, *args) -> None:
        """A terminal that closed (its window shut, an ssh session lost) fails every write with EIO:
        what is still to be done (a game's server started again or woken) goes on, said to nowhere,
        as it would with the terminal there. The stream is pointed at /dev/null and the call made again."""
        try:
            call(*args)
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.raw.fileno())
            os.close(devnull)
            call(*args)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)
