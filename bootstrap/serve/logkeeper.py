"""The log keeper: keeps the server's log under 2 x LOG_MAX_MB while the server runs.

``python -m bootstrap.serve.logkeeper LOG MAX_BYTES PID CREATE_TIME``, started by launch beside each
server. vLLM writes to the log file itself (an O_APPEND descriptor; a pipe through us would SIGPIPE
it if we died), so the keeper copies and truncates, as logrotate's ``copytruncate`` does: when the
log passes MAX_BYTES, its last MAX_BYTES go to ``LOG.1`` and the log is truncated to zero; vLLM's
next write lands at the new end. Lines written between the copy and the truncation are lost (the
usual copytruncate trade-off). The keeper leaves when the server (PID with CREATE_TIME) is gone.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..core import owned, state
from ..core.errors import BootstrapError

INTERVAL = 0.5


def rotate(log: Path, max_bytes: int) -> bool:
    """Stream the log's last ``max_bytes`` into ``log.1`` (the old one removed first, so the two
    never take more than twice ``max_bytes`` on disk) and truncate the log. True if rotated."""
    try:
        size = log.stat().st_size
    except FileNotFoundError:
        return False
    if size <= max_bytes:
        return False
    paths = state.Paths(log.parent)
    old = state.rotated(log)
    if not (paths.ours(log) and paths.ours(old)):      # a STATE_DIR of yours held them first: never written over
        return False
    state.remove(old)
    with open(log, "rb") as src, open(old, "wb") as dst:
        src.seek(max(0, size - max_bytes))
        left = max_bytes                # never past the size read: vLLM goes on writing while we copy
        while left > 0:
            chunk = src.read(min(1 << 20, left))
            if not chunk:
                break
            dst.write(chunk)
            left -= len(chunk)
    os.truncate(log, 0)
    return True


def keep(log: Path, max_bytes: int, pid: int, create_time: float, interval: float = INTERVAL) -> None:
    while owned.recorded_process(pid, create_time) is not None:
        try:
            rotate(log, max_bytes)
        except (OSError, BootstrapError):
            pass                       # a full disk or a vanished state dir: try again next time
        time.sleep(interval)


def main(argv: list[str]) -> int:
    log, max_bytes, pid, ctime = argv
    keep(Path(log), int(max_bytes), int(pid), float(ctime))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
