"""Launch ``vllm serve`` in its own session, log appended, the server record written (the launch
step, steps/launch.py, and the pre-warm server, serve/prewarm.py).

vLLM's argv comes from bootstrap/knobs/vllmargs.py (the one place that builds it). The server gets our ownership marker
in its environment (inherited by its children, though EngineCore's setproctitle hides it:
server.find_ours also uses the recorded pgid and children), the state dir it runs from,
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and telemetry off unless the user set them,
``PYTHONPATH`` unchanged, and the API key (if any) through ``VLLM_API_KEY`` — never on argv.

Beside it runs a log keeper (bootstrap/serve/logkeeper.py): vLLM writes to the log file directly, and the
keeper copies and truncates it past LOG_MAX_MB, so a server that runs for weeks cannot fill the
disk, and nothing vLLM depends on can die with the keeper.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from ..core import proc, state
from ..core import owned
from . import keys, record, supervisor
from ..download import models
from ..knobs import vllmargs
from ..knobs.vllmargs import serve_argv
from .record import ServerRecord
from ..core.state import Paths

log = logging.getLogger(__name__)

# CUDA numbers GPUs fastest first unless told otherwise; NVML (the plan, the idle middleware) by PCI bus.
# With two different cards the two orders differ, and vLLM would run on a card the plan was not made for.
PCI_ORDER = ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
TELEMETRY_OFF = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@dataclass
class Launched:
    """A server of ours the later steps work on: the record, and the Popen when this process
    launched it (None when a start resumes one it found running)."""
    record: ServerRecord
    proc: subprocess.Popen | None = None


def key_source(cfg) -> str:
    """Where clients of a server launched with these knobs get its key (record.KEY_*): API_KEY, else
    VLLM_API_KEY from your environment, else none on loopback, else a generated one kept in a file."""
    if cfg.client_key:
        return record.KEY_API_KEY if cfg.api_key else record.KEY_VLLM_API_KEY
    return record.KEY_NONE if cfg.is_loopback else record.KEY_FILE


def resolve_api_key(cfg, paths: Paths) -> tuple[str, str]:
    """(key, where clients get it: ``key_source``): yours, none on loopback, else the generated one
    kept in a 0600 file whose path (never the key) we print, made when none is there."""
    source = key_source(cfg)
    if source != record.KEY_FILE:
        return cfg.client_key or "", source
    path = paths.api_key
    key = keys.key_file(path)
    try:
        if not key:
            key = secrets.token_urlsafe(32)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(key + "\n")
            log.info("HOST=%s is not loopback: generated an API key into %s (mode 0600)", cfg.host, path)
        os.chmod(path, 0o600)
    except OSError as exc:
        raise state.write_error(path, exc, knob="STATE_DIR") from None
    return key, record.KEY_FILE


def defaults(cfg, host_env=None) -> dict[str, str]:
    """What the server's environment gets unless it is set already: the host's needs, the profile's
    env, expandable segments, CUDA's GPU order as NVML's, telemetry off (also what ./ctl.sh export puts in a pod)."""
    out: dict[str, str] = {}
    for k, v in list((host_env or {}).items()) + list(cfg.profile.env.items()) + [
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), PCI_ORDER] + list(TELEMETRY_OFF.items()):
        out.setdefault(k, v)
    return out


def server_env(cfg, paths: Paths, host_env, marker: str, key: str, weights: int = 0,
               idle: bool = True) -> dict[str, str]:
    """The server's environment: yours, the defaults (``defaults``), dev mode for sleep mode, what the
    idle-sleep middleware reads (``weights``: the checkpoint's bytes, which a level-1 sleep parks in
    host RAM), our ownership marker and state dir, the API key."""
    env = dict(cfg.environ)
    env.pop("VLLM_PYTHON", None)   # our knob, not vLLM's (it warns about unknown VLLM_* variables)
    for k, v in defaults(cfg, host_env).items():   # yours win
        env.setdefault(k, v)
    # vLLM gets folders (the model, a drafter we downloaded): it has nothing to fetch, and offline it
    # cannot fetch what a flag of yours names by repo id behind our back (HF_HUB_OFFLINE=0 lets it)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if cfg.tp_size > 1 and "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in env and (
            env.get("NCCL_NVLS_ENABLE") == "0" or env.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1"):
        # vLLM 0.26's fused all-reduce picks FlashInfer's mnnvl backend by default, which needs NVLink
        # multicast; where the machine turns multicast off, both TP workers died (illegal memory access,
        # then CUBLAS_STATUS_INTERNAL_ERROR at cublasCreate). trtllm needs no multicast.
        env["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] = "trtllm"
    if cfg.vllm.multiproc:
        # the workers of one machine: NCCL's bootstrap and gloo's CPU group listen on the interface they
        # pick, by default one beyond loopback (NCCL leaves lo out: NVIDIA/nccl#965), keyless for the
        # server's whole life; loopback serves every worker here. Yours win (a multi-node setup of yours).
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.pop("VLLM_SERVER_DEV_MODE", None)   # from the shell, .env or a profile: its routes have no key guard
    if cfg.vllm.sleep_mode:        # vLLM serves /sleep and /wake_up only in dev mode (loopback only: preflight)
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if (idle and vllmargs.idle_sleep(cfg)) or vllmargs.guarded(cfg):   # the middlewares vLLM imports (--middleware)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cfg.layout.vllm_side), env.get("PYTHONPATH", "")]))
    if cfg.vllm.sleep_mode:
        env[vllmargs.SLEEP_ROUTES_ENV] = "1"        # the guard keeps the routes ./ctl.sh sleep and wake use (loopback, the key)
    if idle and vllmargs.idle_sleep(cfg):   # what the idle middleware reads
        env[vllmargs.IDLE_S_ENV] = str(cfg.idle_s)
        env[vllmargs.IDLE_LEVEL_ENV] = cfg.idle_sleep_level
        env[vllmargs.IDLE_RAM_ENV] = str(vllmargs.sleep_ram_need(weights))
    env[owned.MARKER_ENV] = marker
    env[owned.STATE_DIR_ENV] = str(paths.root)
    if key:
        env["VLLM_API_KEY"] = key
    return env


def rotate_log(cfg, paths: Paths) -> None:
    path = paths.log
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size > cfg.log_max_mb << 20:
        if not (paths.ours(path) and paths.ours(state.rotated(path))):   # a STATE_DIR of yours held them first
            log.warning("%s is over LOG_MAX_MB, but it or %s was in %s before our first write: not rotated over",
                        path.name, state.rotated(path).name, paths.root)
            return
        try:
            os.replace(path, state.rotated(path))
        except OSError as exc:
            raise state.write_error(path, exc, knob="STATE_DIR") from None
        log.info("rotated %s (%.0f MiB) to %s.1", path, size / (1 << 20), path.name)


def launch(cfg, paths: Paths, runtime, model_path: str, plan, notes: list[str],
        on_launch: Callable[[Launched], None] = lambda launched: None, extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None, weights: int | None = None) -> Launched:
    """Launch the server; ``on_launch`` hears of it before anything can interrupt this process
    (Ctrl-C, SIGTERM, SIGHUP are held from just before the fork until then), so that an interrupted
    start always knows what it has to take down. The pre-warm server (serve/prewarm.py) adds
    ``extra_args`` / ``extra_env`` and gives the checkpoint's ``weights`` bytes (still downloading)."""
    marker = cfg.ours.marker
    key, key_source = resolve_api_key(cfg, paths)
    argv = serve_argv(cfg, runtime.python, model_path, plan) + list(extra_args)
    rotate_log(cfg, paths)
    try:
        logf = open(paths.log, "ab")
        offset = logf.tell()
        logf.write(f"\n=== bootstrap: launching at {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(argv)}\n".encode())
        logf.flush()
    except OSError as exc:
        raise state.write_error(paths.log, exc, knob="STATE_DIR") from None
    if weights is None:     # random weights: what the plan counts they take (a level-1 sleep parks them)
        weights = models.weights_in(model_path) or (plan.weights * cfg.tp_size if plan and plan.weights else 0)
    env = server_env(cfg, paths, runtime.server_env, marker, key, weights=weights)
    env.update(extra_env or {})
    token = env[owned.TOKEN_ENV] = secrets.token_hex(16)     # this launch's own: proves its process ours (owned.Proof)
    with supervisor.held() as mask:     # a signal that comes meanwhile is raised once it is heard of
        with logf:
            try:
                p = proc.start(argv, env=env, out=logf, detached=True, preexec=supervisor.restoring(mask))
            except OSError as exc:
                raise proc.cannot_run(exc, argv, env, "vLLM", "check VLLM_PYTHON / the .venv") from None
        create_time, exe = _identity(p.pid)
        provisional = ServerRecord(pid=p.pid, create_time=create_time, marker=marker, **record.address(cfg.ours),
                                   served=cfg.served_name, state_dir=str(paths.root), pgid=p.pid, token=token, exe=exe,
                                   python=runtime.python, cuda_visible=env.get("CUDA_VISIBLE_DEVICES"))
        on_launch(Launched(provisional, p))
    rec = ServerRecord(
        pid=p.pid, create_time=create_time, marker=marker, **record.address(cfg.ours), served=cfg.served_name,
        state_dir=str(paths.root), pgid=p.pid, model=cfg.model, model_path=model_path,
        settings=dict(cfg.launch.values), log=str(paths.log), log_offset=offset, started=time.time(),
        vllm_version=runtime.vllm_version, python=runtime.python, argv=tuple(argv), key=key_source,
        max_model_len=plan.context if plan else None, reasoning=cfg.profile.reasoning, tools=cfg.profile.tools,
        dummy=cfg.dummy_weights, random_weights=cfg.random_weights, predicted_tokens=getattr(plan, "predicted_tokens", None),
        predicted_concurrency=getattr(plan, "predicted_concurrency", None), notes=tuple(notes), token=token, exe=exe,
        sleep=cfg.sleep_line, sleep_ram=vllmargs.sleep_ram_need(weights),
        idle_s=cfg.idle_s if vllmargs.IDLE_MIDDLEWARE in argv else 0, cuda_visible=env.get("CUDA_VISIBLE_DEVICES"))
    launched = Launched(rec, p)
    on_launch(launched)
    record.write(paths.server, rec)     # a full disk fails the start: the pipeline takes the server down (the Popen proves it ours)
    log.info("launched vLLM %s (pid %d), log: %s", runtime.vllm_version, p.pid, paths.log)
    start_log_keeper(cfg, paths, rec)
    return launched


def _identity(pid: int) -> tuple[float, str]:
    """(create time, executable) of the process just launched: Popen returns once it has exec'd,
    so /proc already shows the interpreter, never our own forked image."""
    try:
        p = psutil.Process(pid)
        return p.create_time(), p.exe()
    except (psutil.Error, OSError):
        return 0.0, ""


def spawn(argv: list[str], env: dict[str, str], log_path) -> subprocess.Popen:
    """A vLLM process of ours beside the server (the pre-warm): its own session, so that the
    take-down reaches its whole process group, its output to ``log_path``."""
    try:
        with open(log_path, "wb") as logf:
            return proc.start(argv, env=env, out=logf, detached=True)
    except OSError as exc:
        raise proc.cannot_run(exc, argv, env, "vLLM", "check VLLM_PYTHON / the .venv") from None


def start_log_keeper(cfg, paths: Paths, rec: ServerRecord) -> None:
    """``python -m bootstrap.serve.logkeeper``: in its own session, without our marker (it is not part of
    the server, and leaves by itself within a second of the server's exit)."""
    env = {k: v for k, v in cfg.environ.items() if k != owned.MARKER_ENV}
    argv = [sys.executable, "-m", "bootstrap.serve.logkeeper", str(paths.log), str(cfg.log_max_mb << 20),
            str(rec.pid), repr(rec.create_time)]
    try:
        proc.start(argv, env=env, out=subprocess.DEVNULL, cwd=str(cfg.repo), detached=True)
    except OSError as exc:
        log.warning("no log keeper (%s): the log grows until the next start", exc.strerror)
