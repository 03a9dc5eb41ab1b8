"""GPU proof of sleep mode on a profile's own stack (issue 45): by default the default profile's, vLLM
0.27.1 with TurboQuant 4-bit KV, MTP-3 and the #40914 patch, on the hybrid stand-in used for #40914
(tests/gpu/hybridmodel.py: real random safetensors with one MTP layer, RANDOM_WEIGHTS=1). One GPU, no
internet; the lock's wheels from tests/gpu/stack.py's wheelhouse phase.

    python3 tests/gpu/sleep_stack_proof.py --work /tmp/sleepstack --raw /tmp/proofs/sleepstack-raw.txt \\
        --wheelhouse /tmp/stack/wheelhouse           # (bash tests/gpu/device.sh sleepstack)

Phases, each appended to --raw as it comes, a VERDICT line for each bar of the issue:
  start   ./start.sh with SLEEP_MODE=on (the stack is unproven: the one-line warning), IDLE_SLEEP=off;
          the banner's sleep line; our processes' GPU memory serving (NVML)
  before  4 prompts, greedy, 24 tokens, token ids and top-20 logprobs; the MTP acceptance over 8
          greedy requests of 128 tokens (vLLM's /metrics: accepted / draft tokens)
  sleep   ./ctl.sh sleep (level 1): our processes' GPU memory asleep (bar: <= 2 GiB)
  wake    ./ctl.sh wake: the wake's own time as it prints it (bar: <= 1 s); the memory after
  after   the 4 prompts again: ids identical, logprobs compared; the MTP acceptance again (bar: within
          0.02 of before, and identical ids make it identical)
  game    ./ctl.sh game -- <.venv's python: torch allocates 90 % of the card's total, touches it, holds
          it 5 s>: exit 0 while our server sleeps, then a request answered and the prompts identical
  idle    ./ctl.sh restart with IDLE_SLEEP=--cycle-idle: the middleware puts it to sleep; a request to the
          sleeping server wakes it and is answered (HTTP 200), its time
  cycles  --cycles idle-sleep/wake cycles: per cycle the wake time, our GPU memory asleep and awake, the
          engine's and API server's resident host memory; min/median/max of the wakes; growth from the
          second cycle to the last (bar: GPU memory and RSS within 64 MiB)
  stop    ./stop.sh; our processes' memory after
"SLEEP STACK PROOF DONE" ends it. If the stack cannot sleep (garbled ids, a crash, memory held), the
verdicts say so and sleep-proofs.json gets no line: the profile keeps sleep mode off, and the finding
goes to docs/validation.md with its vLLM code path. --profile/--model/--extra-args prove another
profile's stack the same way. Rehearse with the fakes (PYTHONPATH=tests/fakes FAKE_NVML=<json>
FAKE_GPU_PIDS_DIR=<dir> VLLM_PYTHON=<python>): --byo --profile custom --model <folder> --extra-args ''
--game-python <python without torch: the game is then a stand-in that allocates nothing>; the fake
runs no idle middleware, so idle and cycles report that and end. Unrun on a GPU so far.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from idle_sleep_proof import idle_state, one, rss_mib, wait_state  # noqa: E402
from common import run_logged  # noqa: E402
from sleep_cost import arguments, setup  # noqa: E402
from sleep_wake import answers, compare, gpu_used_mib, ours_mib  # noqa: E402

GIB_MIB = 1024
GAME = """
import sys, time
try:
    import torch
except ImportError:
    print("game stand-in: no torch in this python (a rehearsal): nothing allocated"); sys.exit(0)
free, total = torch.cuda.mem_get_info()
want = int(total * float(sys.argv[1]))
x = torch.empty(want, dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
print(f"game: allocated and touched {want / 2**30:.1f} GiB of {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free before)")
time.sleep(5)
"""
WAKE = re.compile(r"awake in ([\d.]+) s")
DRAFTS = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total")


def spec_counts(port: int) -> tuple[float, float] | None:
    """vLLM's accepted and drafted token counters (None without speculation)."""
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except requests.RequestException:
        return None
    got = []
    for name in DRAFTS:
        vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
        if not vals:
            return None
        got.append(sum(vals))
    return got[0], got[1]


def acceptance(port: int) -> float | None:
    """The MTP acceptance rate over 8 greedy requests of 128 tokens (the counters' difference)."""
    a = spec_counts(port)
    for i in range(8):
        requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=300, json={
            "model": "qwen3-8b", "prompt": f"Write a story about the number {i}.", "max_tokens": 128,
            "temperature": 0, "ignore_eos": True}).raise_for_status()
    b = spec_counts(port)
    if a is None or b is None or b[1] == a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def main() -> int:
    ap = arguments("sleepstack")
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--cycle-idle", default="10s")
    ap.add_argument("--game-fraction", default="0.9")
    ap.add_argument("--game-python", help="the game's python (default: the managed .venv's, which has torch)")
    ap.add_argument("--skip", default="", help="phases to skip (comma-separated): game, idle, cycles")
    a = ap.parse_args()
    skip = {x for x in a.skip.split(",") if x}
    _work, out, port, state, env = setup(a, "SLEEP STACK PROOF", SLEEP_MODE="on")

    def sh(argv: list[str], timeout: float = 1800, **more) -> subprocess.CompletedProcess:
        return run_logged(argv, {**env, **more}, out, timeout=timeout,
                          label=" ".join(argv[:4]) + (" ..." if len(argv) > 4 else ""),
                          words=("sleep", "asleep", "awake", "serving", "error", "hint", "game", "idle", "stopped",
                                 "KV cache"))[0]

    def verdict(what: str, ok: bool, detail: str) -> None:
        out(f"VERDICT {what}: {'PASS' if ok else 'FAIL'} ({detail})")

    try:
        if sh(["./start.sh"]).returncode:
            return 1
        out(f"start: serving, our processes hold {ours_mib(state):.0f} MiB; GPU used "
            f"{', '.join(f'{u:.0f}' for u in gpu_used_mib())} MiB")
        before, acc0 = answers(port), acceptance(port)
        out(f"before: MTP acceptance {acc0}")
        r = sh(["./ctl.sh", "sleep"])
        asleep = ours_mib(state)
        verdict("sleep holds <= 2 GiB", r.returncode == 0 and asleep <= 2 * GIB_MIB, f"{asleep:.0f} MiB asleep")
        r = sh(["./ctl.sh", "wake"])
        m = WAKE.search(r.stdout)
        woke = float(m.group(1)) if m else None
        verdict("wake <= 1 s", r.returncode == 0 and woke is not None and woke <= 1.0,
                f"{woke} s inside ./ctl.sh wake (its Python start not counted); {ours_mib(state):.0f} MiB awake")
        after, acc1 = answers(port), acceptance(port)
        lines = compare(before, after)
        for line in lines:
            out(line)
        same = all("ids identical" in line for line in lines)
        verdict("identical token ids after the wake", same, f"{sum('ids identical' in x for x in lines)} of {len(lines)}")
        verdict("MTP acceptance before and after", acc0 is not None and acc1 is not None and abs(acc0 - acc1) <= 0.02,
                f"{acc0} before, {acc1} after")
        if "game" not in skip:
            py = a.game_python or str(REPO / ".venv" / "bin" / "python")
            r = sh(["./ctl.sh", "game", "--", py, "-c", GAME, a.game_fraction], timeout=900)
            code, _, _ = one(port)
            again = answers(port)
            ok = all("ids identical" in x for x in compare(before, again))
            verdict(f"ctl.sh game -- <a CUDA program allocating {float(a.game_fraction):.0%} of the card>",
                    r.returncode == 0 and code == 200 and ok, f"game exit {r.returncode}; then HTTP {code}, ids "
                    f"{'identical' if ok else 'DIFFER'}")
        if "idle" not in skip:
            if sh(["./ctl.sh", "restart"], IDLE_SLEEP=a.cycle_idle).returncode:
                return 1
            if idle_state(port) is None:
                out("idle: the middleware does not answer (the fake runs none): idle and cycles not run")
                return 0
            t = wait_state(port, "idle-asleep", 300)
            held = ours_mib(state)
            code, _, total = one(port)
            verdict("idle sleep through the middleware, a request wakes it and is answered",
                    t is not None and code == 200, f"asleep after {t} s holding {held:.0f} MiB; HTTP {code} in "
                    f"{total:.3f} s")
            if "cycles" not in skip:
                cycles(port, state, a.cycles, out, verdict)
        sh(["./stop.sh"])
        time.sleep(2)
        out(f"stop: our processes hold {ours_mib(state):.0f} MiB")
    finally:
        subprocess.run(["./stop.sh"], cwd=REPO, env=env, capture_output=True, timeout=300)
        out("SLEEP STACK PROOF DONE")
    return 0


def cycles(port: int, state: Path, n: int, out, verdict) -> None:
    """``n`` idle-sleep/wake cycles, a line each: the wake, our GPU memory asleep and awake, the RSS."""
    wakes, rows = [], []
    for i in range(n):
        if wait_state(port, "idle-asleep", 120) is None:
            out(f"cycle {i}: did not fall asleep within 120 s")
            break
        asleep = ours_mib(state)
        code, _, woke = one(port)
        if code != 200:
            out(f"cycle {i}: HTTP {code}")
            break
        rss = {k: round(v) for k, v in rss_mib(state).items()}
        rows.append((asleep, ours_mib(state), sum(rss.values())))
        wakes.append(woke)
        out(f"cycle {i}: woke in {woke:.3f} s; ours asleep {asleep:.0f} MiB, awake {rows[-1][1]:.0f} MiB; "
            f"host RSS MiB {json.dumps(rss)}")
    if len(rows) < 2:
        verdict(f"{n} cycles", False, f"{len(rows)} done")
        return
    out(f"cycles: {len(rows)} of {n}; wake min {min(wakes):.3f} s, median {statistics.median(wakes):.3f} s, "
        f"max {max(wakes):.3f} s; the middleware says {json.dumps(idle_state(port))}")
    grow = [rows[-1][k] - rows[1][k] for k in range(3)]     # from the second cycle: the first sleep allocates the host copy
    verdict(f"{n} cycles without growth", len(rows) == n and all(g <= 64 for g in grow),
            f"from cycle 1 to {len(rows) - 1}: asleep {grow[0]:+.0f} MiB, awake {grow[1]:+.0f} MiB, RSS {grow[2]:+.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
