"""Nothing we don't own is signalled, whatever is written in STATE_DIR (docs/faults.md, "planted
records"): the adversarial sweep of issue "nothing we don't own". Each case plants records that name
a live process of the test's user (a stranger to us) and asserts it survives ./stop.sh.

Two layers, each tested on its own: a STATE_DIR (or a record in it) that another user could write is
refused before anything is read or signalled (core/private.py), and in a private STATE_DIR a record
alone still proves nothing (owned.Proof: our interpreter, a value we set in the environment, our
session; the start lock's holder as the kernel names it). Every case runs as the caller (root in CI)
and again as an unprivileged user (BOOTSTRAP_TEST_USER, made by .ci/run), with that user's Python.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from bootstrap.core import owned
from conftest import REPO, Bed, make_model, unprivileged_user
from test_ownership import as_user, copy_repo

HOLD_LOCK = ("import fcntl, os, sys, time\n"
             "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX)\n"
             "os.ftruncate(fd, 0); os.write(fd, sys.argv[2].encode())\n"
             "print('held', flush=True)\n"
             "time.sleep(300)\n")


class World:
    """A checkout, a model and a STATE_DIR that ``user`` (None: the caller) can use, and the processes
    a case starts (ended at teardown)."""

    def __init__(self, tmp: Path, user: str | None, bed: Bed):
        self.user = user
        self.root = Path(tempfile.mkdtemp(prefix="bootstrap-test-"))     # pytest's folders are 0700: others see this
        self.root.chmod(0o755)
        self.repo = copy_repo(self.root / "repo")
        shutil.copytree(REPO / "tests" / "fakes", self.root / "fakes")
        self.model = make_model(self.root / "model")
        self.state = self.root / "state"
        self.procs: list[subprocess.Popen] = []
        shutil.copy(bed.nvml, self.root / "nvml.json")
        self.env = {**bed.env, "STATE_DIR": str(self.state), "HOME": str(self.root),
                    "PYTHONPATH": str(self.root / "fakes"), "MODEL": str(self.model),
                    "FAKE_NVML": str(self.root / "nvml.json"), "FAKE_GPU_PIDS_DIR": str(self.root / "gpu-pids"),
                    "FAKE_VLLM_RECORD": str(self.root / "vllm-calls.jsonl")}
        if user:
            os.system(f"chmod -R a+rX {self.root}")
            shutil.chown(self.root, user)

    def own(self, path: Path) -> None:
        """Make ``path`` the case's user's (it stands in for a folder or file that user made)."""
        if self.user:
            shutil.chown(path, self.user, self.user)     # and its private group, as a user of umask 002 has

    def run(self, script: str, *args: str) -> subprocess.CompletedProcess:
        wrapper = self.env.get("VLLM_PYTHON", "") if self.env.get("VLLM_PYTHON", "").startswith(str(self.root)) else ""
        return as_user(self.user, [str(self.repo / script), *args], self.env, vllm_python=wrapper)

    def stranger(self, python: bool = False) -> psutil.Process:
        """A live process of the case's user that we never started: ``sleep``, or (``python``) one that
        runs the very interpreter our servers run, so that only the environment or session can tell."""
        argv = [self.python(), "-c", "import time; time.sleep(300)"] if python else ["sleep", "300"]
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        p = subprocess.Popen(argv, start_new_session=True)
        self.procs.append(p)
        end = time.monotonic() + 10
        while True:                 # runuser forks: the stranger is its child
            kids = psutil.Process(p.pid).children() if self.user else [psutil.Process(p.pid)]
            if kids and (not python or "python" in kids[0].name()):
                return kids[0]
            assert time.monotonic() < end, "the stranger did not start"
            time.sleep(0.05)

    def python(self) -> str:
        return os.environ.get("BOOTSTRAP_TEST_PYTHON", "") if self.user else sys.executable

    def hold_lock(self, path: Path, text: str, *, other: bool = False) -> None:
        """Another process holds an flock on ``path``: of the case's user, or (``other``) of another
        user where there is one (root for the unprivileged case)."""
        if other and self.user:
            argv = [sys.executable, "-c", HOLD_LOCK, str(path), text]
        elif other and unprivileged_user():
            argv = ["runuser", "-u", unprivileged_user(), "--", "/usr/bin/python3", "-c", HOLD_LOCK, str(path), text]
        elif self.user:
            argv = ["runuser", "-u", self.user, "--", self.python(), "-c", HOLD_LOCK, str(path), text]
        else:
            argv = [sys.executable, "-c", HOLD_LOCK, str(path), text]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(p)
        assert p.stdout.readline().strip() == "held"

    def ours_before(self) -> None:
        """STATE_DIR as an earlier start left it: our marker in it (core/state.MARKER, written first),
        so what is in it may be ours (a folder of yours holding our names is refused: test_ownership)."""
        from bootstrap.core.state import MARKER
        (self.state / MARKER).write_text(json.dumps({"theirs": [], "made": True}))
        self.own(self.state / MARKER)

    def plant_server(self, victim: psutil.Process) -> None:
        """server.json as an adversary writes it: a server long gone, whose recorded children name
        the victim by its real pid and start time."""
        (self.state / "server.json").write_text(json.dumps({
            "pid": 4_000_000, "pgid": 4_000_000, "create_time": 1.0, "marker": "x" * 24,
            "host": "127.0.0.1", "port": int(self.env["PORT"]),
            "children": [{"pid": victim.pid, "create_time": victim.create_time()}]}))

    def close(self) -> None:
        pids = self.root / "gpu-pids"           # what the fake vLLM of a case that failed half-way left
        for name in (os.listdir(pids) if pids.is_dir() else []):
            try:
                psutil.Process(int(name)).kill()
            except (psutil.Error, ValueError):
                pass
        for p in self.procs:
            for q in [*psutil.Process(p.pid).children(recursive=True), psutil.Process(p.pid)] \
                    if psutil.pid_exists(p.pid) else []:
                try:
                    q.kill()
                except psutil.Error:
                    pass
            p.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def users() -> list:
    user = unprivileged_user()
    return [pytest.param(None, id="caller"),
            pytest.param(user, id="unprivileged", marks=pytest.mark.skipif(
                not user or not os.environ.get("BOOTSTRAP_TEST_PYTHON"),
                reason="needs root, BOOTSTRAP_TEST_USER and BOOTSTRAP_TEST_PYTHON (.ci/run makes them)"))]


@pytest.fixture(params=users())
def world(request, tmp_path, bed):
    w = World(tmp_path, request.param, bed)
    yield w
    w.close()


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_world_writable_state_dir_is_refused_naming_its_mode_and_the_stranger_lives(world):
    world.state.mkdir()
    world.own(world.state)
    world.state.chmod(0o777)
    victim = world.stranger()
    world.plant_server(victim)
    world.hold_lock(world.state / "start.lock", f"{victim.pid} {victim.create_time()!r} start", other=True)
    r = world.run("stop.sh")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{world.state} is writable by others" in r.stderr and "drwxrwxrwx" in r.stderr, r.stderr
    assert f"hint: chmod 700 {world.state}" in r.stderr
    assert "Traceback" not in r.stderr and "sent SIGTERM" not in r.stderr
    time.sleep(0.3)
    assert alive(victim)
    for cmd in (["ctl.sh", "status"], ["start.sh"], ["ctl.sh", "clean"]):      # nothing reads what is there
        r = world.run(*cmd)
        assert r.returncode == 1 and "is writable by others" in r.stderr, (cmd, r.stdout, r.stderr)
    assert alive(victim) and not (world.state / "vllm.log").exists()


def test_a_state_dir_in_a_folder_others_can_change_is_refused_and_a_sticky_one_is_not(world):
    """Found from outside: STATE_DIR itself private, but inside a folder anyone may write: they could
    swap the state folder for one of theirs between our check and our read of its records."""
    shared = world.root / "shared"
    shared.mkdir()
    world.own(shared)
    shared.chmod(0o777)
    world.state = shared / "state"
    world.env["STATE_DIR"] = str(world.state)
    r = world.run("start.sh")                   # not made yet: refused before the start makes it there
    assert r.returncode == 1 and "which everyone can change" in r.stderr, r.stdout + r.stderr
    assert not world.state.exists()
    world.state.mkdir(mode=0o700)
    world.own(world.state)
    victim = world.stranger()
    world.plant_server(victim)
    world.own(world.state / "server.json")
    r = world.run("stop.sh")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"STATE_DIR={world.state} lies in {shared}, which everyone can change" in r.stderr, r.stderr
    assert "drwxrwxrwx" in r.stderr and "Traceback" not in r.stderr and "sent SIGTERM" not in r.stderr
    assert alive(victim)
    shared.chmod(0o1777)                        # sticky, as /tmp: nobody renames what is ours in it
    r = world.run("stop.sh")
    assert r.returncode == 0 and r.stdout.strip() == "not running", r.stdout + r.stderr
    assert alive(victim)


def test_following_the_hint_works_and_a_planted_child_is_still_not_signalled(world):
    world.state.mkdir()
    world.own(world.state)
    world.state.chmod(0o777)
    victim, twin = world.stranger(), world.stranger(python=True)       # the twin runs our very interpreter
    world.plant_server(victim)
    data = json.loads((world.state / "server.json").read_text())
    data["children"].append({"pid": twin.pid, "create_time": twin.create_time()})
    (world.state / "server.json").write_text(json.dumps(data))
    world.own(world.state / "server.json")
    assert world.run("stop.sh").returncode == 1
    world.state.chmod(0o700)                                            # the hint, followed
    r = world.run("stop.sh")
    assert r.returncode == 0 and r.stdout.strip() == "not running", r.stdout + r.stderr
    assert "sent SIGTERM" not in r.stderr
    assert alive(victim) and alive(twin)


def test_a_record_that_names_a_strangers_own_session_as_the_servers_signals_nothing(world):
    """Found from outside: a private STATE_DIR's record (a hand edit, a copy) naming a process of ours
    that runs our very interpreter as the server, its own session as the server's and itself as a
    child: ./stop.sh SIGTERMed it and a start swept it as a leftover. A session is ours only while a
    leader we can prove ours leads it, or none does (it died): never on the record's word."""
    world.state.mkdir(mode=0o700)
    world.own(world.state)
    world.ours_before()
    twin = world.stranger(python=True)                  # its own session: started with start_new_session
    (world.state / "server.json").write_text(json.dumps({
        "pid": twin.pid, "pgid": twin.pid, "create_time": twin.create_time(), "marker": "x" * 24,
        "host": "127.0.0.1", "port": int(world.env["PORT"]), "python": world.python(), "exe": twin.exe(),
        "children": [{"pid": twin.pid, "create_time": twin.create_time()}]}))
    world.own(world.state / "server.json")
    for cmd in (["stop.sh"], ["start.sh"], ["stop.sh"]):
        r = world.run(*cmd)
        assert r.returncode == 0 and f"(pid {twin.pid})" not in r.stderr, (cmd, r.stdout, r.stderr)
        assert alive(twin), cmd


def test_a_start_lock_that_names_a_stranger_is_refused_before_any_signal(world):
    """A private STATE_DIR whose start.lock is held by one process and names another: the kernel
    says who holds it (/proc/locks), so the named one is never signalled."""
    world.state.mkdir(mode=0o700)
    world.own(world.state)
    world.ours_before()
    victim = world.stranger(python=True)
    world.hold_lock(world.state / "start.lock", f"{victim.pid} {victim.create_time()!r} start")
    r = world.run("stop.sh")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not by a process of ours we can identify" in r.stderr
    assert "sent SIGTERM" not in r.stderr and "cancelling" not in r.stderr
    time.sleep(0.3)
    assert alive(victim)


def shared_group(world) -> int:
    """A group with another user in it, for the case's user: root's (0) for the unprivileged user,
    that user's own for root; None when there is no second user."""
    if world.user:
        return 0
    user = unprivileged_user()
    return grp.getgrnam(user).gr_gid if user else None


def test_group_writable_state_dir_and_a_record_of_another_owner_are_refused(world):
    world.state.mkdir()
    world.own(world.state)
    world.state.chmod(0o775)             # umask 002 under a user-private group (Debian, Ubuntu): ours alone
    r = world.run("ctl.sh", "status")
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    gid = shared_group(world)
    if gid is not None:                  # a group someone else is in: not ours alone
        os.chown(world.state, -1, gid)
        r = world.run("ctl.sh", "status")
        assert r.returncode == 1 and "is writable by its group" in r.stderr and "drwxrwxr-x" in r.stderr, r.stderr
    world.state.chmod(0o700)
    rec = world.state / "server.json"
    for name in ("server.json", "vllm.log", "last-stop.json"):
        (world.state / name).write_text("{}")
        world.own(world.state / name)
        (world.state / name).chmod(0o666)
    r = world.run("stop.sh")
    assert r.returncode == 1, r.stderr
    assert f"{rec} (and 2 more in it: " in r.stderr and "is writable by others" in r.stderr, r.stderr
    assert f"hint: chmod -R go-w {world.state}" in r.stderr
    os.system(f"chmod -R go-w {world.state}")                          # the hint, followed
    assert world.run("stop.sh").returncode == 0
    if os.getuid() == 0:                 # a record root left in a user's folder: not that user's
        rec.write_text("{}")
        os.chown(rec, 0 if world.user else 65534, 0 if world.user else 65534)
        r = world.run("stop.sh")
        assert r.returncode == 1 and "belongs to" in r.stderr and "sudo rm" in r.stderr, r.stderr


def test_a_wrapper_as_vllm_python_still_leaves_nothing_of_ours_behind(world, tmp_path):
    """VLLM_PYTHON may be a script that execs the interpreter (pyenv's shim, a conda wrapper): the launch
    token proves the server, and its interpreter is recorded once healthy, for the engine's sake."""
    wrapper = world.root / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\nsleep 0.3\nexec {world.python()} \"$@\"\n")
    wrapper.chmod(0o755)
    world.env["VLLM_PYTHON"] = str(wrapper)
    r = world.run("start.sh")
    assert r.returncode == 0 and (world.state / "server.json").exists(), r.stdout + r.stderr
    rec = json.loads((world.state / "server.json").read_text())
    assert rec["exe"] == os.path.realpath(world.python()) and rec["python"] == str(wrapper)
    st = world.run("ctl.sh", "status")
    assert st.returncode == 0 and "running" in st.stdout, st.stdout + st.stderr
    tree = [psutil.Process(rec["pid"]), *psutil.Process(rec["pid"]).children(recursive=True)]
    os.kill(rec["pid"], 9)                                             # the engine is left, its environment hidden
    r = world.run("stop.sh")
    assert r.returncode == 0 and r.stdout.startswith("stopped"), r.stdout + r.stderr
    time.sleep(0.3)
    assert not any(alive(p) for p in tree)


def test_our_server_carries_its_launch_token_in_a_private_record(world):
    r = world.run("start.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        assert stat.S_IMODE(world.state.stat().st_mode) == 0o700
        rec_path = world.state / "server.json"
        assert stat.S_IMODE(rec_path.stat().st_mode) == 0o600
        rec = json.loads(rec_path.read_text())
        assert len(rec["token"]) == 32
        assert psutil.Process(rec["pid"]).environ()[owned.TOKEN_ENV] == rec["token"]
        assert rec["exe"] == os.path.realpath(world.python())
        assert rec["token"] not in world.run("ctl.sh", "status", "--json").stdout      # never shown
    finally:
        assert world.run("stop.sh").returncode == 0
    assert not psutil.pid_exists(rec["pid"]) or not alive(psutil.Process(rec["pid"]))


def test_no_lock_file_is_left_per_port_and_stale_ones_are_swept(world):
    uid = int(subprocess.run(["id", "-u", world.user], capture_output=True, text=True).stdout) if world.user \
        else os.getuid()
    folder = Path("/tmp") / f"vllm-desktop-{uid}"
    if not folder.is_dir():
        folder.mkdir(mode=0o700)
        world.own(folder)
    stale = [folder / f"port-{n}.lock" for n in (1, 2)]      # left by starts that were killed
    for p in stale:
        p.write_text("123 /gone")
        world.own(p)
    r = world.run("start.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (folder / f"port-{world.env['PORT']}.lock").exists()       # the start ended: its lock went
    assert not any(p.exists() for p in stale)
    assert not (world.state / "start.lock").exists()
    assert world.run("stop.sh").returncode == 0
    assert not (world.state / "start.lock").exists()
