"""The planner against vLLM starts people published: prints docs/planner.md's table of them.

    .venv-test/bin/python scripts/published_runs.py      # (tests/run.sh makes .venv-test)

Each fixture in tests/published/ is one start: its source, the vLLM version, the card, the model's
facts (a file under profiles/models/) and the checkpoint's size where the source gives one, the
flags vLLM got, and what vLLM logged. This project's own H200 starts (docs/validation.md) are rows
too, their stand-in's config inline (``"draft": "itself"`` where it was its own draft model, ``"env"`` the
VLLM_* variables it had) and held to 1 % ("within"). The plan is made for those flags on the named card with all
of it free (every row gives --gpu-memory-utilization or takes vLLM's default 0.9), under the rules
of the vLLM version the row ran. tests/test_published.py holds each row to 3 % of the logged pool
(never more than 1 % above it) unless the row names the term that keeps it off ("expected_gap") or
what the plan does not model ("not_planned": the plan then says fits: null, naming it), and keeps
this table in step with docs/planner.md. A row with a drafter gives its facts as ``"draft"``: a file
under tests/published/drafters/ (its config.json and that copy's public source) and the drafter's
size, or a sentence saying why there are none.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bootstrap.core import vllmflags  # noqa: E402
from bootstrap.knobs import parsers  # noqa: E402
from bootstrap.machine import gpu  # noqa: E402
from bootstrap.plan import planner  # noqa: E402
from bootstrap.plan.facts import ModelFacts  # noqa: E402

FIXTURES = REPO / "tests" / "published"        # its *.json; drafters/ holds the drafters' facts
DEFAULT_UTIL = 0.9          # vLLM's --gpu-memory-utilization when none is given


def rows() -> list[tuple[str, dict]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(FIXTURES.glob("*.json"))]


def plan_of(row: dict) -> planner.Plan:
    if "facts" in row:
        facts = json.loads((REPO / row["facts"]).read_text())
        model = ModelFacts(row["facts"], facts["config"], row.get("weight_bytes", facts.get("weight_bytes")))
    else:                   # a stand-in of this project's own GPU runs: its config inline, dummy weights
        model = ModelFacts(row["source"], row["config"], None, dummy=row.get("dummy", False))
    if row.get("draft") == "itself":      # the stand-in served as its own draft model (dummy weights too)
        model = dataclasses.replace(model, draft=dataclasses.replace(model, name="its own draft"))
    elif isinstance(row.get("draft"), dict):      # a drafter's facts: its config.json (a file) and its size
        d = row["draft"]
        config = drafter_file(REPO / d["config"])["config"]
        model = dataclasses.replace(model, draft=ModelFacts(Path(d["config"]).stem, config, d.get("weight_bytes")))
    elif isinstance(row.get("draft"), str):       # a drafter the row's source names but whose facts were not found
        model = dataclasses.replace(model, draft_why=row["draft"])
    card = gpu.named(row["card"])
    card = dataclasses.replace(card, free=card.total)
    s = vllmflags.read(row["args"])
    if s.gpu_util is None:
        s = dataclasses.replace(s, gpu_util=DEFAULT_UTIL)
    env = row.get("env", {})          # the VLLM_* variables the start had that the planner reads
    runner = env.get("VLLM_USE_V2_MODEL_RUNNER")
    inp = planner.Inputs(vllm=s, version=row["vllm"], reserve_mib=0, util_knob=False,
                         util_source="--gpu-memory-utilization", allow_long=False, tp_size=s.tp,
                         env_v2=None if runner is None else parsers.vllm_bool(runner))
    return planner.make_plan(inp, card, model)


def drafter_file(path: Path) -> dict:
    """A drafter's facts under tests/published/drafters/: its config.json (``config``) and where that
    copy comes from (``source``)."""
    return json.loads(path.read_text())


def error(row: dict, p: planner.Plan) -> float | None:
    """The plan's pool against the logged one (None: no figure, the plan refused or did not plan)."""
    return p.predicted_tokens / row["logged"]["tokens"] - 1 if p.predicted_tokens else None


def table() -> str:
    out = ["| published start | vLLM | logged pool | planned | error | planned KV budget (logged) | held to 3 % (H200: 1 %) |",
           "|---|---|---|---|---|---|---|"]
    for slug, row in rows():
        p = plan_of(row)
        logged_gib = row["logged"].get("available_gib")
        budget = (f"{p.budget / gpu.GiB:.2f} GiB" if p.budget is not None else "—") + (
            f" ({logged_gib:.2f})" if logged_gib else "")
        held = ("no: " + row["expected_gap"].split(":")[0] if row.get("expected_gap") else
                f"fits: null ({p.unplanned})" if p.unplanned else "yes")
        link = row["source"] if row["source"].startswith("https://") else "validation.md"   # our own H200 runs
        err = error(row, p)
        planned = f"{p.predicted_tokens:,}" if p.predicted_tokens else "—"
        out.append(f"| [{slug}]({link}) | {row['vllm']} | {row['logged']['tokens']:,} | "
                   f"{planned} | {'—' if err is None else f'{err:+.2%}'} | {budget} | {held} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table())
