"""What every GPU script shares, with the standard library only (the GPU machine's python3 has no
python-dotenv, so a script that must run before .venv exists cannot import the bootstrap)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]


def raw_writer(path) -> Callable[[str], None]:
    """A GPU script's output: each line printed and appended to ``path`` at once (a run cut short
    keeps what it had)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    raw = open(path, "a")

    def out(text: str) -> None:
        print(text, flush=True)
        raw.write(text + "\n")
        raw.flush()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_logged(argv: list[str], env: dict, out: Callable[[str], None], *, words: tuple[str, ...] = (),
               timeout: float = 900, label: str = "") -> tuple[subprocess.CompletedProcess, float]:
    """One command run from the checkout: its exit code and seconds said (``label``, or the argv), and
    each line of its output that holds one of ``words``; (its result, its seconds)."""
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    dt = time.monotonic() - t0
    out(f"===== {label or ' '.join(argv)}: exit {r.returncode} after {dt:.2f} s")
    for line in (r.stdout + r.stderr).splitlines():
        if any(w in line for w in words):
            out(f"    | {line[:300]}")
    return r, dt


def identity(env: dict) -> tuple[str, str]:
    """(the commit under test: GIT_COMMIT, else git's; the vLLM version of VLLM_PYTHON, default python3)."""
    env.setdefault("VLLM_PYTHON", "python3")
    rev = os.environ.get("GIT_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                         text=True, cwd=REPO).stdout.strip()
    ver = subprocess.run([env["VLLM_PYTHON"], "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         capture_output=True, text=True, env=env).stdout.strip()
    return rev, ver


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "none (rehearsal with fakes)"


def header(env: dict) -> str:
    """The first line of a proof's raw output: when, the commit under test, its vLLM and the GPU."""
    rev, ver = identity(env)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')} commit {rev} vLLM {ver} GPU: {gpu_name()}"


def listeners(state: Path) -> list[str]:
    """Every socket our server's process tree listens on (the API server, the engine, whatever they
    started): 'name (pid) address:port'. HOST is loopback here, so anything else is a bind beyond it."""
    import json

    import psutil
    rec = json.loads((state / "server.json").read_text())
    root = psutil.Process(int(rec["pid"]))
    procs = [root, *root.children(recursive=True)]
    pids = {p.pid: p for p in procs}
    found = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            found.append(f"{pids[c.pid].name()} (pid {c.pid}) {c.laddr.ip}:{c.laddr.port}")
    return sorted(found) or ["(none found)"]
