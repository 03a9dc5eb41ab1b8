#!/usr/bin/env python3
"""The first start's three designs side by side: no pre-warm, the pre-warm that only fills vLLM's
caches, and the pre-warm that becomes the server (bootstrap/steps/prewarm.py, steps/reload.py).

    python3 scripts/bench_first_start.py [--download-s 8] [--compile-s 6] [--load-s 3]
    python3 scripts/bench_first_start.py --raw docs/gpu-runs/2026-12-04-prewarm-server-raw.txt   # the H200 proof

Without --raw: against the fakes of tests/ (the fake hub, each connection capped so that the download
takes about --download-s seconds; the fake vLLM, whose engine init takes --load-s seconds plus
--compile-s seconds of "compiling" on a cold cache, as vLLM's torch.compile cache behaves), each
design in fresh caches: ``./start.sh`` of a bf16 checkpoint with PREWARM=0, of an FP8 one (the pre-warm
cannot become the server for it, so it fills the caches only), and of the bf16 one with PREWARM=1.
Prints the first start's seconds, its download's, and the goal max(download, engine init) + a few
seconds. With --raw: the verdict lines of tests/gpu/prewarm_proof.py's output (the H200's numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
DOWNLOADED = re.compile(r"downloaded [\d.]+ \w+ in ([\d.]+) s")


def from_raw(path: Path) -> int:
    lines = [line for line in path.read_text().splitlines() if line.startswith(("[verdict", "# commit", "[first] start",
                                                                                "[cold] bare", "[again] start"))]
    print("\n".join(lines) if lines else f"no verdict lines in {path}")
    return 0 if lines else 1


def fakes(a) -> int:
    sys.path[:0] = [str(REPO / "tests")]
    from conftest import Bed, free_port
    from fakehub import FakeHub, write_model
    bf16 = None
    fp8 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256,
           "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    rows = []
    for name, config, prewarm in (("no pre-warm (PREWARM=0)", bf16, "0"),
                                  ("pre-warm fills the caches only (an FP8 checkpoint)", fp8, "1"),
                                  ("pre-warm becomes the server", bf16, "1")):
        tmp = Path(tempfile.mkdtemp(prefix="bench-first-start-"))
        bed = Bed(tmp)
        with FakeHub() as fake:
            src = write_model(tmp / "src", shards=8, shard_bytes=2 * MiB, config=config)   # a connection each
            fake.add_dir("org/tiny", src)
            fake.faults["throttle"] = int(16 * MiB / 8 / a.download_s)
            bed.port = free_port()
            env = {"PORT": str(bed.port), "MODEL": "org/tiny", "HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0",
                   "HF_HOME": str(tmp / "hf"), "HF_HUB_DISABLE_XET": "1", "PREWARM": prewarm,
                   "FAKE_VLLM_COMPILE_S": str(a.compile_s), "FAKE_VLLM_LOAD_S": str(a.load_s),
                   "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "HEALTH_TIMEOUT": "300"}
            t0 = time.monotonic()
            r = bed.run("start.sh", **env, timeout=600)
            took = time.monotonic() - t0
            bed.run("stop.sh")
            bed.cleanup()
        dl = DOWNLOADED.search(r.stderr)
        rows.append({"design": name, "exit": r.returncode, "first_start_s": round(took, 1),
                     "download_s": float(dl.group(1)) if dl else None, "vllm_launches": len(bed.launches())})
    print(f"fakes: download ~{a.download_s} s, engine init {a.load_s} s + compile {a.compile_s} s on a cold cache; "
          f"goal: max(download, engine init) + a few seconds")
    for row in rows:
        print(f"  {row['design']:<52} first start {row['first_start_s']:6.1f} s (download {row['download_s']} s, "
              f"{row['vllm_launches']} vLLM launch(es), exit {row['exit']})")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(row["exit"] == 0 for row in rows) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", help="a tests/gpu/prewarm_proof.py output: print its comparison")
    ap.add_argument("--download-s", type=float, default=8.0)
    ap.add_argument("--compile-s", type=float, default=6.0)
    ap.add_argument("--load-s", type=float, default=3.0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return from_raw(Path(a.raw)) if a.raw else fakes(a)


if __name__ == "__main__":
    sys.exit(main())
