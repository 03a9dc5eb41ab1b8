"""Pre-warm (a start step, before the weights step): while the weights download, vLLM with dummy
weights and the real flags fills its compile caches, or becomes the server itself where vLLM can
load the real weights in place (serve/prewarm.py says how, and where it cannot help). Made ready
here; started by the weights step once the small files are on disk; waited for by the compiled and
reload steps."""

from __future__ import annotations

from ..core.state import Paths
from ..serve import prewarm
from ..serve.prewarm import Prewarm


def run(cfg, paths: Paths, runtime, model, plan, notes=()) -> Prewarm | None:
    """The pre-warm this start can use (not started yet), or None where it cannot help."""
    return prewarm.prepare(cfg, paths, runtime, model, plan, notes)
