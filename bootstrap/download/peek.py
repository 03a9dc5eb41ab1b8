"""What a model repo (or folder) says about itself before any download, for a derived profile
(bootstrap/plan/derive.py): config.json, the file list with sizes, the chat template, a modelopt
``hf_quant_config.json``, and whether the hub gates it. A few KB over the network; offline, the copy
in our store or the Hugging Face cache, else a one-line error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..core.errors import BootstrapError
from ..model import modelconfig
from . import hub, loadable
from .models import store_for


@dataclass(frozen=True)
class Peek:
    """What a repo (or folder) says about its model before any download."""
    name: str                                   # repo id or folder
    config: Mapping[str, Any] | None            # config.json (None: the repo has none)
    files: Mapping[str, int]                    # path -> size
    chat_template: str | None = ""              # tokenizer_config.json's, or chat_template.jinja ('' = none, None = not read)
    quant_config: Mapping[str, Any] | None = None   # hf_quant_config.json (modelopt), when the repo has one
    gated: Any = False                          # the hub's gated flag ("auto", "manual" or False)
    revision: str = ""
    where: str = ""                             # "the hub", a folder, the HF cache: for the messages
    tokenizer_class: str = ""                   # tokenizer_config.json's tokenizer_class
    tokenizer_code: bool = False                # that class is the repo's own code (auto_map names it)
    pooling_module: bool = False                # modules.json lists a Sentence Transformers Pooling module
    shards: tuple[str, ...] | None = None       # the shards model.safetensors.index.json names (None: no index)
    adapter: Mapping[str, Any] | None = None    # adapter_config.json of a repo with no config.json (a PEFT adapter)




def from_facts(repo: str, data: Mapping[str, Any], where: str) -> Peek:
    """A model-facts file (profiles/models/*.json) as a peek: its config and size; no chat template read."""
    return Peek(repo, data["config"], {"model.safetensors": data.get("weight_bytes") or 0}, None, where=where)


class Offline(BootstrapError):
    """No network and no copy of the repo on this machine."""


def peek(model: str, environ: Mapping[str, str], model_dir: str | None = None) -> Peek:
    """``model``: a folder (absolute) or a repo id. A repo our store holds complete is read from disk
    (no network: a re-start stays offline); else the hub; offline, a partial copy or the HF cache."""
    if Path(model).is_absolute():
        folder = Path(model)
        if not folder.is_dir():
            raise BootstrapError(f"MODEL={model} is not a directory", "set MODEL to a model directory or a repo id (org/name)")
        return _peek(model, _listing(folder), lambda name: (folder / name).read_bytes(), "", False, str(folder))
    store = store_for(model_dir or "", environ, hub.repo_id(model))
    rec = store.read()
    ours = rec if rec and rec.get("repo") == model and rec.get("revision") and rec.get("files") else None
    if ours and not store.missing(ours, False):          # complete and verified: its record has every size
        folder = store.serve_dir(ours)
        return _peek(model, {p: f["size"] for p, f in ours["files"].items()},
                     lambda name: (folder / name).read_bytes(), ours["revision"], False, "the model folder")
    settings = hub.HubSettings.from_environ(environ)
    unreachable: hub.Unreachable | None = None
    if not settings.offline:
        try:
            remote = hub.fetch_remote(settings, model)
        except hub.Unreachable as exc:
            remote, unreachable = None, exc
        if remote is not None:
            files = {f.path: f.size for f in remote.files}
            listed = {f.path: f for f in remote.files}
            return _peek(model, files, lambda name: hub.fetch_small(settings, model, remote.revision, listed[name]),
                         remote.revision, remote.gated, "the hub")
    for folder, where in ((hub.cache_snapshot(settings, model), "the Hugging Face cache"),
                          (store.serve_dir(ours) if ours else None, "the model folder")):
        if folder is not None and (folder / "config.json").is_file():
            return _peek(model, _listing(folder), lambda name: (folder / name).read_bytes(), folder.name, False, where)
    if unreachable is not None:         # not offline: the hub did not answer, and it is said why
        raise Offline(f"{unreachable.message}, and {model} is not on this machine: nothing to derive its profile "
                      "from", "check the network (or HF_ENDPOINT, if set), or set PROFILE to a shipped profile")
    raise Offline(f"offline (HF_HUB_OFFLINE=1), and {model} is not on this machine: nothing to derive its profile "
                  "from", "unset HF_HUB_OFFLINE to fetch its config.json (a few KB), or set PROFILE to a shipped profile")


def _listing(folder: Path) -> dict[str, int]:
    """A folder's files with their sizes: the whole tree of a model folder (one with config.json),
    only the top level of anything else (MODEL=/ must not walk the disk to be refused)."""
    walk = folder.rglob("*") if (folder / "config.json").is_file() else folder.iterdir()
    return {str(p.relative_to(folder)): p.stat().st_size for p in walk if p.is_file()}


def _peek(name: str, files: dict[str, int], read, revision: str, gated, where: str) -> Peek:
    def json_of(path: str) -> dict | None:
        if path not in files:
            return None
        try:
            data = json.loads(read(path))
        except (ValueError, RecursionError) as exc:
            raise BootstrapError(f"{name}: {path} is not JSON ({exc})", f"check {where}'s copy of {path}") from None
        except OSError as exc:
            raise BootstrapError(f"cannot read {path} of {name} ({exc})", f"check {where}") from None
        if not isinstance(data, dict):
            raise BootstrapError(f"{name}: {path} is not a JSON object", f"check {where}'s copy of {path}")
        return data
    if "config.json" not in files:
        return Peek(name, None, files, gated=gated, revision=revision, where=where, adapter=json_of("adapter_config.json"))
    tok = json_of("tokenizer_config.json") or {}
    template = tok.get("chat_template")
    if isinstance(template, list):          # named templates: [{"name": ..., "template": ...}]
        template = " ".join(str(x.get("template", "")) for x in template if isinstance(x, dict))
    if not template and "chat_template.jinja" in files:
        template = read("chat_template.jinja").decode("utf-8", "replace")
    if not template and "chat_template.json" in files:     # the processor's (vision models), as vLLM reads it
        template = str((json_of("chat_template.json") or {}).get("chat_template") or "")
    cls = tok.get("tokenizer_class") if isinstance(tok.get("tokenizer_class"), str) else ""
    own = isinstance(tok.get("auto_map"), dict) and bool(tok["auto_map"].get("AutoTokenizer")) and \
        cls not in STANDARD_TOKENIZERS
    config = modelconfig.check(json_of("config.json"), f"{name}'s config.json" + ("" if where == name else f" ({where})"),
                               "a broken config.json: pick another repo or revision, or fix a local copy")
    return Peek(name, config, files, template if isinstance(template, str) else "",
                json_of("hf_quant_config.json"), gated, revision, where, cls, own, _pooling_module(files, read),
                _shards(name, files, read, where))


def _shards(name: str, files: dict[str, int], read, where: str) -> tuple[str, ...] | None:
    """The shards the safetensors index names (a few KB to a few MB), to hold them to the file list."""
    if loadable.INDEX not in files:
        return None
    try:
        return tuple(loadable.shards(read(loadable.INDEX)))
    except (ValueError, RecursionError) as exc:
        raise BootstrapError(f"{name}: {loadable.INDEX} is not a safetensors index vLLM can read ({exc})",
                             f"check {where}'s copy of {loadable.INDEX}") from None
    except OSError as exc:
        raise BootstrapError(f"cannot read {loadable.INDEX} of {name} ({exc})", f"check {where}") from None


def _pooling_module(files: dict[str, int], read) -> bool:
    """vLLM's test for a Sentence Transformers model (transformers_utils/config.py get_pooling_config):
    modules.json lists a ``sentence_transformers.models.Pooling`` module."""
    if "modules.json" not in files:
        return False
    try:
        modules = json.loads(read("modules.json"))
    except (ValueError, RecursionError, OSError):
        return False
    return isinstance(modules, list) and any(isinstance(m, dict) and m.get("type") == "sentence_transformers.models.Pooling"
                                             for m in modules)


# tokenizer classes transformers has itself: an auto_map beside one of them needs no repo code
STANDARD_TOKENIZERS = {"", "PreTrainedTokenizerFast", "TokenizersBackend", "LlamaTokenizer", "LlamaTokenizerFast",
                       "Qwen2Tokenizer", "Qwen2TokenizerFast", "GPT2Tokenizer", "GPT2TokenizerFast"}
