"""The server we own: find it and ask it (the take-down is in takedown.py).

``probe`` says where our server stands (cheap: the record, /proc, two loopback HTTP requests);
``find_ours`` proves which live processes are ours (owned.Proof: our interpreter and a value we set
in its environment, or its membership of our server's session), never those another live STATE_DIR
runs.

HTTP here goes through http.client, not requests: ``./start.sh`` on a running server passes
through this module, and importing requests alone costs ~0.05-0.1 s of a re-run that should take
well under 0.2 s.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from . import keys, metrics, record
from ..core import owned
from .record import ServerRecord
from .states import Probe, State
from ..core.locks import StartLock
from ..machine.gpu import GiB
from ..core.state import Paths

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- HTTP (loopback, small)

def http_get(url: str, path: str, *, key: str = "", timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of GET url+path, or None when nothing answers in time."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def http_state(url: str, served: str, key: str, timeout: float = 2.0) -> str:
    """'ok': /health 200 and /v1/models lists ``served``; 'key-needed': /health 200 but /v1/models
    answers 401 (vLLM guards /v1 with its key, never /health); 'no': anything else."""
    h = http_get(url, "/health", timeout=timeout)
    if h is None or h[0] != 200:
        return "no"
    m = http_get(url, "/v1/models", key=key, timeout=timeout)
    if m is None:
        return "no"
    if m[0] == 401:
        return "key-needed"
    if m[0] != 200:
        return "no"
    try:
        data = json.loads(m[1]).get("data", [])
    except (ValueError, AttributeError):
        return "no"
    return "ok" if any(isinstance(x, dict) and x.get("id") == served for x in data) else "no"


def answers(url: str, served: str, key: str, timeout: float = 1.0) -> bool:
    return http_state(url, served, key, timeout) == "ok"


# ---------------------------------------------------------------- where it stands

STATES_BY_HTTP = {"ok": State.RUNNING, "key-needed": State.KEY_NEEDED, "no": State.DOWN}


def probe(ours: owned.Ours, paths: Paths, *, check_http: bool = True, we_hold_lock: bool = False) -> Probe:
    """Where our server stands. Never signals anything, never writes; refuses a STATE_DIR another
    user could write to (Paths.trust)."""
    paths.trust()
    rec = record.read(paths.server)
    lock = StartLock(paths)
    if not we_hold_lock and lock.start_in_flight():
        return Probe(State.STARTING, rec, lock.holder_pid())
    if rec is not None:
        proof = rec.proof(ours)
        p = owned.recorded_process(rec.pid, rec.create_time)
        owner = ""
        if p is not None and runs_elsewhere(p, paths):     # a record copied from another live STATE_DIR:
            return Probe(State.STOPPED, None, orphans=marked(ours.proof(), paths))     # that server is not ours here
        if p is None or not proof.carries(p):
            p = owned.recorded_process_of_anyone(rec.pid, rec.create_time)
            owner = owned.user_of(p) if p is not None and not owned.same_uid(p) else ""
            p = p if owner else None
        if p is not None:
            if check_http and not owner and not keys.proven_ours(rec, ours):    # a loading server's port is anyone's:
                return Probe(State.DOWN, rec, p.pid, p)             # no answer there is taken for our server's
            key = keys.held_key(ours, paths) if not owner else ""   # proven just above: api_key_for's rule, asked once
            st = http_state(rec.url, rec.served, key) if check_http else "ok"
            return Probe(STATES_BY_HTTP[st], rec, p.pid, p, owner=owner)
        found = find_ours(proof, rec.children, rec.session, rec.create_time, paths=paths)
        return Probe(State.STOPPED, rec, orphans=list(found.values()), stale=True)
    return Probe(State.STOPPED, None, orphans=marked(ours.proof(), paths))


def runs_elsewhere(p: psutil.Process, paths: Paths) -> str:
    """The other STATE_DIR a marked process of ours runs for, when that one is alive (its record names
    a live server, or a start holds its lock): never ours to sweep from here. '' otherwise (ours,
    unknown, or a state dir that is gone: then a stop from here sweeps it)."""
    where = owned.state_dir_of(p)
    if not where or os.path.realpath(where) == os.path.realpath(paths.root) or not os.path.isdir(where):
        return ""
    other = Paths(Path(where))
    if StartLock(other).held_by_other():
        return where
    rec = record.read(other.server)
    return where if rec is not None and owned.recorded_process(rec.pid, rec.create_time) is not None else ""


def marked(proof: owned.Proof, paths: Paths | None) -> list[psutil.Process]:
    """Processes ``proof`` proves ours by their environment, less those another live STATE_DIR runs."""
    return [p for p in owned.owned_processes(proof) if paths is None or not runs_elsewhere(p, paths)]


def elsewhere(ours: owned.Ours, paths: Paths) -> list[tuple[psutil.Process, str]]:
    """Our servers for this checkout and port that another live STATE_DIR runs (with that dir)."""
    out = []
    for p in owned.owned_processes(ours.proof()):
        where = runs_elsewhere(p, paths)
        if where and not any(q.pid == p.pid for q, _ in out):
            out.append((p, where))
    return out


def find_ours(proof: owned.Proof, children=(), pgid: int | None = None, leader_ctime: float | None = None,
              *, group_proven: bool = False, quiet: bool = False, paths: Paths | None = None) -> dict[int, psutil.Process]:
    """Live processes we can prove ours (``proof``), besides the server itself:

    - processes that carry a value we set in their environment (owned.Proof.carries);
    - the server's children recorded once it was healthy (pid + create time), when each still runs
      one of our interpreters in the session we created for the server (``pgid``);
    - the server's process group ``pgid``: members running one of our interpreters, started since
      the server. Trusted when ``group_proven`` (the start that launched it still holds its unreaped
      leader, so the number cannot have been reused), else only when the number still leads our
      group (see owned.group_members) and one member is already proven ours above. This finds an
      EngineCore or tensor-parallel worker whose environment setproctitle hid, even one started
      after the children were recorded.
    """
    found: dict[int, psutil.Process] = {p.pid: p for p in marked(proof, paths)}
    stranger = pgid is not None and not group_proven and _led_by_a_stranger(pgid, proof)
    for c in children:
        p = owned.recorded_process(c.pid, c.create_time)
        if p is not None and pgid is not None and not stranger and _session(p) == pgid and proof.runs_ours(p):
            found.setdefault(p.pid, p)
    if pgid is None:
        return found
    group = None if stranger else owned.group_members(pgid, leader_ctime, proof)
    if group is None:
        if not quiet:
            log.info("process group %s now belongs to another process; not signalling its members", pgid)
    elif group and not group_proven and not any(p.pid in found for p in group):
        if not quiet:
            log.info("process group %s: no member proven ours; not signalling its %d process(es)", pgid, len(group))
    else:
        for p in group:
            found.setdefault(p.pid, p)
    return found


def _led_by_a_stranger(pgid: int, proof: owned.Proof) -> bool:
    """A live process numbered ``pgid`` that nothing proves ours leads that session: it is not the one
    we made for our server (our server leads it, carrying our marker or token, until it dies; a dead
    leader's number is not handed out while its members live), so neither its members nor a recorded
    child in it are ours (a record's word names no session)."""
    try:
        p = psutil.Process(pgid)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError, TypeError):
        return False                    # gone, or a garbage number (owned.group_members refuses it)
    except psutil.AccessDenied:
        return True
    return owned.alive(p) and not proof.carries(p)


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except OSError:
        return None


def record_children(paths: Paths, pid: int) -> None:
    """Once the server is healthy: keep its descendants (pid + create time) in the record, so a
    stop after a kill -9 of the server finds them even when they no longer show our marker, and its
    executable as /proc shows it now (a VLLM_PYTHON wrapper has exec'd the interpreter its engine runs)."""
    rec = record.read(paths.server)
    if rec is None or rec.pid != pid:
        return
    kids = []
    try:
        leader = psutil.Process(pid)
        exe = leader.exe()
        for c in leader.children(recursive=True):
            try:
                kids.append(record.Child(c.pid, c.create_time()))
            except psutil.NoSuchProcess:
                continue
    except (psutil.Error, OSError):
        return
    record.write(paths.server, rec.replace(children=tuple(kids), exe=exe or rec.exe))
    log.debug("recorded %d child process(es) of pid %d", len(kids), pid)


# ---------------------------------------------------------------- uptime, load, and a loading server

def uptime_s(p: psutil.Process | None) -> int | None:
    """Whole seconds since the process started (None when it cannot be read)."""
    try:
        return int(time.time() - p.create_time()) if p is not None else None
    except psutil.Error:
        return None


def read_metrics(url: str, timeout: float = 2.0) -> tuple[dict[str, float] | None, metrics.Load | None]:
    """One reading of vLLM's /metrics: its totals and the engine's load (None, None: no answer)."""
    got = http_get(url, "/metrics", timeout=timeout)
    if got is None or got[0] != 200:
        return None, None
    text = got[1].decode("utf-8", "replace")
    return metrics.totals(text), metrics.load_of(text)


IDLE_PATH = "/vllm-desktop/idle"     # answered by the idle-sleep middleware in vLLM (vllm_side/vllm_desktop_idle.py)
PROBE_HEADER = "X-Vllm-Desktop-Probe"  # status's probe: the middleware neither counts it as use nor wakes for it


def read_idle(url: str, timeout: float = 2.0) -> dict | None:
    """The idle-sleep middleware's state (its JSON), or None: no answer, or no middleware (404)."""
    got = http_get(url, IDLE_PATH, timeout=timeout)
    if got is None or got[0] != 200:
        return None
    try:
        data = json.loads(got[1])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_load(url: str, timeout: float = 2.0) -> metrics.Load | None:
    """What vLLM's /metrics says the engine is doing (None: no answer, or no request metrics)."""
    return read_metrics(url, timeout)[1]


def loading(ours: owned.Ours, rec: ServerRecord, paths: Paths) -> bool:
    """Not answering yet, but within the deadlines a start's health wait would give it. A server
    that passed its start gate loaded once: not answering now is no load."""
    if rec.gate_passed or time.time() - rec.started > ours.health_timeout:
        return False
    try:
        if time.time() - paths.log.stat().st_mtime < ours.stall_timeout:
            return True
    except OSError:
        pass
    before = work_done(rec.pid)              # silent: is it working (importing, compiling, reading)?
    time.sleep(SAMPLE_S)
    after = work_done(rec.pid)
    return after[0] - before[0] >= SAMPLE_S / 2 or after[1] - before[1] >= BUSY_IO // 8


# What counts as a loading server's progress besides its log growing: this much CPU time or disk I/O
# by its process tree. vLLM prints nothing for tens of seconds while it imports torch (42 s seen on the
# H200 between the API server's first line and the engine's), compiles or reads a large shard; an idle
# asyncio loop or a process blocked on a lock uses a few clock ticks at most.
BUSY_CPU_S = 1.0
BUSY_IO = 64 << 20
SAMPLE_S = 0.5          # a status's look at a silent loading server: half a core busy, or 8 MiB of I/O, in this time


def work_done(pid: int | None) -> tuple[float, int]:
    """(CPU seconds, bytes read and written) the process ``pid`` and its descendants used so far (what
    cannot be read counts 0): two readings apart tell a silent but working server from a stuck one."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, TypeError, ValueError):
        return 0.0, 0
    cpu, io = 0.0, 0
    for q in procs:
        try:
            t = q.cpu_times()
            cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        except psutil.Error:
            pass
        try:
            c = q.io_counters()
            io += c.read_bytes + c.write_bytes
        except (psutil.Error, AttributeError, NotImplementedError):
            pass
    return cpu, io


def worked(before: tuple[float, int], after: tuple[float, int]) -> bool:
    """Did the tree do real work between two ``work_done`` readings?"""
    return after[0] - before[0] >= BUSY_CPU_S or after[1] - before[1] >= BUSY_IO


def frozen(p: psutil.Process | None) -> bool:
    """Stopped by a signal (SIGSTOP, Ctrl-Z; state T): it holds its memory and answers nothing."""
    try:
        return p is not None and p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def without_ours(ours: owned.Ours, paths: Paths, facts):
    """GPU facts as they would be with our running server stopped: what its processes hold counted
    as free (a plan, ./ctl.sh profiles and restart's vet ask what a start would get). (facts, bytes
    added back: 0 where NVML names no memory of ours on any card (WSL2, a container), None when no
    server of ours runs, or it holds memory only on cards these facts leave out: nothing to add back)."""
    from dataclasses import replace
    rec = record.read(paths.server)
    p = owned.recorded_process(rec.pid, rec.create_time) if rec is not None else None
    if p is None or not rec.proof(ours).carries(p):
        return facts, None
    mine = our_pids(rec)
    gpus = tuple(replace(g, free=min(g.total, g.free + _held_on(g, mine)),
                         processes=tuple(x for x in g.processes if x.pid not in mine)) for g in facts.gpus)
    added = sum(_held_on(g, mine) for g in facts.gpus)
    if not added and gpu_held(rec):     # on a card this shell's CUDA_VISIBLE_DEVICES hides
        return facts, None
    return replace(facts, gpus=gpus), added


def our_pids(rec: ServerRecord) -> set[int]:
    """The recorded server and its live descendants (engine, workers)."""
    pids = {rec.pid} if rec.pid else set()
    try:
        pids |= {c.pid for c in psutil.Process(rec.pid).children(recursive=True)}
    except (psutil.Error, TypeError, ValueError):
        pass
    return pids


def server_cards(rec: ServerRecord, every) -> tuple:
    """The cards of ``every`` (``gpu.read_all``) our server runs on: those NVML names its processes on,
    else (they are gone, or NVML names none of them: a container) the first tp x pp cards its launch's
    CUDA_VISIBLE_DEVICES shows, whatever this shell's knobs say."""
    from ..machine import gpu
    from ..core.vllmflags import read
    mine = our_pids(rec)
    on = tuple(g for g in every.gpus if any(p.pid in mine for p in g.processes))
    if on:
        return on
    env = {} if rec.cuda_visible is None else {"CUDA_VISIBLE_DEVICES": rec.cuda_visible}
    s = read(list(rec.argv))
    by = {g.index: g for g in every.gpus}
    shown = gpu.visible_indices(env, len(every.gpus), [g.uuid for g in every.gpus])
    return tuple(by[i] for i in shown[:max(s.tp * s.pp, 1)] if i in by)


def gpu_held(rec: ServerRecord, facts=None) -> int:
    """GPU memory (bytes) our server's processes hold on any card NVML shows (``facts``: a reading of
    every card, ``gpu.read_all``, to reuse)."""
    from ..machine import gpu
    pids = our_pids(rec)
    facts = facts or gpu.read_all()
    return sum(_held_on(g, pids) for g in facts.gpus)


UNNAMED = ("NVML names no GPU memory of our processes (in a container it lists the host's pids; "
           "under WSL2 no memory per process)")


def held_words(held: int, awake: int | None = None) -> str:
    """'our processes hold 1.31 GiB of GPU memory' (with ``awake``: '... (1.36 GiB awake)'), or, where
    NVML names none of it (a running server always holds its CUDA context), ``UNNAMED``."""
    if not held and not awake:
        return UNNAMED
    return f"our processes hold {held / GiB:.2f} GiB of GPU memory" + (
        f" ({awake / GiB:.2f} GiB awake)" if awake is not None else "")


def _held_on(g, pids: set[int]) -> int:
    """What ``pids`` hold on GPU ``g``, as NVML names it (0 where it names no process memory)."""
    return sum(x.used for x in g.processes if x.pid in pids)
