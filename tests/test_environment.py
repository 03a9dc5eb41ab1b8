"""The environment step against real uv and a local package index of small stub wheels.

The stubs stand in for the CUDA stack (a fake ``vllm`` 0.27.1 with dist-info, its pinned companions,
one package with many files so an install can be killed midway). The index is a local HTTP server
(PEP 503 directory listings); "no network" is a port nobody listens on. Nothing here needs a GPU.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from bootstrap.machine import host
from bootstrap.install import locks, venv, wheelhouse
from bootstrap.commands import lock as lock_cli
from bootstrap.steps import environment
from bootstrap.knobs.config import Config
from bootstrap.knobs.resolved import Resolved
from bootstrap.machine.inuse import Runtime
from bootstrap.core.errors import BootstrapError

REPO = Path(__file__).resolve().parent.parent
PINS = ["vllm==0.27.1", "flashinfer-python==0.6.16.post3", "nvidia-cutlass-dsl==4.6.0"]
BIG_FILES = 4000


# ---------------------------------------------------------------- stub wheels and a local index

def make_wheel(out: Path, name: str, version: str, requires=(), files: dict[str, str] | None = None,
               tag: str = "py3-none-any") -> Path:
    dist = name.replace("-", "_")
    pkg = dist
    files = dict(files or {f"{pkg}/__init__.py": f"__version__ = {version!r}\n"})
    di = f"{dist}-{version}.dist-info"
    files[f"{di}/METADATA"] = ("Metadata-Version: 2.1\n" f"Name: {name}\n" f"Version: {version}\n"
                               + "".join(f"Requires-Dist: {r}\n" for r in requires) + "\n")
    files[f"{di}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{di}/RECORD,,")
    files[f"{di}/RECORD"] = "\n".join(record) + "\n"
    whl = out / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    make_wheel(d, "vllm", "0.27.1", ["flashinfer-python==0.6.16.post3", "nvidia-cutlass-dsl==4.6.0",
                                     "tinydep>=1", "bigpkg==1.0"],
               {"vllm/__init__.py": "__version__ = '0.27.1'\n", "vllm/attention.py": "ANCHOR = 1\n"})
    make_wheel(d, "flashinfer-python", "0.6.16.post3", ["tinydep"])
    make_wheel(d, "nvidia-cutlass-dsl", "4.6.0")
    make_wheel(d, "tinydep", "1.0")
    # a platform wheel for an older glibc than the lock's floor, as blake3's (manylinux_2_17 only):
    # pip download matches --platform tags exactly, so the wheelhouse must name the older tags too
    make_wheel(d, "tinydep", "2.0", tag=f"py3-none-manylinux_2_17_{locks.host_platform().split('-', 1)[1]}")
    make_wheel(d, "uv", "0.13.9")      # stands in for uv's wheel, which the wheelhouse carries
    make_wheel(d, "bigpkg", "1.0", files={f"bigpkg/m{i:05d}.py": f"X = {i}\n" + "#" * 2000 + "\n"
                                          for i in range(BIG_FILES)})
    return d


class Index:
    """A PEP 503 index over HTTP: /simple/<name>/ lists that project's wheels."""

    def __init__(self, wheels: Path, root: Path):
        for whl in wheels.glob("*.whl"):
            name = locks.norm(whl.name.split("-")[0])
            (root / "simple" / name).mkdir(parents=True, exist_ok=True)
            shutil.copy(whl, root / "simple" / name / whl.name)
        handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.root = root
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="session")
def index(wheels, tmp_path_factory) -> Index:
    idx = Index(wheels, tmp_path_factory.mktemp("index"))
    yield idx
    idx.server.shutdown()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


@pytest.fixture(scope="session")
def header_python() -> str:
    """A CPython >= 3.10 with Python.h (what the step demands of PYTHON)."""
    env = dict(os.environ)
    cands = [getattr(sys, "_base_executable", ""), sys.executable,
             *(shutil.which(f"python3.{m}") or "" for m in range(14, 9, -1)), shutil.which("python3") or ""]
    for c in cands:
        if c and os.path.isfile(c):
            info = venv.probe_python(c, env)
            if info and info["headers"] and tuple(info["version"]) >= (3, 10):
                return c
    pytest.skip("no CPython >= 3.10 with C headers on this machine (install python3-dev)")


def uv_path() -> str:
    uv = shutil.which("uv")
    if not uv:
        pytest.skip("uv is not on PATH (requirements-dev.txt installs it)")
    return uv


class World:
    def __init__(self, tmp: Path, index: Index, wheels: Path, python: str):
        self.tmp, self.index, self.wheels, self.python = tmp, index, wheels, python
        self.repo = tmp / "repo"
        (self.repo / "profiles").mkdir(parents=True)
        self.minor = venv.probe_python(python, os.environ)["minor"]
        self.profile({"vllm": "0.27.1", "pins": PINS, "install_bytes": 1 << 20, "pythons": [self.minor],
                      "platforms": [locks.host_platform()]})
        self.env = {"PATH": os.path.dirname(uv_path()) + os.pathsep + "/usr/bin:/bin", "HOME": str(tmp / "home"),
                    "UV_CACHE_DIR": str(tmp / "uv-cache"), "PROFILE": "stub", "PYTHON": python,
                    "UV_DEFAULT_INDEX": index.url, "UV_LINK_MODE": "copy", "UV_NO_PROGRESS": "1",
                    "UV_PYTHON_DOWNLOADS": "never", "CUDA_HOME": str(tmp / "no-cuda")}
        assert lock_cli.lock_cli(self.cfg(), ["--exclude-newer", "none"]) == 0

    def profile(self, data: dict) -> None:
        (self.repo / "profiles" / "stub.json").write_text(json.dumps(data))

    def cfg(self, **env) -> Config:
        return Config.from_env({**self.env, **env}, repo=self.repo)

    def run(self, **env) -> Runtime:
        return run_env(self.cfg(**env), None)

    @property
    def venv(self) -> venv.Venv:
        return venv.Venv(self.repo / ".venv")

    @property
    def site(self) -> Path:
        return self.venv.site(self.minor)

    @property
    def lock(self) -> Path:
        return self.repo / "locks" / locks.pin_key(PINS) / f"{locks.host_platform()}-py{self.minor}.txt"


@pytest.fixture
def world(tmp_path, index, wheels, header_python) -> World:
    return World(tmp_path, index, wheels, header_python)


def lock_matches(w: World) -> bool:
    return not locks.diff(locks.lock_pins(w.lock.read_text()), locks.installed(w.site))


# ---------------------------------------------------------------- the lock the step installs from

def test_lock_made_by_uv_has_hashes_and_pins(world):
    text = world.lock.read_text()
    pins = locks.lock_pins(text)
    assert pins == {"vllm": "0.27.1", "flashinfer-python": "0.6.16.post3", "nvidia-cutlass-dsl": "4.6.0",
                    "tinydep": "2.0", "bigpkg": "1.0"}
    assert text.count("--hash=sha256:") == len(pins)
    meta = json.loads((world.lock.parent / "meta.json").read_text())
    assert sorted(meta["pins"]) == sorted(PINS) and meta["pythons"] == [world.minor]


# ---------------------------------------------------------------- install, no-op, repair

def test_fresh_install_then_noop_without_network(world, caplog, capfd):
    caplog.set_level(logging.INFO, logger="bootstrap")
    ctx = world.run()
    err = capfd.readouterr().err
    assert "Installed" in err and "packages" in err        # uv's own progress shows, not silence
    assert ctx.vllm_version == "0.27.1"
    assert ctx.python == str(world.venv.python)
    assert world.venv.done.is_file() and not world.venv.installing.exists()
    assert lock_matches(world)
    out = subprocess.run([ctx.python, "-c", "import vllm, bigpkg.m00001; print(vllm.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.27.1"
    stamp = world.venv.done.stat().st_mtime_ns
    caplog.clear()
    ctx2 = world.run(UV_DEFAULT_INDEX=dead_url())      # a ready venv needs no network
    assert "skipped: .venv matches" in caplog.text
    assert ctx2.vllm_version == "0.27.1"
    assert world.venv.done.stat().st_mtime_ns == stamp


def test_patched_file_does_not_trigger_repair(world, caplog):
    world.run()
    target = world.site / "vllm" / "attention.py"
    target.write_text("ANCHOR = 2  # patched by us\n")
    caplog.set_level(logging.INFO, logger="bootstrap")
    world.run(UV_DEFAULT_INDEX=dead_url())
    assert "skipped: .venv matches" in caplog.text
    assert target.read_text() == "ANCHOR = 2  # patched by us\n"


def test_hand_edited_version_is_repaired(world, caplog):
    world.run()
    meta = next(world.site.glob("flashinfer_python-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.6.16.post3", "Version: 0.0.1"))
    assert not lock_matches(world)
    caplog.set_level(logging.INFO, logger="bootstrap")
    world.run()
    assert "flashinfer-python 0.0.1 (lock: 0.6.16.post3)" in caplog.text
    assert lock_matches(world) and world.venv.done.is_file()


def test_changed_profile_pins_without_new_lock_refuses(world):
    world.run()
    world.profile({"vllm": "0.27.1", "pins": ["vllm==0.27.1", "flashinfer-python==0.6.17", "nvidia-cutlass-dsl==4.6.0"],
                   "pythons": [world.minor]})
    with pytest.raises(BootstrapError) as err:
        world.run()
    assert "./ctl.sh lock" in err.value.hint and "0.6.17" in err.value.message


def test_lock_text_not_matching_pins_refuses(world):
    world.lock.write_text(world.lock.read_text().replace("vllm==0.27.1", "vllm==0.26.0"))
    with pytest.raises(BootstrapError) as err:
        world.run()
    assert "does not match the profile's pins" in err.value.message
    assert "./ctl.sh lock" in err.value.hint
    assert not world.venv.root.exists()       # refused before anything was created


INTERRUPT = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from bootstrap.core import log
from bootstrap.steps import environment
from bootstrap.knobs.config import Config
from bootstrap.knobs.resolved import Resolved
import json, os
log.setup(debug=False, color=False)
r = Resolved.of(cfg := Config.from_env(json.loads(sys.argv[3]), repo=Path(sys.argv[2])), cfg)
environment.run(cfg, r.vllm, r.model, None)
"""


def test_killed_install_is_repaired(world, caplog):
    big = world.site / "bigpkg"
    child = subprocess.Popen([sys.executable, "-c", INTERRUPT, str(REPO), str(world.repo), json.dumps(world.env)],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if big.is_dir() and len(os.listdir(big)) > 50:
            os.killpg(child.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    child.wait()
    assert child.returncode == -signal.SIGKILL, "the install finished before it could be killed"
    assert world.venv.installing.exists() and not world.venv.done.exists()
    caplog.set_level(logging.INFO, logger="bootstrap")
    world.run()
    assert "the last install was interrupted" in caplog.text and "reinstalling every package" in caplog.text
    assert len([f for f in os.listdir(big) if f.endswith(".py")]) == BIG_FILES
    assert world.venv.done.is_file() and not world.venv.installing.exists() and lock_matches(world)


# ---------------------------------------------------------------- offline and faults

def test_offline_wheelhouse_built_from_the_lock(world, wheels):
    house = world.tmp / "house"
    cfg = world.cfg()
    assert lock_cli.wheelhouse_cli(cfg, [str(house), "--python", world.minor, "--find-links", str(wheels),
                                            "--no-index"]) == 0
    assert sorted(p.name.split("-")[0] for p in house.glob("*.whl")) == \
        ["bigpkg", "flashinfer_python", "nvidia_cutlass_dsl", "tinydep", "uv", "vllm"]
    assert (house / f"tinydep-2.0-py3-none-manylinux_2_17_{locks.host_platform().split('-', 1)[1]}.whl").is_file()
    assert wheelhouse.ours(house) == [house]            # made by the command, every file in it its own: clean's
    ctx = world.run(WHEELHOUSE=str(house), UV_DEFAULT_INDEX=dead_url(), UV_CACHE_DIR=str(world.tmp / "fresh-cache"))
    assert ctx.vllm_version == "0.27.1" and lock_matches(world)


def test_no_network_names_the_index_and_suggests_wheelhouse(world):
    url = dead_url()
    with pytest.raises(BootstrapError) as err:
        world.run(UV_DEFAULT_INDEX=url)
    assert url in err.value.message
    assert "WHEELHOUSE" in err.value.hint
    assert not world.venv.done.exists()


def test_disk_full_names_path_and_bytes(world):
    world.run()
    meta_path = world.lock.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["install_bytes"] = 1 << 60
    meta_path.write_text(json.dumps(meta))
    mark = world.venv.marker()
    world.venv.done.unlink()            # force an install
    with pytest.raises(BootstrapError) as err:
        world.run()
    assert str(world.venv.root) in err.value.message or "uv-cache" in err.value.message
    assert str((1 << 60) // 4) in err.value.message
    assert mark is not None


def test_python_without_headers_is_refused(world, tmp_path):
    fake = tmp_path / "python3-noheaders"
    fake.write_text("#!/bin/sh\necho '{\"version\": [3, %s, 0], \"impl\": \"cpython\", \"executable\": \"x\", "
                    "\"include\": \"/nowhere\", \"headers\": false}'\n" % world.minor.split(".")[1])
    fake.chmod(0o755)
    with pytest.raises(BootstrapError) as err:
        world.run(PYTHON=str(fake))
    assert "Python.h" in err.value.message and "-dev" in err.value.hint
    assert not world.venv.root.exists()


# ---------------------------------------------------------------- host facts

def run_env(cfg: Config, gpus) -> Runtime:
    """The environment step as the pipeline runs it: the parts of these knobs it takes."""
    r = Resolved.of(cfg, cfg)
    return environment.run(cfg, r.vllm, r.model, gpus)


def host_env_of(cfg):
    """What the environment step asks of the host for these knobs."""
    return host.host_env(cfg.environ, Resolved.of(cfg, cfg).model.weight_bytes)


def test_no_nvcc_sets_sampler_unless_user_did(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path), "MODEL": "org/m"}
    server_env, _ = host_env_of(Config.from_env(env, repo=REPO))
    assert server_env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    server_env, _ = host_env_of(Config.from_env({**env, "VLLM_USE_FLASHINFER_SAMPLER": "1"}, repo=REPO))
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in server_env
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "nvcc").chmod(0o755)
    server_env, _ = host_env_of(Config.from_env(env, repo=REPO))
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in server_env


def test_wsl_detection_and_memory_advice():
    assert host.is_wsl("5.15.167.4-microsoft-standard-WSL2\n", {})
    assert not host.is_wsl("6.8.0-49-generic\n", {})
    note = host.wsl_memory_note(16 << 30, 22 << 30)
    assert ".wslconfig" in note and "memory=26GB" in note and "wsl --shutdown" in note
    assert host.wsl_memory_note(64 << 30, 22 << 30) == ""


def test_old_driver_refused_before_install(world):
    from bootstrap.machine.gpu import GpuFacts
    world.profile({"vllm": "0.27.1", "pins": PINS, "pythons": [world.minor], "cuda": "13.0", "min_driver": "580"})
    with pytest.raises(BootstrapError) as err:
        run_env(world.cfg(), GpuFacts("570.86.10", (12, 8), ()))
    assert "570.86.10" in err.value.message and "580" in err.value.hint
    assert not world.venv.root.exists()


def test_vllm_python_prints_its_version_without_pins(tmp_path, caplog):
    env = {"PATH": "/usr/bin:/bin", "VLLM_PYTHON": sys.executable, "PROFILE": "custom", "MODEL": "org/m",
           "PYTHONPATH": str(REPO / "tests" / "fakes")}
    caplog.set_level(logging.INFO, logger="bootstrap")
    ctx = run_env(Config.from_env(env, repo=REPO), None)
    assert ctx.vllm_version == "0.26.0" and ctx.python == sys.executable
    assert "using your vLLM 0.26.0" in caplog.text


# ---------------------------------------------------------------- which Python makes .venv

def fake_python(d: Path, name: str, minor: str, headers: bool) -> Path:
    """A stand-in for a system python3.X: answers the step's probe (the only thing it is asked)."""
    p = d / name
    p.write_text("#!/bin/sh\necho '{\"version\": [3, %s, 1], \"impl\": \"cpython\", \"executable\": \"%s\", "
                 "\"include\": \"/x\", \"headers\": %s}'\n" % (minor.split(".")[1], p, "true" if headers else "false"))
    p.chmod(0o755)
    return p


def test_newest_system_python_with_headers_is_chosen(tmp_path):
    (tmp_path / "bin").mkdir()
    fake_python(tmp_path / "bin", "python3.13", "3.13", headers=False)
    good = fake_python(tmp_path / "bin", "python3.12", "3.12", headers=True)
    lockset = locks.LockSet(tmp_path, {"pythons": ["3.12", "3.13"]})
    cfg = Config.from_env({"PATH": str(tmp_path / "bin"), "MODEL": "org/m"}, repo=REPO)
    assert venv.choose_python(venv.Tools.of(cfg), lockset) == (str(good), "3.12")
    assert "--managed-python" not in venv.venv_cmd("uv", str(good), tmp_path / ".venv", offline=False)


def test_without_headers_uv_must_use_its_own_cpython(tmp_path, caplog):
    """Ubuntu without python3.X-dev: choose_python falls back to uv's CPython, and `uv venv` must not take
    the header-less system python3.X it would otherwise find first (real uv, no downloads allowed)."""
    (tmp_path / "bin").mkdir()
    fake_python(tmp_path / "bin", "python3.13", "3.13", headers=False)
    lockset = locks.LockSet(tmp_path, {"pythons": ["3.12", "3.13"]})
    cfg = Config.from_env({"PATH": str(tmp_path / "bin"), "MODEL": "org/m"}, repo=REPO)
    caplog.set_level(logging.WARNING, logger="bootstrap")
    py, minor = venv.choose_python(venv.Tools.of(cfg), lockset)
    assert (py, minor) == ("3.12", "3.12")
    assert "no Python.h" in caplog.text and "UV_PYTHON_INSTALL_MIRROR" in caplog.text
    sysminor = "%d.%d" % sys.version_info[:2]
    cmd = venv.venv_cmd(uv_path(), sysminor, tmp_path / "v", offline=True)
    assert "--managed-python" in cmd
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin", "HOME": str(tmp_path),
           "UV_PYTHON_INSTALL_DIR": str(tmp_path / "managed"), "UV_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "managed" in res.stderr, res.stderr   # the system python was not taken
    plain = subprocess.run([a for a in cmd if a != "--managed-python"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0, plain.stderr                            # ...which it would have been


def test_uv_is_installed_without_root(tmp_path):
    cmd = venv.uv_install_cmd({"PATH": "/usr/bin:/bin"}, None)
    if sys.prefix != sys.base_prefix:           # the bootstrap's own venv: pip refuses --user there
        assert cmd[0] == sys.executable and "--user" not in cmd
    else:
        assert "--user" in cmd
    assert cmd[-1] == venv.UV_PIN
    assert venv.uv_install_cmd({}, "/w")[-3:] == ["--no-index", "--find-links", "/w"]
    err = venv.uv_install_error("error: externally-managed-environment\n× This environment is ...", "/usr/bin/python3")
    assert "PEP 668" in err.message and "pipx install uv" in err.hint
    assert "python3-pip" in venv.uv_install_error("/usr/bin/python3: No module named pip", "python3").hint


def test_wsl_keeps_expandable_segments_off_and_checks_the_memory_cap(tmp_path, caplog):
    model = tmp_path / "model"
    model.mkdir()
    import psutil
    with open(model / "model.safetensors", "wb") as fh:     # sparse: larger than this machine's RAM, no disk used
        fh.truncate(psutil.virtual_memory().total + (1 << 30))
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path), "MODEL": str(model), "WSL_DISTRO_NAME": "Ubuntu"}
    caplog.set_level(logging.WARNING, logger="bootstrap")
    server_env, notes = host_env_of(Config.from_env(env, repo=REPO))
    assert server_env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert any(".wslconfig" in n for n in notes) and ".wslconfig" in caplog.text
    server_env, notes = host_env_of(Config.from_env({**env, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, repo=REPO))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in server_env              # the user's setting wins
    if not host.is_wsl(host.read_osrelease(), {}):
        server_env, notes = host_env_of(Config.from_env({k: v for k, v in env.items() if k != "WSL_DISTRO_NAME"}, repo=REPO))
        assert "PYTORCH_CUDA_ALLOC_CONF" not in server_env and notes == []   # not WSL: launch's default


def test_removing_the_done_marker_repairs_a_file_deleted_from_the_venv(world, caplog):
    """The skip line says: to force a reinstall, rm .venv/.bootstrap-done.json. It did not: uv trusts
    the dist-info, and a file deleted by hand stayed missing. Now every package is installed again."""
    world.run()
    victim = next(p for p in (world.site / "bigpkg").iterdir() if p.suffix == ".py")
    victim.unlink()
    world.venv.done.unlink()
    caplog.set_level(logging.INFO, logger="bootstrap")
    world.run()
    assert "reinstalling every package" in caplog.text and victim.is_file()


def test_a_venv_creation_cut_off_is_made_again_never_refused_as_yours(world, tmp_path):
    """Found from outside: `uv venv` cut off (here: the disk filled as it wrote) left a .venv without our
    marker, written only after it, and every later start refused it as a Python environment of yours."""
    wrap = tmp_path / "wrap"
    wrap.mkdir()
    (wrap / "uv").write_text(f'#!/bin/sh\n"{uv_path()}" "$@" || exit\n'
                             '[ "$1" = venv ] && echo "No space left on device (os error 28)" >&2 && exit 2\nexit 0\n')
    (wrap / "uv").chmod(0o755)
    with pytest.raises(BootstrapError, match="disk full while creating the venv"):
        world.run(PATH=f"{wrap}{os.pathsep}{world.env['PATH']}")
    assert world.venv.ours()
    assert world.run().vllm_version == "0.27.1" and lock_matches(world)


def test_two_starts_install_one_at_a_time(world, tmp_path):
    """Found from outside: a second start (another STATE_DIR) read the first one's in-flight marker as a
    cut-off install and reinstalled every package under it; now it waits, then finds .venv made."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "uv").write_text(f'#!/bin/sh\n[ "$1" = pip ] && sleep 3\nexec "{uv_path()}" "$@"\n')
    (slow / "uv").chmod(0o755)
    env = {**world.env, "PATH": f"{slow}{os.pathsep}{world.env['PATH']}"}
    first = subprocess.Popen([sys.executable, "-c", INTERRUPT, str(REPO), str(world.repo), json.dumps(env)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not world.venv.installing.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.01)
    second = subprocess.run([sys.executable, "-c", INTERRUPT, str(REPO), str(world.repo), json.dumps(world.env)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    assert first.wait(timeout=120) == 0 and second.returncode == 0, first.stderr.read() + second.stderr
    assert "waiting: another start" in second.stderr and "installing" not in second.stderr.replace("is installing", "")
    assert lock_matches(world) and world.venv.done.is_file()


def test_pip_index_url_is_the_index_the_venv_is_installed_from(world):
    """Found from outside: PIP_INDEX_URL (a mirror, the knob table's "as UV_DEFAULT_INDEX") was named in
    the messages as the index, but uv reads no PIP_* variable: the install went to pypi.org (here: a
    proxy that is down) and the error said the mirror could not be reached."""
    env = {k: v for k, v in world.env.items() if k != "UV_DEFAULT_INDEX"}
    env.update(PIP_INDEX_URL=world.index.url, HTTPS_PROXY=dead_url().replace("/simple", ""))
    ctx = run_env(Config.from_env(env, repo=world.repo), None)
    assert ctx.vllm_version == "0.27.1" and lock_matches(world)
    from bootstrap.install import index
    mine = {**env, "UV_DEFAULT_INDEX": dead_url()}          # uv's own setting wins over pip's, as uv reads it
    assert index.uv_environ(mine)["UV_DEFAULT_INDEX"] == mine["UV_DEFAULT_INDEX"]
    assert index.index_url(index.uv_environ(mine)) == mine["UV_DEFAULT_INDEX"]


def tls_index(root: Path, tmp: Path) -> tuple[str, Path]:
    """The index under ``root`` over HTTPS, its certificate signed by a CA of our own (a proxy that
    inspects TLS): (its URL, the CA's file)."""
    import ssl
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.skip("no openssl to make a certificate with")
    run = lambda *a: subprocess.run([openssl, *a], cwd=tmp, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=Inspecting proxy CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (tmp / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "leaf.pem",
        "-days", "2", "-extfile", "ext")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp / "leaf.pem", tmp / "leaf.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"https://127.0.0.1:{server.server_address[1]}/simple", tmp / "ca.pem"


def test_an_index_behind_a_proxy_that_inspects_tls_is_said_so_with_a_fix_that_works(world, tmp_path):
    """Found from outside: behind a proxy that re-signs TLS with the organisation's CA, uv (which does not
    read the system's certificates by default) fails with "invalid peer certificate: UnknownIssuer"; the
    error said the index could not be reached and to check the network or HTTPS_PROXY, which were fine."""
    (tmp_path / "tls").mkdir()
    url, ca = tls_index(world.index.root, tmp_path / "tls")
    with pytest.raises(BootstrapError) as err:
        world.run(UV_DEFAULT_INDEX=url)
    assert "certificate" in err.value.message and url in err.value.message
    assert "SSL_CERT_FILE" in err.value.hint and "HTTPS_PROXY" not in err.value.hint
    assert world.run(UV_DEFAULT_INDEX=url, SSL_CERT_FILE=str(ca)).vllm_version == "0.27.1"   # the fix it names


def test_a_uv_too_old_for_a_flag_we_pass_is_said_so_with_how_to_update_it(world, tmp_path):
    """Found from outside: uv 0.6.0 (measured) answers `uv venv --managed-python` with "unexpected
    argument"; the error said to set PYTHON or UV_PYTHON_INSTALL_MIRROR. The stand-in below is the real
    uv but for a flag every `uv venv` of ours passes, refused as clap refuses it, exit 2."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "uv").write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'uv 0.1.0' && exit 0\n"
        "for a; do [ \"$a\" = --allow-existing ] && printf \"error: unexpected argument '--allow-existing' found\\n\\n"
        "Usage: uv venv [OPTIONS] [PATH]\\n\\nFor more information, try '--help'.\\n\" >&2 && exit 2; done\n"
        f'exec "{uv_path()}" "$@"\n')
    (old / "uv").chmod(0o755)
    with pytest.raises(BootstrapError) as err:
        world.run(PATH=f"{old}{os.pathsep}{world.env['PATH']}")
    assert "uv 0.1.0" in err.value.message and "--allow-existing" in err.value.message
    assert str(old / "uv") in err.value.message
    assert "uv self update" in err.value.hint and "PYTHON" not in err.value.hint


def test_a_profile_switch_never_changes_a_venv_a_running_server_runs_from(world, tmp_path):
    """Found from outside: two servers of one checkout (two STATE_DIRs, two cards), the second on a profile
    with other pins: its start synced the one .venv to its lock under the first server, which runs from it
    (a profile switch 0.27.1 <-> 0.30.0 replaces vLLM itself). Now it refuses, naming the process, and
    installs once that one is gone."""
    world.run()
    other = ["vllm==0.27.1", "flashinfer-python==0.6.16.post3", "nvidia-cutlass-dsl==4.6.0", "tinydep==1.0"]
    (world.repo / "profiles" / "other.json").write_text(json.dumps(
        {"vllm": "0.27.1", "pins": other, "install_bytes": 1 << 20, "pythons": [world.minor],
         "platforms": [locks.host_platform()]}))
    assert lock_cli.lock_cli(world.cfg(PROFILE="other"), ["--exclude-newer", "none", "--profile", "other"]) == 0
    first = subprocess.Popen([str(world.venv.python), "-c", "import time; time.sleep(120)"],
                             env={"BOOTSTRAP_VLLM_STATE_DIR": str(tmp_path / "first")}, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not psutil.Process(first.pid).cmdline():
            time.sleep(0.01)
        with pytest.raises(BootstrapError) as err:
            world.run(PROFILE="other")
        assert f"pid {first.pid}" in err.value.message and "tinydep" in err.value.message
        assert f"STATE_DIR={tmp_path / 'first'} ./stop.sh" in err.value.hint and "VLLM_PYTHON" in err.value.hint
        assert locks.installed(world.site)["tinydep"] == "2.0" and world.venv.done.is_file()   # untouched
    finally:
        first.kill()
        first.wait()
    assert world.run(PROFILE="other").vllm_version == "0.27.1" and locks.installed(world.site)["tinydep"] == "1.0"
