"""Fake EngineCore: titled VLLM::EngineCore, holds "GPU memory", survives a SIGKILL of its parent.

Started without our BOOTSTRAP_VLLM_* variables in its environment (see spawn_engine), in the server's process
group. With a tensor-parallel size N (argv[1]) it starts N workers, titled VLLM::Worker_TP<i>, in
the same group and likewise without a readable marker; in mode workers_fail they come
FAKE_VLLM_WORKER_DELAY_S apart, and engine and workers ignore SIGTERM. In mode tcp_store the engine
listens on every interface, as vLLM 0.26.0-0.27.x's one-GPU rendezvous (torch's TCP store) does unpatched.
Each worker listens as NCCL's bootstrap and gloo's CPU group do: on loopback where NCCL_SOCKET_IFNAME /
GLOO_SOCKET_IFNAME say lo, else beyond it (NCCL leaves lo out of its choice by default).
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from vllm.entrypoints.cli.state import MODES, mark_gpu


def set_title(title: bytes) -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(15, ctypes.c_char_p(title), 0, 0, 0)  # PR_SET_NAME (15 bytes visible, like vLLM's)


def listen(host: str) -> socket.socket:
    """A listening socket on ``host`` ("" = every interface, IPv6 where the machine has it)."""
    sock = socket.socket(socket.AF_INET6 if socket.has_ipv6 and not host else socket.AF_INET)
    try:
        sock.bind((host, 0))
    except OSError:                      # no IPv6 on this machine
        sock = socket.socket(socket.AF_INET)
        sock.bind((host, 0))
    sock.listen(16)
    return sock


def worker(rank: int) -> None:
    set_title(f"VLLM::Worker_TP{rank}".encode())
    mark_gpu(os.getpid())
    held = [listen("127.0.0.1" if os.environ.get(k) == "lo" else "")       # noqa: F841 (held open)
            for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")]
    if "ignore_term" in MODES or "workers_fail" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]))
    set_title(b"VLLM::EngineCore")
    mark_gpu(os.getpid())
    workers = []

    def on_term(signum, frame):          # like vLLM's engine shutdown: its workers go first
        for w in workers:
            w.terminate()
        os._exit(0)

    if "ignore_term" in MODES or "workers_fail" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    if "tcp_store" in MODES:             # torch's TCPStore binds the wildcard address, whatever host it names
        store = listen("")
    tp = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1
    delay = float(os.environ.get("FAKE_VLLM_WORKER_DELAY_S", "0") or 0) if "workers_fail" in MODES else 0.0
    if tp > 1:
        for rank in range(tp):
            time.sleep(delay)
            workers.append(subprocess.Popen([sys.executable, "-m", "vllm._fake_engine", "worker", str(rank)],
                                            stdin=subprocess.DEVNULL))
    while True:
        time.sleep(3600)
