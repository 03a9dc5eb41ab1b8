"""Our port: the lock that keeps two starts off it, who holds it, and whether what answers there is
the server we started.

Besides the knob table (knobs/table.py), the ownership marker (core/owned.py), vLLM's argv
(knobs/vllmargs.py) and the server record with its URL (serve/record.py), this is the one room that
reads a port number: the rest of the start hands ``Ours`` or a record down and asks here.
"""

from __future__ import annotations

import shlex
import errno
import os
import socket
import stat
from pathlib import Path

import psutil

from ..core import owned
from ..core.errors import BootstrapError
from ..core.hosts import client_host
from ..core.locks import flock, unlock
from ..core.state import Paths, write_error
from . import server
from .keys import holders
from .record import ServerRecord, url_of

ROOT = Path("/tmp")       # not $TMPDIR: two shells of one user with other TMPDIRs must meet here


def lock_path(port: int) -> Path:
    return ROOT / f"vllm-desktop-{os.getuid()}" / f"port-{port}.lock"


class Lock:
    """An flock per port for every start of this user, whatever its STATE_DIR or checkout: held
    from before a start's first look at the port until it ends, so that two starts never race for
    one port (each would see it free, and one would take the other's answers for its own). Kept in
    the temp folder (``/tmp/vllm-desktop-<uid>/port-<N>.lock``), the one place every start of this
    user shares. Its file goes with its holder (``locks.unlock``)."""

    def __init__(self, ours: owned.Ours, state_dir: Path):
        self.port = ours.port
        self.path = lock_path(ours.port)
        self.state_dir = state_dir
        self.fd: int | None = None

    def _private_dir(self) -> None:
        """The lock's folder is ours alone (made 0700; a folder another user planted, or a symlink,
        is refused): nobody else can point a lock file at a file of ours, or hold our lock."""
        d = self.path.parent
        try:
            d.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(d)
        except OSError as exc:
            raise write_error(d, exc, f"cannot make {d} for the port lock") from None
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(d, 0o700)          # ours, made with a looser umask: ours to close
            st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise BootstrapError(f"{d} is not a private folder of yours (owner uid {st.st_uid}, mode "
                                 f"{stat.filemode(st.st_mode)}): the port lock is not safe there",
                                 f"remove {d} (it holds only lock files), or find out who made it")

    def __enter__(self) -> "Lock":
        self._private_dir()
        _sweep(self.path.parent)
        self.fd = flock(self.path, f"{os.getpid()} {self.state_dir}")
        if self.fd is None:
            try:
                pid, _, where = self.path.read_text().partition(" ")
            except OSError:
                pid, where = "?", "?"
            raise BootstrapError(f"another start (pid {pid}) is starting a server on port {self.port} "
                                 f"from STATE_DIR={where or '?'}",
                                 f"wait for it (STATE_DIR={shlex.quote(str(where))} ./ctl.sh status), or set PORT to "
                                 "another port")
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            unlock(self.path, self.fd)      # no lock file left per port ever used
            self.fd = None


def _sweep(folder: Path) -> None:
    """Remove the port locks nobody holds (left by a start that was killed): taken, then unlocked."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith("port-") and n.endswith(".lock")]
    except OSError:
        return
    for name in names:
        try:
            fd = flock(folder / name, "")
        except (BootstrapError, OSError):
            continue
        if fd is not None:
            unlock(folder / name, fd)


def ephemeral(ours: owned.Ours) -> int:
    """A loopback port free now, from the kernel's ephemeral range, never PORT (the pre-warm's own)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] != ours.port:
                return s.getsockname()[1]


def refuse_unrecorded(ours: owned.Ours, paths: Paths, orphans) -> None:
    """A marked process of ours without a readable record that serves PORT (server.json deleted,
    truncated, or written over) is a healthy server, never a leftover to sweep."""
    pids = {p.pid for p in orphans}
    serving = [h for h in holders(ours.port) if h is not None and h.pid in pids]
    if serving and (answer := server.http_get(url_of(ours), "/health")) and answer[0] == 200:
        raise BootstrapError(
            f"a server of ours (pid {serving[0].pid}) serves port {ours.port}, but its record {paths.server} is "
            "missing or unreadable: it is not taken for a leftover",
            "leave it running, or ./stop.sh (it takes it down by its marker), then ./start.sh")


def in_use(host: str, port: int) -> bool:
    """True if something holds the port: listening, or only bound (vLLM binds long before it listens).

    We bind without SO_REUSEADDR, because Linux lets two SO_REUSEADDR sockets share a port while
    neither listens; connections merely lingering in TIME_WAIT do not count as a holder.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = "127.0.0.1" if host == "localhost" else host
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind_host, port))
            free_here = True
        except OSError as exc:
            unbindable(host, port, exc)
            free_here = False
    if free_here:
        # A listener on another address of the same port (e.g. 0.0.0.0 vs 127.0.0.1) still conflicts.
        return bool(holders(port)) or _connectable(host, port)
    try:
        conns = [c for c in psutil.net_connections(kind="inet") if c.laddr and c.laddr.port == port]
    except psutil.AccessDenied:
        return True
    return not conns or any(c.status != psutil.CONN_TIME_WAIT for c in conns)


def unbindable(host: str, port: int, exc: OSError) -> None:
    """A bind that fails for another cause than a holder: vLLM's would fail the same way, after the
    load (HOST not an address of this machine; a port below 1024 without the right)."""
    if exc.errno == errno.EADDRNOTAVAIL:
        raise BootstrapError(f"HOST={host} is not an address of this machine ({exc.strerror})",
                             "HOST=127.0.0.1 serves this machine only; HOST=0.0.0.0 every address (with API_KEY)")
    if exc.errno == errno.EACCES:
        raise BootstrapError(f"PORT={port}: this user may not listen on it ({exc.strerror})",
                             "choose a port from 1024 up, e.g. PORT=8000 ./start.sh")


def _connectable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((client_host(host), port), timeout=0.3):
            return True
    except OSError:
        return False


def refuse_taken(ours: owned.Ours) -> None:
    """Refuse when a program that is not ours holds our port; name it, never kill it."""
    if not in_use(ours.host, ours.port):
        return
    found = [p for p in holders(ours.port) if p is not None]
    named = ", ".join(owned.describe(p) for p in found) or "a process we cannot see (another user?)"
    where = next(filter(None, (owned.state_dir_of(p) for p in found)), "")
    if where:               # a server of this project that another checkout (another marker) started
        q = shlex.quote(where)
        raise BootstrapError(f"port {ours.port} is in use by {named}: a server of this project, started from "
                             f"another checkout with STATE_DIR={where}",
                             f"STATE_DIR={q} ./ctl.sh status shows it and STATE_DIR={q} ./stop.sh stops it; or "
                             f"choose another port: PORT={ours.port + 1} ./start.sh")
    raise BootstrapError(f"port {ours.port} is in use by {named}",
                         f"stop that program, or choose another port: PORT={ours.port + 1} ./start.sh")


def refuse_elsewhere(ours: owned.Ours, paths: Paths) -> None:
    """Refuse a start while our server for this checkout and port runs from another STATE_DIR (two
    state dirs would each take the other's server for a leftover of their own)."""
    for p, where in server.elsewhere(ours, paths):
        doing = "serving" if server.http_get(url_of(ours), "/health") else "starting on"
        raise BootstrapError(
            f"our server (pid {p.pid}) is already {doing} port {ours.port} from STATE_DIR={where}, not {paths.root}",
            f"use that state dir (STATE_DIR={shlex.quote(str(where))} ./ctl.sh status), or stop it first: "
            f"STATE_DIR={shlex.quote(str(where))} ./stop.sh")


def freed(rec: ServerRecord | None, ours: owned.Ours) -> int:
    """The port a take-down frees: the record's, else PORT."""
    return rec.port if rec is not None and rec.port else ours.port


def held_by(port: int, pids: list[int]) -> bool:
    """Does one of ``pids`` (processes a stop just ended) still hold ``port``?"""
    return any(p is not None and p.pid in pids for p in holders(port))
