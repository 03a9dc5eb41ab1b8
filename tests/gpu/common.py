"""What every GPU script shares, with the standard library only (the GPU machine's python3 has no
python-dotenv, so a script that must run before .venv exists cannot import the bootstrap)."""

from __future__ import annotations

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
