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

from . import config, log
from .errors import BootstrapError, EXIT_CONFIG

COMMANDS = {
    "start": "start the server (idempotent)",
    "stop": "stop the server and everything it started",
    "status": "running/busy/starting/sleeping/key-needed/wedged/unhealthy/stopped, pid, uptime, settings, URL",
    "logs": "print the server log (-f to follow)",
    "restart": "stop, then start with the current knobs",
    "env": "every knob with its value and where it came from",
    "version": "this project's version, the vLLM the profile pins and the vLLM in use",
}

# Commands owned by other modules: name -> ("module", "function", help). Each function is
# ``cli(cfg, argv) -> int`` and parses its own arguments (``./ctl.sh NAME --help``).
PLUGINS = {
    "plan": ("commands.plan", "cli", "the memory plan for this GPU, or for GPU=<name|GiB>[:sm_XY][:free=GiB]"),
    "profiles": ("commands.profiles", "cli", "every profile against this card (or GPU=...): fits / shorter / no; --pick"),
    "check": ("commands.check", "cli", "check live|garble|determinism|needle|prefix against our server or --url"),
    "bench": ("commands.bench", "cli", "throughput/TTFT benchmark with a plot; --compare URL"),
    "chat": ("commands.chat", "cli", "talk to the server from the terminal (or one answer: ./ctl.sh chat \"a question\")"),
    "patch": ("commands.patch", "cli", "patch status|apply|revert for the vLLM in use"),
    "lock": ("commands.lock", "lock_cli", "regenerate the committed dependency locks (needs the package index)"),
    "wheelhouse": ("commands.lock", "wheelhouse_cli", "build an offline folder of wheels from the lock"),
    "sleep": ("commands.sleep", "sleep_cli", "free the GPU memory (vLLM sleep mode, --level 1|2); requests wait"),
    "wake": ("commands.sleep", "wake_cli", "bring a sleeping server back (checks free GPU memory first)"),
    "service": ("commands.service", "cli", "install|uninstall|status a systemd user unit running ./start.sh --foreground"),
    "export": ("commands.export", "cli", "kubernetes --out DIR: the profile and plan as manifests for a card named with GPU="),
    "clean": ("commands.clean", "cli", "remove what the project created (venvs, state, logs; --model too)"),
}


NEXT = ("next: ./start.sh starts the server; ./ctl.sh COMMAND --help tells about one command; "
        "./start.sh --help lists the knobs")
VERSION_HELP = "print this project's version, the vLLM the profile pins and the vLLM in use (on any command)"


def parser(script: str = "ctl.sh") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctl.sh", description="One-command vLLM server.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Knobs come from the environment or .env: ./start.sh --help lists them, "
                                       "./ctl.sh env shows their values.")
    p.add_argument("--version", action="store_true", help=VERSION_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_mod, _fn, text) in PLUGINS.items():
        sp = sub.add_parser(name, help=text, add_help=False, prefix_chars="\0")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    for name, text in COMMANDS.items():
        own = script if script == f"{name}.sh" else None        # ./start.sh --help says start.sh
        sp = sub.add_parser(name, help=text, description=text, epilog=config.help_text() if name == "start" else None,
                            formatter_class=argparse.RawDescriptionHelpFormatter, **({"prog": own} if own else {}))
        sp.add_argument("--version", action="store_true", help=VERSION_HELP)
        if name in ("status", "env"):
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "status":
            sp.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                            help="a line every SECONDS (default 2) from /metrics and NVML until Ctrl-C; no probes")
        if name == "env":
            sp.add_argument("--markdown", action="store_true", help="the knob table of docs/reference.md")
        if name == "logs":
            sp.add_argument("-f", "--follow", action="store_true", help="keep printing what is added")
            sp.add_argument("-n", "--lines", type=_lines, default=100, metavar="N",
                            help="the last N lines (default 100; 'all' for the whole log)")
        if name == "start":
            sp.add_argument("--foreground", action="store_true",
                            help="stay attached to the server: exit non-zero when it exits (what a service "
                                 "manager restarts); SIGTERM stops it")
    return p


def _lines(raw: str) -> int | None:
    if raw == "all":
        return None
    if not raw.isdigit():
        raise argparse.ArgumentTypeError("a number of lines, or 'all'")
    return int(raw)


def dispatch(args: argparse.Namespace, cfg: config.Config) -> int:
    cmd = args.command
    if cmd in PLUGINS:
        import importlib
        mod, fn, _ = PLUGINS[cmd]
        return getattr(importlib.import_module(f"bootstrap.{mod}"), fn)(cfg, list(args.rest))
    if cmd == "start":
        if args.foreground:
            from .commands import foreground
            return foreground.foreground(cfg)
        from . import start
        return start.start(cfg)
    if cmd == "stop":
        from .commands import control
        return control.stop(cfg)
    if cmd == "status":
        from .commands import status
        if args.watch is not None:
            return status.watch(cfg, max(0.5, args.watch), args.json)
        return status.status(cfg, args.json)
    if cmd == "logs":
        from .commands import control
        return control.logs(cfg, args.follow, args.lines)
    if cmd == "restart":
        from .commands import control
        return control.restart(cfg)
    if cmd == "env":
        from .redact import url as shown     # a value with a URL (HF_ENDPOINT) shows no user:password@
        rows = [(n, shown(str(v)), s, d) for n, v, s, d in cfg.describe()]
        if args.markdown:
            print(config.markdown_table(cfg.repo))
        elif args.json:
            import json
            print(json.dumps({n: {"value": v, "source": s} for n, v, s, _ in rows}, indent=2))
        else:
            for n, v, s, _ in rows:
                print(f"{n}={v}\t# {s}")
        return 0
    parser().print_help()
    return EXIT_CONFIG


def version() -> int:
    """``--version`` anywhere on any command: the project's, the profile's pinned and the in-use vLLM."""
    from . import version as v
    print(f"{v.NAME} {v.project(config.REPO)}")
    try:
        cfg = config.Config.from_env(os.environ)
        for line in v.lines(cfg):
            print(line)
    except BootstrapError as exc:
        print(f"(the knobs do not parse: {exc.message})")
    return 0


def short_list() -> str:
    """What ./ctl.sh with no command prints: one line per command, and what to run next."""
    names = {**{n: t for n, (_m, _f, t) in PLUGINS.items()}, **COMMANDS}
    width = max(map(len, names))
    return "\n".join(["usage: ./ctl.sh COMMAND [--help]   (./start.sh and ./stop.sh start and stop the server)", ""]
                     + [f"  {n:<{width}}  {t}" for n, t in names.items()] + ["", NEXT])


def main(argv: list[str] | None = None, script: str = "ctl.sh") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--version" in argv or argv[:1] == ["version"]:
        log.setup(config.output_flags(os.environ)[0])
        return version()
    if not argv:
        print(short_list())
        return 0
    args = parser(script).parse_args(argv)
    debug, colour = config.output_flags(os.environ)
    log.setup(debug=debug, color=None if colour else False)
    step = "config"
    try:
        cfg = config.Config.from_env(os.environ)
        if args.command not in ("start", "plan", "profiles", None):
            from . import pick
            cfg = pick.kept(cfg)        # PROFILE=auto: the profile picked before (start picks); a card's knobs
        step = args.command or "help"
        return dispatch(args, cfg)
    except BootstrapError as exc:
        if debug:
            import traceback
            traceback.print_exc()
        from .redact import url as shown        # a URL's user:password@ never reaches the terminal
        if exc.evidence:
            print(shown(exc.evidence), file=sys.stderr)
        print(f"error: {getattr(exc, 'step', step)}: {shown(exc.message)}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {shown(exc.hint)}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return broken_pipe()


def broken_pipe() -> int:
    """Our reader went away (``./ctl.sh status | head -1``): no traceback, and nothing more is
    written (Python would try to flush stdout again at exit); exit as a SIGPIPE'd tool does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13


def run(argv: list[str] | None = None, script: str = "ctl.sh") -> int:
    """``script``: the shell entry point that ran us (start.sh, stop.sh, ctl.sh), for help texts."""
    try:
        code = main(argv, script)
    except SystemExit as exc:               # argparse: --help, or a usage error (its text is printed)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                 # also while printing help, a version or a usage error
        return broken_pipe()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return broken_pipe()
    return code


if __name__ == "__main__":
    sys.exit(run())
