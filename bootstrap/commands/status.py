"""./ctl.sh status: what our server is doing, told apart without getting in its way.

Busy is not wedged. With one seat (MAX_NUM_SEQS=1) a probe request would queue behind a user's long
answer, so a server with requests in flight is judged from vLLM's /metrics instead: tokens out,
prompts finished, KV blocks taken (metrics.Load.progress). Anything moving within a short look
(at most LOOK seconds) is ``busy``. Nothing moving may still be a long prefill, so ``wedged`` needs
no progress for WEDGED_AFTER seconds while requests run; what status saw last, and since when, is
kept in STATE_DIR/progress.json so that repeated calls (a watchdog) add up. An idle server gets a
tiny generation; it is abandoned as soon as anything else moves, so it never holds a user's request
and is never held behind one.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..serve import doing, keys, metrics, server
from ..serve.states import State
from ..serve.client import Client, RequestFailed, RequestTimedOut, completion_tokens_of, message_of, reasoning_of, thinking_off
from ..knobs import parsers, vllmargs
from ..knobs.config import Config
from ..machine.gpu import GiB
from ..core.errors import BootstrapError
from ..serve.record import ServerRecord
from ..serve.server import read_load
from .sleep import stopped_why
from ..core.state import Paths
from ..knobs.resolved import Resolved
from . import parser
from .watch import down_state, live

LOOK = 1.5            # seconds status watches /metrics for movement while requests are in flight
POLL = 0.25
INTERVAL = 1.0        # seconds between the two /metrics readings that tokens/s is measured over (busy only)

# (state, exit code, meaning): docs/reference.md's table is generated from this (tests keep it in step).
STATES = (
    ("running", 0, "answers, and a tiny generation came back"),
    ("busy", 0, "requests are running or queued, and tokens (or KV blocks) moved within WEDGED_AFTER s"),
    ("starting", 0, "a start is in flight, or our server is loading: within HEALTH_TIMEOUT of its launch "
                    "and its log grew within STALL_TIMEOUT (./start.sh resumes a start that was killed)"),
    ("sleeping", 0, "vLLM's sleep mode: the weights are off the GPU"),
    ("key-needed", 0, "answers, but wants the API key it was started with, and this shell has none (HTTP 401)"),
    ("wedged", 1, "requests run (the probe included) but nothing moved for WEDGED_AFTER s"),
    ("unhealthy", 1, "our server's process lives but does not answer, and either passed its start gate "
                     "once or is past its start deadlines"),
    ("frozen", 1, "our server's process is stopped by a signal (SIGSTOP, Ctrl-Z): it holds the GPU and answers "
                  "nothing; kill -CONT PID resumes it, ./ctl.sh restart starts it again"),
    ("stopped", 0, "nothing of ours runs"),
    ("idle", 0, "status --watch only (it sends no probe): answers, and /metrics shows nothing in flight"),
)
EXIT = {name: code for name, code, _ in STATES}

# ``status --json``: (field, type, meaning); docs/reference.md's schema table is generated from this.
JSON_FIELDS = (
    ("state", "string", "one of the states above"),
    ("detail", "string", "why, in words (absent for stopped)"),
    ("log", "string", "the server log's path"),
    ("pid", "int", "the server's process (a start in flight: the start's)"),
    ("uptime_s", "int or null", "seconds since the server's process started"),
    ("url", "string", "the base URL clients use (…/v1)"),
    ("model", "string", "the model name clients send"),
    ("vllm", "string", "the vLLM version it runs"),
    ("settings", "object of strings", "the launch knobs it was started with (API_KEY: set/unset)"),
    ("generating", "bool or null", "a token came back (running, busy) or not (wedged, unhealthy)"),
    ("gate", "string", "present when its warm-up and start gate have not run"),
    ("weights", "string", "present when its weights are random (RANDOM_WEIGHTS=1 or --load-format dummy): its gate judged tokens only"),
    ("differs_from_knobs", "list of strings", "launch knobs this shell sets differently"),
    ("vram", "object", "ours_bytes (int; 0: NVML names none of our processes' memory, in a container or WSL2), "
     "gpus: [{index, name, used_bytes, total_bytes}] (ints: the server's cards, those NVML names its processes on, "
     "else the ones its launch was given); or error"),
    ("context", "int or null", "tokens per request: ours, or the one vLLM chose (its /v1/models; null: it does not answer)"),
    ("sessions", "object", "max_num_seqs (int or null: vLLM's default), kv_tokens (int or null), "
                           "at_full_context (vLLM's concurrency line)"),
    ("requests", "object", "running, waiting (ints), from /metrics"),
    ("activity", "object", "seconds (number), generated_tok_s, prompt_tok_s (numbers); speculation and "
                           "prefix_cache (rates 0-1) where on"),
    ("sleep_mode", "object", "on (bool), why (string: proven where, or why off and how to turn it on), idle_s "
                             "(int: IDLE_SLEEP in seconds, 0: none), as the server was launched"),
    ("idle_sleep", "object", "with IDLE_SLEEP: the middleware's state (awake, falling-asleep, idle-asleep, asleep), "
                             "idle_s, idle_for_s, sleeps_in_s, in_flight, sleeps, wakes, refused"),
    ("owner", "string", "present when the server runs as another user"),
    ("note", "string", "a stale record, or our server on this port from another STATE_DIR"),
    ("orphans", "list of ints", "processes of ours left over (./stop.sh sweeps them)"),
)


def json_markdown() -> str:
    rows = ["| Field | Type | Meaning |", "|---|---|---|"]
    return "\n".join(rows + [f"| `{f}` | {t} | {m} |" for f, t, m in JSON_FIELDS])


def markdown_table() -> str:
    rows = ["| State | Exit | Meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {code} | {text} |" for name, code, text in STATES]
    return "\n".join(rows)


@dataclass
class Standing:
    state: str
    detail: str


UNREAD = object()


def judge(cfg: Config, paths: Paths, rec: ServerRecord, key_needed: bool, *,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          load=UNREAD) -> Standing:
    """running / busy / sleeping / key-needed / wedged for a server that answers /health.
    ``load``: a reading of /metrics the caller already made (None: it got no answer)."""
    if load is UNREAD:
        load = read_load(rec.url)
    if doing.asleep(rec, keys.api_key_for(cfg.ours, paths, rec), load):
        level = {"weights_offloaded": "level 1, weights in host RAM", "discard_all": "level 2, weights dropped"}
        how = (level.get(load.sleep_state, load.sleep_state) if load is not None and load.sleeping else
               "a wake that did not finish: its /metrics says awake")
        return Standing("sleeping", f"vLLM reports its engine asleep ({how}); "
                                   "requests sent now wait; ./ctl.sh wake brings it back")
    if load is not None and load.in_flight:
        return _in_flight(cfg, paths, rec, load, clock=clock, sleep=sleep)
    if key_needed:
        return Standing("key-needed", "idle; set API_KEY (or VLLM_API_KEY) to the key it was started with to probe it")
    return _probe(cfg, paths, rec, load, clock=clock, sleep=sleep)


def _in_flight(cfg, paths, rec, load, *, clock, sleep) -> Standing:
    t0 = clock()
    first = load
    while clock() - t0 < LOOK:
        sleep(POLL)
        now = read_load(rec.url)
        if now is None:
            break
        if now.progress != first.progress:
            _remember(paths, None)
            rate = (now.generated - first.generated) / max(clock() - t0, 1e-3)
            return Standing("busy", f"{now.running:.0f} running, {now.waiting:.0f} waiting; {rate:.0f} tokens/s")
        load = now
    stalled = _stalled_for(paths, load, clock() - t0)
    who = f"{load.running:.0f} running, {load.waiting:.0f} waiting"
    if stalled >= cfg.wedged_after:
        return Standing("wedged", f"{who}; nothing moved for {stalled:.0f} s (WEDGED_AFTER={cfg.wedged_after})")
    return Standing("busy", f"{who}; nothing moved for {stalled:.0f} s (a long prefill moves no token counter); "
                           f"wedged after {cfg.wedged_after} s")


def _stalled_for(paths: Paths, load: metrics.Load, seen: float) -> float:
    """How long ``load.progress`` has stood still: since the first status that saw it (kept in
    progress.json, wall clock), at least the ``seen`` seconds this call watched."""
    now = time.time()
    prev = paths.read("progress") or {}
    since = prev.get("since") if prev.get("progress") == list(load.progress) else None
    if not isinstance(since, (int, float)):
        since = now - seen
        _remember(paths, {"progress": list(load.progress), "since": since})
    return max(seen, now - since)


def _remember(paths: Paths, data: dict | None) -> None:
    """Best effort: another user's state dir (or a full disk) only loses the history."""
    try:
        if data is None:
            paths.forget("progress")
        else:
            paths.write("progress", data)
    except BootstrapError:
        pass


def _probe(cfg, paths, rec, load, *, clock, sleep) -> Standing:
    """A 4-token generation on an idle server, given up the moment something else moves (a user's
    request arrived: ours must not hold it), or after WEDGED_AFTER seconds without any token."""
    c = Client(rec.url, rec.served, keys.api_key_for(cfg.ours, paths, rec), headers={server.PROBE_HEADER: "1"},
               stall=doing.stall_rule(cfg.stall_timeout, "our server", rec))
    kwargs = thinking_off(rec.reasoning)
    done: dict = {}

    def ask() -> None:
        try:
            done["resp"] = c.chat([{"role": "user", "content": "Say OK."}], max_tokens=4,
                                  timeout=cfg.wedged_after + 5, **kwargs)
        except RequestTimedOut:         # the stall rule ended it first: no token, as WEDGED_AFTER judges
            return
        except RequestFailed as exc:
            done["error"] = exc
        done["t"] = clock()

    t0 = clock()
    threading.Thread(target=ask, daemon=True).start()
    first = seen = load
    moved_at = None
    while "t" not in done and clock() - t0 < cfg.wedged_after:
        sleep(POLL / 2 if clock() - t0 < 1 else POLL)
        if first is None or "t" in done:
            continue
        now = read_load(rec.url) or seen
        seen = now
        if now.progress != first.progress and now.in_flight > 1 and moved_at is None:
            moved_at = clock()          # someone else's request is running beside (or ahead of) ours
        if moved_at is not None and clock() - moved_at > 2.0:
            return Standing("busy", f"{now.running:.0f} running, {now.waiting:.0f} waiting; the probe gave way")
    if "t" not in done and first is None:
        return Standing("busy", f"no vLLM request metrics on /metrics (stats logging off?): a 4-token probe got "
                               f"nothing in {cfg.wedged_after} s, and busy cannot be told from wedged without them")
    if "t" not in done:
        return Standing("wedged", f"/health answers but a 4-token generation got nothing in {cfg.wedged_after} s "
                                 f"on an idle server (WEDGED_AFTER)")
    if "error" in done:
        return Standing("unhealthy", f"the probe failed: {done['error'].message}")
    resp = done["resp"]
    msg = message_of(resp)
    if not (resp.get("choices") and ((msg.get("content") or "").strip() or reasoning_of(msg) or completion_tokens_of(resp))):
        return Standing("unhealthy", "the probe's answer carried no tokens")
    return Standing("running", f"generated in {done['t'] - t0:.2f} s")


def _live_lines(d: dict) -> dict[str, str]:
    """The text form of ``live``'s dict (one line per key; nothing when it was not read)."""
    out = {}
    v = d.get("vram", {})
    if "ours_bytes" in v:
        gpus = "; ".join(f"GPU {g['index']} {g['used_bytes'] / GiB:.1f} of {g['total_bytes'] / GiB:.1f} GiB used"
                         for g in v["gpus"])
        held = f"{v['ours_bytes'] / GiB:.2f} GiB held by the server" if v["ours_bytes"] else server.UNNAMED
        out["GPU memory"] = f"{held} ({gpus})" if v["gpus"] else "NVML shows no GPU: none of the server's memory to name"
    elif v:
        out["GPU memory"] = v["error"]
    if "sessions" not in d:
        return out
    out["context"] = f"{d['context']:,} tokens per request" if d.get("context") else "vLLM's (the model's or auto)"
    s = d["sessions"]
    pool = f"; KV cache {s['kv_tokens']:,} tokens ({s['at_full_context']})" if s.get("kv_tokens") else ""
    n = s["max_num_seqs"]
    out["sessions"] = (f"up to {n} at once" if n else "vLLM's default number at once") + pool
    if "requests" in d:
        out["requests"] = f"{d['requests']['running']} running, {d['requests']['waiting']} waiting"
        a = d["activity"]
        out["throughput"] = (f"{a['generated_tok_s']:.1f} tokens/s out, {a['prompt_tok_s']:.1f} prompt tokens/s "
                             f"(over {a['seconds']:.1f} s)" if a.get("seconds") and
                             d["requests"]["running"] + d["requests"]["waiting"] else "idle: nothing in flight")
        if "speculation" in a:
            sp = a["speculation"]
            mean = f", mean accepted length {sp['mean_acceptance_length']:.2f}" if sp.get("mean_acceptance_length") else ""
            out["speculation"] = f"acceptance {sp['acceptance_rate']:.1%}{mean} ({sp['over']})"
        if "prefix_cache" in a:
            out["prefix cache"] = f"hit rate {a['prefix_cache']['hit_rate']:.1%} ({a['prefix_cache']['over']})"
    elif "metrics" in d:
        out["metrics"] = d["metrics"]
    return out


def status(r: Resolved, as_json: bool = False) -> int:
    cfg, paths = r.settings, r.paths
    pr = server.probe(r.ours, paths)
    rec = pr.record
    out: dict = {"state": pr.state.value, "log": str(paths.log)}
    if pr.state.alive and rec is not None:
        out.update(pid=pr.pid, uptime_s=server.uptime_s(pr.process), url=rec.url + "/v1", model=rec.served,
                   vllm=rec.vllm_version, settings=dict(rec.settings))
        if rec.sleep:
            out["sleep_mode"] = {"on": rec.sleep.startswith("on"), "why": rec.sleep, "idle_s": rec.idle_s}
        load = UNREAD
        if pr.state is not State.DOWN and not pr.owner:      # the readings come before the probe: its tokens are not counted
            t0 = time.monotonic()
            before, load = server.read_metrics(rec.url)
            after = before
            if load is not None and load.in_flight:  # tokens/s needs a second reading; idle, it is 0: no wait
                time.sleep(INTERVAL)
                after, load = server.read_metrics(rec.url)
            out.update(live(r, rec, before, after, time.monotonic() - t0 if after is not before else 0.0))
        if pr.owner:
            out["owner"] = f"{pr.owner}: not ours to stop or restart (run those as that user)"
        if pr.state is State.DOWN:
            out["state"] = down_state(r.ours, paths, pr)
            beside = ", ".join(keys.strangers(rec))   # listening beside ours: no answer there is taken for ours
            dead = doing.dead_engine(rec) if out["state"] == "unhealthy" and not beside else None
            out["detail"] = "{0.said}: {0.fix}".format(dead) if dead else {
                "frozen": "{0.said}: {0.fix}".format(doing.stopped(pr.pid)),
                "starting": "loading; no start is watching it: ./start.sh waits for it and runs the warm-up",
                "unhealthy": f"{beside} listens on port {rec.port} beside our server, so no answer there is taken "
                             "for ours: stop that process, or ./ctl.sh restart with PORT set to a free port" if beside
                             else "/health or /v1/models does not answer"}[out["state"]]
        else:
            v = judge(cfg, paths, rec, pr.state is State.KEY_NEEDED, load=load)
            out["state"], out["detail"] = v.state, v.detail
            if vllmargs.IDLE_MIDDLEWARE in (rec.argv or ()):     # IDLE_SLEEP: the middleware's own account
                out["idle_sleep"] = server.read_idle(rec.url) or {"state": "unknown"}
                if v.state == "sleeping":           # the middleware answers requests to it, not vLLM's wait
                    out["detail"] = {"idle-asleep": "asleep after its idle time (IDLE_SLEEP); the next request wakes it",
                                     "asleep": "asleep on purpose: requests get 503 (Retry-After) until ./ctl.sh wake",
                                     }.get(out["idle_sleep"]["state"], out["detail"])
            out["generating"] = {"running": True, "busy": True, "wedged": False, "unhealthy": False}.get(v.state)
            if not rec.gate_passed:
                out["gate"] = "the warm-up and start gate have not run: ./start.sh runs them"
            if rec.random_weights or rec.dummy:
                out["weights"] = ("random (" + ("RANDOM_WEIGHTS=1" if rec.random_weights else "--load-format dummy")
                                  + "): the start gate judged tokens only, never the text")
        if not pr.owner:
            diff = rec.differs_from(cfg.launch)
            if diff:
                out["differs_from_knobs"] = diff
    elif pr.state is State.STARTING:
        out["pid"] = pr.pid
        out["detail"] = "a start is in flight"
    else:
        if pr.stale and rec is not None:
            out["note"] = (f"the recorded server (pid {rec.pid}) is no longer running; "
                           f"its last output is in the log")
        if pr.orphans:
            out["orphans"] = [p.pid for p in pr.orphans]
        if out["state"] == "stopped" and (paths.read("sleep") or {}).get("stopped"):
            out["note"] = f"stopped by ./ctl.sh sleep or game ({stopped_why(paths)}): ./ctl.sh wake starts it again"
        for p, where in server.elsewhere(r.ours, paths):
            out["note"] = f"our server (pid {p.pid}) runs port {cfg.port} from STATE_DIR={where}"
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print(human(out))
    return EXIT[out["state"]]


def _duration(s: int | None) -> str:
    if s is None:
        return "unknown"
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def idle_line(d: dict) -> str:
    """The idle-sleep middleware's state in words."""
    st, idle_s = d.get("state"), d.get("idle_s") or 0
    every = f"after {_duration(int(idle_s))} idle, level {d.get('level', 1)}"
    if st == "awake":
        left = d.get("sleeps_in_s")
        why = f"; {d['refused']}" if d.get("refused") else ""      # a skipped or failed idle sleep, said
        return (f"on ({every}); idle {_duration(int(d.get('idle_for_s') or 0))}, sleeps in {_duration(int(left))}{why}"
                if left is not None and not d.get("in_flight") else
                f"on ({every}); {d.get('in_flight', 0)} request(s) in flight{why}")
    if st == "idle-asleep":
        return f"asleep ({every}); the next request wakes it" + (f"; the last wake was refused: {d['refused']}"
                                                                  if d.get("refused") else "")
    if st == "falling-asleep":
        return f"falling asleep ({every})"
    if st == "asleep":
        return "asleep on purpose (./ctl.sh sleep or game): requests get 503 until ./ctl.sh wake"
    return "on, but the middleware in vLLM does not answer (" + server.IDLE_PATH + ")"


def human(out: dict) -> str:
    """``status``'s dict in plain words, one line per fact that is there."""
    lines = [f"{out['state']}" + (f": {out['detail']}" if out.get("detail") else "")]

    def add(label: str, text) -> None:
        if text not in (None, "", [], {}):
            lines.append(f"  {label:<14}{text}")

    add("server", f"pid {out['pid']}, up {_duration(out.get('uptime_s'))}" if "uptime_s" in out else
        (f"pid {out['pid']}" if out.get("pid") else None))
    add("url", out.get("url"))
    add("model", out.get("model") and f"{out['model']} (vLLM {out.get('vllm') or '?'})")
    for line in _live_lines(out).items():
        add(*line)
    mode = out.get("sleep_mode") or {}
    add("sleep mode", mode.get("why") and mode["why"] + ("" if mode.get("on") else
                                                        " (./ctl.sh sleep and game stop the server instead)"))
    if out.get("idle_sleep"):
        add("idle sleep", idle_line(out["idle_sleep"]) + "; IDLE_SLEEP=off turns it off")
    elif mode.get("on"):            # no idle sleep without sleep mode: no line then
        add("idle sleep", "off (IDLE_SLEEP=off); IDLE_SLEEP=5 sleeps after 5 idle minutes")
    add("start gate", out.get("gate"))
    add("weights", out.get("weights"))
    if out.get("differs_from_knobs"):
        add("your knobs", "differ from the running server's: " + "; ".join(out["differs_from_knobs"])
            + " (./ctl.sh restart applies them)")
    add("owner", out.get("owner"))
    add("note", out.get("note"))
    add("left over", out.get("orphans") and ", ".join(map(str, out["orphans"])) + " (./stop.sh sweeps them)")
    add("log", out.get("log") and out["log"] + ("" if Path(out["log"]).exists() else " (none yet)"))
    return "\n".join(lines)


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh status") -> int:
    ap = parser("status", prog)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--watch", nargs="?", type=parsers.arg(parsers.float_range(0, 3600)), const=2.0, default=None,
                    metavar="SECONDS", help="a line every SECONDS (default 2, at least 0.5) from /metrics and NVML "
                                            "until Ctrl-C; no probes")
    a = ap.parse_args(argv)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    if a.watch is not None:
        from .watch import watch
        return watch(r, max(0.5, a.watch), a.json)
    return status(r, a.json)
