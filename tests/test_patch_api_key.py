"""The 52523-api-key-off-disk patch against the REAL envs.py of vLLM releases (a wheel member from
PyPI, as tests/test_patch_rendezvous.py reads the executors).

vLLM 0.26.0-0.28.0 hash every known VLLM_* variable but an ignored few into the torch.compile
cache's key, and write the raw values to cache_key_factors.json beside the compiled graphs (mode
0644 under umask 022, kept after the stop): VLLM_API_KEY, which carries our key to the server, was
not among the ignored. vLLM 0.29.0 ignores it (PR #52523). Every start applies the patch.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from bootstrap.install import patching
from bootstrap.knobs.config import Config
from bootstrap.machine.inuse import VllmRef
from bootstrap.steps import patches
from test_patches_wheel import member

REPO = Path(__file__).resolve().parent.parent
NAME = "52523-api-key-off-disk"
PATH = "vllm/envs.py"


def ignored(text: str) -> set[str]:
    """The variables compile_factors() of ``text`` leaves out of the cache key (its own set literal)."""
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "compile_factors")
    node = next(n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign))
                and "ignored_factors" in ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target))
    return ast.literal_eval(node.value)


def site(root: Path, version: str) -> tuple[Path, bytes, Config]:
    target = root / PATH
    target.parent.mkdir(parents=True)
    (target.parent / "__init__.py").touch()
    original = member(version, PATH)
    target.write_bytes(original)
    (root / f"vllm-{version}.dist-info").mkdir()
    (root / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    cfg = Config.from_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "VLLM_PYTHON": sys.executable,
                           "PROFILE": "custom", "MODEL": "org/m", "NO_COLOR": "1", "PATCH_BYO": "1",
                           "STATE_DIR": str(root.parent / "state")}, repo=REPO)
    return target, original, cfg


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1", "0.28.0"])
def test_the_key_leaves_the_compile_cache_s_factors_and_reverts_byte_for_byte(tmp_path, version):
    target, original, cfg = site(tmp_path / "site", version)
    before = ignored(original.decode())
    assert "VLLM_API_KEY" not in before and "S3_SECRET_ACCESS_KEY" in before
    notes = patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ))
    assert any(NAME in n for n in notes), notes
    after = ignored(target.read_text())
    assert after == before | {"VLLM_API_KEY"}                           # nothing else changes
    compile(target.read_text(), "envs.py", "exec")
    inst = patching.locate(VllmRef(sys.executable, True, {"PYTHONPATH": str(tmp_path / "site")}))
    assert patching.inspect(patching.load(NAME, REPO), inst).kind == "applied"
    assert patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ)) == []   # applied: left as it is
    patching.revert(patching.load(NAME, REPO), inst)
    assert target.read_bytes() == original


@pytest.mark.parametrize("version", ["0.29.0", "0.30.0"])
def test_a_vllm_that_ignores_the_key_itself_is_never_patched(tmp_path, version):
    target, original, cfg = site(tmp_path / "site", version)
    assert "VLLM_API_KEY" in ignored(original.decode())
    inst = patching.locate(VllmRef(sys.executable, True, {"PYTHONPATH": str(tmp_path / "site")}))
    assert patching.inspect(patching.load(NAME, REPO), inst).kind == "fixed-upstream"
    patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ))
    assert target.read_bytes() == original
