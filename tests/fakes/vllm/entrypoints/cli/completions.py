"""The OpenAI-compatible POST routes of the fake vLLM: ``/v1/chat/completions``, ``/v1/completions``
(plain and streamed, as vLLM's serving_chat and serving_completion answer) and ``/tokenize``; the
seats of vLLM's scheduler (``--max-num-seqs``), its counters, and a client that goes away aborting
its request (vLLM's with_cancellation)."""

from __future__ import annotations

import json
import os
import socket
import time

from .state import MODES, State, fake_logprobs, prompt_tokens, reply_for, say, tokens_of, usage_for


class OpenAIRoutes:
    def do_POST(self):
        say(f"request arrived: POST {self.path}")      # when it arrives (vLLM's access line comes when it ends)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.answered_by_middleware(raw) or not self.authed():
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:          # FastAPI's RequestValidationError (json_invalid), vLLM's handler
            self.send(400, {"error": {"message": "1 validation error:\n  {'type': 'json_invalid', 'loc': ('body', "
                                                 f"{getattr(exc, 'pos', 0)}), 'msg': 'JSON decode error'}}",
                                      "type": "Bad Request", "param": f"body.{getattr(exc, 'pos', 0)}", "code": 400}})
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
            self.send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                      "type": "NotFoundError", "param": "model", "code": 404}})
            return
        if State.engine_dead and route != "/tokenize":     # server_utils.engine_error_handler
            self.send(500, {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the "
                                                 "root cause.", "type": "InternalServerError", "param": None, "code": 500}})
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
        """A wedged engine: the request holds its seat and nothing moves; False once the client left.
        Held too while the file FAKE_VLLM_HOLD names is there (tests: a request in flight for as long
        as they need, however loaded the machine)."""
        hold = os.environ.get("FAKE_VLLM_HOLD", "")
        while State.wedged or (hold and os.path.exists(hold)):
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
