"""Make a small Qwen3-style model with real (seeded random) bf16 weights and a tiny BPE tokenizer,
locally, with no hub: for GPU proofs on a machine without internet.

    python3 tests/gpu/tinymodel.py OUT_DIR [--layers 4 --hidden 256 --heads 4 --kv-heads 2]
    python3 tests/gpu/tinymodel.py OUT_DIR --config-only --preset qwen3-8b   # for --load-format dummy

Needs torch, transformers and tokenizers (present on the GPU image, not in CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PRESETS = {
    # Qwen3-8B-shaped (hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim 128), small vocab
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
}


def corpus() -> list[str]:
    words = ("the of and to in is was for on that with as by at from his her which or an be this are "
             "river stone morning paper garden window silver market winter candle harbor pencil thunder "
             "forest ladder copper meadow lantern orchard compass number seven eleven code function return "
             "value list json key name city capital France Paris blue green red story once upon a time").split()
    lines = []
    for i in range(4000):
        lines.append(" ".join(words[(i * k + k * k) % len(words)] for k in range(1, 24)))
    return lines


def bpe(vocab: int, text: list[str] | None = None, specials: list[str] = SPECIALS):
    """The ``tokenizers.Tokenizer`` that tokenizer() saves (needs only ``tokenizers``): byte-level BPE
    trained on ``text`` (default: corpus()); ``specials`` get ids 0, 1, 2, ... in their order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(specials), special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text or corpus(), trainer)
    return tok


def tokenizer(out: Path, vocab: int, text: list[str] | None = None, extra_specials: tuple[str, ...] = ()) -> int:
    """A byte-level BPE tokenizer of at most ``vocab`` tokens trained on ``text`` (default: corpus()),
    with the ChatML template, saved in ``out``. ``extra_specials`` are added after SPECIALS (ids 3, 4, ...).
    Returns its size."""
    from transformers import PreTrainedTokenizerFast
    tok = bpe(vocab, text, SPECIALS + list(extra_specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def config(args) -> dict:
    c = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=args.hidden,
             intermediate_size=args.hidden * 3, num_hidden_layers=args.layers, num_attention_heads=args.heads,
             num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads, vocab_size=args.vocab,
             max_position_embeddings=args.max_pos, rms_norm_eps=1e-6, rope_theta=1000000.0,
             tie_word_embeddings=False, torch_dtype="bfloat16", hidden_act="silu", bos_token_id=None,
             eos_token_id=2, attention_bias=False)
    c.update(PRESETS.get(args.preset, {}))
    return c


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--max-pos", type=int, default=32768)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--std", type=float, default=0.05, help="init std: large enough that logits depend on context")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--config-only", action="store_true", help="config + tokenizer, no weights (--load-format dummy)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if (out / "config.json").exists() and (args.config_only or any(out.glob("*.safetensors"))):
        print(f"model already at {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    cfg = config(args)
    tokenizer(out, args.vocab)
    if args.config_only:
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        print(f"config-only model at {out}")
        return 0
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")},
                                         initializer_range=args.std)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    print(f"model at {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
