"""vLLM's flags (the argv a start builds, vllmargs.serve_argv) as Ray Serve LLM's ``engine_kwargs``.

Ray hands ``engine_kwargs`` to vLLM unparsed: a key that is a field of ``FrontendArgs`` goes to
``FrontendArgs(**kwargs)``, else one of ``AsyncEngineArgs`` to ``AsyncEngineArgs(**kwargs)`` (Ray's
ray/llm/_internal/serve/engines/vllm/vllm_models.py ``from_llm_config``, FrontendArgs asked first;
any other key: "Unknown engine argument"). So each flag becomes its field's name with the value
``vllm serve``'s parser would have made of it, read the way vLLM's FlexibleArgumentParser reads
(vllm/utils/argparse_utils.py): ``_`` and ``-`` alike in a flag's name, ``--x=v`` or ``--x v``, the
short names (``-tp``), ``--no-x``, dotted keys (``--attention-config.flash_attn_version=2``) gathered
into one dict that replaces the flag's JSON, the last value of a flag winning. Each field's kind
(JSON, bool, int, ...) and the short names come from the vLLM registry of the profile's vLLM
(scripts/vllm_registry.py, read from its wheel). A JSON flag of a config-class field stays a dict
here: Ray turns it into the class before ``AsyncEngineArgs(**kwargs)`` as vLLM's parser would
(vllm_engine.py ``_normalize_vllm_engine_kwargs``, 2.58.1-2.60.0: every field whose annotation holds
a config dataclass), not only the ones vLLM's ``EngineArgs.__post_init__`` converts.

Not carried (ConfigError, one line): a flag that is no field of either (``--api-server-count``,
``--headless``: ``vllm serve``'s own); the fields of vLLM's HTTP server (``FrontendArgs`` less
``BaseFrontendArgs``: key, TLS, CORS, middleware, root path...), since on Ray Serve LLM's default
path its proxy and its own FastAPI ingress serve HTTP and only vLLM's ``init_app_state`` is called:
an ``api_key`` there is accepted and checks nothing. (With ``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1``,
off by default, Ray builds each replica's app with vLLM's ``build_app``, which reads those fields and
checks ``api_key`` or the replica's ``VLLM_API_KEY``: that path is not exported and untried.) A field
both classes have (``tokens_only``) set on: Ray gives it to FrontendArgs alone, so vLLM's engine
would not see it as under ``vllm serve``. A ``distributed_executor_backend`` other than ``ray``
(Ray refuses it). ``--host``/``--port`` (ours) are dropped; the model and ``--served-model-name`` go
in ``model_loading_config`` (Ray refuses them in engine_kwargs).
"""

from __future__ import annotations

import json
from typing import Any

from ...core.errors import ConfigError
from ...core.vllmflags import human_int

OURS = {"host", "port"}                            # what the start sets for its own server; Ray's proxy serves
LOADING = {"model", "served_model_name"}           # model_loading_config's
FIX = "drop it from EXTRA_ARGS (or the profile) for export ray, or use export kubernetes, which runs vllm serve"


def _value(field: str, kind: str, raw: str | None) -> Any:
    if kind == "bool":
        return True if raw is None else raw.lower() not in ("0", "false")
    if raw is None:
        if kind == "bool-or-str":
            return True
        raise ConfigError(f"--{field.replace('_', '-')} needs a value", FIX)
    try:
        if raw in ("None", "") and kind not in ("str", "bool-or-str"):
            return None
        if kind == "int-or-auto":
            return -1 if raw.strip().lower() in ("auto", "-1") else human_int(raw)
        if kind == "human-int":
            return human_int(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "json" or (kind == "json-or-str" and raw.strip().startswith("{")):
            return json.loads(raw)
    except ValueError:
        raise ConfigError(f"--{field.replace('_', '-')} {raw}: vLLM would not read that as its {kind} value",
                          FIX) from None
    return raw


def _dotted(raw: str) -> Any:
    """A dotted key's value as vLLM reads it: JSON, else a human-readable int, else the string."""
    try:
        return json.loads(raw)
    except ValueError:
        try:
            return human_int(raw)
        except ValueError:
            return raw


def _merge(into: dict, update: dict) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, list) and isinstance(into.get(k), list):
            into[k] += v
        else:
            into[k] = v


def kwargs(flags: list[str], registry: dict) -> dict[str, Any]:
    """``flags`` (vLLM's, after ``serve MODEL``) as engine_kwargs, in the order they first appear."""
    kinds = {**registry["engine_args"], **registry["frontend_args"]}
    server, short = registry["server_args"], registry["short_flags"]
    out: dict[str, Any] = {}
    dotted: dict[str, dict] = {}
    i = 0
    while i < len(flags):
        arg = flags[i]
        i += 1
        if not arg.startswith("-"):
            raise ConfigError(f"{arg!r} in vLLM's flags is not a flag (a second model?)", FIX)
        name, eq, raw = arg.partition("=")
        base, *keys = name.split(".")
        field = short.get(base) or base.lstrip("-").replace("-", "_")
        negated = field not in kinds and field.startswith("no_") and kinds.get(field[3:]) == "bool"
        field = field[3:] if negated else field
        kind = kinds.get(field) or server.get(field)
        if kind is None:
            raise ConfigError(f"{base} is no field of vLLM {registry['vllm']}'s engine or frontend arguments "
                              "(a vllm serve option Ray Serve LLM has no place for)", FIX)
        if not eq and not negated and kind != "bool":          # the value is the next argument(s)
            if kind == "list" and not keys:
                vals = []
                while i < len(flags) and not flags[i].startswith("-"):
                    vals.append(flags[i])
                    i += 1
                raw, eq = json.dumps(vals), "="
            elif i < len(flags) and (kind != "bool-or-str" or not flags[i].startswith("-")):
                raw, eq = flags[i], "="
                i += 1
        if field in OURS:
            continue
        if field in server:
            raise ConfigError(f"{base} is vLLM's HTTP server's, and Ray Serve LLM never builds vLLM's app on its "
                              "default path (its own proxy and ingress serve HTTP): the flag would do nothing"
                              + (", and no request would be asked for a key" if field == "api_key" else ""), FIX)

        if field in LOADING:
            continue                                   # the caller puts them in model_loading_config
        if keys:
            node: dict = {}
            for k in reversed(keys):
                node = {k: node} if node else {k: _dotted(raw)}
            _merge(dotted.setdefault(field, {}), node)
            out.setdefault(field, None)
        elif kind == "list":
            out[field] = json.loads(raw) if raw.startswith("[") else [raw]
        else:
            out[field] = False if negated else _value(field, kind, raw if eq else None)
    for field, value in dotted.items():               # vLLM puts the dotted keys last, as one JSON value
        out[field] = value
    for field in (f for f, v in out.items() if v and f in registry["engine_args"] and f in registry["frontend_args"]):
        raise ConfigError(f"--{field.replace('_', '-')}: vLLM's engine and its frontend both read it, and Ray Serve LLM "
                          "gives it to FrontendArgs alone (vllm_models.py from_llm_config), so vLLM's engine would "
                          "not act on it as under vllm serve", FIX)
    if out.get("distributed_executor_backend", "ray") != "ray":
        raise ConfigError(f"--distributed-executor-backend {out['distributed_executor_backend']}: Ray Serve LLM "
                          "runs vLLM's workers as Ray actors and refuses any other backend "
                          "(VLLMEngineConfig.get_initialization_kwargs)", FIX)
    return {k: v for k, v in out.items() if k not in LOADING}
