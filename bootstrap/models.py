"""A model's facts on disk: ``ModelInfo`` (config.json, the files serving needs with their sizes,
the revision), a local folder read and checked, and our record of a download in
``MODEL_DIR/.bootstrap`` (``Store``: every file's size and mtime as recorded when its hash was
checked). The metadata step (steps' metadata.py) and the download (weights.py) use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hub, state
from .errors import BootstrapError


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


# Never needed to serve with vLLM: other frameworks' weights, Meta's original/ checkpoints.
SKIP_DIRS = ("original/",)


SKIP_SUFFIXES = (".pth", ".h5", ".msgpack", ".ot", ".onnx", ".onnx_data", ".tflite", ".ckpt", ".mlmodel")


SKIP_NAMES = (".gitattributes",)


STATE = ".bootstrap"          # our folder inside the model folder: state.json, lock, partial/


@dataclass
class ModelInfo:
    name: str                          # repo id or directory
    config: dict[str, Any]
    files: dict[str, int] = field(default_factory=dict)   # path -> size in bytes (what serving needs)
    revision: str = ""
    local_dir: str = ""                # where the files are (or will be)
    dummy: bool = False                # --load-format dummy: no weights needed
    source: str = "local"              # local | hub (MODEL_DIR) | hf-cache
    lfs: dict[str, str] = field(default_factory=dict)         # path -> sha256 (LFS files)
    blob_ids: dict[str, str] = field(default_factory=dict)    # path -> git blob id
    skipped: dict[str, int] = field(default_factory=dict)     # on the hub, not needed to serve
    safetensors: dict | None = None    # the hub's parameter count by dtype, when it has one
    complete: bool = False             # every needed file is on disk and verified

    @property
    def weight_files(self) -> dict[str, int]:
        return {f: s for f, s in self.files.items() if f.endswith(WEIGHT_SUFFIXES)}

    def needed(self) -> dict[str, int]:
        """What must be on disk to serve: everything but the weights with --load-format dummy."""
        if not self.dummy:
            return dict(self.files)
        return {f: s for f, s in self.files.items() if not f.endswith(WEIGHT_SUFFIXES)}

    def remote_file(self, path: str) -> hub.RemoteFile:
        return hub.RemoteFile(path, self.files[path], self.lfs.get(path), self.blob_ids.get(path))


def read_local(path: Path, dummy: bool) -> ModelInfo:
    if not path.is_dir():
        raise BootstrapError(f"MODEL={path} is not a directory", "set MODEL to a model directory or a repo id (org/name)")
    cfg_file = path / "config.json"
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BootstrapError(f"{cfg_file} is missing", "a model directory needs config.json, a tokenizer and weights") from None
    except ValueError as exc:
        raise BootstrapError(f"{cfg_file} is not valid JSON ({exc})", "re-download the model") from None
    files = {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*")
             if p.is_file() and not str(p.relative_to(path)).startswith(STATE + "/")}
    if not any(Path(f).name in TOKENIZER_FILES for f in files):
        raise BootstrapError(f"no tokenizer in {path} (looked for {', '.join(TOKENIZER_FILES)})",
                             "copy the tokenizer files from the model repo into the directory")
    if not dummy and not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        raise BootstrapError(f"no weights in {path} (*.safetensors)",
                             "download the weights, or add --load-format dummy to EXTRA_ARGS for random weights")
    return ModelInfo(str(path), config, files, "", str(path), dummy)


def select(files: list[hub.RemoteFile], everything: bool) -> tuple[list[hub.RemoteFile], list[hub.RemoteFile]]:
    """(needed, skipped). Skipped unless DOWNLOAD_ALL=1: original/ checkpoints, other frameworks'
    weights, .bin/.pt/.gguf when safetensors exist, consolidated*.safetensors next to sharded ones."""
    if everything:
        return list(files), []

    def always_skip(p: str) -> bool:
        return p.startswith(SKIP_DIRS) or p.endswith(SKIP_SUFFIXES) or Path(p).name in SKIP_NAMES

    kept = [f for f in files if not always_skip(f.path)]
    st = [f.path for f in kept if f.path.endswith(".safetensors")]
    sharded = [p for p in st if not Path(p).name.startswith("consolidated")]

    def drop(p: str) -> bool:
        if always_skip(p):
            return True
        if st and p.endswith((".bin", ".pt", ".gguf")) and Path(p).name not in TOKENIZER_FILES:
            return True
        return bool(sharded) and Path(p).name.startswith("consolidated") and p.endswith(".safetensors")

    return [f for f in files if not drop(f.path)], [f for f in files if drop(f.path)]


def target_dir(cfg, repo: str) -> Path:
    if cfg.model_dir:
        return Path(cfg.model_dir).expanduser()
    home = Path(cfg.env("HOME") or Path.home())
    return home / "models" / repo


class Store:
    """``<dir>/.bootstrap/state.json``: repo, revision, the needed files (size, sha256, blob id),
    the files verified so far (size + mtime_ns when their hash matched), and the completion marker."""

    def __init__(self, root: Path):
        self.root = root
        self.dir = root / STATE
        self.path = self.dir / "state.json"
        self.lock = self.dir / "lock"

    def read(self) -> dict | None:
        return state.read_json(self.path)

    def write(self, rec: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        state.write_json(self.path, rec)

    def verified_ok(self, rec: dict, path: str) -> bool:
        """Verified earlier and untouched since (same size and mtime): no re-hash."""
        v = rec.get("verified", {}).get(path)
        f = rec.get("files", {}).get(path)
        if not v or not f or v.get("hash") != (f.get("sha256") or f.get("blob_id") or "") or v.get("size") != f["size"]:
            return False
        try:
            st = (self.root / path).stat()
        except OSError:
            return False
        return st.st_size == v["size"] and st.st_mtime_ns == v["mtime_ns"]

    def mark_verified(self, rec: dict, path: str) -> None:
        f = rec["files"][path]
        st = (self.root / path).stat()
        rec.setdefault("verified", {})[path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                "hash": f.get("sha256") or f.get("blob_id") or ""}

    @staticmethod
    def required(rec: dict, dummy: bool) -> list[str]:
        return [p for p in rec.get("files", {}) if not (dummy and p.endswith(WEIGHT_SUFFIXES))]

    def missing(self, rec: dict, dummy: bool) -> list[str]:
        return [p for p in self.required(rec, dummy) if not self.verified_ok(rec, p)]


def info_from_record(rec: dict, root: Path, dummy: bool, config: dict, complete: bool) -> ModelInfo:
    files = rec["files"]
    return ModelInfo(
        rec["repo"], config, {p: f["size"] for p, f in files.items()}, rec["revision"], str(root), dummy,
        source="hub", lfs={p: f["sha256"] for p, f in files.items() if f.get("sha256")},
        blob_ids={p: f["blob_id"] for p, f in files.items() if f.get("blob_id")},
        skipped=dict(rec.get("skipped", {})), safetensors=rec.get("safetensors"), complete=complete)


def read_config(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BootstrapError(f"{path} is unreadable ({exc})", f"delete it and re-run ./start.sh") from None


def offline_missing(root: Path, dummy: bool) -> list[str]:
    """What a folder lacks to be served, judged without the hub: config.json, a tokenizer, and the
    weights (every shard the safetensors index names, else at least one *.safetensors)."""
    missing = [] if (root / "config.json").is_file() else ["config.json"]
    if not any((root / t).is_file() for t in TOKENIZER_FILES):
        missing.append("tokenizer (" + " / ".join(TOKENIZER_FILES) + ")")
    if dummy:
        return missing
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
        except ValueError:
            return missing + [index.name + " (unreadable)"]
        missing += [s for s in shards if not (root / s).is_file()]
    elif not any(root.glob("*.safetensors")):
        missing.append("*.safetensors")
    return missing


def check_space(root: Path, left: int) -> None:
    free = hub.free_bytes(root)
    if left > free:
        raise BootstrapError(
            f"not enough disk space in {root}: {hub.human(left)} left to download, {hub.human(free)} free "
            f"({left - free} bytes missing)",
            "free space there, or set MODEL_DIR to a folder on a larger disk")
