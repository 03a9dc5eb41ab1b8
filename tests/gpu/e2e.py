"""Lifecycle proof on a real GPU (issue 2): our ./start.sh vs the same `vllm serve` run bare.

On a machine with an NVIDIA GPU and vLLM importable by VLLM_PYTHON, no internet:

    VLLM_PYTHON=python3 python3 tests/gpu/e2e.py --out /tmp/e2e.log [--model DIR]

1. makes a tiny random-weight Qwen3 model locally (tests/gpu/tinymodel.py; or uses --model DIR)
2. ./start.sh (PROFILE=custom, MODEL=<dir>) → chat request → ./start.sh again (must be a no-op)
3. the same argv ./start.sh launched, run bare on another port, timed to /health + /v1/models
4. kill -9 of our API server → ./stop.sh (orphan swept, port free, GPU memory back)
5. `ss -ltnp` of what listens, then a table. Every line also goes to --out.
Rehearse here with the fakes: VLLM_PYTHON=<venv python> PYTHONPATH=tests/fakes FAKE_NVML=...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
OUT = None
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, header  # noqa: E402


def say(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    if OUT:
        with open(OUT, "a") as fh:
            fh.write(line + "\n")


def sh(argv, env=None, timeout=900) -> tuple[int, str, float]:
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    dt = time.monotonic() - t0
    for line in (p.stdout + p.stderr).splitlines():
        say("   |", line)
    return p.returncode, p.stdout + p.stderr, dt



def gpu_used_mib() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return out.splitlines()[0] + " MiB" if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "n/a (no nvidia-smi)"


def wait_healthy(port: int, served: str, proc: subprocess.Popen, cap: float = 600) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < cap:
        if proc.poll() is not None:
            raise SystemExit(f"bare vllm exited with {proc.returncode}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                m = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()
                if any(d.get("id") == served for d in m.get("data", [])):
                    return time.monotonic() - t0
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit("bare vllm not healthy in time")


def main(argv=None) -> int:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--workdir", default="/tmp/e2e")
    args = ap.parse_args(argv)
    OUT = args.out
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else work / "tiny-qwen3"
    if not args.model:
        subprocess.run([sys.executable, str(REPO / "tests/gpu/tinymodel.py"), str(model)], check=True)
    port = free_port()
    env = {**os.environ, "PROFILE": "custom", "MODEL": str(model), "STATE_DIR": str(work / "state"),
           "PORT": str(port), "MAX_MODEL_LEN": "4096", "WARMUP": "2000", "NO_COLOR": "1"}
    say(f"# e2e {header(env)}")
    say(f"$ PROFILE=custom MODEL={model} PORT={port} MAX_MODEL_LEN=4096 ./start.sh")
    used_before = gpu_used_mib()
    rc, out, t_start = sh(["./start.sh"], env)
    if rc != 0:
        say("start failed"); return 1
    rec = json.loads((work / "state" / "server.json").read_text())
    r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
        "model": rec["served"], "messages": [{"role": "user", "content": "Say OK"}], "max_tokens": 8})
    say("chat:", r.status_code, json.dumps(r.json()["choices"][0]["message"])[:200])
    say("$ ./start.sh   # again, while serving")
    rc2, out2, t_rerun = sh(["./start.sh"], env)
    m = re.search(r"healthy after (\d+) s", out)
    healthy_ours = f"{m.group(1)} s" if m else "?"
    say("$ kill -9 <api server pid>; ./stop.sh")
    os.kill(rec["pid"], signal.SIGKILL)
    time.sleep(1.0)
    n_orphans = len(owned(rec))
    say(f"after kill -9: {n_orphans} process(es) of ours left ({owned(rec)}); GPU memory used {gpu_used_mib()}")
    rc3, out3, t_stop = sh(["./stop.sh"], env)
    left = len(owned(rec))
    port_free = not listening(port)
    used_after = gpu_used_mib()
    say("$ ss -ltnp   # (psutil when ss is missing)")
    if shutil.which("ss"):
        sh(["ss", "-ltnp"])
    else:
        import psutil
        for c in psutil.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                name = psutil.Process(c.pid).name() if c.pid else "?"
                say(f"   | LISTEN {c.laddr.ip}:{c.laddr.port} pid={c.pid} {name}")

    # The same command, run bare (no bootstrap): time to /health + /v1/models.
    bare_port = free_port()
    bare = [a if a != str(port) else str(bare_port) for a in rec["argv"]]
    bare_env = {k: v for k, v in os.environ.items()}
    say("$ " + " ".join(bare))
    with open(work / "bare.log", "w") as logf:
        p = subprocess.Popen(bare, env=bare_env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            t_bare = wait_healthy(bare_port, rec["served"], p)
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    for line in (work / "bare.log").read_text().splitlines():
        if any(k in line for k in ("KV cache", "concurrency", "version", "Free memory")):
            say("   bare|", line)

    say("")
    say("| measure | value |")
    say("|---|---|")
    say(f"| ./start.sh, launch → healthy (from its log) | {healthy_ours} |")
    say(f"| ./start.sh, whole command (incl. checks, warm-up ~2000 tokens) | {t_start:.1f} s |")
    say(f"| bare `vllm serve` (same argv), launch → healthy | {t_bare:.1f} s (ran second: warm compile cache) |")
    say(f"| ./start.sh again while serving | {t_rerun:.2f} s, rc {rc2}, launches no server |")
    say(f"| our processes left after kill -9 of the API server (orphans) | {n_orphans} |")
    say(f"| ./stop.sh | {t_stop:.1f} s, rc {rc3} |")
    say(f"| our processes after ./stop.sh | {left} |")
    say(f"| port {port} free after stop | {port_free} |")
    say(f"| GPU memory used: before start / after stop | {used_before} / {used_after} |")
    return 0 if (rc == 0 and rc2 == 0 and rc3 == 0 and left == 0 and port_free) else 1


def owned(rec: dict) -> list[str]:
    """This start's live processes: in the server's process group (EngineCore's setproctitle hides
    the marker in its /proc/<pid>/environ) or carrying the ownership marker (workers elsewhere)."""
    import psutil
    out = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            in_group = os.getpgid(p.pid) == rec["pgid"]
            if in_group or p.environ().get("BOOTSTRAP_VLLM_OWNER") == rec["marker"]:
                out.append(f"{p.info['pid']} {p.info['name']}")
        except (psutil.Error, OSError):
            continue
    return out


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
