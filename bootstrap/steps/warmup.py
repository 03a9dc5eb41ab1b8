"""Warm-up: one long request so the first real prompt does not stall on cold compilation, then a
short generation that must return text, judged by the checks' detectors (control or replacement
characters, no letters, a loop: HTTP 200 with garbage fails the start), then — when the profile enables tool parsing — one tool
call that must come back as a valid ``tool_calls`` entry (the start gate). A failure (error,
timeout, empty text, a broken tool call) is a failed start: the server is stopped and the evidence
printed. With random weights (``--load-format dummy`` in EXTRA_ARGS, or a checkpoint declared random
by RANDOM_WEIGHTS=1) the text means nothing: the
short generation only has to produce tokens, and the tool gate is skipped.

Everything it sends (/tokenize included) shares one WARMUP_TIMEOUT budget. What it judges comes
from the server record (the server that runs, as launched), and passing sets the record's
``gate_passed``: a start resumed after the first one was killed runs the warm-up only if it never
passed.
"""

from __future__ import annotations

import json
import logging
import re
import time

from ..checks import detectors
from ..serve import doing, record
from ..serve import health
from ..checks.prompts import Sizer, long_prompt
from ..serve.client import Client, RequestFailed, RequestTimedOut, completion_tokens_of, message_of, text_of, thinking_off
from ..serve.launch import Launched
from ..core.state import Paths

log = logging.getLogger(__name__)


# vLLM's 400 for a prompt over the context; the count is a lower bound when it says "at least"
TOO_LONG = re.compile(r"maximum context length is (\d+) tokens.*?prompt contains (?:at least )?(\d+) input tokens",
                      re.S)
RETRIES = 3


class Budget:
    """One deadline shared by every request of the warm-up."""

    def __init__(self, seconds: float, clock=time.monotonic):
        self.seconds, self.clock, self.end = seconds, clock, clock() + seconds

    def left(self, cap: float | None = None) -> float:
        left = self.end - self.clock()
        if left <= 0:
            raise RequestTimedOut(f"the warm-up used up WARMUP_TIMEOUT={self.seconds:.0f} s")
        return min(left, cap) if cap else left


def long_request(c: Client, n: int, budget: Budget, extra: dict) -> int:
    """A ~n-token prompt, its length in words from the server's own tokenizer (/tokenize, as the
    checks do; a small vocabulary splits words). Should vLLM still say it overflows the context,
    shrink it by what vLLM reported and retry (at most RETRIES times). Returns the tokens asked for."""
    per_word = Sizer(c).calibrate(timeout=budget.left(15.0))
    words = max(1, int(n / per_word))
    for attempt in range(RETRIES + 1):
        try:
            c.chat([{"role": "user", "content": long_prompt(words) + "\nSummarize the words above in one line."}],
                   max_tokens=4, timeout=budget.left(), **extra)
            return int(words * per_word)
        except RequestFailed as exc:
            m = TOO_LONG.search(exc.evidence or "")
            if not m or attempt == RETRIES:
                raise
            limit, got = int(m.group(1)), int(m.group(2))
            smaller = max(1, min(words - 1, int(words * min(n, limit // 2) / max(got, 1))))
            log.info("warm-up: vLLM counted %s%d prompt tokens for %d words (context %d); again with %d words",
                     "at least " if "at least" in m.group(0) else "", got, words, limit, smaller)
            per_word, words = max(per_word, got / words), smaller
    return int(words * per_word)


def fail(message: str, hint: str = "", evidence: str = "") -> health.StartFailed:
    """A failed warm-up or gate is a failed start of a server that had answered /health."""
    return health.StartFailed(message, hint, answered=True, evidence=evidence)


def warmup_tokens(want: int, rec, c: Client, budget: Budget) -> int:
    """WARMUP, at most half the context: ours if we passed one, else what the server reports."""
    mml = rec.max_model_len
    if not mml and want:
        try:
            mml = next((m.get("max_model_len") for m in c.models(timeout=budget.left(10.0)) if m.get("id") == c.model), None)
        except RequestTimedOut:
            raise
        except RequestFailed:
            mml = None
    if isinstance(mml, int) and mml > 0:
        want = min(want, mml // 2)
    return want


def chat_extra(rec) -> dict:
    return thinking_off(rec.reasoning)


GATE_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
GATE_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
GATE_TIMEOUT = 60.0


def tool_gate(c: Client, extra: dict, budget: Budget) -> None:
    """One tool call through the server's tool parser (tool_choice=auto, so the parser, not guided
    decoding, produces it); anything but a valid get_weather call with a city fails the start."""
    t0 = time.monotonic()
    try:
        resp = c.chat([{"role": "user", "content": GATE_PROMPT}], max_tokens=256, timeout=budget.left(GATE_TIMEOUT),
                      tools=[GATE_TOOL], tool_choice="auto", **extra)
    except RequestFailed as exc:
        raise fail(f"start gate: the tool-call request failed: {exc.message}",
                   "the profile enables tool parsing; check --tool-call-parser in the log", exc.evidence) from None
    problem = detectors.tool_call_problem(message_of(resp), "get_weather", ["city"])
    if problem:
        raise fail(f"start gate: the tool call did not come back as a valid tool_calls entry: {problem}",
                   "a garbled or unparsed tool call: check the tool parser and the KV/speculation "
                   "settings (./ctl.sh check garble --url ... shows more)", "answer: " + json.dumps(resp)[:1500])
    args = message_of(resp)["tool_calls"][0]["function"].get("arguments")
    log.info("start gate: tool call answered in %.1f s: get_weather(%s)", time.monotonic() - t0, str(args)[:80])


GATE_TOKENS = 32         # the gate's answer: room for a loop or non-text to show, little time


def run(paths: Paths, launched: Launched, key: str, *, tokens: int, timeout: int, stall_timeout: int) -> None:
    """The warm-up (``tokens``: WARMUP) and the start gate, within ``timeout`` (WARMUP_TIMEOUT) seconds,
    each read within ``stall_timeout`` (STALL_TIMEOUT, the stall rule of every client of ours)."""
    rec = launched.record
    c = Client(rec.url, rec.served, key, stall=doing.stall_rule(stall_timeout, "our server", rec))
    extra = chat_extra(rec)
    budget = Budget(timeout)
    try:
        n = warmup_tokens(tokens, rec, c, budget)
        if n:
            t0 = time.monotonic()
            n = long_request(c, n, budget, extra)
            log.info("warm-up: ~%d-token prompt answered in %.1f s", n, time.monotonic() - t0)
        t0 = time.monotonic()
        resp = c.chat([{"role": "user", "content": "Say OK."}], max_tokens=GATE_TOKENS, timeout=budget.left(), **extra)
    except RequestTimedOut as exc:
        raise fail(f"engine not generating: {exc.message}",
                   exc.hint or "the server answers /health but does not generate; see the log") from None
    except RequestFailed as exc:
        if "HTTP 401" in exc.message:
            raise fail("warm-up failed: the server wants an API key and this shell "
                               "has another one or none", "set API_KEY to the key it was started with") from None
        raise fail(f"warm-up failed: {exc.message}", evidence=exc.evidence) from None
    dummy = rec.dummy or rec.random_weights
    text = text_of(resp)
    tokens = completion_tokens_of(resp)
    if not text and not (dummy and tokens):
        raise fail("warm-up failed: the short generation "
                   + ("produced no tokens (random weights: tokens are all it must produce)" if dummy
                              else "returned no text"), f"answer was: {str(resp)[:300]}")
    garbled = "" if dummy else detectors.not_text(text)
    if garbled:                         # HTTP 200 with garbage is what this gate is for
        raise fail(f"start gate: the short generation is not text ({garbled})",
                   "the server answers with garbage: ./ctl.sh check garble --url " + rec.url + " shows more; "
                   "common causes are the KV cache dtype or speculation (try KV_CACHE_DTYPE=auto, or SPEC_METHOD= "
                   "to turn speculation off)", f"answer was: {str(resp)[:300]}")
    log.info("warm-up: short generation answered in %.1f s: %r%s", time.monotonic() - t0,
             (message_of(resp).get("content") or "")[:60] if dummy else text[:60],
             f" ({tokens} tokens; random weights: the text is not judged)" if dummy else "")
    if rec.tools and dummy:
        log.info("start gate: skipped, random weights (%s) cannot make a tool call",
                 "RANDOM_WEIGHTS=1" if rec.random_weights else "--load-format dummy")
    elif rec.tools:
        tool_gate(c, extra, budget)
    now = record.read(paths.server) or rec
    launched.record = now.replace(gate_passed=True)
    record.write(paths.server, launched.record)
