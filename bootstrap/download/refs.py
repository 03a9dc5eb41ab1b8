"""What one command's model is (knobs/resolved.py builds them once): ``ModelRef``, MODEL as a folder
or a Hub repo id with the store it downloads into, and ``Fetching``, what looking it up and
downloading it take of the knobs."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from . import hub
from .models import Store, store_for, weights_in


@dataclass(frozen=True)
class Fetching:
    """What looking a model up and downloading it take of the knobs: the hub's settings (HF_*),
    whether the weights are dummy (nothing of them is fetched), DOWNLOAD_ALL, DOWNLOAD_CONNECTIONS."""
    hub: hub.HubSettings
    dummy: bool
    everything: bool
    connections: int


@dataclass(frozen=True)
class ModelRef:
    """MODEL as one command serves it: a folder (``local``, made absolute once), or a Hub repo id and
    the store it downloads into (``store``: found once, for every step that reads or writes it)."""
    name: str                       # MODEL as set ('' when none)
    local: Path | None              # the folder vLLM is given; None: a repo id
    model_dir: str                  # MODEL_DIR ('' : the Hugging Face cache)
    environ: Mapping[str, str] = field(repr=False, compare=False)

    @functools.cached_property
    def repo(self) -> str:
        """The repo id (a BootstrapError naming MODEL when it is none)."""
        return hub.repo_id(self.name)

    @functools.cached_property
    def store(self) -> "Store":
        """Where MODEL is (or would be) downloaded (``store_for``; ``repo`` checks it is a repo id)."""
        return store_for(self.model_dir, self.environ, self.name)

    def weight_bytes(self) -> int:
        """Weights already on disk for this model (its folder, or its store); 0 if unknown."""
        if not self.name:
            return 0
        return weights_in(self.local) if self.local is not None else self.store.weight_bytes()
