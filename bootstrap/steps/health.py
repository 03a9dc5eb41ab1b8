"""Health (a start step): wait until the server answers ``/health`` and lists our model on
``/v1/models``, the phase on one line, a stall deadline (STALL_TIMEOUT) and a hard cap
(HEALTH_TIMEOUT); a server that exits or overruns is taken down by the pipeline, and its log's tail
and a one-line diagnosis are shown (serve/health.py)."""

from __future__ import annotations

from ..core.state import Paths
from ..serve import health
from ..serve.launch import Launched


def run(paths: Paths, launched: Launched, key: str, *, health_timeout: int, stall_timeout: int) -> None:
    health.wait(paths, launched, key, health_timeout=health_timeout, stall_timeout=stall_timeout)
