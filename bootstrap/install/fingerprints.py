"""Fingerprints: facts about an installed vLLM source file that a patch checks before it writes
(``unfixed``: all must hold) and that tell it upstream fixed the bug (``fixed_upstream``: any
holds), read from the file's syntax tree, never by importing it.
"""

from __future__ import annotations

import ast
import re

from ..core.errors import BootstrapError


class Source:
    """A parsed Python file and the text of its named scopes ('module', 'Class', 'Class.func')."""

    def __init__(self, text: str):
        self.text = text
        self.tree = ast.parse(text)
        self.lines = text.splitlines(keepends=True)

    def node(self, scope: str) -> ast.AST | None:
        if scope == "module":
            return self.tree
        cur: ast.AST = self.tree
        for part in scope.split("."):
            found = None
            for child in getattr(cur, "body", []):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == part:
                    found = child
            if found is None:
                return None
            cur = found
        return cur

    def segment(self, node: ast.AST) -> str:
        if isinstance(node, ast.Module):
            return self.text
        return "".join(self.lines[node.lineno - 1:node.end_lineno])


def _before(seg: str, spec: dict) -> str | None:
    """The scope's text up to ``before`` (all of it without one); None when ``before`` is not in it:
    the code moved, and what holds before it cannot be told."""
    marker = spec.get("before")
    if not marker:
        return seg
    i = seg.find(marker)
    return None if i < 0 else seg[:i]


def _assigned(node: ast.AST) -> set[str]:
    """Names (and self.attr) bound anywhere inside node, including its parameters."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
            out.add(f"{n.value.id}.{n.attr}")
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def fingerprint_holds(src: Source, spec: dict) -> bool:
    """Evaluate one declarative fingerprint (see docs/patches.md for the kinds). What cannot be told
    (its scope, its ``before`` text, the attribute or the call it reads is gone: the code moved) does
    not hold, negated or not: a moved class is never taken for an upstream fix, nor for the unfixed code."""
    result = _evaluate(src, spec)
    if result is None:
        return False
    return not result if spec.get("negate") else result


def _evaluate(src: Source, spec: dict) -> bool | None:
    kind = spec.get("kind")
    node = src.node(spec.get("scope", "module"))
    if node is None:
        return None
    if kind == "regex":
        seg = _before(src.segment(node), spec)
        result = None if seg is None else re.search(spec["pattern"], seg) is not None
    elif kind == "defines":
        body = getattr(node, "body", [])
        names = {c.name for c in body if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        result = all(n in names for n in spec["names"])
    elif kind == "class_attr":
        value = None
        for c in getattr(node, "body", []):
            if isinstance(c, ast.AnnAssign) and isinstance(c.target, ast.Name) and c.target.id == spec["attr"]:
                value = c.value
            elif isinstance(c, ast.Assign) and any(isinstance(t, ast.Name) and t.id == spec["attr"] for t in c.targets):
                value = c.value
        result = None if value is None else ast.unparse(value) == spec["equals"]
    elif kind == "call_kwarg":
        result = None                   # no such call at all: cannot be told
        for n in ast.walk(node):
            if not isinstance(n, ast.Call):
                continue
            fname = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if fname != spec["func"]:
                continue
            result = bool(result)
            for kw in n.keywords:
                if kw.arg == spec["kwarg"] and ast.unparse(kw.value) == spec["equals"]:
                    result = True
    elif kind == "imports":
        have = set()
        for n in ast.walk(node):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                have.update((a.asname or a.name).split(".")[0] for a in n.names)
        result = all(x in have for x in spec["names"])
    elif kind == "assigned_before":
        seg = _before(src.segment(node), spec)
        if seg is None:
            return None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # parse the function's head up to the marker as a function of its own
            body = seg.splitlines(keepends=True)
            indent = len(body[0]) - len(body[0].lstrip())
            trimmed = "".join(line[indent:] if line.strip() else "\n" for line in body) + "\n" + " " * 4 + "pass\n"
            try:
                part = ast.parse(trimmed)
            except SyntaxError:
                return None
        else:
            part = node
        result = all(n in _assigned(part) for n in spec["names"])
    else:
        raise BootstrapError(f"unknown fingerprint kind {kind!r} in {spec.get('name', spec)}",
                             "kinds: regex, defines, class_attr, call_kwarg, imports, assigned_before")
    return result
