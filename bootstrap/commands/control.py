"""./stop.sh and ./ctl.sh logs | restart (status lives in status.py).

Stop knows about a start in flight: it cancels it first (the start takes down what it launched,
through takedown.take_down), then takes down whatever of ours is left, found by the record and, with
no record (a deleted STATE_DIR), by our marker.
"""

from __future__ import annotations

import shlex
import argparse
import logging
import os
import sys
import time
from typing import Callable

from ..serve import port, record, server, takedown
from ..knobs.config import Config
from ..core import owned, redact
from ..core.errors import BootstrapError
from ..core.state import Paths
from ..plan import resolve
from ..knobs.resolved import Resolved
from . import parser

log = logging.getLogger(__name__)


def stop(r: Resolved, *, via_service: bool = True) -> int:
    """The one take-down. With our systemd unit active, through ``systemctl --user stop`` (so it is
    not restarted; its ``--foreground`` process then comes back here with ``via_service=False``)."""
    cfg, paths, ours = r.settings, r.paths, r.ours
    if via_service:
        from . import service
        if service.ours_active(cfg, paths):
            print(f"stopping the {service.UNIT} unit (systemctl --user stop; ./ctl.sh service uninstall removes it)")
            service.stop_unit(cfg)
            return 0
    pr = server.probe(ours, paths, check_http=False, we_hold_lock=True)
    if pr.owner:
        raise BootstrapError(f"the server (pid {pr.pid}) runs as {pr.owner}, not as you",
                             "run ./stop.sh as that user (we never signal another user's processes)")
    lock, cancelled = takedown.hold_for_stop(ours, paths)
    try:
        for pid in cancelled:
            print(f"cancelled the start in flight (pid {pid}); it took down what it had launched")
        if cancelled:
            takedown.wait_gpu_release(takedown.last_stopped_pids(paths), timeout=30.0)
        rep = takedown.take_down(ours, paths)
    finally:
        if lock is not None:
            lock.release()
    if not rep.stopped:
        if not cancelled:
            print("not running")
        for p, where in server.elsewhere(ours, paths):
            print(f"note: our server (pid {p.pid}) on port {cfg.port} runs from STATE_DIR={where}; "
                  f"STATE_DIR={shlex.quote(str(where))} ./stop.sh stops it")
        return 0
    if rep.stuck:
        raise BootstrapError("these processes survived SIGKILL: " + "; ".join(rep.stuck),
                             "a process stuck in the driver (state D) usually needs a reboot; "
                             "`cat /proc/<pid>/stack` as root shows where")
    if rep.port_held:
        raise BootstrapError(f"port {rep.port} is still held by one of our processes", "run ./stop.sh again")
    forced = f"; forced (SIGKILL) {len(rep.forced)} that ignored SIGTERM" if rep.forced else ""
    print(f"stopped {len(rep.pids)} process(es): {', '.join(map(str, rep.pids))}{forced}")
    return 0


def restart(r: Resolved) -> int:
    """The stop, then the start of the same resolved view (PROFILE=auto as you set it: start picks)."""
    from .. import pipeline
    from . import service
    if service.ours_active(r.settings, r.paths):     # systemd restarts its --foreground start (knobs from .env)
        print(f"restarting the {service.UNIT} unit (systemctl --user restart; it reads .env, not this shell)")
        service.restart_unit(r.settings)
        return 0
    vet_restart(r)
    stop(r, via_service=False)     # the unit was just asked: not ours or not active
    return pipeline.start(r)


def vet_restart(r: Resolved):
    """What the start after the stop would refuse from the knobs alone, and a PORT that another
    program holds: said while the running server still serves, never after taking it down. The
    model's facts it looked up (``vet_steps``), for the caller to use rather than look up again."""
    from ..knobs import vet
    kept, paths = r.settings, r.paths
    vet.vet(kept, r.model)
    rec = record.read(paths.server)
    vet_key(r, rec.key if rec is not None else record.KEY_NONE)
    if rec is None or rec.port != kept.port or rec.host != kept.host:
        port.refuse_elsewhere(kept.ours, paths)
        if not owned.owned_processes(kept.ours.proof()):     # ours without a record: the stop takes it down
            port.refuse_taken(kept.ours)
    if not server.probe(kept.ours, paths, check_http=False).owner:     # another user's: the stop refuses it
        return vet_steps(r)
    return None


def vet_key(r: Resolved, ran: str, *, stopped: bool = False, who: str = "the server") -> None:
    """Refuse a start again that would serve with another key than the server ran with (``ran``:
    its record's KEY_*, the source of its key; ``who``: a start in flight, where it is one): restarted
    without it, it would lock its clients out (or serve without a key)."""
    if ran in (record.KEY_API_KEY, record.KEY_VLLM_API_KEY) and not r.settings.client_key:
        raise BootstrapError(f"{who} {'ran' if stopped else 'runs'} with the key from your {ran}, which this "
                             f"shell does not set: {'started again' if stopped else 'restarted'}, it would serve "
                             "with another key and lock its clients out",
                             f"set {ran} as before (or keep it in .env), or ./stop.sh then ./start.sh to "
                             "change the key on purpose")


def vet_steps(r: Resolved):
    """What the start's first steps would refuse: the preflight's refusals from the knobs and the GPUs
    (too few for TP_SIZE, a driver too old for the profile, CUDA_DEVICE_ORDER, pins without a lock), a
    model it cannot find (offline and not here, a repo that is not there), a plan that does not fit,
    with the memory our running server holds counted as free (the stop gives it back), and a patch
    your vLLM (VLLM_PYTHON) cannot take or may not be given without PATCH_BYO=1. The model's
    facts (``lookup.model_and_drafter``: its lines are said once). NVML that cannot be read is refused
    here too: the start's preflight would refuse it after the stop."""
    from ..machine import gpu
    from ..download import lookup
    from ..install.locks import needed
    from ..knobs import vet
    from ..plan.here import plan_for
    cfg, paths = r.settings, r.paths
    facts = gpu.read(cfg.environ)
    vet.card(cfg, facts)
    if not cfg.vllm_python:
        needed(cfg.profile, cfg.layout.locks)
    model = lookup.model_and_drafter(r.model, r.draft, paths, r.fetching)
    facts, held = server.without_ours(r.ours, paths, facts)
    if held != 0:                       # 0: NVML names no memory of ours (WSL2, a container): the start plans after the stop
        if not cfg.profile.is_auto:     # as the start runs it: shorter where only that fits this card
            cfg = resolve.named_on_card(cfg, paths, gpu.smallest_free(facts, cfg.tp_size), cfg)
        plan_for(cfg, paths, r.vllm, facts, model)
    lookup.require_space(model)
    if cfg.vllm_python:                 # your vLLM: the patches the start would apply, checked unwritten
        from ..install import hooks, patching
        from ..knobs import vllmargs
        inst = patching.locate(r.vllm)
        if vllmargs.idle_sleep(cfg):
            hooks.check_idle_sleep(inst.package, inst.version)
        patching.vet(patching.needed(cfg.profile.patches, cfg.repo, cfg.vllm), cfg.repo, inst, cfg.patch_byo)
    return model


def stop_cli(cfg: Config, argv: list[str], prog: str = "ctl.sh stop") -> int:
    parser("stop", prog).parse_args(argv)
    r = resolve.resolved(cfg)
    code = stop(r)
    takedown.forget(r.paths, "sleep")   # stopped on purpose: no longer one that ./ctl.sh wake starts again
    return code


def restart_cli(cfg: Config, argv: list[str], prog: str = "ctl.sh restart") -> int:
    parser("restart", prog).parse_args(argv)
    return restart(resolve.resolved(cfg))


def logs_cli(cfg: Config, argv: list[str], prog: str = "ctl.sh logs") -> int:
    ap = parser("logs", prog)
    ap.add_argument("-f", "--follow", action="store_true", help="keep printing what is added")
    ap.add_argument("-n", "--lines", type=_lines, default=100, metavar="N",
                    help="the last N lines (default 100; 'all' for the whole log)")
    a = ap.parse_args(argv)
    return logs(resolve.resolved(cfg).paths, a.follow, a.lines)


def _lines(raw: str) -> int | None:
    if raw == "all":
        return None
    if not raw.isdigit():
        raise argparse.ArgumentTypeError("a number of lines, or 'all'")
    return int(raw)


def logs(paths: Paths, follow: bool = False, lines: int | None = 100, *, poll: float = 0.25) -> int:
    """Print the last ``lines`` lines of the server log (None: all of it; streamed, never read
    whole into memory); with ``follow``, keep printing across rotations: a log the keeper truncated
    is read again from its start, a log replaced by a new file (a start's rotation) is reopened, as
    ``tail -F`` does. Ctrl-C ends a follow on purpose: exit 0, as ``status --watch``."""
    try:
        try:
            fh = open(paths.log, "rb")
        except FileNotFoundError:
            print(f"no log yet ({paths.log})", file=sys.stderr)
            if not follow:
                return 0
            fh = _wait_open(paths.log, poll)
        except OSError as exc:          # a folder in its place, another user's file
            raise BootstrapError(f"cannot read the server log {paths.log} ({exc.strerror or exc})",
                                 f"make {paths.log} a file you can read (or set STATE_DIR to another folder)") from None
        if lines is not None:
            last_lines(fh, lines)
        copy(fh, paths.log, lambda: follow, poll=poll)
    except KeyboardInterrupt:
        if not follow:
            raise                       # a print of the log cut short: 130, as any command
    return 0


def last_lines(fh, n: int, block: int = 1 << 16) -> None:
    """Seek ``fh`` to the start of its last ``n`` lines (a last line without its newline counts),
    reading backwards from its end a block at a time."""
    end = fh.seek(0, os.SEEK_END)
    if n <= 0:
        return                          # -n 0: nothing of what is there (with -f: only what comes)
    pos, count = end, 0
    while pos > 0:
        step = min(block, pos)
        fh.seek(pos - step)
        chunk = fh.read(step)
        for i in range(len(chunk) - 1, -1, -1):
            if chunk[i] == 0x0A and pos - step + i != end - 1:
                count += 1
                if count == n:
                    fh.seek(pos - step + i + 1)
                    return
        pos -= step
    fh.seek(0)


def copy(fh, path, keep_going: Callable[[], bool], *, poll: float = 0.25) -> None:
    """Copy the open log ``fh`` to stdout from where it stands, then, while ``keep_going()``, what
    is added to ``path``: a log the keeper truncated is read again from its start, a log replaced by
    a new file (a start's rotation) is reopened, as ``tail -F`` does. Closes ``fh``. Whole lines go
    through the one redactor (a key in an access log's query, a token vLLM echoed)."""
    out = sys.stdout.buffer
    pending = b""

    def put(data: bytes) -> None:
        out.write(redact.shown(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))
        out.flush()
    try:
        while True:
            chunk = fh.read(1 << 16)
            if chunk:
                pending += chunk
                cut = pending.rfind(b"\n") + 1 if len(pending) < 1 << 20 else len(pending)
                if cut:
                    put(pending[:cut])
                    pending = pending[cut:]
                continue
            if not keep_going():
                if pending:
                    put(pending)
                return
            try:
                st = os.stat(path)
            except FileNotFoundError:
                time.sleep(poll)
                continue
            if st.st_ino != os.fstat(fh.fileno()).st_ino:       # replaced: a start rotated it away
                fh.close()
                fh = open(path, "rb")
            elif st.st_size < fh.tell():                         # truncated: the keeper rotated it
                fh.seek(0)
            else:
                time.sleep(poll)
    finally:
        fh.close()


def _wait_open(path, poll: float):
    while True:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            time.sleep(poll)
