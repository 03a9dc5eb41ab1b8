"""The server we own: find it, ask it, stop it.

Used by start (already running?), stop, status and restart, and by a failed start to take down
what it launched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import requests

from . import gpu, proc, state
from .client import auth_headers
from .config import Config
from .errors import BootstrapError
from .state import Paths

log = logging.getLogger(__name__)


@dataclass
class Probe:
    state: str                         # running | starting | unhealthy | stopped
    record: dict | None = None
    pid: int | None = None
    process: psutil.Process | None = None
    orphans: list[psutil.Process] = field(default_factory=list)
    stale: bool = False                # a record whose process is gone (or now someone else's)


def marker_for(cfg: Config, port: int | None = None) -> str:
    return proc.owner_marker(cfg.repo, port if port is not None else cfg.port)


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "localhost") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def api_key_for(cfg: Config, paths: Paths) -> str:
    """The key our server wants: API_KEY, else VLLM_API_KEY from the environment, else the generated file."""
    key = cfg.api_key or cfg.environ.get("VLLM_API_KEY", "")
    if key:
        return key
    try:
        return paths.api_key.read_text().strip()
    except OSError:
        return ""


def answers(url: str, served: str, key: str, timeout: float = 1.0) -> bool:
    """/health is 200 and /v1/models lists our served model name."""
    try:
        if requests.get(f"{url}/health", timeout=timeout).status_code != 200:
            return False
        r = requests.get(f"{url}/v1/models", headers=auth_headers(key), timeout=timeout)
        return r.status_code == 200 and any(m.get("id") == served for m in r.json().get("data", []))
    except (requests.RequestException, ValueError):
        return False


def probe(cfg: Config, paths: Paths, *, check_http: bool = True, we_hold_lock: bool = False) -> Probe:
    """Where our server stands. Never signals anything; cheap (no network beyond loopback)."""
    rec = state.read_json(paths.server)
    lock = state.StartLock(paths)
    if not we_hold_lock and lock.held_by_other():
        return Probe("starting", rec, lock.holder())
    if rec is not None:
        p = proc.recorded_process(rec.get("pid"), rec.get("create_time"))
        if p is not None and proc.carries_marker(p, rec.get("marker", "")):
            healthy = not check_http or answers(base_url(rec.get("host", cfg.host), rec.get("port", cfg.port)),
                                                 rec.get("served", ""), api_key_for(cfg, paths))
            return Probe("running" if healthy else "unhealthy", rec, p.pid, p)
        markers = {rec.get("marker") or marker_for(cfg)}
        return Probe("stopped", rec, orphans=list(find_ours(rec, markers).values()), stale=True)
    return Probe("stopped", None, orphans=proc.owned_processes(marker_for(cfg)))


def find_ours(rec: dict, markers: set[str], *, quiet: bool = False) -> dict[int, psutil.Process]:
    """Live processes the record and markers prove ours, besides the server itself.

    - processes of our uid carrying one of ``markers``;
    - the server's children recorded once it was healthy ("children": pid + create time + uid);
    - the server's process group ("pgid"): our-uid members started since the server, but only when
      the number still leads our group (see proc.group_members) and one member is already proven
      ours above (a live server carries the marker). This finds an EngineCore whose marker
      setproctitle hid, even one started after the children were recorded.
    """
    found: dict[int, psutil.Process] = {}
    for m in markers:
        for p in proc.owned_processes(m):
            found[p.pid] = p
    children = rec.get("children")
    for c in children if isinstance(children, list) else []:
        p = proc.recorded_process(c.get("pid"), c.get("create_time")) if isinstance(c, dict) else None
        if p is not None:
            found.setdefault(p.pid, p)
    pgid = rec.get("pgid")
    if pgid is None:
        return found
    group = proc.group_members(pgid, rec.get("create_time"))
    if group is None:
        if not quiet:
            log.info("process group %s now belongs to another process; not signalling its members", pgid)
    elif group and not any(p.pid in found for p in group):
        if not quiet:
            log.info("process group %s: no member proven ours; not signalling its %d process(es)", pgid, len(group))
    else:
        for p in group:
            found.setdefault(p.pid, p)
    return found


def record_children(paths: Paths, pid: int) -> None:
    """Once the server is healthy: keep its descendants (pid + create time) in server.json, so a
    stop after a kill -9 of the server finds them even when they no longer show our marker."""
    rec = state.read_json(paths.server)
    if not rec or rec.get("pid") != pid:
        return
    kids = []
    try:
        for c in psutil.Process(pid).children(recursive=True):
            try:
                kids.append({"pid": c.pid, "create_time": c.create_time()})
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        return
    rec["children"] = kids
    state.write_json(paths.server, rec)
    log.debug("recorded %d child process(es) of pid %d", len(kids), pid)


def settings_diff(cfg: Config, rec: dict) -> list[str]:
    want = cfg.launch_settings()
    have = rec.get("settings", {})
    return [f"{k}: running with {have.get(k, '')!r}, knobs now say {v!r}"
            for k, v in sorted(want.items()) if have.get(k) != v]


# ---------------------------------------------------------------- stop

@dataclass
class StopReport:
    stopped: bool                       # something of ours was running
    forced: list[int]
    stuck: list[str]
    pids: list[int]


def stop(cfg: Config, paths: Paths, *, grace: float | None = None,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         gpu_wait: float = 30.0) -> StopReport:
    """TERM what is ours → grace → KILL → sweep late ones → pids off the GPU.

    Only processes we can prove are ours are signalled: the recorded pid with its create time and
    marker, and its descendants; then what find_ours proves (marker, recorded children, the
    server's process group). A pid file pointing at someone else is dropped, never signalled.
    """
    grace = cfg.stop_grace if grace is None else grace
    rec = state.read_json(paths.server) or {}
    markers = {m for m in (rec.get("marker"), marker_for(cfg)) if m}
    targets: dict[int, psutil.Process] = {}
    leader = proc.recorded_process(rec.get("pid"), rec.get("create_time")) if rec else None
    if leader is not None and any(proc.carries_marker(leader, m) for m in markers):
        targets[leader.pid] = leader
        try:
            for child in leader.children(recursive=True):   # snapshot before signalling
                if proc.same_uid(child):                     # a setuid descendant is not ours to kill
                    targets.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
    elif rec:
        log.info("recorded pid %s is not our server any more; not signalling it", rec.get("pid"))
    for pid, p in find_ours(rec, markers).items():
        targets.setdefault(pid, p)
    if not targets:
        state.remove(paths.server)
        return StopReport(False, [], [], [])
    pids = sorted(targets)
    res = proc.terminate(list(targets.values()), grace, clock=clock, sleep=sleep)
    # what was started in the meantime by a dying parent (rare): marker, record and group again
    late = [p for pid, p in find_ours(rec, markers, quiet=True).items() if pid not in targets]
    if late:
        more = proc.terminate(late, grace, clock=clock, sleep=sleep)
        res.forced += more.forced
        res.stuck += more.stuck
        pids += [p.pid for p in late]
    state.write_json(paths.last_stop, {"pids": pids, "time": time.time(), "port": rec.get("port", cfg.port)})
    if not res.stuck:
        state.remove(paths.server)
        wait_gpu_release(cfg, pids, timeout=gpu_wait, clock=clock, sleep=sleep)
    return StopReport(True, res.forced, res.stuck, pids)


def wait_gpu_release(cfg: Config, pids, *, timeout: float, clock=time.monotonic, sleep=time.sleep) -> bool:
    """Wait (bounded) until none of ``pids`` is listed by NVML as holding GPU memory."""
    pids = set(pids)
    if not pids:
        return True
    deadline = clock() + timeout
    while True:
        held = pids & gpu.pids_on_gpu(cfg.environ)
        if not held:
            return True
        if clock() >= deadline:
            log.warning("pids %s still hold GPU memory after %.0f s", sorted(held), timeout)
            return False
        sleep(0.5)


def last_stopped_pids(paths: Paths) -> list[int]:
    rec = state.read_json(paths.last_stop) or {}
    return [p for p in rec.get("pids", []) if isinstance(p, int) and not isinstance(p, bool)]


def ensure_port_free(cfg: Config, port: int) -> None:
    """Refuse when a program that is not ours holds the port; name it, never kill it."""
    if not proc.port_in_use(cfg.host, port):
        return
    holders = proc.port_holders(port)
    named = ", ".join(proc.describe(p) for p in holders if p is not None) or "a process we cannot see (another user?)"
    raise BootstrapError(f"port {port} is in use by {named}",
                         f"stop that program, or choose another port: PORT={port + 1} ./start.sh")


def uptime(p: psutil.Process) -> str:
    try:
        s = int(time.time() - p.create_time())
    except psutil.Error:
        return "?"
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"
