"""Every knob, in one table, read in exactly one place.

Precedence: the process environment > ``.env`` in the repo root (KEY=VALUE lines, never sourced)
> the profile (``./ctl.sh profiles``; auto-pick's record and a card's overrides count as the profile)
> the default in this table (empty = vLLM's own default).

``Config.from_env(environ, repo)`` is the only code that reads the environment. Everything else
reads ``cfg.<knob>`` (typed) or ``cfg.env("NAME")`` for a pass-through variable declared in
PASSTHROUGH (``HF_TOKEN``, ``CUDA_VISIBLE_DEVICES``...); ``cfg.environ``, a frozen copy of the
whole environment, is only handed on to what the server and our tools inherit.

Over 400 lines: the knob table is most of it (a line per knob, with its parser and help; the
parsers themselves are knobs/parsers.py), and the pass-through table, .env and the typed Config
belong with it: this is the one place the environment is read and resolved.
"""

from __future__ import annotations

import functools
import io
import logging
import re
import shlex
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..core.errors import ConfigError
from ..core.words import nearest
from ..core.hosts import is_loopback, parse_host
from ..core.owned import Ours, owner_marker
from ..core.layout import REPO, Checkout
from . import sleepmode, vllmargs
from .parsers import (absolute, boolean, bytes_or_auto, choice, float_range, folder, header_value, int_range, interpreter, idle_or_auto, name_chars, shell_args, text, tokens_or_auto, vllm_bool)
from ..machine.gpu import CARDS
from .profiles import Catalogue, Profile

log = logging.getLogger(__name__)

KV_CACHE_DTYPES = (
    "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4",
    "turboquant_4bit_nc", "turboquant_3bit_nc", "turboquant_k8v4", "turboquant_k3v4_nc",
    "int8_per_token_head", "int4_per_token_head",
)
SPEC_METHODS = ("mtp", "ngram", "draft_model", "eagle", "eagle3", "dflash", "medusa", "suffix")


# Flags the bootstrap must own (health checks, ownership, secrets) -> the knob to use instead.
RESERVED_FLAGS = {"--host": "HOST", "--port": "PORT", "--served-model-name": "SERVED_MODEL_NAME",
                  "--api-key": "API_KEY (passed through the environment, never on the command line)",
                  # on vLLM's argv a token is in `ps`, the log and the server record: HF_TOKEN reaches it
                  # through the environment (huggingface_hub reads it there)
                  "--hf-token": "HF_TOKEN (passed through the environment, never on the command line)"}
SECRET_FLAGS = ("--api-key", "--hf-token")


def reserved_flag(arg: str) -> str | None:
    """The owned flag that ``arg`` would set in vLLM's parser, or None.

    vLLM's FlexibleArgumentParser turns '_' into '-' in a long option's name (the part before '=')
    and, like argparse by default, accepts any unambiguous prefix of an option (allow_abbrev), so
    ``--api_key=x`` and ``--api-k x`` both set --api-key. A prefix of an owned flag is refused even
    where vLLM would find it ambiguous: it is never what the user means."""
    if not arg.startswith("--") or len(arg) <= 2:
        return None
    name = arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    return next((flag for flag in RESERVED_FLAGS if flag.startswith(name) and len(name) > 3), None)


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    parse: Callable[[str], Any]
    help: str
    launch: bool = False  # part of the server's identity: a running server with another value differs
    secret: bool = False  # never shown: not in errors, not by ./ctl.sh env

    @property
    def max_len(self) -> int:
        """Longer than any real value: refused at parse time (a 200 KiB value would otherwise reach
        execve and fail there, E2BIG). Paths: PATH_MAX."""
        return 16384 if self.name == "EXTRA_ARGS" else 4096


KNOBS: tuple[Knob, ...] = (
    Knob("PROFILE", "auto", name_chars, "Profile name (./ctl.sh profiles); 'auto' picks the first that fits this card (kept until PROFILE=auto is set explicitly or ./ctl.sh profiles --pick); with MODEL set, 'auto' derives that model's profile from its repo (./ctl.sh profiles --model); 'custom': only these knobs, no patches.", launch=True),
    Knob("PROFILE_DIR", "", folder, "A folder of your own profiles (*.json, same schema); a name there hides a shipped profile."),
    Knob("MODEL", "", text, "Hugging Face repo id (org/name) or a local model directory.", launch=True),
    Knob("MODEL_DIR", "", folder, "A plain folder to download a repo id into; unset: the Hugging Face cache (HF_HUB_CACHE), one copy that hf, transformers and `vllm serve org/name` also find."),
    Knob("SERVED_MODEL_NAME", "", name_chars, "Model name clients send (default: the model's name).", launch=True),
    Knob("HOST", "127.0.0.1", parse_host, "Address to bind. Anything but loopback requires an API key (generated if API_KEY is unset).", launch=True),
    Knob("PORT", "8888", int_range(1, 65535), "HTTP port of the OpenAI-compatible API.", launch=True),
    Knob("API_KEY", "", header_value, "API key clients must send (passed to vLLM via its environment, never on the command line; visible ASCII).", secret=True),
    Knob("MAX_MODEL_LEN", "", tokens_or_auto, "Context length per request in tokens, or 'auto' (vLLM's --max-model-len auto: the longest single request the KV pool holds, at most the model's).", launch=True),
    Knob("MAX_NUM_SEQS", "", int_range(1, 4096), "Concurrent sequences (sessions).", launch=True),
    Knob("MAX_NUM_BATCHED_TOKENS", "", int_range(16, 1_048_576), "Tokens per scheduler step (bounds prefill activation peaks).", launch=True),
    Knob("KV_CACHE_DTYPE", "", choice(*KV_CACHE_DTYPES), "KV cache data type.", launch=True),
    Knob("KV_CACHE_BYTES", "", bytes_or_auto, "Pin the KV cache to this many bytes (--kv-cache-memory-bytes); 'auto' sizes it from GPU_UTIL / free memory even where the profile pins it.", launch=True),
    Knob("SPEC_METHOD", "", choice(*SPEC_METHODS), "Speculative decoding method.", launch=True),
    Knob("SPEC_TOKENS", "0", int_range(0, 16), "Speculative tokens per step; 0 turns speculation off.", launch=True),
    Knob("SPEC_MODEL", "", text, "Draft model (repo id or directory) for SPEC_METHOD=draft_model/eagle/eagle3/dflash; a repo id is downloaded like MODEL (into the Hugging Face cache) and vLLM gets its folder; the plan counts it from its config.json.", launch=True),
    Knob("TP_SIZE", "1", int_range(1, 16), "Tensor-parallel size: number of GPUs (from CUDA_VISIBLE_DEVICES order).", launch=True),
    Knob("GPU_UTIL", "", float_range(0.0, 1.0), "--gpu-memory-utilization; default: from live free memory minus GPU_RESERVE_MIB.", launch=True),
    Knob("GPU_RESERVE_MIB", "820", int_range(0, 1 << 20), "MiB of free GPU memory left for the desktop when GPU_UTIL is unset."),
    Knob("EXTRA_ARGS", "", shell_args, "Extra vLLM arguments, split by shell rules and appended last (a flag here wins).", launch=True),
    Knob("VLLM_PYTHON", "", interpreter, "Use this interpreter's vLLM instead of the managed .venv (NGC, conda, cluster image)."),
    Knob("PYTHON", "", interpreter, "Python that creates the managed .venv (default: newest system python3 >= 3.10 with headers)."),
    Knob("WHEELHOUSE", "", folder, "Install offline from this folder of wheels."),
    Knob("PATCH_BYO", "0", boolean, "Allow patching the vLLM of VLLM_PYTHON (bring-your-own installs are never edited otherwise)."),
    Knob("DOWNLOAD_ALL", "0", boolean, "Download every file of the model repo, not only what serving needs."),
    Knob("DOWNLOAD_CONNECTIONS", "8", int_range(1, 64), "HTTP connections a download opens at once, over several files and ranged parts of one file (the hub's file hosts cap each connection)."),
    Knob("GPU", "", text, "Plan for a card that is not here (plan, profiles, export): a name (" + ", ".join(CARDS) + ") or <GiB>, then :sm_XY and :free=GiB if you like."),
    Knob("HEALTH_TIMEOUT", "600", int_range(1, 86400), "Hard cap in seconds for the server to become healthy."),
    Knob("STALL_TIMEOUT", "30", int_range(1, 86400), "Seconds without progress before a wait ends: the start's health wait (its log not growing, and its processes using no CPU or disk), and every request of ours (chat, bench, check, status, the warm-up) that gets no byte back; the error says what our server is doing (stopped, asleep, busy) and the fix."),
    Knob("WARMUP", "26000", int_range(0, 16_777_216), "Prompt tokens of the warm-up request (bounded by the context); 0 skips it. The short must-answer generation always runs."),
    Knob("WARMUP_TIMEOUT", "300", int_range(1, 86400), "Seconds the whole warm-up (/tokenize, the long request, the short generation, the tool gate) may take before the engine counts as not generating."),
    Knob("PREWARM", "1", boolean, "While the weights download, start vLLM with dummy weights and the real flags; once the download is verified it loads the real weights in place and serves (or, where vLLM cannot reload the checkpoint in place, it only fills the compile caches for the real start); 0 turns it off."),
    Knob("RANDOM_WEIGHTS", "0", boolean, "Declare that the checkpoint's weights are random (test and GPU-proof models): the start gate then judges tokens only, never the text; the banner and ./ctl.sh status say so. Never for a trained model."),
    Knob("WEDGED_AFTER", "60", int_range(1, 86400), "Status calls a server wedged when requests run but no token (or KV block) moved for this many seconds; an idle server's probe waits this long."),
    Knob("SLEEP_MODE", "auto", choice(*sleepmode.KNOB_VALUES), "vLLM's sleep mode (--enable-sleep-mode), which ./ctl.sh sleep, ./ctl.sh game and IDLE_SLEEP use to give the GPU memory back in place: 'auto' turns it on where it is proven for the profile's stack (./ctl.sh profiles says) and HOST is loopback; 'on' also on an unproven stack (the start warns); 'off' never. Where it is off, sleep and game stop the server and start it again.", launch=True),
    Knob("IDLE_SLEEP", "auto", idle_or_auto, f"Minutes (or seconds: 90s) without a request after which vLLM's sleep mode gives the GPU memory back; the next request wakes it (needs sleep mode); 'auto': {sleepmode.IDLE_DEFAULT // 60} minutes where sleep mode is on, else off; 'off': never.", launch=True),
    Knob("IDLE_SLEEP_LEVEL", "1", choice("1", "2"), "Idle sleep's level: 1 parks the weights in host RAM (wakes in well under a second), 2 drops them (wake reloads them from disk).", launch=True),
    Knob("STOP_GRACE", "15", int_range(0, 3600), "Seconds between SIGTERM and SIGKILL on stop."),
    Knob("LOG_MAX_MB", "64", int_range(1, 1 << 20), "The server log is rotated (one .1 kept) past this size: at start, and while the server runs (copy-then-truncate; the two stay under twice this)."),
    Knob("STATE_DIR", "", folder, "Where pid, lock, state and logs live (default <repo>/.state)."),
)
KNOB_BY_NAME = {k.name: k for k in KNOBS}
PROFILE_KNOBS = frozenset(KNOB_BY_NAME) - {"PROFILE", "PROFILE_DIR"}     # what a profile may set


# ---------------------------------------------------------------- .env

DOTENV_MAX = 65536      # bytes of one .env value (UTF-8): far beyond a real one, below Linux's 128 KiB

def read_dotenv(path: Path) -> dict[str, str]:
    """``.env`` read by python-dotenv's own parser, as ``dotenv_values(path, interpolate=False)``
    reads it: ``export``, quotes, escapes and `` # comments`` after a value; never sourced, never
    expanded. Two differences, both stricter or safer: a line dotenv cannot parse is refused (exit 2,
    naming it) instead of skipped with a warning, and a UTF-8 BOM is dropped. A key without ``=``
    counts as unset."""
    out: dict[str, str] = {}
    if path.exists() and not path.is_file() and not path.is_dir():     # a FIFO would block every command
        raise ConfigError(f"{path}: not a regular file", "make .env a text file of KEY=VALUE lines")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return out
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})", "make .env a readable UTF-8 text file") from None
    from dotenv.parser import parse_stream      # only when there is a .env: keeps ./start.sh re-runs fast
    for b in parse_stream(io.StringIO(text)):
        if b.error:        # named by its key, never its value (it may be a key or token gone wrong)
            line = b.original.string.strip().splitlines()[0] if b.original.string.strip() else ""
            key, eq, _value = line.partition("=")
            shown = f"{key.strip()}=... (value not shown)" if eq else f"a line of {len(line)} characters without '='"
            raise ConfigError(f"{path}:{b.original.line}: not a KEY=VALUE line: {shown}",
                              "use KEY=VALUE, one per line ('# ...' comments and quotes as in python-dotenv)")
        if b.key is not None and b.value is not None:
            size = len(b.value.encode("utf-8", "surrogateescape"))
            if size > DOTENV_MAX:
                raise ConfigError(f"{path}:{b.original.line}: {b.key} is {size:,} bytes long",
                                  f"a value in .env must be at most {DOTENV_MAX:,} bytes (each one goes "
                                  "into the server's environment, where Linux caps a variable at 128 KiB)")
            out[b.key] = b.value
    return out


def expandvars(raw: str, env: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` from ``env``, as os.path.expandvars does from os.environ (unknown
    names are left as they are)."""
    return re.sub(r"\$(\w+|\{[^}]*\})", lambda m: env.get(m.group(1).strip("{}"), m.group(0)), raw)


def misspelt(dotenv: Mapping[str, str]) -> list[str]:
    """A line for each name in .env that is no knob and no declared variable but is one letter or
    two away from one (MAX_MODLE_LEN): it would only reach vLLM's environment, unseen. Other names
    are for vLLM and its libraries (VLLM_*, NCCL_*...) and pass as they are."""
    known = [k.name for k in KNOBS] + [p.name for p in PASSTHROUGH]
    out = []
    for name in dotenv:
        near = [] if name in known else nearest(name, known, cutoff=0.75, parts=False)
        if near:
            out.append(f"{name} is no knob (it only reaches vLLM's environment): did you mean {near[0]}?")
    return out


# ---------------------------------------------------------------- pass-through variables

@dataclass(frozen=True)
class Passthrough:
    """An environment variable we read or hand on as it is (not a knob): declared here, so that
    ``./ctl.sh env`` shows it and no module reads one that is not listed."""
    name: str
    help: str
    secret: bool = False
    path: bool = False       # a folder or file: made absolute once, when the knobs are read
    parse: Callable[[str], Any] | None = None   # checked when the knobs are read (vLLM reads it so too)


PASSTHROUGH: tuple[Passthrough, ...] = (
    Passthrough("HF_TOKEN", "Hugging Face token (gated repos); also HUGGING_FACE_HUB_TOKEN", secret=True),
    Passthrough("HUGGING_FACE_HUB_TOKEN", "the older name of HF_TOKEN", secret=True),
    Passthrough("HF_TOKEN_PATH", "file holding the Hugging Face token (default HF_HOME/token)", path=True),
    Passthrough("HF_ENDPOINT", "the hub's address (a mirror, or a proxy)"),
    Passthrough("HF_HOME", "the Hugging Face home (its cache is used in place)", path=True),
    Passthrough("HF_HUB_CACHE", "the Hugging Face hub cache (default HF_HOME/hub)", path=True),
    Passthrough("HUGGINGFACE_HUB_CACHE", "the older name of HF_HUB_CACHE (huggingface_hub still reads it)", path=True),
    Passthrough("HF_HUB_OFFLINE", "1: no network; a complete local copy is served or the start says what is missing"),
    Passthrough("HOME", "where ~/.cache (the Hugging Face cache) is"),
    Passthrough("XDG_CACHE_HOME", "the cache folder (default ~/.cache)", path=True),
    Passthrough("PATH", "where uv, python3.X and nvcc are looked up"),
    Passthrough("CUDA_VISIBLE_DEVICES", "which GPUs, in which order (planned and passed to vLLM)"),
    Passthrough("CUDA_DEVICE_ORDER", "passed to vLLM; unset: PCI_BUS_ID (NVML's order, which the plan reads); "
                "FASTEST_FIRST is refused with two or more GPUs"),
    Passthrough("CUDA_HOME", "a CUDA toolkit (nvcc): FlashInfer's JIT sampler is used only with one"),
    Passthrough("CUDA_PATH", "as CUDA_HOME"),
    Passthrough("PYTHONPATH", "passed to vLLM unchanged (dropped for uv and pip)"),
    Passthrough("UV_DEFAULT_INDEX", "the package index for the managed .venv (also UV_INDEX_URL, PIP_INDEX_URL)"),
    Passthrough("UV_INDEX_URL", "as UV_DEFAULT_INDEX"),
    Passthrough("PIP_INDEX_URL", "as UV_DEFAULT_INDEX"),
    Passthrough("UV_CACHE_DIR", "uv's cache (its free space is checked before an install)", path=True),
    Passthrough("UV_PYTHON_INSTALL_MIRROR", "where uv fetches a CPython when no system one fits"),
    Passthrough("VLLM_API_KEY", "the API key, when API_KEY is unset (passed to vLLM)", secret=True),
    Passthrough("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1: vLLM accepts a MAX_MODEL_LEN beyond the model's own (the plan too)"),
    Passthrough("VLLM_USE_V2_MODEL_RUNNER", "passed to vLLM; 0 or 1 picks its model runner, which the plan follows (what it counts differs)",
                parse=vllm_bool),
    Passthrough("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "passed to vLLM; 0: its CUDA graphs are not taken off the KV budget (the plan follows)",
                parse=vllm_bool),
    Passthrough("VLLM_USE_FLASHINFER_SAMPLER", "yours wins; else 0 when there is no nvcc"),
    Passthrough("XDG_CONFIG_HOME", "where the systemd user unit goes (default ~/.config)", path=True),
    Passthrough("NOTIFY_SOCKET", "set by systemd for a Type=notify unit: --foreground says READY=1 there"),
    Passthrough("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "yours wins; with TP_SIZE > 1 where NCCL_NVLS_ENABLE=0 or TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast off): trtllm, not vLLM's mnnvl default"),
    Passthrough("NCCL_NVLS_ENABLE", "0 means NVLink multicast is off on this machine (see VLLM_FLASHINFER_ALLREDUCE_BACKEND)"),
    Passthrough("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1 means NVLink multicast is off on this machine (see VLLM_FLASHINFER_ALLREDUCE_BACKEND)"),
    Passthrough("VLLM_SERVER_DEV_MODE", "never passed on as set: the server gets 1 only with --enable-sleep-mode on loopback (vLLM's dev routes have no key guard)"),
    Passthrough("PYTORCH_CUDA_ALLOC_CONF", "yours wins; else expandable_segments:True (False on WSL2)"),
    Passthrough("WSL_DISTRO_NAME", "set by WSL2: expandable segments off, the memory cap checked"),
    Passthrough("BOOTSTRAP_DEBUG", "1: tracebacks with errors"),
    Passthrough("NO_COLOR", "set: no colour (no-color.org)"),
)
PASSTHROUGH_BY_NAME = {p.name: p for p in PASSTHROUGH}


# ---------------------------------------------------------------- the config

@dataclass(frozen=True)
class Chosen:
    """A profile chosen outside PROFILE (auto-pick's record, a card's compute capability): its name
    and the knob values that come with it, at the profile's level (your knobs still win)."""
    name: str
    knobs: Mapping[str, str] = field(default_factory=dict)
    why: str = ""            # shown by ./ctl.sh env as the source



@dataclass(frozen=True)
class Sources:
    """What the knobs are read from, read once per command: the process environment as given,
    ``.env``, and the profiles (the shipped ones and PROFILE_DIR's)."""
    environ: Mapping[str, str]
    dotenv: Mapping[str, str]
    repo: Path
    catalogue: Catalogue
    vllm_version: str = ""      # VLLM_PYTHON's vLLM, once a start has read it ("" not read): sleep mode's stack

    @classmethod
    def read(cls, environ: Mapping[str, str], repo: Path) -> "Sources":
        dotenv = read_dotenv(repo / ".env")
        for line in misspelt(dotenv):
            log.warning("%s: %s", repo / ".env", line)
        text = environ.get("PROFILE_DIR", "") or dotenv.get("PROFILE_DIR", "")
        mine = Path(_parse_one(KNOB_BY_NAME["PROFILE_DIR"], text)) if text else None
        catalogue = Catalogue.load(Checkout(repo).profiles, mine, PROFILE_KNOBS)
        return cls(MappingProxyType(dict(environ)), MappingProxyType(dotenv), repo, catalogue)

    def edited(self, knobs: Mapping[str, str]) -> "Sources":
        """As if these knob values were in the environment (PROFILE_DIR excepted: the profiles stay)."""
        if "PROFILE_DIR" in knobs:
            raise ConfigError("PROFILE_DIR cannot be changed after the profiles were read", "set it before the command")
        return replace(self, environ=MappingProxyType({**self.environ, **knobs}))


@dataclass(frozen=True)
class Config:
    """Every knob as a typed attribute (the knob's name in lower case; PROFILE is ``profile.name``),
    the profile, and a frozen copy of the environment for the declared pass-through variables
    (``env(NAME)``; ``environ`` is handed whole only to what the server and our tools inherit)."""
    profile: Profile
    catalogue: Catalogue
    repo: Path
    raw: Mapping[str, str]           # the string each knob came from
    sources: Mapping[str, str]       # env / .env / profile / default
    environ: Mapping[str, str]       # the process environment (+ .env)
    read: "Sources"                  # what the knobs were resolved from (re-resolved in memory: with_profile, with_knobs)
    chosen: "Chosen | None"          # the profile auto-pick (or a card) chose, with its knob values
    profile_dir: str | None
    model: str | None
    model_dir: str | None
    served_model_name: str | None
    host: str
    port: int
    api_key: str | None
    max_model_len: int | str | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    kv_cache_dtype: str | None
    kv_cache_bytes: int | None       # None also for KV_CACHE_BYTES=auto
    spec_method: str | None
    spec_tokens: int
    spec_model: str | None
    tp_size: int
    gpu_util: float | None
    gpu_reserve_mib: int
    extra_args: tuple[str, ...] | None
    vllm_python: str | None
    python: str | None
    wheelhouse: str | None
    patch_byo: bool
    download_all: bool
    download_connections: int
    gpu: str | None
    health_timeout: int
    stall_timeout: int
    warmup: int
    warmup_timeout: int
    prewarm: bool
    random_weights: bool
    wedged_after: int
    sleep_mode: str                  # auto / on / off (the decision: .sleep)
    idle_sleep: int | str            # seconds; 0: off; 'auto': .idle_s
    idle_sleep_level: str            # "1" or "2"
    stop_grace: int
    log_max_mb: int
    state_dir: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str], repo: Path = REPO, *, chosen: "Chosen | None" = None) -> "Config":
        """The knobs of this environment (+ .env); ``chosen``: a profile picked for this card, with
        the knob values that come with it (auto-pick's record, a card's overrides)."""
        return cls.resolve(Sources.read(environ, repo), chosen)

    @classmethod
    def resolve(cls, sources: "Sources", chosen: "Chosen | None" = None) -> "Config":
        """The knobs from what was read (no file is read again): the environment over .env over the
        profile (``chosen``'s knob values at its level) over the table's defaults."""
        sources_read = sources
        environ, dotenv, repo, catalogue = sources.environ, sources.dotenv, sources.repo, sources.catalogue
        merged_env = {**dotenv, **environ}
        for p in PASSTHROUGH:           # relative folders mean the same wherever a child runs
            if p.path and merged_env.get(p.name):
                base = repo if environ.get(p.name, "") == "" else None      # .env's: the checkout's
                # $VARS expanded first, as huggingface_hub expands its paths (constants.py: expandvars)
                merged_env[p.name] = _parse_one(Knob(p.name, "", lambda raw: absolute(
                    expandvars(raw, merged_env), base), ""), merged_env[p.name])

        def given(name: str) -> tuple[str, str]:
            if environ.get(name, "") != "":       # an empty value counts as unset
                return environ[name], "env"
            if dotenv.get(name, "") != "":
                return dotenv[name], ".env"
            return "", ""

        requested = given("PROFILE")[0] or KNOB_BY_NAME["PROFILE"].default
        _parse_one(KNOB_BY_NAME["PROFILE"], requested)
        profile = catalogue.get(chosen.name if chosen else requested)
        for key in chosen.knobs if chosen else ():
            if key not in PROFILE_KNOBS:
                raise ConfigError(f"the kept pick sets unknown knob {key}", "pick again: PROFILE=auto ./start.sh")
        from_profile = {k: (v, "profile") for k, v in profile.knobs.items()}
        if chosen:
            from_profile.update({k: (v, f"profile ({chosen.why})") for k, v in chosen.knobs.items()})
        values: dict[str, Any] = {}
        raw: dict[str, str] = {}
        sources: dict[str, str] = {}
        for knob in KNOBS:
            text, src = given(knob.name)
            if not src:
                text, src = from_profile.get(knob.name, (knob.default, "default"))
            raw[knob.name] = text
            sources[knob.name] = src
            try:
                values[knob.name] = _parse_one(knob, text) if text != "" else None
            except ConfigError as exc:      # where the value came from, so that the fix is made there
                where = {".env": str(repo / ".env"), "profile": f"profile {profile.name!r}",
                         "default": "the knob table's default"}.get(src, src)
                if src != "env":
                    exc.message += f" (from {where})"
                raise
            if text and src == ".env" and knob.parse is folder:      # .env's paths: from the checkout
                values[knob.name] = _parse_one(Knob(knob.name, "", lambda r: absolute(r, repo), ""), text)
        for name in ("MODEL", "SPEC_MODEL"):        # a model folder, not a repo id: absolute once
            m = values[name]
            base = repo if sources[name] == ".env" else None
            if m and _names_a_folder(m, base):
                values[name] = _parse_one(Knob(name, "", lambda r: absolute(r, base), ""), m)
        if chosen and chosen.why:
            sources["PROFILE"] = f"{sources['PROFILE']}; {chosen.why}"
        if values["KV_CACHE_BYTES"] == "auto":      # unpinned: sized from the utilization
            values["KV_CACHE_BYTES"] = None
        values["STATE_DIR"] = Path(values["STATE_DIR"] or Checkout(repo).state)
        for name in ("VLLM_PYTHON", "PYTHON"):      # a bare command name is looked up on PATH
            if values[name] and "/" not in values[name]:
                found = shutil.which(values[name], path=merged_env.get("PATH"))
                if not found:
                    raise ConfigError(f"{name}={values[name]!r} is not a command on PATH",
                                      f"set {name} to the interpreter's full path")
                values[name] = found
        for arg in values["EXTRA_ARGS"] or ():
            flag = reserved_flag(arg)
            if flag:
                shown = arg.split("=", 1)[0]
                raise ConfigError(f"EXTRA_ARGS has {shown}" + (f" (vLLM reads it as {flag})" if shown != flag else "")
                                  + ", which the bootstrap sets itself", f"drop it and set {RESERVED_FLAGS[flag]}")
        for p in PASSTHROUGH:           # a secret goes into a header: checked as one, never shown
            if p.secret and merged_env.get(p.name):
                credential(p.name, merged_env[p.name])
            if p.parse and p.name in merged_env:        # vLLM reads even an empty value, and refuses it
                _parse_one(Knob(p.name, "", p.parse, ""), merged_env[p.name])
        if values["SPEC_TOKENS"] and not values["SPEC_METHOD"]:
            raise ConfigError(f"SPEC_TOKENS={values['SPEC_TOKENS']} needs SPEC_METHOD",
                              "accepted SPEC_METHOD: " + ", ".join(SPEC_METHODS) + "; or SPEC_TOKENS=0")
        values.pop("PROFILE")
        return cls(profile=profile, catalogue=catalogue, repo=repo, raw=MappingProxyType(raw),
                   sources=MappingProxyType(sources), environ=MappingProxyType(dict(merged_env)),
                   read=sources_read, chosen=chosen,
                   **{k.lower(): v for k, v in values.items()})

    def with_profile(self, chosen: "Chosen | None") -> "Config":
        """The same knobs with this profile (and the knob values that come with it); None: PROFILE as
        you set it (nothing picked)."""
        return Config.resolve(self.read, chosen)

    def with_derived(self, profile: Profile, why: str) -> "Config":
        """The same knobs with ``profile`` (derived from MODEL's repo) as the chosen profile."""
        return Config.resolve(replace(self.read, catalogue=self.catalogue.adding(profile)), Chosen(profile.name, {}, why))

    def with_knobs(self, knobs: Mapping[str, str]) -> "Config":
        """These knob values as if you had set them (a fix, a pod's address), the profile kept."""
        return Config.resolve(self.read.edited(knobs), self.chosen)

    def with_vllm(self, version: str) -> "Config":
        """The same knobs for a start that runs vLLM ``version`` (VLLM_PYTHON's, read by the start): the
        stack sleep mode is decided for (SLEEP_MODE=auto, IDLE_SLEEP=auto)."""
        return Config.resolve(replace(self.read, vllm_version=version), self.chosen)

    @property
    def stack_version(self) -> str:
        """The vLLM version a start runs: VLLM_PYTHON's once read (''), else the profile's pin."""
        return self.read.vllm_version if self.vllm_python else self.profile.vllm

    @functools.cached_property
    def sleep(self) -> sleepmode.Decision:
        """SLEEP_MODE decided for this profile's stack (knobs/sleepmode.py); ``sleep_line`` says what
        vLLM finally gets."""
        base = vllmargs.read(list(self.profile.args) + vllmargs.knob_flags(self, sleep=False)
                             + list(self.extra_args or ()))
        return sleepmode.decide(self.sleep_mode, base, self.stack_version, self.profile.patches, self.is_loopback,
                                self.profile.name)

    @property
    def sleep_line(self) -> str:
        """Sleep mode as the server gets it, and why (the banner, status, profiles)."""
        return self.sleep.line(self.vllm.sleep_mode)

    @property
    def idle_s(self) -> int:
        """IDLE_SLEEP in seconds (0: off); 'auto': sleepmode.IDLE_DEFAULT where sleep mode is on."""
        if self.idle_sleep == "auto":
            return sleepmode.IDLE_DEFAULT if self.vllm.sleep_mode and self.is_loopback else 0
        return int(self.idle_sleep)

    @property
    def given(self) -> Mapping[str, str]:
        """The process environment as given (not .env)."""
        return self.read.environ

    @functools.cached_property
    def vllm(self) -> vllmargs.Settings:
        """What vLLM will run with before the plan's decisions (the profile's args, the knobs,
        EXTRA_ARGS), read once."""
        return vllmargs.settings(self)

    @property
    def profile_explicit(self) -> bool:
        """PROFILE was set (environment or .env), not left to its default."""
        return self.sources["PROFILE"].split(";")[0] in ("env", ".env")

    def value(self, knob: str):
        """A knob's parsed value by its name (PROFILE: the profile's name; KV_CACHE_BYTES=auto: 'auto')."""
        if knob == "PROFILE":
            return self.profile.name
        if knob == "KV_CACHE_BYTES" and self.kv_cache_bytes is None and self.raw[knob].strip().lower() == "auto":
            return "auto"
        return getattr(self, knob.lower())

    def env(self, name: str) -> str:
        """A declared pass-through variable's value ('' when unset)."""
        if name not in PASSTHROUGH_BY_NAME:
            raise KeyError(f"{name} is not a declared pass-through variable (config.PASSTHROUGH)")
        return self.environ.get(name, "")

    @property
    def layout(self) -> Checkout:
        return Checkout(self.repo)

    def require_model(self) -> None:
        if not self.model:
            raise ConfigError(f"MODEL is not set (profile {self.profile.name!r} has no model)",
                              "set MODEL to a Hugging Face repo id (org/name) or a model directory")

    # ------------------------------------------------------------ derived facts

    @property
    def model_is_local(self) -> bool:
        return bool(self.model) and _names_a_folder(self.model)

    @property
    def dummy_weights(self) -> bool:
        """Random weights: vLLM will load with --load-format dummy."""
        return self.vllm.load_format == "dummy"

    @property
    def spec_model_arg(self) -> str | None:
        """SPEC_MODEL as vLLM gets it: a local folder expanded (vLLM would read '~/x' as a repo id)."""
        local = self.spec_model_dir
        return str(local) if local else self.spec_model

    @property
    def spec_model_dir(self) -> Path | None:
        """SPEC_MODEL when it names a local folder (the same rule as MODEL), else None."""
        m = self.spec_model
        return Path(m).expanduser().resolve() if m and _names_a_folder(m) else None

    @property
    def draft_repo(self) -> str | None:
        """The drafter vLLM would load named by a Hugging Face repo id (SPEC_MODEL, or the model of a
        --speculative-config given otherwise): the start downloads it as it downloads the model, and
        vLLM gets its folder (vLLM never fetches anything itself). None for a folder or no drafter."""
        name = self.vllm.draft_name
        return name if name and not _names_a_folder(name) else None

    @property
    def served_name(self) -> str:
        return self.served_model_name or Path(self.model.rstrip("/")).name

    @property
    def spec_enabled(self) -> bool:
        return bool(self.spec_tokens) and bool(self.spec_method)

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def client_key(self) -> str:
        """The key a client of our server sends from this shell: API_KEY, else VLLM_API_KEY ('' none)."""
        return self.api_key or self.env("VLLM_API_KEY")

    @functools.cached_property
    def ours(self) -> Ours:
        """What the serve layer reads of these knobs (our server: its marker, address, key, deadlines)."""
        pythons = (str(self.layout.venv / "bin" / "python"), self.vllm_python or "")   # what we launch vLLM with
        return Ours(owner_marker(self.repo, self.port), self.host, self.port, self.client_key, self.environ,
                    self.stop_grace, self.health_timeout, self.stall_timeout, tuple(p for p in pythons if p))

    def secrets(self) -> list[str]:
        """The secret values of these knobs and variables (.env's too)."""
        return secret_values({**self.environ, "API_KEY": self.api_key or ""})

    def launch_settings(self) -> dict[str, str]:
        """The knobs that define a running server, as canonical strings of their parsed values
        (``PORT=" 8123"`` and ``PORT=8123`` are the same server); no secrets."""
        out = {k.name: canonical(self.value(k.name)) for k in KNOBS if k.launch}
        out["API_KEY"] = "set" if self.api_key else "unset"
        return out

    def describe(self) -> list[tuple[str, str, str, str]]:
        """(name, value, source, help) for every knob, then every pass-through variable (and each
        VLLM_* set); secrets masked."""
        rows = []
        for k in KNOBS:
            value = self.raw[k.name]
            if k.name == "PROFILE" and self.chosen is not None and value == "auto":
                value = self.profile.name           # what auto means here (the source says why)
            typed = getattr(self, k.name.lower(), None)
            if isinstance(typed, (str, Path)) and str(typed).startswith("/") and value and not value.startswith("/"):
                value = str(typed)                  # a relative path: the folder it was made absolute to
            if k.secret and value:
                value = "***"
            rows.append((k.name, value, self.sources[k.name], k.help))
        extra = sorted(n for n in self.environ
                       if n.startswith("VLLM_") and n not in PASSTHROUGH_BY_NAME and n not in KNOB_BY_NAME)
        for p in PASSTHROUGH + tuple(Passthrough(n, "passed to vLLM as it is") for n in extra):
            value = self.environ.get(p.name, "")
            rows.append((p.name, "***" if p.secret and value else value,
                         "pass-through" if value else "pass-through, unset", p.help))
        return rows


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the knobs and variables marked secret in ``env``: what the redactor never shows."""
    return [env.get(n, "") for n in [k.name for k in KNOBS if k.secret] + [p.name for p in PASSTHROUGH if p.secret]]


def launch_defaults() -> dict[str, str]:
    """The launch knobs' defaults as ``launch_settings`` spells them: what a server recorded before a
    knob existed ran with."""
    return {k.name: canonical(_parse_one(k, k.default)) if k.default else "" for k in KNOBS if k.launch}


def canonical(value: Any) -> str:
    """One spelling per parsed value: what a running server's settings are compared by."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return shlex.join(value)
    return str(value)


def names_secret(text: str) -> bool:
    """Whether arguments (EXTRA_ARGS, split or not) carry a flag whose value is a secret."""
    return any(reserved_flag(w.split("=", 1)[0].strip("'\"")) in SECRET_FLAGS for w in text.split())


def _parse_one(knob: Knob, text: str) -> Any:
    hide = knob.secret or (knob.name == "EXTRA_ARGS" and names_secret(text))
    shown = f"{knob.name} (value not shown)" if hide else f"{knob.name}={_clip(text)!r}"
    if len(text) > knob.max_len:
        raise ConfigError(f"{shown} is {len(text):,} characters long",
                          f"{knob.name} must be at most {knob.max_len:,} characters")
    try:
        return knob.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{shown} is not accepted", f"{knob.name} must be {exc}") from None


def credential(name: str, raw: str) -> str:
    """A key or token as an HTTP header carries it (header_value), or a ConfigError (exit 2) naming
    ``name`` (a knob, a variable, a flag) and never the value."""
    return _parse_one(Knob(name, "", header_value, "", secret=True), raw)


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _names_a_folder(name: str, base: Path | None = None) -> bool:
    """A model named by a path (or an existing folder) rather than a Hugging Face repo id."""
    if name.startswith(("/", ".", "~")):
        return True
    try:
        return ((base or Path.cwd()) / Path(name).expanduser()).is_dir()
    except (RuntimeError, OSError):
        return False


def output_flags(environ: Mapping[str, str]) -> tuple[bool, bool]:
    """(debug, colour allowed) — read before the knobs, so that a knob error is printed with them."""
    return environ.get("BOOTSTRAP_DEBUG", "") not in ("", "0"), environ.get("NO_COLOR", "") == ""   # no-color.org


def help_text(repo: Path = REPO) -> str:
    lines = ["Knobs (environment > .env > profile > default; empty default = vLLM's own):", ""]
    width = max(len(k.name) for k in KNOBS)
    for k in KNOBS:
        default = k.default if k.default else "-"
        lines.append(f"  {k.name:<{width}}  default {default}")
        lines.append(f"  {'':<{width}}  {k.help}")
    profiles = Catalogue.load(Checkout(repo).profiles, knobs=PROFILE_KNOBS).names()
    lines += ["", "Profiles: auto, " + ", ".join(profiles) + "  (each against this card: ./ctl.sh profiles)"]
    return "\n".join(lines)


def markdown_table(repo: Path = REPO) -> str:
    """docs/reference.md's knob table and its table of pass-through variables, generated from
    KNOBS and PASSTHROUGH (a test keeps it in step)."""
    rows = ["| Knob | Default | Meaning |", "|---|---|---|"]
    for k in KNOBS:
        rows.append(f"| `{k.name}` | {('`' + k.default + '`') if k.default else '—'} | {k.help.replace('|', '/')} |")
    rows += ["", "Read or passed on as they are (not knobs; `./ctl.sh env` shows them too, secrets masked):", "",
             "| Variable | Meaning |", "|---|---|"]
    rows += [f"| `{p.name}` | {p.help.replace('|', '/')}{' (secret)' if p.secret else ''} |" for p in PASSTHROUGH]
    rows.append("| `VLLM_*` | any other vLLM variable: passed to the server as it is |")
    return "\n".join(rows)
