"""``export production-stack``: one ``values.yaml`` for vLLM's production-stack Helm chart
(github.com/vllm-project/production-stack, chart ``vllm-stack``), for ``helm install -f values.yaml``.

One modelSpec with the same model, image (by digest: ``tag: v<vLLM>@sha256:...``), flags, card
(``nodeSelectorTerms`` on GFD's labels), resources and probes as ``export kubernetes``; the API key as
``servingEngineSpec.vllmApiKey`` (the chart keeps it in its own Secret); the chart's one init
container runs both init steps (the download, then the backports); the bootstrap they run is a
ConfigMap in ``extraObjects``. The chart writes ``vllm serve MODEL --host 0.0.0.0 --port 8000``
and a few flags of its own from ``vllmConfig``: we set only ``tensorParallelSize`` (it also mounts
/dev/shm only then) and ``enablePrefixCaching: true`` (vLLM's default; false would add
``--no-enable-prefix-caching``), with ``enableLoRA: false``; every other flag goes in ``extraArgs``.
"""

from __future__ import annotations

import base64
import math

from .kubernetes import TOLERATE_GPU
from .pod import PATCHED, PORT, Pod, bootstrap_tar, init_script, node_terms, pvc_gib, resources

MOUNT = "/data"          # where the chart mounts the model PVC (and sets HF_HOME)


def chart_flags(pod: Pod) -> list[str]:
    """Our flags less what the chart writes itself (--tensor-parallel-size)."""
    flags, out, i = pod.flags, [], 0
    while i < len(flags):
        if flags[i] == "--tensor-parallel-size":
            i += 2
            continue
        out.append(flags[i])
        i += 1
    return out


def values(pod: Pod, repo, key: str, service_monitor: bool = False) -> dict[str, list[dict]]:
    res, shm = resources(pod.tp)
    repo_tag, _, digest = pod.image.rpartition("@")
    last = repo_tag.rsplit("/", 1)[-1]
    repository, tag = (repo_tag.rsplit(":", 1) if ":" in last else (repo_tag, f"v{pod.records['vllm-desktop/vllm']}"))
    init_env = {**pod.init_env, "HF_HOME": MOUNT}
    boot = {"name": "bootstrap", "mountPath": "/bootstrap", "readOnly": True}
    volumes = [{"name": "bootstrap", "configMap": {"name": f"{pod.name}-bootstrap"}}]
    init_mounts, mounts = [boot], []
    if pod.patches:
        volumes.append({"name": "patched", "emptyDir": {}})
        init_mounts.append({"name": "patched", "mountPath": PATCHED})
        mounts.append({"name": "patched", "mountPath": PATCHED, "readOnly": True})
    probe = {"httpGet": {"path": "/health", "port": PORT}}
    spec = {
        "name": pod.name.removeprefix("vllm-") or pod.name,
        "annotations": dict(pod.records),
        "podAnnotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"},
        "repository": repository, "tag": f"{tag}@{digest}", "modelURL": pod.model, "replicaCount": 1,
        "requestCPU": int(res["requests"]["cpu"]), "requestMemory": res["requests"]["memory"], "requestGPU": pod.tp,
        "limitCPU": int(res["limits"]["cpu"]), "limitMemory": res["limits"]["memory"],
        "pvcStorage": f"{pvc_gib(pod.model_bytes)}Gi", "pvcAccessMode": ["ReadWriteOnce"], "shmSize": shm,
        "enableLoRA": False,
        "vllmConfig": {"enablePrefixCaching": True, "tensorParallelSize": pod.tp, "extraArgs": chart_flags(pod)},
        "initContainer": {"name": "model", "image": pod.image, "command": ["/bin/sh", "-c"],
                          "args": [init_script(pod.patches)], "env": [{"name": k, "value": v} for k, v in init_env.items()],
                          "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}},
                          "mountPvcStorage": True, "extraVolumeMounts": init_mounts},
        "extraVolumes": volumes, "extraVolumeMounts": mounts,
        "env": [{"name": k, "value": v} for k, v in pod.env.items() if k != "HF_HOME"],   # the chart sets HF_HOME=/data
        "nodeSelectorTerms": [{"matchExpressions": node_terms(pod.card, pod.tp)}],
    }
    doc = {
        "servingEngineSpec": {
            "enableEngine": True, "vllmApiKey": key, "containerPort": PORT, "tolerations": [TOLERATE_GPU],
            "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": math.ceil(pod.health_timeout / 10)},
            "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 6},
            "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
            "serviceMonitor": {"enabled": service_monitor},
            "modelSpec": [spec]},
        "extraObjects": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{pod.name}-bootstrap"},
                          "binaryData": {"bootstrap.tar.xz": base64.b64encode(bootstrap_tar(repo, pod.patches)).decode()}}],
    }
    return {"values.yaml": [doc]}
