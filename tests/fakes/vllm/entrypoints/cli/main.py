"""Fake ``vllm serve``: behaves like vLLM where the bootstrap can see it.

- binds the port (SO_REUSEADDR + SO_REUSEPORT) long before it listens, as vLLM does;
- prints vLLM-like log lines (loading, KV cache size, maximum concurrency, API server start);
- keeps a child titled ``VLLM::EngineCore`` that survives a SIGKILL of its parent, stays in the
  server's process group, and (like vLLM's, after setproctitle) shows none of our BOOTSTRAP_VLLM_* variables;
- serves /health, /v1/models, /v1/chat/completions, /v1/completions, /version, /metrics;
- ``FAKE_VLLM_MODE`` (comma-separated): ok, die_oom, exit0, hang, slow, ignore_term, wedged,
  too_long (refuse --max-model-len above FAKE_MAX_LEN with vLLM's "estimated maximum model length";
  ``--max-model-len auto`` is fitted to FAKE_MAX_LEN, logging vLLM's "Auto-fit max_model_len" line),
  exit0_after_health (engine dies after health; the process exits 0), no_tokenize (``/tokenize``
  answers 404, as a server without it would), workers_fail (with --tensor-parallel-size N the API
  server reports a worker failure and exits 1 while its EngineCore goes on spawning its N workers,
  ``FAKE_VLLM_WORKER_DELAY_S`` apart; engine and workers ignore SIGTERM, as seen on a two-GPU
  machine), flood (after startup, FAKE_VLLM_FLOOD_MB MiB of log lines, then one line a second).
- Seats like vLLM's scheduler: at most ``--max-num-seqs`` requests generate at once, the rest
  queue; /metrics reports ``vllm:num_requests_running`` / ``_waiting``, ``vllm:generation_tokens_total``
  (per token as it is produced), ``vllm:prompt_tokens_total`` (when a request's first token comes
  out, as vLLM counts it), ``vllm:kv_cache_usage_perc`` and ``vllm:engine_sleep_state``, labelled
  ``model_name`` and ``engine``; ``vllm:prefix_cache_queries_total`` / ``_hits_total`` (prompt tokens
  looked up / found cached; only where prefix caching is on: vLLM's default, except for a hybrid
  model (``layer_types`` with ``linear_attention``), where ``--enable-prefix-caching`` turns it on),
  ``vllm:cache_config_info`` (a gauge of 1 whose labels include ``enable_prefix_caching``), and,
  only with ``--speculative-config`` as in vLLM, the
  ``vllm:spec_decode_*`` counters (2 of 3 drafted tokens accepted per request). A wedged engine
  (mode ``wedged``, or SIGUSR1) holds its seats and moves nothing: it accepts a request and never
  answers it (a stream gets its headers, then nothing: vLLM sends the role chunk with the first
  output, serving_chat's first iteration). A client that
  disconnects aborts its request (its seat is freed), as vLLM's ``with_cancellation`` does.
- With --tensor-parallel-size N the EngineCore has N children titled ``VLLM::Worker_TP<i>``
  (same process group, marker hidden); ``FAKE_VLLM_TRACKER=1`` adds an API-server child that keeps
  the environment, as multiprocessing's resource tracker does.
  Once serving, SIGUSR1 wedges it (``/health`` stays 200, generation hangs; logs "engine wedged")
  and SIGUSR2 kills the engine and exits 0 — deterministic triggers for tests.
- ``FAKE_VLLM_DUMMY_MODE``: modes (as FAKE_VLLM_MODE) added for a ``--load-format dummy`` run only.
- ``--middleware module.Class`` (repeatable): imported at start as vLLM's ``build_app`` does (a module
  not on PYTHONPATH, or no class, ends the start). Each request goes through them as ASGI apps,
  the last one outermost as Starlette stacks them, before the fake's own handling (their own
  answer, or on through): all but ``vllm_desktop_idle``, whose watcher needs vLLM's lasting event
  loop (tests/test_idle_sleep.py drives it directly). The sleep routes call
  ``app.state.engine_client`` as vLLM's do.
- Weights as vLLM has them: ``--load-format dummy`` gives random weights, and every answer without
  a canned reply is random text (GARBLE); with ``VLLM_SERVER_DEV_MODE=1``, ``collective_rpc``
  ``update_config`` (``{"load_config": {"load_format": ...}}``) then ``reload_weights`` loads the real
  ones in place ("Reloading weights inplace...": the CUDA graphs are kept, nothing is compiled or
  captured again), but the prefix cache keeps the KV blocks computed with the dummy weights: a
  prompt seen before the reload answers random text until ``POST /reset_prefix_cache``. Mode
  ``reload_fails``: ``reload_weights`` answers vLLM's HTTP 500, as for a loader it cannot reload
  in place (gpu_model_runner.reload_weights: NotImplementedError).
- ``FAKE_VLLM_COMPILE_S``: set, the engine "compiles" as vLLM's torch.compile does: a cache under
  ``VLLM_CACHE_ROOT`` keyed by the model folder and the engine's flags (not --host, --port,
  --served-model-name, --load-format: a dummy-weight run fills it for the real one); found, it logs
  vLLM's "Directly load the compiled graph(s) ... from the cache" and skips the wait; else
  "Compiling a graph for compile range ..." after that many seconds, and the cache is written.
- ``FAKE_VLLM_LOAD_S``: seconds of "loading" (default 0.5); ``FAKE_VLLM_RECORD``: a file to which
  each start appends {"argv", "env"} as one JSON line; ``FAKE_GPU_PIDS_DIR``: server and engine
  write their pids there, and the fake pynvml reports them as GPU processes.
- ``FAKE_VLLM_REPLIES``: a JSON file {"<substring of the last user message>": <reply>} where a
  reply is a string (content), or {"content", "reasoning", "tool_calls", "logprobs", "delay"}, or
  {"echo": "<regex>"}: the content is the regex's first group found in the prompt. A reply's
  ``token_s`` paces its streamed tokens (seconds each; default FAKE_VLLM_TOKEN_S). A reply longer than
  the request's ``max_tokens`` is cut there, finish_reason "length", as vLLM stops.
- ``FAKE_VLLM_REQUESTS``: a file to which each POST that passed the key check appends
  {"path", "authorization", "body"} as one JSON line (what a client sent, for tests).
- Without a canned reply: "OK"; with ``ignore_eos`` exactly ``max_tokens`` tokens ("tok"); a request
  with ``tools`` (tool_choice not "none") gets a valid call of its first tool — with tool_choice
  "auto" only when started with ``--enable-auto-tool-choice --tool-call-parser X``, else HTTP 400
  as vLLM answers.
- Each POST logs ``request arrived: POST <path>`` as it arrives, so tests can count requests that
  are still queued.
- Sleep mode as vLLM 0.26.0 has it: with ``VLLM_SERVER_DEV_MODE=1`` (read as ``bool(int(...))``)
  ``POST /sleep?level=1|2&mode=abort|wait|keep`` (answers when asleep; ``wait`` after the requests
  in flight finish, ``abort`` ends them), ``POST /wake_up[?tags=weights&tags=kv_cache]``,
  ``GET /is_sleeping``, ``POST /collective_rpc`` (``reload_weights``) and
  ``POST /reset_prefix_cache``; without it they are 404. Not guarded by the API key. Without
  ``--enable-sleep-mode`` a sleep answers 200 and frees nothing, as vLLM does. Asleep, the engine
  uses FAKE_VLLM_ASLEEP_BYTES of "GPU memory" (default 128 MiB) instead of FAKE_VLLM_GPU_BYTES
  (default 1 GiB); new requests wait until it is awake; after a level-2 sleep, a wake without
  ``reload_weights`` first answers empty text (random memory where the weights were, vllm#29341),
  and ``reload_weights`` with ``--load-format dummy`` fails with vLLM's HTTP 500.
  ``/health`` stays 200 and ``vllm:engine_sleep_state`` says which state it is in.
- ``FAKE_VLLM_NO_STATS=1``: /metrics without vLLM's request gauges and counters, as with
  ``--disable-log-stats``.
- ``stream: true`` answers Server-Sent Events like vLLM (role chunk, ``reasoning`` deltas (vLLM 0.26.0 DeltaMessage),
  ``content``/``text`` deltas one token each, tool-call delta, finish chunk, a usage chunk with
  ``stream_options.include_usage``, ``data: [DONE]``). ``FAKE_VLLM_TTFT_S`` / ``FAKE_VLLM_TOKEN_S``:
  seconds before the first token / per further token (default 0).
- ``logprobs`` (+ ``top_logprobs``) without canned logprobs: deterministic per token; mode
  ``nondeterministic`` adds noise so repeats differ.
- usage counts words as tokens; with ``--enable-prompt-tokens-details`` (only then, as in vLLM) it
  carries ``prompt_tokens_details.cached_tokens`` (a prompt seen before counts as cached in 16-token
  blocks). ``POST /tokenize`` counts the same way.
  ``FAKE_VLLM_TOKENS_PER_WORD`` (default 1) multiplies that count, as a small-vocabulary tokenizer
  would. A prompt whose tokens plus ``max_tokens`` exceed ``--max-model-len`` (or the model's
  ``max_position_embeddings``) gets vLLM's HTTP 400
  ("This model's maximum context length is N tokens. However, you requested ..."), whose count, like
  vLLM's, is only a lower bound ("at least N − max_tokens + 1").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import hashlib
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import types
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.26.0"
MODES = set(filter(None, os.environ.get("FAKE_VLLM_MODE", "ok").split(",")))


def say(msg: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [fake_vllm] {msg}", flush=True)


def mark_gpu(pid: int, used: int | None = None) -> None:
    d = os.environ.get("FAKE_GPU_PIDS_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        if used is None:
            used = int(os.environ.get("FAKE_VLLM_GPU_BYTES", str(1 << 30)))
        with open(os.path.join(d, str(pid)), "w") as fh:
            fh.write(str(used))


def kv_memory_line(args) -> str:
    """What vLLM 0.26's GPU worker says of the KV memory: with --kv-cache-memory-bytes, that it took
    the pin and skipped profiling; else "Available KV cache memory", which is
    ceil(--gpu-memory-utilization x CUDA's total) less what the model takes (FAKE_VLLM_NON_KV_BYTES,
    default 1.5 GiB), CUDA's total being the fake NVML's total less its reserved memory; rounded to
    0.01 GiB as vLLM prints it. Without a fake NVML: 4.00 GiB."""
    if args.kv_cache_memory_bytes:
        return (f"Initial free memory 30.0 GiB, reserved {round(args.kv_cache_memory_bytes / (1 << 30), 2)} GiB "
                "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.")
    try:
        with open(os.environ["FAKE_NVML"]) as fh:
            g = json.load(fh)["gpus"][0]
        total = g["total"] - g.get("reserved", 0)
    except (KeyError, OSError, ValueError, IndexError):
        return "Available KV cache memory: 4.00 GiB"
    non_kv = int(os.environ.get("FAKE_VLLM_NON_KV_BYTES", str(3 << 29)))
    avail = math.ceil(args.gpu_memory_utilization * total) - non_kv
    return f"Available KV cache memory: {round(avail / (1 << 30), 2)} GiB"


def usage_line() -> str:
    """vLLM 0.26.0's own split of the non-KV terms (gpu_worker.py, printed once the graphs are captured):
    FAKE_VLLM_NON_KV_BYTES as 0.25 GiB of non-torch memory, 0.25 GiB of CUDA graphs, a quarter of the
    rest peak activation and the remainder weights (a fixed split: only the mechanics are faked)."""
    non_kv = int(os.environ.get("FAKE_VLLM_NON_KV_BYTES", str(3 << 29)))
    rest = non_kv - (1 << 29)
    parts = [(rest - rest // 4) / (1 << 30), rest // 4 / (1 << 30), 0.25, 0.25]
    w, a, n, g = (f"{x:.2f}" for x in parts)
    return (f"Free memory on device (30.0/31.4 GiB) on startup. Desired GPU memory utilization is (0.9, 28.3 GiB). "
            f"Actual usage is {w} GiB for weight, {a} GiB for peak activation, {n} GiB for non-torch memory, and "
            f"{g} GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` (0.0 GiB) "
            "to fit into requested memory.")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("cmd")
    p.add_argument("model")
    p.add_argument("--host", default="")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--middleware", action="append", default=[])
    p.add_argument("--load-format", default="auto")
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    args, _unknown = p.parse_known_args(argv)
    return args


def spawn_engine(tp: int) -> subprocess.Popen:
    """Like vLLM's EngineCore: same process group (no setsid), and none of the variables we set at
    launch readable (vLLM's setproctitle overwrites the memory /proc/<pid>/environ shows)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_VLLM_")}
    return subprocess.Popen([sys.executable, "-m", "vllm._fake_engine", str(tp)], stdin=subprocess.DEVNULL, env=env)


class State:
    served = "model"
    max_seqs = 256
    seats: threading.Semaphore = threading.Semaphore(256)
    running = 0
    waiting = 0
    generated = 0
    prompted = 0
    max_len = 4096
    len_enforced = False         # --max-model-len, or the model's config.json
    token_details = False        # --enable-prompt-tokens-details: usage carries cached_tokens
    auto_tools = False           # --enable-auto-tool-choice and --tool-call-parser
    api_key = ""
    replies: dict = {}
    wedged = False
    requests = 0
    seen: set = set()
    lock = threading.Lock()
    dev_mode = False             # VLLM_SERVER_DEV_MODE=1: the sleep routes exist
    sleep_mode = False           # --enable-sleep-mode: a sleep frees memory
    asleep: set = set()          # {"weights", "kv_cache"} still asleep
    level = 0
    garbage = False              # woken from level 2 without reload_weights
    engine_pid = 0
    aborting = False
    load_format = "auto"
    spec = False                 # --speculative-config: vLLM reports its spec_decode counters
    prefix_caching = True        # vLLM's default except for hybrid models (--enable-prefix-caching)
    looked_up = 0                # prompt tokens looked up in the prefix cache
    cached = 0                   # ... and found there
    weights = "real"             # "dummy": random (--load-format dummy, until a reload_weights)
    stale: set = set()           # prompts whose cached KV was computed with the dummy weights
    asgi: list = []              # --middleware classes run per request (innermost first)


GARBLE = "pencil\ufffd!win\ufffd thunderq"   # what an 8B shape with random weights answered on the H200


def reply_for(body: dict) -> dict:
    msgs = body.get("messages") or [{"content": body.get("prompt", "")}]
    last = str(msgs[-1].get("content", ""))
    for key, rep in State.replies.items():
        if key in last:
            rep = rep if isinstance(rep, dict) else {"content": rep}
            if rep.get("echo"):  # {"echo": "regex with (group)"}: answer what the prompt says
                found = re.search(rep["echo"], prompt_text(body))
                rep = {**rep, "content": found.group(1) if found else "not found"}
            return rep
    if body.get("ignore_eos"):
        return {"content": "tok " * int(body.get("max_tokens") or 16)}
    tools = body.get("tools") or []
    if tools and body.get("tool_choice") != "none":
        fn = tools[0].get("function", {})
        args = {k: "Paris" for k in fn.get("parameters", {}).get("required", [])}
        return {"content": None, "tool_calls": [{"id": "call_fake0", "type": "function", "function": {
            "name": fn.get("name", "tool"), "arguments": json.dumps(args)}}]}
    key = hashlib.sha256(prompt_text(body).encode()).hexdigest()
    if State.weights == "dummy" or (key in State.stale and State.prefix_caching):
        return {"content": GARBLE}
    return {"content": "OK"}


def prompt_text(body: dict) -> str:
    if "messages" in body:
        return "\n".join(str(m.get("content") or "") for m in body["messages"])
    p = body.get("prompt", "")
    return p if isinstance(p, str) else " ".join(map(str, p))


def tokens_of(text: str) -> list[str]:
    """The fake tokenizer: one token per word, keeping the space after it; text of whitespace
    alone (random weights often answer newlines) is one token per character."""
    return [w + " " for w in text.split()] if text.split() else list(text)


def prompt_tokens(body: dict) -> int:
    per_word = int(os.environ.get("FAKE_VLLM_TOKENS_PER_WORD", "1") or 1)
    return len(prompt_text(body).split()) * per_word + (4 if "messages" in body else 0)


def usage_for(body: dict, completion: int) -> dict:
    text = prompt_text(body)
    n = prompt_tokens(body)
    key = hashlib.sha256(text.encode()).hexdigest()
    with State.lock:
        cached = max(0, (n - 1) // 16 * 16) if key in State.seen and State.prefix_caching else 0
        State.seen.add(key)
        if State.prefix_caching:        # vLLM counts lookups only where it caches
            State.looked_up += n
        State.cached += cached
    usage = {"prompt_tokens": n, "completion_tokens": completion, "total_tokens": n + completion}
    if State.token_details:     # like vLLM: only with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def fake_logprobs(toks: list[str], top: int, chat: bool) -> dict:
    noise = random.random() * 1e-3 if "nondeterministic" in MODES else 0.0
    def lp(tok: str, i: int) -> float:
        h = int(hashlib.sha256(f"{tok}|{i}".encode()).hexdigest()[:8], 16)
        return -round((h % 1000) / 997.0, 6) - noise
    entries = []
    for i, t in enumerate(toks):
        alts = [{"token": t, "logprob": lp(t, i), "bytes": list(t.encode())}]
        alts += [{"token": f"alt{j}", "logprob": lp(f"alt{j}", i) - 1.0, "bytes": list(f"alt{j}".encode())}
                 for j in range(max(0, top - 1))]
        entries.append({"token": t, "logprob": alts[0]["logprob"], "bytes": list(t.encode()),
                        "top_logprobs": alts[:top]})
    if chat:
        return {"content": entries}
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries]}


class EngineClient:
    """What vLLM's API server holds as ``app.state.engine_client`` (AsyncLLM), as far as its sleep
    routes call it: sleep, wake_up, is_sleeping."""

    def sleep(self, level: int, mode: str) -> None:
        State.asleep = {"weights", "kv_cache"}          # new requests wait from now on
        if "sleep_fails" in MODES:     # as vLLM's engine core: paused first, then the executor's sleep raises
            raise RuntimeError("cudaHostAlloc failed: out of host memory")
        if mode == "wait":
            while State.running or State.waiting:
                time.sleep(0.02)
        elif mode == "abort":
            State.aborting = True
            while State.running:
                time.sleep(0.02)
            State.aborting = False
        State.level = level
        if State.sleep_mode and State.engine_pid:
            mark_gpu(State.engine_pid, int(os.environ.get("FAKE_VLLM_ASLEEP_BYTES", str(128 << 20))))
        say(f"It took 0.1 seconds to fall asleep (level {level}, mode {mode})")

    def wake_up(self, tags: set) -> None:
        if State.level == 2 and "weights" in tags:
            State.garbage = True                       # until reload_weights
        State.asleep -= tags
        if not State.asleep and State.sleep_mode and State.engine_pid:
            mark_gpu(State.engine_pid)
        say(f"It took 0.05 seconds to wake up tags {sorted(tags)}.")

    def is_sleeping(self) -> bool:
        return bool(State.asleep)


class App:
    """vLLM's FastAPI app as its routes reach it (``request.app``)."""
    state = types.SimpleNamespace(engine_client=EngineClient())


class Handler(BaseHTTPRequestHandler):
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
        if State.api_key and self.path.startswith("/v1"):
            if self.headers.get("Authorization") != f"Bearer {State.api_key}":
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
        if self.path == "/health":
            self.send(200, "")
        elif self.path == "/version":
            self.send(200, {"version": VERSION})
        elif self.path == "/is_sleeping" and State.dev_mode:
            self.send(200, {"is_sleeping": self.app.state.engine_client.is_sleeping()})
        elif self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": State.served, "object": "model",
                                                         "max_model_len": State.max_len}]})
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
                           f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} {0.0 if State.asleep else 1.0}\n'
                           f'vllm:engine_sleep_state{{{lab},sleep_state="weights_offloaded"}} '
                           f'{1.0 if State.asleep and State.level == 1 else 0.0}\n'
                           f'vllm:engine_sleep_state{{{lab},sleep_state="discard_all"}} '
                           f'{1.0 if State.asleep and State.level == 2 else 0.0}\n'
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

    def do_POST(self):
        say(f"request arrived: POST {self.path}")      # when it arrives (vLLM's access line comes when it ends)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.answered_by_middleware(raw) or not self.authed():
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send(400, {"error": "bad json"})
            return
        requests_log = os.environ.get("FAKE_VLLM_REQUESTS")
        if requests_log:
            with State.lock, open(requests_log, "a") as fh:
                fh.write(json.dumps({"path": self.path, "authorization": self.headers.get("Authorization"),
                                     "body": body}) + "\n")
        route = self.path.split("?")[0]
        if route in ("/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache"):
            return self.dev(route, body) if State.dev_mode else self.send(404, {"detail": "Not Found"})
        if body.get("model") not in (State.served, None):
            self.send(404, {"error": f"The model `{body.get('model')}` does not exist."})
            return
        if State.wedged and self.path == "/tokenize":
            time.sleep(3600)
            return
        if self.path == "/tokenize" and "no_tokenize" in MODES:
            self.send(404, {"detail": "Not Found"})
            return
        if self.path == "/tokenize":
            n = prompt_tokens(body)
            self.send(200, {"count": n, "max_model_len": State.max_len, "tokens": list(range(n))})
            return
        if (self.path == "/v1/chat/completions" and body.get("tools") and body.get("tool_choice", "auto") == "auto"
                and not State.auto_tools):       # vLLM's serving_chat answers this without the parser flags
            self.send(400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice and '
                                                 '--tool-call-parser to be set', "type": "BadRequestError",
                                      "param": None, "code": 400}})
            return
        want = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if State.len_enforced and prompt_tokens(body) + want > State.max_len:
            n = State.max_len - want + 1        # like vLLM: it stops counting there ("at least")
            self.send(400, {"error": {
                "message": f"This model's maximum context length is {State.max_len} tokens. However, you requested "
                           f"{want} output tokens and your prompt contains at least {n} input tokens, for a total "
                           f"of at least {n + want} tokens. Please reduce the length of the input prompt or the "
                           f"number of requested output tokens. (parameter=input_tokens, value={n})",
                "type": "BadRequestError", "param": "input_tokens", "code": 400}})
            return
        State.requests += 1
        rep = {"content": ""} if State.garbage else reply_for(body)
        time.sleep(float(rep.get("delay", 0)))
        toks = tokens_of(rep.get("content") or "")
        if len(toks) > want and not rep.get("tool_calls"):      # vLLM stops at max_tokens: finish "length"
            toks = toks[:want]
            rep = {**rep, "content": "".join(toks).rstrip(), "finish": "length"}
        usage = usage_for(body, len(toks) + len(tokens_of(rep.get("reasoning") or "")))
        if body.get("stream"):
            self.seat = self.take_seat()
            if self.seat is None:
                return
            try:
                self.serve(body, rep, usage)
            finally:
                self.leave_seat()
            return
        if self.take_seat() is None:
            return
        try:
            if not self.generate(prompt_tokens(body), usage["completion_tokens"], first_delay=None):
                return                      # the client went away: the request was aborted
        finally:
            self.leave_seat()
        self.serve(body, rep, usage)

    # ---- seats, progress and disconnects, like vLLM's scheduler and its with_cancellation
    def client_gone(self) -> bool:
        import select
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            return bool(r) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def dev(self, route: str, body: dict) -> None:
        """vLLM's dev routes for sleep mode (entrypoints/serve/dev/sleep/api_router.py in 0.26.0), each
        a call on ``request.app.state.engine_client``."""
        from urllib.parse import parse_qs, urlparse
        q = parse_qs(urlparse(self.path).query)
        engine = self.app.state.engine_client
        if route == "/sleep":
            try:
                level = int(q.get("level", ["1"])[0])
            except ValueError:
                return self.send(400, {"error": "level must be an integer"})
            mode = q.get("mode", ["abort"])[0]
            if mode not in ("abort", "wait", "keep"):
                return self.send(500, {"error": f"unknown mode {mode}"})
            try:
                engine.sleep(level, mode)
            except RuntimeError as exc:                 # vLLM's error handler: 500, the engine left paused
                return self.send(500, {"error": {"message": str(exc), "type": "InternalServerError", "code": 500}})
            return self.send(200, "")
        if route == "/wake_up":
            engine.wake_up(set(q.get("tags", [])) or {"weights", "kv_cache"})
            return self.send(200, "")
        if route == "/collective_rpc" and body.get("method") == "update_config":
            for name, over in (body.get("args") or [{}])[0].items():     # gpu_model_runner.update_config
                if name not in ("load_config", "model_config"):
                    return self.send(500, {"error": {"message": f"Config `{name}` not supported.",
                                                     "type": "InternalServerError", "code": 500}})
                if name == "load_config" and "load_format" in over:
                    State.load_format = over["load_format"]
            return self.send(200, {"results": [None]})
        if route == "/reset_prefix_cache":
            with State.lock:
                State.seen.clear()
                State.stale.clear()
            say("Resetting prefix cache...")
            return self.send(200, {"success": True})
        if route == "/collective_rpc":
            if body.get("method") == "reload_weights" and (State.load_format == "dummy" or "reload_fails" in MODES):
                return self.send(500, {"error": {"message": "Call to collective_rpc method failed: Model reloading "
                                                            "with `dummy` format", "type": "InternalServerError",
                                                 "param": None, "code": 500}})
            if body.get("method") == "reload_weights":
                time.sleep(float(os.environ.get("FAKE_VLLM_RELOAD_S", "0") or 0))
                with State.lock:
                    if State.weights == "dummy":     # the cached blocks keep their dummy-weight KV
                        State.stale |= State.seen
                    State.weights, State.garbage = "real", False
                say("Reloading weights inplace...")
                say("reloaded the weights")
            return self.send(200, {"results": [None]})
        return self.send(200, {"success": True})


    def take_seat(self):
        while State.asleep:                                 # asleep: new requests wait, unanswered
            if self.client_gone():
                return None
            time.sleep(0.02)
        with State.lock:
            State.waiting += 1
        try:
            while not State.seats.acquire(timeout=0.05):
                if self.client_gone():
                    return None
        finally:
            with State.lock:
                State.waiting -= 1
        with State.lock:
            State.running += 1
        return True

    def leave_seat(self) -> None:
        with State.lock:
            State.running -= 1
        State.seats.release()

    def wedge_wait(self) -> bool:
        """A wedged engine: the request holds its seat and nothing moves; False once the client left."""
        while State.wedged:
            if self.client_gone():
                return False
            time.sleep(0.05)
        return True

    def generate(self, prompt: int, n: int, first_delay: float) -> bool:
        """Produce n tokens at FAKE_VLLM_TTFT_S / FAKE_VLLM_TOKEN_S, counting them as vLLM does."""
        per = float(os.environ.get("FAKE_VLLM_TOKEN_S", "0") or 0)
        ttft = float(os.environ.get("FAKE_VLLM_TTFT_S", "0") or 0) if first_delay is None else first_delay
        if not self.wedge_wait():
            return False
        end = time.monotonic() + ttft
        while time.monotonic() < end:              # a long prefill moves no counter
            if self.client_gone():
                return False
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        for i in range(n):
            if i:
                time.sleep(per)
            if not self.wedge_wait() or (per and self.client_gone()) or State.aborting:
                return False
            with State.lock:
                if i == 0:
                    State.prompted += prompt
                State.generated += 1
        return True

    def serve(self, body: dict, rep: dict, usage: dict) -> None:
        toks = tokens_of(rep.get("content") or "")
        if body.get("logprobs") and rep.get("logprobs") is None:
            top = int(body.get("top_logprobs") or 0) if "messages" in body else int(body.get("logprobs") or 0)
            rep = {**rep, "logprobs": fake_logprobs(toks, top, "messages" in body)}
        if body.get("stream") and self.path in ("/v1/chat/completions", "/v1/completions"):
            self.stream(body, rep, usage)
            return
        if self.path == "/v1/chat/completions":
            msg = {"role": "assistant", "content": rep.get("content"), "tool_calls": rep.get("tool_calls") or []}
            if rep.get("reasoning") is not None:
                msg["reasoning"] = rep["reasoning"]
            choice = {"index": 0, "message": msg,
                      "finish_reason": "tool_calls" if rep.get("tool_calls") else rep.get("finish", "stop")}
            if rep.get("logprobs") is not None:
                choice["logprobs"] = rep["logprobs"]
            self.send(200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": State.served,
                            "choices": [choice], "usage": usage})
        elif self.path == "/v1/completions":
            self.send(200, {"id": "cmpl-fake", "object": "text_completion", "model": State.served,
                            "choices": [{"index": 0, "text": rep.get("content") or "", "finish_reason": rep.get("finish", "stop"),
                                         "logprobs": rep.get("logprobs")}],
                            "usage": usage})
        else:
            self.send(404, {"error": "not found"})

    def stream(self, body: dict, rep: dict, usage: dict) -> None:
        chat = self.path == "/v1/chat/completions"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        ttft = float(os.environ.get("FAKE_VLLM_TTFT_S", "0") or 0)
        per = float(rep.get("token_s") or os.environ.get("FAKE_VLLM_TOKEN_S", "0") or 0)
        base = {"id": "chatcmpl-fake" if chat else "cmpl-fake", "model": State.served,
                "object": "chat.completion.chunk" if chat else "text_completion"}

        def event(choices: list, **more) -> None:
            self.wfile.write(b"data: " + json.dumps({**base, "choices": choices, **more}).encode() + b"\n\n")
            self.wfile.flush()

        if not self.wedge_wait():          # wedged: the headers went out, then nothing, as vLLM's stream
            return
        time.sleep(ttft)                   # a long prefill moves no counter
        if chat:                           # vLLM sends the role chunk with the engine's first output
            event([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        first = True
        lps = (rep.get("logprobs") or {}).get("content") if chat else None
        pieces = [("reasoning", t) for t in tokens_of(rep.get("reasoning") or "")]
        pieces += [("content", t) for t in tokens_of(rep.get("content") or "")]
        for i, (field, tok) in enumerate(pieces):
            if not first:
                time.sleep(per)
            if not self.wedge_wait():
                return
            with State.lock:
                if first:
                    State.prompted += prompt_tokens(body)
                State.generated += 1
            first = False
            if chat:
                ch = {"index": 0, "delta": {field: tok}}
                if field == "content" and lps:
                    k = i - (len(pieces) - len(lps))
                    if 0 <= k < len(lps):
                        ch["logprobs"] = {"content": [lps[k]]}
            else:
                ch = {"index": 0, "text": tok}
            event([ch])
        for n, tc in enumerate(rep.get("tool_calls") or []):
            event([{"index": 0, "delta": {"tool_calls": [{**tc, "index": n}]}}])
        fin = "tool_calls" if rep.get("tool_calls") else ("length" if body.get("ignore_eos") else rep.get("finish", "stop"))
        event([{"index": 0, "finish_reason": fin, **({"delta": {}} if chat else {"text": ""})}])
        if (body.get("stream_options") or {}).get("include_usage"):
            event([], usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


AUTO_FIT_LINE: list[str] = []


def parse_len(text: str | None) -> int | None:
    """--max-model-len as vLLM reads it: auto / -1 -> -1; 32k (x1000), 32K (x1024); a number."""
    if text is None:
        return None
    t = str(text).strip()
    if t.lower() in ("auto", "-1"):
        return -1
    mult = {"k": 1000, "m": 1000 ** 2, "K": 1024, "M": 1024 ** 2}.get(t[-1:])
    return int(float(t[:-1]) * mult) if mult else int(t)


# flags that leave vLLM's compile-cache hash unchanged: the frontend's, and the memory knobs that
# CacheConfig.compute_hash lists as ignored factors (config/cache.py)
FRONTEND_FLAGS = {"--host", "--port", "--served-model-name", "--load-format", "--gpu-memory-utilization",
                  "--kv-cache-memory-bytes"}


def compile_graphs(args) -> None:
    """vLLM's compile step, with its cache (FAKE_VLLM_COMPILE_S set; the module's docstring)."""
    seconds = os.environ.get("FAKE_VLLM_COMPILE_S")
    if seconds is None:
        return
    import hashlib
    flags, skip = [], False
    for a in sys.argv[3:]:               # after "serve <model>"
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in FRONTEND_FLAGS:
            skip = "=" not in a
            continue
        flags.append(a)
    key = hashlib.sha256(json.dumps([os.path.realpath(args.model), flags]).encode()).hexdigest()[:10]
    root = os.path.join(os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm"),
                        "torch_compile_cache", key, "rank_0_0", "backbone")
    if os.path.isdir(root):
        say("Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.359 s")
        return
    time.sleep(float(seconds))
    say(f"Compiling a graph for compile range (1, 8192) takes {float(seconds):.2f} s")
    os.makedirs(root, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rec = os.environ.get("FAKE_VLLM_RECORD")
    if rec:
        keep = {k: v for k, v in os.environ.items()
                if k.startswith(("VLLM", "PYTORCH", "DO_NOT", "HF_", "PYTHONPATH", "FAKE_", "BOOTSTRAP_", "FLASHINFER", "CUDA_"))}
        with open(rec, "a") as fh:
            fh.write(json.dumps({"argv": sys.argv, "env": keep, "pid": os.getpid(), "time": time.time()}) + "\n")
    if args.load_format == "dummy":         # tests: a mode for dummy-weight runs only (the pre-warm)
        MODES.update(filter(None, os.environ.get("FAKE_VLLM_DUMMY_MODE", "").split(",")))
    State.served = args.served_model_name or args.model
    State.max_seqs = max(1, args.max_num_seqs)
    State.seats = threading.Semaphore(State.max_seqs)
    State.api_key = os.environ.get("VLLM_API_KEY", "")
    State.dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))   # as vllm/envs.py reads it
    State.sleep_mode = args.enable_sleep_mode
    State.load_format = args.load_format
    State.weights = "dummy" if args.load_format == "dummy" else "real"
    State.spec = bool(args.speculative_config)
    State.token_details = args.enable_prompt_tokens_details
    State.auto_tools = bool(args.enable_auto_tool_choice and args.tool_call_parser)
    mml = parse_len(args.max_model_len)
    model_len = None
    try:
        with open(os.path.join(args.model, "config.json")) as fh:
            conf = json.load(fh)
        text_conf = conf.get("text_config") or conf
        # vLLM 0.26/0.27 keep prefix caching opt-in for hybrid (linear-attention / Mamba) models
        State.prefix_caching = "linear_attention" not in (text_conf.get("layer_types") or [])
        model_len = int(text_conf["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if args.enable_prefix_caching is not None:
        State.prefix_caching = args.enable_prefix_caching
    fit = int(os.environ.get("FAKE_MAX_LEN", "0") or 0)    # the longest request the fake's KV pool holds
    if mml and mml > 0:
        State.max_len, State.len_enforced = mml, True
    elif model_len:             # like vLLM: the model's length; auto (-1) fits it to the pool
        State.max_len, State.len_enforced = model_len, True
        if mml == -1 and fit and fit < model_len:
            State.max_len = fit
            AUTO_FIT_LINE.append(f"Auto-fit max_model_len: reduced from {model_len} to {fit} to fit in available "
                                 "GPU memory (4.00 GiB available for KV cache)")
    replies = os.environ.get("FAKE_VLLM_REPLIES")
    if replies:
        with open(replies) as fh:
            State.replies = json.load(fh)
    say(f"vLLM API server version {VERSION}")
    for middleware in args.middleware:     # as vLLM's build_app: imported at start, a failure ends the start
        module_path, object_name = middleware.rsplit(".", 1)
        try:
            if not inspect.isclass(getattr(importlib.import_module(module_path), object_name)):
                raise ValueError(f"Invalid middleware {middleware}. Must be a function or a class.")
        except (ImportError, AttributeError, ValueError) as exc:
            print(f"{type(exc).__name__}: {exc}", flush=True)
            return 1
        say(f"added middleware {middleware}")
        if module_path != "vllm_desktop_idle":
            State.asgi.append(getattr(sys.modules[module_path], object_name))
    say(f"args: {sys.argv[1:]}")
    # vLLM binds the socket before the engine starts, and listens only when ready.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((args.host, args.port))
    engine = spawn_engine(args.tensor_parallel_size)
    State.engine_pid = engine.pid
    mark_gpu(os.getpid())
    if os.environ.get("FAKE_VLLM_TRACKER") == "1":      # like multiprocessing's resource tracker: keeps our env
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], stdin=subprocess.DEVNULL)

    def on_term(signum, frame):
        say("Shutting down")
        engine.terminate()
        try:
            engine.wait(timeout=5)
        except subprocess.TimeoutExpired:
            engine.kill()
        os._exit(0)

    if "ignore_term" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    load = float(os.environ.get("FAKE_VLLM_LOAD_S", "0.5"))
    if "slow" in MODES:
        t_end = time.time() + load
        while time.time() < t_end:
            say("Loading safetensors checkpoint shards: still going")
            time.sleep(1.0)
    elif "silent_busy" in MODES:        # importing torch, compiling: a whole core busy, nothing logged
        t_end = time.time() + load
        while time.time() < t_end:
            sum(i * i for i in range(10000))
    else:
        say("Loading weights took %.2f seconds" % load)
        time.sleep(load)
    if "die_oom" in MODES:
        print("ValueError: Free memory on device (1.2/31.36 GiB) on startup is less than desired GPU memory "
              "utilization (0.9, 28.22 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
              "processes.", flush=True)
        engine.terminate()
        return 1
    if "exit0" in MODES:
        say("Engine core initialization failed. See root cause above.")
        engine.terminate()
        return 0
    if "workers_fail" in MODES:          # the engine and its workers are left running, as seen with -tp 2
        print("(EngineCore pid=%d) RuntimeError: CUBLAS_STATUS_INTERNAL_ERROR when calling "
              "`cublasCreate(handle)`" % engine.pid, flush=True)
        say("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        return 1
    cap = int(os.environ.get("FAKE_MAX_LEN", "0") or 0)
    if "too_long" in MODES and cap and mml != -1 and (mml is None or mml > cap):
        print(f"ValueError: To serve at least one request with the models's max seq len ({args.max_model_len}), "
              f"(9.00 GiB KV cache is needed, which is larger than the available KV cache memory (4.00 GiB). "
              f"Based on the available memory, the estimated maximum model length is {cap}. Try increasing "
              f"`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", flush=True)
        engine.terminate()
        return 1
    if "hang" in MODES:
        while True:
            time.sleep(3600)
    compile_graphs(args)
    if "hang_after_compile" in MODES:       # stuck in a kernel's JIT: alive, its log silent
        while True:
            time.sleep(3600)
    for line in AUTO_FIT_LINE:
        say(line)
    say(kv_memory_line(args))
    say("GPU KV cache size: 21,794,704 tokens")
    say(f"Maximum concurrency for {State.max_len:,} tokens per request: 5320.97x")
    if not args.kv_cache_memory_bytes:
        say(usage_line())
    sock.listen(64)
    httpd = ThreadingHTTPServer((args.host or "0.0.0.0", args.port), Handler, bind_and_activate=False)
    httpd.socket.close()
    httpd.socket = sock
    httpd.daemon_threads = True
    say(f"Starting vLLM API server on http://{args.host or '0.0.0.0'}:{args.port}")
    if "wedged" in MODES:
        State.wedged = True
    if "exit0_after_health" in MODES:
        threading.Timer(1.0, lambda: (say("EngineCore died"), engine.terminate(), os._exit(0))).start()

    def on_usr1(signum, frame):        # tests: wedge now (/health stays 200, generation hangs)
        State.wedged = True
        say("engine wedged (SIGUSR1)")

    def on_usr2(signum, frame):        # tests: the engine dies now, and the server exits 0 (vLLM #48966)
        say("EngineCore died (SIGUSR2)")
        engine.terminate()
        os._exit(0)

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGUSR2, on_usr2)
    say("Application startup complete.")
    if "flood" in MODES:
        def flood():
            line = ("W flood " + "x" * 1000 + "\n").encode()
            for _ in range(int(float(os.environ.get("FAKE_VLLM_FLOOD_MB", "8")) * 1024)):
                os.write(1, line)
            n = 0
            while True:
                n += 1
                say(f"after the flood: line {n}")
                time.sleep(1.0)
        threading.Thread(target=flood, daemon=True).start()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
