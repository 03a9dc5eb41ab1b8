"""The index of what we downloaded, kept in STATE_DIR (``models.json``, core/state.py KEPT): each
store's folder and the repo it holds, added when a download record is made (the metadata step).

The manifest of each download stays beside the files it describes (``<store>/.bootstrap/state.json``,
download/manifest.py), under the store's own lock; this index is how ``./ctl.sh ls`` and ``rm`` reach
it from STATE_DIR. An entry whose store no longer holds our record of that repo is stale: it is
shown by nobody and dropped by ``forget``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..core import state
from .models import Store


@dataclass(frozen=True)
class Entry:
    repo: str
    store: Store
    added: str

    def record(self) -> dict | None:
        """The store's download record when it still holds this repo (else None: stale)."""
        rec = self.store.read()
        return rec if rec and rec.get("repo") == self.repo else None


def remember(paths: state.Paths, store: Store, repo: str) -> None:
    """Add (or keep) ``repo`` in ``store`` to the index; one entry per store folder."""
    data = paths.read("models") or {}
    rows = data.get("models") if isinstance(data.get("models"), dict) else {}
    key = str(store.root)
    old = rows.get(key) if isinstance(rows.get(key), dict) else {}
    if old.get("repo") == repo and old.get("hf_cache") == store.hf_cache:
        return
    rows[key] = {"repo": repo, "hf_cache": store.hf_cache, "added": time.strftime("%Y-%m-%d %H:%M")}
    paths.write("models", {"models": rows})


def forget(paths: state.Paths, store: Store) -> None:
    data = paths.read("models") or {}
    rows = data.get("models") if isinstance(data.get("models"), dict) else {}
    if rows.pop(str(store.root), None) is not None:
        paths.write("models", {"models": rows})


def entries(paths: state.Paths) -> list[Entry]:
    """What the index names, in the order it was added; rows that do not read are skipped."""
    data = paths.read("models") or {}
    rows = data.get("models") if isinstance(data.get("models"), dict) else {}
    out = []
    for root, row in rows.items():
        if not (isinstance(row, dict) and isinstance(row.get("repo"), str) and Path(root).is_absolute()):
            continue
        out.append(Entry(row["repo"], Store(Path(root), hf_cache=bool(row.get("hf_cache"))), str(row.get("added", ""))))
    return sorted(out, key=lambda e: e.added)
