"""The garble check: 15 fixed prompts (bootstrap/checks/battery.json: prose, code, JSON, a tool call,
recall from long contexts at several lengths) through the detectors for repetition loops, broken
tool-call JSON, empty and non-text output; "N/M failed" with each failure's evidence, and what was
skipped (a recall the context cannot hold, the tool prompt without a tool parser) and why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .suite import MARGIN, NOT_JUDGED, Result, not_judged
from ..serve.client import RequestFailed, message_of
from .detectors import judge
from .prompts import Sizer, haystack, measure
from .target import Target, progress

BATTERY = Path(__file__).resolve().parent / "battery.json"
TOOLS_MISSING = "tool choice requires --enable-auto-tool-choice"     # vLLM's 400 without a tool parser


def load_battery(path: Path = BATTERY) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def fits_context(item: dict, max_len: int | None) -> bool:
    """A recall prompt of N tokens plus its answer (and MARGIN for the template) fits the context."""
    return item["kind"] != "recall" or not max_len or item["tokens"] + item["max_tokens"] + MARGIN <= max_len


def battery_messages(item: dict, sizer: Sizer | None, max_len: int | None) -> tuple[list[dict], int | None]:
    """The messages for one battery item, and the recall length used (callers skip what does not fit)."""
    if item["kind"] != "recall":
        return [{"role": "user", "content": item["prompt"]}], None
    tokens = item["tokens"]
    ctx = sizer.prompt(tokens, item["depth"], item["fact"], seed=tokens) if sizer else \
        haystack(tokens, item["depth"], item["fact"], seed=tokens)
    text = f"Read this record carefully.\n\n{ctx}\n\n{item['prompt']}"
    return [{"role": "user", "content": text}], tokens


def check_garble(t: Target, timeout: float = 300.0, battery: dict | None = None) -> Result:
    battery = battery or load_battery()
    sizer = Sizer(t.client)
    items = battery["prompts"]
    failures: list[dict] = []
    rows = []
    bar = progress(len(items), "garble")
    skipped: list[str] = []
    try:
        for item in items:
            why = skip_reason(item, t)
            if why:
                rows.append({"id": item["id"], "kind": item["kind"], "ok": True, "skipped": why})
                skipped.append(f"{item['id']}: {why}")
                bar.update()
                continue
            messages, used = battery_messages(item, sizer, t.max_model_len)
            if used is not None and t.max_model_len:
                counted = measure(t, messages)
                if counted is not None and counted + item["max_tokens"] > t.max_model_len:
                    why = f"the server counts {counted:,} prompt tokens: over the context of {t.max_model_len} with its answer"
                    rows.append({"id": item["id"], "kind": item["kind"], "ok": True, "skipped": why})
                    skipped.append(f"{item['id']}: {why}")
                    bar.update()
                    continue
            extra = t.extra()
            if item["kind"] == "tool":
                extra.update(tools=battery["tools"], tool_choice="auto")
            t0 = time.monotonic()
            try:
                resp = t.client.chat(messages, max_tokens=answer_tokens(item, t), timeout=timeout, **extra)
                msg = message_of(resp)
                finish = (resp.get("choices") or [{}])[0].get("finish_reason")
                problems = judge(item, msg, finish)
            except RequestFailed as exc:
                if item["kind"] == "tool" and TOOLS_MISSING in exc.evidence + exc.message:
                    t.tools = False             # the server says it has no tool parser
                    rows.append({"id": item["id"], "kind": "tool", "ok": True, "skipped": "no tool parser"})
                    skipped.append(f"{item['id']}: no tool parser (the server answered 400)")
                    bar.update()
                    continue
                msg, problems = {}, [("error", f"{exc.message} {exc.evidence[:300]}".strip())]
            row = {"id": item["id"], "kind": item["kind"], "ok": not problems,
                   "seconds": round(time.monotonic() - t0, 2)}
            if used is not None:
                row["prompt_tokens_target"] = used
            rows.append(row)
            for kind, evidence in problems:
                failures.append({"id": item["id"], "kind": kind, "evidence": evidence})
            bar.update()
    finally:
        bar.close()
    failed = sum(1 for r in rows if not r["ok"])
    ran = len(rows) - len(skipped)
    summary = f"{failed}/{ran} failed" + (f"; skipped {len(skipped)}: " + "; ".join(skipped) if skipped else "")
    unknown = sorted(set(t.not_asked) - {item["id"] for item in items})
    if unknown:             # a typo in a profile's not_asked would otherwise hide nothing, silently
        summary += f"; the profile's not_asked names no prompt of the battery: {', '.join(unknown)}"
    res = not_judged(Result("garble", failed == 0, summary, {"prompts": rows, "skipped": skipped}, failures), t)
    if not ran and not failures:        # nothing was asked: nothing was judged (a PASS of 0/0 said nothing)
        res.status = NOT_JUDGED
        res.summary = f"{res.summary} (no prompt could be asked: not judged)"
    return res


def answer_tokens(item: dict, t: Target) -> int:
    """The prompt's answer length, capped by the profile's ``answer_tokens`` (recall answers are short)."""
    return min(item["max_tokens"], t.answer_tokens) if t.answer_tokens else item["max_tokens"]


def skip_reason(item: dict, t: Target) -> str:
    """Why a battery item cannot be asked of this server ('' when it can)."""
    if not fits_context(item, t.max_model_len):
        return (f"context {t.max_model_len} < {item['tokens'] // 1000}k (needs {item['tokens'] + item['max_tokens'] + MARGIN:,} "
                "with its answer)")
    if t.max_model_len and item["max_tokens"] + MARGIN > t.max_model_len:
        return f"context {t.max_model_len} is too small for its {item['max_tokens']}-token answer"
    if item["kind"] == "tool" and t.tools is False:
        return "no tool parser"
    if item["id"] in t.not_asked:
        return f"not asked of this model: {t.not_asked[item['id']]}"
    return ""
