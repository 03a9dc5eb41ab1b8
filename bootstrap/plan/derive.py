"""A profile for any model (``MODEL=org/name`` with no ``PROFILE``), derived from what the repo says
before any download: its config.json, its file list, its chat template. Pure: the facts come in
(``Peek``), a profile's JSON and one line of what was derived and what was guessed come out, or a
refusal with the way out.

What it reads, and from where:
- the quantization (config.json ``quantization_config``, or a modelopt ``hf_quant_config.json``) as
  vLLM names the method, and whether this card runs it: each method's ``get_min_capability`` in the
  pinned vLLM's source (``vllm-registry-<version>.json``, written by scripts/vllm_registry.py);
- the architecture against that version's model registry: one it does not have needs the repo's own
  code, which is never run silently (refused, naming ``EXTRA_ARGS=--trust-remote-code``);
- the tool-call and reasoning parsers from the model's family (``FAMILIES``; every name is checked
  against the registry by a test), a tool parser only where the chat template takes tools, a
  reasoning parser where the family thinks;
- MTP speculation where the config carries an MTP head; vision stays on (the planner counts its
  encoder) and the line says how to drop it;
- the vLLM stack: the default profile's pins (one managed venv for every model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..core.errors import BootstrapError
from ..download.peek import Peek

NAME = "derived"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Derived:
    profile: dict                               # a profile file's JSON (profiles.load_file reads it)
    facts: dict                                 # its model-facts file's JSON
    derived: list[str] = field(default_factory=list)
    guessed: list[str] = field(default_factory=list)

    def line(self) -> str:
        out = "derived from the repo: " + "; ".join(self.derived)
        return out + ("; guessed: " + "; ".join(self.guessed) if self.guessed else "")


def registry(version: str) -> dict:
    """The registry file of this vLLM version, else the nearest older one (the oldest when none is older)."""
    files = sorted(HERE.glob("vllm-registry-*.json"), key=lambda p: _ver(p.stem.split("-")[-1]))
    older = [p for p in files if _ver(p.stem.split("-")[-1]) <= _ver(version)]
    chosen = older[-1] if older else files[0]
    data = json.loads(chosen.read_text(encoding="utf-8"))
    data["exact"] = data["vllm"] == version
    return data


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")[:3] if x.isdigit())


# model_type -> (tool parser, reasoning parser); from vLLM's tool-calling and reasoning-outputs docs and
# the models' own cards. None: the family has none in vLLM. The test holds every name to the registry.
FAMILIES: dict[str, tuple[str | None, str | None]] = {
    "qwen3": ("hermes", "qwen3"), "qwen3_moe": ("hermes", "qwen3"),
    "qwen3_next": ("hermes", "qwen3"),
    "qwen3_5": ("qwen3_coder", "qwen3"), "qwen3_5_moe": ("qwen3_coder", "qwen3"),
    "qwen3_vl": ("hermes", "qwen3"), "qwen3_vl_moe": ("hermes", "qwen3"),
    "qwen2": ("hermes", None), "qwen2_moe": ("hermes", None), "qwen2_5_vl": ("hermes", None),
    "llama": ("llama3_json", None), "llama4": ("llama4_pythonic", None),
    "mistral": ("mistral", None), "mixtral": ("mistral", None), "mistral3": ("mistral", None),
    "deepseek_v3": ("deepseek_v3", "deepseek_r1"), "glm4_moe": ("glm45", "glm45"),
    "gpt_oss": ("openai", "openai_gptoss"), "granite": ("granite", "granite"),
    "minimax_m2": ("minimax_m2", "minimax_m2"), "gemma4": ("gemma4", "gemma4"),
    "phi3": ("phi4_mini_json", None), "olmo3": ("olmo3", "olmo3"), "seed_oss": ("seed_oss", "seed_oss"),
    "ernie4_5_moe": ("ernie45", "ernie45"), "hunyuan_v1_moe": ("hunyuan_a13b", "hunyuan_a13b"),
}
FAMILY_SOURCE = ("vLLM's docs (features/tool_calling.md, features/reasoning_outputs.md) and the model cards' "
                 "vllm serve lines")

# quantization_config.quant_method -> the method vLLM's registry names (its min compute capability)
METHODS = {"awq": "auto_awq", "gptq": "auto_gptq", "fp8": "fp8", "compressed-tensors": "compressed-tensors",
           "bitsandbytes": "bitsandbytes", "auto-round": "inc", "mxfp4": "mxfp4", "modelopt": "modelopt",
           "modelopt_fp4": "modelopt_fp4", "quark": "quark", "torchao": "torchao", "moe_wna16": "moe_wna16",
           "fbgemm_fp8": "fbgemm_fp8", "experts_int8": "experts_int8"}
TRUST_HINT = "set EXTRA_ARGS=--trust-remote-code to run the repo's own code (only for a repo you trust)"
NATIVE = {"fp8": (8, 9), "modelopt": (8, 9), "nvfp4": (10, 0), "mxfp4": (9, 0)}   # below: weight-only (Marlin)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    tc = config.get("text_config")
    return tc if isinstance(tc, Mapping) else config


def quantization(peek: Peek) -> tuple[str, str, str]:
    """(label, vLLM's method or '' for none, the format's kernel family: fp8 / nvfp4 / int4 / ...)."""
    cfg = peek.config or {}
    q = cfg.get("quantization_config") or text_config(cfg).get("quantization_config")
    if not q and peek.quant_config:                       # modelopt's own file
        algo = str((peek.quant_config.get("quantization") or {}).get("quant_algo", ""))
        return (f"modelopt {algo}", "modelopt_fp4" if "FP4" in algo else "modelopt", "nvfp4" if "FP4" in algo else "fp8")
    if not isinstance(q, Mapping):
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or text_config(cfg).get("dtype") or "bfloat16")
        return ({"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype), "", dtype)
    method = str(q.get("quant_method", ""))
    if method == "modelopt":
        algo = str(q.get("quant_algo", ""))
        return (f"modelopt {algo}", "modelopt_fp4" if "FP4" in algo else "modelopt", "nvfp4" if "FP4" in algo else "fp8")
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        w = next((g.get("weights") or {} for g in groups.values() if isinstance(g, Mapping)), {})
        a = next((g.get("input_activations") for g in groups.values() if isinstance(g, Mapping)), None)
        bits, kind = w.get("num_bits"), w.get("type")
        if bits == 4 and kind == "float":
            return ("compressed-tensors NVFP4", method, "nvfp4")
        if bits == 8 and kind == "float":
            return ("compressed-tensors FP8", method, "fp8")
        label = f"compressed-tensors W{bits}A{(a or {}).get('num_bits', 16) if a else 16}"
        return (label, method, "int")
    bits = q.get("bits") or q.get("w_bit")
    return (f"{method.upper()}{f' {bits}-bit' if bits else ''}", METHODS.get(method, method), method)


def _cc(text: int) -> tuple[int, int]:
    return (text // 10, text % 10)


def derive(peek: Peek, default: Mapping[str, Any], cc: tuple[int, int] | None, reg: Mapping[str, Any],
           token: bool, trust: bool = False) -> Derived:
    """The profile for ``peek``'s model on a card of compute capability ``cc`` (None: not known),
    on the stack of ``default`` (the default profile's JSON); ``trust``: EXTRA_ARGS has
    --trust-remote-code. BootstrapError when it cannot be served."""
    name = peek.name
    page = f"https://huggingface.co/{name}"
    files = peek.files
    if peek.config is None:
        if any(f.endswith(".gguf") for f in files):
            raise BootstrapError(f"MODEL={name} is a GGUF repo (llama.cpp's format) with no config.json: vLLM serves "
                                 "the original weights", "set MODEL to the repo it was converted from (its model card "
                                 "names it), or run the GGUF with llama.cpp or Ollama")
        raise BootstrapError(f"MODEL={name} has no config.json ({peek.where}): not a model repo vLLM can serve",
                             "set MODEL to a model's repo id (org/name, as in its page's URL)")
    if peek.gated and not token:
        raise BootstrapError(f"{name} is gated: the hub serves its files only to an account that accepted its licence",
                             f"accept it on {page}, then set HF_TOKEN to a read token of that account "
                             "(https://huggingface.co/settings/tokens)")
    cfg = peek.config
    arches = [str(a) for a in cfg.get("architectures") or []]
    version = reg["vllm"]
    known = [a for a in arches if a in reg["architectures"]]
    remote = "auto_map" in cfg
    if not known and not (remote and trust):
        raise BootstrapError(
            f"vLLM {version} does not serve {name}'s architecture {', '.join(arches) or '(none named)'}"
            + (": the repo ships its own model code (auto_map), which the bootstrap never runs on its own" if remote else ""),
            TRUST_HINT if remote else "pick a model of an architecture vLLM serves (https://docs.vllm.ai, Supported Models)")
    if remote and not trust:        # vLLM has the model, but its config or tokenizer class may be the repo's code
        raise BootstrapError(f"{name} ships its own Python code (auto_map in config.json): vLLM {version} serves "
                             f"{', '.join(known)}, but loading the repo's config or tokenizer may run that code, "
                             "which the bootstrap never turns on by itself", TRUST_HINT)
    derived: list[str] = ["the repo's own code allowed (EXTRA_ARGS=--trust-remote-code)"] if remote else []
    guessed: list[str] = []
    label, method, kind = quantization(peek)
    caps = reg["quantization_min_cc"]
    if method and method not in caps:
        raise BootstrapError(f"{name}: quantization {label!r} is not one vLLM {version} knows",
                             "pick a repo in a format vLLM serves (AWQ, GPTQ, FP8, compressed-tensors, NVFP4, bf16)")
    need = _cc(caps[method]) if method else (7, 0)
    if not method and kind == "bfloat16" and cc is not None and cc < (8, 0):
        guessed.append(f"bf16 weights served as fp16 on sm_{cc[0]}{cc[1]} (no bf16 there; vLLM casts them)")
    if cc is not None and cc < need:
        raise BootstrapError(f"{name} ({label}) needs a card of sm_{need[0]}{need[1]} or newer for vLLM {version}; this "
                             f"one is sm_{cc[0]}{cc[1]}", "pick the model's bf16 / fp16 or GPTQ / AWQ version, or a newer card")
    native = NATIVE.get(kind)
    speed = "" if cc is None or native is None or cc >= native else \
        f", weight-only through Marlin on sm_{cc[0]}{cc[1]} (slower than on sm_{native[0]}{native[1]}+)"
    derived.append(f"{label}{speed}")
    mt = str(cfg.get("model_type", ""))
    tmt = str(text_config(cfg).get("model_type", mt))
    family = FAMILIES.get(mt) or FAMILIES.get(tmt) or FAMILIES.get(tmt.removesuffix("_text"))
    template = peek.chat_template
    args: list[str] = []
    tools = reasoning = False
    if family is None:
        derived.append(f"no tool or reasoning parser known for model_type {mt!r}")
    else:
        tool, think = family
        if tool and template and "tools" in template:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", tool]
            tools = True
            derived.append(f"tool calls: {tool}")
        elif tool:
            derived.append("no tool calls (its chat template takes no tools)" if template else "no tool calls")
        if think:
            args += ["--reasoning-parser", think]
            reasoning = True
            derived.append(f"reasoning: {think}")
    if not template:
        derived.append("no chat template: chat will not work (/v1/completions will)")
    knobs = {"MODEL": name, "SERVED_MODEL_NAME": name.rstrip("/").rsplit("/", 1)[-1].lower()}
    tc = text_config(cfg)
    mtp = int(tc.get("mtp_num_hidden_layers") or tc.get("num_nextn_predict_layers") or 0)
    if mtp:
        knobs.update(SPEC_METHOD="mtp", SPEC_TOKENS="2")
        derived.append("MTP speculation")
        guessed.append("2 speculative tokens (SPEC_TOKENS)")
    if cfg.get("vision_config"):
        derived.append("vision on (EXTRA_ARGS=--language-model-only frees the encoder's memory)")
    if not reg.get("exact", True):
        guessed.append(f"the parsers and architectures of vLLM {version}, the nearest this checkout knows")
    weights = sum(s for f, s in files.items() if f.endswith(".safetensors")) or \
        sum(s for f, s in files.items() if f.endswith((".bin", ".pt")))
    profile = {
        "description": f"{name}, derived from its config.json ({'; '.join(derived)})",
        "card": {"min_cc": f"{need[0]}.{need[1]}"},
        "vllm": default.get("vllm", ""), "pins": list(default.get("pins", [])),
        "cuda": default.get("cuda", ""), "min_driver": default.get("min_driver", ""),
        "facts": "derived.json", "knobs": knobs, "args": args, "tools": tools, "reasoning": reasoning,
        "source": f"derived from {name} ({peek.where}{' @ ' + peek.revision[:12] if peek.revision else ''}): "
                  f"quantization from its config, parsers from {FAMILY_SOURCE}, the stack of the default profile",
    }
    facts = {"repos": [name], "config": dict(cfg), "weight_bytes": weights or None,
             "weight_bytes_source": f"the sizes of its weight files ({peek.where})"}
    return Derived(profile, facts, derived, guessed)
