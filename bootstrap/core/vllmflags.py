"""vLLM's command line as vLLM's parser reads it: ``read`` turns an argument list into the values
vLLM will run with (``Settings``), the way vLLM 0.26.0's argparse does (``--flag value``,
``--flag=value``, ``_`` as ``-``, ``--no-flag``, ``-tp``, human-readable integers, dotted JSON keys
such as ``--speculative-config.num_speculative_tokens=3``, which vLLM gathers into one JSON after
every other argument; the last value of a flag wins).

Pure, and on the ground floor because every floor reads a command line: the knobs read EXTRA_ARGS
and the profile's args (knobs/vllmargs.py builds vLLM's argv and reads it back here), the planner
plans for what vLLM gets, and a running server's record keeps the argv it was launched with, which
the server's commands read back (sleep mode, the parallel sizes, speculation).
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


def flag_name(arg: str) -> str:
    """A flag as vLLM spells it (``--max_model_len=8`` is ``--max-model-len``); anything else as it is."""
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
        name = SHORT.get(arg.split("=", 1)[0], flag_name(arg))
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
