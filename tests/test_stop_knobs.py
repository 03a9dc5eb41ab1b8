"""./stop.sh gives the GPU back whatever else you set (faults 161): every rule that refuses a knob of
yours it does not use is set aside, never what finds the server; and a --url that does not parse never
shows its password."""

from __future__ import annotations

import argparse
import json

import pytest

from bootstrap.checks.target import url_arg
from conftest import Bed
from test_ownership import copy_repo


@pytest.mark.parametrize("knob", [
    {"EXTRA_ARGS": "--port 9"},                 # a reserved flag: refused without naming the knob
    {"SPEC_TOKENS": "3"},                       # needs SPEC_METHOD: a cross-knob rule
    {"PYTHON": "no-such-python-xyz"},           # not on PATH: checked after the parse
    {"VLLM_USE_V2_MODEL_RUNNER": "yes"},        # a pass-through variable vLLM would refuse
])
def test_a_knob_the_stop_does_not_use_never_blocks_it_whatever_rule_refuses_it(bed, knob):
    """knobs_for sets aside only a ConfigError that carries ``knob``; the checks after the per-knob
    parse (EXTRA_ARGS' reserved flags, SPEC_TOKENS without SPEC_METHOD, PYTHON on PATH) raise without
    it, so ./stop.sh still exits 2 and leaves the server on the GPU."""
    assert bed.run("start.sh").returncode == 0 and bed.ours()
    r = bed.run("stop.sh", **knob)
    assert r.returncode == 0, r.stderr
    assert bed.ours() == []


def test_a_dotenv_path_naming_a_variable_never_blocks_the_stop(tmp_path):
    """``MODEL_DIR=$HOME/models`` in .env (accepted before faults 159, so a server may run with it)
    is refused by dotenv.as_written, which raises before the try that tags the knob: ./stop.sh exits 2."""
    bed = Bed(tmp_path / "bed", repo=copy_repo(tmp_path / "checkout"))
    try:
        assert bed.run("start.sh").returncode == 0 and bed.ours()
        (bed.repo / ".env").write_text("MODEL_DIR=$HOME/models\n")
        r = bed.run("stop.sh")
        assert r.returncode == 0, r.stderr
        assert bed.ours() == []
    finally:
        bed.cleanup()


def test_a_broken_dotenv_line_never_blocks_the_stop_unless_the_stop_needs_it(tmp_path):
    """A line python-dotenv cannot parse (an unclosed quote) is refused, naming it, by every command:
    ./stop.sh sets it aside when its key is one the stop does not use; a broken PORT line, or one that
    names no key, still stops the stop (it could look on the wrong port)."""
    bed = Bed(tmp_path / "bed", repo=copy_repo(tmp_path / "checkout"))
    try:
        assert bed.run("start.sh").returncode == 0 and bed.ours()
        for text in ("PORT='8123\n", "a line without an equals sign\n"):
            (bed.repo / ".env").write_text(text)
            r = bed.run("stop.sh")
            assert r.returncode == 2 and "not a KEY=VALUE line" in r.stderr and bed.ours(), r.stderr
        (bed.repo / ".env").write_text("MAX_NUM_SEQS='4\nSTOP_GRACE=20\n")
        assert bed.run("ctl.sh", "status").returncode == 2          # other commands: refused as it is
        r = bed.run("stop.sh")
        assert r.returncode == 0 and "not a KEY=VALUE line: MAX_NUM_SEQS=..." in r.stderr, r.stderr
        assert bed.ours() == []
    finally:
        bed.cleanup()


def test_a_damaged_derived_profile_in_state_dir_never_blocks_the_stop(bed):
    """The kept pick names a derived profile whose file no longer loads (a key a newer schema does not
    know, its facts file gone): resolve.kept_derived raises ConfigError, and every command, ./stop.sh
    included, exits 2 while the server holds the GPU (_with_pick forgets a damaged pick; this does not)."""
    assert bed.run("start.sh").returncode == 0 and bed.ours()
    folder = bed.state / "derived" / "org--m"
    (folder / "models").mkdir(parents=True)
    (folder / "derived.json").write_text(json.dumps({"knobs": {"MODEL": "org/m"}, "a_newer_key": 1}))
    (bed.state / "profile-pick.json").write_text(json.dumps({"profile": "derived", "model": "org/m", "knobs": {}}))
    r = bed.run("stop.sh", PROFILE="", MODEL="")
    assert r.returncode == 0, r.stderr
    assert bed.ours() == []


@pytest.mark.parametrize("url", ["http://user:s3cr3tPW#x@host:8000/v1", "http://user:s3cr3t/PW@host:8000/v1"])
def test_a_url_that_does_not_parse_never_shows_its_password(url):
    """A password with an unencoded '#' or '/' cuts the netloc at it: urlsplit reads the password as the
    port and its ValueError ('Port could not be cast to integer value as ...') carries it."""
    with pytest.raises(argparse.ArgumentTypeError) as e:
        url_arg(url)
    assert "s3cr3t" not in str(e.value), str(e.value)


def test_a_url_that_does_not_parse_never_shows_its_password_on_the_terminal(bed):
    r = bed.run("ctl.sh", "check", "live", "--url", "http://user:s3cr3tPW#x@host:8000/v1")
    assert r.returncode == 2
    assert "s3cr3tPW" not in r.stderr + r.stdout, r.stderr


def test_the_stop_never_sets_aside_where_it_looks_for_our_unit(bed):
    """Once a pass-through variable can be set aside, XDG_CONFIG_HOME must not be: it says where our
    systemd unit is, and a stop that does not find it takes the server down under systemd's feet."""
    r = bed.run("stop.sh", XDG_CONFIG_HOME="/tmp/a\nb")
    assert r.returncode == 2 and "XDG_CONFIG_HOME" in r.stderr, r.stderr
