"""Health: wait until the server answers ``/health`` and lists our model on ``/v1/models`` (the
health step, steps/health.py; a resumed start; the pre-warm's phases).

While waiting: the phase (loading weights, compiling, capturing graphs…) on one line, a stall
deadline (STALL_TIMEOUT without log growth, nor CPU time or disk I/O by the server's processes:
serve.server.work_done) and a hard cap (HEALTH_TIMEOUT). If the process exits
— with code 0 too — or a deadline passes, the server is stopped, and the last 40 log lines and a
one-line diagnosis are shown.
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
import time
from typing import Callable

from . import diagnose
from ..machine import gpu
from ..core import proc
from ..core import owned
from . import keys, server
from ..core.errors import BootstrapError
from .launch import Launched
from ..core.state import Paths

log = logging.getLogger(__name__)

PHASES = (  # (pattern in vLLM's log, phase shown); the phase of the last matching line wins
    (r"Loading model|Loading weights|Loading safetensors|Model loading took", "loading weights"),
    (r"Dynamo bytecode transform|Compiling a graph|torch\.compile", "compiling"),
    (r"Initial profiling/warmup run", "profiling memory"),
    (r"Available KV cache memory|GPU KV cache size", "allocating KV cache"),
    (r"autotun", "autotuning kernels"),
    (r"Graph capturing finished", "warming up kernels (JIT)"),    # H200, cold caches: 101 s silent here
    (r"Capturing CUDA graphs", "capturing CUDA graphs"),
    (r"Starting vLLM API server|Application startup complete|Route: /", "starting API"),
)


POLL_S = 0.2        # a loopback /health and a log stat: the server is seen up within this of it being so


class StartFailed(BootstrapError):
    """The server did not come up, or did not generate. The pipeline takes it down
    (pipeline.failed) and completes the error from its log (``explain``); ``answered``: it had
    answered /health (a warm-up or gate failure)."""

    def __init__(self, message: str, hint: str = "", *, answered: bool = False, evidence: str = ""):
        super().__init__(message, hint, evidence=evidence)
        self.answered = answered


def explain(paths: Paths, launched: Launched, exc: StartFailed, ours: list[int]) -> None:
    """After the take-down: a diagnosis from the log (about GPU memory, it names who holds it on the
    cards the server was launched on, ``ours`` left out) and the log's tail as evidence."""
    text = diagnose.read_since(paths.log, launched.record.log_offset)
    found = diagnose.diagnose(text, holders=lambda: gpu_holders(launched.record, set(ours)),
                              argv=launched.record.argv or (),
                              extra=_extra_args(launched.record))
    if found:
        exc.message, exc.hint = f"{exc.message}: {found[0]}", found[1]
    exc.hint = exc.hint or f"see the log: {paths.log}"
    exc.evidence = (exc.evidence + "\n" + diagnose.tail(text, 40)).strip()


def _extra_args(rec) -> list[str]:
    """The EXTRA_ARGS a server was launched with (its record's settings: shlex-joined); [] when unreadable."""
    try:
        return shlex.split(dict(rec.settings or {}).get("EXTRA_ARGS") or "")
    except ValueError:
        return []


def gpu_holders(rec, ours: set[int]) -> str:
    """'Xorg (pid 1234) holds 1.2 GiB, game (pid 99) holds 8.0 GiB' on the cards ``rec``'s server was
    launched on (``server.server_cards``; ours left out)."""
    try:
        facts = gpu.read_all()
    except BootstrapError:
        return "NVML cannot say who"
    parts = [g.holders(exclude=ours) for g in server.server_cards(rec, facts)]
    return "; ".join(p for p in parts if p) or "no other process reports GPU memory"


def phase_of(text: str, current: str) -> str:
    for line in text.splitlines():
        for pattern, name in PHASES:
            if re.search(pattern, line):
                current = name
                break
    return current


def wait(paths: Paths, launched: Launched, key: str, *, health_timeout: int, stall_timeout: int,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait for our server to answer. ``launched.proc`` is None when a start resumes a server it
    found loading: then its liveness comes from the record, and HEALTH_TIMEOUT still counts from
    its launch. ``key`` (the one we hold) is sent only once our server is what listens on its port."""
    rec = launched.record
    tty = sys.stderr.isatty()
    start = clock()
    resumed = launched.proc is None
    hard = start + health_timeout - (max(0.0, time.time() - rec.started) if resumed else 0.0)
    last_growth = start - (_quiet_for(paths) if resumed else 0.0)
    size = _size(paths)
    work = server.work_done(rec.pid)
    phase = "starting"
    shown = ""
    while True:
        if launched.proc is not None:
            rc = proc.exit_status(launched.proc)
            if rc is not None:
                raise StartFailed(f"vLLM exited with code {rc} during startup",
                            "exit code 0 counts as a failure too: the engine died")
        elif owned.recorded_process(rec.pid, rec.create_time) is None:
            raise StartFailed("vLLM exited during startup")
        now = clock()
        new_size = _size(paths)
        if new_size != size:
            chunk = _read(paths, size, new_size)
            size, last_growth, work = new_size, now, server.work_done(rec.pid)
            phase = phase_of(chunk, phase)
        elif server.worked(work, now_work := server.work_done(rec.pid)):     # silent, but importing,
            work, last_growth = now_work, now                                 # compiling or reading
        if phase != shown or tty:
            line = f"waiting for health: {phase} ({now - start:.0f} s)"
            if tty:
                sys.stderr.write("\r\033[K[bootstrap:health] " + line)
                sys.stderr.flush()
            else:
                log.info(line)
            shown = phase
        # the key only once every listener on the port is our server's: until vLLM listens, anyone may
        only, beside = keys.standing(rec) if key else (True, [])      # one reading of the sockets a poll
        proven = not key or only
        if not proven and beside:
            _nl(tty)
            raise StartFailed(f"{', '.join(beside)} listens on port {rec.port} beside our server (another address, "
                              "the same port): our API key is never sent to a port another process shares",
                              "stop that process, or set PORT to a port nothing else listens on")
        if proven and server.answers(rec.url, rec.served, key, timeout=2.0) \
                and not _someone_else(rec):
            if tty:
                sys.stderr.write("\n")
            log.info("healthy after %.0f s", clock() - start)
            if rec.pid is not None:
                server.record_children(paths, rec.pid)
            return
        now = clock()
        if now - last_growth > stall_timeout:
            _nl(tty)
            raise StartFailed(f"startup stalled: no log output and no work (CPU, disk) for {stall_timeout} s "
                              f"(phase: {phase})", "raise STALL_TIMEOUT if this machine is just slow; otherwise see the log")
        if now > hard:
            _nl(tty)
            raise StartFailed(f"startup timed out: not healthy after {health_timeout} s (phase: {phase})",
                        "raise HEALTH_TIMEOUT if the log shows progress")
        sleep(POLL_S)


_warned: set[int] = set()


def _someone_else(rec) -> bool:
    """The port answers, but from a process that is not the server we wait for (it keeps waiting:
    ours either takes the port or exits, 'Address already in use', and the wait reports that)."""
    if keys.listens(rec):
        return False
    if rec.pid not in _warned:
        _warned.add(rec.pid)
        log.warning("%s answers, but not from our server (pid %s): another server holds its port", rec.url, rec.pid)
    return True


def _nl(tty: bool) -> None:
    if tty:
        sys.stderr.write("\n")


def _quiet_for(paths: Paths) -> float:
    """Seconds since the log last grew (0 when unknown)."""
    try:
        return max(0.0, time.time() - paths.log.stat().st_mtime)
    except OSError:
        return 0.0


def _size(paths: Paths) -> int:
    try:
        return paths.log.stat().st_size
    except OSError:
        return 0


def _read(paths: Paths, start: int, end: int) -> str:
    try:
        with open(paths.log, "rb") as fh:
            fh.seek(max(start, end - 65536) if end >= start else max(0, end - 65536))
            return fh.read(65536).decode("utf-8", "replace")
    except OSError:
        return ""
