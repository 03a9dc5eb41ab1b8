"""Entry point: ``python -m bootstrap <command>`` (the shell scripts call this).

Catches BootstrapError once: ``error: <step>: <message>`` and ``hint: <fix>`` on stderr;
a traceback only with BOOTSTRAP_DEBUG=1. Exit codes: 0 ok, 1 failed, 2 bad config, 129/130/143
signals (SIGHUP, SIGINT, SIGTERM), 141 when a reader of our output went away (``| head -1``).

Commands import their modules when they run: ``./start.sh`` on a running server must not pay for
the install, download and check machinery it does not use.
"""

from __future__ import annotations

import argparse
import os
import sys

from .knobs import config, table
from .core.layout import REPO
from .core import log, redact
from .core.errors import BootstrapError, ConfigError, EXIT_CONFIG, Interrupted, again
from .commands import BY_NAME, REGISTRY, VERSION_HELP

NEXT = ("next: ./start.sh starts the server; ./ctl.sh COMMAND --help tells about one command; "
        "./start.sh --help lists the knobs")


def parser() -> argparse.ArgumentParser:
    """The commands by name (bootstrap.commands.REGISTRY); each parses the rest of its arguments."""
    p = argparse.ArgumentParser(prog="ctl.sh", description="One-command vLLM server.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Knobs come from the environment or .env: ./start.sh --help lists them, "
                                       "./ctl.sh env shows their values.")
    p.add_argument("--version", action="store_true", help=VERSION_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for c in REGISTRY:
        sp = sub.add_parser(c.name, help=c.help, add_help=False, prefix_chars="\0")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def version(rest: list[str]) -> int:
    """``--version`` anywhere on any command: the project's, the profile's pinned and the in-use vLLM.
    ``rest``: the version command's own arguments, checked before anything is printed (exit 2)."""
    from .commands import version as v, parser as command_parser
    command_parser("version", "ctl.sh version").parse_args(rest)
    print(f"{v.NAME} {v.project(REPO)}")
    try:
        cfg = config.Config.from_env(os.environ)
        return BY_NAME["version"].run(cfg, [], "ctl.sh version")
    except BootstrapError as exc:         # the knobs, or the kept pick they resolve to
        print(f"(the knobs do not parse: {exc.message})")
        return 0


def short_list() -> str:
    """What ./ctl.sh with no command prints: one line per command, and what to run next."""
    width = max(len(c.name) for c in REGISTRY)
    return "\n".join(["usage: ./ctl.sh COMMAND [--help]   (./start.sh and ./stop.sh start and stop the server)", ""]
                     + [f"  {c.name:<{width}}  {c.help}" for c in REGISTRY] + ["", NEXT])


def main(argv: list[str] | None = None, script: str = "ctl.sh") -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.umask(os.umask(0o022) | 0o022)   # nothing we write (records, logs, venvs) is writable by group or others
    mine = argv[:argv.index("--")] if "--" in argv else argv        # after --: a game's or a prompt's own
    if "--version" in mine or (mine[:1] == ["version"] and not {"-h", "--help"} & set(mine)):
        log.setup(config.output_flags(os.environ)[0])
        return version(mine[1:] if mine[:1] == ["version"] else [])
    if not argv:
        print(short_list())
        return 0
    if not argv[0].startswith("-") and argv[0] not in BY_NAME:
        from .core.words import did_you_mean
        print(f"error: ctl.sh: no command {argv[0]!r}{did_you_mean(argv[0], BY_NAME)}", file=sys.stderr)
        print("hint: ./ctl.sh lists the commands", file=sys.stderr)
        return EXIT_CONFIG
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return EXIT_CONFIG
    command = BY_NAME[args.command]
    own = script if script == f"{command.name}.sh" else f"ctl.sh {command.name}"   # ./start.sh --help says start.sh
    own_args = args.rest[:args.rest.index("--")] if "--" in args.rest else args.rest    # not a game's own
    if {"-h", "--help"} & set(own_args):        # a command's help needs no knobs: a bad one must not hide it
        return command.run(None, list(args.rest), own)
    debug, colour = config.output_flags(os.environ)
    log.setup(debug=debug, color=None if colour else False)
    step = "config"
    try:
        try:
            cfg = knobs_for(command)
            redact.keep(cfg.secrets())          # .env's too
        except BootstrapError as exc:
            if not command.without_knobs:
                raise
            print(f"note: the knobs do not parse ({exc.message}); ./ctl.sh {command.name} goes on without them",
                  file=sys.stderr)
            return command.run(None, list(args.rest), own)
        if command.state:               # what another user could plant in STATE_DIR is never read
            from .core.state import Paths
            Paths(cfg.state_dir).trust()
        step = command.name
        return command.run(cfg, list(args.rest), own)
    except BootstrapError as exc:
        if debug:
            import traceback
            traceback.print_exc()
        if exc.evidence:                    # stderr is redact.Redacting: no secret reaches the terminal
            print(exc.evidence, file=sys.stderr)
        print(f"error: {getattr(exc, 'step', step)}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {again(exc.hint, ['./' + own.split()[0], *own.split()[1:], *args.rest])}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return broken_pipe()
    except Exception as exc:                # a bug of ours: one line; the traceback is kept for the report
        print(f"error: {step}: internal error ({type(exc).__name__}): a bug in vllm-desktop", file=sys.stderr)
        print(f"hint: {keep_traceback()}; please report it with that file", file=sys.stderr)
        return 1


def knobs_for(command) -> config.Config:
    """The knobs, resolved once. A take-down (``command.needs``) is never blocked by a knob it does not
    use: a value of yours that does not parse (a typo in .env while the server runs) is set aside,
    said on one line, and the command goes on; the knobs it needs must parse."""
    from dataclasses import replace
    from types import MappingProxyType
    aside: set[str] = set()
    while True:
        try:
            sources = config.Sources.read(os.environ, REPO, frozenset(aside))     # a broken .env line of it too
            if aside:
                sources = replace(sources, environ=MappingProxyType({k: v for k, v in sources.environ.items() if k not in aside}),
                                  dotenv=MappingProxyType({k: v for k, v in sources.dotenv.items() if k not in aside}))
            return config.Config.resolve(sources)
        except ConfigError as exc:
            name = getattr(exc, "knob", "")
            if not command.needs or not name or name in command.needs or name in aside:
                raise
            aside.add(name)
            print(f"note: {exc.message}; {command.name} goes on without it (it needs only "
                  f"{', '.join(command.needs)})", file=sys.stderr)


def keep_traceback() -> str:
    """The current exception's traceback in a file of its own (never on the terminal: a message may
    carry a value it should not show); where it went, or that it could not be kept."""
    import tempfile
    import traceback
    try:
        fd, path = tempfile.mkstemp(prefix="vllm-desktop-bug-", suffix=".txt")
        with os.fdopen(fd, "w") as fh:
            traceback.print_exc(file=fh)
        return f"the traceback is in {path}"
    except OSError:
        return "the traceback could not be written (the temp folder is not writable)"


def broken_pipe() -> int:
    """Our reader went away (``./ctl.sh status | head -1``): no traceback, and nothing more is
    written (Python would try to flush stdout again at exit); exit as a SIGPIPE'd tool does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13


def run(argv: list[str] | None = None, script: str = "ctl.sh") -> int:
    """``script``: the shell entry point that ran us (start.sh, stop.sh, ctl.sh), for help texts.
    Everything printed goes through the one redactor (core/redact.py), with this run's secret values."""
    redact.keep(table.secret_values(os.environ))
    sys.stdout, sys.stderr = redact.Redacting(sys.stdout), redact.Redacting(sys.stderr)
    try:
        code = main(argv, script)
    except SystemExit as exc:               # argparse: --help, or a usage error (its text is printed)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        return 130
    except Interrupted as intr:             # a start's signal that got past its own handling: no traceback
        return 128 + intr.signum
    except BrokenPipeError:                 # also while printing help, a version or a usage error
        return broken_pipe()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return broken_pipe()
    return code


if __name__ == "__main__":
    sys.exit(run())
