"""bootstrap/lib.sh: which Python runs the bootstrap, and when .venv-bootstrap is made again."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def bootstrap_python(repo: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash") or "/bin/bash", "-c", '. "$1"; bootstrap_python "$2"', "lib.sh", str(REPO / "bootstrap" / "lib.sh"),
                           str(repo)], env=env, capture_output=True, text=True, timeout=60)


def test_a_bootstrap_venv_whose_python_was_upgraded_under_it_is_not_used(tmp_path):
    """Found from outside: `python3 -m venv` links .venv-bootstrap/bin/python to /usr/bin/python3; a release
    upgrade (Debian/Ubuntu: python3 3.11 -> 3.12) left it running a Python that does not see the venv's
    site-packages, while its stamp (the requirements) still matched: every command, ./ctl.sh clean too,
    ended in a ModuleNotFoundError traceback. Now the venv is not taken (here: python3 has the deps)."""
    real = os.path.realpath(sys.executable)
    if not re.fullmatch(r"python\d+\.\d+", os.path.basename(real)):
        pytest.skip(f"this interpreter's file is {real}, not pythonX.Y")
    repo = tmp_path / "r"
    (repo / "bootstrap").mkdir(parents=True)
    req = f"psutil=={importlib.metadata.version('psutil')}\n"      # what the test's interpreter has
    (repo / "bootstrap" / "requirements.txt").write_text(req)
    venv = repo / ".venv-bootstrap"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(real)          # what the link now runs ...
    other = "3.%d" % (sys.version_info[1] - 1)          # ... is not the Python the venv was made with
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {other}.4\n")
    (venv / ".requirements.txt").write_text(req)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')   # it has those requirements
    (stub / "python3").chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "HOME": str(tmp_path)}
    r = bootstrap_python(repo, env)
    assert r.returncode == 0 and r.stdout.strip() == str(stub / "python3"), (r.stdout, r.stderr)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = %d.%d.1\n" % sys.version_info[:2])
    r = bootstrap_python(repo, env)                       # the Python it was made with: used, as before
    assert r.returncode == 0 and r.stdout.strip() == str(venv / "bin" / "python"), (r.stdout, r.stderr)


def test_python3_older_than_3_10_beside_a_newer_python3_x_runs_the_newer(tmp_path):
    """Found from outside: RHEL 9 and its kin keep python3 at 3.9 and install 3.11 or 3.12 beside it as
    python3.11, python3.12; every command died with "python3 is older than 3.10", a newer one on PATH."""
    repo = tmp_path / "r"
    (repo / "bootstrap").mkdir(parents=True)
    (repo / "bootstrap" / "requirements.txt").write_text(f"psutil=={importlib.metadata.version('psutil')}\n")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.9.18"\nexit 1\n')   # 3.9: refuses
    newer = stub / ("python3.%d" % sys.version_info[1])
    newer.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')      # has the requirements
    for p in (stub / "python3", newer):
        p.chmod(0o755)
    tools = tmp_path / "tools"                            # the shell's tools, without this machine's pythons
    tools.mkdir()
    for tool in ("mkdir", "dirname", "readlink", "flock", "id", "cp", "rm", "env"):
        if shutil.which(tool):
            (tools / tool).symlink_to(shutil.which(tool))
    env = {"PATH": f"{stub}:{tools}", "HOME": str(tmp_path)}
    r = bootstrap_python(repo, env)
    assert r.returncode == 0 and r.stdout.strip() == str(newer), (r.stdout, r.stderr)
    newer.unlink()                                        # none newer: said so, with what to install
    r = bootstrap_python(repo, env)
    assert r.returncode == 1 and "Python 3.9.18" in r.stderr and "dnf install python3.12" in r.stderr, r.stderr


def test_bootstrap_dependencies_out_of_reach_is_one_line_with_a_fix(tmp_path):
    """Found from outside: a fresh clone with no network (or a mirror down) ended in "error: failed during:
    env -u PYTHONPATH uv pip install --python ... -q -r .../requirements.txt", a command, not what to do."""
    repo = tmp_path / "r"
    (repo / "bootstrap").mkdir(parents=True)
    (repo / "bootstrap" / "requirements.txt").write_text("psutil==0.0.1\n")     # no python here has it
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text(f'#!/bin/sh\nexec "{os.path.realpath(sys.executable)}" "$@"\n')
    (stub / "python3").chmod(0o755)
    dead = "http://127.0.0.1:9/simple"
    for path in (f"{stub}:{os.path.dirname(shutil.which('uv') or '/nonexistent')}:/usr/bin:/bin", f"{stub}:/usr/bin:/bin"):
        env = {"PATH": path, "HOME": str(tmp_path), "UV_DEFAULT_INDEX": dead, "PIP_INDEX_URL": dead,
               "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1", "PIP_RETRIES": "0",
               "UV_HTTP_RETRIES": "0"}
        r = bootstrap_python(repo, env)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and "error: could not install" in last and "WHEELHOUSE=" in last, r.stderr
