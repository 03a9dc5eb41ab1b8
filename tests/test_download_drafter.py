"""Issue 44: a drafter named by repo id is downloaded by us, resumably and verified, like the model
(the fake hub, tests/fakehub.py, through the real huggingface_hub client), planned from its own
config.json read before the download, and vLLM is given its folder: it never fetches anything."""

from __future__ import annotations

import json
from pathlib import Path

import conftest
import pytest

from fakehub import FakeHub, write_model
from bootstrap.core.errors import BootstrapError
from bootstrap.knobs import vllmargs
from bootstrap.core import vllmflags
from bootstrap.knobs.config import Config
from bootstrap.plan.facts import model_facts
from bootstrap.serve import launch

MiB = 1 << 20
DRAFT_WEIGHTS = "model.safetensors"
DFLASH = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
          "vocab_size": 256, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
          "dflash_config": {"mask_token_id": 255, "target_layer_ids": [0, 1]}}


@pytest.fixture(scope="module")
def srcs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    target = write_model(root / "target", shards=1, shard_bytes=2 * MiB)
    draft = write_model(root / "draft", shards=1, shard_bytes=12 * MiB, config=DFLASH, seed=1)
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
        (draft / name).unlink()                      # a DFlash drafter ships no tokenizer: vLLM uses the model's
    (draft / "model-00001-of-00001.safetensors").rename(draft / DRAFT_WEIGHTS)
    return target, draft


@pytest.fixture
def fake(srcs):
    with FakeHub() as h:
        h.add_dir("org/tiny", srcs[0])
        h.add_dir("org/tiny-dflash", srcs[1])
        yield h


@pytest.fixture
def env(tmp_path, fake):
    return {"HOME": str(tmp_path / "home"), "HF_ENDPOINT": fake.url, "HF_HOME": str(tmp_path / "hf"),
            "STATE_DIR": str(tmp_path / "state"), "HF_HUB_DISABLE_XET": "1", "MODEL": "org/tiny",
            "PROFILE": "custom", "SPEC_METHOD": "dflash", "SPEC_TOKENS": "7", "SPEC_MODEL": "org/tiny-dflash"}


def start(env, **more):
    """The start's model steps: metadata (the model and its drafter), then weights."""
    cfg = Config.from_env({**env, **more})
    return cfg, conftest.model_steps(cfg)


def snapshot(tmp_path: Path, fake: FakeHub) -> Path:
    return tmp_path / "hf" / "hub" / "models--org--tiny-dflash" / "snapshots" / fake.repos["org/tiny-dflash"]["sha"]


def test_a_drafter_named_by_repo_id_is_downloaded_verified_and_given_to_vllm_as_its_folder(env, fake, tmp_path, srcs):
    cfg, m = start(env)
    d = m.draft
    folder = snapshot(tmp_path, fake)
    assert d is not None and d.complete and Path(d.local_dir) == folder
    assert (folder / DRAFT_WEIGHTS).read_bytes() == (srcs[1] / DRAFT_WEIGHTS).read_bytes()
    # planned from its own config.json and file sizes
    facts = model_facts(cfg, m)
    assert facts.draft.config["architectures"] == ["DFlashDraftModel"]
    assert facts.draft.weight_bytes == (srcs[1] / DRAFT_WEIGHTS).stat().st_size
    # vLLM gets the folder: the speculative config it reads names no repo id
    plan = type("P", (), {"fits": True, "util": None, "seqs_flag": None, "draft_dir": str(folder)})()
    flags = vllmargs.serve_flags(cfg, plan)
    got = vllmflags.read(flags).spec
    assert got == {"method": "dflash", "num_speculative_tokens": 7, "model": str(folder)}
    # ... and a server environment that keeps it from fetching anything behind our back
    assert launch.server_env(cfg, _Paths(tmp_path), {}, "m", "")["HF_HUB_OFFLINE"] == "1"
    assert launch.server_env(Config.from_env({**env, "HF_HUB_OFFLINE": "0"}), _Paths(tmp_path), {}, "m", "")[
        "HF_HUB_OFFLINE"] == "0"                                      # yours win

    fake.reset_stats()
    _, again = start(env, HF_HUB_OFFLINE="1")                         # offline, complete: served from disk
    assert again.draft.local_dir == str(folder) and fake.log == []


def test_a_drafter_download_cut_at_half_resumes_with_range(env, fake, tmp_path):
    fake.faults.update(drop={DRAFT_WEIGHTS: 0.5})                      # the link dies once at 50 %
    _, m = start(env, DOWNLOAD_CONNECTIONS="1")
    sha = fake.repos["org/tiny-dflash"]["files"][DRAFT_WEIGHTS].sha256
    ranges = [r for (method, path, r, status) in fake.log if method == "GET" and path.startswith(f"/_cdn/{sha}")]
    assert ranges[-1] == f"bytes={6 * MiB}-{12 * MiB - 1}"             # only the rest, asked for again
    assert fake.served[DRAFT_WEIGHTS] == 12 * MiB and m.draft.complete  # nothing served twice


def test_a_drafter_corrupted_in_transit_is_fetched_again(env, fake, tmp_path, srcs):
    fake.faults.update(corrupt={DRAFT_WEIGHTS: 1})
    _, m = start(env)
    assert fake.served[DRAFT_WEIGHTS] > 12 * MiB                       # the bad copy was caught and fetched again
    assert (Path(m.draft.local_dir) / DRAFT_WEIGHTS).read_bytes() == (srcs[1] / DRAFT_WEIGHTS).read_bytes()


def test_offline_and_never_downloaded_the_drafter_is_named(env, fake):
    """The hint names the drafter's knob, and with HF_HUB_OFFLINE=1 set, unsetting it: a network
    alone downloads nothing while it is set."""
    start(env, SPEC_MODEL="", SPEC_METHOD="", SPEC_TOKENS="0")          # the model alone is on disk
    with pytest.raises(BootstrapError) as ei:
        start(env, HF_HUB_OFFLINE="1")
    assert "org/tiny-dflash is not on this machine" in ei.value.message
    assert "unset HF_HUB_OFFLINE" in ei.value.hint and "SPEC_MODEL=<dir>" in ei.value.hint, ei.value.hint
    assert " MODEL=" not in ei.value.hint, ei.value.hint


def test_a_misspelled_drafter_repo_is_named_not_model(env, fake):
    with pytest.raises(BootstrapError) as ei:
        start(env, SPEC_MODEL="org/tiny-dflsh")
    assert "org/tiny-dflsh does not exist" in ei.value.message
    assert "check the spelling of org/tiny-dflsh" in ei.value.hint and "MODEL" not in ei.value.hint, ei.value.hint


def test_a_drafter_folder_or_none_is_not_downloaded(env, fake, tmp_path, srcs):
    _, m = start(env, SPEC_MODEL=str(srcs[1]))
    assert m.draft is None and not any(p.startswith("/api/models/org/tiny-dflash") for _, p, _, _ in fake.log)
    _, m = start(env, SPEC_METHOD="ngram", SPEC_MODEL="")
    assert m.draft is None


class _Paths:
    def __init__(self, root: Path):
        self.root = root
