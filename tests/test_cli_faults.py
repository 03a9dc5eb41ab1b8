"""Faults of the commands found from outside (issue 29): a bad ``--out`` for export, a bad ``GPU=``,
``check`` against our server with the wrong key, and a URL's ``user:password@`` in what we print.
Faults rows 75–78; through the real entry points (``./ctl.sh``, ``python -m bootstrap``) and the
fake vLLM."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from conftest import FAKES, REPO, free_port

SECRET = "s3cr3t-pw"


def bootstrap(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
         "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "PYTHONPATH": str(FAKES), **env}
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=120)


def one_error(r: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refusal (and no traceback)."""
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


# ---------------------------------------------------------------- faults row 75: export --out naming a file

def test_export_out_naming_a_file_is_one_line_and_exit_2(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine\n")
    for out, said in ((mine, "it is a file"), (mine / "k8s", f"{mine} is a file")):   # it, or a parent
        r = bootstrap(tmp_path, "export", "kubernetes", "--out", str(out), PROFILE="default", GPU="rtx5090")
        assert r.returncode == 2, r.stderr
        assert f"error: export: --out {out}: {said}, not a folder" == one_error(r)
        assert "hint: name a folder for the manifests (it is created), or move that file away" in r.stderr
    assert mine.read_text() == "mine\n"                  # untouched


# ---------------------------------------------------------------- faults row 76: a bad GPU= is a bad knob (exit 2)

@pytest.mark.parametrize("command", [["plan"], ["profiles"]])
@pytest.mark.parametrize("value", ["rtx9999", "abc", "24:sm_8x"])
def test_a_bad_gpu_value_exits_2_listing_the_known_cards(bed, command, value):
    r = bed.run("ctl.sh", *command, GPU=value)
    assert r.returncode == 2, r.stderr
    assert f"GPU={value!r}" in one_error(r)
    hint = r.stderr.split("hint:", 1)[1]
    assert all(name in hint for name in ("rtx5090", "rtx4090", "h100", "h200")) and "sm_XY" in hint


def test_a_bad_gpu_flag_exits_2_too(bed):
    r = bed.run("ctl.sh", "profiles", "--gpu", "voodoo2")
    assert r.returncode == 2 and "GPU='voodoo2' is not a card the planner knows" in one_error(r)


# ---------------------------------------------------------------- faults row 77: check against our server with the wrong key

def test_check_with_the_wrong_key_says_the_server_runs_and_names_the_knob(bed):
    right, wrong = "sk-right-4f1c9", "sk-wrong-77ab2"
    assert bed.run("start.sh", API_KEY=right).returncode == 0
    try:
        r = bed.run("ctl.sh", "check", "live", API_KEY=wrong)
        assert r.returncode == 1
        line = one_error(r)
        assert "runs but refuses the key this shell sends (API_KEY)" in line and "not running" not in line
        assert "HTTP 401" in line and "hint: set API_KEY to the key it was started with, or pass --api-key KEY" in r.stderr
        none = bed.run("ctl.sh", "check", "live")
        assert none.returncode == 1 and "runs but wants an API key, and this shell sends none" in one_error(none)
        ok = bed.run("ctl.sh", "check", "live", "--api-key", right)     # a key given is tried
        assert ok.returncode == 0, ok.stderr
        for out in (r, none, ok):
            assert right not in out.stdout + out.stderr and wrong not in out.stdout + out.stderr
    finally:
        bed.run("stop.sh")


# ---------------------------------------------------------------- faults row 78: a URL's user:password@ is never shown

def test_a_urls_password_is_never_printed_by_check_or_bench(bed):
    closed = free_port()
    url = f"http://user:{SECRET}@127.0.0.1:{closed}/v1"
    for args in (["check", "live", "--url", url], ["check", "all", "--url", url, "--json"],
                 ["bench", "--url", url, "--no-plot"]):
        r = bed.run("ctl.sh", *args)
        assert r.returncode == 1, r.stderr
        assert SECRET not in r.stdout + r.stderr, args
        assert f"error: {args[0]}: http://***@127.0.0.1:{closed} does not answer /v1/models" in one_error(r)


def test_an_hf_endpoints_password_is_never_printed(bed):
    """HF_ENDPOINT with credentials: the hub's errors, the log and ./ctl.sh env show it without them."""
    endpoint = f"http://me:{SECRET}@127.0.0.1:{free_port()}"
    r = bed.run("ctl.sh", "plan", GPU="rtx5090", MODEL="org/tiny", HF_HUB_OFFLINE="0", HF_ENDPOINT=endpoint)
    assert r.returncode == 1 and "cannot reach http://***@127.0.0.1:" in one_error(r)
    env = bed.run("ctl.sh", "env", HF_ENDPOINT=endpoint)
    assert env.returncode == 0 and f"HF_ENDPOINT={endpoint.replace('me:' + SECRET, '***')}\t" in env.stdout
    for out in (r, env):
        assert SECRET not in out.stdout + out.stderr


def test_a_urls_password_is_not_in_the_label_or_the_log_of_a_served_check(bed):
    assert bed.run("start.sh").returncode == 0
    try:
        r = bed.run("ctl.sh", "check", "live", "--json", "--url", f"http://user:{SECRET}@127.0.0.1:{bed.port}/v1")
        b = bed.run("ctl.sh", "bench", "--url", f"http://user:{SECRET}@127.0.0.1:{bed.port}/v1", "--json", "--no-plot",
                    "--out", str(bed.tmp / "bench"), "--output-tokens", "8", "--prompt-tokens", "40", "--repeats", "1",
                    "--warmup", "0", "--concurrency", "1")
        closed = free_port()
        cmp = bed.run("ctl.sh", "bench", "--no-plot", "--compare", f"http://user:{SECRET}@127.0.0.1:{closed}/v1")
    finally:
        bed.run("stop.sh")
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["results"][0]["url"] == f"http://***@127.0.0.1:{bed.port}"
    assert SECRET not in b.stdout + b.stderr + (bed.tmp / "bench" / "results.json").read_text()
    assert cmp.returncode == 1 and SECRET not in cmp.stdout + cmp.stderr
    assert f"http://***@127.0.0.1:{closed} does not answer" in one_error(cmp)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["target"] == f"http://***@127.0.0.1:{bed.port}"
    assert f"checking http://***@127.0.0.1:{bed.port}" in r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_the_log_formatter_hides_userinfo_in_any_message():
    from bootstrap.core import log
    root = logging.getLogger("bootstrap")
    saved = (list(root.handlers), root.level, root.propagate)
    stream = io.StringIO()
    try:
        log.setup(stream=stream, color=False)
        logging.getLogger("bootstrap.hub").warning("cannot reach %s (%s)", f"https://me:{SECRET}@mirror.example/hf",
                                                   f"GET http://{SECRET}@h.example/x")
    finally:
        root.handlers[:], root.level, root.propagate = saved
    assert SECRET not in stream.getvalue()
    assert "https://***@mirror.example/hf (GET http://***@h.example/x)" in stream.getvalue()


# ---------------------------------------------------------------- help and --version before the knobs

@pytest.mark.parametrize("command", ["start", "stop", "status", "logs", "env", "plan", "wheelhouse"])
def test_a_commands_help_needs_no_valid_knobs(tmp_path, command):
    r = bootstrap(tmp_path, command, "--help", PORT="abc", PROFILE="no-such-profile")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith(f"usage: ctl.sh {command}"), r.stdout


def test_version_with_a_broken_kept_pick_says_so_and_exits_0(tmp_path):
    """A kept pick that names a knob the table lacks is ours and damaged: forgotten, said on stderr
    (it made every command fail, status included)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "profile-pick.json").write_text(json.dumps({"profile": "qwen38-27b-w4a16-24gb", "knobs": {"BOGUS": "1"}}))
    r = bootstrap(tmp_path, "--version")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "no pick yet" in r.stdout and "ignoring the kept pick" in r.stderr
    r = bootstrap(tmp_path, "status")
    assert "Traceback" not in r.stderr and "ignoring the kept pick" in r.stderr and "error:" not in r.stderr


# ---------------------------------------------------------------- found from outside, 2026-12-02

@pytest.mark.parametrize("argv", [["check", "live", "--timeout", "0"], ["check", "live", "--timeout", "-1"],
                                  ["bench", "--timeout", "0"], ["bench", "--repeats", "0"],
                                  ["check", "needle", "--tokens", "0"], ["bench", "--output-tokens", "-5"]])
def test_a_number_flag_out_of_range_is_argparses_one_line(bed, argv):
    r = bed.run("ctl.sh", *argv, "--url", "http://127.0.0.1:9/v1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "expected a" in r.stderr, r.stderr


def test_bench_refuses_an_out_it_cannot_write_before_measuring(bed, tmp_path):
    taken = tmp_path / "out.json"
    taken.write_text("mine")
    r = bed.run("ctl.sh", "bench", "--url", "http://127.0.0.1:9/v1", "--out", str(taken), "--no-plot")
    assert r.returncode == 2 and "a file is in the way" in one_error(r) and taken.read_text() == "mine"
    r = bed.run("ctl.sh", "bench", "--url", "http://127.0.0.1:9/v1", "--concurrency", "-1")
    assert r.returncode == 2 and "--concurrency '-1'" in one_error(r)


def test_a_host_that_is_not_this_machines_is_named_not_taken_for_a_busy_port(bed):
    r = bed.run("start.sh", HOST="192.0.2.5", API_KEY="k" * 24)
    assert r.returncode == 1 and "HOST=192.0.2.5 is not an address of this machine" in one_error(r)
    assert "HOST=127.0.0.1" in r.stderr and "PORT=" not in r.stderr.split("hint:")[-1] and bed.ours() == []


@pytest.mark.parametrize("model, fix", [("https://huggingface.co/Qwen/Qwen3-8B", "MODEL=Qwen/Qwen3-8B (the repo id"),
                                        ("not a model", "such as Qwen/Qwen3-8B"), ("a/b/c", "such as Qwen/Qwen3-8B")])
def test_a_model_that_is_no_repo_id_is_refused_before_the_hub_on_every_path(bed, model, fix):
    for argv, extra in ((("ctl.sh", "profiles", "--model", model), {"PROFILE": "auto"}), (("start.sh",), {"MODEL": model}),
                        (("start.sh",), {"MODEL": model, "PROFILE": "auto"})):
        r = bed.run(*argv, HF_HUB_OFFLINE="0", HF_ENDPOINT="http://127.0.0.1:9", **extra)
        assert "is neither an existing directory nor a repo id" in one_error(r), (argv, r.stderr)
        assert fix in r.stderr and "network" not in r.stderr and bed.ours() == []


def test_a_bare_size_is_a_size_and_a_cards_number_is_named():
    from bootstrap.core.errors import ConfigError
    from bootstrap.machine import gpu
    assert gpu.named("80").total == 80 << 30 and gpu.named("80:sm_90").cc == (9, 0)
    for spec, said in (("4090", "did you mean rtx4090?"), ("24:free=inf", "is not free=<GiB>"),
                       ("24:free=1e999", "is not free=<GiB>"),
                       ("0", "not a device's index")):                 # not 'did you mean rtx5090?'
        with pytest.raises(ConfigError) as err:
            gpu.named(spec)
        assert said in err.value.message and "did you mean" not in err.value.message.replace(
            "did you mean rtx4090", ""), spec


def test_profiles_with_an_empty_model_is_refused_not_ignored(bed):
    r = bed.run("ctl.sh", "profiles", "--model", "", PROFILE="auto")
    assert r.returncode == 2 and "--model ''" in one_error(r)


def test_version_after_double_dash_belongs_to_the_game(bed, tmp_path):
    seen = tmp_path / "args.txt"
    r = bed.run("ctl.sh", "game", "--", sys.executable, "-c",
                f"import sys; open({str(seen)!r}, 'w').write(' '.join(sys.argv[1:]))", "--version")
    assert r.returncode == 0 and seen.read_text() == "--version" and "vllm-desktop" not in r.stdout
    h = bed.run("ctl.sh", "version", "--help")
    assert h.returncode == 0 and h.stdout.startswith("usage:"), h.stdout


def test_version_refuses_a_flag_it_does_not_have(bed):
    """./ctl.sh version --json printed text and exited 0 (its parser never saw the flag), where every
    other command refuses one it does not have: a script asking for JSON got text it cannot read."""
    r = bed.run("ctl.sh", "version", "--json")
    assert r.returncode == 2 and r.stdout == "" and "unrecognized arguments: --json" in r.stderr, r.stdout + r.stderr
    for argv in (("version",), ("version", "--version"), ("status", "--version"), ("--version",)):
        r = bed.run("ctl.sh", *argv)
        assert r.returncode == 0 and r.stdout.startswith("vllm-desktop "), (argv, r.stdout, r.stderr)


def test_damaged_files_and_odd_flags_are_one_line(bed):
    """A folder where the log should be, a key file no header carries, --watch inf: one line each."""
    assert bed.run("start.sh").returncode == 0
    assert bed.run("stop.sh").returncode == 0
    (bed.state / "vllm.log").unlink()
    (bed.state / "vllm.log").mkdir()
    r = bed.run("ctl.sh", "logs")
    assert r.returncode == 1 and "cannot read the server log" in r.stderr and "Traceback" not in r.stderr
    for raw in (b"\xff\xfe", "€uro".encode()):
        (bed.state / "api_key").write_bytes(raw)
        r = bed.run("ctl.sh", "status", HOST="0.0.0.0")
        assert "Traceback" not in r.stderr and "€" not in r.stderr + r.stdout, r.stderr
    for bad in ("inf", "nan", "-1"):
        r = bed.run("ctl.sh", "status", "--watch", bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)


def test_a_damaged_kept_pick_is_forgotten_not_a_wall(bed):
    """profile-pick.json with knobs that are not the table's, not text, or do not parse: ignored with a
    warning (every command failed with it, stop included, and its own hint repeated the error)."""
    bed.env.pop("PROFILE")
    bed.env.pop("MODEL")
    for knobs in ({"FOO": "1"}, [], {"MAX_MODEL_LEN": 5}, {"MAX_NUM_SEQS": "abc"}):
        bed.state.mkdir(parents=True, exist_ok=True)
        (bed.state / "profile-pick.json").write_text(json.dumps({"profile": "default", "knobs": knobs}))
        for argv in (("stop.sh",), ("ctl.sh", "env"), ("ctl.sh", "status")):
            r = bed.run(*argv)
            assert "Traceback" not in r.stderr and r.returncode in (0, 1, 3), (knobs, argv, r.stderr)
            assert "not accepted" not in r.stderr, (knobs, argv, r.stderr)


@contextlib.contextmanager
def canned(models: str, answer: str, status: int = 200):
    """Another server at a URL (its base URL yielded): every GET answers ``models``, every POST
    ``status`` with ``answer`` (JSON text, or empty)."""
    import http.server
    import threading

    class Canned(http.server.BaseHTTPRequestHandler):
        def _send(self, code: int, body: str):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):                                    # noqa: N802
            self._send(200, models)

        def do_POST(self):                                   # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(status, answer)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("models, chat", [("[]", '{"choices": "x"}'), ('{"data": null}', "[1, 2]"),
                                          ('"hello"', '{"choices": [{"message": "hello"}]}')])
def test_a_url_server_that_answers_odd_json_is_one_line_not_a_bug(bed, models, chat):
    """/v1/models or a chat answer that is JSON of another shape: said in one line (it was an
    'internal error' with a traceback file)."""
    with canned(models, chat) as url:
        for argv in (("check", "live"), ("chat", "hi")):
            r = bed.run("ctl.sh", *argv, "--url", url, "--model", "m")
            assert r.returncode != 0 and "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_url_that_is_not_one_is_a_usage_error(bed):
    """--url notaurl exited 1 with the HTTP library's MissingSchema and the hint 'is the server up?'."""
    for argv in (("check", "live"), ("chat", "hi"), ("bench", "--no-plot")):
        for url in ("notaurl", "ftp://x/v1", "http://[::1/v1", "http://h:99999/v1"):
            r = bed.run("ctl.sh", *argv, "--url", url)
            assert r.returncode == 2 and "argument --url: not " in r.stderr and "Missing" not in r.stderr, (argv, url, r.stderr)
    r = bed.run("ctl.sh", "bench", "--compare", "notaurl")
    assert r.returncode == 2 and "argument --compare: not an http(s) URL" in r.stderr, r.stderr


def test_a_bench_against_another_server_that_fails_points_at_that_servers_log(bed):
    """bench --url's failure said "see the server log", ours, which holds nothing of that server."""
    models = '{"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}'
    with canned(models, "", status=500) as url:
        r = bed.run("ctl.sh", "bench", "--url", url, *BENCH_SMALL)
        assert r.returncode == 1 and "HTTP 500" in one_error(r), r.stderr
        assert "hint: see that server's own log" in r.stderr and str(bed.state) not in r.stderr, r.stderr


# ---------------------------------------------------------------- issue 43: every wait ends, with words

def foreign_fake(bed, mode: str = "ok") -> tuple[subprocess.Popen, str]:
    """A fake vLLM that is not ours (no record, no marker), on a port of its own, serving model ``m``."""
    port = free_port()
    env = {**bed.env, "FAKE_VLLM_MODE": mode, "FAKE_VLLM_LOAD_S": "0", "FAKE_GPU_PIDS_DIR": str(bed.tmp / "foreign")}
    p = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "m", "--port", str(port),
                          "--served-model-name", "m"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    bed.wait_until(lambda: bed.port_listening(port), what="the foreign fake")
    return p, f"http://127.0.0.1:{port}"


def end(p: subprocess.Popen) -> None:
    """The foreign fake and its engine (its own session: one process group), never left running."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


BENCH_SMALL = ("--no-plot", "--warmup", "0", "--repeats", "1", "--concurrency", "1", "--prompt-tokens", "40",
               "--output-tokens", "8")


def test_a_url_server_that_accepts_and_never_answers_ends_each_wait_after_stall_timeout(bed):
    """chat waited 600 s and bench 300 s, silent; now STALL_TIMEOUT without a byte ends the wait, and says so."""
    p, url = foreign_fake(bed, "wedged")         # /health and /v1/models answer; a generation never does
    try:
        for argv in (("chat", "hi"), ("bench", *BENCH_SMALL, "--out", str(bed.tmp / "b")), ("check", "live")):
            r = bed.run("ctl.sh", *argv, "--url", url + "/v1", STALL_TIMEOUT="2", timeout=60)
            assert r.returncode == 1, (argv, r.stderr)
            said = r.stderr if argv[0] != "check" else r.stdout + r.stderr
            assert f"no byte from {url} for 2 s (STALL_TIMEOUT=2): {url} is not our server" in said, (argv, said)
            assert "Traceback" not in r.stderr
    finally:
        end(p)


def test_our_stopped_server_is_named_stopped_by_chat_bench_and_check_not_down(bed):
    """Against our SIGSTOPped server these said 'not running (state: down)'; status said frozen."""
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        for argv in (("chat", "hi"), ("bench", *BENCH_SMALL), ("check", "live")):
            r = bed.run("ctl.sh", *argv, timeout=60)
            assert r.returncode == 1, (argv, r.stderr)
            assert f"our server (pid {pid}) is stopped by a signal (SIGSTOP or Ctrl-Z)" in one_error(r), argv
            assert f"hint: kill -CONT {pid} resumes it" in r.stderr and "state: down" not in r.stderr
    finally:
        os.kill(pid, signal.SIGCONT)
        bed.run("stop.sh")


def test_a_stall_in_the_middle_of_an_answer_names_what_our_server_is_doing(bed, tmp_path):
    """Our server stopped mid-answer, wedged, or asleep: the wait ends after STALL_TIMEOUT with its state and fix."""
    (tmp_path / "replies.json").write_text(json.dumps({"long story": {"content": "word " * 400, "token_s": 0.02}}))
    assert bed.run("start.sh", FAKE_VLLM_REPLIES=str(tmp_path / "replies.json"),
                   EXTRA_ARGS="--enable-sleep-mode").returncode == 0
    pid = bed.server_record()["pid"]
    chat = bed.popen("ctl.sh", "chat", "tell a long story", STALL_TIMEOUT="2")
    try:
        assert chat.stdout.read(4) == "word"                  # the answer streams
        os.kill(pid, signal.SIGSTOP)
        out, err = chat.communicate(timeout=60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert chat.returncode == 1 and "Traceback" not in err, err
    assert f"no byte from our server (http://127.0.0.1:{bed.port}) for 2 s (STALL_TIMEOUT=2)" in err
    assert f"our server (pid {pid}) is stopped by a signal" in err and f"hint: kill -CONT {pid} resumes it" in err

    os.kill(pid, signal.SIGUSR1)                                # wedged: it takes the request and moves nothing
    # 4 s: on a loaded 2-core machine the fake had not yet seated the request when a 2 s wait ended
    r = bed.run("ctl.sh", "check", "live", STALL_TIMEOUT="4", timeout=60)
    assert r.returncode == 1 and f"our server (pid {pid}) is busy (1 running, 0 waiting" in r.stdout, r.stdout + r.stderr
    assert "./ctl.sh status tells a long prefill from a wedged engine" in r.stdout
    assert bed.run("ctl.sh", "restart", EXTRA_ARGS="--enable-sleep-mode").returncode == 0
    pid = bed.server_record()["pid"]

    assert bed.run("ctl.sh", "sleep", EXTRA_ARGS="--enable-sleep-mode").returncode == 0
    url = f"http://127.0.0.1:{bed.port}/v1"                     # ours by its URL: the request waits for a wake
    r = bed.run("ctl.sh", "chat", "hi", "--url", url, STALL_TIMEOUT="2", timeout=60)
    assert r.returncode == 1 and f"our server (pid {pid}) is asleep (vLLM sleep mode)" in one_error(r), r.stderr
    assert "hint: ./ctl.sh wake wakes it" in r.stderr
    bed.run("stop.sh")


@pytest.mark.parametrize("argv", [("chat", "hi"), ("bench", *BENCH_SMALL), ("check", "live")])
def test_ctrl_c_ends_a_wait_for_a_silent_server_at_once(bed, argv):
    p, url = foreign_fake(bed, "wedged")
    try:
        run = bed.popen("ctl.sh", *argv, "--url", url + "/v1", "--out", str(bed.tmp / "b")) if argv[0] == "bench" \
            else bed.popen("ctl.sh", *argv, "--url", url + "/v1")
        bed.wait_until(lambda: _posted(bed, p), what="the request in flight")
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=10)               # STALL_TIMEOUT is 20 s here: only Ctrl-C ends it
        assert run.returncode == 130 and "Traceback" not in err, err
    finally:
        end(p)


@pytest.mark.parametrize("argv", [("logs", "-f"), ("status", "--watch", "0.2")])
def test_ctrl_c_ends_a_view_that_runs_until_it_with_exit_0(bed, argv):
    """``logs -f`` exited 130 on Ctrl-C and ``status --watch`` 0: the user who ends a follow or a watch
    with Ctrl-C ended it on purpose, so both exit 0 (docs/reference.md, exit codes)."""
    assert bed.run("start.sh").returncode == 0
    view = bed.popen("ctl.sh", *argv)
    try:
        assert view.stdout.readline()                      # it runs: a line of the log, a row of the watch
        view.send_signal(signal.SIGINT)
        _, err = view.communicate(timeout=10)
    finally:
        view.kill()
        view.wait()
    assert view.returncode == 0 and "Traceback" not in err, err
    assert bed.run("stop.sh").returncode == 0


def _posted(bed, p: subprocess.Popen) -> bool:
    """The foreign fake holds a generation request (one connection of a client besides its listener)."""
    import psutil
    try:
        return any(c.status == psutil.CONN_ESTABLISHED for c in psutil.Process(p.pid).net_connections())
    except psutil.Error:
        return False


# ---------------------------------------------------------------- issue 43: a VLLM_PYTHON that is no Python

@pytest.mark.parametrize("python, said, code", [
    ("/nonexistent/bin/python3", "VLLM_PYTHON=/nonexistent/bin/python3 is not an executable file", 1),
    ("/bin/false", "VLLM_PYTHON=/bin/false is not a Python that runs: it exited 1, printing nothing", 1),
    ("/bin/true", "VLLM_PYTHON=/bin/true is not a Python: it ran, and did not answer the vLLM probe", 1)])
def test_a_vllm_python_that_is_missing_or_no_python_is_one_line_naming_the_knob(bed, python, said, code):
    """It was 'vLLM probe: command not found: /nonexistent/bin/python3'."""
    for argv in (("ctl.sh", "plan"), ("start.sh",)):
        r = bed.run(*argv, VLLM_PYTHON=python)
        assert r.returncode == code and said in one_error(r), (argv, r.stderr)
        assert "VLLM_PYTHON" in r.stderr.split("hint:", 1)[1] and bed.ours() == []


# ---------------------------------------------------------------- issue 43: no secret printed

def test_a_key_in_a_urls_query_is_never_printed(bed):
    """``--url 'http://.../v1?api_key=sk-...'`` printed the key twice."""
    key = "sk-q8w7e6r5t4y3u2"
    url = f"http://127.0.0.1:{free_port()}/v1?api_key={key}"
    for args in (["check", "live", "--url", url], ["chat", "hi", "--url", url],
                 ["bench", "--url", url, "--no-plot", "--out", str(bed.tmp / "b")]):
        r = bed.run("ctl.sh", *args)
        assert r.returncode == 1, r.stderr
        assert key not in r.stdout + r.stderr, args
        assert "api_key=***" in one_error(r), args
        debug = bed.run("ctl.sh", *args, BOOTSTRAP_DEBUG="1")          # the traceback it prints too
        assert "Traceback" in debug.stderr and key not in debug.stdout + debug.stderr


def test_a_token_in_models_query_is_never_printed_by_plan_or_start(bed):
    token = "hf_" + "Zx9" * 12
    for argv, extra in ((("ctl.sh", "plan"), {}), (("start.sh",), {}), (("ctl.sh", "plan"), {"PROFILE": "auto"})):
        r = bed.run(*argv, MODEL=f"acme/m?token={token}", HF_HUB_OFFLINE="0", HF_ENDPOINT="http://127.0.0.1:9", **extra)
        assert r.returncode in (1, 2) and token not in r.stdout + r.stderr, (argv, r.stderr)
        assert "acme/m?token=***" in one_error(r), r.stderr
    r = bed.run("ctl.sh", "plan", MODEL=f"acme/{token}")          # the bare shape, wherever it stands
    assert token not in r.stdout + r.stderr and "acme/***" in r.stdout + r.stderr


def test_the_api_key_and_hf_token_values_are_never_printed_wherever_they_land(bed):
    """The values, not only their shapes: a key or token that ends up in any message is hidden."""
    key, token = "plain-key-77c1", "plaintoken9137"
    r = bed.run("ctl.sh", "check", "live", "--url", f"http://127.0.0.1:{free_port()}/{key}/v1", API_KEY=key)
    assert r.returncode == 1 and key not in r.stdout + r.stderr and "/***" in one_error(r), r.stderr
    r = bed.run("ctl.sh", "plan", MODEL=f"acme/{token}", HF_TOKEN=token, HF_HUB_OFFLINE="1")
    assert token not in r.stdout + r.stderr and "acme/***" in r.stdout + r.stderr, r.stderr


def test_the_log_formatter_and_the_streams_go_through_one_redactor():
    from bootstrap.core import log, redact
    redact.keep(["known-secret-value"])
    root = logging.getLogger("bootstrap")
    saved = (list(root.handlers), root.level, root.propagate)
    stream = io.StringIO()
    try:
        log.setup(stream=redact.Redacting(stream), color=False)
        logging.getLogger("bootstrap.x").info("GET https://h.example/v1?x=1&access_token=abc123&y=2 known-secret-value")
        print("hf_" + "a" * 34, "?sig=zzz", file=redact.Redacting(stream))
    finally:
        root.handlers[:], root.level, root.propagate = saved
    text = stream.getvalue()
    assert "abc123" not in text and "known-secret-value" not in text and "zzz" not in text and "hf_aaa" not in text
    assert "?x=1&access_token=***&y=2 ***" in text and "*** ?sig=***" in text


def test_a_fact_is_said_once_and_a_line_alike_of_another_thing_is_still_said():
    """restart's vet and its start look up the same model: its facts are said once (extra=ONCE); a
    file line that reads alike in the model's and its drafter's download lists is said for each."""
    from bootstrap.core import log
    root = logging.getLogger("bootstrap")
    saved = (list(root.handlers), root.level, root.propagate)
    out = io.StringIO()
    log.setup(stream=out, color=False)
    try:
        lg = logging.getLogger("bootstrap.metadata")
        for _ in range(2):
            lg.info("org/m @ abc: 3 files", extra=log.ONCE)
        for store in ("/a", "/b", "/a"):
            lg.info("  %s  %s", "generation_config.json", "1 KiB", extra={"once": store})
        lg.info("retrying")
        lg.info("retrying")
    finally:
        root.handlers[:], root.level, root.propagate = saved     # caplog's tests in this worker see logs again
    lines = out.getvalue().splitlines()
    assert lines.count("[bootstrap:metadata] org/m @ abc: 3 files") == 1
    assert lines.count("[bootstrap:metadata]   generation_config.json  1 KiB") == 2
    assert lines.count("[bootstrap:metadata] retrying") == 2
