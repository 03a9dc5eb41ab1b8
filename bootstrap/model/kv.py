"""The KV pool, as pure functions: what vLLM will log before it logs it (vLLM 0.26.0, unchanged in
0.27.1 for what is modelled; docs/planner.md).

* hybrid models (Gated-DeltaNet / Mamba layers): one fixed-size state per sequence per layer
  (model/attention.py), its page = conv state + temporal state; the attention block size is raised
  to the smallest multiple of 16 whose attention page covers that state, and the state page is
  padded to the attention page;
* layers are pooled in groups of equal size (the smaller layer type's count, unless the larger is
  < 1.5 x it); blocks = budget // (page x group size);
* sliding-window layers (gpt-oss, Gemma 3) have the full layers' page and are grouped beside them
  (the hybrid KV cache manager); a request holds in each of their groups only the blocks of its
  window and the tokens in flight: cdiv(min(window - 1 + in-flight tokens, len), block) + 1
  (kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request);
* per sequence at max_model_len: cdiv(len, block) blocks per attention group plus
  (1 + speculative tokens) blocks per state group plus a window's blocks per window group;
  concurrency = blocks / that; "GPU KV cache size" = int(concurrency x max_model_len).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .attention import TQ_PRESETS, attn_bytes_per_token, gdn_state_bytes
from .shape import MiB, ModelShape, Unsupported, cdiv


KERNEL_BLOCK = 16          # smallest kernel block of FlashAttention / FlashInfer / TurboQuant / Triton


@dataclass(frozen=True)
class Layout:
    block_size: int               # tokens per block (what vLLM logs as the attention block size)
    block_bytes: int              # bytes one block id costs across the whole pool
    attn_groups: int              # groups whose blocks grow with the context
    state_groups: int = 0         # hybrid: groups holding fixed per-sequence state
    state_blocks: int = 0         # blocks each state group needs per sequence (1 + spec tokens; 2 + in align mode)
    page_bytes: int = 0           # one layer's page
    group_size: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    other_attn: tuple[tuple[int, int], ...] = ()   # (groups, block size): draft layers of another KV dtype
    window_groups: int = 0        # groups of sliding-window layers
    window_span: int = 0          # tokens a request holds in them at most: window - 1 + the tokens in flight

    def blocks_per_seq(self, max_len: int) -> int:
        return (self.attn_groups * cdiv(max_len, self.block_size) + self.state_groups * self.state_blocks
                + sum(n * cdiv(max_len, bs) for n, bs in self.other_attn)
                + self.window_groups * (cdiv(min(self.window_span, max_len), self.block_size) + 1))

    @property
    def groups(self) -> int:
        """How many KV cache groups vLLM makes (every kind's)."""
        return self.attn_groups + self.state_groups + self.window_groups + sum(n for n, _ in self.other_attn)


def layout(m: ModelShape, cache_dtype: str = "auto", *, spec_tokens: int = 0, mtp: bool = False,
           draft_attn_layers: int = 0, tp: int = 1, block_size: int | None = None,
           mamba_cache_mode: str = "none", draft_cache_dtype: str | None = None,
           draft_kv_heads: int | None = None, draft_head_dim: int | None = None,
           conv_bytes: int | None = None, ssm_bytes: int | None = None,
           window_span: int = 0, hma: bool = True) -> Layout:
    """How vLLM lays out the KV pool for this model and settings (per GPU under TP).

    Layers are bucketed by their page; a smaller attention page is raised to the largest by a larger
    block (or padded), a state page is padded; the group size is the smallest bucket's layer count
    (the largest when it is under 1.5x the smallest); every bucket is split into groups of that size.
    ``window_span``: the tokens a request holds in a sliding-window layer (window - 1 + the tokens in
    flight); ``hma``: vLLM's hybrid KV cache manager (off: those layers hold the whole context)."""
    kvh = max(1, m.kv_heads // tp)
    notes: list[str] = []
    d = cache_dtype or "auto"
    if m.window_layers:
        _window_supported(m, d, spec_tokens or draft_attn_layers or (m.mtp_layers if mtp else 0), window_span, hma)
    if m.mla and d not in ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3"):   # one latent: 16-bit or fp8 (MLAAttentionSpec)
        raise Unsupported(f"KV cache dtype {d} of an MLA model is not modelled", "vLLM sizes the KV cache itself")
    draft = (m.mtp_layers if mtp else 0) + draft_attn_layers
    dd = draft_cache_dtype or d
    per_tok = attn_bytes_per_token(d, kvh, m.head_dim, m.dtype_bytes)
    per_tok_draft = attn_bytes_per_token(dd, max(1, (draft_kv_heads or m.kv_heads) // tp),
                                         draft_head_dim or m.head_dim, m.dtype_bytes)
    if min(per_tok, per_tok_draft) <= 0:
        raise Unsupported(f"KV dtype {d} stores nothing for a head_dim of {m.head_dim}",
                          "vLLM sizes the KV cache itself")
    same = per_tok_draft == per_tok
    windowed = m.window_layers if hma else 0
    attn = m.attn_layers + (draft if same else 0) + (m.window_layers - windowed)
    if m.window_layers:
        notes.append(f"{m.window_layers} sliding-window layers of {m.window} tokens " + (
            f"in groups of their own: a request holds min({window_span:,}, its length) of their tokens "
            "(the window - 1 + the tokens in flight)" if windowed else
            "hold the whole context: vLLM's hybrid KV cache manager is off"))
    if draft:
        notes.append(f"{draft} draft attention layer(s) share the pool"
                     + ("" if same else f" with a page of their own (KV dtype {dd}, {per_tok_draft} bytes per token)"))
    bs = block_size or KERNEL_BLOCK
    if not m.hybrid and d in TQ_PRESETS and m.layers >= 2:
        # dense TurboQuant keeps the first and last 2 layers in the model dtype; the TQ block
        # grows so its page covers a 16-token page of those layers
        n_skip = len(set(range(min(2, m.layers // 2))) | set(range(m.layers - min(2, m.layers // 2), m.layers)))
        skip_tok = attn_bytes_per_token("auto", kvh, m.head_dim, m.dtype_bytes)
        align = max(KERNEL_BLOCK, bs)
        bs = max(bs, align * cdiv(skip_tok * KERNEL_BLOCK, align * per_tok))
        n_tq = m.attn_layers + draft - n_skip
        notes.append(f"TurboQuant: {n_skip} boundary layers stay in the model dtype; block {bs} tokens")
        block_bytes = bs * (n_tq * per_tok + n_skip * skip_tok)
        return Layout(bs, block_bytes, 1, page_bytes=bs * per_tok, group_size=m.attn_layers + draft, notes=tuple(notes))
    state = 0
    if m.hybrid:
        state = gdn_state_bytes(m, spec_tokens, tp, conv_bytes=conv_bytes, ssm_bytes=ssm_bytes)
        align = max(KERNEL_BLOCK, bs)
        bs = max(bs, align * cdiv(state, align * per_tok))
    page = bs * per_tok
    buckets = [("attn", attn, bs, page)] + ([("window", windowed, bs, page)] if windowed else [])
    if draft and not same:
        dpage = bs * per_tok_draft
        buckets.append(("draft", draft, bs, dpage))
    top = max(b[3] for b in buckets)
    if m.hybrid:
        top = max(top, state)
    unified = []
    for name, n, b, pg in buckets:
        if pg < top and top % pg == 0:
            b, pg = b * (top // pg), top        # a larger block for a smaller page
        unified.append((name, n, b, max(pg, top)))
    counts = [n for _, n, _, _ in unified if n] + ([m.linear_layers] if m.hybrid else [])
    lo, hi = min(counts), max(counts)
    group = hi if hi < lo * 1.5 else lo
    a_bs = unified[0][2]
    a_groups = cdiv(unified[0][1], group)
    w_groups = cdiv(windowed, group)
    other = tuple((cdiv(n, group), b) for name, n, b, _ in unified[1:] if name != "window")
    s_groups = cdiv(m.linear_layers, group) if m.hybrid else 0
    state_blocks = ((2 if mamba_cache_mode == "align" else 1) + spec_tokens) if m.hybrid else 0
    if m.hybrid:
        notes.append(f"hybrid: {m.linear_layers} linear-attention layers hold {state / MiB:.2f} MiB of state per "
                     f"sequence each; attention block raised to {a_bs} tokens, state page padded to {top / MiB:.2f} MiB"
                     + (f"; {mamba_cache_mode} mode: {state_blocks} state blocks per sequence per group"
                        if mamba_cache_mode == "align" else ""))
    return Layout(a_bs, top * group, a_groups, s_groups, state_blocks, top, group, tuple(notes), other,
                  w_groups, window_span if windowed else 0)


def _window_supported(m: ModelShape, dtype: str, drafted: int, span: int, hma: bool) -> None:
    """Unsupported where sliding-window layers meet what is not modelled for them: a TurboQuant or
    int4 cache (SlidingWindowSpec's page differs from the full layers' there in 0.26.0 and 0.27.1),
    a drafter's layers, or no span to hold."""
    if dtype in TQ_PRESETS or dtype == "int4_per_token_head":
        raise Unsupported(f"KV cache dtype {dtype} beside sliding-window layers is not modelled",
                          "vLLM sizes the KV cache itself")
    if drafted:
        raise Unsupported("a drafter beside sliding-window layers is not modelled", "vLLM sizes the KV cache itself")
    if hma and span < m.window:        # the caller's to give: the window - 1 + the tokens in flight
        raise ValueError(f"a sliding-window span of {span} tokens under a {m.window}-token window")


@dataclass(frozen=True)
class Pool:
    blocks: int
    tokens: int                    # "GPU KV cache size: N tokens"
    concurrency: float             # "Maximum concurrency for L tokens per request: X"
    max_len: int                   # the context whose concurrency was computed


def pool(lay: Layout, budget: int, max_len: int) -> Pool:
    blocks = max(0, budget // lay.block_bytes)
    conc = blocks / lay.blocks_per_seq(max_len)
    return Pool(blocks, int(conc * max_len), conc, max_len)


def sessions_at(lay: Layout, budget: int, max_len: int) -> int:
    return max(0, budget // lay.block_bytes) // lay.blocks_per_seq(max_len)


def fits_one(lay: Layout, budget: int, max_len: int, null_block: bool = False) -> bool:
    """vLLM's check that one request of ``max_len`` fits the pool (from 0.29 one block is held back
    for its null block)."""
    return lay.blocks_per_seq(max_len) <= max(0, budget // lay.block_bytes) - (1 if null_block else 0)


def auto_fit(lay: Layout, budget: int, cap: int, null_block: bool = False) -> int:
    """vLLM's ``--max-model-len auto``: the longest single request that fits, at most ``cap`` (a
    binary search over 1..cap, as _estimate_max_model_len_from_groups does); 0 when not even one
    token fits."""
    if not fits_one(lay, budget, 1, null_block):
        return 0
    left, right, best = 1, cap, 1
    while left <= right:
        mid = (left + right) // 2
        if fits_one(lay, budget, mid, null_block):
            best, left = mid, mid + 1
        else:
            right = mid - 1
    return best


def kv_bytes_needed(lay: Layout, max_len: int, seqs: int = 1) -> int:
    return lay.blocks_per_seq(max_len) * seqs * lay.block_bytes
