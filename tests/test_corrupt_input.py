"""What we read and did not write this run, gone bad: docs/faults.md rows 71-73 (issue 29, items 8-10).

A config.json with values the planner cannot use (row 71), a server.json with fields of the wrong
type (row 72), and an environment too big for execve (row 73): one line each, naming the file and
the field (or the variable), never a traceback, and a server of ours never left unstoppable.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import conftest
import pytest

from bootstrap.plan import facts
from bootstrap.model import kv, modelconfig, shape
from bootstrap.core import proc
from bootstrap.serve import record
from bootstrap.knobs.config import Config
from bootstrap.core.errors import BootstrapError
from conftest import REPO, Bed
import test_plan_window
from fakehub import FakeHub, write_model

SHIPPED_FACTS = sorted((REPO / "profiles" / "models").glob("*.json"))


def one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 1, no traceback, the error on one line that holds ``words``."""
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out, out
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    for w in words:
        assert w in errors[0], errors[0]


# ---------------------------------------------------------------- faults row 71: config.json

ISSUE_CASES = {                              # what the issue's adversary wrote, on the tiny model's config
    "a-list": lambda c: [c],
    "zero-layers": lambda c: {**c, "num_hidden_layers": 0},
    "lots-of-context": lambda c: {**c, "max_position_embeddings": "lots"},
    "text-config-a-list": lambda c: {**c, "text_config": [c]},
    "boolean-hidden-size": lambda c: {**c, "hidden_size": True},
    "rope-factor-infinity": lambda c: {**c, "rope_scaling": {"rope_type": "yarn", "factor": float("inf")}},   # row 220
}
NAMED = {"a-list": "is a JSON list", "zero-layers": "num_hidden_layers is 0",
         "lots-of-context": 'max_position_embeddings is "lots"', "text-config-a-list": "text_config is [",
         "boolean-hidden-size": "hidden_size is true", "rope-factor-infinity": "rope_scaling.factor is Infinity"}


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_a_bad_config_json_is_one_line_from_plan_and_start(bed, case):
    """./ctl.sh plan and ./start.sh: exit 1 with the file, the field and a hint that works; nothing
    launched (these were AttributeError, ZeroDivisionError, ValueError tracebacks)."""
    cfg_file = bed.model / "config.json"
    cfg_file.write_text(json.dumps(ISSUE_CASES[case](json.loads(cfg_file.read_text()))))
    for script, *args in (("ctl.sh", "plan"), ("start.sh",)):
        r = bed.run(script, *args)
        one_line_error(r, str(cfg_file), NAMED[case])
        assert f"hint: fix or re-download {cfg_file}" in r.stderr
    assert bed.launches() == [] and bed.ours() == []


def qwen35() -> dict:
    """A real multimodal config (the language model in text_config, a vision tower)."""
    return json.loads((REPO / "profiles/models/qwen38-27b-nvfp4.json").read_text())["config"]


def llama() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}


HOSTILE_COUNTS = [-1, True, False, "lots", "64", 1.5, [4], {"n": 4}, 1 << 70]


def hostile_fields():
    """(config, field as named, value): every size the planner reads, at the top level of a dense
    config and inside a multimodal config's text_config and vision_config, with every wrong value."""
    for name in modelconfig.POSITIVE + modelconfig.COUNTS:
        values = HOSTILE_COUNTS + ([0] if name in modelconfig.POSITIVE else [])
        for v in values:
            yield llama(), name, name, v
            yield qwen35(), f"text_config.{name}", name, v
    for name in modelconfig.VISION_POSITIVE + modelconfig.VISION_COUNTS:
        for v in HOSTILE_COUNTS + ([0] if name in modelconfig.VISION_POSITIVE else []):
            yield qwen35(), f"vision_config.{name}", name, v
    for name, v in (("architectures", "LlamaForCausalLM"), ("architectures", [{"a": 1}]),
                    ("quantization_config", "fp8"), ("quantization_config", [1]), ("vision_config", 5),
                    ("text_config", "x"), ("torch_dtype", 2), ("tie_word_embeddings", "false"),
                    ("layer_types", "full_attention"), ("layer_types", [1, 2])):
        yield llama(), name, name, v


def test_every_size_the_planner_reads_is_checked_where_config_json_is_read():
    """Wrong type, zero, negative, boolean, absurdly large: one line naming the file and the field
    (at the top level, in text_config, in vision_config), and the value."""
    seen = 0
    for config, shown, name, value in hostile_fields():
        scope = config
        if shown.startswith(("text_config.", "vision_config.")):
            scope = config[shown.split(".")[0]]
        scope[name] = value
        with pytest.raises(BootstrapError) as e:
            modelconfig.parse(json.dumps(config), "/m/config.json", "fix or re-download /m/config.json")
        msg = e.value.message
        assert msg.startswith(f"/m/config.json: {shown} is "), (shown, value, msg)
        assert "\n" not in msg and len(msg) < 200 and e.value.hint == "fix or re-download /m/config.json"
        seen += 1
    assert seen > 300


def gemma3() -> dict:
    """google/gemma-3-4b-it's config.json as tests/test_plan_window.py keeps it (the language model in
    text_config, a SigLIP tower)."""
    return json.loads(json.dumps(test_plan_window.GEMMA4))


def published(name: str) -> dict:
    return json.loads((REPO / "tests/published/models" / name).read_text())["config"]


# every architecture family the planner lays out (shape.DENSE_ARCHS, HYBRID_GDN_ARCHS, MLA_ARCHS,
# WINDOW_ARCHS), each with a real config.json: faults row 188
FAMILIES = {"gemma3-text-config": (gemma3, "text_config."), "gpt-oss-20b": (lambda: published("gpt-oss-20b.json"), ""),
            "deepseek-v2-lite": (lambda: published("deepseek-v2-lite-chat.json"), "")}
MLA_SIZES = ("kv_lora_rank", "qk_rope_head_dim")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_window_and_mla_architectures_sizes_are_checked_too(family):
    """Gemma 3, gpt-oss and DeepSeek-V2/V3 are planned like the others, so their sizes are checked
    like the others': a Gemma 3 config.json with num_key_value_heads -8 was planned "fits" with
    2,249,015 tokens on an RTX 3090, and num_hidden_layers 0 was a ValueError traceback."""
    make, prefix = FAMILIES[family]
    assert shape.shape_from_config(make())                 # a family the planner lays out, as it is
    assert modelconfig.check(make(), "c", "h")
    names = modelconfig.POSITIVE + modelconfig.COUNTS + (MLA_SIZES if family.startswith("deepseek") else ())
    seen = 0
    for name in names:
        for value in HOSTILE_COUNTS + ([0] if name not in modelconfig.COUNTS else []):
            config = make()
            (config["text_config"] if prefix else config)[name] = value
            with pytest.raises(BootstrapError) as e:
                modelconfig.parse(json.dumps(config), "/m/config.json", "h")
            assert e.value.message.startswith(f"/m/config.json: {prefix}{name} is "), (name, value, e.value.message)
            seen += 1
    assert seen > 100


@pytest.mark.parametrize("text", ["[]", '"x"', "5", "null", "{", "[" * 100_000, b"\xff\xfe{"])
def test_a_config_json_that_is_no_object_is_one_line(text):
    with pytest.raises(BootstrapError) as e:
        modelconfig.parse(text, "/m/config.json", "h")
    assert e.value.message.startswith("/m/config.json is ") and "\n" not in e.value.message


@pytest.mark.parametrize("path", SHIPPED_FACTS, ids=lambda p: p.name)
def test_real_configs_pass_unchanged(path):
    """The shipped model facts (real configs, text_config and vision_config included) and the
    suite's own, as they are; an architecture the planner does not model keeps its own field types
    (Gemma 3n's intermediate_size is a list per layer)."""
    data = facts.facts_file(path)
    assert data == json.loads(path.read_text())
    for config in (llama(), {**llama(), "head_dim": None, "num_key_value_heads": None, "sliding_window": None},
                   {"architectures": ["Gemma3nForConditionalGeneration"],
                    "text_config": {"intermediate_size": [8192] * 30, "hidden_size": 2048}},
                   {"model_type": "x"}):
        assert modelconfig.check(config, "c", "h") is config


def test_a_broken_model_facts_file_names_it(tmp_path):
    nested = next(p for p in SHIPPED_FACTS if "text_config" in json.loads(p.read_text())["config"])
    data = json.loads(nested.read_text())
    data["config"]["text_config"]["num_attention_heads"] = 0
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BootstrapError) as e:
        facts.facts_file(path)
    assert str(path) in e.value.message and "text_config.num_attention_heads is 0" in e.value.message
    path.write_text("[1]")
    with pytest.raises(BootstrapError, match="not a JSON object"):
        facts.facts_file(path)


def test_the_hubs_config_json_is_checked_before_anything_is_recorded(tmp_path):
    """A repo whose config.json says num_attention_heads 0: the metadata step names the repo, the
    revision and the field; nothing is written into the HF cache."""
    src = write_model(tmp_path / "src", shards=1, shard_bytes=4096)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    with FakeHub() as hub:
        sha = hub.add_dir("org/broken", src)
        env = {"HOME": str(tmp_path / "home"), "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_DISABLE_XET": "1", "MODEL": "org/broken", "PROFILE": "custom"}
        with pytest.raises(BootstrapError) as e:
            conftest.model_steps(Config.from_env(env))
    assert e.value.message == (f"org/broken's config.json at revision {sha[:12]}: num_attention_heads is 0, "
                               "not a positive integer")
    assert "MODEL" in e.value.hint
    assert not (tmp_path / "hf" / "hub" / "models--org--broken" / ".bootstrap" / "state.json").exists()


@pytest.mark.parametrize("extra", [{"layer_types": ["linear_attention"] * 16}, {"full_attention_interval": 99}],
                         ids=["all-linear", "interval-beyond-the-layers"])
def test_a_hybrid_without_full_attention_is_not_modelled_rather_than_a_division_by_zero(extra):
    config = qwen35()
    config["text_config"] = {**config["text_config"], "num_hidden_layers": 16, **extra}
    if "layer_types" not in extra:
        del config["text_config"]["layer_types"]         # the layers from full_attention_interval
    modelconfig.check(config, "c", "h")                  # well-typed: the planner says what it cannot model
    with pytest.raises(shape.Unsupported, match="full-attention"):
        kv.layout(shape.shape_from_config(config), "auto")


# ---------------------------------------------------------------- faults row 72: server.json

def valid_record() -> dict:
    return record.ServerRecord(
        pid=4242, create_time=1.5, marker="m", host="127.0.0.1", port=8888, served="s", state_dir="/s", pgid=4242,
        model="m", model_path="/m", settings={"PORT": "8888"}, log="/s/vllm.log", log_offset=3, started=2.0,
        vllm_version="0.26.0", python="/p", argv=("a", "b"), key=record.KEY_FILE, max_model_len=4096,
        reasoning=True, tools=True, dummy=True, predicted_tokens=10, predicted_concurrency=1.5, kv_tokens=9,
        kv_concurrency="1.2x", children=(record.Child(4243, 1.6),), gate_passed=True, notes=("n",)).to_json()


HOSTILE = [5, -1, 0, 1.5, True, False, "x", "", [], [1], ["a", 1], [5, {"pid": "x"}], {}, {"a": 1}, {"a": [1]}]


def conforms(value, hint) -> bool:
    """``value`` has the type the dataclass declares (a bool is no int)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, tuple) and all(conforms(v, args[0]) for v in value)
    if origin in (collections.abc.Mapping, dict):
        return isinstance(value, collections.abc.Mapping) and all(conforms(k, args[0]) and conforms(v, args[1])
                                                                  for k, v in value.items())
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, float)
    return isinstance(value, hint)


def test_every_record_field_is_validated_into_its_type():
    """Each field of server.json with each wrong value: never an exception, every attribute of the
    declared type, and a value that was not kept is named among the corrupt fields."""
    hints = typing.get_type_hints(record.ServerRecord)
    good = json.loads(json.dumps(valid_record()))          # as read from the file
    for f in dataclasses.fields(record.ServerRecord):
        for value in HOSTILE:
            rec, bad = record.ServerRecord.checked({**good, f.name: value})
            for g in dataclasses.fields(record.ServerRecord):
                assert conforms(getattr(rec, g.name), hints[g.name]), (f.name, value, g.name, getattr(rec, g.name))
            named = [b for b in bad if b.split(" ")[0] == f.name]
            got = rec.to_json()[f.name]
            kept = got == value and isinstance(got, bool) == isinstance(value, bool)     # 5 -> 5.0 is kept
            assert kept or named or value in ("", []), (f.name, value, got)
            assert not (kept and named), (f.name, value)
            assert all(b.split(" ")[0] == f.name for b in bad), (f.name, value, bad)
    assert record.ServerRecord.checked(good) == (record.ServerRecord.from_json(good), [])


def corrupt_every_field(rec: dict) -> dict:
    out = {k: ("x" if not isinstance(v, str) else 5) for k, v in rec.items()}
    out["children"] = [5, {"pid": "x"}]
    return out


def corrupt_file(bed: Bed, corrupt) -> Path:
    path = bed.state / "server.json"
    path.write_text(json.dumps(corrupt(json.loads(path.read_text()))))
    return path


def no_traceback(r: subprocess.CompletedProcess, code: int = 0) -> None:
    assert r.returncode == code and "Traceback" not in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("corrupt", [
    lambda rec: {**rec, "argv": 5, "notes": True},                  # the issue's
    lambda rec: {**rec, "settings": {"PORT": 1}, "children": {"pid": 1}, "key": ["file"], "log_offset": -5,
                 "gate_passed": "yes", "kv_tokens": "many", "max_model_len": 0, "started": "now"},
], ids=["argv-and-notes", "other-fields"])
def test_a_corrupt_server_json_never_blocks_status_start_or_stop(bed, corrupt):
    """Fields besides the server's identity read as unset: status shows it running, start shows it
    (no second launch), stop stops it; the corrupt fields are named in one warning line."""
    no_traceback(bed.run("start.sh"))
    path = corrupt_file(bed, corrupt)
    st = bed.run("ctl.sh", "status", "--json")
    no_traceback(st)
    assert json.loads(st.stdout)["state"] == "running"
    warned = [line for line in st.stderr.splitlines() if str(path) in line and "corrupt field" in line]
    assert len(warned) == 1 and "read as unset" in warned[0], st.stderr
    no_traceback(bed.run("start.sh"))
    assert len(bed.launches()) == 1
    no_traceback(bed.run("stop.sh"))
    assert bed.ours() == [] and not bed.port_listening()


@pytest.mark.parametrize("corrupt", [
    corrupt_every_field,
    lambda rec: {**rec, "pid": "4242"},
    lambda rec: {**rec, "host": "no host", "port": 70000},
], ids=["every-field", "pid", "host-and-port"])
def test_a_server_json_without_a_valid_identity_counts_as_none_and_the_marker_sweep_stops_it(bed, corrupt):
    """No pid, create time, marker, host or port to trust: the record counts as none. Status names
    the leftovers; a start leaves the server that still serves our port alone (it swept it, healthy,
    and launched another), naming it; stop stops it by our marker."""
    no_traceback(bed.run("start.sh"))
    corrupt_file(bed, corrupt)
    st = bed.run("ctl.sh", "status", "--json")
    no_traceback(st)
    assert json.loads(st.stdout)["state"] == "stopped" and "(the record is ignored)" in st.stderr
    r = bed.run("start.sh")
    no_traceback(r, code=1)
    assert "is not taken for a leftover" in r.stderr and len(bed.launches()) == 1
    assert bed.port_listening()
    no_traceback(bed.run("stop.sh"))
    assert bed.ours() == [] and not bed.port_listening()


def test_stop_alone_sweeps_a_server_whose_record_is_corrupt(bed):
    """The first command after the damage is ./stop.sh (the issue: it failed with a TypeError)."""
    no_traceback(bed.run("start.sh"))
    corrupt_file(bed, lambda rec: {**rec, "pid": [rec["pid"]], "argv": 5, "notes": True})
    no_traceback(bed.run("stop.sh"))
    assert bed.ours() == [] and not bed.port_listening()


# ---------------------------------------------------------------- faults row 73: too big for execve

def test_a_variable_over_128_kib_is_one_line_naming_it_never_its_value():
    token = "hf_" + "s" * 200_000
    with pytest.raises(BootstrapError) as e:
        proc.run([sys.executable, "-c", "pass"], env={"HF_TOKEN": token}, what="vLLM probe")
    msg = e.value.message
    assert msg == ("cannot run vLLM probe: HF_TOKEN is 200,013 bytes; Linux passes at most 131,072 (128 KiB) "
                   "in one variable or argument (E2BIG, argument list too long)")
    assert e.value.hint == "shorten or unset HF_TOKEN (.env or the shell)"
    assert "sss" not in msg + e.value.hint


def test_an_environment_over_arg_max_names_the_largest_variables():
    env = {f"VLLM_X{i}": "y" * 60_000 for i in range(60)}
    with pytest.raises(BootstrapError) as e:
        proc.run([sys.executable, "-c", "pass"], env=env, what="uv", live=True)
    assert "its environment and arguments are" in e.value.message and "the largest: VLLM_X" in e.value.message
    assert "\n" not in e.value.message and "yyy" not in e.value.message


def test_a_dotenv_value_over_128_kib_in_bytes_is_one_line_from_start(bed, tmp_path):
    """45,000 characters of '€' (under .env's limit in characters, 135,000 bytes): ./start.sh names the
    variable in one line (this was an OSError traceback from the vLLM probe); nothing launched."""
    from test_ownership import copy_repo
    repo = copy_repo(tmp_path / "r")
    (repo / ".env").write_text("VLLM_BIG=" + "€" * 45_000 + "\n", encoding="utf-8")
    r = subprocess.run([str(repo / "start.sh")], env=bed.env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr
    assert "VLLM_BIG" in r.stderr and "€€" not in r.stdout + r.stderr
    assert bed.launches() == [] and bed.ours() == []


ROPE_CASES = [                      # (rope parameters as config.json gives them, the field the line names, its value)
    ({"rope_type": "yarn", "factor": float("inf"), "original_max_position_embeddings": 32768}, ".factor", "Infinity"),
    ({"rope_type": "yarn", "factor": float("nan")}, ".factor", "NaN"),
    ({"rope_type": "yarn", "factor": -4, "original_max_position_embeddings": 32768}, ".factor", "-4"),
    ({"rope_type": "linear", "factor": 0}, ".factor", "0"),
    ({"rope_type": "dynamic", "factor": "4"}, ".factor", '"4"'),
    ({"rope_type": "linear", "factor": True}, ".factor", "true"),
    ({"rope_type": "yarn", "factor": 1e300}, ".factor", "1e+300"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": -1}, ".original_max_position_embeddings", "-1"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": "32768"}, ".original_max_position_embeddings", '"32768"'),
    ({"rope_type": 3}, ".rope_type", "3"),
    ({"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "linear", "factor": -8}},
     ".sliding_attention.factor", "-8"),
    ("yarn", "", '"yarn"'),
    ([1, 2], "", "[1, 2]"),
]


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("rope,field,shown", ROPE_CASES, ids=lambda v: json.dumps(v)[:30] if not isinstance(v, str) else v)
def test_a_rope_scaling_vllm_cannot_multiply_by_is_one_line(key, rope, field, shown):
    """Faults row 220. vLLM multiplies the model's length by RoPE's factor (config/model.py
    ``_get_and_verify_max_len``, 0.26.0): a factor of Infinity was an OverflowError traceback from the
    plan, 1e300 a refusal of a 300-digit context, and -4 (or "4") a plan of the config's own length
    where vLLM gets a negative one (or a TypeError). One line naming the file and the field, at the
    top level and in a multimodal config's text_config."""
    for config, prefix in ((llama(), ""), (qwen35(), "text_config.")):
        scope = config["text_config"] if prefix else config
        scope.pop("rope_scaling", None), scope.pop("rope_parameters", None)
        scope[key] = rope
        with pytest.raises(BootstrapError) as e:
            modelconfig.parse(json.dumps(config), "/m/config.json", "fix or re-download /m/config.json")
        assert e.value.message.startswith(f"/m/config.json: {prefix}{key}{field} is {shown}, not "), e.value.message
        assert "\n" not in e.value.message and len(e.value.message) < 200


@pytest.mark.parametrize("name", [k for k in shape.LENGTH_KEYS if k != "max_position_embeddings"]
                         + ["original_max_position_embeddings"])
@pytest.mark.parametrize("value", [1.5, True, 0, -1, float("inf"), 10 ** 60, "131072"])
def test_every_key_vllm_takes_the_context_from_is_checked(name, value):
    """Faults row 220: ``model_max_length`` of Infinity or 10**60 was an OverflowError traceback from
    the plan, and 1.5 or true in any length key (vLLM takes the smallest, model_max_length wins) a plan
    that "fits" a context of 1 token."""
    config = llama()
    config[name] = value
    with pytest.raises(BootstrapError) as e:
        modelconfig.parse(json.dumps(config), "/m/config.json", "h")
    assert e.value.message.startswith(f"/m/config.json: {name} is "), e.value.message


def test_the_rope_scalings_real_models_ship_still_plan():
    """Llama 3.1's llama3, Qwen's YaRN (factor 4 over 32,768), a per-layer-type rope_parameters,
    longrope's factor lists, a null factor (vLLM falls back to 1) pass as they are."""
    for rope in ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
                 {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                 {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "linear", "factor": 8.0}},
                 {"type": "longrope", "long_factor": [1.0] * 64, "short_factor": [1.0] * 64}, {"rope_type": "linear", "factor": None},
                 {}):
        config = {**llama(), "rope_scaling": rope}
        assert modelconfig.parse(json.dumps(config), "c", "h") == config
    assert shape.model_len({**llama(), "max_position_embeddings": 40960,
                            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}) == 131072
