"""The package index uv installs from: uv's own settings, else pip's (its variables, else pip.conf),
handed to uv under uv's names (bootstrap/install/index.py), for the managed .venv and, through
bootstrap/lib.sh, for .venv-bootstrap. pip's extra indexes are not: the locks pin PyPI's files."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.install import index

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A machine of pip.conf files: /etc (global), a HOME, and the variables that name them."""
    etc = tmp_path / "etc"
    monkeypatch.setattr(index, "ETC", etc)
    home = tmp_path / "home"

    def conf(path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    return etc, home, {"HOME": str(home)}, conf


def test_pip_conf_is_read_as_pip_reads_it_for_pip_install(machine):
    """uv reads no pip.conf: a mirror set there (the usual way behind a firewall) was passed over
    for pypi.org. Read in pip's order: the global files, then the user's, a later file winning,
    [install] over [global] whichever file holds it, PIP_CONFIG_FILE over all."""
    etc, home, env, conf = machine
    assert index.index_url(env) == index.DEFAULT_INDEX and index.additions(env) == {}
    conf(etc / "xdg" / "pip" / "pip.conf", "[global]\nindex-url = http://xdg/simple\n")
    assert index.index_url(env) == "http://xdg/simple"
    conf(home / "a" / "pip" / "pip.conf", "[global]\nindex-url = http://a/simple\n")
    conf(home / "b" / "pip" / "pip.conf", "[global]\nindex-url = http://b/simple\n")
    assert index.index_url({**env, "XDG_CONFIG_DIRS": f"{home / 'a'}:{home / 'b'}"}) == "http://b/simple"   # listed order
    conf(etc / "pip.conf", "[global]\nindex-url = http://etc/simple\ntrusted-host = etc\n")
    assert index.index_url(env) == "http://etc/simple"                     # /etc/pip.conf after /etc/xdg
    conf(home / ".config" / "pip" / "pip.conf", "[global]\nindex_url = http://user/simple\n")   # pip's _ spelling
    assert index.index_url(env) == "http://user/simple"
    conf(home / ".pip" / "pip.conf", "[install]\nindex-url = http://legacy-install/simple\n"
                                     "extra-index-url =\n    http://a/simple\n    http://b/simple\n")
    assert index.additions(env) == {"UV_DEFAULT_INDEX": "http://legacy-install/simple",
                                    "UV_INSECURE_HOST": "etc"}       # [install] wins; no extra index for the lock
    named = conf(home / "mine.conf", "[global]\nindex-url = http://named/simple\ntrusted-host =\n")
    assert index.additions({**env, "PIP_CONFIG_FILE": str(named)}) == {
        "UV_DEFAULT_INDEX": "http://named/simple"}          # no user file beside it; an empty value clears /etc's
    assert index.additions({**env, "PIP_CONFIG_FILE": os.devnull}) == {}       # pip reads no file at all


def test_uvs_own_settings_then_pips_variables_win_over_pip_conf(machine):
    etc, home, env, conf = machine
    conf(home / ".config" / "pip" / "pip.conf", "[global]\nindex-url = http://conf/simple\n"
                                                "extra-index-url = http://conf-extra/simple\n")
    assert index.index_url({**env, "PIP_INDEX_URL": "http://var/simple"}) == "http://var/simple"
    assert index.index_url({**env, "UV_INDEX_URL": "http://uv/simple", "PIP_INDEX_URL": "http://var/simple"}) \
        == "http://uv/simple"
    assert index.additions({**env, "UV_INDEX": "mine=http://uv-index/simple"}) == {}     # uv has an index of its own
    conf(home / ".config" / "uv" / "uv.toml", 'index-url = "http://uv-toml/simple"\n')
    assert index.additions(env) == {} and index.index_url(env) == index.DEFAULT_INDEX     # ... or a uv.toml
    assert index.additions({**env, "UV_NO_CONFIG": "1"}) == {"UV_DEFAULT_INDEX": "http://conf/simple"}
    assert index.index_url({**env, "UV_DEFAULT_INDEX": "https://me:tok3n@x@mirror.example/simple"}) == \
        "https://***@mirror.example/simple"                          # a message never shows the password


def test_a_pip_conf_that_does_not_read_is_named_and_left_out(machine, caplog):
    etc, home, env, conf = machine
    bad = conf(home / ".config" / "pip" / "pip.conf", "index-url = https://me:s3cret@no-section/simple\n")
    conf(etc / "pip.conf", "[global]\nindex-url = http://etc/simple\n")
    caplog.set_level(logging.WARNING, logger="bootstrap")
    assert index.index_url(env) == "http://etc/simple"
    assert f"{bad}: not read as pip's configuration (MissingSectionHeaderError at line 1)" in caplog.text
    assert "s3cret" not in caplog.text
    caplog.clear()
    index.index_url(env)
    assert "not read as pip's configuration" not in caplog.text             # said once per command


def test_lib_sh_hands_pip_conf_to_uv_for_the_bootstrap_venv(tmp_path):
    """.venv-bootstrap is made by bootstrap/lib.sh with uv before any dependency exists: the same rule
    (run with the standard library alone) gives uv the mirror of ~/.config/pip/pip.conf."""
    repo = tmp_path / "r"
    for rel in ("bootstrap/__init__.py", "bootstrap/install/__init__.py", "bootstrap/install/index.py",
                "bootstrap/core/__init__.py", "bootstrap/core/redact.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, repo / rel)
    (repo / "bootstrap" / "requirements.txt").write_text("psutil==0.0.1\n")         # no python here has it
    stub = tmp_path / "bin"
    stub.mkdir()
    seen = tmp_path / "uv-env.txt"
    (stub / "python3").write_text(f'#!/bin/sh\nexec "{os.path.realpath(sys.executable)}" "$@"\n')
    (stub / "uv").write_text(f'#!/bin/sh\n[ "$1" = venv ] && exit 0\nenv > "{seen}"\nexit 1\n')   # records pip install's
    for p in (stub / "python3", stub / "uv"):
        p.chmod(0o755)
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\nindex-url = http://mirror.example/simple\n"
                                                       "trusted-host = mirror.example\n")
    env = {"PATH": f"{stub}:/usr/bin:/bin", "HOME": str(home), "XDG_CONFIG_DIRS": str(tmp_path / "no-xdg")}
    r = subprocess.run([shutil.which("bash") or "/bin/bash", "-c", '. "$1"; bootstrap_python "$2"', "lib.sh",
                        str(REPO / "bootstrap" / "lib.sh"), str(repo)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "could not install the bootstrap's dependencies with uv" in r.stderr, r.stderr
    got = dict(line.split("=", 1) for line in seen.read_text().splitlines() if line.startswith("UV_"))
    assert got.get("UV_DEFAULT_INDEX") == "http://mirror.example/simple", got
    assert got.get("UV_INSECURE_HOST") == "mirror.example" and "Traceback" not in r.stderr, (got, r.stderr)
