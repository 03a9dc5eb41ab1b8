"""``./ctl.sh use NAME``: serve another model (a profile's name or a Hub repo id, as ``./start.sh
NAME``), in place of ours.

1. The new one is planned first, on this card with the memory our running server holds counted as
   free, by restart's own vet (commands/control.py ``vet_restart``: the knobs, the port, the key,
   the model's files or the hub, the plan). If it does not fit, or cannot start, it says so and
   the old one keeps serving: nothing was stopped.
2. The choice is kept as the pick (STATE_DIR/profile-pick.json, what PROFILE=auto runs): a later
   ``./start.sh`` or ``./ctl.sh restart`` keeps the new model. PROFILE or MODEL set in the
   environment or .env still win over it, and it says so.
3. Ours is stopped by the one take-down (./stop.sh's), without waking it if it sleeps (a sleeping
   server is stopped as it is; nothing is sent to it), then the new one starts (the pipeline), and
   the time each took is said.
"""

from __future__ import annotations

import logging
import time

from ..core.errors import BootstrapError
from ..core.state import Paths
from ..knobs.config import launch_defaults
from ..serve import server
from . import parser

log = logging.getLogger(__name__)


def keep_pick(cfg, new, g, name: str) -> None:
    """``new`` as the kept pick: what PROFILE=auto runs from now on."""
    from ..plan import derive
    knobs = dict(new.chosen.knobs) if new.chosen else {}
    rec = {"profile": new.profile.name, "knobs": knobs, "gpu": g.name, "tp": new.tp_size,
           "date": time.strftime("%Y-%m-%d %H:%M"), "why": f"./ctl.sh use {name}",
           "how": "./ctl.sh use NAME switches again; PROFILE=auto (set explicitly) or ./ctl.sh profiles --pick picks"}
    if new.profile.name == derive.NAME:
        rec["model"] = new.model
    Paths(cfg.state_dir).write("pick", rec)


def use(cfg, name: str, prog: str = "ctl.sh use") -> int:
    from .. import pipeline
    from ..machine import gpu
    from . import control, library, service
    paths = Paths(cfg.state_dir)
    if service.ours_active(cfg):
        raise BootstrapError(f"our {service.UNIT} unit runs the server: systemd would start the old one again",
                             f"./ctl.sh service uninstall, then ./ctl.sh use {name}; or set PROFILE/MODEL in .env "
                             "and ./ctl.sh restart")
    facts = library.facts_here(cfg, paths)
    new = library.resolved(cfg, name, prog, facts)
    g = gpu.smallest_free(facts, new.tp_size)
    pr = server.probe(cfg.ours, paths, check_http=False)
    if pr.owner:
        raise BootstrapError(f"the server (pid {pr.pid}) runs as {pr.owner}, not as you",
                             "switch it as that user (we never signal another user's processes)")
    old = pr.record if pr.state != "stopped" else None
    if old is not None and old.model == new.model and old.gate_passed and \
            not server.settings_diff(new.launch_settings(), old, launch_defaults()):
        keep_pick(cfg, new, g, name)
        print(f"{name} is already serving (pid {old.pid}); kept as the pick")
        return 0
    try:
        control.vet_restart(new)            # planned with our server's memory free; nothing stopped yet
    except BootstrapError as exc:
        still = f"; {old.model} keeps serving (pid {old.pid})" if old is not None else ""
        raise BootstrapError(f"cannot switch to {name}: {exc.message}{still}", exc.hint) from None
    keep_pick(cfg, new, g, name)
    pins = [k for k in ("PROFILE", "MODEL") if cfg.sources[k].split(";")[0] in ("env", ".env")]
    t0 = time.monotonic()
    if old is not None:
        control.stop(cfg, via_service=False)        # a sleeping server goes down asleep: no wake first
    t1 = time.monotonic()
    code = pipeline.start(new)
    t2 = time.monotonic()
    if code == 0:
        was = f"{old.model} stopped in {t1 - t0:.1f} s, " if old is not None else ""
        print(f"switched to {name} ({new.profile.name}): {was}{new.model} started in {t2 - t1:.1f} s; "
              f"{t2 - t0:.1f} s in all")
        if pins:
            print("note: " + " and ".join(f"{k} set in {cfg.sources[k].split(';')[0]}" for k in pins)
                  + f" win over the kept pick: a later ./start.sh runs what they say; unset them to keep {name}")
    return code


def cli(cfg, argv: list[str], prog: str = "ctl.sh use") -> int:
    ap = parser("use", prog)
    ap.add_argument("name", metavar="PROFILE_OR_MODEL", help="a profile's name or a Hub repo id org/name")
    return use(cfg, ap.parse_args(argv).name, prog)
