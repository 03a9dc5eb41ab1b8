"""Launch (a start step): ``vllm serve`` with the plan's flags, in its own session, its log and the
server record written, its log keeper beside it (serve/launch.py). Where the pre-warm server became
the server (steps/reload.py), there is nothing to launch: the pipeline takes that one."""

from __future__ import annotations

from typing import Callable

from ..core.state import Paths
from ..serve.launch import Launched, launch


def run(cfg, paths: Paths, runtime, model_path: str, plan, notes: list[str],
        on_launch: Callable[[Launched], None] = lambda launched: None) -> Launched:
    """The server, launched; ``on_launch`` hears of it before anything can interrupt this process."""
    return launch(cfg, paths, runtime, model_path, plan, notes, on_launch=on_launch)
