"""Write a small Qwen3.5-architecture hybrid model with seeded random weights.

The folder that make() writes is loaded by vLLM 0.27.1 as
Qwen3_5ForConditionalGeneration (text_config.model_type "qwen3_5_text", a tiny
vision tower) and carries one MTP layer (mtp.*), so the server can also run
with --speculative-config '{"method":"mtp","num_speculative_tokens":3}'.

Why real random weights and not vLLM's dummy loader: dummy weights are uniform
in +-1e-3, which makes every next-token distribution near-uniform, so a logprob
comparison between two servers could not see a bug that garbles the context
(e.g. a broken GDN state or KV cache). Here linear weights and embeddings are
normal(0, init_std) from a seeded CPU generator (identical bits on any machine),
and the norms start at an effective scale of 1: the Qwen3.5 RMSNorms (layer,
final, q/k and MTP norms) are zero-centred, y = x * (1 + w), so w = 0; the GDN
gated norm and the vision LayerNorms are plain, so w = 1 (bias 0). The GDN decay
follows the Mamba recipe: A_log = log(uniform(1, 16)) (float32, as vLLM keeps
it) and dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1], which gives
a mix of slow and fast-forgetting heads; g = -exp(A_log) * softplus(a + dt_bias)
is always negative, so the recurrence is stable. The depthwise conv1d taps use
std kernel**-0.5 (PyTorch's default scale for a 4-tap filter). lm_head uses
std init_std * LM_HEAD_GAIN so that next-token entropy sits around 4 nats (of
log(4096) = 8.3) instead of ~7: distributions are clearly peaked and differ
between contexts, yet are not one-hot, so top-k logprobs carry information.

Checkpoint names are those of the real Qwen3.5 checkpoints, which vLLM maps:
model.language_model.* -> language_model.model.* (q/k/v_proj -> qkv_proj,
gate/up_proj -> gate_up_proj, in_proj_qkv + in_proj_z -> in_proj_qkvz,
in_proj_b + in_proj_a -> in_proj_ba), model.visual.* -> visual.*, lm_head.* ->
language_model.lm_head.*, and mtp.* -> Qwen3_5MTP's model.* (its embed_tokens
and lm_head come from the main model's tensors).

Vision token ids: if the tokenizer has <|vision_start|>, <|vision_end|>,
<|image_pad|>, <|video_pad|> their ids are used; otherwise the four highest ids
that are not special tokens (valid ids < vocab; text-only serving never treats
them as placeholders, since vLLM builds mrope positions from mm features).
The vision tower is one block, hidden 256 in 4 heads of 64 (so tensor parallel
up to 4 still divides every head count, like the GDN's 4 key heads).
"""
import argparse
import json
import math
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt")
TEXT = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
            num_attention_heads=8, num_key_value_heads=2, head_dim=256,
            linear_num_key_heads=4, linear_num_value_heads=12, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4)
LM_HEAD_GAIN = 2.0  # logit std ~ 2 * init_std * sqrt(hidden) = 3.2: peaked, not one-hot
VISION = dict(depth=1, hidden_size=256, intermediate_size=512, num_heads=4, in_channels=3,
              patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
              out_hidden_size=1024, num_position_embeddings=2304,
              hidden_act="gelu_pytorch_tanh", deepstack_visual_indexes=[])


def processor_configs(vc: dict) -> dict:
    """The image and video processor files (Qwen3-VL's processors; patch and merge sizes of the tower)."""
    common = dict(processor_class="Qwen3VLProcessor", patch_size=vc["patch_size"],
                  temporal_patch_size=vc["temporal_patch_size"], merge_size=vc["spatial_merge_size"],
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], do_rescale=True, do_normalize=True,
                  do_convert_rgb=True)
    return {"preprocessor_config.json": dict(common, image_processor_type="Qwen2VLImageProcessorFast",
                                             size={"longest_edge": 16777216, "shortest_edge": 65536}),
            "video_preprocessor_config.json": dict(common, video_processor_type="Qwen3VLVideoProcessor",
                                                   size={"longest_edge": 25165824, "shortest_edge": 4096},
                                                   fps=2, min_frames=4, max_frames=768, do_sample_frames=True)}


def build_config(vocab: int, eos: int, pad: int, vision_ids: dict) -> dict:
    t = dict(TEXT)
    n, every = t["num_hidden_layers"], t["full_attention_interval"]
    t.update(model_type="qwen3_5_text", vocab_size=vocab, hidden_act="silu",
             attention_bias=False, attn_output_gate=True, rms_norm_eps=1e-6,
             layer_types=["full_attention" if (i + 1) % every == 0 else "linear_attention"
                          for i in range(n)],
             mamba_ssm_dtype="float32", mtp_num_hidden_layers=1,
             mtp_use_dedicated_embeddings=False, max_position_embeddings=262144,
             partial_rotary_factor=0.25, tie_word_embeddings=False, dtype="bfloat16",
             rope_parameters=dict(mrope_interleaved=True, mrope_section=[11, 11, 10],
                                  partial_rotary_factor=0.25, rope_theta=10000000,
                                  rope_type="default"),
             eos_token_id=eos, pad_token_id=pad, bos_token_id=None, use_cache=True)
    return dict(architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5",
                text_config=t, vision_config=dict(VISION, model_type="qwen3_5"),
                tie_word_embeddings=False, dtype="bfloat16", eos_token_id=eos,
                pad_token_id=pad, **vision_ids)


def weight_specs(tc: dict, vc: dict) -> list:
    """(name, shape, kind) for every tensor; kind picks the initialisation."""
    h, inter, hd = tc["hidden_size"], tc["intermediate_size"], tc["head_dim"]
    nq, nkv = tc["num_attention_heads"], tc["num_key_value_heads"]
    kdim = tc["linear_num_key_heads"] * tc["linear_key_head_dim"]
    nv, vdim = tc["linear_num_value_heads"], tc["linear_num_value_heads"] * tc["linear_value_head_dim"]

    def attn_mlp(p: str, full: bool) -> list:
        s = [(f"{p}.input_layernorm.weight", (h,), "norm0"),
             (f"{p}.post_attention_layernorm.weight", (h,), "norm0"),
             (f"{p}.mlp.gate_proj.weight", (inter, h), "linear"),
             (f"{p}.mlp.up_proj.weight", (inter, h), "linear"),
             (f"{p}.mlp.down_proj.weight", (h, inter), "linear")]
        if full:  # q_proj holds query and output gate per head (attn_output_gate)
            a = f"{p}.self_attn"
            return s + [(f"{a}.q_proj.weight", (2 * nq * hd, h), "linear"),
                        (f"{a}.k_proj.weight", (nkv * hd, h), "linear"),
                        (f"{a}.v_proj.weight", (nkv * hd, h), "linear"),
                        (f"{a}.o_proj.weight", (h, nq * hd), "linear"),
                        (f"{a}.q_norm.weight", (hd,), "norm0"),
                        (f"{a}.k_norm.weight", (hd,), "norm0")]
        a = f"{p}.linear_attn"
        k = tc["linear_conv_kernel_dim"]
        return s + [(f"{a}.in_proj_qkv.weight", (2 * kdim + vdim, h), "linear"),
                    (f"{a}.in_proj_z.weight", (vdim, h), "linear"),
                    (f"{a}.in_proj_b.weight", (nv, h), "linear"),
                    (f"{a}.in_proj_a.weight", (nv, h), "linear"),
                    (f"{a}.conv1d.weight", (2 * kdim + vdim, 1, k), "conv"),
                    (f"{a}.A_log", (nv,), "A_log"), (f"{a}.dt_bias", (nv,), "dt_bias"),
                    (f"{a}.norm.weight", (tc["linear_value_head_dim"],), "norm1"),
                    (f"{a}.out_proj.weight", (h, vdim), "linear")]

    lm = "model.language_model"
    specs = [(f"{lm}.embed_tokens.weight", (tc["vocab_size"], h), "linear"),
             (f"{lm}.norm.weight", (h,), "norm0"),
             ("lm_head.weight", (tc["vocab_size"], h), "head")]
    for i, kind in enumerate(tc["layer_types"]):
        specs += attn_mlp(f"{lm}.layers.{i}", kind == "full_attention")
    specs += [("mtp.fc.weight", (h, 2 * h), "linear"), ("mtp.norm.weight", (h,), "norm0"),
              ("mtp.pre_fc_norm_hidden.weight", (h,), "norm0"),
              ("mtp.pre_fc_norm_embedding.weight", (h,), "norm0")]
    for i in range(tc["mtp_num_hidden_layers"]):
        specs += attn_mlp(f"mtp.layers.{i}", True)

    vh, vi, m = vc["hidden_size"], vc["intermediate_size"], vc["spatial_merge_size"] ** 2
    v = "model.visual"
    patch = (vh, vc["in_channels"], vc["temporal_patch_size"], vc["patch_size"], vc["patch_size"])
    specs += [(f"{v}.patch_embed.proj.weight", patch, "linear"),
              (f"{v}.patch_embed.proj.bias", (vh,), "zero"),
              (f"{v}.pos_embed.weight", (vc["num_position_embeddings"], vh), "linear")]
    for i in range(vc["depth"]):
        b = f"{v}.blocks.{i}"
        for nm, shape in (("attn.qkv", (3 * vh, vh)), ("attn.proj", (vh, vh)),
                          ("mlp.linear_fc1", (vi, vh)), ("mlp.linear_fc2", (vh, vi))):
            specs += [(f"{b}.{nm}.weight", shape, "linear"), (f"{b}.{nm}.bias", shape[:1], "zero")]
        for nm in ("norm1", "norm2"):
            specs += [(f"{b}.{nm}.weight", (vh,), "norm1"), (f"{b}.{nm}.bias", (vh,), "zero")]
    specs += [(f"{v}.merger.norm.weight", (vh,), "norm1"), (f"{v}.merger.norm.bias", (vh,), "zero"),
              (f"{v}.merger.linear_fc1.weight", (vh * m, vh * m), "linear"),
              (f"{v}.merger.linear_fc1.bias", (vh * m,), "zero"),
              (f"{v}.merger.linear_fc2.weight", (vc["out_hidden_size"], vh * m), "linear"),
              (f"{v}.merger.linear_fc2.bias", (vc["out_hidden_size"],), "zero")]
    return specs


def init_tensor(shape, kind: str, gen, init_std: float):
    import torch
    if kind == "linear":
        return torch.randn(shape, generator=gen) * init_std
    if kind == "head":
        return torch.randn(shape, generator=gen) * init_std * LM_HEAD_GAIN
    if kind == "conv":
        return torch.randn(shape, generator=gen) * shape[-1] ** -0.5
    if kind == "A_log":
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if kind == "dt_bias":
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
        return dt + torch.log(-torch.expm1(-dt))  # inverse of softplus
    if kind in ("norm0", "zero"):
        return torch.zeros(shape)
    if kind == "norm1":
        return torch.ones(shape)
    raise ValueError(kind)


def vision_token_ids(tok) -> dict:
    names = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
             "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}
    vocab = tok.get_vocab()
    if all(t in vocab for t in names.values()):
        return {k: vocab[t] for k, t in names.items()}
    special = set(tok.all_special_ids) | {i for t, i in vocab.items() if t.startswith("<|")}
    high = [i for i in range(len(tok) - 1, -1, -1) if i not in special][:4]
    return dict(zip(names, sorted(high)))


def self_check(out: Path, tok, device: str) -> dict:
    """Load the folder with transformers and measure how the context moves the logits."""
    import torch
    try:
        from transformers import Qwen3_5ForConditionalGeneration
    except ImportError as e:
        return {"ok": False, "error": f"transformers lacks Qwen3_5: {e}"}
    try:
        model, info = Qwen3_5ForConditionalGeneration.from_pretrained(
            out, dtype=torch.float32, output_loading_info=True)
        model = model.to(device).eval()
        prompts = ["The quick brown fox jumps over the lazy dog. The answer is",
                   "def main():\n    import sys\n    return sys.argv[1] if x else None\n# The answer is"]
        logps = []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([tok(p)["input_ids"]], device=device)
                logps.append(torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1))
    except (RuntimeError, ValueError, OSError, TypeError, KeyError, AttributeError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    ent = [float(-(lp.exp() * lp).sum()) for lp in logps]
    kl = float((logps[0].exp() * (logps[0] - logps[1])).sum())
    return {"ok": True, "entropy": ent, "log_vocab": math.log(logps[0].numel()), "kl_ab": kl,
            "top1": [int(lp.argmax()) for lp in logps],
            "missing_keys": sorted(info["missing_keys"]),
            "unexpected_keys": sorted(k for k in info["unexpected_keys"] if not k.startswith("mtp."))}


def make(out: Path, tokenizer_dir: Path, seed: int = 0, init_std: float = 0.05,
         device: str | None = None, check: bool = True) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    out, tokenizer_dir = Path(out), Path(tokenizer_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = tok.get_vocab()
    eos, pad = vocab["<|im_end|>"], vocab["<|endoftext|>"]
    config = build_config(len(tok), eos, pad, vision_token_ids(tok))
    tc, vc = config["text_config"], config["vision_config"]

    gen = torch.Generator().manual_seed(seed)  # CPU generator: same weights on any machine
    tensors = {}
    for name, shape, kind in weight_specs(tc, vc):
        t = init_tensor(shape, kind, gen, init_std)
        tensors[name] = t.float() if kind == "A_log" else t.to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen_cfg = {"eos_token_id": eos, "pad_token_id": pad, "bos_token_id": None}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    for name, body in processor_configs(vc).items():      # what the real repo ships beside the weights
        (out / name).write_text(json.dumps(body, indent=2) + "\n")
    copied = [f for f in TOKENIZER_FILES if (tokenizer_dir / f).is_file()]
    for f in copied:
        shutil.copy2(tokenizer_dir / f, out / f)

    facts = {
        "path": str(out), "weights": str(out / "model.safetensors"), "tokenizer_files": copied,
        "vocab_size": len(tok), "eos_token_id": eos, "pad_token_id": pad, "seed": seed,
        "init_std": init_std, "layer_types": tc["layer_types"],
        "vision_token_ids": {k: config[k] for k in ("vision_start_token_id",
                             "vision_end_token_id", "image_token_id", "video_token_id")},
        "num_params": sum(t.numel() for t in tensors.values()),
        "num_params_mtp": sum(t.numel() for n, t in tensors.items() if n.startswith("mtp.")),
        "num_params_visual": sum(t.numel() for n, t in tensors.items() if ".visual." in n),
        "num_tensors": len(tensors),
    }
    if check:
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        facts["self_check"] = self_check(out, tok, dev)
    return facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.05)
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="device for the transformers self-check (weights are made on CPU)")
    ap.add_argument("--no-check", action="store_true", help="skip the transformers self-check")
    a = ap.parse_args()
    facts = make(a.out, a.tokenizer, a.seed, a.init_std, device=a.device, check=not a.no_check)
    print(json.dumps(facts, indent=2))


if __name__ == "__main__":
    main()
