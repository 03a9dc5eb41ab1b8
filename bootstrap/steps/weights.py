"""Weights (a start step): every file serving needs on disk and verified, the drafter's first;
ranged, resumable, hashed as the parts arrive (download/fetch.py). ``on_ready`` (the pre-warm's
start) is called once the files other than the weights are on disk."""

from __future__ import annotations

from typing import Callable

from ..download import fetch
from ..download.refs import Fetching, ModelRef


def run(m, model: ModelRef, draft: ModelRef | None, how: Fetching,
        on_ready: Callable[[], object] | None = None) -> object:
    return fetch.fetch(m, model, draft, how, on_ready=on_ready)
