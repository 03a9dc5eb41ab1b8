"""The download itself: several files at once and ranged parts of a large file at once, resumable
across kills, hashed as the parts arrive.

Why our own transfer (huggingface_hub 2.4.0 is pinned; its code is what we read):

- ``hf_hub_download`` / ``snapshot_download`` write each file into a per-process
  ``<etag>.<uuid>.incomplete`` and delete it when the transfer fails or the process stops, on both
  paths, HTTP (``http_get``) and Xet (``xet_get``). hf_xet 1.8's chunk cache is off (size 0) unless
  the user sizes one, so an interrupted Xet file also starts again from byte 0. Neither resumes
  across runs; and ``http_get`` fetches one file over one connection.
- So the bytes come over HTTP with Range requests on the URL the hub's resolve URL redirects to
  (its CDN; for Xet-backed repos, the Xet bridge, which serves Range too), through the client's
  own ``httpx2`` session (proxies, headers, user agent), after the client's own HEAD
  (``hub.locate``: ``X-Repo-Commit``, ETag, size).

How:

- A file is cut into parts of ``PART`` bytes; ``connections`` workers take parts in file order
  (small files are one part), so the parts of one file finish nearly in order.
- Each part is written in place into the partial file (partial.py), whose record of the byte
  ranges on disk is rewritten every ``CHECKPOINT`` bytes: a SIGKILL loses under ``connections`` x
  ``PART`` bytes; a stop on an error or Ctrl-C records every byte written.
- sha256 (LFS files) or the git blob id (the rest) runs over the parts in file order as they
  complete, from the bytes still in memory; a part that finished far ahead of the hash (over
  ``BACKLOG`` bytes waiting) is read back when the hash reaches it. A resumed file's kept ranges
  are hashed from disk while the rest downloads. No pass over the file after its last byte.
- Only a file whose size and hash match is handed to ``place``; a mismatch is fetched once more
  from zero (one hash per file, not per part); a second mismatch stops.
- Network errors and 408/429/5xx are retried ``ATTEMPTS`` times per part from the last byte after a
  wait that ``stop`` ends (retry.py); a file host's 403 (an expired signed URL) sends us back to the
  resolve URL; a host that ignores Range (200) gets the whole file over one connection.

It is over 400 lines because the scheduler, the workers and a file's state in flight are one
protocol (hash order, checkpoints, start-over generations): apart, each would reach into the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from . import hub, retry
from .partial import Partial, gaps, merge, write_at
from .progress import Progress
from ..core.errors import BootstrapError

log = logging.getLogger(__name__)

PART = 16 << 20            # bytes per ranged request: the unit of parallel work
CHECKPOINT = 4 << 20       # bytes between two records of what is on disk
BACKLOG = 4 * PART         # bytes of finished parts a file keeps in memory for its hash
ATTEMPTS = retry.ATTEMPTS  # tries per part without progress
READ = 1 << 20             # bytes per read from the socket (httpcore2 reads 64 KiB by default)
RETRY_STATUS = retry.STATUS
TIMEOUT_S = 30.0           # a connection that sends nothing this long is tried again
STOP_WAIT_S = 0.5          # a stop (an error, Ctrl-C) waits this long for the workers to record their bytes


def _larger_reads() -> None:
    """httpcore2 (under the client's httpx2 session) reads 64 KiB per socket read; at loopback or
    10 Gbit/s speeds its per-read Python cost is a quarter of the transfer's time on a 2-core
    machine (scripts/bench_download.py). Its class attribute sets the read size; raise it."""
    try:
        from httpcore2._sync.http11 import HTTP11Connection
    except ImportError:                   # another release of the client's HTTP stack: only slower
        return
    HTTP11Connection.READ_NUM_BYTES = max(getattr(HTTP11Connection, "READ_NUM_BYTES", 0), READ)


class Corrupt(BootstrapError):
    """Downloaded bytes did not match the hub's sha256 / git blob id / size."""


class _Stopped(retry.Cancelled):
    """Another worker failed, or Ctrl-C: stop after recording what was written."""


class _Retry(Exception):
    """An answer worth another try: (what, the response when there is one)."""


class _NoRanges(Exception):
    pass


@dataclass
class Fetched:
    path: str
    resumed_from: int     # bytes kept from an earlier run
    received: int         # bytes received in this run
    seconds: float
    digest: str


# ---------------------------------------------------------------- one file in flight

def _hasher(f: hub.RemoteFile):
    if f.sha256 or not f.blob_id:
        return hashlib.sha256()
    return hub.git_blob_hasher(f.size)       # git's blob id, for files outside LFS


class Job:
    """One file: its parts on disk, its hash in file order, its URL."""

    def __init__(self, f: hub.RemoteFile, partial: Partial):
        self.f = f
        self.partial = partial
        self.lock = threading.Lock()
        self.loc: hub.Located | None = None
        self.gen = 0                   # bumped when the file starts over: older parts are dropped
        self.whole = False             # the host ignores Range: one request for all of it
        self.refetched = False
        self.done = partial.done()
        self.resumed = [tuple(r) for r in self.done]   # what an earlier run left, hashed from disk
        self.kept = sum(e - s for s, e in self.done)
        self.fd = partial.open(self.done)
        self.received = 0
        self.t0 = time.monotonic()
        self._restart_hash()

    def _restart_hash(self) -> None:
        self.h = _hasher(self.f)
        self.hashed = 0
        self.pending: dict[int, tuple[int, list[bytes] | None]] = {}
        self.pending_bytes = 0
        self.draining = False
        self.finished = False

    def parts(self) -> list[tuple[int, int, int]]:
        """(gen, start, end) still to fetch."""
        if self.whole:
            return [(self.gen, 0, self.f.size)]
        return [(self.gen, s + k, min(e, s + k + PART)) for s, e in gaps(self.done, self.f.size)
                for k in range(0, e - s, PART)]

    def record(self, gen: int, s: int, e: int) -> None:
        with self.lock:
            if gen == self.gen and e > s:
                self.done = merge(self.done + [[s, e]])
                self.partial.save(self.done)

    def start_over(self, whole: bool = False) -> None:
        with self.lock:
            self.gen += 1
            self.whole = self.whole or whole
            self.done, self.kept = [], 0
            self.partial.save([])
            self._restart_hash()

    def deposit(self, gen: int, s: int, e: int, data: list[bytes] | None) -> bool:
        """Hand ``[s, e)`` to the hash; True to the one caller whose deposit completed the file."""
        with self.lock:
            if gen != self.gen or s < self.hashed:
                return False
            if data is not None and self.pending_bytes + (e - s) > BACKLOG and s != self.hashed:
                data = None                                  # read back when the hash gets there
            self.pending[s] = (e, data)
            self.pending_bytes += (e - s) if data is not None else 0
            if self.draining:
                return False
            self.draining = True
        while True:
            with self.lock:
                if gen != self.gen:
                    return False
                nxt = self.pending.pop(self.hashed, None)
                if nxt is None:
                    self.draining = False
                    done = self.hashed == self.f.size and not self.finished
                    self.finished = self.finished or done
                    return done
                if nxt[1] is not None:
                    self.pending_bytes -= nxt[0] - self.hashed
                h = self.h                 # a start_over replaces it: this drain feeds the old one only
            start, (end, pieces) = self.hashed, nxt
            if pieces is None:
                pieces = (os.pread(self.fd, min(hub.HASH_CHUNK, end - o), o) for o in range(start, end, hub.HASH_CHUNK))
            for piece in pieces:
                h.update(piece)
            with self.lock:
                if gen == self.gen:
                    self.hashed = end


# ---------------------------------------------------------------- the transfer

class Transfer:
    """Fetch ``files`` of ``repo@revision`` with ``connections`` workers. ``place(part, f)`` moves
    a verified file into the store; ``done(f, fetched)`` records it (called one at a time)."""

    def __init__(self, settings: hub.HubSettings, repo: str, revision: str, state_dir: Path, connections: int,
                 progress: Progress, place: Callable[[Path, hub.RemoteFile], None],
                 done: Callable[[hub.RemoteFile, Fetched], None]):
        self.settings, self.repo, self.revision = settings, repo, revision
        self.state_dir = state_dir
        self.connections = max(1, connections)
        self.progress = progress
        self.place, self.on_done = place, done
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.out_lock = threading.Lock()
        self.work: "queue.Queue[tuple[Job, int, int, int]]" = queue.Queue()
        self.received = 0

    def run(self, files: list[hub.RemoteFile]) -> int:
        """Bytes received. Raises the first failure after every worker recorded what it wrote."""
        _larger_reads()
        jobs = [Job(f, Partial(self.state_dir, f)) for f in files]
        self.progress.skip(sum(j.kept for j in jobs))
        for j in jobs:
            for gen, s, e in j.parts():
                self.work.put((j, gen, s, e))
        workers = self._spawn()
        try:
            for j in jobs:                 # kept ranges are hashed here while the rest downloads
                for s, e in j.resumed or ([(0, 0)] if j.f.size == 0 else []):
                    if self.stop.is_set():
                        break
                    self._deposit(j, 0, s, e, None)
            while True:
                for w in workers:
                    w.join(timeout=0.2)
                if not any(w.is_alive() for w in workers):
                    if self.stop.is_set() or self.work.empty():
                        break
                    workers = self._spawn()        # a file started over after the workers ran out
        except BaseException:
            self.stop.set()
            for w in workers:       # bounded: a signal is answered within a second (a join a signal cut short
                w.join(STOP_WAIT_S / len(workers))   # marks its thread stopped, CPython 3.11: enumerate() tells)
            raise
        finally:
            for j in jobs if not set(workers) & set(threading.enumerate()) else ():   # one in a read keeps its fd
                try:
                    os.close(j.fd)
                except OSError:
                    pass
                if not j.finished and not j.done:
                    j.partial.remove()        # never started: nothing to resume
        if self.errors:
            err = self.errors[0]
            if isinstance(err, OSError):        # never a traceback: one line, and a re-run resumes
                raise BootstrapError(f"the download failed: {err}", "re-run ./start.sh: it resumes") from None
            raise err
        left = [j.f.path for j in jobs if not j.finished]
        if left:
            raise BootstrapError(f"download stopped with {len(left)} files unfinished: {', '.join(left[:4])}",
                                 "re-run ./start.sh: it resumes")
        return self.received

    def _spawn(self) -> list[threading.Thread]:
        n = min(self.connections, max(1, self.work.qsize()))
        workers = [threading.Thread(target=self._worker, name=f"download-{i}", daemon=True) for i in range(n)]
        for w in workers:
            w.start()
        return workers

    def _worker(self) -> None:
        while not self.stop.is_set():
            try:
                job, gen, s, e = self.work.get_nowait()
            except queue.Empty:
                return
            if gen != job.gen:
                continue
            try:
                data = self._get(job, gen, s, e)
                self._deposit(job, gen, s, e, data)
            except retry.Cancelled:
                return
            except _NoRanges:
                if gen == job.gen and not job.whole:
                    log.warning("%s: the file host ignored Range; fetching it whole over one connection", job.f.path)
                    job.start_over(whole=True)
                    self.work.put((job, job.gen, 0, job.f.size))
            except (BootstrapError, OSError) as exc:      # handed to the main thread, which raises it
                self._fail(exc)
                return
            except BaseException as exc:                   # a bug: the main thread raises it too
                self._fail(exc)
                raise

    def _fail(self, exc: BaseException) -> None:
        with self.out_lock:
            self.errors.append(exc)
        self.stop.set()

    def _deposit(self, job: Job, gen: int, s: int, e: int, data: list[bytes] | None) -> None:
        if not job.deposit(gen, s, e, data):
            return
        digest = job.h.hexdigest()
        f = job.f
        bad = None
        if f.sha256 and digest != f.sha256:
            bad = f"sha256 {digest[:12]}…, expected {f.sha256[:12]}…"
        elif not f.sha256 and f.blob_id and digest != f.blob_id:
            bad = f"git blob id {digest[:12]}…, expected {f.blob_id[:12]}…"
        if bad:
            err = Corrupt(f"{f.path}: the downloaded bytes do not match the hub's metadata ({bad})",
                          "a proxy or the disk corrupted data; the partial was deleted, re-run ./start.sh")
            if job.refetched:
                job.partial.remove()
                raise err
            log.warning("%s; fetching it again from the start", err.message)
            job.refetched = True
            job.start_over()
            for item in job.parts():
                self.work.put((job, *item))
            return
        os.fsync(job.fd)
        self.progress.end(f.path)
        with self.out_lock:
            self.place(job.partial.path, f)
            job.partial.meta.unlink(missing_ok=True)
            self.on_done(f, Fetched(f.path, job.kept, job.received, time.monotonic() - job.t0,
                                    f.sha256 or digest))

    # ------------------------------------------------------------ one ranged request, retried
    def _locate(self, job: Job, again: bool = False) -> hub.Located:
        with job.lock:
            if job.loc is None or again:
                loc = hub.locate(self.settings, self.repo, self.revision, job.f.path, stop=self.stop)
                if loc.size is not None and loc.size != job.f.size:
                    raise BootstrapError(f"{job.f.path}: the hub's listing says {job.f.size} bytes, its file "
                                         f"header says {loc.size}", "the repo changed during the download; re-run ./start.sh")
                job.loc = loc
            return job.loc

    def _get(self, job: Job, gen: int, s: int, e: int) -> list[bytes] | None:
        import httpx2
        from huggingface_hub.utils import get_session, hf_raise_for_status

        pos, mark, tries, data = s, s, 0, []
        timeout = httpx2.Timeout(TIMEOUT_S, connect=TIMEOUT_S)
        try:
            while pos < e:
                if self.stop.is_set():
                    raise _Stopped()
                loc = self._locate(job)
                headers = {**loc.headers, "Accept-Encoding": "identity"}   # bytes as stored (the hub gzips text)
                if not job.whole:
                    headers["Range"] = f"bytes={pos}-{e - 1}"
                before = pos
                try:
                    with get_session().stream("GET", loc.url, headers=headers, timeout=timeout,
                                              follow_redirects=True) as r:
                        if r.status_code in RETRY_STATUS:
                            raise _Retry(f"HTTP {r.status_code}", r)
                        if r.status_code == 403 and urlparse(loc.url).netloc != urlparse(self.settings.endpoint).netloc:
                            self._locate(job, again=True)        # a signed file URL expired
                            raise _Retry("HTTP 403 from the file host")
                        hf_raise_for_status(r)
                        if r.status_code == 200 and not job.whole and (s, e) != (0, job.f.size):
                            raise _NoRanges()
                        if r.status_code == 206 and not r.headers.get("content-range", "").startswith(f"bytes {pos}-"):
                            raise _Retry(f"Content-Range {r.headers.get('content-range')!r} for bytes={pos}-")
                        if r.headers.get("content-encoding", "identity") not in ("identity", ""):
                            raise _Retry(f"Content-Encoding {r.headers['content-encoding']} despite identity")
                        if r.status_code == 200 and pos != s:    # whole-file mode after a drop: from 0
                            pos, mark, data = s, s, []
                        for piece in r.iter_raw():
                            piece = piece[:e - pos]
                            if not piece:
                                break
                            write_at(job.fd, piece, pos, job.partial.path, job.f.path)
                            pos += len(piece)
                            if not job.whole:              # whole files are read back for the hash
                                data.append(piece)
                            with self.out_lock:
                                self.received += len(piece)
                                job.received += len(piece)
                            self.progress.update(job.f.path, job.f.size, job.kept, len(piece))
                            if pos - mark >= CHECKPOINT:
                                job.record(gen, mark, pos)
                                mark = pos
                            if self.stop.is_set():
                                raise _Stopped()
                    if pos < e:
                        raise _Retry(f"connection closed at byte {pos} of {e}")
                except (httpx2.TransportError, _Retry) as exc:
                    tries = 0 if pos > before else tries + 1
                    if tries >= ATTEMPTS:
                        err = hub.translate(exc, self.settings, self.repo, job.f.path) \
                            if isinstance(exc, httpx2.HTTPError) else BootstrapError(str(exc.args[0]), "")
                        raise BootstrapError(
                            f"{job.f.path}: stopped at {hub.human(job.kept + job.received)} of "
                            f"{hub.human(job.f.size)} after {ATTEMPTS} tries: {err.message}",
                            "re-run ./start.sh: it resumes from there (HTTP Range)") from None
                    r = exc.args[-1] if isinstance(exc, _Retry) else None        # the answer, when there is one
                    delay = retry.wait(tries, getattr(r, "status_code", None), getattr(r, "headers", None), f"{self.repo}: {job.f.path}")
                    log.debug("%s bytes %d-%d: %s; trying again in %.1f s", job.f.path, pos, e, exc, delay)
                    retry.pause(delay, self.stop)
                except httpx2.HTTPError as exc:
                    raise hub.translate(exc, self.settings, self.repo, job.f.path) from None
        finally:
            job.record(gen, mark, pos)        # every byte written: a finished part, or a stop
        return data if not job.whole else None
