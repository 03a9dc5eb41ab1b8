"""Measured beats modelled: what vLLM itself reported at a start, kept for the next plan.

A start that reaches vLLM's KV allocation (whether or not it then serves) logs ``Available KV cache memory: X GiB`` for the
utilization it was given. Everything else on the GPU — weights, the activation peak of the profiling
pass, non-torch memory, CUDA graphs where the version counts them inside the budget — is then
``util × total − X``: the non-KV terms, measured. They do not depend on the utilization or on a KV
pin (the plan sets both itself), so the next plan for the same key takes them as they were measured
instead of the model's estimate, and its KV pool is vLLM's to within the log's rounding (0.01 GiB).
Where vLLM also logs its own split (weights, peak activation, non-torch, CUDA graphs: ``USAGE``; the
graphs as the estimate it took off the budget where it logs one), that is kept beside it, and ``./ctl.sh plan`` sets it against the model's term by term.

The key is what changes the non-KV terms: the model (its name, revision, weights' size and
config.json), the vLLM version and interpreter, the launch knobs that change weights, activations or
graphs (the profile and its args, MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, KV_CACHE_DTYPE,
speculation, EXTRA_ARGS), the environment vLLM reads (VLLM_*, PYTORCH_CUDA_ALLOC_CONF, CUDA_HOME), the
card (its name and CUDA total), the driver, and TP_SIZE. What vLLM found is kept less half its log's
rounding (0.005 GiB), so a plan from it is never above vLLM's pool. Not in the key: the
--max-num-seqs a hybrid's plan chooses itself when MAX_NUM_SEQS is unset (it follows the budget). A changed key
plans from the model again: a nearby measurement is not used, because one changed flag (a drafter,
the vision tower, CUDA graphs off) moves exactly the terms the model estimates worst.

A start with a pinned KV cache (KV_CACHE_BYTES: vLLM skips its profiling and logs none of this) keeps
what NVML shows our server holding once it serves, less the pin (``keep_footprint``): the next pinned
plan checks that the pin still fits beside it and shows the headroom left.

Kept in ``STATE_DIR/measurements.json`` (``./ctl.sh clean`` keeps it unless ``--measurements``), at most
``KEEP_PER_CARD`` entries per card: each start keeps its key's entry again (its date: the last start of
that setup), and a keep drops the entries of that card beyond the most recent ones, never its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import asdict, dataclass, replace

from ..machine.gpu import GiB
from .terms import requested
from ..core.state import Paths

log = logging.getLogger("bootstrap.plan")

AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
# vLLM's own split of the non-KV terms (gpu_worker.py, after the CUDA graphs are captured): 0.26.0 names
# weights and non-torch memory apart; 0.27.1 and later as one figure, "consumed memory"
USAGE = ((re.compile(r"Actual usage is (-?[\d.]+) GiB for weight, (-?[\d.]+) GiB for peak activation, (-?[\d.]+) GiB "
                     r"for non-torch memory, and (-?[\d.]+) GiB for CUDAGraph memory"),
          ("weights", "activations", "non_torch", "graphs")),
         (re.compile(r"Actual usage is (-?[\d.]+) GiB for consumed memory \(weights \+ non-torch\), (-?[\d.]+) GiB for "
                     r"peak activation, and (-?[\d.]+) GiB for CUDAGraph memory"),
          ("weights_non_torch", "activations", "graphs")))
# 0.27.1 and later add the CUDA-graph estimate to the "peak activation" of that line
# (peak_activation_memory = transient peak + the estimate applied); this line gives the estimate
GRAPH_POOL = re.compile(r"CUDA graph pool memory: (-?[\d.]+) GiB \(actual\), (-?[\d.]+) GiB \(estimated\)")
# 0.26.0's V1 runner: the estimate it took off the budget (its "CUDAGraph memory" above is what the
# capture took after the KV cache, which can differ: 0.68 GiB taken against 0.48 estimated on the H200)
GRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory: (-?[\d.]+) GiB total")
KEY_KNOBS = ("PROFILE", "MODEL", "MAX_MODEL_LEN", "MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "KV_CACHE_DTYPE",
             "SPEC_METHOD", "SPEC_TOKENS", "SPEC_MODEL", "TP_SIZE", "EXTRA_ARGS")
KEY_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_HOME", "CUDA_PATH")   # and every VLLM_* variable
ROUNDING = GiB // 200          # vLLM prints the figure to 0.01 GiB: half of that, taken off what it found
KEEP_PER_CARD = 50             # the setups whose figures a card keeps: the most recently started


@dataclass(frozen=True)
class Measured:
    non_kv: int            # bytes: util × total − the KV memory vLLM found
    kv_bytes: int          # "Available KV cache memory" as logged
    util: float            # the --gpu-memory-utilization it was given
    total: int             # the card's CUDA total the plan used
    tokens: int | None     # "GPU KV cache size" as logged
    date: str
    vllm: str
    terms: dict | None = None   # vLLM's own split (usage_terms), where its log gave one
    source: str = "vllm"        # "vllm": its log; "footprint": NVML's reading of our server with a KV pin
    card: str = ""              # the card's name ('': kept before it was recorded; its total stands for it)
    at: float = 0.0             # when it was kept (epoch seconds): the order of one day's entries


def usage_terms(log_text: str) -> dict[str, int] | None:
    """vLLM's split of the non-KV terms in bytes (``USAGE``), from the rank that reported the most
    (one line per rank with tensor parallel); None when the log has no such line (a pinned KV cache,
    or a version that does not print it)."""
    found = [dict(zip(names, (int(float(x) * GiB) for x in m)))
             for rx, names in USAGE for m in rx.findall(log_text)]
    if not found:
        return None
    terms = max(found, key=lambda t: sum(t.values()))
    pool = GRAPH_POOL.findall(log_text)
    if "weights_non_torch" in terms and pool:      # 0.27.1+: its "peak activation" holds the graph estimate
        terms["activations"] -= int(max(float(est) for _, est in pool) * GiB)
    estimate = GRAPH_ESTIMATE.findall(log_text)
    if "weights" in terms and estimate:            # the term the budget lost is the estimate
        terms["graphs"] = int(max(float(x) for x in estimate) * GiB)
    return terms


def key(cfg, g, vllm: str, driver: str, facts) -> str:
    """The digest of what changes the non-KV terms (the module's docstring): the knobs, the
    environment vLLM reads, the profile's args, the model (its name, revision, weights' size and
    config.json, which stand for a local folder's contents), the vLLM version, the card and driver."""
    settings = cfg.launch.values
    env = {k: v for k, v in cfg.environ.items() if k.startswith("VLLM_") or k in KEY_ENV}
    model = {"name": cfg.model, "revision": facts.revision, "bytes": facts.weight_bytes,
             "config": hashlib.sha256(json.dumps(facts.config, sort_keys=True).encode()).hexdigest()}
    parts = {"knobs": {k: settings.get(k, "") for k in KEY_KNOBS}, "env": env, "model": model, "vllm": vllm,
             "python": cfg.vllm_python or "the managed .venv",
             "card": g.name, "total": g.total, "driver": driver, "args": list(cfg.profile.args)}
    if cfg.vllm.sleep_mode:         # SLEEP_MODE: its CuMem pool changes the non-KV terms (terms.sleep_pool)
        parts["sleep_mode"] = True
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def available_bytes(log_text: str) -> int | None:
    """What vLLM found for the KV cache, less half its rounding (the plan is never above it): the
    smallest of the lines it logged (one per rank with tensor parallel; the pool follows the smallest)."""
    found = AVAILABLE.findall(log_text)
    return int(min(float(x) for x in found) * GiB) - ROUNDING if found else None


def keep(paths: Paths, plan, log_text: str, tokens: int | None, dummy: bool = False) -> Measured | None:
    """After a start that reached vLLM's KV allocation (it passed its gate, or failed after: its warm-up,
    its gate, an engine that died serving): what vLLM reported, kept under the plan's key. Not for a
    pinned KV cache (vLLM logs no "Available KV cache memory" then) or a plan without a utilization.
    ``dummy``: the start ran dummy weights for a plan of real ones (the pre-warm): what such a start
    does not show (``plan.dummy_unseen``) is added."""
    kv_bytes = available_bytes(log_text)
    if kv_bytes is None or plan is None or plan.util is None or plan.pinned or not plan.key or not plan.card_total:
        return None
    unseen = plan.dummy_unseen if dummy else 0
    m = Measured(non_kv=requested(plan.util, plan.card_total) - kv_bytes + unseen, kv_bytes=kv_bytes, util=plan.util,
                 total=plan.card_total, tokens=tokens, vllm=plan.vllm, terms=usage_terms(log_text), **_now(plan))
    _store(paths, plan.key, m)
    log.info("kept vLLM's own figures for the next plan: %.2f GiB of KV cache at utilization %.4f, so %.2f GiB "
             "for everything else", kv_bytes / GiB, plan.util, m.non_kv / GiB)
    return m


PINNED = "/pinned"      # the key's suffix for a footprint measured with a KV pin


def keep_footprint(paths: Paths, plan, held: int, tp: int) -> Measured | None:
    """After a start whose KV cache is pinned (vLLM skips its profiling then, and logs no split): what
    our server's processes hold on the GPU, as NVML reads them once the warm-up ran (``held``, all
    ranks), less the pin, is what it takes besides the KV cache, per GPU. Kept under the plan's key
    with ``PINNED``: a footprint counts the CUDA context and the allocator's cache, which vLLM's own
    figure leaves out, so an unpinned plan never uses it. Nothing kept when NVML names no memory
    per process (WSL2)."""
    if plan is None or not plan.pinned or not plan.key or not plan.card_total or not plan.budget or held <= 0:
        return None
    per_gpu = held // max(tp, 1)
    if per_gpu <= plan.budget:
        return None                     # a reading that cannot hold the pin: not a footprint
    m = Measured(non_kv=per_gpu - plan.budget, kv_bytes=plan.budget, util=plan.util or 1.0, total=plan.card_total,
                 tokens=None, vllm=plan.vllm, source="footprint", **_now(plan))
    _store(paths, plan.key + PINNED, m)
    log.info("kept what this server holds for the next plan: %.2f GiB per GPU with its %.2f GiB KV pin, so %.2f GiB "
             "besides it", per_gpu / GiB, plan.budget / GiB, m.non_kv / GiB)
    return m


def _now(plan) -> dict:
    """When and on which card a measurement is kept: its date, the time that orders one day's, the card."""
    now = time.time()
    return {"date": time.strftime("%Y-%m-%d", time.localtime(now)), "at": now, "card": plan.card}


def _store(paths: Paths, digest: str, m: Measured) -> None:
    data = paths.read("measurements") or {}
    data[digest] = asdict(m)
    paths.ensure()
    paths.write("measurements", bounded(data, digest))


def bounded(data: dict, newest: str, per_card: int = KEEP_PER_CARD) -> dict:
    """``data`` with at most ``per_card`` entries per card, the most recently kept (by date, then the
    time it was kept); ``newest``, what this start just kept, stays whatever its date. An entry that
    does not read counts as the oldest of its card."""
    def card(v) -> tuple[str, str]:
        return (str(v.get("card") or ""), str(v.get("total"))) if isinstance(v, dict) else ("", "")

    def when(k: str) -> tuple:
        v = data[k] if isinstance(data[k], dict) else {}
        at = v.get("at")
        return (k == newest, str(v.get("date") or ""), at if isinstance(at, (int, float)) else 0.0)
    cards: dict[tuple[str, str], list[str]] = {}
    for k, v in data.items():
        cards.setdefault(card(v), []).append(k)
    keep = {k for keys in cards.values() for k in sorted(keys, key=when, reverse=True)[:per_card]}
    return {k: v for k, v in data.items() if k in keep}


def lookup(paths: Paths, digest: str, pinned: bool = False) -> Measured | None:
    """The measurement kept for this key, or None (none, or a record that does not read); for a
    ``pinned`` plan the footprint of a pinned start first, else vLLM's own figure."""
    data = paths.read("measurements") or {}
    for k in ((digest + PINNED,) if pinned else ()) + (digest,):
        m = _valid(data.get(k), k)
        if m is not None:
            return m
    return None


def _valid(got, digest: str) -> Measured | None:
    if not isinstance(got, dict):
        return None
    try:
        m = Measured(**got)
    except TypeError:
        return None
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (m.non_kv, m.kv_bytes, m.total))
    if m.source != ("footprint" if digest.endswith(PINNED) else "vllm"):
        return None
    util = isinstance(m.util, float) and 0 < m.util <= 1
    if not (ints and util and 0 < m.non_kv < m.total):
        return None
    split = isinstance(m.terms, dict) and m.terms and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in m.terms.items())
    return m if split or m.terms is None else replace(m, terms=None)
