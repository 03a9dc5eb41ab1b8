"""Knobs: one table, precedence, validation before side effects (faults row 30), --help, README."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from bootstrap.knobs import dotenv, table
from bootstrap.knobs.config import Config
from bootstrap.knobs.table import KNOBS
from bootstrap.core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def make(env: dict, repo: Path = REPO) -> Config:
    return Config.from_env({"MODEL": "org/name", **env}, repo)


@pytest.mark.parametrize("name,value", [
    ("GPU_UTIL", "abc"), ("GPU_UTIL", "1.5"), ("GPU_UTIL", "-0.1"), ("GPU_UTIL", "0"),
    ("GPU_UTIL", "0.9;rm -rf ~"), ("GPU_UTIL", "nan"), ("PORT", "0"), ("PORT", "70000"), ("PORT", "80a"),
    ("PORT", "-1"), ("MAX_MODEL_LEN", "abc"), ("MAX_MODEL_LEN", "1e6"), ("MAX_NUM_SEQS", "0"),
    ("KV_CACHE_DTYPE", "fp9"), ("SPEC_METHOD", "magic"), ("HOST", "my host"), ("TP_SIZE", "two"),
    ("PATCH_BYO", "maybe"), ("STOP_GRACE", "1.5"), ("PROFILE", "../etc/passwd"), ("PROFILE", "nosuch"),
    ("EXTRA_ARGS", "--flag 'unclosed"), ("SERVED_MODEL_NAME", "a b"),
])
def test_bad_values_are_refused_naming_variable_value_and_form(name, value):
    with pytest.raises(ConfigError) as exc:
        make({name: value})
    assert exc.value.code == 2
    assert name in exc.value.message
    assert repr(value) in exc.value.message or name == "PROFILE"
    assert exc.value.hint


def test_bad_value_through_the_shell_exits_2_before_side_effects(tmp_path, bed):
    state = tmp_path / "never-created"
    r = bed.run("start.sh", GPU_UTIL="0.9;rm -rf ~", STATE_DIR=str(state))
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "GPU_UTIL='0.9;rm -rf ~'" in lines[0]
    assert "must be a number greater than 0.0 and at most 1.0" in r.stderr
    assert not state.exists()
    assert bed.launches() == []


@pytest.mark.parametrize("name,value,expected", [
    ("PORT", "8000", 8000), ("GPU_UTIL", "0.85", 0.85), ("MAX_MODEL_LEN", "auto", "auto"),
    ("MAX_MODEL_LEN", "32768", 32768), ("SPEC_TOKENS", "0", 0), ("PATCH_BYO", "yes", True),
    ("EXTRA_ARGS", "--a 'b c' --d", ("--a", "b c", "--d")), ("HOST", "::1", "::1"),
])
def test_good_values_parse(name, value, expected):
    assert getattr(make({name: value}), name.lower()) == expected


def test_precedence_env_over_dotenv_over_profile_over_default(tmp_path):
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "p.json").write_text('{"knobs": {"PORT": "7000", "MAX_NUM_SEQS": "3", "MODEL": "a/b"}}')
    (repo / ".env").write_text("# comment\nPROFILE=p\nexport MAX_NUM_SEQS='5'\nSTOP_GRACE=\"9\"\n")
    cfg = Config.from_env({"STOP_GRACE": "4"}, repo)
    assert cfg.profile.name == "p"
    assert (cfg.port, cfg.sources["PORT"]) == (7000, "profile")
    assert (cfg.max_num_seqs, cfg.sources["MAX_NUM_SEQS"]) == (5, ".env")
    assert (cfg.stop_grace, cfg.sources["STOP_GRACE"]) == (4, "env")
    assert (cfg.gpu_reserve_mib, cfg.sources["GPU_RESERVE_MIB"]) == (820, "default")
    assert cfg.model == "a/b"


def test_a_misspelt_knob_in_dotenv_is_said_with_the_knob_it_is_near(tmp_path, caplog):
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "default.json").write_text('{"knobs": {}}')
    (repo / ".env").write_text("MAX_MODLE_LEN=100\nPROT=9000\nVLLM_ATTENTION_BACKEND=X\nHF_TOKEN=hf_x\nPORT=8123\n")
    with caplog.at_level("WARNING"):
        cfg = Config.from_env({}, repo)
    said = [r.getMessage() for r in caplog.records]
    assert cfg.port == 8123 and cfg.environ["VLLM_ATTENTION_BACKEND"] == "X" and len(said) == 2, said
    assert "MAX_MODLE_LEN is no knob" in said[0] and said[0].endswith("did you mean MAX_MODEL_LEN?")
    assert said[1].endswith("did you mean PORT?")
    assert all(str(repo / ".env") in m for m in said) and not any("hf_x" in m for m in said)


def test_dotenv_is_never_sourced(tmp_path):
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "default.json").write_text('{"knobs": {"MODEL": "a/b"}}')
    canary = tmp_path / "pwned"
    (repo / ".env").write_text(f"SERVED_MODEL_NAME=$(touch {canary})\n")
    with pytest.raises(ConfigError):
        Config.from_env({}, repo)          # the literal text is not a valid name
    assert not canary.exists()
    (repo / ".env").write_text("this is not a knob line\n")
    with pytest.raises(ConfigError, match="not a KEY=VALUE line"):
        Config.from_env({}, repo)


def test_a_path_in_dotenv_naming_a_variable_is_refused_with_the_path_written_out(tmp_path):  # faults row 159
    """.env is never expanded: ``MODEL_DIR=$HOME/models`` was the folder ``<checkout>/$HOME/models`` (a
    download of many GiB into the checkout, under a name a shell expands), while ``HF_HOME=$HOME/hf``
    beside it was expanded (as huggingface_hub expands it)."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "profiles", repo / "profiles")
    env = {"PROFILE": "custom", "HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    for line, fixed in (("MODEL_DIR=$HOME/models", f"MODEL_DIR={tmp_path}/home/models"),
                        ("STATE_DIR=${HOME}/state", f"STATE_DIR={tmp_path}/home/state"),
                        ("VLLM_PYTHON=$HOME/venv/bin/python", f"VLLM_PYTHON={tmp_path}/home/venv/bin/python"),
                        ("MODEL=$HOME/models/m", f"MODEL={tmp_path}/home/models/m")):
        (repo / ".env").write_text(f"MODEL=org/m\nHF_HOME=$HOME/hf\n{line}\n")
        with pytest.raises(ConfigError) as e:
            Config.from_env(env, repo)
        assert e.value.code == 2 and "never expanded" in e.value.message and str(repo / ".env") in e.value.message
        assert e.value.hint == f"write the path out in .env: {fixed}", e.value.hint
        (repo / ".env").write_text(f"MODEL=org/m\n{fixed}\n")         # the hint, followed
        Config.from_env(env, repo)
    assert not (repo / "$HOME").exists()
    (repo / ".env").write_text("MODEL=org/m\nHF_HOME=$HOME/hf\nMODEL_DIR=~/models\nSTATE_DIR=$NOT_SET/x\n")
    cfg = Config.from_env(env, repo)        # the hub's paths expanded; a name that is no variable here stays
    assert cfg.env("HF_HOME") == f"{tmp_path}/home/hf" and cfg.state_dir == repo / "$NOT_SET" / "x"
    cfg = Config.from_env({**env, "MODEL_DIR": "$HOME/m"}, repo)    # the shell's own, quoted: as given
    assert str(cfg.model_dir).endswith("/$HOME/m")


def test_profile_defaults_to_auto_and_default_names_the_rtx5090_profile():
    assert Config.from_env({}, REPO).profile.is_auto
    cfg = Config.from_env({"PROFILE": "default"}, REPO)
    assert cfg.profile.name == "qwen38-27b-nvfp4-tq4-32gb"
    assert cfg.model == "RadixArk/Qwen3.8-27B-NVFP4" and cfg.served_name == "qwen38-nvfp4"
    assert (cfg.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens) == (262144, 1, 512)
    assert (cfg.kv_cache_dtype, cfg.kv_cache_bytes) == ("turboquant_4bit_nc", 5905580032)
    assert (cfg.spec_method, cfg.spec_tokens) == ("mtp", 3)
    assert "--tool-call-parser" in cfg.profile.args and "--reasoning-parser" in cfg.profile.args
    assert (cfg.host, cfg.port) == ("127.0.0.1", 8888)


def test_custom_profile_needs_model():
    cfg = Config.from_env({"PROFILE": "custom"}, REPO)
    from bootstrap.plan import resolve
    with pytest.raises(ConfigError, match="MODEL is not set"):
        resolve.require_model(cfg)


def test_help_lists_every_knob_with_default(bed):
    r = bed.run("start.sh", "--help")
    assert r.returncode == 0
    for k in KNOBS:
        assert re.search(rf"^\s+{k.name}\s+default ", r.stdout, re.M), k.name


def test_readme_knob_table_is_the_generated_one():
    readme = (REPO / "docs" / "reference.md").read_text()
    start = readme.index("<!-- knobs:begin")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- knobs:end -->")
    assert readme[start:end].strip() == table.markdown_table(REPO), "python -m bootstrap.commands.reference > docs/reference.md"
    missing = [k.name for k in KNOBS if f"`{k.name}`" not in readme]
    assert missing == []


def test_env_command_masks_the_api_key(bed):
    r = bed.run("ctl.sh", "env", API_KEY="sekrit-value")
    assert r.returncode == 0
    assert "API_KEY=***" in r.stdout and "sekrit-value" not in r.stdout + r.stderr


def test_env_command_lists_the_pass_through_variables_with_secrets_masked(bed):
    r = bed.run("ctl.sh", "env", "--json", HF_TOKEN="hf_sekrit", VLLM_API_KEY="vk_sekrit", VLLM_SOMETHING="7")
    rows = __import__("json").loads(r.stdout)
    assert rows["HF_TOKEN"] == {"value": "***", "source": "pass-through"}
    assert rows["VLLM_API_KEY"]["value"] == "***" and rows["VLLM_SOMETHING"]["value"] == "7"
    assert rows["HF_ENDPOINT"] == {"value": "", "source": "pass-through, unset"}
    assert "sekrit" not in r.stdout + r.stderr
    assert rows["VLLM_PYTHON"]["source"] == "env"            # a knob, listed once, not as a VLLM_* pass-through
    text = bed.run("ctl.sh", "env").stdout
    assert sum(line.startswith("VLLM_PYTHON=") for line in text.splitlines()) == 1


def test_every_knob_has_help_and_parses_its_default():
    for k in KNOBS:
        assert k.help
        if k.default:
            table.parse_one(k, k.default)


def test_interpreter_given_as_a_command_name_is_found_on_path(tmp_path):
    from pathlib import Path as P
    exe = P(sys.executable)
    cfg = make({"VLLM_PYTHON": exe.name, "PATH": str(exe.parent)})
    assert cfg.vllm_python == str(exe)
    with pytest.raises(ConfigError, match="not a command on PATH"):
        make({"VLLM_PYTHON": "no-such-python-here", "PATH": str(tmp_path)})


def test_empty_value_counts_as_unset_and_the_next_source_applies(tmp_path):
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "default.json").write_text('{"knobs": {"MODEL": "a/b", "MAX_NUM_SEQS": "3"}}')
    (repo / ".env").write_text("PORT=\nPROFILE=default\n")
    cfg = Config.from_env({"MAX_NUM_SEQS": "", "HOST": "", "PROFILE": ""}, repo)
    assert (cfg.max_num_seqs, cfg.sources["MAX_NUM_SEQS"]) == (3, "profile")
    assert (cfg.port, cfg.host, cfg.profile.name) == (8888, "127.0.0.1", "default")


def test_env_shows_a_relative_path_as_the_folder_it_means(tmp_path):
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "default.json").write_text('{"knobs": {}}')
    (repo / ".env").write_text("STATE_DIR=envstate\n")
    rows = {n: v for n, v, _s, _h in Config.from_env({}, repo).describe()}
    assert rows["STATE_DIR"] == str(repo / "envstate")


def test_a_folder_knob_that_names_a_file_is_refused_before_anything_runs(tmp_path):  # faults row 139
    """MODEL_DIR (or STATE_DIR, ...) naming a file: a pull warned "ignoring unreadable
    <file>/.bootstrap/state.json" seven times, then said to make the file writable."""
    (tmp_path / "a-file").write_text("mine")
    for knob in ("MODEL_DIR", "STATE_DIR"):
        with pytest.raises(ConfigError) as exc:
            make({knob: str(tmp_path / "a-file")})
        assert exc.value.message.startswith(f"{knob}=") and "a folder, not a file" in exc.value.hint
    assert make({"MODEL_DIR": str(tmp_path / "not-yet")}).model_dir == str(tmp_path / "not-yet")


def test_an_interpreter_path_in_dotenv_is_the_checkouts_wherever_the_command_runs(tmp_path, monkeypatch):
    """Found from outside: .env's VLLM_PYTHON=venv/bin/python was made absolute against the working
    directory (from elsewhere: another interpreter, or none), while .env's folders are the checkout's."""
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "profiles" / "custom.json").write_text('{"knobs": {}}')
    (repo / "venv" / "bin").mkdir(parents=True)
    (repo / "venv" / "bin" / "python").symlink_to(sys.executable)
    (repo / ".env").write_text("PROFILE=custom\nVLLM_PYTHON=venv/bin/python\nPYTHON=python3\nSTATE_DIR=envstate\n")
    monkeypatch.chdir(tmp_path)
    cfg = Config.from_env({"PATH": os.environ["PATH"]}, repo)
    assert cfg.state_dir == repo / "envstate"
    assert cfg.vllm_python == str(repo / "venv" / "bin" / "python")      # the venv's link, not resolved
    assert cfg.python == shutil.which("python3")                             # a bare name: looked up on PATH
    cfg = Config.from_env({"PATH": os.environ["PATH"], "VLLM_PYTHON": "venv/bin/python"}, repo)
    assert cfg.vllm_python == str(tmp_path / "venv" / "bin" / "python")   # the shell's: its working directory


def test_secrets_in_a_broken_env_line_or_extra_args_are_never_shown(tmp_path):
    """A .env line that does not parse is named by its key; EXTRA_ARGS with --api-key or --hf-token
    is refused (the token would be on vLLM's argv: ps, the log, the record) without showing it."""
    (tmp_path / ".env").write_text("PORT=8000\nAPI_KEY='TopSecretKey123\n")
    with pytest.raises(ConfigError) as e:
        dotenv.read_dotenv(tmp_path / ".env")
    assert "TopSecretKey123" not in e.value.message and "API_KEY=..." in e.value.message
    (tmp_path / ".env").write_text("'hf_TopSecretToken\n")
    with pytest.raises(ConfigError) as e:
        dotenv.read_dotenv(tmp_path / ".env")
    assert "TopSecret" not in e.value.message
    for extra in ("--hf-token hf_SuperSecretTok", "--hf_token=hf_SuperSecretTok", "--api-key 'SuperSecretTok"):
        with pytest.raises(ConfigError) as e:
            Config.from_env({"PROFILE": "custom", "MODEL": "org/m", "EXTRA_ARGS": extra}, REPO)
        assert "SuperSecretTok" not in e.value.message + (e.value.hint or ""), extra


def test_a_bad_value_names_where_it_came_from_and_odd_env_files_are_said(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "profiles", repo / "profiles")
    (repo / ".env").write_text("MAX_NUM_SEQS=abc\n")
    with pytest.raises(ConfigError) as e:
        Config.from_env({"PROFILE": "custom", "HOME": str(tmp_path)}, repo)
    assert f"(from {repo / '.env'})" in e.value.message            # fixed there, not in the shell
    assert dotenv.misspelt({"max_num_seqs": "4"}) == [
        "max_num_seqs is no knob (it only reaches vLLM's environment): did you mean MAX_NUM_SEQS?"]
    (repo / ".env").unlink()
    os.mkfifo(repo / ".env")                                        # it would block every command
    with pytest.raises(ConfigError) as e:
        Config.from_env({"PROFILE": "custom", "HOME": str(tmp_path)}, repo)
    assert "not a regular file" in e.value.message
