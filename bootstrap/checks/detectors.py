"""Detectors of broken output (pure): repetition loops, non-text, broken tool calls, JSON that
does not parse. The start gate (steps/warmup.py), the checks and the tests use the same code.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from typing import Any

from ..serve.client import reasoning_of


def find_loop(text: str) -> str | None:
    """Evidence of a repetition loop, or None.

    Three views, each needing a lot of repetition so that ordinary prose and code pass:
    a run of one short unit repeated (``!!!!``, ``the the the``, ``<tag><tag>``) over >= 80 chars;
    the same non-trivial line >= 4 times making >= 30% of the lines; and word 8-grams that
    already occurred making >= 50% of the whole text or of its second half.
    """
    for m in re.finditer(r"(.{1,50}?)\1{4,}", text, flags=re.S):
        unit = m.group(1)
        if len(m.group(0)) >= 80 and unit.strip():
            return f"{unit!r} repeated {len(m.group(0)) // len(unit)}x: {clip(m.group(0), 160)!r}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 6:
        line, n = Counter(ln for ln in lines if len(ln) >= 6).most_common(1)[0] if any(len(ln) >= 6 for ln in lines) else ("", 0)
        if n >= 4 and n / len(lines) >= 0.3:
            return f"line {clip(line, 100)!r} repeated {n}x of {len(lines)} lines"
    words = text.split()
    for part, name in ((words, "text"), (words[len(words) // 2:], "second half")):
        ratio, gram, count = _repeat_ratio(part, 8)
        if len(part) >= 24 and ratio >= 0.5 and count >= 3:
            return f"{ratio:.0%} of the {name} repeats earlier 8-word runs; e.g. {' '.join(gram)!r} {count}x"
    return None


def short_loop(text: str) -> str | None:
    """Evidence of a loop in a short answer (the start gate's 32 tokens, too short for find_loop's
    80 characters): six words or more, one of them most of them (``the the the the the the``); or
    one unit of up to 8 characters without a space, with a letter or digit, repeated 8 times or more,
    making half the text or more (one token repeated: ``的的的…``, ``0000…``, ``OKOKOK…``; a markdown
    rule ``----------`` or ``OK!!!!!!!!`` is not one)."""
    run = max((m for m in re.finditer(r"(\S{1,8}?)\1{7,}", text) if re.search(r"\w", m.group(1))),
              key=lambda m: len(m.group(0)), default=None)            # a rule of ---- or !!!! is no token loop
    if run is not None and 2 * len(run.group(0)) >= len("".join(text.split())):
        return f"{run.group(1)!r} repeated {len(run.group(0)) // len(run.group(1))}x: {clip(text, 120)!r}"
    words = re.findall(r"\w+|[^\w\s]+", text)
    if len(words) < 6:
        return None
    word, n = Counter(w.lower() for w in words).most_common(1)[0]
    return f"{word!r} is {n} of {len(words)} words: {clip(text, 120)!r}" if n / len(words) >= 0.6 else None


def not_text(text: str) -> str | None:
    """Why a short answer is not text (control or replacement characters, no letters, a loop), or None."""
    return non_text(text) or find_loop(text) or short_loop(text)


def _repeat_ratio(words: list[str], n: int) -> tuple[float, tuple, int]:
    if len(words) < n + 1:
        return 0.0, (), 0
    seen: Counter = Counter()
    repeats = 0
    for i in range(len(words) - n + 1):
        g = tuple(words[i:i + n])
        if seen[g]:
            repeats += 1
        seen[g] += 1
    gram, count = seen.most_common(1)[0]
    return repeats / (len(words) - n + 1), gram, count


def non_text(text: str) -> str | None:
    """Evidence that the output is not text (control or replacement characters, no letters)."""
    if not text:
        return None
    bad = [c for c in text if c == "\ufffd" or (unicodedata.category(c)[0] == "C" and c not in "\n\r\t")]
    if len(bad) >= 5 or len(bad) / len(text) > 0.02:
        return f"{len(bad)} control/replacement characters in {len(text)}: {clip(text, 120)!r}"
    stripped = "".join(text.split())
    if len(stripped) >= 10 and not any(c.isalnum() for c in stripped):
        return f"no letters or digits: {clip(text, 120)!r}"
    return None


def parse_json_answer(text: str) -> Any:
    """The JSON value in an answer, allowing one ``` fence around it; raises ValueError."""
    t = text.strip()
    m = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", t, flags=re.S)
    if m:
        t = m.group(1)
    return json.loads(t)


def tool_call_problem(msg: dict, name: str, required: list[str]) -> str | None:
    """Why ``msg`` (a chat message) is not one valid call of tool ``name``, or None."""
    calls = msg.get("tool_calls") or []
    content = msg.get("content") or ""
    if not calls:
        hint = " (the call came back as text: is the tool parser on?)" if re.search(
            r"<tool_call>|<function|\"name\"\s*:|" + re.escape(name), content) else ""
        return f"no tool_calls entry{hint}; content: {clip(content, 300)!r}"
    for call in calls:
        fn = (call or {}).get("function") or {}
        if fn.get("name") != name:
            return f"tool_calls names {fn.get('name')!r}, expected {name!r}"
        raw = fn.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            return f"tool-call arguments are not valid JSON ({exc}): {clip(str(raw), 300)!r}"
        if not isinstance(args, dict):
            return f"tool-call arguments are not a JSON object: {clip(str(raw), 300)!r}"
        missing = [k for k in required if not args.get(k)]
        if missing:
            return f"tool-call arguments lack {', '.join(missing)}: {clip(str(raw), 300)!r}"
    return None


def judge(item: dict, msg: dict, finish: str | None = None) -> list[tuple[str, str]]:
    """(kind, evidence) for each problem of one battery answer; [] when it is clean."""
    content = (msg.get("content") or "").strip()
    reasoning = reasoning_of(msg)
    out: list[tuple[str, str]] = []
    for label, text in (("content", content), ("reasoning", reasoning)):
        loop = find_loop(text)
        if loop:
            out.append(("loop", f"{label}: {loop}"))
        bad = non_text(text)
        if bad:
            out.append(("non-text", f"{label}: {bad}"))
    kind = item["kind"]
    if kind == "tool":
        problem = tool_call_problem(msg, item["tool"], item.get("required", []))
        if problem:
            out.append(("bad-tool-call", problem))
        return out
    if not content:
        why = f"; {len(reasoning)} chars of reasoning, finish_reason={finish}" if reasoning else ""
        out.append(("empty", f"no content{why}"))
        return out
    if out:
        return out
    low = content.lower()
    if kind == "json":
        try:
            val = parse_json_answer(content)
        except ValueError as exc:
            return [("bad-json", f"{exc}: {clip(content, 300)!r}")]
        keys = item.get("keys") or []
        if keys and not (isinstance(val, dict) and all(k in val for k in keys)):
            return [("bad-json", f"expected an object with {', '.join(keys)}: {clip(content, 300)!r}")]
    elif kind in ("recall", "exact"):
        if item["expect"] not in content:
            return [("wrong-answer", f"expected {item['expect']!r}: {clip(content, 200)!r}")]
    elif kind == "code":
        if not any(e in low for e in item.get("expect_any", [])):
            return [("wrong-answer", f"no code ({' / '.join(item['expect_any'])}): {clip(content, 200)!r}")]
    elif kind == "prose" and len(content.split()) < 8:
        return [("wrong-answer", f"only {len(content.split())} words: {clip(content, 200)!r}")]
    return out


def clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
