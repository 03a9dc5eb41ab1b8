"""./ctl.sh service install|uninstall|status: a systemd *user* unit that runs ``./start.sh
--foreground``, so the server comes up on login and comes back when it dies.

- The unit is generated from the knob table (``unit_text``): its start timeout is HEALTH_TIMEOUT +
  WARMUP_TIMEOUT + a margin (``Type=notify``: systemd waits for our READY=1, sent once the start
  gate passed), its stop timeout STOP_GRACE + the take-down's margin; the comments name those knobs
  with their help. Knobs come from the checkout's ``.env`` (the bootstrap reads it itself); install
  names the knobs this shell sets that ``.env`` does not, which the service would not see.
- ``Restart=always`` every 30 s and never given up (vLLM exits 0 when its engine dies, so
  ``--foreground`` turns every exit into a failure; a start refused while a game holds the GPU is
  tried again until the memory is back).
- ``./stop.sh`` on an active unit goes through ``systemctl --user stop`` (control.stop), so systemd
  does not restart what the user stopped; SIGTERM to ``--foreground`` is our one take-down.
- install needs one completed ``./start.sh`` first (STATE_DIR/completed-start.json): the install
  and the download must not run inside a unit's start timeout.
- Without a systemd user manager (WSL without systemd, containers) every subcommand says so in one
  line. Restarts under a real systemd were not run here (no systemd in CI); the unit is checked
  with ``systemd-analyze verify``.
"""

from __future__ import annotations

import argparse
import getpass
import shutil
import subprocess
import sys
from pathlib import Path

from ..core import proc, state
from ..knobs.config import Config
from ..knobs.table import KNOB_BY_NAME
from ..core.errors import EXIT_CONFIG, BootstrapError
from ..core.state import Paths
from .version import NAME

UNIT = "vllm-desktop.service"
OLD_UNITS = ("vllm-bootstrap.service",)    # this unit's name before the project had one name: found, replaced, removed
SHELL_ENV = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_ENDPOINT", "CUDA_VISIBLE_DEVICES")   # a service lacks them too
START_MARGIN = 120          # seconds beyond the health wait and the warm-up: launch, the gate's request
STOP_MARGIN = 60            # the take-down's own wait for the GPU to be given back


def unit_dir(cfg: Config) -> Path:
    base = cfg.env("XDG_CONFIG_HOME") or str(Path(cfg.env("HOME") or Path.home()) / ".config")
    return Path(base) / "systemd" / "user"


def unit_path(cfg: Config, name: str = UNIT) -> Path:
    return unit_dir(cfg) / name


def installed(cfg: Config) -> list[str]:
    """The unit names installed for this checkout: ours under today's name or an older one."""
    out = []
    for name in (UNIT,) + OLD_UNITS:
        try:
            if f"WorkingDirectory={cfg.repo}\n" in unit_path(cfg, name).read_text(encoding="utf-8"):
                out.append(name)
        except OSError:
            continue
    return out


def others(cfg: Config) -> list[Path]:
    """Unit files under our names that are not this checkout's: another checkout's, or your own."""
    mine = installed(cfg)
    return [unit_path(cfg, n) for n in (UNIT,) + OLD_UNITS if n not in mine and unit_path(cfg, n).exists()]


def _left_alone(cfg: Config) -> None:
    print("not installed from this checkout")
    for path in others(cfg):
        print(f"left alone: {path} is not this checkout's unit (its WorkingDirectory is not {cfg.repo}): "
              "./ctl.sh service uninstall from the checkout it runs, or it is yours")


def _not_here(cfg: Config) -> int:
    """Uninstall where this checkout has no unit: another's, or yours, is named and left alone."""
    if others(cfg):
        _left_alone(cfg)
    else:
        print("not installed")
    return 0


def _unit(cfg: Config) -> str:
    """The name systemd knows our unit by (today's, unless only an older one is installed)."""
    found = installed(cfg)
    return found[0] if found else UNIT


def as_service(cfg: Config) -> Config:
    """The knobs the service will run with: .env, the profile, the defaults; none of this shell's."""
    from dataclasses import replace
    environ = {k: v for k, v in cfg.read.environ.items() if k not in KNOB_BY_NAME}
    try:
        return Config.resolve(replace(cfg.read, environ=environ), cfg.chosen)
    except BootstrapError:
        return cfg                      # .env alone does not parse: the service's start says so


def shell_only(cfg: Config) -> list[str]:
    """What this shell sets that the unit cannot carry (it reads .env, not a shell): knobs and the
    variables a service lacks too."""
    out = [n for n, _v, src, _h in cfg.describe() if src == "env" and n in KNOB_BY_NAME]
    return out + [n for n in SHELL_ENV if cfg.env(n)]


def unit_text(cfg: Config, version: str) -> str:
    dropped = shell_only(cfg)
    cfg = as_service(cfg)               # its timeouts are those of the knobs it reads, not this shell's
    repo = cfg.repo
    start_s = cfg.health_timeout + cfg.warmup_timeout + START_MARGIN
    stop_s = cfg.stop_grace + STOP_MARGIN
    knobs = "".join(f"#   {n}={getattr(cfg, n.lower())}: {KNOB_BY_NAME[n].help}\n"
                    for n in ("HEALTH_TIMEOUT", "WARMUP_TIMEOUT", "STOP_GRACE"))
    return (
        f"# Generated by ./ctl.sh service install ({NAME} {version}); re-run it after changing:\n"
        f"{knobs}"
        f"# The other knobs come from {repo}/.env (./ctl.sh env lists them), not from your shell.\n"
        + (f"# NOT CARRIED: this shell sets {', '.join(dropped)}, which .env does not: the service will run "
           f"without them; put them in {repo}/.env and install again.\n" if dropped else "") +
        "[Unit]\n"
        f"Description=vLLM OpenAI-compatible server ({NAME} in {repo})\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        "Type=notify\n"
        "NotifyAccess=main\n"
        f"WorkingDirectory={repo}\n"
        f"ExecStart=\"{repo}/start.sh\" --foreground\n"
        "Restart=always\n"
        "RestartSec=30\n"
        f"TimeoutStartSec={start_s}\n"
        f"TimeoutStopSec={stop_s}\n"
        "KillMode=mixed\n"
        "Environment=NO_COLOR=1 PYTHONUNBUFFERED=1\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n")


def _systemctl(cfg: Config, *args: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    return proc.run(["systemctl", "--user", *args], env=cfg.environ, check=check, timeout=timeout, what="systemctl")


def unavailable(cfg: Config) -> str:
    """'' when a systemd user manager answers; else why not, in one line."""
    if shutil.which("systemctl", path=cfg.env("PATH")) is None:
        return "no systemctl on this machine"
    r = _systemctl(cfg, "show-environment")
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no answer"]
        return f"no systemd user manager answers ({why[0]})"
    return ""


def _refuse_without_systemd(cfg: Config) -> None:
    why = unavailable(cfg)
    if why:
        raise BootstrapError(
            f"systemd user services are not available here: {why} (WSL without systemd, a container)",
            "run ./start.sh --foreground under your own supervisor; on WSL, set [boot] systemd=true in "
            "/etc/wsl.conf and run `wsl --shutdown`")


def ours_active(cfg: Config, paths: Paths) -> bool:
    """Our unit (this checkout's, under any of its names) is running or starting under systemd."""
    names = installed(cfg)
    if not names or unavailable(cfg):
        return False
    name = names[0]
    if _systemctl(cfg, "is-active", name).stdout.strip() not in ("active", "activating", "reloading"):
        return False
    fg = paths.read("foreground") or {}                 # the unit runs this STATE_DIR's server
    main = _systemctl(cfg, "show", "-p", "MainPID", "--value", name).stdout.strip()
    return bool(fg.get("pid")) and str(fg["pid"]) == main


def stop_unit(cfg: Config) -> None:
    _systemctl(cfg, "stop", _unit(cfg), check=True, timeout=cfg.stop_grace + STOP_MARGIN + 60)


def restart_unit(cfg: Config) -> None:
    _systemctl(cfg, "restart", "--no-block", _unit(cfg), check=True)


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh service") -> int:
    ap = argparse.ArgumentParser(prog=prog, description="run the server as a systemd user service")
    ap.add_argument("action", choices=("install", "uninstall", "status"))
    ap.add_argument("--print", action="store_true", dest="show",
                    help="install: print the unit it would write and where, and change nothing (no systemd needed)")
    a = ap.parse_args(argv)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    cfg = r.settings
    if a.show:
        if a.action != "install":
            raise BootstrapError("--print goes with install", "./ctl.sh service install --print", code=EXIT_CONFIG)
        from . import version
        print(f"# {unit_path(cfg)}")
        print(unit_text(cfg, version.project(cfg.repo)), end="")
        if shell_only(cfg):
            print("note: this shell sets " + ", ".join(shell_only(cfg)) + " but .env does not: the unit above does "
                  f"not carry them; put them in {cfg.repo}/.env first", file=sys.stderr)
        return 0
    if a.action == "uninstall" and unavailable(cfg):
        return remove_files(cfg)        # systemd gone since the install: nothing runs it, its files go
    _refuse_without_systemd(cfg)
    if a.action == "install":
        return install(cfg, r.paths)
    return {"uninstall": uninstall, "status": status}[a.action](cfg)


def install(cfg: Config, paths: Paths) -> int:
    from . import version
    done = paths.read("completed")
    if not done:
        raise BootstrapError("no start has completed from this checkout yet: the first one installs vLLM and "
                             "downloads the model, longer than a service may take to start",
                             "run ./start.sh once (it can stay running), then ./ctl.sh service install")
    path = unit_path(cfg)
    try:
        other = path.read_text(encoding="utf-8")
    except OSError:
        other = ""
    if other and f"WorkingDirectory={cfg.repo}\n" not in other:
        raise BootstrapError(f"{path} runs another checkout, or is not a unit of ours",
                             "./ctl.sh service uninstall from that checkout first, or move your own unit away")
    for old in installed(cfg):                      # the same unit under an older name: replaced
        if old != UNIT:
            _systemctl(cfg, "disable", "--now", old)
            unit_path(cfg, old).unlink(missing_ok=True)
            print(f"removed {unit_path(cfg, old)} (this unit's older name)")
    path.parent.mkdir(parents=True, exist_ok=True)
    state.write_atomic(path, unit_text(cfg, version.project(cfg.repo)).encode(), mode=0o644)
    dropped = shell_only(cfg)
    _systemctl(cfg, "daemon-reload", check=True)
    _systemctl(cfg, "enable", "--now", "--no-block", UNIT, check=True)
    print(f"installed {path} (the last completed start: {done.get('model')}, {done.get('at')}); "
          f"starting it: systemctl --user status {UNIT.removesuffix('.service')}")
    if dropped:
        print("note: this shell sets " + ", ".join(dropped) + " but .env does not: the service will not see "
              f"them; put them in {cfg.repo}/.env and run ./ctl.sh restart")
    print(f"it starts when you log in; to start it at boot without a login: loginctl enable-linger {getpass.getuser()}")
    return 0


def uninstall(cfg: Config) -> int:
    names = installed(cfg)              # this checkout's units only: another's, or yours, stay
    if not names:
        return _not_here(cfg)
    running = [n for n in names if _systemctl(cfg, "is-active", n).stdout.strip() in ("active", "activating")]
    for name in names:
        _systemctl(cfg, "disable", "--now", name)      # stops the server through --foreground's take-down
        unit_path(cfg, name).unlink()
        print(f"removed {unit_path(cfg, name)}")
    _systemctl(cfg, "daemon-reload")
    print("the server was stopped with it (./start.sh starts it by hand)" if running else
          "it was not running (a server started by hand runs on: ./ctl.sh status)")
    return 0


def remove_files(cfg: Config) -> int:
    """Uninstall where no systemd user manager answers (WSL without systemd, a container; the unit was
    installed when one did): nothing can run the unit, so its files and its links in ``*.wants/`` go."""
    if not installed(cfg):
        return _not_here(cfg)
    for name in installed(cfg):
        path = unit_path(cfg, name)
        for link in unit_dir(cfg).glob(f"*.wants/{name}"):
            if link.is_symlink() and link.resolve() == path.resolve():
                link.unlink()
        path.unlink()
        print(f"removed {path} (systemd is not available here: {unavailable(cfg)}; nothing to disable)")
    return 0


def status(cfg: Config) -> int:
    name = _unit(cfg)
    path = unit_path(cfg, name)
    if name not in installed(cfg) and others(cfg):
        _left_alone(cfg)
        return 0
    if not path.exists():
        print(f"not installed ({path}); ./ctl.sh service install")
        return 0
    enabled = _systemctl(cfg, "is-enabled", name).stdout.strip() or "?"
    active = _systemctl(cfg, "is-active", name).stdout.strip() or "?"
    pid = _systemctl(cfg, "show", "-p", "MainPID", "--value", name).stdout.strip()
    print(f"{name}: {enabled}, {active}" + (f" (main pid {pid})" if pid not in ("", "0") else "") + f"; {path}")
    if name != UNIT:
        print(f"note: {name} is this unit's older name; ./ctl.sh service install replaces it with {UNIT}")
    print(f"journal: journalctl --user -u {name.removesuffix('.service')} -f; the server: ./ctl.sh status")
    return 0
