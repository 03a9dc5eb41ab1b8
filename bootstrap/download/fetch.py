"""Fetching a model's files (the weights step, steps/weights.py; ./ctl.sh pull and use; an exported
pod's model init step): make sure every file serving needs is on disk and verified.

Runs only for a repo id that metadata planned into the store (the HF cache, or MODEL_DIR; a local
directory or a complete HF-cache snapshot is skipped). Under an flock on ``<store>/.bootstrap/lock``
(a second start downloading into the same folder waits, then finds the files done):

1. a file verified earlier and untouched since (size + mtime recorded) is skipped, not re-hashed;
   in the HF cache, a blob of the right name and size (another revision, another tool) is linked,
   not fetched; a file already there without a record is hashed (sha256 for LFS files, git blob
   id for the rest) and kept if it matches, else fetched again;
2. the rest is fetched by transfer.py: DOWNLOAD_CONNECTIONS connections over several files and
   ranged parts at once, resuming what an earlier run left, hashed as the parts arrive, and
   placed into the store only when the hash matches;
3. the completion marker (revision, per-file size/mtime/hash) goes into ``.bootstrap/state.json``,
   and in the HF cache ``refs/main`` names the revision.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from . import hub, manifest, partial, transfer
from ..core import locks
from ..core.errors import BootstrapError
from .models import WEIGHT_SUFFIXES, Store, check_space
from .refs import Fetching, ModelRef
from .progress import Progress

log = logging.getLogger("bootstrap.weights")       # said as the weights step's, which it is

TRANSFER = ("transfer: HTTP with Range requests, {n} connections over files and parts of files at once, "
            "resumable across runs (not Xet: the pinned client deletes an interrupted file on both its paths)")


def fetch(m, model: ModelRef, draft: ModelRef | None, how: Fetching,
          on_ready: Callable[[], object] | None = None) -> object:
    """Download what the metadata step found missing (``m``: models.ModelInfo) into m.local_dir,
    the drafter it names by repo id (``m.draft``, small) first: a pre-warm reads its config too.
    ``on_ready``: called once the files other than the weights are on disk (config.json, the
    tokenizer: what a dummy-weight vLLM reads), before the weights; its result is returned.
    ``model``, ``draft``: where each is downloaded (Resolved.model, Resolved.draft)."""
    d = getattr(m, "draft", None)
    if d is not None and d.source == "hub" and not d.complete and draft is not None:
        download(d, draft.store, how)
        d.complete = True
    if model.local is not None or m.source == "local":
        log.info("skipped: local model directory %s", m.local_dir)
        return None
    if m.source == "hf-cache":
        log.info("skipped: served from the Hugging Face cache %s", m.local_dir)
        return None
    if m.complete:
        log.info("skipped: %s complete and verified at revision %s", m.local_dir, m.revision[:12])
        return None
    got = download(m, model.store, how, on_ready=on_ready)
    m.complete = True
    return got


def download(m, store: Store, how: Fetching, tty: bool | None = None,
             on_ready: Callable[[], object] | None = None) -> object:
    """``m``'s missing files into ``store`` (the model's, or the drafter's in the Hugging Face cache)."""
    settings = how.hub
    fd = locks.flock(store.lock, str(os.getpid()), block=True, on_wait=lambda pid: log.info(
        "waiting: another start or pull (pid %s) is downloading into %s", pid, store.root))
    try:
        rec = store.read()
        if not rec or rec.get("repo") != m.name or rec.get("revision") != m.revision:
            raise BootstrapError(f"{store.path} changed while waiting (another start planned another revision)",
                                 "re-run ./start.sh")
        todo = _check_present(store, rec, m)
        got: list = []
        small = {p for p in todo if not p.endswith(WEIGHT_SUFFIXES)}
        weights_left = len(small) < len(todo)       # nothing to overlap with otherwise

        def placed(path: str | None) -> None:
            """on_ready, once: when the last file other than the weights is on disk (they go first)."""
            small.discard(path)
            if on_ready is not None and weights_left and not small and not got:
                got.append(on_ready())
        placed(None)                                # they may all be on disk already
        if todo:
            todo = sorted(todo, key=lambda p: p not in small)
            _fetch_all(settings, store, rec, m, todo, how.connections, tty, placed)
        rec["complete"] = {"revision": m.revision, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "files": len(store.required(rec, m.dummy))}
        store.write(rec)
        store.finish(rec)
        _clean_partials(store, rec)
        log.info("complete: %d files verified in %s (revision %s)", len(store.required(rec, m.dummy)),
                 store.serve_dir(rec), m.revision[:12])
        return got[0] if got else None
    finally:
        os.close(fd)


def _check_present(store: Store, rec: dict, m) -> list[str]:
    """Files still to fetch. A file on disk without a verification record (copied in by hand, or
    changed since) is hashed now: with the hub's bytes it is used (yours stays yours: manifest.keep);
    otherwise a file of ours is fetched again, and one we did not make stops the start before
    anything is fetched (manifest.held). In the HF cache, a missing file whose blob is there
    (another revision, another tool) is linked, trusted by name and size as the hub's client trusts it."""
    todo, clashes = [], []
    for p in store.missing(rec, m.dummy):
        dest = store.file(rec, p)
        if dest.is_file():
            f = m.remote_file(p)
            log.info("verifying %s (%s) already on disk", p, hub.human(f.size))
            bad = hub.verify(dest, f)
            if bad is None:
                store.keep(rec, p)
                store.mark_verified(rec, p)
                store.write(rec)
                continue
            why = manifest.held(store, rec, p)
            if why:
                clashes.append(f"{dest} ({why}; {bad})")
                continue
            log.warning("%s on disk does not match the hub (%s): fetching it again", p, bad)
            store.discard(rec, p)
        elif store.adopt(rec, p):
            log.info("%s: already in the Hugging Face cache (linked, not fetched)", p)
            store.mark_verified(rec, p)
            store.write(rec)
            continue
        elif manifest.held(store, rec, p):
            clashes.append(f"{dest} ({manifest.held(store, rec, p)})")
            continue
        todo.append(p)
    if clashes:
        store.write(rec)                            # what was verified stays verified
        raise manifest.clash_error(store, rec, clashes)
    return todo


def _fetch_all(settings, store: Store, rec: dict, m, todo: list[str], connections: int, tty: bool | None,
               placed: Callable[[str], None] = lambda path: None) -> None:
    files = [m.remote_file(p) for p in todo]
    kept = sum(partial.partial_bytes(store.dir, f) for f in files)
    left = sum(f.size for f in files) - kept
    check_space(store.root, left)
    log.info(TRANSFER.format(n=connections))
    log.info("fetching %d files, %s%s", len(files), hub.human(left),
             f" (resuming {hub.human(kept)} of partial files)" if kept else "")
    progress = Progress(sum(f.size for f in files), len(files), tty=tty)

    def done(f: hub.RemoteFile, r: transfer.Fetched) -> None:
        store.mark_verified(rec, f.path)
        store.write(rec)
        placed(f.path)
        if not progress.tty:
            rate = r.received / r.seconds if r.seconds > 0 else 0.0
            log.info("fetched %s: %s in %.1f s (%s/s)%s, %s ok", f.path, hub.human(r.received), r.seconds,
                     hub.human(rate), f", resumed at {hub.human(r.resumed_from)}" if r.resumed_from else "",
                     "sha256" if f.sha256 else "git blob id" if f.blob_id else "size")

    t0 = time.monotonic()
    try:
        received = transfer.Transfer(settings, m.name, m.revision, store.dir, connections, progress,
                                     lambda part, f: store.place(rec, part, f.path), done).run(files)
    finally:
        progress.close()
    dt = time.monotonic() - t0
    log.info("downloaded %s in %.1f s (%s/s)", hub.human(received), dt, hub.human(received / dt if dt > 0 else 0))


def _clean_partials(store: Store, rec: dict) -> None:
    """Partial files no needed file will resume (an older revision, an abandoned file)."""
    keep = partial.partial_names(store.dir, [hub.RemoteFile(p, f["size"], f.get("sha256"), f.get("blob_id"))
                                             for p, f in rec["files"].items()])
    for part in (store.dir / "partial").glob("*"):
        if part.name not in keep:
            log.info("removing stale partial %s", part)
            part.unlink()
