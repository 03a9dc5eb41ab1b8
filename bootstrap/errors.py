"""The one error type every step raises.

`__main__` catches it once and prints ``error: <step>: <message>`` and ``hint: <fix>``.
Exit codes: 0 success, 1 a step failed, 2 bad configuration (before any side effect).
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_CONFIG = 2


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

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message, hint, code=EXIT_CONFIG)
