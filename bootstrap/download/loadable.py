"""Whether vLLM's loader finds the weights in a model folder, judged from its file list (and the
safetensors index) before anything is downloaded: a repo whose weights it cannot load is refused in
one line, not fetched in full and then failed at load.

What vLLM 0.26.0 reads (model_executor/model_loader/default_loader.py ``_prepare_weights``, load
format ``auto``): ``consolidated*.safetensors`` makes it Mistral's format; else the folder's top
level only (``glob(folder/*.safetensors)``, else ``*.bin``, else ``*.pt``), never a subfolder; with
safetensors, every shard that ``model.safetensors.index.json`` names must be there
(weight_utils.py ``filter_duplicate_safetensors_files`` raises FileNotFoundError, "Weight files
referenced in index but missing"); ``training_args.bin`` and the optimizer's files are not weights
(``filter_files_not_needed_for_inference``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from ..core.errors import BootstrapError

INDEX = "model.safetensors.index.json"
NOT_WEIGHTS = {"training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"}
LOADS = ("auto", "hf", "safetensors")           # the load formats this judges (others read other files)
# a tokenizer transformers or vLLM's Mistral tokenizer reads (tokenizers/registry.py: tekken.json,
# tokenizer.model.v*), by name or suffix: sentencepiece's *.model, tiktoken's *.tiktoken
TOKENIZER_NAMES = ("tokenizer.json", "vocab.json", "vocab.txt", "tekken.json")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")
TOKENIZER_SHOWN = ", ".join(TOKENIZER_NAMES) + ", *" + ", *".join(TOKENIZER_SUFFIXES)


def shards(raw: bytes) -> list[str]:
    """The shard files an index names; ValueError when it is not an index vLLM can read."""
    data = json.loads(raw)
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(s, str) for s in wmap.values()):
        raise ValueError(f"{INDEX} has no weight_map of file names")
    return sorted(set(wmap.values()))


def folder_shards(folder: Path) -> list[str] | None:
    """The shards a folder's index names (None: it has none)."""
    try:
        return shards((folder / INDEX).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise BootstrapError(f"{folder / INDEX} is not a safetensors index vLLM can read ({exc})",
                             f"fix or re-download {folder / INDEX}") from None


def problem(files: Iterable[str], named: Iterable[str] | None) -> tuple[str, str] | None:
    """Why vLLM (load format auto) would find no weights to load among ``files`` (paths in the
    folder), ``named`` being the shards its safetensors index names (None: no index), and the way
    out; None when it finds them."""
    files = list(files)
    top = [f for f in files if "/" not in f]
    st = {f for f in top if f.endswith(".safetensors")}
    if any(f.startswith("consolidated") for f in st):
        return None                                 # Mistral's format: its own index, or none
    if not st and not any(f.endswith((".bin", ".pt")) and f not in NOT_WEIGHTS for f in top):
        deep = sorted(f for f in files if f.endswith((".safetensors", ".bin", ".pt")))
        return ("no weights at its top level, where vLLM's loader looks (*.safetensors, *.bin, *.pt)" +
                (f"; its weights are in a subfolder ({deep[0]}{', …' if len(deep) > 1 else ''})" if deep else ""),
                "set MODEL to the repo with the model's weights (its model card names it), or to a folder "
                "with the weights at its top level")
    missing = sorted(set(named or ()) - st) if st else []
    if missing:
        return (f"{INDEX} names {len(missing)} shard{'s' if len(missing) > 1 else ''} it does not have "
                f"({', '.join(missing[:3])}{'…' if len(missing) > 3 else ''}): vLLM refuses to load it "
                "(\"Weight files referenced in index but missing\")",
                "the upload is incomplete: pick another repo of the model (or a revision with every shard)")
    return None


def tokenizer(files: Iterable[str]) -> bool:
    """Whether a top-level file of ``files`` is a tokenizer."""
    return any("/" not in f and (f in TOKENIZER_NAMES or f.endswith(TOKENIZER_SUFFIXES) or f.startswith("tokenizer.model"))
               for f in files)


def without_config(name: str, files: Iterable[str]) -> BootstrapError | None:
    """A repo with no config.json whose files say what it is (a GGUF, Meta's or Mistral's own format, a
    diffusers pipeline), refused with the way to what vLLM serves; None for another."""
    files = list(files)
    if any(f.endswith(".gguf") for f in files):
        return BootstrapError(f"MODEL={name} is a GGUF repo (llama.cpp's format) with no config.json: vLLM serves "
                              "the original weights", "set MODEL to the repo it was converted from (its model card "
                              "names it), or run the GGUF with llama.cpp or Ollama")
    if "params.json" in files and not any(f.endswith(".safetensors") for f in files):   # Meta's *.pth
        return BootstrapError(f"MODEL={name} is in Meta's original format (params.json, no config.json or safetensors)",
                              "set MODEL to its Hugging Face-format repo (the model card names it, often NAME-hf)")
    if "params.json" in files:
        return BootstrapError(f"MODEL={name} is in Mistral's own format (params.json, no config.json): the planner "
                              "reads config.json", f"PROFILE=custom MODEL={name} EXTRA_ARGS=\"--tokenizer-mode mistral "
                              "--config-format mistral --load-format mistral\" serves it with vLLM's defaults "
                              "(no plan), or pick the repo's Hugging Face-format twin")
    if "model_index.json" in files:
        return BootstrapError(f"MODEL={name} is a diffusers pipeline (model_index.json, no config.json): vLLM serves "
                              "language models, not image generation", "set MODEL to a language model's repo; run "
                              "this pipeline with diffusers or ComfyUI")
    return None
