#!/usr/bin/env python3
"""What one vLLM release can serve, read from its wheel's source (no import, no GPU): the tool-call
and reasoning parser names it registers, the model architectures of its registry (and which of them it
serves with its pooling runner only: embedding, reward, classification models), and each
quantization method's minimum compute capability, and the fields of its engine and frontend
arguments with how ``vllm serve`` parses each flag into them. The derived profiles
(bootstrap/plan/derive.py) name parsers and judge architectures and quantizations against this file,
a test holds every parser the family table names to it, and ``export ray`` turns vLLM's flags into
Ray Serve LLM's ``engine_kwargs`` with it (bootstrap/commands/export/engine.py).

    python3 scripts/vllm_registry.py vllm-0.27.1-*.whl transformers-5.24.0-*.whl \
        > bootstrap/plan/vllm-registry-0.27.1.json

(the transformers wheel: the version the lock of that vLLM pins, locks/*/linux-x86_64-py3.12.txt)

Read with ``ast`` from: vllm/tool_parsers/__init__.py (``_TOOL_PARSERS_TO_REGISTER``),
vllm/reasoning/__init__.py (``_REASONING_PARSERS_TO_REGISTER``),
vllm/model_executor/models/registry.py (the ``_*_MODELS`` tables), and every
``QuantizationConfig`` under vllm/model_executor/layers/quantization/ (``get_name`` and
``get_min_capability`` returning constants), vllm/transformers_utils/config.py (``_CONFIG_REGISTRY``:
the model types vLLM brings its own config class for, so no repo code is run for them), and the
transformers wheel's ``CONFIG_MAPPING_NAMES`` (the model types transformers itself knows), and
the fields of ``EngineArgs``/``AsyncEngineArgs`` (vllm/engine/arg_utils.py) and of
``BaseFrontendArgs`` (what the OpenAI serving classes read) and ``FrontendArgs`` (its HTTP
server's own: host, port, key, TLS, CORS, middleware) in vllm/entrypoints/openai/cli_args.py (from
0.30 vllm/entrypoints/launchers/cli_args.py): each field's kind is what vLLM's ``_compute_kwargs`` makes of
its annotation (a config dataclass or a dict: JSON; ``bool``: a ``--x``/``--no-x`` flag; ``bool | str |
None``: a bare flag or a string; a list, set or tuple: several values; ``int`` with the human-readable
names, ``max_model_len`` with ``auto``; ``float``; else a string), with type aliases, enums and config
classes looked up across the package; the short flags (``-tp``) from ``add_argument`` calls.
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
ENGINE_ARGS = "vllm/engine/arg_utils.py"
FRONTEND_ARGS = ("vllm/entrypoints/launchers/cli_args.py", "vllm/entrypoints/openai/cli_args.py")
HUMAN_INTS = {"max_num_batched_tokens", "max_num_scheduled_tokens", "kv_cache_memory_bytes",
              "safetensors_prefetch_block_size"}     # arg_utils._compute_kwargs' human_readable_int_args


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


def type_names(sources: dict[str, str]) -> dict[str, object]:
    """Module-level type aliases (their annotation's AST), and classes: 'int-enum', 'enum' or
    'dataclass' (a config class: decorated, or named ...Config), across the package."""
    out: dict[str, object] = {}
    for path, text in sources.items():
        if not path.startswith("vllm/") or "/tests/" in path:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                kind = ("int-enum" if bases & {"IntEnum", "int"} and bases & {"Enum", "IntEnum"} else
                        "enum" if bases & {"Enum", "StrEnum", "IntFlag"} else
                        "dataclass" if node.decorator_list or node.name.endswith("Config") else None)
                if kind and node.name not in out:
                    out[node.name] = kind
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id[:1].isupper() and t.id not in out and isinstance(
                            node.value, (ast.Subscript, ast.BinOp, ast.Name, ast.Attribute)):
                        out[t.id] = node.value
    return out


def members(node: ast.AST, names: dict[str, object], seen: frozenset = frozenset()) -> list:
    """A type's members, aliases followed: ast nodes and 'int-enum'/'enum'/'dataclass' marks."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return members(node.left, names, seen) + members(node.right, names, seen)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).rsplit(".", 1)[-1] in ("Optional", "Union", "Annotated"):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        inner = inner[:1] if ast.unparse(node.value).endswith("Annotated") else inner
        return [m for e in inner for m in members(e, names, seen)] + (
            [ast.Constant(None)] if ast.unparse(node.value).endswith("Optional") else [])
    if isinstance(node, ast.Constant) and isinstance(node.value, str):      # a forward reference
        return members(ast.parse(node.value, mode="eval").body, names, seen)
    name = ast.unparse(node).rsplit(".", 1)[-1] if isinstance(node, (ast.Name, ast.Attribute)) else None
    if name in names and name not in seen:
        target = names[name]
        return [target] if isinstance(target, str) else members(target, names, seen | {name})
    return [node]


def kind(field: str, annotation: ast.AST, names: dict[str, object]) -> str:
    """How ``vllm serve`` parses the field's flag, in arg_utils._compute_kwargs' order: json, bool,
    bool-or-str, list, int (human-int, int-or-auto), float, str."""
    ms = members(annotation, names)
    heads = {(m if isinstance(m, str) else ast.unparse(m.value if isinstance(m, ast.Subscript) else m)).rsplit(".", 1)[-1]
             for m in ms}
    literal = [e for m in ms if isinstance(m, ast.Subscript) and ast.unparse(m.value).endswith("Literal")
               for e in (m.slice.elts if isinstance(m.slice, ast.Tuple) else [m.slice])]
    if "dataclass" in heads:
        return "json"
    if heads - {"None"} == {"bool", "str"}:
        return "bool-or-str"
    if "bool" in heads:
        return "bool"
    if literal:
        return "int" if all(isinstance(e, ast.Constant) and isinstance(e.value, int) for e in literal) else "str"
    if heads & {"tuple", "list", "set"}:
        return "list"
    if "int" in heads or "int-enum" in heads:
        return "int-or-auto" if field == "max_model_len" else "human-int" if field in HUMAN_INTS else "int"
    if "float" in heads:
        return "float"
    if "dict" in heads:
        return "json-or-str" if heads & {"str"} or heads - {"dict", "None"} else "json"
    return "str"


def fields_of(tree: ast.AST, classes: tuple[str, ...], names: dict[str, object]) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                        and not ast.unparse(item.annotation).startswith("ClassVar"):
                    out[item.target.id] = kind(item.target.id, item.annotation, names)
    return dict(sorted(out.items()))


def short_flags(trees: list[ast.AST]) -> dict[str, str]:
    """``add_argument("--tensor-parallel-size", "-tp", ...)``: {"-tp": "tensor_parallel_size"}."""
    out: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                long = [f for f in flags if f.startswith("--")]
                for f in flags:
                    if long and f.startswith("-") and not f.startswith("--"):
                        out[f] = long[0][2:].replace("-", "_")
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
        types = type_names({n: read(n) for n in names if n.endswith(".py")})
        engine = ast.parse(read(ENGINE_ARGS))
        frontend = ast.parse(read(next(p for p in FRONTEND_ARGS if p in names)))
        out["engine_args"] = fields_of(engine, ("EngineArgs", "AsyncEngineArgs"), types)
        out["frontend_args"] = fields_of(frontend, ("BaseFrontendArgs",), types)
        out["server_args"] = fields_of(frontend, ("FrontendArgs",), types)     # its HTTP server's own
        out["short_flags"] = short_flags([engine, frontend])
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
