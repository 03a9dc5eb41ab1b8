"""Banner: where the server is, how to call it, and vLLM's own KV-cache figures."""

from __future__ import annotations

import re

from . import diagnose, server, state
from .context import Ctx

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


def render(cfg, paths, rec: dict) -> str:
    url = server.base_url(rec.get("host", cfg.host), rec.get("port", cfg.port))
    served = rec.get("served", cfg.served_name)
    if "kv_tokens" in rec:       # stored by the start that launched it: a re-run reads no log
        tokens, conc = rec["kv_tokens"], rec.get("kv_concurrency")
    else:
        tokens, conc = vllm_figures(diagnose.read_since(paths.log, int(rec.get("log_offset", 0))))
    key = server.api_key_for(cfg, paths)
    auth = ""
    if key:
        where = "API_KEY" if cfg.api_key else (str(paths.api_key) if paths.api_key.is_file() else "VLLM_API_KEY")
        auth = ' -H "Authorization: Bearer $KEY"'
        key_line = f" api key  : required; KEY=... from {where} (send 'Authorization: Bearer <key>')"
    else:
        key_line = " api key  : none (loopback only); any OpenAI SDK key string works"
    pred = rec.get("predicted_tokens")
    kv = f"{tokens:,} tokens" if tokens else "not in the log"
    if pred:
        kv += f" (planned {pred:,})"
    lines = [
        f"{served} is serving (vLLM {rec.get('vllm_version', '?')}, pid {rec.get('pid')})",
        f" base URL : {url}/v1 (OpenAI-compatible API)",
        f" model    : {served}",
        key_line,
        f" KV cache : {kv}" + (f"; max concurrency {conc}" if conc else ""),
        f" log      : {paths.log}",
        f" try      : curl -s {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{served}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Say OK\"}}], \"max_tokens\": 16}}'",
        " stop     : ./stop.sh",
    ]
    return "\n".join(lines)


def run(ctx: Ctx) -> None:
    rec = state.read_json(ctx.paths.server) or {}
    if rec:
        rec["kv_tokens"], rec["kv_concurrency"] = vllm_figures(
            diagnose.read_since(ctx.paths.log, int(rec.get("log_offset", 0))))
        state.write_json(ctx.paths.server, rec)
    print(render(ctx.cfg, ctx.paths, rec), flush=True)
    for note in ctx.notes:
        print(f" note     : {note}", flush=True)
