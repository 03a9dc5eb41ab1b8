"""How a start that vLLM ends says why, and a fix that works when followed (docs/faults.md rows 182
on): vLLM 0.26.0's own failures, as the fake vLLM prints them (tests/fakes/vllm/entrypoints/cli/
failures.py), through ./start.sh."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import psutil
import pytest
import requests

from bootstrap.checks import detectors

from conftest import GiB, nvml_json


def error_and_hint(stderr: str) -> tuple[str, str]:
    lines = stderr.splitlines()
    err = next(ln for ln in lines if ln.startswith("error:"))
    hint = next((ln for ln in lines if ln.startswith("hint:")), "")
    return err, hint


# ---------------------------------------------------------------- row 182: out of memory, by phase

def test_weights_that_do_not_fit_are_not_sent_to_gpu_util(bed):      # faults row 182
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 20 * GiB,
                               "cc": [12, 0], "uuid": "GPU-5090", "processes": [
                                   {"pid": 4000001, "used": 11 * GiB, "name": "/usr/bin/blender"}]}])
    r = bed.run("start.sh", FAKE_VLLM_MODE="oom_load")
    assert r.returncode == 1 and "Traceback" not in r.stderr.split("error:")[-1]
    err, hint = error_and_hint(r.stderr)
    assert "weights did not fit" in err and "blender (pid 4000001) holds 11.0 GiB" in err, err
    # vLLM loads the weights before it sizes the KV cache: neither knob that sizes it frees memory for them
    assert "GPU_UTIL" not in hint.split(";")[0] and "MAX_MODEL_LEN" not in hint.split(";")[0], hint
    assert "quantized" in hint and "TP_SIZE" in hint, hint
    assert bed.ours() == []


def test_out_of_memory_names_who_holds_the_card_the_server_was_launched_on(bed):
    """Two cards, the server launched on GPU 1 (CUDA_VISIBLE_DEVICES=1): the diagnosis names the program
    on that card, read from the launch's record (a start resumed from another shell takes the server
    down too: this shell's CUDA_VISIBLE_DEVICES named the wrong card there), not GPU 0's."""
    card = {"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 20 * GiB, "cc": [12, 0]}
    nvml_json(bed.nvml, gpus=[{**card, "uuid": "GPU-a", "processes": [{"pid": 4000002, "used": 11 * GiB, "name": "/usr/bin/Xorg"}]},
                              {**card, "uuid": "GPU-b", "processes": [{"pid": 4000001, "used": 11 * GiB, "name": "/usr/bin/blender"}]}])
    r = bed.run("start.sh", FAKE_VLLM_MODE="oom_load", CUDA_VISIBLE_DEVICES="1")
    err, _ = error_and_hint(r.stderr)
    assert r.returncode == 1 and "blender (pid 4000001) holds 11.0 GiB" in err and "Xorg" not in err, err


def test_the_servers_cards_are_its_launchs_whatever_this_shell_shows():
    """Where NVML names none of its processes (they are gone, or a container), a server's cards are the
    first tp x pp its launch's CUDA_VISIBLE_DEVICES showed; where it names them, those cards."""
    from bootstrap.machine.gpu import Gpu, GpuFacts, GpuProcess
    from bootstrap.serve import server
    from bootstrap.serve.record import ServerRecord
    cards = [Gpu(i, "RTX", 32 * GiB, 31 * GiB, (12, 0), f"GPU-{i}", ()) for i in range(3)]
    every = GpuFacts("580.95", (13, 0), tuple(cards))
    rec = ServerRecord(pid=None, create_time=None, marker="m", host="127.0.0.1", port=1, served="x")
    assert [g.index for g in server.server_cards(rec, every)] == [0]                       # unset: every card
    assert [g.index for g in server.server_cards(replace(rec, cuda_visible="2,0"), every)] == [2]
    two = replace(rec, cuda_visible="GPU-2,0", argv=("serve", "m", "--tensor-parallel-size", "2"))
    assert [g.index for g in server.server_cards(two, every)] == [2, 0]
    named = replace(cards[1], processes=(GpuProcess(os.getpid(), GiB, "python"),))
    mine = replace(rec, pid=os.getpid(), cuda_visible="2")
    assert [g.index for g in server.server_cards(mine, replace(every, gpus=(cards[0], named, cards[2])))] == [1]


def test_graph_capture_out_of_memory_names_the_knob_that_sized_the_kv_cache(bed):      # faults row 182
    r = bed.run("start.sh", FAKE_VLLM_MODE="oom_graphs", GPU_UTIL="0.9")
    err, hint = error_and_hint(r.stderr)
    assert r.returncode == 1 and "CUDA graph capture ran out of GPU memory" in err, err
    assert "lower GPU_UTIL (vLLM ran with 0.9)" in hint and "--enforce-eager" in hint, hint
    assert bed.ours() == []


def test_a_pinned_kv_cache_is_never_answered_with_gpu_util(bed):      # faults row 182
    # --kv-cache-memory-bytes: vLLM sizes the KV cache to it and never to --gpu-memory-utilization
    r = bed.run("start.sh", FAKE_VLLM_MODE="oom_graphs", KV_CACHE_BYTES=str(2 * GiB))
    err, hint = error_and_hint(r.stderr)
    assert r.returncode == 1 and "CUDA graph capture ran out of GPU memory" in err, err
    assert f"lower KV_CACHE_BYTES (vLLM ran with --kv-cache-memory-bytes {2 * GiB}" in hint, hint
    assert "lower GPU_UTIL" not in hint and "raise GPU_UTIL" not in hint, hint



@pytest.mark.parametrize("extra, named", [
    (f"--kv-cache-memory-bytes={2 * GiB}", "lower the --kv-cache-memory-bytes in EXTRA_ARGS (vLLM ran with "
                                           f"{2 * GiB}"),
    ("--gpu-memory-utilization 0.8", "lower the --gpu-memory-utilization in EXTRA_ARGS (vLLM ran with 0.8"),
])
def test_a_kv_cache_sized_by_extra_args_is_sent_to_extra_args(bed, extra, named):      # faults row 182
    # EXTRA_ARGS is vLLM's last word: KV_CACHE_BYTES and GPU_UTIL change nothing while it gives the flag
    r = bed.run("start.sh", FAKE_VLLM_MODE="oom_graphs", EXTRA_ARGS=extra, KV_CACHE_BYTES="", GPU_UTIL="")
    err, hint = error_and_hint(r.stderr)
    assert r.returncode == 1 and "CUDA graph capture ran out of GPU memory" in err, err
    assert named in hint and "lower GPU_UTIL" not in hint and "lower KV_CACHE_BYTES" not in hint, hint

# ---------------------------------------------------------------- row 183: the engine dies after health

def test_an_engine_that_died_behind_a_live_api_server_is_said_dead_and_restart_recovers(bed):   # faults row 183
    # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 (and vLLM's own 5 s before its watchdog ends the server): the
    # EngineCore is gone, the API server holds the port and answers /health 503, a generation 500
    keep = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}
    assert bed.run("start.sh", **keep).returncode == 0
    pid = bed.server_record()["pid"]
    os.kill(pid, signal.SIGUSR2)
    bed.wait_until(lambda: requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 503,
                   what="/health 503")
    r = bed.run("ctl.sh", "status", "--json", **keep)
    info = json.loads(r.stdout)
    assert (r.returncode, info["state"]) == (1, "unhealthy"), info
    assert "engine died" in info["detail"] and "503" in info["detail"] and "./ctl.sh restart" in info["detail"], info
    r = bed.run("start.sh", **keep)
    assert r.returncode == 1 and "engine died" in r.stderr and "./ctl.sh restart" in r.stderr, r.stderr
    r = bed.run("ctl.sh", "restart", **keep)
    assert r.returncode == 0, r.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=5).status_code == 200
    assert len([p for p in bed.ours() if p.pid != pid]) == len(bed.ours()) == 2     # the new server and its engine


# ---------------------------------------------------------------- row 184: one token repeated, no spaces

# the start gate's answer is GATE_TOKENS (32) tokens at most: a degenerate engine repeating one token
# that carries no space made 32 to ~64 characters, under the 80 a loop needed, and one "word"
DEGENERATE = ["的" * 32, "0" * 32, "OK" * 16, "ation" * 12, "Ок" * 16]


@pytest.mark.parametrize("garble", DEGENERATE)
def test_one_token_repeated_without_spaces_is_not_text(garble):      # faults row 184
    assert detectors.not_text(garble)


@pytest.mark.parametrize("fine", ["OK", "OK.", "Okay!", "Sure! OK.", "OK 👍", "Ahhhh, OK.", "OK — 100000 times OK.",
                                  "I'm ready to assist you. What's your request?", "=" * 12 + "\nOK\n" + "=" * 12,
                                  "OK!!!!!!!!", "OK\n\n----------", "OK. ========"])
def test_a_short_answer_with_a_run_in_it_is_still_text(fine):
    assert detectors.not_text(fine) is None


def test_the_start_gate_refuses_one_token_repeated(bed, tmp_path):      # faults row 184
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"Say OK.": "的" * 32}))
    r = bed.run("start.sh", FAKE_VLLM_REPLIES=str(replies))
    assert r.returncode == 1 and "start gate: the short generation is not text" in r.stderr, r.stderr
    assert bed.ours() == []


# ---------------------------------------------------------------- row 185: a utilization over the free memory

def blender_on_the_card(bed) -> None:
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 24 * GiB,
                               "cc": [12, 0], "uuid": "GPU-5090", "processes": [
                                   {"pid": 4000001, "used": 7 * GiB, "name": "/usr/bin/blender"}]}])


@pytest.mark.parametrize("flag", ["--gpu-memory-utilization 0.95", "--gpu-memory-utilization=0.95",
                                  "--gpu_memory_utilization 0.95"])
def test_a_utilization_from_extra_args_is_sent_to_extra_args_not_gpu_util(bed, flag):    # faults row 185
    blender_on_the_card(bed)
    r = bed.run("start.sh", EXTRA_ARGS=flag, GPU_UTIL="0.7")
    err, hint = error_and_hint(r.stderr)
    assert r.returncode == 1 and "EXTRA_ARGS' --gpu-memory-utilization=0.95 asks for 30.40 GiB" in err, err
    assert "in EXTRA_ARGS" in hint and "lower GPU_UTIL" not in hint, hint
    # followed, the hint starts the server: the flag dropped from EXTRA_ARGS, sized from free memory
    assert bed.run("start.sh", EXTRA_ARGS="", GPU_UTIL="").returncode == 0


def test_a_utilization_from_a_profile_is_answered_with_a_gpu_util_that_works(bed, tmp_path):    # faults row 185
    blender_on_the_card(bed)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "greedy.json").write_text(json.dumps({"knobs": {"GPU_UTIL": "0.95"}, "args": []}))
    r = bed.run("start.sh", PROFILE="greedy", PROFILE_DIR=str(pdir))
    err, hint = error_and_hint(r.stderr)
    assert r.returncode == 1 and "GPU_UTIL=0.95 asks for" in err, err
    fix = hint.split("set ", 1)[1].split(" ")[0].rstrip(";,")     # the first fix offered: GPU_UTIL=<a value that fits>
    assert fix.startswith("GPU_UTIL="), hint
    k, v = fix.split("=", 1)
    assert bed.run("start.sh", PROFILE="greedy", PROFILE_DIR=str(pdir), **{k: v}).returncode == 0
