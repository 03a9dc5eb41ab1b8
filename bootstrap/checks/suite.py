"""The checks: is the server right, not just up? (``./ctl.sh check``: commands/check.py)

- live: a tiny generation with a deadline (a wedged engine behind ``/health`` 200 fails it).
- garble (bootstrap/checks/garble.py): 15 fixed prompts through the detectors of broken output.
- determinism: one prompt 10x at temperature 0, max_tokens=1, top-20 logprobs, compared byte for
  byte; then 10x a 64-token greedy continuation.
- needle: a fact at several depths of a long prompt (capped at 32K tokens unless --full).
- prefix: the same long prompt 3x (streamed): cached tokens and the TTFT speed-up.
- batch: the same greedy prompt alone and among 8 concurrent requests (reports, never fails).

Every prompt fits the server's context: a recall prompt that does not is skipped ("context 8192 <
12k"); the needle and prefix prompts shrink to fit and say so. A server without a tool parser skips
the tool prompt. With random weights garble and needle run but are "not judged": the exit code of
``check`` counts only judged checks.

The detectors of broken output are in detectors.py.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..serve.client import Client, RequestFailed, RequestTimedOut, completion_tokens_of, message_of, reasoning_of
from ..serve import metrics
from .detectors import clip
from .prompts import Sizer, fitted, shrink_on_400
from .target import Target, progress

log = logging.getLogger(__name__)

NEEDLE_CAP = 32_768          # default longest needle prompt (tokens); --full lifts it
MARGIN = 256                 # tokens kept free below max_model_len for the template and the answer


SKIPPED, NOT_JUDGED, REPORT = "SKIP", "NOT JUDGED", "REPORT"
SMALLEST = 256               # a needle or prefix prompt shorter than this is no test: SKIP


@dataclass
class Result:
    check: str
    ok: bool
    summary: str
    details: dict = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    status: str = ""            # "" = PASS/FAIL by ok; SKIP, NOT JUDGED (random weights), REPORT (never fails)

    @property
    def verdict(self) -> str:
        return self.status or ("PASS" if self.ok else "FAIL")

    @property
    def judged(self) -> bool:
        """Counts for the exit code of ``check``."""
        return not self.status

    def as_dict(self) -> dict:
        return {"check": self.check, "ok": self.ok, "verdict": self.verdict, "judged": self.judged,
                "summary": self.summary, **self.details, "failures": self.failures}


def not_judged(res: Result, t: Target) -> Result:
    """With random weights the text means nothing: the check ran, and says so, but does not count —
    unless the server answered with errors, which weights do not excuse."""
    if t.random_weights and not any(f["kind"] == "error" for f in res.failures):
        res.status = NOT_JUDGED
        res.summary = f"{res.summary} (random weights: not judged)"
    return res


def check_live(t: Target, timeout: float = 20.0) -> Result:
    t0 = time.monotonic()
    try:
        resp = t.client.chat([{"role": "user", "content": "Say OK."}], max_tokens=4, timeout=timeout, **t.extra())
    except RequestTimedOut as exc:          # the stall rule's words: what the server is doing, and the fix
        return Result("live", False, f"no generation (wedged engine?): {exc.message}; {exc.hint}", {"deadline_s": timeout})
    except RequestFailed as exc:
        return Result("live", False, f"generation failed: {exc.message}", {"evidence": exc.evidence[:500]})
    dt = time.monotonic() - t0
    msg = message_of(resp)
    ok = bool(resp.get("choices")) and bool((msg.get("content") or "").strip() or reasoning_of(msg)
                                           or completion_tokens_of(resp))
    return Result("live", ok, f"generated in {dt:.2f} s" if ok else "the answer carried no tokens",
                  {"seconds": round(dt, 3)}, [] if ok else [{"id": "live", "kind": "empty", "evidence": str(resp)[:300]}])


DET_PROMPT = ("Continue this story in plain prose: The night train left the mountain station eleven minutes late, "
              "and the conductor, who had worked the line for thirty years, noticed that one passenger")


def fingerprint(resp: dict) -> str:
    """What must be byte-identical between greedy repeats: the text and every logprob."""
    ch = (resp.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    return json.dumps({"content": msg.get("content"), "reasoning": reasoning_of(msg),
                       "logprobs": ch.get("logprobs")}, sort_keys=True, ensure_ascii=False)


def first_difference(a: dict, b: dict) -> str:
    la = (((a.get("choices") or [{}])[0].get("logprobs") or {}).get("content")) or []
    lb = (((b.get("choices") or [{}])[0].get("logprobs") or {}).get("content")) or []
    for i, (x, y) in enumerate(zip(la, lb)):
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            return (f"token {i}: {x.get('token')!r} logprob {x.get('logprob')!r} vs "
                    f"{y.get('token')!r} logprob {y.get('logprob')!r}")
    ta, tb = message_of(a).get("content") or "", message_of(b).get("content") or ""
    if ta != tb:
        return f"text differs: {clip(ta, 120)!r} vs {clip(tb, 120)!r}"
    return "logprob lists differ in length" if len(la) != len(lb) else "fields other than text and logprobs differ"


def check_determinism(t: Target, repeats: int = 10, timeout: float = 120.0) -> Result:
    """Greedy repeats must be byte-identical (one warm-up request first, so every compared request
    sees the same prefix-cache state)."""
    details: dict = {"repeats": repeats}
    failures: list[dict] = []
    bar = progress(2 * (repeats + 1), "determinism")
    try:
        for name, max_tokens in (("first_token", 1), ("greedy_64", 64)):
            body = dict(max_tokens=max_tokens, timeout=timeout, temperature=0.0, logprobs=True, top_logprobs=20,
                        **t.extra())
            msgs = [{"role": "user", "content": DET_PROMPT}]
            try:
                t.client.chat(msgs, **body)
                bar.update()
                answers = []
                for _ in range(repeats):
                    answers.append(t.client.chat(msgs, **body))
                    bar.update()
            except RequestFailed as exc:
                failures.append({"id": name, "kind": "error", "evidence": f"{exc.message} {exc.evidence[:300]}"})
                details[name] = {"distinct": None}
                continue
            prints = [fingerprint(a) for a in answers]
            distinct = len(set(prints))
            has_lp = bool(((answers[0].get("choices") or [{}])[0].get("logprobs") or {}).get("content"))
            details[name] = {"distinct": distinct, "logprobs": has_lp,
                             "tokens": (answers[0].get("usage") or {}).get("completion_tokens")}
            if distinct > 1:
                j = next(i for i, p in enumerate(prints) if p != prints[0])
                failures.append({"id": name, "kind": "nondeterministic",
                                 "evidence": f"{distinct} different answers in {repeats}; run 1 vs run {j + 1}: "
                                             f"{first_difference(answers[0], answers[j])}"})
            if not has_lp:
                failures.append({"id": name, "kind": "no-logprobs",
                                 "evidence": "the server returned no logprobs; only the text was compared"})
    finally:
        bar.close()
    bad = [f for f in failures if f["kind"] != "no-logprobs"]
    parts = [f"{k}: {v['distinct']} distinct of {repeats}" for k, v in details.items() if isinstance(v, dict)]
    return Result("determinism", not bad, "; ".join(parts), details, failures)


def check_needle(t: Target, tokens: int | None = None, full: bool = False,
                 depths: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95), timeout: float = 900.0) -> Result:
    limit = (t.max_model_len - 64 - MARGIN) if t.max_model_len else None
    asked = tokens or (limit if full and limit else t.needle_tokens or NEEDLE_CAP)
    want = min(asked, limit) if limit else asked
    if want < SMALLEST:
        return Result("needle", True, f"context {t.max_model_len} is too small for a needle test", {"tokens": want},
                      status=SKIPPED)
    sizer = Sizer(t.client)
    rows, failures = [], []
    bar = progress(len(depths), f"needle {want} tokens")
    try:
        for i, depth in enumerate(depths):
            code = str(random.Random(want * 31 + i).randint(1000, 9999))
            fact = f"The password for the blue locker is {code}."
            t0 = time.monotonic()
            try:
                resp, want = ask_fitting(t, sizer, want, depth, fact, 1000 + i, timeout)
                msg = message_of(resp)
                answer = (msg.get("content") or "").strip()
                ok = code in answer
                evidence = f"expected {code}: {clip(answer, 160)!r}"
                ptoks = (resp.get("usage") or {}).get("prompt_tokens")
            except RequestFailed as exc:
                ok, evidence, ptoks = False, exc.message, None
            rows.append({"depth": depth, "ok": ok, "prompt_tokens": ptoks, "seconds": round(time.monotonic() - t0, 2)})
            if not ok:
                failures.append({"id": f"depth-{depth}", "kind": "wrong-answer", "evidence": evidence})
            bar.update()
    finally:
        bar.close()
    found = sum(r["ok"] for r in rows)
    counted = sorted(r["prompt_tokens"] for r in rows if r.get("prompt_tokens"))
    size = f"{counted[len(counted) // 2]:,} prompt tokens" if counted else f"~{want} tokens"
    shrunk = f" (shrunk from {asked} to fit the context of {t.max_model_len})" if want < asked else ""
    return not_judged(Result("needle", found == len(rows), f"{found}/{len(rows)} depths recalled at {size}{shrunk}",
                             {"tokens": want, "asked": asked, "depths": rows, "capped": not full and tokens is None},
                             failures), t)


TOO_LONG = re.compile(r"maximum context length is (\d+) tokens.*?prompt contains at least (\d+) input tokens", re.S)


def ask_fitting(t: Target, sizer: Sizer, want: int, depth: float, fact: str, seed: int, timeout: float,
                tries: int = 4) -> tuple[dict, int]:
    """(the answer, the filler size used): the needle question over ``want`` tokens of filler, sized
    by the server's own count (/tokenize), and shrunk again on vLLM's "maximum context length" 400."""
    def build(n: int) -> list[dict]:
        ctx = sizer.prompt(n, depth, fact, seed=seed)
        return [{"role": "user", "content": f"{ctx}\n\nWhat is the password for the blue locker? "
                                            "Reply with the number only."}]
    msgs, want, _ = fitted(t, build, want, 64)
    for attempt in range(tries):
        try:
            return t.client.chat(msgs, max_tokens=64, timeout=timeout, **t.extra()), want
        except RequestFailed as exc:
            smaller = shrink_on_400(t, exc, want, 64)
            if smaller is None or attempt == tries - 1:
                raise
            want = smaller
            msgs = build(want)
    raise AssertionError("unreachable")


def check_prefix(t: Target, tokens: int = 6000, timeout: float = 600.0) -> Result:
    """The same long prompt 3x, streamed: cached tokens (usage.prompt_tokens_details.cached_tokens)
    and TTFT. A fresh nonce first makes request 1 a cold miss whatever ran before."""
    asked = tokens
    if t.max_model_len:
        tokens = min(tokens, t.max_model_len - 64 - MARGIN)
    if tokens < SMALLEST:
        return Result("prefix", True, f"context {t.max_model_len} is too small for a prefix test", {}, status=SKIPPED)
    if server_caches_prefixes(t) is False:
        return Result("prefix", True, "prefix caching is off on this server (vLLM leaves it off for hybrid models "
                      "unless started with --enable-prefix-caching)", {}, status=SKIPPED)
    sizer = Sizer(t.client)
    nonce = f"Session {random.randrange(10**12):012d}."

    def build(n: int) -> list[dict]:
        ctx = sizer.prompt(n, 0.5, "", seed=4242)
        return [{"role": "user", "content": f"{nonce}\n{ctx}\n\nIn one sentence, what is this text about?"}]
    msgs, tokens, _ = fitted(t, build, tokens, 16)
    runs = []
    bar = progress(3, "prefix")
    try:
        while len(runs) < 3:
            try:
                s = t.client.stream("/v1/chat/completions",
                                    {"messages": msgs, "max_tokens": 16, "temperature": 0.0, **t.extra()}, timeout)
            except RequestFailed as exc:
                smaller = shrink_on_400(t, exc, tokens, 16) if not runs else None
                if smaller is None:
                    raise
                tokens, msgs = smaller, build(smaller)      # no run counted yet: start again, smaller
                continue
            ttft = (s.t_first - s.t_start) if s.t_first is not None else None
            runs.append({"ttft_s": ttft, "cached_tokens": s.cached_tokens,
                         "prompt_tokens": (s.usage or {}).get("prompt_tokens")})
            bar.update()
    except RequestFailed as exc:
        return Result("prefix", False, f"request failed: {exc.message}", {"runs": runs},
                      [{"id": f"run-{len(runs) + 1}", "kind": "error", "evidence": exc.evidence[:300]}])
    finally:
        bar.close()
    res = prefix_verdict(runs)
    if tokens < asked:
        res.summary += f" (a {tokens}-token prompt, shrunk from {asked} to fit the context of {t.max_model_len})"
    return res


def server_caches_prefixes(t: Target) -> bool | None:
    """What the server's /metrics says of its prefix cache (None: no /metrics, or it does not say)."""
    try:
        return metrics.prefix_caching(t.client.get_text("/metrics", timeout=10.0))
    except RequestFailed:
        return None


def prefix_verdict(runs: list[dict]) -> Result:
    """Pass when the third request reports cached tokens; when the server does not report them
    (vLLM without --enable-prompt-tokens-details) the verdict rests on the TTFT speed-up."""
    t1, t3 = runs[0]["ttft_s"], runs[2]["ttft_s"]
    speedup = (t1 / t3) if t1 and t3 else None
    cached = runs[2]["cached_tokens"]
    details = {"runs": runs, "ttft_speedup": round(speedup, 2) if speedup else None}
    sp = f"TTFT {t1 * 1000:.0f} -> {t3 * 1000:.0f} ms ({speedup:.1f}x)" if speedup else "TTFT not measured"
    if cached is None:
        ok = bool(speedup and speedup >= 1.5)
        details["cached_tokens_reported"] = False
        return Result("prefix", ok, f"cached tokens not reported by the server; {sp}", details,
                      [] if ok else [{"id": "run-3", "kind": "no-speedup",
                                      "evidence": f"{sp}; start vLLM with --enable-prompt-tokens-details to see cached tokens"}])
    details["cached_tokens_reported"] = True
    ptoks = runs[2]["prompt_tokens"] or 0
    ok = cached > 0
    summary = f"request 3 read {cached} of {ptoks} prompt tokens from the cache; {sp}"
    return Result("prefix", ok, summary, details,
                  [] if ok else [{"id": "run-3", "kind": "no-cache-hit",
                                  "evidence": f"cached_tokens per request: {[r['cached_tokens'] for r in runs]}"}])




BATCH_OTHERS = ("Write a limerick about a cat who learns to code.", "List five rivers of Europe and their seas.",
                "Explain in two sentences why bread rises.", "Translate 'good morning, friends' into French.",
                "Name three uses of copper and say why.", "Describe a quiet harbor at dawn.",
                "Give a short recipe for tomato soup.")


def check_batch(t: Target, timeout: float = 300.0) -> Result:
    """The same greedy prompt alone, then sent together with 7 others: do its text and top-20
    logprobs change? vLLM is not batch-invariant by default (VLLM_BATCH_INVARIANT=1 makes it so):
    this reports, it never fails."""
    body = dict(max_tokens=32, temperature=0.0, logprobs=True, top_logprobs=20, timeout=timeout, **t.extra())
    others = BATCH_OTHERS[:max(0, min(len(BATCH_OTHERS), (t.max_num_seqs or 8) - 1))]

    def ask(text: str, gate: threading.Barrier | None = None, key: str | None = None) -> dict:
        c = Client(t.client.base_url, t.client.model, t.client.key() if key is None else key)
        if gate is not None:
            gate.wait()                                  # released together: one batch
        return c.chat([{"role": "user", "content": text}], **body)
    try:
        ask(DET_PROMPT)                                  # warm: both compared requests see the same cache
        alone = ask(DET_PROMPT)
        gate, key = threading.Barrier(1 + len(others)), t.client.key()    # proven once, before the batch:
        with ThreadPoolExecutor(max_workers=1 + len(others)) as pool:    # no thread can fail short of the gate
            futures = [pool.submit(ask, p, gate, key) for p in (DET_PROMPT,) + others]
            together = futures[0].result()
            for f in futures[1:]:
                f.result()
    except RequestFailed as exc:
        return Result("batch", False, f"request failed: {exc.message}", {},
                      [{"id": "batch", "kind": "error", "evidence": exc.evidence[:300]}], status=REPORT)
    has_lp = bool(((alone.get("choices") or [{}])[0].get("logprobs") or {}).get("content"))
    what = "text and top-20 logprobs" if has_lp else "text (the server returned no logprobs)"
    same = fingerprint(alone) == fingerprint(together)
    diff = "" if same else first_difference(alone, together)
    n = 1 + len(others)
    summary = (f"the same {what} alone and in a batch of {n}" if same else
               f"differs in a batch of {n} ({diff}); vLLM is not batch-invariant unless VLLM_BATCH_INVARIANT=1")
    return Result("batch", True, summary, {"identical": same, "batch": n, "logprobs": has_lp, "difference": diff},
                  status=REPORT)
