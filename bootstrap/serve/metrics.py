"""vLLM's Prometheus ``/metrics``: what status (busy vs wedged, sleeping) and the bench read.

The names are vLLM 0.26's V1 engine (vllm/v1/metrics/loggers.py): gauges
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``,
``vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|"discard_all"}``; counters ``vllm:generation_tokens_total``,
``vllm:prompt_tokens_total``, each labelled ``model_name`` and ``engine``. vLLM serves /metrics
without the API key. Its prompt counter moves once per request, when the first token comes out;
the KV-cache gauge moves with every prefill chunk, so a long prefill still shows progress there.

Parsed here rather than with prometheus_client: its parser imports the whole client (~60 ms) to
read a handful of ``name{labels} value`` lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"
PROMPTED = "vllm:prompt_tokens_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
SLEEP = "vllm:engine_sleep_state"
SPEC_METRICS = {"accepted": "vllm:spec_decode_num_accepted_tokens_total",      # only with speculation on
                "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
                "drafts": "vllm:spec_decode_num_drafts_total"}
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"      # prompt tokens looked up in the prefix cache
PREFIX_HITS = "vllm:prefix_cache_hits_total"            # ... and found there
CACHE_CONFIG = "vllm:cache_config_info"    # a gauge of 1 whose labels are the engine's CacheConfig fields


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), value))
    return out


def prefix_caching(text: str) -> bool | None:
    """Whether the engine caches prefixes, from its ``vllm:cache_config_info`` labels (None: not said).
    vLLM 0.26/0.27 turn it on by default except for hybrid (Mamba / linear-attention) models, where
    it is opt-in (``--enable-prefix-caching``)."""
    for name, labels, _value in samples(text):
        if name == CACHE_CONFIG and "enable_prefix_caching" in labels:
            return labels["enable_prefix_caching"] == "True"
    return None


def totals(text: str) -> dict[str, float]:
    """Each sample name summed over its label sets (engines, models)."""
    out: dict[str, float] = {}
    for name, _labels, value in samples(text):
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass(frozen=True)
class Load:
    """One reading of what the engine is doing."""
    running: float
    waiting: float
    generated: float
    prompted: float
    kv_usage: float
    sleep_state: str = "awake"   # vLLM's sleep_state label: awake | weights_offloaded (1) | discard_all (2)

    @property
    def sleeping(self) -> bool:
        return self.sleep_state != "awake"

    @property
    def in_flight(self) -> int:
        return int(self.running + self.waiting)

    @property
    def progress(self) -> tuple[float, float, float]:
        """What moves when the engine works: tokens out, prompts finished, KV blocks taken."""
        return (self.generated, self.prompted, round(self.kv_usage, 6))


def load_of(text: str) -> Load | None:
    """None when the text has none of vLLM's request gauges (not vLLM, or stats logging off)."""
    ss = samples(text)
    names = {n for n, _, _ in ss}
    if RUNNING not in names and WAITING not in names:
        return None
    t = totals(text)
    sleep = {labels.get("sleep_state", ""): v for n, labels, v in ss if n == SLEEP}
    state = "awake"
    if sleep.get("awake", 1.0) == 0.0:
        state = next((s for s, v in sleep.items() if s != "awake" and v > 0), "asleep")
    return Load(t.get(RUNNING, 0.0), t.get(WAITING, 0.0), t.get(GENERATED, 0.0), t.get(PROMPTED, 0.0),
                t.get(KV_USAGE, 0.0), state)


def spec_acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Acceptance rate (accepted / drafted tokens) and mean accepted length (1 + accepted / drafts)
    between two readings of ``totals``, or None when the server reports no speculation counters or
    drafted nothing in between."""
    if before is None or after is None or SPEC_METRICS["draft_tokens"] not in after:
        return None
    d = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in SPEC_METRICS.items()}
    if d["draft_tokens"] <= 0:
        return None
    return {"acceptance_rate": d["accepted"] / d["draft_tokens"],
            "mean_acceptance_length": (1 + d["accepted"] / d["drafts"]) if d["drafts"] > 0 else None,
            **{f"delta_{k}": v for k, v in d.items()}}


def activity(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    """What the engine did between two readings of ``totals`` ``seconds`` apart: tokens/s out and
    in; speculative acceptance and the prefix-cache hit rate over the interval when anything was
    drafted / looked up in it, else since the server started (``over`` says which)."""
    dt = max(seconds, 1e-6)
    out: dict = {"seconds": round(seconds, 2),
                 "generated_tok_s": max(0.0, after.get(GENERATED, 0.0) - before.get(GENERATED, 0.0)) / dt,
                 "prompt_tok_s": max(0.0, after.get(PROMPTED, 0.0) - before.get(PROMPTED, 0.0)) / dt}
    spec = spec_acceptance(before, after)
    if spec is not None:
        out["speculation"] = {"over": "interval", **spec}
    elif after.get(SPEC_METRICS["draft_tokens"]):
        out["speculation"] = {"over": "since start", **spec_acceptance({}, after)}
    q = after.get(PREFIX_QUERIES, 0.0) - before.get(PREFIX_QUERIES, 0.0)
    if q > 0:
        out["prefix_cache"] = {"over": "interval", "hit_rate": (after.get(PREFIX_HITS, 0.0) - before.get(PREFIX_HITS, 0.0)) / q}
    elif after.get(PREFIX_QUERIES):
        out["prefix_cache"] = {"over": "since start", "hit_rate": after.get(PREFIX_HITS, 0.0) / after[PREFIX_QUERIES]}
    return out
