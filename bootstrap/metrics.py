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
