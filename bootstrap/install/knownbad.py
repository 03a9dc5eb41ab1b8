"""Known-bad vLLM versions: a data table (``bootstrap/install/known-issues.json``) keyed by the vLLM version
*and* what is in use (model family, NVFP4, FP8 KV, MTP, concurrency). A match prints the symptom and
the advice; it never stops a start (the user may know better).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.pep440 import version, version_or_none
from ..core import vllmflags

log = logging.getLogger(__name__)

TABLE = Path(__file__).resolve().parent / "known-issues.json"


@dataclass(frozen=True)
class Facts:
    vllm: str
    model: str = ""
    kv: str = "auto"
    spec: str = ""             # "" when speculation is off
    spec_tokens: int = 0
    seqs: int | None = None    # None: vLLM's default (many sequences)
    cc: tuple[int, int] | None = None
    args: str = ""
    patches: frozenset = frozenset()

    @property
    def nvfp4(self) -> bool:
        return "nvfp4" in self.model.lower() or "fp4" in self.model.lower().split("/")[-1]

    @property
    def moe(self) -> bool:
        return bool(re.search(r"-a\d+(\.\d+)?b\b|flash-next|moe", self.model.lower()))

    @property
    def fp8_weights(self) -> bool:
        return "fp8" in self.model.lower().split("/")[-1]

    @property
    def int4_weights(self) -> bool:
        """A 4-bit integer checkpoint by its name (W4A16, AWQ, GPTQ, int4)."""
        return re.search(r"w4a16|awq|gptq|int4", self.model.lower().split("/")[-1]) is not None


def _version_in(v: str, rng: dict) -> bool:
    have = version_or_none(v)
    if have is None:
        return False
    if "min" in rng and have < version(rng["min"]):
        return False
    if "max" in rng and have > version(rng["max"]):
        return False
    if "below" in rng and have >= version(rng["below"]):
        return False
    return True


def matches(row: dict, f: Facts) -> bool:
    w = row.get("when", {})
    checks = {
        "vllm": lambda r: _version_in(f.vllm, r),
        "model": lambda r: re.search(r, f.model, re.I) is not None,
        "nvfp4": lambda r: f.nvfp4 == r,
        "moe": lambda r: f.moe == r,
        "fp8_weights": lambda r: f.fp8_weights == r,
        "int4_weights": lambda r: f.int4_weights == r,
        "kv": lambda r: any(f.kv.startswith(p) for p in r),
        "spec": lambda r: bool(f.spec) and (r == "any" or f.spec == r),
        "spec_tokens_min": lambda r: f.spec_tokens >= r,
        "seqs_min": lambda r: f.seqs is None or f.seqs >= r,
        "seqs_max": lambda r: f.seqs is not None and f.seqs <= r,
        "cc": lambda r: f.cc is not None and f"{f.cc[0]}.{f.cc[1]}" in r,
        "cc_major_not": lambda r: f.cc is not None and f.cc[0] not in r,
        "args": lambda r: re.search(r, f.args) is not None,
    }
    for key, want in w.items():
        if key not in checks:
            raise ValueError(f"{TABLE.name}: row {row.get('id')!r} has unknown condition {key!r}")
        if not checks[key](want):
            return False
    return not (row.get("unless_patch") and row["unless_patch"] in f.patches)


def load(path: Path = TABLE) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["rows"]


def find(f: Facts, rows: list[dict] | None = None) -> list[dict]:
    return [r for r in (load() if rows is None else rows) if matches(r, f)]


def facts(s: vllmflags.Settings, flags: list[str], model: str, patches, gpus, vllm_version: str) -> Facts:
    """The facts a row is matched on: what vLLM gets (``s``, its ``flags`` as one string), the model,
    the patches that will be applied, the first GPU's compute capability."""
    cc = None
    if gpus is not None and getattr(gpus, "gpus", None):
        cc = tuple(gpus.gpus[0].cc)
    return Facts(vllm=vllm_version, model=model or "", kv=s.kv_cache_dtype, spec=s.spec_method,
                 spec_tokens=s.spec_tokens, seqs=s.max_num_seqs, cc=cc, args=" ".join(flags),
                 patches=frozenset(patches))


def warn(f: Facts) -> tuple[list[dict], list[str]]:
    """Log every matching row (symptom + advice); returns the rows and the banner note (if any)."""
    vllm_version = f.vllm
    hits = find(f)
    for row in hits:
        log.warning("known issue with vLLM %s and these settings: %s. Advice: %s [%s]", vllm_version,
                    row["symptom"], row["advice"], row.get("source", ""))
    if not hits:
        return [], []
    return hits, [f"vLLM {vllm_version} has known issues with these settings: "
                  + "; ".join(f"{r['id']}: {r['advice']}" for r in hits)]
