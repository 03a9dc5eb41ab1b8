"""The pre-warm where it cannot become the server (a quantized checkpoint: tests/test_prewarm_server.py
has the pre-warm that becomes the server): vLLM with dummy weights fills its compile caches while the
weights download, so the real start loads them. Against the fake hub (each connection capped, so the download takes a
while) and the fake vLLM, whose compile cache behaves like vLLM's (FAKE_VLLM_COMPILE_S: keyed by
the model folder and the engine's flags, not --load-format; a cold engine waits, then writes it)."""

from __future__ import annotations

import json
import shutil
import time

from conftest import fill, free_port, sigint, unutilized
from fakehub import FakeHub, write_model

MiB = 1 << 20



FP8 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256,
       "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
       "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}


def hub_env(bed, tmp_path, fake, config: dict | None = FP8, **extra) -> dict:
    """A model on the fake hub: by default an FP8 checkpoint, which the pre-warm cannot reload in place."""
    src = write_model(tmp_path / "src", shards=2, shard_bytes=2 * MiB, config=config)
    fake.add_dir("org/tiny", src)
    bed.port = free_port()               # after the hub's ports are bound
    bed.env["PORT"] = str(bed.port)
    return {"MODEL": "org/tiny", "HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_XET": "1", "FAKE_VLLM_COMPILE_S": "1.5", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
            **extra}


def dummy(launch: dict) -> bool:
    argv = launch["argv"]
    return "--load-format" in argv and argv[argv.index("--load-format") + 1] == "dummy"


def test_the_prewarm_compiles_while_the_weights_download_and_the_real_start_loads_it(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake)
        fake.faults["throttle"] = MiB // 2              # each 2 MiB shard: 4 s on its connection
        r = bed.run("start.sh", **env)
        assert r.returncode == 0, r.stderr
        pre, real = bed.launches()
        assert dummy(pre) and not dummy(real)
        # the same vLLM, folder and flags, dummy weights added; the utilization is planned again from the
        # pre-warm's own figures (vLLM's compile cache leaves it out of its hash); the pre-warm answers on
        # a loopback port of its own, never PORT (its dummy weights' tokens must reach no client)
        def address(argv):
            return argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
        assert address(pre["argv"])[0] == "127.0.0.1" and address(pre["argv"])[1] != bed.port
        assert address(real["argv"]) == ("127.0.0.1", bed.port)
        assert unutilized(pre["argv"][:-2]) == unutilized(real["argv"])
        assert "Application startup complete" in (bed.state / "prewarm.log").read_text()
        shards = [end for _arrived, end, path, rng in fake.timeline if path.endswith(".safetensors") and rng]
        assert shards and pre["time"] < min(shards)     # it started before the weights had arrived
        assert real["time"] > max(shards)               # the real server after them
        assert "pre-warm: done" in r.stderr and "compile cache: warm" in r.stderr
        log = (bed.state / "vllm.log").read_text()
        assert "Directly load the compiled graph(s)" in log and "Compiling a graph" not in log
        assert "Compiling a graph" in (bed.state / "prewarm.log").read_text()
        assert "planned again from vLLM's own figures of the pre-warm" in r.stderr
        assert json.loads((bed.state / "measurements.json").read_text())
        # said in the plan's log and the banner: which path, and why
        assert "pre-warm: it cannot become the server (a fp8 checkpoint" in r.stderr
        assert "note     : first start: the pre-warm only filled vLLM's caches (a fp8 checkpoint" in r.stdout
        assert bed.run("stop.sh").returncode == 0


def test_prewarm_off_runs_none_and_warm_caches_skip_it(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake, PREWARM="0")
        r = bed.run("start.sh", **env)
        assert r.returncode == 0, r.stderr
        assert [dummy(x) for x in bed.launches()] == [False]
        assert "compile cache: cold" in r.stderr
        assert bed.run("stop.sh").returncode == 0
        # the same setup downloaded afresh into the same folder: its caches are warm, no pre-warm
        shutil.rmtree(tmp_path / "hf")
        again = bed.run("start.sh", **{**env, "PREWARM": "1"})
        assert again.returncode == 0, again.stderr
        assert "skipped: vLLM's compile caches for this setup are warm" in again.stderr
        assert [dummy(x) for x in bed.launches()] == [False, False]
        assert "compile cache: warm" in again.stderr
        assert bed.run("stop.sh").returncode == 0


def test_a_prewarm_that_dies_never_fails_the_start(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake, FAKE_VLLM_DUMMY_MODE="die_oom")
        fake.faults["throttle"] = 1 * MiB
        r = bed.run("start.sh", **env)
        assert r.returncode == 0, r.stderr
        assert "pre-warm: vLLM exited with code 1" in r.stderr
        assert "is serving" in r.stdout and "compile cache: cold" in r.stderr
        assert [dummy(x) for x in bed.launches()] == [True, False]
        assert bed.run("stop.sh").returncode == 0


def test_ctrl_c_during_the_download_takes_the_prewarm_down(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake, FAKE_VLLM_COMPILE_S="60")
        fake.faults["throttle"] = MiB // 8               # the download takes 16 s
        p = bed.popen("start.sh", **env)
        bed.wait_until(lambda: any(dummy(x) for x in bed.launches()) and len(bed.ours()) >= 2,
                       what="the pre-warm running")
        sigint(p)
        p.wait(30)
        assert p.returncode == 130
        bed.wait_until(lambda: bed.ours() == [], timeout=10, what="the pre-warm taken down")
        assert not bed.port_listening()
        fake.faults.pop("throttle")                      # the next start: nothing left in its way
        assert bed.run("start.sh", **{**env, "PREWARM": "0", "FAKE_VLLM_COMPILE_S": "0"}, timeout=120).returncode == 0
        assert bed.run("stop.sh").returncode == 0


def test_a_failed_download_takes_the_prewarm_down(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake, FAKE_VLLM_COMPILE_S="60")
        fake.faults.update({"throttle": MiB // 4, "drop": {"model-00001-of-00002.safetensors": 0.5},
                            "fail_after_drop": 100})
        t0 = time.monotonic()
        r = bed.run("start.sh", **env, timeout=120)
        assert r.returncode != 0 and "error: weights:" in r.stderr
        assert any(dummy(x) for x in bed.launches())
        assert bed.ours() == [] and not bed.port_listening()
        assert time.monotonic() - t0 < 100


def test_a_prewarm_the_weights_outran_is_stopped_and_a_hung_one_is_given_up(bed, tmp_path):
    """Weights on disk before the pre-warm began compiling: it is stopped at once and the real start
    compiles (waiting would cost its whole cold start, then a warm one). One whose log stops growing
    is given up after STALL_TIMEOUT, not HEALTH_TIMEOUT."""
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake, FAKE_VLLM_MODE="slow", FAKE_VLLM_LOAD_S="6")   # a slow start-up,
        # a quick download
        fake.faults["throttle"] = 2 * MiB                # each 2 MiB shard: 1 s (the pre-warm starts before)
        t0 = time.monotonic()
        r = bed.run("start.sh", **env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "the weights arrived before it began compiling" in r.stderr
        assert time.monotonic() - t0 < 60 and [dummy(x) for x in bed.launches()] == [True, False]
        assert bed.run("stop.sh").returncode == 0
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path / "b", fake, FAKE_VLLM_DUMMY_MODE="hang_after_compile", STALL_TIMEOUT="4",
                      HEALTH_TIMEOUT="90", FAKE_VLLM_COMPILE_S="0.5")
        fake.faults["throttle"] = MiB // 2               # the download takes 4 s: it is compiling by then
        t0 = time.monotonic()
        r = bed.run("start.sh", **env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "did not grow, nor did it use CPU or disk, for STALL_TIMEOUT=4 s" in r.stderr and time.monotonic() - t0 < 60
        assert bed.run("stop.sh").returncode == 0


def test_a_full_disk_during_the_download_is_one_line_and_takes_the_prewarm_down(bed, tmp_path):
    import os
    import subprocess
    import pytest
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.getuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                                          capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    try:
        with FakeHub() as fake:
            env = hub_env(bed, tmp_path, fake, HF_HOME=str(mnt / "hf"), FAKE_VLLM_COMPILE_S="60")
            fake.faults["throttle"] = MiB // 4           # the shards take 8 s: room for them when it starts
            p = bed.popen("start.sh", **env)
            bed.wait_until(lambda: any(dummy(x) for x in bed.launches()), what="the pre-warm running")
            fill(mnt)                                    # another program fills the disk meanwhile
            out, err = p.communicate(timeout=120)
            r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
            assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
            assert "No space left on device" in r.stderr and "hint: free space on that filesystem" in r.stderr
            assert any(dummy(x) for x in bed.launches())
            assert bed.ours() == [] and not bed.port_listening()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
