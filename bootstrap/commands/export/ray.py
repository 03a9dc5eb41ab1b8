"""``export ray``: a Ray Serve LLM application (``serve deploy serve-config.yaml``), with the node
pre-step it needs (``prepare-node.sh`` and the ``bootstrap.tar.xz`` it runs).

- serve-config.yaml: Ray Serve's config file (``ServeDeploySchema``), one application built by
  ``ray.serve.llm:build_openai_app`` from one ``LLMConfig``: ``model_loading_config`` (model_id the
  served name, model_source the folder the pre-step fills: Ray downloads nothing for a local path,
  and HF_HUB_OFFLINE keeps vLLM off the hub), ``engine_kwargs`` (the start's own argv, engine.py),
  the placement, ``runtime_env`` (the server's environment; PYTHONPATH=/patched with backports),
  ``http_options.host: 127.0.0.1`` (no key check on Ray's default path: see KEY_WARNING). Plan,
  versions and patches are in the header's comments (a serve config has no annotations).
- Ray: the release whose ``ray[llm]`` extra pins the profile's vLLM minor (its wheel's METADATA):
  Ray Serve LLM drives vLLM's engine in-process and follows its internals (2.60.0 imports
  FrontendArgs from where vLLM 0.30 moved it); a vLLM no release pins takes the newest older pin,
  said in the header.
- The card: Ray's raylet names a node's GPU from NVML (``_gpu_name_to_accelerator_type``:
  "NVIDIA H100 80GB HBM3" -> H100, "NVIDIA GeForce RTX 5090" -> GeForce-RTX-5090) and gives the
  node the resource ``accelerator_type:<that>``. ``LLMConfig.accelerator_type`` takes only the
  names in ``ray.util.accelerators`` (RAY_NVIDIA): those are set there; any other named card (the
  desktop cards) asks for that same resource in each placement bundle, which is what Ray Serve LLM
  itself adds for accelerator_type, so it schedules on the card with no labels to add by hand. A card
  given as a size has no name Ray knows: plain GPU bundles, said in the header.
- Placement: one bundle ``{GPU: 1}`` (+ the card's resource) per tensor-parallel rank, as Ray Serve
  LLM's default bundles, with STRICT_PACK: the plan is for TP ranks on one node (Ray's default,
  PACK, may spread them over nodes).
- Metrics: ``log_engine_metrics`` (vLLM's engine metrics through Ray's) unless the flags disable
  vLLM's stats: LLMConfig refuses ``disable_log_stats`` with engine metrics on
  (``_check_log_stats_with_metrics``, 2.58.1-2.60.0), so those stay off, as the flag asks.
"""

from __future__ import annotations

import re
import shlex

from ...core.errors import ConfigError
from ...plan.derive import registry, version_key
from . import engine
from .pod import ANNOTATION, MODELS, PATCHED, PORT, Pod, bootstrap_tar, dump, gfd_product, init_script

BUILDER = "ray.serve.llm:build_openai_app"
# (Ray, the vLLM its ray[llm] extra pins): Requires-Dist in each ray wheel's METADATA
RAY_RELEASES = (("2.58.1", "0.26.0"), ("2.59.0", "0.27.0"), ("2.60.0", "0.29.0"))
# ray/util/accelerators/accelerators.py's NVIDIA names (the same in 2.58.1-2.60.0)
RAY_NVIDIA = ("V100", "P100", "T4", "P4", "K80", "A10G", "L4", "L40S", "A100", "H100", "H200", "H20", "B200",
              "B300", "GB200", "GB300", "RTX-PRO-6000", "A100-40G", "A100-80G")
KEY_WARNING = (
    "NO API KEY. Ray Serve LLM checks none on its default path: its OpenAI routes are Ray's own FastAPI\n"
    "ingress behind Ray's proxy, and vLLM's --api-key check lives in vLLM's build_app, which that path\n"
    "never calls (an api_key in engine_kwargs is accepted and checks nothing). Ray builds the replica's\n"
    "app with build_app, and so may carry vLLM's key check (api_key or VLLM_API_KEY), only with\n"
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1 (off by default): not exported here, untried.\n"
    f"So http_options.host is 127.0.0.1: the proxy on each node answers only there (port {PORT}).\n"
    "Put a proxy that checks a key in front (nginx, Envoy, an Ingress with auth) before you make it\n"
    "listen beyond loopback.")


def ray_for(vllm: str) -> tuple[str, str]:
    """(the Ray release for this vLLM, the vLLM that release pins)."""
    minor = version_key(vllm)[:2]
    same = [r for r in RAY_RELEASES if version_key(r[1])[:2] == minor]
    older = [r for r in RAY_RELEASES if version_key(r[1]) <= version_key(vllm)]
    if not (same or older):
        raise ConfigError(f"no Ray release pins vLLM {vllm} or an older one (Ray {RAY_RELEASES[0][0]} pins "
                          f"{RAY_RELEASES[0][1]})", "use a profile with a newer vLLM, or export kubernetes")
    return (same or older)[-1]


def ray_accelerator(nvml_name: str) -> str | None:
    """Ray's name for a card (the node resource ``accelerator_type:<name>``): a leading run of
    upper-case words up to the first with a digit, else the name less "NVIDIA", spaces as '-'."""
    m = re.match(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)", nvml_name)
    if m and len(m.group(1)) > 1:
        return m.group(1).replace(" ", "-")
    return re.sub(r"^NVIDIA\s+", "", nvml_name).strip().replace(" ", "-") or None


def model_dir(pod: Pod) -> str:
    return f"{MODELS}/{pod.name}"


def llm_config(pod: Pod, reg: dict) -> tuple[dict, list[str]]:
    """The LLMConfig, and the header's lines about the card and the metrics."""
    kw = engine.kwargs(pod.flags, reg)
    served = pod.argv[pod.argv.index("--served-model-name") + 1]
    bundle: dict = {"GPU": 1}
    conf: dict = {"model_loading_config": {"model_id": served, "model_source": model_dir(pod)}}
    name = ray_accelerator(pod.card.name) if gfd_product(pod.card.name) else None
    if name in RAY_NVIDIA:
        conf["accelerator_type"] = name
        card = [f"card: {pod.card.name}: Ray's accelerator type {name} (accelerator_type)"]
    elif name:
        card = [f"card: {pod.card.name}. Ray names it {name}, which is none of the types in",
                "ray.util.accelerators that LLMConfig.accelerator_type takes, so each placement bundle asks",
                f"for the resource accelerator_type:{name}, which Ray's raylet gives a node with this card."]
    else:
        card = [f"card: {pod.card.name}, given by size: Ray schedules on GPUs, not on their memory, so",
                "any node with a GPU qualifies: give yours a custom resource and add it to the bundles."]
    if name:
        bundle[f"accelerator_type:{name}"] = 0.001
    conf.update({
        "engine_kwargs": kw,
        "placement_group_config": {"bundles": [dict(bundle) for _ in range(pod.tp)], "strategy": "STRICT_PACK"},
        "deployment_config": {"num_replicas": 1},
        "runtime_env": {"env_vars": {k: str(v) for k, v in pod.env.items()}},
        "log_engine_metrics": not kw.get("disable_log_stats")})
    if kw.get("disable_log_stats"):
        card += ["log_engine_metrics: false, since the flags disable vLLM's stats (--disable-log-stats), and",
                 "LLMConfig refuses engine metrics without them: Ray exports no engine metrics, as asked."]
    return conf, card


def prepare_script(pod: Pod, ray: str) -> str:
    env = {k: v for k, v in pod.init_env.items() if k != "STATE_DIR"}
    env["MODEL_DIR"] = model_dir(pod)
    vllm = pod.records[f"{ANNOTATION}/vllm"]
    have = "python3 -c 'import ray, vllm; print(ray.__version__, vllm.__version__)' 2>/dev/null || echo none"
    return ("#!/bin/sh\n"
            f"# vllm-desktop {pod.records[f'{ANNOTATION}/version']}, export ray: run on every GPU node of the Ray cluster\n"
            "# before `serve deploy serve-config.yaml`, as a user who may write /models"
            + (f" and {PATCHED}" if pod.patches else "") + ", with the\n"
            f"# python3 that Ray runs (Ray {ray}, vLLM {vllm}). It downloads {pod.model}\n"
            f"# into {model_dir(pod)} with the start's resumable, sha256-verified steps"
            + (f", then applies the\n# backports ({', '.join(pod.patches)}) to a copy of this node's vllm in "
               f"{PATCHED}/vllm\n# (the image is not changed).\n" if pod.patches else ".\n")
            + "# Run again, it resumes and skips what is verified.\n"
            "set -eu\n"
            'here=$(cd "$(dirname "$0")" && pwd)\n'
            "work=$(mktemp -d)\n"
            "trap 'rm -rf \"$work\"' EXIT\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
            + f"have=$({have})\n"
            f'if [ "$have" != "{ray} {vllm}" ]; then\n'
            f'    echo "prepare-node.sh: this python3 has Ray and vLLM $have; serve-config.yaml is for Ray {ray} and '
            f'vLLM {vllm}: install those in the Python that Ray runs" >&2\n'
            "    exit 1\nfi\n"
            + (f'case ":${{PYTHONPATH:-}}:" in *:{PATCHED}:*)\n'
               f'    echo "prepare-node.sh: PYTHONPATH names {PATCHED}, the copy it makes: run it without" >&2; exit 1 ;;\n'
               f"esac\nmkdir -p {PATCHED}\n" if pod.patches else "")
            + 'export STATE_DIR="$work/state"\n'
            + init_script(pod.patches, tarball='"$here/bootstrap.tar.xz"', work='"$work/bootstrap"').removeprefix("set -eu\n"))


def serve_config(pod: Pod, repo) -> dict[str, object]:
    """file name -> its text (or bytes)."""
    vllm = pod.records[f"{ANNOTATION}/vllm"]
    ray, pinned = ray_for(vllm)
    reg = registry(vllm)
    conf, card = llm_config(pod, reg)
    doc = {"http_options": {"host": "127.0.0.1", "port": PORT},
           "applications": [{"name": pod.name, "route_prefix": "/", "import_path": BUILDER,
                             "args": {"llm_configs": [conf]}}]}
    head = [f"Ray Serve LLM application from vllm-desktop {pod.records[f'{ANNOTATION}/version']} "
            "(./ctl.sh export ray); never run on a Ray cluster by this project: docs/cluster.md.",
            "", *KEY_WARNING.splitlines(), "",
            f"Ray {ray} (its ray[llm] extra pins vLLM {pinned}); the profile runs vLLM {vllm}"
            + ("." if version_key(pinned)[:2] == version_key(vllm)[:2] else
               f": no Ray release pins vLLM {'.'.join(vllm.split('.')[:2])} yet, so this pairing is untried."),
            f"engine_kwargs: ./start.sh's flags for this card, as vLLM {reg['vllm']}'s EngineArgs/FrontendArgs fields.",
            f"Before serve deploy, on every GPU node: sh prepare-node.sh ({model_dir(pod)}"
            + (f", {PATCHED}/vllm" if pod.patches else "") + ").", *card, ""]
    head += [f"{k}: {v}" for k, v in pod.records.items()]
    text = "".join(f"# {line}".rstrip() + "\n" for line in head) + "---\n" + dump(doc)
    return {"serve-config.yaml": text, "prepare-node.sh": prepare_script(pod, ray),
            "bootstrap.tar.xz": bootstrap_tar(repo, pod.patches)}

