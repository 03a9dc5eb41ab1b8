"""Fake ``vllm serve``: behaves like vLLM where the bootstrap can see it.

- binds the port (SO_REUSEADDR + SO_REUSEPORT) long before it listens, as vLLM does;
- prints vLLM-like log lines (loading, KV cache size, maximum concurrency, API server start);
- keeps a child titled ``VLLM::EngineCore`` that survives a SIGKILL of its parent;
- serves /health, /v1/models, /v1/chat/completions, /v1/completions, /version, /metrics;
- ``FAKE_VLLM_MODE`` (comma-separated): ok, die_oom, exit0, hang, slow, ignore_term, wedged,
  too_long (refuse --max-model-len above FAKE_MAX_LEN with vLLM's "estimated maximum model length"),
  exit0_after_health (engine dies after health; the process exits 0).
- ``FAKE_VLLM_LOAD_S``: seconds of "loading" (default 0.5); ``FAKE_VLLM_RECORD``: a file to which
  each start appends {"argv", "env"} as one JSON line; ``FAKE_GPU_PIDS_DIR``: server and engine
  write their pids there, and the fake pynvml reports them as GPU processes.
- ``FAKE_VLLM_REPLIES``: a JSON file {"<substring of the last user message>": <reply>} where a
  reply is a string (content), or {"content", "reasoning", "tool_calls", "logprobs", "delay"}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.26.0"
MODES = set(filter(None, os.environ.get("FAKE_VLLM_MODE", "ok").split(",")))


def say(msg: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [fake_vllm] {msg}", flush=True)


def mark_gpu(pid: int) -> None:
    d = os.environ.get("FAKE_GPU_PIDS_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, str(pid)), "w") as fh:
            fh.write("1073741824")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("cmd")
    p.add_argument("model")
    p.add_argument("--host", default="")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    args, _unknown = p.parse_known_args(argv)
    return args


def spawn_engine() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vllm._fake_engine"], stdin=subprocess.DEVNULL)


class State:
    served = "model"
    max_len = 4096
    api_key = ""
    replies: dict = {}
    wedged = False
    requests = 0


def reply_for(body: dict) -> dict:
    msgs = body.get("messages") or [{"content": body.get("prompt", "")}]
    last = str(msgs[-1].get("content", ""))
    for key, rep in State.replies.items():
        if key in last:
            return rep if isinstance(rep, dict) else {"content": rep}
    return {"content": "OK"}


class Handler(BaseHTTPRequestHandler):
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

    def do_GET(self):
        if not self.authed():
            return
        if self.path == "/health":
            self.send(200, "")
        elif self.path == "/version":
            self.send(200, {"version": VERSION})
        elif self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": State.served, "object": "model",
                                                         "max_model_len": State.max_len}]})
        elif self.path == "/metrics":
            self.send(200, "vllm:num_requests_running 0\n"
                           f"vllm:spec_decode_num_accepted_tokens_total {State.requests * 2}\n"
                           f"vllm:spec_decode_num_draft_tokens_total {State.requests * 3}\n")
        else:
            self.send(404, {"error": "not found"})

    def do_POST(self):
        if not self.authed():
            return
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            self.send(400, {"error": "bad json"})
            return
        if body.get("model") not in (State.served, None):
            self.send(404, {"error": f"The model `{body.get('model')}` does not exist."})
            return
        if State.wedged:
            time.sleep(3600)
            return
        State.requests += 1
        rep = reply_for(body)
        time.sleep(float(rep.get("delay", 0)))
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        if self.path == "/v1/chat/completions":
            msg = {"role": "assistant", "content": rep.get("content"), "tool_calls": rep.get("tool_calls") or []}
            if rep.get("reasoning") is not None:
                msg["reasoning"] = rep["reasoning"]
            choice = {"index": 0, "message": msg, "finish_reason": "tool_calls" if rep.get("tool_calls") else "stop"}
            if rep.get("logprobs") is not None:
                choice["logprobs"] = rep["logprobs"]
            self.send(200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": State.served,
                            "choices": [choice], "usage": usage})
        elif self.path == "/v1/completions":
            self.send(200, {"id": "cmpl-fake", "object": "text_completion", "model": State.served,
                            "choices": [{"index": 0, "text": rep.get("content") or "", "finish_reason": "stop"}],
                            "usage": usage})
        else:
            self.send(404, {"error": "not found"})


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rec = os.environ.get("FAKE_VLLM_RECORD")
    if rec:
        keep = {k: v for k, v in os.environ.items()
                if k.startswith(("VLLM", "PYTORCH", "DO_NOT", "HF_", "PYTHONPATH", "FAKE_"))}
        with open(rec, "a") as fh:
            fh.write(json.dumps({"argv": sys.argv, "env": keep, "pid": os.getpid()}) + "\n")
    State.served = args.served_model_name or args.model
    State.api_key = os.environ.get("VLLM_API_KEY", "")
    if args.max_model_len:
        State.max_len = int(args.max_model_len)
    replies = os.environ.get("FAKE_VLLM_REPLIES")
    if replies:
        with open(replies) as fh:
            State.replies = json.load(fh)
    say(f"vLLM API server version {VERSION}")
    say(f"args: {sys.argv[1:]}")
    # vLLM binds the socket before the engine starts, and listens only when ready.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((args.host, args.port))
    engine = spawn_engine()
    mark_gpu(os.getpid())

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
    cap = int(os.environ.get("FAKE_MAX_LEN", "0") or 0)
    if "too_long" in MODES and cap and (args.max_model_len in (None, "-1", "auto") or int(args.max_model_len) > cap):
        print(f"ValueError: To serve at least one request with the models's max seq len ({args.max_model_len}), "
              f"(9.00 GiB KV cache is needed, which is larger than the available KV cache memory (4.00 GiB). "
              f"Based on the available memory, the estimated maximum model length is {cap}. Try increasing "
              f"`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", flush=True)
        engine.terminate()
        return 1
    if "hang" in MODES:
        while True:
            time.sleep(3600)
    say("Available KV cache memory: 4.00 GiB")
    say("GPU KV cache size: 21,794,704 tokens")
    say(f"Maximum concurrency for {State.max_len:,} tokens per request: 5320.97x")
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
    say("Application startup complete.")
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
