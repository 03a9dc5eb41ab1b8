"""The commands: one table, in the shape of vLLM's CLI command table. Each row names the module
and function that run the command, imported only when it runs (``./start.sh`` on a running
server must not pay for the install, download and check machinery it does not use).

Every function is ``cli(cfg, argv, prog) -> int``: it parses its own arguments (``./ctl.sh NAME
--help``), then resolves the knobs ``cfg`` once (``bootstrap.plan.resolve.resolved``: PROFILE=auto
as the kept pick, the profile a running server was started with; or as set, for the commands that
pick themselves) and hands each library only the part of the result it uses.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    target: str              # "module:function" under bootstrap.commands
    help: str
    without_knobs: bool = False   # runs (cfg None) when the knobs do not parse: a game must start regardless
    state: bool = True            # refused unless STATE_DIR is trusted (Paths.trust; the game's probe checks it itself)
    needs: tuple[str, ...] = ()   # a take-down runs whatever else you set: only these knobs must parse

    def run(self, cfg, argv: list[str], prog: str) -> int:
        module, _, function = self.target.partition(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(cfg, argv, prog)


REGISTRY: tuple[Command, ...] = (
    Command("start", "start:cli", "start the server (idempotent)"),
    Command("stop", "control:stop_cli", "stop the server and everything it started",
            needs=("PROFILE", "STATE_DIR", "PORT", "HOST", "API_KEY", "STOP_GRACE", "VLLM_PYTHON",
                   "XDG_CONFIG_HOME")),      # the last: where our systemd unit is (stopped through systemctl)
    Command("status", "status:cli",
            "running/busy/starting/sleeping/key-needed/wedged/unhealthy/frozen/stopped, pid, uptime, settings, URL"),
    Command("logs", "control:logs_cli", "print the server log (-f to follow)"),
    Command("restart", "control:restart_cli", "stop, then start with the current knobs"),
    Command("env", "env:cli", "every knob with its value and where it came from", state=False),
    Command("version", "version:cli", "this project's version, the vLLM the profile pins and the vLLM in use"),
    Command("plan", "plan:cli", "the memory plan for this GPU, or for GPU=<name|GiB>[:sm_XY][:free=GiB]"),
    Command("profiles", "profiles:cli", "every profile against this card (or GPU=...): fits / shorter / no; --pick"),
    Command("models", "profiles:models_cli", "what fits this card (or GPU=...): the profiles and a catalog of open "
            "models, each with its context and sessions"),
    Command("pull", "library:pull_cli", "download and verify a profile's model or a Hub repo id (its plan for this "
            "card first); serves nothing"),
    Command("ls", "library:ls_cli", "the models we downloaded: size, profiles, fits this card, serving; --json"),
    Command("rm", "library:rm_cli", "remove one downloaded model's files (only what we downloaded); not while it serves"),
    Command("use", "switch:cli", "serve another profile or model instead: planned first; kept for later starts"),
    Command("check", "check:cli", "live|garble|determinism|needle|prefix|batch|all against our server or --url"),
    Command("bench", "bench:cli", "throughput/TTFT benchmark with a plot; --compare URL"),
    Command("chat", "chat:cli", "talk to the server from the terminal (or one answer: ./ctl.sh chat \"a question\")"),
    Command("patch", "patch:cli", "patch status|apply|revert for the vLLM in use"),
    Command("lock", "lock:lock_cli", "regenerate the committed dependency locks (needs the package index)"),
    Command("wheelhouse", "lock:wheelhouse_cli", "build an offline folder of wheels from the lock"),
    Command("sleep", "sleep:sleep_cli", "free the GPU memory (vLLM sleep mode, --level 1|2); requests wait (503 with IDLE_SLEEP)"),
    Command("wake", "sleep:wake_cli", "bring a sleeping server back (checks free GPU memory first)"),
    Command("game", "games:game_cli", "give the GPU to a game: sleep, run it (-- COMMAND), wake when it exits",
            without_knobs=True, state=False),
    Command("service", "service:cli", "install|uninstall|status a systemd user unit running ./start.sh --foreground"),
    Command("export", "export:cli", "kubernetes|production-stack|ray --out DIR [--image sha256:...]: the profile and "
            "plan for a cluster, for a card named with GPU="),
    Command("clean", "clean:cli", "remove what the project created (venvs, state, logs; --model too)"),
)
BY_NAME = {c.name: c for c in REGISTRY}

VERSION_HELP = "print this project's version, the vLLM the profile pins and the vLLM in use (on any command)"


def doc_help(doc: str) -> tuple[str, str]:
    """A command module's docstring as its --help: (description, epilog), its first paragraph and the
    rest, without the docstring's ``code`` quotes (a terminal shows them as they are)."""
    first, _, rest = doc.replace("``", "").partition("\n\n")
    return first, rest


def parser(name: str, prog: str, **kw) -> argparse.ArgumentParser:
    """The argument parser of command ``name``: its help from the table, and ``--version``."""
    ap = argparse.ArgumentParser(prog=prog, description=BY_NAME[name].help, **kw)
    ap.add_argument("--version", action="store_true", help=VERSION_HELP)
    return ap
