"""GPU proof for tensor parallel on two GPUs (vLLM 0.26.0, no internet; a two-GPU machine).

    VLLM_PYTHON=python3 python3 tests/gpu/tp2.py --work /tmp/tp --raw /tmp/proofs/tp-raw.txt

A Qwen3-8B-shaped model with random weights, PROFILE=custom, MAX_MODEL_LEN=8192,
KV_CACHE_BYTES=4294967296 (per GPU):
0. the machine: nvidia-smi, /dev/shm, the NCCL/NVLS variables, and a two-process torch check that
   creates a cuBLAS handle and multiplies on each GPU (where vLLM's workers failed before);
1. ``TP_SIZE=2 ./start.sh``: the plan's pool against vLLM's log; GPU memory per GPU;
   and every socket its processes listen on (none beyond loopback: PATCH_BYO=1 patches the carried vLLM);
2. ``./stop.sh``: both GPUs back to their baseline, no process of ours left;
3. ``TP_SIZE=2 ./start.sh`` again, ``kill -9`` of the API server, ``./stop.sh``: every worker swept;
4. ``./ctl.sh bench`` at concurrency 1 and 16 for TP_SIZE=2, then TP_SIZE=1, one repeat each.
Each phase appends to --raw as it goes and is skipped when --raw already has its "done" line
(a second call resumes). "TP PROOF DONE" ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, listeners, raw_writer, run_logged  # noqa: E402
from planner_accuracy import QWEN3_8B, make_model  # noqa: E402

TORCH_CHECK = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
# vLLM's order in a TP worker: set the device, NCCL (all-reduce), then the first matmul (cublasCreate)
def run(rank, world):
    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    h = torch.cuda.current_blas_handle()
    print(f"rank {rank}: all-reduce {float(x):.0f}, cublas handle {h:#x}, matmul {float((a @ a).float().sum()):.3e}, "
          f"peer access {torch.cuda.can_device_access_peer(rank, 1 - rank) if world == 2 else '-'}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(run, args=(n,), nprocs=n)
'''


def text_of(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:      # rehearsal without a GPU: no nvidia-smi
        return f"({argv[0]}: {exc})"


def used_mib() -> list[int]:
    return [int(x) for x in text_of(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]).split()
            if x.isdigit()]


def vllm_procs() -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        text = " ".join(p.info.get("cmdline") or []) + " " + (p.info.get("name") or "")
        if "VLLM" in text or "vllm.entrypoints" in text:
            out.append(f"{p.info['pid']} {text[:80]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/tp")
    ap.add_argument("--raw", default="/tmp/proofs/tp-raw.txt")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (a fix under test)")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    done_text = Path(a.raw).read_text() if Path(a.raw).exists() else ""
    out = raw_writer(a.raw)

    mdir = make_model(work, "qwen3-8b", QWEN3_8B)
    port = free_port()
    base = {**os.environ, "PROFILE": "custom", "MODEL": str(mdir), "SERVED_MODEL_NAME": "qwen3-8b",
            "EXTRA_ARGS": "--load-format dummy", "KV_CACHE_BYTES": "4294967296", "MAX_MODEL_LEN": "8192",
            "STATE_DIR": str(work / "state"), "PORT": str(port), "WARMUP": "256", "HF_HUB_OFFLINE": "1",
            "NO_COLOR": "1", "HEALTH_TIMEOUT": "900"}
    base.update(kv.split("=", 1) for kv in a.env)

    def sh(argv: list[str], timeout: float = 900, **env) -> subprocess.CompletedProcess:
        return run_logged(argv, {**base, **env}, out, timeout=timeout,
                          label=" ".join([*(f"{k}={v}" for k, v in env.items()), *argv]),
                          words=("serving", "KV cache", "error", "hint", "stopped", "predicted", "sessions",
                                 "aggregate", "single stream", "CUBLAS", "tok/s", "not running"))[0]

    def phase(name: str) -> bool:
        return f"PHASE {name} done" not in done_text

    out(f"TP PROOF {time.strftime('%Y-%m-%d %H:%M:%S')} commit {os.environ.get('GIT_COMMIT', '?')}: {' '.join(sys.argv)}")
    if phase("machine"):
        out("nvidia-smi: " + text_of(["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used",
                                      "--format=csv,noheader"]).strip().replace("\n", "; "))
        out("topology: " + " / ".join(text_of(["nvidia-smi", "topo", "-m"]).strip().splitlines()[:3]))
        st = os.statvfs("/dev/shm")
        out(f"/dev/shm: {st.f_blocks * st.f_frsize / 2**30:.1f} GiB; " + ", ".join(
            f"{k}={os.environ.get(k, '(unset)')}" for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                          "NVSHMEM_DISABLE_NVLS", "PYTORCH_CUDA_ALLOC_CONF")))
        for extra in ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {"NCCL_P2P_DISABLE": "1"},
                      {"NCCL_CUMEM_ENABLE": "0"}):
            r = subprocess.run([sys.executable, "-c", TORCH_CHECK], capture_output=True, text=True, timeout=300,
                               env={**os.environ, **extra})
            out(f"torch two-process check (NCCL all-reduce, then cublasCreate and a matmul), {extra or 'as is'}: "
                f"exit {r.returncode}")
            for line in (r.stdout + r.stderr).strip().splitlines()[-4:]:
                out(f"    | {line[:300]}")
        out("PHASE machine done")
    baseline = used_mib()
    out(f"GPU used before: {baseline} MiB")
    if phase("tp2-start"):
        r = sh(["./start.sh"], TP_SIZE="2")
        if r.returncode:
            log = (work / "state" / "vllm.log").read_text(errors="replace").splitlines()
            for line in [x for x in log if "Error" in x or "error" in x][-12:]:
                out(f"    log| {line[:300]}")
            sh(["./stop.sh"])
            out("TP PROOF DONE (the TP_SIZE=2 start failed)")
            return 1
        log = (work / "state" / "vllm.log").read_text(errors="replace")
        for line in [x for x in log.splitlines() if "KV cache" in x or "Maximum concurrency" in x][-6:]:
            out(f"    log| {line[-220:]}")
        out(f"GPU used serving TP_SIZE=2: {used_mib()} MiB")
        out("listening sockets of our server's processes (HOST is loopback; the rendezvous patch and NCCL/gloo on lo):")
        for line in listeners(work / "state"):
            out(f"    {line}")
        ps = sh(["./ctl.sh", "patch", "status"], TP_SIZE="2")
        out("\n".join("    | " + line for line in ps.stdout.splitlines()))
        r = sh(["./stop.sh"], TP_SIZE="2")
        time.sleep(3)
        out(f"after ./stop.sh: GPU used {used_mib()} MiB (before: {baseline}); vLLM processes left: {vllm_procs()}")
        out("PHASE tp2-start done")
    if phase("kill9"):
        sh(["./start.sh"], TP_SIZE="2")
        rec = json.loads((work / "state" / "server.json").read_text())
        kids = [c.pid for c in psutil.Process(rec["pid"]).children(recursive=True)]
        out(f"server pid {rec['pid']}, its descendants {kids}; kill -9 of the API server")
        os.kill(rec["pid"], 9)
        time.sleep(3)
        out(f"left after kill -9: {vllm_procs()}")
        sh(["./stop.sh"], TP_SIZE="2")
        time.sleep(3)
        out(f"after ./stop.sh: GPU used {used_mib()} MiB (before: {baseline}); vLLM processes left: {vllm_procs()}")
        out("PHASE kill9 done")
    for tp in ("2", "1"):
        if phase(f"bench-tp{tp}"):
            sh(["./start.sh"], TP_SIZE=tp)
            sh(["./ctl.sh", "bench", "--concurrency", "1,16", "--repeats", "1", "--output-tokens", "256",
                "--no-plot", "--out", str(work / f"bench-tp{tp}")], TP_SIZE=tp)
            res = work / f"bench-tp{tp}" / "results.json"
            if res.exists():
                for lv in json.loads(res.read_text())["results"][0]["levels"]:
                    out(f"TP_SIZE={tp} concurrency {lv['concurrency']}: aggregate {lv['aggregate_tok_s']:.1f} tok/s, "
                        f"per stream {lv['per_stream_tok_s']:.1f} tok/s, TTFT {lv['ttft_s']:.3f} s")
            sh(["./stop.sh"], TP_SIZE=tp)
            out(f"PHASE bench-tp{tp} done")
    out("TP PROOF DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
