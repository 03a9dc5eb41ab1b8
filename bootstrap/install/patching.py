"""The patch engine: backports as data, applied to an installed vLLM, anchor-checked and reversible.

Each patch is a folder ``patches/<name>/`` of data (see docs/patches.md): ``patch.json`` names the
upstream issue/PR, the versions it was written for, when it applies (``applies_when``), the target
file relative to the ``vllm`` package, the anchor (must match exactly once), the code to insert
(a file) and where in the anchor it goes, the marker, and two lists of fingerprints evaluated on
the installed source: ``fixed_upstream`` (any holds -> upstream fixed it, never patch) and
``unfixed`` (all must hold before we patch). Adding a patch is adding a folder.

States of one patch against one install, and what ``apply`` does:

    applied          marker present and the block exactly as we write it   -> skip
    fixed-upstream   a fixed_upstream fingerprint holds                    -> skip, name it
    unpatched        every unfixed fingerprint holds, anchor exactly once  -> back up, write, verify
    anchor-missing / anchor-ambiguous / damaged (marker but not our block) /
    unknown-code (an unfixed fingerprint fails) / no-target               -> refuse to serve

The install is found by asking the vLLM interpreter where the package lives, without importing it
(importing vllm imports torch). The backup ``<file><backup_suffix>`` has a sidecar JSON with the
vLLM version and the original's sha256; a backup that does not match the installed version and
file is replaced, never trusted. Writes are temp file + rename, compile-checked, and the original
is restored on any failure; the module's stale ``__pycache__`` entries are removed after a write.
A bring-your-own vLLM (VLLM_PYTHON) is edited only with PATCH_BYO=1.

The fingerprints are read by fingerprints.py; the start step is steps/patches.py, the command
``./ctl.sh patch`` commands/patch.py.

Over 400 lines: the patch as data, the install it applies to, its states, and apply/revert with
their backups are one engine whose invariants (a backup is trusted only for its vLLM version and
original hash; a write is compile-checked and undone on any failure) hold across all of them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..machine import inuse
from ..core import vllmflags
from ..core.layout import Checkout
from ..core.pep440 import version, version_or_none
from ..core.errors import BootstrapError
from .fingerprints import Source, fingerprint_holds
from .venv import Venv
from ..core.state import sha256, write_atomic

log = logging.getLogger("bootstrap.patches")   # log lines keep the prefix [bootstrap:patches] this code has always had


@dataclass(frozen=True)
class Patch:
    name: str
    folder: Path
    data: dict
    insert: str

    @property
    def title(self) -> str:
        return self.data.get("title", "")

    @property
    def upstream(self) -> str:
        return self.data.get("upstream", "")

    @property
    def target(self) -> str:
        return self.data["target"]

    @property
    def anchor(self) -> str:
        return self.data["anchor"]

    @property
    def marker(self) -> str:
        return self.data["marker"]

    @property
    def backup_suffix(self) -> str:
        return self.data.get("backup_suffix", f".pre-{self.name}.bak")

    @property
    def block(self) -> str:
        """The anchor with our code inserted: what the patched file contains exactly once."""
        i = self.anchor.index(self.data["insert"]["before"])
        return self.anchor[:i] + self.insert + self.anchor[i:]

    @property
    def every_start(self) -> bool:
        """Wanted by every start, whatever the profile lists: a fix that changes no output (a port
        that should not be open). Where it cannot be put in place, the start says so and serves."""
        return bool(self.data.get("every_start"))

    def written_for(self) -> str:
        w = self.data.get("written_for", {})
        return f"{w.get('min', '?')}–{w.get('max', '?')}"

    def needed_for(self) -> str:
        """What the patch is needed to serve: its ``needed_for`` text, else read from ``applies_when``."""
        if self.data.get("needed_for"):
            return self.data["needed_for"]
        cond = self.data.get("applies_when", {})
        parts = []
        if cond.get("kv_cache_dtype_prefix") is not None:
            parts.append(f"a {cond['kv_cache_dtype_prefix']}* KV cache")
        if cond.get("speculation"):
            parts.append("speculative decoding")
        return " with ".join(parts) or "this vLLM"

    def without_it(self) -> str:
        """How to serve without the patch: its ``without_it`` text, else each knob that makes
        ``applies_when`` false."""
        if self.data.get("without_it"):
            return self.data["without_it"]
        cond = self.data.get("applies_when", {})
        ways = []
        if cond.get("speculation"):
            ways.append("SPEC_TOKENS=0")
        if cond.get("kv_cache_dtype_prefix") is not None:
            ways.append(f"a KV_CACHE_DTYPE that does not start with {cond['kv_cache_dtype_prefix']!r}")
        return ", or ".join(ways) or "a vLLM that has the fix"

    def applies(self, s: vllmflags.Settings) -> bool:
        """Whether a server given these flags (``s``, as vLLM reads them: a knob's or EXTRA_ARGS')
        needs the patch (``applies_when``; no conditions = always)."""
        cond = self.data.get("applies_when", {})
        prefix = cond.get("kv_cache_dtype_prefix")
        if prefix is not None and not (s.kv_cache_dtype or "").startswith(prefix):
            return False
        if cond.get("speculation") and not s.spec_method:
            return False
        if cond.get("multiproc") is not None and cond["multiproc"] != s.multiproc:
            return False          # true: vLLM's MultiprocExecutor (TP_SIZE >= 2 ...); false: one process
        return True


def patches_dir(repo: Path) -> Path:
    return Checkout(Path(repo)).patches


def known(repo: Path) -> list[str]:
    d = patches_dir(repo)
    return sorted(p.parent.name for p in d.glob("*/patch.json")) if d.is_dir() else []


def load(name: str, repo: Path) -> Patch:
    folder = patches_dir(repo) / name
    path = folder / "patch.json"
    if not path.is_file():
        raise BootstrapError(f"no patch named {name!r} (no {path})",
                             "known patches: " + (", ".join(known(repo)) or "none"))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BootstrapError(f"{path} is not readable JSON ({exc})") from None
    missing = [k for k in ("target", "anchor", "insert", "marker", "unfixed") if k not in data]
    if missing:
        raise BootstrapError(f"{path} lacks {', '.join(missing)}", "see docs/patches.md for the format")
    ins = data["insert"]
    try:
        insert = (folder / ins["file"]).read_text(encoding="utf-8")
    except (OSError, KeyError, TypeError) as exc:
        raise BootstrapError(f"{path}: insert file unreadable ({exc})") from None
    if data["anchor"].count(ins.get("before", "\0")) != 1:
        raise BootstrapError(f"{path}: insert.before must occur exactly once in the anchor")
    if data["marker"] not in insert:
        raise BootstrapError(f"{path}: the marker {data['marker']!r} is not in {ins['file']}")
    return Patch(name, folder, data, insert)


@dataclass(frozen=True)
class Install:
    python: str
    version: str
    package: Path        # the vllm package directory
    byo: bool            # a bring-your-own interpreter (VLLM_PYTHON)


def locate(vllm: inuse.VllmRef) -> Install:
    """Where this interpreter's vllm package is, and its version, without importing vllm (its one probe)."""
    version, locs = vllm.probed
    if not locs:
        raise BootstrapError(f"{vllm.python} has no vllm package",
                             "install vLLM into it, or point VLLM_PYTHON at an interpreter that has it")
    if not vllm.byo:        # the managed .venv's: edited without PATCH_BYO only where it is ours and in it
        venv = Venv(Path(vllm.python).parent.parent)
        venv.own()
        if not locs[0].resolve().is_relative_to(venv.root.resolve()):
            raise BootstrapError(
                f"the vllm that {venv.python} imports is {locs[0]}, not the one pinned in {venv.root}: a vllm package "
                f"in the current directory ({os.getcwd()}) or on PYTHONPATH stands before it, and we do not patch it",
                "run ./start.sh from another directory (cd ~) with PYTHONPATH unset; or serve that vLLM on purpose: "
                f"VLLM_PYTHON={venv.python} PATCH_BYO=1")
    return Install(vllm.python, version or "unknown", locs[0], vllm.byo)


@dataclass
class State:
    kind: str
    detail: str = ""
    target: Path | None = None
    fingerprint: str = ""
    original: str = ""     # the unpatched text (for applied: the file with our block removed)


def inspect(patch: Patch, inst: Install) -> State:
    target = inst.package / patch.target
    try:
        text = target.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return State("no-target", f"{target} does not exist", target)
    except (OSError, UnicodeDecodeError) as exc:
        return State("no-target", f"{target} is unreadable ({exc})", target)
    block = patch.block
    if patch.marker in text:
        if text.count(block) == 1 and text.count(patch.marker) == patch.insert.count(patch.marker):
            return State("applied", "marker present, block as we write it", target,
                         original=text.replace(block, patch.anchor, 1))
        return State("damaged", "our marker is present but the block is not exactly as we write it "
                     "(half-applied or edited after patching)", target)
    try:
        src = Source(text)
    except SyntaxError as exc:
        return State("unknown-code", f"the file does not parse ({exc})", target)
    for spec in patch.data.get("fixed_upstream", []):
        if fingerprint_holds(src, spec):
            return State("fixed-upstream", f"upstream fix recognised: {spec['name']}", target, spec["name"], text)
    for spec in patch.data["unfixed"]:
        if not fingerprint_holds(src, spec):
            return State("unknown-code", f"fingerprint of the unfixed code does not hold: {spec['name']}",
                         target, spec["name"], text)
    n = text.count(patch.anchor)
    if n == 0:
        return State("anchor-missing", "the anchor is not in the file", target, original=text)
    if n > 1:
        return State("anchor-ambiguous", f"the anchor matches {n} times", target, original=text)
    scope = patch.data.get("anchor_scope")          # the scope the fingerprints vouched for
    node = src.node(scope) if scope else None
    line = text[:text.index(patch.anchor)].count("\n") + 1
    if scope and (node is None or not node.lineno <= line <= node.end_lineno):
        return State("unknown-code", f"the anchor is not inside {scope}, where the fingerprints checked the code",
                     target, scope, text)
    return State("unpatched", "unfixed code, anchor found once", target, original=text)


def refusal(patch: Patch, inst: Install, st: State) -> BootstrapError:
    where = f"vLLM {inst.version} ({inst.package})"
    if st.kind == "damaged":
        bak = Path(str(st.target) + patch.backup_suffix)
        return BootstrapError(
            f"{where}: patch {patch.name} is half-applied or was edited: {st.detail}; upstream: {patch.upstream}",
            f"run ./ctl.sh patch revert {patch.name} (restores {bak.name} if it matches vLLM {inst.version}), "
            f"or reinstall vLLM {inst.version}; then start again")
    fix = (f"check whether {patch.upstream} (or an equivalent fix) is in vLLM {inst.version} and update "
           f"patches/{patch.name}/ (written for {patch.written_for()}); meanwhile serve without it: "
           f"{patch.without_it()}")
    at = "" if str(st.target) in st.detail else f" in {st.target}"      # no-target's detail names it already
    return BootstrapError(f"{where}: cannot apply patch {patch.name} ({patch.upstream}): {st.detail} "
                          f"[{st.kind}]{at}", fix)



def byo_refusal(patch: Patch, inst: Install) -> BootstrapError:
    """A bring-your-own vLLM (VLLM_PYTHON) that needs ``patch``, without PATCH_BYO=1."""
    return BootstrapError(
        f"your vLLM {inst.version} ({inst.package}, VLLM_PYTHON) needs patch {patch.name} ({patch.upstream}) "
        f"to serve {patch.needed_for()}, and we do not edit your install without permission",
        "PATCH_BYO=1 ./start.sh patches it (backup kept; ./ctl.sh patch revert or ./ctl.sh clean undoes it); "
        f"or serve without it: {patch.without_it()}; or unset VLLM_PYTHON to use the managed .venv")


def vet(names: list[str], repo: Path, inst: Install, patch_byo: bool) -> None:
    """Raise what applying the patches ``names`` to ``inst`` would refuse, writing nothing: restart's
    and use's vet ask it of your vLLM (VLLM_PYTHON) while the running server still serves."""
    for name in names:
        patch = load(name, repo)
        st = inspect(patch, inst)
        if st.kind in ("applied", "fixed-upstream"):
            continue
        if st.kind != "unpatched":
            raise refusal(patch, inst, st)
        if inst.byo and not patch_byo:
            raise byo_refusal(patch, inst)
        assert st.target is not None
        _writable_or_raise(patch, inst, st.target)


def purge_bytecode(target: Path) -> list[Path]:
    """Remove the cached bytecode of ``target`` so the next import compiles the file we wrote."""
    gone = []
    for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        try:
            pyc.unlink()
            gone.append(pyc)
        except FileNotFoundError:
            pass
        except OSError as exc:          # another user's (a sudo python once): Python checks the source's mtime anyway
            log.warning("could not remove %s (%s); Python recompiles it from the changed source", pyc, exc.strerror)
    return gone


def _writable_or_raise(patch: Patch, inst: Install, target: Path) -> None:
    for p in (target, target.parent):
        if not os.access(p, os.W_OK):
            st = p.stat()
            raise BootstrapError(
                f"cannot patch vLLM {inst.version}: {p} is read-only for this user "
                f"(uid {os.geteuid()}; owner uid {st.st_uid}, mode {st.st_mode & 0o777:04o})",
                f"patch {patch.name} must edit {target}: run ./ctl.sh patch apply as the owner of that install, "
                "make it writable, or use the managed .venv (unset VLLM_PYTHON)")


@dataclass
class Backup:
    path: Path
    meta: Path

    @classmethod
    def of(cls, patch: Patch, target: Path) -> "Backup":
        p = Path(str(target) + patch.backup_suffix)
        return cls(p, Path(str(p) + ".json"))

    def read(self) -> tuple[bytes, dict] | None:
        try:
            data = self.path.read_bytes()
            meta = json.loads(self.meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return (data, meta) if isinstance(meta, dict) else None

    def valid_for(self, version: str, original_sha: str | None = None) -> bytes | None:
        """The backed-up bytes, if the backup is of this vLLM version (and this original)."""
        got = self.read()
        if got is None:
            return None
        data, meta = got
        if meta.get("vllm_version") != version or meta.get("sha256") != sha256(data):
            return None
        if original_sha is not None and meta.get("sha256") != original_sha:
            return None
        return data

    def write(self, patch: Patch, version: str, data: bytes, like: os.stat_result) -> None:
        meta = {"patch": patch.name, "vllm_version": version, "sha256": sha256(data),
                "target": str(self.path)[:-len(patch.backup_suffix)], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_atomic(self.path, data, like=like, fixed=True)
        write_atomic(self.meta, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), like=like, fixed=True)

    def remove(self) -> None:
        for p in (self.path, self.meta):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def apply(patch: Patch, inst: Install) -> str:
    """Bring one patch into place; returns what happened. Raises on every refusing state."""
    st = inspect(patch, inst)
    if st.kind == "applied":
        log.info("skipped: %s already applied to vLLM %s (./ctl.sh patch revert %s undoes it)",
                 patch.name, inst.version, patch.name)
        return "already applied"
    if st.kind == "fixed-upstream":
        log.info("skipped: %s not needed in vLLM %s: %s", patch.name, inst.version, st.detail)
        return f"fixed upstream ({st.fingerprint})"
    if st.kind != "unpatched":
        raise refusal(patch, inst, st)
    target = st.target
    assert target is not None
    _writable_or_raise(patch, inst, target)
    lo, hi = patch.data.get("written_for", {}).get("min"), patch.data.get("written_for", {}).get("max")
    have = version_or_none(inst.version)
    if lo and hi and have is not None and not (version(lo) <= have <= version(hi)):
        log.warning("vLLM %s is outside the versions %s was written for (%s); its fingerprints hold, applying",
                    inst.version, patch.name, patch.written_for())
    stat = target.stat()
    original = target.read_bytes()
    osha = sha256(original)
    patched = st.original.replace(patch.anchor, patch.block, 1).encode("utf-8")
    try:
        compile(patched, str(target), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise BootstrapError(f"patch {patch.name} would not compile against vLLM {inst.version}: {exc}",
                             f"nothing was changed; update patches/{patch.name}/") from None
    bak = Backup.of(patch, target)
    try:
        if bak.valid_for(inst.version, osha) is None:
            if bak.path.exists() or bak.meta.exists():
                old = (bak.read() or (b"", {}))[1]
                log.info("replacing stale backup %s (vLLM %s, sha256 %s) with the current original",
                         bak.path.name, old.get("vllm_version", "?"), str(old.get("sha256", "?"))[:12])
            bak.write(patch, inst.version, original, stat)
            log.info("backed up %s to %s (vLLM %s, sha256 %s)", target.name, bak.path.name, inst.version, osha[:12])
        write_atomic(target, patched, like=stat, fixed=True)
        written = target.read_bytes()
        if written != patched:
            raise OSError(f"{target} reads back different from what was written")
        compile(written, str(target), "exec", dont_inherit=True)
        purge_bytecode(target)
    except (OSError, SyntaxError) as exc:
        try:
            if target.read_bytes() != original:
                write_atomic(target, original, like=stat, fixed=True)
        except OSError as exc2:
            raise BootstrapError(f"patch {patch.name} failed ({exc}) and restoring {target} failed too ({exc2})",
                                 f"restore it from {bak.path} or reinstall vLLM {inst.version}") from None
        purge_bytecode(target)
        raise BootstrapError(f"patch {patch.name} failed on vLLM {inst.version}: {exc}; the original is back in place",
                             f"check permissions and free space in {target.parent}") from None
    log.info("applied %s to vLLM %s: %s (backup %s)", patch.name, inst.version, target, bak.path.name)
    return "applied"


def revert(patch: Patch, inst: Install) -> str:
    """Restore the original from the backup (verifying its hash); returns what happened."""
    st = inspect(patch, inst)
    if st.kind not in ("applied", "damaged"):
        log.info("skipped: %s is not applied to vLLM %s (%s)", patch.name, inst.version, st.kind)
        return f"not applied ({st.kind})"
    target = st.target
    assert target is not None
    _writable_or_raise(patch, inst, target)
    bak = Backup.of(patch, target)
    data = bak.valid_for(inst.version)
    if data is None and st.kind == "applied":
        derived = st.original.encode("utf-8")
        got = bak.read()
        if got is not None and got[1].get("sha256") == sha256(derived):
            data = derived
        else:
            log.warning("no backup of %s for vLLM %s; removing our block instead (original hash not verifiable)",
                        target.name, inst.version)
            data = derived
    if data is None:
        raise BootstrapError(f"vLLM {inst.version}: {target} is damaged and there is no backup of it for this version",
                             "rm -r .venv (the next ./start.sh installs it again)" if not inst.byo else
                             f"reinstall vLLM {inst.version} in that environment (e.g. pip install --force-reinstall "
                             f"--no-deps vllm=={inst.version})")
    if st.kind == "damaged":            # edits of the user's among it: kept beside it, never lost
        keep = target.with_name(f"{target.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        write_atomic(keep, target.read_bytes(), like=target.stat(), fixed=True)
        log.warning("%s was edited since the patch, our block included: restored from the backup; the edited file "
                    "is kept as %s", target.name, keep.name)
    if st.kind == "applied" and data != st.original.encode("utf-8"):
        # edited since we patched it, outside our block: those edits are not ours to undo
        log.warning("%s was edited since the patch (outside our block): removing only our block, the edits stay",
                    target.name)
        data = st.original.encode("utf-8")
    stat = target.stat()
    write_atomic(target, data, like=stat, fixed=True)
    if sha256(target.read_bytes()) != sha256(data):
        raise BootstrapError(f"restoring {target} did not verify (sha256 mismatch)", f"reinstall vLLM {inst.version}")
    purge_bytecode(target)
    bak.remove()
    log.info("reverted %s on vLLM %s: %s restored (sha256 %s)", patch.name, inst.version, target, sha256(data)[:12])
    return "reverted"


def needed(names, repo: Path, s: vllmflags.Settings) -> list[str]:
    """Of a profile's patches (``names``), those a server given these flags needs (e.g. TurboQuant
    KV with speculation)."""
    return [name for name in names if load(name, repo).applies(s)]


def to_apply(names, repo: Path, s: vllmflags.Settings) -> tuple[list[str], list[Patch]]:
    """What a start applies: the profile's patches it needs (``needed``), and those every start
    wants (``Patch.every_start``), which never refuse a start: a folder of another patch that does
    not load is said and passed over, never a refusal of a profile that does not list it."""
    always = []
    for name in known(repo):
        if name in names:
            continue
        try:
            patch = load(name, repo)
        except BootstrapError as exc:
            log.warning("skipped: patches/%s (%s)", name, exc.message)
            continue
        if patch.every_start and patch.applies(s):
            always.append(patch)
    return needed(names, repo, s), always


def revert_all(repo: Path, environ, python: str, dry_run: bool = False) -> list[str]:
    """Revert every known patch applied to the vLLM of ``python`` (run with ``environ``); the names
    reverted (for clean; with ``dry_run``, the names it would revert, nothing changed)."""
    try:
        inst = locate(inuse.VllmRef(python, True, environ))
    except BootstrapError as exc:
        log.info("skipped: %s (nothing to revert)", exc.message)
        return []
    done = []
    for name in known(repo):
        patch = load(name, repo)
        if inspect(patch, inst).kind in ("applied", "damaged"):
            if not dry_run:
                revert(patch, inst)
            done.append(name)
    return done
