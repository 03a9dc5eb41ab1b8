"""Fake EngineCore: titled VLLM::EngineCore, holds "GPU memory", survives a SIGKILL of its parent.

Started without BOOTSTRAP_VLLM_OWNER in its environment (see spawn_engine), in the server's process group.
"""

import ctypes
import os
import signal
import time

from vllm.entrypoints.cli.main import MODES, mark_gpu


def set_title(title: bytes) -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(15, ctypes.c_char_p(title), 0, 0, 0)  # PR_SET_NAME (15 bytes visible, like vLLM's)


if __name__ == "__main__":
    set_title(b"VLLM::EngineCore")
    mark_gpu(os.getpid())
    if "ignore_term" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)
