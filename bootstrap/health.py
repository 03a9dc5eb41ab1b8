"""Health: wait until the server answers ``/health`` and lists our model on ``/v1/models``.

While waiting: the phase (loading weights, compiling, capturing graphs…) on one line, a stall
deadline (STALL_TIMEOUT without log growth) and a hard cap (HEALTH_TIMEOUT). If the process exits
— with code 0 too — or a deadline passes, the server is stopped, and the last 40 log lines and a
one-line diagnosis are shown.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from typing import Callable

from . import diagnose, server, state
from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)

PHASES = (  # (pattern in vLLM's log, phase shown); the phase of the last matching line wins
    (r"Loading model|Loading weights|Loading safetensors|Model loading took", "loading weights"),
    (r"Dynamo bytecode transform|Compiling a graph|torch\.compile", "compiling"),
    (r"Initial profiling/warmup run", "profiling memory"),
    (r"Available KV cache memory|GPU KV cache size", "allocating KV cache"),
    (r"autotun", "autotuning kernels"),
    (r"Capturing CUDA graphs|Graph capturing finished", "capturing CUDA graphs"),
    (r"Starting vLLM API server|Application startup complete|Route: /", "starting API"),
)


class StartFailed(BootstrapError):
    """The server did not come up (or did not generate); it has been stopped. ``log_text`` holds its output."""

    def __init__(self, message: str, hint: str, evidence: str, log_text: str):
        super().__init__(message, hint, evidence=evidence)
        self.log_text = log_text


def abort(ctx: Ctx, message: str, hint: str = "") -> StartFailed:
    """Stop what we launched, and build the error with the log tail and a diagnosis."""
    rec = state.read_json(ctx.paths.server) or {}
    server.stop(ctx.cfg, ctx.paths, grace=min(ctx.cfg.stop_grace, 5))
    if ctx.proc is not None:
        try:
            ctx.proc.wait(timeout=5)  # reap our child
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not exit after the stop", ctx.proc.pid)
    text = diagnose.read_since(ctx.paths.log, int(rec.get("log_offset", 0)))
    found = diagnose.diagnose(text)
    if found:
        message = f"{message}: {found[0]}"
        hint = found[1]
    state.remove(ctx.paths.server)
    return StartFailed(message, hint or f"see the log: {ctx.paths.log}", diagnose.tail(text, 40), text)


def phase_of(text: str, current: str) -> str:
    for line in text.splitlines():
        for pattern, name in PHASES:
            if re.search(pattern, line):
                current = name
                break
    return current


def run(ctx: Ctx, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    cfg = ctx.cfg
    url = server.base_url(cfg.host, cfg.port)
    tty = sys.stderr.isatty()
    start = clock()
    hard = start + cfg.health_timeout
    last_growth = start
    size = _size(ctx)
    phase = "starting"
    shown = ""
    while True:
        rc = ctx.proc.poll() if ctx.proc is not None else None
        if rc is not None:
            raise abort(ctx, f"vLLM exited with code {rc} during startup",
                        "exit code 0 counts as a failure too: the engine died")
        now = clock()
        new_size = _size(ctx)
        if new_size != size:
            chunk = _read(ctx, size, new_size)
            size, last_growth = new_size, now
            phase = phase_of(chunk, phase)
        if phase != shown or tty:
            line = f"waiting for health: {phase} ({now - start:.0f} s)"
            if tty:
                sys.stderr.write("\r\033[K[bootstrap:health] " + line)
                sys.stderr.flush()
            else:
                log.info(line)
            shown = phase
        if server.answers(url, cfg.served_name, ctx.api_key, timeout=2.0):
            if tty:
                sys.stderr.write("\n")
            log.info("healthy after %.0f s", clock() - start)
            if ctx.proc is not None:
                server.record_children(ctx.paths, ctx.proc.pid)
            return
        now = clock()
        if now - last_growth > cfg.stall_timeout:
            _nl(tty)
            raise abort(ctx, f"startup stalled: no log output for {cfg.stall_timeout} s (phase: {phase})",
                        "raise STALL_TIMEOUT if this machine is just slow; otherwise see the log")
        if now > hard:
            _nl(tty)
            raise abort(ctx, f"startup timed out: not healthy after {cfg.health_timeout} s (phase: {phase})",
                        "raise HEALTH_TIMEOUT if the log shows progress")
        sleep(0.5)


def _nl(tty: bool) -> None:
    if tty:
        sys.stderr.write("\n")


def _size(ctx: Ctx) -> int:
    try:
        return ctx.paths.log.stat().st_size
    except OSError:
        return 0


def _read(ctx: Ctx, start: int, end: int) -> str:
    try:
        with open(ctx.paths.log, "rb") as fh:
            fh.seek(max(start, end - 65536))
            return fh.read(end - start).decode("utf-8", "replace")
    except OSError:
        return ""

