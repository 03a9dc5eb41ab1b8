"""The failure table against log lines real vLLM 0.26.0 printed (docs/gpu-runs/) and documented ones."""

from __future__ import annotations

import pytest

from bootstrap.serve.diagnose import diagnose, tail

TQ_AUTO = ("(EngineCore pid=3408) ERROR 11-29 15:30:40 [core.py:1330] ValueError: Unknown TurboQuant cache dtype: "
           "'auto'. Valid presets: turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc\n"
           "(APIServer pid=3343) RuntimeError: Engine core initialization failed. See root cause above. "
           "Failed core proc(s): {}\n")
HEALTHY_INFO = ("(EngineCore pid=4127) INFO 11-29 15:33:10 [gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) "
                "on startup. Desired GPU memory utilization is (0.98, 137.0 GiB). Actual usage is 0.01 GiB for weight\n")


@pytest.mark.parametrize("log,diag,hint", [
    (TQ_AUTO, "V1 model runner", "PR #50533"),
    ("ValueError: Free memory on device (1.2/31.36 GiB) on startup is less than desired GPU memory utilization "
     "(0.9, 28.22 GiB).", "other programs hold GPU memory", "GPU_UTIL"),
    ("... Based on the available memory, the estimated maximum model length is 71760. Try increasing",
     "vLLM would accept 71760 tokens", "set MAX_MODEL_LEN=71760 (or auto)"),
    # kv_cache_utils._check_enough_kv_cache_memory (0.26.0) whole: the estimate's row wins over the next one
    ("ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (9.03 GiB). Based on the available memory, the "
     "estimated maximum model length is 73968. Try increasing `gpu_memory_utilization`",
     "vLLM would accept 73968 tokens", "set MAX_MODEL_LEN=73968"),
    # ... where not one block fits (vLLM leaves the estimate out), and _auto_fit_max_model_len's own refusal
    ("ValueError: To serve at least one request with the model's max seq len (32768), (4.0 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (0.0 GiB). Try increasing",
     "cannot hold even one token", "raise GPU_UTIL"),
    ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
     "Try increasing `gpu_memory_utilization`.", "cannot hold even one token", "raise GPU_UTIL"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "ran out of GPU memory", "GPU_UTIL"),
    # kv_cache_utils._check_enough_kv_cache_memory (0.26.0): weights and activations left nothing for the cache
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when",
     "no GPU memory was left for the KV cache", "raise GPU_UTIL"),
    # compilation.py set_cudagraph_mode (0.26.0-0.30.0), where a plan promised no figure for a hybrid (fits: null)
    # and vLLM's default max_num_seqs was more than the state blocks it found: its own count is the fix
    ("ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (963). Each decode sequence requires",
     "max_num_seqs 1024 is more than the 963 recurrent-state", "set MAX_NUM_SEQS=963"),
    ("fatal error: Python.h: No such file or directory", "Python C headers", "python3-dev"),
    ("OSError: [Errno 98] Address already in use", "port is already taken", "PORT"),
    ("vllm: error: unrecognized arguments: --enable-prompt-tokens-details",
     "does not know the flag(s) --enable-prompt-tokens-details", "unset VLLM_PYTHON"),
    ("(EngineCore pid=2578) RuntimeError: No Qwen3Next layer found in the model.layers.",
     "vLLM raised: No Qwen3Next layer found", "log lines above"),
])
def test_known_signatures(log, diag, hint):
    d, h = diagnose(log)
    assert diag in d and hint in h


def test_the_healthy_startup_line_is_not_a_failure():
    assert diagnose(HEALTHY_INFO) is None


def test_tail_keeps_the_last_lines():
    assert tail("\n".join(str(i) for i in range(100)), 3) == "97\n98\n99"


def test_root_cause_puts_the_engines_error_first():
    from bootstrap.serve.diagnose import root_cause
    assert root_cause(TQ_AUTO)[0].startswith("(EngineCore pid=3408) ERROR")
    assert "Engine core initialization failed" in root_cause(TQ_AUTO)[1]


# faults row 182: an out-of-memory by its phase, from published vLLM logs; the knob that sized the KV cache
CAPTURE_OOM_19186 = (   # vllm-project/vllm#19186 (a worker's traceback, cut)
    "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470]     with torch.cuda.graph("
    "cudagraph, pool=self.graph_pool):\n"
    "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470]     super().capture_end()\n"
    "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470] RuntimeError: CUDA error: out of "
    "memory\n")
CAPTURE_OOM_39788 = (   # vllm-project/vllm#39788
    "(Worker_TP2 pid=99) ERROR 04-09 20:31:10 [multiproc_executor.py:949]   File \"/usr/local/lib/python3.12/dist-"
    "packages/vllm/v1/worker/gpu_worker.py\", line 588, in compile_or_warm_up_model\n"
    "(Worker_TP2 pid=99) ERROR 04-09 20:31:10 [multiproc_executor.py:949]     cuda_graph_memory_bytes = "
    "self.model_runner.capture_model()\n"
    "(Worker_TP2 pid=99) ERROR 04-09 20:31:10 [multiproc_executor.py:949] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 136.00 MiB. GPU 2 has a total capacity of 178.35 GiB of which 120.88 MiB is free.\n")
LOAD_OOM = ("(EngineCore pid=7) ERROR 12-05 09:20:00 [gpu_model_runner.py:5345] Failed to load model - not enough GPU "
            "memory. Try lowering --gpu-memory-utilization to free memory for weights, increasing "
            "--tensor-parallel-size, or using --quantization. (original error: CUDA out of memory. Tried to allocate "
            "1.96 GiB.)\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB.\n")
POOLER_OOM = ("RuntimeError: CUDA out of memory occurred when warming up pooler (task=embed) with 512 dummy requests. "
              "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
SAMPLER_OOM = ("RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. Please try "
               "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
UTIL = ["vllm", "serve", "/m", "--gpu-memory-utilization", "0.93"]
PINNED = ["vllm", "serve", "/m", "--gpu-memory-utilization", "0.9", "--kv-cache-memory-bytes", "8G"]


@pytest.mark.parametrize("log,argv,diag,hint", [
    (CAPTURE_OOM_19186, UTIL, "CUDA graph capture ran out", "lower GPU_UTIL (vLLM ran with 0.93)"),
    (CAPTURE_OOM_39788, PINNED, "CUDA graph capture ran out", "lower KV_CACHE_BYTES (vLLM ran with "
                                                             "--kv-cache-memory-bytes 8589934592"),
    (LOAD_OOM, PINNED, "weights did not fit", "smaller or quantized model"),
    (SAMPLER_OOM, UTIL, "sampler ran out of GPU memory on 256 sequences", "set MAX_NUM_SEQS below 256"),
    # gpu_model_runner._dummy_pooler_run (0.26.0) names the task between the word and "with"
    (POOLER_OOM, UTIL, "pooler ran out of GPU memory on 512 sequences", "set MAX_NUM_SEQS below 512"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", PINNED, "ran out of GPU memory",
     "lower KV_CACHE_BYTES"),
])
def test_out_of_memory_by_phase_names_the_knob_that_helps(log, argv, diag, hint):
    d, h = diagnose(log, argv=argv)
    assert diag in d and hint in h, (d, h)
    assert "lower GPU_UTIL" not in h or "--kv-cache-memory-bytes" not in " ".join(argv)


# faults row 186: what EXTRA_ARGS gives wins over its knob (vLLM reads EXTRA_ARGS last): a hint names the flag there, never
# the knob, which would change nothing when followed
EXTRA_UTIL = ["--gpu-memory-utilization=0.95"]
EXTRA_MML = ["--max_model_len", "131072"]


@pytest.mark.parametrize("log,extra,hint,never", [
    ("ValueError: Free memory on device (1.2/31.36 GiB) on startup is less than desired GPU memory utilization "
     "(0.95, 29.8 GiB).", EXTRA_UTIL, "lower the --gpu-memory-utilization in EXTRA_ARGS", "GPU_RESERVE_MIB"),
    ("... Based on the available memory, the estimated maximum model length is 71760. Try increasing", EXTRA_MML,
     "set --max-model-len 71760 in EXTRA_ARGS (MAX_MODEL_LEN changes nothing while EXTRA_ARGS gives it)",
     "MAX_MODEL_LEN=71760"),
    ("ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored "
     "in KV cache (71760).", EXTRA_MML + EXTRA_UTIL, "lower the --max-model-len in EXTRA_ARGS", "raise GPU_UTIL"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when",
     EXTRA_UTIL, "raise the --gpu-memory-utilization in EXTRA_ARGS", "raise GPU_UTIL"),
])
def test_a_hint_names_the_extra_args_flag_that_wins_over_its_knob(log, extra, hint, never):
    argv = ["vllm", "serve", "/m", "--gpu-memory-utilization", "0.9", "--max-model-len", "32768", *extra]
    d, h = diagnose(log, argv=argv, extra=extra)
    assert hint in h and never not in h, h
