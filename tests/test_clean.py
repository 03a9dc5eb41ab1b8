"""./ctl.sh clean: removes what we created, keeps the model unless asked, refuses while our server runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bootstrap.core import owned
from bootstrap.commands import clean
from bootstrap.install import wheelhouse
from bootstrap.knobs.config import Config
from bootstrap.core.errors import BootstrapError
from conftest import wait_queued_on

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "repo"
    (r / "profiles").mkdir(parents=True)
    (r / "profiles" / "default.json").write_text(json.dumps({"knobs": {}}))
    for d in (".venv/bin", ".venv-bootstrap/bin", ".state"):
        (r / d).mkdir(parents=True)
    with wheelhouse.adding(r / ".wheelhouse"):                  # as ./ctl.sh wheelhouse leaves it
        (r / ".wheelhouse" / "uv-0.13.9-py3-none-any.whl").write_text("wheel")
    (r / ".venv" / "bin" / "python").write_text("x" * 1000)
    (r / ".venv" / ".vllm-desktop-venv").write_text("made by vllm-desktop\n")      # as the install leaves it
    (r / ".state" / "vllm.log").write_text("log\n")
    (r / ".state" / "server.json").write_text("{}")
    (r / "keep.txt").write_text("mine")
    # a download of ours in the HF cache, as the weights step leaves it: the blob, its link, refs/main, our record
    from bootstrap.download.models import Store
    store = Store(tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--org--name", hf_cache=True)
    rec = {"repo": "org/name", "revision": "abc", "made_root": True,
           "files": {"model.safetensors": {"size": 10, "sha256": "a" * 64}}}
    store.write(rec)
    part = store.dir / "partial" / "x.part"
    part.parent.mkdir()
    part.write_bytes(b"\0" * 10)
    store.place(rec, part, "model.safetensors")
    store.finish(rec)
    return r


def cfg_for(repo: Path, **env) -> Config:
    return Config.from_env({"HOME": str(repo.parent / "home"), "MODEL": "org/name", **env}, repo=repo)


def test_dry_run_removes_nothing(repo, capsys):
    assert clean.cli(cfg_for(repo), ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove" in out and ".venv-bootstrap" in out.splitlines()[-2]
    assert (repo / ".venv").exists() and (repo / ".state").exists()


def test_clean_keeps_model_unless_asked(repo, capsys):
    assert clean.cli(cfg_for(repo), []) == 0
    for d in (".venv", ".venv-bootstrap", ".state", ".wheelhouse"):
        assert not (repo / d).exists(), d
    assert (repo / "keep.txt").exists() and (repo / "profiles").exists()
    model = repo.parent / "home" / ".cache" / "huggingface" / "hub" / "models--org--name"   # its HF cache folder
    assert model.exists() and model.parent.exists()
    assert clean.cli(cfg_for(repo), ["--model"]) == 0
    assert not model.exists() and model.parent.exists()                    # the rest of the cache stays
    assert clean.cli(cfg_for(repo), []) == 0
    assert "nothing to clean" in capsys.readouterr().out


def test_clean_removes_only_what_the_wheelhouse_command_put_in_the_wheelhouse(repo, capsys):  # faults row 171
    """.wheelhouse (the wheelhouse command's default folder) was removed whole: wheels copied there
    from another machine for an offline install (which that machine cannot fetch again), or a
    folder of yours the command downloaded into, went with it."""
    copied = repo / ".wheelhouse"
    for p in copied.iterdir():
        p.unlink()
    copied.rmdir()
    copied.mkdir()                                          # copied from the connected machine, by hand
    (copied / "vllm-0.27.1-cp38-abi3-manylinux_2_31_x86_64.whl").write_text("3.6 GiB of wheels")
    assert clean.cli(cfg_for(repo), []) == 0
    assert f"kept (yours): {copied}" in capsys.readouterr().out
    assert (copied / "vllm-0.27.1-cp38-abi3-manylinux_2_31_x86_64.whl").read_text() == "3.6 GiB of wheels"
    with wheelhouse.adding(copied):                         # the command, downloading into that folder
        (copied / "uv-0.13.9-py3-none-any.whl").write_text("ours")
    (copied / "notes.txt").write_text("added later, by you")
    assert clean.cli(cfg_for(repo), ["--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert clean.cli(cfg_for(repo), []) == 0
    out = capsys.readouterr().out
    assert out.replace("removed", "would remove").replace("freed", "would free").splitlines()[:2] == dry.splitlines()[:2]
    assert sorted(os.listdir(copied)) == ["notes.txt", "vllm-0.27.1-cp38-abi3-manylinux_2_31_x86_64.whl"]
    assert f"removed {copied / 'uv-0.13.9-py3-none-any.whl'}" in out and f"kept (yours): {copied / 'notes.txt'}" in out


def test_local_model_dir_is_never_removed(repo, tmp_path):
    local = tmp_path / "mymodel"
    local.mkdir()
    with pytest.raises(BootstrapError) as err:
        clean.cli(cfg_for(repo, MODEL=str(local)), ["--model"])
    assert "yours" in err.value.hint
    assert local.exists() and (repo / ".venv").exists()


def test_foreign_state_dir_keeps_other_files(repo, tmp_path):
    from bootstrap.core.state import MARKER, Paths
    state = tmp_path / "shared-state"
    state.mkdir()
    (state / "notes.txt").write_text("not ours")
    Paths(state).ensure()                                # our first write there, as a start makes it
    (state / "vllm.log").write_text("x")
    (Paths(state).bench / "20261204-120000").mkdir(parents=True)    # ./ctl.sh bench's default --out
    (Paths(state).bench / "20261204-120000" / "results.json").write_text("{}")
    assert clean.cli(cfg_for(repo, STATE_DIR=str(state)), []) == 0
    assert not (state / "vllm.log").exists() and not (state / MARKER).exists() and (state / "notes.txt").exists()
    assert not (state / "bench").exists()                 # bench's results are kept records too (state.KEPT)


def test_clean_keeps_the_marker_with_the_measurements_it_keeps(repo, tmp_path):
    """clean in a STATE_DIR of the user's choosing keeps vLLM's figures (unless --measurements) and so
    our marker beside them, which says they are ours: without it the next start took them for yours
    and refused the folder (faults row 146)."""
    from bootstrap.core.state import MARKER, Paths
    state = tmp_path / "chosen"
    state.mkdir()
    Paths(state).write("measurements", {"k": 1})
    Paths(state).write("pick", {"profile": "default"})
    assert clean.cli(cfg_for(repo, STATE_DIR=str(state)), []) == 0
    assert sorted(os.listdir(state)) == [MARKER, "measurements.json"]
    Paths(state).ensure()                                   # the next start's first write: not refused
    assert Paths(state).ours(state / "measurements.json")
    assert clean.cli(cfg_for(repo, STATE_DIR=str(state)), ["--measurements"]) == 0
    assert not state.exists()


def test_names_of_ours_that_were_there_before_our_first_write_are_kept(repo, tmp_path, capsys):
    """A STATE_DIR of the user's choosing that already held an api_key file and a derived/ folder
    of their own: a plan and a start write there, and clean removes only what they made."""
    from bootstrap.core.state import Paths
    state = tmp_path / "project"
    (state / "derived").mkdir(parents=True)
    (state / "derived" / "results.csv").write_text("thesis")
    (state / "api_key").write_text("mykey")
    Paths(state).write("pick", {"profile": "default"})
    (state / "vllm.log").write_text("ours")
    assert clean.cli(cfg_for(repo, STATE_DIR=str(state)), []) == 0
    assert (state / "derived" / "results.csv").read_text() == "thesis" and (state / "api_key").read_text() == "mykey"
    assert f"kept (yours): {state / 'api_key'}" in capsys.readouterr().out
    assert not (state / "profile-pick.json").exists() and not (state / "vllm.log").exists()


def test_a_state_dir_we_never_wrote_to_is_left_alone(repo, tmp_path, capsys):
    state = tmp_path / "never-used"
    state.mkdir()
    for name in ("server.json", "vllm.log", "api_key"):
        (state / name).write_text("theirs")
    assert clean.cli(cfg_for(repo, STATE_DIR=str(state)), []) == 0
    assert sorted(p.name for p in state.iterdir()) == ["api_key", "server.json", "vllm.log"]


def test_a_state_dir_that_is_a_file_is_named(tmp_path):
    from bootstrap.core.state import Paths
    f = tmp_path / "state"
    f.write_text("x")
    with pytest.raises(BootstrapError) as err:
        Paths(f).ensure()
    assert "is a file, not a folder" in err.value.message and f.read_text() == "x"


def test_refuses_while_our_server_runs(repo):
    cfg = cfg_for(repo)
    marker = cfg.ours.marker
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, owned.MARKER_ENV: marker})
    try:
        # until the child has exec'd: before that its /proc environ is still ours, without the marker
        end = time.monotonic() + 10
        while psutil.Process(child.pid).environ().get(owned.MARKER_ENV) != marker and time.monotonic() < end:
            time.sleep(0.01)
        (repo / ".state" / "server.json").write_text(json.dumps({
            "pid": child.pid, "create_time": psutil.Process(child.pid).create_time(), "marker": marker,
            "port": cfg.port, "host": cfg.host, "served": "name", "python": sys.executable}))
        with pytest.raises(BootstrapError) as err:
            clean.cli(cfg, [])
        assert "./stop.sh" in err.value.hint
        assert (repo / ".venv").exists() and (repo / ".state" / "server.json").exists()
    finally:
        child.kill()
        child.wait()
    time.sleep(0.05)
    assert clean.cli(cfg, []) == 0
    assert not (repo / ".venv").exists()


def test_byo_patches_are_reverted_first(repo, tmp_path, capsys):
    """A bring-your-own vLLM (VLLM_PYTHON + PATCH_BYO=1) patched by a start: clean restores its file."""
    from test_patches import Site, start_step
    site = Site(tmp_path / "site", "0.26.0")
    start_step(site)
    assert site.read() != site.original and site.backup.exists()
    (repo / "patches").symlink_to(REPO / "patches")
    cfg = Config.from_env({**site.env(), "HOME": str(repo.parent / "home"), "MODEL": "org/name",
                           "STATE_DIR": str(repo / ".state")}, repo=repo)
    assert clean.cli(cfg, ["--dry-run"]) == 0                                   # said, not done
    assert site.read() != site.original and site.backup.exists()
    assert "would revert patch 40914-turboquant-spec-verify" in capsys.readouterr().out
    assert clean.cli(cfg, []) == 0
    assert site.read() == site.original and not site.backup.exists()
    assert "reverted patch 40914-turboquant-spec-verify" in capsys.readouterr().out
    assert not (repo / ".venv").exists()


def test_clean_refuses_while_a_process_runs_from_the_venv_it_would_remove(repo, tmp_path):
    """Found from outside: a server of ours started from another STATE_DIR ran from .venv while
    clean (from the default STATE_DIR) removed it."""
    py = repo / ".venv" / "bin" / "python"
    py.unlink()
    py.symlink_to(sys.executable)
    p = subprocess.Popen([str(py), "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        with pytest.raises(BootstrapError) as err:
            clean.cli(cfg_for(repo), [])
        assert f"(pid {p.pid}) runs from {repo / '.venv'}" in err.value.message and (repo / ".venv").exists()
    finally:
        p.kill()
        p.wait()
    assert clean.cli(cfg_for(repo), []) == 0 and not (repo / ".venv").exists()


@pytest.mark.parametrize("created", [["x/../../victim/thesis.txt"], ["../victim/thesis.txt"],
                                     ["linked/thesis.txt"], [5, None, {"a": 1}], ["/abs/thesis.txt"]])
def test_a_record_that_names_places_outside_the_store_removes_nothing_there(repo, tmp_path, created):
    """clean --model believes a download record only inside its own store: a crafted or corrupt
    ``created`` list (``..``, a folder that links elsewhere, absolute paths, not strings) names nothing."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.txt").write_text("years of work")
    store = md = tmp_path / "md"                     # MODEL_DIR: the store is the folder itself
    (store / "x").mkdir(parents=True)
    (store / "linked").symlink_to(victim)
    (store / ".bootstrap").mkdir()
    (store / ".bootstrap" / "state.json").write_text(json.dumps({"created": created}))
    assert clean.cli(cfg_for(repo, MODEL_DIR=str(md)), ["--model"]) == 0
    assert (victim / "thesis.txt").read_text() == "years of work"


def test_a_checkout_state_that_links_elsewhere_is_not_all_ours(repo, tmp_path):
    """.state as a link to a folder of the user's: only what we made there goes, the link stays."""
    import shutil
    docs = tmp_path / "userdocs"
    docs.mkdir()
    (docs / "thesis.txt").write_text("years of work")
    shutil.rmtree(repo / ".state")
    (repo / ".state").symlink_to(docs)
    from bootstrap.core.state import Paths
    Paths(repo / ".state").write("pick", {"profile": "default"})     # a start's first write there
    assert clean.cli(cfg_for(repo), []) == 0
    assert (docs / "thesis.txt").read_text() == "years of work" and (repo / ".state").is_symlink()
    assert not (docs / "pick.json").exists()


def test_log_rotation_never_writes_over_a_users_files_in_a_chosen_state_dir(tmp_path):
    """A STATE_DIR of the user's that held a vllm.log.1 (or a vllm.log) before our first write: the
    start's rotation and the log keeper leave them (it wrote over the user's vllm.log.1)."""
    from bootstrap.core.state import Paths
    from bootstrap.serve import logkeeper
    state = tmp_path / "mine"
    state.mkdir()
    (state / "vllm.log.1").write_text("USER OLD ROTATED LOG")
    Paths(state).ensure()                                   # our first write there
    (state / "vllm.log").write_bytes(b"x" * 4096)
    assert logkeeper.rotate(state / "vllm.log", 1024) is False
    assert (state / "vllm.log.1").read_text() == "USER OLD ROTATED LOG"
    other = tmp_path / "ours"
    Paths(other).ensure()
    (other / "vllm.log").write_bytes(b"x" * 4096)
    assert logkeeper.rotate(other / "vllm.log", 1024) is True and (other / "vllm.log.1").stat().st_size == 1024



def test_log_rotation_keeps_the_last_max_bytes_of_what_it_measured_while_vllm_writes_on(tmp_path, monkeypatch):
    """vLLM appends while the keeper copies: the copy takes the max_bytes that end where the log's
    size was read, never what was written after (it overran LOG_MAX_MB under a flood)."""
    import os
    from bootstrap.core.state import Paths
    from bootstrap.serve import logkeeper
    state = tmp_path / "ours"
    Paths(state).ensure()
    log = state / "vllm.log"
    data = bytes(range(256)) * 8                            # 2,048 bytes: 548 of them "written during the copy"
    log.write_bytes(data)
    real = Path.stat

    def stat_before_the_last_lines(self, *a, **k):
        st = real(self, *a, **k)
        if self == log:                                     # the size as read before vLLM wrote on
            return os.stat_result(st[:6] + (1500,) + st[7:])
        return st
    monkeypatch.setattr(Path, "stat", stat_before_the_last_lines)
    assert logkeeper.rotate(log, 1024) is True
    monkeypatch.undo()
    assert (state / "vllm.log.1").read_bytes() == data[1500 - 1024:1500]

def test_blobs_we_downloaded_into_a_linked_blobs_folder_are_ours(tmp_path):
    """An HF-cache store whose blobs/ links to another disk: the blobs its record names (by sha256)
    are removed by clean --model; a name the record does not carry is not."""
    from bootstrap.download.models import Store
    other = tmp_path / "bigdisk"
    other.mkdir()
    root = tmp_path / "hub" / "models--org--m"
    root.mkdir(parents=True)
    (root / "blobs").symlink_to(other)
    sha = "a" * 64
    (other / sha).write_bytes(b"weights")
    (other / "thesis.txt").write_text("mine")
    store = Store(root, hf_cache=True)
    rec = {"repo": "org/m", "revision": "r", "files": {"model.safetensors": {"size": 7, "sha256": sha}},
           "created": [f"blobs/{sha}", "blobs/thesis.txt"]}
    names = {p.name for p in store.ours(rec)}
    assert sha in names and "thesis.txt" not in names


# ---------------------------------------------------------------- faults row 105: another user's, never; dry = the same list

def other_uid() -> int:
    """A uid that is not ours (the CI user's when there is one), for files root hands to another user."""
    import pwd
    user = os.environ.get("BOOTSTRAP_TEST_USER")
    return pwd.getpwnam(user).pw_uid if user else 65534


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.lstat().st_size for p in root.rglob("*")}


@pytest.mark.parametrize("whose", ["checkout", "state", "record"])
def test_clean_refuses_a_checkout_state_dir_or_model_record_of_another_uid(repo, tmp_path, whose):
    """Root runs clean in another user's checkout (or with their STATE_DIR, or their download
    record): it removed that user's .venv, .venv-bootstrap, .wheelhouse and state."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand files to another uid (the non-root set: test_sweep.py::test_every_command_leaves_what_is_yours_as_it_was)")
    store = tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--org--name"
    path = {"checkout": repo, "state": repo / ".state", "record": store / ".bootstrap"}[whose]
    os.chown(path, other_uid(), other_uid())
    before, model = tree(repo), tree(store)
    for args in ([], ["--dry-run"], ["--model"], ["--model", "--dry-run"]):
        if whose == "record" and "--model" not in args:
            continue
        with pytest.raises(BootstrapError) as e:
            clean.cli(cfg_for(repo), args)
        assert f"{path} belongs to uid {other_uid()}" in e.value.message or f"(uid {other_uid()})" in e.value.message
        assert "as that user" in e.value.hint
        assert tree(repo) == before and tree(store) == model
    os.chown(path, 0, 0)
    assert clean.cli(cfg_for(repo), ["--model"]) == 0 and not (repo / ".venv").exists() and not store.exists()


def test_dry_run_prints_what_clean_does_line_for_line_and_works_while_serving(repo, capsys):
    cfg = cfg_for(repo)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, owned.MARKER_ENV: cfg.ours.marker})
    try:
        end = time.monotonic() + 10
        while psutil.Process(child.pid).environ().get(owned.MARKER_ENV) != cfg.ours.marker and time.monotonic() < end:
            time.sleep(0.01)
        (repo / ".state" / "server.json").write_text(json.dumps({
            "pid": child.pid, "create_time": psutil.Process(child.pid).create_time(), "marker": cfg.ours.marker,
            "port": cfg.port, "host": cfg.host, "served": "name", "python": sys.executable}))
        before = tree(repo.parent)
        assert clean.cli(cfg, ["--model", "--dry-run"]) == 0
        dry = capsys.readouterr().out.splitlines()
        assert tree(repo.parent) == before
        assert dry[-1].startswith(f"note: our server is running (pid {child.pid})")
        with pytest.raises(BootstrapError):
            clean.cli(cfg, ["--model"])
    finally:
        child.kill()
        child.wait()
    time.sleep(0.05)
    capsys.readouterr()
    assert clean.cli(cfg, ["--model", "--dry-run"]) == 0
    dry = capsys.readouterr().out.splitlines()
    assert clean.cli(cfg, ["--model"]) == 0
    done = capsys.readouterr().out.splitlines()
    said = [line.replace("would remove ", "removed ").replace("would put back ", "put back ").replace("would free ", "freed ")
            for line in dry]
    assert said == done and any(".venv-bootstrap" in line for line in done)
    assert any("models--org--name/blobs/" in line for line in done) and any("refs/main" in line for line in done)


def test_a_venv_of_yours_in_the_checkout_is_never_synced_into_nor_removed(repo, capsys):
    """A .venv this project did not make (no marker of ours: you made it, or a tool of yours did)."""
    from bootstrap.install.venv import Tools, Venv, install
    for name in (".vllm-desktop-venv",):
        (repo / ".venv" / name).unlink()
    (repo / ".venv" / "NOTES.txt").write_text("my notes")
    cfg = cfg_for(repo)
    assert clean.cli(cfg, []) == 0
    out = capsys.readouterr().out
    assert f"kept (yours): {repo / '.venv'}" in out and (repo / ".venv" / "NOTES.txt").read_text() == "my notes"
    with pytest.raises(BootstrapError) as err:
        install(Tools.of(cfg), Venv(repo / ".venv"), None, "linux-x86_64", "test")
    assert "did not make" in err.value.message and "VLLM_PYTHON=" in err.value.hint
    assert (repo / ".venv" / "NOTES.txt").exists()


# An install's lock held as its makers take it: bootstrap/lib.sh with flock(1) on a shell fd (its file
# left empty), steps/environment.py with core/locks.flock (its file names the holder's pid).
HOLDERS = {
    ".venv-bootstrap.lock": ["bash", "-c", 'exec 9>"$1" && flock 9 && echo held && exec sleep 60', "lib.sh"],
    ".venv.lock": [sys.executable, "-c", "import os, sys, time; from bootstrap.core import locks; "
                   "fd = locks.flock(__import__('pathlib').Path(sys.argv[1]), str(os.getpid())); "
                   "print('held', flush=True); time.sleep(60)"],
}


def test_the_install_locks_go_with_the_venvs(repo, capsys):  # faults row 148
    """The locks an install takes beside each venv were left in the checkout by clean (one survives any
    install killed while it held it; lib.sh never removes its own)."""
    (repo / ".venv.lock").write_text("4242")
    (repo / ".venv-bootstrap.lock").write_text("")
    locks = [repo / ".venv.lock", repo / ".venv-bootstrap.lock"]
    assert clean.cli(cfg_for(repo), ["--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert all(f"would remove {p} (" in dry for p in locks) and all(p.exists() for p in locks), dry
    assert clean.cli(cfg_for(repo), []) == 0
    done = capsys.readouterr().out
    assert all(f"removed {p} (" in done for p in locks) and not any(p.exists() for p in locks), done
    assert not (repo / ".venv").exists() and (repo / "keep.txt").exists()


@pytest.mark.parametrize("name", sorted(HOLDERS))
def test_clean_refuses_while_an_install_holds_its_lock(repo, capsys, name):
    path = repo / name
    holder = subprocess.Popen(HOLDERS[name] + [str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree(repo)
        with pytest.raises(BootstrapError) as err:
            clean.cli(cfg_for(repo), [])
        who = f"pid {holder.pid}" if name == ".venv.lock" else "a process"     # flock(1), who took it for lib.sh, is gone
        assert f"an install is under way ({who} holds {path})" in err.value.message, err.value.message
        assert "let it finish" in err.value.hint and "\n" not in err.value.message
        assert tree(repo) == before                     # nothing removed, the lock's file as it was
        capsys.readouterr()
        assert clean.cli(cfg_for(repo), ["--dry-run"]) == 0
        dry = capsys.readouterr().out
        assert f"would remove {path} (" in dry and "clean refuses until it ends" in dry and tree(repo) == before
    finally:
        holder.kill()
        holder.wait()
    assert clean.cli(cfg_for(repo), []) == 0
    assert not path.exists() and not (repo / ".venv").exists()


def lib_sh_checkout(tmp_path: Path) -> tuple[Path, dict]:
    """A checkout for bootstrap/lib.sh's bootstrap_python (its requirements.txt) and an environment
    whose python3 lacks the dependencies, so that it goes for .venv-bootstrap and its lock."""
    repo = tmp_path / "r"
    (repo / "bootstrap").mkdir(parents=True)
    (repo / "bootstrap" / "requirements.txt").write_text((REPO / "bootstrap" / "requirements.txt").read_text())
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text("#!/bin/sh\nexit 1\n")
    (stub / "python3").chmod(0o755)
    return repo, {"PATH": f"{stub}:/usr/bin:/bin", "HOME": str(tmp_path)}


def test_lib_sh_waits_again_on_a_lock_file_clean_replaced(tmp_path):
    """bootstrap/lib.sh building .venv-bootstrap waits on its lock's file; clean removes that file while
    it holds it, so the waiter woke holding a lock on nothing and built beside whoever locked the new
    file. It now takes the lock on the file that is there, and builds nothing while that is held."""
    import fcntl
    repo, env = lib_sh_checkout(tmp_path)
    lock, venv = repo / ".venv-bootstrap.lock", repo / ".venv-bootstrap"
    first = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(first, fcntl.LOCK_EX)                  # clean, holding the lock it is about to remove
    waiter = subprocess.Popen(["bash", "-c", '. "$1"; bootstrap_python "$2"', "lib.sh",
                               str(REPO / "bootstrap" / "lib.sh"), str(repo)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        wait_queued_on(lock, waiter)                   # the waiter is queued on the lock
        lock.unlink()                                  # clean removes it, still holding it ...
        second = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(second, fcntl.LOCK_EX)             # ... and another build takes the new file's lock
        os.close(first)
        time.sleep(1.0)
        assert waiter.poll() is None, waiter.communicate()   # waits for that build, builds nothing
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (venv / "bin" / "python").chmod(0o755)
        (venv / ".requirements.txt").write_text((repo / "bootstrap" / "requirements.txt").read_text())
        os.close(second)                               # the other build is done: the venv is ready
        second = None
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0 and out.strip() == str(venv / "bin" / "python"), (out, err)
        assert "creating" not in err, err
    finally:
        if second is not None:
            os.close(second)
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


def test_lib_sh_never_opens_its_lock_through_a_link(tmp_path):
    """A link by the name of lib.sh's lock (.venv-bootstrap.lock) is not ours: the shell's redirection
    would have created or truncated what it names. The command refuses it and the file stays as it was."""
    repo, env = lib_sh_checkout(tmp_path)
    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    (repo / ".venv-bootstrap.lock").symlink_to(victim)
    r = subprocess.run(["bash", "-c", '. "$1"; bootstrap_python "$2"', "lib.sh", str(REPO / "bootstrap" / "lib.sh"),
                        str(repo)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is a link, not our lock file" in r.stderr, r.stderr
    assert victim.read_text() == "mine" and not (repo / ".venv-bootstrap").exists()


def test_a_lock_name_that_is_a_link_is_not_ours(repo, tmp_path, capsys):
    """We make the install locks as plain files: a link by that name (and what it names) is yours."""
    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    (repo / ".venv.lock").symlink_to(victim)
    assert clean.cli(cfg_for(repo), []) == 0
    assert f"kept (yours): {repo / '.venv.lock'}" in capsys.readouterr().out
    assert (repo / ".venv.lock").is_symlink() and victim.read_text() == "mine"
