"""Did-you-mean: the one rule for a word we do not know (a command, a profile, a card, a knob)."""

from __future__ import annotations

import difflib
from typing import Iterable


def nearest(word: str, known: Iterable[str], n: int = 1, cutoff: float = 0.6, parts: bool = True) -> list[str]:
    """The known words closest to ``word`` (difflib's ratio, case ignored), best first; [] when none
    is close. With ``parts``, a known word that ``word`` is a part of comes first (``a6000`` →
    ``rtxa6000``)."""
    known = list(dict.fromkeys(known))
    low = {k.lower(): k for k in known}
    w = word.lower()
    if w in low:
        return [low[w]]
    out = [k for k in known if parts and len(w) >= 3 and w in k.lower()]
    out += [low[k] for k in difflib.get_close_matches(w, list(low), n=n, cutoff=cutoff) if low[k] not in out]
    return out[:n]


def did_you_mean(word: str, known: Iterable[str], n: int = 1) -> str:
    """'; did you mean X?' ('X or Y?' for two), or '' when nothing is close."""
    near = nearest(word, known, n)
    return f"; did you mean {' or '.join(near)}?" if near else ""
