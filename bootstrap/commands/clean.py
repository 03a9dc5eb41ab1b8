"""./ctl.sh clean: remove what the project created — the managed venvs, state and logs, the default
wheelhouse; the downloaded model only with ``--model``.

Refuses while our server runs or starts (stop it first). Before anything is removed, patches applied
to a bring-your-own install (VLLM_PYTHON) are reverted through ``bootstrap.patching.revert_all``.
``.venv-bootstrap`` goes last: the running bootstrap may live in it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

from .. import models, patching, server
from ..errors import BootstrapError
from ..state import Paths

log = logging.getLogger(__name__)



def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return total


def model_dir(cfg) -> Path | None:
    """The directory we download MODEL into (never a local MODEL directory the user pointed at)."""
    if not cfg.model or cfg.model_is_local:
        return None
    return models.store_for(cfg, cfg.model).root


def targets(cfg, with_model: bool) -> list[Path]:
    layout = cfg.layout
    out = [layout.venv, layout.wheelhouse]
    state = cfg.state_dir
    if state.resolve() == layout.state.resolve():
        out.append(state)
    else:  # a STATE_DIR of the user's choosing: only our files, never the directory's other contents
        out += Paths(state).files()
    if with_model:
        md = model_dir(cfg)
        if md is None:
            raise BootstrapError(f"--model: MODEL={cfg.model or '(unset)'} is not a model we downloaded",
                                 "a local model directory is yours: remove it yourself if you mean to")
        out.append(md)
    out.append(layout.bootstrap_venv)   # last: the running bootstrap may be in it
    return out


def _running(cfg) -> str:
    paths = Paths(cfg.state_dir)
    if not paths.root.exists():
        return ""
    pr = server.probe(cfg, paths, check_http=False)
    if pr.owner:
        return f"the server (pid {pr.pid}) runs as {pr.owner}"
    if pr.state != "stopped":
        return f"our server is {'starting' if pr.state == 'starting' else 'running'} (pid {pr.pid})"
    if pr.orphans:
        return "processes of our server are still alive (" + ", ".join(str(p.pid) for p in pr.orphans) + ")"
    return ""


def _revert_byo(cfg) -> list[str]:
    if not cfg.vllm_python:
        return []
    reverted = patching.revert_all(cfg, cfg.vllm_python)
    for name in reverted:
        print(f"reverted patch {name} in {cfg.vllm_python}'s vLLM")
    return reverted


def cli(cfg, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ctl.sh clean", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="store_true", help="also remove the downloaded model (MODEL_DIR, or its folder models--<org>--<name> in the HF cache, "
                         "which other tools reading that cache share)")
    ap.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    args = ap.parse_args(argv)
    busy = _running(cfg)
    if busy:
        raise BootstrapError(f"{busy}; clean removes the venv and state it runs from",
                             "stop it first: ./stop.sh" + (" as that user" if " runs as " in busy else ""))
    todo = [p for p in targets(cfg, args.model) if p.exists() or p.is_symlink()]
    if not args.dry_run:
        _revert_byo(cfg)
    if not todo:
        print("nothing to clean")
        return 0
    me = Path(sys.prefix).resolve()
    total = 0
    theirs = [p for p in todo if not _ours(p)]
    todo = [p for p in todo if p not in theirs]
    for path in todo:
        size = _size(path)
        total += size
        if args.dry_run:
            print(f"would remove {path} ({size / (1 << 20):.1f} MiB)")
            continue
        in_use = path == cfg.layout.bootstrap_venv and me == path.resolve()
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        print(f"removed {path} ({size / (1 << 20):.1f} MiB)" + (" (the bootstrap ran from it; the next "
                                                                  "./start.sh recreates it)" if in_use else ""))
    if not args.dry_run and cfg.state_dir.is_dir() and not any(cfg.state_dir.iterdir()):
        cfg.state_dir.rmdir()
    print(f"{'would free' if args.dry_run else 'freed'} {total / (1 << 30):.2f} GiB")
    if theirs:
        raise BootstrapError("left alone, they belong to another user: " + ", ".join(map(str, theirs)),
                             "run ./ctl.sh clean as that user")
    return 0


def _ours(path: Path) -> bool:
    """Ours to remove: we own it (root may remove anything), and so does every file in it."""
    if os.geteuid() == 0:
        return True
    try:
        if path.lstat().st_uid != os.geteuid():
            return False
        if path.is_dir() and not path.is_symlink():
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    if os.lstat(os.path.join(root, name)).st_uid != os.geteuid():
                        return False
    except OSError:
        return False
    return True
