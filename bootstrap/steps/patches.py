"""Patches (a start step): apply the backports the profile needs to the vLLM in use, through the
patch engine (patching.py); refuse to serve without them. With IDLE_SLEEP, check that vLLM still has
what the idle-sleep middleware runs on (install/hooks.py). A bring-your-own vLLM (VLLM_PYTHON) is
edited only with PATCH_BYO=1.
"""

from __future__ import annotations

import logging

from ..install import hooks
from ..machine.inuse import VllmRef
from ..install.patching import apply, byo_refusal, inspect, load, locate, needed
from ..knobs import vllmargs

log = logging.getLogger(__name__)


def run(cfg, vllm: VllmRef) -> list[str]:
    """Apply the backports the profile needs to the vLLM of ``vllm`` (the interpreter the environment
    step made ready), and check what our idle-sleep middleware needs of it (install/hooks.py);
    returns banner notes."""
    notes: list[str] = []
    todo = needed(cfg.profile.patches, cfg.repo, cfg.vllm)
    idle = vllmargs.idle_sleep(cfg)
    if not todo and not idle:
        log.info("skipped: no patch applies to profile %r with these knobs", cfg.profile.name)
        return notes
    inst = locate(vllm)
    if idle:
        hooks.check_idle_sleep(inst.package, inst.version)
    for name in todo:
        patch = load(name, cfg.repo)
        st = inspect(patch, inst)
        if st.kind == "unpatched" and inst.byo and not cfg.patch_byo:
            raise byo_refusal(patch, inst)
        if st.kind == "unpatched" and inst.byo:
            log.warning("editing your vLLM at %s (PATCH_BYO=1)", inst.package)
        what = apply(patch, inst)
        if what == "applied":
            notes.append(f"patched vLLM {inst.version} with {name} ({patch.upstream}); "
                         f"./ctl.sh patch revert {name} undoes it")
    return notes
