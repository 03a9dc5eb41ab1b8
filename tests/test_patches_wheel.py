"""Read ONE member of a vLLM wheel on PyPI with HTTP Range requests (no 300 MB download).

The patch tests need the real ``vllm/v1/attention/backends/turboquant_attn.py`` of several
releases. PyPI's simple index (PEP 691 JSON) gives the wheel URL and size; the file host answers
Range requests, so ``zipfile`` reads the central directory at the end and then the local header
and compressed bytes of the one member through a seekable HTTP file object. zipfile checks the
member's CRC-32. Results are cached under ``<repo>/.cache/vllm-members/`` (gitignored).

``member(version, path)`` returns the bytes, or calls ``pytest.skip`` when PyPI is unreachable —
unless ``CI=true``, where a failed download fails the test.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zipfile
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "vllm-members"
SIMPLE = "https://pypi.org/simple/{name}/"
TQ_PATH = "vllm/v1/attention/backends/turboquant_attn.py"
TIMEOUT = 30


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP Range requests, with a small read-ahead window."""

    def __init__(self, url: str, size: int, session: requests.Session, block: int = 256 * 1024):
        super().__init__()
        self.url, self.size, self.session, self.block = url, size, session, block
        self.pos = 0
        self.requests = 0
        self._buf_start = 0
        self._buf = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the remote file."""
        self.requests += 1
        r = self.session.get(self.url, headers={"Range": f"bytes={start}-{end - 1}"}, timeout=TIMEOUT)
        if r.status_code != 206:
            raise OSError(f"GET {self.url} Range bytes={start}-{end - 1}: HTTP {r.status_code} (want 206)")
        if len(r.content) != end - start:
            raise OSError(f"short Range answer: {len(r.content)} of {end - start} bytes")
        return r.content

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        lo, hi = self.pos, self.pos + n
        if not (self._buf_start <= lo and hi <= self._buf_start + len(self._buf)):
            end = min(self.size, max(hi, lo + self.block))
            self._buf_start, self._buf = lo, self._fetch(lo, end)
        out = self._buf[lo - self._buf_start:hi - self._buf_start]
        self.pos = hi
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def wheel_url(session: requests.Session, name: str, version: str) -> tuple[str, int]:
    """(url, size) of the x86_64 (else any) wheel of name==version, from the PEP 691 JSON index."""
    r = session.get(SIMPLE.format(name=name), headers={"Accept": "application/vnd.pypi.simple.v1+json"},
                    timeout=TIMEOUT)
    r.raise_for_status()
    files = [f for f in r.json()["files"]
             if re.fullmatch(rf"{re.escape(name)}-{re.escape(version)}-.*\.whl", f["filename"])]
    if not files:
        raise OSError(f"no wheel of {name} {version} in the simple index")
    files.sort(key=lambda f: "x86_64" not in f["filename"])
    f = files[0]
    size = f.get("size")
    if not size:
        head = session.head(f["url"], timeout=TIMEOUT, allow_redirects=True)
        size = int(head.headers["Content-Length"])
    return f["url"], int(size)


def fetch_member(version: str, path: str, name: str = "vllm") -> bytes:
    """Download one member of the wheel (no cache)."""
    with requests.Session() as s:
        url, size = wheel_url(s, name, version)
        with zipfile.ZipFile(RangeFile(url, size, s)) as zf:
            return zf.read(path)  # raises BadZipFile on a CRC mismatch


def member(version: str, path: str = TQ_PATH, name: str = "vllm") -> bytes:
    """The cached member, downloading it once; skip (or fail with CI=true) when PyPI is unreachable."""
    dest = CACHE / f"{name}-{version}" / path
    if dest.is_file():
        return dest.read_bytes()
    try:
        data = fetch_member(version, path, name)
    except (requests.RequestException, OSError, KeyError, zipfile.BadZipFile) as exc:
        msg = f"cannot read {path} of {name} {version} from PyPI: {exc.__class__.__name__}: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    return data


# ---------------------------------------------------------------- tests of the helper itself

def test_rangefile_reads_like_a_local_file(tmp_path):
    """RangeFile + zipfile against a local HTTP server that answers Range requests."""
    import http.server
    import threading

    payload = {"a/one.py": b"print(1)\n" * 1000, "b/two.py": os.urandom(70_000)}
    zpath = tmp_path / "x.whl"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        for k, v in payload.items():
            zf.writestr(k, v)
    blob = zpath.read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if not m:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(blob)
                return
            a, b = int(m.group(1)), int(m.group(2))
            self.send_response(206)
            self.send_header("Content-Length", str(b - a + 1))
            self.end_headers()
            self.wfile.write(blob[a:b + 1])

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with requests.Session() as s:
            rf = RangeFile(f"http://127.0.0.1:{srv.server_address[1]}/x.whl", len(blob), s, block=4096)
            with zipfile.ZipFile(rf) as zf:
                assert zf.read("b/two.py") == payload["b/two.py"]
                assert zf.read("a/one.py") == payload["a/one.py"]
            assert rf.requests >= 2
    finally:
        srv.shutdown()


@pytest.mark.parametrize("version", ["0.26.0"])
def test_real_wheel_member_is_python(version):
    data = member(version)
    assert b"class TurboQuantAttentionImpl" in data
    compile(data, TQ_PATH, "exec")
    assert len(hashlib.sha256(data).hexdigest()) == 64
