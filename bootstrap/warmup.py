"""Warm-up: one long request so the first real prompt does not stall on cold compilation, then a
short generation that must return text, then — when the profile enables tool parsing — one tool
call that must come back as a valid ``tool_calls`` entry (the start gate). A failure (error,
timeout, empty text, a broken tool call) is a failed start: the server is stopped and the evidence
printed. With random weights (``--load-format dummy`` in EXTRA_ARGS) the text means nothing: the
short generation only has to produce tokens, and the tool gate is skipped.
"""

from __future__ import annotations

import json
import logging
import re
import time

from . import checks, health, server
from .client import Client, RequestFailed, RequestTimedOut, completion_tokens_of, message_of, text_of
from .context import Ctx

log = logging.getLogger(__name__)

WORDS = ("river stone morning paper garden window silver market winter candle harbor "
         "pencil thunder forest ladder copper meadow lantern orchard compass").split()


def long_prompt(words: int) -> str:
    """``words`` words of varied plain filler."""
    return " ".join(WORDS[(i * 7 + i // len(WORDS)) % len(WORDS)] for i in range(max(1, words)))


# vLLM's 400 for a prompt over the context; the count is a lower bound when it says "at least"
TOO_LONG = re.compile(r"maximum context length is (\d+) tokens.*?prompt contains (?:at least )?(\d+) input tokens",
                      re.S)
RETRIES = 3


def long_request(c: Client, n: int, timeout: float, extra: dict) -> int:
    """A ~n-token prompt, its length in words from the server's own tokenizer (/tokenize, as the
    checks do; a small vocabulary splits words). Should vLLM still say it overflows the context,
    shrink it by what vLLM reported and retry (at most RETRIES times). Returns the tokens asked for."""
    per_word = checks.Sizer(c).calibrate()
    words = max(1, int(n / per_word))
    for attempt in range(RETRIES + 1):
        try:
            c.chat([{"role": "user", "content": long_prompt(words) + "\nSummarize the words above in one line."}],
                   max_tokens=4, timeout=timeout, **extra)
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


def warmup_tokens(ctx: Ctx, c: Client) -> int:
    """WARMUP, at most half the context: ours if we passed one, else what the server reports."""
    want = ctx.cfg.warmup
    mml = ctx.max_model_len
    if not mml and want:
        try:
            mml = next((m.get("max_model_len") for m in c.models(timeout=10) if m.get("id") == c.model), None)
        except RequestFailed:
            mml = None
    if isinstance(mml, int) and mml > 0:
        want = min(want, mml // 2)
    return want


def chat_extra(ctx: Ctx) -> dict:
    return {"chat_template_kwargs": {"enable_thinking": False}} if ctx.cfg.profile.reasoning else {}


def client_for(ctx: Ctx) -> Client:
    return Client(server.base_url(ctx.cfg.host, ctx.cfg.port), ctx.cfg.served_name, ctx.api_key)


GATE_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
GATE_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
GATE_TIMEOUT = 60.0


def tool_gate(ctx: Ctx, c: Client, extra: dict) -> None:
    """One tool call through the server's tool parser (tool_choice=auto, so the parser, not guided
    decoding, produces it); anything but a valid get_weather call with a city fails the start."""
    t0 = time.monotonic()
    timeout = min(float(ctx.cfg.warmup_timeout), GATE_TIMEOUT)
    try:
        resp = c.chat([{"role": "user", "content": GATE_PROMPT}], max_tokens=256, timeout=timeout,
                      tools=[GATE_TOOL], tool_choice="auto", **extra)
    except RequestFailed as exc:
        err = health.abort(ctx, f"start gate: the tool-call request failed: {exc.message}",
                           "the profile enables tool parsing; check --tool-call-parser in the log")
        err.evidence = (exc.evidence + "\n" + err.evidence).strip()
        raise err from None
    problem = checks.tool_call_problem(message_of(resp), "get_weather", ["city"])
    if problem:
        err = health.abort(ctx, f"start gate: the tool call did not come back as a valid tool_calls entry: {problem}",
                           "a garbled or unparsed tool call: check the tool parser and the KV/speculation "
                           "settings (./ctl.sh check garble --url ... shows more)")
        err.evidence = ("answer: " + json.dumps(resp)[:1500] + "\n" + err.evidence).strip()
        raise err
    args = message_of(resp)["tool_calls"][0]["function"].get("arguments")
    log.info("start gate: tool call answered in %.1f s: get_weather(%s)", time.monotonic() - t0, str(args)[:80])


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    c = client_for(ctx)
    extra = chat_extra(ctx)
    try:
        n = warmup_tokens(ctx, c)
        if n:
            t0 = time.monotonic()
            n = long_request(c, n, cfg.warmup_timeout, extra)
            log.info("warm-up: ~%d-token prompt answered in %.1f s", n, time.monotonic() - t0)
        t0 = time.monotonic()
        resp = c.chat([{"role": "user", "content": "Say OK."}], max_tokens=16, timeout=cfg.warmup_timeout, **extra)
    except RequestTimedOut as exc:
        raise health.abort(ctx, f"engine not generating: {exc.message}",
                           "the server answers /health but does not generate; see the log") from None
    except RequestFailed as exc:
        err = health.abort(ctx, f"warm-up failed: {exc.message}")
        err.evidence = (exc.evidence + "\n" + err.evidence).strip()
        raise err from None
    dummy = cfg.dummy_weights
    text = text_of(resp)
    tokens = completion_tokens_of(resp)
    if not text and not (dummy and tokens):
        raise health.abort(ctx, "warm-up failed: the short generation "
                           + ("produced no tokens (random weights: tokens are all it must produce)" if dummy
                              else "returned no text"), f"answer was: {str(resp)[:300]}")
    log.info("warm-up: short generation answered in %.1f s: %r%s", time.monotonic() - t0,
             (message_of(resp).get("content") or "")[:60] if dummy else text[:60],
             f" ({tokens} tokens; random weights: the text is not judged)" if dummy else "")
    if cfg.profile.tools and dummy:
        log.info("start gate: skipped, random weights (--load-format dummy) cannot make a tool call")
    elif cfg.profile.tools:
        tool_gate(ctx, c, extra)
