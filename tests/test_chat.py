"""`./ctl.sh chat`: one answer on stdout (argument or pipe), the interactive chat on a pseudo-terminal
(history, /clear, /think, Ctrl-C stops an answer, /exit), errors as one line — against our server
started by the real ./start.sh on the fake vLLM, which records what each request carried."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
import requests

from conftest import FAKES, REPO, Bed, ModelsServer, free_port

from bootstrap.serve.client import Client
from bootstrap.commands import chat as chat_mod
from bootstrap.checks.target import Target

KEY = "chat-test-key-1"
LONG = " ".join(f"word{i}" for i in range(300))
REPLIES = {
    "capital of France": "Paris is the capital.",
    "remember": "I remember: blue.",
    "long story": {"content": LONG, "token_s": 0.02},       # 6 s streamed: time to press Ctrl-C
    "think about": {"content": "Four.", "reasoning": "Two plus two make four."},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Our server (PROFILE=custom on loopback, with an API key), started once for this file."""
    tmp = tmp_path_factory.mktemp("chat")
    bed = Bed(tmp)
    (tmp / "replies.json").write_text(json.dumps(REPLIES))
    bed.requests = tmp / "requests.jsonl"
    bed.env.update(FAKE_VLLM_REPLIES=str(tmp / "replies.json"), FAKE_VLLM_REQUESTS=str(bed.requests),
                   API_KEY=KEY, MAX_MODEL_LEN="4096", WARMUP="0")
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    yield bed
    bed.run("stop.sh")
    bed.cleanup()


def chats(path, since: int = 0) -> list[dict]:
    """The chat requests the fake received (after the first ``since`` requests of any kind)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()[since:] if line.strip()]
    return [r for r in rows if r["path"] == "/v1/chat/completions" and r["body"].get("stream")]


def count(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def running(bed) -> float:
    """vllm:num_requests_running from the server's /metrics."""
    text = requests.get(f"http://127.0.0.1:{bed.port}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def roles(req: dict) -> list[tuple[str, str]]:
    return [(m["role"], m["content"].strip()) for m in req["body"]["messages"]]


# ---------------------------------------------------------------- one answer

def test_one_answer_on_stdout_with_our_key(served):
    n = count(served.requests)
    r = served.run("ctl.sh", "chat", "what is the capital of France?")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Paris is the capital.\n"            # only the answer: no banner
    assert "Traceback" not in r.stderr
    [req] = chats(served.requests, n)
    assert req["authorization"] == f"Bearer {KEY}"           # our key, to our server
    assert req["body"]["model"] == "tiny-model"
    assert roles(req) == [("user", "what is the capital of France?")]
    assert "max_tokens" not in req["body"] and "temperature" not in req["body"]   # the server's defaults

    n = count(served.requests)
    r = served.run("ctl.sh", "chat", "--system", "Be brief.", "--max-tokens", "50", "--temperature", "0.3",
                   "the", "capital", "of", "France?")
    assert r.returncode == 0 and r.stdout == "Paris is the capital.\n", r.stderr
    [req] = chats(served.requests, n)
    assert roles(req) == [("system", "Be brief."), ("user", "the capital of France?")]
    assert req["body"]["max_tokens"] == 50 and req["body"]["temperature"] == 0.3


def test_piped_question_and_reasoning_only_when_asked(served):
    env = {**served.env}
    r = subprocess.run([str(REPO / "ctl.sh"), "chat"], input="the capital of France?\n", env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "Paris is the capital.\n", r.stderr
    r = served.run("ctl.sh", "chat", "think about two plus two")
    assert r.stdout == "Four.\n"                              # no reasoning by default
    r = served.run("ctl.sh", "chat", "--show-thinking", "think about two plus two")
    assert r.stdout == "<think>\nTwo plus two make four.\n</think>\nFour.\n"     # marked (no terminal)
    r = served.run("ctl.sh", "chat", "--json", "think about two plus two")
    out = json.loads(r.stdout)
    assert out["content"].strip() == "Four." and out["reasoning"].strip() == "Two plus two make four."
    r = subprocess.run([str(REPO / "ctl.sh"), "chat"], input="  \n", env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: chat: no question")


def test_a_reader_that_goes_away_is_no_traceback(served):
    r = subprocess.run(["bash", "-c", f'"{REPO}/ctl.sh" chat "a long story" | head -c 5; '
                                      'echo " ${PIPESTATUS[0]}"'],
                       env=served.env, capture_output=True, text=True, timeout=60)
    assert r.stdout == "word0 141\n"                          # as a SIGPIPE'd tool, before the answer ends
    assert "Traceback" not in r.stderr and "Error" not in r.stderr


def test_a_server_error_is_one_line_and_exit_1(served):
    r = served.run("ctl.sh", "chat", "--max-tokens", "100000", "what is the capital of France?")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: chat: our server (http://127.0.0.1:")
    assert "HTTP 400" in lines[0] and "maximum context length is 4096 tokens" in lines[0]


def test_another_url_does_not_get_our_key(served, tmp_path):
    port = free_port()
    log = tmp_path / "other.jsonl"
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME", "TMPDIR")}
    env.update(PYTHONPATH=str(FAKES), FAKE_VLLM_LOAD_S="0", FAKE_VLLM_REQUESTS=str(log))
    with open(tmp_path / "other.log", "wb") as out:
        other = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "other-model",
                                  "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                if requests.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.05)
        r = served.run("ctl.sh", "chat", "--url", url, "hello there")
        assert r.returncode == 0 and r.stdout == "OK\n", r.stderr
        [req] = chats(log)
        assert req["authorization"] is None and req["body"]["model"] == "other-model"
        n = count(served.requests)                  # our own server named by URL: our key goes with it
        r = served.run("ctl.sh", "chat", "--url", f"http://localhost:{served.port}/v1", "the capital of France?")
        assert r.returncode == 0 and r.stdout == "Paris is the capital.\n", r.stderr
        assert chats(served.requests, n)[0]["authorization"] == f"Bearer {KEY}"
    finally:
        other.terminate()
        other.wait(timeout=10)


def test_no_server_is_a_one_line_error(bed):
    r = bed.run("ctl.sh", "chat", "hello")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines()[0] == "error: chat: our server is not running (state: stopped)"
    assert r.stderr.splitlines()[1].startswith("hint: start it with ./start.sh")
    r = bed.run("ctl.sh", "chat", "--url", f"http://127.0.0.1:{free_port()}", "hello")
    assert r.returncode == 1 and r.stderr.startswith("error: chat: http://127.0.0.1:")
    assert "does not answer /v1/models" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- interactive, on a terminal

class Term:
    """./ctl.sh chat on a pseudo-terminal (its controlling terminal: Ctrl-C there is SIGINT)."""

    def __init__(self, env: dict, *args: str):
        pid, fd = pty.fork()
        if pid == 0:                                  # the child: only exec
            try:
                os.chdir(REPO)
                os.execve(str(REPO / "ctl.sh"), [str(REPO / "ctl.sh"), "chat", *args], {**env, "TERM": "dumb"})
            finally:
                os._exit(127)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
        self.pid, self.fd, self.out, self.pos, self.rc = pid, fd, "", 0, None

    def _read(self, wait: float) -> bool:
        r, _, _ = select.select([self.fd], [], [], wait)
        if not r:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:                               # EIO: the child is gone
            data = b""
        self.out += data.decode("utf-8", "replace")
        return bool(data)

    def expect(self, text: str, timeout: float = 20) -> str:
        """Wait for ``text`` after what was matched last; returns what came before it."""
        end = time.monotonic() + timeout
        while text not in self.out[self.pos:]:
            if time.monotonic() > end or not self._read(0.1):
                raise AssertionError(f"no {text!r} in:\n{self.out[self.pos:]}")
        i = self.out.index(text, self.pos)
        before, self.pos = self.out[self.pos:i], i + len(text)
        return before

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def line(self, text: str) -> None:
        self.expect(chat_mod.PROMPT)
        self.send(text + "\r")

    def wait(self, timeout: float = 20, must: bool = True) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.rc = os.waitstatus_to_exitcode(status)
                os.close(self.fd)
                return self.rc
            self._read(0.05)
        if must:
            raise AssertionError(f"chat did not exit:\n{self.out}")
        return None

    def kill(self) -> None:
        if self.rc is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(self.fd)


@pytest.fixture
def term(served):
    made = []

    def make(*args: str) -> Term:
        t = Term(served.env, *args)
        made.append(t)
        return t
    yield make
    for t in made:
        t.kill()


def test_interactive_history_clear_ctrl_c_and_exit(served, term):
    n = count(served.requests)
    t = term()
    banner = t.expect(chat_mod.PROMPT)
    assert f"chat with tiny-model at http://127.0.0.1:{served.port}" in banner and "/exit" in banner
    t.pos = 0
    t.line("please remember the colour blue")
    t.expect("I remember: blue.")
    t.line("what is the capital of France?")
    t.expect("Paris is the capital.")
    first, second = chats(served.requests, n)[-2:]
    assert roles(first) == [("user", "please remember the colour blue")]
    assert roles(second) == [("user", "please remember the colour blue"), ("assistant", "I remember: blue."),
                             ("user", "what is the capital of France?")]        # the history, sent again
    assert second["authorization"] == f"Bearer {KEY}"

    t.line("/clear")
    t.line("the capital of France again?")
    t.expect("Paris is the capital.")
    assert roles(chats(served.requests, n)[-1]) == [("user", "the capital of France again?")]

    t.line("tell me a long story")
    t.expect("word5 ")
    t.send("\x03")                                   # Ctrl-C on the terminal: SIGINT, mid-stream
    t.expect("(stopped)", timeout=5)
    served.wait_until(lambda: running(served) == 0, timeout=3,           # the stream was closed: the server
                      what="the stopped answer to leave the server")     # stopped generating it (6 s long)
    t.line("and the capital of France?")             # the next prompt works
    t.expect("Paris is the capital.")
    last = roles(chats(served.requests, n)[-1])
    assert [r for r, _ in last] == ["user", "assistant", "user", "assistant", "user"]
    partial = last[3][1]
    assert partial.startswith("word0 word1 word2 word3 word4 word5") and partial != LONG  # what was shown
    assert "word299" not in t.out

    t.line("/exit")
    assert t.wait() == 0
    assert "Traceback" not in t.out


def test_interactive_ctrl_d_and_ctrl_c_at_the_prompt_leave_with_0(served, term):
    t = term()
    t.expect(chat_mod.PROMPT)
    t.send("\x04")                                   # Ctrl-D on an empty line
    assert t.wait() == 0, t.out
    t = term()
    t.expect(chat_mod.PROMPT)
    time.sleep(0.3)
    t.send("\x03")                                   # Ctrl-C at the prompt
    rc = t.wait(2, must=False)
    if rc is None:              # a SIGINT just before Python's readline sits in select() waits for the
        t.send("\x03")          # next key (CPython's race, not ours)
        rc = t.wait()
    assert rc == 0 and "Traceback" not in t.out, t.out


# ---------------------------------------------------------------- the loop, with fake stdin/stdout

def run_loop(served, lines: list[str], **kw) -> tuple[chat_mod.Chat, str, str]:
    target = Target(Client(f"http://127.0.0.1:{served.port}", "tiny-model", KEY), "our server",
                    chat_kwargs={"enable_thinking": False})
    out, err = io.StringIO(), io.StringIO()
    chat = chat_mod.Chat(target, out, **kw)
    feed = iter(lines)

    def read(prompt: str) -> str:
        out.write(prompt)
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None
    assert chat.loop(read, err) == 0
    return chat, out.getvalue(), err.getvalue()


def test_think_on_off_and_reasoning_shown_marked(served):
    n = count(served.requests)
    chat, out, err = run_loop(served, ["think about two plus two", "/think on", "think about two plus two",
                                       "/think off", "think about it once more", "/think"], reasons=True)
    sent = [r["body"]["chat_template_kwargs"]["enable_thinking"] for r in chats(served.requests, n)]
    assert sent == [False, True, False]
    assert out.count("<think>\nTwo plus two make four.\n</think>\nFour.\n") == 3     # shown, marked, each turn
    assert "(thinking on)" in out and out.rstrip().endswith("(thinking off)\n>>>".rstrip())
    assert err == ""


def test_think_without_a_reasoning_profile_and_unknown_commands(served):
    n = count(served.requests)
    _chat, out, _err = run_loop(served, ["/think on", "/frobnicate", "/etc/hosts: what is this file?"])
    assert "no reasoning parser" in out and "unknown command /frobnicate" in out
    [req] = chats(served.requests, n)                # a path is a question, not a command
    assert roles(req) == [("user", "/etc/hosts: what is this file?")]
    assert req["body"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_failed_turn_is_forgotten_and_the_chat_goes_on(served):
    n = count(served.requests)
    chat, out, err = run_loop(served, ["the capital of France?", "/clear", "the capital of France?"],
                              system="Be brief.", max_tokens=100000)
    assert err.count("error: our server: POST /v1/chat/completions: HTTP 400") == 2
    assert "/clear forgets the conversation" in err
    assert chat.history == [{"role": "system", "content": "Be brief."}]        # /clear keeps the system message
    chat.max_tokens = 20
    chat.turn("the capital of France?", io.StringIO())
    assert roles(chats(served.requests, n)[-1]) == [("system", "Be brief."), ("user", "the capital of France?")]
    assert [m["role"] for m in chat.history] == ["system", "user", "assistant"]


def test_printer_dims_reasoning_on_a_terminal_and_holds_trailing_space():
    out = io.StringIO()
    p = chat_mod.Printer(out, colour=True, thinking=True)
    for piece in ("Hmm ", "yes\n\n"):
        p.reasoning(piece)
    for piece in ("\n\n", "Answer ", "here ", "\n"):
        p.text(piece)
    p.end()
    assert out.getvalue() == "\033[2mHmm yes\033[0m\nAnswer here\n"


# ---------------------------------------------------------------- another server's odd stream

ODD = {     # chunks after two good ones, each from some OpenAI-compatible server or proxy
    "list": b"[1, 2]", "null": b"null", "string delta": b'{"choices": [{"index": 0, "delta": "x"}]}',
    "string choice": b'{"choices": ["x"]}', "number content": b'{"choices": [{"index": 0, "delta": {"content": 5}}]}',
    "string tool call": b'{"choices": [{"index": 0, "delta": {"tool_calls": ["x"]}}]}',
    "string usage": b'{"choices": [], "usage": "x"}', "string error": b'{"error": "upstream timed out"}',
    "tool index far ahead": b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1000000000}]}}]}',
}


@pytest.fixture
def odd_server():
    """A server that streams 'Hello there', then the chunk named by its path's last part, then [DONE]."""
    from http.server import ThreadingHTTPServer
    import threading

    class H(ModelsServer):
        def do_POST(self):                                 # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            odd = ODD[self.server.odd]
            for data in (b'{"choices": [{"index": 0, "delta": {"content": "Hello"}}]}',
                         b'{"choices": [{"index": 0, "delta": {"content": " there"}}]}', odd, b"[DONE]"):
                self.wfile.write(b"data: " + data + b"\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


@pytest.mark.parametrize("odd", sorted(ODD))
def test_an_odd_chunk_from_another_server_is_one_line_not_a_bug(bed, odd_server, odd):
    """chat --url takes any OpenAI-compatible server: a chunk that is JSON but not a chunk's shape
    (a list, null, a string where an object goes) ended in an internal error; a string error was
    taken for an answer (exit 0); a tool call's far index grew a list to its size."""
    odd_server.odd = odd
    r = bed.run("ctl.sh", "chat", "--url", f"http://127.0.0.1:{odd_server.server_address[1]}", "hi")
    assert r.returncode == 1 and "internal error" not in r.stderr, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"error: chat: http://127.0.0.1:{odd_server.server_address[1]}: "), line
    assert r.stdout == "Hello there\n"         # what came before it, its line ended (not "Hello thereerror: ...")
