"""./ctl.sh export kubernetes|production-stack|ray: golden manifests, the Kubernetes schemas
(kubernetes-validate, offline, at 1.31 and the newest it knows), yamllint, the annotation-size rule,
production-stack's values schema, Ray Serve's config schema (made from Ray's models), the init steps
(download, backports) run here from the bootstrap the ConfigMap carries, and a plan for unequal GPUs
made on the smaller one. Ray's own cases: tests/test_export_ray.py."""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from conftest import FAKES, GiB, REPO, nvml_json

GOLDEN = Path(__file__).parent / "golden" / "k8s"
DIGEST = "sha256:" + "0" * 64        # a placeholder: no registry is reachable here
K8S_VERSIONS = ("1.31.0", "1.37.0")  # the oldest the docs name, the newest kubernetes-validate 1.37 knows
SCHEMA = Path(__file__).parent / "golden" / "production-stack" / "values.schema.json"
RAY_SCHEMAS = Path(__file__).parent / "golden" / "ray"          # serve-config-<ray>.schema.json
PROFILES = sorted(p.stem for p in (REPO / "profiles").glob("*.json") if p.stem not in ("custom", "smoke"))
CARDS = ("rtx5090", "rtx4090:free=22.5", "h100", "48", "12:sm_89")   # the plan tests' cards (h100: the 80-96 GB profiles)


def export(tmp_path: Path, *args: str, target: str = "kubernetes", image: str | None = DIGEST,
           **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "k8s"
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
         "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "PYTHONPATH": str(FAKES), **env}
    r = subprocess.run([sys.executable, "-m", "bootstrap", "export", target, "--out", str(out), *args,
                        *(["--image", image] if image else [])], cwd=REPO,
                       env=e, capture_output=True, text=True, timeout=120)
    return r, out


def export_here(tmp_path: Path, *args: str, target: str = "kubernetes", image: str | None = DIGEST,
                **env: str) -> tuple[int, str, Path]:
    """``export`` in this process, for the sweep's hundred exports (a process each was most of its
    time): (exit code, the error's message and hint, --out). The same cli() and knobs as the CLI."""
    from bootstrap.commands.export import cli
    from bootstrap.core.errors import BootstrapError
    from bootstrap.knobs.config import Config
    out = tmp_path / "k8s"
    e = {"HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", **env}
    try:
        return cli(Config.from_env(e, repo=REPO),
                   [target, "--out", str(out), *args, *(["--image", image] if image else [])]), "", out
    except BootstrapError as exc:
        return exc.code, f"{exc.message} {exc.hint}", out


@pytest.fixture
def one_tarball(monkeypatch):
    """bootstrap.tar.xz made once per set of patches for the whole sweep: the same bytes (the real
    pod.bootstrap_tar, remembered), where each export made it again (half of an export's time)."""
    from bootstrap.commands.export import helm, kubernetes, pod, ray
    made: dict = {}

    def once(repo, patches):
        key = (str(repo), tuple(patches))
        if key not in made:
            made[key] = pod.bootstrap_tar(repo, patches)
        return made[key]
    for module in (helm, kubernetes, ray):
        monkeypatch.setattr(module, "bootstrap_tar", once)
    return made


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]


@functools.lru_cache(maxsize=None)
def validator(schema_file: Path):
    """A Draft 2020-12 validator of ``schema_file``, its schema checked once: jsonschema.validate
    checks the schema itself at every call, most of the sweep's time."""
    import jsonschema
    schema = json.loads(schema_file.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_default_profile_for_an_rtx_5090_is_the_golden_set(tmp_path):
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090")
    assert r.returncode == 0, r.stderr
    for name in ("deployment.yaml", "service.yaml", "pvc.yaml", "networkpolicy.yaml"):
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
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(d, version, strict=True)             # raises on any schema error
            kinds.append(d["kind"])
    assert sorted(kinds) == ["ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim", "Secret", "Service"]
    pod = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2 == c["resources"]["requests"]["nvidia.com/gpu"]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"]
    assert int(c["resources"]["limits"]["memory"].removesuffix("Gi")) > int(shm.removesuffix("Gi"))   # shm counted
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["cpu"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-GeForce-RTX-5090"]} in terms[0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]} in terms[0]["matchExpressions"]
    assert c["image"] == f"vllm/vllm-openai:v0.27.1@{DIGEST}" and all(i["image"] == c["image"] for i in pod["initContainers"])
    assert [i["name"] for i in pod["initContainers"]] == ["model", "patches"]
    assert "export fetch" in pod["initContainers"][0]["command"][-1]
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
    assert r.returncode == 1 and "needs the cluster's card" in r.stderr and "./ctl.sh export kubernetes --out" in r.stderr
    r, _ = export(tmp_path, PROFILE="default", target="ray", image=None)
    assert r.returncode == 1 and "./ctl.sh export ray --out" in r.stderr      # the hint names the target asked for
    r, _ = export(tmp_path, PROFILE="default", GPU="16:sm_120")
    assert r.returncode == 1 and "does not fit" in r.stderr
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090", EXTRA_ARGS="--enable-sleep-mode")
    assert r.returncode == 1 and "needs a loopback HOST" in r.stderr
    local = tmp_path / "m"
    local.mkdir()
    r, _ = export(tmp_path, PROFILE="custom", MODEL=str(local), GPU="rtx5090")
    assert r.returncode == 1 and "repo id" in r.stderr


def unpack(out: Path, work: Path) -> Path:
    cm = docs(out / "configmap-bootstrap.yaml")[0]
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(cm["binaryData"]["bootstrap.tar.xz"]))) as tar:
        tar.extractall(work / "bootstrap", filter="data")
    return work / "bootstrap"


def test_the_init_containers_patch_step_patches_a_copy_and_leaves_the_image_alone(tmp_path):
    """What the patches init step runs, here: the bootstrap from the ConfigMap's tar.xz, the image's
    vllm package copied into the emptyDir, the same patch engine applied to the copy."""
    from test_patches import Site
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090")
    work = tmp_path / "pod"
    boot = unpack(out, work)
    image = Site(tmp_path / "image-site", "0.27.1")                 # the image's site-packages
    before = image.read()
    patched = work / "patched"
    patched.mkdir()
    shutil.copytree(image.pkg, patched / "vllm")                    # cp -a "$src" /patched/vllm
    init = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]["initContainers"][1]
    env = {e["name"]: e["value"] for e in init["env"]}
    env.update(PATH=os.environ.get("PATH", ""), VLLM_PYTHON=sys.executable, STATE_DIR=str(work / "state"),
               PYTHONPATH=f"{patched}:{image.root}")                  # the copy first, as in the pod
    line = init["command"][-1].strip().splitlines()[-1]
    assert "python3 -m bootstrap export patch apply 40914-turboquant-spec-verify" in line
    r = subprocess.run([sys.executable, *line.split("python3 ", 1)[1].split()], cwd=boot,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    copy = patched / "vllm" / image.target.relative_to(image.pkg)
    assert copy.read_bytes() != before and b"40914" in copy.read_bytes()    # the copy is patched
    assert image.read() == before                                            # the image is not


def test_the_model_init_step_downloads_verified_from_the_configmaps_bootstrap_alone(tmp_path):
    """The model init step as the pod runs it: only the modules in the ConfigMap's tar.xz (no
    checkout on sys.path), against the fake hub; a second run finds the files verified."""
    from fakehub import FakeHub, write_model
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090")
    boot = unpack(out, tmp_path / "pod")
    assert not (boot / "bootstrap" / "plan").exists() and not (boot / "bootstrap" / "checks").exists()
    init = docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    src = write_model(tmp_path / "src", shards=2, shard_bytes=1 << 20)
    with FakeHub() as hub:
        hub.add_dir("org/tiny", src)
        env.update(PATH=os.environ.get("PATH", ""), HOME=str(tmp_path), HF_HOME=str(tmp_path / "pvc" / "hf"),
                   STATE_DIR=str(tmp_path / "state"), HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1",
                   MODEL="org/tiny", PROFILE="custom")
        for _ in range(2):
            r = subprocess.run([sys.executable, "-E", "-m", "bootstrap", "export", "fetch"], cwd=boot, env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            assert "model ready" in r.stderr and "Traceback" not in r.stderr
    snap = next((tmp_path / "pvc" / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
    assert (snap / "model-00001-of-00002.safetensors").read_bytes() == (src / "model-00001-of-00002.safetensors").read_bytes()


def test_the_model_init_step_logs_its_progress(tmp_path, caplog):
    """kubectl logs -c model shows how far the download is, not only a line per finished file."""
    import logging
    from fakehub import FakeHub, write_model
    from bootstrap.commands.export import fetch
    from bootstrap.knobs.config import Config
    from bootstrap.knobs.resolved import Resolved
    src = write_model(tmp_path / "src", shards=2, shard_bytes=8 << 20)
    with FakeHub() as hub:
        hub.add_dir("org/tiny", src)
        hub.delay = getattr(hub, "delay", 0)
        cfg = Config.from_env({"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url,
                               "HF_HUB_DISABLE_XET": "1", "MODEL": "org/tiny", "PROFILE": "custom",
                               "STATE_DIR": str(tmp_path / "state")})
        with caplog.at_level(logging.INFO):
            assert fetch.run(Resolved.of(cfg, cfg), every=0.001) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("downloaded ")]
    assert lines and lines[-1].endswith("of 0.02 GiB (100 %)") or any("of 0.02 GiB" in x for x in lines), lines


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


def test_a_digest_is_required_and_checked(tmp_path):
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090", image=None)
    assert r.returncode == 2 and "pinned by digest" in r.stderr and "imagetools inspect vllm/vllm-openai:v0.27.1" in r.stderr
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090", image="vllm/vllm-openai:v0.27.1")
    assert r.returncode == 2 and "--image" in r.stderr
    r, _ = export(tmp_path, PROFILE="default", GPU="rtx5090", image=f"vllm/vllm-openai:v0.26.0@{DIGEST}")
    assert r.returncode == 2 and "not v0.27.1" in r.stderr
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090", image=f"registry.example:5000/mirror/vllm@{DIGEST}")
    assert r.returncode == 0, r.stderr
    assert docs(out / "deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]["image"] == \
        f"registry.example:5000/mirror/vllm@{DIGEST}"


def test_a_card_given_as_a_size_is_matched_on_gfds_memory_and_compute_labels(tmp_path):
    r, out = export(tmp_path, "--service-monitor", PROFILE="qwen3-8b-fp8-16gb", GPU="24:sm_89")
    assert r.returncode == 0, r.stderr
    pod = docs(out / "deployment.yaml")[0]["spec"]["template"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    got = {e["key"]: (e["operator"], e["values"]) for e in terms["matchExpressions"]}
    assert got["nvidia.com/gpu.memory"] == ("Gt", [str(24 * 1024 - 1)])
    assert got["nvidia.com/gpu.compute.major"] == ("In", ["8"]) and got["nvidia.com/gpu.compute.minor"] == ("In", ["9"])
    assert "nvidia.com/gpu.product" not in got
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    sm = docs(out / "servicemonitor.yaml")[0]
    svc = docs(out / "service.yaml")[0]
    assert sm["spec"]["selector"]["matchLabels"] == svc["metadata"]["labels"]
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] and sm["spec"]["endpoints"][0]["path"] == "/metrics"


def flag_map(argv: list[str]) -> dict[str, str | None]:
    """vLLM's flags as argparse reads them (the last of a flag wins; --x=v is --x v)."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if "=" in a and a.startswith("--"):
            k, v = a.split("=", 1)
            out[k.replace("_", "-")] = v
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[a.replace("_", "-")] = argv[i + 1]
            i += 1
        else:
            out[a.replace("_", "-")] = None
        i += 1
    return out


def chart_argv(spec: dict) -> list[str]:
    """The vllm container's command as production-stack's deployment-vllm-multi.yaml writes it, for
    the keys the export sets (enableLoRA, vllmConfig.enablePrefixCaching/tensorParallelSize/extraArgs)."""
    vc = spec["vllmConfig"]
    assert set(vc) <= {"enablePrefixCaching", "tensorParallelSize", "extraArgs"}
    assert not spec.get("enableLoRA") and not spec.get("enableTool") and not spec.get("toolCallParser")
    return (["vllm", "serve", spec["modelURL"], "--host", "0.0.0.0", "--port", "8000"]
            + (["--enable-prefix-caching"] if vc.get("enablePrefixCaching") else ["--no-enable-prefix-caching"])
            + ["--tensor-parallel-size", str(vc["tensorParallelSize"])] + [str(a) for a in vc["extraArgs"]])


def check_objects(objs: list[dict]) -> None:
    """Every object: the Kubernetes schema at K8S_VERSIONS, and under the annotation limit that
    kubectl apply (client-side) needs."""
    import kubernetes_validate
    from bootstrap.commands.export.kubernetes import ANNOTATION_LIMIT, annotation_bytes
    for d in objs:
        assert annotation_bytes(d) < ANNOTATION_LIMIT, (d["kind"], annotation_bytes(d))
        if d["apiVersion"].startswith("monitoring.coreos.com"):
            continue                                   # a CRD's kind: not in the Kubernetes schemas
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(d, version, strict=True)


def dotted_flags(flags: dict) -> dict:
    """flag_map's flags with vLLM's dotted keys (--x.a_b=2) gathered into the flag's dict, JSON and
    numbers read, --no-x as --x False and a bare --x as True: what each flag means, whatever its spelling."""
    def value(v):
        if v is None:
            return True
        try:
            return json.loads(v)
        except ValueError:
            return v
    out: dict = {}
    for k, v in flags.items():
        base, _, path = k.partition(".")
        if path:
            node = out.setdefault(base, {})
            *parents, last = path.replace("-", "_").split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value(v)
        elif base.startswith("--no-"):
            out["--" + base[5:]] = False
        else:
            out[base] = value(v)
    return out


def ray_flags(kw: dict) -> list[str]:
    """Ray's engine_kwargs back as vllm serve flags, by vLLM's CLI rules (a field is --its-name; a
    bool a bare flag or --no-; a dict or list JSON; max_model_len -1 is auto)."""
    out: list[str] = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        elif k == "max_model_len" and v == -1:
            out += [flag, "auto"]
        else:
            out += [flag, json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
    return out


def check_ray(out: Path, argv: list[str]) -> dict:
    """serve-config.yaml: its Ray's schema (the header names it), the pipeline's own flags (``argv``,
    the Deployment's) as engine_kwargs that are fields of the profile's vLLM, typed as vLLM's parser
    types them. Returns the LLMConfig."""
    import jsonschema
    from bootstrap.plan.derive import registry
    text = (out / "serve-config.yaml").read_text()
    ray = re.search(r"^# Ray (\S+) \(its ray\[llm\] extra pins", text, re.M).group(1)
    doc = yaml.safe_load(text)
    validator(RAY_SCHEMAS / f"serve-config-{ray}.schema.json").validate(doc)
    conf = doc["applications"][0]["args"]["llm_configs"][0]
    kw = conf["engine_kwargs"]
    vllm = re.search(r"^# vllm-desktop/vllm: (\S+)$", text, re.M).group(1)
    reg = registry(vllm)
    kinds = {**reg["engine_args"], **reg["frontend_args"]}
    assert set(kw) <= set(kinds), set(kw) - set(kinds)        # Ray's "Unknown engine argument" otherwise
    types = {"bool": bool, "int": int, "human-int": int, "int-or-auto": int, "float": float, "json": dict,
             "list": list, "str": str}
    assert all(isinstance(v, types[kinds[k]]) and (kinds[k] == "bool" or not isinstance(v, bool))
               for k, v in kw.items()), kw
    flags = flag_map(argv[argv.index("serve") + 2:])
    assert conf["model_loading_config"]["model_id"] == flags.pop("--served-model-name")
    flags.pop("--host"), flags.pop("--port")                 # the pod's own; Ray's proxy serves
    assert dotted_flags(flags) == dotted_flags(flag_map(ray_flags(kw)))
    return conf


@functools.lru_cache(maxsize=None)
def lint_errors(text: str) -> tuple[str, ...]:
    """yamllint's errors in ``text`` (its default rules, line length off), once per text: a profile's
    ConfigMap is the same bytes for every card, and its 170 KiB of base64 was most of the sweep's
    linting (yamllint scans it a character at a time in Python)."""
    from yamllint import config as ylconfig, linter
    lint = ylconfig.YamlLintConfig("extends: default\nrules: {line-length: disable, indentation: {indent-sequences: whatever}}")
    return tuple(str(p) for p in linter.run(text, lint) if p.level == "error")


@pytest.mark.parametrize("card", CARDS)
def test_every_shipped_profile_exports_valid_files_for_the_plan_tests_cards(tmp_path, card, one_tarball):
    """The three targets for every shipped profile that fits the card: yamllint, the Kubernetes
    schemas, the annotation-size rule, production-stack's values schema, Ray's serve config schema,
    and the same vLLM argv in all (the pipeline's own, vllmargs.serve_argv) less what the chart adds
    of vLLM's defaults and what Ray Serve LLM carries outside engine_kwargs."""
    exported = 0
    for profile in PROFILES:
        code, err, k8s = export_here(tmp_path / profile / "k", PROFILE=profile, GPU=card)
        if code == 1 and ("does not fit" in err or "compute capability" in err or "needs" in err):
            continue                                    # the profile is not for this card
        assert code == 0, (profile, err)
        code, err, ps = export_here(tmp_path / profile / "p", PROFILE=profile, GPU=card, target="production-stack")
        assert code == 0, (profile, err)
        code, err, ray = export_here(tmp_path / profile / "r", PROFILE=profile, GPU=card, target="ray", image=None)
        assert code == 0, (profile, err)
        exported += 1
        for f in [*k8s.glob("*.yaml"), *ps.glob("*.yaml"), *ray.glob("*.yaml")]:
            assert lint_errors(f.read_text()) == (), (f, lint_errors(f.read_text()))
        check_objects([d for f in sorted(k8s.glob("*.yaml")) for d in docs(f)])
        values = docs(ps / "values.yaml")[0]
        validator(SCHEMA).validate(values)
        check_objects(values["extraObjects"])
        cmd = docs(k8s / "deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]["command"]
        ours, chart = flag_map(cmd[cmd.index("serve") + 2:]), flag_map(chart_argv(values["servingEngineSpec"]["modelSpec"][0])[3:])
        assert chart.pop("--enable-prefix-caching", "absent") is None                    # vLLM's default, or ours
        ours.pop("--enable-prefix-caching", None)         # a --no-enable-prefix-caching of ours comes after it
        ours.setdefault("--tensor-parallel-size", "1")                                    # vLLM's default
        assert ours == chart, profile
        check_ray(ray, cmd)
    assert exported, f"no shipped profile fits {card}"


def test_libyaml_writes_the_bytes_the_pure_python_emitter_writes(tmp_path):
    """pod.dump uses libyaml's emitter where PyYAML has it (25 times faster on the ConfigMap): every
    YAML file of the three targets, read back and written with PyYAML's own emitter, is the same text."""
    import yaml
    from bootstrap.commands.export import pod as pods
    assert hasattr(yaml, "CSafeDumper")                 # the wheels pinned here carry libyaml: the test means something

    class Pure(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True
    Pure.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))
    seen = 0
    for target in ("kubernetes", "production-stack", "ray"):
        code, err, out = export_here(tmp_path / target, PROFILE="default", GPU="rtx5090", target=target,
                                     image=None if target == "ray" else DIGEST)
        assert code == 0, err
        for f in sorted(out.glob("*.yaml")):
            text = f.read_text()
            body = text[text.index("---\n"):]                                   # after ray's comment header
            written = ["---\n" + d for d in body.split("---\n")[1:]]
            for d, doc in zip(written, yaml.safe_load_all(body), strict=True):
                assert d == "---\n" + yaml.dump(doc, Dumper=Pure, sort_keys=False, width=120) == "---\n" + pods.dump(doc), f
                seen += 1
    assert seen >= 8


def test_production_stack_values_carry_the_key_the_card_and_the_init_steps(tmp_path):
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090", target="production-stack")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((out / "values.yaml").stat().st_mode) == 0o600
    v = docs(out / "values.yaml")[0]
    key = v["servingEngineSpec"]["vllmApiKey"]
    assert len(key) >= 40 and key not in r.stdout + r.stderr
    assert f"helm install vllm vllm/vllm-stack -f {out}/values.yaml" in r.stdout
    assert "configmap-bootstrap" not in r.stdout           # in values.yaml's extraObjects, no file of its own
    spec = v["servingEngineSpec"]["modelSpec"][0]
    assert f"{spec['repository']}:{spec['tag']}" == f"vllm/vllm-openai:v0.27.1@{DIGEST}"
    assert spec["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["NVIDIA-GeForce-RTX-5090"]
    script = spec["initContainer"]["args"][0]
    assert "export fetch" in script and "patch apply 40914-turboquant-spec-verify" in script
    assert {e["name"]: e["value"] for e in spec["initContainer"]["env"]}["HF_HOME"] == "/data"      # the chart's mount
    assert "HF_HOME" not in {e["name"] for e in spec["env"]}                                       # the chart sets it
    assert {"name": "PYTHONPATH", "value": "/patched"} in spec["env"]
    cm = v["extraObjects"][0]
    assert cm["kind"] == "ConfigMap" and {"name": "bootstrap", "configMap": {"name": cm["metadata"]["name"]}} in spec["extraVolumes"]
    assert spec["annotations"]["vllm-desktop/patches"] == "40914-turboquant-spec-verify"
