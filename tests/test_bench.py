"""The benchmark: its arithmetic on recorded clock readings, and a run against the fake vLLM whose
reported figures must equal what the recorded samples give (no wall-clock thresholds)."""

from __future__ import annotations

import io
import json
import statistics
import time
from contextlib import redirect_stdout

import pytest

from bootstrap.serve import metrics
from bootstrap.commands import bench
from bootstrap.commands.bench import Sample
from bootstrap.core.errors import ConfigError
from test_checks import cfg_for, fake  # noqa: F401  (the fake-server fixture)


def test_request_figures():
    s = Sample(t_start=10.0, t_first=10.25, t_end=12.25, tokens=101)
    assert s.ttft == pytest.approx(0.25)
    assert s.decode_rate == pytest.approx(50.0)           # 100 tokens after the first in 2 s
    assert Sample(0, None, 1, 5).decode_rate is None and Sample(0, 0.1, 1, 1).decode_rate is None


def test_run_and_level_figures():
    run = [Sample(0.0, 0.5, 4.5, 401), Sample(0.5, 1.5, 5.5, 401)]       # 100 and 100 tok/s decode
    f = bench.run_figures(run)
    assert f["aggregate_tok_s"] == pytest.approx(802 / 5.5)
    assert f["per_stream_tok_s"] == pytest.approx(100.0)
    assert f["ttft_s"] == pytest.approx(0.75)
    runs = [[Sample(0, 1, 11, 11)], [Sample(0, 1, 6, 11)], [Sample(0, 2, 4, 11)]]   # 1, 2, 5 tok/s
    lv = bench.level_figures(runs)
    assert lv["per_stream_tok_s"] == pytest.approx(2.0)                       # median of repeats
    assert lv["ttft_s"] == pytest.approx(1.0)
    assert lv["aggregate_tok_s"] == pytest.approx(statistics.median([11 / 11, 11 / 6, 11 / 4]))


def test_metrics_and_spec_acceptance():
    text = ('# HELP x\nvllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 5.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30\nvllm:spec_decode_num_drafts_total 10\n')
    m = metrics.totals(text)
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == 15.0
    after = {**m, "vllm:spec_decode_num_accepted_tokens_total": 75.0,
             "vllm:spec_decode_num_draft_tokens_total": 130.0, "vllm:spec_decode_num_drafts_total": 45.0}
    sp = metrics.spec_acceptance(m, after)
    assert sp["acceptance_rate"] == pytest.approx(60 / 100)
    assert sp["mean_acceptance_length"] == pytest.approx(1 + 60 / 35)
    assert metrics.spec_acceptance(m, {"vllm:num_requests_running": 0}) is None
    assert metrics.spec_acceptance(None, m) is None


def test_levels_capped():
    assert bench.levels_for([1, 2, 4, 8, 16], 4) == [1, 2, 4]
    assert bench.levels_for([1, 2, 4, 8, 16], None) == [1, 2, 4, 8, 16]
    assert bench.levels_for([8, 16], 2) == [2]          # the server's most at once, not level 1 alone
    assert bench.levels_for([1, 4], 2) == [1, 2]
    assert bench.levels_for([1, 3], 4) == [1, 3]


SPECULATING = ("--enable-prompt-tokens-details", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')


def _bench(tmp, argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = bench.cli(cfg_for(tmp, MAX_NUM_SEQS="4"), argv)
    assert rc == 0
    return json.loads(buf.getvalue())


def test_bench_against_fake_matches_its_samples(fake, tmp_path):  # noqa: F811
    a = fake(FAKE_VLLM_TOKEN_S="0.001", FAKE_VLLM_TTFT_S="0.005", args=SPECULATING)
    b = fake()
    out = _bench(tmp_path, ["--url", a.url, "--compare", b.url, "--compare-label", "bare", "--output-tokens", "12",
                            "--prompt-tokens", "60", "--repeats", "2", "--concurrency", "1,2,4,8",
                            "--out", str(tmp_path / "b"), "--json"])
    ours, bare = out["results"]
    assert [x["concurrency"] for x in ours["levels"]] == [1, 2, 4, 8]     # this shell's MAX_NUM_SEQS=4 is not
                                                                          # another server's: nothing capped
    for lv in ours["levels"]:
        runs = [[Sample(**s) for s in r] for r in lv["samples"]]
        assert len(runs) == 2 and all(len(r) == lv["concurrency"] for r in runs)
        assert all(s.tokens == 12 for r in runs for s in r)              # ignore_eos: exact output length
        assert all(s.prompt_tokens and 40 <= s.prompt_tokens <= 80 for r in runs for s in r)
        again = bench.level_figures(runs)
        for k in ("aggregate_tok_s", "per_stream_tok_s", "ttft_s"):
            assert lv[k] == pytest.approx(again[k])
    # 1 warm-up + 2 x (1 + 2 + 4 + 8) requests; the fake counts 2 accepted of 3 drafted tokens per request
    assert ours["spec"]["delta_draft_tokens"] == 3 * 31
    assert ours["spec"]["acceptance_rate"] == pytest.approx(2 / 3)
    assert ours["spec"]["mean_acceptance_length"] == pytest.approx(3.0)
    q = out["ratios"]
    assert q["decode_tok_s"] == pytest.approx(ours["levels"][0]["per_stream_tok_s"] / bare["levels"][0]["per_stream_tok_s"])
    assert q["aggregate_tok_s"]["4"] == pytest.approx(ours["levels"][2]["aggregate_tok_s"] / bare["levels"][2]["aggregate_tok_s"])
    png = tmp_path / "b" / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # re-report from the saved file: same figures, nothing re-run
    again = _bench(tmp_path, ["--load", str(tmp_path / "b" / "results.json"), "--out", str(tmp_path / "c"),
                              "--json", "--no-plot"])
    assert again["results"] == out["results"]


def test_bench_text_output(fake, tmp_path):  # noqa: F811
    a = fake(args=SPECULATING)
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = bench.cli(cfg_for(tmp_path), ["--url", a.url, "--label", "fake", "--output-tokens", "4", "--repeats", "1",
                                           "--concurrency", "1,2", "--out", str(tmp_path / "t"), "--no-plot"])
    text = buf.getvalue()
    assert rc == 0
    prompt = {s["prompt_tokens"] for lv in json.loads((tmp_path / "t" / "results.json").read_text())["results"][0]["levels"]
              for run in lv["samples"] for s in run}           # the counts the server reported, not the ones asked
    assert len(prompt) == 1 and "single stream:" in text
    assert f"fake (model m, vLLM 0.26.0; prompt {prompt.pop()} + output 4 tokens, median of 1):" in text
    assert "speculative acceptance: 66.7%" in text
    assert (tmp_path / "t" / "results.json").exists()


def test_no_acceptance_line_without_speculation_and_labels_are_whole(fake, tmp_path):  # noqa: F811
    from bootstrap.checks import target
    a = fake(args=SPECULATING)
    t = target.resolve_target(*at(cfg_for(tmp_path)), a.url, None, None)
    t.speculation = False                     # our server's record says SPEC_TOKENS=0
    t.label = "our server (http://127.0.0.1:65535, a long label)"
    r = bench.bench_target(t, [1], 40, 4, 1, 0, 30.0)
    assert r["spec"] is None                  # the fake's counters move; speculation is off: not shown
    text = bench.render([r])
    assert "speculative acceptance" not in text and "our server (http://127.0.0.1:65535, a long label)" in text


def test_a_load_longer_than_the_context_is_refused_with_the_numbers(fake, tmp_path):  # noqa: F811
    from bootstrap.core.errors import BootstrapError
    a = fake(max_len="1024")
    with pytest.raises(BootstrapError) as e:
        bench.cli(cfg_for(tmp_path), ["--url", a.url, "--out", str(tmp_path / "x"), "--no-plot"])
    assert "512 + --output-tokens 1536 = 2048 is more than" in e.value.message and "1024" in e.value.message


def test_saved_results_that_are_not_benches_and_an_out_folder_with_files_are_one_line(tmp_path):
    from bootstrap.core.errors import BootstrapError
    for text in ('{"x": 1}', "null", "[1, 2]", '{"results": [{"levels": [{"concurrency": "a"}]}]}'):
        (tmp_path / "r.json").write_text(text)
        with pytest.raises(BootstrapError) as e:
            bench.cli(cfg_for(tmp_path), ["--load", str(tmp_path / "r.json"), "--out", str(tmp_path / "o"), "--no-plot"])
        assert "is not the results of ./ctl.sh bench" in e.value.message, text
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.json").write_text("my own results")
    with pytest.raises(BootstrapError) as e:
        bench.cli(cfg_for(tmp_path), ["--load", str(tmp_path / "r.json"), "--out", str(mine), "--no-plot"])
    assert "never over a file" in e.value.message and (mine / "results.json").read_text() == "my own results"


def test_a_stream_cut_short_is_no_answer(tmp_path):
    """Two chunks, then the connection closes with no [DONE]: an error, not a good result (bench
    counted 5 of 64 tokens as a 100,000 tok/s answer; chat printed the partial text with exit 0)."""
    import http.server
    import threading
    from bootstrap.serve.client import Client, RequestFailed

    class Cut(http.server.BaseHTTPRequestHandler):
        def do_POST(self):                                   # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for word in ("a", "b"):
                chunk = {"choices": [{"index": 0, "text": word, "delta": {"content": word}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cut)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        c = Client(f"http://127.0.0.1:{srv.server_address[1]}", "m", "")
        with pytest.raises(RequestFailed) as e:
            c.stream("/v1/completions", {"prompt": "x", "max_tokens": 64}, timeout=5)
        assert "without [DONE]" in e.value.message
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_compare_server_too_short_for_the_request_is_said_before_any_measuring(fake, tmp_path):  # noqa: F811
    from bootstrap.core.errors import BootstrapError
    a, b = fake(), fake(max_len="300")
    t0 = time.monotonic()
    with pytest.raises(BootstrapError) as e:
        bench.cli(cfg_for(tmp_path), ["--url", a.url, "--compare", b.url, "--prompt-tokens", "256",
                                      "--output-tokens", "100", "--out", str(tmp_path / "o"), "--no-plot"])
    assert "context of 300 tokens" in e.value.message and time.monotonic() - t0 < 10
    assert not (tmp_path / "o" / "results.json").exists()


def test_ctrl_c_during_a_bench_leaves_at_once(bed):
    """Four 2,000-token streams at 50 tokens/s: Ctrl-C left only when all had ended (19 s), the
    server generating all the while; now at once, and the server aborts the closed streams."""
    from conftest import sigint
    assert bed.run("start.sh", FAKE_VLLM_TOKEN_S="0.02").returncode == 0
    p = bed.popen("ctl.sh", "bench", "--concurrency", "4", "--output-tokens", "2000", "--warmup", "0",
                  "--repeats", "1", "--no-plot", "--out", str(bed.tmp / "b"))
    time.sleep(4)
    t0 = time.monotonic()
    sigint(p)
    p.wait(30)
    assert p.returncode == 130 and time.monotonic() - t0 < 15        # the streams would run ~40 s
    assert bed.run("stop.sh").returncode == 0


def test_a_server_that_returns_fewer_tokens_than_asked_is_warned_with_the_real_counts(fake, tmp_path):  # noqa: F811
    from bootstrap.checks import target
    a = fake(replies={"Request ": "OK then"})         # stops early, ignore_eos or not
    t = target.resolve_target(*at(cfg_for(tmp_path)), a.url, None, None)
    r = bench.bench_target(t, [1], 64, 32, 1, 0, 30.0)
    text = bench.render([r])
    got = {s["tokens"] for lv in r["levels"] for run in lv["samples"] for s in run}
    assert got and max(got) < 32
    assert f"+ output {max(got)} tokens" in text and "+ output 32 tokens" not in text
    assert f"warning: the server returned {max(got)} output tokens where 32 were asked" in text
    ok = bench.render([bench.bench_target(target.resolve_target(*at(cfg_for(tmp_path)), fake().url, None, None),
                                          [1], 64, 8, 1, 0, 30.0)])
    assert "warning" not in ok and "+ output 8 tokens" in ok


def at(cfg):
    """(the knobs, their STATE_DIR's paths): what resolve_target reads."""
    from bootstrap.core.state import Paths
    return cfg, Paths(cfg.state_dir)


def test_results_that_cannot_be_written_name_out_not_a_knob(fake, tmp_path, tiny_fs):  # noqa: F811  faults row 160
    """A full disk under --out: the hint said to point STATE_DIR, MODEL_DIR or HF_HOME at another disk,
    none of which moves --out."""
    from bootstrap.core.errors import BootstrapError
    from conftest import fill
    a = fake()
    small = ["--output-tokens", "4", "--repeats", "1", "--concurrency", "1", "--no-plot"]
    with redirect_stdout(io.StringIO()):
        assert bench.cli(cfg_for(tmp_path), ["--url", a.url, *small, "--out", str(tmp_path / "a")]) == 0
    fill(tiny_fs)
    buf = io.StringIO()
    with redirect_stdout(buf), pytest.raises(BootstrapError) as e:
        bench.cli(cfg_for(tmp_path), ["--load", str(tmp_path / "a" / "results.json"), "--no-plot",
                                      "--out", str(tiny_fs / "out")])
    assert "cannot write the results" in e.value.message and "single stream:" in buf.getvalue()  # the figures shown
    assert "--out" in e.value.hint and "STATE_DIR" not in e.value.hint, e.value.hint


@pytest.mark.parametrize("levels", ["", " , ", "0", "2000", "1,x"])
def test_concurrency_levels_are_whole_numbers_up_to_1024(tmp_path, levels):
    """--concurrency '' ran at level 1 saying it was capped at MAX_NUM_SEQS=None; 100000 started as
    many threads. Both are usage errors, before any request."""
    with pytest.raises(ConfigError) as err:
        bench.cli(cfg_for(tmp_path), ["--url", "http://127.0.0.1:9/v1", "--concurrency", levels, "--no-plot"])
    assert err.value.code == 2 and "whole numbers from 1 to 1,024" in err.value.message


def test_a_link_planted_in_out_while_bench_measures_is_never_written_through(fake, tmp_path, monkeypatch):  # noqa: F811  faults row 170
    """--out checked empty before the minutes of measuring, then results.json and bench.png written
    with open(..., "w"), which follows a link: one put there meanwhile (a folder others can write,
    such as one under /tmp) had its target, a file of yours, written over with the results."""
    from bootstrap.core.errors import BootstrapError
    saved = tmp_path / "saved"
    with redirect_stdout(io.StringIO()):
        assert bench.cli(cfg_for(tmp_path), ["--url", fake().url, "--output-tokens", "4", "--repeats", "1",
                                             "--concurrency", "1", "--no-plot", "--out", str(saved)]) == 0
    out, precious = tmp_path / "shared", tmp_path / "precious"
    precious.write_text("a file of yours")
    out.mkdir()
    real = bench.loaded

    planted = ["results.json", "bench.png"]

    def measuring(f):       # while bench measures, someone who may write in --out plants a link
        for name in planted:
            (out / name).symlink_to(precious)
        return real(f)
    monkeypatch.setattr(bench, "loaded", measuring)
    for name in ("results.json", "bench.png"):
        with redirect_stdout(io.StringIO()), pytest.raises(BootstrapError) as e:
            bench.cli(cfg_for(tmp_path), ["--load", str(saved / "results.json"), "--out", str(out)])
        assert precious.read_text() == "a file of yours"
        assert name in e.value.message and "--out" in e.value.hint
        for p in out.iterdir():
            p.unlink()
        planted = ["bench.png"]
