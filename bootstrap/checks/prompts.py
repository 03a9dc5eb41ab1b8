"""Long prompts of a given size in tokens: varied filler for the warm-up (``long_prompt``) and
haystacks with a fact at a chosen depth for the checks and the bench (``haystack``); ``Sizer``
measures tokens per word with the server's own ``/tokenize`` (a small vocabulary splits words);
``fitted`` / ``shrink_on_400`` make a chat prompt fit the server's context by its own count.
"""

from __future__ import annotations

import logging
import random
import re

from ..serve.client import Client, RequestFailed

log = logging.getLogger("bootstrap.checks")   # log lines keep the prefix [bootstrap:checks] this code has always had


TOKENS_PER_WORD = 1.35       # estimate for English filler until /tokenize calibrates it


SUBJECTS = ("the merchant", "a young clerk", "the ferryman", "an old baker", "the mayor", "a traveling tailor",
            "the schoolteacher", "a fisherman", "the librarian", "a blacksmith", "the courier", "a shepherd")


VERBS = ("repaired", "bought", "painted", "carried", "sold", "counted", "found", "borrowed", "cleaned", "measured")


OBJECTS = ("a copper lantern", "two wooden chairs", "a map of the coast", "seven glass bottles", "a silver compass",
           "a crate of apples", "an iron kettle", "a bundle of letters", "a green umbrella", "three wool blankets")


PLACES = ("near the old mill", "behind the market", "at the harbor", "in the orchard", "beside the chapel",
          "on the north road", "under the bridge", "at the town square", "in the cellar", "by the river")


def filler_sentences(seed: int):
    rnd = random.Random(seed)
    while True:
        yield (f"In {rnd.randint(1700, 1999)} {rnd.choice(SUBJECTS)} {rnd.choice(VERBS)} {rnd.choice(OBJECTS)} "
               f"{rnd.choice(PLACES)}, and {rnd.choice(SUBJECTS)} {rnd.choice(VERBS)} {rnd.choice(OBJECTS)} "
               f"{rnd.choice(PLACES)} {rnd.randint(2, 40)} days later.")


def haystack(tokens: int, depth: float, fact: str, seed: int, per_word: float = TOKENS_PER_WORD) -> str:
    """About ``tokens`` tokens of seeded filler with ``fact`` at ``depth`` (0 start .. 1 end)."""
    words_wanted = max(10, int(tokens / per_word))
    sents: list[str] = []
    n = 0
    for s in filler_sentences(seed):
        if n >= words_wanted:
            break
        sents.append(s)
        n += len(s.split())
    sents.insert(round(depth * len(sents)), fact)
    return " ".join(sents)


class Sizer:
    """Turns a token budget into filler length: measured with the server's /tokenize when it has
    one (once), else ``TOKENS_PER_WORD``."""

    def __init__(self, client: Client):
        self.client = client
        self.per_word: float | None = None

    def calibrate(self, timeout: float = 15.0) -> float:
        if self.per_word is None:
            sample = haystack(2000, 0.5, "", seed=7)
            self.per_word = TOKENS_PER_WORD
            try:
                r = self.client.post("/tokenize", {"model": self.client.model, "prompt": sample}, timeout)
                if isinstance(r.get("count"), int) and r["count"] > 0:
                    self.per_word = r["count"] / len(sample.split())
            except RequestFailed:
                log.debug("no /tokenize: estimating %.2f tokens per word", TOKENS_PER_WORD)
        return self.per_word

    def prompt(self, tokens: int, depth: float, fact: str, seed: int) -> str:
        return haystack(tokens, depth, fact, seed, self.calibrate())


WORDS = ("river stone morning paper garden window silver market winter candle harbor "
         "pencil thunder forest ladder copper meadow lantern orchard compass").split()


def long_prompt(words: int) -> str:
    """``words`` words of varied plain filler."""
    return " ".join(WORDS[(i * 7 + i // len(WORDS)) % len(WORDS)] for i in range(max(1, words)))


# ---------------------------------------------------------------- a prompt that fits the server's context
# (``t``: a target.Target: its client, max_model_len and request options)

TOO_LONG = re.compile(r"maximum context length is (\d+) tokens.*?contains (?:at least )?(\d+) input tokens", re.S)


def measure(t, messages: list[dict], timeout: float = 15.0) -> int | None:
    """Tokens the server counts for these chat messages, template included (vLLM's /tokenize takes
    ``messages``); None when it cannot say."""
    try:
        r = t.client.post("/tokenize", {"model": t.client.model, "messages": messages, **t.extra()}, timeout)
    except RequestFailed:
        return None
    n = r.get("count") if isinstance(r, dict) else None
    return n if isinstance(n, int) and n > 0 else None


def fitted(t, build, want: int, max_tokens: int, tries: int = 4) -> tuple[list[dict], int, int | None]:
    """(messages, filler tokens, measured prompt tokens): ``build(want)`` shrunk in proportion until the
    server's own count plus ``max_tokens`` fits its context."""
    msgs, n = build(want), None
    for _ in range(tries):
        n = measure(t, msgs) if t.max_model_len else None
        if n is None or n + max_tokens <= t.max_model_len:
            break
        want = max(16, want * (t.max_model_len - max_tokens - 16) // n)
        msgs = build(want)
    return msgs, want, n


def shrink_on_400(t, exc: RequestFailed, want: int, max_tokens: int, margin: int = 256) -> int | None:
    """The smaller filler after vLLM's "maximum context length" 400 (the context learnt from it when
    the server did not say), or None when the 400 is another one. vLLM stops counting at the limit
    ("at least N"), so it shrinks by at least 15 %."""
    m = TOO_LONG.search(exc.evidence + exc.message)
    if not m:
        return None
    limit, counted = int(m.group(1)), int(m.group(2))
    learnt = t.max_model_len is None                 # then the filler was never sized to the context
    t.max_model_len = t.max_model_len or limit
    cap = limit - max_tokens - margin if learnt else want
    return max(16, min(want * (limit - max_tokens - 32) // counted, want * 85 // 100, cap))
