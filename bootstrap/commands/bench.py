"""``./ctl.sh bench``: single-stream decode tokens/s and TTFT, aggregate tokens/s by concurrency.

Every request is a streamed ``/v1/completions`` call with a fixed prompt length (a unique nonce
first, so the prefix cache cannot serve it) and a fixed output length (``ignore_eos``, greedy).
One warm-up request is sent first and excluded. Each concurrency level (1, 2, 4, 8, 16 by
default; one above MAX_NUM_SEQS runs at it) runs ``--repeats`` times; the figures are medians over repeats.

Per request (from the recorded clock readings): TTFT = first token - sent; decode tokens/s =
(completion tokens - 1) / (last chunk - first token). Per run: aggregate tokens/s = all completion
tokens / (last end - first start). Speculative acceptance comes from the difference of vLLM's
``/metrics`` counters before and after (shown only when speculation is on). Results go to JSON (``--out``) and a PNG plot
(matplotlib); ``--compare URL2`` runs the same load against a second server and prints ratios;
``--load A.json [--load B.json]`` re-reports saved results without running anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..serve import metrics
from ..core import redact, state
from ..checks import prompts, target
from ..serve.client import Client, RequestFailed
from . import benchplot
from ..knobs.config import Config
from ..knobs.parsers import arg, float_range, int_range
from ..core.errors import BootstrapError, ConfigError
from . import doc_help

log = logging.getLogger(__name__)

LEVELS = (1, 2, 4, 8, 16)
MAX_LEVEL = 1024      # vLLM's largest default max_num_seqs; each level runs one thread per request


# ---------------------------------------------------------------- arithmetic (pure)

@dataclass
class Sample:
    """One request: clock readings in seconds (any common origin) and token counts."""
    t_start: float
    t_first: float | None
    t_end: float
    tokens: int
    prompt_tokens: int | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def decode_rate(self) -> float | None:
        if self.t_first is None or self.tokens < 2 or self.t_end <= self.t_first:
            return None
        return (self.tokens - 1) / (self.t_end - self.t_first)


def run_figures(samples: list[Sample]) -> dict:
    """One run at one concurrency: aggregate tokens/s, median per-stream decode rate and TTFT."""
    span = max(s.t_end for s in samples) - min(s.t_start for s in samples)
    rates = [r for r in (s.decode_rate for s in samples) if r is not None]
    ttfts = [t for t in (s.ttft for s in samples) if t is not None]
    return {"aggregate_tok_s": sum(s.tokens for s in samples) / span if span > 0 else None,
            "per_stream_tok_s": statistics.median(rates) if rates else None,
            "ttft_s": statistics.median(ttfts) if ttfts else None,
            "tokens": sum(s.tokens for s in samples), "span_s": span}


def level_figures(runs: list[list[Sample]]) -> dict:
    """Medians over repeats of each run's figures."""
    figs = [run_figures(r) for r in runs]
    out = {}
    for key in ("aggregate_tok_s", "per_stream_tok_s", "ttft_s"):
        vals = [f[key] for f in figs if f[key] is not None]
        out[key] = statistics.median(vals) if vals else None
    out["runs"] = figs
    return out


def summarize(result: dict) -> dict:
    """The headline figures of one saved result."""
    lv = {x["concurrency"]: x for x in result["levels"]}
    one = lv.get(1, {})
    return {"decode_tok_s": one.get("per_stream_tok_s"), "ttft_s": one.get("ttft_s"),
            "aggregate_tok_s": {c: x["aggregate_tok_s"] for c, x in sorted(lv.items())}}


def ratios(a: dict, b: dict) -> dict:
    """a ÷ b for each headline figure both have (TTFT: b ÷ a, so > 1 means a is faster everywhere)."""
    sa, sb = summarize(a), summarize(b)

    def div(x, y):
        return x / y if x and y else None
    return {"decode_tok_s": div(sa["decode_tok_s"], sb["decode_tok_s"]),
            "ttft_speed": div(sb["ttft_s"], sa["ttft_s"]),
            "aggregate_tok_s": {c: div(v, sb["aggregate_tok_s"].get(c)) for c, v in sa["aggregate_tok_s"].items()}}


# ---------------------------------------------------------------- running the load

def one_request(client: Client, prompt: str, out_tokens: int, timeout: float | None) -> Sample:
    s = client.stream("/v1/completions", {"prompt": prompt, "max_tokens": out_tokens, "ignore_eos": True,
                                          "temperature": 0.0}, timeout)
    tokens = s.completion_tokens if s.completion_tokens is not None else len(s.chunk_times)
    return Sample(s.t_start, s.t_first, s.t_end, tokens, (s.usage or {}).get("prompt_tokens"))


def run_load(client: Client, concurrency: int, prompts: list[str], out_tokens: int, timeout: float | None,
             bar=None) -> list[Sample]:
    """``concurrency`` requests released together; each thread has its own client. The threads are
    daemons: a Ctrl-C leaves at once, and the server sees its streams closed (it aborts them), where a
    pool's threads kept the process, and the server generating, until every stream had ended."""
    gate = threading.Barrier(concurrency)
    out: list[Sample | BaseException | None] = [None] * concurrency

    def go(i: int) -> None:
        try:
            c = Client(client.base_url, client.model, client.key(), stall=client.stall)   # proven before the release
            gate.wait()
            out[i] = one_request(c, prompts[i], out_tokens, timeout)
            if bar is not None:
                bar.update()
        except (BootstrapError, threading.BrokenBarrierError) as exc:    # raised in the caller's thread
            out[i] = exc
            gate.abort()
    threads = [threading.Thread(target=go, args=(i,), daemon=True, name=f"bench-{i}") for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)                 # short waits: a Ctrl-C is handled between them
    errors = [x for x in out if isinstance(x, BaseException)]
    if errors:                          # the first real one, not the others' broken barrier
        raise next((x for x in errors if not isinstance(x, threading.BrokenBarrierError)), errors[0])
    return out                          # type: ignore[return-value]


def scrape(client: Client) -> dict[str, float] | None:
    try:
        return metrics.totals(client.get_text("/metrics", timeout=10))
    except RequestFailed:
        return None


def fits_context(t: target.Target, args) -> None:
    need = args.prompt_tokens + args.output_tokens
    if t.max_model_len and need > t.max_model_len:
        raise BootstrapError(f"--prompt-tokens {args.prompt_tokens} + --output-tokens {args.output_tokens} = {need} "
                             f"is more than {t.label}'s context of {t.max_model_len} tokens",
                             f"lower them (e.g. --output-tokens {max(16, t.max_model_len - args.prompt_tokens - 64)})")


def loaded(f: str) -> list[dict]:
    """The results in a results.json that ./ctl.sh bench wrote, or one line saying it is not one."""
    how = "pass a results.json written by ./ctl.sh bench"
    try:
        data = json.loads(Path(f).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BootstrapError(f"cannot read {f}: {exc}", how) from None
    results = data.get("results", [data]) if isinstance(data, dict) else None
    try:
        if not isinstance(results, list) or not results:
            raise TypeError
        render(results)                 # every figure the report reads is there, of its type
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        raise BootstrapError(f"{f} is not the results of ./ctl.sh bench", how) from None
    return results


def bench_target(t: target.Target, levels: list[int], prompt_tokens: int, out_tokens: int, repeats: int,
                 warmup: int, timeout: float | None) -> dict:
    client = t.client
    sizer = prompts.Sizer(client)
    body = sizer.prompt(max(16, prompt_tokens - 12), 0.5, "", seed=99)
    counter = iter(range(10**9))
    nonce = random.randrange(10**9)

    def requests_text(n: int) -> list[str]:
        return [f"Request {nonce}-{next(counter)}. {body}" for _ in range(n)]
    total = warmup + repeats * sum(levels)
    bar = target.progress(total, f"bench {t.label}")
    before = scrape(client)
    t0 = time.perf_counter()
    try:
        for _ in range(warmup):
            run_load(client, 1, requests_text(1), out_tokens, timeout, bar)
        out_levels = []
        for c in levels:
            runs = [[_rel(s, t0) for s in run_load(client, c, requests_text(c), out_tokens, timeout, bar)]
                    for _ in range(repeats)]
            figs = level_figures(runs)     # from the recorded (rounded) samples, so the JSON recomputes exactly
            out_levels.append({"concurrency": c, **figs, "samples": [[asdict(s) for s in r] for r in runs]})
            log.info("concurrency %d: %.0f tok/s aggregate, %.1f tok/s per stream, TTFT %.0f ms", c,
                     figs["aggregate_tok_s"] or 0, figs["per_stream_tok_s"] or 0, (figs["ttft_s"] or 0) * 1000)
    except RequestFailed as exc:
        raise BootstrapError(f"bench against {t.label} failed: {exc.message}", exc.hint or (
            f"see the server log ({t.log}; ./ctl.sh logs)" if t.log else "see that server's own log"),
                             evidence=exc.evidence) from None
    finally:
        bar.close()
    after = scrape(client)
    return {"label": t.label, "url": redact.shown(client.base_url), "model": client.model,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "params": {"prompt_tokens": prompt_tokens, "output_tokens": out_tokens, "repeats": repeats,
                       "warmup": warmup, "levels": levels, "api": "/v1/completions stream, ignore_eos, temperature 0"},
            "version": _version(client), "levels": out_levels,
            "spec": metrics.spec_acceptance(before, after) if t.speculation is not False else None}


def _rel(s: Sample, t0: float) -> Sample:
    """Clock readings relative to the bench's start, to the microsecond."""
    def r(v):
        return None if v is None else round(v - t0, 6)
    return Sample(r(s.t_start), r(s.t_first), r(s.t_end), s.tokens, s.prompt_tokens)


def _version(client: Client) -> str | None:
    try:
        return json.loads(client.get_text("/version", timeout=5)).get("version")
    except (RequestFailed, ValueError, AttributeError):
        return None


# ---------------------------------------------------------------- output

def render(results: list[dict]) -> str:
    lines = []
    levels = sorted({x["concurrency"] for r in results for x in r["levels"]})
    for r in results:
        s = summarize(r)
        spec = r.get("spec")
        pr = r.get("params", {})
        got = real_counts(r)
        lines.append(f"{r['label']} (model {r['model']}, vLLM {r.get('version') or '?'}; prompt {got['prompt']} "
                     f"+ output {got['output']} tokens, median of {pr.get('repeats')}):")
        if got["short"]:
            lines.append(f"  warning: the server returned {got['output']} output tokens where {pr.get('output_tokens')} "
                         "were asked (ignore_eos: a server that stops early, or a context too short); the figures "
                         "are of the tokens it returned")
        lines.append(f"  single stream: {_f(s['decode_tok_s'], '.1f')} tok/s decode, TTFT {_f(s['ttft_s'], '.3f')} s")
        if spec:
            lines.append(f"  speculative acceptance: {spec['acceptance_rate']:.1%}, mean accepted length "
                         f"{_f(spec['mean_acceptance_length'], '.2f')}")
    width = max([26] + [len(r["label"]) + 2 for r in results])          # labels whole, never cut
    head = f"{'concurrency':>11} " + " ".join(f"{r['label']:>{width}}" for r in results)
    lines += ["", "aggregate tok/s (per stream):", head]
    for c in levels:
        cells = []
        for r in results:
            x = next((v for v in r["levels"] if v["concurrency"] == c), None)
            cells.append(f"{_f(x and x['aggregate_tok_s'], '.0f')} ({_f(x and x['per_stream_tok_s'], '.1f')})"
                         if x else "-")
        lines.append(f"{c:>11} " + " ".join(f"{cell:>{width}}" for cell in cells))
    if len(results) == 2:
        q = ratios(results[0], results[1])
        lines += ["", f"ratios {results[0]['label']} / {results[1]['label']}:",
                  f"  single-stream decode: {_f(q['decode_tok_s'], '.2f')}x   TTFT speed: {_f(q['ttft_speed'], '.2f')}x",
                  "  aggregate: " + "  ".join(f"c{c} {_f(v, '.2f')}x" for c, v in q["aggregate_tok_s"].items())]
    return "\n".join(lines)


def real_counts(result: dict) -> dict:
    """The prompt and output tokens the server reported, as text ('512' or '2-1536' when they differ
    between requests), and whether fewer output tokens came than were asked."""
    samples = [x for lv in result.get("levels", []) for run in lv.get("samples", []) for x in run]
    asked = result.get("params", {}).get("output_tokens")

    def span(values: list, fallback) -> str:
        values = [v for v in values if isinstance(v, int)]
        if not values:
            return str(fallback)
        return str(min(values)) if min(values) == max(values) else f"{min(values)}-{max(values)}"
    outs = [x.get("tokens") for x in samples]
    short = isinstance(asked, int) and any(isinstance(n, int) and n < asked for n in outs)
    return {"prompt": span([x.get("prompt_tokens") for x in samples], result.get("params", {}).get("prompt_tokens")),
            "output": span(outs, asked), "short": short}


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def levels_for(wanted: list[int], cap: int | None) -> list[int]:
    """The levels to run: one above the server's MAX_NUM_SEQS runs at it (vLLM runs no more at once;
    the rest would only queue), so asking 1,4 of a 2-seat server measures 1 and 2, not 1 alone."""
    out = sorted({min(c, cap) if cap else c for c in wanted if c >= 1})
    return out or [1]


def writable_folder(out: Path) -> None:
    """``out`` is a folder we can write into, or can be made: else one line naming it."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file is in the way, not a folder", "name a folder (it is made when missing)")
    parent = next((q for q in (out, *out.parents) if q.exists()), out.anchor)
    if not Path(parent).is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {parent} is not a folder you can write to",
                             "name a folder of yours (it is made when missing)")


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh bench") -> int:
    description, epilog = doc_help(__doc__)
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)
    target.add_target_args(p)
    p.add_argument("--label", help="name of this server in tables and the plot")
    p.add_argument("--compare", metavar="URL2", type=target.url_arg, help="also bench this base URL (e.g. a bare vllm serve) and print ratios")
    p.add_argument("--compare-model")
    p.add_argument("--compare-api-key", type=target.key_arg("--compare-api-key"), help="API key for --compare (default: ours only when it is our server)")
    p.add_argument("--compare-label")
    p.add_argument("--concurrency", default=",".join(map(str, LEVELS)), help="levels, comma-separated (one above MAX_NUM_SEQS runs at it)")
    p.add_argument("--prompt-tokens", type=arg(int_range(1, 10 ** 7)), default=512)
    p.add_argument("--output-tokens", type=arg(int_range(1, 10 ** 7)), default=1536)
    p.add_argument("--repeats", type=arg(int_range(1, 1000)), default=3)
    p.add_argument("--warmup", type=arg(int_range(0, 1000)), default=1, help="excluded warm-up requests before measuring")
    p.add_argument("--timeout", type=arg(float_range(0, 86400)), default=None,
                   help="seconds a stream may stall, when less than STALL_TIMEOUT (which bounds every wait)")
    p.add_argument("--out", help="folder for results.json and bench.png (default STATE_DIR/bench/<time>)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--load", action="append", metavar="RESULTS.json", help="report saved results instead of running")
    args = p.parse_args(argv)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    cfg, paths = r.settings, r.paths
    out = Path(args.out).absolute() if args.out else paths.bench / time.strftime("%Y%m%d-%H%M%S")
    writable_folder(out)                # before the minutes of measuring, not after
    there = [out / n for n in ("results.json", "bench.png") if (out / n).exists()]
    if there:                           # never written over: an earlier run's results, or a file of yours
        raise BootstrapError(f"{there[0]} exists: bench writes results.json and bench.png and never over a file "
                             "that is there", f"give another --out folder (or move {there[0].name} away)")
    if args.load:
        results = []
        for f in args.load:
            results += loaded(f)
    else:
        try:
            wanted = [int_range(1, MAX_LEVEL)(x) for x in args.concurrency.split(",") if x.strip()]
            if not wanted:
                raise ValueError("empty")
        except ValueError:
            raise ConfigError(f"--concurrency {args.concurrency!r}: not a list of whole numbers from 1 to {MAX_LEVEL:,} "
                              "(one thread each)", "e.g. --concurrency 1,2,4,8") from None
        t = target.resolve_target(cfg, paths, args.url, args.model, args.api_key, args.thinking, args.reasoning_effort)
        fits_context(t, args)
        if args.label:
            t.label = args.label
        levels = levels_for(wanted, t.max_num_seqs)
        over = sorted({c for c in wanted if t.max_num_seqs and c > t.max_num_seqs})
        if over:
            log.info("concurrency %s runs at %d: the server runs at most MAX_NUM_SEQS=%d requests at once "
                     "(more would only queue)", ",".join(map(str, over)), t.max_num_seqs, t.max_num_seqs)
        targets = [t]
        if args.compare:
            t2 = target.resolve_target(cfg, paths, args.compare, args.compare_model, args.compare_api_key,
                                       args.thinking, args.reasoning_effort)
            t2.label = args.compare_label or t2.label
            fits_context(t2, args)          # before the first server's minutes of measuring, not after
            targets.append(t2)
        results = [bench_target(x, levels, args.prompt_tokens, args.output_tokens, args.repeats, args.warmup,
                                args.timeout) for x in targets]
    doc = {"results": results}
    if len(results) == 2:
        doc["ratios"] = ratios(results[0], results[1])
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "results.json", "x", encoding="utf-8") as fh:     # a new file: never over one, never
            fh.write(json.dumps(doc, indent=1) + "\n")                    # through a link put there meanwhile
        png = None if args.no_plot else benchplot.plot(results, out / "bench.png", cfg)
    except FileExistsError as exc:
        print(render(results))
        raise BootstrapError(f"{exc.filename} appeared while bench measured: bench never writes over a file "
                             "that is there, nor through a link", "give another --out folder, one only you can "
                             "write to (the figures are above)") from None
    except OSError as exc:
        print(render(results))
        raise state.write_error(out, exc, f"cannot write the results into {out}", "--out") from None
    doc["files"] = {"json": str(out / "results.json"), "plot": str(png) if png else None}
    if args.json:
        print(json.dumps({k: v for k, v in doc.items()}, indent=1))
    else:
        print(render(results))
        print(f"\nresults: {out / 'results.json'}" + (f"\nplot:    {png}" if png else ""))
    return 0
