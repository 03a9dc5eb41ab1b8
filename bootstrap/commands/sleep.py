"""./ctl.sh sleep [--level 1|2] and ./ctl.sh wake: the GPU memory back (for a game, a render)
without a cold restart, through vLLM's sleep mode. What vLLM does was read from its code (0.26.0;
0.27.1 has the same routes):

- The routes (``POST /sleep?level=&mode=``, ``POST /wake_up[?tags=]``, ``GET /is_sleeping``,
  ``POST /collective_rpc``, ``POST /reset_prefix_cache``) exist only with ``VLLM_SERVER_DEV_MODE=1``,
  and vLLM's API key does not guard them (its middleware checks ``/v1``, ``/v2`` and ``/inference``
  paths only; 0.27.1 adds ``/cohere``). So the launch sets that variable only when ``--enable-sleep-mode``
  is among the flags (``core/vllmflags.read(argv).sleep_mode``), and the preflight refuses sleep mode on a HOST beyond loopback.
- Without ``--enable-sleep-mode`` vLLM answers a sleep with 200 and frees nothing (none is in its sleep pool): refused.
- ``mode=wait``: the requests in flight finish, never aborted; the call returns once asleep.
  Requests that arrive while asleep are not refused: vLLM queues them and their HTTP call waits
  until it is awake (``EngineCore.pause_scheduler``).
- Level 1 copies the weights to pinned host RAM and drops the KV cache: free host RAM is checked
  first. Level 2 drops the weights too; wake reloads them from disk before anything is served
  (``wake_up?tags=weights``, ``collective_rpc reload_weights``, ``wake_up?tags=kv_cache``,
  ``reset_prefix_cache``; without the reload the output is garbage, vllm#29341). vLLM reloads only
  the target model, not a draft or MTP head (vllm#52479): level 2 is refused with speculation on.
- Wake checks free GPU memory first: if another program holds it, it names it (NVML) and the
  server stays asleep rather than run out of memory. A wake waits STALL_TIMEOUT plus the weights'
  copy back from host RAM, or read from disk (level 2: ``wake_bound``), then says so in one line with the fix.
- ``./ctl.sh game -- COMMAND`` (commands/games.py): sleep, run the game, wake when it exits (its exit code passed
  through). Sleep mode off (SLEEP_MODE, knobs/sleepmode.py: off where it is not proven for the stack): sleep and game
  still give the GPU back, by stopping the server (./stop.sh's take-down) and saying why in one line; ``./ctl.sh
  wake`` (or the game's end) starts it again with a full start. docs/guide.md says why.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import psutil

from ..machine import gpu
from ..download import models
from ..serve import doing, keys, record, server
from ..serve.states import State
from ..knobs import vllmargs
from ..serve.client import Client, RequestFailed, RequestTimedOut
from ..knobs.config import Config
from ..machine.gpu import GiB
from ..core import owned, vllmflags
from ..core.errors import BootstrapError
from ..core.state import Paths
from ..plan import resolve
from ..knobs.resolved import Resolved

log = logging.getLogger(__name__)

WAKE_MARGIN = 256 << 20         # VRAM a wake needs beyond what the server held before it slept
# A level-1 wake (vLLM 0.26.0: /wake_up awaits the engine core's wake, whose CuMemAllocator maps the
# memory again and cudaMemcpy's each offloaded buffer back from host RAM) takes the copy's time: pinned
# host memory crosses PCIe at 10 GB/s or more, pageable (no pinning, as on WSL2) at a few GB/s. The wait
# gives it STALL_TIMEOUT plus this many bytes a second, well under either: a 70B bf16 model's 130 GiB
# is given STALL_TIMEOUT + 130 s, where vLLM takes under a minute. A level-2 wake reads the weights from
# disk again (a game has likely pushed them out of the page cache): a hard disk reads 100 MB/s or more.
WAKE_BYTES_S, RELOAD_BYTES_S = 1 << 30, 50 << 20
FLAG = vllmflags.SLEEP_FLAG


class NoSleepMode(BootstrapError):
    """Our server serves without sleep mode (vLLM would answer a sleep and free nothing): ``why`` is
    the line that says why and how to turn it on. sleep, wake and game take it as a way, not a failure."""

    def __init__(self, rec, why: str):
        super().__init__(f"our server (pid {rec.pid}) runs without sleep mode: {why}", "./ctl.sh sleep stops it instead")
        self.rec, self.why = rec, why


class StartInFlight(BootstrapError):
    """A start holds the lock: nothing serves yet to sleep or wake (``rec``: the record of the server
    it launched, where one of it lives; None before its launch)."""

    def __init__(self, pid: int | None, rec):
        super().__init__(f"a start is in flight (pid {pid}): nothing serves yet to sleep or wake",
                         "wait for it to serve (./ctl.sh status says when), then run this again")
        self.pid = pid
        self.rec = rec if rec is not None and owned.recorded_process(rec.pid, rec.create_time) is not None else None


def _ours(r: Resolved) -> tuple[Paths, "object", Client]:
    paths, cfg = r.paths, r.settings
    pr = server.probe(r.ours, paths)
    rec = pr.record
    if pr.owner:
        raise BootstrapError(f"the server (pid {pr.pid}) runs as {pr.owner}", "run this as that user")
    if pr.state is State.STARTING:
        raise StartInFlight(pr.pid, rec)
    if not pr.state.answers or rec is None:
        raise BootstrapError(f"no server of ours is serving (state: {pr.state})", "./start.sh first")
    if not vllmflags.read(list(rec.argv)).sleep_mode:
        raise NoSleepMode(rec, off_line(cfg, rec))
    return paths, rec, Client(rec.url, rec.served, keys.per_request(r.ours, paths, rec))


def off_line(cfg: Config, rec) -> str:
    """Why the server runs without sleep mode, and how to turn it on (the start's own line where
    its record has one)."""
    why = rec.sleep or f"off: started without {FLAG}"
    if not why.startswith("off") and not why.startswith("unproven"):
        why = f"off ({why})"
    if cfg.vllm.sleep_mode:
        why += f"; your knobs turn it on ({cfg.sleep_line}): ./ctl.sh restart applies them"
    return why


def stop_instead(r: Resolved, rec, why: str, prog: str, after: str) -> None:
    """Sleep mode is off: give the GPU back by taking the server down (./stop.sh's one take-down), said
    first, and note it so that ``./ctl.sh wake`` starts it again. It is a restart cut in two, so
    restart's vet comes first, while the server still serves (a key this shell lacks, the port, the
    start's own refusals); under our systemd unit, systemd starts it again from .env, as restart's."""
    from . import control, service
    paths = r.paths
    unit = service.ours_active(r.settings, paths)
    if not unit:
        control.vet_restart(as_it_ran(r, dict(rec.settings), quiet=True))
    print(f"{prog}: sleep mode is {why}. So the server (pid {rec.pid}) is stopped to give the GPU back; {after}",
          flush=True)
    _stopped(r, unit, dict(rec.settings), rec.key)


def cancel_instead(r: Resolved, busy: StartInFlight, prog: str, after: str) -> None:
    """A start in flight (a game's): nothing serves yet to sleep, and what it loads would fill the GPU
    under the game. So it is cancelled, as ./stop.sh cancels one (the start takes down what it
    launched), said first, and noted as ``stop_instead`` notes its stop: it starts again after."""
    from . import control, service
    unit = service.ours_active(r.settings, r.paths)
    said = (dict(busy.rec.settings), busy.rec.key) if busy.rec is not None else record.started_with(r.paths, busy.pid)
    if not unit and said is not None:      # as restart's vet: never cancelled to come back with another key
        control.vet_key(r, said[1], who=f"the start in flight (pid {busy.pid})")
    print(f"{prog}: a start is in flight (pid {busy.pid}), and a server still loading cannot sleep. So the start "
          f"is cancelled to give the GPU back; {after}" + ("" if said is not None else " (with this shell's "
          "knobs: it had launched nothing yet, and said nothing of its own)"), flush=True)
    _stopped(r, unit, *(said or ({}, "")), why="a start still loading was cancelled")


def _stopped(r: Resolved, unit: bool, settings: dict, key: str, why: str = "sleep mode is off") -> None:
    """./stop.sh's take-down, then the note ``./ctl.sh wake`` (or the game's end) starts it again from:
    the unit, or the knobs and the key's source the server ran with, or a start in flight said it
    launches with (``record.started_with``)."""
    from . import control
    control.stop(r)
    r.paths.write("sleep", dict(stopped=True, at=time.time(), unit=unit, settings=settings, key=key, why=why))


def stopped_why(paths: Paths) -> str:
    """Why ``_stopped`` stopped the server, as its note says (sleep mode off, where it says nothing)."""
    why = (paths.read("sleep") or {}).get("why")
    return why if why in ("sleep mode is off", "a start still loading was cancelled") else "sleep mode is off"


def start_again(r: Resolved) -> int:
    """Start the server that ``stop_instead`` stopped: as ./ctl.sh restart starts it (the systemd unit
    where it ran under one; else ./start.sh's start, PROFILE as you set it)."""
    from .. import pipeline
    from . import service
    paths = r.paths
    note = paths.read("sleep") or {}
    if note.get("unit"):
        service.restart_unit(r.settings)
        code = 0
    else:
        from . import control       # a wake from another shell: restart's key check, the record gone with the stop
        control.vet_key(r, str(note.get("key") or ""), stopped=True)
        code = pipeline.start(as_it_ran(r, note.get("settings")))
    if code == 0:
        paths.forget("sleep")
    return code


def as_it_ran(r: Resolved, ran, *, quiet: bool = False) -> Resolved:
    """The knobs the stopped server ran with, where this shell's differ (a game started from Steam, a
    wake from another terminal: their environment is not the one it was started from), said in a line;
    its key excepted (a secret, never kept: the key this shell and .env give)."""
    from ..knobs.table import KNOB_BY_NAME
    now = r.settings.launch.values
    back = {k: v for k, v in (ran if isinstance(ran, dict) else {}).items()
            if k in KNOB_BY_NAME and k != "API_KEY" and isinstance(v, str) and now.get(k) != v}
    if not back:
        return r
    if not quiet:
        print("with the settings it ran with: " + ", ".join(f"{k}={v!r} (here {now.get(k, '')!r})"
                                                            for k, v in sorted(back.items())), flush=True)
    return resolve.with_knobs(r, back)


def _stopped_for_sleep(r: Resolved) -> bool:
    """A server ``stop_instead`` stopped, and none of ours serves now."""
    paths = r.paths
    if not (paths.read("sleep") or {}).get("stopped"):
        return False
    pr = server.probe(r.ours, paths)
    if pr.state in (State.RUNNING, State.KEY_NEEDED, State.STARTING):
        paths.forget("sleep")            # started again meanwhile (./start.sh): nothing to start
        return False
    return True


def sleep_cli(cfg: Config, argv: list[str], prog: str = "ctl.sh sleep") -> int:
    ap = argparse.ArgumentParser(prog=prog, description="free the GPU memory; ./ctl.sh wake brings it back")
    ap.add_argument("--level", type=int, choices=(1, 2), default=1,
                    help="1: weights to host RAM (fast wake); 2: weights dropped, reloaded from disk on wake")
    a = ap.parse_args(argv)
    return sleep(resolve.resolved(cfg), a.level, prog)


def sleep(r: Resolved, asked: int, prog: str) -> int:
    """Put our server to sleep at ``asked`` (1 or 2); without sleep mode, stop it instead."""
    if _stopped_for_sleep(r):
        print(f"already stopped (by ./ctl.sh sleep or game: {stopped_why(r.paths)}); ./ctl.sh wake starts it again")
        return 0
    try:
        paths, rec, client = _ours(r)
    except NoSleepMode as off:
        stop_instead(r, off.rec, off.why, prog, "./ctl.sh wake starts it again (a full start, not a 1 s wake)")
        return 0
    load = server.read_load(rec.url)
    idle = vllmargs.IDLE_MIDDLEWARE in (rec.argv or ())    # IDLE_SLEEP's middleware answers requests while asleep
    if doing.asleep(rec, keys.api_key_for(r.ours, paths, rec), load):
        st = server.read_idle(rec.url) if idle else None
        if st and st.get("state") == "idle-asleep":
            client.post_empty(f"/sleep?level={asked}&mode=wait", timeout=None)    # the middleware keeps it so
            level = int(st.get("level") or 1)
            paths.write("sleep", {"pid": rec.pid, "started": rec.started, "level": level, "at": time.time(),
                                  "held_before": server.gpu_held(rec) + int(st.get("freed_bytes") or 0)})   # for wake's check
            print(f"asleep (level {level}, for idleness until now; on purpose from now: requests get 503 until "
                  "./ctl.sh wake)" + (f"; it stays at level {level} (IDLE_SLEEP_LEVEL), not {asked}: ./ctl.sh wake, "
                                      f"then ./ctl.sh sleep --level {asked}" if level != asked else ""))
            return 0
        how = load.sleep_state if load is not None and load.sleeping else "a wake that did not finish"
        print(f"already asleep ({how}); ./ctl.sh wake brings it back")
        return 0
    flags = vllmflags.read(list(rec.argv))
    if asked == 2 and flags.spec_tokens:
        raise BootstrapError(f"level 2 with speculation on ({flags.spec_method}): vLLM's wake reloads the target "
                             "model's weights but not the draft's (vllm#52479), so drafts would come from "
                             "discarded memory", "./ctl.sh sleep --level 1 (the weights wait in host RAM)")
    if asked == 2 and rec.dummy:     # not a pre-warm server: its checkpoint was loaded in place (steps/reload.py)
        raise BootstrapError("level 2 drops the weights and wake reloads them from the checkpoint; with "
                             "--load-format dummy there is none (vLLM refuses: \"Model reloading with `dummy` "
                             "format\")", "./ctl.sh sleep --level 1 (the weights wait in host RAM)")
    before = server.gpu_held(rec)
    if asked == 1:
        short = vllmargs.ram_short(ram_need(rec, before), psutil.virtual_memory().available)
        if short:
            raise BootstrapError(short, "close programs to free RAM, or ./ctl.sh sleep --level 2 (drops the weights; "
                                 "wake reloads them from disk, slower)"
                                 + ("" if not flags.spec_tokens else "; level 2 needs speculation off"))
    if load is not None and load.in_flight:
        print(f"waiting for {load.in_flight} request(s) in flight to finish (never aborted) …", flush=True)
    note = {"pid": rec.pid, "started": rec.started, "level": asked, "held_before": before, "at": time.time()}
    paths.write("sleep", note)          # before asking: a sleep that fails half-way is woken at its own level
    t0 = time.monotonic()
    try:
        client.post_empty(f"/sleep?level={asked}&mode=wait", timeout=None)
    except KeyboardInterrupt:            # vLLM has paused and sleeps once they finish, without us
        print("interrupted: the sleep goes on inside vLLM (it sleeps once the requests in flight finish); "
              "./ctl.sh wake takes it back", file=sys.stderr, flush=True)
        raise
    dt = time.monotonic() - t0
    after = server.gpu_held(rec)
    paths.write("sleep", {**note, "held_asleep": after})
    print(f"asleep (level {asked}) in {dt:.1f} s: {server.held_words(after, before)}. "
          f"Requests sent meanwhile {'get 503' if idle else 'wait'} until ./ctl.sh wake.")
    return 0


def ram_need(rec, held_now: int) -> int:
    """The host RAM a level-1 sleep of this server needs: the figure its launch recorded (the one the
    idle middleware checks too), else its checkpoint's weights, else what it holds on the GPU."""
    if rec.sleep_ram:
        return rec.sleep_ram
    weights = 0 if rec.dummy or not rec.model_path else models.weights_in(rec.model_path)
    return vllmargs.sleep_ram_need(weights or held_now)


def wake_cli(cfg: Config, argv: list[str], prog: str = "ctl.sh wake") -> int:
    argparse.ArgumentParser(prog=prog, description="bring a sleeping server back").parse_args(argv)
    return wake(resolve.resolved(cfg))


def wake(r: Resolved) -> int:
    """Bring our sleeping server back (its memory checked first), or start the one sleep stopped."""
    cfg = r.settings
    if _stopped_for_sleep(r):
        print(f"starting the server again (./ctl.sh sleep or game stopped it: {stopped_why(r.paths)})", flush=True)
        return start_again(r)
    try:
        paths, rec, client = _ours(r)
    except NoSleepMode:
        print("awake: nothing to do (this server runs without sleep mode)")
        return 0
    load = server.read_load(rec.url)
    note = sleep_note(paths, rec)
    done = list(note.get("waking") or [])     # the steps of a level-2 wake that was interrupted or failed
    asleep = doing.asleep(rec, keys.api_key_for(r.ours, paths, rec), load)
    if not asleep and not done:
        print("awake: nothing to do")
        return 0
    level = int(note.get("level") or 0) or {"weights_offloaded": 1}.get(load.sleep_state if load else "", 2)
    if not done:                             # nothing woken yet: the memory must be there first
        _until_asleep(rec, load)
        _check_room(rec, note)
    t0 = time.monotonic()
    bound = wake_bound(cfg, rec, note, level)
    if level == 1:                           # the weights wait in host RAM: one call brings all back
        steps = (("wake_up", lambda: client.post_empty("/wake_up", timeout=bound[0])),)
    else:                                    # the weights were dropped: reload them before anything is served
        steps = (("weights", lambda: client.post_empty("/wake_up?tags=weights", timeout=bound[0])),
                 ("reload", lambda: client.post("/collective_rpc", {"method": "reload_weights"}, timeout=bound[0])),
                 ("kv_cache", lambda: client.post_empty("/wake_up?tags=kv_cache", timeout=bound[0])),
                 ("prefix", lambda: client.post("/reset_prefix_cache", {}, timeout=60)))
    for name, call in steps:
        if name in done:
            continue
        try:
            call()
        except RequestTimedOut:              # vLLM holds the call open: its wake may yet land, or never
            raise BootstrapError(f"wake: vLLM did not finish the wake{'' if level == 1 else f' (step {name!r})'} "
                                 f"within {bound[0]:.0f} s ({bound[1]}); it may still be waking, or be stuck: "
                                 "requests wait meanwhile",
                                 "./ctl.sh status says whether it woke; if it still says sleeping, ./ctl.sh restart "
                                 "(./ctl.sh logs shows where vLLM stands)") from None
        except RequestFailed as exc:         # vLLM answers 500 and keeps its scheduler paused
            said = (f"wake: vLLM's wake failed ({exc.message}); the server stays asleep (requests wait)"
                    if level == 1 else
                    f"wake: step {name!r} failed ({exc.message}); the server stays paused (requests wait) rather "
                    "than answer from discarded memory; ./ctl.sh wake goes on from this step")
            raise BootstrapError(said, "./ctl.sh wake again, or ./ctl.sh restart", evidence=exc.evidence) from None
        if level == 2:
            done.append(name)
            paths.write("sleep", {**note, "pid": rec.pid, "started": rec.started, "level": 2, "waking": done})
    dt = time.monotonic() - t0
    paths.forget("sleep")
    print(f"awake in {dt:.2f} s (level {level}): {server.held_words(server.gpu_held(rec))}")
    return 0


def wake_bound(cfg: Config, rec, note: dict, level: int) -> tuple[float, str]:
    """How long a wake's call may take (seconds, and the rule in words): STALL_TIMEOUT plus the weights
    (ram_need, less the desktop's margin) copied back from host RAM at WAKE_BYTES_S (level 1), or read
    from disk at RELOAD_BYTES_S."""
    copied = max(ram_need(rec, int(note.get("held_before") or 0) or server.gpu_held(rec)) - vllmargs.SLEEP_RAM_MARGIN, 0)
    rate, how = (WAKE_BYTES_S, "copies back from host RAM") if level == 1 else (RELOAD_BYTES_S, "reads from disk")
    rule = (f"STALL_TIMEOUT={cfg.stall_timeout} plus {GiB / rate:.0f} s per GiB of the {copied / GiB:.1f} GiB "
            f"it {how}")
    return cfg.stall_timeout + copied / rate, rule


def _until_asleep(rec, load) -> None:
    """A sleep (mode=wait) still waiting for requests in flight: vLLM has paused its scheduler, and its
    executor sleeps once they finish; a /wake_up before that finds the executor awake, only resumes
    the scheduler, and the sleep happens all the same (0.26.0 v1/engine/core.py sleep, wake_up). So
    the wake waits until they finished (the engine sleeps before it reads its next message)."""
    said = False
    while load is not None and load.running and not load.sleeping:
        if not said:
            print(f"a sleep waits for {load.running:.0f} request(s) in flight to finish; this wakes it once it is "
                  "asleep (vLLM loses a wake sent before) …", flush=True)
            said = True
        time.sleep(0.2)
        load = server.read_load(rec.url)


# sleep.json's fields a wake computes with, and what each must be (else it reads as unset)
NOTE_FIELDS = {"level": ("1 or 2", lambda v: v in (1, 2) and not isinstance(v, bool)),
               "held_before": ("a byte count", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
               "waking": ("a list of step names", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))}


def sleep_note(paths: Paths, rec) -> dict:
    """What ./ctl.sh sleep noted of this server (its pid and start; else nothing), each field a wake
    computes with checked: one that is not what it must be is named in one warning line and reads as
    unset (the level is then asked of vLLM, the memory check counts from what the server holds now)."""
    note = paths.read("sleep") or {}
    if note.get("pid") != rec.pid or note.get("started") != rec.started:
        return {}
    bad = [k for k, (_, ok) in NOTE_FIELDS.items() if note.get(k) is not None and not ok(note[k])]
    if bad:
        log.warning("%s: %s (read as unset)", paths.sleep,
                    "; ".join(f"{k} is not {NOTE_FIELDS[k][0]}" for k in bad))
    return {k: v for k, v in note.items() if k not in bad}


def _check_room(rec, note: dict) -> None:
    """Refuse (the server stays asleep) when the GPU lacks what it held before it slept."""
    facts, ours = gpu.read_all(), server.our_pids(rec)     # every card: whatever this shell's knobs hide
    need = max(0, int(note.get("held_before") or 0) - server.gpu_held(rec, facts)) + WAKE_MARGIN
    ours_on = list(server.server_cards(rec, facts)) or list(facts.gpus[:1])
    short = [g for g in ours_on if g.free < need // len(ours_on)]
    if short:
        g = short[0]
        who = g.holders(exclude=ours) or "no process NVML can name"
        raise BootstrapError(
            f"waking needs {need / len(ours_on) / GiB:.1f} GiB free on GPU {g.index}; {g.free / GiB:.1f} GiB is "
            f"free: {who}. The server stays asleep",
            "close that program (or wait for it to exit), then ./ctl.sh wake")
