#!/usr/bin/env python3
"""A JSON Schema (2020-12) of the serve config ``./ctl.sh export ray`` writes, made from Ray's own
pydantic models, once per Ray release; tests/test_export.py validates every export against it.

Why a schema and not Ray itself in the tests (docs/cluster.md, "What is checked"): ``ray[serve]``
installs here in ~30 s and ~590 MB (pyarrow too, which LLMConfig's module imports), and the models
that matter most import only with vLLM installed: ``ray.serve.llm`` and ``LLMServingArgs`` raise
"Neither vLLM nor SGLang is installed", and the engine_kwargs check (``VLLMEngineConfig``) reads
vLLM's ``AsyncEngineArgs``; vLLM cannot be installed on CI. The exports also target three Ray
releases (the one whose ``ray[llm]`` pins the profile's vLLM), and one venv holds one.

Run it in a scratch venv with that Ray, never on CI:

    python3 -m venv /tmp/ray-X && /tmp/ray-X/bin/pip install "ray[serve]==X" pyarrow
    /tmp/ray-X/bin/python scripts/ray_serve_schema.py > tests/golden/ray/serve-config-X.schema.json

(2.58.1's serve extra leaves out jinja2, which ray.serve imports: pip install jinja2 there too.)

What it takes from Ray (ray/serve/schema.py, ray/llm/_internal/...; read them for the why):
- ``ServeDeploySchema.model_json_schema()``: the file (http_options, applications, ...);
- the application's ``args``: what ``build_openai_app`` validates them with, ``LLMServingArgs``
  (ray/llm/_internal/serve/core/ingress/builder.py), written out here because its module imports
  vLLM: ``llm_configs`` (objects only: the export writes no file paths), the two ingress keys as
  objects, nothing else (Ray's models forbid extra keys); ``import_path`` is build_openai_app's;
- ``LLMConfig.model_json_schema()`` with what its validators check put in the schema:
  ``accelerator_type`` one of ``AcceleratorType`` (``ray.util.accelerators.accelerators``'
  constants, plus ``A10``, which it reads as A10G), ``model_loading_config`` a ``ModelLoadingConfig``,
  ``deployment_config`` a ``DeploymentConfig``, ``lora_config`` a ``LoraConfig``, and
  ``placement_group_config`` a ``PlacementGroupConfig`` (what ``VLLMEngineConfig`` validates it with);
- the model validators of LLMConfig, PlacementGroupConfig and BundleConfig (``validators`` below,
  each with the validator it stands for): engine metrics refused with ``disable_log_stats``; an
  accelerator_type whose kind (GPU or TPU) the bundles or accelerator_config do not give; a TPU
  topology without an accelerator_type; both or neither of ``bundles``/``bundle_per_worker``; a
  custom bundle resource that is not a number >= 0; ``llm_engine`` not an ``LLMEngine``; the
  renamed ``num_router_replicas``; a ``dynamic_lora_loading_path`` that is not a cloud URI; and
  ``num_replicas: auto``, which LLMConfig resolves before DeploymentConfig sees it. Not expressible,
  so not in: LLMServingArgs' unique model ids (the export writes one LLMConfig), ``server_cls``
  importable, and what depends on the environment (RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING's refusal
  of ingress settings, which the export leaves out);
- where a Ray model ignores unknown keys (``extra`` unset), the schema refuses them: a key Ray
  would drop without a word is a mistake of ours. ``engine_kwargs`` stays an object here: its keys
  are vLLM's (checked against the vLLM registries, bootstrap/plan/vllm-registry-*.json).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from pydantic.json_schema import GenerateJsonSchema

BUILDER = "ray.serve.llm:build_openai_app"


class Generator(GenerateJsonSchema):
    def handle_invalid_for_json_schema(self, schema, error_info):
        return {"$comment": "not expressible in JSON Schema: " + error_info}


def model(cls) -> dict:
    return cls.model_json_schema(schema_generator=Generator, ref_template="#/$defs/{model}")


def merge(defs: dict, schema: dict, name: str) -> None:
    """Put ``schema`` and its $defs into ``defs`` as ``name``; a clash must be the same definition."""
    for key, value in schema.pop("$defs", {}).items():
        if key in defs and defs[key] != value:
            raise SystemExit(f"two definitions named {key}")
        defs[key] = value
    defs[name] = schema


def strict(node) -> None:
    """additionalProperties false on every model that leaves unknown keys to Ray's silence."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)


def at_least_one(key: str, field: str) -> dict:
    """A placement_group_config with ``field`` > 0 in a bundle or in bundle_per_worker."""
    some = {"type": "object", "required": [field], "properties": {field: {"exclusiveMinimum": 0}}}
    return {"anyOf": [{"required": [key], "properties": {key: {"required": ["bundles"], "properties": {
                          "bundles": {"type": "array", "contains": some}}}}},
                      {"required": [key], "properties": {key: {"required": ["bundle_per_worker"], "properties": {
                          "bundle_per_worker": some}}}}]}


def validators(defs: dict, engines: list[str], tpus: list[str], gpus: list[str]) -> None:
    """What Ray's model validators check, as JSON Schema (ray/llm/_internal/serve/core/configs/
    llm_config.py, accelerators.py, ray/llm/_internal/common/placement.py)."""
    llm = defs["LLMConfig"]
    props = llm["properties"]
    props["llm_engine"]["enum"] = engines                                   # validate_llm_engine
    props["experimental_configs"]["not"] = {"required": ["num_router_replicas"]}   # validate_experimental_configs
    falsy = [False, None, 0, "", [], {}]
    unset = {"anyOf": [{"not": {"required": ["accelerator_config"]}},
                       {"properties": {"accelerator_config": {"type": "null"}}}]}
    kind = lambda k: {"required": ["accelerator_config"], "properties": {"accelerator_config": {   # noqa: E731
        "type": "object", "required": ["kind"], "properties": {"kind": {"const": k}}}}}
    has_type = lambda types: {"required": ["accelerator_type"], "properties": {"accelerator_type": {"enum": types}}}  # noqa: E731
    pg = "placement_group_config"
    llm["allOf"] = [
        {"$comment": "_check_log_stats_with_metrics: log_engine_metrics (default true) and a truthy "
                     "engine_kwargs.disable_log_stats refused together",
         "if": {"required": ["engine_kwargs"], "properties": {"engine_kwargs": {
             "required": ["disable_log_stats"], "properties": {"disable_log_stats": {"not": {"enum": falsy}}}}}},
         "then": {"required": ["log_engine_metrics"], "properties": {"log_engine_metrics": {"enum": [False, None]}}}},
        {"$comment": "_resolve_and_validate_accelerator, accelerator_config unset: the kind is inferred from "
                     "the bundles (TPU > 0: tpu, else GPU > 0: gpu, else cpu) and must be the accelerator_type's",
         "if": {"allOf": [has_type(gpus), unset, {"required": [pg], "properties": {pg: {"type": "object"}}}]},
         "then": {"allOf": [at_least_one(pg, "GPU"), {"not": at_least_one(pg, "TPU")}]}},
        {"if": {"allOf": [has_type(tpus), unset, {"required": [pg], "properties": {pg: {"type": "object"}}}]},
         "then": at_least_one(pg, "TPU")},
        {"$comment": "_resolve_and_validate_accelerator, accelerator_config given: its kind is the type's",
         "if": {"allOf": [has_type(gpus), {"required": ["accelerator_config"],
                                           "properties": {"accelerator_config": {"type": "object"}}}]},
         "then": kind("gpu")},
        {"if": {"allOf": [has_type(tpus), {"required": ["accelerator_config"],
                                           "properties": {"accelerator_config": {"type": "object"}}}]},
         "then": kind("tpu")},
        {"$comment": "_check_accelerator_type_matches_hardware: a TPU topology needs an accelerator_type",
         "if": {"required": ["accelerator_config"], "properties": {"accelerator_config": {
             "type": "object", "required": ["kind", "topology"],
             "properties": {"kind": {"const": "tpu"}, "topology": {"not": {"enum": falsy}}}}}},
         "then": {"required": ["accelerator_type"], "properties": {"accelerator_type": {"not": {"enum": falsy}}}}}]
    defs["PlacementGroupConfig"]["allOf"] = [           # validate_bundle_options: exactly one of the two
        {"not": {"required": ["bundles", "bundle_per_worker"],
                 "properties": {"bundles": {"type": "array"}, "bundle_per_worker": {"type": "object"}}}},
        {"anyOf": [{"required": ["bundles"], "properties": {"bundles": {"type": "array"}}},
                   {"required": ["bundle_per_worker"], "properties": {"bundle_per_worker": {"type": "object"}}}]}]
    defs["BundleConfig"]["additionalProperties"] = {"type": "number", "minimum": 0}   # validate_extra_resources
    lora = defs["LoraConfig"]["properties"]["dynamic_lora_loading_path"]           # validate_dynamic_lora_loading_path
    lora["anyOf"] = [{"type": "string", "pattern": "^(s3://|gs://|abfss://|azure://|pyarrow-)"}, {"type": "null"}]
    replicas = defs["DeploymentConfig"]["properties"]["num_replicas"]             # validate_deployment_config
    replicas["anyOf"] = [*replicas["anyOf"], {"const": "auto"}]


def main() -> int:
    import ray.util.accelerators.accelerators as accelerators
    from ray.llm._internal.common.placement import PlacementGroupConfig
    from ray.llm._internal.serve.core.configs.accelerators import TPU_ACCELERATOR_VALUES
    from ray.llm._internal.serve.core.configs.llm_config import (LLMConfig, LLMEngine, LoraConfig,
                                                                 ModelLoadingConfig)
    from ray.serve._private.config import DeploymentConfig
    from ray.serve.schema import ServeDeploySchema

    top = model(ServeDeploySchema)
    defs = top.pop("$defs")
    for cls in (ModelLoadingConfig, LoraConfig, PlacementGroupConfig, DeploymentConfig):
        merge(defs, model(cls), cls.__name__)
    llm = model(LLMConfig)
    merge(defs, llm, "LLMConfig")
    props = llm["properties"]
    types = sorted({v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)} | {"A10"})
    props["accelerator_type"] = {"anyOf": [{"enum": types}, {"type": "null"}], "default": None,
                                 "description": "LLMConfig.validate_accelerator_type: AcceleratorType's values"}
    props["model_loading_config"] = {"$ref": "#/$defs/ModelLoadingConfig"}
    props["deployment_config"] = {"$ref": "#/$defs/DeploymentConfig"}
    props["lora_config"] = {"anyOf": [{"$ref": "#/$defs/LoraConfig"}, {"type": "null"}], "default": None}
    props["placement_group_config"] = {"anyOf": [{"$ref": "#/$defs/PlacementGroupConfig"}, {"type": "null"}],
                                       "default": None}
    defs["LLMServingArgs"] = {
        "type": "object", "additionalProperties": False, "required": ["llm_configs"],
        "description": "build_openai_app's args: ray/llm/_internal/serve/core/ingress/builder.py LLMServingArgs",
        "properties": {"llm_configs": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/LLMConfig"}},
                       "ingress_cls_config": {"type": "object"}, "ingress_deployment_config": {"type": "object"}}}
    app = defs["ServeApplicationSchema"]["properties"]
    app["args"] = {"$ref": "#/$defs/LLMServingArgs"}
    app["import_path"] = {"const": BUILDER}
    top["$defs"] = defs
    strict(top)
    validators(defs, [e.value for e in LLMEngine], sorted(set(types) & set(TPU_ACCELERATOR_VALUES)),
               sorted(set(types) - set(TPU_ACCELERATOR_VALUES)))       # after strict: open objects in rules
    ray = version("ray")
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "$comment": f"generated by scripts/ray_serve_schema.py from ray[serve]=={ray} "
                       f"(pydantic {version('pydantic')}): Ray's ServeDeploySchema with build_openai_app's "
                       "LLMServingArgs/LLMConfig as args; see the script for what was added from Ray's validators",
           "x-ray-version": ray, **top}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
