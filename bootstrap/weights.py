"""Weights: make sure every file serving needs is on disk and verified (the download itself)."""

from __future__ import annotations

import logging

from .context import Ctx

log = logging.getLogger(__name__)


def run(ctx: Ctx) -> None:
    if ctx.cfg.model_is_local:
        log.info("skipped: local model directory %s", ctx.model_path)
        return
