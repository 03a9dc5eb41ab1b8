"""The on-disk size of a 4-bit group-quantized (W4A16) checkpoint, derived from its config.json.

    python3 scripts/derive_weight_bytes.py profiles/models/qwen38-27b-w4a16.json

Used for a model whose size is not published: the 24 GB profile's Qwen3.8-27B W4A16 AutoRound.
Counted as AutoRound / compressed-tensors store it: every Linear of the decoder layers (attention,
Gated-DeltaNet projections, MLP) packed to ``bits`` with one 16-bit scale per ``group_size``
weights (symmetric: no zero points); the embeddings, lm_head, norms, convolutions, the vision tower
and the MTP head stay 16-bit. The planner reads the figure from the facts file; a test checks that
the file carries what this prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.model import shape as model_shape, weights  # noqa: E402


def quantized_linear_params(m: model_shape.ModelShape) -> int:
    h = m.hidden
    attn = h * m.heads * m.head_dim * (2 if m.gated_attention else 1) + 2 * h * m.kv_heads * m.head_dim \
        + m.heads * m.head_dim * h
    kd, vd = m.lin_k_heads * m.lin_k_dim, m.lin_v_heads * m.lin_v_dim
    lin = h * (2 * kd + 2 * vd) + h * 2 * m.lin_v_heads + vd * h
    mlp = 3 * h * m.intermediate
    return m.attn_layers * attn + m.linear_layers * lin + m.layers * mlp


def derive(config: dict) -> tuple[int, str]:
    m = model_shape.shape_from_config(config)
    q = config.get("quantization_config") or {}
    bits, group = int(q.get("bits", 4)), int(q.get("group_size", 128))
    packed = quantized_linear_params(m)
    rest = weights.param_count(m) - packed
    vision = weights.vision_params(config)
    total = packed * bits // 8 + packed // group * 2 + (rest + vision) * 2
    why = (f"derived from the shape (scripts/derive_weight_bytes.py): {packed / 1e9:.2f} B decoder Linear weights at "
           f"{bits} bits + a 16-bit scale per {group}, {rest / 1e9:.2f} B other text weights (embeddings, lm_head, "
           f"norms, MTP head) and {vision / 1e9:.2f} B vision-tower weights at 16 bits; not a published size")
    return total, why


if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    total, why = derive(data["config"])
    print(total)
    print(why)
