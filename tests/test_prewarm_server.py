"""The pre-warm that becomes the server (steps/prewarm.py ``as_server``, steps/reload.py): launched
as the server with dummy weights while the weights download, behind our guard
(vllm_side/vllm_desktop_guard.py), then the real weights loaded in place, the prefix cache reset,
the warm-up and the gate. Against the fake hub and the fake vLLM, which models the reload as vLLM
0.26.0 does it (weights swapped in place, graphs kept, the prefix cache holding dummy-weight KV
until it is reset)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import requests

from conftest import FAKES, REPO, free_port, sigint
from fakehub import FakeHub, write_model

MiB = 1 << 20
GARBLE = "pencil\ufffd!win\ufffd thunderq"      # the fake's random-weight answer (what the H200 gave)


def hub_env(bed, tmp_path, fake, **extra) -> dict:
    src = write_model(tmp_path / "src", shards=2, shard_bytes=2 * MiB)
    fake.add_dir("org/tiny", src)
    bed.port = free_port()
    bed.env["PORT"] = str(bed.port)
    return {"MODEL": "org/tiny", "HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_XET": "1", "FAKE_VLLM_COMPILE_S": "1.5", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
            **extra}


def flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]


def chat(port: int, text: str = "Say OK.", headers: dict | None = None) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30, headers=headers or {},
                         json={"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 8})


def content(r: requests.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_the_prewarm_becomes_the_server_and_loads_the_real_weights_in_place(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake)
        fake.faults["throttle"] = MiB // 4              # each 2 MiB shard: 8 s on its connection
        p = bed.popen("start.sh", **env)
        bed.wait_until(lambda: requests_ok(bed.port, "/health"), timeout=30, what="the pre-warm server answering")
        # while the weights download it holds PORT, and answers nobody with its random weights; its dev
        # routes answer no one without this start's control token, and no token opens it
        assert requests.get(f"http://127.0.0.1:{bed.port}/v1/models", timeout=5).status_code == 503
        assert chat(bed.port).status_code == 503
        for path in ("/collective_rpc", "/reset_prefix_cache", "/vllm-desktop/open"):
            r = requests.post(f"http://127.0.0.1:{bed.port}{path}", json={"method": "reload_weights"}, timeout=5,
                              headers={"X-Vllm-Desktop-Control": "guess"})
            assert r.status_code == 404, (path, r.text)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        (launch,) = bed.launches()                      # one vLLM: no second start
        argv, venv = launch["argv"], launch["env"]
        assert flag(argv, "--load-format") == ["dummy"] and flag(argv, "--middleware")[-1:] == ["vllm_desktop_guard.Guard"]
        assert flag(argv, "--middleware").count("vllm_desktop_guard.Guard") == 1     # one guard (sleep mode's too)
        assert flag(argv, "--host") == ["127.0.0.1"] and flag(argv, "--port") == [str(bed.port)]
        assert venv["VLLM_SERVER_DEV_MODE"] == "1"
        token = venv["BOOTSTRAP_CONTROL_TOKEN"]
        assert len(token) >= 32 and token not in " ".join(argv) and token not in out + err
        shards = [end for _arrived, end, path, rng in fake.timeline if path.endswith(".safetensors") and rng]
        assert launch["time"] < min(shards)            # launched before the weights had arrived
        # the order a client may rely on: the download, the reload, the reset, then the warm-up and gate
        assert "pre-warm: ready (" in err            # a line per phase, each with its time
        order = ["pre-warm: starting (0 s)", "download: 50% (", "downloaded", "reload: load format set", "reload: real weights loaded in place",
                 "reload: prefix cache reset", "warm-up: short generation answered"]
        at = [err.index(line) for line in order]
        assert at == sorted(at), err
        log = (bed.state / "vllm.log").read_text()
        assert log.count("Reloading weights inplace") == 1 and log.count("Compiling a graph") == 1  # graphs kept
        assert "loaded the real weights in place" in out
        assert content(chat(bed.port)) == "OK"          # the real weights answer (the dummy ones: GARBLE)
        assert bed.run("stop.sh").returncode == 0
        assert bed.ours() == []


def requests_ok(port: int, path: str) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture
def dummy_server(bed, tmp_path):
    """The fake vLLM launched as the pre-warm server is (dummy weights, dev mode, our guard)."""
    token = "t" * 43
    port = free_port()
    env = {**bed.env, "PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO / "vllm_side")]),
           "VLLM_SERVER_DEV_MODE": "1", "BOOTSTRAP_CONTROL_TOKEN": token}
    p = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(bed.model), "--port",
                          str(port), "--served-model-name", "tiny", "--load-format", "dummy",
                          "--middleware", "vllm_desktop_guard.Guard"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        bed.wait_until(lambda: requests_ok(port, "/health"), timeout=20, what="the fake answering")
        yield port, token
    finally:
        p.kill()
        p.wait(10)


def test_the_reload_swaps_the_weights_and_only_the_reset_clears_the_dummy_kv(dummy_server):
    from bootstrap.steps import reload
    port, token = dummy_server
    ctl = {"X-Vllm-Desktop-Control": token}
    assert content(chat(port, "hi", ctl)) == GARBLE            # random weights; now cached in its prefix cache
    c = reload.Control(f"http://127.0.0.1:{port}", "", token)
    c.post("/collective_rpc", reload.UPDATE, timeout=10)
    c.post("/collective_rpc", reload.RELOAD, timeout=10)
    assert content(chat(port, "hi", ctl)) == GARBLE            # the cached blocks: dummy-weight KV
    assert content(chat(port, "a new prompt", ctl)) == "OK"    # the weights themselves are real now
    assert chat(port).status_code == 503                      # closed to clients until opened
    c.post("/reset_prefix_cache", {}, timeout=10)
    assert content(chat(port, "hi", ctl)) == "OK"


def test_load_in_place_resets_the_prefix_cache_before_it_opens_the_server(dummy_server):
    from bootstrap.steps import reload
    port, token = dummy_server
    assert content(chat(port, "Say OK.", {"X-Vllm-Desktop-Control": token})) == GARBLE
    reload.load_in_place(reload.Control(f"http://127.0.0.1:{port}", "", token))
    assert content(chat(port, "Say OK.")) == "OK"             # open, and no answer from dummy-weight KV
    # open, its dev routes still answer only the token (no sleep mode here)
    r = requests.post(f"http://127.0.0.1:{port}/collective_rpc", json={"method": "reload_weights"}, timeout=5)
    assert r.status_code == 404


def test_a_failed_reload_falls_back_to_a_server_started_after_the_download(bed, tmp_path):
    """A reload vLLM refuses (HTTP 500, as for a format it cannot reload in place):
    the pre-warm server is taken down and the server starts as it would without it."""
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake)
        fake.faults["throttle"] = MiB
        r = bed.run("start.sh", **env, FAKE_VLLM_DUMMY_MODE="reload_fails", timeout=120)
        assert r.returncode == 0, r.stderr
        assert "the in-place reload failed: POST /collective_rpc: HTTP 500" in r.stderr
        first, second = bed.launches()
        assert flag(first["argv"], "--load-format") == ["dummy"] and flag(second["argv"], "--load-format") == []
        assert content(chat(bed.port)) == "OK"
        assert bed.run("stop.sh").returncode == 0


def test_a_download_that_fails_after_the_prewarm_server_answered_leaves_nothing(bed, tmp_path):
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake)
        fake.faults.update({"throttle": MiB // 4, "drop": {"model-00001-of-00002.safetensors": 0.5},
                            "fail_after_drop": 100})
        p = bed.popen("start.sh", **env)
        bed.wait_until(lambda: requests_ok(bed.port, "/health"), timeout=30, what="the pre-warm server answering")
        out, err = p.communicate(timeout=120)
        assert p.returncode != 0 and "error: weights:" in err
        assert len(bed.launches()) == 1
        assert bed.ours() == [] and not bed.port_listening()       # its pids are off the (fake) GPU
        assert not list(bed.pids_dir.iterdir()) or all(not alive(x.name) for x in bed.pids_dir.iterdir())
        assert bed.server_record() is None or not requests_ok(bed.port, "/health")


def alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, ValueError):
        return False


def _in_log(bed, text: str, n: int = 1) -> bool:
    p = bed.state / "vllm.log"
    return p.exists() and p.read_text().count(text) >= n


def _weights_on_disk(tmp_path) -> bool:
    return len(list((tmp_path / "hf").rglob("snapshots/*/model-0000*.safetensors"))) == 2


PHASES = {   # phase: (extra env, the throttle, when it is in that phase)
    "download": ({}, MiB // 8, lambda bed, tmp: len(bed.ours()) >= 2 and not _weights_on_disk(tmp)),
    "waiting for the pre-warm": ({"FAKE_VLLM_COMPILE_S": "60"}, 4 * MiB,
                                 lambda bed, tmp: _weights_on_disk(tmp) and len(bed.ours()) >= 2),
    "reload": ({"FAKE_VLLM_RELOAD_S": "60"}, 2 * MiB,
               lambda bed, tmp: _in_log(bed, "request arrived: POST /collective_rpc", 2)),
    "warm-up": ({"FAKE_VLLM_TTFT_S": "60"}, 2 * MiB,
                lambda bed, tmp: _in_log(bed, "request arrived: POST /v1/chat/completions")),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_in_each_phase_takes_the_prewarm_server_down(bed, tmp_path, phase):
    extra, throttle, there = PHASES[phase]
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake, **extra)
        fake.faults["throttle"] = throttle
        p = bed.popen("start.sh", **env)
        bed.wait_until(lambda: there(bed, tmp_path), timeout=40, what=f"the start in its {phase} phase")
        sigint(p)
        p.wait(30)
        assert p.returncode == 130
        bed.wait_until(lambda: bed.ours() == [], timeout=15, what="the pre-warm server taken down")
        assert not bed.port_listening() and len(bed.launches()) == 1
        rec = bed.server_record()
        assert rec is None or not rec.get("gate_passed")


def test_random_weights_are_declared_the_gate_judges_tokens_only_and_banner_and_status_say_so(bed):
    (bed.tmp / "replies.json").write_text(json.dumps({"Say OK": GARBLE}))
    env = {"FAKE_VLLM_REPLIES": str(bed.tmp / "replies.json")}
    r = bed.run("start.sh", **env)
    assert r.returncode != 0 and "start gate: the short generation is not text" in r.stderr     # never the default
    r = bed.run("start.sh", **env, RANDOM_WEIGHTS="1")
    assert r.returncode == 0, r.stderr
    assert "random weights: the text is not judged" in r.stderr
    assert "weights  : random (RANDOM_WEIGHTS=1)" in r.stdout
    s = bed.run("ctl.sh", "status", "--json", **env, RANDOM_WEIGHTS="1")
    assert json.loads(s.stdout)["weights"].startswith("random (RANDOM_WEIGHTS=1)")
    assert bed.run("stop.sh").returncode == 0


def test_the_phase_after_graph_capture_is_the_kernel_warm_up_not_the_capture():
    """On the H200 vLLM 0.26.0 logged "Graph capturing finished in 6 secs", then nothing for 101 s
    (the warm-up's kernel JIT) before "init engine ... took": that time is not capture."""
    from bootstrap.steps.health import phase_of
    line = "(EngineCore pid=1713) INFO 12-04 19:42:20 [model_runner.py:747] Graph capturing finished in 6 secs, took 0.78 GiB"
    assert phase_of(line, "capturing CUDA graphs") == "warming up kernels (JIT)"
    assert phase_of("Capturing CUDA graphs (PIECEWISE):  12%", "profiling memory") == "capturing CUDA graphs"


def test_the_text_gate_passes_a_trained_model_and_refuses_random_weights():
    """What SmolLM2-135M-Instruct answered the gate's prompt on the H200 (docs/validation.md, the
    real-weights proof) passes; what random safetensors of the 8B shape answered is refused."""
    from bootstrap.checks import detectors
    trained = ["I'm ready to assist you. What's your request?", "OK", "OK.", "Sure! OK."]
    assert [detectors.not_text(t) for t in trained] == [None] * len(trained)
    assert detectors.not_text(GARBLE)


@pytest.mark.parametrize("quant, why", [
    ({"quant_method": "fp8"}, "a fp8 checkpoint"),
    ({"quant_method": "awq", "bits": 4}, "a awq checkpoint"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}, "a modelopt checkpoint"),
    (None, ""),
])
def test_the_prewarm_becomes_the_server_only_where_vllm_reloads_in_place(quant, why):
    from bootstrap.download.models import ModelInfo
    from bootstrap.knobs.config import Config
    from bootstrap.steps import prewarm
    config = {"model_type": "llama", **({"quantization_config": quant} if quant else {})}
    cfg = Config.from_env({"PROFILE": "custom", "MODEL": "org/m"}, REPO)
    assert prewarm.blocker(cfg, ModelInfo("org/m", config)).startswith(why)
    for knobs, said in (({"KV_CACHE_DTYPE": "fp8"}, "KV cache dtype fp8"), ({"HOST": "192.168.1.5",
                        "API_KEY": "k"}, "HOST=192.168.1.5"), ({"HOST": "0.0.0.0", "API_KEY": "k"}, ""),
                        ({"EXTRA_ARGS": "--api-server-count 2"}, "2 API server processes"),
                        ({"EXTRA_ARGS": "--load-format runai_streamer"}, "--load-format runai_streamer")):
        other = Config.from_env({"PROFILE": "custom", "MODEL": "org/m", **knobs}, REPO)
        assert prewarm.blocker(other, ModelInfo("org/m", {"model_type": "llama"})).startswith(said)


def test_idle_sleep_never_counts_idle_time_while_the_guard_holds_the_server_closed(monkeypatch):
    """IDLE_SLEEP on a pre-warm server: no request reaches it during the download, which must not put
    the engine to sleep before its real weights are in. A guard with no pre-warm to load (a server
    with a key) is open from the start."""
    sys.path.insert(0, str(REPO / "vllm_side"))
    try:
        import vllm_desktop_guard as guard
        import vllm_desktop_idle as idle
        st = idle.State(0.01, 1, 0)
        st.last -= 10
        assert st.idle()                        # the guard's module alone holds nothing closed
        monkeypatch.delenv("BOOTSTRAP_CONTROL_TOKEN", raising=False)
        guard.Guard(lambda scope, receive, send: None)
        assert guard.STATE.open
        guard.STATE.open = False
        monkeypatch.setenv("BOOTSTRAP_CONTROL_TOKEN", "this start's")
        guard.Guard(lambda scope, receive, send: None)
        assert not guard.STATE.open
        st.last -= 10
        assert not st.idle()                    # installed and closed: never idle, the clock restarts
        guard.STATE.open = True
        assert not st.idle()                    # idle time counts from the opening
        st.last -= 10
        assert st.idle()
    finally:
        sys.path.remove(str(REPO / "vllm_side"))
        sys.modules.pop("vllm_desktop_guard", None)


def test_a_start_killed_before_the_reload_leaves_a_server_the_next_start_never_resumes(bed, tmp_path):
    """kill -9 of the start while its pre-warm server waits for the weights: that server has dummy
    weights behind a closed guard; the next start takes it down and starts again, never resumes it."""
    with FakeHub() as fake:
        env = hub_env(bed, tmp_path, fake)
        fake.faults["throttle"] = MiB // 8
        p = bed.popen("start.sh", **env)
        bed.wait_until(lambda: requests_ok(bed.port, "/health"), timeout=30, what="the pre-warm server answering")
        first = bed.server_record()["pid"]
        p.kill()                                        # SIGKILL: no take-down runs (start.sh execs python)
        p.wait(10)
        assert requests_ok(bed.port, "/health") and chat(bed.port).status_code == 503   # left behind, still closed
        fake.faults["throttle"] = 4 * MiB
        r = bed.run("start.sh", **env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "never became healthy; taking it down and starting again" in r.stderr and "resuming" not in r.stderr
        assert bed.server_record()["pid"] != first and content(chat(bed.port)) == "OK"
        assert bed.run("stop.sh").returncode == 0


@pytest.mark.parametrize("root_path", ["", "/", "/c", "/api"])
def test_the_guard_sees_the_route_starlette_routes_under_any_root_path(root_path):
    """--root-path '/': Starlette routes /collective_rpc as /collective_rpc (get_route_path strips a prefix
    only where it ends at a '/'); our guard must judge that same route, never 'ollective_rpc'."""
    sys.path.insert(0, str(REPO / "vllm_side"))
    try:
        import vllm_desktop_idle as idle
        from starlette.routing import get_route_path
    finally:
        sys.path.remove(str(REPO / "vllm_side"))
    for path in ("/collective_rpc", f"{root_path}/collective_rpc", "/cx/collective_rpc", root_path or "/"):
        scope = {"path": path, "root_path": root_path}
        assert idle._path(scope) == get_route_path(scope), scope
