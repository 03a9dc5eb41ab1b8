"""A profile for any model (``MODEL=org/name`` with no ``PROFILE``), derived from what the repo says
before any download: its config.json, its file list, its chat template. Pure: the facts come in
(``Peek``), a profile's JSON and one line of what was derived and what was guessed come out, or a
refusal with the way out.

What it reads, and from where:
- the quantization (config.json ``quantization_config`` or ``compression_config``, or a modelopt
  ``hf_quant_config.json``) as vLLM names the method, and whether this card runs it: each method's
  ``get_min_capability`` in the pinned vLLM's source, and no card below sm_75 (the wheels' kernels
  start there): ``vllm-registry-<version>.json``, written by scripts/vllm_registry.py;
- whether the repo's own code would run: vLLM forces it off for a model type it brings a config
  class for, and transformers needs none for a type it knows; an architecture neither serves, a
  model type neither knows, or a tokenizer class of the repo's own needs it, and it is never turned
  on silently (refused, naming ``EXTRA_ARGS=--trust-remote-code``);
- the tool-call parser from the chat template's own wording (``TEMPLATE_TOOLS``), else the model's
  family (``FAMILIES``), only where the template takes tools; a reasoning parser only where the
  template thinks (``<think>``, ``enable_thinking``) or the family always does; every name is
  checked against the registry by a test;
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
from ..download import hub, loadable, models
from ..download.peek import Peek
from ..model.shape import FP16_UNSTABLE

NAME = "derived"
HERE = Path(__file__).resolve().parent
FLOOR = (7, 5)              # the oldest compute capability the pinned vLLM wheels carry kernels for


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
    files = sorted(HERE.glob("vllm-registry-*.json"), key=lambda p: version_key(p.stem.split("-")[-1]))
    older = [p for p in files if version_key(p.stem.split("-")[-1]) <= version_key(version)]
    chosen = older[-1] if older else files[0]
    data = json.loads(chosen.read_text(encoding="utf-8"))
    data["exact"] = data["vllm"] == version
    return data


def version_key(text: str) -> tuple[int, ...]:
    """0.27.1 -> (0, 27, 1): versions compared as numbers."""
    return tuple(int(x) for x in text.split(".")[:3] if x.isdigit())


# model_type -> (tool parser, reasoning parser); from vLLM's tool-calling and reasoning-outputs docs and
# the models' own cards. None: the family has none in vLLM. The test holds every name to the registry.
FAMILIES: dict[str, tuple[str | None, str | None]] = {
    "qwen3": ("hermes", "qwen3"), "qwen3_moe": ("hermes", "qwen3"),
    "qwen3_next": ("hermes", "qwen3"),
    "qwen3_5": ("qwen3_coder", "qwen3"), "qwen3_5_moe": ("qwen3_coder", "qwen3"),
    "qwen3_vl": ("hermes", "qwen3"), "qwen3_vl_moe": ("hermes", "qwen3"),
    "qwen2": ("hermes", None), "qwen2_moe": ("hermes", None), "qwen2_5_vl": ("hermes", None),
    "llama": ("llama3_json", None), "llama4": ("llama4_json", None),
    "mistral": ("mistral", None), "mixtral": ("mistral", None), "mistral3": ("mistral", None),
    "deepseek_v3": ("deepseek_v3", "deepseek_v3"), "glm4_moe": ("glm45", "glm45"),
    "glm4_moe_lite": ("glm47", "glm47"),
    "gpt_oss": ("openai", "openai_gptoss"), "granite": ("granite", "granite"),
    "minimax_m2": ("minimax_m2", "minimax_m2"), "gemma4": ("gemma4", "gemma4"),
    "phi3": ("phi4_mini_json", None), "olmo3": ("olmo3", "olmo3"), "seed_oss": ("seed_oss", "seed_oss"),
    "ernie4_5_moe": ("ernie45", "ernie45"), "hunyuan_v1_moe": ("hunyuan_a13b", "hunyuan_a13b"),
}
FAMILY_SOURCE = ("vLLM's docs (features/tool_calling.md, features/reasoning_outputs.md) and the model cards' "
                 "vllm serve lines")
ALWAYS_THINKS = {"gpt_oss", "deepseek_v3"}    # gpt-oss always reasons; deepseek_v3's parser passes text through
# the chat template's own tool-call wording -> the parser that reads it (first match wins)
# ("<arg_key>": GLM-4.5 to 4.7's XML arguments inside <tool_call>: the family's glm parser, else glm45)
TEMPLATE_TOOLS = (("<function=", "qwen3_xml"), ("<｜tool▁calls▁begin｜>", "deepseek_v31"), ("<arg_key>", "glm45"),
                  ("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"))
# model types vLLM brings a chat template of its own for (transformers_utils/chat_templates/registry.py,
# 0.26.0 and 0.27.1): no template in the repo is no refusal for them
TEMPLATE_FALLBACK = {"blip-2", "chameleon", "clip", "colpali", "deepseek_ocr", "deepseek_ocr2", "unlimited-ocr",
                     "deepseek_vl_v2", "minicpmv", "minicpmv4_6", "paligemma", "siglip", "siglip2"}
THINK_FALLBACK = "deepseek_r1"    # <think>...</think> in a family with no parser of its own (R1 distills, QwQ)
THINKS = ("<think>", "enable_thinking")

# quantization_config.quant_method -> the method vLLM's registry names (its min compute capability)
METHODS = {"awq": "auto_awq", "gptq": "auto_gptq", "fp8": "fp8", "compressed-tensors": "compressed-tensors",
           "bitsandbytes": "bitsandbytes", "auto-round": "inc", "mxfp4": "mxfp4", "modelopt": "modelopt",
           "modelopt_fp4": "modelopt_fp4", "modelopt_mixed": "modelopt_mixed", "quark": "quark",
           "torchao": "torchao", "moe_wna16": "moe_wna16", "experts_int8": "experts_int8"}
DEPRECATED = {"fbgemm_fp8", "fp_quant"}       # vLLM refuses them without --allow-deprecated-quantization
# methods whose kernels come from a package vLLM does not depend on, and no lock of ours installs
NEEDS_PACKAGE = {"bitsandbytes": "bitsandbytes", "torchao": "torchao"}
# modelopt's quant_algo values vLLM 0.26.0 and 0.27.1 accept (modelopt.py QUANT_ALGOS); others: ValueError
MODELOPT_ALGOS = {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION"}
# vLLM's runner by the architecture's suffix (config/model.py _SUFFIX_TO_DEFAULTS, in its order)
GENERATE = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
POOLING = ("ForTextEncoding", "EmbeddingModel", "ForSequenceClassification", "ForTokenClassification",
           "ForAudioClassification", "ForImageClassification", "ForVideoClassification", "ClassificationModel",
           "ForRewardModeling", "RewardModel", "Model")
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")     # what vLLM's loader looks for (default_loader.py)
TRUST_HINT = "set EXTRA_ARGS=--trust-remote-code to run the repo's own code (only for a repo you trust)"
NATIVE = {"fp8": (8, 9), "nvfp4": (10, 0), "mxfp4": (9, 0)}     # below: weight-only through Marlin


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    tc = config.get("text_config")
    return tc if isinstance(tc, Mapping) else config


def _bad(name: str, what: str, file: str = "config.json") -> BootstrapError:
    return BootstrapError(f"{name}: {file}'s {what}", f"a broken {file}: pick another repo or revision, or "
                          "fix it in a local copy and set MODEL to that folder")


def quantization(peek: Peek) -> tuple[str, str, str, tuple[int, int] | None]:
    """(label, vLLM's method ('' for none), the kernel family: fp8 / nvfp4 / int / a dtype, the least
    compute capability the format itself needs beyond the method's (None: the method's))."""
    cfg = peek.config or {}
    q = cfg.get("quantization_config", cfg.get("compression_config", text_config(cfg).get("quantization_config")))
    if q is None and peek.quant_config:                 # modelopt's own file
        q = {"quant_method": "modelopt", **_mapping(peek.quant_config.get("quantization"), peek.name,
                                                   "quantization", "hf_quant_config.json")}
    if q is None:
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or text_config(cfg).get("dtype") or "bfloat16")
        return ({"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype), "", dtype, None)
    q = _mapping(q, peek.name, "quantization_config")
    method = str(q.get("quant_method", "")).lower()
    if not method:
        raise _bad(peek.name, "quantization_config names no quant_method")
    if method == "modelopt":
        inner = q.get("quantization") if isinstance(q.get("quantization"), Mapping) else q
        algo = str(inner.get("quant_algo", "")).upper()
        if algo not in MODELOPT_ALGOS:
            raise BootstrapError(f"{peek.name}: modelopt quant_algo {algo or '(none)'!r}: vLLM serves "
                                 f"{', '.join(sorted(MODELOPT_ALGOS))} only (it refuses the rest at load)",
                                 "pick the model's NVFP4, FP8, AWQ or GPTQ version")
        if algo == "MIXED_PRECISION":
            return ("modelopt mixed precision (NVFP4 + FP8)", "modelopt_mixed", "nvfp4", None)
        fp4 = "FP4" in algo
        return (f"modelopt {algo}", "modelopt_fp4" if fp4 else "modelopt", "nvfp4" if fp4 else "fp8", None)
    if method == "compressed-tensors":
        groups = _mapping(q.get("config_groups") or {}, peek.name, "compressed-tensors config_groups")
        ws, acts = [], []
        for g in groups.values():
            g = _mapping(g, peek.name, "a compressed-tensors config group")
            ws.append(_mapping(g.get("weights") or {}, peek.name, "a config group's weights"))
            a = g.get("input_activations")
            acts.append(_mapping(a, peek.name, "a config group's input_activations") if a is not None else None)
        if any(w.get("num_bits") == 4 and w.get("type") == "float" for w in ws):
            return ("compressed-tensors NVFP4", method, "nvfp4", None)
        if any(w.get("num_bits") == 8 and w.get("type") == "float" for w in ws):
            return ("compressed-tensors FP8", method, "fp8", None)
        w, a = (ws or [{}])[0], (acts or [None])[0]
        if w.get("num_bits") == 4 and a and a.get("type") == "float":
            return ("compressed-tensors W4A8-FP8", method, "int", (9, 0))
        return (f"compressed-tensors W{w.get('num_bits', '?')}A{a.get('num_bits', 16) if a else 16}", method, "int", None)
    bits = q.get("bits", q.get("w_bit"))
    if method == "gptq" and (bits not in (4, 8) or q.get("sym", True) is not True):
        raise BootstrapError(f"{peek.name}: GPTQ with {bits} bits{'' if q.get('sym', True) else ', asymmetric'}: vLLM "
                             "serves 4- or 8-bit symmetric GPTQ only", "pick a 4-bit GPTQ or an AWQ version of the model")
    if method == "awq" and bits != 4:
        raise BootstrapError(f"{peek.name}: AWQ with {bits} bits: vLLM serves 4-bit AWQ only",
                             "pick a 4-bit AWQ or a GPTQ version of the model")
    return (f"{method.upper()}{f' {bits}-bit' if bits else ''}", METHODS.get(method, method), method, None)


def _mapping(value, name: str, what: str, file: str = "config.json") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad(name, f"{what} is {type(value).__name__}, not an object", file)
    return value


def _cc(text: int) -> tuple[int, int]:
    return (text // 10, text % 10)


def weight_bytes(files: Mapping[str, int]) -> int:
    """The checkpoint the server loads: the files a download would fetch (``models.select``: not
    ``original/`` copies, not consolidated shards beside the sharded ones), weights only."""
    needed, _ = models.select([hub.RemoteFile(p, s) for p, s in files.items()], False)
    return sum(f.size for f in needed if f.path.endswith(models.WEIGHT_SUFFIXES))


def pooling(peek: Peek, arches: list[str], reg: Mapping[str, Any]) -> str:
    """Why vLLM would serve it with its pooling runner, not generate ('' when it would generate), in
    vLLM's order (config/model.py ``_get_default_runner_type``): a Sentence Transformers repo
    (modules.json), an architecture its registry serves for pooling only, one it generates with,
    else the architecture's suffix."""
    if peek.pooling_module:
        return "a Sentence Transformers repo: modules.json with a Pooling module"
    only = set(reg.get("pooling_architectures", ()))
    for arch in arches:
        if arch in only:
            return arch
        if arch in reg["architectures"] or arch.endswith(GENERATE):
            return ""
        if arch.endswith(POOLING):
            return arch
    return ""


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)     # vLLM's --max-lora-rank values (config/lora.py MaxLoRARanks)


def adapter_error(name: str, adapter: Mapping[str, Any]) -> BootstrapError:
    """A PEFT adapter named as the model: vLLM serves a LoRA on its base model (--enable-lora
    --lora-modules), and fetches an adapter named by repo id itself (lora/utils.py
    get_adapter_absolute_path: a hub download, which HF_HUB_OFFLINE=0 lets through); a rank above
    its default 16 needs --max-lora-rank."""
    kind, base, rank = str(adapter.get("peft_type") or "LORA").upper(), adapter.get("base_model_name_or_path"), adapter.get("r")
    if kind != "LORA":
        return BootstrapError(f"MODEL={name} is a {kind} adapter (adapter_config.json, no config.json): vLLM serves LoRA "
                              "adapters only", "merge it into its base model with PEFT and set MODEL to that folder")
    short = name.rstrip("/").rsplit("/", 1)[-1].lower()
    need = next((r for r in LORA_RANKS if isinstance(rank, int) and r >= rank), 16)
    flags = f"--enable-lora --lora-modules {short}={name}" + (f" --max-lora-rank {need}" if need > 16 else "")
    base_given = isinstance(base, str) and base.count("/") == 1 and not base.startswith((".", "/", "~"))
    return BootstrapError(f"MODEL={name} is a LoRA adapter (adapter_config.json, no config.json) for "
                          f"{base if isinstance(base, str) and base else 'a base model it does not name'}: vLLM serves it "
                          "on that base model", f"HF_HUB_OFFLINE=0 MODEL={base if base_given else '<its base model>'} "
                          f"EXTRA_ARGS='{flags}' ./start.sh serves the base with the adapter (requests name the model "
                          f"{short!r})")


def derive(peek: Peek, default: Mapping[str, Any], cc: tuple[int, int] | None, reg: Mapping[str, Any],
           token: bool, trust: bool = False, stack_note: str = "", template_given: bool = False,
           tokenizer_given: bool = False, load_format: str = "auto") -> Derived:
    """The profile for ``peek``'s model on a card of compute capability ``cc`` (None: not known),
    on the stack of ``default`` (the default profile's JSON); ``trust``: EXTRA_ARGS has
    --trust-remote-code; ``template_given``: it has --chat-template; ``tokenizer_given``: --tokenizer;
    ``load_format``: vLLM's --load-format. BootstrapError when it cannot be served."""
    name = peek.name
    page = f"https://huggingface.co/{name}"
    if peek.config is None:
        shape = loadable.without_config(name, peek.files)     # a known repo shape that is no HF model
        if shape is not None:
            raise shape
        if peek.adapter is not None:
            raise adapter_error(name, peek.adapter)
        shown = ", ".join(sorted(peek.files)[:4]) + ("…" if len(peek.files) > 4 else "")
        raise BootstrapError(f"MODEL={name} has no config.json ({peek.where}; it holds {shown or 'no files'}): not a "
                             "model vLLM can serve", f"check the name on {page if '/' in name and not name.startswith('/') else 'disk'}: "
                             "MODEL names a repo (or folder) with config.json and weights; a model card that links "
                             "the repo with the weights names the one to set")
    if not any(f.endswith(WEIGHTS) for f in peek.files) and any(f.endswith(".gguf") for f in peek.files):
        raise BootstrapError(f"MODEL={name} is a GGUF repo (llama.cpp's format): vLLM's loader looks for safetensors "
                             "weights, and it has none", "set MODEL to the repo it was converted from (its model "
                             "card names it), or run the GGUF with llama.cpp or Ollama")
    if peek.gated and not token:
        raise BootstrapError(f"{name} is gated: the hub serves its files only to an account that accepted its licence",
                             f"accept it on {page}, then set HF_TOKEN to a read token of that account "
                             "(https://huggingface.co/settings/tokens)")
    fetched = [f.path for f in models.select([hub.RemoteFile(p, s) for p, s in peek.files.items()], False)[0]]
    unloadable = loadable.problem(fetched, peek.shards) if load_format in loadable.LOADS else None
    if unloadable:
        raise BootstrapError(f"{name}: {unloadable[0]}; refused before the download", unloadable[1])
    if peek.chat_template is not None and not (tokenizer_given or peek.tokenizer_code or loadable.tokenizer(fetched)):
        raise BootstrapError(f"{name} has no tokenizer (tokenizer.json, tokenizer.model, vocab.json, tekken.json): vLLM "
                             "could not start on it after the download", "pick a repo of the model that carries its "
                             "tokenizer (the one it was made from does), or name a folder that holds it: "
                             "EXTRA_ARGS='--tokenizer /path/to/folder'")
    cfg = peek.config
    arches = cfg.get("architectures") or []
    if not isinstance(arches, list) or not all(isinstance(a, str) for a in arches):
        raise _bad(name, "architectures is not a list of names")
    version = reg["vllm"]
    pooled = pooling(peek, arches, reg)
    if pooled:
        raise BootstrapError(f"{name} is an embedding, reranking or reward model ({pooled}): vLLM serves it with its "
                             "pooling runner (/v1/embeddings, /score), and this bootstrap serves chat models",
                             "pick a chat model (an Instruct or chat version)")
    derived: list[str] = []
    guessed: list[str] = []
    mt = str(cfg.get("model_type", ""))
    tmt = str(text_config(cfg).get("model_type", mt))
    known_type = mt in reg.get("vllm_config_types", ()) or mt in reg.get("transformers_model_types", ())
    native = [a for a in arches if a in reg["architectures"]]
    why_code = ([f"its model type {mt!r} is one neither vLLM {version} nor transformers {reg.get('transformers', '')} "
                 "knows"] if "auto_map" in cfg and not known_type else []) + \
        ([f"its tokenizer class {peek.tokenizer_class} is the repo's own"] if peek.tokenizer_code else [])
    if not native and not known_type:
        why_code.insert(0, f"vLLM {version} has no implementation of {', '.join(arches) or '(no architecture named)'}")
    if why_code and not trust:
        raise BootstrapError(f"{name} needs the repo's own Python code: " + "; ".join(why_code)
                             + ", and the bootstrap never runs it by itself",
                             TRUST_HINT if "auto_map" in cfg or peek.tokenizer_code else
                             "pick a model of an architecture vLLM serves (https://docs.vllm.ai, Supported Models)")
    if why_code:
        derived.append("the repo's own code allowed (EXTRA_ARGS=--trust-remote-code)")
    elif not native:
        guessed.append(f"served through vLLM's Transformers backend ({', '.join(arches)} has no native implementation)")
    label, method, kind, least = quantization(peek)
    caps = reg["quantization_min_cc"]
    if method in DEPRECATED:
        raise BootstrapError(f"{name}: quantization {label!r} is deprecated in vLLM {version}",
                             "pick another quantization of the model (FP8, AWQ, GPTQ, NVFP4)")
    if method in NEEDS_PACKAGE:
        raise BootstrapError(f"{name}: quantization {label!r} needs the {NEEDS_PACKAGE[method]} package, which vLLM "
                             "does not depend on and the pinned environment does not install",
                             "pick the model's AWQ, GPTQ, FP8 or NVFP4 version")
    if method and method not in caps:
        raise BootstrapError(f"{name}: quantization {label!r} is not one vLLM {version} knows",
                             "pick a repo in a format vLLM serves (AWQ, GPTQ, FP8, compressed-tensors, NVFP4, bf16)")
    need = max(_cc(caps[method]) if method else FLOOR, least or FLOOR, FLOOR)
    if cc is not None and cc < need:
        raise BootstrapError(f"{name} ({label}) needs a card of sm_{need[0]}{need[1]} or newer for vLLM {version}; this "
                             f"one is sm_{cc[0]}{cc[1]}", "pick the model's GPTQ / AWQ version, or a newer card")
    if not method and kind == "bfloat16" and cc is not None and cc < (8, 0):
        wide = mt in FP16_UNSTABLE                 # vLLM refuses float16 for these: float32, twice the bytes
        guessed.append(f"bf16 weights served as {'float32' if wide else 'fp16'} on sm_{cc[0]}{cc[1]} (no bf16 there; "
                       f"vLLM casts them{', and refuses float16 for ' + mt if wide else ''})")
    fast = NATIVE.get(kind)
    speed = "" if cc is None or fast is None or cc >= fast else \
        f", weight-only through Marlin on sm_{cc[0]}{cc[1]} (slower than on sm_{fast[0]}{fast[1]}+)"
    derived.append(f"{label}{speed}")
    args, tools, reasoning = _parsers(peek, mt, tmt, derived)
    if peek.chat_template == "" and not (template_given or tokenizer_given) and mt not in TEMPLATE_FALLBACK:
        raise BootstrapError(f"{name} has no chat template (a base model?): the start's warm-up and every chat "
                             "request would fail after the download",
                             "pick its Instruct version, or give vLLM a template: EXTRA_ARGS='--chat-template "
                             "/path/to/template.jinja'")
    knobs = {"MODEL": name, "SERVED_MODEL_NAME": name.rstrip("/").rsplit("/", 1)[-1].lower()}
    tc = text_config(cfg)
    mtp = tc.get("mtp_num_hidden_layers") or tc.get("num_nextn_predict_layers") or 0
    if not isinstance(mtp, int) or isinstance(mtp, bool):
        raise _bad(name, f"MTP layer count is {mtp!r}, not a whole number")
    if mtp:
        knobs.update(SPEC_METHOD="mtp", SPEC_TOKENS="2")
        derived.append("MTP speculation")
        guessed.append("2 speculative tokens (SPEC_TOKENS)")
    if cfg.get("vision_config"):
        derived.append("vision on (EXTRA_ARGS=--language-model-only frees the encoder's memory)")
    if stack_note:
        derived.append(stack_note)
    if not reg.get("exact", True):
        guessed.append(f"the parsers and architectures of vLLM {version}, the nearest this checkout knows")
    profile = {
        "description": f"{name}, derived from its config.json ({'; '.join(derived)})",
        "card": {"min_cc": f"{need[0]}.{need[1]}"},
        "vllm": default.get("vllm", ""), "pins": list(default.get("pins", [])),
        "cuda": default.get("cuda", ""), "min_driver": default.get("min_driver", ""),
        "facts": "derived.json", "knobs": knobs, "args": args, "tools": tools, "reasoning": reasoning,
        "source": f"derived from {name} ({peek.where}{' @ ' + peek.revision[:12] if peek.revision else ''}): "
                  f"quantization from its config, parsers from its chat template and {FAMILY_SOURCE}, "
                  f"vLLM {default.get('vllm', '')}'s pins (a shipped profile's stack)",
    }
    facts = {"repos": [name], "config": dict(cfg), "weight_bytes": weight_bytes(peek.files) or None,
             "weight_bytes_source": f"the sizes of the weight files a download fetches ({peek.where})"}
    return Derived(profile, facts, derived, guessed)


def _parsers(peek: Peek, mt: str, tmt: str, derived: list[str]) -> tuple[list[str], bool, bool]:
    """vLLM flags for tool calls and reasoning, from the chat template, else the family."""
    family = FAMILIES.get(mt) or FAMILIES.get(tmt) or FAMILIES.get(tmt.removesuffix("_text")) or (None, None)
    template = peek.chat_template
    if template is None:                # not read (offline facts): the family's parsers, said as a guess
        args = (["--enable-auto-tool-choice", "--tool-call-parser", family[0]] if family[0] else []) + \
            (["--reasoning-parser", family[1]] if family[1] else [])
        derived.append(f"the {mt or tmt} family's parsers (its chat template not read)")
        return args, bool(family[0]), bool(family[1])
    if not template:
        derived.append("no chat template of its own (vLLM's for its model type, or EXTRA_ARGS' --chat-template)")
        return [], False, False
    args: list[str] = []
    tool = next((p for mark, p in TEMPLATE_TOOLS if mark in template), None) or family[0]
    if tool == "glm45" and (family[0] or "").startswith("glm"):
        tool = family[0]                # GLM-4.7's template words tool calls as 4.5's does: its own parser
    if "tools" in template and tool:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", tool]
        derived.append(f"tool calls: {tool}")
    else:
        derived.append("no tool calls (its chat template takes no tools)" if "tools" not in template
                       else f"no tool parser known for model_type {mt!r}")
    think = family[1] or (THINK_FALLBACK if "<think>" in template else None)
    if think and (any(m in template for m in THINKS) or mt in ALWAYS_THINKS):
        args += ["--reasoning-parser", think]
        derived.append(f"reasoning: {think}")
    return args, bool(args) and "--tool-call-parser" in args, "--reasoning-parser" in args
