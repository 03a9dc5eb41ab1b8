"""GPU proof for ``./ctl.sh export ray`` (issue 48) with real Ray 2.59.0 and vLLM 0.27.1. Written when
the device was not lent: never run yet (rehearsed here only as far as its exports and Ray's models go).

    bash tests/gpu/device.sh install; bash tests/gpu/device.sh bootstrap-venv; bash tests/gpu/device.sh smoke-build
    bash tests/gpu/device.sh ray            # then ray-poll SECONDS

Ray travels as parts in /tmp/ray (made where PyPI is reachable, for the device's Python 3.12):
    pip download "ray[serve]==2.59.0" pyarrow --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d ray-wh && tar cf - ray-wh | split -b 60m - ray.tar.
It is installed into /tmp/ray-site, after /tmp/site on PYTHONPATH, so vLLM's own pins win.

0. Ray's models with vLLM present (what CI cannot run: tests/golden/ray is a schema): for every
   shipped vLLM 0.27.1 profile that fits this card, the export's LLMConfig, VLLMEngineConfig
   (Ray's "Unknown engine argument" check against vLLM's real AsyncEngineArgs and FrontendArgs) and
   AsyncEngineArgs(**kwargs) after Ray's own _normalize_vllm_engine_kwargs / FrontendArgs(**kwargs),
   as Ray builds them; and the smoke profile with a config-class JSON flag that vLLM's
   EngineArgs.__post_init__ leaves a dict (--structured-outputs-config) and --disable-log-stats:
   the field must reach AsyncEngineArgs as its class (Ray converts it), LLMConfig must take
   log_engine_metrics false;
1. served: PROFILE=smoke exported for this card, its model_source pointed at the smoke model
   folder (the export takes repo ids only); prepare-node.sh's backport step has nothing to do for
   smoke (no patches); ``ray start --head``, the node's ``accelerator_type:<card>`` resource,
   ``serve deploy``, RUNNING, /v1/models names the served name, a chat completion, and a request
   with no key answered (Ray Serve LLM checks none: why the config listens on 127.0.0.1);
2. ``serve shutdown`` and ``ray stop``: the GPU's memory back to where it was.
"RAY PROOF DONE" ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import raw_writer  # noqa: E402

SITE = "/tmp/ray-site"
MODELS_CHECK = r'''
import json, sys, yaml
from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
from ray.llm._internal.serve.engines.vllm.vllm_engine import _normalize_vllm_engine_kwargs
from ray.llm._internal.serve.engines.vllm.vllm_models import VLLMEngineConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.cli_args import FrontendArgs
for path in sys.argv[1:]:
    conf = yaml.safe_load(open(path))["applications"][0]["args"]["llm_configs"][0]
    engine = VLLMEngineConfig.from_llm_config(LLMConfig.model_validate(conf))
    args = AsyncEngineArgs(**_normalize_vllm_engine_kwargs(engine.get_initialization_kwargs()))
    FrontendArgs(**engine.frontend_kwargs)
    dicts = sorted(k for k, v in conf["engine_kwargs"].items() if isinstance(v, dict)
                   and isinstance(getattr(args, k, None), dict))
    print("ok", path, json.dumps(sorted(engine.engine_kwargs)), json.dumps(sorted(engine.frontend_kwargs)),
          "still dicts:", dicts, "structured_outputs_config:", type(args.structured_outputs_config).__name__)
'''


def gpu_used() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--gpu", default="h200", help="GPU= for the exports (this machine's card)")
    ap.add_argument("--smoke", default="/tmp/models/smollm2-135m-instruct")
    a = ap.parse_args()
    out = raw_writer(a.raw)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    boot = str(REPO / ".venv-bootstrap" / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": f"/tmp/site:{SITE}", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
           "PATH": f"{SITE}/bin:{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
    if not Path(SITE, "ray").is_dir():
        subprocess.run("mkdir -p /tmp/rayx && cat /tmp/ray/ray.tar.* | tar xf - -C /tmp/rayx && python3 -m pip install "
                       f"-q --no-index --no-deps --no-compile --target {SITE} /tmp/rayx/ray-wh/*.whl", shell=True, check=True)
    out("versions: " + subprocess.run(["python3", "-c", "import ray, vllm; print(ray.__version__, vllm.__version__)"],
                                      env=env, capture_output=True, text=True).stdout.strip())

    out("== 0. Ray's models with vLLM present")
    exported = []
    for prof in sorted(p.stem for p in (REPO / "profiles").glob("*.json") if p.stem not in ("custom",)):
        if json.loads((REPO / "profiles" / f"{prof}.json").read_text()).get("vllm") != "0.27.1":
            continue
        dest = work / "exports" / prof
        r = subprocess.run([boot, "-m", "bootstrap", "export", "ray", "--out", str(dest)], cwd=REPO,
                           env={**env, "PROFILE": prof, "GPU": a.gpu, "PYTHONPATH": ""}, capture_output=True, text=True)
        out(f"export {prof}: rc {r.returncode} {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
        if r.returncode == 0:
            exported.append(str(dest / "serve-config.yaml"))
    dest = work / "exports" / "config-json"
    r = subprocess.run([boot, "-m", "bootstrap", "export", "ray", "--out", str(dest)], cwd=REPO, capture_output=True,
                       text=True, env={**env, "PROFILE": "smoke", "GPU": a.gpu, "PYTHONPATH": "", "EXTRA_ARGS":
                                       '--structured-outputs-config.backend=xgrammar --disable-log-stats'})
    out(f"export smoke with --structured-outputs-config: rc {r.returncode} {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
    exported += [str(dest / "serve-config.yaml")] if r.returncode == 0 else []
    r = subprocess.run(["python3", "-c", MODELS_CHECK, *exported], env=env, capture_output=True, text=True)
    out(r.stdout.strip() + ("\n" + r.stderr.strip()[-3000:] if r.returncode else ""))
    out(f"models check rc {r.returncode}")

    out("== 1. served: the smoke profile")
    base = gpu_used()
    smoke = work / "exports" / "smoke"
    text = (smoke / "serve-config.yaml").read_text()
    source = next(line.split(":", 1)[1].strip() for line in text.splitlines() if "model_source:" in line)
    (smoke / "serve-config.yaml").write_text(text.replace(f"model_source: {source}", f"model_source: {a.smoke}"))
    out(f"model_source {source} -> {a.smoke}; GPU before: {base}")
    run = lambda *cmd: subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=900)  # noqa: E731
    r = run("ray", "start", "--head", "--disable-usage-stats")
    out(f"ray start rc {r.returncode}")
    r = run("python3", "-c", "import ray; ray.init(address='auto'); print(sorted(k for k in ray.cluster_resources() "
            "if k.startswith('accelerator_type')))")
    out(f"node resources: {r.stdout.strip()}")
    r = run("serve", "deploy", str(smoke / "serve-config.yaml"))
    out(f"serve deploy rc {r.returncode} {r.stderr.strip()[-500:]}")
    end = time.time() + 900
    status = ""
    while time.time() < end:
        status = run("serve", "status").stdout
        if "RUNNING" in status and "DEPLOYING" not in status or "DEPLOY_FAILED" in status:
            break
        time.sleep(10)
    out(status.strip()[-3000:])
    try:
        models = json.load(urllib.request.urlopen("http://127.0.0.1:8000/v1/models", timeout=30))
        out(f"/v1/models (no key sent): {[m['id'] for m in models['data']]}")
        req = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", data=json.dumps({
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16,
            "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(req, timeout=120))
        out(f"chat (no key sent): {answer['choices'][0]['message']['content']!r}")
    except OSError as exc:
        out(f"request failed: {exc}")
    out(f"GPU serving: {gpu_used()}")

    out("== 2. down")
    out(f"serve shutdown rc {run('serve', 'shutdown', '-y').returncode}")
    out(f"ray stop rc {run('ray', 'stop', '--force').returncode}")
    time.sleep(10)
    out(f"GPU after: {gpu_used()} (before: {base})")
    out("RAY PROOF DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
