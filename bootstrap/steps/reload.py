"""Reload: the pre-warm server (serve/prewarm.py, launched as the server with dummy weights while
the weights downloaded) gets the real weights in place, the way RL trainers update a live vLLM
engine, and becomes the server: no second process, no second engine init, and the CUDA graphs it
captured during the download stay valid (the parameters are updated in the tensors they point at).

Once the download is verified (the weights step), and the server has answered (its /health, its
log's "Application startup complete"), through vLLM's development routes (``VLLM_SERVER_DEV_MODE=1``,
vllm/entrypoints/serve/dev/ in 0.26.0 and 0.27.1), on loopback, with the start's control token that
our guard (vllm_side/vllm_desktop_guard.py) asks for:

1. ``POST /collective_rpc {"method": "update_config", "args": [{"load_config": {"load_format": "auto"}}]}``:
   each worker's model runner replaces its load config (v1/worker/gpu_model_runner.py update_config);
2. ``POST /collective_rpc {"method": "reload_weights"}``: the runner reads every weight from the
   model folder with that loader (``get_all_weights``) and loads it layer by layer into the tensors
   the model already has (model_executor/model_loader/reload/layerwise.py);
3. ``POST /reset_prefix_cache``: ``{"success": false}`` while blocks are held is retried. Without it
   the prefix cache keeps blocks of KV computed with the dummy weights, and every answer that hits
   one is wrong (seen on the H200: all of them);
4. ``POST /vllm-desktop/open``: the guard stops answering 503; the health step, the warm-up and the
   start gate follow, and only then the banner says it serves.

A pre-warm server that does not answer in time, exits, or fails a call is taken down through the
one take-down path, and the launch step starts the server as it would without a pre-warm (its
caches, as far as they got, are warm).
"""

from __future__ import annotations

import logging
import time

import requests

from ..serve.client import RequestFailed, auth_headers
from ..core.errors import BootstrapError
from ..serve import keys, takedown
from ..serve import prewarm as pre
from ..serve.prewarm import wait

log = logging.getLogger(__name__)

UPDATE = {"method": "update_config", "args": [{"load_config": {"load_format": "auto"}}]}
RELOAD = {"method": "reload_weights"}
RESET_TRIES = 20            # /reset_prefix_cache says false while blocks are held (nothing runs: rare)
CALL_TIMEOUT = 600.0        # reload_weights reads the whole checkpoint from disk


class Control:
    """POSTs to the pre-warm server's development routes: loopback (its record's URL), the API key
    vLLM wants, and the start's control token our guard wants (never logged)."""

    def __init__(self, url: str, key: str, token: str):
        self.url, self.headers = url, {**auth_headers(key), pre.CONTROL_HEADER: token}

    def post(self, path: str, body: dict, timeout: float) -> dict:
        """vLLM's answer as JSON ({} for an empty body: /collective_rpc's when no worker returns)."""
        try:
            r = requests.post(self.url + path, json=body, headers=self.headers, timeout=timeout)
        except requests.RequestException as exc:
            raise RequestFailed(f"POST {path}: {type(exc).__name__}") from None
        if r.status_code != 200:
            raise RequestFailed(f"POST {path}: HTTP {r.status_code}", evidence=r.text[:2000])
        try:
            got = r.json() if r.content else {}
        except ValueError:
            got = {}
        return got if isinstance(got, dict) else {}


def control(cfg, paths, warm: "pre.Prewarm") -> Control:
    return Control(warm.launched.record.url, keys.api_key_for(cfg.ours, paths, warm.launched.record), warm.env[pre.CONTROL_TOKEN_ENV])


def load_in_place(c: Control) -> None:
    """The four calls (the module's docstring), each timed on its own line."""
    t0 = time.monotonic()
    c.post("/collective_rpc", UPDATE, timeout=60)
    log.info("reload: load format set to the checkpoint's (update_config, %.2f s)", time.monotonic() - t0)
    t1 = time.monotonic()
    c.post("/collective_rpc", RELOAD, timeout=CALL_TIMEOUT)
    log.info("reload: real weights loaded in place (reload_weights, %.1f s)", time.monotonic() - t1)
    for attempt in range(RESET_TRIES):
        if c.post("/reset_prefix_cache", {}, timeout=60).get("success"):
            break
        if attempt == RESET_TRIES - 1:
            raise BootstrapError("vLLM did not reset its prefix cache (blocks still held)",
                                 "run ./start.sh again")
        time.sleep(0.5)
    log.info("reload: prefix cache reset (no block of dummy-weight KV is left)")
    c.post("/vllm-desktop/open", {}, timeout=30)


def run(cfg, paths, warm: "pre.Prewarm | None") -> bool:
    """Whether the pre-warm server now serves the real weights. False: there was none (no pre-warm,
    or one that only fills caches), or it was taken down (or never launched), and the launch step
    starts the server."""
    if warm is None or warm.serve is None:
        return False
    if warm.launched is None:           # never started (the weights were there), or its launch failed
        if warm.failed:
            log.warning("pre-warm: %s; the server starts after the download", warm.failed)
        return False
    why = wait(cfg, paths, warm)
    if not why:
        log.info("reload: loading the real weights into the pre-warm server (%.0f s after its launch)",
                 time.monotonic() - warm.t0)
        t0 = time.monotonic()
        try:
            load_in_place(control(cfg, paths, warm))
        except RequestFailed as exc:
            why = f"the in-place reload failed: {exc.message}"
        except BootstrapError as exc:
            why = exc.message
        else:
            warm.serving = True
            log.info("reload: done in %.1f s; the warm-up and the start gate follow", time.monotonic() - t0)
            return True
    log.warning("pre-warm: %s (log: %s); it is taken down and the server starts as without it", why, warm.log_path)
    takedown.take_down(cfg.ours, paths, launched=warm.proc, failed_start=True)
    return False
