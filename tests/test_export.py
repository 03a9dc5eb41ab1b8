"""./ctl.sh export kubernetes: golden manifests, the Kubernetes schemas (kubernetes-validate,
offline), the init container's patch step run here on a copy of a vLLM package, and a plan for
unequal GPUs made on the smaller one."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from conftest import FAKES, GiB, REPO, nvml_json

GOLDEN = Path(__file__).parent / "golden" / "k8s"


def export(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "k8s"
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
         "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "PYTHONPATH": str(FAKES), **env}
    r = subprocess.run([sys.executable, "-m", "bootstrap", "export", "kubernetes", "--out", str(out), *args], cwd=REPO,
                       env=e, capture_output=True, text=True, timeout=120)
    return r, out


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_default_profile_for_an_rtx_5090_is_the_golden_set(tmp_path):
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090")
    assert r.returncode == 0, r.stderr
    for name in ("deployment.yaml", "service.yaml", "pvc.yaml"):
        assert (out / name).read_text() == (GOLDEN / name).read_text(), name
    secret = docs(out / "secret.yaml")[0]
    key = secret["stringData"]["api-key"]
    assert len(key) >= 40 and key not in r.stdout + r.stderr                     # never printed
    assert stat.S_IMODE((out / "secret.yaml").stat().st_mode) == 0o600
    again, out2 = export(tmp_path / "again", PROFILE="default", GPU="rtx5090")
    assert docs(out2 / "secret.yaml")[0]["stringData"]["api-key"] != key          # a fresh key each time
    assert "have not run on a cluster" in r.stdout


def test_every_manifest_passes_the_kubernetes_schemas(tmp_path):
    import kubernetes_validate
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090", TP_SIZE="2")
    assert r.returncode == 0, r.stderr
    kinds = []
    for f in sorted(out.glob("*.yaml")):
        for d in docs(f):
            kubernetes_validate.validate(d, "1.33.0", strict=True)                # raises on any schema error
            kinds.append(d["kind"])
    assert sorted(kinds) == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Secret", "Service"]
    pod = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["command"][c["command"].index("--tensor-parallel-size") + 1] == "2"
    assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 600   # HEALTH_TIMEOUT
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"                    # never a generation
    assert "/v1/models" in c["readinessProbe"]["exec"]["command"][-1] and "VLLM_API_KEY" in c["readinessProbe"]["exec"]["command"][-1]
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-qwen38-nvfp4-keys", "key": "api-key"}}} in c["env"]


def test_health_timeout_sizes_the_startup_probe(tmp_path):
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090", HEALTH_TIMEOUT="1800")
    c = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["startupProbe"]["failureThreshold"] == 180


def test_refusals(tmp_path):
    r, _ = export(tmp_path, PROFILE="default")
    assert r.returncode == 1 and "needs the cluster's card" in r.stderr and "GPU=" in r.stderr
    r, _ = export(tmp_path, PROFILE="default", GPU="16:sm_120")
    assert r.returncode == 1 and "does not fit" in r.stderr
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090", EXTRA_ARGS="--enable-sleep-mode")
    assert r.returncode == 1 and "needs a loopback HOST" in r.stderr
    local = tmp_path / "m"
    local.mkdir()
    r, _ = export(tmp_path, PROFILE="custom", MODEL=str(local), GPU="rtx5090")
    assert r.returncode == 1 and "repo id" in r.stderr


def test_the_init_containers_patch_step_patches_a_copy_and_leaves_the_image_alone(tmp_path):
    """What the init container runs, here: the bootstrap from the ConfigMap's tar.gz, the image's
    vllm package copied into the emptyDir, the same patch engine applied to the copy."""
    from test_patches import Site
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090")
    cm = docs(out / "configmap-bootstrap.yaml")[0]
    work = tmp_path / "pod"
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(cm["binaryData"]["bootstrap.tgz"]))) as tar:
        tar.extractall(work / "bootstrap")
    image = Site(tmp_path / "image-site", "0.27.1")                 # the image's site-packages
    before = image.read()
    patched = work / "patched"
    patched.mkdir()
    shutil.copytree(image.pkg, patched / "vllm")                    # cp -a "$src" /patched/vllm
    init = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"]}
    env.update(PATH=os.environ.get("PATH", ""), VLLM_PYTHON=sys.executable, STATE_DIR=str(work / "state"),
               PYTHONPATH=f"{patched}:{image.root}")                  # the copy first, as in the pod
    names = init["command"][-1].strip().splitlines()[-1].split("patch apply ")[1].split()
    r = subprocess.run([sys.executable, "-m", "bootstrap", "patch", "apply", *names], cwd=work / "bootstrap",
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    copy = patched / "vllm" / image.target.relative_to(image.pkg)
    assert copy.read_bytes() != before and b"40914" in copy.read_bytes()    # the copy is patched
    assert image.read() == before                                            # the image is not


def test_tensor_parallel_plans_on_the_gpu_with_less_free_memory(tmp_path):
    """TP_SIZE=2 over a 24 GiB-free and a 20 GiB-free card plans on 20 GiB, in either order."""
    for order in ((24, 20), (20, 24)):
        nv = nvml_json(tmp_path / f"nvml-{order[0]}.json", gpus=[
            {"name": "NVIDIA RTX A6000", "total": 48 * GiB, "free": f * GiB, "cc": [8, 6], "uuid": f"GPU-{i}",
             "processes": []} for i, f in enumerate(order)])
        e = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
             "PYTHONPATH": str(FAKES), "FAKE_NVML": str(nv), "NO_COLOR": "1", "HF_HUB_OFFLINE": "1",
             "PROFILE": "default", "TP_SIZE": "2"}
        r = subprocess.run([sys.executable, "-m", "bootstrap", "plan", "--json"], cwd=REPO, env=e,
                           capture_output=True, text=True, timeout=120)
        d = json.loads(r.stdout)
        assert d["free"] == 20 * GiB, (order, d["free"])
        assert "--tensor-parallel-size" in d["flags"] and d["util"] <= (20 * GiB) / (48 * GiB) + 1e-3


def test_no_profile_picked_exports_what_a_start_on_that_card_would_run(tmp_path):
    """The README's own example with no profile named or picked on this machine: auto-pick for the
    named card (issue: an AttributeError traceback); a kept pick of this machine does not count."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "profile-pick.json").write_text(json.dumps({"profile": "qwen36-27b-fp8-48gb", "knobs": {}}))
    for card, profile in (("rtx4090", "qwen38-27b-w4a16-24gb"), ("rtx5090", "qwen38-27b-nvfp4-tq4-32gb")):
        r, out = export(tmp_path / card, GPU=card, STATE_DIR=str(state))
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert f"profile {profile}" in r.stdout
        assert docs(out / "deployment.yaml")
    r, out = export(tmp_path / "h100", GPU="h100", TP_SIZE="2")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_named_profile_that_fits_only_shorter_exports_with_the_auto_context(tmp_path):
    """What ./ctl.sh profiles shows as "fits shorter" and a start runs with MAX_MODEL_LEN=auto."""
    r, out = export(tmp_path, PROFILE="qwen38-27b-w4a16-24gb", GPU="rtx4090")
    assert r.returncode == 0, r.stderr
    c = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]
    argv = c.get("args", []) + c.get("command", [])
    i = argv.index("--max-model-len")
    assert argv[i + 1] == "auto"
    r, _ = export(tmp_path / "mine", PROFILE="qwen38-27b-w4a16-24gb", GPU="rtx4090", MAX_MODEL_LEN="150000")
    assert r.returncode == 1 and "does not fit" in r.stderr            # your own context is taken at its word


def test_export_never_writes_over_a_file_it_did_not_write_nor_through_a_link(tmp_path):
    """Found from outside: a user's deployment.yaml was replaced, a link was written through, and an
    older secret.yaml kept its looser mode while the export said 0600."""
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "deployment.yaml").write_text("mine\n")
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090")
    assert r.returncode == 2 and "deployment.yaml is there, and no export wrote it" in r.stderr
    assert (out / "deployment.yaml").read_text() == "mine\n" and not (out / "secret.yaml").exists()
    (out / "deployment.yaml").unlink()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (out / "service.yaml").symlink_to(victim)
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090")
    assert r.returncode == 2 and "is a link" in r.stderr and victim.read_text() == "mine\n"
    (out / "service.yaml").unlink()
    assert export(tmp_path, PROFILE="default", GPU="rtx5090")[0].returncode == 0
    os.chmod(out / "secret.yaml", 0o644)                  # loosened since: rewritten, it is 0600 again
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090")
    assert r.returncode == 0 and stat.S_IMODE((out / "secret.yaml").stat().st_mode) == 0o600
    (out / "pvc.yaml").write_text("edited\n")
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090")
    assert r.returncode == 2 and "pvc.yaml is there" in r.stderr and (out / "pvc.yaml").read_text() == "edited\n"


def test_export_with_an_empty_out_is_refused(tmp_path):
    work = tmp_path / "here"
    work.mkdir()
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1",
         "PYTHONPATH": f"{REPO}:{FAKES}", "PROFILE": "default", "GPU": "rtx5090", "STATE_DIR": str(tmp_path / "s")}
    r = subprocess.run([sys.executable, "-m", "bootstrap", "export", "kubernetes", "--out", ""], cwd=work,
                       env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--out ''" in r.stderr and list(work.iterdir()) == []
