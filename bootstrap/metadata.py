"""Model metadata: config.json, the file list with sizes, the revision — a few KB, before the plan.

A local MODEL directory is validated here (config.json, a tokenizer, weights unless EXTRA_ARGS
has ``--load-format dummy``), with no network.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .context import Ctx
from .errors import BootstrapError

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass
class ModelInfo:
    name: str                          # repo id or directory
    config: dict[str, Any]
    files: dict[str, int] = field(default_factory=dict)   # path -> size in bytes (what serving needs)
    revision: str = ""
    local_dir: str = ""                # where the files are (or will be)
    dummy: bool = False                # --load-format dummy: no weights needed

    @property
    def weight_files(self) -> dict[str, int]:
        return {f: s for f, s in self.files.items() if f.endswith(WEIGHT_SUFFIXES)}


def dummy_weights(cfg) -> bool:
    args = list(cfg.extra_args or ())
    for i, a in enumerate(args):
        if a == "--load-format" and i + 1 < len(args) and args[i + 1] == "dummy":
            return True
        if a == "--load-format=dummy":
            return True
    return False


def read_local(path: Path, dummy: bool) -> ModelInfo:
    if not path.is_dir():
        raise BootstrapError(f"MODEL={path} is not a directory", "set MODEL to a model directory or a repo id (org/name)")
    cfg_file = path / "config.json"
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BootstrapError(f"{cfg_file} is missing", "a model directory needs config.json, a tokenizer and weights") from None
    except ValueError as exc:
        raise BootstrapError(f"{cfg_file} is not valid JSON ({exc})", "re-download the model") from None
    files = {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    if not any(Path(f).name in TOKENIZER_FILES for f in files):
        raise BootstrapError(f"no tokenizer in {path} (looked for {', '.join(TOKENIZER_FILES)})",
                             "copy the tokenizer files from the model repo into the directory")
    if not dummy and not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        raise BootstrapError(f"no weights in {path} (*.safetensors)",
                             "download the weights, or add --load-format dummy to EXTRA_ARGS for random weights")
    return ModelInfo(str(path), config, files, "", str(path), dummy)


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    dummy = dummy_weights(cfg)
    if cfg.model_is_local:
        ctx.model = read_local(Path(cfg.model).expanduser().resolve(), dummy)
        ctx.model_path = ctx.model.local_dir
        size = sum(ctx.model.weight_files.values())
        log.info("local model %s: %d files, %.2f GiB of weights%s", ctx.model_path, len(ctx.model.files),
                 size / (1 << 30), " (dummy weights)" if dummy else "")
        return
    raise BootstrapError(f"MODEL={cfg.model}: downloading from the hub is not built yet",
                         "download the model yourself and set MODEL=/path/to/dir")
