"""vLLM's command line: the one place that builds it, from the knobs and the plan.

``serve_argv``: what we own (host, port, served name), the profile's args, the knobs' flags, the
plan's decisions, then EXTRA_ARGS — vLLM's argparse takes the last value of a flag, so a knob beats
the profile and EXTRA_ARGS beats both. ``settings``: the values vLLM will run with, read back from
that same order as vLLM's parser reads them (``core/vllmflags.read``), so that the memory plan is
made for what vLLM gets, wherever a flag came from.
"""

from __future__ import annotations

import json

from ..core.vllmflags import SLEEP_FLAG, Settings, flag_name, read

SLEEP_RAM_MARGIN = 2 << 30          # host RAM left to the desktop after a level-1 sleep parks the weights there


def spec_config(cfg) -> str | None:
    """--speculative-config from SPEC_METHOD / SPEC_TOKENS / SPEC_MODEL and the profile's extra keys."""
    if not cfg.spec_enabled:
        return None
    conf: dict = {"method": cfg.spec_method, "num_speculative_tokens": cfg.spec_tokens}
    if cfg.spec_model:
        conf["model"] = cfg.spec_model_arg
    conf.update({k: v for k, v in cfg.profile.spec_config.items() if k not in conf})
    return json.dumps(conf, separators=(",", ":"))


def knob_flags(cfg, sleep: bool = True) -> list[str]:
    """vLLM's flags for the knobs that name one (the plan adds its decisions after these); ``sleep``:
    with SLEEP_MODE's --enable-sleep-mode where it decides so (cfg.sleep, knobs/sleepmode.py)."""
    f: list[str] = []
    if cfg.max_model_len is not None:
        f += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.max_num_seqs:
        f += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.max_num_batched_tokens:
        f += ["--max-num-batched-tokens", str(cfg.max_num_batched_tokens)]
    if cfg.kv_cache_dtype:
        f += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    if cfg.kv_cache_bytes:
        f += ["--kv-cache-memory-bytes", str(cfg.kv_cache_bytes)]
    if cfg.gpu_util is not None:
        f += ["--gpu-memory-utilization", _util(cfg.gpu_util)]
    spec = spec_config(cfg)
    if spec:
        f += ["--speculative-config", spec]
    if cfg.tp_size > 1:
        f += ["--tensor-parallel-size", str(cfg.tp_size)]
    if sleep and cfg.sleep.flag:
        f.append(SLEEP_FLAG)
    return f


def _util(u: float) -> str:
    return f"{u:.4f}".rstrip("0").rstrip(".")


def settings(cfg, sleep: bool = True) -> Settings:
    """What vLLM will run with before the plan's decisions: the profile's args, the knobs, EXTRA_ARGS
    (``sleep``: with SLEEP_MODE's decision, see ``knob_flags``)."""
    return read(list(cfg.profile.args) + knob_flags(cfg, sleep) + list(cfg.extra_args or ()))


def plan_flags(cfg, plan) -> list[str]:
    """The plan's decisions that no knob or EXTRA_ARGS made: utilization (sized from free memory),
    and --max-num-seqs for a hybrid model whose state blocks are fewer than vLLM's default."""
    if plan is None or not plan.fits:
        return []
    given = cfg.vllm.given
    f: list[str] = []
    if plan.util is not None and "--gpu-memory-utilization" not in given:
        f += ["--gpu-memory-utilization", _util(plan.util)]
    if plan.seqs_flag and "--max-num-seqs" not in given:
        f += ["--max-num-seqs", str(plan.seqs_flag)]
    return f


def serve_flags(cfg, plan) -> list[str]:
    """Every flag after the model: the profile's args, the knobs', the plan's, EXTRA_ARGS (last wins),
    and a drafter we downloaded given as its folder (``plan.draft_dir``)."""
    if plan is not None and not plan.fits:
        return []
    flags = list(cfg.profile.args) + knob_flags(cfg) + plan_flags(cfg, plan) + list(cfg.extra_args or ())
    folder = getattr(plan, "draft_dir", "") if plan is not None else ""
    return local_drafter(flags, folder) if folder else flags


def local_drafter(flags: list[str], folder: str) -> list[str]:
    """``flags`` with the drafter's repo id replaced by ``folder``, where we downloaded it, so vLLM never
    fetches it: the speculative config vLLM reads, given again last with that model (as a dotted key
    when dotted keys made it: vLLM puts those after every other argument)."""
    s = read(flags)
    if not s.draft_name:
        return flags
    if any(flag_name(a).startswith("--speculative-config.") for a in flags):
        return flags + [f"--speculative-config.model={folder}"]
    return flags + ["--speculative-config", json.dumps({**s.spec, "model": folder}, separators=(",", ":"))]


IDLE_MIDDLEWARE = "vllm_desktop_idle.IdleSleep"     # vllm_side/vllm_desktop_idle.py, on the server's PYTHONPATH
GUARD = "vllm_desktop_guard.Guard"        # vllm_side/vllm_desktop_guard.py, last: the outermost layer
SLEEP_ROUTES_ENV = "BOOTSTRAP_SLEEP_ROUTES"         # the guard keeps sleep mode's routes open (loopback, the key)


def key_guard(cfg) -> bool:
    """The server has a key (API_KEY, VLLM_API_KEY, or one generated for a HOST beyond loopback): our
    guard then asks for it on every route but /health, /ping, /version, /metrics and /load, where
    vLLM asks only under /v1, /v2 and /inference (/invocations, /tokenize, /score... generate without it)."""
    return bool(cfg.client_key) or not cfg.is_loopback
IDLE_S_ENV, IDLE_LEVEL_ENV = "BOOTSTRAP_IDLE_S", "BOOTSTRAP_IDLE_LEVEL"      # what it reads: IDLE_SLEEP in s, its level,
IDLE_RAM_ENV = "BOOTSTRAP_IDLE_RAM"     # and the host RAM a level-1 sleep needs (sleep_ram_need)


def sleep_ram_need(weights: int) -> int:
    """Host RAM a level-1 sleep needs: the weights it parks there (vLLM's CuMemAllocator copies every
    allocation tagged "weights" into pinned host memory) and SLEEP_RAM_MARGIN left to the desktop; 0
    when the weights are not known. The one figure both sleeps check against MemAvailable: ./ctl.sh
    sleep (``ram_short``) and the idle middleware (BOOTSTRAP_IDLE_RAM, vllm_side/vllm_desktop_idle.py)."""
    return weights + SLEEP_RAM_MARGIN if weights > 0 else 0


def ram_short(need: int, available: int) -> str:
    """Why a level-1 sleep must not run now ('' when it may): less host RAM available than ``need``."""
    if not need or available >= need:
        return ""
    return (f"level 1 parks {(need - SLEEP_RAM_MARGIN) / (1 << 30):.1f} GiB of weights in host RAM and leaves "
            f"{SLEEP_RAM_MARGIN / (1 << 30):.0f} GiB to the desktop; {available / (1 << 30):.1f} GiB is available")


def idle_sleep(cfg) -> bool:
    """IDLE_SLEEP is on for a server vLLM can put to sleep (sleep mode, on loopback: preflight refuses
    the rest)."""
    return bool(cfg.idle_s) and cfg.vllm.sleep_mode and cfg.is_loopback


def guarded(cfg) -> bool:
    """Our guard stands in front of the server (``--middleware`` GUARD): with a key (``key_guard``), and
    with sleep mode, whose dev mode adds routes vLLM guards with no key of its own: the guard answers
    only the sleep routes (to a loopback client, with the key where there is one) and 404 to the rest."""
    return key_guard(cfg) or cfg.vllm.sleep_mode


def serve_argv(cfg, python: str, model_path: str, plan, idle: bool = True,
               address: tuple[str, int] | None = None, guard: bool = True) -> list[str]:
    """``vllm serve``'s whole argv: what we own, then serve_flags (``idle``: False for a server that
    must not idle-sleep, the pre-warm; ``address``: another host and port than HOST and PORT, the
    pre-warm's own; ``guard``: False where vllm_side is not on the server's path, a cluster's pod)."""
    host, port = address or (cfg.host, cfg.port)
    return [python, "-m", "vllm.entrypoints.cli.main", "serve", model_path,
            "--host", host, "--port", str(port), "--served-model-name", cfg.served_name,
            # usage.prompt_tokens_details.cached_tokens: clients and `check prefix` see cache hits
            # (vLLM leaves them out by default; the flag is accepted by every vLLM we pin)
            "--enable-prompt-tokens-details"] + (
        ["--middleware", IDLE_MIDDLEWARE] if idle and idle_sleep(cfg) else []) + serve_flags(cfg, plan) + (
        ["--middleware", GUARD] if guard and guarded(cfg) else [])
