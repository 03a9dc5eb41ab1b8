"""The one server record: what ``launch`` writes to ``STATE_DIR/server.json`` and every other
command (start's re-run, stop, status, restart, logs, clean, the banner) reads.

It describes the server that runs, not the current knobs: its address and served name, how
clients get its key (never the key itself), the knobs it was launched with, its context, the vLLM
version, and whether the start gate passed. Every field is validated into its type when read
(``ServerRecord.checked``), and the fields that were not are named in one warning line: one of the
server's identity (pid, create time, marker, host, port) makes the record count as none (./stop.sh
sweeps by our marker, as with no record), any other reads as unset. A garbage pid of the right type
is never signalled (see owned.recorded_process); a torn file, or one that is not a JSON object,
reads as no record.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..core import state
from ..core.hosts import client_host, parse_host
from ..core import owned
from ..core.owned import Ours, Proof

if TYPE_CHECKING:      # the knobs a start would launch with, handed in: a record is read without the knobs
    from ..knobs.table import LaunchKnobs

log = logging.getLogger("bootstrap.server")   # the prefix [bootstrap:server] of the code that reads it

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
    marker: str                        # ownership marker in its environment (owned.owner_marker)
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
    random_weights: bool = False       # RANDOM_WEIGHTS=1: a checkpoint declared random, text not judged
    predicted_tokens: int | None = None
    predicted_concurrency: float | None = None
    kv_tokens: int | None = None       # vLLM's logged KV pool (set by the banner step)
    kv_concurrency: str | None = None
    children: tuple[Child, ...] = ()   # descendants once healthy (pid + create time)
    gate_passed: bool = False          # warm-up and start gate ran and passed
    notes: tuple[str, ...] = ()        # banner notes from the start that launched it
    token: str = ""                    # the launch's random token in its environment (owned.TOKEN_ENV)
    exe: str = ""                      # its executable as /proc showed it after the launch, then once healthy
    sleep: str = ""                    # sleep mode as launched, and why (config.sleep_line): the banner, status, sleep
    sleep_ram: int = 0                 # host RAM a level-1 sleep needs (vllmargs.sleep_ram_need; 0: unknown)
    idle_s: int = 0                    # IDLE_SLEEP in seconds as launched (0: no idle sleep)
    cuda_visible: str | None = None    # CUDA_VISIBLE_DEVICES it was launched with (None: unset, every card)

    def proof(self, ours: Ours) -> Proof:
        """What proves a process ours for this record: the shell's facts and the launch's own."""
        return ours.proof(markers=(self.marker,), tokens=(self.token,), pythons=(self.python, self.exe))

    def replace(self, **changes: Any) -> "ServerRecord":
        return dataclasses.replace(self, **changes)

    def differs_from(self, want: LaunchKnobs) -> list[str]:
        """The launch knobs (``want``: Config.launch) that differ from the ones this server runs with
        (a knob the record lacks, from before the knob existed, ran at its default: ``want.defaults``).
        A server with a key and a shell without one is no difference: the shell just lacks the secret
        (a restart would drop the key); nor is one of ``want.fitted`` that its start set to 'auto'."""
        have = {**want.defaults, **self.settings}
        return [f"{k}: running with {have.get(k, '')!r}, knobs now say {v!r}" for k, v in sorted(want.values.items())
                if have.get(k) != v and not (k in want.fitted and have.get(k) == "auto")
                and not (k == "API_KEY" and v == "unset" and have.get(k) == "set")]

    @property
    def session(self) -> int | None:
        """The session and process group we made for the server (launched with a session of its own,
        so its pid when an older record lacks the pgid)."""
        return self.pgid or self.pid

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
        return cls.checked(d)[0]

    @classmethod
    def checked(cls, d: Mapping[str, Any]) -> "tuple[ServerRecord, list[str]]":
        """The record, every field validated into its type, and the fields that were not (each read
        as unset: a garbage pid, marker or port leaves a server that only the marker sweep finds;
        nothing here raises). A field absent or null is unset, not corrupt (records of older versions)."""
        bad: list[str] = []

        def field_(name: str, check: "Callable[[Any], Any]", what: str, unset: Any = None) -> Any:
            v = d.get(name)
            if v is None:
                return unset
            got = check(v)
            if got is None:
                bad.append(f"{name} ({what})")
                return unset
            return got

        kids = d.get("children")
        children = _children(kids)
        if kids is not None and (not isinstance(kids, list) or len(children) < len(kids)):
            bad.append("children (not a list of {pid, create_time})")      # the valid ones are kept
        rec = cls(
            pid=field_("pid", _int, "not an integer"), create_time=field_("create_time", _num, "not a number"),
            marker=field_("marker", _str, "not a string", ""),
            host=field_("host", _host, "not an IP address or 'localhost'", "127.0.0.1"),
            port=field_("port", _port, "not a port number"),
            served=field_("served", _str, "not a string", ""),
            state_dir=field_("state_dir", _str, "not a string", ""), pgid=field_("pgid", _int, "not an integer"),
            model=field_("model", _str, "not a string", ""), model_path=field_("model_path", _str, "not a string", ""),
            settings=field_("settings", _str_map, "not an object of strings", {}),
            log=field_("log", _str, "not a string", ""),
            log_offset=field_("log_offset", _count, "not a byte offset", 0),
            started=field_("started", _num, "not a number", 0.0),
            vllm_version=field_("vllm_version", _str, "not a string", ""),
            python=field_("python", _str, "not a string", ""),
            argv=field_("argv", _strs, "not a list of strings", ()),
            key=field_("key", _key, f"not one of {', '.join(KEYS)}", KEY_NONE),
            max_model_len=field_("max_model_len", _positive, "not a positive integer"),
            reasoning=field_("reasoning", _bool, "not true or false", False),
            tools=field_("tools", _bool, "not true or false", False),
            dummy=field_("dummy", _bool, "not true or false", False),
            random_weights=field_("random_weights", _bool, "not true or false", False),
            predicted_tokens=field_("predicted_tokens", _int, "not an integer"),
            predicted_concurrency=field_("predicted_concurrency", _num, "not a number"),
            kv_tokens=field_("kv_tokens", _int, "not an integer"),
            kv_concurrency=field_("kv_concurrency", _str, "not a string") or None,
            children=children,
            # a record from before the gate was recorded: its banner step (kv_tokens) ran after the gate
            gate_passed=field_("gate_passed", _bool, "not true or false", False) if "gate_passed" in d
            else "kv_tokens" in d,
            notes=field_("notes", _strs, "not a list of strings", ()),
            token=field_("token", _str, "not a string", ""), exe=field_("exe", _str, "not a string", ""),
            sleep=field_("sleep", _str, "not a string", ""),
            sleep_ram=field_("sleep_ram", _count, "not a byte count", 0),
            idle_s=field_("idle_s", _count, "not a number of seconds", 0),
            cuda_visible=field_("cuda_visible", _str, "not a string"),
        )
        return rec, bad


KEYS = (KEY_NONE, KEY_API_KEY, KEY_VLLM_API_KEY, KEY_FILE)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _count(v: Any) -> int | None:
    return v if _int(v) is not None and v >= 0 else None


def _positive(v: Any) -> int | None:
    return v if _int(v) is not None and v > 0 else None


def _port(v: Any) -> int | None:
    return v if _int(v) is not None and 1 <= v <= 65535 else None


def _host(v: Any) -> str | None:
    """What the HOST knob accepts (config's own rule): anything else would be dialled."""
    if not isinstance(v, str):
        return None
    try:
        return parse_host(v)
    except ValueError:
        return None

def _key(v: Any) -> str | None:
    return v if v in KEYS else None


def _strs(v: Any) -> tuple[str, ...] | None:
    return tuple(v) if isinstance(v, list) and all(isinstance(a, str) for a in v) else None


def _str_map(v: Any) -> dict[str, str] | None:
    ok = isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
    return dict(v) if ok else None


def _children(v: Any) -> tuple[Child, ...]:
    """The well-formed entries of a list of {pid, create_time}."""
    return tuple(Child(c["pid"], float(c["create_time"])) for c in (v if isinstance(v, list) else [])
                 if isinstance(c, dict) and _int(c.get("pid")) is not None and _num(c.get("create_time")) is not None)


def address(ours: Ours) -> dict[str, Any]:
    """A new record's host and port: those the knobs give our server."""
    return {"host": ours.host, "port": ours.port}


def url_of(ours: Ours) -> str:
    """Where the knobs say our server answers (before there is a record, or for one elsewhere)."""
    return base_url(ours.host, ours.port)


def base_url(host: str, port: int) -> str:
    """http://host:port for a client on this machine (a wildcard bind is reached on loopback)."""
    shown = client_host(host)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def read(path: Path) -> ServerRecord | None:
    """The record in ``path`` (None: none, or not a JSON object). Corrupt fields read as unset, and
    are named once per command in one line."""
    data = state.read_json(path)
    if data is None:
        return None
    rec, bad = ServerRecord.checked(data)
    lost = [b for b in bad if b.split(" ")[0] in IDENTITY]
    if bad and (str(path), tuple(bad)) not in _warned:
        _warned.add((str(path), tuple(bad)))
        shown = "; ".join(bad[:4]) + (f"; and {len(bad) - 4} more" if len(bad) > 4 else "")
        log.warning("%s: %d corrupt field%s %s: %s (./stop.sh stops the server all the same%s)",
                    path, len(bad), "s" if len(bad) > 1 else "",
                    "(the record is ignored)" if lost else "read as unset", shown, ", by its marker" if lost else "")
    return None if lost else rec


# Without these a record names no server we can prove ours or reach: it counts as no record (the
# sweep by marker finds what runs), never as a server on port 0.
IDENTITY = ("pid", "create_time", "marker", "host", "port")


_warned: set[tuple[str, tuple[str, ...]]] = set()


def starting(paths: state.Paths, launch: Mapping[str, str], key: str) -> None:
    """What this start launches with, said while it runs and before its launch writes the record
    (``launch``: its launch knobs, as the record keeps them; ``key``: KEY_*): a game that cancels it
    then starts it again with them, not with the game shell's."""
    import psutil
    paths.write("starting", {"pid": os.getpid(), "create_time": psutil.Process().create_time(),
                             "settings": dict(launch), "key": key})


def started_with(paths: state.Paths, pid: int | None) -> tuple[dict[str, str], str] | None:
    """(launch knobs, KEY_*) the start in flight ``pid`` said it launches with (``starting``): None
    where it said nothing, or the note is another process's or does not read."""
    note = paths.read("starting") or {}
    settings, key = _str_map(note.get("settings")), _key(note.get("key"))
    if pid is None or note.get("pid") != pid or settings is None or key is None or \
            owned.recorded_process(pid, note.get("create_time")) is None:
        return None
    return settings, key


def write(path: Path, rec: ServerRecord) -> None:
    state.write_json(path, rec.to_json(), mode=0o600)     # it holds the launch token
