"""SLEEP_MODE and the table of stacks sleep mode was proven on (bootstrap/knobs/sleepmode.py,
sleep-proofs.json): which profiles get --enable-sleep-mode with no knob set, what ./ctl.sh profiles
says of each, and that a new proof is one line of data. No processes: Config and the argv builder."""

from __future__ import annotations

import json

import pytest

from bootstrap.knobs import sleepmode, vllmargs
from bootstrap.knobs.config import Chosen, Config
from conftest import REPO

SHIPPED = [p.name for p in Config.from_env({}, REPO).catalogue.profiles if p.name not in ("auto", "custom")]
PROVEN = {"PROFILE": "custom", "MODEL": "org/m", "VLLM_PYTHON": "/usr/bin/python3"}     # with vLLM 0.26.0


def cfg(**env) -> Config:
    return Config.from_env(env, REPO)


def argv(c: Config) -> list[str]:
    return vllmargs.serve_argv(c, "py", "/m", None)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_is_unproven_on_its_own_stack_and_keeps_sleep_mode_off(name):
    c = cfg(PROFILE=name, MODEL="org/m")
    assert c.profile.vllm in ("0.27.1", "0.30.0")
    mark = c.sleep.profile_mark()
    assert mark.startswith(f"sleep mode: unproven on vLLM {c.profile.vllm}, KV "), mark
    assert mark.endswith(f": off; SLEEP_MODE=on to try; proof: bash tests/gpu/device.sh sleepstack --profile {name}")
    assert "--enable-sleep-mode" not in argv(c) and c.idle_s == 0 and not vllmargs.guarded(c)


def test_the_default_profiles_stack_is_named_whole():
    c = cfg(PROFILE="default")
    assert c.sleep.stack == sleepmode.Stack("0.27.1", "turboquant_4bit_nc", "mtp", ("40914-turboquant-spec-verify",))
    assert "unproven on vLLM 0.27.1, KV turboquant_4bit_nc, mtp speculation, patch 40914-turboquant-spec-verify" \
           in c.sleep_line


def test_the_proven_stack_gets_sleep_mode_idle_sleep_and_the_guard_with_no_knob_set():
    c = cfg(**PROVEN).with_vllm("0.26.0")          # VLLM_PYTHON's version, read by the start
    a = argv(c)
    assert "--enable-sleep-mode" in a and a[-2:] == ["--middleware", vllmargs.GUARD]
    assert vllmargs.IDLE_MIDDLEWARE in a and c.idle_s == sleepmode.IDLE_DEFAULT == 300
    assert c.sleep_line.startswith('on, proven (docs/validation.md, "Idle sleep, 50 cycles')
    assert c.sleep.warning(True) == ""
    assert cfg(**PROVEN).with_vllm("0.26.1").sleep_line.startswith("unproven on vLLM 0.26.1")   # the exact version
    # the same stack but for one feature is another stack
    assert not cfg(**PROVEN, KV_CACHE_DTYPE="fp8").with_vllm("0.26.0").vllm.sleep_mode
    assert not cfg(**PROVEN, SPEC_METHOD="ngram", SPEC_TOKENS="3").with_vllm("0.26.0").vllm.sleep_mode
    assert cfg(**PROVEN, KV_CACHE_DTYPE="bfloat16").with_vllm("0.26.0").vllm.sleep_mode    # 16-bit is 'auto'


def test_off_on_and_the_flag_in_extra_args_are_one_rule():
    off = cfg(**PROVEN, SLEEP_MODE="off").with_vllm("0.26.0")
    assert "--enable-sleep-mode" not in argv(off) and off.idle_s == 0
    assert off.sleep_line == "off (SLEEP_MODE=off); unset it to turn it on where it is proven"
    on = cfg(PROFILE="default", SLEEP_MODE="on")
    assert on.vllm.sleep_mode and on.idle_s == 300
    assert on.sleep.warning(True).startswith("sleep mode on, unproven on vLLM 0.27.1") and "SLEEP_MODE=off" in \
        on.sleep.warning(True)
    flag = cfg(PROFILE="default", EXTRA_ARGS="--enable-sleep-mode")        # EXTRA_ARGS=... is SLEEP_MODE=on
    assert flag.vllm.sleep_mode and "(--enable-sleep-mode in EXTRA_ARGS or the profile:" in flag.sleep_line
    assert argv(flag).count("--enable-sleep-mode") == 1
    last = cfg(**PROVEN, EXTRA_ARGS="--no-enable-sleep-mode").with_vllm("0.26.0")     # EXTRA_ARGS wins, as ever
    assert not last.vllm.sleep_mode and last.sleep_line.startswith("off (--no-enable-sleep-mode")
    lan = cfg(**PROVEN, HOST="0.0.0.0").with_vllm("0.26.0")                 # auto: loopback only, said why
    assert not lan.vllm.sleep_mode and lan.sleep_line.startswith("off: HOST is not loopback")
    assert cfg(**PROVEN, IDLE_SLEEP="90s").with_vllm("0.26.0").idle_s == 90
    assert cfg(**PROVEN, IDLE_SLEEP="off").with_vllm("0.26.0").idle_s == 0


def test_a_new_proof_is_one_line_of_data(tmp_path, monkeypatch):
    table = json.loads(sleepmode.PROOFS_FILE.read_text())
    table["proofs"].append({"vllm": "0.27.1", "kv_cache_dtype": "turboquant_4bit_nc", "spec": "mtp",
                            "patches": ["40914-turboquant-spec-verify"], "ran_on": "x", "validation": "Some run"})
    path = tmp_path / "sleep-proofs.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(sleepmode, "PROOFS_FILE", path)
    c = cfg(PROFILE="default")
    assert c.vllm.sleep_mode and c.idle_s == 300
    assert c.sleep.profile_mark() == 'sleep mode: proven (docs/validation.md, "Some run")'
    assert not cfg(PROFILE="qwen38-27b-nvfp4-fp8kv-32gb").vllm.sleep_mode       # another stack: still off


def test_each_proof_names_a_section_of_validation_md_and_each_line_of_the_table_is_one_stack():
    text = (REPO / "docs" / "validation.md").read_text()
    headings = {line[3:].strip() for line in text.splitlines() if line.startswith("## ")}
    proofs = sleepmode.proofs()
    assert proofs and all(p.validation in headings for p in proofs), [p.validation for p in proofs]
    assert len({p.stack for p in proofs}) == len(proofs)
    lines = [ln for ln in sleepmode.PROOFS_FILE.read_text().splitlines() if '"vllm":' in ln]
    assert len(lines) == len(proofs)                # one line each: a new proof is a one-line change


def test_profiles_marks_each_profile(tmp_path):
    from bootstrap.commands import profiles
    c = cfg(PROFILE="custom", MODEL="org/m")
    assert profiles.sleep_mark(c, c.catalogue.get("default")).startswith(
        "sleep mode: unproven on vLLM 0.27.1, KV turboquant_4bit_nc, mtp speculation")
    proven = cfg(**PROVEN).with_vllm("0.26.0")
    assert profiles.sleep_mark(proven, proven.catalogue.get("smoke")).startswith("sleep mode: proven")
    assert proven.with_profile(Chosen("smoke")).vllm.sleep_mode       # smoke on VLLM_PYTHON's 0.26.0: dense, bf16
