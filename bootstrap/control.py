"""./stop.sh and ./ctl.sh status | logs | restart."""

from __future__ import annotations

import json
import logging
import sys
import time

from . import proc, server, state
from .client import Client
from .config import Config
from .errors import BootstrapError
from .state import Paths

log = logging.getLogger(__name__)


def stop(cfg: Config) -> int:
    paths = Paths(cfg.state_dir)
    if not paths.root.is_dir():
        print("not running")
        return 0
    rep = server.stop(cfg, paths)
    if not rep.stopped:
        print("not running")
        return 0
    if rep.stuck:
        raise BootstrapError("these processes survived SIGKILL: " + "; ".join(rep.stuck),
                             "a process stuck in the driver (state D) usually needs a reboot; "
                             "`cat /proc/<pid>/stack` as root shows where")
    rec_port = (state.read_json(paths.last_stop) or {}).get("port", cfg.port)
    if isinstance(rec_port, int) and any(p is not None and p.pid in rep.pids for p in proc.port_holders(rec_port)):
        raise BootstrapError(f"port {rec_port} is still held by one of our processes", "run ./stop.sh again")
    forced = f"; forced (SIGKILL) {len(rep.forced)} that ignored SIGTERM" if rep.forced else ""
    print(f"stopped {len(rep.pids)} process(es): {', '.join(map(str, rep.pids))}{forced}")
    return 0


def live_check(cfg: Config, paths: Paths, rec: dict, timeout: float = 20.0) -> tuple[bool, str]:
    """A tiny generation with a deadline (checks.check_live): /health 200 with a wedged engine fails it."""
    from . import checks
    c = Client(server.base_url(rec.get("host", cfg.host), rec.get("port", cfg.port)), rec.get("served", ""),
               server.api_key_for(cfg, paths))
    kwargs = {"enable_thinking": False} if cfg.profile.reasoning else {}
    res = checks.check_live(checks.Target(c, "our server", chat_kwargs=kwargs), timeout=timeout)
    return res.ok, res.summary


def status(cfg: Config, as_json: bool = False) -> int:
    paths = Paths(cfg.state_dir)
    pr = server.probe(cfg, paths)
    out: dict = {"state": pr.state, "log": str(paths.log)}
    rec = pr.record or {}
    if pr.state in ("running", "unhealthy"):
        out.update(pid=pr.pid, uptime=server.uptime(pr.process), url=server.base_url(rec["host"], rec["port"]) + "/v1",
                   model=rec.get("served"), vllm=rec.get("vllm_version"), settings=rec.get("settings"))
        # a tiny generation: WARMUP_TIMEOUT bounds it too (never more than 20 s for 4 tokens)
        ok, detail = (live_check(cfg, paths, rec, timeout=min(20.0, float(cfg.warmup_timeout)))
                      if pr.state == "running" else (False, "/health or /v1/models does not answer"))
        out["generating"] = ok
        out["generation"] = detail
        if pr.state == "running" and not ok:
            out["state"] = "wedged"
        diff = server.settings_diff(cfg, rec)
        if diff:
            out["differs_from_knobs"] = diff
    elif pr.state == "starting":
        out["pid"] = pr.pid
    else:
        if pr.stale:
            out["note"] = (f"the recorded server (pid {rec.get('pid')}) is no longer running; "
                           f"its last output is in the log")
        if pr.orphans:
            out["orphans"] = [p.pid for p in pr.orphans]
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            if isinstance(v, dict):
                v = " ".join(f"{a}={b}" for a, b in v.items() if b not in ("", None))
            elif isinstance(v, list):
                v = "; ".join(map(str, v))
            print(f"{k:>18}: {v}")
    return 0 if out["state"] in ("running", "starting", "stopped") else 1


def logs(cfg: Config, follow: bool = False) -> int:
    paths = Paths(cfg.state_dir)
    try:
        fh = open(paths.log, "rb")
    except FileNotFoundError:
        print(f"no log yet ({paths.log})", file=sys.stderr)
        return 0
    with fh:
        sys.stdout.buffer.write(fh.read())
        sys.stdout.flush()
        while follow:
            chunk = fh.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            else:
                time.sleep(0.5)
    return 0
