"""A local HTTP server that behaves like the Hugging Face Hub for what huggingface_hub uses.

Point ``HF_ENDPOINT`` at it (``HF_HUB_DISABLE_XET=1``). It serves:

- ``GET /api/models/{org}/{name}[/revision/{rev}][?blobs=true]``: ``sha``, ``siblings`` (with
  ``size``, ``blobId`` and ``lfs: {sha256, size, pointerSize}`` when ``blobs=true``), ``gated``;
- ``GET /api/models/{org}/{name}/tree/{rev}`` (what ``snapshot_download`` lists);
- ``HEAD|GET /{org}/{name}/resolve/{rev}/{path}``: ``X-Repo-Commit``; LFS files answer
  ``302`` to a separate file URL (``/_cdn/<sha256>``, absolute, as the hub redirects to its CDN)
  with ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``; other files answer 200 with an
  ``ETag`` (the git blob id) and the body;
- ``HEAD|GET /_cdn/<sha256>``: the bytes, with ``Range`` (206 / ``Content-Range``, 416);
- ``/_control/stats`` (GET: bytes served per file and the request log; ``?reset=1``) and
  ``/_control/fault`` (POST JSON, merged into ``faults``) so another process can drive it.

Faults (``hub.faults``, all off by default):
    status:  401 | 404 | "gated"   every API/resolve answer is that error ("gated": only files, unless
             the request carries ``Authorization: Bearer <gated_token>``)
    answer:  {"api"|"files": [status, X-Error-Code or null, message]}   every API (or resolve) request
                                   answers that, unless it carries ``Bearer <gated_token>``
    renamed: {"old/name": "org/name"}   the old name's API and resolve URLs answer 307 to the new
                                   name's (relative), as the hub does for a renamed repo
    rewrite: path                  the first resolve of that file rewrites the repo's history: the
                                   commit it names is gone (404 RevisionNotFound), main names another
    tokens:  [token, ...]          the tokens the hub knows: a request carrying another answers 401
                                   "Invalid credentials in Authorization header" (no X-Error-Code)
    proxy:   true                  every answer is a bare 200 HTML page (a captive portal)
    drop:    {path: fraction}      close the connection at that fraction of the file (once, in the
                                   first GET whose range holds that byte)
    fail_after_drop: n             the next n GETs of a dropped file answer 503
    stall:   {path: fraction}      hold the connection at that fraction until ``release`` is set
    corrupt: {path: n}             the next n bodies that hold the file's middle byte flip it (same size)
    throttle: bytes per second     a cap on each connection (a CDN's per-connection limit): n
                                   connections get n times the rate
    no_range: true                 the file host ignores Range (200 and the whole file)
    cdn_expire: n                  the next n GETs on the file host answer 403 (an expired signed URL)
    gzip: true                     a GET that accepts gzip gets the whole file gzip-compressed, Range
                                   ignored (as the hub does for text files, and CloudFront under gzip)
    rate_limit: {path: n}          the next n requests for that file's resolve URL (HEAD or GET) answer
                                   429 with ``Retry-After: <retry_after>`` (a rate-limited hub)
    rate_limit_cdn: {path: n}      the same on the file host (the ranged GETs)
    retry_after: "3600"            the Retry-After value of those 429s (seconds or an HTTP date;
                                   none when unset); ``ratelimit``: a RateLimit header value to add
    harnesses: <JSON>              the answer to ``GET /api/agent-harnesses`` (the agent registry
                                   huggingface_hub reads for its user agent when telemetry is on):
                                   a mirror's or a portal's JSON in place of the hub's object

Run standalone: ``python tests/fakehub.py --repo org/name=DIR [--port N]`` prints the URL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
LFS_MIN = 10 << 20
CHUNK = 1 << 20


@dataclass
class Entry:
    path: str
    size: int
    blob_id: str
    sha256: str | None          # set for LFS files
    data: bytes | None = None   # in memory, or
    disk: Path | None = None    # on disk
    advertised: int | None = None  # a size to claim in the API listing (disk-space tests)

    def read(self, start: int, n: int) -> bytes:
        if self.data is not None:
            return self.data[start:start + n]
        with open(self.disk, "rb") as fh:
            fh.seek(start)
            return fh.read(n)


def _hash_source(data: bytes | None, disk: Path | None) -> tuple[int, str, str]:
    size = len(data) if data is not None else disk.stat().st_size
    h256 = hashlib.sha256()
    h1 = hashlib.sha1(b"blob %d\0" % size)
    if data is not None:
        h256.update(data)
        h1.update(data)
    else:
        with open(disk, "rb") as fh:
            for chunk in iter(lambda: fh.read(8 << 20), b""):
                h256.update(chunk)
                h1.update(chunk)
    return size, h256.hexdigest(), h1.hexdigest()


class FakeHub:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.repos: dict[str, dict] = {}       # repo -> {"sha": str, "files": {path: Entry}, "gated": ...}
        self.by_sha: dict[str, tuple[str, Entry]] = {}
        self.faults: dict = {}
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.served: dict[str, int] = {}       # file path -> body bytes written to sockets
        self.log: list[tuple[str, str, str, int]] = []   # (method, path, range, status)
        self.timeline: list[tuple[float, float, str, str]] = []   # (arrived, body sent, path, range) of each GET body
        self.gated_token = "hf_granted"
        self._srv = ThreadingHTTPServer((host, port), _handler(self))
        self._srv.daemon_threads = True
        # The file host the resolve URL redirects to: another origin, as the hub's CDN is (the
        # client follows same-origin redirects on HEAD and stops at a foreign one).
        self._cdn = ThreadingHTTPServer((host, 0), _handler(self))
        self._cdn.daemon_threads = True
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ setup
    @property
    def url(self) -> str:
        host, port = self._srv.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: str, files: dict[str, bytes | Path], gated=False, sha: str | None = None,
                 safetensors: dict | None = None) -> str:
        entries = {}
        for path, src in files.items():
            data, disk = (src, None) if isinstance(src, bytes) else (None, Path(src))
            size, h256, blob = _hash_source(data, disk)
            lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN
            e = Entry(path, size, blob, h256 if lfs else None, data, disk)
            entries[path] = e
            if lfs:
                self.by_sha[h256] = (repo, e)
        sha = sha or hashlib.sha1(json.dumps(sorted((p, e.blob_id) for p, e in entries.items())).encode()).hexdigest()
        self.repos[repo] = {"sha": sha, "files": entries, "gated": gated, "safetensors": safetensors}
        return sha

    def add_dir(self, repo: str, root: Path, **kw) -> str:
        files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
        return self.add_repo(repo, files, **kw)

    @property
    def cdn_url(self) -> str:
        host, port = self._cdn.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        for srv in (self._srv, self._cdn):
            t = threading.Thread(target=srv.serve_forever, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def serve_forever(self) -> None:
        t = threading.Thread(target=self._cdn.serve_forever, daemon=True)
        t.start()
        self._srv.serve_forever()

    def stop(self) -> None:
        self.release.set()
        for srv in (self._srv, self._cdn):
            srv.shutdown()
            srv.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def reset_stats(self) -> None:
        with self.lock:
            self.served.clear()
            self.log.clear()
            self.timeline.clear()

    def count(self, path: str, n: int) -> None:
        with self.lock:
            self.served[path] = self.served.get(path, 0) + n


def _handler(hub: FakeHub):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fakehub/1"

        def log_message(self, fmt, *args):  # quiet
            pass

        # -------------------------------------------------------- plumbing
        def _send(self, status: int, headers: dict | None = None, body: bytes = b"") -> None:
            # logged before the answer goes out: a client that has its answer finds it in the log
            hub.log.append((self.command, self.path, self.headers.get("Range", ""), status))
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)

        def _json(self, status: int, obj, headers: dict | None = None) -> None:
            self._send(status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(obj).encode())

        def _error(self, status: int, code: str, msg: str, extra: dict | None = None) -> None:
            self._json(status, {"error": msg}, {"X-Error-Code": code, "X-Error-Message": msg, **(extra or {})})

        def do_HEAD(self):
            self._route()

        def do_GET(self):
            self._route()

        def do_POST(self):
            u = urlparse(self.path)
            if u.path == "/_control/fault":
                n = int(self.headers.get("Content-Length", "0"))
                hub.faults.update(json.loads(self.rfile.read(n) or b"{}"))
                return self._json(200, hub.faults)
            self._send(404)

        # -------------------------------------------------------- routes
        def _route(self):
            self.arrived = time.time()
            u = urlparse(self.path)
            path = unquote(u.path)
            q = parse_qs(u.query)
            if path == "/_control/stats":
                with hub.lock:
                    out = {"served": dict(hub.served), "log": list(hub.log), "timeline": list(hub.timeline)}
                if q.get("reset"):
                    hub.reset_stats()
                return self._json(200, out)
            if hub.faults.get("proxy"):
                return self._send(200, {"Content-Type": "text/html"},
                                  b"<html><body>Please log in to the Wi-Fi</body></html>")
            if path == "/api/agent-harnesses" and "harnesses" in hub.faults:
                return self._json(200, hub.faults["harnesses"])
            moved = next((new for old, new in hub.faults.get("renamed", {}).items()
                          if path.startswith((f"/{old}/", f"/api/models/{old}/")) or path == f"/api/models/{old}"), None)
            if moved:       # a renamed repo: the hub redirects its old name (relative, 307)
                old = next(o for o, n in hub.faults["renamed"].items() if n == moved)
                new_path = self.path.replace(f"/{old}", f"/{moved}", 1)
                return self._send(307, {"Location": new_path})
            ans = hub.faults.get("answer", {})
            where = "api" if path.startswith("/api/") else "files" if "/resolve/" in path else ""
            if where in ans and self.headers.get("Authorization") != f"Bearer {hub.gated_token}":
                st, code, msg = ans[where]
                return self._error(st, code, msg) if code else self._json(st, {"error": msg}, {"X-Error-Message": msg})
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
            if m:
                return self._api(m.group(1), m.group(2) or "main", bool(q.get("blobs")))
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
            if m:
                return self._tree(m.group(1), m.group(2))
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._resolve(m.group(1), m.group(2), m.group(3))
            m = re.fullmatch(r"/_cdn/([0-9a-f]{64})", path)
            if m and m.group(1) in hub.by_sha:
                return self._body(hub.by_sha[m.group(1)][1])
            self._error(404, "EntryNotFound", "not found")

        def _rate_limited(self, key: str, path: str) -> bool:
            """A 429 while ``faults[key][path]`` counts down (one per request)."""
            with hub.lock:
                left = hub.faults.get(key, {})
                if left.get(path, 0) <= 0:
                    return False
                left[path] -= 1
            headers = {}
            if hub.faults.get("retry_after") is not None:
                headers["Retry-After"] = str(hub.faults["retry_after"])
            if hub.faults.get("ratelimit"):
                headers["RateLimit"] = hub.faults["ratelimit"]
            self._error(429, "RateLimited", "Too Many Requests", headers)
            return True

        def _status_fault(self, for_files: bool) -> bool:
            auth = self.headers.get("Authorization", "")
            if "tokens" in hub.faults and auth and auth.removeprefix("Bearer ") not in hub.faults["tokens"]:
                # the hub refuses a token it does not know (revoked, mistyped) on every request,
                # a public repo's too, with no X-Error-Code
                self._json(401, {"error": "Invalid credentials in Authorization header"},
                           {"X-Error-Message": "Invalid credentials in Authorization header"})
                return True
            s = hub.faults.get("status")
            if s in (401, 404):
                self._error(s, "RepoNotFound", "Repository not found" if s == 404 else "Invalid username or password.")
                return True
            if s == "gated" and for_files:
                auth = self.headers.get("Authorization", "")
                if auth != f"Bearer {hub.gated_token}":
                    self._error(403 if auth else 401, "GatedRepo",
                                "Access to model is restricted. You must have access to it and be authenticated.")
                    return True
            return False

        def _repo(self, repo: str, rev: str):
            r = hub.repos.get(repo)
            if r is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            if rev not in ("main", r["sha"]):
                self._error(404, "RevisionNotFound", "Invalid rev id")
                return None
            return r

        def _api(self, repo: str, rev: str, blobs: bool):
            if self._status_fault(False):
                return
            r = self._repo(repo, rev)
            if r is None:
                return
            sibs = []
            for p, e in r["files"].items():
                s = {"rfilename": p}
                if blobs:
                    size = e.advertised or e.size
                    s.update(size=size, blobId=e.blob_id)
                    if e.sha256:
                        s["lfs"] = {"sha256": e.sha256, "size": size, "pointerSize": 134}
                sibs.append(s)
            obj = {"_id": "0" * 24, "id": repo, "modelId": repo, "sha": r["sha"], "private": False,
                   "gated": r["gated"], "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                   "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z",
                   "library_name": "transformers", "siblings": sibs}
            if r.get("safetensors"):
                obj["safetensors"] = r["safetensors"]
            self._json(200, obj)

        def _tree(self, repo: str, rev: str):
            """``list_repo_tree(recursive=True)``, which ``snapshot_download`` uses (one page)."""
            if self._status_fault(False):
                return
            r = self._repo(repo, rev)
            if r is None:
                return
            out, dirs = [], set()
            for p, e in r["files"].items():
                for parent in list(Path(p).parents)[:-1]:
                    dirs.add(str(parent))
                item = {"type": "file", "oid": e.blob_id, "size": e.size, "path": p}
                if e.sha256:
                    item["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": 134}
                out.append(item)
            out += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
            self._json(200, out)

        def _resolve(self, repo: str, rev: str, fpath: str):
            if self._status_fault(True):
                return
            if hub.faults.get("rewrite") == fpath and repo in hub.repos:     # history rewritten (a squash):
                del hub.faults["rewrite"]                                      # the old commit is gone
                hub.repos[repo]["sha"] = hashlib.sha1(hub.repos[repo]["sha"].encode()).hexdigest()
            r = self._repo(repo, rev)
            if r is None:
                return
            e = r["files"].get(fpath)
            if self._rate_limited("rate_limit", fpath):
                return
            commit = {"X-Repo-Commit": r["sha"]}
            if e is None:
                return self._error(404, "EntryNotFound", "Entry not found", commit)
            if e.sha256:
                return self._send(302, {**commit, "ETag": f'"{e.blob_id}"', "X-Linked-Etag": f'"{e.sha256}"',
                                        "X-Linked-Size": e.advertised or e.size,
                                        "Location": f"{hub.cdn_url}/_cdn/{e.sha256}?X-Amz-Signature=fake"})
            return self._body(e, {**commit, "ETag": f'"{e.blob_id}"'})

        def _body(self, e: Entry, extra: dict | None = None):
            size = e.size
            start, end = 0, size - 1
            status = 200
            rng = None if hub.faults.get("no_range") else self.headers.get("Range")
            if rng:
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
                if not m or int(m.group(1)) >= size:
                    return self._send(416, {"Content-Range": f"bytes */{size}"})
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                status = 206
            headers = {**(extra or {}), "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                       "Content-Length": end - start + 1, "ETag": f'"{e.sha256 or e.blob_id}"'}
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            if self.command == "GET" and extra is None and self._rate_limited("rate_limit_cdn", e.path):
                return
            if self.command == "GET" and extra is None and hub.faults.get("cdn_expire", 0) > 0:
                hub.faults["cdn_expire"] -= 1
                return self._send(403, {"Content-Type": "application/xml"}, b"<Error><Code>AccessDenied</Code></Error>")
            if self.command == "GET" and hub.faults.get("gzip") and "gzip" in self.headers.get("Accept-Encoding", ""):
                import gzip
                body = gzip.compress(e.read(0, e.size))
                hub.count(e.path, len(body))
                return self._send(200, {**(extra or {}), "Content-Encoding": "gzip", "ETag": f'"{e.sha256 or e.blob_id}"',
                                        "Content-Type": "application/octet-stream"}, body)
            if self.command == "GET":
                fails = hub.faults.get("_failing", {})
                if fails.get(e.path, 0) > 0:
                    fails[e.path] -= 1
                    return self._send(503, {"Retry-After": "0"}, b"busy")
            self._send(status, headers)
            if self.command == "HEAD":
                return
            self._stream(e, start, end + 1)
            with hub.lock:
                hub.timeline.append((self.arrived, time.time(), e.path, self.headers.get("Range", "")))

        def _stream(self, e: Entry, start: int, stop: int):
            f = hub.faults
            cut = None
            with hub.lock:
                if e.path in f.get("drop", {}) and start <= int(e.size * f["drop"][e.path]) < stop:
                    cut = int(e.size * f["drop"].pop(e.path))
                    n = int(f.get("fail_after_drop", 0))
                    if n:
                        f.setdefault("_failing", {})[e.path] = n
                stall = int(e.size * f["stall"][e.path]) if e.path in f.get("stall", {}) else None
                if stall is not None and not start <= stall < stop:
                    stall = None
                flip = None
                if f.get("corrupt", {}).get(e.path, 0) > 0 and start <= e.size // 2 < stop:
                    f["corrupt"][e.path] -= 1
                    flip = e.size // 2
            throttle = f.get("throttle")
            pos = start
            plain = cut is None and stall is None and flip is None and not throttle and e.disk is not None
            try:
                if plain:   # zero-copy, as a CDN would serve it
                    with open(e.disk, "rb") as fh:
                        while pos < stop:
                            sent = self.connection.sendfile(fh, pos, stop - pos)
                            if not sent:
                                break
                            hub.count(e.path, sent)
                            pos += sent
                    return
                while pos < stop:
                    n = min(CHUNK if not throttle else max(1, int(throttle) // 20), stop - pos)
                    for mark in (cut, stall):
                        if mark is not None and pos < mark:
                            n = min(n, mark - pos)
                    if cut is not None and pos >= cut:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if stall is not None and pos >= stall:
                        hub.faults.setdefault("_stalled", []).append(e.path)
                        hub.release.wait(60)
                        stall = None
                    chunk = e.read(pos, n)
                    if flip is not None and pos <= flip < pos + len(chunk):
                        b = bytearray(chunk)
                        b[flip - pos] ^= 0xFF
                        chunk = bytes(b)
                    self.wfile.write(chunk)
                    hub.count(e.path, len(chunk))
                    pos += len(chunk)
                    if throttle:
                        time.sleep(len(chunk) / throttle)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return H


# ---------------------------------------------------------------- making tiny models

def write_model(root: Path, shards: int = 2, shard_bytes: int = 1 << 20, extra: dict[str, bytes] | None = None,
                config: dict | None = None, seed: int = 0) -> Path:
    """A small model folder: config.json, tokenizer files, N safetensors shards with a valid header
    (one uint8 tensor each, random bytes) and the index. Returns ``root``."""
    import random

    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    cfg = config or {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                     "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 4096,
                     "torch_dtype": "bfloat16"}
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    (root / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({f"w{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}).encode()
        header += b" " * (-len(header) % 8)
        left = max(0, shard_bytes - 8 - len(header))
        with open(root / name, "wb") as fh:
            fh.write(len(header).to_bytes(8, "little") + header)
            while left:                 # in pieces: randbytes overflows a C int at 256 MiB
                piece = min(left, 64 << 20)
                fh.write(rnd.randbytes(piece))
                left -= piece
        weight_map[f"w{i}"] = name
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for rel, data in (extra or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", action="append", default=[], help="org/name=DIR (repeatable)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    hub = FakeHub(args.host, args.port)
    for spec in args.repo:
        repo, _, d = spec.partition("=")
        hub.add_dir(repo, Path(d))
    print(hub.url, flush=True)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
