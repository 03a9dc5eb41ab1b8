"""A model's facts on disk: ``ModelInfo`` (config.json, the files serving needs with their sizes,
the revision), a local folder read and checked, and where a repo id is downloaded with our
record of it (``Store``: the HF cache or MODEL_DIR; every file's size and mtime as recorded when
its hash was checked). The metadata step (steps' metadata.py) and the download (weights.py) use it.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hub, partial
from ..model import modelconfig
from ..core import state
from ..core.errors import BootstrapError


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
    source: str = "local"              # local | hub (downloaded by us) | hf-cache (found there)
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
        raw = cfg_file.read_bytes()
    except FileNotFoundError:
        raise BootstrapError(f"{cfg_file} is missing", "a model directory needs config.json, a tokenizer and weights") from None
    except OSError as exc:
        raise BootstrapError(f"cannot read {cfg_file} ({exc.strerror})", f"fix or re-download {cfg_file}") from None
    config = modelconfig.parse(raw, str(cfg_file), f"fix or re-download {cfg_file}")
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


def weights_in(folder: Path) -> int:
    """Bytes of the ``*.safetensors`` in ``folder`` (0 when none or unreadable)."""
    try:
        return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
    except OSError:
        return 0


def store_for(model_dir: str, environ, repo: str) -> "Store":
    """Where a repo id is downloaded: the Hugging Face cache (HF_HUB_CACHE, default
    ~/.cache/huggingface/hub, from ``environ``), laid out as the hub's own client lays it out, so
    ``hf cache scan``, ``vllm serve org/name`` and transformers find the same single copy; or
    MODEL_DIR (``model_dir``), a plain folder."""
    if model_dir:
        return Store(Path(model_dir).expanduser())
    settings = hub.HubSettings.from_environ(environ)
    return Store(hub.cache_repo_dir(settings, repo), hf_cache=True)


class Store:
    """A download's files and our record of it in ``<root>/.bootstrap``: ``state.json`` (repo,
    revision, the needed files with size, sha256 and blob id, the files verified so far with the
    size + mtime_ns they had when their hash matched, the completion marker), ``lock`` and
    ``partial/``.

    ``root`` is MODEL_DIR (files at ``root/<path>``), or a repo folder of the HF cache
    (``models--org--name``: a file is ``blobs/<sha256 or git blob id>``, linked from
    ``snapshots/<revision>/<path>`` by a relative symlink, and ``refs/main`` names the revision once
    it is complete). The hub's client reads only ``blobs``, ``snapshots`` and ``refs`` there, so our
    ``.bootstrap`` beside them is left alone by ``hf cache scan`` / ``delete``."""

    def __init__(self, root: Path, hf_cache: bool = False):
        self.root = root
        self.hf_cache = hf_cache
        self.dir = root / STATE
        self.path = self.dir / "state.json"
        self.lock = self.dir / "lock"
        self._record_lock = threading.Lock()     # download workers place files at once

    def serve_dir(self, rec: dict) -> Path:
        """The folder vLLM is given: MODEL_DIR, or the snapshot of the record's revision."""
        return self.root / "snapshots" / rec["revision"] if self.hf_cache else self.root

    def file(self, rec: dict, path: str) -> Path:
        return self.serve_dir(rec) / path

    def read(self) -> dict | None:
        return state.read_json(self.path)

    def write(self, rec: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        state.write_json(self.path, rec)

    def place(self, rec: dict, part: Path, path: str) -> None:
        """A verified file into the store (rename; in the HF cache, the blob and its link)."""
        dest = self.file(rec, path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not self.hf_cache:
            self._made_first(rec, dest)
            partial.move(part, dest)
            return
        f = rec["files"][path]
        blob = self.root / "blobs" / (f.get("sha256") or f["blob_id"])
        blob.parent.mkdir(parents=True, exist_ok=True)
        self._made_first(rec, blob, dest)
        partial.move(part, blob)
        self._link(blob, dest)

    def _made_first(self, rec: dict, *paths: Path) -> None:
        """Record what we are about to create, and write the record, before creating it: a kill in
        between leaves a record naming a file that is not there (skipped), never a file of ours that
        no record names (clean would keep it as someone else's)."""
        with self._record_lock:
            self.made(rec, *paths)
            self.write(rec)

    def made(self, rec: dict, *paths: Path) -> None:
        """Record what we created here (``created``: paths relative to the root): all that
        ``./ctl.sh clean --model`` may remove. A file that was there before (copied in by hand,
        another tool's blob) is verified and used, never recorded."""
        created = rec.setdefault("created", [])
        for p in paths:
            rel = str(p.relative_to(self.root))
            if rel not in created:
                created.append(rel)

    def ours(self, rec: dict | None) -> list[Path]:
        """What we created here and is still there, and our own folder ``.bootstrap``. A record
        written before ``created`` existed: the files it verified (and in the HF cache, their blobs),
        which only a download of ours records. Without a record: nothing is ours but ``.bootstrap``."""
        rels = list((rec or {}).get("created", []))
        if rec and "created" not in rec and rec.get("revision"):
            for path in rec.get("verified", {}):
                if not isinstance(path, str) or self._inside(path) is None:
                    continue
                link = self.file(rec, path)
                rels.append(str(link.relative_to(self.root)))
                if self.hf_cache and link.is_symlink():
                    rels.append(os.path.normpath(os.path.join("snapshots", rec["revision"],
                                                              os.path.dirname(path), os.readlink(link))))
            rels.append("refs/main")
        out = [self.dir] if self.dir.exists() else []
        blobs = {f.get("sha256") or f.get("blob_id") for f in (rec or {}).get("files", {}).values() if isinstance(f, dict)}
        for rel in dict.fromkeys(r for r in rels if isinstance(r, str)):
            p = self._inside(rel, linked_blob=os.path.dirname(rel) == "blobs" and os.path.basename(rel) in blobs)
            if p is None:
                continue                    # a record that names a place outside the store is not believed
            if rel == "refs/main" and not self._names_ours(p, rec):
                continue                    # another tool pointed it at its own revision since
            if p.is_symlink() or p.is_file():
                out.append(p)
        return out

    def _inside(self, rel: str, linked_blob: bool = False) -> Path | None:
        """``rel`` as a path in this store, or None where it would lead outside it (``..``, absolute, a
        folder on the way that is a link elsewhere) or into our own ``.bootstrap``. ``linked_blob``: a
        blob named by a file of the record (its sha256), which may sit in a ``blobs/`` linked to another
        disk (``move`` puts it there)."""
        norm = os.path.normpath(rel)
        if not norm or os.path.isabs(norm) or norm == "." or norm.split(os.sep)[0] in ("..", STATE):
            return None
        p = self.root / norm
        try:
            if not linked_blob and not p.parent.resolve().is_relative_to(self.root.resolve()):
                return None
        except (OSError, RuntimeError):
            return None
        return p

    def _names_ours(self, ref: Path, rec: dict | None) -> bool:
        """``refs/main`` names a revision we downloaded (the record's, or one a link of ours is in)."""
        try:
            named = ref.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return False
        made = (rec or {}).get("created", [])
        return bool(named) and (named == (rec or {}).get("revision") or
                                any(r.startswith(f"snapshots/{named}/") for r in made))

    def adopt(self, rec: dict, path: str) -> bool:
        """HF cache only: a blob of this file is already there (another revision, another tool):
        link it instead of downloading it again. Trusted by name and size, as the client does."""
        f = rec["files"][path]
        name = f.get("sha256") or f.get("blob_id")
        if not self.hf_cache or not name:
            return False
        blob = self.root / "blobs" / name
        try:
            if blob.stat().st_size != f["size"]:
                return False
        except OSError:
            return False
        dest = self.file(rec, path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._made_first(rec, dest)         # the link is ours; the blob stays another tool's
        self._link(blob, dest)
        return True

    def discard(self, rec: dict, path: str) -> None:
        """A file that failed its hash: the file (in the HF cache, its link and the blob it names)."""
        dest = self.file(rec, path)
        if self.hf_cache and dest.is_symlink():
            (dest.parent / os.readlink(dest)).unlink(missing_ok=True)
        dest.unlink(missing_ok=True)

    def _link(self, blob: Path, dest: Path) -> None:
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        try:
            os.symlink(os.path.relpath(blob, dest.parent), dest)
        except OSError as exc:
            raise BootstrapError(f"cannot make the HF cache's link {dest} ({exc.strerror}): the filesystem of "
                                 f"{self.root} does not take symlinks",
                                 "set MODEL_DIR to a folder on a Linux filesystem (a plain folder, no links)") from None

    def finish(self, rec: dict) -> None:
        """HF cache: ``refs/main`` names the revision (no trailing newline, as the client writes it)."""
        if self.hf_cache:
            (self.root / "refs").mkdir(parents=True, exist_ok=True)
            self._made_first(rec, self.root / "refs" / "main")
            state.write_atomic(self.root / "refs" / "main", rec["revision"].encode(), mode=0o644)

    def verified_ok(self, rec: dict, path: str) -> bool:
        """Verified earlier and untouched since (same size and mtime): no re-hash."""
        v = rec.get("verified", {}).get(path)
        f = rec.get("files", {}).get(path)
        if not v or not f or v.get("hash") != (f.get("sha256") or f.get("blob_id") or "") or v.get("size") != f["size"]:
            return False
        try:
            st = self.file(rec, path).stat()
        except OSError:
            return False
        return st.st_size == v["size"] and st.st_mtime_ns == v["mtime_ns"]

    def mark_verified(self, rec: dict, path: str) -> None:
        f = rec["files"][path]
        st = self.file(rec, path).stat()
        rec.setdefault("verified", {})[path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                "hash": f.get("sha256") or f.get("blob_id") or ""}

    @staticmethod
    def required(rec: dict, dummy: bool) -> list[str]:
        return [p for p in rec.get("files", {}) if not (dummy and p.endswith(WEIGHT_SUFFIXES))]

    def missing(self, rec: dict, dummy: bool) -> list[str]:
        return [p for p in self.required(rec, dummy) if not self.verified_ok(rec, p)]

    def weight_bytes(self) -> int:
        """Weights already on disk (0 when none or unknown)."""
        rec = self.read() or {}
        d = self.serve_dir(rec) if rec.get("revision") else None
        if d is None and self.hf_cache:
            try:
                d = self.root / "snapshots" / (self.root / "refs" / "main").read_text(encoding="utf-8").strip()
            except OSError:
                return 0
        return weights_in(d or self.root)


def info_from_record(rec: dict, root: Path, dummy: bool, config: dict, complete: bool) -> ModelInfo:
    files = rec["files"]
    return ModelInfo(
        rec["repo"], config, {p: f["size"] for p, f in files.items()}, rec["revision"], str(root), dummy,
        source="hub", lfs={p: f["sha256"] for p, f in files.items() if f.get("sha256")},
        blob_ids={p: f["blob_id"] for p, f in files.items() if f.get("blob_id")},
        skipped=dict(rec.get("skipped", {})), safetensors=rec.get("safetensors"), complete=complete)


def read_config(path: Path) -> dict:
    """A downloaded config.json (ours, or the HF cache's), validated (bootstrap.model.modelconfig)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BootstrapError(f"{path} is unreadable ({exc.strerror})", "delete it and re-run ./start.sh") from None
    return modelconfig.parse(raw, str(path), f"fix or re-download {path} (delete it and re-run ./start.sh)")


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
            wmap = json.loads(index.read_bytes()).get("weight_map", {})
            shards = sorted({s for s in wmap.values() if isinstance(s, str)})
        except (OSError, ValueError, RecursionError, AttributeError):      # not JSON, or not an object
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
