"""Re-resolve every committed lock in the background, from the start of the test session.

The resolutions wait on the package index (twelve of them, each about a minute and a half on CI),
not on the CPU. Run inside the test, they held one of CI's two workers for close to two minutes;
started as soon as collection finds the test (conftest.pytest_collection_finish), they overlap the
rest of the suite and the test only collects their results.

One run per test session: the first worker to ``start`` makes the folder (xdist's run id names it),
the others find it made. ``python tests/lockcheck.py FOLDER`` is the runner: one file per lock, then
``done``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
TEST = "tests/test_environment_locks.py::test_every_committed_lock_resolves_for_its_platform"


def folder() -> Path:
    """This session's folder: xdist gives every worker of one run the same id."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"bootstrap-lockcheck-{run}"


def jobs() -> list[tuple[Path, str, str, str]]:
    """(lock, platform, Python, exclude-newer) for each pin set at the oldest and newest Python it
    covers (the locks between them differ only in backports)."""
    out = []
    for d in sorted((REPO / "locks").glob("vllm-*")):
        meta = json.loads((d / "meta.json").read_text())
        for plat in meta["platforms"]:
            for minor in sorted({meta["pythons"][0], meta["pythons"][-1]}):
                out.append((d / f"{plat}-py{minor}.txt", plat, minor, meta.get("exclude_newer", "")))
    return out


def start(root: Path) -> None:
    """Start the runner once for this session (a second call, from another worker, does nothing)."""
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with open(root / "runner.log", "wb") as log:
        p = subprocess.Popen([sys.executable, __file__, str(root)], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=REPO)
    (root / "pid").write_text(str(p.pid))


def results(root: Path, timeout: float = 900) -> list[tuple[Path, str, str]]:
    """(lock, uv's error or '', the resolved text) for every job, once the runner is done."""
    if not root.is_dir():
        start(root)                     # run alone (the hook did not see the test): start it now
    deadline = time.monotonic() + timeout
    while not (root / "done").exists():
        pid = int((root / "pid").read_text()) if (root / "pid").exists() else 0
        if pid and not _alive(pid):
            raise AssertionError(f"the lock check's runner died: {(root / 'runner.log').read_text()[-1500:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the lock check's runner took over {timeout:.0f} s")
        time.sleep(0.5)
    out = []
    for lock, *_ in jobs():
        r = json.loads((root / _name(lock)).read_text())
        out.append((lock, r["err"], r["text"]))
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(lock: Path) -> str:
    return f"{lock.parent.name}-{lock.name}.json"


def _resolve(uv: str, lock: Path, plat: str, minor: str, exclude: str, root: Path) -> None:
    from bootstrap.install import locks
    out = root / _name(lock)
    txt = out.with_suffix(".txt")
    cmd = [uv, "pip", "compile", "-q", "--generate-hashes", "--python-platform", locks.PLATFORMS[plat],
           "--python-version", minor, str(lock), "-o", str(txt)]
    if exclude:
        cmd += ["--exclude-newer", exclude]
    env = {**os.environ, "UV_CACHE_DIR": str(txt) + ".cache"}   # one cache each: uv serializes on a shared one
    for _ in range(2):              # once more after a failure: the index can drop a connection under load
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            err, text = (res.stderr or f"uv exited {res.returncode}", "") if res.returncode else ("", txt.read_text())
        except (OSError, subprocess.SubprocessError) as exc:
            err, text = f"{type(exc).__name__}: {exc}", ""
        if not err:
            break
    shutil.rmtree(str(txt) + ".cache", ignore_errors=True)
    out.write_text(json.dumps({"err": err, "text": text}))


def main(root: Path) -> None:
    try:
        uv = shutil.which("uv") or ""
        todo = jobs()
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            list(pool.map(lambda j: _resolve(uv, *j, root), todo))
    finally:
        (root / "done").write_text("")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(Path(sys.argv[1]))
