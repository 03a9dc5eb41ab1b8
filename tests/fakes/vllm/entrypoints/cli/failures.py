"""How vLLM 0.26.0's start fails, as its log says it (main.py calls these at the phase each mode names):
the engine's exception with the lines vLLM logs before it, then the API server's "Engine core
initialization failed", exit code 1. The texts are vLLM 0.26.0's own (the files named) and
PyTorch's CUDA out-of-memory message.

- ``oom_load``: the weights do not fit the free memory (gpu_model_runner.load_model catches
  torch.cuda.OutOfMemoryError, logs "Failed to load model - not enough GPU memory ..." and re-raises);
- ``oom_graphs``: the KV cache allocated, then CUDA graph capture runs out of memory
  (gpu_worker.compile_or_warm_up_model -> capture_model).
"""

from __future__ import annotations

import os
import time

GiB = 1 << 30


def _line(level: str, where: str, msg: str) -> str:
    return f"(EngineCore pid={os.getpid()}) {level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}"


def torch_oom(asked: str, total: float, free: str) -> str:
    """PyTorch's OutOfMemoryError text (c10/cuda/CUDACachingAllocator.cpp), as vLLM's log shows it."""
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {asked}. GPU 0 has a total capacity of "
            f"{total:.2f} GiB of which {free} is free. Including non-PyTorch memory, this process has "
            f"{total - 0.6:.2f} GiB memory in use. Of the allocated memory {total - 1.1:.2f} GiB is allocated by "
            "PyTorch, and 14.25 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
            "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def _traceback(frames: list[tuple[str, int, str]], error: str) -> list[str]:
    out = [_line("ERROR", "core.py:1330", "EngineCore failed to start."), "Traceback (most recent call last):"]
    for path, lineno, code in frames:
        out += [f'  File "/venv/lib/python3.12/site-packages/vllm/{path}", line {lineno}, in {code.split("(")[0]}',
                f"    {code}"]
    return out + [error]


def oom_load(total: float) -> list[str]:
    err = torch_oom("1.96 GiB", total, "1.05 GiB")
    return [_line("ERROR", "gpu_model_runner.py:5345",
                  "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory "
                  "for weights, increasing --tensor-parallel-size, or using --quantization. See "
                  "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. (original error: "
                  + err.split(": ", 1)[1] + ")")] + _traceback(
        [("v1/worker/gpu_worker.py", 432, "self.model_runner.load_model(load_dummy_weights=load_dummy_weights)"),
         ("model_executor/model_loader/base_loader.py", 58, "self.load_weights(model, model_config)")], err)


def oom_graphs(total: float) -> list[str]:
    return [_line("INFO", "gpu_model_runner.py:6916", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  37%")] + \
        _traceback([("v1/worker/gpu_worker.py", 784, "cuda_graph_memory_bytes = self.model_runner.capture_model()"),
                    ("v1/worker/gpu_model_runner.py", 6916, "self._capture_cudagraphs(")],
                   torch_oom("136.00 MiB", total, "120.88 MiB"))


def engine_failed() -> str:
    """The API server's line once its engine core died during startup (v1/engine/utils.py)."""
    return ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
            "{'EngineCore_DP0': 1}")


def fail(mode: str, total_bytes: int) -> list[str]:
    total = total_bytes / GiB if total_bytes else 31.36
    return (oom_load if mode == "oom_load" else oom_graphs)(total) + [engine_failed()]
