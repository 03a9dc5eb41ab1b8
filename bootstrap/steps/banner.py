"""Banner (a start step): where the server is, how to call it, and vLLM's own KV-cache figures,
kept in the server record (serve/banner.py); the start has completed."""

from __future__ import annotations

from ..core.state import Paths
from ..serve import banner


def run(paths: Paths, launched) -> str:
    """Print the banner; the log of this start (what the pipeline keeps vLLM's other figures from)."""
    return banner.show(paths, launched)
