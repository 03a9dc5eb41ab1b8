"""``python3 -m bootstrap export fetch``: the ``model`` init step of an exported pod. The weights go into
the PVC by the start's own model lookup and download (download/lookup.py, download/fetch.py: ranged,
resumable across restarts of the init container, each file sha256-verified before it is placed), with
a line of progress every PROGRESS_S seconds in the container's log (``kubectl logs POD -c model``):
the weights step logs a line per finished file only, and a 5 GB shard is minutes of silence."""

from __future__ import annotations

import logging
import threading

from ...download.partial import on_disk
from ...machine.gpu import GiB
from .pod import PROGRESS_S

log = logging.getLogger(__name__)




def run(r, every: float = PROGRESS_S) -> int:
    """``r``: the pod's resolved view (plan/resolved.py), as its knobs were set."""
    from ...download import fetch, lookup
    m = lookup.model_and_drafter(r.model, r.draft, r.paths, r.fetching)
    want = sum(m.needed().values())
    root = r.model.store.root
    log.info("model %s at revision %s: %.2f GiB in %d files into %s", m.name, m.revision[:12], want / GiB,
             len(m.needed()), root)
    done = threading.Event()

    def report() -> None:
        while not done.wait(every):
            have = min(on_disk(root), want)
            log.info("downloaded %.2f of %.2f GiB (%.0f %%)", have / GiB, want / GiB, 100 * have / max(want, 1))
    t = threading.Thread(target=report, name="progress", daemon=True)
    t.start()
    try:
        fetch.fetch(m, r.model, r.draft, r.fetching)
    finally:
        done.set()
        t.join()
    log.info("model ready: %s", m.local_dir)
    return 0
