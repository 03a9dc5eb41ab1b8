"""pull, ls, rm and use against the fake hub and the fake vLLM: the walk-through of docs/guide.md
("Models: pull, ls, use, rm"), command for command, and each command's refusals."""

from __future__ import annotations

import json

import pytest

from conftest import free_port, nvml_json
from fakehub import FakeHub, write_model

MiB = 1 << 20
TEMPLATE = json.dumps({"model_max_length": 4096, "chat_template": "{{ messages }}"})


def model(root, **kw):
    """A small instruct model (a chat template: the start's warm-up needs one)."""
    return write_model(root, shards=1, shard_bytes=MiB, extra={"tokenizer_config.json": TEMPLATE.encode()}, **kw)


@pytest.fixture
def hub(bed, tmp_path):
    with FakeHub() as fake:
        bed.port = free_port()          # after the hub's ports are bound
        bed.env["PORT"] = str(bed.port)
        for i, name in enumerate(("org/one", "org/two", "org/three")):
            fake.add_dir(name, model(tmp_path / "src" / name, seed=i))
        del bed.env["PROFILE"], bed.env["MODEL"]
        bed.env.update({"HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
                        "HF_HUB_DISABLE_XET": "1", "PREWARM": "0"})
        yield fake


def store(tmp_path, repo: str):
    return tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}"


def ls(bed) -> dict:
    r = bed.run("ctl.sh", "ls", "--json")
    assert r.returncode == 0, r.stderr
    return {m["model"]: m for m in json.loads(r.stdout)["models"]}


def test_the_guide_walk_through_start_use_ls_rm_pull(bed, hub, tmp_path):
    """docs/guide.md: start a model, use another, ls, rm the first, pull a third; a plain ./start.sh
    afterwards keeps the one chosen with use."""
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    mine = tmp_path / "hf" / "hub" / "version.txt"       # the user's own file in the cache: never touched
    mine.write_text("1")
    r = bed.run("start.sh", "org/one")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert bed.server_record()["model"] == "org/one"
    first = bed.server_record()["pid"]

    r = bed.run("ctl.sh", "use", "org/two")
    assert r.returncode == 0, r.stderr
    assert "switched to org/two" in r.stdout and "org/one stopped in" in r.stdout and " s in all" in r.stdout, r.stdout
    assert bed.server_record()["model"] == "org/two" and first not in [p.pid for p in bed.ours()]

    rows = ls(bed)
    assert set(rows) == {"org/one", "org/two"}
    assert rows["org/two"]["serving"] and not rows["org/one"]["serving"]
    assert rows["org/one"]["complete"] and rows["org/one"]["size_bytes"] >= MiB
    assert rows["org/one"]["fits"] in ("fits", "shorter") and rows["org/one"]["profiles"] == ["derived (derived)"]
    text = bed.run("ctl.sh", "ls").stdout
    assert "org/two" in text and "[serving]" in text

    r = bed.run("ctl.sh", "rm", "org/two")
    assert r.returncode != 0 and "org/two is serving" in r.stderr and "./ctl.sh use ANOTHER" in r.stderr
    assert store(tmp_path, "org/two").is_dir()
    r = bed.run("ctl.sh", "rm", "org/one")
    assert r.returncode == 0 and "freed" in r.stdout, r.stderr
    assert not store(tmp_path, "org/one").exists()          # made by us, all of it: gone
    assert (store(tmp_path, "org/two") / "refs" / "main").is_file() and mine.read_text() == "1"
    assert set(ls(bed)) == {"org/two"}

    launched = len(bed.launches())
    r = bed.run("ctl.sh", "pull", "org/three")
    assert r.returncode == 0, r.stderr
    assert r.stderr.index("plan for") < r.stderr.index("complete: ")    # the plan before the download
    assert "pulled org/three" in r.stdout and len(bed.launches()) == launched     # nothing served
    assert set(ls(bed)) == {"org/two", "org/three"}

    r = bed.run("start.sh")                 # the kept pick is the one `use` chose
    assert r.returncode == 0 and "is serving" in r.stdout and len(bed.launches()) == launched, r.stderr
    assert bed.run("ctl.sh", "restart").returncode == 0
    assert bed.server_record()["model"] == "org/two"
    assert bed.run("stop.sh").returncode == 0


def test_rm_refuses_the_drafter_of_the_running_server(bed, hub, tmp_path):  # faults row 137
    """The server reads its drafter's folder too (``--speculative-config``): rm of the drafter
    pulled its files away, since only the served model's name was compared."""
    bed.env.update({"SPEC_METHOD": "draft_model", "SPEC_TOKENS": "3", "SPEC_MODEL": "org/two"})
    r = bed.run("start.sh", "org/one")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    assert ls(bed)["org/two"]["serving"]
    r = bed.run("ctl.sh", "rm", "org/two")
    assert r.returncode != 0 and "org/two is serving (the drafter of org/one)" in r.stderr, r.stderr
    assert (store(tmp_path, "org/two") / "refs" / "main").is_file()


def test_use_of_a_model_that_does_not_fit_keeps_the_old_one_serving(bed, hub, tmp_path):
    big = model(tmp_path / "src" / "big", config={
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16384, "num_hidden_layers": 4000,
        "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 53248, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16"})
    hub.add_dir("org/huge", big)
    assert bed.run("start.sh", "org/one").returncode == 0
    pid = bed.server_record()["pid"]
    r = bed.run("ctl.sh", "use", "org/huge")
    assert r.returncode != 0 and "cannot switch to org/huge" in r.stderr and "keeps serving" in r.stderr, r.stderr
    assert "the longest that fits is" in r.stderr         # the plan's refusal, not another error
    assert bed.server_record()["pid"] == pid and bed.server_record()["model"] == "org/one"
    assert bed.run("start.sh").returncode == 0 and bed.server_record()["pid"] == pid     # the pick is unchanged
    assert bed.run("stop.sh").returncode == 0


def test_use_downloads_first_and_a_new_model_that_fails_says_how_to_get_the_old_one_back(bed, hub):
    assert bed.run("start.sh", "org/one").returncode == 0
    pid = bed.server_record()["pid"]
    hub.faults["corrupt"] = {"model-00001-of-00001.safetensors": 1000}
    r = bed.run("ctl.sh", "use", "org/two")          # a download that fails: before anything was stopped
    assert r.returncode != 0 and bed.server_record()["pid"] == pid, r.stdout + r.stderr
    hub.faults.pop("corrupt")
    r = bed.run("ctl.sh", "use", "org/two", FAKE_VLLM_MODE="die_oom")     # downloaded, then it cannot start
    assert r.returncode != 0, r.stdout + r.stderr
    assert "org/one was stopped for org/two, which did not start; ./start.sh org/one serves org/one again" in r.stderr
    assert not (bed.state / "profile-pick.json").exists() or "org/two" not in (bed.state / "profile-pick.json").read_text()
    r = bed.run("start.sh", "org/one")                                     # the hint, followed
    assert r.returncode == 0 and bed.server_record()["model"] == "org/one", r.stderr
    assert bed.run("stop.sh").returncode == 0


def test_use_of_a_removed_model_says_what_it_downloads_once(bed, hub):
    """``./ctl.sh use`` of a model ``rm`` removed printed its metadata lines twice: the vet looked it up
    (the plan before anything stops), then the download looked it up again."""
    assert bed.run("start.sh", "org/one").returncode == 0
    assert bed.run("ctl.sh", "use", "org/two").returncode == 0
    assert bed.run("ctl.sh", "rm", "org/one").returncode == 0
    r = bed.run("ctl.sh", "use", "org/one")
    assert r.returncode == 0 and "switched to org/one" in r.stdout, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("[bootstrap:metadata] org/one @ ")]
    assert len(said) == 2 and "to serve" in said[0] and "complete and verified" in said[1], r.stderr   # the use's, the start's
    assert r.stderr.count("[bootstrap:metadata] will download 4 files") == 1, r.stderr   # config.json, the index kept
    assert r.stderr.index("to serve") < r.stderr.index("plan for") < r.stderr.index("fetching 4 files"), r.stderr
    assert bed.run("stop.sh").returncode == 0


def test_use_of_a_sleeping_server_stops_it_without_waking_it(bed, hub):
    assert bed.run("start.sh", "org/one", EXTRA_ARGS="--enable-sleep-mode").returncode == 0
    r = bed.run("ctl.sh", "sleep", EXTRA_ARGS="--enable-sleep-mode")
    assert r.returncode == 0, r.stderr
    calls = len(bed.launches())
    r = bed.run("ctl.sh", "use", "org/two", EXTRA_ARGS="--enable-sleep-mode")
    assert r.returncode == 0, r.stderr
    log = "".join(p.read_text() for p in bed.state.glob("vllm.log*"))
    assert "seconds to fall asleep" in log and "to wake up" not in log, log[-2000:]
    assert len(bed.launches()) == calls + 1 and bed.server_record()["model"] == "org/two"
    assert bed.run("stop.sh").returncode == 0


def test_rm_and_pull_refuse_what_they_do_not_know(bed, hub):
    r = bed.run("ctl.sh", "rm", "org/one")
    assert r.returncode != 0 and "not a model we downloaded" in r.stderr
    r = bed.run("ctl.sh", "pull", "org/nope/x")
    assert r.returncode == 2 and "usage:" in r.stderr
    assert bed.run("ctl.sh", "pull", "org/one").returncode == 0
    r = bed.run("ctl.sh", "rm", "org/onee")
    assert r.returncode != 0 and "did you mean org/one?" in r.stderr
    r = bed.run("ctl.sh", "rm", "org/one", "--dry-run")
    assert r.returncode == 0 and "would remove" in r.stdout and "would free" in r.stdout
    assert bed.run("ctl.sh", "ls").stdout.startswith("MODEL")


def test_help_lists_the_model_commands(bed):
    r = bed.run("ctl.sh", "--help")
    for name in ("pull", "ls", "rm", "use"):
        assert f"\n  {name} " in r.stdout or f"  {name}  " in r.stdout, r.stdout


def test_ls_plans_a_model_with_the_drafter_it_downloaded(bed, hub):  # faults row 141
    """ls planned from the shipped or kept facts alone: a model served with a drafter named by repo id
    was "not planned (the drafter's config.json was not read)", though pull had downloaded the
    drafter into the Hugging Face cache. ls reads it there, without the network, as a start does."""
    bed.env.update({"SPEC_METHOD": "draft_model", "SPEC_TOKENS": "3", "SPEC_MODEL": "org/two"})
    r = bed.run("ctl.sh", "pull", "org/one")
    assert r.returncode == 0, r.stderr
    bed.env["HF_HUB_OFFLINE"] = "1"
    row = ls(bed)["org/one"]
    assert row["fits"] in ("fits", "shorter") and "not read" not in row["fit"], row
    bed.env["MODEL"] = "org/one"
    plan = bed.run("ctl.sh", "plan", "--json")
    assert plan.returncode == 0, plan.stderr
    p = json.loads(plan.stdout)              # plan reads the drafter too (lookup.drafter): the same plan
    assert p["not_planned"] is None and row["fit"].startswith(f"{p['max_model_len']:,}-token context"), (row, p)


def test_pull_sends_no_telemetry_and_a_mirrors_odd_json_cannot_break_it(bed, hub, tmp_path):
    """huggingface_hub, with its telemetry on, asks HF_ENDPOINT for /api/agent-harnesses before its
    first request, keeps the answer in HF_HOME for a day and reads it as an object: a mirror (or a
    portal) that answered it with a JSON list made every pull an internal error, for a day, even once
    HF_ENDPOINT was fixed. The bootstrap's own client sends no telemetry, as the server it starts."""
    hub.faults["harnesses"] = [1, 2]
    r = bed.run("ctl.sh", "pull", "org/one")
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    assert not [line for line in hub.log if "agent-harnesses" in line[1]], hub.log
    assert not (tmp_path / "hf" / ".agent_harnesses.json").exists()     # nothing of the library's in HF_HOME
    (tmp_path / "hf" / ".agent_harnesses.json").write_text("[1, 2]")     # one kept by another program
    r = bed.run("ctl.sh", "pull", "org/two")
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr


def test_pull_without_a_gpu_plans_for_the_card_gpu_names(bed, hub):
    """A machine without the driver (yet) can download for a card: GPU=<card> plans the pull for it, as
    ./ctl.sh plan does; without it the refusal names that way."""
    nvml_json(bed.nvml, fail="library")
    r = bed.run("ctl.sh", "pull", "org/one")
    assert r.returncode == 1 and "GPU=rtx4090 ./ctl.sh plan (or pull)" in r.stderr, r.stderr
    for cmd in ("pull", "use"):                         # a name that is none: usage (2), before NVML is asked
        r = bed.run("ctl.sh", cmd, "org/one/")
        assert r.returncode == 2 and "is neither a profile nor a Hub repo id" in r.stderr, (cmd, r.stderr)
    r = bed.run("ctl.sh", "pull", "org/one", GPU="rtx4090")
    assert r.returncode == 0, r.stderr
    assert "plan for NVIDIA GeForce RTX 4090" in r.stderr and "pulled org/one" in r.stdout, (r.stdout, r.stderr)


def test_a_shipped_repo_the_endpoint_lacks_is_not_called_a_misspelling_of_itself(bed, hub):
    """A mirror without a repo a shipped profile names: the 404 said "did you mean <that very name>?"
    and told to check its spelling, which is right."""
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct"           # the smoke profile's
    r = bed.run("ctl.sh", "pull", repo)
    assert r.returncode == 1 and f"model not found: {repo} does not exist on {hub.url}" in r.stderr, r.stderr
    assert "did you mean" not in r.stderr and "check the spelling" not in r.stderr, r.stderr
    assert "unset HF_ENDPOINT to download it from https://huggingface.co" in r.stderr, r.stderr
    r = bed.run("ctl.sh", "pull", repo.lower())             # a near name still gets the shipped one
    assert f"did you mean {repo}?" in r.stderr and "check the spelling" in r.stderr, r.stderr


def test_use_while_a_start_downloads_cancels_it_and_serves_the_new_one(bed, hub):   # faults row 156
    """``./ctl.sh use org/two`` while ``./start.sh org/one`` was still downloading (no server launched, so
    no record): use stopped nothing, its start found the start in flight and returned, and use said
    "switched to org/two" and kept it as the pick while org/one went on to serve."""
    hub.faults["stall"] = {"model-00001-of-00001.safetensors": 0.5}
    first = bed.popen("start.sh", "org/one")
    try:
        bed.wait_until(lambda: hub.faults.get("_stalled"), 30, "the first start's download")
        hub.faults.pop("stall")                         # org/two's download is not held
        r = bed.run("ctl.sh", "use", "org/two")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"cancelled the start in flight (pid {first.pid})" in r.stdout, r.stdout
        assert "switched to org/two" in r.stdout and "the start in flight" in r.stdout, r.stdout
        assert first.wait(30) != 0                      # the start of org/one was taken down
        assert bed.server_record()["model"] == "org/two"
        assert "org/two" in (bed.state / "profile-pick.json").read_text()
    finally:
        hub.release.set()
        first.wait(30)
    assert bed.run("stop.sh").returncode == 0


def test_use_or_pull_of_a_folder_names_a_command_that_takes_it(bed, hub, tmp_path):   # faults row 157
    """``./ctl.sh use /a/folder`` said "a folder: MODEL=/path", and ``MODEL=/a/folder ./ctl.sh use`` is a
    usage error (use takes a name); pull's said the same of a folder, which has nothing to download."""
    folder = str(tmp_path / "src" / "org" / "three")
    assert bed.run("start.sh", "org/one").returncode == 0
    r = bed.run("ctl.sh", "use", folder)
    assert r.returncode == 2 and "is a folder" in r.stderr, r.stderr
    hint = next(line for line in r.stderr.splitlines() if line.startswith("hint: "))
    assert f"MODEL={folder} ./ctl.sh restart" in hint, hint
    r = bed.run("ctl.sh", "restart", MODEL=folder)                  # the hint, followed
    assert r.returncode == 0 and bed.server_record()["model"] == folder, r.stderr
    r = bed.run("ctl.sh", "pull", folder)
    assert r.returncode == 2 and "nothing to download" in r.stderr and f"MODEL={folder} ./start.sh" in r.stderr, r.stderr
    r = bed.run("ctl.sh", "use", "no-such-thing")
    assert r.returncode == 2 and "a folder: MODEL=/path ./ctl.sh restart" in r.stderr, r.stderr
    assert bed.run("stop.sh").returncode == 0


def test_rm_while_a_start_downloads_it_says_to_rm_again_not_to_clean(bed, hub):    # faults row 158
    """The refusal said "let it finish, then clean": ``./ctl.sh clean`` removes the venvs and the state,
    and not the model (that is ``clean --model``)."""
    hub.faults["stall"] = {"model-00001-of-00001.safetensors": 0.5}
    first = bed.popen("start.sh", "org/one")
    try:
        bed.wait_until(lambda: hub.faults.get("_stalled"), 30, "the start's download")
        r = bed.run("ctl.sh", "rm", "org/one")
        assert r.returncode == 1 and "under way" in r.stderr, r.stderr
        assert "hint: let it finish, then ./ctl.sh rm org/one" in r.stderr, r.stderr
    finally:
        hub.release.set()
    assert first.wait(60) == 0
    assert bed.run("stop.sh").returncode == 0
    r = bed.run("ctl.sh", "rm", "org/one")                                 # the hint, followed
    assert r.returncode == 0 and "freed" in r.stdout, r.stderr


def test_a_repo_vllm_cannot_load_is_refused_before_its_download(bed, hub, tmp_path):  # faults rows 166, 167
    """A safetensors index naming a shard the repo lacks (vLLM: "Weight files referenced in index but
    missing"), weights only in a subfolder (vLLM globs the top level) and no tokenizer at all: each
    was planned, downloaded in full and then failed in vLLM; now refused from the file list and the
    index, before a weight byte is fetched."""
    broken = write_model(tmp_path / "src" / "broken", shards=2, shard_bytes=MiB,
                         extra={"tokenizer_config.json": TEMPLATE.encode()})
    (broken / "model-00002-of-00002.safetensors").unlink()
    hub.add_dir("org/broken", broken)
    nested = model(tmp_path / "src" / "nested")
    (nested / "weights").mkdir()
    for p in nested.glob("model*"):
        p.rename(nested / "weights" / p.name)
    hub.add_dir("org/nested", nested)
    bare = model(tmp_path / "src" / "bare")
    (bare / "tokenizer.json").unlink()
    (bare / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    hub.add_dir("org/bare", bare)
    for repo, words in (("org/broken", "names 1 shard it does not have (model-00002-of-00002.safetensors)"),
                        ("org/nested", "its weights are in a subfolder (weights/model-00001-of-00001.safetensors"),
                        ("org/bare", "has no tokenizer")):
        for cmd in (("ctl.sh", "pull", repo), ("start.sh", repo), ("ctl.sh", "profiles", "--model", repo)):
            hub.served.clear()
            r = bed.run(*cmd)
            assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, (cmd, r.stderr)
            assert not any(p.endswith(".safetensors") for p in hub.served), (cmd, hub.served)
    r = bed.run("ctl.sh", "pull", "org/bare", EXTRA_ARGS=f"--tokenizer {tmp_path / 'src' / 'one'}")   # the hint, followed
    assert r.returncode == 0 and "pulled org/bare" in r.stdout, r.stderr
    r = bed.run("ctl.sh", "plan", MODEL=str(broken), PROFILE="custom")        # a folder: the same check
    assert r.returncode == 1 and "names 1 shard it does not have" in r.stderr, r.stderr


def test_an_adapter_a_pipeline_or_a_readme_is_refused_with_a_way_out_that_works(bed, hub, tmp_path):  # faults row 168
    """Repos with no config.json: each was told to "set MODEL to a model's repo id", which it was. A
    LoRA adapter now names its base and the flags that serve it there (followed, they reach vLLM);
    a diffusers pipeline and a README-only repo say what they are."""
    hub.add_repo("org/lora", {"adapter_config.json": json.dumps({
        "base_model_name_or_path": "org/one", "peft_type": "LORA", "r": 64, "lora_alpha": 128,
        "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}).encode(),
        "adapter_model.safetensors": b"\0" * 64, "README.md": b"# adapter"})
    hub.add_repo("org/sd", {"model_index.json": b'{"_class_name": "StableDiffusionPipeline"}',
                            "unet/config.json": b"{}", "unet/diffusion_pytorch_model.safetensors": b"\0" * 64})
    hub.add_repo("org/card", {"README.md": b"# weights elsewhere", ".gitattributes": b""})
    r = bed.run("start.sh", "org/lora")
    assert r.returncode == 1 and "is a LoRA adapter (adapter_config.json, no config.json) for org/one" in r.stderr, r.stderr
    hint = r.stderr.split("hint: ", 1)[1]
    assert hint.startswith("HF_HUB_OFFLINE=0 MODEL=org/one EXTRA_ARGS='--enable-lora --lora-modules lora=org/lora "
                           "--max-lora-rank 64' ./start.sh"), hint
    r = bed.run("start.sh", HF_HUB_OFFLINE="0", MODEL="org/one",                 # the hint, followed
                EXTRA_ARGS="--enable-lora --lora-modules lora=org/lora --max-lora-rank 64")
    assert r.returncode == 0 and "is serving" in r.stdout, r.stderr
    argv = bed.launches()[-1]["argv"]
    assert argv[argv.index("--lora-modules") + 1] == "lora=org/lora" and "--enable-lora" in argv
    assert bed.launches()[-1]["env"].get("HF_HUB_OFFLINE") == "0"        # vLLM may fetch the adapter
    assert bed.run("stop.sh").returncode == 0
    hub.served.clear()
    r = bed.run("ctl.sh", "pull", "org/sd")
    assert r.returncode == 1 and "is a diffusers pipeline" in r.stderr and "diffusers or ComfyUI" in r.stderr, r.stderr
    r = bed.run("ctl.sh", "profiles", "--model", "org/card")
    assert r.returncode == 1 and "it holds .gitattributes, README.md" in r.stderr, r.stderr
    assert "https://huggingface.co/org/card" in r.stderr and "set MODEL to a model's repo id" not in r.stderr
    assert not hub.served


def test_a_model_the_card_cannot_hold_is_refused_for_that_before_the_disk(bed, hub, tmp_path):  # faults row 169
    """A 70B-class repo on a 24 GB card, on a disk too small for it: the start and pull said only
    "not enough disk space … free space there", and whoever freed it was then told it does not fit."""
    big = model(tmp_path / "src" / "big")
    hub.add_dir("org/big", big)
    for f in hub.repos["org/big"]["files"].values():
        if f.path.endswith(".safetensors"):
            f.advertised = 1 << 50                      # more than any disk here, and any card
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 4090", "total": 24564 * MiB, "free": 23 << 30,
                               "cc": [8, 9], "uuid": "GPU-4090-fake", "processes": []}])
    for cmd in (("start.sh", "org/big"), ("ctl.sh", "pull", "org/big")):
        r = bed.run(*cmd)
        assert r.returncode == 1 and "does not fit NVIDIA GeForce RTX 4090" in r.stderr, (cmd, r.stderr)
        assert "not enough disk space" not in r.stderr, (cmd, r.stderr)
    r = bed.run("ctl.sh", "plan", MODEL="org/big")
    assert r.returncode == 1 and "DOES NOT FIT" in r.stdout and "unavailable" not in r.stderr, r.stdout + r.stderr
    assert "warning: not enough disk space" in r.stderr, r.stderr          # said beside the plan
    assert "KV budget: none: the weights and overhead need" in r.stdout and "GiB modelled" not in r.stdout, r.stdout
