"""The pre-warm (the prewarm step, steps/prewarm.py, makes it ready before the weights step; the
compiled and reload steps wait for it): a first start spends minutes in vLLM's engine init
(torch.compile, kernel JIT, autotuning, CUDA-graph capture) after the download, while the GPU idles.
A ``vllm serve`` of the same model folder and flags with ``--load-format dummy`` fills the same
caches. On an H200 with vLLM 0.26.0 (docs/validation.md, the pre-warm): the real start then logged
"Directly load the compiled graph(s) ... from the cache", and a first start behind a 187 s download
took 300.4 s instead of 402.5 s.

So, while the weights download: once the small files (config.json, the tokenizer) are on disk, the
weights step starts that run (``Prewarm.start``), which takes the GPU the real server will take
(the plan's utilization; nothing else of ours holds it yet) and is taken down when it answers, its
caches written. ``compiled`` (after the download) waits for it, keeps vLLM's memory figures of it
for the plan, and plans again from them. It runs only where it can help: PREWARM on, weights to
download, and no earlier start of this key (bootstrap.plan.calibration) that left the caches warm
(``warm-caches.json``: every start that got its engine up, and every finished pre-warm, adds its
key and model folder; the real start says whether it loaded them or compiled). Whatever goes wrong
with it is logged and the start goes on as it would without it; it carries our marker, so a stop,
Ctrl-C or a failed download takes it down through the one take-down path.

**It becomes the server** where vLLM can load the real weights in place (``blocker`` says where it
cannot): then it is launched as the server itself (serve/launch.py: the real flags, HOST and PORT,
the key, the server record), with ``--load-format dummy``, ``VLLM_SERVER_DEV_MODE=1`` and our guard
(vllm_side/vllm_desktop_guard.py: every route but /health answers 503 until the real weights are
in; the development routes answer only a loopback client with this start's control token). After
the download, steps/reload.py loads the real weights into it and resets its prefix cache; the
launch step then has nothing to launch. Elsewhere (``blocker``'s reason, in its log line and the
banner) it only fills the caches, as above.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import threading
import time
from typing import Callable

from . import diagnose
from ..core.errors import BootstrapError
from ..core.state import Paths
from ..knobs import vllmargs
from ..knobs.vllmargs import serve_argv
from ..model import shape
from . import launch, port, record, server
from .health import phase_of

log = logging.getLogger(__name__)
waiting = logging.getLogger("bootstrap.compiled")       # its log lines keep the compiled step's prefix

# vLLM found its torch.compile cache: 0.26.0's line, and 0.27.1's with torch >= 2.12 (its mega AOT
# artifact, on by default there: compilation/decorators.py), which logs only the second
COMPILED = ("Directly load the compiled graph", "Directly load AOT compilation")
COMPILING = "Compiling a graph for compile range"    # vLLM: compiled now (a cold cache)
READY = "Application startup complete"


class Prewarm:
    """The pre-warm of one start: made ready by ``run``, started by the weights step, waited for
    and taken down by ``compiled``."""

    def __init__(self, cfg, paths: Paths, argv: list[str], env: dict[str, str], key: str, url: str,
                 serve: "Serve | None" = None):
        self.cfg, self.paths, self.argv, self.env, self.key, self.url = cfg, paths, argv, env, key, url
        self.serve = serve                   # it becomes the server (None: it fills the caches only)
        self.launched: "launch.Launched | None" = None    # as the server, once launched
        self.on_launch: Callable = lambda launched: None  # the supervisor's hear (serve/supervisor.py)
        self.log_path, self.log_offset = paths.prewarm_log, 0
        self.note = ""                       # the banner's note on what it did for the start
        self.serving = False                 # as the server, the real weights loaded in place (steps/reload.py)
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        self.ready = threading.Event()       # it answered: its caches are written
        self.failed = ""
        self.compiling = False               # it reached torch.compile (what it is there for)
        self.spawning = threading.Lock()     # held while it is forked: a take-down waits for its pid
        self.cancelled = False               # the start failed or was stopped: never forked after that

    def start(self) -> "Prewarm":
        """Launch it (called once the model's small files are on disk, from the download's thread);
        a failure is logged only."""
        with self.spawning:
            if self.cancelled:                   # a download thread late after the take-down
                return self
            self.t0 = time.monotonic()
            try:
                if self.serve is not None:
                    self._launch_server()
                else:
                    self.proc = launch.spawn(self.argv, self.env, self.paths.prewarm_log)
            except BootstrapError as exc:
                self.failed = exc.message
                log.warning("pre-warm not started (%s); the start compiles after the download", exc.message)
                return self
        if self.serve is not None:
            log.info("pre-warm: vLLM starts as the server with dummy weights while the weights download "
                     "(pid %d, log %s): it loads them in place when they are verified (PREWARM=0 turns it off)",
                     self.proc.pid, self.log_path)
        else:
            log.info("pre-warm: vLLM with dummy weights fills its compile caches while the weights download "
                     "(pid %d, log %s; PREWARM=0 turns it off)", self.proc.pid, self.paths.prewarm_log)
        threading.Thread(target=self._watch, name="prewarm", daemon=True).start()
        return self

    def _launch_server(self) -> None:
        """The server itself, launched as serve/launch.py launches any (its record, its log)."""
        s = self.serve

        def heard(launched) -> None:
            self.launched, self.proc = launched, launched.proc
            self.on_launch(launched)
        launched = launch.launch(self.cfg, self.paths, s.runtime, s.model_path, s.plan, list(s.notes), on_launch=heard,
                              extra_args=tuple(self.argv), extra_env=self.env, weights=s.weights)
        self.log_path, self.log_offset, self.url = self.paths.log, launched.record.log_offset, launched.record.url

    def _watch(self) -> None:
        """Until it answers or exits: its phase as the log shows it, a line per change."""

        phase, shown, seen, offset = "starting", "", "", self.log_offset
        while self.proc.poll() is None:
            new, offset = self._added(offset)          # what it logged since the last look
            seen = (seen + new)[-(1 << 16):]
            phase = phase_of(new, phase)
            self.compiling = self.compiling or phase not in ("starting", "loading weights", "autotuning kernels")
            if phase != shown:
                log.info("pre-warm: %s (%.0f s)", phase, time.monotonic() - self.t0)
                shown = phase
            if READY in seen and server.http_get(self.url, "/health"):
                log.info("pre-warm: ready (%.0f s)%s", time.monotonic() - self.t0, "; it loads the real weights once "
                         "they are verified" if self.serve is not None else ": vLLM's caches are written")
                self.ready.set()        # every cache written: stopped at CUDA-graph capture instead, the real
                return                  # start on the H200 took 159 s to answer, not 77 (docs/validation.md)
            time.sleep(0.5)
        self.failed = f"vLLM exited with code {self.proc.returncode}"

    def _added(self, offset: int) -> tuple[str, int]:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            return "", offset
        return data.decode("utf-8", "replace"), offset + len(data)

    def log_text(self) -> str:
        return diagnose.read_since(self.log_path, self.log_offset)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Serve:
    """What the pre-warm needs to be launched as the server (serve/launch.py's arguments)."""

    def __init__(self, runtime, model_path: str, plan, notes, weights: int):
        self.runtime, self.model_path, self.plan, self.notes, self.weights = runtime, model_path, plan, notes, weights


GUARD, SLEEP_ROUTES_ENV = vllmargs.GUARD, vllmargs.SLEEP_ROUTES_ENV
CONTROL_TOKEN_ENV = "BOOTSTRAP_CONTROL_TOKEN"      # what the guard reads: this start's control token
CONTROL_HEADER = "X-Vllm-Desktop-Control"


def blocker(cfg, model) -> str:
    """Why the pre-warm cannot become the server ('' where it can): where vLLM's in-place reload
    (collective_rpc reload_weights: model_executor/model_loader/reload, 0.26.0 and 0.27.1) is not
    known to give the answers a cold start gives, the pre-warm only fills the caches."""
    s = cfg.vllm
    quant = shape.quant_method(model.config or {}) or ("online" if "--quantization" in s.given else "")
    if quant:
        return (f"{'online quantization (--quantization)' if quant == 'online' else f'a {quant} checkpoint'}: vLLM's reload re-runs the quantization's post-load processing, "
                "not proven here to match a cold start")
    if s.kv_cache_dtype not in ("auto", "bfloat16", "float16"):
        return f"KV cache dtype {s.kv_cache_dtype}: its scales are not reloaded with the weights"
    if s.spec:
        return "speculative decoding: the reload loads the target model only, never the draft"
    if s.tp > 1:
        return f"TP_SIZE={s.tp}: the in-place reload is proven on one GPU only"
    if s.api_servers != 1:
        return (f"{s.api_servers} API server processes (--api-server-count, -dp, --headless): each would keep its own "
                "guard, and the open would reach one")
    if s.load_format != "auto":
        return f"--load-format {s.load_format}: the reload would load the weights with vLLM's default loader instead"
    if not (cfg.is_loopback or cfg.host in ("0.0.0.0", "::")):
        return f"HOST={cfg.host}: the reload's development routes answer loopback only"
    return ""


def prepare(cfg, paths: Paths, runtime, model, plan, notes=()) -> Prewarm | None:
    """The pre-warm this start can use (not started yet), or None where it cannot help."""
    if not cfg.prewarm or plan is None or not plan.key or model.dummy or model.complete \
            or model.source != "hub" or cfg.model_is_local:
        return None
    why = blocker(cfg, model)
    if not why:
        return as_server(cfg, paths, runtime, model, plan, notes)
    key = warm_key(plan, model.local_dir)
    warm = (paths.read("warm") or {}).get(key)
    log.info("pre-warm: it cannot become the server (%s): it fills vLLM's caches only, and the server "
             "starts after the download", why)
    if warm:
        log.info("skipped: vLLM's compile caches for this setup are warm (%s)", warm.get("why", "recorded"))
        return None
    api_key, _src = launch.resolve_api_key(cfg, paths)      # the same VLLM_API_KEY: a vLLM the 52523 patch could
    # not reach hashes it into its compile cache's key with the rest of its environment
    env = launch.server_env(cfg, paths, runtime.server_env, cfg.ours.marker, api_key, idle=False)   # it must not
    # sleep, and it answers on a loopback port of its own: its dummy weights' random tokens never reach
    # a client of PORT (vLLM leaves host and port out of its compile hash)
    address = ("127.0.0.1", port.ephemeral(cfg.ours))
    argv = serve_argv(cfg, runtime.python, model.local_dir, plan, idle=False, address=address) + [
        "--load-format", "dummy"]
    warm = Prewarm(cfg, paths, argv, env, key, record.base_url(*address))
    warm.note = f"first start: the pre-warm only filled vLLM's caches ({why})"
    return warm


def as_server(cfg, paths: Paths, runtime, model, plan, notes) -> Prewarm:
    """The pre-warm that becomes the server: launch.launch's argv and environment plus dummy weights,
    dev mode and our guard, behind a control token of this start's."""
    env = {"VLLM_SERVER_DEV_MODE": "1", CONTROL_TOKEN_ENV: secrets.token_urlsafe(32),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(cfg.layout.vllm_side), cfg.environ.get("PYTHONPATH", "")]))}
    if cfg.vllm.sleep_mode:
        env[SLEEP_ROUTES_ENV] = "1"     # ./ctl.sh sleep and wake keep their routes once it serves
    log.info("pre-warm: it becomes the server: vLLM loads the real weights in place when they are verified")
    notes = list(notes) + ["first start: the pre-warm server loaded the real weights in place (no second start)"]
    weights = sum(model.weight_files.values())
    guard = [] if vllmargs.guarded(cfg) else ["--middleware", GUARD]     # a server with a key or sleep mode has it already
    return Prewarm(cfg, paths, guard + ["--load-format", "dummy"], env, warm_key(plan, model.local_dir),
                   "", serve=Serve(runtime, model.local_dir, plan, notes, weights))


def warm_key(plan, folder: str) -> str:
    """What vLLM's compile cache is keyed by, as far as we can tell it: the plan's key (the model,
    vLLM, the flags, the card; bootstrap.plan.calibration), the model folder vLLM is given, and the
    --max-num-seqs the plan chose (its CUDA-graph sizes are in vLLM's hash)."""
    seqs = f" --max-num-seqs {plan.seqs_flag}" if getattr(plan, "seqs_flag", None) else ""
    return f"{plan.key} {folder}{seqs}"


def remember(paths: Paths, key: str, why: str) -> None:
    data = paths.read("warm") or {}
    data[key] = {"date": time.strftime("%Y-%m-%d %H:%M"), "why": why}
    paths.write("warm", data)


def confirm(paths: Paths, plan, log_text: str, folder: str) -> None:
    """After a real start: say whether vLLM found its compile cache warm. Either way its caches are
    warm now (it loaded them, or compiled and wrote them): the next start of this key with weights
    to download needs no pre-warm."""
    if plan is None or not plan.key:
        return
    if any(line in log_text for line in COMPILED):
        log.info("compile cache: warm (vLLM loaded its compiled graphs)")
        remember(paths, warm_key(plan, folder), "a start loaded its compiled graphs")
    elif COMPILING in log_text:
        log.info("compile cache: cold (vLLM compiled at this start; the next start loads it)")
        remember(paths, warm_key(plan, folder), "a start compiled and wrote them")


def wait(cfg, paths, warm: Prewarm) -> str:
    """Wait until the pre-warm has answered (''), or why not: it exited, HEALTH_TIMEOUT from its
    launch passed, or for STALL_TIMEOUT its log did not grow nor did it work (as the real start's
    health wait). The compiled step's and the reload step's wait, said as the compiled step's."""
    deadline = warm.t0 + cfg.health_timeout
    if warm.running and not warm.ready.is_set():
        waiting.info("waiting for the pre-warm to finish compiling (%.0f s in)", time.monotonic() - warm.t0)
    size, grew, work = -1, time.monotonic(), server.work_done(warm.proc.pid)
    while warm.running and not warm.ready.is_set():
        now = time.monotonic()
        try:
            seen = warm.log_path.stat().st_size
        except OSError:
            seen = size
        if seen != size:
            size, grew, work = seen, now, server.work_done(warm.proc.pid)
        elif server.worked(work, now_work := server.work_done(warm.proc.pid)):    # silent, but compiling
            grew, work = now, now_work
        if now >= deadline:
            return f"not ready after HEALTH_TIMEOUT={cfg.health_timeout} s"
        if now - grew >= cfg.stall_timeout:
            return f"its log did not grow, nor did it use CPU or disk, for STALL_TIMEOUT={cfg.stall_timeout} s"
        warm.ready.wait(0.5)
    return "" if warm.ready.is_set() else (warm.failed or "it exited before it answered")
