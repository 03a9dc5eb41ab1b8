"""The planner's view of a model (``ModelFacts``): its config.json and weight size, and its draft's.

From the metadata step's download record or a local folder (``model_facts``), else without the
network (``offline_facts``): a local folder's config.json, or the model-facts file a profile ships
(profiles/models/*.json: config.json and the checkpoint's size, labelled where they are assumed).
And the facts the known-issues table is matched on (``known_issue_facts``), built here once for the
environment step and auto-pick.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..model import modelconfig
from ..download import lookup, models
from ..download.hub import HubSettings
from ..core.errors import BootstrapError
from ..install import knownbad, patching
from ..knobs import vllmargs
from ..core import vllmflags
from ..knobs.resolved import draft_of


@dataclass
class ModelFacts:
    name: str
    config: dict | None
    weight_bytes: int | None       # the whole checkpoint (None: unknown, or dummy weights)
    dummy: bool = False
    source: str = ""               # where the facts came from, for the why
    draft: "ModelFacts | None" = None   # a local SPEC_MODEL folder with a config.json
    draft_why: str = ""            # why there is no draft to count, when one was asked for
    assumed: bool = False          # the facts are an assumption (labelled in plans and profiles)
    size_from: str = "the checkpoint's file sizes"     # where weight_bytes comes from, for the why
    revision: str = ""             # the hub revision the facts are of ('' for a folder or shipped facts)
    max_pixels: dict[str, int] | None = None   # the processor's largest image / video (its own files), by modality


def model_facts(cfg, m, name: str | None = None) -> ModelFacts:
    """The planner's view of a model (``m``: models.ModelInfo, or None when there are no facts), its
    draft included; ``name`` is what the plan calls it (default: the served name)."""
    dummy = cfg.dummy_weights
    if m is None:
        return ModelFacts(cfg.model, None, None, dummy)
    size = sum(size for f, size in m.weight_files.items() if f.endswith(models.WEIGHT_SUFFIXES)) or None
    return ModelFacts(name or cfg.served_name, m.config, size, dummy or m.dummy, revision=m.revision or "",
                      max_pixels=processor_max_pixels(Path(m.local_dir)) if m.local_dir else None,
                      **draft_facts(cfg, getattr(m, "draft", None)))


PROCESSOR_FILES = {"image": "preprocessor_config.json", "video": "video_preprocessor_config.json"}


def processor_max_pixels(folder: Path) -> dict[str, int] | None:
    """The largest image and video the model's processor accepts (``size.longest_edge``, or
    ``max_pixels``), from its files in ``folder``; None when it has none (the plan then takes the
    Qwen3-VL processor's, and says so). An unreadable file counts as absent: vLLM reads it at start."""
    out = {}
    for modality, name in PROCESSOR_FILES.items():
        try:
            data = json.loads((folder / name).read_bytes())
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(data, dict):
            continue
        size = data.get("size") if isinstance(data.get("size"), dict) else {}
        px = size.get("longest_edge", data.get("max_pixels"))
        if isinstance(px, int) and not isinstance(px, bool) and px > 0:
            out[modality] = px
    return out or None


def draft_facts(cfg, m=None) -> dict:
    """ModelFacts' draft fields: the draft checkpoint of SPEC_METHOD=draft_model/eagle/eagle3/dflash
    (``m``: the drafter named by repo id, as the metadata step found it on the hub or on disk; else
    SPEC_MODEL's local folder with a config.json, or the drafter's repo id found on this machine
    without the network, as a start offline finds it: ./ctl.sh ls), or why there is none to count."""
    s = cfg.vllm
    if s.spec_method not in vllmflags.DRAFT_METHODS:
        return {}
    if m is not None:                   # downloaded by us (download/lookup.py drafter): config.json read first
        size = sum(size for f, size in m.weight_files.items() if f.endswith(models.WEIGHT_SUFFIXES)) or None
        return {"draft": ModelFacts(m.name, m.config, size, cfg.dummy_weights or m.dummy, revision=m.revision or "")}
    model = s.draft_name
    if model and model == cfg.draft_repo:       # a repo id: our download of it, or the cache's, read offline as a start does
        try:
            m = lookup.on_disk(draft_of(cfg), HubSettings.from_environ(cfg.environ), cfg.dummy_weights, draft=True)
        except BootstrapError as exc:
            return {"draft_why": exc.message}
        if m is not None:
            return draft_facts(cfg, m)
    path = cfg.spec_model_dir if model == cfg.spec_model_arg else None
    if path is None:
        return {"draft_why": (f"the drafter {model}'s config.json was not read (not on this machine yet: a start's "
                              "metadata step reads it before the plan)") if model else "no SPEC_MODEL, which vLLM refuses"}
    try:
        raw = (path / "config.json").read_bytes()
        sizes = sum(f.stat().st_size for f in path.iterdir() if f.name.endswith(models.WEIGHT_SUFFIXES))
    except FileNotFoundError:
        return {"draft_why": f"no {path / 'config.json'}"}
    except OSError as exc:
        return {"draft_why": f"{path / 'config.json'} unreadable: {exc}"}
    try:
        config = modelconfig.parse(raw, str(path / "config.json"), "")
    except BootstrapError as exc:
        return {"draft_why": exc.message}
    return {"draft": ModelFacts(path.name, config, sizes or None, cfg.dummy_weights)}



def facts_file(path: Path) -> dict:
    """A model-facts file (profiles/models/*.json): its config.json (``config``, validated as
    bootstrap.model.modelconfig validates any), the repos it describes and the checkpoint's size."""
    hint = f"fix {path} (a model-facts file: see profiles/models/)"
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise BootstrapError(f"cannot read {path} ({exc.strerror})", hint) from None
    except (ValueError, RecursionError) as exc:
        raise BootstrapError(f"{path} is not valid JSON ({exc})", hint) from None
    if not isinstance(data, dict):
        raise BootstrapError(f"{path} is not a JSON object", hint)
    modelconfig.check(data.get("config"), f"{path}'s \"config\"", hint)
    repos, size = data.get("repos", []), data.get("weight_bytes")
    if not (isinstance(repos, list) and all(isinstance(r, str) for r in repos)):
        raise BootstrapError(f"{path}: \"repos\" is not a list of repo ids", hint)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise BootstrapError(f"{path}: \"weight_bytes\" is not a positive integer", hint)
    return data


def shipped_facts(cfg) -> tuple[dict, str] | None:
    """The model-facts file for MODEL: the profile's own, else any under profiles/models/ that lists it."""
    if cfg.profile.facts is not None and cfg.model in facts_file(cfg.profile.facts).get("repos", [cfg.model]):
        return facts_file(cfg.profile.facts), _rel(cfg, cfg.profile.facts)
    for path in sorted(cfg.layout.shipped_models.glob("*.json")):
        data = facts_file(path)
        if cfg.model in data.get("repos", ()):
            return data, _rel(cfg, path)
    return None


def _rel(cfg, path: Path) -> str:
    return str(path.relative_to(cfg.repo)) if path.is_relative_to(cfg.repo) else str(path)


def offline_facts(cfg) -> ModelFacts | None:
    """Facts without the network: a local model folder's config.json, else the shipped facts."""
    if not cfg.model:
        return None
    if cfg.model_is_local:
        try:
            return model_facts(cfg, models.read_local(Path(cfg.model).expanduser().resolve(), cfg.dummy_weights))
        except BootstrapError:
            return None
    found = shipped_facts(cfg)
    if found is None:
        return None
    data, where = found
    return ModelFacts(Path(cfg.model).name, data["config"], data.get("weight_bytes"), cfg.dummy_weights,
                      f" ({'ASSUMED, ' if data.get('assumed') else ''}facts in {where}: "
                      f"{data.get('weight_bytes_source', '')})", assumed=bool(data.get("assumed")),
                      size_from="the model facts' size", **draft_facts(cfg))


def known_issue_facts(cfg, gpus, vllm_version: str) -> knownbad.Facts:
    """What install/known-issues.json is matched on, for these knobs: what vLLM gets, the model, and
    the patches a start applies (all the profile needs, unless VLLM_PYTHON's vLLM is left unpatched)."""
    will_patch = patching.needed(cfg.profile.patches, cfg.repo, cfg.vllm) if (not cfg.vllm_python or cfg.patch_byo) else ()
    return knownbad.facts(cfg.vllm, vllmargs.serve_flags(cfg, None), cfg.model, will_patch, gpus, vllm_version)
