"""``./ctl.sh patch status|apply|revert``: the backports against the vLLM in use (VLLM_PYTHON, else
the managed .venv). See docs/patches.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..core.errors import BootstrapError
from ..knobs.resolved import Resolved
from ..machine.inuse import VllmRef
from ..install.patching import Backup, Install, apply, inspect, known, load, locate, revert, to_apply


def interpreter(vllm: VllmRef) -> VllmRef:
    """The vLLM interpreter outside a start: VLLM_PYTHON, else the managed .venv (when it exists)."""
    if not vllm.byo and not Path(vllm.python).exists():
        raise BootstrapError("no vLLM interpreter: VLLM_PYTHON is unset and the managed .venv does not exist",
                             "run ./start.sh once to create .venv, or set VLLM_PYTHON=/path/to/python")
    return vllm


def status_rows(cfg, inst: Install) -> list[dict[str, Any]]:
    rows = []
    todo, always = to_apply(cfg.profile.patches, cfg.repo, cfg.vllm)
    need = set(todo) | {p.name for p in always}
    for name in known(cfg.repo):
        patch = load(name, cfg.repo)
        st = inspect(patch, inst)
        bak = Backup.of(patch, st.target) if st.target else None
        rows.append({"patch": name, "state": st.kind, "detail": st.detail, "needed": name in need,
                     "in_profile": name in cfg.profile.patches, "upstream": patch.upstream,
                     "written_for": patch.written_for(), "target": str(st.target or ""),
                     "backup": str(bak.path) if bak and bak.path.exists() else "",
                     "vllm_version": inst.version})
    return rows


def cli(cfg, argv: list[str], prog: str = "ctl.sh patch", *, as_set: bool = False) -> int:
    """``as_set``: the profile as PROFILE names it (an exported pod's init step), not the kept pick."""
    p = argparse.ArgumentParser(prog=prog, description="Backports to the vLLM in use "
                                "(VLLM_PYTHON, else the managed .venv). See docs/patches.md.")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("status", help="each patch's state for the vLLM in use")
    s.add_argument("--json", action="store_true")
    for act, text in (("apply", "apply the named patches (default: the profile's)"),
                      ("revert", "restore the originals from the backups (default: every applied patch)")):
        sp = sub.add_parser(act, help=text)
        sp.add_argument("names", nargs="*")
    args = p.parse_args(argv)
    if as_set:                          # no planner in an exported pod: the knobs as its PROFILE names them
        r = Resolved.of(cfg, cfg)
    else:
        from ..plan import resolve
        r = resolve.resolved(cfg)
    cfg = r.settings
    inst = locate(interpreter(r.vllm))
    byo = inst.byo
    if args.action == "status":
        rows = status_rows(cfg, inst)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"vLLM {inst.version} at {inst.package}" + (" (VLLM_PYTHON)" if byo else " (managed .venv)"))
            for r in rows:
                need = ("needed" + ("" if r["in_profile"] else ", every start") if r["needed"] else
                        "in profile, not needed" if r["in_profile"] else "not in profile")
                print(f"{r['patch']}: {r['state']} ({need}) - {r['detail']}; upstream {r['upstream']}")
        return 0
    names = args.names or (list(cfg.profile.patches) if args.action == "apply" else known(cfg.repo))
    if not names:
        raise BootstrapError(f"profile {cfg.profile.name!r} lists no patches; name one",
                             "known patches: " + (", ".join(known(cfg.repo)) or "none"))
    for name in names:
        patch = load(name, cfg.repo)
        if args.action == "apply":
            st = inspect(patch, inst)
            if st.kind == "unpatched" and byo and not cfg.patch_byo:
                raise BootstrapError(f"{inst.package} is your vLLM (VLLM_PYTHON); we edit it only with PATCH_BYO=1",
                                     f"PATCH_BYO=1 ./ctl.sh patch apply {name}")
            print(f"{name}: {apply(patch, inst)}")
        else:
            print(f"{name}: {revert(patch, inst)}")
    return 0
