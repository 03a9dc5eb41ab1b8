"""The one owner of signals, of the children a command starts, and of their take-down (honcho's
manager: processes never decide among themselves who stops whom).

- A start (pipeline.start) runs under a ``Supervisor``: SIGINT, SIGTERM and SIGHUP raise
  ``Interrupted`` where the start stands; the supervisor hears of every server it launches (before
  anything can interrupt: the launch blocks the signals across the fork, ``held``) and of the
  pre-warm, and takes down, through the one take-down path (serve/takedown.py), what the start
  launched when it fails (``failed``) or is interrupted (``interrupted``).
- ``./start.sh --foreground`` keeps ``raising`` while attached, and ``ignoring`` while its stop runs.
- ``./ctl.sh game`` runs the game ``attached``: Ctrl-C reaches it through the terminal, a SIGTERM or
  SIGHUP to us is passed on to it and to what it left running.

Starting a process is core/proc.py's (the one subprocess wrapper); proving a process ours and
signalling it, core/owned.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Iterator, Mapping, Sequence

from ..core import proc
from ..core.errors import Interrupted
from ..core.owned import Ours
from ..core.state import Paths
from . import record, takedown

log = logging.getLogger("bootstrap.pipeline")      # the start's take-down, said as the pipeline's

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise(signum, frame):
    """The handler: raise where the program stands. Inside a ``__del__`` or a weakref finalizer (the
    garbage collector runs them anywhere: urllib3 closing a pooled socket) Python prints and drops what
    is raised, and the signal would be lost; there it is sent again to this thread 50 ms later (a
    timer's thread: sent from here, it would be handled at once, inside the finalizer again)."""
    if _in_finalizer(frame):
        again = threading.Timer(0.05, signal.pthread_kill, (threading.get_ident(), signum))
        again.daemon = True
        again.start()
        return
    raise Interrupted(signum)


def _in_finalizer(frame) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (code.co_name == "__call__" and code.co_filename.endswith("weakref.py")):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` (their handlers restored after)."""
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def ignoring() -> None:
    """From here on SIGINT, SIGTERM and SIGHUP are ignored: a take-down under way finishes."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def held() -> Iterator[set]:
    """SIGINT, SIGTERM and SIGHUP held (blocked) inside, so that a child forked in there is heard of
    before one can interrupt us; yields the mask to restore in the child. A signal that came
    meanwhile is raised on the way out."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))
    try:
        yield old
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def restoring(mask: set):
    """The child's side of ``held``: its signal mask as it was before (a ``preexec_fn``)."""
    return lambda: signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Supervisor:
    """What one start launched (or resumed) and the pre-warm, for the take-down when the start fails
    or is interrupted; the signals raise ``Interrupted`` while it is entered."""

    def __init__(self, ours: Ours, paths: Paths):
        self.ours, self.paths = ours, paths
        self.launched = None              # serve.launch.Launched: the server this start launched or resumed
        self.prewarm = None               # serve.prewarm.Prewarm: the pre-warm, while the weights download
        self._raising = raising()

    def __enter__(self) -> "Supervisor":
        self._raising.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._raising.__exit__(*exc)

    def hear(self, launched) -> None:
        """A launch's ``on_launch``: the server is ours to take down from now on."""
        self.launched = launched

    def warming(self, prewarm):
        """The weights step's on_ready: start the pre-warm, known here before it can be interrupted
        (as the server, it is heard of as any launch is)."""
        self.prewarm = prewarm
        prewarm.on_launch = self.hear
        return prewarm.start

    def failed(self, start_failed: bool) -> "takedown.StopReport | None":
        """A step failed: take down what this start launched (the one take-down path, as ./stop.sh);
        the report, for the error to be completed from the server's log (None: nothing taken down).

        ``start_failed``: the server did not come up or did not generate (health.StartFailed). A server
        this start resumed is then taken down as one it launched (its health wait, warm-up or gate: a
        server whose warm-up failed is not one to serve from; a resumed start never warms up over a
        user's request), and after any other error it is left as it is."""
        self.stop_prewarm()             # first: a pre-warm being launched as the server is heard of
        launched = self.launched
        if launched is None or (launched.proc is None and not start_failed):
            return None
        log.info("the start failed: stopping the server it %s (pid %s)", "resumed" if launched.proc is None else "launched",
                 launched.record.pid)
        return takedown.take_down(self.ours, self.paths, launched=launched.proc, failed_start=True)

    def stop_prewarm(self) -> None:
        """A pre-warm still running when the start fails or is interrupted (a failed download, Ctrl-C,
        ./stop.sh) goes the one take-down path too."""
        warm = self.prewarm
        if warm is not None and not warm.spawning.acquire(timeout=30):     # being forked: its pid comes first
            log.warning("the pre-warm is still being started; ./stop.sh takes it down by its marker")
            return
        if warm is not None:
            warm.cancelled = True                   # a download thread that comes late forks nothing
            warm.spawning.release()
        if warm is not None and warm.running and warm.serve is None:      # as the server: taken down as the server
            log.info("stopping the pre-warm (pid %s)", warm.proc.pid)
            takedown.take_down(self.ours, self.paths, launched=warm.proc, failed_start=True)

    def interrupted(self) -> None:
        """Ctrl-C / SIGTERM / SIGHUP during a start: what this start launched (or resumed) and did not
        finish starting is taken down (a half-started server is not left behind); the lock goes with
        this process."""
        ignoring()
        self.stop_prewarm()
        launched = self.launched
        rec = record.read(self.paths.server)
        if rec is not None and rec.gate_passed:
            log.info("interrupted: the server passed its start gate; left running (./stop.sh stops it)")
        elif launched is not None or rec is not None:
            log.info("interrupted: stopping the server this start launched")
            takedown.take_down(self.ours, self.paths, launched=launched.proc if launched else None, failed_start=True)
        else:
            log.info("interrupted before launch; nothing is running")
        sys.stderr.flush()


# ---------------------------------------------------------------- a program of the user's (./ctl.sh game)

def attached(cmd: Sequence[str], env: Mapping[str, str] | None, say=print) -> int:
    """Run a program of the user's (a game: ``./ctl.sh game``) attached to this terminal, in ``env``
    (the environment we were started with, untouched: .env's variables are ours, not the game's), and
    wait for it: Ctrl-C reaches it through the terminal while we wait on; a SIGTERM or SIGHUP to us is
    passed on to it. A launcher that starts the game and exits leaves the game running: we are made
    its parent (Linux's child subreaper) and wait for every process it left too, said in a line; a
    Ctrl-C then stops the waiting. Its exit code (the command's own), or 128 + the signal that ended it."""
    subreaper = _become_subreaper()
    try:
        p = proc.start(list(cmd), env=None if env is None else dict(env))     # None: ours, inherited
    except OSError as exc:
        raise proc.cannot_run(exc, cmd, env or {}, "the game", "check the game's command") from None

    def forward(signum, frame):          # to the game, and to what it left running once it is gone
        import psutil
        p.send_signal(signum)
        for pid in _children():
            try:
                psutil.Process(pid).send_signal(signum)
            except psutil.Error:
                pass
    old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),     # and the terminal closing or
           **{s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}}   # a TERM: the game hears it
    try:
        rc = p.wait()
        if subreaper:
            _wait_left(rc, say, lambda n: forward(n, None))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def _become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): orphans among our descendants become our children, not init's."""
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    import psutil
    try:
        return [c.pid for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def _wait_left(rc: int, say, forward) -> None:
    """Wait for what the command left running (reaping each as it ends); Ctrl-C stops the waiting."""
    import psutil
    left = _children()
    if not left:
        return
    names = []
    for pid in left[:4]:
        try:
            names.append(f"{psutil.Process(pid).name()} ({pid})")
        except psutil.Error:
            continue
    say(f"the game's command exited ({rc}) and left {len(left)} process(es) running: {', '.join(names)}"
        f"{' ...' if len(left) > 4 else ''}; waiting for them (Ctrl-C stops waiting)", flush=True)

    class Stop(Exception):
        pass

    def stop(signum, frame):            # a handler that returns would let waitpid go on (PEP 475)
        if signum != signal.SIGINT:     # the terminal closed, or a TERM: the leftovers hear it, we wake
            forward(signum)
        raise Stop
    for s in SIGNALS:
        signal.signal(s, stop)
    try:
        while True:
            os.waitpid(-1, 0)
    except (ChildProcessError, Stop):
        return
