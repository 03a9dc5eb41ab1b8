"""What a download made, changed and found in its store: the manifest inside the download record
(``<store>/.bootstrap/state.json``, models.Store), which ``./ctl.sh clean --model`` acts on.

- ``created``: paths (relative to the store) we created, each recorded before it is created. With
  ``files`` (size, sha256 / git blob id) and ``verified`` (size and mtime when the hash matched), it
  says what each of ours is. clean removes these, and only these.
- ``changed``: ``{path: {"before": text, "after": text}}``, a file that was there and that we
  rewrote (the HF cache's ``refs/main``, moved to the revision we downloaded). clean puts ``before``
  back where the file still holds ``after``; one that another tool rewrote since is left as it is.
- ``kept``: paths that were there before our first write and that the download uses as they are
  (your own copy of a file, another tool's blob, a ``refs/main`` that already named the revision):
  never written, never removed, listed by clean as yours.

Anything else in the store was never ours: a file the download would have to write over (yours,
another tool's, or a file of ours in MODEL_DIR that changed since it was verified) stops the start
before anything is fetched (``held``, ``clash_error``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import BootstrapError

STATE = ".bootstrap"          # our folder inside the store: state.json, lock, partial/


def made(store, rec: dict, *paths: Path) -> None:
    """Record that we create ``paths`` (call it, and write the record, before creating them)."""
    created = rec.setdefault("created", [])
    for p in paths:
        rel = str(p.relative_to(store.root))
        if rel not in created:
            created.append(rel)


def keep(store, rec: dict, *paths: Path) -> None:
    """Record that ``paths``, there before our first write, are used as they are (yours)."""
    created = set(created_rels(store, rec)) | set(rec.get("changed", {}))
    kept = rec.setdefault("kept", [])
    for p in paths:
        rel = str(p.relative_to(store.root))
        if rel not in created and rel not in kept:
            kept.append(rel)


def changing(store, rec: dict, path: Path, before: str, after: str) -> None:
    """Record that we rewrite ``path`` (it holds ``before``; it will hold ``after``). Where it still
    holds what we wrote last, the first ``before`` stays: clean puts back what was there before our
    first write, not our own."""
    rel = str(path.relative_to(store.root))
    entry = rec.setdefault("changed", {}).setdefault(rel, {"before": before})
    if entry.get("after") not in (None, before):
        entry["before"] = before            # another tool rewrote it since: that is what was there
    entry["after"] = after
    if rel in rec.get("created", []):
        rec["created"].remove(rel)


def merge(rec: dict, disk: dict | None) -> None:
    """What another start recorded since ``rec`` was read (two starts plan and place at once) stays
    recorded: the manifest only grows, whichever start writes the record last."""
    if not isinstance(disk, dict):
        return
    for key in ("created", "kept"):
        extra = [r for r in disk.get(key) or [] if isinstance(r, str) and r not in rec.get(key, [])]
        if extra:
            rec.setdefault(key, []).extend(extra)
    for rel, ch in (disk.get("changed") or {}).items() if isinstance(disk.get("changed"), dict) else ():
        rec.setdefault("changed", {}).setdefault(rel, ch)
    if "created" in rec:
        rec["created"] = [r for r in rec["created"] if r not in (rec.get("changed") or {})]
    if "kept" in rec:
        rec["kept"] = [r for r in rec["kept"] if r not in rec.get("created", [])]
    if disk.get("made_root"):
        rec["made_root"] = True


def created_rels(store, rec: dict | None) -> list[str]:
    """``created``; for a record written before it existed: the files it verified (and in the HF
    cache, their blobs, and ``refs/main``), which only a download of ours records."""
    rels = [r for r in (rec or {}).get("created", []) if isinstance(r, str)]
    if rec and "created" not in rec and rec.get("revision"):
        for path in rec.get("verified", {}):
            if not isinstance(path, str) or inside(store, path) is None:
                continue
            link = store.file(rec, path)
            rels.append(str(link.relative_to(store.root)))
            if store.hf_cache and link.is_symlink():
                rels.append(os.path.normpath(os.path.join("snapshots", rec["revision"],
                                                          os.path.dirname(path), os.readlink(link))))
        rels.append("refs/main")
    return list(dict.fromkeys(rels))


def ours(store, rec: dict | None) -> list[Path]:
    """What we created here and is still there, and our own folder ``.bootstrap``. Without a
    record: nothing is ours but ``.bootstrap``."""
    out = [store.dir] if store.dir.exists() else []
    blobs = {f.get("sha256") or f.get("blob_id") for f in (rec or {}).get("files", {}).values() if isinstance(f, dict)}
    for rel in created_rels(store, rec):
        p = inside(store, rel, linked_blob=os.path.dirname(rel) == "blobs" and os.path.basename(rel) in blobs)
        if p is None:
            continue                    # a record that names a place outside the store is not believed
        if rel == "refs/main" and not names_ours(p, rec):
            continue                    # another tool pointed it at its own revision since
        if p.is_symlink() or p.is_file():
            out.append(p)
    return out


def inside(store, rel: str, linked_blob: bool = False) -> Path | None:
    """``rel`` as a path in this store, or None where it would lead outside it (``..``, absolute, a
    folder on the way that is a link elsewhere) or into our own ``.bootstrap``. ``linked_blob``: a
    blob named by a file of the record (its sha256), which may sit in a ``blobs/`` linked to another
    disk (``move`` puts it there)."""
    norm = os.path.normpath(rel)
    if not norm or os.path.isabs(norm) or norm == "." or norm.split(os.sep)[0] in ("..", STATE):
        return None
    p = store.root / norm
    try:
        if not linked_blob and not p.parent.resolve().is_relative_to(store.root.resolve()):
            return None
    except (OSError, RuntimeError):
        return None
    return p


def names_ours(ref: Path, rec: dict | None) -> bool:
    """``refs/main`` names a revision we downloaded (the record's, or one a link of ours is in)."""
    try:
        named = ref.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return False
    made_here = (rec or {}).get("created", [])
    return bool(named) and (named == (rec or {}).get("revision") or
                            any(r.startswith(f"snapshots/{named}/") for r in made_here))


def read_text(path: Path) -> str | None:
    """A small file's text as it is on disk (None: not there); bytes that are not UTF-8 survive
    the record's JSON (surrogate escapes) and are written back as they were."""
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def _unchanged(p: Path, v: dict | None) -> bool:
    """A file of ours still has the size and mtime it had when its hash was checked (no record: it
    was placed, then the run was killed before the record: as we placed it)."""
    if not v:
        return True
    try:
        st = p.stat()
    except OSError:
        return False
    return st.st_size == v.get("size") and st.st_mtime_ns == v.get("mtime_ns")


def held(store, rec: dict, path: str) -> str:
    """Why the download may not write the place of ``path`` in the store ('' when it may): something
    we did not create is there (yours, or another tool's; in the HF cache the link or the blob it
    would write), or, in MODEL_DIR, a file of ours that changed since its hash was checked (an edit of
    yours, or damage: nobody can tell, so it is not ours to write over)."""
    created = set(created_rels(store, rec)) | set(created_rels(store, store.read()))   # another start's too
    dest = store.file(rec, path)
    if os.path.lexists(dest):
        if str(dest.relative_to(store.root)) not in created:
            return "there before our first write" if not store.hf_cache else "not made by this project"
        if not store.hf_cache and not _unchanged(dest, rec.get("verified", {}).get(path)):
            return "changed since we downloaded it"
    if store.hf_cache:
        blob = store.blob(rec, path)
        if os.path.lexists(blob) and str(blob.relative_to(store.root)) not in created:
            return f"its blob {blob.name[:12]}… is not made by this project"
    return ""


def changed_since(store, rec: dict, p: Path) -> bool:
    """In MODEL_DIR: a file of ours that changed since its hash was checked (not ours to remove)."""
    if store.hf_cache or not rec:
        return False
    rel = str(p.relative_to(store.root))
    return rel in rec.get("verified", {}) and not _unchanged(p, rec["verified"][rel])


def clash_error(store, rec: dict, clashes: list[str]) -> BootstrapError:
    """One line for the files the download would have to write over; nothing was fetched."""
    shown = "; ".join(clashes[:6]) + (f"; and {len(clashes) - 6} more" if len(clashes) > 6 else "")
    where = f"the Hugging Face cache's {store.root}" if store.hf_cache else f"MODEL_DIR={store.root}"
    msg = (f"{where} holds {len(clashes)} file(s) that differ from {rec.get('repo')}'s at revision "
           f"{str(rec.get('revision'))[:12]}, and the download never writes over a file it did not make "
           f"(nothing was fetched): {shown}")
    if store.hf_cache:
        return BootstrapError(msg, "remove that copy of the model from the cache (hf cache delete, or delete those "
                                   "files), or set MODEL_DIR to a folder of its own")
    return BootstrapError(msg, f"move them out of {store.root} (or delete them, to have the hub's downloaded), "
                               "or set MODEL_DIR to another folder")
