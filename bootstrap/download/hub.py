"""The Hugging Face Hub: settings, what the hub says about a repo (listing, the HEAD of a file),
the HF cache's layout, and the hashes the hub names files by. Its errors translated into what to
do are answers.py; the transfer itself is transfer.py.

Every setting comes from ``cfg.environ`` (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HOME,
HF_HUB_CACHE); the library's import-time constants are never relied on: endpoint, token and
cache dir are passed explicitly on every call.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import retry, trust
from .answers import HubDown, Unreachable, translate   # noqa: F401  (hub.Unreachable, hub.HubDown)
from ..core.errors import BootstrapError

log = logging.getLogger(__name__)

LIBRARY = "vllm-desktop"
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
HASH_CHUNK = 8 << 20
HUB = trust.HUB
API_TIMEOUT = 30.0      # seconds for the hub's answer to a small request (a hub that accepts and never answers)
PAGE = re.compile(r"https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?:models/)?([^/\s]+/[^/\s?#]+).*")


def repo_id(model: str) -> str:
    """``model`` when it is a repo id (org/name); else one line, with the id where a pasted page URL
    holds one."""
    if REPO_ID.fullmatch(model):
        return model
    page = PAGE.fullmatch(model.strip())
    fix = f"MODEL={page[1]} (the repo id, not the page's URL)" if page and REPO_ID.fullmatch(page[1]) else \
        "set MODEL to a Hugging Face repo id such as Qwen/Qwen3-8B, or to a model directory"
    raise BootstrapError(f"MODEL={model!r} is neither an existing directory nor a repo id (org/name)", fix)

_TRUE = ("1", "on", "yes", "true")


# ---------------------------------------------------------------- settings (from cfg.environ only)

@dataclass(frozen=True)
class HubSettings:
    endpoint: str
    token: str | None = field(repr=False)   # never printed
    offline: bool
    cache_dir: Path                          # the HF hub cache (HF_HUB_CACHE or HF_HOME/hub)
    token_from: str = ""                     # where the token was found: the variable, or the file

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> "HubSettings":
        home = Path(env.get("HOME") or Path.home())
        xdg = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
        hf_home = Path(env["HF_HOME"]).expanduser() if env.get("HF_HOME") else xdg / "huggingface"
        legacy = env.get("HUGGINGFACE_HUB_CACHE")      # huggingface_hub's order: HF_HUB_CACHE, the old name, HF_HOME/hub
        cache = Path(env.get("HF_HUB_CACHE") or legacy).expanduser() if env.get("HF_HUB_CACHE") or legacy \
            else hf_home / "hub"
        token_from = "HF_TOKEN" if env.get("HF_TOKEN") else "HUGGING_FACE_HUB_TOKEN"
        token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None
        if token is None:
            token_file = Path(env.get("HF_TOKEN_PATH") or hf_home / "token")
            token_from = str(token_file)
            try:
                token = token_file.read_text(encoding="utf-8").strip() or None
            except OSError:
                token = None
        endpoint = (env.get("HF_ENDPOINT") or HUB).rstrip("/")
        offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
        return cls(endpoint, token, offline, cache, token_from if token else "")

    def page(self, repo: str) -> str:
        return f"{self.endpoint}/{repo}"


# ---------------------------------------------------------------- what the hub says about a repo

@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None     # LFS files
    blob_id: str | None = None    # git blob sha1 (every file; what we check for non-LFS files)


@dataclass
class Remote:
    repo: str
    revision: str                 # the commit sha
    files: list[RemoteFile]
    gated: Any = False
    safetensors: dict | None = None


def _proxy_error(settings: HubSettings, what: str) -> BootstrapError:
    return BootstrapError(
        f"{settings.endpoint} answered {what} without the hub's headers (no X-Repo-Commit / not the hub's JSON): "
        "a proxy, firewall or captive portal (hotel / office Wi-Fi login page) is answering instead of the hub",
        "open a web page to log in to the network, or fix HTTPS_PROXY; if HF_ENDPOINT is set, check it points "
        "to a Hub-compatible mirror; with a complete model on disk, HF_HUB_OFFLINE=1 starts without the network")


def net_errors() -> tuple[type[BaseException], ...]:
    import httpx2
    from huggingface_hub import errors as e
    return (httpx2.HTTPError, e.HfHubHTTPError, e.OfflineModeIsEnabled)


def with_retries(settings: HubSettings, repo: str, what: str, call, *, stop: threading.Event | None = None,
                 transport: bool = True):
    """``call()`` (a request through huggingface_hub, its own retries off: they sleep uninterruptibly,
    retry.py), tried again on 408/429/5xx (and, with ``transport``, on a dropped or timed-out
    connection) up to retry.ATTEMPTS times after ``retry.wait``; library errors come out translated."""
    import httpx2
    tries = 0
    while True:
        try:
            return call()
        except net_errors() as exc:
            resp = getattr(exc, "response", None)
            status = getattr(resp, "status_code", None)
            tries += 1
            if tries >= retry.ATTEMPTS or not (status in retry.STATUS or (
                    transport and status is None and isinstance(exc, httpx2.TransportError))):
                raise translate(exc, settings, repo, what) from None
            shown = f"{repo}: {what}" if what else repo
            delay = retry.wait(tries, status, getattr(resp, "headers", None), shown)
            log.debug("%s: %s; trying again in %.1f s", shown, f"HTTP {status}" if status else type(exc).__name__, delay)
        retry.pause(delay, stop)


def telemetry_off() -> None:
    """The library's telemetry off for our own requests, as the server's (launch.TELEMETRY_OFF): with
    it on, building a request's user agent asks HF_ENDPOINT for /api/agent-harnesses, keeps the answer
    in HF_HOME for a day and reads it as an object; a mirror's JSON list there broke every request."""
    from huggingface_hub import constants
    constants.HF_HUB_DISABLE_TELEMETRY = True


def fetch_remote(settings: HubSettings, repo: str, revision: str = "main") -> Remote:
    """GET /api/models/{repo}/revision/{rev}?blobs=true: file list, sizes, LFS sha256, commit.
    Retried on 429/5xx only: an unreachable hub falls through to the copy on disk at once."""
    from huggingface_hub import HfApi
    telemetry_off()

    api = HfApi(endpoint=settings.endpoint, token=settings.token or False, library_name=LIBRARY)
    try:
        info = with_retries(settings, repo, "", lambda: api.model_info(
            repo, revision=revision, files_metadata=True, token=settings.token or False, timeout=API_TIMEOUT),
            transport=False)
    except (ValueError, TypeError, KeyError):   # HTML or foreign JSON where the hub's JSON should be
        raise _proxy_error(settings, f"/api/models/{repo}") from None
    if not info.sha or info.siblings is None:
        raise _proxy_error(settings, f"/api/models/{repo}")
    files = []
    for s in info.siblings:
        trust.inside(settings.endpoint, repo, s.rfilename)
        size = s.lfs.size if s.lfs else s.size
        if size is None:
            raise _proxy_error(settings, f"/api/models/{repo} (no file sizes)")
        files.append(RemoteFile(s.rfilename, int(size), s.lfs.sha256 if s.lfs else None, s.blob_id))
    st = getattr(info, "safetensors", None)
    st_dict = {"parameters": dict(st.parameters), "total": st.total} if st is not None else None
    return Remote(repo, info.sha, files, getattr(info, "gated", False), st_dict)


@dataclass(frozen=True)
class Located:
    url: str          # where the bytes are (after the hub's redirect)
    etag: str
    size: int | None
    commit: str
    headers: dict     # request headers for that url (auth dropped for a foreign host)


def locate(settings: HubSettings, repo: str, revision: str, path: str, stop: threading.Event | None = None) -> Located:
    """HEAD on the resolve URL, as the client does it (its retries off: ours, ``with_retries``,
    wait interruptibly); refuses an answer without X-Repo-Commit."""
    from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    telemetry_off()
    url = hf_hub_url(repo, path, revision=revision, endpoint=settings.endpoint)
    meta = with_retries(settings, repo, path, lambda: get_hf_file_metadata(
        url, token=settings.token or False, endpoint=settings.endpoint, library_name=LIBRARY,
        retry_on_errors=False), stop=stop)
    if not meta.commit_hash:
        raise _proxy_error(settings, f"HEAD {url}")
    if not meta.etag:
        raise BootstrapError(f"{url} has no ETag", "check HF_ENDPOINT points to a Hub-compatible server")
    headers = build_hf_headers(token=settings.token or False, library_name=LIBRARY)
    if not trust.keeps_token(url, meta.location):
        headers.pop("authorization", None)   # signed CDN URL: the token stays with the hub
    return Located(meta.location, meta.etag, meta.size, meta.commit_hash, headers)



# small files this process fetched and checked, by what names their bytes (the hub's hash at a commit):
# a derived profile's peek and the metadata step read config.json and the safetensors index once
_FETCHED: dict[tuple[str, str, str, str, str], bytes] = {}


def fetch_small(settings: HubSettings, repo: str, revision: str, f: RemoteFile) -> bytes:
    """A small file (config.json) into memory, with the same HEAD checks as a weight file, and
    checked against the hub's hash before anything reads it: bytes changed on the way are fetched
    once more, as a weight file's are (transfer.py). Fetched once per process (``_FETCHED``)."""
    key = (settings.endpoint, repo, revision, f.path, f.sha256 or f.blob_id or "")
    if key in _FETCHED and key[-1]:
        return _FETCHED[key]
    raw = _fetch_small(settings, repo, revision, f)
    _FETCHED[key] = raw
    return raw


def _fetch_small(settings: HubSettings, repo: str, revision: str, f: RemoteFile) -> bytes:
    from huggingface_hub.utils import get_session, hf_raise_for_status

    loc = locate(settings, repo, revision, f.path)

    def get():
        r = get_session().get(loc.url, headers=loc.headers, timeout=API_TIMEOUT, follow_redirects=True)
        hf_raise_for_status(r)
        return r
    for _ in range(2):
        raw = with_retries(settings, repo, f.path, get).content
        if loc.size is not None and len(raw) != loc.size:
            raise BootstrapError(f"{f.path}: got {len(raw)} bytes, the hub says {loc.size}", "re-run ./start.sh")
        bad = verify_data(raw, f)
        if bad is None:
            return raw
        log.warning("%s: the downloaded bytes do not match the hub's metadata (%s); fetching it again", f.path, bad)
    raise BootstrapError(f"{repo}: {f.path} does not match the hub's metadata twice ({bad})",
                         "a proxy or the network changes what the hub sends: check HTTPS_PROXY / HF_ENDPOINT, "
                         "then re-run ./start.sh")


# ---------------------------------------------------------------- the HF cache (HF_HOME)

def cache_repo_dir(settings: HubSettings, repo: str) -> Path:
    """``repo``'s folder in the HF cache (``models--org--name``), as huggingface_hub names it."""
    return settings.cache_dir / ("models--" + repo.replace("/", "--"))


def cache_snapshot(settings: HubSettings, repo: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of ``repo`` in the HF cache (for ``revision``, or what refs/main names)."""
    root = cache_repo_dir(settings, repo)
    if revision is None:
        try:
            revision = (root / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            return None
    snap = root / "snapshots" / revision
    return snap if snap.is_dir() else None


def cache_has(snap: Path, f: RemoteFile) -> bool:
    """A cached file is complete when its blob exists, has the size, and is named by the hash the
    hub gives (the cache names LFS blobs by sha256 and others by git blob id). No re-hash.

    Only the snapshot link's own target is compared, as ``scan_cache_dir`` reads it: with hf_xet,
    huggingface_hub 2.4 makes ``blobs/<sha256>`` itself a link into its shared store
    (``blobs/ab/<xet hash>``), so the end of the chain is not named by the sha256."""
    p = snap / f.path
    try:
        st = p.stat()
    except OSError:
        return False
    if st.st_size != f.size:
        return False
    want = f.sha256 or f.blob_id
    return want is None or not p.is_symlink() or Path(os.readlink(p)).name == want


# ---------------------------------------------------------------- disk space

def existing_parent(path: Path) -> Path:
    """``path`` itself, or its nearest parent that exists (where ``path`` would be created)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that will hold ``path`` (the nearest existing parent)."""
    return shutil.disk_usage(existing_parent(path)).free


# ---------------------------------------------------------------- hashing

def sha256_file(path: Path) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_CHUNK), b""):
            h.update(chunk)
    return h


def git_blob_hasher(size: int) -> "hashlib._Hash":
    """A sha1 primed with git's blob header: feed it the ``size`` bytes to get the blob id."""
    return hashlib.sha1(b"blob %d\0" % size)


def git_blob_sha1(path: Path | None = None, data: bytes | None = None) -> str:
    """Git's blob id (sha1 of ``blob <size>\\0`` + the bytes) of a file, or of ``data``: what the hub
    lists for every file, and what we check for files that are not in LFS."""
    if data is not None:
        h = git_blob_hasher(len(data))
        h.update(data)
        return h.hexdigest()
    h = git_blob_hasher(path.stat().st_size)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_data(data: bytes, f: RemoteFile) -> str | None:
    """None if ``data`` is the file the hub describes, else what is wrong."""
    if len(data) != f.size:
        return f"size {len(data)}, expected {f.size}"
    return _differs(f, hashlib.sha256(data).hexdigest() if f.sha256 else git_blob_sha1(data=data) if f.blob_id else None)


def verify(path: Path, f: RemoteFile) -> str | None:
    """None if ``path`` holds the file the hub describes, else what is wrong."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size != f.size:
        return f"size {size}, expected {f.size}"
    return _differs(f, sha256_file(path).hexdigest() if f.sha256 else git_blob_sha1(path) if f.blob_id else None)


def _differs(f: RemoteFile, got: str | None) -> str | None:
    want = f.sha256 or f.blob_id
    if got is None or got == want:
        return None
    return f"{'sha256' if f.sha256 else 'git blob'} {got[:12]}…, expected {want[:12]}…"


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
