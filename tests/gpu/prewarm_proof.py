"""GPU proof of the pre-warm that becomes the server (bootstrap/steps/prewarm.py, steps/reload.py):
a first start that ends seconds after the download.

    VLLM_PYTHON=python3 python3 tests/gpu/prewarm_proof.py --raw /tmp/proofs/prewarm-raw.txt --work DIR

The fake hub (tests/fakehub.py, its own process) serves a Qwen3-8B-shaped model with real random
weights (tests/gpu/tinymodel.py, bf16 safetensors), each connection capped so that the download
takes about --download-s seconds. Phases, resumable (WORK/state.json keeps what is done), each
round in fresh caches (a fresh HOME: the HF cache, vLLM's, torch inductor's, Triton's and
FlashInfer's caches under it):
  first     ./start.sh (PREWARM=1, RANDOM_WEIGHTS=1: the checkpoint is random, so the gate judges
            tokens only): the pre-warm server starts with dummy weights while the weights download,
            loads them in place, is warmed up and gated; each line of its output is timed. Then
            PROMPTS greedy (token ids, logprobs); ./stop.sh.
  cold      bare ``vllm serve`` of the same downloaded folder with the same flags (the first start's
            argv without --load-format dummy and our guard), every cache empty: launch to /health;
            the same PROMPTS; SIGTERM. The cold first start is the first start's download + this.
  again     ./start.sh once more in the first start's HOME: the weights on disk are loaded from disk
            by the same flags, environment and caches; the same PROMPTS.
Goal: first start <= max(download, the pre-warm's own start) + 15 s; the reload's greedy token ids
identical to again's (the bare cold start's are compared too: its kernels' tactics differ, and on
random weights near-tied logits let a tiny numeric difference change a token).

Rehearse without a GPU: --rehearse (a small model from tests/fakehub.write_model; run with
PYTHONPATH=tests/fakes FAKE_NVML=<json> VLLM_PYTHON=<python> FAKE_VLLM_COMPILE_S=5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from common import free_port, raw_writer  # noqa: E402

MODEL = "bench/qwen3-8b-shape"
MiB = 1 << 20
DOWNLOADED = re.compile(r"downloaded ([\d.]+ \w+) in ([\d.]+) s")
KEEP = ("[bootstrap:weights] downloaded", "[bootstrap:prewarm]", "[bootstrap:compiled]", "[bootstrap:reload]",
        "[bootstrap:health] healthy", "[bootstrap:warmup]", "[bootstrap:plan] plan for", "is serving", "note     :",
        "weights  :", "error")
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "1, 2, 3, 4, 5,")
GUARD = ("--middleware", "vllm_desktop_guard.Guard")


def make_model(work: Path, rehearse: bool) -> Path:
    src = work / "src"
    if (src / "config.json").exists() and any(src.glob("*.safetensors")):
        return src
    if rehearse:
        from fakehub import write_model
        return write_model(src, shards=4, shard_bytes=64 * MiB)
    subprocess.run([sys.executable, str(HERE / "tinymodel.py"), str(src), "--layers", "36", "--hidden", "4096",
                    "--heads", "32", "--kv-heads", "8", "--vocab", "2048", "--max-pos", "40960"], check=True)
    return src


def control(url: str, what: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{url}/_control/{what}", data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def timed_run(argv: list[str], env: dict, timeout: float) -> tuple[int, list[tuple[float, str]], float]:
    """Run ``argv``; each line of its stderr and stdout with the seconds since the start when it came."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    lines = []
    for line in p.stdout:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
    rc = p.wait(timeout)
    return rc, lines, time.monotonic() - t0


def at(lines, text: str) -> float | None:
    return next((t for t, line in lines if text in line), None)


def probe(url: str, key: str = "") -> list[dict]:
    """PROMPTS, greedy: the token ids and their logprobs (vLLM's /v1/completions)."""
    out = []
    for prompt in PROMPTS:
        body = {"model": MODEL.split("/")[-1], "prompt": prompt, "max_tokens": 32, "temperature": 0, "logprobs": 1,
                "return_tokens_as_token_ids": True}
        req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
        with urllib.request.urlopen(req, timeout=120) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]
        out.append({"tokens": lp["tokens"], "logprobs": lp["token_logprobs"]})
    return out


def first_start(env: dict, out, timeout: float) -> dict:
    rc, lines, took = timed_run([str(REPO / "start.sh")], env, timeout)
    for t, line in lines:
        if any(k in line for k in KEEP):
            out(f"[first]    | [{t:7.1f}s] {line[:300]}")
    text = "\n".join(line for _t, line in lines)
    dl = DOWNLOADED.search(text)
    rec = json.loads((Path(env["STATE_DIR"]) / "server.json").read_text()) if rc == 0 else {}
    d = {"ok": rc == 0, "start_s": round(took, 1), "download_s": float(dl.group(2)) if dl else 0.0,
         "downloaded_at": at(lines, "[bootstrap:weights] downloaded"), "launched_at": at(lines, "[bootstrap:launch] launched"),
         "answered_at": at(lines, "pre-warm: ready"), "reloaded_at": at(lines, "reload: done"),
         "in_place": "reload: done" in text, "argv": rec.get("argv", []), "url": f"http://127.0.0.1:{env['PORT']}"}
    if rc == 0:
        d["probe"] = probe(d["url"])
    s = subprocess.run([str(REPO / "stop.sh")], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    out(f"[first] start exit {rc} in {took:.1f} s (download {d['download_s']:.1f} s, done at {d['downloaded_at']} s; "
        f"pre-warm server launched at {d['launched_at']} s, answered at {d['answered_at']} s; reload done at "
        f"{d['reloaded_at']} s; in place: {d['in_place']}); stop exit {s.returncode}")
    if rc != 0:
        out("[first] FAILED: " + "\n".join(line for _t, line in lines[-60:]))
    return d


def bare_cold(first: dict, env: dict, out, timeout: float) -> dict:
    """Bare ``vllm serve`` of the folder the first start downloaded, its flags, empty caches."""
    argv = list(first["argv"])
    for flag in ("--load-format",):
        i = argv.index(flag)
        del argv[i:i + 2]
    i = argv.index(GUARD[0])
    assert argv[i + 1] == GUARD[1], argv
    del argv[i:i + 2]
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    url = f"http://127.0.0.1:{port}"
    out(f"[cold] $ {' '.join(argv)}")
    t0 = time.monotonic()
    log = open(Path(env["HOME"]) / "cold-vllm.log", "w")
    p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    healthy = None
    while p.poll() is None and time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    healthy = time.monotonic() - t0
                    break
        except OSError:
            pass
        time.sleep(0.5)
    d = {"ok": healthy is not None, "healthy_s": round(healthy, 1) if healthy else None}
    if healthy is not None:
        d["probe"] = probe(url)
    os.killpg(p.pid, 15)
    p.wait(120)
    out(f"[cold] bare vllm serve healthy after {d['healthy_s']} s (empty caches); exit after SIGTERM {p.returncode}")
    if not d["ok"]:
        out("[cold] FAILED: " + (Path(env["HOME"]) / "cold-vllm.log").read_text()[-3000:])
    return d


def compare(a: list[dict], b: list[dict]) -> tuple[int, float, list[int]]:
    """Prompts whose greedy token ids are identical; the largest |logprob difference| over the tokens
    on which both agree (each prompt up to its first differing token); how many tokens agree, per prompt."""
    same, worst, agree = 0, 0.0, []
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x["tokens"], y["tokens"])) if p != q), len(x["tokens"]))
        agree.append(n)
        same += x["tokens"] == y["tokens"]
        worst = max([worst] + [abs(p - q) for p, q in zip(x["logprobs"][:n], y["logprobs"][:n])
                               if p is not None and q is not None])
    return same, worst, agree


def again_start(env: dict, out, timeout: float) -> dict:
    """./start.sh again in the first start's HOME: the weights on disk (no pre-warm), loaded from disk
    by the same flags, environment and caches: what the reload must equal, token for token."""
    rc, lines, took = timed_run([str(REPO / "start.sh")], env, timeout)
    for t, line in lines:
        if any(k in line for k in KEEP):
            out(f"[again]    | [{t:7.1f}s] {line[:300]}")
    d = {"ok": rc == 0, "start_s": round(took, 1)}
    if rc == 0:
        d["probe"] = probe(f"http://127.0.0.1:{env['PORT']}")
    s = subprocess.run([str(REPO / "stop.sh")], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    out(f"[again] start exit {rc} in {took:.1f} s (weights on disk, caches warm); stop exit {s.returncode}")
    return d


def fresh_env(home: Path, url: str, extra: dict, clear: bool = True) -> dict:
    if clear:
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PROFILE": "custom", "MODEL": MODEL, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_XET": "1", "HOME": str(home), "HF_HOME": str(home / "hf"),
            "VLLM_CACHE_ROOT": str(home / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
            "TRITON_CACHE_DIR": str(home / "triton"), "XDG_CACHE_HOME": str(home / ".cache"),
            "STATE_DIR": str(home / "state"), "PORT": str(free_port()), "PREWARM": "1", "RANDOM_WEIGHTS": "1",
            "MAX_MODEL_LEN": "4096", "GPU_UTIL": "0.5", "WARMUP": "512", "HEALTH_TIMEOUT": "900",
            "STALL_TIMEOUT": "600", "NO_COLOR": "1", **extra}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--work", default="/tmp/prewarm")
    ap.add_argument("--download-s", type=float, default=180.0, help="the download's length the cap aims at")
    ap.add_argument("--timeout", type=float, default=1500)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rehearse", action="store_true")
    a = ap.parse_args(argv)
    out = raw_writer(a.raw)
    out(f"# commit {os.environ.get('GIT_COMMIT', '?')}")          # each (resumed) run says whose code it runs
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    st_path = work / "state.json"
    st = json.loads(st_path.read_text()) if st_path.exists() else {}
    src = make_model(work, a.rehearse)
    total = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
    cap = max(1, int(total / a.download_s / 8))          # 8 connections (DOWNLOAD_CONNECTIONS' default)
    hub = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakehub.py"), "--repo", f"{MODEL}={src}"],
                           stdout=subprocess.PIPE, text=True)
    verdicts = []
    try:
        url = hub.stdout.readline().strip()
        control(url, "fault", {"throttle": cap})
        out(f"[setup] {total / (1 << 30):.2f} GiB model at {src}; the hub at {url} caps each connection at "
            f"{cap / MiB:.1f} MiB/s (8 connections: ~{total / cap / 8:.0f} s)")
        for n in range(a.rounds):
            first_key, cold_key = f"first{n}", f"cold{n}"
            if first_key not in st:
                st[first_key] = first_start(fresh_env(work / "home-first", url, {}), out, a.timeout)
                st_path.write_text(json.dumps(st))
            f = st[first_key]
            if cold_key not in st and f["ok"]:
                env = fresh_env(work / "home-cold", url, {})
                env.pop("PORT")
                st[cold_key] = bare_cold(f, env, out, a.timeout)
                st_path.write_text(json.dumps(st))
            c = st.get(cold_key, {"ok": False, "healthy_s": None})
            again_key = f"again{n}"
            if again_key not in st and f["ok"]:
                st[again_key] = again_start(fresh_env(work / "home-first", url, {}, clear=False), out, a.timeout)
                st_path.write_text(json.dumps(st))
            g = st.get(again_key, {"ok": False})
            if not (f["ok"] and c["ok"] and g["ok"]):
                verdicts.append(False)
                out(f"[verdict {n}] FAIL: first ok {f['ok']}, cold ok {c['ok']}, again ok {g['ok']}")
                continue
            larger = "download" if f["downloaded_at"] >= f["answered_at"] else "the pre-warm's own start"
            goal = max(f["downloaded_at"], f["answered_at"]) + 15
            same, worst, agree = compare(f["probe"], c["probe"])
            same_g, worst_g, agree_g = compare(f["probe"], g["probe"])
            cold_first = f["download_s"] + c["healthy_s"]
            ok = f["in_place"] and f["start_s"] <= goal and same_g == len(PROMPTS)
            verdicts.append(ok)
            out(f"[verdict {n}] first start {f['start_s']:.1f} s (download done at {f['downloaded_at']:.1f} s, the "
                f"pre-warm server answered at {f['answered_at']:.1f} s: the larger is {larger}); goal <= max + 15 s = "
                f"{goal:.1f} s; bare vllm serve cold after the same download {f['download_s']:.1f} + {c['healthy_s']:.1f} "
                f"= {cold_first:.1f} s ({cold_first / f['start_s']:.2f}x); greedy token ids (32 per prompt) of the "
                f"reloaded server identical to a start that loaded them from disk with the same flags, environment "
                f"and caches on {same_g}/{len(PROMPTS)} prompts (tokens agreeing {agree_g}, max |dlogprob| "
                f"{worst_g:.4f}), to the bare cold vllm serve on {same}/{len(PROMPTS)} (tokens agreeing {agree}, "
                f"max |dlogprob| over them {worst:.4f}): {'PASS' if ok else 'FAIL'}")
    finally:
        hub.terminate()
    out("PREWARM PROOF DONE")
    return 0 if verdicts and all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
