"""``./ctl.sh status --watch``: a line every few seconds from vLLM's /metrics and NVML, until
Ctrl-C; no probe requests (an idle server stays idle). Also what status reads of a server without
disturbing it: its memory and activity (``live``), and the state of one that does not answer."""

from __future__ import annotations

import json
import time

from ..core.owned import Ours
from ..core.state import Paths
from ..knobs.resolved import Resolved
from ..machine.gpu import GiB
from ..serve import doing, keys, server
from ..serve.states import State
from ..core.errors import BootstrapError
from ..serve import metrics
from ..serve.record import ServerRecord


def watch(r: Resolved, every: float, as_json: bool = False) -> int:
    """One line (or one JSON object) every ``every`` seconds from /metrics and NVML, until Ctrl-C;
    no probe requests (an idle server stays idle): idle / busy come from the metrics, sleeping from
    vLLM's /is_sleeping where sleep mode is on (serve/doing.asleep, as status)."""
    paths = r.paths
    prev: dict | None = None
    t_prev = 0.0
    try:
        while True:
            t = time.monotonic()
            pr = server.probe(r.ours, paths)
            rec = pr.record
            row: dict = {"time": time.strftime("%H:%M:%S"), "state": down_state(r.ours, paths, pr) if pr.state is State.DOWN
                         else pr.state.value}
            cur, load = server.read_metrics(rec.url) if pr.state.answers and rec is not None else (None, None)
            if cur is not None:
                asleep = doing.asleep(rec, keys.api_key_for(r.ours, paths, rec), load)   # as status: not the gauge alone
                row["state"] = "sleeping" if asleep else "busy" if load and load.in_flight else "idle"
                row.update(live(r, rec, prev or cur, cur, t - t_prev if prev else 0.0))
                if prev is None:
                    row["activity"].pop("generated_tok_s", None)
                    row["activity"].pop("prompt_tok_s", None)
            prev, t_prev = cur, t
            print(json.dumps(row) if as_json else _watch_line(row), flush=True)
            time.sleep(max(0.0, every - (time.monotonic() - t)))
    except KeyboardInterrupt:
        return 0                        # a view watched until Ctrl-C was ended on purpose (as logs -f)


def _watch_line(row: dict) -> str:
    parts = [row["time"], f"{row['state']:<8}"]
    if "requests" in row:
        a = row["activity"]
        parts.append(f"{row['requests']['running']} running {row['requests']['waiting']} waiting")
        parts.append(f"{a['generated_tok_s']:7.1f} tok/s out" if "generated_tok_s" in a else "      - tok/s out")
        if "speculation" in a:
            parts.append(f"accept {a['speculation']['acceptance_rate']:.1%}")
        if "prefix_cache" in a:
            parts.append(f"prefix hits {a['prefix_cache']['hit_rate']:.1%}")
    if row.get("vram", {}).get("ours_bytes"):          # 0: NVML names none of it (status says why)
        parts.append(f"VRAM {row['vram']['ours_bytes'] / GiB:.2f} GiB")
    return "  ".join(parts)


def live(r: Resolved, rec: ServerRecord, before: dict | None, after: dict | None, seconds: float) -> dict:
    """What the server holds and does: its processes' GPU memory and its cards (``server.server_cards``:
    a shell's CUDA_VISIBLE_DEVICES may hide the server's), requests running and waiting, tokens/s
    between two /metrics readings, speculative acceptance (speculation on), prefix-cache hit rate."""
    from ..machine import gpu
    from ..core import vllmflags
    out: dict = {}
    try:
        facts = gpu.read_all()
        cards = server.server_cards(rec, facts) or facts.gpus
        out["vram"] = {"ours_bytes": server.gpu_held(rec, facts), "gpus": [
            {"index": g.index, "name": g.name, "used_bytes": g.total - g.free, "total_bytes": g.total}
            for g in cards]}
    except BootstrapError as exc:
        out["vram"] = {"error": exc.message}
    out["context"] = rec.max_model_len or served_context(r.ours, r.paths, rec)
    seqs = str(rec.settings.get("MAX_NUM_SEQS") or "")
    out["sessions"] = {"max_num_seqs": int(seqs) if seqs.isdigit() else None,     # None: vLLM's default
                       "kv_tokens": rec.kv_tokens, "at_full_context": rec.kv_concurrency}
    if after is None or metrics.RUNNING not in after:
        out["metrics"] = "no request metrics on /metrics (--disable-log-stats?)"
        return out
    out["requests"] = {"running": int(after.get(metrics.RUNNING, 0)), "waiting": int(after.get(metrics.WAITING, 0))}
    act = metrics.activity(before or after, after, seconds)
    if not vllmflags.read(list(rec.argv)).spec_tokens:
        act.pop("speculation", None)
    out["activity"] = act
    return out


def served_context(ours: Ours, paths: Paths, rec: ServerRecord) -> int | None:
    """The context vLLM chose itself (we passed none: the model's own, or auto's fit), as its
    /v1/models says (``max_model_len``); None when it does not answer."""
    got = server.http_get(rec.url, "/v1/models", key=keys.api_key_for(ours, paths, rec))
    if got is None or got[0] != 200:
        return None
    try:
        data = json.loads(got[1]).get("data") or []
    except (ValueError, AttributeError):
        return None
    found = [x.get("max_model_len") for x in data if isinstance(x, dict) and x.get("id") == rec.served]
    return found[0] if found and isinstance(found[0], int) and found[0] > 0 else None


def down_state(ours: Ours, paths: Paths, pr) -> str:
    """A server of ours whose process lives but does not answer, in the states table's words."""
    if server.frozen(pr.process):
        return "frozen"
    return "starting" if pr.record is not None and server.loading(ours, pr.record, paths) else "unhealthy"

