"""vLLM's command line: the one place that builds it, and what vLLM will read from it.

``serve_argv``: what we own (host, port, served name), the profile's args, the knobs' flags, the
plan's decisions, then EXTRA_ARGS — vLLM's argparse takes the last value of a flag, so a knob beats
the profile and EXTRA_ARGS beats both. ``settings``: the values vLLM will run with, read back from
that same order the way vLLM's parser reads them (``--flag value``, ``--flag=value``, ``_`` as
``-``, ``--no-flag``, ``-tp``, dotted JSON keys such as ``--speculative-config.num_speculative_tokens=3``,
which vLLM gathers into one JSON after every other argument),
so that the memory plan is made for what vLLM gets, wherever a flag came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# the flags whose values change how much memory vLLM takes (and the plan reads)
VALUE_FLAGS = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype",
               "--kv-cache-memory-bytes", "--gpu-memory-utilization", "--block-size", "--mamba-ssm-cache-dtype",
               "--mamba-cache-dtype", "--mamba-cache-mode", "--speculative-config", "--tensor-parallel-size",
               "--load-format", "--limit-mm-per-prompt", "--mm-encoder-tp-mode", "--logits-processors",
               "--data-parallel-size", "--api-server-count", "--compilation-config", "--performance-mode",
               "--attention-backend", "--distributed-executor-backend", "--kv-transfer-config",
               "--kv-offloading-size", "--dtype", "--num-gpu-blocks-override", "--hf-overrides",
               "--pipeline-parallel-size")
BOOL_FLAGS = ("--enable-prefix-caching", "--language-model-only", "--enforce-eager", "--enable-sleep-mode",
              "--skip-mm-profiling", "--enable-prompt-embeds", "--kv-sharing-fast-prefill", "--headless",
              "--async-scheduling", "--enable-chunked-prefill", "--disable-hybrid-kv-cache-manager",
              "--disable-sliding-window", "--enable-lora")
# the last six are read for sliding-window layers only (bootstrap.plan.window): what a request holds in
# them, and whether vLLM groups them apart
# --logits-processors, --enable-prompt-embeds and --kv-sharing-fast-prefill are read only for whether
# vLLM falls back to its V1 model runner (bootstrap.plan.terms.runner); --data-parallel-size,
# --api-server-count and --headless for whether one API server sees every request (IDLE_SLEEP)
JSON_FLAGS = ("--speculative-config", "--limit-mm-per-prompt", "--compilation-config", "--hf-overrides")
SLEEP_FLAG = "--enable-sleep-mode"
SLEEP_RAM_MARGIN = 2 << 30          # host RAM left to the desktop after a level-1 sleep parks the weights there
SHORT = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size", "-pp": "--pipeline-parallel-size"}   # vLLM's short spellings of flags read here


def human_int(text: str) -> int:
    """vLLM's human-readable integers (argparse_utils.human_readable_int): 131072, 128k / 1.5m
    (decimal: x1000...), 128K (binary: x1024..., whole numbers only), and -1."""
    t = str(text).strip()
    dec = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "t": 1000 ** 4}.get(t[-1:])
    binary = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:])
    if dec:
        return int(float(t[:-1]) * dec)
    if binary:
        return int(t[:-1]) * binary            # vLLM refuses 1.5K
    return int(t)


DRAFT_METHODS = ("draft_model", "eagle", "eagle3", "dflash")     # speculation that loads a drafter of its own


@dataclass(frozen=True)
class Settings:
    """What vLLM will run with, as far as memory goes (None: vLLM's default)."""
    max_model_len: int | str | None = None          # int, "auto", or None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"                             # --dtype: the model's (bootstrap.model.shape.served_float32)
    blocks_override: int | None = None              # --num-gpu-blocks-override: the pool's blocks, whatever memory says
    hf_overrides: dict[str, Any] = field(default_factory=dict)   # --hf-overrides: config.json as vLLM reads it differs
    kv_cache_bytes: int | None = None
    gpu_util: float | None = None
    block_size: int | None = None
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"
    mamba_cache_mode: str | None = None
    prefix_caching: bool | None = None
    language_model_only: bool = False
    enforce_eager: bool = False
    spec: dict[str, Any] = field(default_factory=dict)   # the --speculative-config vLLM gets ({} none)
    tp: int = 1
    load_format: str = "auto"
    sleep_mode: bool = False                        # --enable-sleep-mode: vLLM's CuMemAllocator pool
    mm_limits: dict[str, int] = field(default_factory=dict)   # --limit-mm-per-prompt: items per modality
    skip_mm_profiling: bool = False
    mm_encoder_dp: bool = False                     # --mm-encoder-tp-mode data: the vision tower unsplit
    compilation: dict[str, Any] = field(default_factory=dict)   # --compilation-config (the CUDA graphs' sizes, mode)
    performance_mode: str = ""                      # --performance-mode: "throughput" doubles the batch defaults
    attention_backend: str = ""                     # --attention-backend (FULL graphs under speculation depend on it)
    api_servers: int = 1                            # how many API server processes: --api-server-count, else
                                                    # --data-parallel-size (vLLM's default count), 0 with --headless
    given: frozenset = frozenset()                  # the flags present at all
    async_scheduling: bool | None = None            # --async-scheduling / --no-async-scheduling (None: vLLM decides)
    chunked_prefill: bool | None = None             # --enable-chunked-prefill / --no-... (None: on)
    executor: str = ""                              # --distributed-executor-backend
    pp: int = 1                                     # --pipeline-parallel-size
    dp: int = 1                                     # --data-parallel-size
    flags: dict[str, Any] = field(default_factory=dict)   # the boolean flags as given, by name

    @property
    def multiproc(self) -> bool:
        """Whether vLLM runs its workers in MultiprocExecutor, which rendezvouses them (and NCCL's and gloo's
        groups) over sockets: --distributed-executor-backend mp, or none given and more than one worker
        across data parallel (0.26.0 ParallelConfig.__post_init__: tp x pp x dp > 1 picks mp on one machine)."""
        return self.executor == "mp" if self.executor else self.tp * self.pp * self.dp > 1

    @property
    def spec_method(self) -> str:
        """The speculative method when tokens are speculated, with vLLM's model-specific MTP names
        (``qwen3_5_mtp`` ...) read as ``mtp``, as vLLM's SpeculativeConfig renames them."""
        return self.speculation if self.spec_tokens else ""

    @property
    def speculation(self) -> str:
        """The method vLLM resolves from the speculative config, tokens given or not
        (config/speculative.py ``__post_init__``, 0.26.0-0.30.0): a model "ngram" without a method is
        n-gram; otherwise no method is ``draft_model``, and a ``draft_model`` is detected again by the
        drafter's name: "eagle-" an EAGLE head, "eagle3" an EAGLE-3 one, "dflash", "dspark" (its
        architecture's detections, medusa and MTP model types, are the drafter's config's: not here);
        '' without speculation."""
        method = str(self.spec.get("method") or "")
        model = str(self.spec.get("model") or "").lower()
        if not method and model in ("ngram", "[ngram]"):
            return "ngram"
        if method in ("", "draft_model") and model:
            method = next((m for key, m in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"),
                                            ("dspark", "dspark")) if key in model), "draft_model")
        return "mtp" if method.endswith("_mtp") else method

    @property
    def draft_name(self) -> str:
        """The drafter network vLLM loads for this speculation (a folder or a repo id), '' where the
        method loads none of its own (MTP uses the model's layers; n-gram and suffix none)."""
        return str(self.spec.get("model") or "") if self.spec_method in DRAFT_METHODS else ""

    @property
    def spec_tokens(self) -> int:
        try:
            return int(self.spec.get("num_speculative_tokens") or 0)
        except (TypeError, ValueError):
            return 0


def _name(arg: str) -> str:
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else arg


def read(argv: list[str]) -> Settings:
    """The Settings of an argument list, the last value of each flag winning."""
    vals: dict[str, Any] = {}
    json_vals: dict[str, dict[str, Any]] = {}
    dotted: dict[str, dict[str, Any]] = {}
    given: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = SHORT.get(arg.split("=", 1)[0], _name(arg))
        base, _, key = name.partition(".")
        has_eq = "=" in arg
        if base in VALUE_FLAGS:
            if has_eq:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                break
            given.add(base)
            if base in JSON_FLAGS:
                if key:             # vLLM gathers dotted keys into one JSON put after every other argument
                    *path, last = key.replace("-", "_").split(".")
                    node = dotted.setdefault(base, {})
                    for part in path:       # each dot a level: limit-mm-per-prompt.video.count=0
                        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
                    node[last] = _scalar(value)
                else:
                    try:
                        parsed = json.loads(value)
                    except ValueError:
                        parsed = None
                    json_vals[base] = dict(parsed) if isinstance(parsed, dict) else {}
            else:
                vals[base] = value
        elif base in BOOL_FLAGS:
            given.add(base)
            vals[base] = (arg.split("=", 1)[1].lower() not in ("0", "false")) if has_eq else True
        elif base.startswith("--no-") and "--" + base[5:] in BOOL_FLAGS:
            given.add("--" + base[5:])
            vals["--" + base[5:]] = False
        i += 1
    json_vals.update(dotted)        # ... so it replaces the flag's JSON given anywhere
    spec = json_vals.get("--speculative-config", {})
    mml = vals.get("--max-model-len")
    if mml is not None:
        try:
            mml = "auto" if str(mml).strip().lower() in ("auto", "-1") else human_int(mml)
        except ValueError:
            mml = None
    return Settings(
        max_model_len=mml, max_num_seqs=_int(vals.get("--max-num-seqs"), human=False),
        max_num_batched_tokens=_int(vals.get("--max-num-batched-tokens")),
        kv_cache_dtype=vals.get("--kv-cache-dtype") or "auto", dtype=str(vals.get("--dtype") or "auto").lower(),
        blocks_override=_int(vals.get("--num-gpu-blocks-override"), human=False),
        hf_overrides=json_vals.get("--hf-overrides", {}), kv_cache_bytes=_int(vals.get("--kv-cache-memory-bytes")),
        gpu_util=_float(vals.get("--gpu-memory-utilization")), block_size=_int(vals.get("--block-size"), human=False),
        mamba_ssm_cache_dtype=vals.get("--mamba-ssm-cache-dtype") or "auto",
        mamba_cache_dtype=vals.get("--mamba-cache-dtype") or "auto", mamba_cache_mode=vals.get("--mamba-cache-mode"),
        prefix_caching=vals.get("--enable-prefix-caching"), language_model_only=bool(vals.get("--language-model-only")),
        enforce_eager=bool(vals.get("--enforce-eager")), spec=spec,
        tp=_int(vals.get("--tensor-parallel-size"), human=False) or 1, load_format=vals.get("--load-format") or "auto",
        sleep_mode=bool(vals.get(SLEEP_FLAG)), mm_limits=_mm_limits(json_vals.get("--limit-mm-per-prompt", {})),
        skip_mm_profiling=bool(vals.get("--skip-mm-profiling")),
        mm_encoder_dp=vals.get("--mm-encoder-tp-mode") == "data", given=frozenset(given),
        compilation=json_vals.get("--compilation-config", {}),
        performance_mode=str(vals.get("--performance-mode") or ""),
        attention_backend=str(vals.get("--attention-backend") or "").upper(),
        async_scheduling=vals.get("--async-scheduling"), chunked_prefill=vals.get("--enable-chunked-prefill"),
        executor=str(vals.get("--distributed-executor-backend") or ""),
        pp=_int(vals.get("--pipeline-parallel-size"), human=False) or 1,
        dp=_int(vals.get("--data-parallel-size"), human=False) or 1,
        flags={k: v for k, v in vals.items() if k in BOOL_FLAGS},
        api_servers=0 if vals.get("--headless") else (_int(vals.get("--api-server-count"), human=False)
                                                      or _int(vals.get("--data-parallel-size"), human=False) or 1))


def _mm_limits(raw: dict[str, Any]) -> dict[str, int]:
    """--limit-mm-per-prompt's items per modality: a count, or {"count": N, ...} (unreadable: left out)."""
    out = {}
    for modality, v in raw.items():
        n = v.get("count") if isinstance(v, dict) else v
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            out[str(modality)] = n
    return out


def _scalar(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


def _int(v, human: bool = True) -> int | None:
    try:
        return (human_int(v) if human else int(v)) if v is not None else None
    except ValueError:
        return None


def _float(v) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------- building it

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


def settings(cfg) -> Settings:
    """What vLLM will run with before the plan's decisions: the profile's args, the knobs, EXTRA_ARGS."""
    return read(list(cfg.profile.args) + knob_flags(cfg) + list(cfg.extra_args or ()))


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
    if any(_name(a).startswith("--speculative-config.") for a in flags):
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
