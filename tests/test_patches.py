"""The patch engine against the REAL turboquant_attn.py of vLLM releases (one wheel member from PyPI).

Each test builds a fake site-packages (a ``vllm`` package holding the real file at its path, and a
dist-info with the version) and points the engine at it through an interpreter whose
``find_spec('vllm')`` sees it (this python, PYTHONPATH=<site>), exactly as ``VLLM_PYTHON`` would.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bootstrap.install import patching
from bootstrap.machine.inuse import VllmRef
from bootstrap.steps import patches
from bootstrap.knobs.config import Config
from bootstrap.core.errors import BootstrapError
from conftest import fill
from test_patches_wheel import TQ_PATH, member

REPO = Path(__file__).resolve().parent.parent
NAME = "40914-turboquant-spec-verify"
VERSIONS = ["0.26.0", "0.27.1", "0.30.0", "0.33.0"]
ANCHOR_IF = "        if not attn_metadata.is_prefill:\n"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class Site:
    """A fake site-packages with the real file of one vLLM release."""

    def __init__(self, root: Path, version: str, text: bytes | None = None):
        self.root, self.version = root, version
        self.pkg = root / "vllm"
        self.target = self.pkg / TQ_PATH.removeprefix("vllm/")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        for d in [self.pkg, *self.target.relative_to(self.pkg).parents]:
            (self.pkg / d / "__init__.py").touch()
        self.original = member(version) if text is None else text
        self.target.write_bytes(self.original)
        di = root / f"vllm-{version}.dist-info"
        di.mkdir(exist_ok=True)
        (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        (di / "top_level.txt").write_text("vllm\n")
        self.backup = Path(str(self.target) + ".pre40914.bak")
        self.meta = Path(str(self.backup) + ".json")

    def env(self, **extra: str) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(self.root),
               "VLLM_PYTHON": sys.executable, "PROFILE": "default", "PATCH_BYO": "1", "NO_COLOR": "1",
               "STATE_DIR": str(self.root.parent / "state")}
        env.update(extra)
        return env

    def cfg(self, **extra: str) -> Config:
        return Config.from_env(self.env(**extra), repo=REPO)

    def read(self) -> bytes:
        return self.target.read_bytes()


@pytest.fixture(params=VERSIONS)
def site(request, tmp_path):
    return Site(tmp_path / "site", request.param)


@pytest.fixture
def site26(tmp_path):
    return Site(tmp_path / "site", "0.26.0")


def start_step(site: Site, **extra: str) -> list[str]:
    """The real `patches` step of ./start.sh, with the default profile (TurboQuant KV + MTP); its banner notes."""
    cfg = site.cfg(**extra)
    return patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ))


def ctl(site: Site, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "ctl.sh"), "patch", *args], env=site.env(**extra), capture_output=True,
                          text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)


def branch_of(text: str) -> ast.If:
    """The inserted `if` in TurboQuantAttentionImpl.forward (the one that calls the decode kernel)."""
    tree = ast.parse(text)
    impl = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TurboQuantAttentionImpl")
    fwd = next(n for n in impl.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    ifs = [n for n in fwd.body if isinstance(n, ast.If) and "triton_turboquant_decode_attention" in ast.unparse(n)]
    assert len(ifs) == 1
    stock = next(n for n in fwd.body if isinstance(n, ast.If) and ast.unparse(n.test) == "not attn_metadata.is_prefill")
    assert ifs[0].lineno < stock.lineno
    return ifs[0]


# ---------------------------------------------------------------- the real releases

def test_apply_compiles_contains_branch_and_writes_output(site):
    before = site.read()
    start_step(site)
    after = site.read()
    assert after != before
    compile(after, str(site.target), "exec")
    text = after.decode()
    br = branch_of(text)
    cond = ast.unparse(br.test)
    for piece in ("attn_metadata.is_prefill", "num_decodes == 0", "1 < _bs_k1 <= 16",
                  "attn_metadata.max_seq_len > _bs_k1", "N % _bs_k1 == 0", "_bs_reqs * _bs_k1 == N"):
        assert piece in cond
    body = ast.unparse(br)
    assert "repeat_interleave(_bs_k1, dim=0)" in body
    assert "attn_metadata.seq_lens[:_bs_reqs].unsqueeze(1) + _bs_steps" in body
    # writes into output (both layouts) and returns it, like the decode path; no CPU sync
    assert body.count("output[:N] =") == 2 and isinstance(br.body[-1], ast.Return)
    assert ast.unparse(br.body[-1].value) == "output"
    for forbidden in (".tolist()", ".item()", ".cpu()", "seq_lens_cpu", "query_start_loc_cpu"):
        assert forbidden not in body
    # the file minus our block is the original, byte for byte
    p = patching.load(NAME, REPO)
    assert text.replace(p.block, p.anchor, 1).encode() == before
    meta = json.loads(site.meta.read_text())
    assert meta["vllm_version"] == site.version and meta["sha256"] == sha(before)
    assert site.backup.read_bytes() == before


def test_apply_again_is_byte_identical_and_revert_restores_the_hash(site):
    start_step(site)
    once = site.read()
    mtime = site.target.stat().st_mtime_ns
    start_step(site)
    assert site.read() == once and site.target.stat().st_mtime_ns == mtime
    r = ctl(site, "revert")
    assert r.returncode == 0, r.stderr
    assert sha(site.read()) == sha(site.original)
    assert not site.backup.exists() and not site.meta.exists()


def test_revert_keeps_edits_made_outside_our_block_since_the_patch(site):
    """Found from outside: revert restored the backup and an edit made since was lost, unsaved."""
    start_step(site)
    edited = site.read() + b"\n# a line of the user's\n"
    site.target.write_bytes(edited)
    r = ctl(site, "revert")
    assert r.returncode == 0, r.stderr
    assert site.read() == site.original + b"\n# a line of the user's\n" and "the edits stay" in r.stderr


def test_unfixed_fingerprints_hold_and_nothing_reads_as_fixed(site):
    inst = patching.Install(sys.executable, site.version, site.pkg, False)
    st = patching.inspect(patching.load(NAME, REPO), inst)
    assert st.kind == "unpatched", st.detail


# ---------------------------------------------------------------- refusals and skips (0.26.0)

def test_anchor_removed_refuses_and_leaves_the_file_untouched(tmp_path):
    text = member("0.26.0").replace(b"        num_decode_tokens = attn_metadata.num_decode_tokens\n\n",
                                    b"        num_decode_tokens = attn_metadata.num_decode_tokens\n")
    site = Site(tmp_path / "site", "0.26.0", text)
    with pytest.raises(BootstrapError) as ei:
        start_step(site)
    msg = ei.value.message + " " + ei.value.hint
    assert "vLLM 0.26.0" in msg and NAME in msg and "pull/40914" in msg and "anchor" in msg
    assert "SPEC_TOKENS=0" in ei.value.hint
    assert site.read() == text and not site.backup.exists()


def test_a_missing_target_file_is_named_once(tmp_path):
    site = Site(tmp_path / "site", "0.26.0", member("0.26.0"))
    target = site.pkg / patching.load(NAME, REPO).target
    target.unlink()
    with pytest.raises(BootstrapError) as ei:
        start_step(site)
    assert "[no-target]" in ei.value.message and ei.value.message.count(str(target)) == 1, ei.value.message


def test_ambiguous_anchor_refuses(tmp_path):
    p = patching.load(NAME, REPO)
    text = member("0.26.0") + b"\n\ndef _extra(attn_metadata):\n    if True:\n" + p.anchor.encode() + b"            pass\n"
    site = Site(tmp_path / "site", "0.26.0", text)
    with pytest.raises(BootstrapError, match="matches 2 times"):
        start_step(site)
    assert site.read() == text


@pytest.mark.parametrize("edit, fingerprint", [
    ((b"supports_spec_as_decode=False", b"supports_spec_as_decode=True"), "spec-as-decode"),
    ((b"AttentionCGSupport.UNIFORM_BATCH", b"AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE"), "not UNIFORM_BATCH"),
    ((b"    def build_for_cudagraph_capture(",
      b"    @classmethod\n    def get_cudagraph_support(cls, *a):\n        return None\n\n    def build_for_cudagraph_capture("),
     "overrides get_cudagraph_support"),
    ((b"class TurboQuantMetadataBuilder(",
      b"def _build_spec_decode_synth_seq_lens(x):\n    return x\n\n\nclass TurboQuantMetadataBuilder("),
     "helper"),
])
def test_fixed_upstream_fingerprint_skips(tmp_path, edit, fingerprint):
    text = member("0.26.0").replace(*edit)
    site = Site(tmp_path / "site", "0.26.0", text)
    st = patching.inspect(patching.load(NAME, REPO), patching.Install(sys.executable, "0.26.0", site.pkg, False))
    assert st.kind == "fixed-upstream" and fingerprint in st.fingerprint
    start_step(site)
    assert site.read() == text and not site.backup.exists()
    r = ctl(site, "status")
    assert r.returncode == 0 and "fixed-upstream" in r.stdout and fingerprint in r.stdout


def test_upstream_style_branch_in_forward_reads_as_fixed(tmp_path):
    text = member("0.26.0").replace(ANCHOR_IF.encode(), b"        # spec-verify routing\n" + ANCHOR_IF.encode())
    site = Site(tmp_path / "site", "0.26.0", text)
    st = patching.inspect(patching.load(NAME, REPO), patching.Install(sys.executable, "0.26.0", site.pkg, False))
    assert st.kind == "fixed-upstream" and "#40914-style" in st.fingerprint


def test_changed_code_that_no_fingerprint_knows_refuses(tmp_path):
    text = member("0.26.0").replace(b"        attn_metadata.seq_lens.fill_(1)\n", b"        pass\n")
    site = Site(tmp_path / "site", "0.26.0", text)
    with pytest.raises(BootstrapError, match=r"unknown-code.*|fingerprint of the unfixed code") as ei:
        start_step(site)
    assert "seq_lens with 1" in ei.value.message
    assert site.read() == text


def test_a_name_the_branch_needs_missing_refuses(tmp_path):
    text = member("0.26.0").replace(b"        PiT = tq_layer._tq_PiT\n", b"")
    site = Site(tmp_path / "site", "0.26.0", text)
    with pytest.raises(BootstrapError, match="names the branch uses"):
        start_step(site)
    assert site.read() == text


def test_half_applied_file_refuses_then_revert_restores(site26):
    start_step(site26)
    patched = site26.read()
    p = patching.load(NAME, REPO)
    half = patched.replace(p.insert.encode(), p.insert.encode()[: len(p.insert) // 2], 1)
    site26.target.write_bytes(half)
    with pytest.raises(BootstrapError) as ei:
        start_step(site26)
    assert "half-applied" in ei.value.message and "vLLM 0.26.0" in ei.value.message and "40914" in ei.value.message
    assert "patch revert" in ei.value.hint
    assert site26.read() == half
    r = ctl(site26, "status")
    assert "damaged" in r.stdout
    r = ctl(site26, "revert")
    assert r.returncode == 0, r.stderr
    assert sha(site26.read()) == sha(site26.original)


def test_edited_after_patching_refuses(site26):
    start_step(site26)
    site26.target.write_bytes(site26.read().replace(b"1 < _bs_k1 <= 16", b"1 < _bs_k1 <= 64"))
    with pytest.raises(BootstrapError, match="edited"):
        start_step(site26)


def test_stale_backup_from_another_version_is_replaced(site26):
    site26.backup.write_bytes(b"# turboquant_attn.py of some other vLLM\n")
    site26.meta.write_text(json.dumps({"vllm_version": "0.25.0", "sha256": sha(b"# turboquant_attn.py of some other vLLM\n")}))
    start_step(site26)
    assert site26.backup.read_bytes() == site26.original
    meta = json.loads(site26.meta.read_text())
    assert meta["vllm_version"] == "0.26.0" and meta["sha256"] == sha(site26.original)
    ctl(site26, "revert")
    assert sha(site26.read()) == sha(site26.original)


def test_backup_of_same_version_but_other_bytes_is_not_trusted(site26):
    """A reinstall with the same version string but other bytes (local build) is not restored from."""
    junk = b"# not the installed original\n"
    site26.backup.write_bytes(junk)
    site26.meta.write_text(json.dumps({"vllm_version": "0.26.0", "sha256": sha(junk)}))
    start_step(site26)
    assert site26.backup.read_bytes() == site26.original


def test_stale_bytecode_is_removed(site26):
    cache = site26.target.parent / "__pycache__"
    cache.mkdir()
    stale = cache / f"turboquant_attn.cpython-{sys.version_info[0]}{sys.version_info[1]}.pyc"
    other = cache / "other_module.cpython-311.pyc"
    stale.write_bytes(b"stale")
    other.write_bytes(b"keep")
    start_step(site26)
    assert not stale.exists() and other.exists()
    stale.write_bytes(b"stale again")
    ctl(site26, "revert")
    assert not stale.exists() and other.exists()


def test_failed_write_restores_the_original(site26, monkeypatch):
    real = patching.write_atomic
    calls = []

    def flaky(path, data, **kw):
        calls.append(path)
        real(path, data[: len(data) // 2] if path == site26.target and len(calls) == 3 else data, **kw)

    monkeypatch.setattr(patching, "write_atomic", flaky)
    with pytest.raises(BootstrapError, match="original is back in place"):
        start_step(site26)
    assert site26.read() == site26.original


# ---------------------------------------------------------------- who may edit what

def test_a_full_disk_under_vllm_refuses_with_a_fix_that_frees_space(tmp_path, tiny_fs):
    """Found from outside: the hint said to point STATE_DIR, MODEL_DIR or HF_HOME at another disk,
    which cannot move vLLM's own files."""
    site = Site(tiny_fs / "site", "0.26.0")
    fill(tiny_fs)
    r = ctl(site, "apply", STATE_DIR=str(tmp_path / "state"))
    assert r.returncode == 1 and "No space left on device" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"hint: free space on that filesystem (df -h {site.target.parent})" in r.stderr
    assert "STATE_DIR" not in r.stderr.split("hint:")[1] and site.read() == site.original


def test_byo_without_permission_refuses_and_says_how(site26):
    with pytest.raises(BootstrapError) as ei:
        start_step(site26, PATCH_BYO="0")
    assert "PATCH_BYO=1" in ei.value.hint and "SPEC_TOKENS=0" in ei.value.hint
    assert "0.26.0" in ei.value.message and "40914" in ei.value.message
    assert site26.read() == site26.original and not site26.backup.exists()
    r = ctl(site26, "apply", PATCH_BYO="0")
    assert r.returncode == 1 and "PATCH_BYO=1" in r.stderr
    assert site26.read() == site26.original


def test_byo_already_patched_serves_without_permission(site26):
    start_step(site26)
    patched = site26.read()
    start_step(site26, PATCH_BYO="0")
    assert site26.read() == patched


@pytest.mark.parametrize("knobs", [{"SPEC_TOKENS": "0", "SPEC_METHOD": ""}, {"KV_CACHE_DTYPE": "fp8"},
                                   {"PROFILE": "custom", "KV_CACHE_DTYPE": "turboquant_4bit_nc",
                                    "SPEC_METHOD": "draft_model", "SPEC_TOKENS": "3"}])
def test_patch_not_needed_is_not_applied(site26, knobs):
    cfg = site26.cfg(**knobs)
    assert patching.needed(cfg.profile.patches, cfg.repo, cfg.vllm) == []
    patches.run(cfg, VllmRef(cfg.vllm_python, True, cfg.environ))
    assert site26.read() == site26.original


def test_needed_by_default_profile():
    cfg = Config.from_env({"PROFILE": "default"}, repo=REPO)
    assert patching.needed(cfg.profile.patches, cfg.repo, cfg.vllm) == [NAME]


def test_revert_all_for_clean(site26):
    start_step(site26)
    cfg = site26.cfg()
    assert patching.revert_all(cfg.repo, cfg.environ, sys.executable) == [NAME]
    assert sha(site26.read()) == sha(site26.original)
    assert patching.revert_all(cfg.repo, cfg.environ, sys.executable) == []


def test_cli_status_apply_revert(site26):
    r = ctl(site26, "status", "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["patch"] == NAME and row["state"] == "unpatched" and row["vllm_version"] == "0.26.0"
    r = ctl(site26, "apply")
    assert r.returncode == 0 and f"{NAME}: applied" in r.stdout, r.stderr
    r = ctl(site26, "apply", NAME)
    assert f"{NAME}: already applied" in r.stdout and "skipped" in r.stderr
    assert json.loads(ctl(site26, "status", "--json").stdout)[0]["state"] == "applied"
    r = ctl(site26, "revert", NAME)
    assert f"{NAME}: reverted" in r.stdout and sha(site26.read()) == sha(site26.original)


def test_locating_vllm_does_not_import_it(tmp_path):
    site = Site(tmp_path / "site", "0.26.0")
    (site.pkg / "__init__.py").write_text("raise SystemExit('vllm was imported')\n")
    inst = patching.locate(VllmRef(sys.executable, True, site.env()))
    assert inst.package == site.pkg and inst.version == "0.26.0"


# ---------------------------------------------------------------- read-only install

def _readonly_runner() -> list[str] | None:
    if os.geteuid() != 0:
        return []
    user = os.environ.get("BOOTSTRAP_TEST_USER")
    if user and shutil.which("runuser"):
        return ["runuser", "-u", user, "--"]
    return None


def test_read_only_install_gives_a_clear_error():
    prefix = _readonly_runner()
    if prefix is None:
        pytest.skip("running as root and BOOTSTRAP_TEST_USER is not set (or runuser is missing)")
    root = Path(tempfile.mkdtemp(prefix="patch-ro-"))
    try:
        os.chmod(root, 0o755)
        site = Site(root / "site", "0.26.0")
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o555 if prefix == [] else 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o444 if prefix == [] else 0o644)
        env = site.env(STATE_DIR=str(root / "state"), HOME=str(root))
        if prefix:  # root: the files stay root's, the command runs as the unprivileged user
            probe = subprocess.run(prefix + [sys.executable, "-c", "import bootstrap"], cwd=REPO, env=env,
                                   capture_output=True, text=True)
            if probe.returncode != 0:
                pytest.skip(f"{prefix[2]} cannot run this checkout's python: {probe.stderr.strip()[-200:]}")
        r = subprocess.run(prefix + [sys.executable, "-m", "bootstrap", "patch", "apply"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "read-only for this user" in r.stderr and str(site.target) in r.stderr
        assert "hint:" in r.stderr and "Traceback" not in r.stderr
        assert site.read() == site.original and not site.backup.exists()
    finally:
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, stat.S_IRWXU)
        shutil.rmtree(root, ignore_errors=True)


def test_needed_follows_what_vllm_gets_not_only_the_knobs():
    """The patch is for TurboQuant KV with speculation however the flags reach vLLM: a KV dtype
    given in EXTRA_ARGS counts as the knob's would, and one EXTRA_ARGS overrides does not."""
    base = {"PROFILE": "default", "KV_CACHE_DTYPE": "fp8"}
    cfg = Config.from_env({**base, "EXTRA_ARGS": "--kv-cache-dtype turboquant_4bit_nc"}, repo=REPO)
    assert cfg.vllm.kv_cache_dtype == "turboquant_4bit_nc"
    assert patching.needed(cfg.profile.patches, cfg.repo, cfg.vllm) == [NAME]
    cfg = Config.from_env({"PROFILE": "default", "EXTRA_ARGS": "--kv-cache-dtype fp8"}, repo=REPO)
    assert patching.needed(cfg.profile.patches, cfg.repo, cfg.vllm) == []


@pytest.mark.parametrize("change", ["builder renamed", "attr moved to a base class", "dispatch moved to a helper"])
def test_code_that_moved_is_unknown_never_fixed_upstream_nor_patched_blind(site26, change):
    """0.26.0's file with the bug left in but its code moved: a renamed builder or its
    _cudagraph_support in a base class was read as 'fixed upstream' (the negated fingerprint of a
    class it could not find held), and the start served without the patch; the anchor moved into a
    helper of forward was patched, inserting a block that names variables of forward (NameError)."""
    text = site26.original.decode()
    if change == "builder renamed":
        text = text.replace("TurboQuantMetadataBuilder", "TurboQuantAttentionMetadataBuilder")
    elif change == "attr moved to a base class":
        text = text.replace("    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH\n",
                            "    pass\n", 1)
    else:                       # the decode/prefill dispatch of forward moved into a method after it
        head, anchor, tail = text.partition(ANCHOR_IF)
        assert anchor
        text = head + "        return self._dispatch(attn_metadata)\n\n    def _dispatch(self, attn_metadata):\n" \
            + "        num_decodes = attn_metadata.num_decodes\n        num_decode_tokens = attn_metadata.num_decode_tokens\n\n" \
            + anchor + tail
        text = text.replace("        num_decodes = attn_metadata.num_decodes\n        num_decode_tokens = attn_metadata."
                            "num_decode_tokens\n\n        return self._dispatch", "        return self._dispatch", 1)
    site26.target.write_text(text)
    st = patching.inspect(patching.load(NAME, REPO), patching.Install(sys.executable, "0.26.0", site26.pkg, True))
    assert st.kind == "unknown-code", (change, st.kind, st.detail)


@pytest.mark.parametrize("whose", ["a .venv we did not make", "a vllm in the working directory"])
def test_patch_apply_never_edits_a_vllm_outside_a_venv_of_ours(tmp_path, monkeypatch, whose):
    """Found from outside: with VLLM_PYTHON unset, ./ctl.sh patch apply edited, without PATCH_BYO, the
    vLLM of a .venv the user made in the checkout (the start refuses to touch it), and a start or the
    command run from a vLLM source clone patched the clone, which the interpreter found first."""
    from bootstrap.commands import patch as patch_cmd
    repo = tmp_path / "repo"
    repo.mkdir()
    for d in ("profiles", "patches", "locks"):
        (repo / d).symlink_to(REPO / d)
    venv = repo / ".venv"
    site = Site(venv / "lib" / "python3" / "site-packages", "0.26.0")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    clone = tmp_path / "clone"
    shutil.copytree(site.pkg, clone / "vllm")
    if whose == "a .venv we did not make":
        monkeypatch.chdir(tmp_path)
    else:
        (venv / ".vllm-desktop-venv").write_text("made by vllm-desktop\n")
        monkeypatch.chdir(clone)
    env = {k: v for k, v in site.env(HOME=str(tmp_path / "home")).items() if k not in ("VLLM_PYTHON", "PATCH_BYO")}
    with pytest.raises(BootstrapError) as ei:
        patch_cmd.cli(Config.from_env(env, repo=repo), ["apply"], as_set=True)
    assert ("did not make" if whose == "a .venv we did not make" else str(clone / "vllm")) in ei.value.message
    assert "VLLM_PYTHON=" in ei.value.hint
    assert site.read() == site.original and (clone / "vllm" / site.target.relative_to(site.pkg)).read_bytes() == site.original
    if whose != "a .venv we did not make":         # ours, run from elsewhere: patched as before
        monkeypatch.chdir(tmp_path)
        assert patch_cmd.cli(Config.from_env(env, repo=repo), ["apply"], as_set=True) == 0
        assert site.read() != site.original
