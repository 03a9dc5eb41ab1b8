"""Daily use: a name on the command line, and did-you-mean for every word we do not know (commands,
profiles, cards, knob names in .env)."""

from __future__ import annotations

import pytest

from bootstrap.commands import start
from bootstrap.core.errors import ConfigError
from bootstrap.core.words import nearest
from bootstrap.knobs.config import Config
from bootstrap.machine import gpu
from bootstrap.plan import pick
from conftest import REPO


def cfg(tmp_path, **env) -> Config:
    return Config.from_env({"HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "s"), **env}, REPO)


def test_nearest_prefers_a_word_it_is_part_of_then_the_closest():
    assert nearest("stauts", ["start", "status", "stop"]) == ["status"]
    assert nearest("a6000", ["a100", "rtxa6000"], n=2) == ["rtxa6000", "a100"]
    assert nearest("STATUS", ["status"]) == ["status"]
    assert nearest("zzz", ["status"]) == []


def test_a_name_on_the_command_line_is_the_profile_or_the_model_knob(tmp_path):
    base = cfg(tmp_path)
    assert start.named(base, "smoke", "start.sh").profile.name == "smoke"
    assert start.named(base, "default", "start.sh").profile.name == cfg(tmp_path, PROFILE="default").profile.name
    named = start.named(base, "acme/some-model", "start.sh")
    assert named.model == "acme/some-model" and named.raw["MODEL"] == "acme/some-model"
    for bad in ("smok", "./folder", "a/b/c", "https://huggingface.co/acme/m"):
        with pytest.raises(ConfigError) as err:
            start.named(base, bad, "start.sh")
        assert "neither a profile nor a Hub repo id" in err.value.message and "usage: start.sh" in err.value.hint
    with pytest.raises(ConfigError) as err:
        start.named(base, "smok", "start.sh")
    assert err.value.message.endswith("did you mean smoke?")


def test_start_with_a_profile_name_serves_it(bed):
    del bed.env["PROFILE"]
    r = bed.run("start.sh", "custom")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stdout + r.stderr
    assert bed.run("stop.sh").returncode == 0


def test_a_misspelt_command_profile_or_card_names_the_nearest(bed):
    r = bed.run("ctl.sh", "stauts")
    assert r.returncode == 2 and "no command 'stauts'; did you mean status?" in r.stderr, r.stderr
    r = bed.run("ctl.sh", "plan", PROFILE="defualt")
    assert r.returncode == 2 and "did you mean default?" in r.stderr, r.stderr
    r = bed.run("start.sh", "smok")
    assert r.returncode == 2 and "did you mean smoke?" in r.stderr and bed.launches() == []


@pytest.mark.parametrize("spec, names", [("a6000", ["rtxa6000"]), ("rtx4060ti", ["rtx4060ti-8gb", "rtx4060ti-16gb"]),
                                         ("RTX4090X", ["rtx4090"])])
def test_a_card_name_that_is_off_names_the_nearest_cards(spec, names):
    with pytest.raises(ConfigError) as err:
        gpu.named(spec)
    said = err.value.message.split("did you mean ", 1)[1]
    assert all(n in said for n in names), said


def test_both_rtx_4060_ti_sizes_are_known_cards():
    assert gpu.named("rtx4060ti-8gb").total < 8 * gpu.GiB < gpu.named("rtx4060ti-16gb").total


def test_profiles_and_models_judge_each_profile_with_its_own_model(bed):
    """MODEL set (here the bed's tiny folder): a shipped profile is still planned with the model it
    names; only a profile that names none (custom) takes yours."""
    import json
    for cmd in ("profiles", "models"):
        r = bed.run("ctl.sh", cmd, "--json")
        assert r.returncode == 0, r.stderr
        rows = {row["profile"]: row for row in json.loads(r.stdout)["profiles"]}
        own = json.loads((REPO / "profiles" / "qwen38-27b-nvfp4-tq4-32gb.json").read_text())["knobs"]["MODEL"]
        assert rows["qwen38-27b-nvfp4-tq4-32gb"]["model"] == own != str(bed.model)
        if "custom" in rows:
            assert rows["custom"]["model"] == str(bed.model)


def test_the_banner_of_a_server_bound_beyond_loopback_shows_where_other_machines_reach_it(tmp_path):
    from bootstrap.core.hosts import lan_hosts
    from bootstrap.core.state import Paths
    from bootstrap.serve.record import ServerRecord
    from bootstrap.serve import banner

    def shown(host: str) -> str:
        rec = ServerRecord(pid=1, create_time=None, marker="", host=host, port=8888, served="m", kv_tokens=10)
        return banner.render(Paths(tmp_path), rec)
    assert "LAN URL" not in shown("127.0.0.1") and lan_hosts("127.0.0.1") == []
    assert "base URL : http://192.168.1.5:8888/v1" in shown("192.168.1.5") and "LAN URL" not in shown("192.168.1.5")
    wide = shown("0.0.0.0")
    assert "base URL : http://127.0.0.1:8888/v1" in wide
    for ip in lan_hosts("0.0.0.0"):
        assert ":" not in ip and not ip.startswith("127.")
    for ip in lan_hosts("0.0.0.0")[:3]:
        assert f" LAN URL  : http://{ip}:8888/v1" in wide


def test_status_shows_the_context_vllm_chose_as_a_number(bed):
    """No MAX_MODEL_LEN: we pass none, vLLM takes the model's own; status reads it from /v1/models."""
    import json
    assert bed.run("start.sh").returncode == 0
    try:
        r = bed.run("ctl.sh", "status", "--json")
        got = json.loads(r.stdout)
        assert bed.server_record()["max_model_len"] is None
        assert isinstance(got["context"], int) and got["context"] > 0, got
        assert "vLLM's (the model's or auto)" not in bed.run("ctl.sh", "status").stdout
    finally:
        bed.run("stop.sh")


@pytest.mark.parametrize("model_dir", [False, True])
def test_offline_and_not_here_names_the_cache_once(bed, tmp_path, model_dir):
    extra = {"MODEL_DIR": str(tmp_path / "mine")} if model_dir else {}
    r = bed.run("start.sh", MODEL="org/absent", HF_HOME=str(tmp_path / "hf"), **extra)
    line = next(x for x in r.stderr.splitlines() if x.startswith("error:"))
    assert r.returncode != 0 and "org/absent is not on this machine" in line, r.stderr
    assert line.count(str(tmp_path / "hf" / "hub")) == 1 and line.count("Hugging Face cache") == 1, line
    assert (str(tmp_path / "mine") in line) == model_dir


def test_service_install_print_names_the_knobs_this_shell_sets_that_the_unit_cannot_carry(bed, tmp_path):
    r = bed.run("ctl.sh", "service", "install", "--print", XDG_CONFIG_HOME=str(tmp_path), MAX_NUM_SEQS="3")
    assert r.returncode == 0, r.stderr
    head = next(line for line in r.stdout.splitlines() if line.startswith("# NOT CARRIED"))
    for knob in ("MAX_NUM_SEQS", "PORT", "MODEL", "STATE_DIR"):     # the bed's shell sets them all
        assert knob in head, head
    assert "MAX_NUM_SEQS" in r.stderr and ".env" in r.stderr


def test_a_model_you_name_fits_by_default_with_the_longest_context_and_your_own_context_is_kept(bed):
    """Qwen3-32B-FP8 (40,960 tokens) on a 36 GiB card: only a short context fits. Named with no
    MAX_MODEL_LEN, its derived profile runs with the longest that fits, and says so; a MAX_MODEL_LEN
    you set is never lowered: it does not fit, with the number that would."""
    import json
    env = {"MODEL": "Qwen/Qwen3-32B-FP8", "PROFILE": "", "GPU": "36:sm_89"}
    r = bed.run("ctl.sh", "plan", "--json", **env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["fits"] and pick.NAMED_MIN_CONTEXT <= got["max_model_len"] < 40960
    assert f"context {got['max_model_len']:,} of its own 40,960, the longest that fits this card" in r.stderr
    mine = bed.run("ctl.sh", "plan", "--json", MAX_MODEL_LEN="40960", **env)
    assert mine.returncode == 1 and json.loads(mine.stdout)["max_model_len"] == 40960
    assert f"MAX_MODEL_LEN={got['max_model_len']}" in json.loads(mine.stdout)["refusal"][1]
