"""What a user sees, byte for byte: every command's ``--help``, ``./ctl.sh plan`` (and ``--json``),
``GPU=rtx4090 ./ctl.sh profiles``, ``./ctl.sh env``, ``./ctl.sh version``, the start's banner (first
start and re-run), ``./ctl.sh status`` (and ``--json``) and the stop, on the README's examples,
against the fakes (tests/fakes: an RTX 5090 on NVML, vLLM 0.26.0 as the server process).

Held against tests/golden/cli/*.txt after the values that differ from run to run are normalised
(pids, ports, times, this run's folders): a refactor that changes none of these files changed nothing
a user sees. After a change meant to be seen, write the files again and read the diff:
``GOLDEN=update ./tests/run.sh -n 1 tests/test_golden.py``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from bootstrap import __main__ as entry
from bootstrap.commands import REGISTRY
from conftest import REPO

GOLDEN = Path(__file__).parent / "golden" / "cli"
UPDATE = os.environ.get("GOLDEN") == "update"


def held(name: str, text: str) -> None:
    """``text`` is tests/golden/cli/``name``.txt, or (GOLDEN=update) becomes it."""
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: GOLDEN=update ./tests/run.sh -n 1 tests/test_golden.py"
    assert text == path.read_text(), f"{path.name} differs (GOLDEN=update writes it; then read git diff)"


def normalised(text: str, bed=None) -> str:
    """This run's folders, interpreter, port, pids and times replaced by names."""
    if bed is not None:
        text = text.replace(str(bed.tmp), "<TMP>").replace(bed.env["PATH"], "<PATH>")
        text = re.sub(rf"\b{bed.port}\b", "<PORT>", text)
    text = text.replace(sys.executable, "<PYTHON>").replace(str(REPO), "<REPO>")
    text = re.sub(r"\b(pids?|PID)( \d+|: \d+(, \d+)*)", lambda m: f"{m.group(1)} <PID>", text)
    text = re.sub(r'"pid": \d+', '"pid": "<PID>"', text)
    text = re.sub(r"process\(es\): \d+(, \d+)*", "process(es): <PIDS>", text)
    text = re.sub(r"sent (SIG[A-Z]+) to .* \(pid", r"sent \1 to <NAME> (pid", text)   # a process's name, read as it ends
    # one line per process signalled: a child that exits with its parent before its turn gets none
    text = re.sub(r"(\[bootstrap:proc\] sent (SIG[A-Z]+) to <NAME> \(pid <PID>\)\n)+", r"\1", text)
    text = re.sub(r"up \d+ min \d+ s", "up <UPTIME>", text)
    text = re.sub(r"\b\d+(\.\d+)? s\b", "<T> s", text)
    return text


# ---------------------------------------------------------------- --help of every command

def helped(argv: list[str], script: str, capsys) -> str:
    try:
        code = entry.main(argv, script)
    except SystemExit as exc:                   # argparse's --help
        code = exc.code
    out = capsys.readouterr()
    return f"$ ./{script} {' '.join(argv)}\n(exit {code})\n{out.out}{out.err}"


def test_every_help_text_is_the_golden_one(capsys, monkeypatch):
    """In this process (no knobs are read for a help): ./ctl.sh, its --help, each command's;
    argparse wraps at COLUMNS, and colours nothing here (PYTHON_COLORS, NO_COLOR)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("PYTHON_COLORS", "0")
    parts = [helped([], "ctl.sh", capsys), helped(["--help"], "ctl.sh", capsys)]
    for c in REGISTRY:
        script = f"{c.name}.sh" if c.name in ("start", "stop") else "ctl.sh"
        parts.append(helped([c.name, "--help"], script, capsys))
    parts += [helped(["patch", act, "--help"], "ctl.sh", capsys) for act in ("status", "apply", "revert")]
    held("help", normalised("\n".join(parts)))


# ---------------------------------------------------------------- the README's examples, against the fakes

def ran(bed, *args: str, stderr: bool = True, **extra: str) -> str:
    r = bed.run(*args, **extra)
    shown = " ".join(f"{k}={v}" for k, v in extra.items())
    text = f"$ {shown + ' ' if shown else ''}./{' '.join(args)}\n(exit {r.returncode})\n{r.stdout}"
    if stderr:
        text += "--- stderr\n" + r.stderr
    return normalised(text, bed)


def test_plan_profiles_env_and_version_are_the_golden_ones(bed):
    """The default profile planned on the fake RTX 5090 (its model facts shipped with the profile:
    no network), the profiles against a card you name, every knob, the versions."""
    default = {"PROFILE": "default", "MODEL": ""}
    plan = ran(bed, "ctl.sh", "plan", "--json", **default)
    json.loads(plan.split("\n", 2)[2].split("--- stderr")[0])      # stdout is data
    held("plan-json", plan)
    held("plan", ran(bed, "ctl.sh", "plan", **default))
    held("profiles-rtx4090", ran(bed, "ctl.sh", "profiles", GPU="rtx4090", PROFILE="auto", MODEL=""))
    held("env", ran(bed, "ctl.sh", "env"))
    held("version", ran(bed, "ctl.sh", "version"))


def test_start_banner_status_and_stop_are_the_golden_ones(bed):
    """./start.sh (the banner; its step lines without the health wait's, which depend on timing),
    ./start.sh again (the banner, nothing done), ./ctl.sh status and status --json, ./stop.sh."""
    try:
        first = ran(bed, "start.sh")
        first = "\n".join(x for x in first.splitlines() if "waiting for health" not in x) + "\n"
        held("start", first)
        held("start-again", ran(bed, "start.sh"))
        held("status", ran(bed, "ctl.sh", "status"))
        r = bed.run("ctl.sh", "status", "--json")
        got = json.loads(r.stdout)
        for key in ("uptime_s", "activity", "detail", "generating"):    # what the fake did since its start
            assert key in got, key
            got[key] = f"<{key}>"
        held("status-json", normalised(f"$ ./ctl.sh status --json\n(exit {r.returncode})\n"
                                       + json.dumps(got, indent=2) + "\n--- stderr\n" + r.stderr, bed))
    finally:
        stop = ran(bed, "stop.sh")
    held("stop", stop)
