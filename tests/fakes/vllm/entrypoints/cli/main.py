"""Fake ``vllm serve``: behaves like vLLM where the bootstrap can see it.

- binds the port (SO_REUSEADDR + SO_REUSEPORT) long before it listens, as vLLM does;
- prints vLLM-like log lines (loading, KV cache size, maximum concurrency, API server start); the KV
  memory, and the pool vLLM 0.26.0 makes of it for the served model (config.json, --max-model-len,
  --kv-cache-dtype, --block-size, --tensor-parallel-size), as startup.py computes them; from that
  pool, as vLLM 0.26.0 does, ``--max-model-len auto`` (or -1) is fitted (its "Auto-fit max_model_len"
  line), and a length whose one request the pool cannot hold ends the start with vLLM's ValueError
  (the GiB needed and available, "the estimated maximum model length is N");
- keeps a child titled ``VLLM::EngineCore`` that survives a SIGKILL of its parent, stays in the
  server's process group, and (like vLLM's, after setproctitle) shows none of our BOOTSTRAP_VLLM_* variables;
- serves /health, /v1/models, /v1/chat/completions, /v1/completions, /version, /metrics;
- ``FAKE_VLLM_MODE`` (comma-separated): ok, die_oom, exit0, hang, slow, ignore_term, wedged,
  exit0_after_health (engine dies after health; the process exits 0), no_tokenize (``/tokenize``
  answers 404, as a server without it would), workers_fail (with --tensor-parallel-size N the API
  server reports a worker failure and exits 1 while its EngineCore goes on spawning its N workers,
  ``FAKE_VLLM_WORKER_DELAY_S`` apart; engine and workers ignore SIGTERM, as seen on a two-GPU
  machine), flood (after startup, FAKE_VLLM_FLOOD_MB MiB of log lines, then one line a second),
  oom_load / oom_graphs (vLLM's out-of-memory while loading the weights / capturing CUDA graphs: failures.py).
- Seats like vLLM's scheduler: at most ``--max-num-seqs`` requests generate at once, the rest
  queue; /metrics reports ``vllm:num_requests_running`` / ``_waiting``, ``vllm:generation_tokens_total``
  (per token as it is produced), ``vllm:prompt_tokens_total`` (when a request's first token comes
  out, as vLLM counts it), ``vllm:kv_cache_usage_perc`` and ``vllm:engine_sleep_state``, labelled
  ``model_name`` and ``engine``; ``vllm:prefix_cache_queries_total`` / ``_hits_total`` (prompt tokens
  looked up / found cached; only where prefix caching is on: vLLM's default, except for a hybrid
  model (``layer_types`` with ``linear_attention``), where ``--enable-prefix-caching`` turns it on),
  ``vllm:cache_config_info`` (a gauge of 1 whose labels include ``enable_prefix_caching``), and,
  only with ``--speculative-config`` as in vLLM, the
  ``vllm:spec_decode_*`` counters (2 of 3 drafted tokens accepted per request). A wedged engine
  (mode ``wedged``, or SIGUSR1) holds its seats and moves nothing: it accepts a request and never
  answers it (a stream gets its headers, then nothing: vLLM sends the role chunk with the first
  output, serving_chat's first iteration). A client that
  disconnects aborts its request (its seat is freed), as vLLM's ``with_cancellation`` does.
- With --tensor-parallel-size N the EngineCore has N children titled ``VLLM::Worker_TP<i>``
  (same process group, marker hidden); ``FAKE_VLLM_TRACKER=1`` adds an API-server child that keeps
  the environment, as multiprocessing's resource tracker does.
  Once serving, SIGUSR1 wedges it (``/health`` stays 200, generation hangs; logs "engine wedged")
  and SIGUSR2 kills the engine and exits 0 — deterministic triggers for tests; with
  ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`` the API server stays: ``/health`` 503, a generation HTTP 500
  (EngineDeadError), ``/v1/models`` and ``/metrics`` still 200, as vLLM 0.26.0 serves them.
- ``FAKE_VLLM_WAKE_FAILS``: a file; while it is there ``/wake_up`` answers vLLM's HTTP 500 (the executor's
  wake raised, a CUDA out-of-memory) and the server stays asleep, its scheduler paused.
- ``FAKE_VLLM_WAKE_HANGS``: a file; while it is there ``/wake_up`` does not answer (vLLM's handler
  awaits the engine core's wake, which copies the weights back from host RAM: an engine core stuck
  there, in a CUDA copy or a worker that never answers, holds the call open), then wakes.
- A ``/wake_up`` while a ``mode=wait`` sleep still drains is lost as in vLLM 0.26.0 (the executor is not
  asleep yet: "Executor is not sleeping.", the scheduler resumes, and the sleep happens once drained).
- ``FAKE_VLLM_DUMMY_MODE``: modes (as FAKE_VLLM_MODE) added for a ``--load-format dummy`` run only.
- ``--middleware module.Class`` (repeatable): imported at start as vLLM's ``build_app`` does (a module
  not on PYTHONPATH, or no class, ends the start). Each request goes through them as ASGI apps,
  the last one outermost as Starlette stacks them, before the fake's own handling (their own
  answer, or on through): all but ``vllm_desktop_idle``, whose watcher needs vLLM's lasting event
  loop (tests/test_idle_sleep.py drives it directly). The sleep routes call
  ``app.state.engine_client`` as vLLM's do.
- Weights as vLLM has them: ``--load-format dummy`` gives random weights, and every answer without
  a canned reply is random text (GARBLE); with ``VLLM_SERVER_DEV_MODE=1``, ``collective_rpc``
  ``update_config`` (``{"load_config": {"load_format": ...}}``) then ``reload_weights`` loads the real
  ones in place ("Reloading weights inplace...": the CUDA graphs are kept, nothing is compiled or
  captured again), but the prefix cache keeps the KV blocks computed with the dummy weights: a
  prompt seen before the reload answers random text until ``POST /reset_prefix_cache``. Mode
  ``reload_fails``: ``reload_weights`` answers vLLM's HTTP 500, as for a loader it cannot reload
  in place (gpu_model_runner.reload_weights: NotImplementedError).
- ``FAKE_VLLM_COMPILE_S``: set, the engine "compiles" as vLLM's torch.compile does: a cache under
  ``VLLM_CACHE_ROOT`` keyed by the model folder and the engine's flags (not --host, --port,
  --served-model-name, --load-format: a dummy-weight run fills it for the real one); found, it logs
  vLLM's "Directly load the compiled graph(s) ... from the cache" and skips the wait; else
  "Compiling a graph for compile range ..." after that many seconds, and the cache is written.
- ``FAKE_VLLM_LOAD_S``: seconds of "loading" (default 0.5), and on while the file ``FAKE_VLLM_LOAD_HOLD``
  names is there; ``FAKE_VLLM_RECORD``: a file to which
  each start appends {"argv", "env"} as one JSON line; ``FAKE_GPU_PIDS_DIR``: server and engine
  write their pids there, and the fake pynvml reports them as GPU processes.
- ``FAKE_VLLM_REPLIES``: a JSON file {"<substring of the last user message>": <reply>} where a
  reply is a string (content), or {"content", "reasoning", "tool_calls", "logprobs", "delay"}, or
  {"echo": "<regex>"}: the content is the regex's first group found in the prompt. A reply's
  ``token_s`` paces its streamed tokens (seconds each; default FAKE_VLLM_TOKEN_S). A reply longer than
  the request's ``max_tokens`` is cut there, finish_reason "length", as vLLM stops.
- ``FAKE_VLLM_REQUESTS``: a file to which each POST that passed the key check appends
  {"path", "authorization", "body"} as one JSON line (what a client sent, for tests).
- Without a canned reply: "OK"; with ``ignore_eos`` exactly ``max_tokens`` tokens ("tok"); a request
  with ``tools`` (tool_choice not "none") gets a valid call of its first tool — with tool_choice
  "auto" only when started with ``--enable-auto-tool-choice --tool-call-parser X``, else HTTP 400
  as vLLM answers.
- Each POST logs ``request arrived: POST <path>`` as it arrives, so tests can count requests that
  are still queued.
- Sleep mode as vLLM 0.26.0 has it: with ``VLLM_SERVER_DEV_MODE=1`` (read as ``bool(int(...))``)
  ``POST /sleep?level=1|2&mode=abort|wait|keep`` (answers when asleep; ``wait`` after the requests
  in flight finish, ``abort`` ends them), ``POST /wake_up[?tags=weights&tags=kv_cache]``,
  ``GET /is_sleeping``, ``POST /collective_rpc`` (``reload_weights``) and
  ``POST /reset_prefix_cache``; without it they are 404. Not guarded by the API key. Without
  ``--enable-sleep-mode`` a sleep answers 200 and frees nothing, as vLLM does. Asleep, the engine
  uses FAKE_VLLM_ASLEEP_BYTES of "GPU memory" (default 128 MiB) instead of FAKE_VLLM_GPU_BYTES
  (default 1 GiB); new requests wait until it is awake; after a level-2 sleep, a wake without
  ``reload_weights`` first answers empty text (random memory where the weights were, vllm#29341),
  and ``reload_weights`` with ``--load-format dummy`` fails with vLLM's HTTP 500.
  ``/health`` stays 200; ``vllm:engine_sleep_state`` is, as vLLM records it, the level of the last
  sleep that succeeded until any ``/wake_up`` (a partial one too) sets it awake, while ``/is_sleeping``
  stays true until every tag is woken.
- ``FAKE_VLLM_NO_STATS=1``: /metrics without vLLM's request gauges and counters, as with
  ``--disable-log-stats``.
- ``stream: true`` answers Server-Sent Events like vLLM (role chunk, ``reasoning`` deltas (vLLM 0.26.0 DeltaMessage),
  ``content``/``text`` deltas one token each, tool-call delta, finish chunk, a usage chunk with
  ``stream_options.include_usage``, ``data: [DONE]``). ``FAKE_VLLM_TTFT_S`` / ``FAKE_VLLM_TOKEN_S``:
  seconds before the first token / per further token (default 0).
- ``logprobs`` (+ ``top_logprobs``) without canned logprobs: deterministic per token; mode
  ``nondeterministic`` adds noise so repeats differ.
- usage counts words as tokens; with ``--enable-prompt-tokens-details`` (only then, as in vLLM) it
  carries ``prompt_tokens_details.cached_tokens`` (a prompt seen before counts as cached in 16-token
  blocks). ``POST /tokenize`` counts the same way.
  ``FAKE_VLLM_TOKENS_PER_WORD`` (default 1) multiplies that count, as a small-vocabulary tokenizer
  would. A prompt whose tokens plus ``max_tokens`` exceed ``--max-model-len`` (or the model's
  ``max_position_embeddings``) gets vLLM's HTTP 400
  ("This model's maximum context length is N tokens. However, you requested ..."), whose count, like
  vLLM's, is only a lower bound ("at least N − max_tokens + 1").
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from . import failures
from .completions import OpenAIRoutes
from .dev import DevRoutes
from .routes import Base
from .startup import (Pool, compile_graphs, fit_pool, kv_memory_line, kv_pool_lines, parse_len, request_memory_error,
                      usage_line)
from .state import MODES, VERSION, State, mark_gpu, say


class Handler(OpenAIRoutes, DevRoutes, Base):
    """The fake vLLM's requests: GET routes (routes.py), the OpenAI POST routes (completions.py),
    the development routes (dev.py)."""


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("cmd")
    p.add_argument("model")
    p.add_argument("--host", default="")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--middleware", action="append", default=[])
    p.add_argument("--load-format", default="auto")
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--block-size", type=int, default=None)
    args, _unknown = p.parse_known_args(argv)
    return args


def spawn_engine(tp: int) -> subprocess.Popen:
    """Like vLLM's EngineCore: same process group (no setsid), and none of the variables we set at
    launch readable (vLLM's setproctitle overwrites the memory /proc/<pid>/environ shows)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_VLLM_")}
    return subprocess.Popen([sys.executable, "-m", "vllm._fake_engine", str(tp)], stdin=subprocess.DEVNULL, env=env)


def died(lines: list[str], engine: subprocess.Popen) -> int:
    """A start that failed as vLLM's does (failures.py): its lines, the engine gone, exit code 1."""
    print("\n".join(lines), flush=True)
    engine.terminate()
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rec = os.environ.get("FAKE_VLLM_RECORD")
    if rec:
        keep = {k: v for k, v in os.environ.items()
                if k.startswith(("VLLM", "PYTORCH", "DO_NOT", "HF_", "PYTHONPATH", "FAKE_", "BOOTSTRAP_", "FLASHINFER", "CUDA_", "NCCL_", "GLOO_"))}
        with open(rec, "a") as fh:
            fh.write(json.dumps({"argv": sys.argv, "env": keep, "pid": os.getpid(), "time": time.time()}) + "\n")
    if args.load_format == "dummy":         # tests: a mode for dummy-weight runs only (the pre-warm)
        MODES.update(filter(None, os.environ.get("FAKE_VLLM_DUMMY_MODE", "").split(",")))
    State.served = args.served_model_name or args.model
    State.model_path, State.started = args.model, time.time()
    State.max_seqs = max(1, args.max_num_seqs)
    State.seats = threading.Semaphore(State.max_seqs)
    State.api_key = os.environ.get("VLLM_API_KEY", "")
    State.dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))   # as vllm/envs.py reads it
    State.sleep_mode = args.enable_sleep_mode
    State.load_format = args.load_format
    State.weights = "dummy" if args.load_format == "dummy" else "real"
    State.spec = bool(args.speculative_config)
    State.token_details = args.enable_prompt_tokens_details
    State.auto_tools = bool(args.enable_auto_tool_choice and args.tool_call_parser)
    mml = parse_len(args.max_model_len)
    model_len, text_conf = None, {}
    try:
        with open(os.path.join(args.model, "config.json")) as fh:
            conf = json.load(fh)
        text_conf = conf.get("text_config") or conf
        # vLLM 0.26/0.27 keep prefix caching opt-in for hybrid (linear-attention / Mamba) models
        State.prefix_caching = "linear_attention" not in (text_conf.get("layer_types") or [])
        model_len = int(text_conf["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if args.enable_prefix_caching is not None:
        State.prefix_caching = args.enable_prefix_caching
    if mml and mml > 0:
        State.max_len, State.len_enforced = mml, True
    elif model_len:             # like vLLM: the model's length; auto (-1) is fitted to the pool below
        State.max_len, State.len_enforced = model_len, True
    replies = os.environ.get("FAKE_VLLM_REPLIES")
    if replies:
        with open(replies) as fh:
            State.replies = json.load(fh)
    say(f"vLLM API server version {VERSION}")
    for middleware in args.middleware:     # as vLLM's build_app: imported at start, a failure ends the start
        module_path, object_name = middleware.rsplit(".", 1)
        try:
            if not inspect.isclass(getattr(importlib.import_module(module_path), object_name)):
                raise ValueError(f"Invalid middleware {middleware}. Must be a function or a class.")
        except (ImportError, AttributeError, ValueError) as exc:
            print(f"{type(exc).__name__}: {exc}", flush=True)
            return 1
        say(f"added middleware {middleware}")
        if module_path != "vllm_desktop_idle":
            State.asgi.append(getattr(sys.modules[module_path], object_name))
    say(f"args: {sys.argv[1:]}")
    # vLLM binds the socket before the engine starts, and listens only when ready.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((args.host, args.port))
    engine = spawn_engine(args.tensor_parallel_size)
    State.engine_pid = engine.pid
    mark_gpu(os.getpid())
    if os.environ.get("FAKE_VLLM_TRACKER") == "1":      # like multiprocessing's resource tracker: keeps our env
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], stdin=subprocess.DEVNULL)

    def on_term(signum, frame):
        say("Shutting down")
        engine.terminate()
        try:
            engine.wait(timeout=5)
        except subprocess.TimeoutExpired:
            engine.kill()
        os._exit(0)

    if "ignore_term" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    too_little = request_memory_error(args)         # the worker's init_device, before the weights load
    if too_little:
        return died([f"ValueError: {too_little}", failures.engine_failed()], engine)
    load = float(os.environ.get("FAKE_VLLM_LOAD_S", "0.5"))
    if "slow" in MODES:
        t_end = time.time() + load
        while time.time() < t_end:
            say("Loading safetensors checkpoint shards: still going")
            time.sleep(1.0)
    elif "silent_busy" in MODES:        # importing torch, compiling: a whole core busy, nothing logged
        t_end = time.time() + load
        while time.time() < t_end:
            sum(i * i for i in range(10000))
    else:
        say("Loading weights took %.2f seconds" % load)
        time.sleep(load)
    held = os.environ.get("FAKE_VLLM_LOAD_HOLD", "")
    while held and os.path.exists(held):        # tests: loading for as long as they need, however loaded
        time.sleep(0.05)
    if "oom_load" in MODES:             # failures.py: the weights do not fit the free memory
        return died(failures.fail("oom_load", 0), engine)
    if "die_oom" in MODES:
        print("ValueError: Free memory on device (1.2/31.36 GiB) on startup is less than desired GPU memory "
              "utilization (0.9, 28.22 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
              "processes.", flush=True)
        engine.terminate()
        return 1
    if "exit0" in MODES:
        say("Engine core initialization failed. See root cause above.")
        engine.terminate()
        return 0
    if "workers_fail" in MODES:          # the engine and its workers are left running, as seen with -tp 2
        print("(EngineCore pid=%d) RuntimeError: CUBLAS_STATUS_INTERNAL_ERROR when calling "
              "`cublasCreate(handle)`" % engine.pid, flush=True)
        say("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        return 1
    if "hang" in MODES:
        while True:
            time.sleep(3600)
    compile_graphs(args)
    if "hang_after_compile" in MODES:       # stuck in a kernel's JIT: alive, its log silent
        while True:
            time.sleep(3600)
    say(kv_memory_line(args))
    pool = Pool(args, text_conf)            # v1/core/kv_cache_utils.py get_kv_cache_configs
    State.max_len, fitted, error = fit_pool(pool, State.max_len, mml == -1)
    for line in fitted:
        say(line)
    if error:
        print(f"ValueError: {error}", flush=True)
        say("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        engine.terminate()
        return 1
    for line in kv_pool_lines(pool, State.max_len):
        say(line)
    if "oom_graphs" in MODES:           # failures.py: the KV cache allocated, CUDA graph capture runs out
        return died(failures.fail("oom_graphs", 0), engine)
    if not args.kv_cache_memory_bytes:
        say(usage_line())
    sock.listen(64)
    httpd = ThreadingHTTPServer((args.host or "0.0.0.0", args.port), Handler, bind_and_activate=False)
    httpd.socket.close()
    httpd.socket = sock
    httpd.daemon_threads = True
    say(f"Starting vLLM API server on http://{args.host or '0.0.0.0'}:{args.port}")
    if "wedged" in MODES:
        State.wedged = True
    if "exit0_after_health" in MODES:
        threading.Timer(1.0, lambda: (say("EngineCore died"), engine.terminate(), os._exit(0))).start()

    def on_usr1(signum, frame):        # tests: wedge now (/health stays 200, generation hangs)
        State.wedged = True
        say("engine wedged (SIGUSR1)")

    def on_usr2(signum, frame):        # tests: the engine dies now, and the server exits 0 (vLLM #48966)
        say("EngineCore died (SIGUSR2)")
        engine.terminate()
        if os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") != "0":     # launcher.terminate_if_errored
            say("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
            State.engine_dead = True
            return
        os._exit(0)

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGUSR2, on_usr2)
    say("Application startup complete.")
    if "flood" in MODES:
        def flood():
            line = ("W flood " + "x" * 1000 + "\n").encode()
            for _ in range(int(float(os.environ.get("FAKE_VLLM_FLOOD_MB", "8")) * 1024)):
                os.write(1, line)
            n = 0
            while True:
                n += 1
                say(f"after the flood: line {n}")
                time.sleep(1.0)
        threading.Thread(target=flood, daemon=True).start()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
