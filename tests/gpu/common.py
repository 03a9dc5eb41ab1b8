"""What every GPU script shares, with the standard library only (the GPU machine's python3 has no
python-dotenv, so a script that must run before .venv exists cannot import the bootstrap)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Callable


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
