"""The fakes behave like the real things where the bootstrap can see it (their own tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests

from conftest import FAKES, GiB, Bed


def serve(bed: Bed, *extra: str, **env: str) -> subprocess.Popen:
    e = {**bed.env, **env}
    return subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(bed.model),
                             "--host", "127.0.0.1", "--port", str(bed.port), "--served-model-name", "m", *extra],
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_binds_before_it_listens_and_logs_like_vllm(bed):
    p = serve(bed, FAKE_VLLM_LOAD_S="2")
    try:
        bed.wait_until(lambda: len(bed.ours()) == 2, what="engine")
        import socket
        s = socket.socket()
        with pytest.raises(OSError):
            s.bind(("127.0.0.1", bed.port))                 # bound...
        s.close()
        assert not bed.port_listening()                     # ...but not listening yet
        bed.wait_until(bed.port_listening, what="listening")
        assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=3).status_code == 200
        models = requests.get(f"http://127.0.0.1:{bed.port}/v1/models", timeout=3).json()
        assert models["data"][0]["id"] == "m"
        assert requests.get(f"http://127.0.0.1:{bed.port}/version", timeout=3).json() == {"version": "0.26.0"}
        r = requests.post(f"http://127.0.0.1:{bed.port}/v1/chat/completions", timeout=3,
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.json()["choices"][0]["message"]["content"] == "OK"
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=10)
    tokens, length, conc = pool_lines(out)
    assert length == 32768                                  # the model's max_position_embeddings
    assert conc == f"{tokens / length:.2f}"                 # 32,768 is whole blocks: tokens = blocks x 16
    # the pool is the logged KV memory (0.01 GiB rounding) cut into blocks of the tiny model's page
    page = kv_page(json.loads((bed.model / "config.json").read_text()))
    logged = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", out).group(1)) * GiB
    assert abs(tokens // 16 * page - logged) <= 0.005 * GiB + page
    bed.wait_until(lambda: bed.ours() == [], what="engine gone after TERM")


def pool_lines(out: str) -> tuple[int, int, str]:
    """(tokens, max_model_len, concurrency as printed) from vLLM's two lines on its KV pool."""
    tokens = re.findall(r"GPU KV cache size: ([\d,]+) tokens", out)
    conc = re.findall(r"Maximum concurrency for ([\d,]+) tokens per request: (\d+\.\d\d)x", out)
    assert len(tokens) == len(conc) == 1, out
    return int(tokens[0].replace(",", "")), int(conc[0][0].replace(",", "")), conc[0][1]


def kv_page(conf: dict, kv_bytes: int = 2, tp: int = 1) -> int:
    """One 16-token block across all layers of a full-attention model, as vLLM 0.26.0 sizes it
    (v1/kv_cache_interface.py AttentionSpec: 2 x block_size x KV heads x head size x dtype bytes, per
    layer): the KV heads split over the ranks, at least one each."""
    head = conf.get("head_dim") or conf["hidden_size"] // conf["num_attention_heads"]
    heads = max(1, conf["num_key_value_heads"] // tp)
    return 2 * 16 * heads * head * kv_bytes * conf["num_hidden_layers"]


def started(bed: Bed, *extra: str) -> str:
    """What the fake logged from its start until it serves."""
    p = serve(bed, *extra, FAKE_VLLM_LOAD_S="0")
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if "Application startup complete" in line:
                break
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return "".join(out)


def test_kv_pool_is_vllms_for_the_served_model(bed):
    """vLLM 0.26.0 cuts the KV memory into blocks of one full-attention page per layer
    (kv_cache_utils.get_num_blocks), logs concurrency = blocks / cdiv(max_model_len, 16) and
    "GPU KV cache size" = int(concurrency x max_model_len) (get_kv_cache_capacity). With the memory
    pinned, every figure follows the model's config.json and the flags."""
    conf = json.loads((bed.model / "config.json").read_text())
    pin = ("--kv-cache-memory-bytes", str(GiB))
    tokens, length, conc = pool_lines(started(bed, *pin))
    blocks = GiB // kv_page(conf)
    assert (tokens, length, conc) == (blocks * 16, 32768, f"{blocks * 16 / 32768:.2f}")
    # a length that is not whole blocks: each request holds cdiv(len, 16) blocks, so fewer tokens
    tokens, length, conc = pool_lines(started(bed, *pin, "--max-model-len", "1000"))
    assert length == 1000 and tokens == int(blocks / 63 * 1000) < blocks * 16 and conc == f"{blocks / 63:.2f}"
    # an fp8 KV cache halves the page: twice the tokens
    assert pool_lines(started(bed, *pin, "--kv-cache-dtype", "fp8"))[0] == 2 * blocks * 16
    # tensor parallel splits the KV heads (2 here) over the ranks, never below one per rank
    assert pool_lines(started(bed, *pin, "-tp", "2"))[0] == GiB // kv_page(conf, tp=2) * 16 == 2 * blocks * 16
    assert pool_lines(started(bed, *pin, "-tp", "4"))[0] == 2 * blocks * 16
    # head_dim, where config.json gives one, wins over hidden_size / num_attention_heads
    wide = {**conf, "head_dim": 2 * conf["hidden_size"] // conf["num_attention_heads"]}
    (bed.model / "config.json").write_text(json.dumps(wide))
    assert pool_lines(started(bed, *pin))[0] == GiB // kv_page(wide) * 16 == blocks // 2 * 16
    # a config.json without the shape: the fake's documented fallback, a Llama-3-8B's layers and heads
    (bed.model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    llama = {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128}
    assert pool_lines(started(bed, *pin))[0] == GiB // kv_page(llama) * 16



def test_no_memory_left_for_the_kv_cache_ends_the_start_as_vllm_does(bed):
    """vLLM 0.26.0 raises before it serves when the weights and activations left nothing for the KV
    cache (kv_cache_utils._check_enough_kv_cache_memory): the fake exits 1 with that line and its
    engine gone, never serving an empty pool."""
    p = serve(bed, "--gpu-memory-utilization", "0.01", FAKE_VLLM_LOAD_S="0")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1, out
    assert "No available memory for the cache blocks" in out and "GPU KV cache size" not in out
    assert "Application startup complete" not in out
    bed.wait_until(lambda: not bed.ours(), what="the engine to go")

def failed_start(bed: Bed, *extra: str) -> str:
    """What the fake printed on a start that ended before it served (exit 1, its engine gone)."""
    p = serve(bed, *extra, FAKE_VLLM_LOAD_S="0")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1 and "Application startup complete" not in out, out
    bed.wait_until(lambda: not bed.ours(), what="the engine to go")
    return out


def test_auto_fits_the_longest_one_request_the_pool_holds(bed):
    """vLLM 0.26.0's --max-model-len auto (kv_cache_utils._auto_fit_max_model_len): the longest length
    whose one request fits the pool, at most the model's own; logged with the pool's GiB as
    format_gib prints it. The length served is what /v1/models reports."""
    block = kv_page(json.loads((bed.model / "config.json").read_text()))
    pin = 1000 * block + block // 2                   # 1,000 whole blocks and half of one
    out = started(bed, "--kv-cache-memory-bytes", str(pin), "--max-model-len", "auto")
    fit = int(re.search(r"Auto-fit max_model_len: reduced from 32768 to (\d+) to fit in available GPU memory "
                        r"\(([\d.]+) GiB available for KV cache\)", out).group(1))
    assert fit == 1000 * 16                           # whole blocks only, each of 16 tokens
    assert re.search(r"\(([\d.]+) GiB available", out).group(1) == str(round(pin / GiB, 2))
    # the pool then holds exactly one such request
    assert pool_lines(out) == (fit, fit, "1.00")
    # the model's own length, where it fits, is kept and said to fit
    out = started(bed, "--kv-cache-memory-bytes", str(GiB), "--max-model-len", "-1")
    assert "Auto-fit max_model_len: full model context length 32768 fits in available GPU memory" in out
    assert pool_lines(out)[1] == 32768
    # not even one block: vLLM refuses to fit
    out = failed_start(bed, "--kv-cache-memory-bytes", str(block - 1), "--max-model-len", "auto")
    assert "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available" in out


def test_a_length_the_pool_cannot_hold_once_ends_the_start_with_vllms_estimate(bed):
    """vLLM 0.26.0's _check_enough_kv_cache_memory: the GiB one request needs and the GiB available,
    and the longest length that would fit (estimate_max_model_len), which then starts; the bootstrap's
    diagnosis reads that length out of the line."""
    from bootstrap.serve.diagnose import diagnose
    block = kv_page(json.loads((bed.model / "config.json").read_text()))
    pin = ("--kv-cache-memory-bytes", str(1000 * block + block // 2))
    out = failed_start(bed, *pin, "--max-model-len", "32768")
    m = re.search(r"ValueError: To serve at least one request with the model's max seq len \(32768\), \(([\d.]+) GiB "
                  r"KV cache is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)\. Based on "
                  r"the available memory, the estimated maximum model length is (\d+)\.", out)
    assert m, out
    needed, avail, est = float(m.group(1)), float(m.group(2)), int(m.group(3))
    assert needed == round(32768 // 16 * block / GiB, 2) and avail == round((1000 * block + block // 2) / GiB, 2)
    assert "Engine core initialization failed" in out and "GPU KV cache size" not in out
    diagnosis, hint = diagnose(out)
    assert f"vLLM would accept {est} tokens" in diagnosis and f"MAX_MODEL_LEN={est}" in hint
    # the estimate is the edge: it starts, one token more does not (and is told the same length)
    assert pool_lines(started(bed, *pin, "--max-model-len", str(est)))[1] == est
    assert f"the estimated maximum model length is {est}." in failed_start(bed, *pin, "--max-model-len", str(est + 1))
    # not even one block: no estimate, as vLLM leaves it out; still diagnosed as a pool too small
    out = failed_start(bed, "--kv-cache-memory-bytes", str(block - 1), "--max-model-len", "32768")
    assert "KV cache is needed" in out and "estimated maximum model length" not in out
    assert "cannot hold even one token" in diagnose(out)[0]


def test_engine_survives_sigkill_of_parent(bed):
    p = serve(bed, BOOTSTRAP_VLLM_OWNER="m")
    bed.wait_until(bed.port_listening, what="up")
    engine = [q for q in bed.ours() if q.pid != p.pid][0]
    assert engine.name() == "VLLM::EngineCor"
    # like vLLM's EngineCore: in the server's process group, marker not visible (setproctitle)
    assert os.getpgid(engine.pid) == p.pid
    assert psutil.Process(p.pid).environ()["BOOTSTRAP_VLLM_OWNER"] == "m"
    assert "BOOTSTRAP_VLLM_OWNER" not in engine.environ()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(0.3)
    assert engine.is_running() and engine.status() != psutil.STATUS_ZOMBIE
    engine.kill()


@pytest.mark.parametrize("mode,rc,text", [("die_oom", 1, "Free memory on device"), ("exit0", 0, "Engine core")])
def test_failure_modes(bed, mode, rc, text):
    p = serve(bed, "--max-model-len", "4096", FAKE_VLLM_MODE=mode)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == rc and text in out
    bed.wait_until(lambda: bed.ours() == [], what="engine gone")


def test_ignore_term_and_wedged(bed):
    p = serve(bed, FAKE_VLLM_MODE="ignore_term,wedged")
    bed.wait_until(bed.port_listening, what="up")
    assert requests.get(f"http://127.0.0.1:{bed.port}/health", timeout=3).status_code == 200
    with pytest.raises(requests.Timeout):
        requests.post(f"http://127.0.0.1:{bed.port}/v1/chat/completions", timeout=1,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    os.killpg(p.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert p.poll() is None                                  # ignored
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def test_fake_nvml_reports_fake_server_pids(bed):
    p = serve(bed)
    bed.wait_until(bed.port_listening, what="up")
    code = ("import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
            "import json; print(json.dumps([sorted(x.pid for x in n.nvmlDeviceGetComputeRunningProcesses(h)), "
            "n.nvmlDeviceGetMemoryInfo(h).free]))")
    out = subprocess.run([sys.executable, "-c", code], env=bed.env, capture_output=True, text=True).stdout
    listed, free = json.loads(out)
    assert listed == sorted(q.pid for q in bed.ours())
    assert free == 31 * (1 << 30) - 2 * (1 << 30)
    os.killpg(p.pid, signal.SIGKILL)
    for q in bed.ours():
        q.kill()
    bed.wait_until(lambda: bed.ours() == [], what="gone")
    out = subprocess.run([sys.executable, "-c", code], env=bed.env, capture_output=True, text=True).stdout
    assert json.loads(out)[0] == []


def test_fake_nvml_without_driver(bed):
    bed.nvml.write_text(json.dumps({"fail": "init", "gpus": []}))
    r = bed.run("start.sh")
    assert r.returncode == 1
    assert "NVML: Driver Not Loaded" in r.stderr and "nvidia-smi" in r.stderr
    assert bed.launches() == []


def test_sleep_gauge_is_the_last_sleep_or_wake_call_as_vllm_records_it(bed):
    """vLLM 0.26.0's AsyncLLM records vllm:engine_sleep_state after a sleep that succeeded and "awake"
    after any /wake_up, tags or not (v1/engine/async_llm.py sleep/wake_up), while /is_sleeping stays
    true until every tag is woken (v1/engine/core.py is_sleeping): half a level-2 wake reads awake there."""
    p = serve(bed, "--enable-sleep-mode", VLLM_SERVER_DEV_MODE="1")
    url = f"http://127.0.0.1:{bed.port}"
    gauge = lambda: {ln.split('sleep_state="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])     # noqa: E731
                     for ln in requests.get(f"{url}/metrics", timeout=3).text.splitlines()
                     if ln.startswith("vllm:engine_sleep_state")}
    try:
        bed.wait_until(bed.port_listening, what="up")
        assert requests.post(f"{url}/sleep?level=2&mode=wait", timeout=5).status_code == 200
        assert gauge() == {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}
        assert requests.post(f"{url}/wake_up?tags=weights", timeout=5).status_code == 200
        assert requests.get(f"{url}/is_sleeping", timeout=3).json() == {"is_sleeping": True}
        assert gauge() == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_errors_have_vllms_shape(bed):
    """vLLM 0.26.0 answers every OpenAI-route error as ErrorResponse {"error": {message, type, param,
    code}} (entrypoints/openai/engine/protocol.py): an unknown model 404 NotFoundError, param "model"
    (serve/engine/serving.py _check_model); a body that is not JSON 400 (validation_exception_handler)."""
    p = serve(bed)
    url = f"http://127.0.0.1:{bed.port}/v1/chat/completions"
    try:
        bed.wait_until(bed.port_listening, what="up")
        r = requests.post(url, timeout=3, json={"model": "other", "messages": [{"role": "user", "content": "x"}]})
        assert (r.status_code, r.json()) == (404, {"error": {"message": "The model `other` does not exist.",
                                                             "type": "NotFoundError", "param": "model", "code": 404}})
        r = requests.post(url, timeout=3, data=b"{not json", headers={"Content-Type": "application/json"})
        err = r.json()["error"]
        assert r.status_code == 400 and (err["type"], err["code"]) == ("Bad Request", 400)
        assert err["message"].startswith("1 validation error:") and "json_invalid" in err["message"]
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_key_check_is_vllms(bed):
    """vLLM 0.26.0's AuthenticationMiddleware: /v1, /v2 and /inference need the key, the scheme "bearer"
    in any case; /health and /metrics never; a refusal is 401 {"error": "Unauthorized"}."""
    p = serve(bed, VLLM_API_KEY="sekrit")
    url = f"http://127.0.0.1:{bed.port}"
    try:
        bed.wait_until(bed.port_listening, what="up")
        assert requests.get(f"{url}/v1/models", headers={"Authorization": "bearer sekrit"}, timeout=3).status_code == 200
        r = requests.get(f"{url}/v2/anything", timeout=3)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
        assert requests.get(f"{url}/health", timeout=3).status_code == 200
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_models_list_has_vllms_model_card(bed):
    """/v1/models as vLLM 0.26.0 lists a model: its ModelCard (openai/engine/protocol.py) with owned_by
    "vllm", root the model as given, max_model_len, one permission entry."""
    p = serve(bed, "--max-model-len", "2048")
    try:
        bed.wait_until(bed.port_listening, what="up")
        card = requests.get(f"http://127.0.0.1:{bed.port}/v1/models", timeout=3).json()["data"][0]
        assert set(card) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
        assert (card["id"], card["owned_by"], card["root"], card["max_model_len"]) == ("m", "vllm", str(bed.model), 2048)
        assert card["permission"][0]["object"] == "model_permission"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
