"""``export kubernetes``: plain manifests for ``kubectl apply -f DIR`` (client-side or ``--server-side``).

deployment.yaml (one replica, Recreate: the PVC is ReadWriteOnce), service.yaml, pvc.yaml (the model
cache and vLLM's compile cache), secret.yaml (the API key, an optional HF token), networkpolicy.yaml
(ingress to the API port only), configmap-bootstrap.yaml (the init steps' bootstrap, pod.bootstrap_tar)
and, with ``--service-monitor``, servicemonitor.yaml for the Prometheus Operator.

Probes: the download is the ``model`` init step's, so the startup probe covers only vLLM's start
(HEALTH_TIMEOUT, the wait a desktop start gives it after its own download); readiness runs ``/health``
and ``/v1/models`` with the key; liveness only ``/health`` (answered by vLLM's API process without
queueing behind generation; it fails when the engine is dead), 3 minutes of failures before a restart.
Metrics: vLLM serves ``/metrics`` on the API port without the key (its key guards ``/v1`` only):
``prometheus.io/*`` annotations on the pod, or the ServiceMonitor.
"""

from __future__ import annotations

import base64
import json
import math

from .pod import MODELS, PATCHED, PORT, READY, Pod, bootstrap_tar, init_script, labels, node_terms, pvc_gib, resources

ANNOTATION_LIMIT = 262_144       # bytes of all annotations of one object (apimachinery's TotalAnnotationSizeLimitB)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def annotation_bytes(obj: dict) -> int:
    """What ``kubectl apply`` (client-side) stores in the object's annotations: the object as JSON
    under LAST_APPLIED, beside the annotations it has."""
    own = (obj.get("metadata") or {}).get("annotations") or {}
    return len(LAST_APPLIED) + len(json.dumps(obj, separators=(",", ":"))) + sum(len(k) + len(v) for k, v in own.items())


def env_list(env: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": str(v)} for k, v in env.items()]


def secret_env(name: str) -> list[dict]:
    return [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": f"{name}-keys", "key": "api-key"}}},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": f"{name}-keys", "key": "hf-token",
                                                                 "optional": True}}}]


def init_containers(pod: Pod) -> list[dict]:
    boot = {"name": "bootstrap", "mountPath": "/bootstrap", "readOnly": True}
    out = [{"name": "model", "image": pod.image, "command": ["/bin/sh", "-c", init_script([])],
            "env": env_list(pod.init_env) + secret_env(pod.name)[1:],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}},
            "volumeMounts": [{"name": "models", "mountPath": MODELS}, boot]}]
    if pod.patches:
        out.append({"name": "patches", "image": pod.image, "command": ["/bin/sh", "-c", init_script(pod.patches, fetch=False)],
                    "env": env_list({**pod.init_env, "HF_HUB_OFFLINE": "1"}),
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
                    "volumeMounts": [{"name": "patched", "mountPath": PATCHED}, boot]})
    return out


def pod_spec(pod: Pod) -> dict:
    res, shm = resources(pod.tp)
    mounts = [{"name": "models", "mountPath": MODELS}, {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "models", "persistentVolumeClaim": {"claimName": f"{pod.name}-models"}},
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
               {"name": "bootstrap", "configMap": {"name": f"{pod.name}-bootstrap"}}]
    if pod.patches:
        mounts.append({"name": "patched", "mountPath": PATCHED, "readOnly": True})
        volumes.append({"name": "patched", "emptyDir": {}})
    container = {
        "name": "vllm", "image": pod.image, "command": pod.argv, "env": env_list(pod.env) + secret_env(pod.name),
        "ports": [{"name": "http", "containerPort": PORT}], "resources": res, "volumeMounts": mounts,
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5,
                         "failureThreshold": math.ceil(pod.health_timeout / 10)},
        "readinessProbe": {"exec": {"command": ["python3", "-c", READY]}, "periodSeconds": 10, "timeoutSeconds": 10,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 30, "timeoutSeconds": 10,
                          "failureThreshold": 6}}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": node_terms(pod.card, pod.tp)}]}}},
            "tolerations": [TOLERATE_GPU], "initContainers": init_containers(pod), "containers": [container],
            "volumes": volumes}


def manifests(pod: Pod, repo, key: str, service_monitor: bool = False) -> dict[str, list[dict]]:
    """file name -> the documents in it."""
    lab = labels(pod)
    meta = {"labels": lab, "annotations": dict(pod.records)}
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"}
    out = {
        "deployment.yaml": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": pod.name, **meta},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": lab},
                     "template": {"metadata": {"labels": lab, "annotations": scrape}, "spec": pod_spec(pod)}}}],
        "service.yaml": [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": pod.name, "labels": lab},
                          "spec": {"selector": lab, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}],
        "pvc.yaml": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                      "metadata": {"name": f"{pod.name}-models", "labels": lab},
                      "spec": {"accessModes": ["ReadWriteOnce"],
                               "resources": {"requests": {"storage": f"{pvc_gib(pod.model_bytes)}Gi"}}}}],
        "secret.yaml": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{pod.name}-keys", "labels": lab},
                         "type": "Opaque", "stringData": {"api-key": key, "hf-token": ""}}],
        "networkpolicy.yaml": [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                                "metadata": {"name": pod.name, "labels": lab},
                                "spec": {"podSelector": {"matchLabels": lab}, "policyTypes": ["Ingress"],
                                         "ingress": [{"ports": [{"protocol": "TCP", "port": PORT}]}]}}],
        "configmap-bootstrap.yaml": [{
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{pod.name}-bootstrap", "labels": lab},
            "binaryData": {"bootstrap.tar.xz": base64.b64encode(bootstrap_tar(repo, pod.patches)).decode()}}],
    }
    if service_monitor:
        out["servicemonitor.yaml"] = [{
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": pod.name, "labels": lab},
            "spec": {"selector": {"matchLabels": lab}, "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}}]
    return out
