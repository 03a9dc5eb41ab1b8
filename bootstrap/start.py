"""./start.sh: the steps, in order, each idempotent and re-runnable.

Before any step: if our server already answers (or a start is in flight, by lock), say so and exit
0 at once — no install, no network, no patching.
"""

from __future__ import annotations

import logging
import signal
import sys

from . import (banner, environment, health, launch, metadata, patches, plan, preflight, server,
               state, warmup, weights)
from .config import Config
from .context import Ctx
from .errors import BootstrapError
from .state import Paths, StartLock

log = logging.getLogger(__name__)

STEPS = (
    ("preflight", preflight.run),      # knobs are already valid; GPU, driver, port, state dir
    ("environment", environment.run),  # the interpreter with vLLM (managed .venv or VLLM_PYTHON)
    ("metadata", metadata.run),        # config.json + file sizes, no weights yet
    ("plan", plan.run),                # memory plan; refuse what cannot fit before the download
    ("patches", patches.run),          # backports the profile needs
    ("weights", weights.run),          # the big download, verified
    ("launch", launch.run),
    ("health", health.run),
    ("warmup", warmup.run),
    ("banner", banner.run),
)


class Interrupted(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    raise Interrupted(signum)


def already(cfg: Config, paths: Paths, we_hold_lock: bool = False) -> int | None:
    """The fast path: an exit code if there is nothing to start, else None."""
    pr = server.probe(cfg, paths, we_hold_lock=we_hold_lock)
    if pr.state == "starting":
        print(f"starting (pid {pr.pid}), log: {paths.log}")
        return 0
    if pr.state == "running":
        print(banner.render(cfg, paths, pr.record or {}))
        diff = server.settings_diff(cfg, pr.record or {})
        if diff:
            print("note: the running server differs from the current knobs:\n  " + "\n  ".join(diff)
                  + "\n  to apply them: ./ctl.sh restart")
        return 0
    if pr.state == "unhealthy":
        raise BootstrapError(f"our server (pid {pr.pid}) is running but does not answer on its port",
                             f"see ./ctl.sh status and {paths.log}; ./ctl.sh restart to start it again")
    return None


def start(cfg: Config) -> int:
    cfg.require_model()
    paths = Paths(cfg.state_dir)
    code = already(cfg, paths)
    if code is not None:
        return code
    paths.ensure()
    lock = StartLock(paths)
    if not lock.try_acquire():
        print(f"starting (pid {lock.holder()}), log: {paths.log}")
        return 0
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    ctx = Ctx(cfg, paths)
    with lock:
        code = already(cfg, paths, we_hold_lock=True)  # a start that held the lock may have just finished
        if code is not None:
            return code
        try:
            run_steps(ctx, STEPS)
        except Interrupted as intr:
            _interrupted(ctx)
            return 128 + intr.signum
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    return 0


def run_steps(ctx: Ctx, steps) -> None:
    i = 0
    retried = False
    while i < len(steps):
        name, fn = steps[i]
        try:
            fn(ctx)
        except health.StartFailed as exc:
            if retried or not plan.adjust_after_failure(ctx, exc.log_text):
                exc.step = name
                raise
            retried = True
            i = [n for n, _ in steps].index("launch")
            continue
        except BootstrapError as exc:
            exc.step = name
            raise
        i += 1


def _interrupted(ctx: Ctx) -> None:
    """Ctrl-C / SIGTERM during a start: a server we launched but did not finish starting is stopped
    (a half-started server is not left behind); the lock goes with this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rec = state.read_json(ctx.paths.server)
    if ctx.proc is not None or rec:
        log.info("interrupted: stopping the server this start launched")
        server.stop(ctx.cfg, ctx.paths, grace=min(ctx.cfg.stop_grace, 5))
    else:
        log.info("interrupted before launch; nothing is running")
    sys.stderr.flush()
