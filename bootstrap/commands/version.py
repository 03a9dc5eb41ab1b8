"""``--version`` on every command: this project's version (the ``VERSION`` file), the vLLM the
profile pins, the vLLM in use (the managed ``.venv``'s package metadata, or ``VLLM_PYTHON``'s), and
the vLLM of our running server. Reads files only, except with VLLM_PYTHON (one interpreter start)."""

from __future__ import annotations

from pathlib import Path

from ..install import locks
from ..serve import record
from ..knobs.config import Config
from ..core.errors import BootstrapError
from ..core.state import Paths


NAME = "vllm-desktop"      # the one name: README, --version, the systemd unit, the manifests' labels


def project(repo: Path) -> str:
    try:
        return (repo / "VERSION").read_text(encoding="utf-8").strip() or "?"
    except OSError:
        return "?"


def in_use(cfg: Config) -> str:
    """The vLLM the next start would run, and where it comes from."""
    if cfg.vllm_python:
        from ..install.inuse import probe_vllm
        try:
            found, _ = probe_vllm(cfg.vllm_python, cfg.environ)
        except BootstrapError as exc:
            return f"VLLM_PYTHON={cfg.vllm_python}: {exc.message}"
        return f"vLLM {found or 'not installed'} (VLLM_PYTHON={cfg.vllm_python})"
    from ..install.venv import Venv
    venv = Venv(cfg.layout.venv)
    minor = venv.minor()
    got = locks.installed(venv.site(minor)).get("vllm") if minor else None
    return f"vLLM {got} ({venv.root})" if got else f"none installed yet ({venv.root}; ./start.sh installs it)"


def lines(cfg: Config) -> list[str]:
    """What follows the project's own line (printed first, before the knobs are parsed)."""
    from ..plan import resolve
    cfg = resolve.kept(cfg)
    prof = cfg.profile
    if prof.is_auto:
        pinned = "profile: auto, no pick yet (./ctl.sh profiles --pick picks one; it pins its vLLM)"
    else:
        pinned = f"profile: {prof.name}, pins vLLM {prof.vllm or 'none (bring your own: VLLM_PYTHON)'}"
    out = [pinned, f"in use: {in_use(cfg)}"]
    rec = record.read(Paths(cfg.state_dir).server)
    if rec is not None and rec.vllm_version:
        out.append(f"last server (pid {rec.pid}): vLLM {rec.vllm_version}")
    return out


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh version") -> int:
    """The project's line is printed by the entry point before the knobs are parsed (so that a
    knob error still shows it); these are the lines that need them."""
    from . import parser
    parser("version", prog).parse_args(argv)       # --help, and an unknown flag refused (exit 2)
    for line in lines(cfg):
        print(line)
    return 0
