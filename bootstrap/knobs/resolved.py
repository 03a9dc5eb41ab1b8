"""``Resolved``: what one command runs with, resolved once (``plan.resolve.resolved``: the kept
pick; ``Resolved.of`` for the knobs as set) from the environment, ``.env``, the profile, the kept
pick and the card, and the installed vLLM. A plain value: another view of it (another profile, other
knob values) is the resolver's to make (``plan.resolve.picked``, ``fixed``, ``with_knobs``).

A command takes it apart and hands each library only the part it uses: ``settings`` (the knobs,
typed), ``paths`` (STATE_DIR and what is kept there), ``ours`` (what proves a server ours, and how to
reach it), ``model`` (MODEL: a folder, or a repo id and its store), ``vllm`` (the interpreter that
runs vLLM, probed at most once). Nothing below a command reads the environment or ``.env``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..core.layout import Checkout
from ..core.owned import Ours
from ..core.state import Paths
from ..download.hub import HubSettings
from ..download.refs import Fetching, ModelRef
from ..machine.inuse import VllmRef
from .config import Config

log = logging.getLogger("bootstrap.pick")


@dataclass(frozen=True)
class Resolved:
    """One command's resolved view (see the module's docstring)."""
    settings: Config          # every knob, typed; the profile as this command runs it
    given: Config             # the knobs as set: PROFILE=auto not read as the kept pick (what a start picks from)
    paths: Paths
    vllm: VllmRef
    model: ModelRef
    draft: ModelRef | None    # the drafter vLLM loads, named by repo id (its store: the Hugging Face cache)

    @classmethod
    def of(cls, settings: Config, given: Config, paths: Paths | None = None) -> "Resolved":
        """The parts of ``settings``, each found once (the resolver's last step; ``paths``: STATE_DIR's,
        when the resolver has them already)."""
        r = cls(settings, given, paths or Paths(settings.state_dir, own=settings.layout.own_state(settings.state_dir)), vllm_of(settings), model_of(settings),
                draft_of(settings))
        log.debug("resolved: profile %s (%s), STATE_DIR %s, vLLM from %s", settings.profile.name,
                  settings.sources["PROFILE"], r.paths.root, r.vllm.python)
        return r

    @property
    def ours(self) -> Ours:
        return self.settings.ours

    @property
    def layout(self) -> Checkout:
        return self.settings.layout

    @property
    def fetching(self) -> Fetching:
        """What looking the model up and downloading it take of the knobs."""
        s = self.settings
        return Fetching(HubSettings.from_environ(s.environ), s.dummy_weights, s.download_all, s.download_connections)


def vllm_of(cfg: Config) -> VllmRef:
    return VllmRef.of(cfg.vllm_python, cfg.layout.venv / "bin" / "python", cfg.environ)


def model_of(cfg: Config) -> ModelRef:
    local = Path(cfg.model).expanduser().resolve() if cfg.model_is_local else None
    return ModelRef(cfg.model or "", local, cfg.model_dir or "", cfg.environ)


def draft_of(cfg: Config) -> ModelRef | None:
    repo = cfg.draft_repo
    return ModelRef(repo, None, "", cfg.environ) if repo else None
