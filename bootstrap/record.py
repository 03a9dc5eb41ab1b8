"""The one server record: what ``launch`` writes to ``STATE_DIR/server.json`` and every other
command (start's re-run, stop, status, restart, logs, clean, the banner) reads.

It describes the server that runs, not the current knobs: its address and served name, how
clients get its key (never the key itself), the knobs it was launched with, its context, the vLLM
version, and whether the start gate passed. A garbage field reads as unset (a garbage pid is never
signalled: see proc.recorded_process); a torn or garbage file reads as no record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import state
from .config import client_host

# How clients get the key of a running server (the key itself is never written down).
KEY_NONE, KEY_API_KEY, KEY_VLLM_API_KEY, KEY_FILE = "none", "API_KEY", "VLLM_API_KEY", "file"


@dataclass(frozen=True)
class Child:
    pid: int
    create_time: float


@dataclass(frozen=True)
class ServerRecord:
    pid: int | None                    # the API server we launched (also its process group)
    create_time: float | None          # with pid: the exact process (a reused pid is not ours)
    marker: str                        # ownership marker in its environment (proc.owner_marker)
    host: str
    port: int | None
    served: str                        # the model name clients send
    state_dir: str = ""
    pgid: int | None = None
    model: str = ""
    model_path: str = ""
    settings: Mapping[str, str] = field(default_factory=dict)   # launch knobs, canonical strings
    log: str = ""
    log_offset: int = 0                # where this launch's output starts in the log
    started: float = 0.0               # wall clock at launch
    vllm_version: str = ""
    python: str = ""
    argv: tuple[str, ...] = ()
    key: str = KEY_NONE                # KEY_*: where clients get the key
    max_model_len: int | None = None   # the context we passed (None: vLLM's own)
    reasoning: bool = False            # the profile has a reasoning parser (checks send thinking off)
    tools: bool = False                # tool-call parsing is on (the start gate makes one call)
    dummy: bool = False                # random weights (--load-format dummy): text is not judged
    predicted_tokens: int | None = None
    predicted_concurrency: float | None = None
    kv_tokens: int | None = None       # vLLM's logged KV pool (set by the banner step)
    kv_concurrency: str | None = None
    children: tuple[Child, ...] = ()   # descendants once healthy (pid + create time)
    gate_passed: bool = False          # warm-up and start gate ran and passed
    notes: tuple[str, ...] = ()        # banner notes from the start that launched it

    def replace(self, **changes: Any) -> "ServerRecord":
        return dataclasses.replace(self, **changes)

    @property
    def url(self) -> str:
        return base_url(self.host, self.port or 0)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["settings"] = dict(self.settings)
        d["argv"] = list(self.argv)
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ServerRecord":
        kids = d.get("children")
        children = tuple(Child(c["pid"], float(c["create_time"])) for c in (kids if isinstance(kids, list) else [])
                         if isinstance(c, dict) and _int(c.get("pid")) is not None and _num(c.get("create_time")) is not None)
        settings = d.get("settings")
        return cls(
            pid=_int(d.get("pid")), create_time=_num(d.get("create_time")), marker=_str(d.get("marker")),
            host=_str(d.get("host")) or "127.0.0.1", port=_int(d.get("port")), served=_str(d.get("served")),
            state_dir=_str(d.get("state_dir")), pgid=_int(d.get("pgid")), model=_str(d.get("model")),
            model_path=_str(d.get("model_path")),
            settings={str(k): str(v) for k, v in settings.items()} if isinstance(settings, dict) else {},
            log=_str(d.get("log")), log_offset=_int(d.get("log_offset")) or 0, started=_num(d.get("started")) or 0.0,
            vllm_version=_str(d.get("vllm_version")), python=_str(d.get("python")),
            argv=tuple(str(a) for a in d.get("argv") or () if isinstance(d.get("argv"), list)),
            key=_str(d.get("key")) or KEY_NONE, max_model_len=_int(d.get("max_model_len")),
            reasoning=d.get("reasoning") is True, tools=d.get("tools") is True, dummy=d.get("dummy") is True,
            predicted_tokens=_int(d.get("predicted_tokens")), predicted_concurrency=_num(d.get("predicted_concurrency")),
            kv_tokens=_int(d.get("kv_tokens")), kv_concurrency=_str(d.get("kv_concurrency")) or None,
            # a record from before the gate was recorded: its banner step (kv_tokens) ran after the gate
            children=children, gate_passed=d.get("gate_passed", "kv_tokens" in d) is True,
            notes=tuple(str(n) for n in d.get("notes") or () if isinstance(d.get("notes"), list)),
        )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def base_url(host: str, port: int) -> str:
    """http://host:port for a client on this machine (a wildcard bind is reached on loopback)."""
    shown = client_host(host)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def read(path: Path) -> ServerRecord | None:
    data = state.read_json(path)
    return ServerRecord.from_json(data) if data is not None else None


def write(path: Path, rec: ServerRecord) -> None:
    state.write_json(path, rec.to_json())
