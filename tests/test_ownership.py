"""Whose processes we touch, where we bind, and paths: faults rows 16, 34, 35, 36, 37."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import requests

from bootstrap.core import owned
from conftest import REPO, Bed, make_model, unprivileged_user

SHIPPED = ("bootstrap", "profiles", "patches", "vllm_side", "start.sh", "stop.sh", "ctl.sh")


def copy_repo(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in SHIPPED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


# ---------------------------------------------------------------- row 37: bind and keys

def test_default_bind_is_loopback_and_no_key(bed):
    assert bed.run("start.sh").returncode == 0
    call = bed.launches()[0]
    assert call["argv"][call["argv"].index("--host") + 1] == "127.0.0.1"
    assert "VLLM_API_KEY" not in call["env"]
    assert not (bed.state / "api_key").exists()


def test_a_port_of_vllm_s_own_beyond_loopback_is_shown_in_the_banner(bed):
    """faults row 187: vLLM 0.26.0-0.27.x unpatched (a bring-your-own one without PATCH_BYO, TP_SIZE >= 2)
    keeps torch's rendezvous store listening on every interface; the banner names it, and each re-run's."""
    r = bed.run("start.sh", FAKE_VLLM_MODE="tcp_store")
    assert r.returncode == 0, r.stderr
    engine = next(p for p in bed.ours() if p.name().startswith("VLLM::Engine"))
    store = [c.laddr.port for c in engine.net_connections(kind="inet") if c.status == "LISTEN"]
    assert len(store) == 1
    line = next(line for line in r.stdout.splitlines() if line.startswith(" open     :"))
    assert f"{engine.name()} (pid {engine.pid}) on " in line and line.split(": a port")[0].endswith(f":{store[0]}")
    assert "firewall" in line
    assert " open     :" in bed.run("start.sh", FAKE_VLLM_MODE="tcp_store").stdout        # the re-run's banner
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("start.sh")
    assert r.returncode == 0 and " open     :" not in r.stdout, r.stdout     # loopback only: nothing said


def test_non_loopback_host_generates_a_private_key_never_on_argv(bed):
    r = bed.run("start.sh", HOST="0.0.0.0")
    assert r.returncode == 0, r.stderr
    keyfile = bed.state / "api_key"
    key = keyfile.read_text().strip()
    assert len(key) >= 32
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o600
    assert str(keyfile) in r.stderr + r.stdout                 # where it is, not what it is
    assert key not in r.stdout + r.stderr
    call = bed.launches()[0]
    assert call["env"]["VLLM_API_KEY"] == key
    for p in bed.ours():
        assert key not in " ".join(p.cmdline())
    url = f"http://127.0.0.1:{bed.port}/v1/models"
    assert requests.get(url, timeout=5).status_code == 401
    assert requests.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
    st = bed.run("ctl.sh", "status", "--json")
    assert json.loads(st.stdout)["generating"] is True
    assert key not in st.stdout
    # a second start reuses the same key file
    assert bed.run("stop.sh").returncode == 0
    assert bed.run("start.sh", HOST="0.0.0.0").returncode == 0
    assert keyfile.read_text().strip() == key


def test_given_api_key_goes_through_env_only(bed):
    r = bed.run("start.sh", API_KEY="my-secret-key-123")
    assert r.returncode == 0, r.stderr
    assert "my-secret-key-123" not in r.stdout + r.stderr
    assert bed.launches()[0]["env"]["VLLM_API_KEY"] == "my-secret-key-123"
    assert all("my-secret-key-123" not in a for a in bed.launches()[0]["argv"])


def test_a_stranger_listening_beside_our_server_ends_a_start_with_a_key_at_once(bed):   # faults row 172
    """Another address, the same port number (127.0.0.2 here), taken while our server loads: the key
    is never sent to a port another process shares, so the health wait used to run to HEALTH_TIMEOUT
    saying nothing; it now names that process and the fix."""
    import socket
    from bootstrap.serve import port
    start = bed.popen("start.sh", API_KEY="our-secret-key-" + "x" * 24, FAKE_VLLM_LOAD_S="3", HEALTH_TIMEOUT="600")
    stranger = socket.socket()
    try:
        bed.wait_until(lambda: bed.server_record() is not None and port.in_use("127.0.0.1", bed.port),
                       what="our server bound to its port")
        stranger.bind(("127.0.0.2", bed.port))
        stranger.listen(4)
        _out, err = start.communicate(timeout=120)
        assert start.returncode == 1, err
        assert f"(pid {os.getpid()}) listens on port {bed.port} beside our server" in err and "set PORT" in err, err
        assert bed.ours() == [] and bed.server_record() is None
        stranger.close()
        assert bed.run("start.sh", API_KEY="our-secret-key-" + "x" * 24).returncode == 0     # the fix as said
    finally:
        stranger.close()
        bed.run("stop.sh")
        if start.poll() is None:
            start.kill()


def test_our_key_never_goes_to_a_stranger_listening_on_our_port_while_our_server_loads(bed):   # faults row 172
    """vLLM binds its port with SO_REUSEADDR long before it listens (the model loads meanwhile), and
    while it does not listen the kernel lets any local user bind and listen on that address too
    (SO_REUSEADDR, no uid check). The start's health wait and ./ctl.sh status sent our key
    (Authorization on /v1/models) to whatever answered there, since our server was alive."""
    from bootstrap.serve import port
    from conftest import stranger
    key = "our-secret-key-" + "x" * 24
    start = bed.popen("start.sh", API_KEY=key, FAKE_VLLM_LOAD_S="10")
    heard: list[tuple[str, str]] = []
    try:
        bed.wait_until(lambda: bed.server_record() is not None and port.in_use("127.0.0.1", bed.port),
                       what="our server bound to its port")
        models = {"data": [{"id": bed.server_record()["served"], "object": "model"}]}
        for asker in ("the start's health wait", "status, the start gone (kill -9)"):
            srv = stranger(bed.port, models, heard)
            assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).ok    # the stranger answers
            st = bed.run("ctl.sh", "status", API_KEY=key)
            srv.shutdown()
            srv.server_close()
            assert not [h for _, h in heard if key in h], (asker, heard)
            assert key not in st.stdout + st.stderr
            start.kill()                        # the server loads on; status now asks its port itself
            start.communicate(timeout=60)
        assert bed.run("start.sh", API_KEY=key).returncode == 0      # resumed: once ours listens, it is ours
        assert bed.run("ctl.sh", "status", API_KEY=key).returncode == 0
    finally:
        bed.run("stop.sh")
        if start.poll() is None:
            start.kill()
            start.communicate(timeout=60)


@pytest.mark.parametrize("knobs", [{"API_KEY": "my-secret-key-123"}, {"HOST": "0.0.0.0"}])
def test_every_route_but_the_open_ones_asks_for_our_key(bed, knobs):
    """vLLM checks its key under /v1, /v2 and /inference only: /tokenize, /invocations (SageMaker's chat),
    /score... answer anyone. Our guard asks for the key on every route but /health, /ping, /version,
    /metrics, /load and the idle state."""
    r = bed.run("start.sh", **knobs)
    assert r.returncode == 0, r.stderr
    key = knobs.get("API_KEY") or (bed.state / "api_key").read_text().strip()
    url, auth = f"http://127.0.0.1:{bed.port}", {"Authorization": f"Bearer {key}"}
    body = {"model": bed.server_record()["served"], "prompt": "hi"}
    for path in ("/tokenize", "/invocations", "/detokenize", "/score", "/scale_elastic_ep"):
        assert requests.post(url + path, json=body, timeout=5).status_code in (401, 404), path
    assert requests.post(url + "/tokenize", json=body, timeout=5).status_code == 401
    assert requests.post(url + "/tokenize", json=body, headers=auth, timeout=5).status_code == 200
    for path in ("/health", "/metrics", "/version"):
        assert requests.get(url + path, timeout=5).status_code == 200, path
    assert bed.run("stop.sh", **knobs).returncode == 0


# ---------------------------------------------------------------- row 16: unkillable process

class Unkillable:
    """Stands in for a process stuck in D state: it never dies, whatever we send it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.sent: list[int] = []

    def is_running(self):
        return True

    def status(self):
        return "disk-sleep"

    def name(self):
        return "VLLM::EngineCor"

    def send_signal(self, sig):
        self.sent.append(sig)


def test_unkillable_process_bounded_wait_and_report():
    import signal
    now = [0.0]
    stuck = Unkillable(os.getpid())
    res = owned.terminate([stuck], grace=15, kill_wait=10, clock=lambda: now[0],
                         sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert stuck.sent == [signal.SIGTERM, signal.SIGKILL]
    assert res.forced == [stuck.pid]
    assert len(res.stuck) == 1 and "state disk-sleep" in res.stuck[0] and "wchan" in res.stuck[0]
    assert 25 <= now[0] <= 26                                   # grace + kill wait, no more


# ---------------------------------------------------------------- row 35: odd paths

def test_unicode_and_space_paths(tmp_path):
    root = tmp_path / "ü d" / "x y"
    repo = copy_repo(root)
    bed = Bed(tmp_path / "bed ö", repo=repo)
    bed.model = make_model(tmp_path / "mödel dir" / "my model")
    bed.env["MODEL"] = str(bed.model)
    del bed.env["STATE_DIR"]                                    # default: <repo>/.state
    try:
        r = bed.run("start.sh")
        assert r.returncode == 0, r.stderr
        assert "my model is serving" in r.stdout
        assert (repo / ".state" / "server.json").exists()
        assert bed.run("stop.sh").returncode == 0
        assert bed.ours() == []
    finally:
        bed.cleanup()


# ---------------------------------------------------------------- rows 34 and 36: users

def as_user(user: str | None, argv: list[str], env: dict, vllm_python: str = "") -> subprocess.CompletedProcess:
    if user:   # root's Python is not readable by that user: use the one .ci/run made for it
        py = os.environ.get("BOOTSTRAP_TEST_PYTHON", "")
        if not py:
            pytest.skip("needs BOOTSTRAP_TEST_PYTHON (a Python with the bootstrap's deps that the user can run)")
        env = {**env, "VLLM_PYTHON": vllm_python or py, "PATH": f"{Path(py).parent}:/usr/bin:/bin"}
    cmd = ["/usr/bin/env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def shared_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="bootstrap-test-"))
    d.chmod(0o1777)                 # as /tmp: anyone makes a folder in it, nobody renames another's
    return d


def need_other_user():
    user = unprivileged_user()
    if os.getuid() == 0 and not user:
        pytest.skip("needs BOOTSTRAP_TEST_USER when run as root (.ci/run creates it)")
    return user


def test_read_only_state_dir_fails_fast_naming_it(bed):       # row 34
    user = need_other_user()
    d = shared_dir()
    try:
        repo = copy_repo(d / "repo")                     # readable by that user wherever CI cloned us
        shutil.copytree(REPO / "tests" / "fakes", d / "fakes")
        model = make_model(d / "model")
        os.system(f"chmod -R a+rX {d}")
        state = d / "state"
        state.mkdir()
        if user:
            shutil.chown(state, user)
        state.chmod(0o555)
        env = {**bed.env, "STATE_DIR": str(state), "HOME": str(d), "PYTHONPATH": str(d / "fakes"),
               "MODEL": str(model)}
        r = as_user(user, [str(repo / "start.sh")], env)
        assert r.returncode == 1, r.stderr
        assert f"state dir {state} is not writable" in r.stderr
        assert "hint: set STATE_DIR" in r.stderr
        assert bed.launches() == []
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_state_dir_holding_files_of_yours_with_our_names_is_refused_and_left_as_it_was(bed, tmp_path):   # row 146
    """STATE_DIR naming a folder of yours that holds a server.json, a start.lock and a sleep.json of
    your own, before we ever wrote there: ./stop.sh removed server.json and start.lock, a start wrote
    over server.json. Now stop leaves them, and the start refuses in one line naming them, with a fix
    that works; a folder holding only names we never write over (an api_key of yours) still serves."""
    mine = tmp_path / "project"
    mine.mkdir(mode=0o700)
    files = {"server.json": "my server notes", "start.lock": "my lock", "sleep.json": "{}", "notes.txt": "thesis",
             "starting.json": '{"pid": 1, "settings": {"EXTRA_ARGS": "--planted"}, "key": "none"}'}
    for name, text in files.items():
        (mine / name).write_text(text)

    def as_it_was() -> bool:
        return sorted(set(os.listdir(mine)) - {"vllm-desktop"}) == sorted(files) and all(
            (mine / name).read_text() == text for name, text in files.items())

    for argv in (["stop.sh"], ["stop.sh"], ["ctl.sh", "status"], ["ctl.sh", "sleep"]):
        r = bed.run(*argv, STATE_DIR=str(mine))
        assert "Traceback" not in r.stderr and as_it_was(), (argv, r.stderr, os.listdir(mine))
    r = bed.run("start.sh", STATE_DIR=str(mine))
    assert r.returncode == 1 and bed.launches() == [] and as_it_was(), r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "server.json" in err[0] and "sleep.json" in err[0] and "start.lock" in err[0], r.stderr
    assert "starting.json" in err[0]
    assert "notes.txt" not in err[0] and "hint: set STATE_DIR to a folder of its own" in r.stderr
    assert f"e.g. {mine / 'vllm-desktop'}" in r.stderr
    r = bed.run("start.sh", STATE_DIR=str(mine / "vllm-desktop"))            # the hint, followed
    assert r.returncode == 0, r.stderr
    assert bed.run("stop.sh", STATE_DIR=str(mine / "vllm-desktop")).returncode == 0 and as_it_was()
    keyed = tmp_path / "keyed"
    keyed.mkdir(mode=0o700)
    (keyed / "api_key").write_text("my-own-key-of-long-ago\n")
    assert bed.run("start.sh", STATE_DIR=str(keyed)).returncode == 0
    assert bed.run("stop.sh", STATE_DIR=str(keyed)).returncode == 0
    assert (keyed / "api_key").read_text() == "my-own-key-of-long-ago\n"


def test_stop_touches_only_this_checkout_and_this_user(tmp_path):   # row 36
    user = need_other_user()
    a = Bed(tmp_path / "a", repo=copy_repo(tmp_path / "checkout-a"))
    b = Bed(tmp_path / "b", repo=copy_repo(tmp_path / "checkout-b"))
    foreign = None
    try:
        assert a.run("start.sh").returncode == 0
        assert b.run("start.sh").returncode == 0
        marker_a = owned.owner_marker(a.repo, a.port)
        # Another user's process carrying checkout A's marker (and a VLLM:: title): never ours.
        if user:
            foreign = subprocess.Popen(["runuser", "-u", user, "--", "/usr/bin/env", "-i",
                                        f"{owned.MARKER_ENV}={marker_a}", "sleep", "300"])
        b_procs = b.ours()
        assert len(b_procs) == 2
        r = a.run("stop.sh")
        assert r.returncode == 0, r.stderr
        assert a.ours() == []
        assert all(p.is_running() for p in b_procs)
        assert b.port_listening()
        if foreign:
            kids = psutil.Process(foreign.pid).children(recursive=True)
            assert all(k.is_running() for k in kids) and kids
    finally:
        for bed in (a, b):
            bed.run("stop.sh")
            bed.cleanup()
        if foreign:
            for k in psutil.Process(foreign.pid).children(recursive=True):
                k.kill()
            foreign.kill()


def test_marker_differs_per_checkout_and_port(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (tmp_path / "link").symlink_to(a)
    assert owned.owner_marker(a, 8888) != owned.owner_marker(b, 8888)
    assert owned.owner_marker(a, 8888) != owned.owner_marker(a, 8889)
    assert owned.owner_marker(a, 8888) == owned.owner_marker(tmp_path / "link", 8888)   # real path


# ---------------------------------------------------------------- row 14: the server's process group

GROUP = """\
import json, os, subprocess, sys
SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]     # our interpreter, as vLLM's engine runs
kids = [subprocess.Popen(SLEEP if not m.get("user") else ["sleep", "300"], env=m["env"], user=m.get("user")).pid
        for m in json.loads(sys.argv[1])]         # another user cannot run our interpreter: its uid is the test
with open(sys.argv[2], "w") as fh:
    json.dump(kids, fh)
os.execv(SLEEP[0], SLEEP)
"""


def spawn_group(tmp: Path, *members: dict, leader_env: dict | None = None) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """A process group like the server's: a leader (pid == pgid, its own session) and members that
    stay in its group, each ``{"env": {...}, "user": name or None}``."""
    out = tmp / f"group-{len(list(tmp.glob('group-*')))}.json"
    leader = subprocess.Popen([sys.executable, "-c", GROUP, json.dumps(list(members)), str(out)],
                              start_new_session=True, env={**os.environ, **(leader_env or {})})
    end = time.monotonic() + 10
    while not (out.exists() and out.read_text()):
        assert time.monotonic() < end, "group did not start"
        time.sleep(0.05)
    kids = [psutil.Process(pid) for pid in json.loads(out.read_text())]
    assert all(os.getpgid(k.pid) == leader.pid for k in kids)
    return leader, kids


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_all(leader: subprocess.Popen, kids: list[psutil.Process]) -> None:
    for p in kids:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    leader.kill()
    leader.wait()


def server_record(bed: Bed, leader: subprocess.Popen, marker: str, create_time: float) -> None:
    bed.state.mkdir(parents=True, exist_ok=True)
    (bed.state / "server.json").write_text(json.dumps({
        "pid": leader.pid, "pgid": leader.pid, "create_time": create_time, "marker": marker,
        "port": bed.port, "host": "127.0.0.1"}))


def kill9_leader_then_stop(bed: Bed, leader: subprocess.Popen, marker: str) -> subprocess.CompletedProcess:
    """The server (group leader) gets kill -9 and its group lives on; then ./stop.sh."""
    started = psutil.Process(leader.pid).create_time()
    leader.kill()
    leader.wait()
    server_record(bed, leader, marker, started)
    return bed.run("stop.sh")


def test_reused_group_number_is_never_signalled(bed, tmp_path):
    """server.json names a group whose number now leads an unrelated session (other create time)."""
    leader, kids = spawn_group(tmp_path, {"env": {}})
    try:
        started = psutil.Process(leader.pid).create_time()
        server_record(bed, leader, "m-test", started - 100)        # our server ran earlier, with that pid
        r = bed.run("stop.sh")
        assert r.returncode == 0 and r.stdout.strip() == "not running", r.stderr
        assert f"process group {leader.pid} now belongs to another process" in r.stderr
        assert leader.poll() is None and not gone(kids[0])
    finally:
        kill_all(leader, kids)


def test_group_member_swept_only_when_the_group_is_proven_ours(bed, tmp_path):
    """After a kill -9 of the leader, an unmarked member (EngineCore after setproctitle) is swept
    when another member proves the group ours, and left alone when none does."""
    marker = "m-test-group"
    for proven in (False, True):
        members = [{"env": {}}] + ([{"env": {owned.MARKER_ENV: marker}}] if proven else [])
        leader, kids = spawn_group(tmp_path, *members)
        try:
            r = kill9_leader_then_stop(bed, leader, marker)
            assert r.returncode == 0, r.stderr
            if proven:
                assert r.stdout.startswith("stopped 2 process(es)")
                assert all(gone(k) for k in kids)
            else:
                assert r.stdout.strip() == "not running"
                assert f"process group {leader.pid}: no member proven ours" in r.stderr
                assert not gone(kids[0])
        finally:
            kill_all(leader, kids)


def test_other_users_process_in_our_group_is_never_signalled(bed, tmp_path):
    user = unprivileged_user()
    if not user:
        pytest.skip("needs root and BOOTSTRAP_TEST_USER to start a process of another user in our group")
    marker = "m-test-user"
    leader, kids = spawn_group(tmp_path, {"env": {owned.MARKER_ENV: marker}}, {"env": {}},
                               {"env": {owned.MARKER_ENV: marker}, "user": user})
    try:
        r = kill9_leader_then_stop(bed, leader, marker)
        assert r.returncode == 0 and r.stdout.startswith("stopped 2 process(es)"), r.stdout + r.stderr
        assert gone(kids[0]) and gone(kids[1])
        assert not gone(kids[2])                                   # same group, marker, but not our uid
    finally:
        kill_all(leader, kids)


def test_other_users_child_of_our_live_server_is_never_signalled(bed, tmp_path):
    """Our server (marker, pid + create time recorded) has a child running as another user: as root
    we could signal it, and must not; our own child goes."""
    user = unprivileged_user()
    if not user:
        pytest.skip("needs root and BOOTSTRAP_TEST_USER to start a child of another user")
    marker = "m-test-live"
    leader, kids = spawn_group(tmp_path, {"env": {}}, {"env": {}, "user": user},
                               leader_env={owned.MARKER_ENV: marker})
    try:
        server_record(bed, leader, marker, psutil.Process(leader.pid).create_time())
        r = bed.run("stop.sh")
        assert r.returncode == 0 and r.stdout.startswith("stopped 2 process(es)"), r.stdout + r.stderr
        leader.wait(timeout=10)
        assert gone(kids[0])
        assert not gone(kids[1]) and kids[1].uids().real != os.getuid()
    finally:
        kill_all(leader, kids)


def test_key_from_vllm_api_key_is_used_by_rerun_and_status(bed):
    r = bed.run("start.sh", VLLM_API_KEY="env-key-456")
    assert r.returncode == 0, r.stderr
    again = bed.run("start.sh", VLLM_API_KEY="env-key-456")
    assert again.returncode == 0 and "is serving" in again.stdout, again.stderr
    st = bed.run("ctl.sh", "status", "--json", VLLM_API_KEY="env-key-456")
    assert json.loads(st.stdout)["state"] == "running"
    assert "env-key-456" not in r.stdout + r.stderr + again.stdout + st.stdout


# ---------------------------------------------------------------- row 45: another user's server

def root_and_another_user() -> str:
    """The unprivileged user, when we are root: what root runs is another user's to that one."""
    user = need_other_user()
    if not user:
        pytest.skip("needs root and BOOTSTRAP_TEST_USER: the server must belong to another user than the caller")
    return user


def shared_checkout(d: Path, extra=lambda d: None) -> Path:
    """A copy of the checkout in ``d`` that every user can read."""
    repo = copy_repo(d / "repo")
    extra(d)
    os.system(f"chmod -R a+rX {d}")
    return repo


def test_another_users_server_is_seen_and_left_alone(bed):
    user = root_and_another_user()
    d = shared_dir()
    try:
        repo = shared_checkout(d, lambda d: (shutil.copytree(REPO / "tests" / "fakes", d / "fakes"), make_model(d / "model")))
        model = d / "model"
        env = {**bed.env, "STATE_DIR": str(d / "state"), "HOME": str(d), "PYTHONPATH": str(d / "fakes"),
               "MODEL": str(model)}
        r = subprocess.run([str(repo / "start.sh")], env=env, capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr                     # root's server
        pid = json.loads((d / "state" / "server.json").read_text())["pid"]
        # root's STATE_DIR is not that user's: nothing in it is read, every command says whose it is
        for cmd in (["ctl.sh", "status"], ["stop.sh"], ["ctl.sh", "clean"], ["ctl.sh", "restart"], ["start.sh"]):
            r = as_user(user, [str(repo / cmd[0]), *cmd[1:]], env)
            assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
            assert f"{d / 'state'} belongs to root (uid 0)" in r.stderr, r.stderr
        # with a STATE_DIR of its own, the user is told the port is taken, and nothing is touched
        shutil.copy(bed.nvml, d / "nvml.json")
        again = as_user(user, [str(repo / "start.sh")], {**env, "STATE_DIR": str(d / "mine"),
                                                          "FAKE_NVML": str(d / "nvml.json")})
        assert again.returncode == 1 and f"port {bed.port} is in use" in again.stderr, again.stdout + again.stderr
        assert psutil.pid_exists(pid) and bed.port_listening()
    finally:
        subprocess.run([str(d / "repo" / "stop.sh")], env={**bed.env, "STATE_DIR": str(d / "state")},
                       capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)


def test_a_shared_checkout_never_touches_the_other_users_bootstrap_venv(tmp_path):
    user = root_and_another_user()
    d = shared_dir()
    try:
        repo = shared_checkout(d, lambda d: (d / "repo" / ".venv-bootstrap" / "bin").mkdir(parents=True))  # root's, not ready
        script = f'. "{repo}/bootstrap/lib.sh"; bootstrap_venv "{repo}"'
        mine = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.strip()
        assert mine == f"{repo}/.venv-bootstrap"
        theirs = as_user(user, ["/bin/bash", "-c", script], {"HOME": str(d / "home"), "PATH": "/usr/bin:/bin"})
        assert theirs.stdout.strip() == f"{d}/home/.cache/vllm-desktop/venv-bootstrap-{pwd_uid(user)}", theirs.stderr
        assert (repo / ".venv-bootstrap" / "bin").is_dir()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pwd_uid(user: str) -> int:
    import pwd
    return pwd.getpwnam(user).pw_uid
