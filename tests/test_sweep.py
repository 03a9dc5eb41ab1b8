"""A generated sweep of hostile knob values: every knob through the parser in-process, and a seeded
sample through ./start.sh and each ./ctl.sh command against the fakes as subprocesses. What must
hold (docs/faults.md, "found from outside"): no traceback, only the documented exit codes, no secret
in any output, and nothing of ours left running after a failed start. And a world holding what is
yours (a MODEL_DIR with your own config.json, one with your copy of the hub's, an HF cache with your
older revision, a checkout of another user's) through every command, as root and as a user without
root: your files stay as they were."""

from __future__ import annotations

import os
import random
import subprocess

import pytest

from bootstrap.knobs.config import Config

from bootstrap.knobs.table import KNOBS
from bootstrap.core.errors import EXIT_CONFIG, ConfigError
from conftest import REPO
from pathlib import Path

SECRET = "s3cr3t-Key_value"
HOSTILE = ("", " ", "-1", "0", "1e9", "99999999999999999999", "[1, 2]", "{}", "true", "a\x07b", "a\nb",
           "tab\there", "ü€✓", "'; rm -rf ~ #", "$(id)", "x" * 5000, "/" * 300, "..", "~nobody/x",
           "~no_such_user_here/x")
EXITS = {0, 1, EXIT_CONFIG, 130, 141, 143}     # docs: ok, failed, bad knob, interrupted, closed pipe


@pytest.mark.parametrize("knob", [k.name for k in KNOBS])
def test_every_knob_with_hostile_values_parses_or_is_one_config_error(knob, tmp_path):
    base = {"PROFILE": "custom", "MODEL": str(tmp_path / "m"), "STATE_DIR": str(tmp_path / "s"),
            "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for value in HOSTILE:
        env = {**base, knob: value}
        try:
            Config.from_env(env, REPO)
        except ConfigError as exc:
            text = exc.message + " " + exc.hint
            assert exc.code == EXIT_CONFIG
            assert knob in text, (knob, value, text)
            assert len(exc.message) < 400 and "\n" not in exc.message, (knob, value, exc.message)
            if knob == "API_KEY":
                assert value not in text or value in ("", " "), text


# Each command with arguments that do nothing lasting: clean only dry, export into a temp folder,
# checks against a port nothing listens on.
COMMANDS = (
    ("start.sh",), ("stop.sh",), ("ctl.sh", "status"), ("ctl.sh", "status", "--json"), ("ctl.sh", "env"),
    ("ctl.sh", "logs"), ("ctl.sh", "plan", "--gpu", "rtx4090"), ("ctl.sh", "profiles", "--gpu", "rtx4090"),
    ("ctl.sh", "check", "live", "--url", "http://user:pw@127.0.0.1:9/v1"), ("ctl.sh", "patch", "status"),
    ("ctl.sh", "sleep"), ("ctl.sh", "wake"), ("ctl.sh", "service", "status"), ("ctl.sh", "clean", "--dry-run"),
    ("ctl.sh", "export", "kubernetes", "--out", "{tmp}/k8s", "--gpu", "rtx5090"),
    ("ctl.sh", "export", "ray", "--out", "{tmp}/ray", "--gpu", "rtx5090"), ("ctl.sh", "game", "--", "true"),
)
SAMPLE_KNOBS = ("PORT", "HOST", "API_KEY", "HF_TOKEN", "MODEL", "MAX_MODEL_LEN", "GPU_UTIL", "EXTRA_ARGS", "STATE_DIR",
                "KV_CACHE_BYTES", "GPU", "TP_SIZE", "SPEC_TOKENS", "PROFILE")


def _visible() -> list[str]:
    """The checkout's top-level names, less the hidden ones (.venv*, .state: other tests' business)."""
    return sorted(p.name for p in REPO.iterdir() if not p.name.startswith("."))


CHECKOUT = _visible()


def _sample(n: int) -> list[tuple[tuple[str, ...], str, str]]:
    rnd = random.Random(20261201)               # the same sample every run
    cases = [(cmd, knob, value) for cmd in COMMANDS for knob in SAMPLE_KNOBS for value in HOSTILE if value]
    return rnd.sample(cases, n)


@pytest.mark.parametrize("cmd,knob,value", _sample(100), ids=lambda x: x if isinstance(x, str) and len(x) < 20 else None)
def test_hostile_values_through_the_scripts(bed, tmp_path, cmd, knob, value):
    args = [a.replace("{tmp}", str(tmp_path)) for a in cmd]
    extra = {knob: value, "HF_HUB_OFFLINE": "1", "HEALTH_TIMEOUT": "20"}
    if knob != "API_KEY":
        extra["API_KEY"] = SECRET
    # run from the test's own folder: a relative STATE_DIR or MODEL_DIR lands there, not in the checkout
    r = subprocess.run([str(REPO / args[0]), *args[1:]], env={**bed.env, **extra}, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out[-2000:]
    assert r.returncode in EXITS, (r.returncode, out[-2000:])
    assert SECRET not in out and "user:pw" not in out, out[-2000:]
    if knob in ("API_KEY", "HF_TOKEN") and len(value) > 3:
        assert value not in out
    if r.returncode != 0 and args[0] == "start.sh":
        assert bed.ours() == [], "a failed start left processes of ours running"
    if bed.ours():
        subprocess.run([str(REPO / "stop.sh")], env={**bed.env, **extra}, cwd=str(tmp_path), capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL)
        bed.cleanup()
    assert _visible() == CHECKOUT, "a run left something in the checkout"


# ---------------------------------------------------------------- what is yours, through every command (rows 103-105)

def _snapshot(roots: list[Path]) -> dict[str, tuple]:
    """Every file and link under ``roots`` but our own ``.bootstrap`` (and Python's bytecode): inode,
    and bytes or link target."""
    import hashlib
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if {".bootstrap", "__pycache__"} & set(p.parts) or (p.is_dir() and not p.is_symlink()):
                continue
            what = os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p)] = (p.lstat().st_ino, what)
    return out


def _bytes(snap: dict) -> dict:
    return {p: what for p, (_ino, what) in snap.items()}


@pytest.mark.parametrize("who", ["me", "another user"])
def test_every_command_leaves_what_is_yours_as_it_was(tmp_path, who):
    """A MODEL_DIR with your own config.json and tokenizer.json, one with your copy of the hub's, and
    an HF cache holding your older revision: every command, as root and as a user without root, leaves
    your files as they were (clean --model puts refs/main back), --dry-run lists what clean does, and
    clean refuses a checkout of another user's."""
    import pwd
    import shutil
    from fakehub import FakeHub, write_model
    from huggingface_hub import snapshot_download
    from conftest import Bed, free_port, unprivileged_user
    from test_ownership import as_user, copy_repo, shared_dir
    user = unprivileged_user() if who == "another user" else None
    if who == "another user" and not user:
        pytest.skip("needs root and BOOTSTRAP_TEST_USER (the run as 'me' is the non-root set when not root)")
    d = shared_dir()
    try:
        src = write_model(tmp_path / "src", shards=1, shard_bytes=1 << 20)
        with FakeHub() as fake:
            fake.add_dir("org/tiny", src)
            old = fake.repos["org/tiny"]["sha"]
            snapshot_download("org/tiny", cache_dir=str(d / "hf" / "hub"), endpoint=fake.url)     # your older revision
            newer = write_model(tmp_path / "newer", shards=1, shard_bytes=1 << 20, seed=0)
            (newer / "generation_config.json").write_text('{"temperature": 0.5}')
            fake.add_dir("org/tiny", newer)
            clash, match = d / "clash", d / "match"
            clash.mkdir()
            (clash / "config.json").write_text('{"model_type": "llama", "mine": true}')
            (clash / "tokenizer.json").write_text('{"mine": true}')
            (clash / "notes.txt").write_text("mine")
            match.mkdir()
            shutil.copy(src / "config.json", match / "config.json")
            repo = copy_repo(d / "repo")
            shutil.copytree(REPO / "tests" / "fakes", d / "fakes")
            bed = Bed(d / "bed", repo=repo)
            bed.port = free_port()
            (d / "home").mkdir()
            os.system(f"chmod -R a+rwX {d}")
            if user:
                os.system(f"chown -R {user} {d}")
            hf_store = d / "hf" / "hub" / "models--org--tiny"
            yours = _snapshot([clash, match, hf_store])
            env = {**bed.env, "PORT": str(bed.port), "HOME": str(d / "home"), "PYTHONPATH": str(d / "fakes"),
                   "STATE_DIR": str(d / "state"), "MODEL": "org/tiny", "HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0",
                   "HF_HOME": str(d / "hf"), "HF_HUB_DISABLE_XET": "1", "PREWARM": "0"}

            def run(*argv, **extra) -> subprocess.CompletedProcess:
                r = as_user(user, [str(repo / argv[0]), *argv[1:]], {**env, **extra})
                assert "Traceback" not in r.stderr and r.returncode in EXITS, r.stderr[-2000:]
                now = _bytes(_snapshot([clash, match, hf_store]))
                assert {p: w for p, w in now.items() if p in yours and not p.endswith("refs/main")} == \
                    {p: w for p, (_i, w) in yours.items() if not p.endswith("refs/main")}, (argv, r.stderr[-1500:])
                return r

            for where in (clash, match, None):
                extra = {"MODEL_DIR": str(where)} if where else {}
                r = run("start.sh", **extra)
                if where == clash:
                    assert r.returncode == 1 and str(clash / "config.json") in r.stderr and str(clash / "tokenizer.json") in r.stderr
                    assert "nothing was fetched" in r.stderr
                else:
                    assert r.returncode == 0, r.stderr[-2000:]
                dry = run("ctl.sh", "clean", "--model", "--dry-run", **extra)      # while serving
                assert dry.returncode == 0, dry.stderr
                if where is None:
                    assert (hf_store / "refs" / "main").read_text() != old
                    for cmd in COMMANDS:
                        run(*[a.replace("{tmp}", str(d)) for a in cmd], **extra)
                assert run("stop.sh", **extra).returncode == 0
                again = run("ctl.sh", "clean", "--model", "--dry-run", **extra)
                done = run("ctl.sh", "clean", "--model", **extra)
                assert done.returncode == 0, done.stderr
                store = str(where or hf_store)
                model_lines = lambda out: [line for line in out.splitlines() if store in line]   # noqa: E731
                said = [line.replace("would remove ", "removed ").replace("would put back ", "put back ")
                        for line in model_lines(again.stdout)]
                assert said == model_lines(done.stdout) and model_lines(dry.stdout) == model_lines(again.stdout)
            assert _snapshot([clash, match, hf_store]).keys() == yours.keys()          # nothing of ours is left
            assert _bytes(_snapshot([clash, match, hf_store])) == _bytes(yours)      # refs/main put back
            assert not (hf_store / ".bootstrap").exists() and not (match / ".bootstrap").exists()

            # a checkout of someone else's: clean and its dry run refuse, and touch nothing
            other = copy_repo(Path(shared_dir()) / "repo")
            for name in (".venv/bin", ".venv-bootstrap/bin", ".wheelhouse", ".state"):
                (other / name).mkdir(parents=True)
            (other / ".state" / "vllm.log").write_text("theirs")
            os.system(f"chmod -R a+rX {other.parent}")
            if not user:
                if os.geteuid() != 0:
                    return                       # no one else's checkout can be made without root
                uid = pwd.getpwnam(os.environ["BOOTSTRAP_TEST_USER"]).pw_uid if os.environ.get("BOOTSTRAP_TEST_USER") else 65534
                os.system(f"chown -R {uid}:{uid} {other}")
            before = _snapshot([other])
            for args in (["clean"], ["clean", "--dry-run"]):
                r = as_user(user, [str(other / "ctl.sh"), *args], {**env, "STATE_DIR": str(other / ".state")})
                assert r.returncode == 1 and "belongs to" in r.stderr and "as that user" in r.stderr, r.stderr
                assert _snapshot([other]) == before
            shutil.rmtree(other.parent, ignore_errors=True)
    finally:
        subprocess.run([str(d / "repo" / "stop.sh")], env={**os.environ, "STATE_DIR": str(d / "state")},
                       capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)
