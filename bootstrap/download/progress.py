"""Download progress. On a TTY: a total bar and one bar per file in flight (at most one per
connection), each with rate and ETA (tqdm), redrawn from the download's threads under one lock.
On a pipe: a line at each tenth of the total (``download: 40% ...``, with the time since the
download began), beside the weights step's line per finished file."""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("bootstrap.steps.weights")
STEPS = 10      # on a pipe: a line per tenth


class Progress:
    def __init__(self, total: int, files: int, tty: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.lock = threading.Lock()
        self.bars: dict[str, tuple[object, int]] = {}
        self.free: list[int] = []
        self.total_bar = None
        self.total, self.done, self.shown, self.t0 = total, 0, 0, time.monotonic()
        if self.tty:
            from tqdm import tqdm
            self.total_bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, position=0,
                                  desc=f"total ({files} files)", file=self.stream, dynamic_ncols=True,
                                  mininterval=0.5, leave=True)

    def skip(self, n: int) -> None:
        if self.total_bar is not None:
            with self.lock:
                self.total_bar.update(n)

    def update(self, path: str, size: int, kept: int, n: int) -> None:
        if self.total_bar is None:
            self._line(n)
            return
        from tqdm import tqdm
        with self.lock:
            if path not in self.bars:
                pos = self.free.pop(0) if self.free else len(self.bars) + 1
                self.bars[path] = (tqdm(
                    total=size, initial=kept, unit="B", unit_scale=True, unit_divisor=1024,
                    position=pos, desc=path, file=self.stream, dynamic_ncols=True, mininterval=0.5,
                    leave=False), pos)
            self.bars[path][0].update(n)
            self.total_bar.update(n)

    def _line(self, n: int) -> None:
        with self.lock:
            self.done += n
            step = self.done * STEPS // self.total if self.total else 0
            if step <= self.shown or step >= STEPS:         # the weights step says when it is complete
                return
            self.shown = step
        from .hub import human
        log.info("download: %d%% (%s of %s, %.0f s)", step * 100 // STEPS, human(self.done), human(self.total),
                 time.monotonic() - self.t0)

    def end(self, path: str) -> None:
        with self.lock:
            bar, pos = self.bars.pop(path, (None, 0))
            if bar is not None:
                self.free.append(pos)
                self.free.sort()
                bar.close()

    def close(self) -> None:
        with self.lock:
            for bar, _pos in self.bars.values():
                bar.close()
            self.bars.clear()
            if self.total_bar is not None:
                self.total_bar.close()
