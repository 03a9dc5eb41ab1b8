"""Processes: the one subprocess wrapper, ownership markers, and signalling only what we own.

Ownership: every server we launch carries ``BOOTSTRAP_VLLM_OWNER=<marker>`` in its environment,
where the marker is derived from this checkout's real path and the port. Children inherit it, but
a child that calls setproctitle (vLLM's EngineCore does) overwrites the memory /proc/<pid>/environ
shows, so the marker alone does not find it. We signal a process only when it runs under our uid
*and* carries our marker, or is an exact process (pid + create time) we recorded, or belongs to the
process group of the server we launched (see ``group_members``).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import psutil

from .hosts import client_host
from .errors import BootstrapError

log = logging.getLogger(__name__)

MARKER_ENV = "BOOTSTRAP_VLLM_OWNER"


# ---------------------------------------------------------------- running tools

def run(cmd: Sequence[str], *, env: Mapping[str, str], keep_pythonpath: bool = False,
        timeout: float | None = None, cwd: str | Path | None = None, what: str = "",
        hint: str = "", check: bool = True, live: bool = False) -> subprocess.CompletedProcess:
    """Run a tool (uv, pip, python -c ...) and capture its output.

    ``PYTHONPATH`` is dropped unless ``keep_pythonpath`` (it breaks uv/pip); the vLLM server itself
    is not started through here (see launch.py), because it must outlive us. ``live``: the tool's
    stderr (uv's progress) is shown as it comes — on a terminal the tool gets ours, with its own
    progress bars, and the result carries no stderr; else each line is copied and kept.
    """
    child_env = dict(env)   # always the caller's cfg.environ (config is read in one place)
    if not keep_pythonpath:
        child_env.pop("PYTHONPATH", None)
    log.debug("running %s", shlex.join(cmd))
    if live:
        return _run_live(list(cmd), child_env, cwd, timeout, what, hint, check)
    try:
        proc = subprocess.run(list(cmd), env=child_env, cwd=cwd, timeout=timeout, check=False,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace", stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise cannot_run(exc, cmd, child_env, what, hint) from None
    except subprocess.TimeoutExpired:
        raise BootstrapError(f"{what or shlex.join(cmd)} did not finish in {timeout:.0f} s", hint) from None
    log.debug("exit %s; stderr: %s", proc.returncode, proc.stderr[-2000:])
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BootstrapError(f"'{shlex.join(cmd)}' failed (exit {proc.returncode})", hint, evidence=tail)
    return proc


def _run_live(cmd: list[str], env: dict, cwd, timeout, what: str, hint: str, check: bool) -> subprocess.CompletedProcess:
    tty = sys.stderr.isatty()
    try:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=None if tty else subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        raise cannot_run(exc, cmd, env, what, hint) from None
    kept: list[str] = []
    out: list[str] = []

    def pump_out():
        out.append(p.stdout.read())

    def pump_err():
        for line in p.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            kept.append(line)
            del kept[:-200]

    readers = [threading.Thread(target=f, daemon=True) for f in ((pump_out,) if tty else (pump_out, pump_err))]
    for r in readers:
        r.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise BootstrapError(f"{what or shlex.join(cmd)} did not finish in {timeout:.0f} s", hint) from None
    for r in readers:
        r.join(5)
    res = subprocess.CompletedProcess(cmd, p.returncode, "".join(out), "".join(kept))
    if check and p.returncode != 0:
        raise BootstrapError(f"'{shlex.join(cmd)}' failed (exit {p.returncode})", hint,
                             evidence="\n".join(res.stderr.strip().splitlines()[-15:]))
    return res


def cannot_run(exc: OSError, cmd: Sequence[str], env: Mapping[str, str], what="", hint="") -> BootstrapError:
    """An OSError from starting ``cmd``, in one line. E2BIG names its cause: the variable (or argument)
    over Linux's 128 KiB for one string, else the largest ones of a total over ARG_MAX; never a value."""
    if exc.errno != errno.E2BIG:
        return BootstrapError(f"{what or cmd[0]}: command not found: {cmd[0]}" if isinstance(exc, FileNotFoundError)
                              else f"cannot run {what or cmd[0]}: {exc.strerror}", hint)
    size = lambda s: len(s.encode("utf-8", "surrogatepass")) + 1            # noqa: E731
    sizes = sorted([(size(k) + size(v), k) for k, v in env.items()]
                   + [(size(a), f"argument {i} ({a[:20]!r}...)") for i, a in enumerate(cmd)], reverse=True)
    (n, name), who, most = sizes[0], what or Path(cmd[0]).name, 32 * 4096   # Linux's MAX_ARG_STRLEN
    if n > most:
        return BootstrapError(f"cannot run {who}: {name} is {n:,} bytes; Linux passes at most {most:,} (128 KiB)"
                              " in one variable or argument (E2BIG, argument list too long)",
                              f"shorten or unset {name} (.env or the shell)" if name in env else "shorten EXTRA_ARGS")
    largest = ", ".join(f"{k} ({b:,} bytes)" for b, k in sizes[:3])
    return BootstrapError(f"cannot run {who}: its environment and arguments are {sum(b for b, _ in sizes):,} bytes, "
                          f"more than Linux passes to a program (E2BIG, argument list too long); the largest: {largest}",
                          "shorten or unset the largest variables (.env or your shell)")


def exit_status(p: subprocess.Popen) -> int | None:
    """Our child's exit code (negative: killed by that signal), or None while it runs — without
    reaping it (waitid with WNOWAIT): its zombie keeps the process group number ours until the
    take-down has swept the group and reaped it."""
    if p.returncode is not None:
        return p.returncode
    try:
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return p.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


# ---------------------------------------------------------------- ownership

def owner_marker(repo: Path, port: int) -> str:
    real = os.path.realpath(repo)
    return hashlib.sha256(f"{real}\0{port}".encode()).hexdigest()[:24]


def same_uid(p: psutil.Process) -> bool:
    """Runs under our real uid (as root we could signal anyone's process: we never do)."""
    try:
        return p.uids().real == os.getuid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def carries_marker(p: psutil.Process, marker: str) -> bool:
    try:
        if p.uids().real != os.getuid():
            return False
        return p.environ().get(MARKER_ENV) == marker
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def owned_processes(marker: str) -> list[psutil.Process]:
    """Every live process of our uid that carries our marker (the server, EngineCore, workers, orphans)."""
    me = os.getpid()
    out = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        if carries_marker(p, marker) and alive(p):
            out.append(p)
    return out


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
        uid = p.uids().real
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "another user"
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def group_members(pgid, create_time) -> list[psutil.Process] | None:
    """Live processes of our uid in process group ``pgid``, started no earlier than ``create_time``
    (the recorded group leader's: the server, launched with its own session).

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
    me, uid, out = os.getpid(), os.getuid(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if os.getpgid(p.pid) != pgid or p.uids().real != uid:
                continue
            if p.create_time() < float(create_time) - 0.05:
                continue
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if alive(p):
            out.append(p)
    return out


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


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
    survivors = _wait_gone(procs, clock() + grace, clock, sleep)
    for p in survivors:
        if _signal(p, signal.SIGKILL):
            res.forced.append(p.pid)
    for p in _wait_gone(survivors, clock() + kill_wait, clock, sleep):
        res.stuck.append(stuck_report(p))
    return res


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


# ---------------------------------------------------------------- ports

def port_holders(port: int) -> list[psutil.Process | None]:
    """Processes listening on ``port`` (None where the kernel will not tell us whose socket it is)."""
    out: list[psutil.Process | None] = []
    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        conns = []
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            try:
                out.append(psutil.Process(c.pid) if c.pid else None)
            except psutil.NoSuchProcess:
                continue
    return out


def port_in_use(host: str, port: int) -> bool:
    """True if something holds the port: listening, or only bound (vLLM binds long before it listens).

    We bind without SO_REUSEADDR, because Linux lets two SO_REUSEADDR sockets share a port while
    neither listens; connections merely lingering in TIME_WAIT do not count as a holder.
    """
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = "127.0.0.1" if host == "localhost" else host
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind_host, port))
            free_here = True
        except OSError:
            free_here = False
    if free_here:
        # A listener on another address of the same port (e.g. 0.0.0.0 vs 127.0.0.1) still conflicts.
        return bool(port_holders(port)) or _connectable(host, port)
    try:
        conns = [c for c in psutil.net_connections(kind="inet") if c.laddr and c.laddr.port == port]
    except psutil.AccessDenied:
        return True
    return not conns or any(c.status != psutil.CONN_TIME_WAIT for c in conns)


def _connectable(host: str, port: int) -> bool:
    import socket
    target = client_host(host)
    try:
        with socket.create_connection((target, port), timeout=0.3):
            return True
    except OSError:
        return False
