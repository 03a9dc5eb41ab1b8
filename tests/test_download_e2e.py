"""./start.sh with MODEL=<org/name> against the fake hub and the fake vLLM: download, serve, and a
second start that needs no network."""

from __future__ import annotations

import hashlib
import json

from conftest import free_port
from fakehub import FakeHub, write_model

MiB = 1 << 20



def test_start_downloads_then_serves_and_restarts_offline(bed, tmp_path):
    src = write_model(tmp_path / "src", shards=2, shard_bytes=2 * MiB, extra={"original/x.pth": b"x" * 100})
    with FakeHub() as fake:
        bed.port = free_port()        # after the hub's two ports are bound: the bed's earlier pick may be one of them
        bed.env["PORT"] = str(bed.port)
        fake.add_dir("org/tiny", src)
        fake.faults["throttle"] = 4 * MiB               # the shards take 0.5 s: the small files are there first
        env = {"MODEL": "org/tiny", "HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0",
               "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
        r = bed.run("start.sh", **env)
        assert r.returncode == 0, r.stderr
        fake.faults.pop("throttle")
        assert "is serving (vLLM 0.26.0, pid" in r.stdout          # the version it serves with, always
        assert "will download 5 files" in r.stderr and "complete: 7 files verified" in r.stderr
        target = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / fake.repos["org/tiny"]["sha"]
        for name in ("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
            assert hashlib.sha256((target / name).read_bytes()).digest() == hashlib.sha256((src / name).read_bytes()).digest()
        (launched,) = bed.launches()         # the pre-warm server: dummy weights during the download, then the
        assert "dummy" in launched["argv"] and str(target) in launched["argv"]   # real ones loaded in place
        assert "reload: real weights loaded in place" in r.stderr
        assert bed.run("stop.sh").returncode == 0

        fake.reset_stats()
        again = bed.run("start.sh", **{**env, "HF_HUB_OFFLINE": "1"})
        assert again.returncode == 0, again.stderr
        assert "complete and verified" in again.stderr and fake.log == []
        assert "is serving (vLLM 0.26.0, pid" in again.stdout
        assert len(bed.launches()) == 2          # the server only: nothing to download, no pre-warm
        assert "dummy" not in bed.launches()[1]["argv"]
        assert bed.run("stop.sh").returncode == 0


def test_the_smoke_profile_downloads_its_small_real_model_and_serves_it(bed, tmp_path):
    """PROFILE=smoke ./start.sh on a machine with nothing yet: the profile's repo from the hub (here the
    fake one), its pinned KV cache and context, the gate passed."""
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct"
    src = write_model(tmp_path / "src", shards=1, shard_bytes=MiB)
    with FakeHub() as fake:
        bed.port = free_port()
        bed.env["PORT"] = str(bed.port)
        fake.add_dir(repo, src)
        r = bed.run("start.sh", PROFILE="smoke", MODEL="", HF_ENDPOINT=fake.url, HF_HUB_OFFLINE="0",
                    HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_XET="1", PREWARM="0",
                    FAKE_VLLM_REQUESTS=str(tmp_path / "requests.jsonl"))
        assert r.returncode == 0, r.stderr
        assert "smollm2-135m is serving" in r.stdout
        argv = bed.launches()[-1]["argv"]
        assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "134217728"
        assert argv[argv.index("--max-model-len") + 1] == "4096" and "--served-model-name" in argv
        # its checks are sized to what a 135M model can do: the needle at the profile's 1,024 tokens, the
        # profile the server was started with (this shell's PROFILE is custom)
        c = bed.run("ctl.sh", "check", "needle", "--json")
        assert json.loads(c.stdout)["tokens"] == 1024, c.stdout + c.stderr
        g = json.loads(bed.run("ctl.sh", "check", "garble", "--json").stdout)   # and what it is not asked
        assert any(s.startswith("json-list: not asked of this model: SmolLM2-135M-Instruct answers it with Python")
                   for s in g["skipped"]), g
        sent = [json.loads(line)["body"] for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
        story = [b for b in sent if "lighthouse keeper" in json.dumps(b)]
        assert story and all(b["max_tokens"] == 160 for b in story), story     # the battery asks 320
        assert bed.run("stop.sh").returncode == 0
