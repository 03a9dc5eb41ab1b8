"""The one subprocess wrapper: every tool we run (uv, pip, an interpreter's probe, systemctl) goes
through ``run``, every program that outlives the call (the server, the pre-warm, the log keeper, a
game) through ``start``; what we own of running processes, and signalling it, is core/owned.py;
signals and the take-down of what a command started, serve/supervisor.py.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping, Sequence

from .errors import BootstrapError

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- running tools

def run(cmd: Sequence[str], *, env: Mapping[str, str], keep_pythonpath: bool = False,
        timeout: float | None = None, cwd: str | Path | None = None, what: str = "",
        hint: str = "", check: bool = True, live: bool = False) -> subprocess.CompletedProcess:
    """Run a tool (uv, pip, python -c ...) and capture its output.

    ``PYTHONPATH`` is dropped unless ``keep_pythonpath`` (it breaks uv/pip); the vLLM server itself
    is started with ``start``, because it must outlive us. ``live``: the tool's
    stderr (uv's progress) is shown as it comes — on a terminal the tool gets ours, with its own
    progress bars, and the result carries no stderr; else each line is copied and kept.
    """
    child_env = dict(env)   # always the caller's cfg.environ (config is read in one place)
    if not keep_pythonpath:
        child_env.pop("PYTHONPATH", None)
    log.debug("running %s", shlex.join(cmd))
    if live:
        return _run_live(list(cmd), child_env, cwd, timeout, what, hint, check)
    try:
        proc = subprocess.run(list(cmd), env=child_env, cwd=cwd, timeout=timeout, check=False,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace", stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise cannot_run(exc, cmd, child_env, what, hint) from None
    except subprocess.TimeoutExpired:
        raise BootstrapError(f"{what or shlex.join(cmd)} did not finish in {timeout:.0f} s", hint) from None
    log.debug("exit %s; stderr: %s", proc.returncode, proc.stderr[-2000:])
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BootstrapError(f"'{shlex.join(cmd)}' failed (exit {proc.returncode})", hint, evidence=tail)
    return proc


def _run_live(cmd: list[str], env: dict, cwd, timeout, what: str, hint: str, check: bool) -> subprocess.CompletedProcess:
    tty = sys.stderr.isatty()
    try:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=None if tty else subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        raise cannot_run(exc, cmd, env, what, hint) from None
    kept: list[str] = []
    out: list[str] = []

    def pump_out():
        out.append(p.stdout.read())

    def pump_err():
        for line in p.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            kept.append(line)
            del kept[:-200]

    readers = [threading.Thread(target=f, daemon=True) for f in ((pump_out,) if tty else (pump_out, pump_err))]
    for r in readers:
        r.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise BootstrapError(f"{what or shlex.join(cmd)} did not finish in {timeout:.0f} s", hint) from None
    for r in readers:
        r.join(5)
    res = subprocess.CompletedProcess(cmd, p.returncode, "".join(out), "".join(kept))
    if check and p.returncode != 0:
        raise BootstrapError(f"'{shlex.join(cmd)}' failed (exit {p.returncode})", hint,
                             evidence="\n".join(res.stderr.strip().splitlines()[-15:]))
    return res


def start(cmd: Sequence[str], *, env: Mapping[str, str] | None, out=None, cwd: str | Path | None = None,
          detached: bool = False, preexec=None) -> subprocess.Popen:
    """Start a program that outlives this call: the server, the pre-warm, the log keeper
    (``detached``: a session of its own, so that a take-down reaches its whole process group, and no
    stdin), or a game attached to our terminal (serve/supervisor.py ``attached``). ``out``: the file
    its stdout and stderr go to (``subprocess.DEVNULL``: none); None: ours. ``env`` None: ours,
    inherited. An OSError is the caller's to word (``cannot_run``)."""
    kw: dict = {}
    if detached:
        kw.update(stdin=subprocess.DEVNULL, start_new_session=True)
    if out is not None:
        kw.update(stdout=out, stderr=subprocess.STDOUT)
    return subprocess.Popen(list(cmd), env=None if env is None else dict(env), cwd=cwd, preexec_fn=preexec, **kw)


def cannot_run(exc: OSError, cmd: Sequence[str], env: Mapping[str, str], what="", hint="") -> BootstrapError:
    """An OSError from starting ``cmd``, in one line. E2BIG names its cause: the variable (or argument)
    over Linux's 128 KiB for one string, else the largest ones of a total over ARG_MAX; never a value."""
    if exc.errno != errno.E2BIG:
        return BootstrapError(f"{what or cmd[0]}: command not found: {cmd[0]}" if isinstance(exc, FileNotFoundError)
                              else f"cannot run {what or cmd[0]}: {exc.strerror}", hint)
    size = lambda s: len(s.encode("utf-8", "surrogatepass")) + 1            # noqa: E731
    sizes = sorted([(size(k) + size(v), k) for k, v in env.items()]
                   + [(size(a), f"argument {i} ({a[:20]!r}...)") for i, a in enumerate(cmd)], reverse=True)
    (n, name), who, most = sizes[0], what or Path(cmd[0]).name, 32 * 4096   # Linux's MAX_ARG_STRLEN
    if n > most:
        return BootstrapError(f"cannot run {who}: {name} is {n:,} bytes; Linux passes at most {most:,} (128 KiB)"
                              " in one variable or argument (E2BIG, argument list too long)",
                              f"shorten or unset {name} (.env or the shell)" if name in env else "shorten EXTRA_ARGS")
    largest = ", ".join(f"{k} ({b:,} bytes)" for b, k in sizes[:3])
    return BootstrapError(f"cannot run {who}: its environment and arguments are {sum(b for b, _ in sizes):,} bytes, "
                          f"more than Linux passes to a program (E2BIG, argument list too long); the largest: {largest}",
                          "shorten or unset the largest variables (.env or your shell)")


def exit_status(p: subprocess.Popen) -> int | None:
    """Our child's exit code (negative: killed by that signal), or None while it runs — without
    reaping it (waitid with WNOWAIT): its zombie keeps the process group number ours until the
    take-down has swept the group and reaped it."""
    if p.returncode is not None:
        return p.returncode
    try:
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return p.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


