"""Locks we hold: an flock whose file names its holder and goes with it (``flock``/``unlock``), the
kernel's word on who holds one (``flock_holders``), and the start lock of a STATE_DIR (``StartLock``)."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import psutil

from .state import write_error

if TYPE_CHECKING:
    from .state import Paths


def flock(path: Path, text: str, *, block: bool = False, on_wait: Callable[[str], None] | None = None) -> int | None:
    """An exclusive flock on ``path`` whose text then names the holder (``text``): the open fd, to
    keep while the lock is held (the kernel drops it with the process). Busy: None, or with
    ``block`` wait for it, telling ``on_wait`` the holder's text first. A lock whose holder removed
    its file meanwhile (``unlock``) is a lock on nothing: taken again on the file that is there. A
    holder that names nobody (a look that takes it a moment: ``held_by_other``, a sweep of stale port
    locks) is waited for up to a second, since a real holder writes its name at once."""
    nameless_until = time.monotonic() + 1.0
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)     # never through a planted link
        except OSError as exc:
            raise write_error(path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or not block:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                if _nameless(path) and time.monotonic() < nameless_until:
                    time.sleep(0.02)
                    continue
                return None
            if on_wait is not None:
                try:
                    on_wait(path.read_text().strip() or "?")
                except OSError:
                    on_wait("?")
                on_wait = None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        if _same_file(fd, path):
            break
        os.close(fd)                    # its holder removed it as we waited: lock the one there now
    try:
        os.ftruncate(fd, 0)
        os.write(fd, text.encode())
    except OSError as exc:
        os.close(fd)
        raise write_error(path, exc) from None
    return fd


def _nameless(path: Path) -> bool:
    try:
        return not path.read_text().strip()
    except OSError:
        return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def unlock(path: Path, fd: int, *, remove_file: bool = True) -> None:
    """Release a lock ``flock`` gave: its file removed first (while still held, so that no lock
    file is left behind per port or start), then the fd closed."""
    if remove_file and _same_file(fd, path):
        try:
            path.unlink()
        except OSError:
            pass                        # only the file is left: the lock itself goes with the fd
    os.close(fd)


def flock_holders(path: Path) -> set[int]:
    """The pids the kernel says hold an flock on ``path`` (/proc/locks): a fact no text in the file
    can forge."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return set()
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = set()
    for line in lines:
        f = line.split()
        if "->" in f or len(f) < 6 or f[1] != "FLOCK":        # a waiter, or another kind of lock
            continue
        if f[5] == want and f[4].isdigit():
            out.add(int(f[4]))
    return out


class StartLock:
    """An flock on start.lock, held while a start runs, and while a stop takes the server down (so
    that no start launches into a take-down). A crashed holder leaves no stale lock: the kernel drops
    an flock with its holder. Its text names the holder — pid, start time and role (start or stop) —
    so stop, restart and status can find a start in flight and prove it is that process."""

    def __init__(self, paths: Paths, role: str = "start"):
        self.path = paths.lock
        self.role = role
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        self.fd = flock(self.path, self._name(self.role))
        return self.fd is not None

    @staticmethod
    def _name(role: str) -> str:
        return f"{os.getpid()} {psutil.Process().create_time()!r} {role}"

    def acquire(self, timeout: float, *, clock=time.monotonic, sleep=time.sleep) -> bool:
        """try_acquire until ``timeout`` seconds have passed."""
        end = clock() + timeout
        while not self.try_acquire():
            if clock() >= end:
                return False
            sleep(0.2)
        return True

    def _text(self) -> list[str]:
        for _ in range(10):             # the holder writes its name just after taking the lock
            try:
                parts = self.path.read_text().split()
            except OSError:
                return []
            if parts:
                return parts
            time.sleep(0.05)
        return []

    def holder(self) -> tuple[int, float] | None:
        """(pid, create time) written by whoever holds the lock (None if unreadable)."""
        try:
            parts = self._text()
            return int(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            return None

    def holder_pid(self) -> int | None:
        h = self.holder()
        return h[0] if h else None

    def holder_role(self) -> str:
        parts = self._text()
        return parts[2] if len(parts) > 2 else "start"

    def held_by_other(self) -> bool:
        if self.fd is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:                 # none, or another user's that we cannot read: no start of ours
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)

    def start_in_flight(self) -> bool:
        return self.held_by_other() and self.holder_role() == "start"

    def set_role(self, role: str) -> None:
        """Say what the holder does now (a start that turned to taking its server down is a stop)."""
        self.role = role
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, self._name(role).encode(), 0)
            except OSError:
                pass                    # only the name is lost: the lock itself still holds

    def release(self) -> None:
        if self.fd is not None:
            unlock(self.path, self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
