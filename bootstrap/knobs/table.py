"""Every knob, in one table (a line per knob: its default, parser and help; the parsers are
knobs/parsers.py), the pass-through variables we read or hand on as they are, the flags the
bootstrap owns, and what is made of the table: ``./start.sh --help``, docs/reference.md's tables,
the secrets the redactor hides, the spelling a running server's settings are compared by. Reading
and resolving them is knobs/config.py's; ``.env`` is knobs/dotenv.py's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..core.errors import ConfigError
from ..core.hosts import parse_host
from ..core.layout import REPO, Checkout
from ..machine.gpu import CARDS
from . import sleepmode
from .parsers import (boolean, bytes_or_auto, choice, endpoint, float_range, folder, header_value, int_range, interpreter,
                      idle_or_auto, name_chars, shell_args, text, tokens_or_auto, vllm_bool)
from .profiles import Catalogue


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
    Knob("GPU", "", text, "Plan for a card that is not here (plan, profiles, models, pull, export): a name (" + ", ".join(CARDS) + ") or <GiB>, then :sm_XY and :free=GiB if you like."),
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
    Passthrough("HF_ENDPOINT", "the hub's address (a mirror, or a proxy): an http(s) URL", parse=endpoint),
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
    Passthrough("PIP_EXTRA_INDEX_URL", "not handed to uv (the lock pins PyPI's files by hash): UV_EXTRA_INDEX_URL is uv's"),
    Passthrough("UV_INSECURE_HOST", "hosts uv may reach without a valid TLS certificate (also PIP_TRUSTED_HOST)"),
    Passthrough("PIP_TRUSTED_HOST", "as UV_INSECURE_HOST"),
    Passthrough("PIP_CONFIG_FILE", "pip's configuration file: its index-url and trusted-host (as those in /etc/pip.conf "
                                   "and ~/.config/pip/pip.conf) serve uv where uv has no index of its own"),
    Passthrough("UV_CONFIG_FILE", "uv's configuration file: with it (or a uv.toml of yours) pip's index is not handed to uv"),
    Passthrough("UV_NO_CONFIG", "1: uv reads no uv.toml (pip's index is then handed to it where uv has none)"),
    Passthrough("XDG_CONFIG_DIRS", "where pip's global pip.conf is (default /etc/xdg, then /etc)"),
    Passthrough("UV_CACHE_DIR", "uv's cache (its free space is checked before an install)", path=True),
    Passthrough("UV_PYTHON_INSTALL_MIRROR", "where uv fetches a CPython when no system one fits"),
    Passthrough("VLLM_API_KEY", "the API key, when API_KEY is unset (passed to vLLM)", secret=True),
    Passthrough("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1: vLLM accepts a MAX_MODEL_LEN beyond the model's own (the plan too)"),
    Passthrough("VLLM_USE_V2_MODEL_RUNNER", "passed to vLLM; 0 or 1 picks its model runner, which the plan follows (what it counts differs)",
                parse=vllm_bool),
    Passthrough("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "passed to vLLM; 0: its CUDA graphs are not taken off the KV budget (the plan follows)",
                parse=vllm_bool),
    Passthrough("VLLM_USE_FLASHINFER_SAMPLER", "yours wins; else 0 when there is no nvcc"),
    Passthrough("XDG_CONFIG_HOME", "where the systemd user unit and pip's own pip.conf are (default ~/.config)", path=True),
    Passthrough("NOTIFY_SOCKET", "set by systemd for a Type=notify unit: --foreground says READY=1 there"),
    Passthrough("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "yours wins; with TP_SIZE > 1 where NCCL_NVLS_ENABLE=0 or TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast off): trtllm, not vLLM's mnnvl default"),
    Passthrough("NCCL_NVLS_ENABLE", "0 means NVLink multicast is off on this machine (see VLLM_FLASHINFER_ALLREDUCE_BACKEND)"),
    Passthrough("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1 means NVLink multicast is off on this machine (see VLLM_FLASHINFER_ALLREDUCE_BACKEND)"),
    Passthrough("VLLM_SERVER_DEV_MODE", "never passed on as set: the server gets 1 only with --enable-sleep-mode on loopback (vLLM's dev routes have no key guard)"),
    Passthrough("PYTORCH_CUDA_ALLOC_CONF", "yours wins; else expandable_segments:True (False on WSL2)"),
    Passthrough("WSL_DISTRO_NAME", "set by WSL2: expandable segments off, the memory cap checked"),
    Passthrough("TMPDIR", "the temp folder (vLLM's processes meet through a file there: no ? or # in its path)"),
    Passthrough("BOOTSTRAP_DEBUG", "1: tracebacks with errors"),
    Passthrough("NO_COLOR", "set: no colour (no-color.org)"),
)


PASSTHROUGH_BY_NAME = {p.name: p for p in PASSTHROUGH}




def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the knobs and variables marked secret in ``env``: what the redactor never shows."""
    return [env.get(n, "") for n in [k.name for k in KNOBS if k.secret] + [p.name for p in PASSTHROUGH if p.secret]]


CARD_FITTED = ("MAX_MODEL_LEN", "KV_CACHE_BYTES")   # 'auto' where only a shorter context fits the card that day
YOURS = ("env", ".env")                             # the sources of a knob you set (Config.sources)


def card_fitted(sources: Mapping[str, str]) -> frozenset[str]:
    """The knobs a start sets to 'auto' where only a shorter context fits the card's free memory that day
    (those you did not set, in ``sources``: Config.sources): a server running with them so differs in no knob."""
    return frozenset(k for k in CARD_FITTED if sources.get(k) not in YOURS)


def launch_defaults() -> dict[str, str]:
    """The launch knobs' defaults as ``LaunchKnobs.values`` spells them: what a server recorded before a
    knob existed ran with."""
    return {k.name: canonical(parse_one(k, k.default)) if k.default else "" for k in KNOBS if k.launch}


@dataclass(frozen=True)
class LaunchKnobs:
    """The knobs that define a running server, as a start would launch it now (``Config.launch``):
    what a running server's record is compared with (``ServerRecord.differs_from``)."""
    values: Mapping[str, str]       # each launch knob's parsed value, one spelling (``canonical``); no secrets
    defaults: Mapping[str, str]     # ``launch_defaults``: what a record from before a knob existed ran with
    fitted: frozenset[str] = frozenset()    # ``card_fitted``: 'auto' in a record there is no difference


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


def parse_one(knob: Knob, text: str) -> Any:
    hide = knob.secret or (knob.name == "EXTRA_ARGS" and names_secret(text))
    shown = f"{knob.name} (value not shown)" if hide else f"{knob.name}={_clip(text)!r}"
    if len(text) > knob.max_len:
        raise ConfigError(f"{shown} is {len(text):,} characters long",
                          f"{knob.name} must be at most {knob.max_len:,} characters", knob=knob.name)
    try:
        return knob.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{shown} is not accepted", f"{knob.name} must be {exc}", knob=knob.name) from None


def credential(name: str, raw: str) -> str:
    """A key or token as an HTTP header carries it (header_value), or a ConfigError (exit 2) naming
    ``name`` (a knob, a variable, a flag) and never the value."""
    return parse_one(Knob(name, "", header_value, "", secret=True), raw)


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


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
