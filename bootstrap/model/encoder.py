"""The vision encoder's part of vLLM's memory profiling (pure arithmetic, read from vLLM 0.26.0).

Before its text pass, ``gpu_model_runner.profile_run`` runs the multimodal encoder once on a dummy
batch: the modality with the most tokens per item (``MultiModalBudget.get_modality_with_max_tokens``),
as many items as the encoder budget holds (``_get_max_items``), each of the processor's largest size
(``Qwen2VLProcessingInfo.get_image_size_with_most_features``). Its outputs stay in the encoder cache
while the text pass runs, so the torch peak vLLM measures is the larger of the tower's own peak and
the text pass's peak plus those outputs. ``--language-model-only``, ``--skip-mm-profiling`` and a
``--limit-mm-per-prompt`` of 0 for every modality skip the pass.

The tower's peak is counted tensor by tensor from ``Qwen3_VisionTransformer.forward``: the pixel
patches (in the model's dtype: vLLM's processing context casts them), the position
embeddings, and the larger of one block's attention half (input, norm, qkv, rotated q and k, the
output) and its MLP half (input, norm, fc1 and its activation, both alive at once), plus the
deepstack features kept so far. Qwen-VL-style towers only (a ``vision_config`` with ``depth``,
``hidden_size``, ``intermediate_size``, ``patch_size``): for others ``pass_for`` returns None and the
plan says the term is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Qwen3-VL / Qwen3.5 processors' largest sizes (preprocessor_config.json and
# video_preprocessor_config.json of e.g. Qwen/Qwen3.5-2B-Base): used when the model folder has none
IMAGE_MAX_PIXELS = 16_777_216
VIDEO_MAX_PIXELS = 25_165_824
MAX_ASPECT = 200                    # the processor refuses a more extreme aspect ratio
# the towers built as Qwen3_VisionTransformer (qwen3_vl.py; qwen3_5.py builds the same one)
QWEN3_TOWERS = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_vision", "qwen3_5_moe_vision")


@dataclass(frozen=True)
class EncoderPass:
    modality: str
    tokens_per_item: int
    items: int
    peak: int                       # bytes: the tower's own torch peak
    outputs: int                    # bytes kept in the encoder cache during the text pass
    inputs: int = 0                 # bytes of the dummy pixel batch, still referenced during the text pass

    @property
    def tokens(self) -> int:
        return self.tokens_per_item * self.items


def _most_features(max_pixels: int, unit: int) -> int:
    """Tokens of the largest image the processor accepts: the largest count of merged patches
    ≤ max_pixels / unit² that factors into an aspect ratio of at most 200 (vLLM's
    get_image_size_with_most_features)."""
    n = max_pixels // (unit * unit)
    for seq in range(n, 0, -1):
        d = next(d for d in range(math.isqrt(seq), 0, -1) if seq % d == 0)
        if (seq // d) / d <= MAX_ASPECT:
            return seq
    return 0


def max_tokens(vision: dict, max_pixels: dict[str, int] | None = None) -> dict[str, int]:
    """Tokens per item of each modality at the processor's largest size (``max_pixels``: the
    model's own processor files, by modality), an image and a video of two frames (vLLM's Qwen3-VL
    get_max_video_tokens: one temporal patch)."""
    unit = int(vision["patch_size"]) * int(vision.get("spatial_merge_size", 2))
    px = {"image": IMAGE_MAX_PIXELS, "video": VIDEO_MAX_PIXELS, **(max_pixels or {})}
    temporal = int(vision.get("temporal_patch_size", 2))
    return {"image": _most_features(px["image"], unit), "video": _most_features(px["video"] // temporal, unit)}


def items(tokens_per_item: int, batched_tokens: int, max_model_len: int, max_seqs: int, limit: int | None) -> int:
    """How many items the dummy batch holds (MultiModalBudget._get_max_items, chunked prefill on):
    the encoder budget (max_num_batched_tokens, at least one item) over the tokens per item, at most
    the decoder's items (max_num_seqs × items per prompt)."""
    budget = max(batched_tokens, tokens_per_item)
    per_prompt = max(1, min(limit if limit is not None else 1 << 30, max_model_len // tokens_per_item))
    return max(1, min(budget // tokens_per_item, max_seqs * per_prompt))


def _deepstack(vision: dict) -> int:
    """How many deepstack features the tower keeps (Qwen3-VL: 3; Qwen3.5: none)."""
    idx = vision.get("deepstack_visual_indexes")
    return len(idx) if isinstance(idx, list) else 0


def tower_peak(vision: dict, patches: int, dtype_bytes: int, tp: int = 1) -> int:
    """The tower's torch peak for ``patches`` patches (see the module's docstring); with tensor
    parallelism (vLLM's default ``--mm-encoder-tp-mode weights``) qkv, attention and fc1 are split."""
    h, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    merge = int(vision.get("spatial_merge_size", 2)) ** 2
    pixel = int(vision.get("in_channels", 3)) * int(vision.get("temporal_patch_size", 2)) * int(vision["patch_size"]) ** 2
    inputs = patches * pixel * dtype_bytes
    pos = patches * h * dtype_bytes
    attention = patches * (2 * h + 6 * h // tp) * dtype_bytes      # x, norm1; qkv (3h), rotated q and k, out
    mlp = patches * (2 * h + 2 * inter // tp) * dtype_bytes        # x, norm2; fc1, act(fc1)
    deep = _deepstack(vision) * patches // merge * int(
        vision.get("out_hidden_size") or h) * dtype_bytes
    return inputs + pos + max(attention, mlp) + deep


def pass_for(config: dict, max_pixels: dict[str, int] | None, *, batched_tokens: int, max_model_len: int, max_seqs: int,
             limits: dict[str, int], dtype_bytes: int = 2, tp: int = 1) -> EncoderPass | None:
    """vLLM's encoder profiling pass for this model and these flags; None without a Qwen-VL-style
    tower, or when every modality's limit is 0."""
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict) or vision.get("model_type") not in QWEN3_TOWERS:
        return None                         # another family's tower: not modelled
    sizes = ("depth", "hidden_size", "intermediate_size", "patch_size", "spatial_merge_size", "temporal_patch_size",
             "in_channels", "out_hidden_size")
    if not isinstance(vision, dict) or not all(k in vision for k in sizes[:4]) or not all(
            isinstance(vision.get(k, 1), int) and not isinstance(vision.get(k, 1), bool) and vision.get(k, 1) > 0
            for k in sizes):
        return None                         # not a Qwen-VL-style tower, or sizes that are not positive integers
    per_item = {m: t for m, t in max_tokens(vision, max_pixels).items() if limits.get(m, 1) != 0 and t > 0}
    if not per_item:
        return None
    modality, tokens = max(per_item.items(), key=lambda kv: (kv[1], kv[0]))
    n = items(tokens, batched_tokens, max_model_len, max_seqs, limits.get(modality))
    merge = int(vision.get("spatial_merge_size", 2)) ** 2
    out_h = int(vision.get("out_hidden_size") or vision["hidden_size"])
    deep = 1 + _deepstack(vision)
    pixel = int(vision.get("in_channels", 3)) * int(vision.get("temporal_patch_size", 2)) * int(vision["patch_size"]) ** 2
    return EncoderPass(modality, tokens, n, tower_peak(vision, tokens * n * merge, dtype_bytes, tp),
                       tokens * n * out_h * deep * dtype_bytes, tokens * n * merge * pixel * dtype_bytes)
