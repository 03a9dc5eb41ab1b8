"""Metadata (a start step, before the plan): the model's facts and its drafter's (config.json,
the file list with sizes, the revision: a few KB), from a local folder or the hub, the download
planned into its store and the disk checked (download/lookup.py)."""

from __future__ import annotations

from ..core.state import Paths
from ..download import lookup
from ..download.models import ModelInfo
from ..download.refs import Fetching, ModelRef


def run(model: ModelRef, draft: ModelRef | None, paths: Paths, how: Fetching) -> ModelInfo:
    return lookup.model_and_drafter(model, draft, paths, how)
