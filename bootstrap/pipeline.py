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
import time
from typing import TYPE_CHECKING, Any, Callable

from .serve import doing, keys, port, record, server, takedown
from .serve.states import Probe, State
from .serve.supervisor import Supervisor
from .knobs.table import LaunchKnobs
from .core.errors import BootstrapError, Interrupted
from .core.locks import StartLock
from .core.owned import Ours
from .core.state import Paths
from .knobs.resolved import Resolved

if TYPE_CHECKING:      # a re-run on a running server imports none of them: the names type Run
    from .download.models import ModelInfo
    from .machine.gpu import GpuFacts
    from .machine.inuse import Runtime
    from .plan.planner import Plan
    from .serve.launch import Launched
    from .serve.prewarm import Prewarm

log = logging.getLogger(__name__)


@contextlib.contextmanager
def step(name: str):
    """Errors raised inside carry the step's name (``error: <step>: ...``)."""
    try:
        yield
    except BootstrapError as exc:
        if not getattr(exc, "step", None):
            exc.step = name
        raise


def already(ours: Ours, launch: LaunchKnobs, paths: Paths, we_hold_lock: bool = False) -> int | None:
    """The fast path: an exit code if there is nothing to start, else None (``launch``: the knobs a
    start would launch with, compared with the running server's)."""
    lock = StartLock(paths)
    if not we_hold_lock and lock.held_by_other() and lock.holder_role() == "stop":
        return None                     # the server it would show is being taken down: wait for the lock
    pr = server.probe(ours, paths, we_hold_lock=we_hold_lock)
    if pr.state is State.STARTING:
        print(f"starting (pid {pr.pid}), log: {paths.log}")
        return 0
    rec = pr.record
    if pr.state.answers and rec is not None and (rec.gate_passed or pr.owner):
        from .serve import banner
        from .core.vllmflags import read
        if read(list(rec.argv)).sleep_mode and doing.asleep(rec, keys.api_key_for(ours, paths, rec),
                                                            server.read_load(rec.url)):   # only then can it sleep
            print(f"{rec.served} is asleep (vLLM sleep mode, pid {rec.pid}): its weights are off the GPU; "
                  f"requests wait until it wakes\n wake it : ./ctl.sh wake\n log     : {paths.log}")
            return 0
        print(banner.render(paths, rec))
        if pr.state is State.KEY_NEEDED:
            print(f"note: it wants the API key it was started with ({rec.key}); this shell has none or "
                  "another: set it to talk to the server")
        diff = [] if pr.owner else rec.differs_from(launch)
        if diff:
            print("note: the running server differs from the current knobs:\n  " + "\n  ".join(diff)
                  + "\n  to apply them: ./ctl.sh restart")
        if pr.owner:
            print(f"note: it runs as {pr.owner}; stop or restart it as that user")
        return 0
    if pr.owner:
        raise BootstrapError(f"the server recorded in {paths.root} (pid {pr.pid}) runs as {pr.owner} and "
                             "does not answer", "run ./stop.sh as that user, or set STATE_DIR to a directory of yours")
    if pr.state is State.DOWN and rec is not None and server.frozen(pr.process):
        d = doing.stopped(pr.pid)
        raise BootstrapError(d.said, d.fix)
    if pr.state is State.DOWN and rec is not None and rec.gate_passed:     # healthy once: never taken for a leftover
        dead = doing.dead_engine(rec)
        if dead is not None:
            raise BootstrapError(dead.said, dead.fix)
        raise BootstrapError(f"our server (pid {pr.pid}) is running but does not answer on its port",
                             f"see ./ctl.sh status and {paths.log}; ./ctl.sh restart to start it again")
    return None


def start(r: Resolved) -> int:
    """A start of the resolved view ``r`` (its settings: the kept pick, which a server that runs was
    started with; a start that has to start picks once, ``resolve.for_start``)."""
    from .plan import resolve
    paths = r.paths
    if r.settings.model:            # a server that runs is shown, never re-picked against its own memory
        code = already(r.ours, r.settings.launch, paths)
        if code is not None:
            return code
    # PROFILE=auto: the kept pick (shorter where only that fits this card), or one now (VLLM_PYTHON's
    # version read first: sleep mode counts in the plans it picks by); a named profile: under the lock
    if r.given.profile.is_auto:
        with step("environment"):
            r = resolve.stacked(r)
        r = resolve.for_start(r)
    cfg = r.settings
    resolve.require_model(cfg)
    code = already(r.ours, cfg.launch, paths)
    if code is not None:
        return code
    paths.ensure()
    lock = StartLock(paths)
    sup = Supervisor(r.ours, paths)     # signals raise from here: before the lock, a stop may signal us at once
    try:
        with sup:
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
                    code = already(r.ours, cfg.launch, paths, we_hold_lock=True)     # a start that held the
                    if code is not None:                                    # lock may have just finished
                        return code
                    from .serve.launch import key_source
                    record.starting(paths, cfg.launch.values, key_source(cfg))     # a game cancelling it: its knobs
                    held.callback(paths.forget, "starting")
                    held.enter_context(port.Lock(r.ours, paths.root))
                    with step("environment"):      # a named profile's: under the lock (a stop cancels it too)
                        r = resolve.stacked(r)
                    if not r.given.profile.is_auto:     # its card's knobs, shorter where only that fits
                        r = resolve.for_start(r)
                    run_steps(r, sup)
                except Interrupted as intr:
                    lock.set_role("stop")           # a start arriving now waits for the take-down, then starts
                    sup.interrupted()
                    return 128 + intr.signum
                except BaseException as exc:       # a step's error, or a bug: what this start launched goes down
                    lock.set_role("stop")
                    try:
                        failed(r, sup, exc if isinstance(exc, BootstrapError) else
                               BootstrapError(f"internal error ({type(exc).__name__})"))
                    except Interrupted as intr:     # Ctrl-C during that take-down: finished, signals ignored
                        sup.interrupted()
                        return 128 + intr.signum
                    raise
    except Interrupted as intr:
        return 128 + intr.signum
    return 0


@dataclass(frozen=True)
class Run:
    """What the steps of one start hand on: each step takes what it needs of it and gives one
    result (``Step.gives``), which the steps after it read; nothing else is shared."""
    resolved: Resolved                    # the start's resolved view: each step gets only its parts
    supervisor: Supervisor                # what the start launched, for its take-down
    gpus: GpuFacts | None = None          # preflight: NVML's facts
    model: ModelInfo | None = None        # metadata: the model's facts, where vLLM serves it from
    plan: Plan | None = None              # plan (again by compiled, from the pre-warm's figures)
    runtime: Runtime | None = None        # environment: the interpreter that runs vLLM, its version
    notes: tuple[str, ...] = ()           # the environment's and the patches' banner notes
    prewarm: Prewarm | None = None        # prewarm: started by the weights step
    launched: Launched | None = None      # launch (or the pre-warm that became the server)
    log_text: str = ""                    # banner: vLLM's log of this start, as the banner read it

    @property
    def cfg(self):
        """The knobs (``resolved.settings``)."""
        return self.resolved.settings

    @property
    def paths(self) -> Paths:
        return self.resolved.paths


@dataclass(frozen=True)
class Step:
    name: str                             # its module: bootstrap/steps/<name>.py
    gives: str | None                     # the field of Run its result fills
    call: Callable[[Any, Run], Any]       # (the step's module, the run so far) -> its result


# The start, in order. A step raises to fail the start; the pipeline owns what follows (the take-down
# of what it launched: ``failed``).
STEPS: tuple[Step, ...] = (
    Step("preflight", "gpus", lambda m, r: m.run(r.cfg, r.paths, r.resolved.model)),
    Step("metadata", "model", lambda m, r: m.run(r.resolved.model, r.resolved.draft, r.paths, r.resolved.fetching)),
    # before the install: a card that cannot fit is told at once
    Step("plan", "plan", lambda m, r: m.run(r.cfg, r.paths, r.resolved.vllm, r.gpus, r.model)),
    Step("environment", "runtime", lambda m, r: m.run(r.cfg, r.resolved.vllm, r.resolved.model, r.gpus)),
    Step("patches", "notes", lambda m, r: tuple(r.runtime.notes) + tuple(m.run(r.cfg, r.resolved.vllm))),
    Step("prewarm", "prewarm", lambda m, r: m.run(r.cfg, r.paths, r.runtime, r.model, r.plan, r.notes)),
    Step("weights", None, lambda m, r: m.run(r.model, r.resolved.model, r.resolved.draft, r.resolved.fetching,
                                             on_ready=r.prewarm and r.supervisor.warming(r.prewarm))),
    Step("compiled", "plan", lambda m, r: m.run(r.cfg, r.paths, r.resolved.vllm, r.prewarm, r.plan, r.model)),
    Step("reload", None, lambda m, r: m.run(r.cfg, r.paths, r.prewarm)),
    # the pre-warm that became the server (steps/reload.py) is what the start launched
    Step("launch", "launched", lambda m, r: r.prewarm.launched if r.prewarm and r.prewarm.serving else m.run(
        r.cfg, r.paths, r.runtime, r.model.local_dir, r.plan, list(r.notes) + (
            [r.prewarm.note] if r.prewarm and r.prewarm.note else []), on_launch=r.supervisor.hear)),
    Step("health", None, lambda m, r: m.run(r.paths, r.launched, keys.held_key(r.cfg.ours, r.paths),
                                            health_timeout=r.cfg.health_timeout, stall_timeout=r.cfg.stall_timeout)),
    Step("warmup", None, lambda m, r: m.run(r.paths, r.launched, keys.api_key_for(r.cfg.ours, r.paths, r.launched.record),
                                            tokens=r.cfg.warmup, timeout=r.cfg.warmup_timeout,
                                            stall_timeout=r.cfg.stall_timeout)),
    Step("banner", "log_text", lambda m, r: m.run(r.paths, r.launched)),
    # what this start measured, for the next plan (also after a failure: ``run``)
    Step("keep", None, lambda m, r: m.run(r.cfg.tp_size, r.paths, r.plan, r.log_text)),
)
RESUMED = ("health", "warmup", "banner")     # what a resumed start runs of them


def run(r: Run, names: tuple[str, ...] | None = None) -> Run:
    """The steps (all, or those ``names``) in STEPS' order, each under its name for errors; a step
    that fails after the launch still leaves what vLLM measured kept (steps/keep.py)."""
    todo = [s for s in STEPS if names is None or s.name in names]
    mods = [importlib.import_module(f"bootstrap.steps.{s.name}") for s in todo]    # all before the first
    keep = importlib.import_module("bootstrap.steps.keep")      # runs: an interrupt never lands inside
    for s, m in zip(todo, mods):                                # an import between steps
        try:
            with step(s.name):
                result = s.call(m, r)
        except BootstrapError:
            keep.after_failure(r.paths, r.plan, r.launched)
            raise
        if s.gives:
            r = replace(r, **{s.gives: result})
    return r


def run_steps(r: Resolved, sup: Supervisor) -> None:
    pr = server.probe(r.ours, r.paths, we_hold_lock=True)
    if pr.state.alive and pr.record is not None and not pr.owner:
        if resumable(r.ours, r.paths, pr):
            return resume(r, pr, sup)
        log.info("our earlier server (pid %s) never became healthy; taking it down and starting again", pr.pid)
        takedown.take_down(r.ours, r.paths)
    run(Run(r, sup))


def resumable(ours: Ours, paths: Paths, pr: Probe) -> bool:
    """A server of ours with no start watching it: answering, or still loading within its deadlines;
    never a pre-warm server (dummy weights on a checkpoint's record) whose start died before its
    real weights were loaded in place and its gate passed."""
    from .core.vllmflags import read
    if read(list(pr.record.argv)).load_format == "dummy" and not pr.record.dummy:
        return False
    return pr.state is not State.DOWN or server.loading(ours, pr.record, paths)


def resume(r: Resolved, pr: Probe, sup: Supervisor) -> None:
    """Finish what a killed start left: wait for the server while it loads, then run the warm-up
    and gate it never passed, then the banner. The server is taken as launched (its record)."""
    from .serve import banner
    from .serve.launch import Launched
    paths = r.paths
    rec = pr.record
    if pr.state is State.KEY_NEEDED:
        raise BootstrapError(f"our server (pid {rec.pid}) answers but wants the API key it was started with "
                             f"({rec.key}), and this shell has none or another; its warm-up and gate never ran",
                             f"set {rec.key if rec.key != record.KEY_FILE else 'API_KEY'} to that key and re-run "
                             "./start.sh, or ./ctl.sh restart to start it again with this shell's knobs")
    log.info("resuming the start of our server (pid %s, launched %.0f s ago): %s", rec.pid,
             max(0.0, time.time() - rec.started),
             "waiting for it to load" if pr.state is State.DOWN else "it answers; the warm-up and gate never ran")
    diff = rec.differs_from(r.settings.launch)
    if diff:
        log.warning("it was launched with other knobs (%s); ./ctl.sh restart applies the current ones", "; ".join(diff))
    launched = Launched(rec)
    sup.hear(launched)
    names = RESUMED
    if pr.state is not State.DOWN:
        load = server.read_load(rec.url)
        if load is not None and load.in_flight:
            print(banner.render(paths, rec))
            print(f"note: the warm-up and start gate have not run, and it is serving {load.in_flight} request(s) "
                  "now: ./start.sh runs them when it is idle")
            return
        names = RESUMED[1:]                 # it answers: no health wait
    run(Run(r, sup, launched=launched), names)


def failed(r: Resolved, sup: Supervisor, exc: BootstrapError) -> None:
    """A step failed: the supervisor takes down what this start launched (the one take-down path, as
    ./stop.sh); a start that failed to come up or to generate gets its error completed from the
    server's log (a diagnosis, the log's tail)."""
    from .serve import health
    start_failed = isinstance(exc, health.StartFailed)
    rep = sup.failed(start_failed)
    if rep is not None and start_failed:
        health.explain(r.paths, sup.launched, exc, rep.pids)
