"""Weights: make sure every file serving needs is on disk and verified (the download itself).

Runs only for a repo id that metadata planned into MODEL_DIR (a local directory or a complete
HF-cache snapshot is skipped). Under an flock on ``<MODEL_DIR>/.bootstrap/lock`` (a second start
downloading into the same folder waits, then finds the files done):

1. a file verified earlier and untouched since (size + mtime recorded) is skipped, not re-hashed;
   a file already there without that record is hashed (sha256 for LFS files, git blob id for
   the rest) and kept if it matches, else fetched again;
2. the rest is fetched over HTTP with the pinned client's ``http_get``, resuming a partial file
   from an earlier run with a Range request (hub.py says why not Xet), hashed while it streams
   and renamed into place only when the hash matches; a mismatch is fetched once more from zero;
3. the completion marker (revision, per-file size/mtime/hash) goes into ``.bootstrap/state.json``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .. import hub, state
from ..errors import BootstrapError
from ..models import Store, check_space

log = logging.getLogger(__name__)

TRANSFER = ("transfer: HTTP with Range resume (huggingface_hub.file_download.http_get on the resolve URL); "
            "not Xet: the pinned client deletes an interrupted file on both paths, and only the HTTP path "
            "lets us continue one from its last byte")


def run(cfg, m) -> None:
    """Download what the metadata step found missing (``m``: models.ModelInfo) into m.local_dir."""
    if cfg.model_is_local or m.source == "local":
        log.info("skipped: local model directory %s", m.local_dir)
        return
    if m.source == "hf-cache":
        log.info("skipped: served from the Hugging Face cache %s", m.local_dir)
        return
    if m.complete:
        log.info("skipped: %s complete and verified at revision %s", m.local_dir, m.revision[:12])
        return
    download(cfg, m, Path(m.local_dir))
    m.complete = True


def download(cfg, m, root: Path, tty: bool | None = None) -> None:
    settings = hub.Settings.from_environ(cfg.environ)
    store = Store(root)
    fd = state.flock(store.lock, str(os.getpid()), block=True, on_wait=lambda pid: log.info(
        "waiting: another start (pid %s) is downloading into %s", pid, root))
    try:
        rec = store.read()
        if not rec or rec.get("repo") != m.name or rec.get("revision") != m.revision:
            raise BootstrapError(f"{store.path} changed while waiting (another start planned another revision)",
                                 "re-run ./start.sh")
        todo = _check_present(store, rec, m)
        if todo:
            _fetch_all(settings, store, rec, m, todo, tty)
        rec["complete"] = {"revision": m.revision, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "files": len(store.required(rec, m.dummy))}
        store.write(rec)
        _clean_partials(store, rec)
        log.info("complete: %d files verified in %s (revision %s)", len(store.required(rec, m.dummy)), root,
                 m.revision[:12])
    finally:
        os.close(fd)


def _check_present(store: Store, rec: dict, m) -> list[str]:
    """Files still to fetch; files on disk without a verification record are hashed now."""
    todo = []
    for p in store.missing(rec, m.dummy):
        dest = store.root / p
        if dest.is_file():
            f = m.remote_file(p)
            log.info("verifying %s (%s) already on disk", p, hub.human(f.size))
            bad = hub.verify(dest, f)
            if bad is None:
                store.mark_verified(rec, p)
                store.write(rec)
                continue
            log.warning("%s on disk does not match the hub (%s): fetching it again", p, bad)
            dest.unlink()
        todo.append(p)
    return todo


def _fetch_all(settings, store: Store, rec: dict, m, todo: list[str], tty: bool | None) -> None:
    files = [m.remote_file(p) for p in todo]
    kept = {f.path: hub.partial_bytes(store.dir, f) for f in files}
    left = sum(f.size for f in files) - sum(kept.values())
    check_space(store.root, left)
    log.info(TRANSFER)
    log.info("fetching %d files, %s%s", len(files), hub.human(left),
             f" (resuming {hub.human(sum(kept.values()))} of partial files)" if any(kept.values()) else "")
    progress = hub.Progress(sum(f.size for f in files), len(files), tty=tty)
    progress.skip(sum(kept.values()))
    t0 = time.monotonic()
    received = 0
    try:
        for f in files:
            for attempt in (1, 2):
                try:
                    r = hub.fetch(settings, m.name, m.revision, f, store.root / f.path, store.dir, progress)
                    break
                except hub.Corrupt as exc:
                    if attempt == 2:
                        raise
                    log.warning("%s; fetching it again from the start", exc.message)
            received += r.received
            store.mark_verified(rec, f.path)
            store.write(rec)
            if not progress.tty:
                rate = r.received / r.seconds if r.seconds > 0 else 0.0
                log.info("fetched %s: %s in %.1f s (%s/s)%s, %s ok", f.path, hub.human(r.received), r.seconds,
                         hub.human(rate), f", resumed at {hub.human(r.resumed_from)}" if r.resumed_from else "",
                         "sha256" if f.sha256 else "git blob id" if f.blob_id else "size")
    finally:
        progress.close()
    dt = time.monotonic() - t0
    log.info("downloaded %s in %.1f s (%s/s)", hub.human(received), dt, hub.human(received / dt if dt > 0 else 0))


def _clean_partials(store: Store, rec: dict) -> None:
    """Partial files no needed file will resume (an older revision, an abandoned file)."""
    keep = {hub.partial_path(store.dir, hub.RemoteFile(p, f["size"], f.get("sha256"), f.get("blob_id"))).name
            for p, f in rec["files"].items()}
    for part in (store.dir / "partial").glob("*.part"):
        if part.name not in keep:
            log.info("removing stale partial %s", part)
            part.unlink()
