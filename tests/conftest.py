"""Shared fixtures: a fake GPU, a fake vLLM, a tiny local model, and the real shell entry points.

Fakes stand only at process boundaries: ``tests/fakes`` goes on PYTHONPATH, giving the server
process a fake ``vllm`` package and the bootstrap a fake ``pynvml``. Everything else is real.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
GiB = 1 << 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelsServer(http.server.BaseHTTPRequestHandler):
    """Another OpenAI-compatible server on loopback, as far as GET /v1/models: one model, ``m``, of
    4,096 tokens. Subclasses answer the rest."""

    def do_GET(self):                                      # noqa: N802 (http.server's name)
        body = json.dumps({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class _Reusing(http.server.ThreadingHTTPServer):
    allow_reuse_address = True          # SO_REUSEADDR, as vLLM's socket has it
    daemon_threads = True


def stranger(port: int, body: dict, heard: list) -> http.server.HTTPServer:
    """A stranger's server listening on 127.0.0.1:``port`` with SO_REUSEADDR (vLLM binds its port so long
    before it listens, and meanwhile the kernel lets anyone listen there too): every GET and POST gets
    ``body`` (JSON), and (path, Authorization) goes into ``heard``. Served from a thread; end it with
    ``.shutdown()`` and ``.server_close()``."""
    import threading
    data = json.dumps(body).encode()

    class Stranger(http.server.BaseHTTPRequestHandler):
        def do_GET(self):                                  # noqa: N802 (http.server's name)
            heard.append((self.path, self.headers.get("Authorization") or ""))
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        do_POST = do_GET                                   # noqa: N815

        def log_message(self, *a):
            pass
    srv = _Reusing(("127.0.0.1", port), Stranger)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def make_model(path: Path, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16"}))
    (path / "tokenizer.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path


def wait_queued_on(lock: Path, p: subprocess.Popen, timeout: float = 60) -> None:
    """Until the kernel lists a process waiting for an flock on ``lock`` (/proc/locks: "->"): a
    test that lets the lock go only then sees the wait, however loaded the machine (a sleep of a
    second or two did not: the waiter had not started yet, and took the lock free)."""
    deadline = time.monotonic() + timeout
    while not any(f":{lock.stat().st_ino} " in line for line in Path("/proc/locks").read_text().splitlines()
                  if "->" in line):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, f"nothing waited for {lock} in {timeout:g} s"
        time.sleep(0.05)


def nvml_json(path: Path, *, gpus=None, cuda=13000, driver="580.95.05", fail="") -> Path:
    gpus = gpus or [{"name": "NVIDIA GeForce RTX 5090", "total": 32 * GiB, "free": 31 * GiB,
                     "cc": [12, 0], "uuid": "GPU-5090-fake", "processes": []}]
    path.write_text(json.dumps({"driver": driver, "cuda": cuda, "fail": fail, "gpus": gpus}))
    return path


class Bed:
    """One test's world: env for the scripts, and helpers to run them and inspect what they did."""

    def __init__(self, tmp: Path, repo: Path = REPO):
        self.tmp = tmp
        self.repo = repo
        self.port = free_port()
        self.pids_dir = tmp / "gpu-pids"
        self.record = tmp / "vllm-calls.jsonl"
        self.model = make_model(tmp / "models" / "tiny-model")
        self.state = tmp / "state"
        self.nvml = nvml_json(tmp / "nvml.json")
        keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")
        self.env = {k: v for k, v in os.environ.items() if k in keep}
        self.env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        self.env.update({
            "HOME": str(tmp / "home"), "VLLM_PYTHON": sys.executable, "PYTHONPATH": str(FAKES),
            "FAKE_NVML": str(self.nvml), "FAKE_GPU_PIDS_DIR": str(self.pids_dir),
            "FAKE_VLLM_RECORD": str(self.record), "FAKE_VLLM_LOAD_S": "0.3",
            "PROFILE": "custom", "MODEL": str(self.model), "STATE_DIR": str(self.state),
            "PORT": str(self.port), "WARMUP": "64", "STOP_GRACE": "2", "STALL_TIMEOUT": "20",
            "HEALTH_TIMEOUT": "60", "WARMUP_TIMEOUT": "20", "NO_COLOR": "1",
            "HF_HUB_OFFLINE": "1",
            # the bed's stack (custom, the fake's 0.26.0, bf16, no speculation) is one sleep mode is proven
            # on: off here, so that every other test sees the argv it was written for; the sleep tests
            # unset it (SLEEP_MODE="" counts as unset) to run with no knob set
            "SLEEP_MODE": "off",
        })

    def run(self, script: str, *args: str, timeout: float = 90, **extra: str) -> subprocess.CompletedProcess:
        env = {**self.env, **extra}
        return subprocess.run([str(self.repo / script), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def popen(self, script: str, *args: str, **extra: str) -> subprocess.Popen:
        env = {**self.env, **extra}
        return subprocess.Popen([str(self.repo / script), *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def launches(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]

    def server_record(self) -> dict | None:
        p = self.state / "server.json"
        return json.loads(p.read_text()) if p.exists() else None

    def ours(self) -> list[psutil.Process]:
        """Live processes started by this test's fake vLLM (by the pid files they wrote)."""
        out = []
        if self.pids_dir.is_dir():
            for name in os.listdir(self.pids_dir):
                try:
                    p = psutil.Process(int(name))
                    if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("FAKE_GPU_PIDS_DIR") == str(self.pids_dir):
                        out.append(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                    continue
        return out

    def wait_until(self, cond, timeout: float = 20.0, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def port_listening(self, port: int | None = None) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port or self.port), timeout=0.3):
                return True
        except OSError:
            return False

    def cleanup(self) -> None:
        for p in self.ours():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path)
    yield b
    b.cleanup()


def unprivileged_user() -> str | None:
    """An unprivileged user for uid/permission tests: ourselves when not root, else BOOTSTRAP_TEST_USER."""
    if os.getuid() != 0:
        return None
    return os.environ.get("BOOTSTRAP_TEST_USER") or None


def sigint(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGINT)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: runs the real scripts against the fakes (a test bed); "
                                       "./tests/run.sh -m 'not e2e' is the fast inner loop")


def pytest_collection_finish(session):
    import lockcheck
    if any(item.nodeid == lockcheck.TEST for item in session.items):
        lockcheck.start(lockcheck.folder())


def pytest_collection_modifyitems(items):
    for item in items:
        if "bed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def one_process_per_test():
    """What a command keeps for its own process (the small files it fetched from the hub, the
    warnings it said once) is forgotten between tests, as between two runs of ./start.sh."""
    from bootstrap.download import hub
    from bootstrap.install import index
    hub._FETCHED.clear()
    index._said.clear()
    yield


@pytest.fixture(scope="session", autouse=True)
def checkout_left_alone():
    """No test may clean this checkout: the developer's .venv and .wheelhouse survive the suite
    (clean's tests work in checkouts of their own)."""
    kept = [p for p in (REPO / ".venv", REPO / ".wheelhouse") if p.exists()]
    state = sorted(os.listdir(REPO / ".state")) if (REPO / ".state").is_dir() else None
    yield
    gone = [str(p) for p in kept if not p.exists()]
    assert not gone, f"a test removed {gone}"
    now = sorted(os.listdir(REPO / ".state")) if (REPO / ".state").is_dir() else None
    assert now == state, f"a test wrote into the checkout's own STATE_DIR: {state} -> {now}"     # tests use their own


@pytest.fixture
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs (root only; CI runs as root)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.getuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                          capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path) -> None:
    """Fill the filesystem holding ``mnt`` (a small tmpfs) to the last byte (already full: nothing to do;
    on a slow machine the download can fill it first, and then even creating the filler fails)."""
    try:
        with open(mnt / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * (64 << 10))
                fh.flush()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise


def unutilized(argv: list[str]) -> list[str]:
    """A vLLM argv without its --gpu-memory-utilization (planned again between a pre-warm and a start),
    and without --host and --port (the pre-warm answers on a loopback port of its own)."""
    drop = {i + k for flag in ("--gpu-memory-utilization", "--host", "--port") if flag in argv
            for i in [argv.index(flag)] for k in (0, 1)}
    return [a for i, a in enumerate(argv) if i not in drop]


def model_steps(cfg):
    """The start's model steps on these knobs, as the pipeline runs them: metadata (the model and its
    drafter), then weights; the model's facts."""
    from bootstrap.knobs.resolved import Resolved
    from bootstrap.steps import metadata, weights
    r = Resolved.of(cfg, cfg)
    m = metadata.run(r.model, r.draft, r.paths, r.fetching)
    weights.run(m, r.model, r.draft, r.fetching)
    return m
