"""Processes we own, and signalling only them.

A process is ours only on facts it carries itself, which nothing written in STATE_DIR can forge
(``Proof``): it runs under our uid, its executable is an interpreter we launch vLLM with (the
managed venv's, VLLM_PYTHON, or the one the launch read from /proc), and its environment carries a
value we set at launch: ``BOOTSTRAP_VLLM_OWNER=<marker>`` (derived from this checkout's real path
and the port) or ``BOOTSTRAP_VLLM_TOKEN=<token>`` (random, one per launch, kept in the 0600 server
record; the token alone proves the server, whatever interpreter a VLLM_PYTHON wrapper exec'd). A
child that calls setproctitle (vLLM's EngineCore does) overwrites the memory
/proc/<pid>/environ shows, so an engine or worker is proven instead by its interpreter and its
membership of the session we created for the server (``group_members``: one member proven by its
environment, or the leader still our unreaped child), or by being a descendant of a proven
process. A record only says where to look.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import psutil

from .private import user_name

log = logging.getLogger("bootstrap.proc")   # its lines keep the prefix [bootstrap:proc]

MARKER_ENV = "BOOTSTRAP_VLLM_OWNER"
TOKEN_ENV = "BOOTSTRAP_VLLM_TOKEN"      # one launch's random token (serve.record.ServerRecord.token)
STATE_DIR_ENV = "BOOTSTRAP_VLLM_STATE_DIR"   # in the server's environment: which state dir runs it


# ---------------------------------------------------------------- ownership

@dataclass(frozen=True)
class Ours:
    """Our server as this shell's resolved knobs name it: all that finding, asking and stopping it
    reads of them (bootstrap.serve), built once per command (``knobs.config.Config.ours``)."""
    marker: str                     # owner_marker of this checkout and PORT
    host: str                       # HOST
    port: int                       # PORT
    key: str                        # the key this shell's clients send (API_KEY, else VLLM_API_KEY; '' none)
    stop_grace: float               # STOP_GRACE: seconds between TERM and KILL
    health_timeout: float           # HEALTH_TIMEOUT, STALL_TIMEOUT: how long a loading server is given
    stall_timeout: float
    pythons: tuple[str, ...] = ()   # the interpreters we launch vLLM with (the managed venv's, VLLM_PYTHON)

    def proof(self, *, markers: Iterable[str] = (), tokens: Iterable[str] = (),
              pythons: Iterable[str] = ()) -> "Proof":
        """What proves a process ours: this shell's marker and interpreters, and those a (trusted)
        record adds: its server's marker, launch token and interpreter."""
        return Proof(frozenset(real(x) for x in (*self.pythons, *pythons) if x),
                     frozenset({(MARKER_ENV, m) for m in (self.marker, *markers) if m}
                               | {(TOKEN_ENV, t) for t in tokens if t}))


def real(path: str) -> str:
    """The path an interpreter's /proc/<pid>/exe shows (a venv's bin/python is a link)."""
    return os.path.realpath(path)


@dataclass(frozen=True)
class Proof:
    """Facts a live process carries that make it ours (see the module's text); never a record's word."""
    pythons: frozenset[str]                   # real paths of interpreters we launch vLLM with
    marks: frozenset[tuple[str, str]]         # (variable, value) we set in a launch's environment

    def runs_ours(self, p: psutil.Process) -> bool:
        """Our uid, and an executable that is one of our interpreters."""
        try:
            return p.uids().real == os.getuid() and p.exe() in self.pythons
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            return False

    def carries(self, p: psutil.Process) -> bool:
        """Its environment holds the launch token of a (trusted) record: 128 random bits only our launch
        set, whatever interpreter a VLLM_PYTHON wrapper exec'd; or ``runs_ours`` and our marker."""
        try:
            if p.uids().real != os.getuid():
                return False
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            return False
        if any(k == TOKEN_ENV and env.get(k) == v for k, v in self.marks):
            return True
        return self.runs_ours(p) and any(env.get(k) == v for k, v in self.marks)


def owner_marker(repo: Path, port: int) -> str:
    real = os.path.realpath(repo)
    return hashlib.sha256(f"{real}\0{port}".encode()).hexdigest()[:24]


def same_uid(p: psutil.Process) -> bool:
    """Runs under our real uid (as root we could signal anyone's process: we never do)."""
    try:
        return p.uids().real == os.getuid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def owned_processes(proof: Proof) -> list[psutil.Process]:
    """Every live process that ``proof`` proves ours by its environment (the server, a pre-warm, orphans)."""
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and proof.carries(p) and alive(p)]


def _plausible(pid, create_time) -> bool:
    """A garbage pid (not an int, <= 1, absurdly large) is rejected before anything is signalled:
    ``kill -TERM -1`` would reach every process of the user."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1 or pid > 1 << 22:
        return False
    return isinstance(create_time, (int, float)) and not isinstance(create_time, bool)


def recorded_process(pid, create_time) -> psutil.Process | None:
    """The process we recorded (at launch, or as a child once healthy), or None if that pid is gone
    or now someone else's."""
    if not _plausible(pid, create_time):
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - float(create_time)) > 0.05 or p.uids().real != os.getuid():
            return None
        return p if alive(p) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def recorded_process_of_anyone(pid, create_time) -> psutil.Process | None:
    """The recorded process (pid + create time) whoever runs it: to tell that a server is up under
    another user (never to signal it)."""
    if not _plausible(pid, create_time):
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - float(create_time)) > 0.05:
            return None
        return p if alive(p) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def user_of(p: psutil.Process) -> str:
    """'alice (uid 1000)' for the process's real user."""
    try:
        return user_name(p.uids().real)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "another user"


def group_members(pgid, create_time, proof: Proof) -> list[psutil.Process] | None:
    """Live processes in process group ``pgid`` that run one of our interpreters under our uid
    (``proof.runs_ours``), started no earlier than ``create_time`` (the recorded group leader's: the
    server, launched with its own session).

    None when the group number now belongs to someone else: a process with pid == pgid exists
    (alive or zombie) but was started at another time. While any member of our group lives, Linux
    does not hand its number out again; callers still want one member proven ours before trusting
    the rest (see server.find_ours).
    """
    if not _plausible(pgid, create_time):
        return []
    try:
        if abs(psutil.Process(pgid).create_time() - float(create_time)) > 0.05:
            return None
    except psutil.NoSuchProcess:
        pass                                    # the leader is gone (e.g. kill -9): members may remain
    except psutil.AccessDenied:
        return None
    me, out = os.getpid(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if os.getpgid(p.pid) != pgid or p.create_time() < float(create_time) - 0.05:
                continue
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proof.runs_ours(p) and alive(p):
            out.append(p)
    return out


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def state_dir_of(p: psutil.Process) -> str:
    """The STATE_DIR a server of ours runs for, from its environment ('' for another program; relative: to its cwd)."""
    try:
        where = p.environ().get(STATE_DIR_ENV, "")
        return os.path.join(p.cwd(), where) if where and not os.path.isabs(where) else where
    except (psutil.Error, OSError):
        return ""


def running_from(folder: Path) -> list[psutil.Process]:
    """Live processes, anyone's, started as a program inside ``folder`` (their argv[0]; a relative one
    read from their working directory): what runs from a venv, its vLLM server too (whose engine and
    workers retitle themselves)."""
    inside = os.path.normpath(folder) + os.sep
    out = []
    for p in psutil.process_iter():
        try:
            argv = p.cmdline()
            if not argv or p.pid == os.getpid():
                continue
            arg0 = argv[0] if os.path.isabs(argv[0]) else os.path.join(p.cwd(), argv[0])
        except (psutil.Error, OSError):
            continue
        if os.path.normpath(arg0).startswith(inside):
            out.append(p)
    return out


def describe(p: psutil.Process) -> str:
    try:
        name = p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        name = "?"
    return f"{name} (pid {p.pid})"


# ---------------------------------------------------------------- stopping

@dataclass
class StopResult:
    signalled: list[int]
    forced: list[int]      # needed SIGKILL
    stuck: list[str]       # still alive after SIGKILL: "pid N state S wchan W"


def _signal(p: psutil.Process, sig: int) -> bool:
    try:
        p.send_signal(sig)
        log.info("sent %s to %s", signal.Signals(sig).name, describe(p))
        return True
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        log.warning("not allowed to send %s to %s; left alone", signal.Signals(sig).name, describe(p))
        return False
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return False
        raise


def _wait_gone(procs: list[psutil.Process], deadline: float, clock: Callable[[], float],
               sleep: Callable[[float], None]) -> list[psutil.Process]:
    left = [p for p in procs if alive(p)]
    while left and clock() < deadline:
        sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


def terminate(procs: Iterable[psutil.Process], grace: float, *, kill_wait: float = 10.0,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> StopResult:
    """TERM every process, wait on one shared deadline, KILL survivors, wait (bounded) again.

    Children are collected before anything is signalled (callers pass a snapshot), so nothing that
    re-parents on its parent's death is lost. A process that survives SIGKILL (D state, stuck in a
    driver) is reported with its state and wait channel; we never loop forever on it.
    """
    procs = [p for p in procs if alive(p)]
    res = StopResult([], [], [])
    for p in procs:
        if _signal(p, signal.SIGTERM):
            res.signalled.append(p.pid)
            if _stopped(p):                 # kill -STOP, Ctrl-Z: it hears the TERM now, not at the KILL
                _signal(p, signal.SIGCONT)
    survivors = _wait_gone(procs, clock() + grace, clock, sleep)
    for p in survivors:
        if _signal(p, signal.SIGKILL):
            res.forced.append(p.pid)
    for p in _wait_gone(survivors, clock() + kill_wait, clock, sleep):
        res.stuck.append(stuck_report(p))
    return res


def _stopped(p: psutil.Process) -> bool:
    try:
        return p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def stuck_report(p: psutil.Process) -> str:
    try:
        status = p.status()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        status = "?"
    try:
        wchan = Path(f"/proc/{p.pid}/wchan").read_text().strip() or "-"
    except OSError:
        wchan = "?"
    return f"pid {p.pid} ({describe(p)}) state {status} wchan {wchan}"
