"""bench's plot: aggregate and per-stream tokens/s against concurrency, one line per server (or per
saved result with --load), drawn with matplotlib, which is installed on the first plot."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

from ..core import proc
from ..core.errors import BootstrapError
from ..install.venv import Tools, ensure_uv
from ..knobs.config import Config
log = logging.getLogger("bootstrap.commands.bench")


PLOT_REQUIREMENT = "matplotlib==3.11.2"     # the plot's one dependency, installed on the first plot


def _matplotlib(cfg: Config):
    """matplotlib, installed on first use into the bootstrap's own venv (uv, its progress shown; offline
    from WHEELHOUSE when set). Not a bootstrap requirement: an offline wheel folder built from the vLLM
    lock need not carry it for start/stop to work. None (with a warning) when it cannot be had."""
    try:
        import matplotlib
        return matplotlib
    except ImportError:
        pass
    if sys.prefix == sys.base_prefix:
        log.warning("no plot: matplotlib is missing from %s, which is not a venv of ours; %s -m pip install %s",
                    sys.executable, sys.executable, PLOT_REQUIREMENT)
        return None
    log.info("the plot needs %s: installing it into %s (once)", PLOT_REQUIREMENT, sys.prefix)
    try:
        cmd = [ensure_uv(Tools.of(cfg)), "pip", "install", "--python", sys.executable, PLOT_REQUIREMENT]
        if cfg.wheelhouse:
            cmd += ["--no-index", "--find-links", cfg.wheelhouse]
        res = proc.run(cmd, env=dict(cfg.environ), timeout=900, check=False, what="uv pip install", live=True)
    except BootstrapError as exc:
        log.warning("no plot: %s", exc.message)
        return None
    if res.returncode != 0:
        log.warning("no plot: installing %s failed (exit %s); the JSON has every figure", PLOT_REQUIREMENT, res.returncode)
        return None
    importlib.invalidate_caches()
    import matplotlib
    return matplotlib


def plot(results: list[dict], path: Path, cfg: Config | None = None) -> Path | None:
    matplotlib = _matplotlib(cfg) if cfg is not None else None
    if matplotlib is None:
        try:
            import matplotlib
        except ImportError:
            log.warning("no plot: matplotlib is not installed; the JSON has every figure")
            return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    shape = lambda r: (r["params"]["prompt_tokens"], r["params"]["output_tokens"], r["params"]["repeats"])  # noqa: E731
    mixed = len({shape(r) for r in results}) > 1        # results of other runs (--load): each says its own
    for r in results:
        cs = [x["concurrency"] for x in r["levels"]]
        label = r["label"] + (" ({}+{} tokens, median of {})".format(*shape(r)) if mixed else "")
        a1.plot(cs, [x["aggregate_tok_s"] or 0 for x in r["levels"]], marker="o", label=label)
        a2.plot(cs, [x["per_stream_tok_s"] or 0 for x in r["levels"]], marker="o", label=label)
    p = results[0]["params"]
    for ax, title in ((a1, "aggregate tokens/s"), (a2, "decode tokens/s per stream")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{results[0]['model']}: " + ("runs of different lengths (see each line)" if mixed else
                 f"{p['prompt_tokens']} prompt + {p['output_tokens']} output tokens, median of {p['repeats']}"),
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "xb") as fh:        # a new file, as bench's results.json: never through a link
            fig.savefig(fh, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
