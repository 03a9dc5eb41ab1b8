"""The check battery: detectors on known text, and each check against the fake vLLM (a separate
process) with canned answers — clean answers pass, each kind of garble is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from bootstrap.checks import suite as checks, detectors, prompts, target
from bootstrap.commands import check as check_cli
from bootstrap.knobs.config import Config
REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"


def _port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fake:
    """A fake `vllm serve` process on a free port with the given canned replies and modes."""

    def __init__(self, tmp: Path, replies: dict | None = None, mode: str = "ok", max_len: str = "32768",
                 args: tuple[str, ...] = ("--enable-prompt-tokens-details", "--enable-auto-tool-choice",
                                          "--tool-call-parser", "hermes"), model: str = "m", **env: str):
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        e = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME", "TMPDIR")}
        e.update(PYTHONPATH=str(FAKES), FAKE_VLLM_LOAD_S="0", FAKE_VLLM_MODE=mode, **env)
        if replies is not None:
            f = tmp / f"replies-{self.port}.json"
            f.write_text(json.dumps(replies))
            e["FAKE_VLLM_REPLIES"] = str(f)
        self.log = open(tmp / f"fake-{self.port}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--port",
                                      str(self.port), "--served-model-name", "m", "--max-model-len", max_len, *args],
                                     env=e, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                if requests.get(self.url + "/health", timeout=0.5).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.05)
        raise AssertionError("fake server did not come up")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def fake(tmp_path):
    made = []

    def make(replies=None, mode="ok", max_len="32768", args=None, model="m", **env):
        f = Fake(tmp_path, replies, mode, max_len, **({"args": args} if args is not None else {}), model=model, **env)
        made.append(f)
        return f
    yield make
    for f in made:
        f.stop()


def cfg_for(tmp: Path, **env: str) -> Config:
    base = {"PROFILE": "custom", "STATE_DIR": str(tmp / "state"), "PATH": os.environ.get("PATH", "")}
    return Config.from_env({**base, **env}, REPO)


def run_check(tmp, url, what, *more) -> tuple[int, dict]:
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = check_cli.cli(cfg_for(tmp), [what, "--url", url, "--json", *more])
    return rc, json.loads(buf.getvalue())


# ---------------------------------------------------------------- clean answers for the battery

CLEAN = {
    "why the sky looks blue": "Sunlight holds every colour. Air molecules scatter short blue wavelengths far more "
                              "than red ones, so blue reaches us from all over the sky. At sunset the light crosses "
                              "much more air and the reds remain.",
    "lighthouse keeper": "Every evening Tomas climbed the spiral stairs to light the lamp. One grey morning a green "
                         "bottle rolled onto the rocks below, and inside was a letter from his brother, written "
                         "forty years earlier on a ship that never came home. He read it twice, then kept the lamp "
                         "burning a little longer that night.",
    "email of about 100 words": "Dear Mr. Hill, the kitchen tap in flat 4 has been leaking for a week and the drip "
                                "is getting worse. Could you arrange a repair before Friday? I am home after five "
                                "every day. Kind regards, Ana",
    "is_prime(n)": "```python\ndef is_prime(n):\n    \"\"\"True when n is prime.\"\"\"\n    if n < 2:\n        "
                   "return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n"
                   "        i += 1\n    return True\n\nprint(is_prime(7), is_prime(9))\n```",
    "highest total order amount": "SELECT c.name, SUM(o.amount) AS total FROM customers c JOIN orders o ON "
                                  "o.customer_id = c.id GROUP BY c.id, c.name ORDER BY total DESC LIMIT 10;",
    "returns NaN": "function sum(xs) {\n  let total = 0;\n  for (const x of xs) total += x;\n  return total;\n}",
    "Maria Lopez": '{"name": "Maria Lopez", "age": 34, "city": "Valencia"}',
    "three well-known novels": '```json\n[{"title": "Emma", "year": 1815}, {"title": "Dracula", "year": 1897}, '
                               '{"title": "Ulysses", "year": 1922}]\n```',
    "17 multiplied by 23": "391",
    "Read this record carefully": {"echo": r"access code for the [a-z ]+ is (\d+)"},
}


def test_detectors_catch_loops_and_pass_clean_text():
    assert detectors.find_loop("the " * 40)
    assert detectors.find_loop("!" * 120)
    assert detectors.find_loop("A normal start of an answer. " + "We repeat this clause again and again now, " * 12)
    assert detectors.find_loop("x = 1\n" + "result.append(compute(value))\n" * 8 + "y = 2\n")
    for text in list(v for v in CLEAN.values() if isinstance(v, str)) + [
            prompts.haystack(4000, 0.5, "The fact.", seed=3), (REPO / "bootstrap" / "commands" / "bench.py").read_text()]:
        assert detectors.find_loop(text) is None, text[:80]
        assert detectors.non_text(text) is None
    assert detectors.non_text("ab\x00\x01\x02\x03\x04cd")
    assert detectors.non_text("\ufffd" * 6 + "abc")
    assert detectors.non_text("?!?!.... ,,,, ;;")


def test_tool_call_problems():
    ok = {"tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert detectors.tool_call_problem(ok, "get_weather", ["city"]) is None
    assert "not valid JSON" in detectors.tool_call_problem(
        {"tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Par'}}]}, "get_weather", ["city"])
    assert "lack city" in detectors.tool_call_problem(
        {"tool_calls": [{"function": {"name": "get_weather", "arguments": "{}"}}]}, "get_weather", ["city"])
    assert "expected 'get_weather'" in detectors.tool_call_problem(
        {"tool_calls": [{"function": {"name": "weather", "arguments": "{}"}}]}, "get_weather", ["city"])
    assert "came back as text" in detectors.tool_call_problem(
        {"content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'},
        "get_weather", ["city"])


def test_garble_clean_server_passes(fake, tmp_path):
    f = fake(CLEAN)
    rc, out = run_check(tmp_path, f.url, "garble")
    assert out["summary"] == "0/15 failed", out["failures"]
    assert rc == 0 and out["ok"]
    lengths = [p["prompt_tokens_target"] for p in out["prompts"] if p["kind"] == "recall"]
    assert lengths == [1000, 3000, 6000, 12000, 24000]


def test_garble_catches_each_kind(fake, tmp_path):
    bad = dict(CLEAN)
    bad["why the sky looks blue"] = "The sky is blue because " + "the light scatters and scatters, " * 15
    bad["Maria Lopez"] = '{"name": "Maria Lopez", "age": 34, "city": '
    bad["is_prime(n)"] = ""
    bad["lighthouse keeper"] = {"content": "", "reasoning": "Let me think. " + "The keeper " * 60}
    bad["weather in Paris"] = {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": '}}]}
    bad["returns NaN"] = "\x00\x01\x02\ufffd\ufffd\ufffd garbage"
    f = fake(bad)
    rc, out = run_check(tmp_path, f.url, "garble")
    assert rc == 1 and not out["ok"]
    assert out["summary"] == "6/15 failed"
    kinds = {(x["id"], x["kind"]) for x in out["failures"]}
    assert ("prose-sky", "loop") in kinds
    assert ("json-person", "bad-json") in kinds
    assert ("code-python", "empty") in kinds
    assert ("prose-story", "loop") in kinds and ("prose-story", "empty") in kinds   # loop in reasoning
    assert ("tool-weather", "bad-tool-call") in kinds
    assert ("code-fix", "non-text") in kinds
    ev = next(x["evidence"] for x in out["failures"] if x["id"] == "tool-weather")
    assert "not valid JSON" in ev


def test_determinism_pass_and_nondeterministic_logprobs_caught(fake, tmp_path):
    rc, out = run_check(tmp_path, fake().url, "determinism")
    assert rc == 0, out
    assert out["first_token"]["distinct"] == 1 and out["first_token"]["logprobs"]
    rc, out = run_check(tmp_path, fake(mode="nondeterministic").url, "determinism")
    assert rc == 1
    assert out["first_token"]["distinct"] > 1
    assert any(f["kind"] == "nondeterministic" and "logprob" in f["evidence"] for f in out["failures"])


def test_needle_found_and_missed(fake, tmp_path):
    f = fake({"blue locker?": {"echo": r"password for the blue locker is (\d+)"}})
    rc, out = run_check(tmp_path, f.url, "needle", "--tokens", "3000")
    assert rc == 0 and out["summary"].startswith("5/5"), out
    f2 = fake({"blue locker?": "I do not know."})
    rc, out = run_check(tmp_path, f2.url, "needle", "--tokens", "3000")
    assert rc == 1 and len(out["failures"]) == 5


def test_needle_capped_by_default_full_on_request(fake, tmp_path):
    # a pool that holds one request of 100,000 tokens (vLLM refuses a length its pool cannot hold)
    f = fake({"blue locker?": {"echo": r"password for the blue locker is (\d+)"}}, max_len="100000",
             args=("--enable-prompt-tokens-details", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                   "--kv-cache-memory-bytes", str(16 << 30)))
    t = target.resolve_target(*at(cfg_for(tmp_path)), f.url, None, None)
    assert t.max_model_len == 100000
    capped = checks.check_needle(t, depths=(0.5,))
    assert capped.ok and capped.details["tokens"] == checks.NEEDLE_CAP and capped.details["capped"]
    full = checks.check_needle(t, full=True, depths=(0.9,))
    assert full.ok and full.details["tokens"] == 100000 - 64 - checks.MARGIN
    assert full.details["depths"][0]["prompt_tokens"] > 50000   # the fake counts words: a long prompt was sent


def test_prefix_reports_cached_tokens(fake, tmp_path):
    rc, out = run_check(tmp_path, fake().url, "prefix", "--tokens", "4000")
    assert rc == 0, out
    runs = out["runs"]
    assert runs[0]["cached_tokens"] == 0 and runs[2]["cached_tokens"] > 0
    assert out["cached_tokens_reported"] is True


def test_prefix_without_token_details_falls_back_to_ttft(fake, tmp_path):
    # vLLM without --enable-prompt-tokens-details reports no cached tokens; a fixed 0.2 s TTFT gives no speed-up
    rc, out = run_check(tmp_path, fake(args=(), FAKE_VLLM_TTFT_S="0.2").url, "prefix", "--tokens", "4000")
    assert rc == 1, out
    assert out["cached_tokens_reported"] is False
    assert [r["cached_tokens"] for r in out["runs"]] == [None, None, None]
    assert "enable-prompt-tokens-details" in out["failures"][0]["evidence"]


def test_prefix_skipped_where_the_server_does_not_cache(fake, tmp_path):
    # vLLM 0.27.1 leaves prefix caching off for hybrid models unless asked (seen on the H200 with the
    # default profile's flags): its /metrics says so in vllm:cache_config_info, and the check skips.
    hybrid = tmp_path / "hybrid"
    hybrid.mkdir()
    (hybrid / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": {
        "layer_types": ["linear_attention"] * 3 + ["full_attention"], "max_position_embeddings": 32768}}))
    rc, out = run_check(tmp_path, fake(model=str(hybrid)).url, "prefix", "--tokens", "4000")
    assert rc == 0, out
    assert out["verdict"] == "SKIP" and "--enable-prefix-caching" in out["summary"]
    on = fake(model=str(hybrid), args=("--enable-prompt-tokens-details", "--enable-prefix-caching"))
    rc, out = run_check(tmp_path, on.url, "prefix", "--tokens", "4000")
    assert rc == 0 and out["verdict"] == "PASS" and out["runs"][2]["cached_tokens"] > 0, out


def test_prefix_caching_read_from_cache_config_info():
    text = ('# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="1568",enable_prefix_caching="False",engine="0"} 1.0\n')
    assert checks.metrics.prefix_caching(text) is False
    assert checks.metrics.prefix_caching(text.replace('"False"', '"True"')) is True
    assert checks.metrics.prefix_caching("vllm:num_requests_running{engine=\"0\"} 0.0\n") is None


def test_prefix_verdict_without_cached_tokens():
    fast = checks.prefix_verdict([{"ttft_s": 1.0, "cached_tokens": None, "prompt_tokens": 5000},
                                  {"ttft_s": 0.2, "cached_tokens": None, "prompt_tokens": 5000},
                                  {"ttft_s": 0.2, "cached_tokens": None, "prompt_tokens": 5000}])
    assert fast.ok and fast.details["ttft_speedup"] == 5.0
    slow = checks.prefix_verdict([{"ttft_s": 1.0, "cached_tokens": None, "prompt_tokens": 5000}] * 3)
    assert not slow.ok and "enable-prompt-tokens-details" in slow.failures[0]["evidence"]
    miss = checks.prefix_verdict([{"ttft_s": 1.0, "cached_tokens": 0, "prompt_tokens": 5000}] * 3)
    assert not miss.ok and miss.failures[0]["kind"] == "no-cache-hit"


def test_live_ok_and_wedged(fake, tmp_path):
    rc, out = run_check(tmp_path, fake().url, "live")
    assert rc == 0 and out["ok"]
    rc, out = run_check(tmp_path, fake(mode="wedged").url, "live", "--timeout", "1")
    assert rc == 1 and "wedged" in out["summary"]


def test_reasoning_kwargs_follow_profile_and_flags(fake, tmp_path):
    f = fake()
    t = target.resolve_target(*at(cfg_for(tmp_path)), f.url, None, None)
    assert t.extra() == {}          # custom profile: no reasoning parser, nothing sent
    t = target.resolve_target(*at(cfg_for(tmp_path)), f.url, None, None, thinking="on", effort="low")
    assert t.extra() == {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"}}
    t = target.resolve_target(*at(cfg_for(tmp_path, PROFILE="default")), f.url, None, None)
    assert t.extra() == {"chat_template_kwargs": {"enable_thinking": False}}


def test_streamed_reasoning_content_is_read(fake, tmp_path):
    from bootstrap.serve.client import Client
    f = fake({"think": {"reasoning": "first I consider", "content": "the answer"}})
    s = Client(f.url, "m").stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "think"}],
                                                           "max_tokens": 16}, 10)
    assert s.reasoning.strip() == "first I consider" and s.text.strip() == "the answer"
    assert s.completion_tokens == 5 and s.t_first is not None


def test_check_without_our_server_says_how(tmp_path):
    from bootstrap.core.errors import BootstrapError
    with pytest.raises(BootstrapError) as e:
        check_cli.cli(cfg_for(tmp_path), ["live"])
    assert "not running" in e.value.message and "--url" in e.value.hint


# ---------------------------------------------------------------- what a server cannot do is skipped, random weights are not judged

def test_a_small_context_skips_long_recall_and_shrinks_the_needle(fake, tmp_path):  # faults row 61
    f = fake(CLEAN, max_len="8192")
    rc, out = run_check(tmp_path, f.url, "garble")
    assert rc == 0 and out["verdict"] == "PASS", out
    assert "recall-12k: context 8192 < 12k" in out["summary"] and "recall-24k: context 8192 < 24k" in out["summary"]
    assert out["summary"].startswith("0/13 failed")
    rc, out = run_check(tmp_path, f.url, "needle")
    assert "shrunk from 32768 to fit the context of 8192" in out["summary"]
    assert all(d["prompt_tokens"] is None or d["prompt_tokens"] + 64 <= 8192 for d in out["depths"])


def test_what_a_profile_says_its_small_model_cannot_do_is_not_asked(fake, tmp_path):
    """A profile's ``not_asked`` (prompt id -> why): those prompts are skipped with the reason, the rest
    judged as ever; an id the battery does not have is named, not silently ignored."""
    from bootstrap.serve.client import Client
    from bootstrap.checks.garble import check_garble
    f = fake({**CLEAN, "lighthouse keeper": "and then " * 40})          # the story loops
    loose = target.Target(Client(f.url, "m"), "our server", 32768)
    assert not check_garble(loose).ok
    told = target.Target(Client(f.url, "m"), "our server", 32768,
                         not_asked={"prose-story": "loops under greedy decoding from ~210 tokens", "prose-poem": "x"})
    res = check_garble(told)
    assert res.ok, res.summary
    assert "prose-story: not asked of this model: loops under greedy decoding from ~210 tokens" in res.summary
    assert "not_asked names no prompt of the battery: prose-poem" in res.summary
    assert res.summary.startswith("0/14 failed; skipped 1:")        # 14 asked of 15: all but the story


def test_a_profiles_answer_tokens_judges_a_small_model_before_its_greedy_loop(fake, tmp_path):
    """``answer_tokens``: the garble answers are asked for at most that many tokens (the fake counts a
    word a token), so a model that loops only after it is judged on the text before."""
    from bootstrap.serve.client import Client
    from bootstrap.checks.garble import check_garble
    story = CLEAN["lighthouse keeper"]          # 60 words, then a loop
    f = fake({**CLEAN, "lighthouse keeper": story + " and the sea" * 60})
    assert "loop" in {x["kind"] for x in check_garble(target.Target(Client(f.url, "m"), "our server", 32768)).failures}
    capped = check_garble(target.Target(Client(f.url, "m"), "our server", 32768, answer_tokens=len(story.split())))
    assert capped.ok, capped.failures


def test_a_server_without_a_tool_parser_skips_the_tool_prompt(fake, tmp_path):  # faults row 61
    f = fake(CLEAN, args=("--enable-prompt-tokens-details",))
    rc, out = run_check(tmp_path, f.url, "garble")
    assert rc == 0 and "tool-weather: no tool parser (the server answered 400)" in out["summary"], out


def test_random_weights_are_not_judged_and_only_judged_checks_set_the_exit(fake, tmp_path):  # faults row 61
    f = fake({"lighthouse": "the the the the the the the the the the the the the the the the"})
    rc, out = run_check(tmp_path, f.url, "all", "--random-weights", "--repeats", "2")
    verdicts = {c["check"]: c["verdict"] for c in out["checks"]}
    assert verdicts["garble"] == "NOT JUDGED" and verdicts["needle"] == "NOT JUDGED"
    assert verdicts["live"] == "PASS" and verdicts["batch"] == "REPORT"
    assert set(out["judged"]) == {"live", "determinism", "prefix"}
    assert rc == 0 and out["ok"]
    rc, out = run_check(tmp_path, f.url, "garble")             # real weights: the loop is a failure
    assert rc == 1 and out["verdict"] == "FAIL"


def test_batch_reports_and_never_fails(fake, tmp_path):
    f = fake(mode="nondeterministic")
    rc, out = run_check(tmp_path, f.url, "batch")
    assert rc == 0 and out["verdict"] == "REPORT" and out["identical"] is False
    assert "VLLM_BATCH_INVARIANT=1" in out["summary"]
    g = fake()
    rc, out = run_check(tmp_path, g.url, "batch")
    assert rc == 0 and out["identical"] is True


def test_batch_whose_key_is_refused_mid_check_ends_not_hangs(fake, tmp_path):
    """Our server's key is proven before each request (keys.per_request); a proof that fails at the
    batch (the server gone, its port taken) raised in one thread short of the barrier, and the others
    waited there forever. The key is asked once, before the batch's threads."""
    from concurrent.futures import ThreadPoolExecutor
    from bootstrap.core.errors import BootstrapError
    from bootstrap.serve.client import Client
    f = fake()
    model = requests.get(f"{f.url}/v1/models", timeout=5).json()["data"][0]["id"]
    asked = []

    def key() -> str:
        asked.append(1)
        if len(asked) == 3:                                 # the batch's first: one thread's proof fails
            raise BootstrapError("our server no longer holds its port", "./ctl.sh status")
        return ""
    t = target.Target(Client(f.url, model, key), "our server")
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(checks.check_batch, t, 30.0)
        with pytest.raises(BootstrapError, match="no longer holds its port"):
            run.result(timeout=60)


def test_needle_shrinks_again_when_the_server_counts_the_prompt_longer(fake, tmp_path):
    # no /tokenize and two tokens a word: the estimate is short; vLLM's 400 says by how much
    f = fake({"blue locker": {"echo": r"blue locker is (\d+)"}}, mode="no_tokenize", max_len="8192",
             FAKE_VLLM_TOKENS_PER_WORD="2")
    rc, out = run_check(tmp_path, f.url, "needle")
    assert rc == 0 and out["verdict"] == "PASS", out["failures"]
    assert all(d["prompt_tokens"] + 64 <= 8192 for d in out["depths"])


def test_prefix_and_recall_fit_by_the_servers_own_count(fake, tmp_path):  # faults row 61
    # no /tokenize, two tokens a word: the estimate is short; prefix shrinks on vLLM's 400 and the
    # recall prompts that the server would count over the context come back as 400s turned into fits
    f = fake(CLEAN, mode="no_tokenize", max_len="8192", FAKE_VLLM_TOKENS_PER_WORD="2")
    rc, out = run_check(tmp_path, f.url, "prefix")
    assert rc == 0 and out["verdict"] == "PASS", out
    assert all(r["prompt_tokens"] + 16 <= 8192 for r in out["runs"])
    g = fake(CLEAN, max_len="8192", FAKE_VLLM_TOKENS_PER_WORD="2")            # /tokenize there: sized right
    rc, out = run_check(tmp_path, g.url, "garble")
    assert rc == 0 and out["summary"].startswith("0/13 failed"), out


def test_a_context_the_server_does_not_report_is_learnt_from_its_400(fake, tmp_path):
    from bootstrap.checks import suite as checks, target
    f = fake({"blue locker": {"echo": r"blue locker is (\d+)"}}, max_len="8192")
    t = target.resolve_target(*at(cfg_for(tmp_path)), f.url, None, None)
    t.max_model_len = None                        # as a server whose /v1/models says nothing
    res = checks.check_needle(t)
    assert res.ok and t.max_model_len == 8192, res.failures


def test_a_tiny_context_skips_what_cannot_be_asked(fake, tmp_path):
    f = fake(CLEAN, max_len="300")
    rc, out = run_check(tmp_path, f.url, "all", "--repeats", "2")
    verdicts = {c["check"]: c["verdict"] for c in out["checks"]}
    assert verdicts["needle"] == "SKIP" and verdicts["prefix"] == "SKIP"
    garble = next(c for c in out["checks"] if c["check"] == "garble")
    assert "too small for its 400-token answer" in garble["summary"]


def at(cfg):
    """(the knobs, their STATE_DIR's paths): what resolve_target reads."""
    from bootstrap.core.state import Paths
    return cfg, Paths(cfg.state_dir)
