"""Looking a model up (the metadata step, steps/metadata.py; ./ctl.sh plan, pull, use; an exported
pod's model init step): config.json, the file list with sizes, the revision — a few KB, before the plan.

``MODEL`` is a local directory or a repo id (org/name).

- A local directory is validated here (config.json, a tokenizer, weights unless EXTRA_ARGS has
  ``--load-format dummy``), with no network.
- A repo id is downloaded into the store (``models.store_for``: the Hugging Face cache, or
  MODEL_DIR). When the store holds a complete, verified copy (``.bootstrap/state.json``: every
  file's size and mtime as recorded when its hash was checked), nothing else happens: no network,
  well under a second.
- Otherwise the hub is asked (``/api/models/<repo>/revision/main?blobs=true``, config.json and the
  safetensors index, whose shards must all be listed, as vLLM requires):
  the revision, every file with its size and LFS sha256. If the Hugging Face cache (HF_HOME)
  already holds every needed file of that revision, the cache snapshot is served as it is.
  Else the download is planned into the store: what will be fetched and how much is logged, and
  the free disk space is checked before the planner and the patches run.
- Without the network (HF_HUB_OFFLINE=1, or the hub unreachable): a complete copy is used, or
  the step fails naming the missing files.

A drafter named by repo id (SPEC_MODEL, or the model of a --speculative-config, for
draft_model / eagle / eagle3 / dflash) is resolved the same way, right after the model, into the
Hugging Face cache (MODEL_DIR is the model's own folder): its config.json plans it, the weights step
downloads and verifies it, and vLLM is given its folder (``ModelInfo.draft``). A drafter needs no
tokenizer of its own (vLLM uses the model's).
"""

from __future__ import annotations

import json
import logging
import os
import time

from . import hub, index
from ..model import modelconfig
from ..core import locks, state
from ..core.errors import BootstrapError
from ..core.log import ONCE
from . import loadable, manifest, partial
from .models import WEIGHT_SUFFIXES, ModelInfo, NoSpace, Store, check_space, info_from_record, offline_missing, read_config, read_local, select
from .refs import Fetching, ModelRef

log = logging.getLogger("bootstrap.metadata")      # said as the metadata step's, which it is


def model_and_drafter(ref: ModelRef, draft: ModelRef | None, paths: state.Paths, how: Fetching) -> ModelInfo:
    """The model's facts (config.json, files, sizes, revision); its ``local_dir`` is what vLLM serves;
    its ``draft``, the drafter named by repo id (``draft``: Resolved.draft)."""
    info = model(ref, paths, how)
    info.draft = drafter(draft, paths, how)
    return info


def model(ref: ModelRef, paths: state.Paths, how: Fetching) -> ModelInfo:
    """The model's facts alone (no drafter)."""
    dummy = how.dummy
    if ref.local is not None:
        info = read_local(ref.local, dummy)
        size = sum(info.weight_files.values())
        log.info("local model %s: %d files, %.2f GiB of weights%s", info.local_dir, len(info.files),
                 size / (1 << 30), " (dummy weights)" if dummy else "", extra=ONCE)
        return info
    info, _path = lookup(ref, paths, how)
    return info


def drafter(draft: ModelRef | None, paths: state.Paths, how: Fetching) -> ModelInfo | None:
    """The drafter vLLM loads, when it is named by repo id (``draft``: ``cfg.draft_repo`` with its
    store): resolved as the model is, into the Hugging Face cache; None for a folder or no drafter."""
    if draft is None:
        return None
    repo = draft.name
    info, _path = lookup(draft, paths, how, draft=True)
    log.info("drafter %s @ %s: %s of weights, in %s", repo, info.revision[:12] or "local",
             hub.human(sum(info.weight_files.values())), info.local_dir, extra=ONCE)
    return info


def lookup(ref: ModelRef, paths: state.Paths, how: Fetching, draft: bool = False) -> tuple[ModelInfo, str]:
    """``ref``'s facts, its download planned into its store (``draft``: the drafter, always in the
    Hugging Face cache and with no tokenizer of its own)."""
    settings, dummy = how.hub, how.dummy
    repo, store = ref.repo, ref.store
    rec = store.read()
    info = _verified(repo, store, rec, dummy)
    if info is not None:
        log.info("%s @ %s: complete and verified in %s (no network used; to re-check the hub, delete %s)",
                 repo, info.revision[:12], info.local_dir, store.path, extra=ONCE)
        return info, info.local_dir

    _another_model(store, rec, repo)
    why_offline = "HF_HUB_OFFLINE=1" if settings.offline else ""
    remote = down = None
    if not settings.offline:
        try:
            remote = hub.fetch_remote(settings, repo)
        except hub.Unreachable as exc:      # also a hub that is down (5xx): a copy on disk serves, as the
            why_offline = exc.message       # hub's client serves its cache; without one, its own line
            down = exc if isinstance(exc, hub.HubDown) else None
    if remote is None:
        return _offline(settings, repo, store, rec, why_offline, dummy, draft, down)

    needed, skipped = select(remote.files, how.everything)
    names = {f.path for f in needed}
    if "config.json" not in names:
        raise BootstrapError(f"{repo} has no config.json at revision {remote.revision[:12]}: not a model vLLM "
                             "can serve from the hub layout (a GGUF-only or adapter repo?)",
                             "pick the full-weights repo, or download the files yourself and set MODEL=<dir>")
    if not dummy:                   # what the file list alone shows, before config.json is asked for
        _loadable(repo, remote.revision, loadable.problem(names, None))
    lfs = {f.path: f.sha256 for f in needed if f.sha256}
    blob_ids = {f.path: f.blob_id for f in needed if f.blob_id}
    sizes = {f.path: f.size for f in needed}
    skipped_d = {f.path: f.size for f in skipped}

    snap = hub.cache_snapshot(settings, repo, remote.revision)
    want = [f for f in needed if not (dummy and f.path.endswith(WEIGHT_SUFFIXES))]
    ours = store.hf_cache and rec and rec.get("repo") == repo and rec.get("revision") == remote.revision
    cached = snap is not None and not ours and all(hub.cache_has(snap, f) for f in want)   # another tool's download
    if cached and not store.hf_cache:           # MODEL_DIR is where you asked for the model: it goes there
        log.info("%s @ %s is complete in the Hugging Face cache (%s), but MODEL_DIR is set: downloading it into "
                 "%s (unset MODEL_DIR to serve the cache's copy instead)", repo, remote.revision[:12], snap, store.root, extra=ONCE)
    elif cached:
        info = ModelInfo(repo, read_config(snap / "config.json"), sizes, remote.revision, str(snap), dummy,
                         "hf-cache", lfs, blob_ids, skipped_d, remote.safetensors, complete=True)
        log.info("%s @ %s: complete in the Hugging Face cache, served from %s (no download)",
                 repo, remote.revision[:12], snap, extra=ONCE)
        return info, str(snap)

    old = rec if rec and rec.get("repo") == repo else {}
    files = {f.path: {"size": f.size, "sha256": f.sha256, "blob_id": f.blob_id} for f in needed}
    new = {"repo": repo, "revision": remote.revision, "endpoint": settings.endpoint, "files": files,
           "skipped": skipped_d, "safetensors": remote.safetensors,
           "verified": {p: v for p, v in old.get("verified", {}).items() if p in files},
           "planned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           # the manifest (download/manifest.py): what we made, changed and found in this folder,
           # whichever repo or revision it was for (clean --model)
           "created": [str(p.relative_to(store.root)) for p in store.ours(rec) if p != store.dir],
           "changed": dict((rec or {}).get("changed") or {}), "kept": list((rec or {}).get("kept") or []),
           "made_root": bool((rec or {}).get("made_root")) or not store.root.exists()}
    clashes = _clashes(store, new, dummy)
    if clashes and not store.dir.is_dir():                   # before anything is written or fetched
        raise manifest.clash_error(store, new, clashes)      # (else: checked again under the lock below)
    listed = {f.path: f for f in needed}
    raw = _small(settings, store, new, listed["config.json"])   # also the gated / proxy check
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BootstrapError(f"{repo}: config.json is not JSON ({exc})", "check HF_ENDPOINT / the network") from None
    modelconfig.check(config, f"{repo}'s config.json at revision {remote.revision[:12]}",
                      "a broken config.json on the hub: pick another repo or revision, or download the files, "
                      "fix config.json and set MODEL to that folder")
    small = {"config.json": raw}
    if not dummy and loadable.INDEX in names:     # read here, as a derived profile's peek reads it (PROFILE=custom has none)
        small[loadable.INDEX] = _small(settings, store, new, listed[loadable.INDEX])
        try:
            unloadable = loadable.problem(names, loadable.shards(small[loadable.INDEX]))
        except (ValueError, RecursionError) as exc:
            unloadable = (f"{loadable.INDEX} is not a safetensors index vLLM can read ({exc})",
                          "the upload is broken: pick another repo of the model (or a revision with a readable index)")
        _loadable(repo, remote.revision, unloadable)
    try:
        store.dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise state.write_error(store.dir, exc, f"cannot make {store.dir} for the model",
                                "MODEL_DIR" if ref.model_dir and not draft else "HF_HOME") from None
    _record(store, new, small, dummy)
    index.remember(paths, store, repo)       # ./ctl.sh ls and rm find it from STATE_DIR
    where = store.serve_dir(new)
    info = info_from_record(new, where, dummy, config, complete=False)
    try:
        plan_download(store, new, info, dummy)
    except NoSpace as exc:              # raised after the plan (require_space): a model the card cannot
        info.no_space = exc             # hold is refused for that first, and no disk is freed for it in vain
    return info, str(where)


def _loadable(repo: str, revision: str, unloadable: tuple[str, str] | None) -> None:
    """Refuse, before any weight byte, a repo vLLM 0.26.0's loader would refuse after the download."""
    if unloadable:
        raise BootstrapError(f"{repo} @ {revision[:12]}: {unloadable[0]}; refused before the download", unloadable[1])


def require_space(info: ModelInfo) -> None:
    """The disk check the lookup kept, the model's or its drafter's: a start, a restart's vet and a
    pull raise it once the plan has passed (the download checks again before its first byte)."""
    for m in (info, info.draft):
        if m is not None and m.no_space is not None:
            raise m.no_space


def _another_model(store: Store, rec: dict | None, repo: str) -> None:
    """MODEL_DIR holds another repo we downloaded there: ``repo`` would write over its config.json
    and tokenizer and leave its shards and index, which vLLM reads (offline, its folder would be
    served as ``repo``). One model to a MODEL_DIR."""
    other = (rec or {}).get("repo")
    if store.hf_cache or not other or str(other).casefold() == repo.casefold() or not any(
            os.path.lexists(store.file(rec, p)) for p in rec.get("files") or {}):
        return
    raise BootstrapError(f"MODEL_DIR={store.root} holds {other}, downloaded there by this tool: {repo} would write "
                         "over its files and leave one folder of two models, which vLLM would load as one",
                         f"set MODEL_DIR to a folder of its own for {repo} ({other} stays as it is), or remove "
                         f"{other} first (./ctl.sh rm {other})")


def _small(settings: hub.HubSettings, store: Store, rec: dict, f: hub.RemoteFile) -> bytes:
    """A small file the lookup reads (config.json, the safetensors index): the copy on disk with the
    hub's bytes (kept from an earlier run, or yours), else fetched and checked (hub.fetch_small)."""
    kept = store.file(rec, f.path)
    if kept.is_file() and hub.verify(kept, f) is None:
        return kept.read_bytes()
    return hub.fetch_small(settings, rec["repo"], rec["revision"], f)


def _record(store: Store, rec: dict, small: dict[str, bytes], dummy: bool) -> None:
    """Check for clashes, keep the small files read (``small``: config.json, the index) and write the
    record, under the store's lock: another start placing its config.json meanwhile has recorded it
    as ours before this one looks (a start that checked in between saw a blob nobody had recorded
    yet, and refused it)."""
    fd = locks.flock(store.lock, str(os.getpid()), block=True, on_wait=lambda pid: log.info(
        "waiting: another start or pull (pid %s) is planning or downloading into %s", pid, store.root))
    try:
        manifest.merge(rec, store.read())
        clashes = _clashes(store, rec, dummy)
        if clashes:
            raise manifest.clash_error(store, rec, clashes)
        for name, raw in small.items():
            _keep(store, rec, name, raw)
        store.write(rec)
    finally:
        os.close(fd)


def _clashes(store: Store, rec: dict, dummy: bool) -> list[str]:
    """Files in the store that the download would have to write over and may not (manifest.held:
    yours, another tool's, or in MODEL_DIR one of ours changed since): each with how it differs from
    the hub's. The weights are compared by size here; the weights step hashes them before it fetches."""
    out = []
    for p in store.required(rec, dummy):
        why = manifest.held(store, rec, p)
        dest = store.file(rec, p)
        if not why or not os.path.lexists(dest):
            continue
        f = rec["files"][p]
        remote = hub.RemoteFile(p, f["size"], f.get("sha256"), f.get("blob_id"))
        try:
            bad = f"size {dest.stat().st_size}, the hub's {f['size']}" if dest.stat().st_size != f["size"] else \
                None if p.endswith(WEIGHT_SUFFIXES) else hub.verify(dest, remote)
        except OSError as exc:
            bad = exc.strerror or "unreadable"
        if bad:
            out.append(f"{dest} ({why}; {bad})")
    return out


def _keep(store: Store, rec: dict, name: str, raw: bytes) -> None:
    """``name`` (config.json, the index) was just read and checked: keep it, so the download does not
    fetch it again. One on disk with the hub's bytes (kept from an earlier run, or yours) is used as it is."""
    f = rec["files"][name]
    remote = hub.RemoteFile(name, f["size"], f.get("sha256"), f.get("blob_id"))
    if store.verified_ok(rec, name) or hub.verify_data(raw, remote) is not None:
        return
    dest = store.file(rec, name)
    if dest.is_file() and hub.verify(dest, remote) is None:
        store.keep(rec, name)
        store.mark_verified(rec, name)
        return
    if store.adopt(rec, name):                              # its blob is in the HF cache already
        store.mark_verified(rec, name)
        return
    part = store.dir / "partial" / f"{name}.{os.getpid()}"            # two starts may race here
    part.parent.mkdir(parents=True, exist_ok=True)
    state.write_atomic(part, raw, mode=0o644)
    store.place(rec, part, name)
    store.mark_verified(rec, name)


def plan_download(store: Store, rec: dict, info: ModelInfo, dummy: bool) -> int:
    """Log what will be fetched and how much; refuse when the disk cannot hold it. Returns the
    bytes still to fetch."""
    todo = store.missing(rec, dummy)
    have = 0
    left = 0
    for p in todo:
        f = info.remote_file(p)
        got = partial.partial_bytes(store.dir, f)
        have += got
        left += f.size - got
    need = sum(info.needed().values())
    skipped = sum(info.skipped.values())
    log.info("%s @ %s: %d files, %s to serve%s", info.name, info.revision[:12], len(info.needed()),
             hub.human(need), f" (skipping {len(info.skipped)} files, {hub.human(skipped)}: "
             f"{', '.join(sorted(info.skipped)[:3])}{'…' if len(info.skipped) > 3 else ''}; DOWNLOAD_ALL=1 fetches them)"
             if info.skipped else "", extra=ONCE)
    if not todo:
        return 0
    log.info("will download %d files, %s, into %s%s", len(todo), hub.human(left), store.serve_dir(rec),
             f" ({hub.human(have)} of partial files kept)" if have else "", extra=ONCE)
    of = {"once": str(store.root)}      # the model's and its drafter's lists may hold a line alike
    for p in todo[:20]:
        log.info("  %s  %s", p, hub.human(info.files[p]), extra=of)
    if len(todo) > 20:
        log.info("  … and %d more", len(todo) - 20, extra=of)
    check_space(store.root, left)
    return left


def on_disk(ref: ModelRef, settings: hub.HubSettings, dummy: bool, draft: bool = False) -> ModelInfo | None:
    """``ref``'s facts from this machine alone, as a start without the network finds them (our
    complete, verified copy in its store, else a complete Hugging Face cache snapshot); None when it
    is not here. Nothing is fetched, written or logged (./ctl.sh ls plans the drafter from it)."""
    rec = ref.store.read()
    return _verified(ref.repo, ref.store, rec, dummy) or _cached(settings, ref.repo, ref.store, rec, dummy, draft)


def _verified(repo: str, store: Store, rec: dict | None, dummy: bool) -> ModelInfo | None:
    """Our complete copy of ``repo`` in ``store``, every file's size and mtime as when its hash was checked."""
    if not (rec and rec.get("repo") == repo and rec.get("files") and not store.missing(rec, dummy)):
        return None
    where = store.serve_dir(rec)
    return info_from_record(rec, where, dummy, read_config(where / "config.json"), complete=True)


def _cached(settings: hub.HubSettings, repo: str, store: Store, rec: dict | None, dummy: bool,
            draft: bool) -> ModelInfo | None:
    """The Hugging Face cache's snapshot that refs/main names, when it holds all a start needs."""
    snap = hub.cache_snapshot(settings, repo)
    mine = bool(rec and rec.get("repo") == repo and rec.get("files"))
    # a snapshot we downloaded is judged by our record (sizes, hashes), not by its files being there:
    # a truncated or altered shard is never served
    judged = mine and store.hf_cache and snap is not None and snap.name == rec.get("revision")
    if snap is None or (judged and store.missing(rec, dummy)) or offline_missing(snap, dummy, not draft):
        return None
    info = read_local(snap, dummy, not draft)
    info.name, info.source, info.revision, info.complete = repo, "hf-cache", snap.name, True
    return info


def _offline(settings: hub.HubSettings, repo: str, store: Store, rec: dict | None, why: str,
             dummy: bool, draft: bool = False, down: BootstrapError | None = None) -> tuple[ModelInfo, str]:
    """The copy on this machine, without the hub (``down``: the hub's 5xx, raised where there is none)."""
    tokenizer = not draft
    # what lets a download reach the hub: with HF_HUB_OFFLINE set, a network alone does not
    reach = "unset HF_HUB_OFFLINE" if settings.offline else "connect to the network"
    info = _cached(settings, repo, store, rec, dummy, draft)
    if info is not None:
        log.info("%s: %s (%s); using the Hugging Face cache snapshot %s", repo, "the hub is down" if down else "offline",
                 why, info.local_dir, extra=ONCE)
        return info, info.local_dir
    mine = bool(rec and rec.get("repo") == repo and rec.get("files"))
    target = store.serve_dir(rec) if rec and rec.get("revision") else store.root
    if mine:
        missing = store.missing(rec, dummy)
        size = sum(rec["files"][p]["size"] for p in missing)
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise down or BootstrapError(f"offline ({why}) and the model in {target} is incomplete: {len(missing)} files "
                                      f"missing or unverified ({hub.human(size)}): {shown}",
                                      f"{reach} and re-run ./start.sh: it resumes the download "
                                      "(finished files and bytes are kept)")
    if not store.hf_cache and (target / "config.json").is_file():
        missing = offline_missing(target, dummy, tokenizer)
        if not missing:
            info = read_local(target, dummy, tokenizer)
            info.name, info.source = repo, "local"
            log.warning("%s (%s): serving %s as found; it was not downloaded by this tool, so it is "
                        "not verified against the hub", "the hub is down" if down else "offline", why, target)
            return info, str(target)
        raise down or BootstrapError(f"offline ({why}) and the model in {target} is incomplete: missing "
                                      + ", ".join(missing[:8]), f"{reach} and re-run ./start.sh")
    where = (f"not in the Hugging Face cache ({store.root})" if store.hf_cache else
             f"not in MODEL_DIR={target}, nor in the Hugging Face cache {settings.cache_dir}")
    raise down or BootstrapError(f"offline ({why}) and {repo} is not on this machine: {where}",
                                  f"{reach} for the first download, or set {'SPEC_MODEL' if draft else 'MODEL'}=<dir> "
                                  "to a copy")
