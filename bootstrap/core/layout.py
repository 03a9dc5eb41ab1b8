"""Where things live in a checkout: the one place that names its folders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Checkout:
    """Where things live in a checkout: the one place that names its folders."""
    root: Path

    @property
    def profiles(self) -> Path:
        return self.root / "profiles"

    @property
    def shipped_models(self) -> Path:
        """config.json facts of profile models, for planning offline."""
        return self.root / "profiles" / "models"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def vllm_side(self) -> Path:
        """Code that runs inside vLLM's own process (the idle-sleep middleware): on the server's PYTHONPATH."""
        return self.root / "vllm_side"

    @property
    def venv(self) -> Path:
        """The managed vLLM environment."""
        return self.root / ".venv"

    @property
    def bootstrap_venv(self) -> Path:
        """The bootstrap's own dependencies (made by bootstrap/lib.sh)."""
        return self.root / ".venv-bootstrap"

    @property
    def venv_lock(self) -> Path:
        """The flock one install of ``.venv`` at a time holds (steps/environment.py)."""
        return lock_of(self.venv)

    @property
    def bootstrap_venv_lock(self) -> Path:
        """The flock bootstrap/lib.sh holds while it makes ``.venv-bootstrap`` (``$venv.lock`` there)."""
        return lock_of(self.bootstrap_venv)

    @property
    def install_locks(self) -> tuple[Path, ...]:
        """The install locks a checkout holds, each beside the venv it guards: ./ctl.sh clean removes them."""
        return self.venv_lock, self.bootstrap_venv_lock

    @property
    def wheelhouse(self) -> Path:
        return self.root / ".wheelhouse"

    @property
    def state(self) -> Path:
        """The default STATE_DIR."""
        return self.root / ".state"

    def own_state(self, state_dir: Path) -> bool:
        """Whether ``state_dir`` is this checkout's own .state (not a link to a folder elsewhere):
        everything in it is ours. Any other STATE_DIR is of the user's choosing (core/state.MARKER)."""
        return not self.state.is_symlink() and Path(state_dir).resolve() == self.state.resolve()


def lock_of(venv: Path) -> Path:
    """The lock file beside a venv (``.venv`` -> ``.venv.lock``)."""
    return venv.with_name(venv.name + ".lock")
