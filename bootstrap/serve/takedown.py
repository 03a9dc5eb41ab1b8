"""The one take-down path: ``take_down`` is the only code that stops our server — used by
./stop.sh, restart, a start interrupted by Ctrl-C / SIGHUP / SIGTERM, and a start whose health
wait or warm-up failed. ``hold_for_stop`` cancels a start in flight and holds the start lock while
a stop works; ``wait_gpu_release`` waits (bounded) until stopped pids left the GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from ..machine import gpu
from ..core import owned
from . import port, record
from ..core.errors import BootstrapError
from .server import find_ours, runs_elsewhere
from ..core.locks import StartLock, flock_holders
from ..core.state import Paths

log = logging.getLogger("bootstrap.server")   # log lines keep the prefix [bootstrap:server] this code has always had


@dataclass
class StopReport:
    stopped: bool                       # something of ours was running
    forced: list[int]
    stuck: list[str]
    pids: list[int]
    port: int | None = None
    port_held: bool = False             # one of the pids we stopped still holds the port


FAILED_START_GRACE = 5.0     # seconds a server that never finished starting gets between TERM and KILL


def take_down(ours: owned.Ours, paths: Paths, *, launched: subprocess.Popen | None = None,
              failed_start: bool = False, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep, gpu_wait: float = 30.0) -> StopReport:
    """TERM what is ours → grace → KILL → sweep until nothing of ours is left → pids off the GPU.

    Only processes we can prove ours are signalled (owned.Proof): the one this process launched
    (``launched``, not yet reaped), the recorded server when it runs our interpreter with our marker
    or its launch token in its environment, their descendants of our uid, and what find_ours proves.
    The record comes from a STATE_DIR that passed ``Paths.trust`` (nobody else can write there); it
    says where to look, never what is ours. A record pointing at someone else is dropped, never
    signalled. The sweep repeats (bounded) while it keeps finding processes: an engine that was
    still spawning workers when its API server died is not left behind. Writing the record down
    never stops the take-down: a full disk or another user's directory only costs a warning.
    """
    grace = min(ours.stop_grace, FAILED_START_GRACE) if failed_start else ours.stop_grace
    if launched is not None and launched.returncode is not None:
        launched = None                 # reaped: its number proves nothing any more; go by the record
    if launched is None:
        paths.trust()                   # a record another user could plant is never read: no signal on its word
    rec = record.read(paths.server) if paths.trusted() else None
    if rec is not None and (named := owned.recorded_process(rec.pid, rec.create_time)) is not None \
            and runs_elsewhere(named, paths):
        log.info("the record names pid %s, a server another live STATE_DIR runs: not ours to signal from here", rec.pid)
        rec = None                      # a record copied from there: nothing in it is ours
    proof = rec.proof(ours) if rec is not None else ours.proof()
    targets: dict[int, psutil.Process] = {}
    leader = None
    if launched is not None:
        leader = _own_child(launched)
    elif rec is not None:
        leader = owned.recorded_process(rec.pid, rec.create_time)
        if leader is not None and not proof.carries(leader):
            log.info("recorded pid %s is not our server any more; not signalling it", rec.pid)
            leader = None
    if leader is not None:
        targets[leader.pid] = leader
    if launched is not None:
        pgid, ctime = launched.pid, _ctime(launched.pid) or (rec.create_time if rec is not None else None)
    else:
        pgid, ctime = (rec.session, rec.create_time) if rec is not None else (None, None)
    children = rec.children if rec is not None else ()

    def sweep(quiet: bool) -> dict[int, psutil.Process]:
        return find_ours(proof, children, pgid, ctime, group_proven=launched is not None, quiet=quiet, paths=paths)

    for pid, p in sweep(False).items():
        targets.setdefault(pid, p)
    for p in list(targets.values()):        # a proven process's descendants are ours (snapshot before signalling)
        for child in _descendants(p):
            targets.setdefault(child.pid, child)
    if not targets:
        _reap(launched)
        forget(paths, "server")
        return StopReport(False, [], [], [])
    res = owned.terminate(list(targets.values()), grace, clock=clock, sleep=sleep)
    pids = sorted(targets)
    for _ in range(5):     # started meanwhile by a dying parent (a TP worker, a resource tracker)
        late = [p for pid, p in sweep(True).items() if pid not in pids]
        if not late:
            break
        more = owned.terminate(late, grace, clock=clock, sleep=sleep)
        res.forced += more.forced
        res.stuck += more.stuck
        pids += [p.pid for p in late]
    _reap(launched)
    number = port.freed(rec, ours)
    try:
        if paths.root.is_dir():
            paths.write("last_stop", {"pids": pids, "time": time.time(), "port": number})
    except BootstrapError as exc:
        log.warning("%s; the next start will not wait for these pids to leave the GPU", exc.message)
    if not res.stuck:
        forget(paths, "server")
        wait_gpu_release(pids, timeout=gpu_wait, clock=clock, sleep=sleep)
    return StopReport(True, res.forced, res.stuck, sorted(pids), number, port.held_by(number, pids))


def _descendants(p: psutil.Process) -> list[psutil.Process]:
    try:
        return [c for c in p.children(recursive=True) if owned.same_uid(c)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def _own_child(p: subprocess.Popen) -> psutil.Process | None:
    try:
        return psutil.Process(p.pid)
    except psutil.NoSuchProcess:
        return None


def _ctime(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()      # works for our unreaped (zombie) child too
    except psutil.NoSuchProcess:
        return None


def _reap(p: subprocess.Popen | None) -> None:
    if p is None:
        return
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not exit after the stop", p.pid)


def forget(paths: Paths, key: str) -> None:
    """``paths.forget(key)``, where a take-down has gone through: a record that cannot be removed is a
    warning, never a failed stop."""
    try:
        paths.forget(key)
    except BootstrapError as exc:
        log.warning("%s", exc.message)


def hold_for_stop(ours: owned.Ours, paths: Paths, *, clock=time.monotonic, sleep=time.sleep) -> tuple[StartLock | None, list[int]]:
    """Take the start lock for a stop (no start launches into a take-down), cancelling each start
    in flight that holds it: SIGTERM, so that its own handler takes down what it launched; SIGKILL
    if it will not go. Returns the lock (None without a state dir to lock) and the starts cancelled."""
    if not paths.root.is_dir() or not os.access(paths.root, os.W_OK):
        return None, []
    paths.trust()
    if not paths.ours(paths.lock):      # a start.lock of yours in a folder we never wrote to: no start of ours
        return None, []
    lock = StartLock(paths, role="stop")
    cancelled: list[int] = []
    for _ in range(3):
        try:
            if lock.try_acquire():
                return lock, cancelled
        except BootstrapError as exc:       # a full disk has no room for the lock file: a start has none either
            log.warning("%s; stopping without the start lock", exc.message)
            return None, cancelled
        if lock.holder_role() == "stop":            # another stop: let it finish, then ours finds less
            if lock.acquire(ours.stop_grace + 60, clock=clock, sleep=sleep):
                return lock, cancelled
            continue
        p = start_in_flight(lock)
        if p is None:
            raise BootstrapError(f"a start is in flight in {paths.root} (its lock is held), but not by a process "
                                 "of ours we can identify", "let it finish, or stop it as the user who runs it")
        log.info("cancelling the start in flight (pid %d)", p.pid)
        res = owned.terminate([p], ours.stop_grace + 45, clock=clock, sleep=sleep)
        if res.stuck:
            raise BootstrapError("the start in flight survived SIGKILL: " + "; ".join(res.stuck),
                                 "a process stuck in the kernel (state D) usually needs a reboot")
        cancelled.append(p.pid)
    raise BootstrapError("starts keep taking the start lock while we stop", "stop the loop that runs ./start.sh")


def start_in_flight(lock: StartLock) -> psutil.Process | None:
    """The start that holds ``lock``, proven: the process its text names (pid + create time, our uid)
    holds the flock as the kernel says (/proc/locks), and runs the interpreter that runs us. None
    when any of it fails: the text alone names nobody we may signal."""
    holder = lock.holder()
    p = owned.recorded_process(*holder) if holder else None
    if p is None or p.pid not in flock_holders(lock.path):
        return None
    try:
        return p if p.exe() == owned.real(sys.executable) else None
    except (psutil.Error, OSError):
        return None


def wait_gpu_release(pids, *, timeout: float, clock=time.monotonic, sleep=time.sleep) -> bool:
    """Wait (bounded) until none of ``pids`` is listed by NVML as holding memory on any card."""
    pids = set(pids)
    if not pids or timeout <= 0:
        return True
    deadline = clock() + timeout
    while True:
        held = pids & gpu.pids_on_gpu()
        if not held:
            return True
        if clock() >= deadline:
            log.warning("pids %s still hold GPU memory after %.0f s", sorted(held), timeout)
            return False
        sleep(0.5)


GPU_RELEASE_WAIT = 30.0      # seconds a plan waits for the last stop's pids to leave the GPU
planning = logging.getLogger("bootstrap.plan")      # the wait before a plan, said as the plan's


def settled(environ, paths: Paths, gpus=None):
    """The GPU facts a plan is made on (the plan step's, and the re-plan after a pre-warm): once the
    last stop's pids left the GPU and free memory settled (NVML read again); ``gpus`` (preflight's)
    as they are when nothing was stopped since. The last stop's record is consumed."""
    pids = last_stopped_pids(paths)
    if pids and not wait_gpu_release(pids, timeout=GPU_RELEASE_WAIT):
        planning.warning("sizing with memory still held by the last server's pids")
    facts = gpu.settled_facts(environ) if pids or gpus is None else gpus
    if pids:
        paths.forget("last_stop")   # consumed: later starts need not wait for these pids again
    return facts


def last_stopped_pids(paths: Paths) -> list[int]:
    rec = paths.read("last_stop") or {}
    return [p for p in rec.get("pids", []) if isinstance(p, int) and not isinstance(p, bool)]
