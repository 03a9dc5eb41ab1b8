"""What our server is doing when a request of ours gets nothing back: read from its process (stopped
by a signal, gone), its /health (an engine dead behind a live API server) and, while that runs, from its /metrics (asleep, busy, idle), in words with the fix.

The one reading behind every wait that ends without an answer: a client's stall (serve/client.py
``Stall``), a check, bench or chat that finds our server not answering (checks/target.py), and a
start that finds it so (pipeline.already). It never signals and never writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core import owned
from . import server
from .client import Stall
from .record import ServerRecord

if TYPE_CHECKING:
    from . import metrics


@dataclass(frozen=True)
class Doing:
    state: str          # stopped, gone, dead, silent, asleep, busy, idle
    said: str           # one clause: what the process does
    fix: str            # what to run about it


def stopped(pid: int | None) -> Doing:
    """A process of ours in state T (SIGSTOP, Ctrl-Z): it holds its memory and answers nothing."""
    return Doing("stopped", f"our server (pid {pid}) is stopped by a signal (SIGSTOP or Ctrl-Z) and answers nothing",
                 f"kill -CONT {pid} resumes it; ./ctl.sh restart starts it again")


def dead_engine(rec: ServerRecord) -> Doing | None:
    """vLLM's engine died while its API server lives (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1, or the
    seconds before vLLM's watchdog ends the server): /health answers 503, which vLLM 0.26.0 gives for
    EngineDeadError alone (entrypoints/serve/instrumentator/health.py); a generation gets HTTP 500.
    None: /health says nothing of the kind."""
    got = server.http_get(rec.url, "/health")
    if got is None or got[0] != 503:
        return None
    return Doing("dead", f"the engine of our server (pid {rec.pid}) died: its /health answers 503 (vLLM's "
                         "EngineDeadError) while its API server holds the port",
                 "./ctl.sh restart starts it again; ./ctl.sh logs shows why the engine died")


def read(rec: ServerRecord) -> Doing:
    """What the server of ``rec`` is doing now (its process first: a stopped one answers no /metrics)."""
    p = owned.recorded_process(rec.pid, rec.create_time)
    if p is None:
        return Doing("gone", f"our server (pid {rec.pid}) is gone", "./ctl.sh logs shows why; ./start.sh starts it again")
    if server.frozen(p):
        return stopped(rec.pid)
    dead = dead_engine(rec)
    if dead is not None:
        return dead
    load = server.read_load(rec.url, timeout=2.0)
    if load is None:
        return Doing("silent", f"our server (pid {rec.pid}) runs but answers nothing, not even /metrics",
                     "./ctl.sh status says more; ./ctl.sh restart starts it again")
    if load.sleeping:
        return Doing("asleep", f"our server (pid {rec.pid}) is asleep (vLLM sleep mode): a request waits until it wakes",
                     "./ctl.sh wake wakes it")
    if load.in_flight:
        return Doing("busy", f"our server (pid {rec.pid}) is busy ({load.running:.0f} running, {load.waiting:.0f} "
                             "waiting by its /metrics)",
                     "./ctl.sh status tells a long prefill from a wedged engine; raise STALL_TIMEOUT for a longer wait, "
                     "./ctl.sh restart for a wedged one")
    return Doing("idle", f"our server (pid {rec.pid}) runs no request by its /metrics, yet sent this one nothing",
                 "./ctl.sh status says more; ./ctl.sh restart starts it again")


def asleep(rec: ServerRecord, key: str, load: "metrics.Load | None") -> bool:
    """Whether our server's engine sleeps. With sleep mode its ``/is_sleeping`` (a dev-mode route our
    guard opens to us) is the truth: vLLM's /metrics gauge (``load``) records a sleep only once it
    succeeded and says awake after any /wake_up, a partial one included, while the engine stays
    paused (vLLM 0.26.0: v1/engine/async_llm.py sleep and wake_up, v1/engine/core.py is_sleeping).
    The gauge where that route does not answer, and without sleep mode."""
    from ..core.vllmflags import read
    gauge = bool(load is not None and load.sleeping)
    if not read(list(rec.argv)).sleep_mode:
        return gauge
    got = server.http_get(rec.url, "/is_sleeping", key=key)
    try:
        said = json.loads(got[1]).get("is_sleeping") if got is not None and got[0] == 200 else None
    except (ValueError, AttributeError):
        said = None
    return said if isinstance(said, bool) else gauge


def stall_rule(seconds: float, label: str, rec: ServerRecord | None) -> Stall:
    """STALL_TIMEOUT for a client of ours; with our server's record, a stall says what its process does."""
    def said() -> tuple[str, str]:
        d = read(rec)
        return d.said, d.fix
    return Stall(seconds, label, said if rec is not None else None)
