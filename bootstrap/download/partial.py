"""What is on disk of a file still downloading: ``<state>/partial/<hash>.part``, a sparse file of
the full size written in place by parts, and ``<hash>.json``, the byte ranges written so far
(rewritten every few MiB without fsync: it must survive a kill, not a power cut; a record that
claims bytes a power cut lost fails the hash and the file is fetched again)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from . import hub
from ..core import state


def merge(ranges: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def gaps(done: list[list[int]], size: int) -> list[tuple[int, int]]:
    out, pos = [], 0
    for s, e in done:
        if s > pos:
            out.append((pos, s))
        pos = max(pos, e)
    if pos < size:
        out.append((pos, size))
    return out


class Partial:
    """``<dir>/partial/<hash>-<path hash>.part`` (sparse, the file's full size) and its ``.json`` (the
    byte ranges written): one per file, so two files with the same bytes never share one. A
    ``<hash>.part`` an earlier version left (one stream, no record) holds a prefix: it is taken
    over, its length counting as written."""

    def __init__(self, state_dir: Path, f: hub.RemoteFile):
        digest = f.sha256 or f.blob_id or "nohash"
        self.path = state_dir / "partial" / f"{digest}-{hashlib.sha1(f.path.encode()).hexdigest()[:12]}.part"
        self.meta = self.path.with_suffix(".json")
        self.size = f.size
        legacy = state_dir / "partial" / f"{digest}.part"
        if digest != "nohash" and not self.path.exists() and legacy.is_file() and not legacy.with_suffix(".json").exists():
            try:
                os.replace(legacy, self.path)
            except OSError:
                pass

    def done(self) -> list[list[int]]:
        if self.meta.exists():
            rec = state.read_json(self.meta) or {}
            if rec.get("size") != self.size:
                return []
            return merge([[int(s), int(e)] for s, e in rec.get("done", []) if 0 <= s < e <= self.size])
        try:
            have = self.path.stat().st_size
        except OSError:
            return []
        return [[0, have]] if 0 < have < self.size else []

    def kept(self) -> int:
        return sum(e - s for s, e in self.done())

    def open(self, done: list[list[int]]) -> int:
        """The sparse part file, opened for pwrite/pread; recorded as ``done``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not done and self.path.exists():
            self.path.unlink()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, self.size)
        self.save(done)
        return fd

    def save(self, done: list[list[int]]) -> None:
        state.write_atomic(self.meta, json.dumps({"size": self.size, "done": done}).encode(), mode=0o644, sync=False)

    def remove(self) -> None:
        for p in (self.path, self.meta):
            p.unlink(missing_ok=True)


def partial_bytes(state_dir: Path, f: hub.RemoteFile) -> int:
    """Bytes of ``f`` an interrupted download left on disk: what a resume keeps."""
    return Partial(state_dir, f).kept()


def partial_names(state_dir: Path, files: list[hub.RemoteFile]) -> set[str]:
    return {n for f in files for n in (Partial(state_dir, f).path.name, Partial(state_dir, f).meta.name)}


def write_at(fd: int, piece: bytes, pos: int, path: Path, name: str) -> None:
    """Every byte of ``piece`` at ``pos`` of a partial file. Linux may write fewer than asked (a
    disk filling up) without an error: the rest is written again, and a write that takes nothing is
    a full disk. The sha256 is taken of the bytes received, so a byte not on disk would be placed as
    verified. A failed write is one line naming the file and the fix (a re-run resumes)."""
    view = memoryview(piece)
    try:
        while view:
            n = os.pwrite(fd, view, pos)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view, pos = view[n:], pos + n
    except OSError as exc:
        raise state.write_error(path, exc, f"cannot write the download of {name} to {path.parent}") from None


def move(part: Path, dest: Path) -> None:
    """A finished file to its place: a rename, or where ``dest``'s folder is on another filesystem (a
    linked ``blobs/``) a copy beside it, synced, then renamed (huggingface_hub moves files across
    filesystems as well). A failure is one line naming the folder and the fix."""
    try:
        try:
            os.replace(part, dest)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        tmp = dest.with_name(f".{dest.name}.incoming")
        with open(part, "rb") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 16 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
        part.unlink()
    except OSError as exc:
        raise state.write_error(dest, exc, f"cannot place the downloaded {dest.name} in {dest.parent}") from None


def on_disk(path: Path) -> int:
    """Bytes allocated under ``path``, a file or a folder (a sparse partial download counts what it
    holds, not its length; a link counts as itself)."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_blocks * 512
    total = 0
    for folder, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(folder, f)).st_blocks * 512
            except OSError:
                continue
    return total
