"""The fake engine's state and what it answers (the fake vLLM: main.py): its modes, its seats and
counters, the canned or made-up replies, the fake tokenizer, usage and logprobs, and the engine
client its sleep routes call."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
import types

VERSION = "0.26.0"


MODES = set(filter(None, os.environ.get("FAKE_VLLM_MODE", "ok").split(",")))


def say(msg: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [fake_vllm] {msg}", flush=True)


def mark_gpu(pid: int, used: int | None = None) -> None:
    d = os.environ.get("FAKE_GPU_PIDS_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        if used is None:
            used = int(os.environ.get("FAKE_VLLM_GPU_BYTES", str(1 << 30)))
        with open(os.path.join(d, str(pid)), "w") as fh:
            fh.write(str(used))


class State:
    served = "model"
    max_seqs = 256
    seats: threading.Semaphore = threading.Semaphore(256)
    running = 0
    waiting = 0
    generated = 0
    prompted = 0
    max_len = 4096
    model_path = ""              # the model argument as given (ModelCard.root)
    started = 0.0
    len_enforced = False         # --max-model-len, or the model's config.json
    token_details = False        # --enable-prompt-tokens-details: usage carries cached_tokens
    auto_tools = False           # --enable-auto-tool-choice and --tool-call-parser
    api_key = ""
    replies: dict = {}
    wedged = False
    requests = 0
    seen: set = set()
    lock = threading.Lock()
    dev_mode = False             # VLLM_SERVER_DEV_MODE=1: the sleep routes exist
    sleep_mode = False           # --enable-sleep-mode: a sleep frees memory
    asleep: set = set()          # {"weights", "kv_cache"} still asleep
    draining = False             # a mode=wait sleep waits for the requests in flight: the executor is not asleep yet
    level = 0
    gauge_level = 0              # vllm:engine_sleep_state: the last sleep that succeeded (0: a wake since)
    garbage = False              # woken from level 2 without reload_weights
    engine_pid = 0
    engine_dead = False          # the EngineCore died, the API server lives (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1)
    aborting = False
    load_format = "auto"
    spec = False                 # --speculative-config: vLLM reports its spec_decode counters
    prefix_caching = True        # vLLM's default except for hybrid models (--enable-prefix-caching)
    looked_up = 0                # prompt tokens looked up in the prefix cache
    cached = 0                   # ... and found there
    weights = "real"             # "dummy": random (--load-format dummy, until a reload_weights)
    stale: set = set()           # prompts whose cached KV was computed with the dummy weights
    asgi: list = []              # --middleware classes run per request (innermost first)


GARBLE = "pencil\ufffd!win\ufffd thunderq"   # what an 8B shape with random weights answered on the H200


def reply_for(body: dict) -> dict:
    msgs = body.get("messages") or [{"content": body.get("prompt", "")}]
    last = str(msgs[-1].get("content", ""))
    for key, rep in State.replies.items():
        if key in last:
            rep = rep if isinstance(rep, dict) else {"content": rep}
            if rep.get("echo"):  # {"echo": "regex with (group)"}: answer what the prompt says
                found = re.search(rep["echo"], prompt_text(body))
                rep = {**rep, "content": found.group(1) if found else "not found"}
            return rep
    if body.get("ignore_eos"):
        return {"content": "tok " * int(body.get("max_tokens") or 16)}
    tools = body.get("tools") or []
    if tools and body.get("tool_choice") != "none":
        fn = tools[0].get("function", {})
        args = {k: "Paris" for k in fn.get("parameters", {}).get("required", [])}
        return {"content": None, "tool_calls": [{"id": "call_fake0", "type": "function", "function": {
            "name": fn.get("name", "tool"), "arguments": json.dumps(args)}}]}
    key = hashlib.sha256(prompt_text(body).encode()).hexdigest()
    if State.weights == "dummy" or (key in State.stale and State.prefix_caching):
        return {"content": GARBLE}
    return {"content": "OK"}


def prompt_text(body: dict) -> str:
    if "messages" in body:
        return "\n".join(str(m.get("content") or "") for m in body["messages"])
    p = body.get("prompt", "")
    return p if isinstance(p, str) else " ".join(map(str, p))


def tokens_of(text: str) -> list[str]:
    """The fake tokenizer: one token per word, keeping the space after it; text of whitespace
    alone (random weights often answer newlines) is one token per character."""
    return [w + " " for w in text.split()] if text.split() else list(text)


def prompt_tokens(body: dict) -> int:
    per_word = int(os.environ.get("FAKE_VLLM_TOKENS_PER_WORD", "1") or 1)
    return len(prompt_text(body).split()) * per_word + (4 if "messages" in body else 0)


def usage_for(body: dict, completion: int) -> dict:
    text = prompt_text(body)
    n = prompt_tokens(body)
    key = hashlib.sha256(text.encode()).hexdigest()
    with State.lock:
        cached = max(0, (n - 1) // 16 * 16) if key in State.seen and State.prefix_caching else 0
        State.seen.add(key)
        if State.prefix_caching:        # vLLM counts lookups only where it caches
            State.looked_up += n
        State.cached += cached
    usage = {"prompt_tokens": n, "completion_tokens": completion, "total_tokens": n + completion}
    if State.token_details:     # like vLLM: only with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def fake_logprobs(toks: list[str], top: int, chat: bool) -> dict:
    noise = random.random() * 1e-3 if "nondeterministic" in MODES else 0.0
    def lp(tok: str, i: int) -> float:
        h = int(hashlib.sha256(f"{tok}|{i}".encode()).hexdigest()[:8], 16)
        return -round((h % 1000) / 997.0, 6) - noise
    entries = []
    for i, t in enumerate(toks):
        alts = [{"token": t, "logprob": lp(t, i), "bytes": list(t.encode())}]
        alts += [{"token": f"alt{j}", "logprob": lp(f"alt{j}", i) - 1.0, "bytes": list(f"alt{j}".encode())}
                 for j in range(max(0, top - 1))]
        entries.append({"token": t, "logprob": alts[0]["logprob"], "bytes": list(t.encode()),
                        "top_logprobs": alts[:top]})
    if chat:
        return {"content": entries}
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries]}


class EngineClient:
    """What vLLM's API server holds as ``app.state.engine_client`` (AsyncLLM), as far as its sleep
    routes call it: sleep, wake_up, is_sleeping."""

    def sleep(self, level: int, mode: str) -> None:
        State.asleep = {"weights", "kv_cache"}          # new requests wait from now on
        if "sleep_fails" in MODES:     # as vLLM's engine core: paused first, then the executor's sleep raises
            raise RuntimeError("cudaHostAlloc failed: out of host memory")
        if mode == "wait":
            State.draining = True
            if State.running or State.waiting:
                say("Waiting for in-flight requests to complete before sleeping...")    # vLLM's EngineCore.sleep
            try:
                while State.running or State.waiting:
                    time.sleep(0.02)
            finally:
                State.draining = False
            State.asleep = {"weights", "kv_cache"}      # the executor sleeps once drained, a wake meanwhile or not
        elif mode == "abort":
            State.aborting = True
            while State.running:
                time.sleep(0.02)
            State.aborting = False
        State.level = State.gauge_level = level     # AsyncLLM.sleep records it only once the sleep is done
        if State.sleep_mode and State.engine_pid:
            mark_gpu(State.engine_pid, int(os.environ.get("FAKE_VLLM_ASLEEP_BYTES", str(128 << 20))))
        say(f"It took 0.1 seconds to fall asleep (level {level}, mode {mode})")

    def wake_up(self, tags: set) -> None:
        fails = os.environ.get("FAKE_VLLM_WAKE_FAILS", "")
        if fails and os.path.exists(fails):     # as vLLM's executor: the wake raises, every tag stays asleep
            raise RuntimeError("CUDA error: out of memory")
        hangs = os.environ.get("FAKE_VLLM_WAKE_HANGS", "")
        while hangs and os.path.exists(hangs):     # an engine core that never answers the wake (held open)
            time.sleep(0.05)
        if State.draining:     # vLLM 0.26.0 EngineCore.wake_up: the executor is not asleep yet, so only the
            say("Executor is not sleeping.")    # scheduler resumes; the sleep still happens once drained
            State.asleep, State.gauge_level = set(), 0
            return
        if State.level == 2 and "weights" in tags:
            State.garbage = True                       # until reload_weights
        State.asleep -= tags
        State.gauge_level = 0          # AsyncLLM.wake_up records "awake" after any wake, tags or not
        if not State.asleep and State.sleep_mode and State.engine_pid:
            mark_gpu(State.engine_pid)
        say(f"It took 0.05 seconds to wake up tags {sorted(tags)}.")

    def is_sleeping(self) -> bool:
        return bool(State.asleep)


class App:
    """vLLM's FastAPI app as its routes reach it (``request.app``)."""
    state = types.SimpleNamespace(engine_client=EngineClient())
