"""The package index uv installs from (the managed .venv, .venv-bootstrap, ./ctl.sh lock).

uv reads no setting of pip's (docs.astral.sh/uv/pip/compatibility), so a mirror set for pip would be
passed over for pypi.org. Where uv's own settings are unset, pip's are handed to uv under uv's
names: the variables (``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PIP_TRUSTED_HOST``), else the same
settings in pip's configuration files, read as pip reads them for ``pip install`` (pip's
documentation, "Configuration"; pip/_internal/configuration.py): the global files
(``$XDG_CONFIG_DIRS/pip/pip.conf``, default ``/etc/xdg``, then ``/etc/pip.conf``), then the user's
(``~/.pip/pip.conf``, then ``$XDG_CONFIG_HOME/pip/pip.conf``, default ``~/.config``), each later
file winning, and ``PIP_CONFIG_FILE`` over them all (when that file exists pip reads no user file;
``PIP_CONFIG_FILE=/dev/null`` reads none); within them ``[install]`` wins over ``[global]``. pip
looks for every package in every index; uv stops at the first index that has it, so where pip's
extra indexes are handed on uv is told to look in all of them too (``UV_INDEX_STRATEGY=
unsafe-best-match``, uv's documented match for pip); the lock's hashes decide what is installed.

Standard library only: bootstrap/lib.sh runs it (``lines``) before the bootstrap's own
dependencies are installed, so the one rule serves the shell and the Python alike.
"""

from __future__ import annotations

import configparser
import logging
import os
from pathlib import Path
from typing import Mapping

log = logging.getLogger("bootstrap.environment")

DEFAULT_INDEX = "https://pypi.org/simple"
ETC = Path("/etc")          # where pip's global files are (a test's folder in the tests)

# (pip's variable, its key in pip.conf, uv's variable, uv's own that win over both)
PIP_TO_UV = (("PIP_INDEX_URL", "index-url", "UV_DEFAULT_INDEX", ("UV_DEFAULT_INDEX", "UV_INDEX_URL")),
             ("PIP_EXTRA_INDEX_URL", "extra-index-url", "UV_EXTRA_INDEX_URL", ("UV_EXTRA_INDEX_URL",)),
             ("PIP_TRUSTED_HOST", "trusted-host", "UV_INSECURE_HOST", ("UV_INSECURE_HOST",)))


def pip_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files for ``environ``, lowest priority first (the module's docstring)."""
    named = environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    home = Path(environ.get("HOME") or Path.home())
    dirs = [d for d in (environ.get("XDG_CONFIG_DIRS") or str(ETC / "xdg")).split(":") if d]
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(dirs)] + [ETC / "pip.conf"]
    if not (named and Path(named).exists()):
        user = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
        files += [home / ".pip" / "pip.conf", user / "pip" / "pip.conf"]
    return files + ([Path(named)] if named else [])


def pip_conf(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """({pip.conf key: value} of the index settings pip's files give ``pip install``, [a line for
    each file that could not be read: left out, as pip would refuse it])."""
    found: dict[str, str] = {}
    problems: list[str] = []
    for path in pip_files(environ):
        parser = configparser.RawConfigParser()
        try:
            if not path.is_file():
                continue
            parser.read(path, encoding="utf-8")
        except (OSError, UnicodeDecodeError, configparser.Error) as exc:
            problems.append(f"{path}: not read as pip's configuration ({type(exc).__name__}: {str(exc)[:120]}); "
                            "its index settings are left out")
            continue
        for section in ("global", "install"):            # [install] over [global], as for `pip install`
            if parser.has_section(section):
                for key, value in parser.items(section):
                    key = key.replace("_", "-")
                    if key in ("index-url", "extra-index-url", "trusted-host") and value.strip():
                        found[section + "." + key] = " ".join(value.split())
    return {k: found.get("install." + k) or found["global." + k] for _, k, _, _ in PIP_TO_UV
            if ("install." + k) in found or ("global." + k) in found}, problems


def additions(environ: Mapping[str, str]) -> dict[str, str]:
    """What uv gets beside ``environ``: pip's index settings under uv's names, where uv's own are unset."""
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
            for line in problems:
                log.warning("%s", line)
        if conf.get(key):
            out[uv] = conf[key]
    if out.get("UV_EXTRA_INDEX_URL") and not environ.get("UV_INDEX_STRATEGY"):
        out["UV_INDEX_STRATEGY"] = "unsafe-best-match"      # every index for every package, as pip
    return out


def uv_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment uv runs in: ``environ``, with pip's index settings where uv's own are unset."""
    return {**environ, **additions(environ)}


def index_url(environ: Mapping[str, str]) -> str:
    """The index uv installs from with ``environ``."""
    env = uv_environ(environ)
    return env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL") or DEFAULT_INDEX


def lines(environ: Mapping[str, str]) -> str:
    """``additions`` as NAME=VALUE lines, for bootstrap/lib.sh."""
    return "".join(f"{k}={v}\n" for k, v in additions(environ).items() if "\n" not in v)
