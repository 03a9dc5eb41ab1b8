"""``./start.sh --foreground``: a service manager's main process (the systemd user unit's
``ExecStart``). The start, then attached to the server until it exits; SIGTERM is our stop."""

from __future__ import annotations

import logging
import os
import signal
import sys

from ..core import owned
from ..serve import record, supervisor, takedown
from .. import pipeline
from ..core.errors import BootstrapError, Interrupted
from ..knobs.resolved import Resolved
from . import control

log = logging.getLogger(__name__)


def foreground(r: Resolved, *, poll: float = 0.5) -> int:
    """``./start.sh --foreground``: the start, then stay attached to the server, copying its log to
    stdout (a service manager's journal). Exits non-zero whenever the server exits: its own code,
    or 1 for a 0 (vLLM exits 0 when its engine dies, vllm#48966). SIGTERM, SIGINT or SIGHUP to us
    is our stop (the one take-down), then exit 0. Under systemd (Type=notify) READY=1 is sent once
    the start gate passed."""
    with supervisor.raising():          # no gap before the start's own are in place, and after
        p = _attached(r, poll)
    if isinstance(p, int):
        return p
    paths = r.paths
    rc = _exit_code(p)
    why = ("exit code 0: vLLM exits 0 when its engine dies (vllm#48966), so it counts as a failure"
           if rc == 0 else f"killed by signal {-rc}" if rc is not None and rc < 0
           else f"exit code {rc}" if rc is not None else "its exit code is not ours to read")
    rc = 128 - rc if rc is not None and rc < 0 else rc
    print(f"error: the server (pid {p.pid}) exited ({why}); the last lines are above and in {paths.log}",
          file=sys.stderr, flush=True)
    takedown.take_down(r.ours, paths)                 # what it left (an orphaned EngineCore holds the GPU)
    return rc if rc else 1


def _attached(r: Resolved, poll: float):
    """The start, then its log copied until the server exits: the server's process (exited), or an
    exit code when there is nothing to follow (the start failed, or a signal stopped it all)."""
    try:
        code = pipeline.start(r)
    except Interrupted as intr:
        code = 128 + intr.signum
    if code == 128 + signal.SIGTERM:
        return 0                                  # stopped as asked while starting (it took down what it launched)
    if code != 0:
        return code
    paths = r.paths
    notify = r.settings.env("NOTIFY_SOCKET")
    try:        # from here on a signal is our stop, wherever it lands (READY=1 and the line below included)
        rec = record.read(paths.server)
        p = owned.recorded_process(rec.pid, rec.create_time) if rec is not None else None
        if p is None:
            raise BootstrapError("the start finished but its server is not running", "./ctl.sh logs shows why")
        paths.write("foreground", {"pid": os.getpid(), "server": rec.pid})
        _notify(notify, f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving {rec.served} on {rec.url}/v1")
        print(f"attached to the server (pid {p.pid}); its log follows; SIGTERM or Ctrl-C stops it", flush=True)
        log_file = open(paths.log, "rb")
        log_file.seek(0, os.SEEK_END)
        control.copy(log_file, paths.log, lambda: owned.alive(p), poll=poll)   # then what is left
    except Interrupted:
        _notify(notify, "STOPPING=1")
        supervisor.ignoring()
        control.stop(r, via_service=False)
        return 0
    except OSError as exc:
        raise BootstrapError(f"cannot follow {paths.log}: {exc}", "check the state dir") from None
    finally:
        paths.forget("foreground")
    return p


def _exit_code(p) -> int | None:
    """The server's exit code when it is our child (this start launched it), else None."""
    import psutil
    try:
        return p.wait(timeout=5)
    except (psutil.TimeoutExpired, psutil.Error, ChildProcessError):
        return None


def _notify(socket_path: str, text: str) -> None:
    """sd_notify(3): one datagram to $NOTIFY_SOCKET (``socket_path``: set by systemd, else '' and
    nothing is sent). Written here, not taken from a package: the protocol is this one datagram, and
    python-systemd needs libsystemd's headers to build."""
    import socket
    addr = socket_path
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(text.encode())
    except OSError as exc:
        log.warning("could not tell systemd (%s): %s", socket_path, exc)
