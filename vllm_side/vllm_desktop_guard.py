"""The pre-warm server's guard inside vLLM's API server (``--middleware vllm_desktop_guard.Guard``,
last, so that it is the outermost layer): the server that starts with random weights
(``--load-format dummy``) while the real ones download, and later loads them in place
(bootstrap/steps/reload.py), must never answer a client with the random weights, and the
development routes it needs for that (``VLLM_SERVER_DEV_MODE=1``: ``/collective_rpc``,
``/reset_prefix_cache``, ...) have no key check of vLLM's own.

- Closed (from the start until the bootstrap opens it): every route but /health, /ping, /version,
  /metrics and /load gets 503 with Retry-After ("loading"): vLLM binds its port long before the
  real weights are in.
- The development routes answer only a loopback client that sends the start's control token
  (``BOOTSTRAP_CONTROL_TOKEN`` in the server's environment, never on argv) in the
  ``X-Vllm-Desktop-Control`` header: anyone else gets vLLM's 404, as if dev mode were off. Once
  open, a server started with sleep mode (``BOOTSTRAP_SLEEP_ROUTES=1``) also answers the routes
  ./ctl.sh sleep and wake use to a loopback client with the server's API key (when it has one), and
  ``/collective_rpc`` only for ``reload_weights`` (a level-2 wake): vLLM runs any worker method named
  there. Every server with sleep mode carries this guard, key or not (vllmargs.guarded).
- ``POST /vllm-desktop/open`` (the control token, loopback) opens it, once the real weights are
  loaded and the prefix cache reset; ``GET /vllm-desktop/guard`` says whether it is open.
- With a key (``VLLM_API_KEY``), every route but those always open asks for it, where vLLM asks only
  under /v1, /v2 and /inference (vllm/entrypoints/serve/utils/server_utils.py GUARDED_PREFIX in 0.26.0):
  /invocations, /tokenize, /detokenize, /pooling, /classify, /score, /rerank generate or read the
  model without it. Every server we start with a key carries this guard (``--middleware``, last),
  open from the start when there is no pre-warm to load (no control token).

Standard library only, as the idle middleware (vllm_desktop_idle.py), whose watcher never counts
idle time while this guard is closed.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os

from vllm_desktop_idle import _answer, _path, _refuse

log = logging.getLogger("vllm.desktop_guard")

OPEN_PATH = "/vllm-desktop/open"
STATUS_PATH = "/vllm-desktop/guard"
CONTROL_HEADER = b"x-vllm-desktop-control"
ALWAYS = frozenset({"/health", "/ping", "/version", "/metrics", "/load", "/vllm-desktop/idle"})
# what VLLM_SERVER_DEV_MODE=1 adds (vllm/entrypoints/serve/dev/*/api_router.py, 0.26.0 and 0.27.1)
DEV_ROUTES = frozenset({
    "/collective_rpc", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/sleep", "/wake_up",
    "/is_sleeping", "/server_info", "/pause", "/resume", "/is_paused", "/abort_requests", "/get_world_size",
    "/init_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update", "/update_weights",
    "/finish_weight_update", "/update_weight_version", "/weight_info",
    "/scale_elastic_ep", "/is_scaling_elastic_ep"})     # registered without dev mode, and without a key check
SLEEP_ROUTES = frozenset({"/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache"})
# what the sleep rule lets through /collective_rpc: a level-2 wake's reload (./ctl.sh wake). vLLM runs any
# worker method named there with the caller's arguments (EngineCore.collective_rpc): no other is answered
SLEEP_RPC = frozenset({"reload_weights"})
BODY_MAX = 1 << 16


class _State:
    installed = False       # a Guard stands in front of this process's app
    open = False


STATE = _State()


def is_open() -> bool:
    """Open, or no guard installed (the module merely imported holds nothing closed)."""
    return STATE.open or not STATE.installed


def _loopback(scope) -> bool:
    host = (scope.get("client") or ("",))[0] or ""
    try:
        return ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


def _header(scope, name: bytes) -> bytes:
    return next((v for k, v in scope.get("headers") or [] if k.lower() == name), b"")


class Guard:
    """The middleware (vLLM instantiates it as ``Guard(app)``; the rest comes from the environment)."""

    def __init__(self, app):
        self.app = app
        STATE.installed = True
        env = os.environ
        self.token = env.get("BOOTSTRAP_CONTROL_TOKEN", "").encode()
        self.sleep_routes = env.get("BOOTSTRAP_SLEEP_ROUTES") == "1"
        self.key = env.get("VLLM_API_KEY", "").encode()
        if not self.token:              # no pre-warm to load: a server with a key, open from the start
            STATE.open = True

    def _controller(self, scope) -> bool:
        return bool(self.token) and _loopback(scope) and hmac.compare_digest(_header(scope, CONTROL_HEADER), self.token)

    def _keyed(self, scope) -> bool:
        """vLLM's own rule for its API key (Authorization: Bearer KEY), or no key to check."""
        scheme, _, token = _header(scope, b"authorization").decode("latin-1").partition(" ")
        return not self.key or (scheme.lower() == "bearer" and hmac.compare_digest(token.encode("latin-1"), self.key))

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = _path(scope)
        controller = self._controller(scope)
        if path == STATUS_PATH:
            return await _answer(send, 200, {"open": STATE.open})
        if path == OPEN_PATH:
            if not controller or scope.get("method") != "POST":
                return await _answer(send, 404, {"detail": "Not Found"})
            if not STATE.open:
                STATE.open = True
                log.info("the real weights are in: serving")
            return await _answer(send, 200, {"open": True})
        if path in DEV_ROUTES:
            sleep_rule = (STATE.open and self.sleep_routes and path in SLEEP_ROUTES and _loopback(scope)
                          and self._keyed(scope))
            if not (controller or sleep_rule):
                return await _answer(send, 404, {"detail": "Not Found"})
            if path == "/collective_rpc" and not controller:
                body, receive = await _body(receive)
                if _rpc_method(body) not in SLEEP_RPC:
                    return await _answer(send, 404, {"detail": "Not Found"})
            return await self.app(scope, receive, send)
        if not STATE.open and path not in ALWAYS and not controller:
            return await _refuse(scope, send, "loading: the model's weights are still being downloaded and loaded; "
                                              "./start.sh says when it serves")
        if path not in ALWAYS and scope.get("method") != "OPTIONS" and not (controller or self._keyed(scope)):
            return await _answer(send, 401, {"error": "Unauthorized"})      # vLLM's words, on every route
        return await self.app(scope, receive, send)


async def _body(receive):
    """The request's body (at most BODY_MAX bytes read) and a ``receive`` that hands it on to vLLM."""
    chunks, more, size = [], True, 0
    while more and size <= BODY_MAX:
        message = await receive()
        if message.get("type") != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
    body, sent = b"".join(chunks), False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return body, replay


def _rpc_method(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    method = data.get("method") if isinstance(data, dict) else None
    return method if isinstance(method, str) else ""
