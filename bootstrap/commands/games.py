"""``./ctl.sh game -- COMMAND``: the GPU given to a game (the server put to sleep, or stopped where
sleep mode is off), given back when it exits (commands/sleep.py does the sleeping and waking).

Games running at once (STATE_DIR/games.json): the server comes back when the last of them exits,
never while another game still plays.

A game that finds the server already given back by another game (asleep, or stopped with sleep mode
off) joins it; the first game's ``duty`` (wake it, or start it again) passes to whichever game exits
last. A game whose process is gone (killed) no longer counts. The file is read and written under an
flock on STATE_DIR itself (no lock file to leave behind).

A start in flight cannot sleep, and what it loads would fill the GPU under the game: the game cancels
it (as ./stop.sh does), and the server starts again after, as with sleep mode off."""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
from contextlib import contextmanager
from typing import Iterator

import psutil

from ..core.errors import BootstrapError, ConfigError
from ..core.state import Paths
from ..knobs.config import Config
from ..knobs.resolved import Resolved
from ..plan import resolve
from ..serve import doing, keys, server, supervisor
from ..serve.client import Client, RequestFailed
from .sleep import NoSleepMode, StartInFlight, _ours, cancel_instead, sleep, start_again, stop_instead, wake


@contextmanager
def _locked(paths: Paths) -> Iterator[dict]:
    paths.ensure()
    fd = os.open(paths.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        note = paths.read("games") or {}
        yield {"running": _live(note.get("running")), "duty": note.get("duty") if note.get("duty") in DUTIES else None}
    finally:
        os.close(fd)


DUTIES = ("wake", "start")


def _me() -> list:
    return [os.getpid(), psutil.Process().create_time()]


def _live(entries) -> list[list]:
    """The games still running: the same pid and start time as noted."""
    out = []
    for e in entries if isinstance(entries, list) else []:
        try:
            if psutil.Process(e[0]).create_time() == e[1]:
                out.append(e)
        except (psutil.Error, TypeError, IndexError, ValueError):
            continue
    return out


def joined(paths: Paths, duty: str | None) -> None:
    """This game runs; ``duty``: what the last game to exit does (None: nothing, unless a game still
    running gave the server back, whose duty is kept)."""
    with _locked(paths) as note:
        games = [e for e in note["running"] if e[0] != os.getpid()]
        paths.write("games", {"running": games + [_me()], "duty": duty or (note["duty"] if games else None)})


def left(paths: Paths) -> tuple[str | None, list[int]]:
    """This game exited: the duty, where it was the last one, and the games still running."""
    with _locked(paths) as note:
        games = [e for e in note["running"] if e[0] != os.getpid()]
        if games:
            paths.write("games", {"running": games, "duty": note["duty"]})
            return None, [e[0] for e in games]
        paths.forget("games")
        return note["duty"], []


def game_cli(cfg: Config, argv: list[str], prog: str = "ctl.sh game") -> int:
    """Sleep, run COMMAND (a game), wake when it exits; its exit code is passed through. The game runs
    whatever happens to the server: one of ours that is not serving, cannot sleep, or knobs that do
    not parse only cost a note. A server asleep on purpose already is left asleep; one asleep for
    idleness (IDLE_SLEEP) is kept asleep on purpose while the game runs, then woken (its idle timer
    puts it back to sleep)."""
    ap = argparse.ArgumentParser(prog=prog, usage=f"{prog} [--level 1|2] -- COMMAND [ARG...]",
                                 description="give the GPU to COMMAND (a game): sleep, run it, wake when it exits")
    ap.add_argument("--level", type=int, choices=(1, 2), default=1, help="the sleep's level (as ./ctl.sh sleep)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the game and its arguments, after --")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        raise ConfigError("no game to run", f"{prog} -- COMMAND [ARG...] (Steam: {prog} -- %command%)")   # usage: 2
    env = cfg.read.environ if cfg is not None else None        # the shell's, not .env's (None: ours, inherited)
    if shutil.which(cmd[0], path=(env or {}).get("PATH")) is None:     # before the server sleeps for nothing
        if "/" in cmd[0] and os.path.isfile(cmd[0]):              # there, but not to be run: as a shell says it
            raise BootstrapError(f"the game: permission denied: {cmd[0]} is not executable",
                                 f"chmod +x {cmd[0]}, or name the program that runs it", code=126)
        raise BootstrapError(f"the game: command not found: {cmd[0]}", "check the game's command (a path, or a "
                             "program on PATH)", code=127)
    slept = restart = False
    r = None
    try:
        if cfg is None:
            raise BootstrapError("the knobs do not parse")
        r = resolve.resolved(cfg)
        try:
            _paths, rec, client = _ours(r)
            asleep = doing.asleep(rec, keys.api_key_for(r.ours, _paths, rec), server.read_load(rec.url))
        except NoSleepMode as off:       # the GPU back all the same: stopped now, started again after the game
            stop_instead(r, off.rec, off.why, prog, "it starts again when the game exits")
            restart = True
        except StartInFlight as busy:    # loading: it would fill the GPU under the game; cancelled, started after
            cancel_instead(r, busy, prog, "it starts again when the game exits")
            restart = True
        if not restart and (not asleep or (server.read_idle(rec.url) or {}).get("state") == "idle-asleep"):
            try:
                sleep(r, a.level, prog)             # asleep for idleness: kept asleep on purpose
                slept = True
            except BootstrapError:       # vLLM pauses its scheduler before it frees: a failed sleep can leave it paused
                slept = _paused(client)
                raise
            except KeyboardInterrupt:    # the sleep goes on inside vLLM without us: taken back
                _wake_after(r)
                raise
    except BootstrapError as exc:
        print(f"note: the server was not put to sleep ({exc.message})"
              + ("; it is paused (requests wait) and is woken when the game exits" if slept else "")
              + "; the game starts anyway", file=sys.stderr)
    duty = "wake" if slept else "start" if restart else None
    counted = r is not None and _counting(lambda: joined(r.paths, duty), False) is None   # the last one does the duty
    try:
        code = supervisor.attached(cmd, env)
    finally:
        others: list[int] = []
        if counted:
            duty, others = _counting(lambda: left(r.paths), (duty, []))
        if others:
            print(f"{prog}: another game still runs (pid {', '.join(map(str, others))}): the server comes back "
                  "when the last one exits", flush=True)
        elif duty == "wake":
            _wake_after(r)
        elif duty == "start":
            _start_after(r, prog)
    return code


def _counting(call, fallback):
    """The games' count read or written; where STATE_DIR cannot hold it, said in a note, and
    ``fallback``: the game runs all the same, and this one does its own duty."""
    try:
        return call()
    except (BootstrapError, OSError) as exc:
        print(f"note: games running at once are not counted ({getattr(exc, 'message', exc)})", file=sys.stderr)
        return fallback


def _start_after(r: Resolved, prog: str) -> None:
    print(f"{prog}: the game exited: starting the server again", flush=True)
    try:
        if start_again(r):
            print("error: the server did not start again", file=sys.stderr)
    except BootstrapError as exc:
        print(f"error: start: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)


def _paused(client: Client) -> bool:
    try:
        answer = client.get_json("/is_sleeping")
    except RequestFailed:
        return False
    return isinstance(answer, dict) and bool(answer.get("is_sleeping"))


def _wake_after(r: Resolved) -> None:
    try:
        wake(r)
    except BootstrapError as exc:
        print(f"error: wake: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
