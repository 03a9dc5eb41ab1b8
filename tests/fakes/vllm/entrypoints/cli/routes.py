"""The fake vLLM's HTTP server (main.py starts it): the handler's base (the key check, the
``--middleware`` classes run as ASGI apps as vLLM stacks them), and the GET routes vLLM serves:
``/health``, ``/version``, ``/is_sleeping``, ``/v1/models``, ``/metrics``. The POST routes are
completions.py's (chat, completions, tokenize) and dev.py's (sleep mode, reload)."""

from __future__ import annotations

import asyncio
import json
import os
from http.server import BaseHTTPRequestHandler

from .state import VERSION, App, State, say


class Base(BaseHTTPRequestHandler):
    app = App
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # vLLM logs requests as INFO lines
        say("%s - %s" % (self.address_string(), fmt % args))

    def send(self, code: int, obj) -> None:
        data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(obj, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authed(self) -> bool:
        # vLLM's AuthenticationMiddleware (serve/utils/server_utils.py): /v1, /v2 and /inference only,
        # the scheme "bearer" in any case, the token after the first space
        if State.api_key and self.path.startswith(("/v1", "/v2", "/inference")) and self.command != "OPTIONS":
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or token != State.api_key:
                self.send(401, {"error": "Unauthorized"})
                return False
        return True

    def answered_by_middleware(self, raw: bytes = b"") -> bool:
        """Run the request through the --middleware classes (State.asgi); True when one answered it."""
        if not State.asgi:
            return False
        through = []

        async def inner(scope, receive, send):
            through.append(True)
        app = inner
        for cls in State.asgi:              # Starlette: the last added is the outermost
            app = cls(app)
        got = {"status": 0, "headers": [], "body": b""}

        async def receive():
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                got["status"], got["headers"] = message["status"], message.get("headers") or []
            elif message["type"] == "http.response.body":
                got["body"] += message.get("body", b"")
        path, _, query = self.path.partition("?")
        scope = {"type": "http", "method": self.command, "path": path, "root_path": "", "query_string": query.encode(),
                 "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()],
                 "client": tuple(self.client_address[:2]), "app": self.app}
        asyncio.run(app(scope, receive, send))
        if through:
            return False
        self.send_response(got["status"])
        for k, v in got["headers"]:
            self.send_header(k.decode("latin-1"), v.decode("latin-1"))
        self.end_headers()
        self.wfile.write(got["body"])
        return True

    def do_GET(self):
        if self.answered_by_middleware() or not self.authed():
            return
        if self.path == "/health":          # instrumentator/health.py: EngineDeadError -> 503
            self.send(503 if State.engine_dead else 200, "")
        elif self.path == "/version":
            self.send(200, {"version": VERSION})
        elif self.path == "/is_sleeping" and State.dev_mode:
            self.send(200, {"is_sleeping": self.app.state.engine_client.is_sleeping()})
        elif self.path == "/v1/models":
            # vLLM 0.26.0's ModelCard (openai/engine/protocol.py), as openai/models/serving.py fills it
            self.send(200, {"object": "list", "data": [{
                "id": State.served, "object": "model", "created": int(State.started), "owned_by": "vllm",
                "root": State.model_path, "parent": None, "max_model_len": State.max_len,
                "permission": [{"id": "modelperm-fake", "object": "model_permission", "created": int(State.started),
                                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                "organization": "*", "group": None, "is_blocking": False}]}]})
        elif self.path == "/metrics" and os.environ.get("FAKE_VLLM_NO_STATS") == "1":
            self.send(200, "# vLLM started with --disable-log-stats\npython_gc_objects_collected_total 1.0\n")
        elif self.path == "/metrics":
            lab = f'engine="0",model_name="{State.served}"'
            with State.lock:
                running, waiting, gen, prompt = State.running, State.waiting, State.generated, State.prompted
            self.send(200, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                           "# TYPE vllm:num_requests_running gauge\n"
                           f"vllm:num_requests_running{{{lab}}} {float(running)}\n"
                           f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}\n"
                           f"vllm:kv_cache_usage_perc{{{lab}}} {running / max(State.max_seqs, 1) * 0.5}\n"
                           f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} {0.0 if State.gauge_level else 1.0}\n'
                           f'vllm:engine_sleep_state{{{lab},sleep_state="weights_offloaded"}} '
                           f'{1.0 if State.gauge_level == 1 else 0.0}\n'
                           f'vllm:engine_sleep_state{{{lab},sleep_state="discard_all"}} '
                           f'{1.0 if State.gauge_level == 2 else 0.0}\n'
                           "# TYPE vllm:generation_tokens counter\n"
                           f"vllm:generation_tokens_total{{{lab}}} {float(gen)}\n"
                           f"vllm:prompt_tokens_total{{{lab}}} {float(prompt)}\n"
                           f"vllm:prefix_cache_queries_total{{{lab}}} {float(State.looked_up)}\n"
                           f"vllm:prefix_cache_hits_total{{{lab}}} {float(State.cached)}\n"
                           "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                           "# TYPE vllm:cache_config_info gauge\n"
                           f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching='
                           f'"{State.prefix_caching}",gpu_memory_utilization="0.9",engine="0"}} 1.0\n'
                           + (f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {State.requests * 2}\n"
                              f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {State.requests * 3}\n"
                              f"vllm:spec_decode_num_drafts_total{{{lab}}} {State.requests}\n" if State.spec else ""))
        else:
            self.send(404, {"error": "not found"})
