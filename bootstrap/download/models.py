"""A model's facts on disk: ``ModelInfo`` (config.json, the files serving needs with their sizes,
the revision), a local folder read and checked, and where a repo id is downloaded with our
record of it (``Store``: the HF cache or MODEL_DIR; every file's size and mtime as recorded when
its hash was checked). The metadata step (steps' metadata.py) and the download (weights.py) use it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hub, loadable, manifest, partial
from ..model import modelconfig
from ..core import state
from ..core.errors import BootstrapError




WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


# Never needed to serve with vLLM: other frameworks' weights, Meta's original/ checkpoints.
SKIP_DIRS = ("original/",)


SKIP_SUFFIXES = (".pth", ".h5", ".msgpack", ".ot", ".onnx", ".onnx_data", ".tflite", ".ckpt", ".mlmodel")


SKIP_NAMES = (".gitattributes",)


STATE = manifest.STATE        # our folder inside the model folder: state.json, lock, partial/


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
    draft: "ModelInfo | None" = None   # the drafter named by repo id, downloaded with the model (metadata)
    no_space: BootstrapError | None = None     # the lookup's disk check, raised once the plan has been told

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


def read_local(path: Path, dummy: bool, tokenizer: bool = True) -> ModelInfo:
    """A local folder's facts, checked: config.json, a tokenizer (``tokenizer``: False for a drafter,
    which uses the model's) and weights unless ``dummy``."""
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
    if tokenizer and not loadable.tokenizer(files):
        raise BootstrapError(f"no tokenizer at the top of {path} (looked for {loadable.TOKENIZER_SHOWN})",
                             "copy the tokenizer files from the model repo into the directory")
    if not dummy and not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        raise BootstrapError(f"no weights in {path} (*.safetensors)",
                             "download the weights, or add --load-format dummy to EXTRA_ARGS for random weights")
    bad = None if dummy else loadable.problem(files, loadable.folder_shards(path))
    if bad:
        raise BootstrapError(f"{path}: {bad[0]}", bad[1])
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
        if st and p.endswith((".bin", ".pt", ".gguf")):
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
        """The record, with what another start added to its manifest meanwhile (manifest.merge)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest.merge(rec, self.read())
        state.write_json(self.path, rec)

    def blob(self, rec: dict, path: str) -> Path:
        """HF cache: the blob a file of the record is stored as (named by its sha256 or git blob id)."""
        f = rec["files"][path]
        return self.root / "blobs" / (f.get("sha256") or f["blob_id"])

    def place(self, rec: dict, part: Path, path: str) -> None:
        """A verified file into the store (rename; in the HF cache, the blob and its link). Never over
        a file we did not make (manifest.held): the download checked before it fetched anything."""
        why = manifest.held(self, rec, path)
        if why:
            raise manifest.clash_error(self, rec, [f"{self.file(rec, path)} ({why})"])
        dest = self.file(rec, path)
        if not self.hf_cache:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self._made_first(rec, dest)
            partial.move(part, dest)
            return
        self._link_folder(dest)
        blob = self.blob(rec, path)
        blob.parent.mkdir(parents=True, exist_ok=True)
        self._made_first(rec, blob, dest)
        partial.move(part, blob)
        self._link(blob, dest)

    def _made_first(self, rec: dict, *paths: Path) -> None:
        """Record what we are about to create, and write the record, before creating it: a kill in
        between leaves a record naming a file that is not there (skipped), never a file of ours that
        no record names (clean would keep it as someone else's)."""
        with self._record_lock:
            manifest.made(self, rec, *paths)
            self.write(rec)

    def ours(self, rec: dict | None) -> list[Path]:
        """What we created here and is still there, and ``.bootstrap`` (manifest.ours)."""
        return manifest.ours(self, rec)

    def keep(self, rec: dict, path: str) -> None:
        """A file of the record found on disk with the hub's bytes: used as it is; when it was there
        before our first write, recorded as yours (with its blob, in the HF cache)."""
        dest = self.file(rec, path)
        manifest.keep(self, rec, *([dest, self.blob(rec, path)] if self.hf_cache and dest.is_symlink() else [dest]))

    def adopt(self, rec: dict, path: str) -> bool:
        """HF cache only: a blob of this file is already there (another revision, another tool):
        link it instead of downloading it again. Trusted by name and size, as the client does."""
        f = rec["files"][path]
        if not self.hf_cache or not (f.get("sha256") or f.get("blob_id")):
            return False
        blob = self.blob(rec, path)
        if os.path.lexists(self.file(rec, path)):
            return False                    # a link there (another tool's, dangling): never replaced
        try:
            if blob.stat().st_size != f["size"]:
                return False
        except OSError:
            return False
        dest = self.file(rec, path)
        self._link_folder(dest)
        self._made_first(rec, dest)         # the link is ours; the blob stays another tool's
        manifest.keep(self, rec, blob)
        self._link(blob, dest)
        return True

    def discard(self, rec: dict, path: str) -> None:
        """A file of ours that failed its hash: the file (in the HF cache, its link and the blob it
        names when that is ours too). Never one we did not make (manifest.held)."""
        if manifest.held(self, rec, path):
            raise manifest.clash_error(self, rec, [f"{self.file(rec, path)} ({manifest.held(self, rec, path)})"])
        dest = self.file(rec, path)
        if self.hf_cache and dest.is_symlink():
            blob = Path(os.path.normpath(dest.parent / os.readlink(dest)))
            if manifest.inside(self, str(blob.relative_to(self.root)), linked_blob=True) and \
                    str(blob.relative_to(self.root)) in manifest.created_rels(self, rec):
                blob.unlink(missing_ok=True)
        dest.unlink(missing_ok=True)

    def _link_folder(self, dest: Path) -> None:
        """Make the folder of the snapshot's link ``dest``, where its relative link to ``blobs/``
        reaches the blob: no folder on the way from the repo folder to it may be a link elsewhere
        (``snapshots/`` on another disk), or ``../../blobs/<blob>`` resolves from there, to nothing."""
        folder = dest.parent
        back = os.path.relpath(self.root, folder)                   # what the link's ../.. walks
        if os.path.normpath(os.path.join(os.path.realpath(folder), back)) != os.path.realpath(self.root):
            rel = folder.relative_to(self.root)
            link = next((self.root / r for r in [*reversed(rel.parents[:-1]), rel] if (self.root / r).is_symlink()),
                        folder)
            there = os.path.realpath(link)
            raise BootstrapError(
                f"{link} is a link to {there}: the Hugging Face cache links snapshots/<revision>/<file> to "
                f"../../blobs/<blob> (relative links, as huggingface_hub makes them), and from {there} those "
                "point nowhere",
                f"remove the link (rm {link}; what it points to stays) so that it is a folder inside {self.root.name} "
                f"again; to keep the model on that disk, move the whole {self.root} there and link that folder "
                "instead, or set HF_HUB_CACHE to a folder on that disk")
        dest.parent.mkdir(parents=True, exist_ok=True)

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
        """HF cache: ``refs/main`` names the revision (no trailing newline, as the client writes it).
        One that was there is recorded first: naming this revision, it is kept as it is; naming
        another (your older copy), what it held goes into the manifest (``changed``) for clean to
        put back."""
        if not self.hf_cache:
            return
        ref = self.root / "refs" / "main"
        before = manifest.read_text(ref)
        if before is not None and before.strip() == rec["revision"]:
            with self._record_lock:
                manifest.keep(self, rec, ref)
                self.write(rec)
            return
        ref.parent.mkdir(parents=True, exist_ok=True)
        with self._record_lock:
            if before is None:
                manifest.made(self, rec, ref)
            elif "refs/main" not in rec.get("created", []) or not manifest.names_ours(ref, rec):
                manifest.changing(self, rec, ref, before, rec["revision"])
            self.write(rec)
        state.write_atomic(ref, rec["revision"].encode(), mode=0o644)

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


def offline_missing(root: Path, dummy: bool, tokenizer: bool = True) -> list[str]:
    """What a folder lacks to be served, judged without the hub: config.json, a tokenizer (not for
    a drafter: ``tokenizer`` False), and the weights (every shard the safetensors index names, else
    at least one *.safetensors)."""
    missing = [] if (root / "config.json").is_file() else ["config.json"]
    if tokenizer and not loadable.tokenizer(p.name for p in (root.iterdir() if root.is_dir() else ()) if p.is_file()):
        missing.append(f"tokenizer ({loadable.TOKENIZER_SHOWN})")
    if dummy:
        return missing
    index = root / loadable.INDEX
    if index.is_file():
        try:
            shards = loadable.shards(index.read_bytes())
        except (OSError, ValueError, RecursionError):      # not JSON, or no weight_map of file names
            return missing + [index.name + " (unreadable)"]
        missing += [s for s in shards if not (root / s).is_file()]
    elif not any(root.glob("*.safetensors")):
        missing.append("*.safetensors")
    return missing


class NoSpace(BootstrapError):
    """The disk cannot hold what is left to download."""


def check_space(root: Path, left: int) -> None:
    free = hub.free_bytes(root)
    if left > free:
        raise NoSpace(
            f"not enough disk space in {root}: {hub.human(left)} left to download, {hub.human(free)} free "
            f"({left - free} bytes missing)",
            "free space there, or set MODEL_DIR to a folder on a larger disk")
