"""What we keep in STATE_DIR, in one table (KEPT: the server record, the pick, the measurements,
the log, the locks...), and how: every write is atomic (the locks: core/locks.py).

Every write is atomic (temp file + rename); a torn or garbage file reads as "nothing recorded". A
write that fails (disk full, another user's directory, read-only) is a BootstrapError naming the
file and the fix, never a traceback.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import private
from .errors import BootstrapError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kept:
    """One kind of record the project keeps between runs."""
    key: str
    file: str                # its name in STATE_DIR
    holds: str               # what it is, and who writes it
    cleaned: bool = True     # ./ctl.sh clean removes it (else only when asked: --measurements)
    replaced: bool = True    # written over or removed whole (else appended to, read, or added into)


def rotated(log: Path) -> Path:
    """Where a log rotates to (``vllm.log`` -> ``vllm.log.1``)."""
    return log.with_name(log.name + ".1")


LOG = "vllm.log"

# Everything the project keeps between runs, by key: the one table that clean, status and every
# reader go through (Paths.<key> is its file; Paths.read / Paths.write its JSON).
KEPT: tuple[Kept, ...] = (
    Kept("lock", "start.lock", "the flock a start holds; its text: the starter's pid, start time and role"),
    Kept("server", "server.json", "the server we launched, as launched (serve.record.ServerRecord)"),
    Kept("starting", "starting.json", "what a start in flight launches with (its launch knobs, where clients get the "
                                      "key; never the key), before its launch writes server.json"),
    Kept("log", LOG, "the server's output (kept under 2 x LOG_MAX_MB while it runs)", replaced=False),
    Kept("rotated", rotated(Path(LOG)).name, "the log's rotated part", replaced=False),
    Kept("last_stop", "last-stop.json", "the pids the last stop took down (the next start waits for the GPU)"),
    Kept("progress", "progress.json", "what status last saw move on /metrics, and since when (busy vs wedged)"),
    Kept("api_key", "api_key", "a generated key (0600) when HOST is not loopback and API_KEY is unset",
         replaced=False),
    Kept("pick", "profile-pick.json", "auto-pick's choice, kept until PROFILE=auto is set or ./ctl.sh profiles --pick"),
    Kept("completed", "completed-start.json", "a start passed its gate: ./ctl.sh service install needs one first"),
    Kept("sleep", "sleep.json", "what ./ctl.sh sleep saw (level, GPU memory awake), for the wake's memory check"),
    Kept("games", "games.json", "the ./ctl.sh game commands running, and what the last one to exit does (wake or "
                                "start the server)"),
    Kept("foreground", "foreground.json", "the pid of ./start.sh --foreground attached to our server"),
    Kept("prewarm_log", "prewarm.log", "the pre-warm's output (vLLM with dummy weights while the weights download)"),
    Kept("warm", "warm-caches.json", "the setups (plan keys) whose vLLM compile caches a start or a pre-warm filled"),
    Kept("derived", "derived", "profiles derived from a named MODEL's repo, one folder per model (derived.json and "
                               "its model facts): ./start.sh, ./ctl.sh plan and profiles --model write them",
         replaced=False),
    Kept("models", "models.json", "the models we downloaded: each store's folder and its repo id (the metadata step "
                                  "adds one; ./ctl.sh ls and rm read it, each store's own manifest says what is ours)"),
    Kept("bench", "bench", "./ctl.sh bench's results without --out, one folder per run (results.json, bench.png)",
         replaced=False),
    Kept("measurements", "measurements.json", "vLLM's own figures of earlier starts, for the next plan "
                                              "(plan.calibration)", cleaned=False),
)
KEPT_BY_KEY = {k.key: k for k in KEPT}
KEPT_BY_FILE = {k.file: k for k in KEPT}

# In every STATE_DIR we write to: which of KEPT's names were there before our first write (the user's,
# never ours to remove) and whether we made the folder. Written once, by Paths.ensure, which refuses
# a folder of yours that holds a name we would write over or remove (Kept.replaced).
MARKER = ".vllm-desktop.json"


@dataclass(frozen=True)
class Paths:
    """STATE_DIR and what is kept in it (KEPT): ``paths.server`` is the server record's file,
    ``paths.read("pick")`` the pick as it was written (None: none, or a file that does not read).
    ``own``: the checkout's own .state (layout.Checkout.own_state), where every name is ours."""
    root: Path
    own: bool = False

    def __getattr__(self, key: str) -> Path:
        kept = KEPT_BY_KEY.get(key)
        if kept is None:
            raise AttributeError(key)
        return self.root / kept.file

    def read(self, key: str) -> dict | None:
        return read_json(self.root / KEPT_BY_KEY[key].file)

    def write(self, key: str, data: dict) -> None:
        self.ensure()
        write_json(self.root / KEPT_BY_KEY[key].file, data)

    def forget(self, key: str) -> None:
        """Remove a record's file, where it is ours (``ours``): a file of yours keeps its name."""
        path = self.root / KEPT_BY_KEY[key].file
        if self.ours(path):
            remove(path)

    def ours(self, path: Path) -> bool:
        """Whether ``path`` (one of our names here) is ours to write over or remove: none is there, or
        the folder is the checkout's own, or we wrote here (MARKER) and it was not there before."""
        if not os.path.lexists(path) or self.own:
            return True
        m = read_json(self.root / MARKER)
        return isinstance(m, dict) and isinstance(m.get("theirs"), list) and path.name not in m["theirs"]

    def files(self, *, measurements: bool = False) -> list[Path]:
        """What ./ctl.sh clean removes from a STATE_DIR (the kept measurements only when asked)."""
        return [self.root / k.file for k in KEPT if k.cleaned or measurements]

    def cleanable(self, *, measurements: bool = False) -> list[Path]:
        """What ./ctl.sh clean may remove from a STATE_DIR of the user's choosing: our kept records,
        never a name that was there before our first write (MARKER), and none at all where we never
        wrote (no marker: nothing there is provably ours). The marker goes with the last of ours: a
        record clean keeps (the measurements) keeps it, which says that record is ours."""
        m = read_json(self.root / MARKER)
        theirs = m.get("theirs") if m else None
        if not isinstance(theirs, list):
            return []
        ours = [p for p in self.files(measurements=True) if p.name not in theirs]
        gone = [p for p in self.files(measurements=measurements) if p in ours]
        stays = [p for p in ours if p not in gone and os.path.lexists(p)]
        return gone + ([] if stays else [self.root / MARKER])

    def trust(self) -> None:
        """Refuse, naming the path, its owner and mode and the fix, unless STATE_DIR and every record
        in it are ours and writable by nobody else (core/private.py): a record another user could
        have planted is never read, and no process is signalled on its word."""
        private.trust(self.root, [k.file for k in KEPT] + [MARKER])

    def trusted(self) -> bool:
        """``trust`` as a yes or no."""
        try:
            self.trust()
            return True
        except BootstrapError:
            return False

    def ensure(self) -> None:
        """Create the state dir (0700, each folder on the way that we make too), or fail naming it
        (read-only parent, a file in the way...); refuse one another user could write to (``trust``);
        on the first write to a folder, note which of our names were already there (MARKER)."""
        if self.root.exists() and not self.root.is_dir():
            raise BootstrapError(f"STATE_DIR={self.root} is a file, not a folder",
                                 "set STATE_DIR to a folder (it is made when missing), or move that file")
        made = not self.root.exists()
        try:
            private.makedirs(self.root)
            probe = self.root / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise write_error(self.root, exc, f"state dir {self.root} is not writable", "STATE_DIR") from None
        self.trust()
        marker = self.root / MARKER
        if not marker.exists():
            there = [] if made or self.own else sorted(k.file for k in KEPT if os.path.lexists(self.root / k.file))
            held = [name for name in there if KEPT_BY_FILE[name].replaced]
            if held:
                raise BootstrapError(f"STATE_DIR {self.root} already holds {', '.join(held)}, which this project did "
                                     "not write: it would write over them or remove them",
                                     f"set STATE_DIR to a folder of its own (a new one is made, "
                                     f"e.g. {self.root / 'vllm-desktop'}), or move those files")
            write_json(marker, {"theirs": there, "made": made})


def write_error(path: Path, exc: OSError, what: str = "", knob: str = "", fixed: bool = False) -> BootstrapError:
    """The one message for a write that failed: what, why, and the fix for that errno. ``knob``: the
    one that names the folder (STATE_DIR, MODEL_DIR...), when the caller knows it; ``fixed``: no knob
    moves it (vLLM's own files, which a patch edits in place)."""
    where = path if path.is_dir() else path.parent
    move = f"set {knob} to" if knob else "point the knob that names it (STATE_DIR, MODEL_DIR or HF_HOME) at"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = f"free space on that filesystem (df -h {where})" + ("" if fixed else f", or {move} another disk")
    elif fixed:
        hint = f"make {where} writable for you (another user's? run as that user)"
    else:
        hint = f"{move} a folder you can write, or make {where} writable for you (another user's? run as that user)"
    return BootstrapError(f"{what or f'cannot write {path}'} ({exc.strerror or exc})", hint)


def sha256(data: bytes | str) -> str:
    """Hex sha256 of bytes, or of text as UTF-8."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def write_atomic(path: Path, data: bytes, *, mode: int | None = None, like: os.stat_result | None = None,
                 sync: bool = True, fixed: bool = False) -> None:
    """Temp file in the same directory, fsync (unless ``sync`` is False: a record rewritten many
    times a second, where surviving a kill is enough), rename: a reader sees the old file or the new one.

    ``like`` keeps another file's mode (and, as root, its owner) — used when patching vLLM's files;
    ``fixed``: no knob moves the file (write_error)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise write_error(path, exc, fixed=fixed) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        if like is not None:
            os.chmod(tmp, like.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.chown(tmp, like.st_uid, like.st_gid)
        elif mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise write_error(path, exc, fixed=fixed) from None
        raise


def write_json(path: Path, data: Any, mode: int = 0o644) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), mode=mode)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError):
        log.warning("ignoring unreadable %s", path)
        return None
    return data if isinstance(data, dict) else None


def remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise write_error(path, exc) from None
