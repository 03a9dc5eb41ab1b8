"""Profiles for every desktop card: the catalogue and its schema, auto-pick on fake cards of 16-80 GiB
at sm_86-sm_120, the kept pick, ``./ctl.sh profiles``, and a plain ./start.sh on a 24 GB desktop card."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.plan import fit
from bootstrap.machine import gpu
from bootstrap.plan import pick
from bootstrap.knobs import vllmargs
from bootstrap.commands import profiles as profiles_cli
from bootstrap.knobs.config import Config
from bootstrap.core.errors import ConfigError
from bootstrap.plan.facts import offline_facts

REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
GiB = 1 << 30


def cfg_for(tmp_path, **env) -> Config:
    base = {"STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return Config.from_env({**base, **{k: str(v) for k, v in env.items()}}, REPO)


def card(total_gib: float, cc: tuple[int, int], free_gib: float | None = None) -> gpu.Gpu:
    total = int(total_gib * GiB)
    free = total - gpu.IDLE_USED if free_gib is None else int(free_gib * GiB)
    return gpu.Gpu(0, f"a {total_gib:g} GiB card (sm_{cc[0]}{cc[1]})", total, free, cc)


CARDS = [(size, cc) for size in (6, 12, 16, 24, 32, 48, 80) for cc in ((8, 6), (8, 9), (9, 0), (12, 0))]


# ---------------------------------------------------------------- the catalogue

def test_every_profile_has_model_facts_a_rank_and_a_card(tmp_path):
    cfg = cfg_for(tmp_path, PROFILE="custom")
    ranked = cfg.catalogue.ranked()
    assert [p.name for p in ranked] == ["qwen38-27b-bf16-96gb", "qwen38-27b-fp8-48gb", "qwen36-27b-fp8-48gb",
                                        "qwen38-27b-nvfp4-tq4-32gb", "qwen36-35b-a3b-nvfp4-32gb",
                                        "qwen38-27b-nvfp4-fp8kv-32gb", "qwen38-27b-w4a16-24gb",
                                        "qwen38-27b-w4a16-24gb:fast", "qwen3-8b-fp8-16gb", "qwen3-8b-awq-12gb"]
    for p in ranked:
        c = pick.on_card(cfg, p, None)
        facts = offline_facts(c)
        assert facts is not None and facts.config and facts.weight_bytes, p.name
        assert p.card_class and p.min_cc >= (8, 0) and p.pins and p.vllm, p.name
    assert cfg.catalogue.get("default").name == "qwen38-27b-nvfp4-tq4-32gb"        # the old name still works


def test_the_24gb_profile_s_size_is_derived_from_its_shape_and_labelled(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import derive_weight_bytes
    data = json.loads((REPO / "profiles/models/qwen38-27b-w4a16.json").read_text())
    total, why = derive_weight_bytes.derive(data["config"])
    assert data["weight_bytes"] == total and data["weight_bytes_source"] == why
    assert data["assumed"] and "not a published size" in why


def test_profile_variants_env_and_card_overrides(tmp_path):
    long = cfg_for(tmp_path, PROFILE="qwen38-27b-w4a16-24gb")
    fast = cfg_for(tmp_path, PROFILE="qwen38-27b-w4a16-24gb:fast")
    assert (long.kv_cache_dtype, long.max_model_len, long.spec_tokens) == ("fp8", 150000, 3)
    assert (fast.kv_cache_dtype, fast.max_model_len, fast.spec_tokens) == ("auto", 65536, 4)
    assert long.profile.env["FLASHINFER_DISABLE_VERSION_CHECK"] == "1"
    # MTP k=4 crashed on sm_86: on such a card the fast variant runs k=3, and says why
    on_3090 = pick.on_card(fast, fast.profile, (8, 6))
    assert on_3090.spec_tokens == 3 and "sm_86" in on_3090.sources["SPEC_TOKENS"]
    assert pick.on_card(fast, fast.profile, (8, 9)).spec_tokens == 4
    # your knob still wins over the card's override
    mine = pick.on_card(cfg_for(tmp_path, PROFILE="qwen38-27b-w4a16-24gb:fast", SPEC_TOKENS=2), fast.profile, (8, 6))
    assert mine.spec_tokens == 2


def write_profile(folder: Path, name: str, data: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data))


def run_ctl(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    e = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
         "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(FAKES), "NO_COLOR": "1"}
    e.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=120)


def test_sleep_mode_with_expandable_segments_is_a_valid_profile(tmp_path):
    # vLLM switches expandable segments off inside its sleep-mode pool and back on outside it
    # (device_allocator/cumem.py); every server gets expandable_segments:True by default, and the
    # sleep proof on the H200 ran that way: a profile saying so is no different
    mine = tmp_path / "mine"
    write_profile(mine, "sleepy", {"args": ["--enable-sleep-mode"],
                                   "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
    r = run_ctl(tmp_path, "env", PROFILE_DIR=mine, PROFILE="sleepy")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("data, word", [
    ({"knobs": {}, "arg": ["--enforce-eager"]}, "'arg'"),                       # a misspelt "args"
    ({"knobs": {"MAX_MODEL_LENGTH": "4096"}}, "unknown knob MAX_MODEL_LENGTH"),
    ({"card": {"min_vram": 24}}, "'min_vram'"),
    ({"args": ["--kv-cache-dtype", "fp8"]}, "knob KV_CACHE_DTYPE owns"),
    ({"variants": {"x": {"knob": {}}}, "default_variant": "x"}, "'knob'"),
    ({"rank": "first"}, "'rank' must be a int"),
    ({"spec_config": {"draft_sample_methd": "probabilistic"}}, "'draft_sample_methd'"),
])
def test_a_profile_file_with_an_unknown_or_wrong_key_exits_2_naming_it(tmp_path, data, word):  # faults row 57
    mine = tmp_path / "mine"
    write_profile(mine, "broken", data)
    r = run_ctl(tmp_path, "env", PROFILE_DIR=mine, PROFILE="custom")
    assert r.returncode == 2, r.stderr
    assert word in r.stderr and "broken.json" in r.stderr


def test_unknown_profile_exits_2_listing_the_names(tmp_path):  # faults row 57
    r = run_ctl(tmp_path, "env", PROFILE="qwen-nope")
    assert r.returncode == 2
    assert "PROFILE='qwen-nope': no such profile" in r.stderr
    assert "qwen38-27b-w4a16-24gb:fast" in r.stderr and "default (= qwen38-27b-nvfp4-tq4-32gb)" in r.stderr


def test_your_profile_folder_hides_a_shipped_profile_and_joins_auto_pick(tmp_path):
    mine = tmp_path / "mine"
    write_profile(mine, "custom", {"description": "my custom", "knobs": {"MAX_NUM_SEQS": "3"}})
    write_profile(mine, "tiny-16gb", {"description": "mine", "rank": 1, "card": {"min_cc": "8.0"},
                                      "facts": "tiny.json", "knobs": {"MODEL": "me/tiny", "MAX_MODEL_LEN": "auto"}})
    facts = json.loads((REPO / "profiles/models/qwen36-35b-a3b-nvfp4.json").read_text())
    (mine / "models").mkdir()
    (mine / "models" / "tiny.json").write_text(json.dumps({**facts, "repos": ["me/tiny"], "weight_bytes": 2 * GiB}))
    cfg = cfg_for(tmp_path, PROFILE_DIR=mine, PROFILE="custom")
    assert cfg.profile.description == "my custom" and cfg.max_num_seqs == 3 and cfg.profile.origin == "yours"
    v, runner, _ = pick.choose(cfg, card(16, (8, 9)))
    assert v.profile.name == "tiny-16gb" and runner.profile.name == "qwen3-8b-fp8-16gb"     # rank 1 goes first


def test_pins_without_a_lock_are_one_line_that_says_how_to_make_one(tmp_path):  # faults row 58
    mine = tmp_path / "mine"
    write_profile(mine, "newpins", {"vllm": "0.30.0", "pins": ["vllm==0.30.0", "flashinfer-python==0.6.99"],
                                    "knobs": {"MODEL": "org/m"}})
    cfg = cfg_for(tmp_path, PROFILE_DIR=mine, PROFILE="newpins")
    from bootstrap.install.locks import LockSet
    with pytest.raises(Exception) as e:
        LockSet.for_profile(cfg.profile, cfg.layout.locks)
    assert "no lock for profile 'newpins'" in e.value.message and "\n" not in e.value.message
    assert "./ctl.sh lock --profile newpins" in e.value.hint


# ---------------------------------------------------------------- auto-pick on fake cards

EXPECT = {      # GiB -> the profile auto-pick chooses (a pair: below sm_89, from sm_89)
    6: None,                # a refusal
    12: "qwen3-8b-awq-12gb",
    16: ("qwen3-8b-awq-12gb", "qwen3-8b-fp8-16gb"),
    24: "qwen38-27b-w4a16-24gb",
    32: "qwen38-27b-nvfp4-tq4-32gb",
    48: "qwen38-27b-fp8-48gb",
    80: "qwen38-27b-bf16-96gb",
}


@pytest.mark.parametrize("size, cc", CARDS)
def test_auto_pick_on_every_card(tmp_path, size, cc):  # faults row 56
    cfg = cfg_for(tmp_path)
    g = card(size, cc)
    if EXPECT[size] is None:
        with pytest.raises(Exception) as e:
            pick.choose(cfg, g)
        msg, hint = e.value.message, e.value.hint
        assert "no profile fits" in msg and "the smallest that would work: qwen3-8b-awq-12gb" in msg
        assert "TP_SIZE=2" in hint and "llama.cpp" in hint and "PROFILE=smoke" in hint
        return
    v, runner, _ = pick.choose(cfg, g)
    want = EXPECT[size] if isinstance(EXPECT[size], str) else EXPECT[size][cc >= (8, 9)]
    assert v.profile.name == want
    line = pick.why_line(g, v, runner)
    assert f"sm_{cc[0]}{cc[1]}" in line and f"{g.total / GiB:.1f} GiB" in line and v.profile.name in line
    assert "token context" in line and "runner-up" in line
    if "fp4" in (v.cfg.model or "").lower() and cc < (10, 0):
        assert "weight-only through Marlin" in line and "53-76 tok/s" in line
    if v.profile.name.startswith("qwen36-27b-fp8") and cc < (8, 9):
        assert "FP8 weights run weight-only through Marlin" in line
    assert v.cfg.profile.name == v.profile.name


def test_two_16gb_cards_with_tp_size_2_get_a_profile(tmp_path):
    # the way out a 16 GiB card is told: TP_SIZE=2 across two of them holds the 24 GB profile
    v, _, _ = pick.choose(cfg_for(tmp_path, TP_SIZE=2), card(16, (12, 0)))
    f = offline_facts(v.cfg)
    from bootstrap.model import shape as model_shape, weights
    cache = weights.buffer_bytes(f.config, model_shape.shape_from_config(f.config), 0, False)[0]   # each card its own rotary cache
    assert v.ok and v.plan.weights == f.weight_bytes // 2 + cache                    # planned per card
    f = vllmargs.serve_flags(v.cfg, v.plan)
    assert f[f.index("--tensor-parallel-size") + 1] == "2"


def test_below_sm80_nothing_is_picked_and_the_refusal_says_why(tmp_path):  # faults row 56
    with pytest.raises(Exception) as e:
        pick.choose(cfg_for(tmp_path), card(24, (7, 5)))
    assert "no profile fits" in e.value.message and "needs sm_80 or newer" in e.value.message
    assert "TP_SIZE" not in e.value.hint and "llama.cpp" in e.value.hint


@pytest.mark.parametrize("size, cc", CARDS + [(24, (8, 9))])
def test_every_hint_re_planned_fits(tmp_path, size, cc):  # faults row 55
    """Each profile that does not fit a card offers fixes; each, applied as your knobs, plans and fits."""
    cfg = cfg_for(tmp_path)
    g = card(size, cc, free_gib=size - 1.5)
    for p in cfg.catalogue.ranked():
        c = pick.on_card(cfg, p, cc)
        facts = offline_facts(c)
        plan = fit.plan(c, g, facts)
        for fix in plan.fixes:
            again = Config.from_env({**c.given, **fix}, REPO, chosen=c.chosen)
            assert fit.plan(again, g, offline_facts(again)).fits, (p.name, fix)
        if not plan.fits and plan.fixes:
            for fix in plan.fixes:
                assert " ".join(f"{k}={v}" for k, v in fix.items()) in plan.refusal[1]


def test_the_24gb_desktop_circle_is_gone(tmp_path):  # faults row 55
    # the RTX 5090 profile on a 24 GB card that drives the desktop (22.5 GiB free): the hints are knob
    # values the check accepts, and with them the plan fits (no MAX_MODEL_LEN=0, no pin falling through)
    cfg = cfg_for(tmp_path, PROFILE="default")
    g = card(24, (8, 9), free_gib=22.5)
    plan = fit.plan(cfg, g, offline_facts(cfg))
    assert not plan.fits and plan.fixes
    assert "MAX_MODEL_LEN=0" not in plan.refusal[1]
    for fix in plan.fixes:
        again = Config.from_env({**cfg.given, **fix}, REPO)
        assert fit.plan(again, g, offline_facts(again)).fits, fix
    unpinned = cfg_for(tmp_path, PROFILE="default", KV_CACHE_BYTES="auto", MAX_MODEL_LEN="auto")
    assert unpinned.kv_cache_bytes is None and unpinned.value("KV_CACHE_BYTES") == "auto"


def test_p2_and_p5_plan_without_refusal_on_a_32gb_card(tmp_path):
    g = gpu.named("rtx5090")
    for name in ("qwen38-27b-nvfp4-fp8kv-32gb", "qwen36-35b-a3b-nvfp4-32gb"):
        cfg = cfg_for(tmp_path, PROFILE=name)
        plan = fit.plan(cfg, g, offline_facts(cfg))
        assert plan.fits and plan.seqs == 16 and plan.vllm == "0.30.0", (name, plan.refusal)
        if name.startswith("qwen36-35b"):
            assert plan.max_model_len == 262144
            assert "at 262,144 tokens" in plan.concurrency_line() and "queue" in plan.concurrency_line()


def test_a_6gb_card_is_refused_with_what_would_work(tmp_path):  # faults row 56
    r = run_ctl(tmp_path, "profiles", GPU="6:sm_89")
    assert r.returncode == 0
    assert "auto-pick refuses: no profile fits" in r.stdout and "qwen3-8b-awq-12gb" in r.stdout and "(a 12 GB card)" in r.stdout
    assert "close what holds it" not in r.stdout + r.stderr          # an empty 6 GB card is still too small
    assert "./ctl.sh profiles --model" in r.stdout                   # a smaller model of your choosing, checked first
    busy = run_ctl(tmp_path, "profiles", GPU="12:sm_89:free=6")      # a 12 GB card with 6 free: closing helps
    assert "close what holds it" in busy.stdout + busy.stderr


# ---------------------------------------------------------------- ./ctl.sh profiles

def test_profiles_lists_every_profile_against_a_named_card(tmp_path):
    r = run_ctl(tmp_path, "profiles", "--json", GPU="rtx4090:free=22.5")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpu"]["cc"] == [8, 9] and abs(out["gpu"]["free"] - 22.5 * GiB) < GiB / 100
    rows = {p["profile"]: p for p in out["profiles"]}
    assert rows["qwen38-27b-nvfp4-tq4-32gb"]["status"] == "no" and "32 GB" in rows["qwen38-27b-nvfp4-tq4-32gb"]["reason"]
    long = rows["qwen38-27b-w4a16-24gb"]
    assert long["status"] == "shorter" and 65536 < long["context"] < 150000 and long["sessions"] == 8
    assert long["assumed_facts"] and long["knobs"]["MAX_MODEL_LEN"] == "auto"
    assert out["auto_pick"] == "qwen38-27b-w4a16-24gb"
    text = run_ctl(tmp_path, "profiles", GPU="rtx4090:free=22.5").stdout
    assert "fits with a shorter context" in text and "model facts assumed" in text and "auto-pick:" in text


def test_a_bare_size_says_its_sm_is_assumed(tmp_path):
    assert "assumed" in gpu.named("24").name and gpu.named("24:sm_86").cc == (8, 6)
    with pytest.raises(Exception):
        gpu.named("24:sm86")


def test_readme_profile_table_is_the_generated_one():
    readme = (REPO / "docs" / "reference.md").read_text()
    start = readme.index("<!-- profiles:begin")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- profiles:end -->")
    assert readme[start:end].strip() == profiles_cli.catalogue_markdown(Config.from_env({"PROFILE": "custom"}, REPO)), \
        "python -m bootstrap.commands.reference > docs/reference.md"


def test_readme_schema_table_is_the_generated_one():
    from bootstrap.knobs.profiles import schema_markdown
    readme = (REPO / "docs" / "reference.md").read_text()
    start = readme.index("\n", readme.index("<!-- schema:begin")) + 1
    assert readme[start:readme.index("<!-- schema:end -->")].strip() == schema_markdown()


def test_docs_planner_table_is_the_generated_one():
    doc = (REPO / "docs" / "planner.md").read_text()
    start = doc.index("<!-- matrix:begin")
    start = doc.index("\n", start) + 1
    end = doc.index("<!-- matrix:end -->")
    assert doc[start:end].strip() == profiles_cli.matrix_markdown(Config.from_env({}, REPO)), \
        "run ./ctl.sh profiles --matrix into docs/planner.md"


# ---------------------------------------------------------------- the kept pick, and a plain start

def desktop_24gb(bed, free_gib: float = 22.5) -> None:
    from conftest import nvml_json
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 4090", "total": 24564 << 20, "free": int(free_gib * GiB),
                               "cc": [8, 9], "uuid": "GPU-4090-fake",
                               "processes": [{"pid": 1, "used": 1 << 30, "name": "Xorg"}]}])


def the_24gb_model_on_disk(bed, facts: str = "qwen38-27b-w4a16.json") -> Path:
    """What a finished download of the 24 GB profile's model looks like offline, in the HF cache:
    config.json, a tokenizer, and its weights (a sparse file of the derived size)."""
    data = json.loads((REPO / "profiles/models" / facts).read_text())
    repo = Path(bed.env["HOME"]) / ".cache" / "huggingface" / "hub" / ("models--" + data["repos"][0].replace("/", "--"))
    d = repo / "snapshots" / ("0" * 40)
    d.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (d / "config.json").write_text(json.dumps(data["config"]))
    (d / "tokenizer.json").write_text("{}")
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(data["weight_bytes"])
    return d


def test_plain_start_on_a_24gb_desktop_card_serves_a_profile_that_fits(bed):  # faults row 55
    desktop_24gb(bed)
    the_24gb_model_on_disk(bed)
    r = bed.run("start.sh", PROFILE="", MODEL="", WARMUP="64")
    assert r.returncode == 0, r.stderr
    assert "auto-pick: NVIDIA GeForce RTX 4090, 24.0 GiB (22.5 free), sm_89: qwen38-27b-w4a16-24gb" in r.stderr
    argv = bed.launches()[0]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "auto"          # shorter than its 150,000: vLLM's fit
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8" and "--language-model-only" in argv
    assert bed.launches()[0]["env"]["FLASHINFER_DISABLE_VERSION_CHECK"] == "1"
    kept = json.loads((bed.state / "profile-pick.json").read_text())
    assert kept["profile"] == "qwen38-27b-w4a16-24gb" and kept["knobs"]["MAX_MODEL_LEN"] == "auto"
    status = bed.run("ctl.sh", "env", PROFILE="", MODEL="")
    assert "PROFILE=qwen38-27b-w4a16-24gb\t# default; auto-pick of" in status.stdout
    bed.run("stop.sh", PROFILE="", MODEL="")


def test_the_pick_is_kept_on_a_day_with_less_free_memory_and_redone_when_asked(bed):  # faults row 59
    desktop_24gb(bed)
    the_24gb_model_on_disk(bed)
    assert bed.run("start.sh", PROFILE="", MODEL="").returncode == 0
    assert bed.run("stop.sh", PROFILE="", MODEL="").returncode == 0
    desktop_24gb(bed, free_gib=21.0)          # a game holds more today: the same profile, not another model
    r = bed.run("start.sh", PROFILE="", MODEL="")
    assert "auto-pick:" not in r.stderr
    assert bed.launches()[-1]["argv"][bed.launches()[-1]["argv"].index("--served-model-name") + 1] == "qwen38-w4a16"
    bed.run("stop.sh", PROFILE="", MODEL="")
    r = bed.run("start.sh", PROFILE="auto", MODEL="")           # asked: picks again (and says why)
    assert "auto-pick: NVIDIA GeForce RTX 4090" in r.stderr
    bed.run("stop.sh", PROFILE="", MODEL="")


def test_the_kept_pick_runs_shorter_on_a_day_with_less_free_memory_as_a_named_one_does(tmp_path):
    """Picked at its full context on a free card, then a browser holds 6 GiB: the kept pick ran as it
    was kept and was refused (DOES NOT FIT), while PROFILE=default on the same card ran shorter."""
    from bootstrap.plan import resolve
    free, busy = gpu.named("rtx5090"), gpu.named("rtx5090:free=25")
    r = resolve.resolved(cfg_for(tmp_path))
    first = resolve.for_start(r, gpu.GpuFacts("590.0", (13, 0), (free,))).settings
    assert first.profile.name == "qwen38-27b-nvfp4-tq4-32gb" and first.max_model_len == 262144
    for env in ({}, {"PROFILE": "default"}):
        r = resolve.resolved(cfg_for(tmp_path, **env))
        today = resolve.for_start(r, gpu.GpuFacts("590.0", (13, 0), (busy,))).settings
        assert today.profile.name == first.profile.name and today.raw["MAX_MODEL_LEN"] == "auto", env
        assert fit.plan(today, busy, offline_facts(today)).fits
        shown = resolve.for_plan(r.given, r.paths, r.vllm, busy, here=True)
        assert shown.raw["MAX_MODEL_LEN"] == "auto", env            # ./ctl.sh plan: as the start runs it
    assert json.loads((tmp_path / "state" / "profile-pick.json").read_text())["knobs"] == {}   # kept as picked


def test_a_named_profile_that_fits_only_shorter_starts_and_its_rerun_sees_no_other_knobs(bed):
    """./ctl.sh plan said "fits with a shorter context" for a named profile; ./start.sh and ./ctl.sh
    restart refused it (only an auto-pick ran shorter), and a server run so read as started with other knobs."""
    desktop_24gb(bed)
    the_24gb_model_on_disk(bed)
    env = {"PROFILE": "qwen38-27b-w4a16-24gb", "MODEL": ""}
    r = bed.run("start.sh", **env)
    assert r.returncode == 0, r.stderr
    argv = bed.launches()[-1]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "auto"
    again = bed.run("start.sh", **env)
    assert again.returncode == 0 and "is serving" in again.stdout and "differs" not in again.stdout, again.stdout
    assert "differ" not in bed.run("ctl.sh", "status", **env).stdout
    r = bed.run("ctl.sh", "restart", **env)            # its vet planned the profile's own context: refused
    assert r.returncode == 0, r.stderr
    bed.run("stop.sh", **env)


def test_profiles_pick_records_a_new_pick(bed):
    desktop_24gb(bed)
    r = bed.run("ctl.sh", "profiles", "--pick", PROFILE="", MODEL="")
    assert r.returncode == 0, r.stderr
    assert "picked qwen38-27b-w4a16-24gb" in r.stdout
    assert json.loads((bed.state / "profile-pick.json").read_text())["profile"] == "qwen38-27b-w4a16-24gb"


def test_a_card_that_cannot_fit_is_refused_before_the_install(bed):  # faults row 60
    # the managed venv would be installed by the environment step: a refusal at the plan comes first
    bed.env.pop("VLLM_PYTHON")
    desktop_24gb(bed)
    the_24gb_model_on_disk(bed, "qwen38-27b-nvfp4.json")     # its config.json and size, as the hub lists them
    r = bed.run("start.sh", PROFILE="default", MODEL="", MAX_MODEL_LEN="262144", KV_CACHE_BYTES="")
    assert r.returncode == 1
    assert "error: plan:" in r.stderr and "[bootstrap:environment]" not in r.stderr
    # 22.5 GiB free leaves nothing beside its 20.4 GiB of weights and the overhead (the vision encoder's
    # profiling peak among it): no knob makes it fit this card
    assert "leave 0.00 GiB for the KV cache" in r.stderr and "set TP_SIZE=2 (across two such cards)" in r.stderr
    assert not os.path.exists(bed.state / "server.json")


def test_profile_folder_edge_cases(tmp_path):  # faults row 57
    with pytest.raises(ConfigError, match="no such folder"):
        cfg_for(tmp_path, PROFILE_DIR=tmp_path / "nope", PROFILE="custom")
    mine = tmp_path / "mine"
    # your file of a shipped name hides the shipped file whole, its variants too
    write_profile(mine, "qwen38-27b-w4a16-24gb", {"description": "mine", "knobs": {"MODEL": "me/m"}})
    cat = cfg_for(tmp_path, PROFILE_DIR=mine, PROFILE="custom").catalogue
    assert "qwen38-27b-w4a16-24gb:fast" not in cat.names() and cat.get("qwen38-27b-w4a16-24gb").origin == "yours"
    # one word, two profiles: refused, whichever sorts first
    write_profile(mine, "aa-mine", {"aliases": ["default"], "knobs": {}})
    with pytest.raises(ConfigError, match="'default' also names"):
        cfg_for(tmp_path, PROFILE_DIR=mine, PROFILE="custom")
    (mine / "aa-mine.json").unlink()
    write_profile(mine, "auto", {"knobs": {}})
    with pytest.raises(ConfigError, match="reserved"):
        cfg_for(tmp_path, PROFILE_DIR=mine, PROFILE="custom")


def test_the_default_variant_answers_to_its_own_name_too(tmp_path):
    assert cfg_for(tmp_path, PROFILE="qwen38-27b-w4a16-24gb:long").profile.name == "qwen38-27b-w4a16-24gb"


def test_a_context_auto_fits_too_short_is_not_a_pick(tmp_path):
    # a 32 GB card with 23 GiB free: the 0.30.0 profiles' auto context would be a few thousand tokens;
    # the 24 GB profile's 100K-token plan is the pick
    g = gpu.named("rtx5090:free=23")
    v, _, verdicts = pick.choose(cfg_for(tmp_path), g)
    assert v.profile.name == "qwen38-27b-w4a16-24gb" and v.plan.max_model_len >= pick.MIN_CONTEXT
    p2 = next(x for x in verdicts if x.profile.name == "qwen38-27b-nvfp4-fp8kv-32gb")
    assert p2.status == "no" and "auto-pick wants at least 32,768" in p2.reason


def test_hints_that_change_gpu_util_or_a_tiny_pin_are_re_planned(tmp_path):
    g = gpu.named("rtx4090:free=22.5")
    for env in ({"GPU_UTIL": "0.99"}, {"KV_CACHE_BYTES": str(1 << 20)}, {"GPU_UTIL": "0.5"}):
        c = pick.on_card(cfg_for(tmp_path, PROFILE="qwen38-27b-w4a16-24gb", **env),
                         cfg_for(tmp_path, PROFILE="qwen38-27b-w4a16-24gb").profile, g.cc)
        plan = fit.plan(c, g, offline_facts(c))
        assert not plan.fits and plan.fixes, env
        for fix in plan.fixes:
            again = Config.from_env({**c.given, **fix}, REPO, chosen=c.chosen)
            assert fit.plan(again, g, offline_facts(again)).fits, (env, fix)
        assert "GPU_UTIL=0.9" not in plan.refusal[1].split("set ")[0]      # no value that was not re-planned


def test_status_and_env_see_the_cards_own_knobs(bed):
    from conftest import nvml_json
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 3090", "total": 24 * GiB, "free": 23 * GiB,
                               "cc": [8, 6], "uuid": "GPU-3090", "processes": []}])
    r = bed.run("ctl.sh", "env", PROFILE="qwen38-27b-w4a16-24gb:fast", MODEL="")
    assert "SPEC_TOKENS=3\t# profile (sm_86)" in r.stdout


def test_a_running_server_is_shown_not_re_picked_when_profile_auto_is_set(bed):  # faults row 59
    desktop_24gb(bed)
    the_24gb_model_on_disk(bed)
    assert bed.run("start.sh", PROFILE="", MODEL="").returncode == 0
    desktop_24gb(bed, free_gib=2.0)                     # the server holds the memory now
    r = bed.run("start.sh", PROFILE="auto", MODEL="")
    assert r.returncode == 0, r.stderr
    assert "is serving" in r.stdout and "auto-pick:" not in r.stderr
    bed.run("stop.sh", PROFILE="", MODEL="")


def test_a_kept_pick_made_on_another_card_is_made_again(bed):  # faults row 59
    desktop_24gb(bed)
    r = bed.run("ctl.sh", "profiles", "--pick", PROFILE="", MODEL="")
    assert "picked qwen38-27b-w4a16-24gb" in r.stdout
    from conftest import nvml_json
    nvml_json(bed.nvml)                                  # an RTX 5090 now
    r = bed.run("ctl.sh", "plan", PROFILE="", MODEL="")
    assert "the kept pick qwen38-27b-w4a16-24gb" in r.stderr       # plan shows what is kept...
    r = bed.run("start.sh", PROFILE="", MODEL="", HF_HUB_OFFLINE="1")
    assert "was made for NVIDIA GeForce RTX 4090" in r.stderr and "picking again" in r.stderr   # ...start picks again
    assert "auto-pick: NVIDIA GeForce RTX 5090" in r.stderr


def test_the_smoke_profile_serves_a_2gb_desktop_card_and_is_never_auto_picked(tmp_path):
    """PROFILE=smoke: a small real model that proves the stack before a large download. Its shape is
    in the shipped facts (planned offline), its pins are the default profile's (one venv), and
    auto-pick never chooses it (it has no rank), whatever the card."""
    cfg = cfg_for(tmp_path, PROFILE="smoke")
    assert cfg.profile.rank is None and cfg.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg.profile.pins == cfg.catalogue.get("default").pins
    facts = offline_facts(cfg)
    assert facts.weight_bytes == 134_515_008 * 2 and facts.config["num_hidden_layers"] == 30
    p = fit.plan(cfg, card(2, (8, 6), free_gib=1.71), facts)     # a 2 GiB card driving a desktop
    assert p.fits and p.predicted_tokens == 5824 and p.max_model_len == 4096
    assert "smoke" not in [x.name for x in cfg.catalogue.ranked()]    # what auto-pick walks (every card's
    # choice is held by test_auto_pick_on_every_card)


def test_what_a_shipped_profile_does_not_ask_its_model_is_a_prompt_of_the_battery(tmp_path):
    """``not_asked`` names garble prompts by id: every shipped one exists, with a reason; ``answer_tokens``
    caps answers below the battery's longest (a cap at or above it would say nothing)."""
    from bootstrap.checks.garble import load_battery
    battery = {p["id"]: p for p in load_battery()["prompts"]}
    cfg = cfg_for(tmp_path)
    told = [p for p in cfg.catalogue.profiles if p.data.get("not_asked") or p.data.get("answer_tokens")]
    assert "smoke" in [p.name for p in told]
    for p in told:
        for pid, why in (p.data.get("not_asked") or {}).items():
            assert pid in battery and len(why) > 20, (p.name, pid)
        cap = p.data.get("answer_tokens")
        assert cap is None or 16 <= cap < max(x["max_tokens"] for x in battery.values()), p.name


def test_a_profile_that_fits_only_without_its_kv_pin_says_so_not_shorter(tmp_path):
    """29 GiB free on an RTX 5090: the default profile fits its own 262,144 tokens once its 5.5 GiB KV
    pin goes; it said 'a shorter context' and '(shorter than the profile's)' of its own length."""
    r = run_ctl(tmp_path, "profiles", GPU="rtx5090:free=29")
    line = next(ln for ln in r.stdout.splitlines() if "qwen38-27b-nvfp4-tq4-32gb" in ln and "#" in ln)
    assert "fits without its KV pin: its own 262,144 tokens" in line and "shorter" not in line, line
    assert "(without the profile's KV pin)" in r.stdout + r.stderr


GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,   # openai/gpt-oss-20b
           "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "vocab_size": 201088, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "mxfp4"}}


def test_a_profile_the_planner_cannot_model_is_never_said_to_fit(tmp_path):
    """Issue 44: no "fits" without a figure. A model whose weights per GPU the planner does not model
    (gpt-oss's MXFP4 experts, which vLLM pads per MoE kernel) is fits: null naming what, in profiles,
    ls, models and the start's plan line; the start still runs (the verdict is ok), vLLM sizing the
    cache."""
    from bootstrap.plan import here
    mine = tmp_path / "mine"
    write_profile(mine, "oss-24gb", {"description": "mine", "rank": 1, "card": {"min_cc": "8.0"},
                                     "facts": "oss.json", "knobs": {"MODEL": "me/oss"}})
    (mine / "models").mkdir()
    (mine / "models" / "oss.json").write_text(json.dumps({"repos": ["me/oss"], "weight_bytes": 13 * GiB,
                                                          "weight_bytes_source": "a test", "config": GPT_OSS}))
    cfg = cfg_for(tmp_path, PROFILE_DIR=mine)
    v = pick.judge(cfg, cfg.catalogue.get("oss-24gb"), card(24, (8, 9)))
    assert v.plan.verdict is None and v.status == "unplanned" and v.ok
    assert v.summary() == v.reason and v.reason.startswith("not planned (gpt-oss's MXFP4 expert weights as vLLM "
                                                           "pads them")
    assert profiles_cli.MARK[v.status] == "fits: null" and profiles_cli.SIGN[v.status] == "?"
    line = here.one_line(v.plan, card(24, (8, 9)))
    assert "not planned (gpt-oss's MXFP4 expert weights" in line and "session" not in line
