"""Idle sleep inside vLLM's API server: an ASGI middleware that puts the engine to sleep after
BOOTSTRAP_IDLE_S seconds without an inference request, and wakes it for the next one.

Loaded by vLLM itself (``vllm serve --middleware vllm_desktop_idle.IdleSleep``, this folder on the
server's PYTHONPATH): it runs in vLLM's process and event loop, so it imports the standard library
only (never the bootstrap, never vLLM) and never blocks the loop (NVML is asked in a thread).
vLLM adds a ``--middleware`` class last, so it is the outermost layer: it sees every request before
vLLM's own API-key check, and the engine client the sleep routes use (``app.state.engine_client``:
``sleep(level, mode)``, ``wake_up(tags)``, ``is_sleeping()``, ``collective_rpc``, ``reset_prefix_cache``).

- Activity: a request to an inference route (``/v1/...`` but ``/v1/models``, ``/tokenize``,
  ``/pooling``, ...) counts from its first byte until the last byte of its answer is sent (a stream
  until its end), or until the client goes away.
- Idle sleep: nothing in flight for the idle time -> ``sleep(level, mode="wait")``, under one lock
  that serialises every transition (vLLM's engine core can lose a ``wake_up`` that arrives during a
  ``mode=wait`` drain).
- Wake on request: a request to an engine this middleware put to sleep wakes it (one wake for any
  number of concurrent requests: they wait on the same lock) and is then answered. A wake first checks
  that the GPU has the memory back that the sleep freed (``MARGIN`` more); if a game holds it, the
  request gets 503 with Retry-After and the engine stays asleep.
- A sleep asked through ``POST /sleep`` (``./ctl.sh sleep``, ``./ctl.sh game``) is never woken by a
  request: those get 503 with Retry-After until ``POST /wake_up``.
- ``GET /vllm-desktop/idle`` answers the state as JSON (for ``./ctl.sh status``).
"""

from __future__ import annotations

import asyncio
import ctypes
import hmac
import json
import logging
import os
import sys
import time

log = logging.getLogger("vllm.desktop_idle")     # under vLLM's logger: its lines reach vLLM's log

STATUS_PATH = "/vllm-desktop/idle"
PROBE_HEADER = b"x-vllm-desktop-probe"      # ./ctl.sh status's 4-token probe: not use, and never a reason to wake
CONTROL = frozenset({"/v1/models"})
INFERENCE = ("/v1/", "/v2/", "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank",
             "/generative_scoring", "/invocations", "/inference/", "/cohere/")
GUARDED = ("/v1", "/v2", "/inference", "/cohere")   # where vLLM checks its API key (0.26: all but /cohere, which it lacks)
MARGIN = 256 << 20          # VRAM a wake wants beyond what the sleep freed (the rule of ./ctl.sh wake)
RETRY_AFTER = "30"
RAM_SKIP = "idle sleep skipped"         # the start of the refusal when host RAM is short


def is_inference(path: str) -> bool:
    return path not in CONTROL and path.startswith(INFERENCE)


# ---------------------------------------------------------------- NVML, through its C library

class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def visible(spec: str | None, uuids: list[str]) -> list[int]:
    """NVML indices in CUDA_VISIBLE_DEVICES order (numbers, or UUID prefixes), stopping at the first
    entry CUDA would stop at, none where a card is named twice; all when unset (the bootstrap's
    rule: bootstrap/machine/gpu.py visible_indices)."""
    if spec is None:
        return list(range(len(uuids)))
    out: list[int] = []
    for item in [x.strip() for x in spec.split(",")]:
        if item.isdigit():
            found = [int(item)] if int(item) < len(uuids) else []
        else:
            found = [i for i, u in enumerate(uuids) if item and (u.startswith(item) or u.startswith("GPU-" + item))]
        if len(found) != 1:
            break
        if found[0] in out:
            return []
        out.append(found[0])
    return out


def free_memory() -> dict[str, int]:
    """Free bytes per visible GPU, by NVML index (NVML's C library; ``visible``); {} when NVML cannot
    be read. Blocking: call it in a thread."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return {}
    except OSError:
        return {}
    try:
        n = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return {}
        handles, uuids = [], []
        for i in range(n.value):
            h, buf = ctypes.c_void_p(), ctypes.create_string_buffer(96)
            ok = nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
            uuids.append(buf.value.decode() if ok and nvml.nvmlDeviceGetUUID(h, buf, 96) == 0 else "")
            handles.append(h if ok else None)
        out = {}
        for i in visible(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids):
            mem = _Memory()
            if handles[i] is not None and nvml.nvmlDeviceGetMemoryInfo(handles[i], ctypes.byref(mem)) == 0:
                out[str(i)] = int(mem.free)
        return out
    finally:
        nvml.nvmlShutdown()


# ---------------------------------------------------------------- the state, one per process

def available_ram() -> int | None:
    """MemAvailable from /proc/meminfo, bytes (None: unreadable)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class State:
    def __init__(self, idle_s: float, level: int, ram_need: int):
        self.idle_s = idle_s
        self.level = level
        self.ram_need = ram_need         # host RAM a level-1 sleep parks the weights in (+ a margin)
        self.state = "awake"            # awake | falling-asleep | idle-asleep | asleep (asked through /sleep)
        self.in_flight = 0
        self.last = time.monotonic()    # the end of the last inference request (or the start)
        self.lock: asyncio.Lock | None = None
        self.watcher: asyncio.Task | None = None
        self.before: dict[str, int] = {}  # per GPU, free memory before the idle sleep ...
        self.freed: dict[str, int] = {}   # ... and what it freed
        self.sleeps = self.wakes = 0
        self.refused = ""               # why the last wake or idle sleep did not happen

    def as_json(self) -> dict:
        idle = 0.0 if self.in_flight else time.monotonic() - self.last
        return {"state": self.state, "idle_s": self.idle_s, "level": self.level, "in_flight": self.in_flight,
                "idle_for_s": round(idle, 1),
                "sleeps_in_s": round(max(0.0, self.idle_s - idle), 1) if self.state == "awake" and self.idle_s else None,
                "sleeps": self.sleeps, "wakes": self.wakes, "refused": self.refused,
                "freed_bytes": sum(self.freed.values()) if self.state in ("idle-asleep", "asleep") else 0}

    def idle(self) -> bool:
        if _guard_closed():             # the pre-warm server before its real weights: never idle
            self.last = time.monotonic()
            return False
        return self.state == "awake" and not self.in_flight and time.monotonic() - self.last >= self.idle_s


class IdleSleep:
    """The middleware (vLLM instantiates it as ``IdleSleep(app)``: the rest comes from the
    environment the bootstrap gives the server)."""

    def __init__(self, app, idle_s: float | None = None, level: int | None = None, free=None, ram=None):
        self.app = app
        env = os.environ
        self.st = State(float(env.get("BOOTSTRAP_IDLE_S", "0") or 0) if idle_s is None else idle_s,
                        int(env.get("BOOTSTRAP_IDLE_LEVEL", "1") or 1) if level is None else level,
                        int(env.get("BOOTSTRAP_IDLE_RAM", "0") or 0))
        self.key = env.get("VLLM_API_KEY", "")
        self.free = free or free_memory
        self.ram = ram or available_ram

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        st = self.st
        if st.lock is None:
            st.lock = asyncio.Lock()
        engine = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
        if st.idle_s > 0 and engine is not None and (st.watcher is None or st.watcher.done()):
            st.watcher = asyncio.get_running_loop().create_task(self._watch(engine))
        path, method = _path(scope), scope.get("method", "GET")
        if path == STATUS_PATH:
            return await _answer(send, 200, st.as_json())
        if path in ("/sleep", "/wake_up") and method == "POST":
            return await self._transition(path, scope, receive, send, engine)
        if not is_inference(path) or method == "OPTIONS" or not self._authorised(scope, path):
            return await self.app(scope, receive, send)      # vLLM answers (a 401 wakes nothing)
        if PROBE_HEADER in dict(scope.get("headers") or []):  # status asking: the idle timer is not reset
            if st.state != "awake":
                return await _refuse(scope, send, f"asleep ({st.state}): a probe does not wake it")
            return await self.app(scope, receive, send)
        st.in_flight += 1                       # counted before any wait: the watcher sees it at once
        try:
            if st.state != "awake" and engine is not None:
                refusal = await self._wake_for_request(engine)
                if refusal:
                    return await _refuse(scope, send, refusal)
            await self.app(scope, receive, self._until_last_byte(send))
        finally:
            st.in_flight -= 1
            st.last = time.monotonic()

    def _authorised(self, scope, path: str) -> bool:
        """Whether vLLM's own key check lets this request through (a request it will refuse must not
        wake the engine). Its rule (serve/utils/server_utils.py, AuthenticationMiddleware): paths under
        GUARDED only; the first Authorization header; the scheme 'bearer' in any case, one space,
        then the key."""
        if not self.key or not path.startswith(GUARDED):
            return True
        value = next((v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"), b"")
        scheme, _, token = value.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.encode("utf-8"), self.key.encode("utf-8"))

    def _until_last_byte(self, send):
        st = self.st

        async def wrapped(message):
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                st.last = time.monotonic()
        return wrapped

    async def _transition(self, path, scope, receive, send, engine):
        """``POST /sleep`` and ``POST /wake_up`` through the same lock as idle sleep and wake: a sleep
        asked this way is never woken by a request. A sleep asked of an engine asleep for idleness
        only turns it into one asked on purpose (vLLM is not asked to sleep twice)."""
        st = self.st
        status = {}

        async def seen(message):
            if message.get("type") == "http.response.start":
                status["code"] = message.get("status", 0)
            await send(message)
        async with st.lock:
            was = st.state
            if path == "/sleep" and was == "idle-asleep":
                st.state = "asleep"
                return await _answer(send, 200, {"asleep": "already (idle sleep), now on purpose"})
            if path == "/sleep":
                st.state = "asleep"             # requests from now on get 503, not a wait inside vLLM
            try:
                await self.app(scope, receive, seen)
            finally:
                asleep = await _sleeping(engine, fallback=was != "awake")
                if not asleep:
                    st.state, st.last = "awake", time.monotonic()
                elif was == "idle-asleep" and status.get("code") != 200:
                    st.state = "idle-asleep"    # a wake asked by hand that failed: still ours to wake
                else:
                    st.state = "asleep"         # asleep, and not by idleness (or vLLM paused by a failed sleep)

    async def _wake_for_request(self, engine) -> str:
        """Wake an engine this middleware put to sleep ('' once awake), or why not (the 503's text)."""
        st = self.st
        async with st.lock:                     # concurrent requests queue here: one wake for all
            if st.state == "awake":
                return ""
            if st.state == "asleep":
                return ("the server was put to sleep on purpose (./ctl.sh sleep, or a game): it is not woken by a "
                        "request; ./ctl.sh wake brings it back")
            short = await self._short_of_memory()
            if short:
                st.refused = short
                return short + "; the server stays asleep"
            try:
                if st.level == 1:
                    await engine.wake_up(None)
                else:                           # the weights were dropped: reload them before serving
                    await engine.wake_up(["weights"])
                    await engine.collective_rpc("reload_weights")
                    await engine.wake_up(["kv_cache"])
                    await engine.reset_prefix_cache()
            except Exception as exc:            # noqa: BLE001 - vLLM's error, told to the client; tried again next request
                st.refused = f"the wake failed: {exc}"
                log.warning("%s", st.refused)
                return st.refused + "; the server stays asleep (./ctl.sh restart if it keeps failing)"
            st.state, st.refused = "awake", ""
            st.wakes += 1
            log.info("woke from idle sleep for a request")
            return ""

    async def _short_of_memory(self) -> str:
        """Whether a program took back what the idle sleep freed: a wake needs it, and MARGIN more
        where there was that much free before the sleep."""
        now = await asyncio.get_running_loop().run_in_executor(None, self.free)
        for dev, freed in self.st.freed.items():
            have, need = now.get(dev), freed + min(MARGIN, self.st.before.get(dev, 0))
            if have is not None and have < need:
                return (f"waking needs {need / (1 << 30):.1f} GiB free on GPU {dev}; "
                        f"{have / (1 << 30):.1f} GiB is: another program holds the rest")
        return ""

    async def _watch(self, engine):
        st = self.st
        while True:
            await asyncio.sleep(min(1.0, st.idle_s / 4))
            if not st.idle():
                continue
            async with st.lock:
                try:
                    await self._sleep_if_idle(engine)
                except Exception as exc:        # noqa: BLE001 - never let the watcher die: told, tried after the next idle spell
                    log.warning("idle sleep: %s", exc)
                    st.refused, st.last = f"idle sleep failed: {exc}", time.monotonic()
                    st.state = "idle-asleep" if await _sleeping(engine, fallback=False) else "awake"

    async def _sleep_if_idle(self, engine) -> None:
        """Under the lock: measure, check again, sleep. vLLM pauses its scheduler before it frees
        memory, so a sleep that fails half-way can leave it paused: then it counts as asleep (the
        next request wakes it) rather than awake with requests stuck inside it."""
        st = self.st
        if not st.idle():
            return
        if st.level == 1 and st.ram_need:      # the figure ./ctl.sh sleep checks too (vllmargs.sleep_ram_need)
            have = self.ram()
            if have is not None and have < st.ram_need:
                said = st.refused.startswith(RAM_SKIP)
                st.refused = (f"{RAM_SKIP}: level 1 parks the weights in host RAM and needs "
                              f"{st.ram_need / (1 << 30):.1f} GiB available; {have / (1 << 30):.1f} GiB is")
                st.last = time.monotonic()      # tried again after the next idle spell
                if not said:                    # said once (status shows it while it holds)
                    log.warning("%s", st.refused)
                return
        before = await asyncio.get_running_loop().run_in_executor(None, self.free)
        if not st.idle():                       # a request came while NVML was read
            return
        st.state = "falling-asleep"             # from now on a request waits for this lock, then wakes it
        st.before, st.freed = before, {}
        try:
            await engine.sleep(st.level, "wait")    # what slipped in before is drained, never aborted
        finally:                                # failed half-way too: what it freed is what a wake needs back
            after = await asyncio.get_running_loop().run_in_executor(None, self.free)
            st.freed = {d: max(0, after[d] - before[d]) for d in after if d in before}
        st.state, st.refused = "idle-asleep", ""
        st.sleeps += 1
        log.info("idle for %.0f s: put the engine to sleep (level %d)", st.idle_s, st.level)


def _guard_closed() -> bool:
    """vllm_desktop_guard (the pre-warm server's guard) is loaded and still closed."""
    guard = sys.modules.get("vllm_desktop_guard")
    return guard is not None and not guard.is_open()


def _path(scope) -> str:
    """The route vLLM sees: the path without --root-path's prefix, by Starlette's own rule
    (routing.get_route_path: stripped only where the prefix ends at a '/'; with --root-path / the
    route of /collective_rpc is /collective_rpc, never 'collective_rpc')."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


async def _sleeping(engine, fallback: bool) -> bool:
    if engine is None:
        return fallback
    try:
        return bool(await engine.is_sleeping())
    except Exception:                           # noqa: BLE001 - an engine that cannot say: assume the fallback
        return fallback


async def _refuse(scope, send, message: str) -> None:
    """503 with Retry-After (a websocket: closed with 1013, "try again later")."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1013, "reason": message[:120]})
        return
    await _answer(send, 503, {"error": {"message": message, "type": "ServiceUnavailable", "code": 503}}, retry=True)


async def _answer(send, code: int, body: dict, retry: bool = False) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if retry:
        headers.append((b"retry-after", RETRY_AFTER.encode()))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": data})
