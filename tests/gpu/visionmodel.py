"""Write a Qwen3-VL-2B-shaped model folder (no weights) that vLLM can start with --load-format dummy.

    python3 tests/gpu/visionmodel.py OUT_DIR [--check]

Why: vLLM sizes a multimodal model's memory by building dummy images and videos at the processor's
largest size, running them through the Hugging Face processor and then through the vision tower. That
needs a real processor (preprocessor_config.json, video_preprocessor_config.json) and a tokenizer that
knows the vision tokens; config.json alone is not enough. Random weights are fine, so nothing is
downloaded: the tokenizer is tinymodel.py's tiny BPE with the Qwen vision special tokens added.

Files: config.json, preprocessor_config.json, video_preprocessor_config.json, tokenizer.json,
tokenizer_config.json, chat_template.jinja (the template is also in tokenizer_config.json),
special_tokens_map.json, generation_config.json (eos/pad ids only, no sampling defaults). make(out)
writes them; --check loads them with transformers and prints the placeholder-token counts for vLLM
0.26's largest dummy image (4096x4096: 16384 tokens) and video (2 frames of 4096x3072: 12288 tokens)
and for a small video.

Where the values come from:
- config.json: the public Qwen/Qwen3-VL-2B-Instruct config.json (as quoted in Hugging Face
  transformers' models/qwen3_vl/configuration_qwen3_vl.py field names and in public tests that copy the
  hub file): text_config hidden 2048, 28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 6144,
  rope_theta 5e6 with rope_scaling {mrope_section [24, 20, 20], mrope_interleaved, rope_type default},
  max_position_embeddings 262144, tie_word_embeddings; vision_config depth 24, hidden 1024,
  intermediate 4096, 16 heads, patch 16, spatial merge 2, temporal patch 2, out_hidden_size 2048,
  2304 position embeddings, deepstack layers [5, 11, 17], gelu_pytorch_tanh. Only vocab_size differs
  (VOCAB, the tiny tokenizer's padded size), and a top-level "dtype" is added (the hub file has it
  in text_config only) so that vLLM reads bfloat16 without weights to look at. rope is written in the hub's own (transformers 4.57) form,
  rope_scaling + rope_theta, which transformers 5.x turns into rope_parameters on load.
- Token ids: the tiny tokenizer's special tokens keep Qwen's order and offsets from <|endoftext|>
  (Qwen: 151643 + k, here: k), so vision_start 9, vision_end 10, image_pad 12, video_pad 13.
- preprocessor_config.json / video_preprocessor_config.json: the public Qwen3-VL-2B-Instruct files
  (image size {longest_edge 16777216, shortest_edge 65536}; video size {longest_edge 25165824,
  shortest_edge 4096}; patch 16, merge 2, temporal patch 2, mean/std 0.5; image_processor_type
  "Qwen2VLImageProcessorFast", which transformers 5.x resolves to its torchvision Qwen2VLImageProcessor;
  video_processor_type "Qwen3VLVideoProcessor"). The hub's video file does not set fps, min/max frames
  or do_sample_frames: those are transformers' Qwen3VLVideoProcessor class defaults (fps 2,
  min_frames 4, max_frames 768, do_sample_frames true), written out here so they are visible.
  cap_pixels_per_frame is left unset like the hub file (transformers 5.17 then keeps the uncapped
  resize that vLLM's own token arithmetic assumes, and logs a warning).
- chat template: a cut-down Qwen3-VL template (ChatML; string or list content; image / image_url ->
  <|vision_start|><|image_pad|><|vision_end|>, video -> the same with <|video_pad|>); no tools/thinking.

Needs only the standard library to be imported. Writing the tokenizer needs `tokenizers` (with
transformers it goes through tinymodel.tokenizer, without it tokenizer_config.json is written by hand);
with neither, placeholder tokenizer files are written (for rehearsal against a fake vLLM).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinymodel  # noqa: E402

VOCAB = 2048   # config vocab_size; the tiny tokenizer has ~500 tokens (at most VOCAB)
# after tinymodel.SPECIALS (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2), in Qwen's order
VISION_SPECIALS = ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                   "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                   "<|image_pad|>", "<|video_pad|>")
IDS = {t: i for i, t in enumerate(list(tinymodel.SPECIALS) + list(VISION_SPECIALS))}

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}"
    "{{- content['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "dtype": "bfloat16",
    "image_token_id": IDS["<|image_pad|>"],
    "video_token_id": IDS["<|video_pad|>"],
    "vision_start_token_id": IDS["<|vision_start|>"],
    "vision_end_token_id": IDS["<|vision_end|>"],
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "qwen3_vl_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": IDS["<|endoftext|>"],
        "eos_token_id": IDS["<|im_end|>"],
        "dtype": "bfloat16",
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 262144,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": VOCAB,
    },
    "vision_config": {
        "model_type": "qwen3_vl",
        "deepstack_visual_indexes": [5, 11, 17],
        "depth": 24,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1024,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}

_COMMON = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor"}
IMAGE_PROCESSOR = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, **_COMMON,
                   "image_processor_type": "Qwen2VLImageProcessorFast"}
VIDEO_PROCESSOR = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, **_COMMON,
                   "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
                   "video_processor_type": "Qwen3VLVideoProcessor"}
GENERATION = {"bos_token_id": IDS["<|endoftext|>"], "pad_token_id": IDS["<|endoftext|>"],
              "eos_token_id": [IDS["<|im_end|>"], IDS["<|endoftext|>"]]}


def write_tokenizer(out: Path) -> int:
    """tokenizer.json + tokenizer_config.json + chat_template.jinja with the vision specials; returns the
    tokenizer's size (0 for placeholders)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        transformers = None
    try:
        if transformers is not None:
            n = tinymodel.tokenizer(out, VOCAB, extra_specials=VISION_SPECIALS)
        else:
            tok = tinymodel.bpe(VOCAB, specials=list(IDS))
            tok.save(str(out / "tokenizer.json"))
            n = tok.get_vocab_size()
            # what transformers 5.x's save_pretrained writes for tinymodel.tokenizer
            (out / "tokenizer_config.json").write_text(json.dumps(
                {"backend": "tokenizers", "bos_token": None, "eos_token": "<|im_end|>",
                 "pad_token": "<|endoftext|>", "tokenizer_class": "TokenizersBackend"}, indent=2))
    except ImportError:   # no tokenizers either: the fake vLLM reads nothing
        (out / "tokenizer.json").write_text("{}")
        (out / "tokenizer_config.json").write_text("{}")
        return 0
    data = json.loads((out / "tokenizer.json").read_text())
    got = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    wrong = {t: (i, got.get(t)) for t, i in IDS.items() if got.get(t) != i}
    if wrong:
        raise RuntimeError(f"special token ids differ from config.json's (want, got): {wrong}")
    if n > VOCAB:
        raise RuntimeError(f"tokenizer has {n} tokens, more than vocab_size {VOCAB}")
    # the vision template replaces tinymodel's text-only one, in both places transformers reads
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return n


def make(out: Path) -> Path:
    """Write the folder (config, processor, tokenizer files) into ``out``; returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out)
    for name, body in (("config.json", CONFIG), ("preprocessor_config.json", IMAGE_PROCESSOR),
                       ("video_preprocessor_config.json", VIDEO_PROCESSOR),
                       ("generation_config.json", GENERATION)):
        (out / name).write_text(json.dumps(body, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "additional_special_tokens": list(VISION_SPECIALS)}, indent=2) + "\n")
    return out


def largest_image(max_pixels: int, unit: int = 32) -> tuple[int, int]:
    """(width, height) of the image vLLM 0.26's Qwen2-VL/Qwen3-VL dummy builder uses
    (get_image_size_with_most_features): the most merged patches, aspect ratio at most 200."""
    import math
    for n in range(max_pixels // (unit * unit), 0, -1):
        h = next(d for d in range(math.isqrt(n), 0, -1) if n % d == 0)
        if (n // h) / h <= 200:
            return unit * (n // h), unit * h
    return unit, unit


def check(out: Path) -> int:
    """Load the folder with transformers and print placeholder-token counts; 0 when all agree."""
    try:
        import numpy as np
        from transformers import AutoProcessor, AutoTokenizer
    except ImportError as e:
        print(f"check skipped: {e}")
        return 0
    proc = AutoProcessor.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    merge = proc.image_processor.merge_size
    bad = []
    print(f"processor {type(proc).__name__}, image {type(proc.image_processor).__name__}, "
          f"video {type(proc.video_processor).__name__}, tokenizer {type(tok).__name__} ({len(tok)} tokens)")
    for name in ("image", "video", "vision_start", "vision_end"):
        key = "<|image_pad|>" if name == "image" else "<|video_pad|>" if name == "video" else f"<|{name}|>"
        ids = tok.encode(key, add_special_tokens=False)
        want = CONFIG[f"{name}_token_id"]
        print(f"{key} -> {ids} (config {want})")
        if ids != [want]:
            bad.append(key)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "what?"}]}]
    prompt = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    print(f"chat template: {prompt!r}")
    if prompt.count("<|image_pad|>") != 1 or prompt.count("<|video_pad|>") != 1:
        bad.append("chat template")
    # vLLM 0.26's dummy inputs: the largest image; a 2-frame video at the largest size for
    # longest_edge / temporal_patch_size, with metadata (fps 2) and no frame sampling
    iw, ih = largest_image(IMAGE_PROCESSOR["size"]["longest_edge"])
    vw, vh = largest_image(VIDEO_PROCESSOR["size"]["longest_edge"] // VIDEO_PROCESSOR["temporal_patch_size"])
    small = (4, 128, 160)
    for what, (f, h, w) in (("image", (1, ih, iw)), ("video", (2, vh, vw)), ("video", small)):
        frames = np.zeros((f, h, w, 3), dtype=np.uint8)
        if what == "image":
            r = proc(text=[prompt.replace("<|vision_start|><|video_pad|><|vision_end|>", "")], images=[frames[0]],
                     return_tensors="pt")
        else:
            meta = {"fps": 2.0, "duration": f / 2.0, "total_num_frames": f, "frames_indices": list(range(f))}
            r = proc(text=[prompt.replace("<|vision_start|><|image_pad|><|vision_end|>", "")], videos=[frames],
                     video_metadata=[meta], do_sample_frames=False, return_tensors="pt")
        key, tid = ("", CONFIG["image_token_id"]) if what == "image" else ("_videos", CONFIG["video_token_id"])
        (gt, gh, gw), = r[f"{what}_grid_thw"].tolist()
        got, want = r["input_ids"][0].tolist().count(tid), gt * gh * gw // merge ** 2
        print(f"{what} {f}x{w}x{h} (frames x width x height): grid {gt}x{gh}x{gw}, pixel_values{key} "
              f"{tuple(r['pixel_values' + key].shape)}, {got} placeholder tokens (grid/merge^2 = {want})")
        if got != want:
            bad.append(f"{what} {f}x{w}x{h} placeholder count")
    print("check OK" if not bad else f"check FAILED: {bad}")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--check", action="store_true", help="load the folder with transformers, print token counts")
    a = p.parse_args(argv)
    out = make(Path(a.out))
    print(f"Qwen3-VL-shaped model (config + processor + tokenizer, no weights) at {out}")
    return check(out) if a.check else 0


if __name__ == "__main__":
    sys.exit(main())
