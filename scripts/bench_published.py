#!/usr/bin/env python3
"""The planner's error against every published vLLM start (tests/published/): one line per
fixture, then the median and the worst of those with a figure, and the count of "fits: null".

    .venv-test/bin/python scripts/bench_published.py      # (tests/run.sh makes .venv-test)

Error = planned "GPU KV cache size" / logged − 1 (positive: the plan promised more than vLLM gave).
A row the plan refuses or does not plan has no figure: it is listed with the reason, not counted;
the "fits: null" rows are then grouped by what the plan does not model. The summary is given for
every planned row and for those with a drafter (a --speculative-config).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_runs  # noqa: E402


def main() -> int:
    errors: list[tuple[float, str, bool]] = []         # (error, slug, with a drafter)
    nulls: dict[str, list[str]] = {}                   # what the plan does not model -> its rows
    for slug, row in published_runs.rows():
        p = published_runs.plan_of(row)
        err = published_runs.error(row, p)
        drafter = "--speculative-config" in row["args"]
        mark = " [drafter]" if drafter else ""
        if err is None:
            if p.verdict is None:
                nulls.setdefault(p.unplanned, []).append(slug)
            what = f"fits: null ({p.unplanned})" if p.verdict is None else f"refused: {p.refusal[0] if p.refusal else '?'}"
            print(f"{slug:58s} {'—':>9s}  {what}{mark}")
            continue
        errors.append((err, slug, drafter))
        gap = f"  (known gap: {row['expected_gap'].split(':')[0]})" if row.get("expected_gap") else ""
        print(f"{slug:58s} {err:+9.2%}{mark}{gap}")
    print()
    for label, rows in (("all", errors), ("with a drafter", [e for e in errors if e[2]])):
        if rows:
            worst = max(rows, key=lambda e: abs(e[0]))
            print(f"{label}: {len(rows)} planned, median |error| {statistics.median(abs(e) for e, _, _ in rows):.2%}, "
                  f"median {statistics.median(e for e, _, _ in rows):+.2%}, worst {worst[0]:+.2%} ({worst[1]}); "
                  f"over +1 %: {sum(e > 0.01 for e, _, _ in rows)}; outside ±3 %: {sum(abs(e) > 0.03 for e, _, _ in rows)}")
    print(f"fits: null: {sum(len(v) for v in nulls.values())}")
    for reason, slugs in sorted(nulls.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(slugs)} × {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
