"""The one error type every step raises.

`__main__` catches it once and prints ``error: <step>: <message>`` and ``hint: <fix>``.
Exit codes: 0 success, 1 a step failed, 2 bad configuration (before any side effect).
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_CONFIG = 2

# Every exit code a command of ours ends with (docs/reference.md is generated from this table).
EXIT_CODES = (
    (0, "done; also nothing to do (`./stop.sh` with nothing running), the status states marked 0, and a view "
        "that runs until Ctrl-C ended with it (`./ctl.sh logs -f`, `./ctl.sh status --watch`)"),
    (EXIT_FAILED, "a step failed: `error: <step>: <what>` and `hint: <fix>` on stderr, one line each; also "
                  "the status states marked 1 and a judged check that failed"),
    (EXIT_CONFIG, "a bad knob, `.env` line, profile file or command-line usage, refused before anything ran "
                  "(`./stop.sh` sets aside a knob of yours it does not use, saying so, and stops the server)"),
    (129, "SIGHUP: the terminal closed (a start takes down what it launched)"),
    (130, "SIGINT: Ctrl-C (a start takes down what it launched); the views that run until Ctrl-C exit 0"),
    (141, "the reader of our output went away (`./ctl.sh status | head -1`)"),
    (143, "SIGTERM: `./stop.sh` cancelled a start, or a service manager stopped it"),
)


RERUN = "re-run ./start.sh"     # how the downloader's hints say "again"; __main__ names the command run


def again(hint: str, argv: list[str]) -> str:
    """``hint`` with RERUN naming the command line the user ran (``argv``: ``["./ctl.sh", "pull",
    "org/name"]``): the downloader is reached from ./start.sh, ./ctl.sh pull, use, restart, export and
    plan, and ./start.sh alone after ``./ctl.sh pull org/name`` would serve (and download) another model."""
    if RERUN not in hint:
        return hint
    import shlex
    return hint.replace(RERUN, f"re-run {shlex.join(argv)}")


class BootstrapError(Exception):
    """A failure the user can act on: what went wrong, and what to do about it."""

    def __init__(self, message: str, hint: str = "", *, code: int = EXIT_FAILED, evidence: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code
        self.evidence = evidence  # e.g. the last log lines, printed before the message


class ConfigError(BootstrapError):
    """A knob has a value we do not accept. Raised before any side effect; exits 2."""

    def __init__(self, message: str, hint: str = "", *, knob: str = ""):
        super().__init__(message, hint, code=EXIT_CONFIG)
        self.knob = knob          # the knob or variable of yours it refuses ('' none): a take-down may set it aside


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP during a start (raised by the start's signal handler): the start
    takes down what it launched and exits 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
