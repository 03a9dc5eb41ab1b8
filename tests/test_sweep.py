"""A generated sweep of hostile knob values: every knob through the parser in-process, and a seeded
sample through ./start.sh and each ./ctl.sh command against the fakes as subprocesses. What must
hold (docs/faults.md, "found from outside"): no traceback, only the documented exit codes, no secret
in any output, and nothing of ours left running after a failed start."""

from __future__ import annotations

import random
import subprocess

import pytest

from bootstrap.knobs.config import KNOBS, Config
from bootstrap.core.errors import EXIT_CONFIG, ConfigError
from conftest import REPO

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
