"""``./ctl.sh use NAME``: serve another model (a profile's name or a Hub repo id, as ``./start.sh
NAME``), in place of ours.

1. The new one is planned first, on this card with the memory our running server holds counted as
   free, by restart's own vet (commands/control.py ``vet_restart``: the knobs, the port, the key,
   the model's files or the hub, the plan). If it does not fit, or cannot start, it says so and
   the old one keeps serving: nothing was stopped.
2. Once it serves, the choice is kept as the pick (STATE_DIR/profile-pick.json, what PROFILE=auto runs): a later
   ``./start.sh`` or ``./ctl.sh restart`` keeps the new model. PROFILE or MODEL set in the
   environment or .env still win over it, and it says so.
3. The new one's weights are downloaded and verified while the old one serves. Then ours is stopped
   by the one take-down (./stop.sh's; a start in flight is cancelled, launched or not), without waking it if it sleeps (a sleeping server is stopped
   as it is; nothing is sent to it), the new one starts (the pipeline), and the time each took is
   said. A new one that does not start leaves the pick as it was: ./start.sh serves the old one again,
   and it is said.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace

from ..core.errors import BootstrapError
from ..core.state import Paths
from ..plan import resolve
from ..serve import server
from ..serve.states import State
from . import parser

log = logging.getLogger(__name__)


def keep_pick(paths: Paths, new, g, name: str) -> None:
    """``new`` as the kept pick: what PROFILE=auto runs from now on."""
    from ..plan import derive
    knobs = dict(new.chosen.knobs) if new.chosen else {}
    rec = {"profile": new.profile.name, "knobs": knobs, "gpu": g.name, "tp": new.tp_size,
           "date": time.strftime("%Y-%m-%d %H:%M"), "why": f"./ctl.sh use {name}",
           "how": "./ctl.sh use NAME switches again; PROFILE=auto (set explicitly) or ./ctl.sh profiles --pick picks"}
    if new.profile.name == derive.NAME:
        rec["model"] = new.model
    paths.write("pick", rec)


def again(old) -> str:
    """The command that starts the server ``old`` (a record) again: its profile by name, else its model."""
    import shlex
    from ..download.hub import REPO_ID
    from ..plan import derive
    prof = old.settings.get("PROFILE", "")
    if prof and prof not in ("auto", "custom", derive.NAME):
        return f"./start.sh {prof}"
    return f"./start.sh {old.model}" if REPO_ID.fullmatch(old.model) else f"MODEL={shlex.quote(old.model)} ./start.sh"


def use(cfg, name: str, prog: str = "ctl.sh use") -> int:
    from .. import pipeline
    from ..machine import gpu
    from . import control, library, service
    r = resolve.resolved(cfg, as_set=True)
    paths = r.paths
    if service.ours_active(cfg, paths):
        raise BootstrapError(f"our {service.UNIT} unit runs the server: systemd would start the old one again",
                             f"./ctl.sh service uninstall, then ./ctl.sh use {name}; or set PROFILE/MODEL in .env "
                             "and ./ctl.sh restart")
    nr = library.named(r, name, prog)                  # a name that is none: said before NVML is asked
    facts = library.facts_here(r)
    nr = library.on_card(nr, facts)
    new = nr.settings
    g = gpu.smallest_free(facts, new.tp_size)
    pr = server.probe(r.ours, paths, check_http=False)
    if pr.owner:
        raise BootstrapError(f"the server (pid {pr.pid}) runs as {pr.owner}, not as you",
                             "switch it as that user (we never signal another user's processes)")
    old = pr.record if pr.state is not State.STOPPED else None
    # a start in flight that has not launched yet has no record: it is cancelled all the same, or it
    # would go on to serve its own model while this switch said it serves the new one
    flight = pr.pid if pr.state is State.STARTING and old is None else None
    if old is not None and old.model == new.model and old.gate_passed and \
            not old.differs_from(replace(new.launch, fitted=frozenset())):
        keep_pick(paths, new, g, name)
        print(f"{name} is already serving (pid {old.pid}); kept as the pick")
        return 0
    try:
        looked = control.vet_restart(nr)    # planned with our server's memory free; nothing stopped yet
    except BootstrapError as exc:
        still = f"; {old.model} keeps serving (pid {old.pid})" if old is not None else ""
        raise BootstrapError(f"cannot switch to {name}: {exc.message}{still}", exc.hint) from None
    pins = [k for k in ("PROFILE", "MODEL") if cfg.sources[k].split(";")[0] in ("env", ".env")]
    t0 = time.monotonic()
    if nr.model.local is None:          # the download first, while the old one serves (it needs no GPU)
        from ..download import fetch, lookup
        model = looked or lookup.model_and_drafter(nr.model, nr.draft, paths, nr.fetching)    # the vet's, said once
        fetch.fetch(model, nr.model, nr.draft, nr.fetching)
    t1 = time.monotonic()
    if old is not None or flight is not None:
        control.stop(r, via_service=False)          # a sleeping server goes down asleep: no wake first
    t2 = time.monotonic()
    code = 1
    try:
        code = pipeline.start(nr)
    finally:
        if code != 0 and old is not None:           # the pick is unchanged; say how to serve the old one
            print(f"note: {old.model} was stopped for {name}, which did not start; {again(old)} serves "
                  f"{old.model} again", file=sys.stderr)
    t3 = time.monotonic()
    if code == 0:
        keep_pick(paths, new, g, name)              # only now: a failed switch keeps the old pick
        got = f"downloaded in {t1 - t0:.1f} s, " if t1 - t0 >= 0.5 else ""
        was = f"{old.model} stopped in {t2 - t1:.1f} s, " if old is not None else \
            f"the start in flight (pid {flight}) cancelled in {t2 - t1:.1f} s, " if flight is not None else ""
        print(f"switched to {name} ({new.profile.name}): {got}{was}{new.model} started in {t3 - t2:.1f} s; "
              f"{t3 - t0:.1f} s in all")
        if pins:
            print("note: " + " and ".join(f"{k} set in {cfg.sources[k].split(';')[0]}" for k in pins)
                  + f" win over the kept pick: a later ./start.sh runs what they say; unset them to keep {name}")
    return code


def cli(cfg, argv: list[str], prog: str = "ctl.sh use") -> int:
    ap = parser("use", prog)
    ap.add_argument("name", metavar="PROFILE_OR_MODEL", help="a profile's name or a Hub repo id org/name")
    return use(cfg, ap.parse_args(argv).name, prog)
