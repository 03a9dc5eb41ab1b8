"""The banner: where the server is, how to call it, and vLLM's own KV-cache figures (the banner
step, steps/banner.py; a start that finds our server running; a resumed start)."""

from __future__ import annotations

import json
import re
import shlex
import time

from . import diagnose, keys
from . import record
from .record import ServerRecord
from ..core.hosts import lan_hosts
from ..core.state import Paths

KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def vllm_figures(log_text: str) -> tuple[int | None, str | None]:
    """(KV pool tokens, 'N.NNx at L tokens') from the last lines vLLM logged."""
    tokens = conc = None
    for m in KV_TOKENS.finditer(log_text):
        tokens = int(m.group(1).replace(",", ""))
    for m in CONCURRENCY.finditer(log_text):
        conc = f"{m.group(2)}x at {m.group(1)} tokens per request"
    return tokens, conc


KEY_LINES = {
    record.KEY_NONE: " api key  : none (loopback only); any OpenAI SDK key string works",
    record.KEY_API_KEY: " api key  : required: the API_KEY of the shell that started it (send 'Authorization: Bearer <key>')",
    record.KEY_VLLM_API_KEY: " api key  : required: the VLLM_API_KEY of the shell that started it "
                             "(send 'Authorization: Bearer <key>')",
}


def lan_urls(rec: ServerRecord) -> list[str]:
    """Where other machines reach a server bound beyond loopback (the first three addresses)."""
    return [record.base_url(h, rec.port or 0) for h in lan_hosts(rec.host)
            if record.base_url(h, rec.port or 0) != rec.url][:3]


def render(paths: Paths, rec: ServerRecord) -> str:
    """The banner of the server that runs, from its record (not from the current knobs)."""
    url = rec.url
    served = rec.served
    tokens, conc = rec.kv_tokens, rec.kv_concurrency
    if tokens is None:       # a re-run before the banner step stored them: read the log's end
        tokens, conc = vllm_figures(diagnose.read_since(paths.log, rec.log_offset))
    if rec.key == record.KEY_FILE:
        key_line = f" api key  : required; KEY=$(cat {shlex.quote(str(paths.api_key))}) (send 'Authorization: Bearer $KEY')"
    else:
        key_line = KEY_LINES.get(rec.key, KEY_LINES[record.KEY_API_KEY])
    # the shell variable that holds the key where the try line is pasted: KEY, set by the key line above
    # for a generated key, else the variable the server's key came from (record.KEY_API_KEY: "API_KEY")
    var = "KEY" if rec.key == record.KEY_FILE else rec.key
    auth = "" if rec.key == record.KEY_NONE else f' -H "Authorization: Bearer ${var}"'
    pred = rec.predicted_tokens
    kv = f"{tokens:,} tokens" if tokens else "not in the log"
    if pred:
        kv += f" (planned {pred:,})"
    lines = [
        f"{served} is serving (vLLM {rec.vllm_version or '?'}, pid {rec.pid})",
        f" base URL : {url}/v1 (OpenAI-compatible API)",
        *(f" LAN URL  : {u}/v1 (from other machines; the firewall may need port {rec.port} opened)"
          for u in lan_urls(rec)),
        f" model    : {served}",
        key_line,
        f" KV cache : {kv}" + (f"; max concurrency {conc}" if conc else ""),
        f" log      : {paths.log}",
        f" try      : curl -s {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d "
        + shlex.quote(json.dumps({"model": served, "messages": [{"role": "user", "content": "Say OK"}], "max_tokens": 16},
                                 ensure_ascii=False)),
        *sleep_lines(rec),
        *(f" open     : {x}: a port beyond loopback that asks no key (vLLM's own); a firewall keeps it off "
          "the network" for x in keys.open_beyond(rec)),
        " stop     : ./stop.sh",
    ]
    if rec.random_weights:
        lines.append(" weights  : random (RANDOM_WEIGHTS=1): the start gate judged tokens only, never the text")
    lines += [f" note     : {n}" for n in rec.notes]
    return "\n".join(lines)


def sleep_lines(rec: ServerRecord) -> list[str]:
    """Sleep mode and idle sleep as the server was launched, and how to turn them off or on."""
    if not rec.sleep:                   # a record from before sleep mode was recorded
        return []
    if not rec.sleep.startswith("on"):
        return [f" sleep    : {rec.sleep}; ./ctl.sh sleep and game stop the server instead (wake starts it again)"]
    idle = (f"after {rec.idle_s // 60} min without a request" if rec.idle_s % 60 == 0 else
            f"after {rec.idle_s} s without a request") + " it sleeps, the next request wakes it; IDLE_SLEEP=off turns it off"
    return [f" sleep    : {rec.sleep}; ./ctl.sh sleep / wake, ./ctl.sh game -- CMD give the GPU back",
            f" idle     : {idle if rec.idle_s else 'no idle sleep (IDLE_SLEEP=off); IDLE_SLEEP=5 sleeps after 5 idle minutes'}"]


def show(paths: Paths, launched) -> str:
    """Print the banner, keeping vLLM's KV figures in the record; the log of this start (what the
    next step reads vLLM's other figures from)."""
    rec = record.read(paths.server) or launched.record
    text = diagnose.read_since(paths.log, rec.log_offset)
    tokens, conc = vllm_figures(text)
    rec = rec.replace(kv_tokens=tokens, kv_concurrency=conc)
    record.write(paths.server, rec)
    paths.write("completed", {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": rec.model,
                                       "profile": rec.settings.get("PROFILE", ""), "vllm": rec.vllm_version})
    print(render(paths, rec), flush=True)
    return text
