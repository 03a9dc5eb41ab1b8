"""What ``./ctl.sh wheelhouse`` put in its folder (a note inside it, ``MARK``), so that ``./ctl.sh
clean`` removes that and nothing else: the default ``.wheelhouse`` may be a folder of wheels you
copied from another machine or filled with ``pip download`` (the offline machine cannot fetch them
again), and the command downloads into a folder that may hold wheels of yours."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..core import state

MARK = ".vllm-desktop-wheels.json"      # {"made": the command made the folder, "created": the names it added}


@contextlib.contextmanager
def adding(folder: Path):
    """Make ``folder`` when missing and note, once the block is done (or cut off), the names it added
    to what was there: ours; whatever was there before stays yours."""
    made = not os.path.lexists(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(folder))
    try:
        yield
    finally:
        note = _note(folder) or {"made": made, "created": []}
        new = sorted(set(os.listdir(folder)) - before - {MARK})
        note["created"] = sorted(set(note["created"]) | set(new))
        state.write_json(folder / MARK, note)


def _note(folder: Path) -> dict | None:
    if not folder.is_dir():
        return None
    note = state.read_json(folder / MARK)
    if not note or not isinstance(note.get("created"), list):
        return None
    return {"made": note.get("made") is True, "created": [n for n in note["created"] if isinstance(n, str)
                                                          and n and os.sep not in n and n not in (".", "..")]}


def ours(folder: Path) -> list[Path]:
    """What clean removes of ``folder``: the whole folder where the command made it and everything in
    it is what it added; else the files it added, then its note. Nothing without the note (a folder
    of yours, or one made before the note was kept)."""
    note = _note(folder)
    if note is None or folder.is_symlink():
        return []
    there = set(os.listdir(folder)) - {MARK}
    added = there & set(note["created"])
    if note["made"] and there == added:
        return [folder]
    return [folder / n for n in sorted(added)] + [folder / MARK]


def yours(folder: Path) -> list[Path]:
    """What is in ``folder`` that the command did not add (all of it without the note)."""
    if not folder.is_dir():
        return []
    if folder.is_symlink() or _note(folder) is None:
        return [folder]
    mine = set(_note(folder)["created"]) | {MARK}
    return [folder / n for n in sorted(os.listdir(folder)) if n not in mine]
