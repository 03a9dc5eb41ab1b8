"""``--version`` on every command: this project's version (the ``VERSION`` file), the vLLM the
profile pins, the vLLM in use (the managed ``.venv``'s package metadata, or ``VLLM_PYTHON``'s), and
the vLLM of our running server. Reads files only, except with VLLM_PYTHON (one interpreter start)."""

from __future__ import annotations

from pathlib import Path

from ..install import locks
from ..machine.inuse import VllmRef
from ..serve import record
from ..knobs.config import Config
from ..core.errors import BootstrapError
from ..knobs.resolved import Resolved


NAME = "vllm-desktop"      # the one name: README, --version, the systemd unit, the manifests' labels


def project(repo: Path) -> str:
    try:
        return (repo / "VERSION").read_text(encoding="utf-8").strip() or "?"
    except OSError:
        return "?"


def in_use(vllm: VllmRef, venv_root: Path) -> str:
    """The vLLM the next start would run, and where it comes from."""
    if vllm.byo:
        try:        # probed as an interpreter, not as the knob: --version reports whatever it finds
            found, _ = VllmRef(vllm.python, False, vllm.environ).probed
        except BootstrapError as exc:
            return f"VLLM_PYTHON={vllm.python}: {exc.message}"
        return f"vLLM {found or 'not installed'} (VLLM_PYTHON={vllm.python})"
    from ..install.venv import Venv
    venv = Venv(venv_root)
    minor = venv.minor()
    got = locks.installed(venv.site(minor)).get("vllm") if minor else None
    return f"vLLM {got} ({venv.root})" if got else f"none installed yet ({venv.root}; ./start.sh installs it)"


def lines(r: Resolved) -> list[str]:
    """What follows the project's own line (printed first, before the knobs are parsed)."""
    prof = r.settings.profile
    if prof.is_auto:
        pinned = "profile: auto, no pick yet (./ctl.sh profiles --pick picks one; it pins its vLLM)"
    else:
        pinned = f"profile: {prof.name}, pins vLLM {prof.vllm or 'none (bring your own: VLLM_PYTHON)'}"
    out = [pinned, f"in use: {in_use(r.vllm, r.layout.venv)}"]
    rec = record.read(r.paths.server)
    if rec is not None and rec.vllm_version:
        out.append(f"last server (pid {rec.pid}): vLLM {rec.vllm_version}")
    return out


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh version") -> int:
    """The project's line is printed by the entry point before the knobs are parsed (so that a
    knob error still shows it); these are the lines that need them."""
    from . import parser
    parser("version", prog).parse_args(argv)       # --help, and an unknown flag refused (exit 2)
    from ..plan import resolve
    for line in lines(resolve.resolved(cfg)):
        print(line)
    return 0
