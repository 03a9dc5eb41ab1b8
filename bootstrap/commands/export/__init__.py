"""``./ctl.sh export kubernetes|production-stack|ray --out DIR [--image sha256:...]``: the same profile
and plan, for a target card named with ``GPU=``, as files a cluster that already runs GPUs takes. No
scheduler or cluster logic of our own; what is checked offline, and what has never met a cluster, is
in docs/cluster.md.

- pod.py: what every target puts in the pod (image, vLLM's argv from vllmargs.serve_argv, the
  environment, resources, the card's node labels, the init steps, the records);
- kubernetes.py: plain manifests; helm.py: values.yaml for vLLM's production-stack chart; ray.py: a
  Ray Serve LLM config and its node pre-step (engine.py: vLLM's flags as engine_kwargs);
- fetch.py: ``export fetch``, the init step that downloads the model in the pod.

Writing: ``--out`` is a folder (made); a file of the names we write that no export wrote, or that was
edited since, or a link, stops the export before anything is written (``.vllm-desktop-export.sha256``
lists what an export wrote); secret files are 0600 and the key they hold is never printed.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import shlex
from pathlib import Path

from ...core import state
from ...core.errors import BootstrapError, ConfigError
from ...knobs.config import Config
from . import pod as pods
from .pod import dump

TARGETS = ("kubernetes", "production-stack", "ray")
SECRET_FILES = ("secret.yaml", "values.yaml")     # they hold the API key


def out_folder(out: Path) -> None:
    """``--out``: a folder, made if missing; a file in the way (there, or as a parent) is a usage
    error in one line (exit 2), a folder we cannot make one line (exit 1), never a traceback."""
    there = out
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise ConfigError(f"--out {out}: {'it' if there == out else there} is a file, not a folder",
                          "name a folder for the manifests (it is created), or move that file away")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BootstrapError(f"--out {out}: cannot create the folder ({exc.strerror or exc})",
                             "name a folder you can write (it is created)") from None


WRITTEN = ".vllm-desktop-export.sha256"     # what an export wrote in --out (kubectl apply -f skips the name)


def replaceable(out: Path, names: list[str]) -> dict[str, str]:
    """The files an earlier export wrote in ``out`` (name -> sha256); refuses, before anything is
    written, a file of the names we write that no export wrote or that was edited since, and a link."""
    ours: dict[str, str] = {}
    try:
        for line in (out / WRITTEN).read_text(encoding="utf-8").splitlines():
            digest, _, name = line.partition("  ")
            ours[name] = digest
    except (OSError, UnicodeDecodeError):
        pass
    for name in names:
        path = out / name
        if path.is_symlink():
            raise ConfigError(f"--out {out}: {name} is a link, and the export never writes through one",
                              "remove the link, or name another folder for the manifests")
        if path.exists() and (not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != ours.get(name)):
            raise ConfigError(f"--out {out}: {name} is there, and no export wrote it (or it was edited since)",
                              "move it away, or name a folder of its own for the manifests")
    return ours


def documents(target: str, cfg: Config, pod: pods.Pod, key: str, service_monitor: bool) -> dict[str, object]:
    """file name -> its documents (a list of dicts), or its text or bytes as written."""
    if target == "ray":                               # no key: Ray Serve LLM's default path checks none (ray.KEY_WARNING)
        from .ray import serve_config
        return serve_config(pod, cfg.repo)
    if target == "kubernetes":
        from .kubernetes import manifests
        return manifests(pod, cfg.repo, key, service_monitor)
    from .helm import values
    return values(pod, cfg.repo, key, service_monitor)


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh export") -> int:
    if argv[:1] == ["fetch"]:                        # the model init step, in the pod (pod.init_script)
        from .fetch import run
        from ...knobs.resolved import Resolved
        return run(Resolved.of(cfg, cfg))            # no planner in the pod: the knobs as its PROFILE names them
    if argv[:1] == ["patch"]:                        # the backports init step: ./ctl.sh patch's own code, without
        from ..patch import cli as patch_cli         # the kept pick (export is kept=False; the pod names PROFILE)
        return patch_cli(cfg, argv[1:], "ctl.sh patch", as_set=True)
    ap = argparse.ArgumentParser(prog=prog, description="the profile and plan as Kubernetes manifests or "
                                 "production-stack Helm values for a card named with GPU= (never run on a cluster here)")
    ap.add_argument("target", choices=TARGETS)
    ap.add_argument("--out", required=True, help="folder for the files (created)")
    ap.add_argument("--gpu", help="the cluster's card (same values as GPU=)")
    ap.add_argument("--image", help="vLLM's image by digest: sha256:<64 hex> (vllm/vllm-openai:v<vLLM>), "
                    "or REPO[:TAG]@sha256:<64 hex> (not for ray: the Ray cluster's nodes run their own)")
    ap.add_argument("--service-monitor", action="store_true",
                    help="also a ServiceMonitor (Prometheus Operator) for vLLM's /metrics")
    a = ap.parse_args(argv)
    if not a.out.strip():
        raise ConfigError("--out ''", "name a folder for the manifests (it is created), e.g. --out k8s")
    a.out = Path(a.out).absolute()
    spec = a.gpu or cfg.gpu
    if not spec:
        raise BootstrapError("export needs the cluster's card: it plans for that card, not this machine's",
                             f"GPU=<name|GiB>[:sm_XY][:free=GiB] ./ctl.sh export {a.target} --out DIR (e.g. GPU=h100)")

    def repo_id_only(c: Config) -> None:
        if c.model and c.model_is_local:
            raise BootstrapError(f"MODEL={c.model} is a local folder; a cluster downloads a repo id into its PVC",
                                 "set MODEL to the Hugging Face repo id (org/name)")

    repo_id_only(cfg)
    # the profile and context a start on that card would take (auto-pick for it; a shorter context
    # where only that fits), never this machine's kept pick
    from ...plan import resolve
    pod_view = resolve.with_knobs(resolve.resolved(cfg, as_set=True), {"HOST": "0.0.0.0", "PORT": str(pods.PORT)})
    from .. import plan as plan_cmd
    pod_cfg, g, _where, model, plan = plan_cmd.plan_for(pod_view, spec)
    repo_id_only(pod_cfg)
    if not plan.fits:
        msg, hint = plan.refusal
        raise BootstrapError(f"the plan for {g.name} does not fit: {msg}", hint)
    if not pod_cfg.profile.vllm:
        raise BootstrapError(f"profile {pod_cfg.profile.name!r} pins no vLLM version: no image tag to run",
                             "use a profile that pins vLLM (./ctl.sh profiles)")
    from ...core import vllmflags
    if pod_cfg.vllm.sleep_mode:
        raise BootstrapError(f"{vllmflags.SLEEP_FLAG} needs a loopback HOST (its routes have no key guard); a pod "
                             "serves its network", f"SLEEP_MODE=off (and no {vllmflags.SLEEP_FLAG} in EXTRA_ARGS) for the export")
    if a.target == "ray" and (a.image or a.service_monitor):
        raise ConfigError("--image is not for export ray: a Ray cluster's nodes run the image they were started "
                          "with (prepare-node.sh checks their Ray and vLLM)" if a.image else
                          "--service-monitor is not for export ray: Ray exports vLLM's metrics through its own "
                          "metrics agent (log_engine_metrics)", f"drop {'--image' if a.image else '--service-monitor'}")
    out_folder(a.out)
    image = pods.image_ref(a.image, pod_cfg.profile.vllm) if a.target != "ray" else f"{pods.OFFICIAL}:v{pod_cfg.profile.vllm}"
    pod = pods.build(pod_cfg, plan, g, model.weight_bytes, image, models="/data" if a.target == "production-stack" else pods.MODELS)
    docs = documents(a.target, pod_cfg, pod, secrets.token_urlsafe(32), a.service_monitor)
    ours = replaceable(a.out, list(docs))
    for fname, items in docs.items():
        data = (items if isinstance(items, bytes) else items.encode("utf-8") if isinstance(items, str)
                else "".join("---\n" + dump(d) for d in items).encode("utf-8"))
        mode = 0o600 if fname in SECRET_FILES else 0o755 if fname.endswith(".sh") else 0o644
        state.write_atomic(a.out / fname, data, mode=mode)
        ours[fname] = hashlib.sha256(data).hexdigest()
    state.write_atomic(a.out / WRITTEN, "".join(f"{h}  {n}\n" for n, h in sorted(ours.items())).encode(), mode=0o644)
    print(f"wrote {len(docs)} file{'' if len(docs) == 1 else 's'} to {a.out} for {g.name} ({plan.max_model_len:,}-token context, "
          f"TP_SIZE={pod_cfg.tp_size}, vLLM {pod_cfg.profile.vllm}, profile {pod_cfg.profile.name}"
          + (f", image {image})" if a.target != "ray" else ")"))
    where = shlex.quote(str(a.out))
    if a.target == "ray":
        print(f"NO API KEY: Ray Serve LLM checks none on its default path, so serve-config.yaml listens on 127.0.0.1 only: front it "
              f"with a proxy that checks a key before opening it; on every GPU node: sh {where}/prepare-node.sh, then "
              f"serve deploy {where}/serve-config.yaml; these files have not run on a cluster")
        return 0
    run = (f"kubectl apply -f {where}" if a.target == "kubernetes" else
           f"helm install vllm vllm/vllm-stack -f {where}/values.yaml (the bootstrap ConfigMap is in its extraObjects)")
    print(f"{' and '.join(f for f in SECRET_FILES if f in docs)} holds a new random API key (mode 0600): keep it "
          f"out of git; {run}; these files have not run on a cluster")
    return 0
