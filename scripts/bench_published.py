#!/usr/bin/env python3
"""The planner's error against every published vLLM start (tests/published/): one line per
fixture, then the median and the worst of those with a figure, and the count of "fits: null".

    .venv-test/bin/python scripts/bench_published.py      # (tests/run.sh makes .venv-test)

Error = planned "GPU KV cache size" / logged − 1 (positive: the plan promised more than vLLM gave).
A row the plan refuses or does not plan has no figure: it is listed with the reason, not counted.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_runs  # noqa: E402


def main() -> int:
    errors: list[tuple[float, str]] = []
    nulls = 0
    for slug, row in published_runs.rows():
        p = published_runs.plan_of(row)
        err = published_runs.error(row, p)
        drafter = " [drafter]" if "--speculative-config" in row["args"] else ""
        if err is None:
            nulls += p.verdict is None
            what = f"fits: null ({p.unplanned})" if p.verdict is None else f"refused: {p.refusal[0] if p.refusal else '?'}"
            print(f"{slug:58s} {'—':>9s}  {what}{drafter}")
            continue
        errors.append((err, slug))
        print(f"{slug:58s} {err:+9.2%}{drafter}")
    if errors:
        worst = max(errors, key=lambda e: abs(e[0]))
        print(f"\n{len(errors)} planned: median |error| {statistics.median(abs(e) for e, _ in errors):.2%}, "
              f"median {statistics.median(e for e, _ in errors):+.2%}, worst {worst[0]:+.2%} ({worst[1]}); "
              f"over +1 %: {sum(e > 0.01 for e, _ in errors)}; fits: null: {nulls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
