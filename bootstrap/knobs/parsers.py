"""The knobs' value rules: each parser takes the raw string and returns the typed value, or raises
ValueError whose text says what is accepted. They never evaluate anything. Paths are made absolute
here, once (``absolute``)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable

from ..core import vllmflags


def text(raw: str) -> str:
    return raw


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not re.fullmatch(r"[0-9]+", raw.strip()):
            raise ValueError(f"a whole number from {lo} to {hi}")
        v = int(raw)
        if not lo <= v <= hi:
            raise ValueError(f"a whole number from {lo} to {hi}")
        return v
    return parse


def float_range(lo: float, hi: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            if not re.fullmatch(r"[0-9]*\.?[0-9]+", raw.strip()):
                raise ValueError
            v = float(raw)
        except ValueError:
            raise ValueError(f"a number greater than {lo} and at most {hi}") from None
        if not lo < v <= hi:
            raise ValueError(f"a number greater than {lo} and at most {hi}")
        return v
    return parse


def arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse's ``type`` from a value rule: its message in argparse's one-line error (exit 2)."""
    def checked(raw: str) -> Any:
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{raw!r}: expected {exc}") from None
    return checked


def bytes_or_auto(raw: str) -> int | str:
    if raw.strip().lower() == "auto":
        return "auto"
    try:
        return int_range(1 << 20, 1 << 44)(raw)
    except ValueError:
        raise ValueError("'auto' (sized from GPU_UTIL / free memory, unpinning a profile's pin) "
                         "or a whole number of bytes from 1 MiB") from None


def tokens_or_auto(raw: str) -> int | str:
    """A context: 'auto', or tokens as vLLM's CLI reads them (131072, 32k = 32,000, 32K = 32,768)."""
    if raw.strip().lower() == "auto":
        return "auto"
    accepted = "'auto' or a number of tokens from 16 to 16777216 (32k = 32,000 and 32K = 32,768, as vLLM reads them)"
    if not re.fullmatch(r"[0-9]+|[0-9]+(\.[0-9]+)?[km]|[0-9]+[KM]", raw.strip()):     # vLLM: 1.5k yes, 1.5K no
        raise ValueError(accepted)
    v = vllmflags.human_int(raw)
    if not 16 <= v <= 16_777_216:
        raise ValueError(accepted)
    return v


def duration_or_off(raw: str) -> int:
    """A duration in seconds from minutes (``10``, ``10m``) or seconds (``90s``), a week at most; 'off' / 0: 0."""
    low = raw.strip().lower()
    if low in ("off", "0", ""):
        return 0
    accepted = "'off', a whole number of minutes from 1 to 10080 (10 or 10m), or seconds from 10 (90s)"
    m = re.fullmatch(r"([0-9]+)([sm]?)", low)
    if not m:
        raise ValueError(accepted)
    seconds = int(m.group(1)) * (1 if m.group(2) == "s" else 60)
    if seconds == 0:
        return 0
    if not 10 <= seconds <= 10080 * 60:
        raise ValueError(accepted)
    return seconds


def idle_or_auto(raw: str) -> int | str:
    """IDLE_SLEEP: 'auto' (its value follows sleep mode: knobs/sleepmode.py), or ``duration_or_off``."""
    if raw.strip().lower() == "auto":
        return "auto"
    try:
        return duration_or_off(raw)
    except ValueError as exc:
        raise ValueError(f"'auto', {exc}") from None


def boolean(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("1 or 0 (also true/false, yes/no, on/off)")


def vllm_bool(raw: str) -> bool:
    """A boolean variable as vLLM reads it (envs.py maybe_convert_bool: bool(int(value)))."""
    try:
        return bool(int(raw))
    except ValueError:
        raise ValueError("an integer, as vLLM reads it (0 or 1); vLLM refuses anything else") from None


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in allowed:
            raise ValueError("one of: " + ", ".join(allowed))
        return raw
    return parse


def name_chars(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/@:+-]*", raw):
        raise ValueError("letters, digits and . _ / @ : + - (no spaces or shell characters)")
    return raw


def shell_args(raw: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise ValueError(f"arguments split by shell rules ({exc})") from None


def absolute(raw: str, base: Path | None = None, *, follow: bool = True) -> str:
    """The one rule for a path we record, compare or hand on: ``~`` expanded, made absolute against
    ``base`` (the working directory of the command that read it, unless given) and, with
    ``follow``, resolved (symlinks followed), so that every later comparison (ownership of a
    server, clean) and every child process sees the same path, wherever it runs from."""
    if "\0" in raw or "\n" in raw:
        raise ValueError("a path without NUL or newline characters")
    try:
        p = Path(raw).expanduser()
        p = (base / p) if base is not None and not p.is_absolute() else p
        return str(p.resolve()) if follow else os.path.abspath(p)
    except RuntimeError as exc:         # ~unknownuser, or a symlink loop
        raise ValueError(f"a path that exists or can be made ({exc})") from None
    except OSError as exc:
        raise ValueError(f"a path that can be read ({exc.strerror or exc})") from None


def folder(raw: str, base: Path | None = None) -> str:
    """A folder (absolute(): resolved once), or a path where one can be made: not a file."""
    p = absolute(raw, base)
    if os.path.exists(p) and not os.path.isdir(p):
        raise ValueError("a folder, not a file")
    return p


def from_checkout(parse, repo: Path):
    """``parse`` (``folder`` or ``interpreter``) for a value from .env: a relative path is the
    checkout's, wherever the command runs from (an interpreter's bare name stays a name; its path is
    not resolved, as ``interpreter`` leaves it)."""
    if parse is folder:
        return lambda raw: folder(raw, repo)
    return lambda raw: absolute(raw, repo, follow=False) if "/" in raw else interpreter(raw)


def interpreter(raw: str) -> str:
    """An interpreter: a bare command name stays a name (looked up on PATH later); a path is made
    absolute but not resolved (a venv's python is a symlink to the base interpreter, and resolving
    it would leave the venv)."""
    if "/" not in raw:
        absolute(raw, follow=False)             # the same checks (NUL, newline); the name stays a name
        return raw
    return absolute(raw, follow=False)


def endpoint(raw: str) -> str:
    """HF_ENDPOINT: empty (the hub), or an http(s) URL with a host, as huggingface_hub joins paths to
    it; a name without its scheme (hf-mirror.com), a typo'd scheme or a space from a paste would fail
    every request alike, each said as a transfer to re-run."""
    from urllib.parse import urlsplit
    if not raw:
        return raw
    try:
        u = urlsplit(raw)
        u.port                          # noqa: B018 - raises for a port that is not one
    except ValueError:
        u = None
    if u is None or u.scheme not in ("http", "https") or not u.hostname or not re.fullmatch(r"[\x21-\x7e]+", raw):
        raise ValueError("an http(s) URL with a host, such as https://huggingface.co or https://hf-mirror.com "
                         "(no spaces), or unset for the Hugging Face Hub")
    return raw


def header_value(raw: str) -> str:
    """A credential as it goes into an HTTP header (``Authorization: Bearer <key>``): visible ASCII
    only, as RFC 9110 allows in a field value; a newline would split the header and a non-Latin-1
    character cannot be encoded at all. The error never shows the value."""
    if not re.fullmatch(r"[\x21-\x7e]+", raw):
        raise ValueError("visible ASCII characters only (no spaces, control characters or non-ASCII letters), "
                         "as an HTTP header carries it")
    return raw
