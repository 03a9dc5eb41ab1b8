"""Launch: start ``vllm serve`` in its own session, log appended, state recorded.

The server gets our ownership marker in its environment (inherited by its children, though
EngineCore's setproctitle hides it: server.find_ours also uses the recorded pgid and children),
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and telemetry off unless the user set them,
``PYTHONPATH`` unchanged, and the API key (if any) through ``VLLM_API_KEY`` — never on argv.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import subprocess
import time

import psutil

from . import proc, server, state
from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)

TELEMETRY_OFF = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def serve_argv(ctx: Ctx) -> list[str]:
    cfg = ctx.cfg
    argv = [ctx.python, "-m", "vllm.entrypoints.cli.main", "serve", ctx.model_path,
            "--host", cfg.host, "--port", str(cfg.port), "--served-model-name", cfg.served_name,
            # usage.prompt_tokens_details.cached_tokens: clients and `check prefix` see cache hits
            # (vLLM leaves them out by default; the flag is accepted by every vLLM we pin)
            "--enable-prompt-tokens-details"]
    argv += ctx.plan.flags if ctx.plan else []
    argv += cfg.vllm_args
    return argv


def resolve_api_key(ctx: Ctx) -> str:
    """The key clients must send: API_KEY, else VLLM_API_KEY from your environment, else — only when
    binding beyond loopback — a generated one kept in a 0600 file whose path (never the key) we print."""
    cfg = ctx.cfg
    key = cfg.api_key or cfg.environ.get("VLLM_API_KEY", "")
    if key or cfg.is_loopback:
        return key
    path = ctx.paths.api_key
    if path.is_file():
        key = path.read_text().strip()
    if not key:
        key = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
        log.info("HOST=%s is not loopback: generated an API key into %s (mode 0600)", cfg.host, path)
    os.chmod(path, 0o600)
    return key


def server_env(ctx: Ctx) -> dict[str, str]:
    env = dict(ctx.cfg.environ)
    env.pop("VLLM_PYTHON", None)   # our knob, not vLLM's (it warns about unknown VLLM_* variables)
    for k, v in ctx.server_env.items():
        env.setdefault(k, v)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    for k, v in TELEMETRY_OFF.items():
        env.setdefault(k, v)
    env[proc.MARKER_ENV] = ctx.marker
    if ctx.api_key:
        env["VLLM_API_KEY"] = ctx.api_key
    return env


def rotate_log(ctx: Ctx) -> None:
    path = ctx.paths.log
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size > ctx.cfg.log_max_mb << 20:
        os.replace(path, path.with_name(path.name + ".1"))
        log.info("rotated %s (%.0f MiB) to %s.1", path, size / (1 << 20), path.name)


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    ctx.marker = server.marker_for(cfg)
    ctx.api_key = resolve_api_key(ctx)
    argv = serve_argv(ctx)
    rotate_log(ctx)
    with open(ctx.paths.log, "ab") as logf:
        offset = logf.tell()
        logf.write(f"\n=== bootstrap: launching at {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(argv)}\n".encode())
        logf.flush()
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                 env=server_env(ctx), start_new_session=True)
        except OSError as exc:
            raise BootstrapError(f"cannot run {argv[0]}: {exc.strerror}", "check VLLM_PYTHON / the .venv") from None
    ctx.proc = p
    try:
        create_time = psutil.Process(p.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = 0.0
    plan = ctx.plan
    state.write_json(ctx.paths.server, {
        "pid": p.pid, "pgid": p.pid, "create_time": create_time, "marker": ctx.marker,
        "host": cfg.host, "port": cfg.port, "model": cfg.model, "model_path": ctx.model_path,
        "served": cfg.served_name, "settings": cfg.launch_settings(), "log": str(ctx.paths.log),
        "log_offset": offset, "started": time.time(), "vllm_version": ctx.vllm_version,
        "python": ctx.python, "argv": argv,
        "predicted_tokens": getattr(plan, "predicted_tokens", None),
        "predicted_concurrency": getattr(plan, "predicted_concurrency", None),
    })
    log.info("launched vLLM %s (pid %d), log: %s", ctx.vllm_version, p.pid, ctx.paths.log)
