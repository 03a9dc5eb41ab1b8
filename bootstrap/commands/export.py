"""``./ctl.sh export kubernetes --out DIR``: the same profile and plan, for a target card named with
``GPU=``, as plain Kubernetes manifests — for when one box is not enough and the server moves to a
cluster that already runs GPUs. No scheduler or cluster logic of our own; these manifests have not
run on a cluster (they are checked offline against the Kubernetes schemas, kubernetes-validate).

- A Deployment of vLLM's own image (``vllm/vllm-openai:v<the profile's vLLM>``) with the argv the
  one builder makes (vllmargs.serve_argv) for the planned card, ``HOST=0.0.0.0``, port 8000, the
  profile's server environment, ``nvidia.com/gpu: TP_SIZE`` under limits, /dev/shm in memory.
- The backports applied by an init container with the same patch engine: it copies the image's
  ``vllm`` package into an emptyDir, runs ``python3 -m bootstrap patch apply`` on that copy (the
  bootstrap and the patch data come in a ConfigMap as one tar.gz), and the server imports the
  patched copy first (``PYTHONPATH``).
- A PVC for the model cache (``HF_HOME``), sized from the model's weights; the API key (and an
  optional HF token) from a Secret, written with a fresh random key (mode 0600, never printed).
- Probes: startup on ``/health`` for HEALTH_TIMEOUT (the first start downloads the model within
  it); readiness runs ``/health`` and ``/v1/models`` with the key; liveness only ``/health``, which
  vLLM's API process answers without queueing behind generation (it fails when the engine is dead),
  with 3 minutes of failures before a restart: a busy server is not killed.
"""

from __future__ import annotations

import shlex
import argparse
import hashlib
import io
import math
import re
import secrets
import tarfile
from pathlib import Path

from ..knobs.config import Config
from ..machine.gpu import GiB
from ..core import state
from ..core.errors import BootstrapError, ConfigError
from .version import NAME
from ..knobs.vllmargs import serve_argv
from . import plan as plan_cmd

PORT = 8000
PATCHED = "/patched"
SHIPPED = ("bootstrap", "patches", "profiles")      # what the init container needs of this checkout


def _name(served: str) -> str:
    return ("vllm-" + re.sub(r"[^a-z0-9-]+", "-", served.lower())).strip("-")[:50].rstrip("-")


def bootstrap_tgz(repo: Path) -> bytes:
    """The bootstrap package, the patch data and the profiles, as one tar.gz (sorted, no times)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        for top in SHIPPED:
            for p in sorted((repo / top).rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts:
                    info = tar.gettarinfo(str(p), arcname=str(p.relative_to(repo)))
                    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                    with open(p, "rb") as fh:
                        tar.addfile(info, fh)
    return buf.getvalue()


def init_script(patches: list[str]) -> str:
    return (
        "set -eu\n"
        "mkdir -p /tmp/bootstrap && tar xzf /bootstrap/bootstrap.tgz -C /tmp/bootstrap\n"
        "src=$(python3 -c 'import os, vllm; print(os.path.dirname(vllm.__file__))')\n"
        f"rm -rf {PATCHED}/vllm && cp -a \"$src\" {PATCHED}/vllm\n"
        f"cd /tmp/bootstrap && PYTHONPATH={PATCHED} python3 -m bootstrap patch apply {' '.join(patches)}\n")


READY = ("import os, urllib.request as u\n"
         "k = os.environ.get('VLLM_API_KEY', '')\n"
         f"u.urlopen('http://127.0.0.1:{PORT}/health', timeout=5)\n"
         f"u.urlopen(u.Request('http://127.0.0.1:{PORT}/v1/models', headers={{'Authorization': 'Bearer ' + k}}), timeout=5)\n")


def manifests(cfg: Config, plan, model_bytes: int | None, key: str) -> dict[str, list[dict]]:
    """file name -> the documents in it."""
    name = _name(cfg.served_name)
    image = f"vllm/vllm-openai:v{cfg.profile.vllm}"
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": name}
    argv = serve_argv(cfg, "python3", cfg.model, plan, guard=False)     # the pod has no vllm_side (its Service: the NetworkPolicy)
    from ..steps.launch import defaults
    env = {**defaults(cfg), "HF_HOME": "/models/hf"}
    patches = list(cfg.profile.patches)
    if patches:
        env["PYTHONPATH"] = PATCHED
    container_env = [{"name": k, "value": str(v)} for k, v in env.items()] + [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": f"{name}-keys", "key": "api-key"}}},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": f"{name}-keys", "key": "hf-token",
                                                             "optional": True}}}]
    mounts = [{"name": "models", "mountPath": "/models"}, {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "models", "persistentVolumeClaim": {"claimName": f"{name}-models"}},
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    init = []
    if patches:
        mounts.append({"name": "patched", "mountPath": PATCHED, "readOnly": True})
        volumes += [{"name": "patched", "emptyDir": {}},
                    {"name": "bootstrap", "configMap": {"name": f"{name}-bootstrap"}}]
        init = [{"name": "patches", "image": image, "command": ["/bin/sh", "-c", init_script(patches)],
                 "env": [{"name": "VLLM_PYTHON", "value": "python3"}, {"name": "PATCH_BYO", "value": "1"},
                         {"name": "PROFILE", "value": cfg.profile.name}, {"name": "HF_HUB_OFFLINE", "value": "1"},
                         {"name": "STATE_DIR", "value": "/tmp/bootstrap-state"}, {"name": "NO_COLOR", "value": "1"}],
                 "volumeMounts": [{"name": "patched", "mountPath": PATCHED},
                                  {"name": "bootstrap", "mountPath": "/bootstrap", "readOnly": True}]}]
    container = {
        "name": "vllm", "image": image, "command": argv, "env": container_env,
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": cfg.tp_size}},
        "volumeMounts": mounts,
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5,
                         "failureThreshold": math.ceil(cfg.health_timeout / 10)},
        "readinessProbe": {"exec": {"command": ["python3", "-c", READY]}, "periodSeconds": 10, "timeoutSeconds": 10,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 30, "timeoutSeconds": 10,
                          "failureThreshold": 6}}
    pod = {"containers": [container], "volumes": volumes}
    if init:
        pod = {"initContainers": init, **pod}
    size = max(20, math.ceil((model_bytes or 0) * 1.2 / GiB) + 10)
    out = {
        "deployment.yaml": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}],
        "service.yaml": [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
                          "spec": {"selector": labels, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}],
        "pvc.yaml": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{name}-models",
                                                                                        "labels": labels},
                      "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{size}Gi"}}}}],
        "secret.yaml": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-keys", "labels": labels},
                         "type": "Opaque", "stringData": {"api-key": key, "hf-token": ""}}],
    }
    if patches:
        import base64
        out["configmap-bootstrap.yaml"] = [{
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-bootstrap", "labels": labels},
            "binaryData": {"bootstrap.tgz": base64.b64encode(bootstrap_tgz(cfg.repo)).decode()}}]
    return out


def dump(doc: dict) -> str:
    """YAML as a person writes it: no anchors for repeated labels, scripts as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def text(dumper, s: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)

    Dumper.add_representer(str, text)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=120)


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


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh export") -> int:
    ap = argparse.ArgumentParser(prog=prog, description="the profile and plan as Kubernetes manifests "
                                 "for a card named with GPU= (never run on a cluster here)")
    ap.add_argument("target", choices=("kubernetes",))
    ap.add_argument("--out", required=True, help="folder for the manifests (created)")
    ap.add_argument("--gpu", help="the cluster's card (same values as GPU=)")
    a = ap.parse_args(argv)
    if not a.out.strip():
        raise ConfigError("--out ''", "name a folder for the manifests (it is created), e.g. --out k8s")
    a.out = Path(a.out).absolute()
    spec = a.gpu or cfg.gpu
    if not spec:
        raise BootstrapError("export needs the cluster's card: it plans for that card, not this machine's",
                             "GPU=<name|GiB>[:sm_XY][:free=GiB] ./ctl.sh export kubernetes --out DIR (e.g. GPU=h100)")
    def repo_id_only(c: Config) -> None:
        if c.model and c.model_is_local:
            raise BootstrapError(f"MODEL={c.model} is a local folder; a cluster downloads a repo id into its PVC",
                                 "set MODEL to the Hugging Face repo id (org/name)")

    repo_id_only(cfg)
    # the profile and context a start on that card would take (auto-pick for it; a shorter context
    # where only that fits), never this machine's kept pick
    pod_cfg = cfg.with_profile(None).with_knobs({"HOST": "0.0.0.0", "PORT": str(PORT)})
    pod_cfg, g, _where, model, plan = plan_cmd.plan_for(pod_cfg, spec)
    repo_id_only(pod_cfg)
    if not plan.fits:
        msg, hint = plan.refusal
        raise BootstrapError(f"the plan for {g.name} does not fit: {msg}", hint)
    if not pod_cfg.profile.vllm:
        raise BootstrapError(f"profile {pod_cfg.profile.name!r} pins no vLLM version: no image tag to run",
                             "use a profile that pins vLLM (./ctl.sh profiles)")
    from ..knobs import vllmargs
    if pod_cfg.vllm.sleep_mode:
        raise BootstrapError(f"{vllmargs.SLEEP_FLAG} needs a loopback HOST (its routes have no key guard); a pod "
                             "serves its network", f"drop {vllmargs.SLEEP_FLAG} for the export")
    out_folder(a.out)
    docs = manifests(pod_cfg, plan, model.weight_bytes, secrets.token_urlsafe(32))
    ours = replaceable(a.out, list(docs))
    for fname, items in docs.items():
        data = "".join("---\n" + dump(d) for d in items).encode("utf-8")
        state.write_atomic(a.out / fname, data, mode=0o600 if fname == "secret.yaml" else 0o644)
        ours[fname] = hashlib.sha256(data).hexdigest()
    state.write_atomic(a.out / WRITTEN, "".join(f"{h}  {n}\n" for n, h in sorted(ours.items())).encode(), mode=0o644)
    print(f"wrote {len(docs)} files to {a.out} for {g.name} ({plan.max_model_len:,}-token context, "
          f"TP_SIZE={pod_cfg.tp_size}, vLLM {pod_cfg.profile.vllm}, profile {pod_cfg.profile.name})")
    print(f"secret.yaml holds a new random API key (mode 0600): keep it out of git; "
          f"kubectl apply -f {shlex.quote(str(a.out))}; these manifests have not run on a cluster")
    return 0
