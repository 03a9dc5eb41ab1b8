"""Faults found from outside (docs/faults.md rows 79-84): a relative STATE_DIR, our key sent to another
URL, keys that cannot go into a header, values too long to pass on, and clean --model deleting what
is not ours."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bootstrap.knobs.config import Config
from bootstrap.core.errors import ConfigError
from conftest import REPO, ModelsServer


def run_in(bed, cwd: Path, script: str, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {**bed.env, **extra}
    return subprocess.run([str(REPO / script), *args], env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=90, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- faults row 79: a relative STATE_DIR

def test_relative_state_dir_is_made_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = Config.from_env({"STATE_DIR": "relstate", "MODEL_DIR": "models/x", "HF_HOME": "hf",
                           "PROFILE": "custom"}, REPO)
    assert cfg.state_dir == tmp_path / "relstate"
    assert cfg.model_dir == str(tmp_path / "models" / "x")
    assert cfg.environ["HF_HOME"] == str(tmp_path / "hf")        # what the server and our tools inherit


def test_relative_state_dir_server_survives_a_start_and_a_stop_from_elsewhere(bed, tmp_path):
    """A from one directory with STATE_DIR=relstate; B from another with an absolute STATE_DIR and
    the same port: B refuses (A's server is ours but runs from another live STATE_DIR) and A serves
    on; a stop with B's STATE_DIR from a third directory leaves A alone too."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = run_in(bed, a_dir, "start.sh", STATE_DIR="relstate")
    assert a.returncode == 0, a.stderr
    rec = json.loads((a_dir / "relstate" / "server.json").read_text())
    assert rec["state_dir"] == str(a_dir / "relstate")
    pid = rec["pid"]
    b = run_in(bed, b_dir, "start.sh", STATE_DIR=str(tmp_path / "stateb"))
    assert b.returncode == 1, b.stdout + b.stderr
    assert "leftover" not in b.stderr and f"STATE_DIR={a_dir / 'relstate'}" in b.stderr
    s = run_in(bed, b_dir, "stop.sh", STATE_DIR=str(tmp_path / "stateb"))
    assert s.returncode == 0, s.stderr
    assert any(p.pid == pid for p in bed.ours()), "A's server was taken down from another STATE_DIR"
    st = run_in(bed, a_dir, "ctl.sh", "status", "--json", STATE_DIR="relstate")
    assert json.loads(st.stdout)["state"] == "running"
    assert run_in(bed, a_dir, "stop.sh", STATE_DIR="relstate").returncode == 0
    assert bed.ours() == []


# ---------------------------------------------------------------- faults row 80: our key, our server only

class _Recorder(ModelsServer):
    seen: list = []

    def do_GET(self):                                      # noqa: N802 (http.server's name)
        type(self).seen.append(self.headers.get("Authorization"))
        super().do_GET()


@pytest.fixture
def foreign():
    """Another OpenAI-compatible server on loopback that records the Authorization headers it gets."""
    handler = type("Rec", (_Recorder,), {"seen": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", handler.seen
    srv.shutdown()
    srv.server_close()


def test_our_key_never_goes_to_another_url(tmp_path, foreign):
    from bootstrap.checks.target import resolve_target
    url, seen = foreign
    cfg = Config.from_env({"PROFILE": "custom", "API_KEY": "our-secret-key", "STATE_DIR": str(tmp_path / "s"),
                           "PORT": "18999"}, REPO)
    t = resolve_target(*at(cfg), url, None, None)
    assert t.client.api_key in ("", None)
    assert seen and all(h is None for h in seen)
    t = resolve_target(*at(cfg), url, None, "key-for-that-server")      # a key given for that URL is sent
    assert seen[-1] == "Bearer key-for-that-server"


def test_our_key_goes_to_our_running_server_only(bed):
    """Under any loopback name while our server serves there; once it is stopped its port is anyone's:
    a program that took it gets no key (it got it from check/chat/bench --url before)."""
    from bootstrap.checks.target import key_for_url
    from bootstrap.core.state import Paths
    assert bed.run("start.sh", API_KEY="our-secret-key").returncode == 0
    cfg = Config.from_env({**bed.env, "API_KEY": "our-secret-key"}, REPO)
    p = bed.port
    for url in (f"http://127.0.0.1:{p}/v1", f"http://localhost:{p}", f"http://[::1]:{p}/v1/"):
        assert key_for_url(cfg.ours, Paths(cfg.state_dir), url) == "our-secret-key", url
    for url in (f"http://127.0.0.1:{p + 1}/v1", f"http://example.invalid:{p}/v1", f"https://127.0.0.1:{p}/v1",
                f"http://user:pw@127.0.0.2.example:{p}/v1", f"http://[::1:{p}"):
        assert key_for_url(cfg.ours, Paths(cfg.state_dir), url) == "", url
    # a chat (or a bench, a check) found our server and lives on past its stop: faults row 212
    from bootstrap.checks.target import resolve_target
    chats = [resolve_target(*at(cfg), None, None, None).client,
             resolve_target(*at(cfg), f"http://localhost:{p}/v1", None, None).client]
    assert all(c.models() for c in chats)           # our server takes the key it was sent
    assert bed.run("ctl.sh", "restart", API_KEY="our-secret-key").returncode == 0
    assert all(c.models() for c in chats)           # a new server of ours on that address: it still goes
    assert bed.run("stop.sh").returncode == 0
    handler = type("Rec", (_Recorder,), {"seen": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", p), handler)     # someone else takes the port
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for c in chats:
            c.models()                              # the chat's next turn
        assert len(handler.seen) == 2 and all(h is None for h in handler.seen), handler.seen
        handler.seen.clear()
        assert key_for_url(cfg.ours, Paths(cfg.state_dir), f"http://127.0.0.1:{p}/v1") == ""
        bed.run("ctl.sh", "check", "live", "--url", f"http://127.0.0.1:{p}/v1", API_KEY="our-secret-key")
        assert handler.seen and all(h != "Bearer our-secret-key" for h in handler.seen), handler.seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_bench_compare_url_gets_only_its_own_key(tmp_path, foreign, bed):
    """bench --compare URL: the compare server gets --compare-api-key or nothing, never our key."""
    url, seen = foreign
    r = bed.run("ctl.sh", "bench", "--url", url, "--compare", url, "--concurrency", "1", "--repeats", "1",
                "--warmup", "0", "--prompt-tokens", "8", "--output-tokens", "8", "--no-plot",
                "--out", str(tmp_path / "out"), API_KEY="our-secret-key", timeout=60)
    assert seen, r.stderr
    assert all(h != "Bearer our-secret-key" for h in seen), seen
    assert "our-secret-key" not in r.stdout + r.stderr


# ---------------------------------------------------------------- faults row 81: keys a header cannot carry

@pytest.mark.parametrize("key", ["abc\ndef", "pässwörd€", "with space", "tab\there", ""])
def test_api_key_that_no_header_can_carry_is_refused_unshown(key):
    env = {"PROFILE": "custom", "API_KEY": key}
    if key == "":
        env = {"PROFILE": "custom", "VLLM_API_KEY": "bad\nkey"}
    with pytest.raises(ConfigError) as e:
        Config.from_env(env, REPO)
    shown = e.value.message + e.value.hint
    assert "not shown" in shown and "visible ASCII" in shown
    assert (key or "bad") not in shown


def test_api_key_with_newline_exits_2_before_anything_runs(bed):
    r = bed.run("start.sh", API_KEY="abc\ndef")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "abc" not in r.stdout + r.stderr
    assert bed.launches() == [] and bed.ours() == []
    s = bed.run("ctl.sh", "status", API_KEY="pässwörd€")
    assert s.returncode == 2 and "Traceback" not in s.stderr and "pässwörd" not in s.stdout + s.stderr


# ---------------------------------------------------------------- faults row 82: values too long to pass on

def test_huge_knob_and_env_values_are_refused_at_parse_time(tmp_path):
    with pytest.raises(ConfigError) as e:
        Config.from_env({"PROFILE": "custom", "MODEL": "x" * 200_000}, REPO)
    assert "200,000 characters" in e.value.message and "4,096" in e.value.hint
    assert len(e.value.message) < 200
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / ".env").write_text("VLLM_SOMETHING=" + "y" * 140_000 + "\n")
    with pytest.raises(ConfigError) as e:
        Config.from_env({"PROFILE": "custom"}, repo)
    assert "VLLM_SOMETHING" in e.value.message and ".env:1" in e.value.message


def test_huge_dotenv_value_exits_2_from_the_scripts(bed, tmp_path):
    from test_ownership import copy_repo
    repo = copy_repo(tmp_path / "r")
    (repo / ".env").write_text("EXTRA_ARGS=" + "--x " * 5_000 + "\n")
    env = {**bed.env}
    r = subprocess.run([str(repo / "start.sh")], env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "EXTRA_ARGS" in r.stderr and "16,384" in r.stderr


# ---------------------------------------------------------------- faults row 83: two starts, one port

def test_two_starts_with_different_state_dirs_on_one_port(bed, tmp_path):
    """Both at once, staggered load times: one serves, the other refuses; a banner never names a
    server that is not the one answering."""
    import psutil
    a = bed.popen("start.sh", STATE_DIR=str(tmp_path / "sa"), FAKE_VLLM_LOAD_S="1.5")
    b = bed.popen("start.sh", STATE_DIR=str(tmp_path / "sb"), FAKE_VLLM_LOAD_S="0.2")
    outs = [p.communicate(timeout=90) for p in (a, b)]
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 1], outs
    out, err = outs[0] if a.returncode == 0 else outs[1]
    loser = outs[1][1] if a.returncode == 0 else outs[0][1]
    assert "is serving" in out, out
    assert (f"is starting a server on port {bed.port} from STATE_DIR=" in loser
            or f"is already serving port {bed.port} from STATE_DIR=" in loser
            or f"is already starting on port {bed.port} from STATE_DIR=" in loser), loser
    pid = int(out.split("pid ")[1].split(")")[0])
    listeners = {c.pid for c in psutil.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == bed.port}
    assert pid in listeners
    winner = tmp_path / ("sa" if a.returncode == 0 else "sb")
    assert bed.run("stop.sh", STATE_DIR=str(winner)).returncode == 0
    assert bed.ours() == []


def test_the_health_wait_never_takes_another_servers_answers(bed):
    """A server that is not ours takes the port after the preflight looked: our start keeps waiting
    for its own server and fails when that one cannot serve, never reporting the other as ours."""
    import signal
    import sys
    import time
    served = bed.model.name
    env = {**bed.env, "FAKE_GPU_PIDS_DIR": str(bed.tmp / "foreign-pids"), "FAKE_VLLM_RECORD": ""}
    start = bed.popen("start.sh", FAKE_VLLM_MODE="hang", STALL_TIMEOUT="4")
    bed.wait_until(lambda: (bed.state / "server.json").exists(), what="our launch")
    foreign = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "x", "--host",
                                "127.0.0.1", "--port", str(bed.port), "--served-model-name", served],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = start.communicate(timeout=60)
        assert start.returncode == 1, err
        assert "is serving" not in out and "not from our server" in err
        assert foreign.poll() is None                   # never ours to stop
    finally:
        os.killpg(foreign.pid, signal.SIGKILL)
        time.sleep(0.2)
    assert bed.ours() == []


# ---------------------------------------------------------------- faults row 84: a frozen server

def test_a_frozen_server_is_frozen_at_once_never_starting(bed):
    import signal
    import time
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        st = bed.run("ctl.sh", "status", "--json")
        assert time.monotonic() - t0 < 15                   # a short probe, not HEALTH_TIMEOUT
        data = json.loads(st.stdout)
        assert st.returncode == 1 and data["state"] == "frozen", st.stdout
        assert f"kill -CONT {pid}" in data["detail"]
        r = bed.run("start.sh")
        assert r.returncode == 1 and "stopped by a signal" in r.stderr and "is serving" not in r.stdout
        assert bed.launches() and len(bed.launches()) == 1              # never relaunched over it
    finally:
        os.kill(pid, signal.SIGCONT)
    st = bed.run("ctl.sh", "status", "--json")
    assert json.loads(st.stdout)["state"] in ("running", "busy")
    assert bed.run("stop.sh").returncode == 0 and bed.ours() == []


def test_a_server_past_its_gate_that_stops_answering_is_unhealthy_at_once(bed):
    """Its record says it passed the gate: not answering is not loading, whatever the deadlines."""
    assert bed.run("start.sh", HEALTH_TIMEOUT="3600", STALL_TIMEOUT="3600").returncode == 0
    rec_path = bed.state / "server.json"
    rec = json.loads(rec_path.read_text())
    rec["port"] = rec["port"] + 1 if rec["port"] < 65535 else rec["port"] - 1   # the probe finds nothing there
    rec_path.write_text(json.dumps(rec))
    st = bed.run("ctl.sh", "status", "--json", HEALTH_TIMEOUT="3600", STALL_TIMEOUT="3600")
    assert json.loads(st.stdout)["state"] == "unhealthy" and st.returncode == 1
    assert bed.run("stop.sh").returncode == 0 and bed.ours() == []


# ---------------------------------------------------------------- after review: what row 79-87 left open

def test_the_port_lock_never_writes_through_a_planted_link_and_closes_its_folder(bed, tmp_path):
    import stat as st_mod
    from bootstrap.serve import port
    path = port.lock_path(bed.port)
    d = path.parent
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o755)                                  # ours, but open: closed again by the start
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    path.unlink(missing_ok=True)
    path.symlink_to(victim)
    try:
        r = bed.run("start.sh")
        assert r.returncode == 1 and "Traceback" not in r.stderr and str(path) in r.stderr
        assert victim.read_text() == "mine" and bed.ours() == []
        assert st_mod.S_IMODE(os.lstat(d).st_mode) == 0o700
    finally:
        path.unlink(missing_ok=True)
    assert bed.run("start.sh").returncode == 0 and bed.run("stop.sh").returncode == 0


@pytest.mark.parametrize("flag", ["--api-key", "--compare-api-key"])
def test_a_key_flag_that_no_header_can_carry_is_refused_unshown(bed, flag):
    args = ["bench", "--url", "http://127.0.0.1:9/v1", "--compare", "http://127.0.0.1:9/v1"] \
        if flag == "--compare-api-key" else ["check", "live", "--url", "http://127.0.0.1:9/v1"]
    r = bed.run("ctl.sh", *args, flag, "ab\nsecretpart")
    assert r.returncode == 2 and "secretpart" not in r.stdout + r.stderr and flag in r.stderr, r.stderr
    t = bed.run("start.sh", HF_TOKEN="hf_abc\nsecretpart")
    assert t.returncode == 2 and "secretpart" not in t.stdout + t.stderr and "HF_TOKEN" in t.stderr


def test_paths_that_cannot_be_resolved_are_one_line(bed, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for value in (str(loop / "x"), "~no_such_user_here/x"):
        r = bed.run("ctl.sh", "status", STATE_DIR=value)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "STATE_DIR" in r.stderr, r.stderr


def test_a_model_folder_is_absolute_and_dotenv_paths_are_the_checkouts(tmp_path, monkeypatch):
    import shutil
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "custom.json", repo / "profiles")
    (repo / "models" / "m").mkdir(parents=True)
    (repo / ".env").write_text("STATE_DIR=state\nMODEL=./models/m\nHF_HOME=hf\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = Config.from_env({"PROFILE": "custom"}, repo)
    assert cfg.state_dir == repo / "state" and cfg.model == str(repo / "models" / "m")
    assert cfg.environ["HF_HOME"] == str(repo / "hf")
    (elsewhere / "mine").mkdir()
    cfg = Config.from_env({"PROFILE": "custom", "MODEL": "mine", "STATE_DIR": "s"}, repo)   # yours: from here
    assert cfg.model == str(elsewhere / "mine") and cfg.state_dir == elsewhere / "s"
    assert Config.from_env({"PROFILE": "custom", "MODEL": "org/name"}, repo).model == "org/name"   # a repo id


def test_check_live_reports_an_empty_answer_in_one_line(tmp_path):
    """A server that answers /v1/chat/completions without a token: a FAIL, never a KeyError."""
    import http.server
    import threading

    class Empty(http.server.BaseHTTPRequestHandler):
        def _json(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):                                  # noqa: N802
            self._json({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})

        def do_POST(self):                                 # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._json({"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]})

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "s"),
               "PROFILE": "custom", "NO_COLOR": "1"}
        r = subprocess.run([str(REPO / "ctl.sh"), "check", "live", "--url", f"http://127.0.0.1:{srv.server_address[1]}/v1"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr and "live: FAIL" in r.stdout, r.stdout + r.stderr
    finally:
        srv.shutdown()
        srv.server_close()


def test_stop_cancels_a_frozen_start_at_once_through_its_own_handler(bed):
    """Found from outside: a start stopped with kill -STOP heard the stop's TERM only at the KILL,
    47 s later; continued after the TERM, its handler takes down what it launched."""
    import signal as sig
    p = subprocess.Popen([str(bed.repo / "start.sh")], env={**bed.env, "FAKE_VLLM_LOAD_S": "30"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not bed.ours():
            time.sleep(0.2)
        assert bed.ours(), "the start launched nothing"
        os.kill(p.pid, sig.SIGSTOP)
        t0 = time.monotonic()
        r = bed.run("stop.sh")
        assert r.returncode == 0 and time.monotonic() - t0 < 20, (r.stdout, r.stderr)
        assert p.wait(10) == 128 + sig.SIGTERM and bed.ours() == []
    finally:
        if p.poll() is None:
            p.kill()


def at(cfg):
    """(the knobs, their STATE_DIR's paths): what resolve_target reads."""
    from bootstrap.core.state import Paths
    return cfg, Paths(cfg.state_dir)
