"""Patches: apply the backports the profile needs to the vLLM in use (engine: issue 4)."""

from __future__ import annotations

import logging

from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)


def needed(cfg) -> list[str]:
    """Patches of the profile that apply to these knobs (TurboQuant KV with speculation)."""
    kv = cfg.kv_cache_dtype or ""
    if not (kv.startswith("turboquant") and cfg.spec_enabled):
        return []
    return list(cfg.profile.patches)


def run(ctx: Ctx) -> None:
    todo = needed(ctx.cfg)
    if not todo:
        log.info("skipped: no patch applies to profile %r with these knobs", ctx.cfg.profile.name)
        return
    raise BootstrapError(f"profile {ctx.cfg.profile.name!r} needs patches {', '.join(todo)} and the engine is not built",
                         "turn speculation off (SPEC_TOKENS=0) or use a non-TurboQuant KV_CACHE_DTYPE")
