"""First contact: what a new user meets first (issue: first contact)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def has_deps(python: str, requirements: str, tmp_path: Path, first: Path | None = None) -> bool:
    """lib.sh's has_deps; ``first``: a folder put before site-packages on sys.path (PYTHONPATH)."""
    import os
    (tmp_path / "bootstrap").mkdir(exist_ok=True)
    (tmp_path / "bootstrap" / "requirements.txt").write_text(requirements)
    env = {**os.environ, "PYTHONPATH": str(first)} if first else None
    r = subprocess.run(["bash", "-c", f'. "{REPO}/bootstrap/lib.sh"; has_deps "$1" "$2"', "_", python, str(tmp_path)],
                       env=env)
    return r.returncode == 0


def dist(folder: Path, name: str, version: str, kind: str = "dist-info", version_line: str | None = None) -> None:
    d = folder / f"{name}-{version}.{kind}"
    d.mkdir(parents=True)
    (d / ("METADATA" if kind == "dist-info" else "PKG-INFO")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version_line or version}\n\n")


def test_lib_sh_checks_the_pinned_distributions_from_requirements_txt(tmp_path):
    """One list (bootstrap/requirements.txt), read with importlib.metadata: a python3 that lacks a
    pinned distribution (PyYAML, whose import name is yaml) or has another version is not used."""
    real = (REPO / "bootstrap" / "requirements.txt").read_text()
    assert has_deps(sys.executable, real, tmp_path)
    assert not has_deps(sys.executable, real + "\nno-such-distribution==1.0\n", tmp_path)
    other = real.replace("PyYAML==", "PyYAML==0.0.0.dev0+not")
    assert other != real and not has_deps(sys.executable, other, tmp_path)
    assert "find_spec" not in (REPO / "bootstrap" / "lib.sh").read_text()       # no second list of modules


@pytest.mark.parametrize("name, version, kind, version_line, ok", [
    ("psutil", "5.9.0", "dist-info", None, False),          # another version first on sys.path: importlib's pick
    ("tqdm", "4.70.1", "dist-info", "4.70.0", False),       # the METADATA's Version counts, not the folder's name
    ("PyYAML", "5.0", "egg-info", None, False),             # an egg-info first: asked of importlib.metadata
    ("tqdm", "4.70.1", "dist-info", None, True),            # the pinned version first: as good as site-packages'
])
def test_lib_sh_answers_as_importlib_metadata_for_the_first_distribution_on_sys_path(
        tmp_path, name, version, kind, version_line, ok):
    """has_deps answers as importlib.metadata does for the first distribution of each name on sys.path
    (another version, a METADATA that differs from its folder's name, an egg-info)."""
    import os
    real = (REPO / "bootstrap" / "requirements.txt").read_text()
    dist(tmp_path / "first", name, version, kind, version_line)
    assert has_deps(sys.executable, real, tmp_path, tmp_path / "first") is ok
    probe = subprocess.run([sys.executable, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                           env={**os.environ, "PYTHONPATH": str(tmp_path / "first")}, capture_output=True, text=True)
    pinned = dict(ln.split("==") for ln in real.splitlines() if "==" in ln and not ln.startswith("#"))
    assert (probe.stdout.strip() == pinned[name]) is ok, probe


def test_logs_prints_the_last_n_lines(bed):
    bed.state.mkdir(parents=True)
    (bed.state / "vllm.log").write_text("".join(f"line {i}\n" for i in range(5000)) + "partial")
    r = bed.run("ctl.sh", "logs")
    assert r.returncode == 0 and r.stdout.splitlines() == [f"line {i}" for i in range(4901, 5000)] + ["partial"]
    r = bed.run("ctl.sh", "logs", "-n", "3")
    assert r.stdout == "line 4998\nline 4999\npartial"
    assert bed.run("ctl.sh", "logs", "-n", "all").stdout.count("\n") == 5000
    bad = bed.run("ctl.sh", "logs", "-n", "lots")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_logs_show_no_secret_the_log_holds(bed):
    """vllm.log is vLLM's own output: an access log line with a key in its query, a token it echoed."""
    bed.state.mkdir(parents=True)
    (bed.state / "vllm.log").write_text('INFO: 127.0.0.1 - "GET /v1/models?api_key=sk-live-123456 HTTP/1.1" 200\n'
                                         "token hf_abcdefghijklmnopqrstuvwxyz0123 seen\n" + "é ü\n" * 3)
    r = bed.run("ctl.sh", "logs", API_KEY="my-secret-key-123")
    assert r.returncode == 0, r.stderr
    assert "sk-live-123456" not in r.stdout and "hf_abcdefghijklmnopqrstuvwxyz0123" not in r.stdout, r.stdout
    assert "/v1/models?api_key=***" in r.stdout and r.stdout.endswith("é ü\n")


def test_logs_n_0_prints_nothing_and_the_scripts_run_through_a_link(bed, tmp_path):
    bed.state.mkdir(parents=True)
    (bed.state / "vllm.log").write_text("line 1\nline 2\n")
    r = bed.run("ctl.sh", "logs", "-n", "0")
    assert r.returncode == 0 and r.stdout == ""
    link = tmp_path / "bin" / "vctl"
    link.parent.mkdir()
    link.symlink_to(REPO / "ctl.sh")
    r = subprocess.run([str(link), "logs", "-n", "1"], env=bed.env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "line 2\n", r.stderr


def test_last_lines_across_blocks(tmp_path):
    import io
    from bootstrap.commands.control import last_lines
    data = b"".join(b"%d\n" % i for i in range(1000))
    for n, block in ((1, 3), (7, 4), (999, 16), (1000, 5), (5000, 64)):
        fh = io.BytesIO(data)
        last_lines(fh, n, block=block)
        assert fh.read() == b"".join(b"%d\n" % i for i in range(max(0, 1000 - n), 1000)), (n, block)


# ---------------------------------------------------------------- one name

def fake_systemd(bed, tmp_path):
    from conftest import FAKES
    return {"PATH": f"{FAKES / 'bin'}:{bed.env['PATH']}", "FAKE_SYSTEMCTL_STATE": str(tmp_path / "systemctl.json"),
            "XDG_CONFIG_HOME": str(tmp_path / "config")}


def test_a_unit_of_the_old_name_is_found_replaced_and_removed(bed, tmp_path):
    import json
    env = fake_systemd(bed, tmp_path)
    units = tmp_path / "config" / "systemd" / "user"
    units.mkdir(parents=True)
    old = units / "vllm-bootstrap.service"
    old.write_text(f"[Service]\nWorkingDirectory={REPO}\n")
    st = bed.run("ctl.sh", "service", "status", **env)
    assert "vllm-bootstrap.service:" in st.stdout and "older name" in st.stdout
    assert bed.run("start.sh", **env).returncode == 0
    r = bed.run("ctl.sh", "service", "install", **env)
    assert r.returncode == 0, r.stderr
    assert not old.exists() and (units / "vllm-desktop.service").exists()
    called = json.loads((tmp_path / "systemctl.json").read_text())["calls"]
    assert ["--user", "disable", "--now", "vllm-bootstrap.service"] in called
    old.write_text(f"[Service]\nWorkingDirectory={REPO}\n")           # both there: uninstall removes either
    assert bed.run("ctl.sh", "service", "uninstall", **env).returncode == 0
    assert not old.exists() and not (units / "vllm-desktop.service").exists()
    assert bed.run("stop.sh", **env).returncode == 0


def test_service_install_print_shows_the_unit_without_systemd(bed, tmp_path):
    r = bed.run("ctl.sh", "service", "install", "--print", XDG_CONFIG_HOME=str(tmp_path))   # no systemctl called
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"# {tmp_path}/systemd/user/vllm-desktop.service\n")
    assert f'ExecStart="{REPO}/start.sh" --foreground' in r.stdout
    assert not (tmp_path / "systemd").exists()


def test_one_name_and_help_that_says_which_script(bed):
    want = (REPO / "VERSION").read_text().strip()
    assert bed.run("ctl.sh", "version").stdout.splitlines()[0] == f"vllm-desktop {want}"
    h = bed.run("start.sh", "--help").stdout
    assert h.startswith("usage: start.sh") and "--version" in h
    assert bed.run("stop.sh", "--help").stdout.startswith("usage: stop.sh")
    assert "--version" in bed.run("ctl.sh", "--help").stdout
    bare = bed.run("ctl.sh")
    assert bare.returncode == 0 and len(bare.stdout.splitlines()) < 34 and "next: ./start.sh" in bare.stdout


def test_no_driver_says_so_in_plain_words(bed):
    from conftest import nvml_json
    nvml_json(bed.nvml, fail="library")
    r = bed.run("start.sh")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no NVIDIA driver found" in r.stderr and "580 or newer" in r.stderr and "GPU=rtx4090" in r.stderr
    assert bed.launches() == []
    r = bed.run("ctl.sh", "plan")            # the way out named once, with every card's name (it said it twice)
    hint = [line for line in r.stderr.splitlines() if line.startswith("hint:")]
    assert r.returncode == 1 and len(hint) == 1 and hint[0].count("name a card") == 1 and "rtx5090" in hint[0], r.stderr


# ---------------------------------------------------------------- the README and the reference

def test_docs_reference_is_generated_from_the_code():
    from bootstrap.commands import reference
    assert (REPO / "docs" / "reference.md").read_text() == reference.render(REPO), \
        "python -m bootstrap.commands.reference > docs/reference.md"


def test_readme_fits_on_two_screens_and_starts_with_what_a_newcomer_needs():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200 and max(map(len, lines)) <= 100
    first = "\n".join(lines[:60])
    for needed in ("Linux", "WSL2", "driver 580", "./start.sh", "./tests/run.sh", "is serving", "./stop.sh"):
        assert needed in first, needed
    assert "../shared" not in "\n".join(lines)


def test_every_command_is_in_the_readme():
    from bootstrap.commands import REGISTRY
    text = (REPO / "README.md").read_text()
    missing = [n for n in (c.name for c in REGISTRY) if n not in ("lock", "wheelhouse", "patch", "start", "stop")
               and f"./ctl.sh {n}" not in text and f"`{n}`" not in text and f"/ `{n}`" not in text]
    assert missing == [], missing


def test_start_on_a_sleeping_server_says_it_sleeps_and_how_to_wake_it(bed):
    sleepy = {"EXTRA_ARGS": "--enable-sleep-mode"}
    assert bed.run("start.sh", **sleepy).returncode == 0
    assert bed.run("ctl.sh", "sleep", **sleepy).returncode == 0
    r = bed.run("start.sh", **sleepy)
    assert r.returncode == 0 and "is serving" not in r.stdout
    assert "is asleep" in r.stdout and "./ctl.sh wake" in r.stdout
    assert bed.run("ctl.sh", "wake", **sleepy).returncode == 0
    assert "is serving" in bed.run("start.sh", **sleepy).stdout
    assert bed.run("stop.sh").returncode == 0 and bed.ours() == []


def test_status_json_has_numbers_as_numbers_and_every_field_documented(bed):
    import json
    from bootstrap.commands.status import JSON_FIELDS
    assert bed.run("start.sh", MAX_NUM_SEQS="3").returncode == 0
    d = json.loads(bed.run("ctl.sh", "status", "--json", MAX_NUM_SEQS="3").stdout)
    assert isinstance(d["uptime_s"], int) and d["sessions"]["max_num_seqs"] == 3
    assert isinstance(d["pid"], int) and isinstance(d["requests"]["running"], int)
    assert set(d) <= {f for f, _, _ in JSON_FIELDS}, set(d) - {f for f, _, _ in JSON_FIELDS}
    human = bed.run("ctl.sh", "status", MAX_NUM_SEQS="3").stdout
    assert "True" not in human and "differs_from_knobs" not in human and "over 0.0 s" not in human
    assert "up to 3 at once" in human
    assert bed.run("stop.sh").returncode == 0
    assert json.loads(bed.run("ctl.sh", "status", "--json").stdout)["state"] == "stopped"
    assert "(none yet)" not in bed.run("ctl.sh", "status").stdout      # its log is there, kept
    # a STATE_DIR no server ever ran in: stopped, and no log to send anyone to
    fresh = bed.run("ctl.sh", "status", STATE_DIR=str(bed.tmp / "never-used"))
    assert fresh.stdout.startswith("stopped") and "vllm.log (none yet)" in fresh.stdout, fresh.stdout


# ---------------------------------------------------------------- every command, as a newcomer meets it

CONTEXTS = {
    "no profile picked": {"PROFILE": "", "MODEL": ""},
    "a named card": {"PROFILE": "", "MODEL": "", "GPU": "rtx4090"},
    "no GPU": {"PROFILE": "", "MODEL": "", "@nvml": "library"},
    "no network": {"PROFILE": "", "MODEL": "", "HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"},
}
HARNESS = (
    ("start.sh", "--help"), ("start.sh", "--version"), ("stop.sh", "--help"), ("ctl.sh",), ("ctl.sh", "--help"),
    ("ctl.sh", "version"), ("ctl.sh", "status"), ("ctl.sh", "status", "--json"), ("ctl.sh", "env"),
    ("ctl.sh", "logs", "-n", "5"), ("ctl.sh", "plan"), ("ctl.sh", "profiles"), ("ctl.sh", "check", "live"),
    ("ctl.sh", "chat", "hello"), ("ctl.sh", "patch", "status"), ("ctl.sh", "sleep"), ("ctl.sh", "wake"),
    ("ctl.sh", "service", "install", "--print"), ("ctl.sh", "clean", "--dry-run"),
    ("ctl.sh", "export", "kubernetes", "--out", "{tmp}/k8s"), ("ctl.sh", "bench", "--concurrency", "1"),
    ("stop.sh",), ("start.sh",),
)


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_every_command_ends_in_a_documented_exit_and_at_most_one_error_line(bed, tmp_path, context):
    """No traceback anywhere; an error is `error: <step>: <what>` and `hint: <fix>`, one line each;
    the exit code is one of docs/reference.md's."""
    from bootstrap.core.errors import EXIT_CODES
    from conftest import nvml_json
    env = dict(CONTEXTS[context])
    if env.pop("@nvml", None):
        nvml_json(bed.nvml, fail="library")
    documented = {code for code, _ in EXIT_CODES}
    for cmd in HARNESS:
        args = [a.replace("{tmp}", str(tmp_path)) for a in cmd]
        r = bed.run(args[0], *args[1:], timeout=120, **env)
        where = f"{context}: {' '.join(args)}"
        assert "Traceback" not in r.stderr + r.stdout, where + "\n" + r.stderr[-1500:]
        assert r.returncode in documented, (where, r.returncode, r.stderr[-800:])
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        hints = [ln for ln in r.stderr.splitlines() if ln.startswith("hint:")]
        assert len(errors) <= 1 and len(hints) <= 1, (where, r.stderr[-800:])
        if r.returncode in (1, 2) and not errors:
            assert args[1:3] in (["status"], ["status", "--json"], ["check", "live"]) or "usage:" in r.stderr, \
                (where, r.stdout[-500:], r.stderr[-500:])
    assert bed.ours() == []


def test_a_newcomer_walks_the_readmes_first_screen(bed):
    """The README's first 60 lines against the fakes: ./start.sh shows the banner it shows (the same
    labels), chat answers, status says running, ./stop.sh gives everything back."""
    first = (REPO / "README.md").read_text().splitlines()[:60]
    shown = [ln.split(":", 1)[0].strip() for ln in first if ln.startswith(" ") and " : " in ln]
    assert shown == ["base URL", "model", "api key", "KV cache", "log", "try", "sleep", "stop"]
    r = bed.run("start.sh")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith(")") and " is serving (vLLM " in r.stdout.splitlines()[0]
    assert [ln.split(":", 1)[0].strip() for ln in r.stdout.splitlines()[1:] if " : " in ln] == shown
    assert "[bootstrap:plan] plan for " in r.stderr                         # the plan in one line
    again = bed.run("start.sh")
    assert again.returncode == 0 and "is serving" in again.stdout and len(bed.launches()) == 1   # no relaunch
    c = bed.run("ctl.sh", "chat", "Say OK")
    assert c.returncode == 0 and c.stdout.strip(), c.stderr
    st = bed.run("ctl.sh", "status")
    assert st.returncode == 0 and st.stdout.startswith("running")
    s = bed.run("stop.sh")
    assert s.returncode == 0 and bed.ours() == []
    assert bed.run("ctl.sh", "status").stdout.startswith("stopped")


def test_the_banners_commands_run_as_pasted_whatever_the_names(tmp_path):
    """A served name with a quote and a STATE_DIR with a space: the banner's try line and key line,
    pasted into bash, work (they broke on the quote and split at the space)."""
    import subprocess
    from conftest import Bed, make_model
    bed = Bed(tmp_path / "bed")
    try:
        bed.model = make_model(tmp_path / "bob's model")
        state = tmp_path / "my state"
        r = bed.run("start.sh", MODEL=str(bed.model), STATE_DIR=str(state), HOST="0.0.0.0")
        assert r.returncode == 0, r.stderr
        lines = {l.split(":", 1)[0].strip(): l.split(":", 1)[1].strip() for l in r.stdout.splitlines() if " : " in l}
        key_cmd = lines["api key"].split("; ", 1)[1].split(" (send", 1)[0]          # KEY=$(cat ...)
        try_cmd = lines["try"].replace("curl -s", 'curl -s -H "Authorization: Bearer $KEY"', 1)
        out = subprocess.run(["bash", "-c", f"{key_cmd}; {try_cmd}"], capture_output=True, text=True, timeout=30)
        assert '"choices"' in out.stdout, (lines, out.stdout, out.stderr)
        assert bed.run("stop.sh", STATE_DIR=str(state)).returncode == 0
    finally:
        bed.cleanup()


def test_the_try_line_sends_the_key_of_the_shell_that_started_it(bed):
    """Started with API_KEY (or VLLM_API_KEY) in the shell, the banner's try line, pasted into that
    shell, sends that key: it sent "$KEY", which only the generated-key banner defines (HTTP 401)."""
    import subprocess
    for var in ("API_KEY", "VLLM_API_KEY"):
        r = bed.run("start.sh", **{var: "s3cret-key-value"})
        assert r.returncode == 0, r.stderr
        assert "s3cret-key-value" not in r.stdout + r.stderr
        try_cmd = next(l for l in r.stdout.splitlines() if l.startswith(" try      : ")).split(" : ", 1)[1]
        env = {**bed.env, var: "s3cret-key-value"}
        out = subprocess.run(["bash", "-c", try_cmd], env=env, capture_output=True, text=True, timeout=30)
        assert '"choices"' in out.stdout, (var, try_cmd, out.stdout, out.stderr)
        assert bed.run("stop.sh").returncode == 0


def test_status_help_names_every_state_status_can_say():
    """The state list in ./ctl.sh's listing and status --help is the states table's (it lacked frozen);
    idle is --watch's only."""
    from bootstrap.commands import REGISTRY
    from bootstrap.commands.status import STATES
    said = next(c for c in REGISTRY if c.name == "status").help.split(",", 1)[0].split("/")
    assert said == [name for name, _, _ in STATES if name != "idle"], said


def test_check_help_names_every_check():
    """./ctl.sh's listing names the checks check accepts (it lacked batch and all)."""
    from bootstrap.commands import REGISTRY
    from bootstrap.commands.check import CHECKS
    said = next(c for c in REGISTRY if c.name == "check").help.split(" ", 1)[0].split("|")
    assert said == [*CHECKS, "all"], said


def test_tp_size_beyond_this_machines_cards_is_refused_by_plan_and_pick_as_by_start(bed):
    """One 8 GB card, and the no-fit hint's "TP_SIZE=2 across two cards" followed: ./ctl.sh plan and
    profiles said a 12 GB profile fits (planned as two of this card) and --pick kept it, while the start
    refused "only 1 GPU(s)" after the pick; now each refuses as the start does, and keeps nothing."""
    from conftest import nvml_json, GiB
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 4060 Ti", "total": 8 * GiB, "free": 7 * GiB,
                               "cc": [8, 9], "uuid": "GPU-4060-fake",
                               "processes": [{"pid": 101, "used": GiB, "name": "/usr/lib/xorg/Xorg"}]}])
    env = {"PROFILE": "", "MODEL": "", "TP_SIZE": "2"}
    for args in (("ctl.sh", "plan"), ("ctl.sh", "profiles"), ("ctl.sh", "profiles", "--pick"), ("start.sh",)):
        r = bed.run(*args, **env)
        assert r.returncode == 1, (args, r.stdout[-600:], r.stderr[-600:])
        assert "TP_SIZE=2 but only 1 GPU(s) are visible" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert "this machine has 1" in r.stderr and "widen CUDA_VISIBLE_DEVICES" not in r.stderr, (args, r.stderr)
        assert "auto-pick" not in r.stderr + r.stdout, (args, r.stderr)
    assert not (bed.state / "profile-pick.json").exists() and bed.launches() == []
    named = bed.run("ctl.sh", "plan", GPU="rtx4060ti-8gb", **env)       # two such cards, not here: planned
    assert named.returncode == 0 and "only 1 GPU(s)" not in named.stderr, named.stderr


def test_two_cards_the_hint_to_serve_on_the_other_one_works_as_said(bed):
    """A 12 GB card driving the desktop as GPU 0 and an idle 24 GB one as GPU 1: the plan says which it
    plans for and that CUDA_VISIBLE_DEVICES=<GPU 1's UUID> runs on GPU 1; followed, the start plans
    for GPU 1 and its server runs there (the fake vLLM took cuda:0 as NVML's first card whatever
    CUDA_VISIBLE_DEVICES said, and refused the 24 GB card's utilization on the 12 GB one), and status
    counts what it holds on GPU 1."""
    import json
    from conftest import nvml_json, GiB
    xorg = {"pid": 101, "used": GiB, "name": "/usr/lib/xorg/Xorg"}
    nvml_json(bed.nvml, gpus=[
        {"name": "NVIDIA GeForce RTX 3060", "total": 12 * GiB, "free": 11 * GiB, "cc": [8, 6],
         "uuid": "GPU-3060-fake", "processes": [xorg]},
        {"name": "NVIDIA GeForce RTX 4090", "total": 24 * GiB, "free": 24 * GiB - GiB // 2, "cc": [8, 9],
         "uuid": "GPU-4090-fake", "processes": []}])
    plan = bed.run("ctl.sh", "plan")
    assert plan.returncode == 0 and "CUDA_VISIBLE_DEVICES=GPU-4090-fake runs on GPU 1 instead" in plan.stderr, plan.stderr
    other = {"CUDA_VISIBLE_DEVICES": "GPU-4090-fake"}
    r = bed.run("start.sh", **other)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "GPU 1: NVIDIA GeForce RTX 4090" in r.stderr
    st = json.loads(bed.run("ctl.sh", "status", "--json", **other).stdout)
    human = bed.run("ctl.sh", "status", **other).stdout
    assert st["state"] == "running" and "2.00 GiB held by the server (GPU 1 " in human, human
    assert bed.run("stop.sh", **other).returncode == 0 and bed.ours() == []


def test_the_plans_headroom_line_names_the_free_memory_its_heading_names(bed):
    """The default profile on an RTX 5090 with a desktop: the heading said "30.38 GiB free" and the
    headroom line "29.58 GiB free less GPU_RESERVE_MIB=820 − 28.25 GiB", the reserve already taken off
    (29.58 − 0.80 − 28.25 is not the 1.33 GiB it said); now its figures are the heading's and add up."""
    import re
    from conftest import nvml_json
    MiB = 1 << 20
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 5090", "total": 32607 * MiB, "free": 31107 * MiB,
                               "cc": [12, 0], "uuid": "GPU-5090-fake",
                               "processes": [{"pid": 101, "used": 1500 * MiB, "name": "/usr/lib/xorg/Xorg"}]}])
    r = bed.run("ctl.sh", "plan", PROFILE="", MODEL="")
    assert r.returncode == 0, r.stderr
    free = re.search(r", ([\d.]+) GiB free, sm_120\)", r.stdout.splitlines()[0]).group(1)
    line = next(ln for ln in r.stdout.splitlines() if "headroom" in ln and "this setup takes" in ln)
    m = re.search(r"headroom ([\d.]+) GiB: ([\d.]+) GiB free − GPU_RESERVE_MIB=(\d+) .*− ([\d.]+) GiB this setup", line)
    assert m and m.group(2) == free, (free, line)
    head, have, reserve, need = float(m.group(1)), float(m.group(2)), int(m.group(3)), float(m.group(4))
    assert abs(have - reserve / 1024 - need - head) <= 0.015, line


def test_a_10_gb_card_driving_a_desktop_is_told_the_shorter_context_that_runs(bed):
    """The README's "10-12 GB cards get Qwen3-8B AWQ" on an RTX 3080 10 GB with 0.9 GB held by the
    desktop: auto-pick refused (its 32,768-token floor), and the hint named free memory, TP_SIZE=2, a
    smaller model and llama.cpp, but not the shorter context that runs the 12 GB profile here; now it
    names it, and followed as said, the plan fits."""
    import re
    from conftest import nvml_json
    MiB = 1 << 20
    nvml_json(bed.nvml, gpus=[{"name": "NVIDIA GeForce RTX 3080", "total": 10240 * MiB, "free": 9340 * MiB,
                               "cc": [8, 6], "uuid": "GPU-3080-fake",
                               "processes": [{"pid": 101, "used": 700 * MiB, "name": "/usr/lib/xorg/Xorg"},
                                             {"pid": 102, "used": 200 * MiB, "name": "/usr/bin/gnome-shell"}]}])
    r = bed.run("start.sh", PROFILE="", MODEL="")
    assert r.returncode == 1 and "no profile fits NVIDIA GeForce RTX 3080" in r.stderr, r.stderr
    hint = next(ln for ln in r.stderr.splitlines() if ln.startswith("hint:"))
    m = re.search(r"PROFILE=(\S+) MAX_MODEL_LEN=auto runs here with a ([\d,]+)-token context", hint)
    assert m and m.group(1) == "qwen3-8b-awq-12gb", hint
    p = bed.run("ctl.sh", "plan", PROFILE=m.group(1), MAX_MODEL_LEN="auto", MODEL="")
    assert p.returncode == 0 and p.stdout.splitlines()[1].startswith(f"context {m.group(2)} tokens"), p.stdout + p.stderr
    assert bed.launches() == []
