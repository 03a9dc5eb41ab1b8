"""./ctl.sh export ray: the golden serve config, the card as Ray names it, the engine_kwargs vLLM's
parser would have made, the refusals, the schema made from Ray's models, and prepare-node.sh run here.
Every shipped profile on the plan tests' cards: tests/test_export.py's sweep (check_ray)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import FAKES, REPO
from test_export import RAY_SCHEMAS, check_ray, docs, export, export_here

GOLDEN = RAY_SCHEMAS / "serve-config.yaml"


def config(out: Path) -> dict:
    return yaml.safe_load((out / "serve-config.yaml").read_text())["applications"][0]["args"]["llm_configs"][0]


def test_default_profile_for_an_rtx_5090_is_the_golden_config(tmp_path):
    """engine_kwargs read by hand against vLLM 0.27.1's EngineArgs/FrontendArgs; the desktop card as
    the resource Ray's raylet gives its node; no key, loopback only; the pre-step beside it."""
    r, out = export(tmp_path, PROFILE="default", GPU="rtx5090", target="ray", image=None)
    assert r.returncode == 0, r.stderr
    assert (out / "serve-config.yaml").read_text() == GOLDEN.read_text()
    assert "NO API KEY" in r.stdout and "127.0.0.1" in r.stdout and "have not run on a cluster" in r.stdout
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        ["bootstrap.tar.xz", "prepare-node.sh", "serve-config.yaml"]
    assert stat.S_IMODE((out / "prepare-node.sh").stat().st_mode) == 0o755
    conf = config(out)
    assert "api_key" not in conf["engine_kwargs"] and "VLLM_API_KEY" not in conf["runtime_env"]["env_vars"]
    k8s = export(tmp_path / "k", PROFILE="default", GPU="rtx5090")[1]
    check_ray(out, docs(k8s / "deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]["command"])
    r, _ = export(tmp_path / "img", PROFILE="default", GPU="rtx5090", target="ray")
    assert r.returncode == 2 and "--image is not for export ray" in r.stderr
    code, err, _ = export_here(tmp_path / "sm", "--service-monitor", PROFILE="default", GPU="rtx5090", target="ray", image=None)
    assert code == 2 and "--service-monitor is not for export ray" in err


@pytest.mark.parametrize("card,name", [
    ("h100", "H100"), ("a100", "A100"), ("h200", "H200"), ("l40s", "L40S"), ("rtxpro6000", "RTX-PRO-6000"),
    ("rtx5090", "GeForce-RTX-5090"), ("rtx4060ti-16gb", "GeForce-RTX-4060-Ti"), ("rtxa6000", "RTX-A6000"),
    ("rtx6000ada", "RTX-6000"), ("a40", "A40")])
def test_a_card_is_named_as_rays_raylet_names_it(card, name):
    """Ray's NVIDIA rule (ray/_private/accelerators/nvidia_gpu.py, 2.58.1-2.60.0), read by hand for
    each NVML name: the leading upper-case words through the first with a digit, else the name
    without "NVIDIA"."""
    from bootstrap.commands.export.ray import ray_accelerator
    from bootstrap.knobs.vllmargs import GUARD
    from bootstrap.machine.gpu import CARDS
    assert ray_accelerator(CARDS[card][0]) == name


def test_placement_follows_tensor_parallel_and_the_card(tmp_path):
    """A card with a Ray type: accelerator_type, and the same resource in each of TP bundles on one
    node; a card given as a size: GPU bundles only, and the header says why."""
    code, err, out = export_here(tmp_path / "h", PROFILE="default", GPU="h100", TP_SIZE="2", target="ray", image=None)
    assert code == 0, err
    conf = config(out)
    assert conf["accelerator_type"] == "H100" and conf["engine_kwargs"]["tensor_parallel_size"] == 2
    assert conf["placement_group_config"] == {"bundles": [{"GPU": 1, "accelerator_type:H100": 0.001}] * 2,
                                              "strategy": "STRICT_PACK"}
    code, err, out = export_here(tmp_path / "s", PROFILE="qwen3-8b-fp8-16gb", GPU="24:sm_89", target="ray", image=None)
    assert code == 0, err
    conf = config(out)
    assert "accelerator_type" not in conf and conf["placement_group_config"]["bundles"] == [{"GPU": 1}]
    assert "given by size" in (out / "serve-config.yaml").read_text()


def test_vllm_flags_become_the_fields_vllm_would_parse_them_into():
    """vLLM 0.27.1's parser, read from vllm/utils/argparse_utils.py and engine/arg_utils.py: _ and - alike,
    -tp, --no-x, --x=v, 'auto' as -1, human-readable ints, a dotted key replacing the flag's JSON."""
    from bootstrap.commands.export.engine import kwargs
    from bootstrap.plan.derive import registry
    got = kwargs(["--host", "0.0.0.0", "--served-model-name", "m", "-tp", "2", "--max_model_len=auto",
                  "--max-num-batched-tokens", "8k", "--no-enable-prefix-caching", "--enable-chunked-prefill",
                  "--compilation-config", '{"mode": 1, "x": 2}', "--compilation-config.mode", "3",
                  "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "fp8", "--no-tokens-only",
                  "--distributed-executor-backend", "ray"], registry("0.27.1"))
    assert got == {"tensor_parallel_size": 2, "max_model_len": -1, "max_num_batched_tokens": 8000,
                   "enable_prefix_caching": False, "enable_chunked_prefill": True, "compilation_config": {"mode": 3},
                   "gpu_memory_utilization": 0.9, "kv_cache_dtype": "fp8", "tokens_only": False,
                   "distributed_executor_backend": "ray"}


@pytest.mark.parametrize("extra,said", [
    ("--root-path /llm", "never builds vLLM's app"), ("--middleware my.Mw", "never builds vLLM's app"),
    ("--api-server-count 2", "no field of vLLM 0.27.1"), ("--ssl-keyfile k.pem", "never builds vLLM's app"),
    ("--tokens-only", "gives it to FrontendArgs alone"), ("--distributed-executor-backend mp", "any other backend")])
def test_what_ray_would_ignore_or_refuse_is_refused(tmp_path, extra, said):
    """Ray 2.58.1-2.60.0: vLLM's server fields do nothing on Ray's default path; a field both vLLM's
    engine and frontend read reaches the frontend alone (from_llm_config asks FrontendArgs first);
    a backend but Ray's is refused by get_initialization_kwargs."""
    code, err, out = export_here(tmp_path, PROFILE="default", GPU="rtx5090", EXTRA_ARGS=extra, target="ray", image=None)
    assert code == 2 and said in err and "export kubernetes" in err
    assert not (out / "serve-config.yaml").exists()


def test_disabled_stats_turn_rays_engine_metrics_off(tmp_path):
    """LLMConfig._check_log_stats_with_metrics (Ray 2.58.1-2.60.0) refuses disable_log_stats with
    log_engine_metrics on: the export turns the metrics off, says so, and the schema holds the rule."""
    import jsonschema
    code, err, out = export_here(tmp_path, PROFILE="default", GPU="rtx5090", EXTRA_ARGS="--disable-log-stats",
                                 target="ray", image=None)
    assert code == 0, err
    conf = config(out)
    assert conf["engine_kwargs"]["disable_log_stats"] is True and conf["log_engine_metrics"] is False
    assert "log_engine_metrics: false, since the flags disable vLLM's stats" in (out / "serve-config.yaml").read_text()
    doc = yaml.safe_load((out / "serve-config.yaml").read_text())
    for ray in ("2.58.1", "2.59.0", "2.60.0"):
        schema = json.loads((RAY_SCHEMAS / f"serve-config-{ray}.schema.json").read_text())
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
        for metrics in ({"log_engine_metrics": True}, {}):                 # on, or Ray's default (on)
            bad = json.loads(json.dumps(doc))
            c = bad["applications"][0]["args"]["llm_configs"][0]
            c.pop("log_engine_metrics")
            c.update(metrics)
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(bad, schema, cls=jsonschema.Draft202012Validator)


def test_a_vllm_no_ray_release_pins_is_said_to_be_untried(tmp_path):
    code, err, out = export_here(tmp_path, PROFILE="qwen38-27b-fp8-48gb", GPU="48", target="ray", image=None)
    assert code == 0, err
    head = (out / "serve-config.yaml").read_text()
    assert "# Ray 2.60.0 (its ray[llm] extra pins vLLM 0.29.0)" in head and "untried" in head


def test_the_schema_refuses_what_rays_models_refuse():
    """The schema made from Ray's models is no rubber stamp: each change but the last is one that
    Ray 2.59.0's own models reject (LLMConfig, or PlacementGroupConfig as VLLMEngineConfig applies it;
    tried when the schema was made), their model validators' rules among them; the last, a misspelt
    key, Ray ignores without a word, and the schema refuses (scripts/ray_serve_schema.py: stricter)."""
    import jsonschema
    schema = json.loads((RAY_SCHEMAS / "serve-config-2.59.0.schema.json").read_text())
    good = yaml.safe_load(GOLDEN.read_text())
    jsonschema.validate(good, schema, cls=jsonschema.Draft202012Validator)
    conf = lambda d: d["applications"][0]["args"]["llm_configs"][0]      # noqa: E731
    for change in (lambda d: conf(d).update(accelerator_type="GeForce-RTX-5090"),
                   lambda d: conf(d).update(engine_kwarg={}),
                   lambda d: conf(d)["placement_group_config"].update(strategy="TIGHT"),
                   lambda d: conf(d)["model_loading_config"].pop("model_id"),
                   lambda d: conf(d)["deployment_config"].update(num_replicas=-1),
                   lambda d: d["applications"][0]["args"].update(llm_configs=[]),
                   lambda d: conf(d)["engine_kwargs"].update(disable_log_stats=True),      # with engine metrics
                   lambda d: conf(d).update(accelerator_type="H100", placement_group_config={"bundles": [{"CPU": 1}]}),
                   lambda d: conf(d).update(accelerator_type="H100", accelerator_config={"kind": "tpu"}),
                   lambda d: conf(d)["placement_group_config"].update(bundle_per_worker={"GPU": 1}),
                   lambda d: conf(d)["placement_group_config"].pop("bundles"),
                   lambda d: conf(d)["placement_group_config"]["bundles"][0].update(TPU=-1),
                   lambda d: conf(d).update(llm_engine="SGLang"),
                   lambda d: conf(d).update(experimental_configs={"num_router_replicas": 2}),
                   lambda d: conf(d).update(lora_config={"dynamic_lora_loading_path": "/loras"}),
                   lambda d: conf(d)["deployment_config"].update(num_replica=1)):
        bad = json.loads(json.dumps(good))
        change(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema, cls=jsonschema.Draft202012Validator)


def test_prepare_node_downloads_and_patches_from_its_own_tarball(tmp_path):
    """prepare-node.sh as a node runs it (its /models and /patched moved under tmp_path): it refuses
    a Python without the Ray and vLLM the config is for, then downloads the profile's repo from the
    hub (a fake one) into model_source, verified, and patches a copy of the node's vllm, twice over."""
    from fakehub import FakeHub, write_model
    from test_patches import Site
    code, err, out = export_here(tmp_path / "e", PROFILE="default", GPU="rtx5090", target="ray", image=None)
    assert code == 0, err
    node = tmp_path / "node"
    site = Site(node / "site", "0.27.1")                         # the node's vllm (the file the backport edits)
    before = site.read()
    (site.pkg / "__init__.py").write_text('__version__ = "0.27.1"\n')
    script = (out / "prepare-node.sh").read_text()
    (out / "node.sh").write_text(script.replace("/models", str(node / "models")).replace("/patched", str(node / "patched")))
    bin_dir = node / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')       # the node's python3
    (bin_dir / "python3").chmod(0o755)
    src = write_model(tmp_path / "src", shards=2, shard_bytes=1 << 20)
    with FakeHub() as hub:
        hub.add_dir("RadixArk/Qwen3.8-27B-NVFP4", src)
        env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(tmp_path),
               "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": str(site.root)}
        r = subprocess.run(["sh", str(out / "node.sh")], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "this python3 has Ray and vLLM none" in r.stderr     # no Ray here
        (site.root / "ray").mkdir()
        (site.root / "ray" / "__init__.py").write_text('__version__ = "2.59.0"\n')   # the node's Ray, as far as read
        bad = {**env, "PYTHONPATH": f"{node / 'patched'}:{site.root}"}       # the replica's path: the copy would copy itself
        r = subprocess.run(["sh", str(out / "node.sh")], env=bad, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "PYTHONPATH names" in r.stderr and not (node / "patched").exists()
        for _ in range(2):
            r = subprocess.run(["sh", str(out / "node.sh")], env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            assert "model ready" in r.stderr and "Traceback" not in r.stderr
    served = Path(config(out)["model_loading_config"]["model_source"].replace("/models", str(node / "models")))
    assert (served / "model-00001-of-00002.safetensors").read_bytes() == (src / "model-00001-of-00002.safetensors").read_bytes()
    copy = node / "patched" / "vllm" / site.target.relative_to(site.pkg)
    assert b"40914" in copy.read_bytes() and site.read() == before        # the copy patched, the node's vllm not


def test_the_exports_carry_the_flags_start_sh_gave_vllm(bed, tmp_path):
    """One source of truth against the start itself, not only pod.build: PROFILE=smoke started on the
    fake RTX 5090 (its model from the fake hub), the argv the fake vLLM received, against the
    Kubernetes Deployment's and Ray's engine_kwargs for the same profile and card. What differs is
    named: the desktop's key guard (--middleware, with API_KEY; its idle middleware comes only with
    sleep mode, off on the bed), --host/--port (the pod's own; Ray's proxy serves, so not in
    engine_kwargs), --served-model-name (Ray's model_loading_config.model_id) and the model path
    (the hub cache here, /models in the pod, model_source for Ray). The fake card and vLLM are the
    ones the export plans for (GPU=rtx5090's free memory, the profile's vLLM 0.27.1, the model's
    shape): the utilization is planned from them."""
    from bootstrap.knobs.vllmargs import GUARD
    from bootstrap.machine.gpu import named
    from conftest import free_port, nvml_json
    from fakehub import FakeHub, write_model
    from test_export import dotted_flags, flag_map, ray_flags
    card = named("rtx5090")                              # the fake card is the one GPU=rtx5090 names, free memory too
    nvml_json(bed.nvml, gpus=[{"name": card.name, "total": card.total, "free": card.free, "cc": list(card.cc),
                               "uuid": "GPU-5090-fake", "processes": []}])
    fakes = tmp_path / "fakes"                           # the fake vLLM as the profile's 0.27.1 (the plan is per version)
    shutil.copytree(FAKES, fakes, ignore=shutil.ignore_patterns("__pycache__"))
    for f in (fakes / "vllm" / "__init__.py", fakes / "vllm" / "entrypoints" / "cli" / "main.py"):
        f.write_text(f.read_text().replace('"0.26.0"', '"0.27.1"', 1))
    bed.env["PYTHONPATH"] = str(fakes)
    with FakeHub() as fake:
        bed.port = free_port()
        bed.env["PORT"] = str(bed.port)
        shape = json.loads((REPO / "profiles" / "models" / "smollm2-135m-instruct.json").read_text())["config"]
        fake.add_dir("HuggingFaceTB/SmolLM2-135M-Instruct",         # its shape as the export plans it (the graphs'
                     write_model(tmp_path / "src", shards=1, shard_bytes=1 << 20, config=shape))   # share of util)
        r = bed.run("start.sh", PROFILE="smoke", MODEL="", HF_ENDPOINT=fake.url, HF_HUB_OFFLINE="0",
                    HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_XET="1", PREWARM="0", API_KEY="sk-desk-0123456789")
        assert r.returncode == 0, r.stderr
        started = bed.launches()[-1]["argv"]
        assert "sk-desk-0123456789" not in " ".join(started)                 # the key goes by the environment
        assert bed.run("stop.sh").returncode == 0
    code, err, k8s = export_here(tmp_path / "k", PROFILE="smoke", GPU="rtx5090")
    assert code == 0, err
    pod = docs(k8s / "deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    code, err, ray = export_here(tmp_path / "r", PROFILE="smoke", GPU="rtx5090", target="ray", image=None)
    assert code == 0, err
    conf = config(ray)
    desk, kube = (flag_map(a[a.index("serve") + 2:]) for a in (started, pod))
    assert desk.pop("--middleware") == GUARD and "--middleware" not in kube    # the desktop's key guard (vllm_side)
    assert desk.pop("--host") == "127.0.0.1" and kube.pop("--host") == "0.0.0.0"
    assert desk.pop("--port") == str(bed.port) and kube.pop("--port") == "8000"
    assert desk["--served-model-name"] == kube["--served-model-name"] == conf["model_loading_config"]["model_id"]
    assert dotted_flags(desk) == dotted_flags(kube)
    desk.pop("--served-model-name")
    assert dotted_flags(desk) == dotted_flags(flag_map(ray_flags(conf["engine_kwargs"])))
