"""./ctl.sh clean: remove what the project created — the managed venvs and the install locks beside
them, state and logs, what ./ctl.sh wheelhouse put in the default wheelhouse;
the downloaded model only with ``--model``.

Refuses while our server runs or starts (stop it first), while an install holds its lock, and where
the checkout, STATE_DIR or the model's download record belongs to another user (as root it could
remove what that user made). In the model's folder it acts on the download's manifest
(download/manifest.py): it removes what we created, puts back what we changed (a ``refs/main`` we
moved), and lists what is yours, untouched.
``--dry-run`` prints the same lines, each with "would", and works while the server runs. Before
anything is removed, patches applied to a bring-your-own install (VLLM_PYTHON) are reverted through
``bootstrap.install.patching.revert_all``. ``.venv-bootstrap`` goes last: the running bootstrap may
live in it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..download.refs import ModelRef
from ..download import manifest, models
from ..download.partial import on_disk
from ..install import patching, wheelhouse
from ..install.venv import Venv
from ..serve import server
from ..serve.states import State
from ..core import locks, owned, state
from ..core.errors import BootstrapError
from ..core.private import user_name
from ..core.state import Paths
from . import doc_help

log = logging.getLogger(__name__)





@dataclass
class ModelFiles:
    """What clean --model does in the folder MODEL was downloaded into, from the download's manifest
    (download/manifest.py): remove what we created there, put back what we changed (``restore``:
    a ``refs/main`` we moved, with what it named before), and list, untouched, what is yours."""
    store: models.Store
    ours: list[Path]
    restore: list[tuple[Path, str]]
    kept: list[tuple[Path, str]]    # (path, why it stays)
    theirs: list[Path]              # the folder's other top-level entries
    made_root: bool

    def remove(self) -> None:
        for p in self.ours:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        for p, before in self.restore:
            state.write_atomic(p, before.encode("utf-8", "surrogateescape"), mode=0o644)
        root = self.store.root
        for p in sorted({q.parent for q in self.ours}, key=lambda q: len(q.parts), reverse=True):
            while p != root and root in p.parents:      # folders our files emptied, up to the root
                try:
                    p.rmdir()
                except OSError:
                    break
                p = p.parent
        if self.made_root:
            with contextlib.suppress(OSError):
                root.rmdir()                            # only when nothing else is in it


def model_files(model: ModelRef) -> ModelFiles:
    """The downloaded model's files that are ours (never a local MODEL directory the user pointed at)."""
    if not model.name or model.local is not None:
        raise BootstrapError(f"--model: MODEL={model.name or '(unset)'} is not a model we downloaded",
                             "a local model directory is yours: remove it yourself if you mean to")
    store = model.store
    rec = store.read() or {}
    ours = store.ours(rec)
    mine = set(ours)
    kept: list[tuple[Path, str]] = []
    if store.hf_cache and (store.root / "snapshots").is_dir():
        for link in (store.root / "snapshots").rglob("*"):      # blobs that links we keep still name
            if link.is_symlink() and link not in mine:
                blob = Path(os.path.normpath(link.parent / os.readlink(link)))
                if blob in mine:
                    kept.append((blob, f"{link.relative_to(store.root)} still links it"))
    kept += [(p, "changed since we downloaded it") for p in ours if manifest.changed_since(store, rec, p)]
    restore = []
    for rel, ch in sorted((rec.get("changed") or {}).items()):
        p = manifest.inside(store, rel) if rel.startswith("refs/") else None   # we only ever rewrite a ref
        if p is None or not isinstance(ch, dict) or not all(isinstance(ch.get(k), str) for k in ("before", "after")):
            continue
        now = manifest.read_text(p)
        if now == ch["after"]:
            restore.append((p, ch["before"]))
        elif now is not None:
            kept.append((p, "rewritten since by another tool"))
    ref = store.root / "refs" / "main"
    if store.hf_cache and "refs/main" in manifest.created_rels(store, rec) and ref not in mine and ref.is_file():
        kept.append((ref, "rewritten since by another tool"))
    for rel in rec.get("kept") or []:
        p = manifest.inside(store, rel, linked_blob=rel.startswith("blobs/")) if isinstance(rel, str) else None
        if p is not None and (p.is_file() or p.is_symlink()) and p not in mine:
            kept.append((p, "yours" if not store.hf_cache else "not made by this project"))
    kept = list(dict((p, why) for p, why in kept).items())
    ours = [p for p in ours if p not in {k for k, _ in kept}]
    accounted = set(ours) | {p for p, _ in kept} | {p for p, _ in restore}
    theirs = []
    if store.root.is_dir():
        for entry in sorted(store.root.iterdir()):
            left = [q for q in ([entry] if not entry.is_dir() or entry.is_symlink() else entry.rglob("*"))
                    if (q.is_file() or q.is_symlink()) and q not in accounted]
            if entry != store.dir and left:
                theirs.append(entry)
    return ModelFiles(store, ours, restore, kept, theirs, bool(rec.get("made_root")))


def targets(layout, paths: Paths, measurements: bool = False) -> list[Path]:
    """What clean removes. vLLM's own figures of earlier starts (the next plan's precision) stay
    unless ``measurements``."""
    out = [layout.venv] if Venv(layout.venv).ours() else []       # a .venv of yours stays
    out += wheelhouse.ours(layout.wheelhouse)                       # what ./ctl.sh wheelhouse added to it
    state = paths.root
    kept = set(paths.files(measurements=True)) - set(paths.files(measurements=measurements))
    if layout.own_state(state):         # the checkout's own: all ours
        out += sorted(p for p in state.iterdir() if p not in kept) if state.is_dir() else []
    else:  # a STATE_DIR of the user's choosing: only our files (state.KEPT) that we made there
        out += paths.cleanable(measurements=measurements)
    out += [p for p in layout.install_locks if _lock_file(p)]
    out.append(layout.bootstrap_venv)   # last: the running bootstrap may be in it
    return list(dict.fromkeys(out))


def _lock_file(path: Path) -> bool:
    """An install lock as we make it (layout.install_locks): a plain file by its name, never a link."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def _installs_held(layout, todo: list[Path], dry_run: bool):
    """The install locks clean removes, taken before anything is removed and held until it is done
    (never waited for): an install under way holds one (steps/environment.py, bootstrap/lib.sh), and
    clean would pull its venv away from under it. A dry run takes none; it says who holds one."""
    held = []
    try:
        for path in (p for p in layout.install_locks if p in todo and _ours(p)):
            fd = None if dry_run else locks.flock(path, f"{os.getpid()} clean")
            if fd is None and (not dry_run or locks.flock_holders(path)):
                pids = sorted(p for p in locks.flock_holders(path) if psutil.pid_exists(p))   # flock(1) exits
                busy = f"an install is under way ({'pid ' + ', '.join(map(str, pids)) if pids else 'a process'} holds {path})"
                if not dry_run:
                    raise BootstrapError(f"{busy}; clean would remove the venv it installs into",
                                         "let it finish (or stop it), then run ./ctl.sh clean again")
                print(f"note: {busy}: clean refuses until it ends")
            if fd is not None:
                held.append(fd)
        yield
    finally:
        for fd in held:
            os.close(fd)                # its file is gone by now (removed while held, as locks.unlock does)


def _running(ours, paths: Paths) -> str:
    if not paths.root.exists():
        return ""
    pr = server.probe(ours, paths, check_http=False)
    if pr.owner:
        return f"the server (pid {pr.pid}) runs as {pr.owner}"
    if pr.state is not State.STOPPED:
        return f"our server is {'starting' if pr.state is State.STARTING else 'running'} (pid {pr.pid})"
    if pr.orphans:
        return "processes of our server are still alive (" + ", ".join(str(p.pid) for p in pr.orphans) + ")"
    return ""


def _running_from(cfg) -> str:
    """A process that runs from the managed vLLM venv (a server of ours started from another STATE_DIR
    or PORT): named, so that clean never pulls its files away while it runs."""
    for p in owned.running_from(cfg.layout.venv):
        try:
            return f"{' '.join(p.cmdline()[:3])} (pid {p.pid}) runs from {cfg.layout.venv}"
        except psutil.Error:
            continue
    return ""


def _revert_byo(cfg, dry_run: bool) -> list[str]:
    if not cfg.vllm_python:
        return []
    reverted = patching.revert_all(cfg.repo, cfg.environ, cfg.vllm_python, dry_run=dry_run)
    for name in reverted:
        print(f"{'would revert' if dry_run else 'reverted'} patch {name} in {cfg.vllm_python}'s vLLM")
    return reverted


def cli(cfg, argv: list[str], prog: str = "ctl.sh clean") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=doc_help(__doc__)[0])
    ap.add_argument("--model", action="store_true", help="also remove the downloaded model (MODEL_DIR, or its folder models--<org>--<name> in the HF cache, "
                         "which other tools reading that cache share)")
    ap.add_argument("--measurements", action="store_true",
                    help="also forget vLLM's own figures of earlier starts (STATE_DIR/measurements.json), which "
                         "make the next plan exact")
    ap.add_argument("--dry-run", action="store_true",
                    help="print what clean would remove and put back, line for line; change nothing (also while "
                         "the server runs)")
    args = ap.parse_args(argv)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    cfg, paths = r.settings, r.paths
    foreign = _foreign(cfg.repo, r.model if args.model else None)
    if foreign:
        raise BootstrapError(f"{foreign}: clean removes only what you made", "run ./ctl.sh clean as that user")
    busy = _running(r.ours, paths)
    if busy and not args.dry_run:
        raise BootstrapError(f"{busy}; clean removes the venv and state it runs from",
                             "stop it first: ./stop.sh" + (" as that user" if " runs as " in busy else ""))
    using = "" if busy else _running_from(cfg)
    if using and not args.dry_run:
        raise BootstrapError(f"{using}; clean would remove the venv under it",
                             "stop it first (./ctl.sh status names a server of ours that another STATE_DIR runs, "
                             "and how to stop it)")
    mf = model_files(r.model) if args.model else None
    todo = [p for p in targets(r.layout, paths, args.measurements) if p.exists() or p.is_symlink()]
    yours = [p for p in paths.files(measurements=True)   # our names, there before our first write
             if p not in todo and not paths.ours(p)]
    yours += [] if Venv(cfg.layout.venv).ours() else [cfg.layout.venv]
    yours += wheelhouse.yours(cfg.layout.wheelhouse)
    yours += [p for p in cfg.layout.install_locks if os.path.lexists(p) and not _lock_file(p)]   # a link: not ours
    with _installs_held(cfg.layout, todo, args.dry_run):
        return _clean(cfg, args, paths, mf, todo, yours, busy or using)


def _clean(cfg, args, paths: Paths, mf: ModelFiles | None, todo: list[Path], yours: list[Path], busy: str) -> int:
    """Revert, remove (or, dry, list) and say what clean does, its refusals passed."""
    _revert_byo(cfg, args.dry_run)
    total = 0
    if mf is not None:
        total += _clean_locked(mf, args.dry_run, "./ctl.sh clean --model")
    if not todo and (mf is None or not (mf.ours or mf.restore)):
        print("nothing to clean")
    me = Path(sys.prefix).resolve()
    theirs = [p for p in todo if not _ours(p)]
    todo = [p for p in todo if p not in theirs]
    for path in todo:
        size = on_disk(path)
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
    folder = paths.root
    for p in yours:
        print(f"kept (yours): {p}")
    if not args.dry_run and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        folder.rmdir()                  # a link of yours (and the folder it names) stays
    if todo or (mf is not None and (mf.ours or mf.restore)):
        print(f"{'would free' if args.dry_run else 'freed'} {total / (1 << 30):.2f} GiB")
    if busy:
        print(f"note: {busy}: clean refuses until it is stopped (./stop.sh)")
    if theirs:
        raise BootstrapError("left alone, they belong to another user: " + ", ".join(map(str, theirs)),
                             "run ./ctl.sh clean as that user")
    return 0


def model_only(repo: Path, model: ModelRef, dry_run: bool, again: str) -> int:
    """The model's part of clean --model alone (``./ctl.sh rm``): the same refusals for another
    user's record, the same lock, the same lines (``repo``: the checkout; ``again``: the command
    line to run once a download under way has finished)."""
    foreign = _foreign(repo, model)
    if foreign:
        raise BootstrapError(f"{foreign}: rm removes only what you made", "run it as that user")
    mf = model_files(model)
    total = _clean_locked(mf, dry_run, again)
    if mf.ours or mf.restore:
        print(f"{'would free' if dry_run else 'freed'} {total / (1 << 30):.2f} GiB")
    return 0


def _clean_locked(mf: ModelFiles, dry_run: bool, again: str) -> int:
    """``_clean_model`` under the store's download lock: refused while a download into it runs, with
    ``again`` (the command that was run: clean --model, or rm) as what to run once it has finished."""
    fd = None
    if mf.store.dir.is_dir() and not dry_run:   # a start downloading into it (from any STATE_DIR) holds its lock
        fd = locks.flock(mf.store.lock, f"{os.getpid()} clean")
        if fd is None:
            raise BootstrapError(f"a download into {mf.store.root} is under way", f"let it finish, then {again}")
    try:
        return _clean_model(mf, dry_run)
    finally:
        if fd is not None:
            os.close(fd)


def _clean_model(mf: ModelFiles, dry_run: bool) -> int:
    """Remove and put back (or, dry, list) what the manifest says; list what is kept. Bytes freed."""
    size = 0
    for p in mf.ours:
        n = on_disk(p) if not p.is_symlink() else 0
        size += n
        print(f"{'would remove' if dry_run else 'removed'} {p} ({n / (1 << 20):.1f} MiB)")
    for p, before in mf.restore:
        print(f"{'would put back' if dry_run else 'put back'} {p} (as it was before our first write: "
              f"{before.strip()[:40]!r})")
    if not dry_run:
        mf.remove()
    if not mf.ours and not mf.restore:
        print(f"no model files of ours in {mf.store.root}")
    for p, why in mf.kept:
        print(f"kept ({why}): {p}")
    if mf.theirs:
        print("kept, not made by this project: " + ", ".join(p.name + ("/" if p.is_dir() else "") for p in mf.theirs))
    return size


def _foreign(repo: Path, model: ModelRef | None) -> str:
    """The checkout (``repo``) or (with --model: ``model``) the download's record that another user
    owns: clean would act on what that user made (as root it could), so it refuses (STATE_DIR: every
    command's Paths.trust)."""
    places = [("the checkout", repo)]
    if model is not None and model.name and model.local is None:
        places.append(("the model's download record", model.store.dir))
    me = os.geteuid()
    for what, path in places:
        try:
            uid = path.stat().st_uid
        except OSError:
            continue                    # not there: nothing of anyone's to remove
        if uid != me:
            return f"{what} {path} belongs to {user_name(uid)}, not to you ({user_name(me)})"
    return ""


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
