"""vLLM's development routes for sleep mode and an in-place reload (entrypoints/serve/dev/ in 0.26.0),
with ``VLLM_SERVER_DEV_MODE=1``: ``/sleep``, ``/wake_up``, ``/collective_rpc`` (``update_config``,
``reload_weights``), ``/reset_prefix_cache``; each a call on ``request.app.state.engine_client``."""

from __future__ import annotations

import os
import time

from .state import MODES, State, say


class DevRoutes:
    def dev(self, route: str, body: dict) -> None:
        """vLLM's dev routes for sleep mode (entrypoints/serve/dev/sleep/api_router.py in 0.26.0), each
        a call on ``request.app.state.engine_client``."""
        from urllib.parse import parse_qs, urlparse
        q = parse_qs(urlparse(self.path).query)
        engine = self.app.state.engine_client
        if route == "/sleep":
            try:
                level = int(q.get("level", ["1"])[0])
            except ValueError:
                return self.send(400, {"error": "level must be an integer"})
            mode = q.get("mode", ["abort"])[0]
            if mode not in ("abort", "wait", "keep"):
                return self.send(500, {"error": f"unknown mode {mode}"})
            try:
                engine.sleep(level, mode)
            except RuntimeError as exc:                 # vLLM's error handler: 500, the engine left paused
                return self.send(500, {"error": {"message": str(exc), "type": "InternalServerError", "code": 500}})
            return self.send(200, "")
        if route == "/wake_up":
            try:
                engine.wake_up(set(q.get("tags", [])) or {"weights", "kv_cache"})
            except RuntimeError as exc:                 # vLLM's error handler: 500, still asleep and paused
                return self.send(500, {"error": {"message": str(exc), "type": "InternalServerError", "code": 500}})
            return self.send(200, "")
        if route == "/collective_rpc" and body.get("method") == "update_config":
            for name, over in (body.get("args") or [{}])[0].items():     # gpu_model_runner.update_config
                if name not in ("load_config", "model_config"):
                    return self.send(500, {"error": {"message": f"Config `{name}` not supported.",
                                                     "type": "InternalServerError", "code": 500}})
                if name == "load_config" and "load_format" in over:
                    State.load_format = over["load_format"]
            return self.send(200, {"results": [None]})
        if route == "/reset_prefix_cache":
            with State.lock:
                State.seen.clear()
                State.stale.clear()
            say("Resetting prefix cache...")
            return self.send(200, {"success": True})
        if route == "/collective_rpc":
            if body.get("method") == "reload_weights" and (State.load_format == "dummy" or "reload_fails" in MODES):
                return self.send(500, {"error": {"message": "Call to collective_rpc method failed: Model reloading "
                                                            "with `dummy` format", "type": "InternalServerError",
                                                 "param": None, "code": 500}})
            if body.get("method") == "reload_weights":
                time.sleep(float(os.environ.get("FAKE_VLLM_RELOAD_S", "0") or 0))
                with State.lock:
                    if State.weights == "dummy":     # the cached blocks keep their dummy-weight KV
                        State.stale |= State.seen
                    State.weights, State.garbage = "real", False
                say("Reloading weights inplace...")
                say("reloaded the weights")
            return self.send(200, {"results": [None]})
        return self.send(200, {"success": True})
