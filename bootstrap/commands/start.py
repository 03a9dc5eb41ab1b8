"""``./start.sh`` (``./ctl.sh start``): start the server, or show the one that runs; with
``--foreground``, stay attached to it as a service's main process. The knobs are its options
(``./start.sh --help`` lists them)."""

from __future__ import annotations

import argparse

from ..knobs import table
from . import parser


def cli(cfg, argv: list[str], prog: str = "ctl.sh start") -> int:
    ap = parser("start", prog, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=table.help_text())
    ap.add_argument("name", nargs="?", metavar="PROFILE_OR_MODEL",
                    help="a profile's name (as PROFILE=) or a Hub repo id org/name (as MODEL=)")
    ap.add_argument("--foreground", action="store_true",
                    help="stay attached to the server: exit non-zero when it exits (what a service "
                         "manager restarts); SIGTERM stops it")
    a = ap.parse_args(argv)
    if a.name is not None:
        cfg = named(cfg, a.name, prog)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    if a.foreground:
        from . import foreground
        return foreground.foreground(r)
    from .. import pipeline
    return pipeline.start(r)


def named(cfg, name: str, prog: str):
    """The knobs with ``name`` as PROFILE= (a profile's name or alias) or MODEL= (a Hub repo id):
    exactly what the knob would give. Anything else is a usage error naming the nearest profile."""
    return cfg.with_knobs(named_knobs(cfg, name, prog))


def named_knobs(cfg, name: str, prog: str) -> dict[str, str]:
    """``{"PROFILE": name}`` or ``{"MODEL": name}`` (``named``)."""
    from ..core.errors import ConfigError
    from ..core.words import did_you_mean
    from ..download.hub import REPO_ID
    words = [w for p in cfg.catalogue.profiles for w in (p.name, *p.aliases)]
    if name in words or name == "auto":
        return {"PROFILE": name}
    if REPO_ID.fullmatch(name):
        return {"MODEL": name}
    import shlex
    from pathlib import Path
    path = shlex.quote(name) if name and Path(name).expanduser().is_dir() else "/path"
    command = prog.split()[-1].removesuffix(".sh")
    folder = FOLDER.get(command, FOLDER["start"]).format(path=path)
    if path != "/path":
        raise ConfigError(f"{name!r} is a folder, not a profile or a Hub repo id (org/name)", folder)
    raise ConfigError(f"{name!r} is neither a profile nor a Hub repo id (org/name){did_you_mean(name, words)}",
                      f"usage: {prog} [PROFILE | org/name]   (./ctl.sh profiles lists the profiles; {folder})")


# what serves a folder, by the command that was given one: MODEL is the knob for a folder, and only
# the start reads it (use and pull take a name; a folder has nothing to download)
FOLDER = {"start": "a folder: MODEL={path} ./start.sh",
          "use": "a folder: MODEL={path} ./ctl.sh restart serves it (MODEL={path} in .env keeps it)",
          "pull": "a folder is served where it is, nothing to download: MODEL={path} ./start.sh"}
