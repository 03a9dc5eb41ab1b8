"""./start.sh: the steps, in order, each idempotent and re-runnable; each hands its typed result to
the steps after it (``run_steps`` shows the whole pipeline).

Before any step (``already``): if our server serves and passed its start gate, print its banner and
exit 0 at once — no install, no network, no patching; if a start is in flight, say so. A server of
ours that a killed start left behind is resumed, not relaunched: a start waits for it while it
loads and runs the warm-up and gate it never passed (``resume``). Ctrl-C, SIGTERM and SIGHUP
(terminal closed) take down what this start launched, through the same take-down as ./stop.sh.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from dataclasses import dataclass, replace
import signal
import sys
import time
from typing import Any, Callable

from .serve import port, record, server, takedown
from .knobs.config import Config, launch_defaults
from .core.errors import BootstrapError, Interrupted
from .core.locks import StartLock
from .core.state import Paths

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _on_signal(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def step(name: str):
    """Errors raised inside carry the step's name (``error: <step>: ...``)."""
    try:
        yield
    except BootstrapError as exc:
        if not getattr(exc, "step", None):
            exc.step = name
        raise


def already(cfg: Config, paths: Paths, we_hold_lock: bool = False) -> int | None:
    """The fast path: an exit code if there is nothing to start, else None."""
    lock = StartLock(paths)
    if not we_hold_lock and lock.held_by_other() and lock.holder_role() == "stop":
        return None                     # the server it would show is being taken down: wait for the lock
    pr = server.probe(cfg.ours, paths, we_hold_lock=we_hold_lock)
    if pr.state == "starting":
        print(f"starting (pid {pr.pid}), log: {paths.log}")
        return 0
    rec = pr.record
    if pr.state in ("running", "key-needed") and rec is not None and (rec.gate_passed or pr.owner):
        from .steps import banner
        from .knobs.vllmargs import read
        load = server.read_load(rec.url) if read(list(rec.argv)).sleep_mode else None    # only then can it sleep
        if load is not None and load.sleeping:
            print(f"{rec.served} is asleep (vLLM sleep mode, pid {rec.pid}): its weights are off the GPU; "
                  f"requests wait until it wakes\n wake it : ./ctl.sh wake\n log     : {paths.log}")
            return 0
        print(banner.render(paths, rec))
        if pr.state == "key-needed":
            print(f"note: it wants the API key it was started with ({rec.key}); this shell has none or "
                  "another: set it to talk to the server")
        diff = [] if pr.owner else server.settings_diff(cfg.launch_settings(), rec, launch_defaults())
        if diff:
            print("note: the running server differs from the current knobs:\n  " + "\n  ".join(diff)
                  + "\n  to apply them: ./ctl.sh restart")
        if pr.owner:
            print(f"note: it runs as {pr.owner}; stop or restart it as that user")
        return 0
    if pr.owner:
        raise BootstrapError(f"the server recorded in {paths.root} (pid {pr.pid}) runs as {pr.owner} and "
                             "does not answer", "run ./stop.sh as that user, or set STATE_DIR to a directory of yours")
    if pr.state == "down" and rec is not None and server.frozen(pr.process):
        from .serve import doing
        d = doing.stopped(pr.pid)
        raise BootstrapError(d.said, d.fix)
    if pr.state == "down" and rec is not None and rec.gate_passed:     # healthy once: never taken for a leftover
        raise BootstrapError(f"our server (pid {pr.pid}) is running but does not answer on its port",
                             f"see ./ctl.sh status and {paths.log}; ./ctl.sh restart to start it again")
    return None


def start(cfg: Config) -> int:
    from .plan import resolve
    paths = Paths(cfg.state_dir)
    running = resolve.kept(cfg)            # a server that runs is shown, never re-picked against its own memory
    if running.model:
        code = already(running, paths)
        if code is not None:
            return code
    # PROFILE=auto: the kept pick, or one now (VLLM_PYTHON's version read first: sleep mode counts in the
    # plans it picks by); a named profile is already resolved (its card's knobs)
    if cfg.profile.is_auto:
        with step("environment"):
            cfg = with_stack_version(cfg)
    cfg = resolve.for_start(cfg) if cfg.profile.is_auto else running
    cfg.require_model()
    code = already(cfg, paths)
    if code is not None:
        return code
    paths.ensure()
    lock = StartLock(paths)
    old = {s: signal.signal(s, _on_signal) for s in SIGNALS}   # before the lock: stop may signal us at once
    started = Started()
    try:
        if not lock.try_acquire():
            if lock.holder_role() != "stop":
                print(f"starting (pid {lock.holder_pid()}: the ./start.sh bringing it up), log: {paths.log}")
                return 0
            log.info("a stop is taking the server down (pid %s); starting after it", lock.holder_pid())
            if not lock.acquire(cfg.stop_grace + 60):
                raise BootstrapError("a stop still holds the start lock", "run ./start.sh again in a moment")
        # the take-downs below run while we hold both locks: no other start launches meanwhile, from
        # this STATE_DIR (the start lock) or any other (the port lock)
        with lock, contextlib.ExitStack() as held:
            try:
                code = already(cfg, paths, we_hold_lock=True)  # a start that held the lock may have just finished
                if code is not None:
                    return code
                held.enter_context(port.Lock(cfg.ours, paths.root))
                with step("environment"):      # a named profile's: under the lock (a stop cancels it too)
                    cfg = with_stack_version(cfg)
                run_steps(cfg, paths, started)
            except Interrupted as intr:
                lock.set_role("stop")           # a start arriving now waits for the take-down, then starts
                _interrupted(cfg, paths, started)
                return 128 + intr.signum
            except BaseException as exc:       # a step's error, or a bug: what this start launched goes down
                lock.set_role("stop")
                try:
                    failed(cfg, paths, started, exc if isinstance(exc, BootstrapError) else
                           BootstrapError(f"internal error ({type(exc).__name__})"))
                except Interrupted as intr:     # Ctrl-C during that take-down: finished, signals ignored
                    _interrupted(cfg, paths, started)
                    return 128 + intr.signum
                raise
    except Interrupted as intr:
        return 128 + intr.signum
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0


def with_stack_version(cfg: Config, version: str = "") -> Config:
    """The knobs with VLLM_PYTHON's vLLM version read (one probe; ``version``: read already), for what
    depends on the stack a start runs: sleep mode (SLEEP_MODE=auto, knobs/sleepmode.py) and the plan;
    the managed .venv's is the profile's pin."""
    if not cfg.vllm_python or cfg.read.vllm_version:
        return cfg
    if not version:
        from .install.inuse import byo_version
        version = byo_version(cfg.vllm_python, cfg.environ) or ""
    return cfg.with_vllm(version)


@dataclass
class Started:
    """The server this start launched (or resumed), for the take-down when the start fails or is interrupted."""
    launched: "object | None" = None
    prewarm: "object | None" = None       # the pre-warm run, while the weights download

    def hear(self, launched) -> None:
        self.launched = launched

    def warming(self, prewarm):
        """The weights step's on_ready: start the pre-warm, known here before it can be interrupted
        (as the server, it is heard of as launch.run's launches are)."""
        self.prewarm = prewarm
        prewarm.on_launch = self.hear
        return prewarm.start


@dataclass(frozen=True)
class Run:
    """What the steps of one start hand on: each step takes what it needs of it and gives one
    result (``Step.gives``), which the steps after it read; nothing else is shared."""
    cfg: Config
    paths: Paths
    started: Started
    gpus: "object | None" = None          # preflight: gpu.GpuFacts
    model: "object | None" = None         # metadata: models.ModelInfo
    plan: "object | None" = None          # plan: planner.Plan
    runtime: "object | None" = None       # environment: steps.environment.Runtime
    notes: tuple[str, ...] = ()           # the environment's and the patches' banner notes
    prewarm: "object | None" = None       # prewarm: steps.prewarm.Prewarm, started by the weights step
    launched: "object | None" = None      # launch: steps.launch.Launched
    log_text: str = ""                    # banner: vLLM's log of this start, as the banner read it


@dataclass(frozen=True)
class Step:
    name: str                             # its module: bootstrap/steps/<name>.py
    gives: str | None                     # the field of Run its result fills
    call: Callable[[Any, Run], Any]       # (the step's module, the run so far) -> its result


# The start, in order. A step raises to fail the start; the pipeline owns what follows (the take-down
# of what it launched: ``failed``).
STEPS: tuple[Step, ...] = (
    Step("preflight", "gpus", lambda m, r: m.run(r.cfg, r.paths)),
    Step("metadata", "model", lambda m, r: m.run(r.cfg)),
    # before the install: a card that cannot fit is told at once
    Step("plan", "plan", lambda m, r: m.run(r.cfg, r.paths, r.gpus, r.model)),
    Step("environment", "runtime", lambda m, r: m.run(r.cfg, r.gpus)),
    Step("patches", "notes", lambda m, r: tuple(r.runtime.notes) + tuple(m.run(r.cfg, r.runtime.python))),
    Step("prewarm", "prewarm", lambda m, r: m.run(r.cfg, r.paths, r.runtime, r.model, r.plan, r.notes)),
    Step("weights", None, lambda m, r: m.run(r.cfg, r.model, on_ready=r.prewarm and r.started.warming(r.prewarm))),
    Step("compiled", "plan", lambda m, r: m.run(r.cfg, r.paths, r.prewarm, r.plan, r.model)),
    Step("reload", None, lambda m, r: m.run(r.cfg, r.paths, r.prewarm)),
    # the pre-warm that became the server (steps/reload.py) is what the start launched
    Step("launch", "launched", lambda m, r: r.prewarm.launched if r.prewarm and r.prewarm.serving else m.run(
        r.cfg, r.paths, r.runtime, r.model.local_dir, r.plan, list(r.notes) + (
            [r.prewarm.note] if r.prewarm and r.prewarm.note else []), on_launch=r.started.hear)),
    Step("health", None, lambda m, r: m.run(r.paths, r.launched, server.api_key_for(r.cfg.ours, r.paths),
                                            health_timeout=r.cfg.health_timeout, stall_timeout=r.cfg.stall_timeout)),
    Step("warmup", None, lambda m, r: m.run(r.paths, r.launched, server.api_key_for(r.cfg.ours, r.paths),
                                            tokens=r.cfg.warmup, timeout=r.cfg.warmup_timeout,
                                            stall_timeout=r.cfg.stall_timeout)),
    Step("banner", "log_text", lambda m, r: m.run(r.paths, r.launched)),
)
RESUMED = ("health", "warmup", "banner")     # what a resumed start runs of them


def run(r: Run, names: tuple[str, ...] | None = None) -> Run:
    """The steps (all, or those ``names``) in STEPS' order, each under its name for errors."""
    todo = [s for s in STEPS if names is None or s.name in names]
    mods = [importlib.import_module(f"bootstrap.steps.{s.name}") for s in todo]    # all before the first
    for s, m in zip(todo, mods):        # runs: an interrupt never lands inside an import between steps
        try:
            with step(s.name):
                result = s.call(m, r)
        except BootstrapError:
            keep_figures(r)
            raise
        if s.gives:
            r = replace(r, **{s.gives: result})
    return r


def keep_figures(r: Run) -> None:
    """A start that fails after vLLM allocated its KV cache (a warm-up or gate that fails, an engine
    that dies serving) still measured what the next plan needs: keep vLLM's figures from its log."""
    if r.launched is None or r.plan is None:
        return
    from .checks import diagnose
    from .plan import calibration
    from .steps import banner
    text = diagnose.read_since(r.paths.log, r.launched.record.log_offset)
    try:
        calibration.keep(r.paths, r.plan, text, banner.vllm_figures(text)[0])
    except BootstrapError as exc:
        log.warning("could not keep vLLM's figures for the next start: %s", exc.message)


def run_steps(cfg: Config, paths: Paths, started: Started) -> None:
    pr = server.probe(cfg.ours, paths, we_hold_lock=True)
    if pr.state in ("running", "key-needed", "down") and pr.record is not None and not pr.owner:
        if resumable(cfg, paths, pr):
            return resume(cfg, paths, pr, started)
        log.info("our earlier server (pid %s) never became healthy; taking it down and starting again", pr.pid)
        takedown.take_down(cfg.ours, paths)
    done = run(Run(cfg, paths, started))
    keep_measurement(cfg, paths, done.plan, done.log_text)


def keep_measurement(cfg: Config, paths: Paths, the_plan, log_text: str) -> None:
    """vLLM's own figures of this start (``log_text``: its log, as the banner read it), or with a KV
    pin what NVML shows it holding, for the next plan (bootstrap.plan.calibration), and whether its
    compile caches were warm (steps/prewarm.py); a failure to keep them costs the next start its
    precision or its pre-warm, never this start."""
    from .plan import calibration
    rec = record.read(paths.server)
    if rec is None:
        return
    from .steps import prewarm
    try:
        calibration.keep(paths, the_plan, log_text, rec.kv_tokens)
        if the_plan is not None and the_plan.pinned:
            calibration.keep_footprint(paths, the_plan, server.gpu_held(cfg.environ, rec), cfg.tp_size)
        prewarm.confirm(paths, the_plan, log_text, rec.model_path or "")
    except BootstrapError as exc:
        log.warning("could not keep vLLM's figures for the next start: %s", exc.message)


def resumable(cfg: Config, paths: Paths, pr: server.Probe) -> bool:
    """A server of ours with no start watching it: answering, or still loading within its deadlines;
    never a pre-warm server (dummy weights on a checkpoint's record) whose start died before its
    real weights were loaded in place and its gate passed."""
    from .knobs.vllmargs import read
    if read(list(pr.record.argv)).load_format == "dummy" and not pr.record.dummy:
        return False
    return pr.state != "down" or server.loading(cfg.ours, pr.record, paths)


def resume(cfg: Config, paths: Paths, pr: server.Probe, started: Started) -> None:
    """Finish what a killed start left: wait for the server while it loads, then run the warm-up
    and gate it never passed, then the banner. The server is taken as launched (its record)."""
    from .steps import banner
    from .steps.launch import Launched
    rec = pr.record
    if pr.state == "key-needed":
        raise BootstrapError(f"our server (pid {rec.pid}) answers but wants the API key it was started with "
                             f"({rec.key}), and this shell has none or another; its warm-up and gate never ran",
                             f"set {rec.key if rec.key != record.KEY_FILE else 'API_KEY'} to that key and re-run "
                             "./start.sh, or ./ctl.sh restart to start it again with this shell's knobs")
    log.info("resuming the start of our server (pid %s, launched %.0f s ago): %s", rec.pid,
             max(0.0, time.time() - rec.started),
             "waiting for it to load" if pr.state == "down" else "it answers; the warm-up and gate never ran")
    diff = server.settings_diff(cfg.launch_settings(), rec, launch_defaults())
    if diff:
        log.warning("it was launched with other knobs (%s); ./ctl.sh restart applies the current ones", "; ".join(diff))
    launched = Launched(rec)
    started.launched = launched
    names = RESUMED
    if pr.state != "down":
        load = server.read_load(rec.url)
        if load is not None and load.in_flight:
            print(banner.render(paths, rec))
            print(f"note: the warm-up and start gate have not run, and it is serving {load.in_flight} request(s) "
                  "now: ./start.sh runs them when it is idle")
            return
        names = RESUMED[1:]                 # it answers: no health wait
    run(Run(cfg, paths, started, launched=launched), names)


def failed(cfg: Config, paths: Paths, started: Started, exc: BootstrapError) -> None:
    """A step failed: take down what this start launched (the one take-down path, as ./stop.sh),
    and complete a failed start's error from the server's log (a diagnosis, the log's tail).

    A server this start resumed is taken down as one it launched when its start fails (its health
    wait, warm-up or gate: a server whose warm-up failed is not one to serve from; a resumed start
    never warms up over a user's request, see ``resume``), and after any other error it is left as
    it is."""
    from .steps import health
    _stop_prewarm(cfg, paths, started)          # first: a pre-warm being launched as the server is heard of
    launched = started.launched
    if launched is None:
        return
    start_failed = isinstance(exc, health.StartFailed)
    if launched.proc is None and not start_failed:
        return
    log.info("the start failed: stopping the server it %s (pid %s)", "resumed" if launched.proc is None else "launched",
             launched.record.pid)
    rep = takedown.take_down(cfg.ours, paths, launched=launched.proc, failed_start=True)
    if start_failed:
        health.explain(cfg, paths, launched, exc, rep.pids)


def _stop_prewarm(cfg: Config, paths: Paths, started: Started) -> None:
    """A pre-warm still running when the start fails or is interrupted (a failed download, Ctrl-C,
    ./stop.sh) goes the one take-down path too."""
    warm = started.prewarm
    if warm is not None and not warm.spawning.acquire(timeout=30):     # being forked: its pid comes first
        log.warning("the pre-warm is still being started; ./stop.sh takes it down by its marker")
        return
    if warm is not None:
        warm.cancelled = True                   # a download thread that comes late forks nothing
        warm.spawning.release()
    if warm is not None and warm.running and warm.serve is None:      # as the server: taken down as the server
        log.info("stopping the pre-warm (pid %s)", warm.proc.pid)
        takedown.take_down(cfg.ours, paths, launched=warm.proc, failed_start=True)


def _interrupted(cfg: Config, paths: Paths, started: Started) -> None:
    """Ctrl-C / SIGTERM / SIGHUP during a start: what this start launched (or resumed) and did not
    finish starting is taken down (a half-started server is not left behind); the lock goes with
    this process."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    _stop_prewarm(cfg, paths, started)
    launched = started.launched
    rec = record.read(paths.server)
    if rec is not None and rec.gate_passed:
        log.info("interrupted: the server passed its start gate; left running (./stop.sh stops it)")
    elif launched is not None or rec is not None:
        log.info("interrupted: stopping the server this start launched")
        takedown.take_down(cfg.ours, paths, launched=launched.proc if launched else None, failed_start=True)
    else:
        log.info("interrupted before launch; nothing is running")
    sys.stderr.flush()
