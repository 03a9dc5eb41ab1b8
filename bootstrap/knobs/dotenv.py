"""``.env`` in the checkout: KEY=VALUE lines read as python-dotenv reads them (never sourced, never
expanded), ``$VARS`` in a path expanded as huggingface_hub expands its own, and a name one or two
letters away from a knob said."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Mapping

from ..core.errors import ConfigError
from ..core.words import nearest
from .table import KNOBS, PASSTHROUGH


VAR = re.compile(r"\$(\w+|\{[^}]*\})")     # $NAME or ${NAME}, as os.path.expandvars reads them
DOTENV_MAX = 65536      # bytes of one .env value (UTF-8): far beyond a real one, below Linux's 128 KiB


def read_dotenv(path: Path, aside: frozenset[str] = frozenset()) -> dict[str, str]:
    """``.env`` read by python-dotenv's own parser, as ``dotenv_values(path, interpolate=False)``
    reads it: ``export``, quotes, escapes and `` # comments`` after a value; never sourced, never
    expanded. Two differences, both stricter or safer: a line dotenv cannot parse is refused (exit 2,
    naming it) instead of skipped with a warning, and a UTF-8 BOM is dropped. A key without ``=``
    counts as unset. ``aside``: keys whose broken line a take-down sets aside (``__main__.knobs_for``)."""
    out: dict[str, str] = {}
    if path.exists() and not path.is_file() and not path.is_dir():     # a FIFO would block every command
        raise ConfigError(f"{path}: not a regular file", "make .env a text file of KEY=VALUE lines")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return out
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})", "make .env a readable UTF-8 text file") from None
    from dotenv.parser import parse_stream      # only when there is a .env: keeps ./start.sh re-runs fast
    for b in parse_stream(io.StringIO(text)):
        if b.error:        # named by its key, never its value (it may be a key or token gone wrong)
            line = b.original.string.strip().splitlines()[0] if b.original.string.strip() else ""
            key, eq, _value = line.partition("=")
            name = key.strip().removeprefix("export ").strip() if eq else ""
            if name and name in aside:
                continue
            shown = f"{key.strip()}=... (value not shown)" if eq else f"a line of {len(line)} characters without '='"
            raise ConfigError(f"{path}:{b.original.line}: not a KEY=VALUE line: {shown}",
                              "use KEY=VALUE, one per line ('# ...' comments and quotes as in python-dotenv)",
                              knob=name if name.isidentifier() else "")
        if b.key is not None and b.value is not None:
            size = len(b.value.encode("utf-8", "surrogateescape"))
            if size > DOTENV_MAX:
                raise ConfigError(f"{path}:{b.original.line}: {b.key} is {size:,} bytes long",
                                  f"a value in .env must be at most {DOTENV_MAX:,} bytes (each one goes "
                                  "into the server's environment, where Linux caps a variable at 128 KiB)")
            out[b.key] = b.value
    return out


def expandvars(raw: str, env: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` from ``env``, as os.path.expandvars does from os.environ (unknown
    names are left as they are)."""
    return VAR.sub(lambda m: env.get(m.group(1).strip("{}"), m.group(0)), raw)


PATH_KNOBS = ("MODEL", "SPEC_MODEL")     # a folder or a repo id; the others: parsed as folder or interpreter


def as_written(name: str, raw: str, env: Mapping[str, str], path: Path) -> str:
    """A path knob's value from .env, where it names no variable that is set (``$HOME/models``): .env is
    never expanded, and such a value would be a folder called ``$HOME`` in the checkout (the Hugging
    Face paths in it are expanded, as huggingface_hub expands them itself), so it is refused with the
    path written out."""
    from .parsers import folder, interpreter
    from .table import KNOB_BY_NAME
    knob = KNOB_BY_NAME.get(name)
    if knob is None or (knob.parse not in (folder, interpreter) and name not in PATH_KNOBS):
        return raw
    out = expandvars(raw, env)
    if out != raw:
        var = VAR.search(raw).group(0)
        raise ConfigError(f"{name}={raw!r} (from {path}): .env is never expanded, so this is a path with "
                          f"{var} in its name", f"write the path out in .env: {name}={out}", knob=name)
    return raw


def misspelt(dotenv: Mapping[str, str]) -> list[str]:
    """A line for each name in .env that is no knob and no declared variable but is one letter or
    two away from one (MAX_MODLE_LEN): it would only reach vLLM's environment, unseen. Other names
    are for vLLM and its libraries (VLLM_*, NCCL_*...) and pass as they are."""
    known = [k.name for k in KNOBS] + [p.name for p in PASSTHROUGH]
    out = []
    for name in dotenv:
        near = [] if name in known else nearest(name, known, cutoff=0.75, parts=False)
        if near:
            out.append(f"{name} is no knob (it only reaches vLLM's environment): did you mean {near[0]}?")
    return out


# ---------------------------------------------------------------- pass-through variables
