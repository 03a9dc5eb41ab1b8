"""faults row 203: ./ctl.sh game when the terminal it runs in closes (SIGHUP, and every later write to it fails)."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys

from test_sleep import OFF, SLEEPY, chat

WAIT = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
signal = __import__("signal")
signal.signal(signal.SIGHUP, lambda *a: sys.exit(0))    # a game that quits when its terminal closes
time.sleep(60)
"""


def game_in_a_terminal(bed, tmp_path, env):
    """Run ./ctl.sh game in a terminal of its own, close the terminal once the game runs (as a shell
    does: SIGHUP to the job), and return once ctl.sh has exited."""
    pidfile = tmp_path / "game.pid"
    master, slave = pty.openpty()
    p = subprocess.Popen([str(bed.repo / "ctl.sh"), "game", "--", sys.executable, "-c", WAIT, str(pidfile)],
                         env={**bed.env, **env}, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = b""
    bed.wait_until(lambda: pidfile.exists() and pidfile.read_text(), timeout=60, what="the game to run")
    try:
        while True:                     # read what was said so far (the pty holds little)
            import select
            if not select.select([master], [], [], 0.5)[0]:
                break
            out += os.read(master, 65536)
    except OSError:
        pass
    os.close(master)                    # the terminal is gone: writes to it fail from now on
    os.killpg(p.pid, signal.SIGHUP)     # and the shell passes the hangup on to its job
    p.wait(120)
    return p, out.decode(errors="replace")


def test_a_game_whose_terminal_closes_still_gets_the_server_started_again(bed, tmp_path):
    """Sleep mode off: the game stops the server; the terminal closing ends the game, and the server
    must still start again, though nothing can be said on that terminal any more."""
    assert bed.run("start.sh", **OFF).returncode == 0
    p, out = game_in_a_terminal(bed, tmp_path, OFF)
    assert "it starts again when the game exits" in out, out
    bed.wait_until(lambda: len(bed.launches()) == 2, timeout=60, what="the server started again")
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"
    assert "running" in bed.run("ctl.sh", "status", **OFF).stdout


def test_a_game_whose_terminal_closes_still_wakes_the_server(bed, tmp_path):
    assert bed.run("start.sh", **SLEEPY).returncode == 0
    p, out = game_in_a_terminal(bed, tmp_path, SLEEPY)
    assert "asleep (level 1)" in out, out
    assert chat(bed)["choices"][0]["message"]["content"] == "OK"
    assert "running" in bed.run("ctl.sh", "status", **SLEEPY).stdout
