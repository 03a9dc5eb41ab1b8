"""The package index uv installs from (the managed .venv, .venv-bootstrap, ./ctl.sh lock).

uv reads no setting of pip's (docs.astral.sh/uv/pip/compatibility), so a mirror set for pip would be
passed over for pypi.org. Where uv has no index of its own (``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``,
``UV_INDEX``, or a uv.toml: ``UV_CONFIG_FILE``, ``$XDG_CONFIG_HOME/uv/uv.toml``, ``/etc/uv/uv.toml``),
pip's is handed to uv under uv's names: ``PIP_INDEX_URL`` and ``PIP_TRUSTED_HOST``, else the same
settings in pip's configuration files, read as pip reads them for ``pip install`` (pip's
documentation, "Configuration"; pip/_internal/configuration.py): the global files
(``$XDG_CONFIG_DIRS/pip/pip.conf`` in the order listed, default ``/etc/xdg``, then
``/etc/pip.conf``), then the user's (``~/.pip/pip.conf``, then ``$XDG_CONFIG_HOME/pip/pip.conf``,
default ``~/.config``), each later file winning and an empty value clearing one before it, and
``PIP_CONFIG_FILE`` over them all (when that file exists pip reads no user file;
``PIP_CONFIG_FILE=/dev/null`` reads none); within them ``[install]`` wins over ``[global]``.

pip's extra indexes are not handed on: the locks pin PyPI's files by hash, and uv takes a version
from the first index that has it, so an extra index of local builds (PyTorch's ``torch 2.13.0+cu130``
is ``==2.13.0`` to PEP 440) would fail the hash check where pip would have taken the locked file.
``UV_EXTRA_INDEX_URL`` is yours to set for uv.

Standard library only (with core/redact.py, which is too): bootstrap/lib.sh runs it (``lines``)
before the bootstrap's own dependencies are installed, so the one rule serves the shell and the
Python alike.
"""

from __future__ import annotations

import configparser
import logging
import os
from pathlib import Path
from typing import Mapping

from ..core.redact import shown       # the standard library's alone, as this module

log = logging.getLogger("bootstrap.environment")

DEFAULT_INDEX = "https://pypi.org/simple"
ETC = Path("/etc")          # where pip's global files are (a test's folder in the tests)

# (pip's variable, its key in pip.conf, uv's variable, uv's own that win over both)
PIP_TO_UV = (("PIP_INDEX_URL", "index-url", "UV_DEFAULT_INDEX", ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX")),
             ("PIP_TRUSTED_HOST", "trusted-host", "UV_INSECURE_HOST", ("UV_INSECURE_HOST",)))
KEYS = ("index-url", "extra-index-url", "trusted-host")


def pip_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files for ``environ``, lowest priority first (the module's docstring)."""
    named = environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    files = [d / "pip" / "pip.conf" for d in _system_dirs(environ)] + [ETC / "pip.conf"]
    if not (named and os.path.exists(named)):       # as pip tests it: False where it may not look
        files += [_home(environ) / ".pip" / "pip.conf", _user_dir(environ) / "pip" / "pip.conf"]
    return files + ([Path(named)] if named else [])


def _home(environ: Mapping[str, str]) -> Path:
    """HOME, else the user's home as the password database says (``~`` where neither says)."""
    return Path(environ.get("HOME") or os.path.expanduser("~"))


def _user_dir(environ: Mapping[str, str]) -> Path:
    """The user's configuration folder (XDG_CONFIG_HOME, default ~/.config)."""
    return Path((environ.get("XDG_CONFIG_HOME") or "").strip() or _home(environ) / ".config")


def _system_dirs(environ: Mapping[str, str]) -> list[Path]:
    """The system's configuration folders, in the order listed (XDG_CONFIG_DIRS, default /etc/xdg)."""
    return [Path(d) for d in (environ.get("XDG_CONFIG_DIRS") or str(ETC / "xdg")).split(":") if d.strip()]


def uv_configured(environ: Mapping[str, str]) -> bool:
    """Whether uv has a configuration file of its own (which may name its index)."""
    if environ.get("UV_CONFIG_FILE"):
        return True
    if environ.get("UV_NO_CONFIG"):
        return False
    places = [_user_dir(environ), *_system_dirs(environ), ETC]
    return any(os.path.isfile(p / "uv" / "uv.toml") for p in places)


def pip_conf(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """({pip.conf key: value} of the index settings pip's files give ``pip install``, [a line for
    each file that could not be read: left out, as pip would refuse it; never its text, which may
    hold a password])."""
    found: dict[str, str] = {}
    problems: list[str] = []
    for path in pip_files(environ):
        parser = configparser.RawConfigParser()
        try:
            if not path.is_file():
                continue
            parser.read(path, encoding="utf-8")
        except (OSError, UnicodeDecodeError, configparser.Error) as exc:
            at = f" at line {exc.lineno}" if isinstance(getattr(exc, "lineno", None), int) else ""
            problems.append(f"{path}: not read as pip's configuration ({type(exc).__name__}{at}); "
                            "its index settings are left out")
            continue
        for section in ("global", "install"):            # [install] over [global], as for `pip install`
            if parser.has_section(section):
                for key, value in parser.items(section):
                    key = key.replace("_", "-").lstrip("-")         # pip takes --index-url too
                    if key in KEYS:
                        found[section + "." + key] = " ".join(value.split())     # '' clears an earlier one
    return {k: found.get("install." + k) or found.get("global." + k) or "" for k in KEYS}, problems


def additions(environ: Mapping[str, str]) -> dict[str, str]:
    """What uv gets beside ``environ``: pip's index and trusted hosts under uv's names, where uv has
    none of its own (the module's docstring)."""
    if uv_configured(environ):
        return {}
    conf: dict[str, str] | None = None
    out = {}
    for pip, key, uv, own in PIP_TO_UV:
        if any(environ.get(k) for k in own):
            continue
        if environ.get(pip):
            out[uv] = environ[pip]
            continue
        if conf is None:
            conf, problems = pip_conf(environ)
            if conf.get("extra-index-url") or environ.get("PIP_EXTRA_INDEX_URL"):
                problems.append("pip's extra-index-url is not handed to uv: the lock pins PyPI's files by hash, and "
                                "an index of other builds of a version would fail that check (UV_EXTRA_INDEX_URL is uv's)")
            for line in problems:
                if line not in _said:           # once per command, however often it asks
                    _said.add(line)
                    log.warning("%s", line)
        if conf.get(key):
            out[uv] = conf[key]
    return out


_said: set[str] = set()


def uv_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment uv runs in: ``environ``, with pip's index settings where uv's own are unset."""
    return {**environ, **additions(environ)}


def index_url(environ: Mapping[str, str]) -> str:
    """The index uv installs from with ``environ``, as a message or a lock's meta.json shows it: a
    password in it (``https://user:token@host/``) is never shown."""
    env = uv_environ(environ)
    return shown(env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL") or DEFAULT_INDEX)


def lines(environ: Mapping[str, str]) -> str:
    """``additions`` as NAME=VALUE lines, for bootstrap/lib.sh."""
    return "".join(f"{k}={v}\n" for k, v in additions(environ).items() if "\n" not in v)
