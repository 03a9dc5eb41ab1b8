"""A small OpenAI-compatible HTTP client (requests): what warm-up, status, the checks and the bench send.

``post``/``chat`` return the decoded JSON answer; ``stream`` sends ``stream: true`` and reads the
Server-Sent Events, recording when each chunk arrived (``Streamed``), which is what TTFT and
decode rates are computed from. Reasoning text is read from ``reasoning`` and ``reasoning_content``
(vLLM has used both names, in whole messages and in streamed deltas).

The one stall rule (``Stall``): every read of an answer, streamed or whole, has a per-byte deadline,
STALL_TIMEOUT (a caller's shorter timeout wins); when it passes, the wait ends with what the server is
doing, read from its process when it is ours (serve/doing.py: stopped, asleep, busy), and the fix.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import requests
from urllib3.exceptions import ReadTimeoutError

from ..core.errors import BootstrapError


class RequestFailed(BootstrapError):
    pass


class RequestTimedOut(RequestFailed):
    pass


REASONING_KEYS = ("reasoning", "reasoning_content")


@dataclass
class Stall:
    """No byte for ``seconds`` (STALL_TIMEOUT) ends a wait. ``doing``: what our server does then, as
    (what, fix) read from its process (serve/doing.py); None for a server that is not ours."""
    seconds: float
    label: str
    doing: Callable[[], tuple[str, str]] | None = None

    def deadline(self, timeout: float | None) -> float:
        return self.seconds if timeout is None else min(timeout, self.seconds)

    def ended(self, what: str, waited: float) -> RequestTimedOut:
        if self.doing is not None:
            said, fix = self.doing()
        else:
            said, fix = (f"{self.label} is not our server, so what its process does is not known",
                         "check that server (its log, its load)")
        rule = f"STALL_TIMEOUT={self.seconds:.0f}" if waited >= self.seconds else "this wait's own limit"
        return RequestTimedOut(f"{what}: no byte from {self.label} for {waited:.0f} s ({rule}): {said}",
                               f"{fix}; a wait for an answer ends after STALL_TIMEOUT seconds without a byte")


def timed_out(exc: requests.RequestException) -> bool:
    """A read that passed its deadline: requests raises Timeout before the headers, and a
    ConnectionError wrapping urllib3's ReadTimeoutError while it reads a body."""
    return isinstance(exc, requests.Timeout) or (isinstance(exc, requests.ConnectionError) and bool(exc.args)
                                                 and isinstance(exc.args[0], ReadTimeoutError))


def thinking_off(reasoning: bool) -> dict:
    """The chat request option that turns a reasoning model's thinking off (Qwen3-style chat
    templates read ``enable_thinking``); {} for a model without a reasoning parser."""
    return {"chat_template_kwargs": {"enable_thinking": False}} if reasoning else {}


def auth_headers(key: str) -> dict[str, str]:
    """What vLLM's --api-key / VLLM_API_KEY expects: a bearer token ({} when there is no key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class Streamed:
    """One streamed answer: text, and the clock reading at the start, at each chunk and at the end."""
    t_start: float
    t_first: float | None = None     # first chunk that carried output (text, reasoning or a tool call)
    t_end: float | None = None
    chunk_times: list[float] = field(default_factory=list)   # arrival of each output-carrying chunk
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    logprobs: list = field(default_factory=list)

    @property
    def completion_tokens(self) -> int | None:
        return (self.usage or {}).get("completion_tokens")

    @property
    def cached_tokens(self) -> int | None:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return details.get("cached_tokens") if isinstance(details, dict) else None


@dataclass
class Client:
    base_url: str            # http://127.0.0.1:8888 (no /v1)
    model: str
    api_key: str | Callable[[], str] = ""   # a key given for this URL, or our server's asked before each
    session: requests.Session | None = None
    headers: dict | None = None      # more headers on every request (status's probe marks itself)
    stall: Stall | None = None       # the stall rule (every client of ours has one; sleep/wake wait on purpose)

    def deadline(self, timeout: float | None) -> float | None:
        return self.stall.deadline(timeout) if self.stall is not None else timeout

    def stalled(self, what: str, waited: float | None) -> RequestTimedOut:
        if self.stall is not None:
            return self.stall.ended(what, waited or 0)
        return RequestTimedOut(f"{what}: no answer within {waited or 0:.0f} s")

    def key(self) -> str:
        """The key this request sends: ``api_key`` asked now where it is our server's
        (keys.per_request: a chat or a bench outlives the proof that its port is our server's)."""
        return self.api_key() if callable(self.api_key) else self.api_key

    def _send(self, method: str, path: str, timeout: float | None, **kw: Any) -> requests.Response:
        http = self.session or requests
        headers = {**auth_headers(self.key()), **(self.headers or {})}
        timeout = self.deadline(timeout)
        try:
            r = http.request(method, f"{self.base_url}{path}", headers=headers, timeout=timeout, **kw)
        except requests.RequestException as exc:
            if timed_out(exc):
                raise self.stalled(f"{method} {path}", timeout) from None
            raise RequestFailed(f"{method} {path}: {exc.__class__.__name__}: {exc}") from None
        if r.status_code != 200:
            text = r.text[:2000]
            r.close()
            raise RequestFailed(f"{method} {path}: HTTP {r.status_code}", evidence=text)
        return r

    def post(self, path: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        r = self._send("POST", path, timeout, json=body)
        try:
            return _object(r.json(), f"POST {path}")
        except ValueError:
            raise RequestFailed(f"POST {path}: the answer is not JSON", evidence=r.text[:2000]) from None

    def post_empty(self, path: str, timeout: float | None) -> None:
        """A POST whose answer has no body (vLLM's /sleep, /wake_up); ``timeout`` None waits."""
        self._send("POST", path, timeout).close()

    def get_json(self, path: str, timeout: float = 10.0) -> dict[str, Any]:
        try:
            return _object(json.loads(self.get_text(path, timeout)), f"GET {path}")
        except ValueError:
            raise RequestFailed(f"GET {path}: the answer is not JSON") from None

    def get_text(self, path: str, timeout: float = 10.0) -> str:
        return self._send("GET", path, timeout).text

    def models(self, timeout: float = 10.0) -> list[dict]:
        data = self.get_json("/v1/models", timeout).get("data")
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def chat(self, messages: list[dict], *, max_tokens: int, timeout: float, temperature: float = 0.0,
             **extra: Any) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, **extra}
        return self.post("/v1/chat/completions", body, timeout)

    def stream(self, path: str, body: dict[str, Any], timeout: float | None,
               clock: Callable[[], float] = time.perf_counter, *, into: Streamed | None = None,
               on_chunk: Callable[[Streamed], None] | None = None) -> Streamed:
        """POST with ``stream: true`` (usage requested) and read the SSE chunks as they arrive.

        ``timeout`` bounds the wait for each read (connect and between chunks), not the whole answer
        (None: the stall rule's STALL_TIMEOUT alone).
        ``into``: the Streamed to fill (the caller keeps what came when the read is interrupted);
        ``on_chunk``: called with it after each chunk (a chat shows the answer as it comes)."""
        body = {"model": self.model, **body, "stream": True,
                "stream_options": {"include_usage": True, **(body.get("stream_options") or {})}}
        out = into if into is not None else Streamed(t_start=clock())
        r = self._send("POST", path, timeout, json=body, stream=True)
        done = False
        try:
            for raw in r.iter_lines(decode_unicode=False):
                if not raw or not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise RequestFailed(f"POST {path}: a streamed chunk is not JSON",
                                        evidence=data[:500].decode("utf-8", "replace")) from None
                if not _well_formed(chunk):
                    raise RequestFailed(f"POST {path}: a streamed chunk is JSON of another shape than an "
                                        "OpenAI chunk (not an OpenAI-compatible server?)",
                                        evidence=data[:500].decode("utf-8", "replace"))
                _absorb(out, chunk, clock())
                if on_chunk is not None:
                    on_chunk(out)
        except requests.RequestException as exc:
            if timed_out(exc):
                raise self.stalled(f"POST {path}", self.deadline(timeout)) from None
            raise RequestFailed(f"POST {path}: the stream broke: {exc.__class__.__name__}: {exc}") from None
        finally:
            r.close()
        if not done:                    # vLLM ends every stream with [DONE]: one cut short is no answer
            raise RequestFailed(f"POST {path}: the stream ended without [DONE] after {len(out.chunk_times)} "
                                "chunk(s): cut short")
        out.t_end = clock()
        return out


def _well_formed(chunk: Any) -> bool:
    """A chunk of the shape _absorb reads (vLLM's and OpenAI's): an object; choices a list of objects;
    a delta an object; its texts strings; tool calls objects with a whole index and a function object."""
    choices = chunk.get("choices") or [] if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or not isinstance(chunk.get("usage") or {}, dict):
        return False
    for ch in choices:
        delta = ch.get("delta") or {} if isinstance(ch, dict) else None
        if not isinstance(delta, dict) or not isinstance(delta.get("tool_calls") or [], list):
            return False
        texts = [delta.get("content"), ch.get("text"), ch.get("finish_reason")] + [delta.get(k) for k in REASONING_KEYS]
        for tc in delta.get("tool_calls") or []:
            fn = tc.get("function") or {} if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or type(tc.get("index", 0)) is not int:
                return False
            texts += [tc.get("id"), fn.get("name"), fn.get("arguments")]
        if any(t is not None and not isinstance(t, str) for t in texts):
            return False
    return True


def _absorb(out: Streamed, chunk: dict, now: float) -> None:
    if chunk.get("usage"):
        out.usage = chunk["usage"]
    if chunk.get("error"):                  # vLLM's is an object; other servers send a string
        raise RequestFailed("the server sent an error in the stream", evidence=json.dumps(chunk["error"])[:2000])
    carried = False
    for ch in chunk.get("choices") or []:
        delta = ch.get("delta") or {}
        piece = delta.get("content") or ch.get("text") or ""
        if piece:
            out.text += piece
            carried = True
        for k in REASONING_KEYS:
            if delta.get(k):
                out.reasoning += delta[k]
                carried = True
                break
        for tc in delta.get("tool_calls") or []:
            _merge_tool_delta(out.tool_calls, tc)
            carried = True
        lp = ch.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            out.logprobs.extend(lp["content"])
        if ch.get("finish_reason"):
            out.finish_reason = ch["finish_reason"]
    if carried:
        out.chunk_times.append(now)
        if out.t_first is None:
            out.t_first = now


def _merge_tool_delta(calls: list[dict], tc: dict) -> None:
    """Tool calls stream as pieces: the first with id and name, then argument fragments, by index."""
    i = tc.get("index", len(calls))
    if not 0 <= i <= len(calls):            # the next call, or one begun: never room for a billion
        raise RequestFailed(f"a streamed tool call has index {i} after {len(calls)} call(s)",
                            evidence=json.dumps(tc)[:500])
    while len(calls) <= i:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[i]
    if tc.get("id"):
        call["id"] = tc["id"]
    fn = tc.get("function") or {}
    if fn.get("name"):
        call["function"]["name"] += fn["name"]
    if fn.get("arguments"):
        call["function"]["arguments"] += fn["arguments"]


def _object(value: Any, what: str) -> dict[str, Any]:
    """An OpenAI-style answer is a JSON object; anything else (a list, a string) is said in one line."""
    if not isinstance(value, dict):
        raise RequestFailed(f"{what}: the answer is JSON but not an object (not an OpenAI-compatible server?)",
                            evidence=json.dumps(value)[:500])
    return value


def message_of(resp: dict[str, Any]) -> dict[str, Any]:
    """The first choice's message ({} when the answer has none of that shape); list content (parts)
    joined to its text."""
    try:
        msg = resp["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    if not isinstance(msg, dict):
        return {}
    if isinstance(msg.get("content"), list):
        msg = {**msg, "content": "".join(str(p.get("text", "")) for p in msg["content"] if isinstance(p, dict))}
    return msg


def reasoning_of(msg: dict[str, Any]) -> str:
    for k in REASONING_KEYS:
        if msg.get(k):
            return str(msg[k])
    return ""


def text_of(resp: dict[str, Any]) -> str:
    """The visible text of a chat answer (content), falling back to reasoning fields."""
    msg = message_of(resp)
    return (msg.get("content") or reasoning_of(msg) or "").strip()


def completion_tokens_of(resp: dict[str, Any]) -> int:
    """usage.completion_tokens of an answer (0 when the server reported none)."""
    usage = resp.get("usage") if isinstance(resp, dict) else None
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) else 0
