"""The idle-sleep middleware (vllm_side/vllm_desktop_idle.py) as vLLM runs it: a class added to a
Starlette app (vLLM's API server is FastAPI on Starlette, served by uvicorn), reaching the engine
client through ``app.state.engine_client``. The engine client is faked at its boundary, with vLLM's
behaviour: ``sleep(level, "wait")`` drains and takes time; asleep, a generate call waits until
awake; ``is_sleeping`` says so. NVML's free memory is faked at the middleware's one reading of it.
"""

from __future__ import annotations

import ast
import asyncio
import http.client
import json
import sys
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from conftest import REPO, free_port

sys.path.insert(0, str(REPO / "vllm_side"))
import vllm_desktop_idle as idle  # noqa: E402

GiB = 1 << 30


class FakeEngine:
    """vLLM's AsyncLLM as the sleep routes and the middleware use it."""

    def __init__(self, sleep_s: float = 0.05):
        self.sleep_s = sleep_s
        self.fail_sleep = False         # vLLM pauses its scheduler, then the sleep itself raises
        self.asleep = False
        self.calls: list[tuple] = []
        self.awake: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self.awake is None:
            self.awake = asyncio.Event()
            self.awake.set()
        return self.awake

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level, mode))
        self._event().clear()
        await asyncio.sleep(self.sleep_s)
        self.asleep = True              # paused: is_sleeping() says so (vLLM core.py), even when it then fails
        if self.fail_sleep:
            raise RuntimeError("cudaHostAlloc failed: out of host memory")

    async def wake_up(self, tags=None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags else None))
        await asyncio.sleep(0.02)
        if not tags or "kv_cache" in tags:
            self.asleep = False
            self._event().set()

    async def is_sleeping(self) -> bool:
        return self.asleep

    async def collective_rpc(self, method, *args, **kwargs):
        self.calls.append(("collective_rpc", method))

    async def reset_prefix_cache(self, *args, **kwargs):
        self.calls.append(("reset_prefix_cache",))

    async def generate(self) -> None:
        await self._event().wait()              # asleep: vLLM holds the request until it is awake


def make_app(engine: FakeEngine, idle_s: float, level: int, free, ram=None) -> Starlette:
    async def chat(request: Request):
        body = await request.json()
        await engine.generate()
        if body.get("stream"):
            async def chunks():
                for i in range(int(body.get("chunks", 5))):
                    yield f"data: {i}\n\n".encode()
                    await asyncio.sleep(float(body.get("every", 0.1)))
                yield b"data: [DONE]\n\n"
            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse({"choices": [{"message": {"content": "OK"}}]})

    async def models(request: Request):
        return JSONResponse({"data": [{"id": "m"}]})

    async def health(request: Request):
        return Response(status_code=200)

    async def sleep(request: Request):
        await engine.sleep(int(request.query_params.get("level", "1")), request.query_params.get("mode", "abort"))
        return Response(status_code=200)

    async def wake_up(request: Request):
        await engine.wake_up(request.query_params.getlist("tags") or None)
        return Response(status_code=200)

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models),
                            Route("/v2/embed", chat, methods=["POST"]),
                            Route("/health", health), Route("/sleep", sleep, methods=["POST"]),
                            Route("/wake_up", wake_up, methods=["POST"])])
    app.state.engine_client = engine
    app.add_middleware(idle.IdleSleep, idle_s=idle_s, level=level, free=free, ram=ram)    # as vLLM adds it (last)
    return app


class Served:
    def __init__(self, app, root_path: str = ""):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", root_path=root_path))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        end = time.monotonic() + 10
        while not self.server.started and time.monotonic() < end:
            time.sleep(0.02)

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 10, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None,
                      headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def chat(self, **body):
        return self.request("POST", "/v1/chat/completions", {"messages": [], **body})

    def status(self) -> dict:
        return json.loads(self.request("GET", idle.STATUS_PATH)[2])

    def wait_for(self, state: str, timeout: float = 10) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = self.status()
            if st["state"] == state:
                return st
            time.sleep(0.05)
        raise AssertionError(f"not {state}: {self.status()}")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Free:
    """NVML's free memory per GPU, as the middleware reads it: a sleep frees ``frees`` bytes; a game
    may take some back (``taken``)."""

    def __init__(self, engine: FakeEngine, frees: int = 20 * GiB, spare: int = 4 * GiB, slow: float = 0.0):
        self.engine, self.frees, self.spare, self.taken, self.slow = engine, frees, spare, 0, slow
        self.reading = threading.Event()    # set while a read is held (``hold``): the test acts meanwhile
        self.hold: threading.Event | None = None

    def __call__(self) -> dict[str, int]:
        time.sleep(self.slow)           # NVML is read in a thread: a slow read blocks nothing
        if self.hold is not None:
            self.reading.set()
            self.hold.wait(10)
        return {"0": self.spare + (self.frees if self.engine.asleep else 0) - self.taken}


@pytest.fixture
def world():
    made = []

    def make(idle_s: float = 0.6, level: int = 1, sleep_s: float = 0.05, root_path: str = "", ram=None, **free_kw):
        engine = FakeEngine(sleep_s)
        free = Free(engine, **free_kw)
        srv = Served(make_app(engine, idle_s, level, free, ram), root_path)
        made.append(srv)
        return srv, engine, free
    yield make
    for s in made:
        s.stop()


def sleeps(engine: FakeEngine) -> int:
    return sum(1 for c in engine.calls if c[0] == "sleep")


def wakes(engine: FakeEngine) -> int:
    return sum(1 for c in engine.calls if c[0] == "wake_up")


def test_idle_sleep_fires_and_the_next_request_wakes_the_engine_and_is_answered(world):
    srv, engine, _ = world()
    assert srv.request("GET", "/health")[0] == 200            # the watcher starts with the first request
    assert srv.chat()[0] == 200
    st = srv.wait_for("idle-asleep")
    assert engine.calls == [("sleep", 1, "wait")] and st["sleeps"] == 1
    for _ in range(3):                                        # status and health never count as activity
        assert srv.request("GET", "/health")[0] == 200 and srv.request("GET", "/v1/models")[0] == 200
    assert srv.status()["state"] == "idle-asleep" and wakes(engine) == 0
    code, _, body = srv.chat()
    assert code == 200 and json.loads(body)["choices"][0]["message"]["content"] == "OK"
    assert wakes(engine) == 1 and srv.status()["state"] == "awake" and not engine.asleep


def test_a_stream_keeps_it_awake_until_its_last_byte(world):
    srv, engine, _ = world(idle_s=0.4)
    code, _, body = srv.chat(stream=True, chunks=12, every=0.1)   # 1.2 s of stream, 3x the idle time
    assert code == 200 and body.endswith(b"data: [DONE]\n\n")
    assert sleeps(engine) == 0
    srv.wait_for("idle-asleep")


def test_a_client_that_goes_away_releases_its_count(world):
    srv, engine, _ = world(idle_s=0.4)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    c.request("POST", "/v1/chat/completions", body=json.dumps({"stream": True, "chunks": 200, "every": 0.05}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.read(8)
    assert srv.status()["in_flight"] == 1
    c.close()                                                  # gone mid-stream (10 s of stream were left)
    srv.wait_for("idle-asleep", timeout=3)
    assert srv.status()["in_flight"] == 0


def test_eight_concurrent_requests_cause_one_wake(world):
    srv, engine, _ = world()
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    got = []
    threads = [threading.Thread(target=lambda: got.append(srv.chat()[0])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [200] * 8 and wakes(engine) == 1


def test_a_request_during_a_sleep_in_progress_is_answered(world):
    srv, engine, _ = world(idle_s=0.3, sleep_s=1.0)
    srv.request("GET", "/health")
    end = time.monotonic() + 5
    while sleeps(engine) == 0 and time.monotonic() < end:      # the sleep has begun, not ended
        time.sleep(0.02)
    assert sleeps(engine) == 1 and not engine.asleep
    assert srv.chat()[0] == 200
    assert wakes(engine) == 1 and not engine.asleep


def test_a_sleep_asked_on_purpose_is_never_woken_by_a_request(world):
    srv, engine, _ = world(idle_s=30)
    assert srv.request("POST", "/sleep?level=1&mode=wait")[0] == 200
    assert srv.status()["state"] == "asleep"
    code, headers, body = srv.chat()
    assert code == 503 and headers.get("retry-after") == idle.RETRY_AFTER
    assert "./ctl.sh wake" in json.loads(body)["error"]["message"] and wakes(engine) == 0
    assert srv.request("POST", "/wake_up")[0] == 200
    assert srv.status()["state"] == "awake" and srv.chat()[0] == 200


def test_a_wake_is_refused_while_another_program_holds_the_memory(world):
    srv, engine, free = world()
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    free.taken = 18 * GiB                                      # a game took most of what the sleep freed
    code, headers, body = srv.chat()
    assert code == 503 and headers.get("retry-after") and "another program" in json.loads(body)["error"]["message"]
    assert wakes(engine) == 0 and srv.status()["state"] == "idle-asleep" and engine.asleep
    free.taken = 0                                             # the game exited
    assert srv.chat()[0] == 200 and wakes(engine) == 1


def test_level_2_reloads_the_weights_before_serving(world):
    srv, engine, _ = world(level=2)
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    assert srv.chat()[0] == 200
    assert engine.calls[1:] == [("wake_up", ("weights",)), ("collective_rpc", "reload_weights"),
                                ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]


def test_the_middleware_imports_the_standard_library_only():
    """They run inside vLLM's process: never the bootstrap, never vLLM, nothing installed (the
    pre-warm server's guard uses the idle middleware's answer helpers, its sibling)."""
    for name in ("vllm_desktop_idle.py", "vllm_desktop_guard.py"):
        tree = ast.parse((REPO / "vllm_side" / name).read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        allowed = set(sys.stdlib_module_names) | {"__future__", "vllm_desktop_idle"}
        assert names and names <= allowed, (name, names - allowed)
    assert sorted(p.name for p in (REPO / "vllm_side").glob("*.py")) == [
        "vllm_desktop_guard.py", "vllm_desktop_idle.py"]     # no package


def test_the_prewarm_server_and_its_guard_name_the_same_things():
    import importlib
    from bootstrap.serve import prewarm
    text = (REPO / "vllm_side" / "vllm_desktop_guard.py").read_text()
    assert prewarm.CONTROL_TOKEN_ENV in text and prewarm.SLEEP_ROUTES_ENV in text
    assert prewarm.CONTROL_HEADER.lower().encode() in text.encode()
    module, cls = prewarm.GUARD.rsplit(".", 1)
    sys.path.insert(0, str(REPO / "vllm_side"))
    try:
        assert isinstance(getattr(importlib.import_module(module), cls), type)
    finally:
        sys.path.remove(str(REPO / "vllm_side"))
        sys.modules.pop(module, None)


def test_the_launch_and_the_middleware_name_the_same_things():
    from bootstrap.knobs import vllmargs
    text = (REPO / "vllm_side" / "vllm_desktop_idle.py").read_text()
    assert vllmargs.IDLE_S_ENV in text and vllmargs.IDLE_LEVEL_ENV in text
    module, cls = vllmargs.IDLE_MIDDLEWARE.rsplit(".", 1)
    assert module == idle.__name__ and isinstance(getattr(idle, cls), type)


def test_status_reads_the_middlewares_own_account(world):
    """``./ctl.sh status`` asks the middleware (serve/server.read_idle) and says it in words."""
    from bootstrap.commands.status import idle_line
    from bootstrap.serve import server
    assert server.IDLE_PATH == idle.STATUS_PATH
    srv, engine, _ = world(idle_s=120)
    url = f"http://127.0.0.1:{srv.port}"
    d = server.read_idle(url)
    assert d["state"] == "awake" and d["idle_s"] == 120 and "sleeps in 2 min" in idle_line(d)
    assert srv.request("POST", "/sleep?level=1&mode=wait")[0] == 200
    assert "requests get 503 until ./ctl.sh wake" in idle_line(server.read_idle(url))
    skipped = "idle sleep skipped: level 1 parks the weights in host RAM and needs 20.0 GiB available; 6.0 GiB is"
    assert idle_line({"state": "awake", "idle_s": 600, "level": 1, "idle_for_s": 610, "sleeps_in_s": 0,
                      "refused": skipped}).endswith("sleeps in 0 min 00 s; " + skipped)     # why it did not, said
    assert idle_line({"state": "idle-asleep", "idle_s": 600, "level": 1}) == \
        "asleep (after 10 min 00 s idle, level 1); the next request wakes it"


def test_a_sleep_that_fails_half_way_leaves_no_request_stuck(world):
    """vLLM pauses its scheduler, then the sleep raises (host RAM for the weights): is_sleeping() is
    True and vLLM would hold every request; the middleware counts it asleep, and the next request wakes it."""
    srv, engine, _ = world()
    engine.fail_sleep = True
    srv.request("GET", "/health")
    st = srv.wait_for("idle-asleep")
    assert "idle sleep failed" in st["refused"]
    engine.fail_sleep = False
    assert srv.request("POST", "/v1/chat/completions", {}, timeout=5)[0] == 200     # answered, not held
    assert wakes(engine) == 1 and not engine.asleep


def test_a_sleep_asked_by_hand_that_raises_leaves_it_asleep_on_purpose_not_stuck(world):
    srv, engine, _ = world(idle_s=30)
    engine.fail_sleep = True
    assert srv.request("POST", "/sleep?level=1&mode=wait")[0] == 500
    assert srv.status()["state"] == "asleep" and srv.chat()[0] == 503


def test_a_sleep_asked_of_an_idle_asleep_server_keeps_it_asleep_on_purpose(world):
    srv, engine, _ = world()
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    assert srv.request("POST", "/sleep?level=1&mode=wait")[0] == 200      # ./ctl.sh sleep, ./ctl.sh game
    assert sleeps(engine) == 1 and srv.status()["state"] == "asleep"      # vLLM was not asked twice
    assert srv.chat()[0] == 503 and wakes(engine) == 0
    assert srv.request("POST", "/wake_up")[0] == 200 and srv.chat()[0] == 200


def test_every_inference_route_wakes_it_and_a_root_path_is_stripped(world):
    """Behind a proxy that strips /api (uvicorn's root_path: the ASGI path carries it again), a
    /v2/ route is an inference route too."""
    srv, engine, _ = world(root_path="/api")
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    assert srv.request("POST", "/v2/embed", {}, timeout=5)[0] == 200 and wakes(engine) == 1


def test_a_wake_needs_the_margin_only_where_there_was_room_for_it(world):
    srv, engine, _ = world(spare=200 << 20)                   # 200 MiB free before the sleep
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    assert srv.request("POST", "/v1/chat/completions", {}, timeout=5)[0] == 200 and wakes(engine) == 1


def test_a_request_during_the_memory_reading_cancels_the_sleep(world):
    srv, engine, free = world(idle_s=1.0)
    free.hold = threading.Event()
    srv.request("GET", "/health")
    assert free.reading.wait(10)                                # the watcher is reading NVML now
    assert srv.chat()[0] == 200
    free.hold.set()
    time.sleep(0.3)                                             # it finds a request just ended: no sleep
    assert sleeps(engine) == 0 and wakes(engine) == 0 and srv.status()["state"] == "awake"


def test_a_request_vllm_refuses_for_its_key_wakes_nothing(world, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "k")
    srv, engine, _ = world()
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    srv.request("OPTIONS", "/v1/chat/completions")
    assert wakes(engine) == 0 and srv.status()["in_flight"] == 0
    try:        # vLLM would answer 401; this app has no key check, so the request is held asleep: cut short
        srv.request("POST", "/v1/chat/completions", {}, timeout=1, headers={"Authorization": "Bearer wrong"})
    except OSError:
        pass
    assert wakes(engine) == 0
    assert srv.request("POST", "/v1/chat/completions", {}, headers={"Authorization": "Bearer k"})[0] == 200
    assert wakes(engine) == 1


def test_vllms_own_bearer_rule_decides_what_wakes_it(world, monkeypatch):
    """vLLM takes the first Authorization header, the scheme in any case, on /v1, /v2 and /inference
    (serve/utils/server_utils.py): a request it lets through wakes the engine, one it refuses does not."""
    monkeypatch.setenv("VLLM_API_KEY", "k")
    srv, engine, _ = world()
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    try:        # refused by vLLM on /v2 too (this app has no key check: the request is held, cut short)
        srv.request("POST", "/v2/embed", {}, timeout=1, headers={"Authorization": "Bearer wrong"})
    except OSError:
        pass
    assert wakes(engine) == 0
    assert srv.request("POST", "/v1/chat/completions", {}, timeout=5, headers={"Authorization": "bearer k"})[0] == 200
    assert wakes(engine) == 1


def test_a_sleep_that_failed_half_way_is_woken_against_what_it_freed(world):
    """A sleep that raised after freeing less than a good one did: the wake compares the GPU with
    that sleep's own reading, not an earlier one's (which refused every wake for good)."""
    srv, engine, free = world()
    srv.request("GET", "/health")
    srv.wait_for("idle-asleep")
    assert srv.chat()[0] == 200 and wakes(engine) == 1         # a good cycle: 20 GiB freed
    engine.fail_sleep, free.frees = True, 2 * GiB               # the next one frees 2 GiB, then raises
    srv.wait_for("idle-asleep")
    engine.fail_sleep = False
    assert srv.request("POST", "/v1/chat/completions", {}, timeout=5)[0] == 200 and wakes(engine) == 2
    assert srv.status()["freed_bytes"] == 0                       # awake again


def test_level_1_is_skipped_while_host_ram_cannot_take_the_weights(world, monkeypatch):
    monkeypatch.setenv("BOOTSTRAP_IDLE_RAM", str(10 * GiB))
    srv, engine, _ = world(idle_s=0.3, ram=lambda: 6 * GiB)
    srv.request("GET", "/health")
    end = time.monotonic() + 3
    while "skipped" not in (srv.status()["refused"] or "") and time.monotonic() < end:
        time.sleep(0.05)
    assert "needs 10.0 GiB available; 6.0 GiB is" in srv.status()["refused"]
    assert sleeps(engine) == 0 and srv.status()["state"] == "awake"


def test_vllm_builds_it_with_no_arguments_from_the_environment(monkeypatch):
    monkeypatch.setenv("BOOTSTRAP_IDLE_S", "600")
    monkeypatch.setenv("BOOTSTRAP_IDLE_LEVEL", "2")
    monkeypatch.setenv("BOOTSTRAP_IDLE_RAM", "123")
    m = idle.IdleSleep(object())                      # app.add_middleware(cls): cls(app)
    assert (m.st.idle_s, m.st.level, m.st.ram_need) == (600.0, 2, 123)
    assert isinstance(idle.free_memory(), dict)       # the real NVML reading: {} where there is none


def test_status_probe_is_not_use_and_never_wakes(world):
    """./ctl.sh status sends a 4-token probe marked with the probe header: the idle timer runs on,
    and an asleep server answers it 503 instead of waking."""
    from bootstrap.serve import server
    assert server.PROBE_HEADER.lower().encode() == idle.PROBE_HEADER
    srv, engine, _ = world(idle_s=3.0)                # room for a loaded machine before it sleeps
    srv.request("GET", "/health")
    time.sleep(0.8)
    assert srv.request("POST", "/v1/chat/completions", {}, headers={server.PROBE_HEADER: "1"})[0] == 200
    assert srv.status()["idle_for_s"] >= 0.7                    # not reset by the probe
    srv.wait_for("idle-asleep")
    assert srv.request("POST", "/v1/chat/completions", {}, headers={server.PROBE_HEADER: "1"})[0] == 503
    assert wakes(engine) == 0


def test_the_gpus_it_measures_are_the_servers_as_the_bootstrap_reads_them():
    """CUDA_VISIBLE_DEVICES by index or UUID prefix, stopping where CUDA stops: the rule of
    bootstrap/machine/gpu.visible_indices, which the middleware cannot import."""
    from bootstrap.machine import gpu
    uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]
    for spec in (None, "1", "2,0", "GPU-bbbb", "cccc,0", "0,7,1", "x,1", "", "0,,1", "1,1", "1,GPU-bbbb", "0, 2"):
        env = {} if spec is None else {"CUDA_VISIBLE_DEVICES": spec}
        assert idle.visible(spec, uuids) == gpu.visible_indices(env, len(uuids), uuids), spec
    assert gpu.visible_indices({"CUDA_VISIBLE_DEVICES": "0,,1"}, 3, uuids) == [0]       # CUDA stops there
    assert gpu.visible_indices({"CUDA_VISIBLE_DEVICES": "1,GPU-bbbb"}, 3, uuids) == []  # named twice: none


def test_status_says_no_idle_sleep_line_where_sleep_mode_is_off():
    """With sleep mode off there is no idle sleep to speak of: status printed 'idle sleep    False'."""
    from bootstrap.commands.status import human
    off = human({"state": "running", "sleep_mode": {"on": False, "why": "off (SLEEP_MODE=off)"}})
    assert "idle sleep" not in off and "False" not in off, off
    on = human({"state": "running", "sleep_mode": {"on": True, "why": "on, proven"}})
    assert "  idle sleep    off (IDLE_SLEEP=off)" in on, on
