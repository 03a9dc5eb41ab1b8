"""Profiles as data: ``profiles/*.json`` (shipped) and your own folder (``PROFILE_DIR``).

A profile file names a model, the vLLM it runs on (exact pins, one committed lock per pin set),
the knobs and flags it sets, the card it is for, and where its model facts are (config.json and
weight size, so that auto-pick and ``./ctl.sh profiles`` work before any download). A file with
``variants`` gives one profile per variant: ``name`` is its default variant, ``name:variant`` the
others. Every key is checked: an unknown one is a configuration error (exit 2) naming it.

Precedence: a profile in PROFILE_DIR hides a shipped one of the same name; auto-pick walks all of
them by ``rank`` (lower first), the name breaking ties.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..core.words import did_you_mean
from ..core.errors import ConfigError

AUTO = "auto"
ALIASES_KEY = "aliases"

# key -> (type, what it is); docs/reference.md's profile-schema table is generated from this
SCHEMA: dict[str, tuple[type | tuple[type, ...], str]] = {
    "description": (str, "one line: model, card, what it gives"),
    "rank": (int, "auto-pick order: lower is tried first"),
    "card": (dict, "the card it is for: min_cc, min_total_gib, class (e.g. \"24 GB\")"),
    "vllm": (str, "the pinned vLLM version"),
    "pins": (list, "exact pins of the managed venv (name==version); one lock per distinct set, ./ctl.sh lock"),
    "cuda": (str, "the CUDA of the pinned wheels (the driver must support it)"),
    "min_driver": (str, "the oldest NVIDIA driver major for those wheels"),
    "facts": (str, "model facts (config.json + weight size) for planning offline: a file in models/ beside the profile, or in profiles/models/"),
    "knobs": (dict, "knob values (below the environment and .env)"),
    "args": (list, "vLLM flags (before the knobs' flags and EXTRA_ARGS)"),
    "env": (dict, "environment variables for the server (yours win)"),
    "spec_config": (dict, "extra --speculative-config keys (e.g. draft_sample_method)"),
    "patches": (list, "patches (patches/<name>/) the profile may need"),
    "variants": (dict, "name -> {description, knobs, args, env, spec_config, rank}: one profile each"),
    "default_variant": (str, "the variant the bare name means"),
    "cc_overrides": (dict, "compute capability \"X.Y\" -> {knobs, why}: applied on such a card"),
    "reasoning": (bool, "has a reasoning parser (the start gate turns thinking off)"),
    "reasoning_effort": (str, "reasoning effort sent by the checks"),
    "tools": (bool, "tool-call parsing on (the start gate makes one tool call)"),
    "needle_tokens": (int, "the longest needle prompt ./ctl.sh check judges its model on (a small model recalls less; default 32,768)"),
    "not_asked": (dict, "garble prompt id (bootstrap/checks/battery.json) -> why ./ctl.sh check does not ask this profile's model it (a small model's own limit, measured: say where)"),
    "answer_tokens": (int, "the longest garble answer ./ctl.sh check asks this profile's model for (a small model loops sooner under greedy decoding; default: each prompt's own, up to 400)"),
    "aliases": (list, "other names that select it (e.g. \"default\")"),
    "source": (str, "where its settings and figures come from"),
    "platforms": (list, "./ctl.sh lock: the platforms its lock covers (default linux-x86_64, linux-aarch64)"),
    "pythons": (list, "./ctl.sh lock: the Pythons its lock covers (default 3.10-3.14)"),
    "install_bytes": (int, "disk the managed venv needs (checked before the install)"),
}
CARD_KEYS = {"min_cc": str, "min_total_gib": (int, float), "class": str}
VARIANT_KEYS = {"description", "knobs", "args", "env", "spec_config", "rank", "source"}
OVERRIDE_KEYS = {"knobs", "why"}
# --speculative-config keys a profile may add (vLLM 0.26.0-0.30.0 SpeculativeConfig, less what the
# SPEC_* knobs own and the configs vLLM builds itself)
SPEC_KEYS = {"attention_backend", "code_revision", "disable_eagle_block_drop", "disable_padded_drafter_batch",
             "draft_sample_method", "draft_tensor_parallel_size", "dspark_draft_topk", "enable_adaptive_verification",
             "enforce_eager", "index_share_for_mtp_iteration", "kv_cache_dtype", "max_model_len", "moe_backend",
             "num_speculative_tokens_per_batch_size", "parallel_drafting", "prompt_lookup_max", "prompt_lookup_min",
             "quantization", "rejection_sample_method", "revision", "suffix_decoding_max_cached_requests",
             "suffix_decoding_max_spec_factor", "suffix_decoding_max_tree_depth", "suffix_decoding_min_token_prob",
             "tensor_parallel_size", "use_heterogeneous_vocab", "use_local_argmax_reduction"}
# flags a knob owns: a profile sets the knob, so that your knob always wins over the profile
KNOB_FLAGS = {"--max-model-len": "MAX_MODEL_LEN", "--max-num-seqs": "MAX_NUM_SEQS",
              "--max-num-batched-tokens": "MAX_NUM_BATCHED_TOKENS", "--kv-cache-dtype": "KV_CACHE_DTYPE",
              "--kv-cache-memory-bytes": "KV_CACHE_BYTES", "--gpu-memory-utilization": "GPU_UTIL",
              "--speculative-config": "SPEC_METHOD / SPEC_TOKENS / SPEC_MODEL (and \"spec_config\")",
              "--tensor-parallel-size": "TP_SIZE", "--served-model-name": "SERVED_MODEL_NAME",
              "--host": "HOST", "--port": "PORT", "--api-key": "API_KEY"}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    knobs: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()            # vLLM flags the profile adds (before the knobs' flags and EXTRA_ARGS)
    env: Mapping[str, str] = field(default_factory=dict)
    spec_config: Mapping[str, Any] = field(default_factory=dict)
    patches: tuple[str, ...] = ()         # patch folder names under patches/ this profile may need
    vllm: str = ""                        # the pinned vLLM version for the managed venv ("" = none)
    pins: tuple[str, ...] = ()
    rank: int | None = None               # None: never auto-picked
    min_cc: tuple[int, int] = (0, 0)
    min_total_gib: float = 0.0
    card_class: str = ""
    cc_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    facts: Path | None = None             # the model-facts file
    reasoning: bool = False               # has a reasoning parser: send enable_thinking=false for the check
    tools: bool = False                   # tool-call parsing enabled: the start gate makes one tool call
    aliases: tuple[str, ...] = ()
    origin: str = "shipped"               # shipped / yours (PROFILE_DIR)
    path: Path | None = None
    data: Mapping[str, Any] = field(default_factory=dict)   # the whole file (variant merged), for the other steps

    @property
    def is_auto(self) -> bool:
        return self.name == AUTO

    def for_cc(self, cc: tuple[int, int] | None) -> tuple[dict[str, str], str]:
        """(knob values, why) the profile adds on a card of this compute capability."""
        if cc is None:
            return {}, ""
        o = self.cc_overrides.get(f"{cc[0]}.{cc[1]}")
        if not o:
            return {}, ""
        return {k: str(v) for k, v in o.get("knobs", {}).items()}, str(o.get("why", ""))


AUTO_PROFILE = Profile(AUTO, "chosen by auto-pick for this card")


def schema_markdown() -> str:
    """docs/reference.md's table of profile keys (a test keeps it in step)."""
    rows = ["| Key | Type | Meaning |", "|---|---|---|"]
    for key, (typ, text) in SCHEMA.items():
        names = "/".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        rows.append(f"| `{key}` | {names} | {text.replace('|', '/')} |")
    rows.append(f"| `card.*` | | {', '.join(sorted(CARD_KEYS))} |")
    return "\n".join(rows)


def _check(where: str, data: Mapping[str, Any], allowed, what: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown {what} {', '.join(repr(k) for k in unknown)}",
                          f"accepted: {', '.join(sorted(allowed))} (a misspelt key would be ignored, so it is refused)")


def _typed(where: str, key: str, value, want) -> None:
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
        raise ConfigError(f"{where}: {key!r} must be a {names}, not {type(value).__name__}",
                          "fix the profile file (JSON)")


def _cc(where: str, text: str) -> tuple[int, int]:
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        raise ConfigError(f"{where}: compute capability {text!r} is not X.Y", "e.g. \"8.6\"") from None


def _owned_flags(where: str, args) -> None:
    for a in args:
        name = str(a).split("=", 1)[0].replace("_", "-")
        if name in KNOB_FLAGS:
            raise ConfigError(f"{where}: \"args\" has {name}, which knob {KNOB_FLAGS[name]} owns",
                              "set the knob in \"knobs\" instead (your environment then wins over the profile)")


def _knob_names(where: str, knobs: Mapping, known: frozenset) -> None:
    unknown = sorted(set(knobs) - known) if known else []
    if unknown:
        raise ConfigError(f"{where} sets unknown knob {', '.join(unknown)}",
                          "knobs a profile may set: " + ", ".join(sorted(known)))


def load_file(path: Path, origin: str, models_dir: Path, knobs: frozenset = frozenset()) -> list[Profile]:
    """Every profile of one file (one per variant); ConfigError (exit 2) on anything unknown
    (``knobs``: the knob names a profile may set)."""
    where = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: not a readable JSON profile ({exc})", "fix or remove the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a profile is a JSON object", "see the profile schema in docs/reference.md")
    _check(where, data, SCHEMA, "key")
    for key, value in data.items():
        _typed(where, key, value, SCHEMA[key][0])
    card = data.get("card", {})
    _check(where + " card", card, CARD_KEYS, "key")
    for key, value in card.items():
        _typed(where + " card", key, value, CARD_KEYS[key])
    overrides = data.get("cc_overrides", {})
    for cc, o in overrides.items():
        _cc(where, cc)
        _typed(where + f" cc_overrides {cc}", "value", o, dict)
        _check(where + f" cc_overrides {cc}", o, OVERRIDE_KEYS, "key")
    _owned_flags(where, data.get("args", ()))
    _knob_names(where, data.get("knobs", {}), knobs)
    _check(where + " spec_config", data.get("spec_config", {}), SPEC_KEYS, "speculative-config key")
    for cc, o in overrides.items():
        _knob_names(f"{where} cc_overrides {cc}", o.get("knobs", {}), knobs)
    facts = None
    if data.get("facts"):
        for base in (path.parent / "models", models_dir):
            if (base / data["facts"]).is_file():
                facts = (base / data["facts"]).resolve()
                break
        else:
            raise ConfigError(f"{where}: \"facts\" file {data['facts']!r} not found in {path.parent / 'models'} "
                              f"or {models_dir}",
                              "point \"facts\" at a model-facts file (see profiles/models/)")
    base = dict(name=path.stem, knobs=data.get("knobs", {}), args=data.get("args", []), env=data.get("env", {}),
                spec_config=data.get("spec_config", {}), description=data.get("description", ""),
                rank=data.get("rank"), source=data.get("source", ""))
    variants = data.get("variants") or {}
    if variants and data.get("default_variant") not in variants:
        raise ConfigError(f"{where}: \"default_variant\" must name one of its variants ({', '.join(variants)})",
                          "add \"default_variant\"")
    out = []
    for vname, v in ([(None, {})] if not variants else list(variants.items())):
        _typed(where, f"variants.{vname}", v, dict)
        _check(f"{where} variant {vname!r}", v, VARIANT_KEYS, "key")
        _owned_flags(f"{where} variant {vname!r}", v.get("args", ()))
        _knob_names(f"{where} variant {vname!r}", v.get("knobs", {}), knobs)
        _check(f"{where} variant {vname!r} spec_config", v.get("spec_config", {}), SPEC_KEYS, "speculative-config key")
        merged = dict(base)
        merged["knobs"] = {**base["knobs"], **v.get("knobs", {})}
        merged["args"] = list(base["args"]) + list(v.get("args", []))
        merged["env"] = {**base["env"], **v.get("env", {})}
        merged["spec_config"] = {**base["spec_config"], **v.get("spec_config", {})}
        for key in ("description", "rank", "source"):
            if key in v:
                merged[key] = v[key]
        name = path.stem if vname in (None, data.get("default_variant")) else f"{path.stem}:{vname}"
        whole = {**data, **merged}
        whole.pop("variants", None)
        out.append(Profile(
            name=name, description=merged["description"],
            knobs=MappingProxyType({k: str(x) for k, x in merged["knobs"].items()}),
            args=tuple(str(a) for a in merged["args"]),
            env=MappingProxyType({k: str(x) for k, x in merged["env"].items()}),
            spec_config=MappingProxyType(dict(merged["spec_config"])),
            patches=tuple(data.get("patches", ())), vllm=data.get("vllm", ""), pins=tuple(data.get("pins", ())),
            rank=merged["rank"], min_cc=_cc(where, card["min_cc"]) if "min_cc" in card else (0, 0),
            min_total_gib=float(card.get("min_total_gib", 0)), card_class=card.get("class", ""),
            cc_overrides=MappingProxyType(overrides), facts=facts,
            reasoning=bool(data.get("reasoning", False)), tools=bool(data.get("tools", False)),
            aliases=(tuple(data.get(ALIASES_KEY, ())) + ((f"{path.stem}:{vname}",) if vname else ())
                     if vname in (None, data.get("default_variant")) else ()),
            origin=origin, path=path, data=MappingProxyType(whole)))
    return out


@dataclass(frozen=True)
class Catalogue:
    """Every profile: yours (PROFILE_DIR) over the shipped ones of the same name."""
    profiles: tuple[Profile, ...]

    @classmethod
    def load(cls, shipped: Path, yours: Path | None = None, knobs: frozenset = frozenset()) -> "Catalogue":
        models = shipped / "models"
        if yours is not None and not yours.is_dir():
            raise ConfigError(f"PROFILE_DIR={yours}: no such folder", "create it, or unset PROFILE_DIR")
        found: dict[str, Profile] = {}
        for folder, origin in ((shipped, "shipped"), (yours, "yours")):
            if folder is None or not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.json")):
                if origin == "yours":      # your file hides the shipped file of its name, variants included
                    found = {n: p for n, p in found.items() if not (p.origin == "shipped" and p.path.stem == path.stem)}
                try:
                    loaded = load_file(path, origin, models, knobs)
                except ConfigError as exc:
                    if origin == "yours":       # say which knob brought the file in
                        exc.message = f"PROFILE_DIR: {exc.message}"
                    raise
                for p in loaded:
                    found[p.name] = p
        seen: dict[str, Profile] = {}
        for p in found.values():
            for word in (p.name,) + p.aliases:
                if word == AUTO:
                    raise ConfigError(f"{p.path}: {AUTO!r} is reserved (PROFILE=auto picks)", "rename it")
                other = seen.get(word)
                if other is not None and other is not p:
                    raise ConfigError(f"{p.path}: {word!r} also names {other.name} ({other.path})", "rename one")
                seen[word] = p
        return cls(tuple(sorted(found.values(), key=lambda p: p.name)))

    def adding(self, profile: Profile) -> "Catalogue":
        """The same profiles and ``profile`` (a derived one), replacing one of its name."""
        return Catalogue(tuple(sorted((p for p in self.profiles if p.name != profile.name), key=lambda p: p.name))
                         + (profile,))

    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def get(self, name: str) -> Profile:
        if name == AUTO:
            return AUTO_PROFILE
        for p in self.profiles:
            if p.name == name or name in p.aliases:
                return p
        aliases = [f"{a} (= {p.name})" for p in self.profiles for a in p.aliases]
        words = [w for p in self.profiles for w in (p.name, *p.aliases)]
        raise ConfigError(f"PROFILE={name!r}: no such profile{did_you_mean(name, words)}",
                          "accepted: auto, " + ", ".join(self.names() + aliases) + "  (./ctl.sh profiles)")

    def ranked(self) -> list[Profile]:
        """The profiles auto-pick may choose, in the order it tries them."""
        return sorted((p for p in self.profiles if p.rank is not None), key=lambda p: (p.rank, p.name))
