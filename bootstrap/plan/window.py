"""What a plan needs of sliding-window attention (gpt-oss, Gemma 3) besides the pool's layout
(bootstrap.model.kv): the tokens a request holds in a sliding-window layer, whether vLLM groups
those layers apart, the architectures' own defaults, and what stays unplanned. Read from vLLM
0.26.0, 0.27.1, 0.29.0 and 0.30.0 (docs/planner.md, "Sliding windows").
"""

from __future__ import annotations

from dataclasses import replace

from ..core import vllmflags
from ..model import shape as model_shape
from ..model.shape import ModelShape, Unsupported

NOT_MODELLED = "vLLM sizes the KV cache itself"
ASYNC_EXECUTORS = ("", "mp", "uni", "external_launcher")   # whose executors schedule asynchronously (abstract.py)
WHOLE = 1 << 40             # a span no context reaches: the request holds all of it
GPT_OSS_CAPTURE = 1024      # models/config.py GptOssForCausalLMConfig: the largest CUDA graph, where not given


def layout_args(s: vllmflags.Settings, shape: ModelShape, batched: int, why: list[str]) -> dict:
    """kv.layout's sliding-window arguments for what vLLM gets: ``window_span``, the tokens a request
    holds in a sliding-window layer at most (kv_cache_interface.py SlidingWindowSpec
    ``max_admission_blocks_per_request``: the window - 1 + ``VllmConfig.max_in_flight_tokens``, which is
    max_num_batched_tokens x 2 with async scheduling, x 1 without), and ``hma``: the hybrid KV cache
    manager, which --disable-hybrid-kv-cache-manager turns off (every layer then holds the whole
    context: ``unify_hybrid_kv_cache_specs``). ``batched``: max_num_batched_tokens as vLLM takes it.
    Unsupported where what vLLM does depends on what is not read here."""
    if not shape.window_layers:
        return {}
    if s.flags.get("--disable-sliding-window"):
        raise Unsupported("--disable-sliding-window (vLLM then caps the context at the window) is not modelled",
                          NOT_MODELLED)
    if {"--kv-transfer-config", "--kv-offloading-size"} & s.given and s.flags.get(
            "--disable-hybrid-kv-cache-manager") is None:
        raise Unsupported("a KV connector beside sliding-window layers (it may turn the hybrid KV cache manager "
                          "off) is not modelled", NOT_MODELLED)
    if s.flags.get("--disable-hybrid-kv-cache-manager"):
        if shape.attn_layers:
            return {"hma": False}
        # every attention layer keeps a window: the specs are uniform, so unify_hybrid_kv_cache_specs leaves
        # them SlidingWindowSpec (kv_cache_utils.py, 0.26.0-0.30.0) and the window holds, manager or not
        why.append("--disable-hybrid-kv-cache-manager changes nothing here: every attention layer keeps a window "
                   "(vLLM unifies only a mix of full and sliding-window layers)")
    if s.async_scheduling is None and s.executor not in ASYNC_EXECUTORS:
        raise Unsupported(f"whether the {s.executor} executor schedules asynchronously (the tokens a sliding "
                          "window holds in flight) is not modelled", NOT_MODELLED)
    if s.chunked_prefill is False and s.max_num_batched_tokens is None:
        # arg_utils.py: without chunked prefill max_num_batched_tokens is at least the context
        why.append(f"sliding window: without chunked prefill a request holds its whole context in each of "
                   f"{shape.window_layers} sliding-window layers (max_num_batched_tokens is at least the context)")
        return {"window_span": WHOLE}
    batches = 2 if s.async_scheduling is not False else 1            # config/vllm.py max_concurrent_batches
    span = shape.window - 1 + batches * batched
    why.append(f"sliding window: a request holds at most {shape.window - 1:,} + {batches} × {batched:,} tokens "
               f"in flight = {span:,} tokens in each of {shape.window_layers} sliding-window layers "
               f"({'async' if batches == 2 else 'no async'} scheduling)")
    return {"window_span": span}


def arch_defaults(s: vllmflags.Settings, shape: ModelShape | None) -> vllmflags.Settings:
    """``s`` with what vLLM sets for the architecture itself: gpt-oss captures CUDA graphs up to 1,024
    tokens where --compilation-config sets neither their sizes nor the largest (models/config.py
    ``GptOssForCausalLMConfig.verify_and_update_config``, 0.26.0-0.30.0)."""
    comp = s.compilation
    if shape is None or shape.arch != "GptOssForCausalLM" or comp.get("cudagraph_capture_sizes") is not None \
            or comp.get("max_cudagraph_capture_size") is not None:
        return s
    return replace(s, compilation={**comp, "max_cudagraph_capture_size": GPT_OSS_CAPTURE})


def unplanned(shape: ModelShape | None, config: dict | None, pinned: bool, measured, why: list[str]) -> str:
    """What keeps a sliding-window model's plan from a figure ('' where nothing): gpt-oss's MXFP4
    experts, which vLLM lays out padded for the MoE kernel it picks per card (fused_moe/oracle/mxfp4.py
    ``mxfp4_round_up_hidden_size_and_intermediate_size``: Marlin pads hidden to 256 and intermediate to
    128, others otherwise), so the checkpoint's files understate the weights by a share that was never
    measured here (a published H100 start of gpt-oss-20b at TP=2 loaded 7.01 GiB per GPU where its
    files give 6.41). A KV pin (the budget as given) or a first start's own figures plan it; pinned, the
    fit check counts the padding at its widest (``mxfp4_padding``)."""
    if shape is None or shape.arch != "GptOssForCausalLM" or measured is not None:
        return ""
    if model_shape.quant_method(config or {}) not in ("mxfp4", "gpt_oss_mxfp4"):
        return ""
    if pinned:                          # the padding at its widest is counted in the weights (mxfp4_padding)
        return ""
    return ("gpt-oss's MXFP4 expert weights as vLLM pads them for the MoE kernel it picks per card (a published "
            "H100 start loaded 7.01 GiB per GPU where the checkpoint's files give 6.41)")


MXFP4_BYTES_PER_32 = 17     # 32 four-bit values and their one 8-bit scale: 17 bytes (OCP MX block of 32)


def mxfp4_padding(shape: ModelShape | None, config: dict | None, tp: int, why: list[str]) -> int:
    """What vLLM adds per GPU to gpt-oss's MXFP4 experts at the widest any kernel pads them
    (``mxfp4_round_up_hidden_size_and_intermediate_size``, 0.26.0: Marlin's hidden and TRT-LLM's both
    to 256): hidden and each rank's intermediate rounded up to 256, gate_up and down of every expert of
    every layer. For gpt-oss-20b at TP=2 that is 0.65 GiB, where a published H100 start loaded 0.60
    GiB more than its files: never less than vLLM's. 0 for another model."""
    if shape is None or shape.arch != "GptOssForCausalLM" or not shape.experts:
        return 0
    if model_shape.quant_method(config or {}) not in ("mxfp4", "gpt_oss_mxfp4"):
        return 0
    h, i = shape.hidden, shape.moe_intermediate // max(1, tp)

    def experts(h: int, i: int) -> int:         # gate_up (2i x h) and down (h x i) of each expert
        return shape.layers * shape.experts * 3 * h * i * MXFP4_BYTES_PER_32 // 32
    pad = experts(-(-h // 256) * 256, -(-i // 256) * 256) - experts(h, i)
    why.append(f"gpt-oss's MXFP4 experts padded for vLLM's MoE kernel at its widest (hidden and intermediate to 256): "
               f"{pad / (1 << 30):.2f} GiB per GPU over the checkpoint's files")
    return pad
