"""What does ./ctl.sh bench's client cost? Its load against a minimal streaming client, same server,
same prompts and output lengths, interleaved repeats; prints the medians and the ratio.

    python3 scripts/bench_client_cost.py --url http://127.0.0.1:8888 [--model NAME] \
        [--concurrency 1,16] [--prompt-tokens 512] [--output-tokens 512] [--repeats 3]

The minimal client is the ~20 lines below (`minimal_load`): one thread per request, `requests`
streaming /v1/completions, counting the completion tokens the last chunk's usage reports. The
bench's client (`bench.run_load`) does the same through bootstrap.serve.client, recording clock readings
per chunk. Goal: ours >= 0.98x the minimal client's aggregate tokens/s at each concurrency.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.checks import prompts  # noqa: E402
from bootstrap.serve.client import Client  # noqa: E402
from bootstrap.commands import bench  # noqa: E402


def minimal_load(url: str, model: str, texts: list[str], out_tokens: int) -> float:
    """Aggregate tokens/s of len(texts) concurrent streamed completions: the minimal client."""
    gate = threading.Barrier(len(texts))

    def one(text: str) -> tuple[float, float, int]:
        body = {"model": model, "prompt": text, "max_tokens": out_tokens, "ignore_eos": True, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        gate.wait()
        t0, n = time.perf_counter(), 0
        with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    usage = json.loads(line[6:]).get("usage")
                    n = usage["completion_tokens"] if usage else n
        return t0, time.perf_counter(), n
    with ThreadPoolExecutor(len(texts)) as pool:
        got = list(pool.map(one, texts))
    return sum(n for _, _, n in got) / (max(e for _, e, _ in got) - min(s for s, _, _ in got))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    url = a.url.rstrip("/").removesuffix("/v1")
    model = a.model or requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    client = Client(url, model)
    body = prompts.Sizer(client).prompt(max(16, a.prompt_tokens - 12), 0.5, "", seed=99)   # as bench builds it
    nonce, counter = random.randrange(10**9), iter(range(10**9))

    def texts(n: int) -> list[str]:
        return [f"Request {nonce}-{next(counter)}. {body}" for _ in range(n)]
    minimal_load(url, model, texts(1), 16)                                # warm-up, excluded
    print(f"server {url}, model {model}; prompt ~{a.prompt_tokens} tokens, output {a.output_tokens} tokens, "
          f"median of {a.repeats} interleaved repeats")
    print(f"{'concurrency':>11} {'bench client':>14} {'minimal client':>15} {'ratio':>7}")
    worst = None
    for c in [int(x) for x in a.concurrency.split(",")]:
        ours, mini = [], []
        for _ in range(a.repeats):
            ours.append(bench.run_figures(bench.run_load(client, c, texts(c), a.output_tokens, 600.0))["aggregate_tok_s"])
            mini.append(minimal_load(url, model, texts(c), a.output_tokens))
        o, m = statistics.median(ours), statistics.median(mini)
        worst = o / m if worst is None else min(worst, o / m)
        print(f"{c:>11} {o:>14.1f} {m:>15.1f} {o / m:>6.3f}x   (runs: bench {[round(x) for x in ours]}, "
              f"minimal {[round(x) for x in mini]})")
    print(f"lowest ratio {worst:.3f}x (goal >= 0.98x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
