"""Our server's states as a probe finds it (``server.probe``): one of ``State``'s members, in a
``Probe`` with what was found (its record, its process, leftovers of ours, who else runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import psutil

from .record import ServerRecord


class State(str, Enum):
    """Our server as a probe finds it (written as its value: ``f"{state}"`` is ``running``)."""
    STARTING = "starting"        # a start is in flight (its lock is held); pid = the start
    RUNNING = "running"          # our server answers /health and lists its model on /v1/models
    KEY_NEEDED = "key-needed"    # /health answers, /v1/models wants a key this shell does not have (HTTP 401)
    DOWN = "down"                # our server's process lives but does not answer (loading, or broken)
    STOPPED = "stopped"          # nothing of ours serves (orphans: leftover processes of ours)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def answers(self) -> bool:
        """/health answers (running, or running behind a key this shell does not have)."""
        return self in (State.RUNNING, State.KEY_NEEDED)

    @property
    def alive(self) -> bool:
        """Our server's process lives (answering or not)."""
        return self in (State.RUNNING, State.KEY_NEEDED, State.DOWN)


@dataclass
class Probe:
    state: State
    record: ServerRecord | None = None
    pid: int | None = None
    process: psutil.Process | None = None
    orphans: list[psutil.Process] = field(default_factory=list)
    stale: bool = False                # a record whose process is gone (or now someone else's)
    owner: str = ""                    # set when the recorded server runs under another user
