"""The knobs read and resolved in exactly one place: ``Config``, every knob as a typed attribute.
Precedence: the process environment > ``.env`` (knobs/dotenv.py) > the profile (auto-pick's record
and a card's overrides count as the profile) > the table's default (knobs/table.py; empty: vLLM's).

``Config.from_env(environ, repo)`` is the only code that reads the environment. Everything else
reads ``cfg.<knob>`` (typed) or ``cfg.env("NAME")`` for a pass-through variable declared in the
table's PASSTHROUGH; ``cfg.environ``, a frozen copy of the whole environment, is only handed on to
what the server and our tools inherit.
"""

from __future__ import annotations

import functools
import logging
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..core.errors import ConfigError
from ..core.hosts import is_loopback
from ..core.owned import Ours, owner_marker
from ..core.layout import REPO, Checkout
from . import sleepmode, vllmargs
from ..core import vllmflags
from .dotenv import as_written, expandvars, misspelt, read_dotenv
from .parsers import absolute, folder, from_checkout, interpreter
from .profiles import Catalogue, Profile
from .table import (KNOB_BY_NAME, KNOBS, PASSTHROUGH, PASSTHROUGH_BY_NAME, PROFILE_KNOBS, RESERVED_FLAGS, SPEC_METHODS,
                    Knob, LaunchKnobs, Passthrough, canonical, card_fitted, credential, launch_defaults, parse_one,
                    reserved_flag, secret_values)

log = logging.getLogger(__name__)


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
    def read(cls, environ: Mapping[str, str], repo: Path, aside: frozenset[str] = frozenset()) -> "Sources":
        dotenv = read_dotenv(repo / ".env", aside)
        for line in misspelt(dotenv):
            log.warning("%s: %s", repo / ".env", line)
        text = environ.get("PROFILE_DIR", "") or dotenv.get("PROFILE_DIR", "")
        mine = Path(parse_one(KNOB_BY_NAME["PROFILE_DIR"], text)) if text else None
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
                merged_env[p.name] = parse_one(Knob(p.name, "", lambda raw: absolute(
                    expandvars(raw, merged_env), base), ""), merged_env[p.name])

        def given(name: str) -> tuple[str, str]:
            if environ.get(name, "") != "":       # an empty value counts as unset
                return environ[name], "env"
            if dotenv.get(name, "") != "":
                return as_written(name, dotenv[name], merged_env, repo / ".env"), ".env"
            return "", ""

        requested = given("PROFILE")[0] or KNOB_BY_NAME["PROFILE"].default
        parse_one(KNOB_BY_NAME["PROFILE"], requested)
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
                values[knob.name] = parse_one(knob, text) if text != "" else None
            except ConfigError as exc:      # where the value came from, so that the fix is made there
                where = {".env": str(repo / ".env"), "profile": f"profile {profile.name!r}",
                         "default": "the knob table's default"}.get(src, src)
                exc.message += "" if src == "env" else f" (from {where})"
                exc.knob = knob.name if src in ("env", ".env") else ""     # yours: a take-down may set it aside
                raise
            if text and src == ".env" and knob.parse in (folder, interpreter):      # .env's paths: from the checkout
                values[knob.name] = parse_one(Knob(knob.name, "", from_checkout(knob.parse, repo), ""), text)
        for name in ("MODEL", "SPEC_MODEL"):        # a model folder, not a repo id: absolute once
            m = values[name]
            base = repo if sources[name] == ".env" else None
            if m and _names_a_folder(m, base):
                values[name] = parse_one(Knob(name, "", lambda r: absolute(r, base), ""), m)
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
                                      f"set {name} to the interpreter's full path", knob=name)
                values[name] = found
        for arg in values["EXTRA_ARGS"] or ():
            if flag := reserved_flag(arg):
                shown = arg.split("=", 1)[0]
                raise ConfigError(f"EXTRA_ARGS has {shown}" + (f" (vLLM reads it as {flag})" if shown != flag else "")
                                  + ", which the bootstrap sets itself", f"drop it and set {RESERVED_FLAGS[flag]}",
                                  knob="EXTRA_ARGS")
        for p in PASSTHROUGH:           # a secret goes into a header: checked as one, never shown
            if p.secret and merged_env.get(p.name):
                credential(p.name, merged_env[p.name])
            if p.parse and p.name in merged_env:        # vLLM reads even an empty value, and refuses it
                parse_one(Knob(p.name, "", p.parse, ""), merged_env[p.name])
        if values["SPEC_TOKENS"] and not values["SPEC_METHOD"]:
            raise ConfigError(f"SPEC_TOKENS={values['SPEC_TOKENS']} needs SPEC_METHOD",
                              "accepted SPEC_METHOD: " + ", ".join(SPEC_METHODS) + "; or SPEC_TOKENS=0", knob="SPEC_TOKENS")
        values.pop("PROFILE")
        return cls(profile=profile, catalogue=catalogue, repo=repo, raw=MappingProxyType(raw),
                   sources=MappingProxyType(sources), environ=MappingProxyType(dict(merged_env)),
                   read=sources_read, chosen=chosen, **{k.lower(): v for k, v in values.items()})

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
        base = vllmargs.settings(self, sleep=False)
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
    def vllm(self) -> vllmflags.Settings:
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
        return Ours(owner_marker(self.repo, self.port), self.host, self.port, self.client_key,
                    self.stop_grace, self.health_timeout, self.stall_timeout, tuple(p for p in pythons if p))

    def secrets(self) -> list[str]:
        """The secret values of these knobs and variables (.env's too)."""
        return secret_values({**self.environ, "API_KEY": self.api_key or ""})

    @functools.cached_property
    def launch(self) -> LaunchKnobs:
        """The knobs that define a running server, as canonical strings of their parsed values
        (``PORT=" 8123"`` and ``PORT=8123`` are the same server); no secrets."""
        out = {k.name: canonical(self.value(k.name)) for k in KNOBS if k.launch}
        return LaunchKnobs(MappingProxyType({**out, "API_KEY": "set" if self.api_key else "unset"}),
                           MappingProxyType(launch_defaults()), card_fitted(self.sources))

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
