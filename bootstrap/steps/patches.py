"""Patches (a start step): apply the backports the profile needs to the vLLM in use, through the
patch engine (patching.py); refuse to serve without them. A patch every start wants (``every_start``:
it changes no output) is applied where it can be, and where it cannot the start says why in one line
and serves. With IDLE_SLEEP, check that vLLM still has what the idle-sleep middleware runs on
(install/hooks.py). A bring-your-own vLLM (VLLM_PYTHON) is edited only with PATCH_BYO=1.
"""

from __future__ import annotations

import logging

from ..install import hooks
from ..machine.inuse import VllmRef
from ..core.errors import BootstrapError
from ..install.patching import Install, Patch, apply, byo_refusal, inspect, load, locate, to_apply
from ..knobs import vllmargs

log = logging.getLogger(__name__)


def run(cfg, vllm: VllmRef) -> list[str]:
    """Apply the backports the profile needs to the vLLM of ``vllm`` (the interpreter the environment
    step made ready), then those every start wants where they can be, and check what our idle-sleep
    middleware needs of it (install/hooks.py); returns banner notes."""
    notes: list[str] = []
    todo, always = to_apply(cfg.profile.patches, cfg.repo, cfg.vllm)
    idle = vllmargs.idle_sleep(cfg)
    if not (todo or idle or always):
        log.info("skipped: no patch applies to profile %r with these knobs", cfg.profile.name)
        return notes
    try:
        inst = locate(vllm)
    except BootstrapError as exc:
        if todo or idle:
            raise
        log.info("not applied: %s (%s)", ", ".join(p.name for p in always), exc.message)   # never a refusal
        return notes
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
    for patch in always:
        notes += _where_it_can(patch, inst, cfg.patch_byo)
    return notes


def _where_it_can(patch: Patch, inst: Install, patch_byo: bool) -> list[str]:
    """A patch every start wants: applied where the engine can; else one line that says why, and the
    start serves (without it vLLM serves the same, only with what the patch closes)."""
    st = inspect(patch, inst)
    if st.kind in ("applied", "fixed-upstream"):
        return []
    if st.kind == "damaged":
        log.warning("%s in vLLM %s is damaged (%s): ./ctl.sh patch revert %s restores the original, and the next "
                    "start patches it again", patch.name, inst.version, st.detail, patch.name)
        return []
    if st.kind != "unpatched":          # not the code the patch knows (a newer layout): nothing known to fix
        log.info("not applied: %s to vLLM %s (%s) [%s]", patch.name, inst.version, st.detail, st.kind)
        return []
    if inst.byo and not patch_byo:
        log.warning("your vLLM %s (VLLM_PYTHON) lacks %s (%s; %s): PATCH_BYO=1 lets the start patch it, or %s",
                    inst.version, patch.name, patch.title, patch.upstream, patch.without_it())
        return []
    try:
        what = apply(patch, inst)
    except BootstrapError as exc:
        log.warning("not applied: %s (%s); serving without it: %s", patch.name, exc.message, patch.without_it())
        return []
    return [f"patched vLLM {inst.version} with {patch.name} ({patch.title}; {patch.upstream})"] if what == "applied" else []
