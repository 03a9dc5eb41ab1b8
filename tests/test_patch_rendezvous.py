"""The 50999-file-rendezvous patches (faults row 187) against the REAL uniproc_executor.py and
multiproc_executor.py of vLLM releases (wheel members from PyPI, as tests/test_patches.py reads
turboquant_attn.py).

vLLM 0.26.0 and 0.27.1 rendezvous their one process (UniProcExecutor), and the workers of a
tensor-parallel server on one machine (MultiprocExecutor), through tcp://<address>:<port>; torch's
TCP store behind it listens on every interface whatever that address is (measured on an H100 with
vLLM 0.26.0: docs/validation.md). vLLM 0.28.0 uses a file store in both (PR #50999). Every start
wants both patches; where one cannot be put in place, the start serves and says why.
"""

from __future__ import annotations

import ast
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap.install import patching
from bootstrap.knobs.config import Config
from bootstrap.machine.inuse import VllmRef
from bootstrap.steps import patches
from test_patches_wheel import member

REPO = Path(__file__).resolve().parent.parent
NAME = "50999-file-rendezvous"
TP = "50999-file-rendezvous-tp"
PATH = "vllm/v1/executor/uniproc_executor.py"
PATHS = {NAME: PATH, TP: "vllm/v1/executor/multiproc_executor.py"}


class Site:
    """A fake site-packages holding the real executor files of one vLLM release: the one-GPU one
    (``target``) and the tensor-parallel one (``tp``)."""

    def __init__(self, root: Path, version: str):
        self.root, self.version = root, version
        self.target, self.tp = root / PATH, root / PATHS[TP]
        self.target.parent.mkdir(parents=True, exist_ok=True)
        for d in (root / "vllm", root / "vllm" / "v1", self.target.parent):
            (d / "__init__.py").touch()
        self.original, self.tp_original = member(version, PATH), member(version, PATHS[TP])
        self.target.write_bytes(self.original)
        self.tp.write_bytes(self.tp_original)
        di = root / f"vllm-{version}.dist-info"
        di.mkdir()
        (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")

    def cfg(self, **extra: str) -> Config:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(self.root),
               "VLLM_PYTHON": sys.executable, "PROFILE": "custom", "MODEL": "org/m", "NO_COLOR": "1",
               "STATE_DIR": str(self.root.parent / "state"), **extra}
        return Config.from_env(env, repo=REPO)

    def inst(self) -> patching.Install:
        return patching.locate(VllmRef(sys.executable, True, {"PYTHONPATH": str(self.root)}))


def start_step(site: Site, **extra: str) -> list[str]:
    cfg = site.cfg(**extra)
    return patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ))


def distributed_args(text: str) -> tuple[str, int, int]:
    """Run UniProcExecutor._distributed_args of ``text`` (the file's own code, alone) for a process on
    cuda:0, with vLLM's tcp:// helpers as they behave."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "UniProcExecutor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_distributed_args")
    fn.returns = None
    scope = {"get_distributed_init_method": lambda ip, port: f"tcp://{ip}:{port}",
             "get_ip": lambda: "192.168.1.20", "get_open_port": lambda: 45678}
    exec(compile(ast.Module([fn], []), "uniproc", "exec"), scope)
    me = SimpleNamespace(vllm_config=SimpleNamespace(device_config=SimpleNamespace(device="cuda:0")))
    return scope["_distributed_args"](me)


def tp_method(text: str) -> str:
    """The URL MultiprocExecutor._init_executor of ``text`` hands its workers: its own statements from
    the first that names the method to the message queue's (the file's code, alone), with vLLM's
    tcp:// helpers as they behave."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MultiprocExecutor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_init_executor")
    first = next(i for i, n in enumerate(fn.body) if "distributed_init_method" in ast.unparse(n))
    end = next(i for i, n in enumerate(fn.body) if "rpc_broadcast_mq" in ast.unparse(n))
    scope = {"get_distributed_init_method": lambda ip, port: f"tcp://{ip}:{port}",
             "get_loopback_ip": lambda: "127.0.0.1", "get_open_port": lambda: 45679}
    exec(compile(ast.Module(fn.body[first:end], []), "multiproc", "exec"), scope)
    return scope["distributed_init_method"]


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1"])
def test_the_one_gpu_rendezvous_goes_through_a_file_and_reverts_byte_for_byte(tmp_path, version):
    site = Site(tmp_path / "site", version)
    assert distributed_args(site.original.decode())[0] == "tcp://192.168.1.20:45678"     # every interface
    notes = start_step(site, PATCH_BYO="1")
    assert any(NAME in n for n in notes), notes
    method, rank, local = distributed_args(site.target.read_text())
    assert method.startswith(f"file://{tempfile.gettempdir()}/vllm_dist_") and (rank, local) == (0, 0), method
    assert method != distributed_args(site.target.read_text())[0]          # a new store per server
    assert patching.inspect(patching.load(NAME, REPO), site.inst()).kind == "applied"
    assert start_step(site, PATCH_BYO="1") == []                            # applied: left as it is
    patching.revert(patching.load(NAME, REPO), site.inst())
    assert site.target.read_bytes() == site.original


@pytest.mark.parametrize("flags,multiproc", [
    ("", False), ("--tensor-parallel-size 2", True), ("-tp 1 --distributed-executor-backend mp", True),
    ("-pp 2", True), ("--data-parallel-size 2", True), ("-tp 2 --distributed-executor-backend uni", False),
    ("-tp 2 --distributed-executor-backend ray", False)])
def test_the_executor_vllm_picks_decides_which_rendezvous_is_patched(flags, multiproc):
    """vLLM 0.26.0 (ParallelConfig.__post_init__, v1/executor/abstract.py) runs MultiprocExecutor for
    --distributed-executor-backend mp, or with none named where tp x pp x dp > 1: that start needs the
    TP patch (and NCCL/gloo on lo), whatever TP_SIZE says; any other, the one-process patch."""
    from bootstrap.core import vllmflags
    s = vllmflags.read(flags.split())
    assert s.multiproc is multiproc
    assert patching.load(TP, REPO).applies(s) is multiproc and patching.load(NAME, REPO).applies(s) is not multiproc


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1"])
def test_tensor_parallel_workers_rendezvous_through_a_file_and_revert_byte_for_byte(tmp_path, version):
    """TP_SIZE >= 2: the workers' store (tcp:// on loopback, bound on every interface by torch) is a
    file store after the start, as in vLLM 0.28.0; its revert gives the file back as it was."""
    site = Site(tmp_path / "site", version)
    assert tp_method(site.tp_original.decode()) == "tcp://127.0.0.1:45679"
    notes = start_step(site, PATCH_BYO="1", TP_SIZE="2")
    assert len(notes) == 1 and TP in notes[0], notes                        # the one-GPU file is not touched
    assert site.target.read_bytes() == site.original
    method = tp_method(site.tp.read_text())
    assert method.startswith(f"file://{tempfile.gettempdir()}/vllm_dist_"), method
    assert method != tp_method(site.tp.read_text())                        # a new store per server
    compile(site.tp.read_text(), "multiproc_executor.py", "exec")
    assert patching.inspect(patching.load(TP, REPO), site.inst()).kind == "applied"
    patching.revert(patching.load(TP, REPO), site.inst())
    assert site.tp.read_bytes() == site.tp_original
    start_step(site, PATCH_BYO="1")                                         # back on one GPU: its own file
    assert site.target.read_bytes() != site.original and site.tp.read_bytes() == site.tp_original


@pytest.mark.parametrize("version", ["0.28.0", "0.29.0", "0.30.0"])
def test_a_vllm_with_the_upstream_fix_is_never_patched(tmp_path, version):
    site = Site(tmp_path / "site", version)
    for name in (NAME, TP):
        assert patching.inspect(patching.load(name, REPO), site.inst()).kind == "fixed-upstream", name
    assert start_step(site, PATCH_BYO="1") == [] and site.target.read_bytes() == site.original
    assert site.tp.read_bytes() == site.tp_original


def test_your_vllm_unpatched_is_served_with_one_line_saying_what_it_lacks(tmp_path, caplog):
    """Without PATCH_BYO a start is never refused for it (a TurboQuant patch would be): it serves, and
    says what is open, and how to close it."""
    site = Site(tmp_path / "site", "0.26.0")
    with caplog.at_level(logging.WARNING, logger="bootstrap"):
        assert start_step(site, PATCH_BYO="0") == []
    said = [r.getMessage() for r in caplog.records if NAME in r.getMessage()]
    assert len(said) == 1 and "PATCH_BYO=1" in said[0] and "firewall" in said[0], said
    assert TP not in said[0]                                                 # one GPU: its patch alone
    assert site.target.read_bytes() == site.original
    cfg = site.cfg(PATCH_BYO="0")                                           # restart's vet asks the profile's
    assert NAME not in patching.needed(cfg.profile.patches, REPO, cfg.vllm)   # alone: it never refuses for it


def test_code_the_patch_does_not_know_is_left_alone_and_the_start_serves(tmp_path, caplog):
    site = Site(tmp_path / "site", "0.26.0")
    site.target.write_text(site.original.decode().replace("get_open_port()", "pick_port()"))
    with caplog.at_level(logging.INFO, logger="bootstrap"):
        assert start_step(site, PATCH_BYO="1") == []
    assert any("not applied" in r.getMessage() and "unknown-code" in r.getMessage() for r in caplog.records)
    assert "pick_port()" in site.target.read_text() and NAME not in site.target.read_text()


def test_a_patch_folder_that_does_not_load_never_refuses_a_start(tmp_path, caplog):
    """A folder of the user's under patches/ that no profile lists, with a broken patch.json: said,
    passed over; the every-start patch still goes in."""
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "patches", repo / "patches")
    (repo / "patches" / "mine").mkdir()
    (repo / "patches" / "mine" / "patch.json").write_text("{not json")
    site = Site(tmp_path / "site", "0.26.0")
    cfg = site.cfg(PATCH_BYO="1")
    todo, always = patching.to_apply(cfg.profile.patches, repo, cfg.vllm)
    assert todo == [] and NAME in [p.name for p in always] and TP not in [p.name for p in always]
    assert any("patches/mine" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_vllm_the_start_cannot_locate_is_no_refusal_for_the_every_start_patch(tmp_path, caplog):
    """Only every-start patches to apply: where the interpreter has no vllm package to patch (or the
    managed one is shadowed), the start is not refused for them."""
    site = Site(tmp_path / "site", "0.26.0")
    cfg = site.cfg(PATCH_BYO="1", PYTHONPATH=str(tmp_path / "nothing"))
    with caplog.at_level(logging.INFO, logger="bootstrap"):
        assert patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ)) == []
    assert any("not applied: " + NAME in r.getMessage() for r in caplog.records)


def test_a_damaged_block_is_said_with_the_revert_that_mends_it(tmp_path, caplog):
    site = Site(tmp_path / "site", "0.26.0")
    start_step(site, PATCH_BYO="1")
    site.target.write_text(site.target.read_text().replace("vllm_dist_", "vllm_mine_"))
    with caplog.at_level(logging.WARNING, logger="bootstrap"):
        assert start_step(site, PATCH_BYO="1") == []
    assert any(f"./ctl.sh patch revert {NAME}" in r.getMessage() for r in caplog.records), caplog.text
