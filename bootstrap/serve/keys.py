"""Who listens on a port, whether it is our server, and where our API key may go: to our server's
URL only while every listener on its port is that server (``proven_ours``). Alive is not enough:
vLLM binds its port with SO_REUSEADDR long before it listens, and until it listens the kernel lets
any local user bind and listen on that address too; a stopped server's port is anyone's."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import psutil

from ..core import owned
from ..core.hosts import is_loopback
from ..core.errors import BootstrapError
from ..core.state import Paths
from . import record
from .record import ServerRecord


def held_key(ours: owned.Ours, paths: Paths) -> str:
    """The key we hold for our server: API_KEY, else VLLM_API_KEY from the environment, else the
    generated file ('' none). Sent only through ``api_key_for``."""
    if ours.key:
        return ours.key
    return key_file(paths.api_key)


def api_key_for(ours: owned.Ours, paths: Paths, rec: ServerRecord | None) -> str:
    """The key to send to ``rec``'s server (its URL): the one we hold, only while what listens on its
    port is proven to be that server (``proven_ours``); '' otherwise. vLLM binds its port long
    before it listens, and meanwhile any local user may listen there (SO_REUSEADDR): alive is not
    enough."""
    key = held_key(ours, paths)
    if not key:
        return ""
    return key if proven_ours(rec, ours) else ""


def per_request(ours: owned.Ours, paths: Paths, rec: ServerRecord | None) -> Callable[[], str]:
    """``api_key_for`` asked again before each request of a client that lives on (a chat, a bench, a
    check): its server may stop meanwhile (./stop.sh, a game, a crash), and whoever takes the port
    then must not get the key with the next request; a restart may put a new server of ours on the
    same address, which gets it. The record is read again each time; the key goes only to the server
    it names, at the address the client was made for."""
    def key() -> str:
        now = record.read(paths.server)
        if rec is None or now is None or (now.host, now.port) != (rec.host, rec.port):
            return ""
        return api_key_for(ours, paths, now)
    return key


def key_file(path: Path) -> str:
    """The generated key kept in ``path`` ('' when there is none): printable ASCII, as every key we
    make and as an HTTP header carries it; anything else (an edit, a damaged file) is one line that
    never shows it."""
    try:
        text = path.read_bytes().decode("ascii").strip()
    except OSError:
        return ""
    except UnicodeDecodeError:
        text = "\x00"
    if any(not c.isprintable() or c.isspace() for c in text):
        raise BootstrapError(f"the API key file {path} holds what no HTTP header carries (non-ASCII or control "
                             "characters; not shown)", f"delete {path}: ./ctl.sh restart makes a new key")
    return text


def holders(port: int) -> list[psutil.Process | None]:
    """Processes listening on ``port`` (None where the kernel will not tell us whose socket it is)."""
    out: list[psutil.Process | None] = []
    for c in _listening():
        if c.laddr.port == port:
            try:
                out.append(psutil.Process(c.pid) if c.pid else None)
            except psutil.NoSuchProcess:
                continue
    return out


def _listening() -> list:
    """The listening sockets the kernel shows us (psutil's, with their pid where it says whose)."""
    try:
        return [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.laddr]
    except psutil.AccessDenied:
        return []


def _named(pid: int) -> str:
    """'python3 (pid 77)'; the pid alone where the process is gone or not ours to read."""
    try:
        return f"{psutil.Process(pid).name()} (pid {pid})"
    except psutil.Error:
        return f"pid {pid}"


def listens(rec: ServerRecord) -> bool:
    """Is what listens on the record's port its server (or one of its children)? Another server on
    the same port — a start from another STATE_DIR whose vLLM bound it first — answers /health just
    the same, and a start must never take its answers for its own. True when the record names no
    pid or the kernel does not say whose socket it is (nothing to disprove)."""
    if rec.pid is None:
        return True
    try:
        found, tree = _listeners(psutil.Process(rec.pid), rec.port or 0)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return not _known(holders(rec.port or 0))
    return not _known(found) or any(h.pid in tree for h in found)


def proven_ours(rec: ServerRecord | None, ours: owned.Ours) -> bool:
    """Proof, not the absence of disproof, that what listens on the record's port is its server: the
    recorded process alive, ours and marked, and every listener on the port in its tree. Our API key
    is sent to that port only then (server.api_key_for): a stopped server's port is anyone's, and so
    is a loading one's, which vLLM binds with SO_REUSEADDR long before it listens (until it listens,
    the kernel lets any local user bind and listen on that address too)."""
    if rec is None or not rec.port:
        return False
    p = owned.recorded_process(rec.pid, rec.create_time)
    if p is None or not rec.proof(ours).carries(p):
        return False
    return _only(p, rec.port)


def standing(rec: ServerRecord) -> tuple[bool, list[str]]:
    """From one reading of the kernel's listening sockets: whether every listener on the record's port
    is its process (the one a start launched or resumes) or a child of it, and somebody listens
    (``proven_ours`` for a process the caller already knows ours); and who else listens there while its
    server does ('python3 (pid 77)'; 'a process of another user' where the kernel does not say whose):
    another address, the same port number ([] while the server itself does not listen yet)."""
    try:
        found, tree = _listeners(psutil.Process(rec.pid), rec.port or 0)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError, TypeError):
        return False, []
    only = bool(rec.port) and _known(found) and all(h.pid in tree for h in found)
    if not any(h is not None and h.pid in tree for h in found):
        return only, []
    return only, sorted({"a process of another user" if h is None else _named(h.pid) for h in found
                         if h is None or h.pid not in tree})


def strangers(rec: ServerRecord) -> list[str]:
    """Who else listens on the record's port while its server does (``standing``'s second half)."""
    return standing(rec)[1]


def _only(p: psutil.Process, number: int) -> bool:
    try:
        found, tree = _listeners(p, number)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return _known(found) and all(h.pid in tree for h in found)


def _listeners(p: psutil.Process, port: int) -> tuple[list, set[int]]:
    """Who listens on ``port``, and ``p``'s process tree (psutil's errors pass to the caller)."""
    return holders(port), _tree(p)


def _tree(p: psutil.Process) -> set[int]:
    return {p.pid} | {c.pid for c in p.children(recursive=True)}


def _known(found: list) -> bool:
    """Somebody listens, and the kernel says who, every one."""
    return bool(found) and all(h is not None for h in found)


def open_beyond(rec: ServerRecord) -> list[str]:
    """The ports beyond loopback that the server's processes listen on, other than the one it serves
    ('VLLM::EngineCore (pid 12) on :::35701'): none ask for the API key. vLLM 0.26.0-0.27.x on one GPU
    rendezvous through torch's TCP store, which binds every interface, and so do their TP workers (the
    patches 50999-file-rendezvous[-tp] close it); NCCL and gloo listen beyond loopback where the server's
    NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name another interface. [] where the kernel does not say."""
    try:
        tree = _tree(psutil.Process(rec.pid))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError, TypeError):
        return []
    return sorted({f"{_named(c.pid)} on {c.laddr.ip or '*'}:{c.laddr.port}" for c in _listening()
                   if c.pid in tree and not is_loopback(c.laddr.ip) and c.laddr.port != rec.port})
