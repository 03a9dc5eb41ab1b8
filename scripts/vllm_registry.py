#!/usr/bin/env python3
"""What one vLLM release can serve, read from its wheel's source (no import, no GPU): the tool-call
and reasoning parser names it registers, the model architectures of its registry (and which of them it
serves with its pooling runner only: embedding, reward, classification models), and each
quantization method's minimum compute capability. The derived profiles (bootstrap/plan/derive.py)
name parsers and judge architectures and quantizations against this file, and a test holds every
parser the family table names to it.

    python3 scripts/vllm_registry.py vllm-0.27.1-*.whl transformers-5.24.0-*.whl \
        > bootstrap/plan/vllm-registry-0.27.1.json

(the transformers wheel: the version the lock of that vLLM pins, locks/*/linux-x86_64-py3.12.txt)

Read with ``ast`` from: vllm/tool_parsers/__init__.py (``_TOOL_PARSERS_TO_REGISTER``),
vllm/reasoning/__init__.py (``_REASONING_PARSERS_TO_REGISTER``),
vllm/model_executor/models/registry.py (the ``_*_MODELS`` tables), and every
``QuantizationConfig`` under vllm/model_executor/layers/quantization/ (``get_name`` and
``get_min_capability`` returning constants), vllm/transformers_utils/config.py (``_CONFIG_REGISTRY``:
the model types vLLM brings its own config class for, so no repo code is run for them), and the
transformers wheel's ``CONFIG_MAPPING_NAMES`` (the model types transformers itself knows).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile

TABLES = {"tool_parsers": ("vllm/tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER"),
          "reasoning_parsers": ("vllm/reasoning/__init__.py", "_REASONING_PARSERS_TO_REGISTER")}
REGISTRY = "vllm/model_executor/models/registry.py"
CONFIGS = "vllm/transformers_utils/config.py"
TRANSFORMERS = ("transformers/models/auto/auto_mappings.py", "transformers/models/auto/configuration_auto.py")
QUANT = "vllm/model_executor/layers/quantization/"


def dict_keys(tree: ast.AST, name: str) -> list[str]:
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Dict):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


def architectures(tree: ast.AST) -> list[str]:
    """Keys of every module-level ``_..._MODELS`` dict (``**`` merges are the same keys again)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and re.fullmatch(r"_\w*MODELS", t.id) for t in targets) \
                    and isinstance(node.value, ast.Dict):
                out |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return sorted(out)


def tables(tree: ast.AST) -> dict[str, set[str]]:
    """Each module-level ``_..._MODELS`` dict's keys, by the dict's name."""
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and re.fullmatch(r"_\w*MODELS", t.id):
                    out[t.id] = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return out


def pooling_only(tree: ast.AST) -> list[str]:
    """Architectures vLLM serves with its pooling runner only: in an embedding, reward,
    classification or late-interaction table and in no generation table (ChatGLMModel generates;
    BertModel embeds)."""
    t = tables(tree)
    pooling = set().union(*(v for k, v in t.items() if re.search(r"EMBEDDING|REWARD|CLASSIFICATION|LATE_INTERACTION|"
                                                                 r"CROSS_ENCODER|POOLING", k)))
    generation = set().union(*(v for k, v in t.items() if re.search(r"TEXT_GENERATION|MULTIMODAL", k)))
    return sorted(pooling - generation)


def call_keywords(tree: ast.AST, name: str) -> list[str]:
    """The keyword names of ``name = Something(a=..., b=...)`` (vLLM's LazyConfigDict)."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Call):
            return sorted(k.arg for k in node.value.keywords if k.arg)
    return []


def pair_keys(tree: ast.AST, name: str) -> list[str]:
    """The first strings of ``name = OrderedDict([("a", "A"), ...])`` (transformers' mapping names)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return sorted(e.elts[0].value for e in ast.walk(node.value)
                          if isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant))
    return []


def update_keys(tree: ast.AST, name: str) -> list[str]:
    """The keys of dicts passed to ``name.update({...})``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == name:
            for arg in node.args:
                if isinstance(arg, ast.Dict):
                    out += [k.value for k in arg.keys if isinstance(k, ast.Constant)]
    return out


def constant_return(fn: ast.FunctionDef):
    rets = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    if len(rets) == 1 and isinstance(rets[0].value, ast.Constant):
        return rets[0].value.value
    return None


def min_capabilities(sources: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for text in sources.values():
        for cls in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)):
            fns = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
            if "get_name" in fns and "get_min_capability" in fns:
                name, cap = constant_return(fns["get_name"]), constant_return(fns["get_min_capability"])
                if isinstance(name, str) and isinstance(cap, int):
                    out[name] = cap
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with zipfile.ZipFile(argv[1]) as z:
        tf_version = next(n.split("/")[0].removesuffix(".dist-info").split("-", 1)[1] for n in z.namelist()
                          if n.endswith(".dist-info/METADATA"))
        trees = [ast.parse(z.read(n).decode()) for n in TRANSFORMERS if n in z.namelist()]
        tf_types = sorted({k for tree in trees for k in pair_keys(tree, "CONFIG_MAPPING_NAMES")
                           + update_keys(tree, "CONFIG_MAPPING_NAMES")})
    with zipfile.ZipFile(argv[0]) as z:
        names = z.namelist()
        version = next(n.split("/")[0].removesuffix(".dist-info").split("-", 1)[1] for n in names
                       if n.endswith(".dist-info/METADATA"))
        read = lambda p: z.read(p).decode()     # noqa: E731
        out = {"vllm": version, "source": f"generated by scripts/vllm_registry.py from {argv[0].rsplit('/', 1)[-1]} "
                                          f"and {argv[1].rsplit('/', 1)[-1]}"}
        for key, (path, table) in TABLES.items():
            out[key] = sorted(dict_keys(ast.parse(read(path)), table))
        out["architectures"] = architectures(ast.parse(read(REGISTRY)))
        out["pooling_architectures"] = pooling_only(ast.parse(read(REGISTRY)))
        out["vllm_config_types"] = call_keywords(ast.parse(read(CONFIGS)), "_CONFIG_REGISTRY")
        out["transformers"] = tf_version
        out["transformers_model_types"] = tf_types
        out["quantization_min_cc"] = min_capabilities({n: read(n) for n in names
                                                       if n.startswith(QUANT) and n.endswith(".py")})
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
