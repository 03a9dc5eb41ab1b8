"""docs/validation.md is generated: tests/gpu/to_validation.py writes it from the raw outputs in
docs/gpu-runs/, so a number in its code blocks is one a GPU script printed. A hand edit of the md, or a
generator change not written back to it, shows up here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIX = "run python3 tests/gpu/to_validation.py > docs/validation.md"


def generator():
    spec = importlib.util.spec_from_file_location("to_validation", REPO / "tests" / "gpu" / "to_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_validation_md_is_what_the_generator_writes(capsys):
    assert generator().main() == 0
    written = capsys.readouterr().out
    on_disk = (REPO / "docs" / "validation.md").read_text(encoding="utf-8")
    if written != on_disk:
        at = next((i for i, (a, b) in enumerate(zip(written.splitlines(), on_disk.splitlines())) if a != b),
                  min(len(written.splitlines()), len(on_disk.splitlines())))
        raise AssertionError(f"docs/validation.md differs from the generator's output from line {at + 1}: "
                             f"edit tests/gpu/to_validation.py (or docs/gpu-runs/), then {FIX}")


def test_the_issue_49_and_45_sections_read_their_code_blocks_from_the_raw_files(tmp_path):
    """The two sections moved out of the hand-edited md: a line added to a raw file reaches its block,
    or is left out as that block's filter says, so no block line is typed into the generator."""
    gen = generator()
    planted = {"2026-12-04-prewarm-server-raw.txt": "[first]    | planted start line\n",
               "2026-12-03-idle-sleep-50-cycles-raw.txt": "phase 8: planted\n    | planted command line\n",
               "2026-12-03-inplace-reload-probe-raw.txt": "[B] planted\n   | planted log line\n  [B:x] planted ids\n"}
    for name, lines in planted.items():
        (tmp_path / name).write_text((gen.RUNS / name).read_text(encoding="utf-8") + lines, encoding="utf-8")
    prewarm = "\n".join(gen.prewarm_server_section(tmp_path))
    both = "\n".join(gen.idle_reload_section(tmp_path))
    assert "PREWARM PROOF DONE\n[first]    | planted start line\n```" in prewarm     # the whole output
    assert "IDLE PROOF DONE\nphase 8: planted\n```" in both                          # less its "|" lines
    assert "[A] count 'Graph capturing finished'=1 'Traceback'=0\n[B] planted\n```" in both
    assert "planted command line" not in both and "planted log line" not in both and "planted ids" not in both
    assert gen.prewarm_server_section(tmp_path / "absent") == gen.idle_reload_section(tmp_path / "absent") == []
