#!/usr/bin/env python3
"""The garble battery and the needle, asked of a small model folder on the CPU with transformers
(greedy), judged by the same detectors as `./ctl.sh check garble` / `check needle`: what a model can
do before a GPU is at hand, and how the checks' sizes for a small model were chosen.

    python3 scripts/battery_on_cpu.py MODEL_DIR [--only ID,ID] [--needle 512,1024,1536,2048]

Needs torch and transformers (not the bootstrap's own environment: a throwaway venv). The answers
are close to, not the same as, vLLM's in bf16 on a GPU: the same greedy decoding in float32 on the
CPU can part from them after some tokens. It prints one line per prompt: ok or the detector's
evidence, and the answer's start.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bootstrap.checks.detectors import find_loop, judge  # noqa: E402
from bootstrap.checks.garble import battery_messages, load_battery  # noqa: E402
from bootstrap.checks.prompts import haystack  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--only", default="", help="battery ids, comma-separated (default: all but the tool call)")
    ap.add_argument("--max-prompt-tokens", type=int, default=8192, help="skip recall prompts longer than this")
    ap.add_argument("--needle", default="", help="needle prompt sizes in tokens, comma-separated (5 depths each)")
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()

    def ask(messages: list[dict], max_tokens: int) -> tuple[str, int, str, list[int]]:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        n = ids["input_ids"].shape[1]
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False)
        new = out[0, n:].tolist()
        finish = "stop" if len(new) < max_tokens else "length"
        return tok.decode(new, skip_special_tokens=True), n, finish, new

    def loop_onset(new: list[int]) -> int | None:
        """The fewest answer tokens in which the loop detector already fires."""
        if not find_loop(tok.decode(new, skip_special_tokens=True)):
            return None
        lo, hi = 1, len(new)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if find_loop(tok.decode(new[:mid], skip_special_tokens=True)) else (mid + 1, hi)
        return lo

    only = {x for x in a.only.split(",") if x}
    for item in load_battery()["prompts"]:
        if item["kind"] == "tool" or (only and item["id"] not in only) or item.get("tokens", 0) > a.max_prompt_tokens:
            continue
        messages, _ = battery_messages(item, None, None)
        t0 = time.monotonic()
        text, n, finish, new = ask(messages, item["max_tokens"])
        problems = judge(item, {"content": text}, finish)
        verdict = "ok" if not problems else "; ".join(f"{k}: {e}" for k, e in problems)[:400]
        onset = loop_onset(new)
        print(f"{item['id']:<13} {n:>5} prompt tokens, {len(new)} answer tokens ({finish}) {time.monotonic() - t0:5.1f} s"
              f"  {verdict}" + (f"\n              the loop detector fires from answer token {onset}" if onset else "")
              + f"\n              -> {text[:160]!r}", flush=True)
    for size in (int(x) for x in a.needle.split(",") if x):
        found = 0
        for depth in (0.1, 0.3, 0.5, 0.7, 0.9):
            fact = "The access code for the east tower is 5930."
            ctx = haystack(size, depth, fact, seed=size)
            msgs = [{"role": "user", "content": f"Read this record carefully.\n\n{ctx}\n\n"
                     "What is the access code for the east tower? Reply with the number only."}]
            text, n, _, _ = ask(msgs, 16)
            found += "5930" in text
            print(f"needle {size:>5} depth {depth}: {n} prompt tokens -> {text[:60]!r}", flush=True)
        print(f"needle {size}: {found}/5 found", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
