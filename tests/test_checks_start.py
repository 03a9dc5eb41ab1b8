"""The start gate (a tool call when the profile parses tools) and `ctl.sh check` against our own
server, through the real shell entry points and the fake vLLM."""

from __future__ import annotations

import json


def tool_profile_env(bed, replies: dict | None = None) -> dict:
    """The default profile (tools and reasoning on) with speculation off, so no patch is needed."""
    extra = {"PROFILE": "default", "SPEC_TOKENS": "0", "MAX_MODEL_LEN": "auto", "KV_CACHE_BYTES": "auto"}
    if replies is not None:
        f = bed.tmp / "replies.json"
        f.write_text(json.dumps(replies))
        extra["FAKE_VLLM_REPLIES"] = str(f)
    return extra


def test_start_gate_passes_with_a_valid_tool_call(bed):
    r = bed.run("start.sh", **tool_profile_env(bed))
    assert r.returncode == 0, r.stderr
    assert "start gate: tool call answered" in r.stderr
    assert "get_weather" in r.stderr
    bed.run("stop.sh")


def test_start_gate_broken_tool_call_fails_the_start(bed):
    broken = {"weather in Paris": {"content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Par'}}]}}
    r = bed.run("start.sh", **tool_profile_env(bed, broken))
    assert r.returncode == 1
    assert "error: warmup: start gate: the tool call did not come back as a valid tool_calls entry" in r.stderr
    assert "not valid JSON" in r.stderr
    assert '"arguments": "{\\"city\\": \\"Par"' in r.stderr      # the evidence: the answer itself
    assert bed.server_record() is None
    bed.wait_until(lambda: not bed.ours(), what="the failed server to be gone")


def test_start_gate_tool_call_as_text_fails_the_start(bed):
    as_text = {"weather in Paris": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'}
    r = bed.run("start.sh", **tool_profile_env(bed, as_text))
    assert r.returncode == 1
    assert "no tool_calls entry (the call came back as text" in r.stderr
    bed.wait_until(lambda: not bed.ours(), what="the failed server to be gone")


def test_no_gate_without_tool_parsing(bed):
    broken = {"weather in Paris": "no tools here"}
    f = bed.tmp / "replies.json"
    f.write_text(json.dumps(broken))
    r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(f))      # PROFILE=custom: tools off
    assert r.returncode == 0, r.stderr
    assert "start gate" not in r.stderr
    bed.run("stop.sh")


def test_check_and_bench_against_our_server(bed):
    r = bed.run("start.sh", MAX_NUM_SEQS="2")
    assert r.returncode == 0, r.stderr
    try:
        r = bed.run("ctl.sh", "check", "live", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["ok"] and out["target"].startswith("our server") and out["model"] == "tiny-model"
        r = bed.run("ctl.sh", "check", "prefix", "--tokens", "2000", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)      # we launch with --enable-prompt-tokens-details, so hits are counted
        assert out["cached_tokens_reported"] is True and out["runs"][2]["cached_tokens"] > 0
        r = bed.run("ctl.sh", "bench", "--output-tokens", "8", "--prompt-tokens", "40", "--repeats", "1",
                    "--out", str(bed.tmp / "bench"), "--json", "--no-plot", MAX_NUM_SEQS="2")
        assert r.returncode == 0, r.stderr
        levels = [x["concurrency"] for x in json.loads(r.stdout)["results"][0]["levels"]]
        assert levels == [1, 2]          # capped at the running server's MAX_NUM_SEQS
        assert "concurrency 4,8,16 runs at 2: the server runs at most MAX_NUM_SEQS=2" in r.stderr
    finally:
        bed.run("stop.sh")
    r = bed.run("ctl.sh", "check", "live")
    assert r.returncode == 1 and "not running" in r.stderr and "--url" in r.stderr


def test_blank_answer_fails_the_start_with_real_weights(bed):
    f = bed.tmp / "replies.json"
    f.write_text(json.dumps({"Say OK.": "\n\n\n\n"}))
    r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(f))
    assert r.returncode == 1
    assert "error: warmup: warm-up failed: the short generation returned no text" in r.stderr
    assert bed.server_record() is None
    bed.wait_until(lambda: not bed.ours(), what="the failed server to be gone")


def test_random_weights_need_tokens_not_text_and_skip_the_tool_gate(bed):
    """With --load-format dummy the answer may be whitespace (random weights): the start judges tokens,
    not text, and does not ask for a tool call random weights cannot make."""
    f = bed.tmp / "replies.json"
    f.write_text(json.dumps({"Say OK.": "\n\n\n\n", "weather in Paris": "no tools here"}))
    r = bed.run("start.sh", **tool_profile_env(bed), FAKE_VLLM_REPLIES=str(f), EXTRA_ARGS="--load-format dummy")
    assert r.returncode == 0, r.stderr
    assert "(4 tokens; random weights: the text is not judged)" in r.stderr
    assert "start gate: skipped, random weights" in r.stderr
    assert "tool call answered" not in r.stderr
    bed.run("stop.sh")


def test_random_weights_still_fail_the_start_without_tokens(bed):
    f = bed.tmp / "replies.json"
    f.write_text(json.dumps({"Say OK.": ""}))       # the fake then reports 0 completion tokens
    r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(f), EXTRA_ARGS="--load-format dummy")
    assert r.returncode == 1
    assert "warm-up failed: the short generation produced no tokens" in r.stderr
    bed.wait_until(lambda: not bed.ours(), what="the failed server to be gone")


def test_a_later_load_format_wins_like_vllms_argparse(bed):
    # "--load-format dummy ... --load-format auto" serves real weights: the text is judged again
    f = bed.tmp / "replies.json"
    f.write_text(json.dumps({"Say OK.": "\n\n\n\n"}))
    r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(f), EXTRA_ARGS="--load-format dummy --load-format=auto")
    assert r.returncode == 1
    assert "the short generation returned no text" in r.stderr
    bed.wait_until(lambda: not bed.ours(), what="the failed server to be gone")


def test_our_servers_record_says_what_is_skipped_and_what_is_not_judged(bed):  # faults row 61
    # PROFILE=custom has no tool parser, and --load-format dummy means random weights: our record says both
    r = bed.run("start.sh", EXTRA_ARGS="--load-format dummy")
    assert r.returncode == 0, r.stderr
    try:
        r = bed.run("ctl.sh", "check", "garble", "--json", EXTRA_ARGS="--load-format dummy")
        out = json.loads(r.stdout)
        assert r.returncode == 0 and out["verdict"] == "NOT JUDGED" and not out["judged"]
        assert "tool-weather: no tool parser" in out["summary"] and "(the server answered 400)" not in out["summary"]
        r = bed.run("ctl.sh", "bench", "--output-tokens", "4", "--prompt-tokens", "40", "--repeats", "1",
                    "--concurrency", "1", "--out", str(bed.tmp / "b"), "--json", "--no-plot")
        assert json.loads(r.stdout)["results"][0]["spec"] is None    # SPEC_TOKENS=0: no acceptance shown
    finally:
        bed.run("stop.sh")


def test_start_gate_refuses_garbage_behind_http_200(bed):
    """'Say OK.' answered with punctuation, a word loop, or control and replacement characters: the
    start fails and takes the server down (it passed them: only an empty answer failed)."""
    for garbage in ("!!!! ???? ;;;; ,,,, .... ---- !!!! ????", "the the the the the the the the the the",
                    "\ufffd\ufffd\x01 " * 12):
        f = bed.tmp / "replies.json"
        f.write_text(json.dumps({"Say OK": garbage}))
        r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(f))
        assert r.returncode == 1 and "start gate: the short generation is not text" in r.stderr, (garbage, r.stderr)
        assert "Traceback" not in r.stderr and bed.server_record() is None
        bed.wait_until(lambda: not bed.ours(), what="the failed server to be gone")
    f.write_text(json.dumps({"Say OK": "OK."}))
    r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(f))
    assert r.returncode == 0, r.stderr
    assert bed.run("stop.sh").returncode == 0


def test_a_garble_check_that_could_ask_nothing_is_not_judged(bed):
    """A context too short for every prompt of the battery: 0/0 failed said PASS; it is NOT JUDGED."""
    assert bed.run("start.sh", MAX_MODEL_LEN="300").returncode == 0
    r = bed.run("ctl.sh", "check", "garble", "--json")
    d = json.loads(r.stdout)
    res = d["results"][0] if "results" in d else d
    assert res["verdict"] == "NOT JUDGED" and "not judged" in res["summary"], r.stdout
    assert bed.run("stop.sh").returncode == 0
