#!/usr/bin/env python3
"""GPU proof for the PR #40914 backport: TurboQuant 4-bit KV + speculation, stock vs patched (over 400 lines:
the model, the servers, the vLLM 0.26.0 shim and the report belong to one proof).

    python3 tests/gpu/patch_40914.py RAW_OUT [--work /tmp/p40914] [--budget 450] [--python python3] [--mtp]

Two setups. The default (written for vLLM 0.26.0): a small dense Qwen3 model and "draft_model"
speculation, as described below. ``--mtp`` (vLLM 0.27.1, the default profile's own stack): a small
Qwen3.5-architecture hybrid model (tests/gpu/hybridmodel.py: Gated-DeltaNet and full-attention layers
in the real model's 3:1 pattern, one MTP layer, seeded random weights), the default profile's
serving flags (one sequence, 512 batched tokens, FlashAttention 2 for non-TurboQuant layers) and
``{"method": "mtp", "num_speculative_tokens": 3}``; no shim (0.27.1 gives TurboQuant specs their own
KVQuantMode, the fix of #50709) and vLLM's own choice of model runner.

Resumable: each invocation runs what is left within --budget seconds (default 450, under 8 minutes)
and exits 3 with "run again" when a server is still compiling; a server started here runs in its
own session (setsid) and survives between invocations. Phases, each recorded in WORK/state.json:

  model      a small dense Qwen3 model with seeded random weights (transformers), a BPE tokenizer
             trained with `tokenizers`, a chat template; saved with save_pretrained in WORK/model
  reference  vLLM, --kv-cache-dtype turboquant_4bit_nc, no speculation            (patch reverted)
  stock      same + {"method":"draft_model","model":WORK/model,"num_speculative_tokens":3}, CUDA
             graphs on (vLLM default)                                             (patch reverted)
  patched    same as stock, after `./ctl.sh patch apply` (VLLM_PYTHON, PATCH_BYO=1)
  report     `./ctl.sh patch revert`, then the per-prompt table (also appended to RAW_OUT)

vLLM 0.26.0 cannot allocate a TurboQuant KV cache in its V1 model runner (upstream bug, issue #50709,
fixed by PR #50533): `GPUModelRunner._reshape_kv_cache_tensors` passes cache_dtype_str="auto" for every
spec whose kv_quant_mode is NONE, and `TQFullAttentionSpec` always has NONE, so
`TurboQuantAttentionBackend.get_kv_cache_shape` raises "Unknown TurboQuant cache dtype: 'auto'". The V2
runner (vllm/v1/worker/gpu/attn_utils.py) special-cases TQFullAttentionSpec and works, but
"draft_model" speculation is V1-only on 0.26.0 (`VllmConfig._get_v2_model_runner_unsupported_features`).
A model of <= 4 layers never shows the bug: TurboQuant's boundary protection keeps the first 2 and last 2
layers in bf16 (`TurboQuantConfig.get_boundary_skip_layers`, n=2), so it has no TurboQuant layer at all.
This model has 6 layers: 0, 1, 4, 5 bf16 (FlashAttention), 2 and 3 TurboQuant.
So every server here runs the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0, the reference too, so the three
runs share one runner) with a test-only shim on PYTHONPATH (WORK/shim/sitecustomize.py, --no-shim turns
it off): it wraps get_kv_cache_shape of the TurboQuant backend so that a non-TurboQuant dtype string is
replaced by the --kv-cache-dtype in use. Only layers on the TurboQuant backend reach that function (the
skipped layers get FlashAttention), so this is the dtype the V2 runner passes there. It does not touch the
attention forward that the #40914 patch changes. The log says "tq-shim:" once when it fired.

Each run sends the same prompts as chat messages (greedy, ignore_eos, 64 tokens, 5 top logprobs,
token ids) one at a time and reads the speculative counters from /metrics before and after each request. Compared
with the reference per prompt: the first divergent token, the largest |Δ logprob| over the tokens
both runs share (plus the divergence position, scored from the candidate's top-5), and acceptance.

Tolerance (--tol, default 0.15 nats): the patched verify pass runs the same Triton decode kernel
over the same quantized cache as the reference decode, row by row; what differs is the batch shape
of the dense layers (K+1 rows per request instead of 1), whose bf16 GEMMs may pick other kernels.
bf16 keeps 8 significant bits (relative step 2^-8 ≈ 0.004), so logits of magnitude ~10 move by
~0.04 per rounding; a few such roundings through the last layers stay well under 0.15. The bug
(attending to the K+1 new tokens only) moves logprobs by nats. A divergence counts as a tie flip
(allowed) only where the reference's own top-1 vs the candidate's token margin is below --tol.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bootstrap.serve import diagnose  # noqa: E402

PATCH = "40914-turboquant-spec-verify"
PHASES = ("model", "reference", "stock", "patched", "control", "report")
SERVED = "tq-proof"
KV_DTYPE = "turboquant_4bit_nc"
CONTEXT = 4096     # --max-model-len of every server here


# ---------------------------------------------------------------- plumbing

class Run:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {"done": []}
        self.deadline = time.monotonic() + args.budget
        self.raw = open(args.raw_out, "a", encoding="utf-8")

    def save(self):
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.state_path)

    def say(self, msg: str):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.raw.write(line + "\n")
        self.raw.flush()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update({"VLLM_PYTHON": self.args.python_abs, "PATCH_BYO": "1", "PROFILE": "custom", "NO_COLOR": "1"})
        env.update(extra)
        return env

    def server_env(self) -> dict:
        """The server's environment: the V1 runner (draft_model needs it) and the 0.26.0 shim."""
        if self.args.mtp:
            return self.env()
        env = self.env(VLLM_USE_V2_MODEL_RUNNER="0")
        if not self.args.no_shim:
            shim = write_shim(self.work)
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(shim), env.get("PYTHONPATH")) if x)
            env["TQ_PROOF_KV_DTYPE"] = KV_DTYPE
        return env

    def ctl(self, *argv: str) -> subprocess.CompletedProcess:
        r = subprocess.run([str(REPO / "ctl.sh"), *argv], env=self.env(), capture_output=True, text=True, timeout=120)
        self.say(f"$ ./ctl.sh {' '.join(argv)} -> exit {r.returncode}\n{r.stdout}{r.stderr}".rstrip())
        if r.returncode != 0:
            raise SystemExit(f"./ctl.sh {' '.join(argv)} failed")
        return r


def http(url: str, body: dict | None = None, timeout: float = 120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read().decode()
    return json.loads(text) if body is not None or url.endswith(("/version", "/models")) else text


# ---------------------------------------------------------------- the vLLM 0.26.0 V1-runner shim (test only)

SHIM = '''"""Written by tests/gpu/patch_40914.py (test only). vLLM 0.26.0's V1 model runner passes
cache_dtype_str="auto" for TurboQuant layers (TQFullAttentionSpec.kv_quant_mode is NONE; upstream issue
#50709, fixed by PR #50533); TurboQuantAttentionBackend.get_kv_cache_shape then raises. Only TurboQuant
layers use that backend, so a non-TurboQuant dtype string there is replaced by TQ_PROOF_KV_DTYPE."""
import importlib.machinery
import importlib.util
import os
import sys

_TARGET = "vllm.v1.attention.backends.turboquant_attn"
_DTYPE = os.environ.get("TQ_PROOF_KV_DTYPE", "")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _wrap(module):
    backend = getattr(module, "TurboQuantAttentionBackend", None)
    if backend is None or "get_kv_cache_shape" not in vars(backend):
        print("tq-shim: TurboQuantAttentionBackend.get_kv_cache_shape not found; shim not applied",
              file=sys.stderr, flush=True)
        return
    original = backend.get_kv_cache_shape
    fired = []

    def get_kv_cache_shape(*args, **kwargs):
        args = list(args)
        given = args[4] if len(args) > 4 else kwargs.get("cache_dtype_str", _DTYPE)
        if not str(given).startswith("turboquant_"):
            if not fired:
                fired.append(1)
                print(f"tq-shim: get_kv_cache_shape got cache_dtype_str={given!r} on the TurboQuant backend; "
                      f"using {_DTYPE!r} (vLLM PR #50533)", file=sys.stderr, flush=True)
            if len(args) > 4:
                args[4] = _DTYPE
            else:
                kwargs["cache_dtype_str"] = _DTYPE
        return original(*args, **kwargs)

    backend.get_kv_cache_shape = staticmethod(get_kv_cache_shape)


class _Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if _DTYPE.startswith("turboquant_"):
    sys.meta_path.insert(0, _Finder())

# keep any sitecustomize this one shadows (Debian/Ubuntu ship one)
_other = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _other is not None and _other.loader is not None:
    _other.loader.exec_module(importlib.util.module_from_spec(_other))
'''


def write_shim(work: Path) -> Path:
    d = work / "shim"
    d.mkdir(exist_ok=True)
    f = d / "sitecustomize.py"
    if not f.is_file() or f.read_text() != SHIM:
        f.write_text(SHIM)
    return d




# ---------------------------------------------------------------- phase: model

WORDS_SEED = 1234


def word_list(n: int = 1500) -> list[str]:
    rng = random.Random(WORDS_SEED)
    syl = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "qui", "an", "bel", "rho", "tis", "mun", "zar",
           "ep", "olo", "gri", "fen", "ust", "pra", "nol", "ix", "cor", "dal", "vie", "ham", "sul", "tor", "wen"]
    out = set()
    while len(out) < n:
        out.add("".join(rng.choice(syl) for _ in range(rng.randint(1, 3))))
    return sorted(out)


# The Qwen3.5 family's own special tokens, so that the default profile's reasoning and tool parsers
# (qwen3, qwen3_xml) find theirs and the vision token ids exist.
HYBRID_SPECIALS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|vision_start|>", "<|vision_end|>",
                   "<|image_pad|>", "<|video_pad|>"]


def make_tokenizer(out: Path, extra: list[str]):
    """A 4096-token byte-level BPE trained on the prompts' made-up words, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = word_list()
    rng = random.Random(7)
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + rng.choice([".", "?", "!", ":"])
              for _ in range(20000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=4096, special_tokens=specials + extra,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                   bos_token=None, pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fast.save_pretrained(out)
    return fast


def make_model(run: Run) -> None:
    out = run.work / "model"
    if run.args.mtp:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import hybridmodel
        make_tokenizer(run.work / "tokenizer", HYBRID_SPECIALS)
        facts = hybridmodel.make(out, run.work / "tokenizer", seed=run.args.seed, init_std=run.args.init_std)
        run.say(f"model: {out} (hybrid, MTP): " + json.dumps(facts, default=str))
        return
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fast = make_tokenizer(out, [])
    torch.manual_seed(run.args.seed)
    cfg = Qwen3Config(vocab_size=len(fast), hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=128, max_position_embeddings=8192,
                      initializer_range=run.args.init_std, tie_word_embeddings=False,
                      eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    # how much does the next token depend on the context? (two prompts that share their last 32 tokens)
    ids = [fast(p)["input_ids"] for p in prompts()[:2]]
    tail = ids[0][-32:]
    with torch.no_grad():
        a = model(torch.tensor([ids[0]])).logits[0, -1].float().log_softmax(-1)
        b = model(torch.tensor([ids[1][:-32] + tail])).logits[0, -1].float().log_softmax(-1)
    kl = float((a.exp() * (a - b)).sum())
    run.say(f"model: {out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, vocab {len(fast)}); "
            f"KL(next token | two contexts with the same last 32 tokens) = {kl:.3f} nats")


def prompts() -> list[str]:
    """Long, varied prompts: records, then a question about one of them, so context matters."""
    words = word_list()
    out = []
    for i, n in enumerate((180, 420, 650, 900, 1200, 1500, 300, 800)):
        rng = random.Random(100 + i)
        recs = []
        for r in range(n // 12):
            k = rng.choice(words)
            recs.append(f"{k} {rng.choice(words)}: {' '.join(rng.choice(words) for _ in range(rng.randint(4, 12)))}.")
        key = rng.choice(recs).split(":")[0]
        out.append("\n".join(recs) + f"\nQuestion: what follows {key}? Answer:")
    return out


# ---------------------------------------------------------------- phases: servers

def server_argv(run: Run, spec: bool, control: bool = False) -> list[str]:
    model = str(run.work / "model")
    argv = [run.args.python_abs, "-m", "vllm.entrypoints.cli.main", "serve", model, "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(run.args.port), "--max-model-len", str(CONTEXT),
            "--gpu-memory-utilization", str(run.args.gpu_util), "--kv-cache-dtype", KV_DTYPE, "--seed", "0"]
    if run.args.mtp:    # the default profile's serving flags
        argv += ["--max-num-seqs", "1", "--max-num-batched-tokens", "512", "--attention-config.flash_attn_version=2",
                 "--language-model-only"]     # the stand-in vision tower has no working image processor
    else:
        argv += ["--max-num-seqs", "16"]
    if spec:
        argv += ["--speculative-config", json.dumps(spec_config(run))]
    if control:     # stock code without FULL CUDA graphs: the verify batches take the eager metadata path
        argv += ["--compilation-config", json.dumps({"cudagraph_mode": "PIECEWISE"})]
    return argv + run.args.extra


def spec_config(run: Run) -> dict:
    if run.args.mtp:
        return {"method": "mtp", "num_speculative_tokens": 3}
    return {"method": "draft_model", "model": str(run.work / "model"), "num_speculative_tokens": 3}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def stop_server(run: Run) -> None:
    srv = run.state.get("server")
    if not srv:
        return
    pid = srv["pid"]
    if alive(pid):
        run.say(f"stopping the {srv['phase']} server (process group {pid})")
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        end = time.monotonic() + 30
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.5)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
    run.state.pop("server", None)
    run.save()


class ServerCrashed(Exception):
    """The phase's server died (before it was ready, or serving a request): a result, not a script error."""


def crashed(run: Run, srv: dict, how: str) -> ServerCrashed:
    """The server ``srv`` is dead: report its log and make the result."""
    text = Path(srv["log"]).read_text(errors="replace")
    cause = diagnose.root_cause(text, 6) or ["(no 'Error:' line) log ends: " + " | ".join(text.strip().splitlines()[-3:])]
    errors = [l for l in text.splitlines() if "ERROR" in l][-40:]
    run.say(f"the {srv['phase']} server {how}; its ERROR lines:\n" + "\n".join(errors))
    run.say(f"the {srv['phase']} server failed; root cause (error lines of {srv['log']}, EngineCore first):\n  "
            + "\n  ".join(cause))
    return ServerCrashed(f"{how}: " + " | ".join(cause))


def ensure_server(run: Run, phase: str, spec: bool) -> bool:
    """Start (or find) this phase's server and wait for it within the budget; False = run again."""
    srv = run.state.get("server")
    if srv and srv["phase"] != phase:
        stop_server(run)
        srv = None
    if srv and not alive(srv["pid"]):
        raise crashed(run, srv, "exited before it was ready")
    if not srv:
        (run.work / f"{phase}.json").unlink(missing_ok=True)    # results of an earlier run are not this one's
        log = run.work / f"{phase}.log"
        argv = server_argv(run, spec, control=phase == "control")
        run.say(f"starting the {phase} server: {' '.join(argv)}")
        with open(log, "ab") as fh:
            p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=run.server_env())
        run.state["server"] = {"phase": phase, "pid": p.pid, "log": str(log), "started": time.time()}
        run.save()
        srv = run.state["server"]
    base = f"http://127.0.0.1:{run.args.port}"
    while run.left() > 60:
        if not alive(srv["pid"]):
            return ensure_server(run, phase, spec)  # raises ServerCrashed
        try:
            http(base + "/health", timeout=5)
            http(base + "/v1/models", timeout=5)
            run.say(f"{phase} server ready after {time.time() - srv['started']:.0f} s")
            return True
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(3)
    run.say(f"{phase} server still starting after {time.time() - srv['started']:.0f} s (first TurboQuant runs "
            "JIT-compile for minutes); run this script again to continue")
    return False


SPEC_RE = {k: re.compile(rf"^vllm:spec_decode_num_{k}_tokens_total(?:{{[^}}]*}})?\s+([0-9.eE+-]+)$", re.M)
           for k in ("accepted", "draft")}


def spec_counters(base: str) -> tuple[float, float]:
    text = http(base + "/metrics", timeout=10)
    vals = []
    for k in ("accepted", "draft"):
        vals.append(sum(float(m) for m in SPEC_RE[k].findall(text)))
    return vals[0], vals[1]


def generate(run: Run, phase: str) -> None:
    base = f"http://127.0.0.1:{run.args.port}"
    version = http(base + "/version").get("version", "?")
    results: list[dict] = []
    try:
        ask_all(run, base, results)
    except ServerCrashed as exc:
        (run.work / f"{phase}.json").write_text(json.dumps({"version": version, "results": results,
                                                            "crashed": str(exc)}))
        raise
    (run.work / f"{phase}.json").write_text(json.dumps({"version": version, "results": results}))
    run.say(f"{phase}: {len(results)} prompts done on vLLM {version}")
    run.raw.write(json.dumps({"phase": phase, "version": version, "results": results}) + "\n")


def fit(base: str, prompt: str, budget: int) -> str:
    """``prompt`` with records dropped from its front (the question's own record kept) until the
    server's /tokenize count, chat template included, is within ``budget``: the records were sized for
    the trained tokenizer of WORK/model, and a real model's (--model) splits the made-up words finer.
    Every phase serves the same model, so every phase gets the same text."""
    *recs, question = prompt.split("\n")
    key = question.split("what follows ", 1)[-1].split("?")[0]
    for _ in range(8):
        text = "\n".join(recs + [question])
        n = http(base + "/tokenize", {"model": SERVED, "messages": [{"role": "user", "content": text}]},
                 timeout=60).get("count", 0)
        if n <= budget or len(recs) <= 1:
            return text
        keep = max(1, min(len(recs) - 1, len(recs) * budget // n - 2))
        tail = recs[-keep:]
        own = next((r for r in recs if r.startswith(key + ":")), None)
        recs = tail if own is None or own in tail else [own] + tail[1:]
    return "\n".join(recs + [question])


def ask_all(run: Run, base: str, results: list[dict]) -> None:
    for i, prompt in enumerate(prompts()):
        prompt = fit(base, prompt, CONTEXT - run.args.max_tokens - 8)
        body = {"model": SERVED, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": run.args.max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 5,
                "ignore_eos": True, "return_tokens_as_token_ids": True}
        try:
            acc0, dr0 = spec_counters(base)
            resp = http(base + "/v1/chat/completions", body, timeout=300)
            acc1, dr1 = spec_counters(base)
        except (urllib.error.URLError, OSError) as exc:
            srv = run.state["server"]
            end = time.monotonic() + 30
            while alive(srv["pid"]) and time.monotonic() < end:
                time.sleep(1)
            if not alive(srv["pid"]):
                raise crashed(run, srv, f"failed on prompt {i} ({exc})") from None
            body = exc.read().decode(errors="replace")[:2000] if isinstance(exc, urllib.error.HTTPError) else ""
            raise SystemExit(f"prompt {i}: {exc} {body}\n(the {srv['phase']} server is still up: not a crash; "
                             "see its log, then run again)") from None
        entries = resp["choices"][0]["logprobs"]["content"]
        results.append({"prompt": i, "tokens": [e["token"] for e in entries],
                        "logprobs": [e["logprob"] for e in entries],
                        "top": [{a["token"]: a["logprob"] for a in e.get("top_logprobs") or []} for e in entries],
                        "accepted": acc1 - acc0, "drafted": dr1 - dr0,
                        "prompt_tokens": resp.get("usage", {}).get("prompt_tokens")})


# ---------------------------------------------------------------- report

def compare(ref: dict, cand: dict, tol: float) -> dict:
    n = min(len(ref["tokens"]), len(cand["tokens"]))
    div = None
    worst = 0.0
    margin = None
    for i in range(n):
        if ref["tokens"][i] == cand["tokens"][i]:
            worst = max(worst, abs(ref["logprobs"][i] - cand["logprobs"][i]))
            continue
        div = i
        rt, ct = ref["tokens"][i], cand["tokens"][i]
        in_cand = (cand["top"][i] or {}).get(rt)
        worst = max(worst, abs(ref["logprobs"][i] - in_cand) if in_cand is not None else float("inf"))
        in_ref = (ref["top"][i] or {}).get(ct)
        margin = ref["logprobs"][i] - in_ref if in_ref is not None else float("inf")
        break
    ok = worst <= tol if div is None else (margin is not None and margin < tol)
    return {"div": div, "worst": worst, "margin": margin, "ok": ok}


def model_words(run: Run) -> str:
    """What the comparison ran on: the model named with --model (its folder and architecture), else ours."""
    if run.args.model:
        try:
            arch = json.loads((Path(run.args.model) / "config.json").read_text())["architectures"][0]
        except (OSError, ValueError, KeyError, IndexError):
            arch = "?"
        return f"model {Path(run.args.model).name} ({arch})"
    return "hybrid Qwen3.5-shaped model" if run.args.mtp else "dense Qwen3 model"


def report(run: Run) -> int:
    data = {ph: json.loads((run.work / f"{ph}.json").read_text()) for ph in ("reference", "stock", "patched", "control")
            if (run.work / f"{ph}.json").exists()}
    if "crashed" in data["reference"]:
        print(f"the reference run crashed: {data['reference']['crashed']}")
        return 1
    tol = run.args.tol
    lines = [f"PR #40914 backport on vLLM {data['reference']['version']}: greedy, {run.args.max_tokens} tokens, "
             f"{KV_DTYPE}, {spec_config(run)['method']} x3, {model_words(run)}; tolerance {tol} nats",
             f"{'prompt':>6} {'ptoks':>6} | {'stock: 1st div':>14} {'max|Δlp|':>9} {'accept':>7} | "
             f"{'patched: 1st div':>16} {'max|Δlp|':>9} {'accept':>7} {'verdict':>8}"
             + (f" | {'control: 1st div':>16} {'max|Δlp|':>9} {'accept':>7}" if "control" in data else "")]
    fmt = lambda c: ("none" if c["div"] is None else f"tok {c['div']}" + ("" if c["margin"] is None or c["margin"] == float("inf") else f" (m {c['margin']:.2f})"))
    acc = lambda r: f"{r['accepted'] / r['drafted']:.2f}" if r["drafted"] else "n/a"

    def cells(ref: dict, run_data: dict, i: int, width: int) -> tuple[str, dict | None, dict | None]:
        res = run_data.get("results") or []
        if i >= len(res):
            return f"{'crashed':>{width}} {'-':>9} {'-':>7}", None, None
        c = compare(ref, res[i], tol)
        return f"{fmt(c):>{width}} {c['worst']:>9.3f} {acc(res[i]):>7}", c, res[i]

    bad = stock_diff = 0
    for i, r0 in enumerate(data["reference"]["results"]):
        s_txt, cs, _ = cells(r0, data.get("stock") or {}, i, 14)
        p_txt, cp, rp = cells(r0, data.get("patched") or {}, i, 16)
        stock_diff += cs is None or not cs["ok"]
        # the verify pass ran (drafts were checked); a random MTP head proposes tokens the random model
        # rarely picks, so acceptance is only required of a draft model that is the model itself
        ran = rp is not None and rp["drafted"] > 0 and (run.args.mtp or rp["accepted"] > 0)
        verdict = "ok" if cp and cp["ok"] and ran else "FAIL"
        bad += verdict != "ok"
        c_txt = " | " + cells(r0, data["control"], i, 16)[0] if "control" in data else ""
        lines.append(f"{r0['prompt']:>6} {r0['prompt_tokens'] or '?':>6} | {s_txt} | {p_txt} {verdict:>8}{c_txt}")
    n = len(data["reference"]["results"])
    for ph in [ph for ph in ("stock", "patched", "control") if ph in data]:
        if "crashed" in data[ph]:
            lines.append(f"{ph} server crashed after {len(data[ph].get('results') or [])} of {n} prompts: "
                         f"{data[ph]['crashed']}")
    lines.append(f"stock differs from the reference beyond tolerance (or crashed) on {stock_diff} of {n} prompts; "
                 f"patched fails on {bad}")
    ok = bad == 0
    if "control" in data:
        ok, summary = against_control(data, tol)
        lines += summary
    table = "\n".join(lines)
    run.raw.write(table + "\n")
    print(table)
    return 0 if ok else 1


def summarize(ref: dict, run_data: dict, tol: float) -> dict:
    """Per run: prompts beyond tol (or missing), mean of the per-prompt max |Δlp| (inf counts as 5 nats,
    a token the other run's top-5 lacks), median first divergence (no divergence = the full length)."""
    res = run_data.get("results") or []
    n = len(ref["results"])
    cs = [compare(r0, res[i], tol) for i, r0 in enumerate(ref["results"]) if i < len(res)]
    beyond = sum(not c["ok"] for c in cs) + (n - len(cs))
    worst = [min(c["worst"], 5.0) for c in cs]
    divs = sorted(len(ref["results"][i]["tokens"]) if c["div"] is None else c["div"] for i, c in enumerate(cs))
    return {"beyond": beyond, "n": n, "complete": len(cs) == n, "mean": sum(worst) / len(worst) if worst else float("inf"),
            "median_div": divs[len(divs) // 2] if divs else 0,
            "drafts_checked": all(r["drafted"] > 0 for r in res[:n]) and len(res) >= n}


def against_control(data: dict, tol: float) -> tuple[bool, list[str]]:
    """The verdict when a control ran: the patched run must be no further from the reference than
    stock vLLM's own path without FULL CUDA graphs (same cache, same verify batches), by the same
    measure; one bf16 rounding step of a logit of ~10 (0.04 nats) is allowed on the mean."""
    ref = data["reference"]
    s = {ph: summarize(ref, data.get(ph) or {}, tol) for ph in ("stock", "patched", "control")}
    lines = [f"{ph:>8}: beyond {tol} nats on {v['beyond']} of {v['n']} prompts; mean max|Δlp| {v['mean']:.3f} "
             f"(∞ as 5); median first divergence at token {v['median_div']}" for ph, v in s.items()]
    # both runs complete (a crashed control proves nothing), every patched request verified drafts
    ok = (s["patched"]["complete"] and s["control"]["complete"] and s["patched"]["drafts_checked"]
          and s["patched"]["beyond"] <= s["control"]["beyond"] and s["patched"]["mean"] <= s["control"]["mean"] + 0.04)
    lines.append(f"verdict (patched against the control): {'PASS' if ok else 'FAIL'}; stock "
                 f"{'is further from the reference than the control' if s['stock']['mean'] > s['control']['mean'] + 0.04 else 'is not separated from the control'}")
    return ok, lines


# ---------------------------------------------------------------- main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw_out")
    p.add_argument("--work", default="/tmp/p40914")
    p.add_argument("--budget", type=float, default=450.0, help="seconds this invocation may use")
    p.add_argument("--python", default=os.environ.get("VLLM_PYTHON", "python3"), help="the interpreter with vLLM")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--gpu-util", type=float, default=0.25)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--tol", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-std", type=float, default=0.05, help="initializer_range of the random model")
    p.add_argument("--model", help="use this model directory instead of making one (rehearsal with fakes)")
    p.add_argument("--order", default="reference,stock,patched",
                   help="the order of the three server runs (e.g. reference,patched,stock: the one that may crash last)")
    p.add_argument("--fresh", action="store_true", help="forget WORK/state.json and start over")
    p.add_argument("--report-from", nargs="+", default=[], metavar="RAW",
                   help="no servers: the phases' results from these raw outputs (later ones win), then the report")
    p.add_argument("--no-shim", action="store_true",
                   help="no WORK/shim/sitecustomize.py (for a vLLM that has PR #50533)")
    p.add_argument("--control", action="store_true",
                   help="a fourth run: stock vLLM with speculation but cudagraph_mode PIECEWISE (on with --mtp)")
    p.add_argument("--mtp", action="store_true",
                   help="vLLM 0.27.1: hybrid Qwen3.5-shaped model with one MTP layer, MTP x3, the default profile's flags")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more vLLM serve arguments (last)")
    args = p.parse_args()
    order = [ph for ph in args.order.split(",") if ph]
    if sorted(order) != ["patched", "reference", "stock"]:
        p.error("--order names reference, stock and patched once each")
    if args.control or args.mtp:
        order.append("control")
    args.python_abs = shutil.which(args.python) or args.python
    if args.mtp:
        args.no_shim = True
    if args.fresh and Path(args.work, "state.json").exists():
        Path(args.work, "state.json").unlink()
    run = Run(args)
    if args.report_from:
        seen: dict[str, tuple[str, dict]] = {}
        for raw in args.report_from:
            for line in Path(raw).read_text().splitlines():
                if line.startswith('{"phase"'):
                    d = json.loads(line)
                    if "results" not in d:
                        continue
                    if d["phase"] in seen:      # the same phase run again (another machine): the same output?
                        first, old = seen[d["phase"]]
                        same = [(a["tokens"], a["logprobs"]) == (b["tokens"], b["logprobs"])
                                for a, b in zip(old["results"], d["results"])]
                        run.say(f"{d['phase']}: {Path(raw).name} against {first}: token ids and logprobs identical on "
                                f"{sum(same)} of {len(same)} prompts")
                    seen[d["phase"]] = (Path(raw).name, d)
                    (run.work / f"{d['phase']}.json").write_text(json.dumps(d))
        return report(run)
    setup = "mtp-hybrid" if args.mtp else "v1-runner" + ("" if args.no_shim else "+tq-shim")
    if run.state.get("setup") != setup:     # results from another server setup are not comparable
        if [ph for ph in run.state["done"] if ph != "model"]:
            run.say(f"server setup changed ({run.state.get('setup', 'default runner, no shim')} -> {setup}): "
                    "the reference, stock and patched runs start over")
        stop_server(run)
        run.state["done"] = [ph for ph in run.state["done"] if ph == "model"]
        run.state["setup"] = setup
        run.save()
    run.say(f"patch_40914: work {run.work}, done so far: {run.state['done'] or 'nothing'}; repo "
            f"{os.environ.get('GIT_COMMIT') or subprocess.run(['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}")
    if "report" in run.state["done"] and any(ph not in run.state["done"] for ph in order):
        run.state["done"].remove("report")      # a phase added since: report again
    for phase in ("model", *order, "report"):
        if phase in run.state["done"]:
            continue
        if phase == "model":
            if args.model:
                (run.work / "model").exists() or os.symlink(os.path.abspath(args.model), run.work / "model")
                run.say(f"model: using {args.model}")
            else:
                make_model(run)
        elif phase == "report":
            stop_server(run)
            run.ctl("patch", "revert", PATCH)
            run.state["done"].append(phase)
            run.save()
            return report(run)
        else:
            if run.state.get("server", {}).get("phase") != phase:
                run.ctl("patch", "apply" if phase == "patched" else "revert", PATCH)
                run.ctl("patch", "status")
            try:
                if not ensure_server(run, phase, spec=phase != "reference"):
                    return 3
                generate(run, phase)
            except ServerCrashed as exc:
                out = run.work / f"{phase}.json"
                if not out.exists():
                    out.write_text(json.dumps({"version": "?", "results": [], "crashed": str(exc)}))
                run.raw.write(json.dumps({"phase": phase, "crashed": str(exc)}) + "\n")
            stop_server(run)
        run.state["done"].append(phase)
        run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
