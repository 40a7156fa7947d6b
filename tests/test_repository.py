"""Promises about the repository itself: no import cycle inside ``mixstack``, the table
lookup below the sweep that fills it, and documents that describe the software and
cite only what ships with it."""

from __future__ import annotations

import ast
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "mixstack")


def _modules() -> dict[str, str]:
    """Dotted module name -> path, for every module of the package."""
    mods = {}
    for dirpath, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[dotted.removesuffix(".__init__")] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at module level or inside functions).
    The package face ``mixstack`` only hands names on and is left out."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        base = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    prefix = ".".join(parts[: len(parts) - node.level + 1])
                    prefix += "." + node.module if node.module else ""
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != m and "mixstack" not in (t, m):
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("low, high", [
    ("mixstack.tuning", "mixstack.tuner"),          # the lookup every call makes, below the sweep
    ("mixstack.tuning", "mixstack.ops.stack"),      # ... and below the operators that read it
    ("mixstack.ops.stack", "mixstack.functional"),
    ("mixstack.kernels.gemm", "mixstack.ops.launchers"),
    ("mixstack.functional", "mixstack.bench.runner"),
    ("mixstack.bench.runner", "mixstack.tuner"),
    ("mixstack.potential.model", "mixstack.cli"),
    ("mixstack.potential.neighbors", "mixstack.lammps.domain"),   # the potential knows nothing of LAMMPS
])
def test_lower_floors_never_reach_higher_ones(low, high):
    graph = import_graph()
    assert high not in reachable(graph, low)


def test_cli_modules_import_no_private_names_from_each_other():
    for path in sorted(_modules().values()):
        if os.sep + "cli" + os.sep not in path:
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path} imports {private}"


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.split() if os.path.isfile(os.path.join(ROOT, f))]


# Work periods, budgets and issue numbers belong to the changelog's history, not to files
# that describe the software; documents outside the repo are not cited.
# (The words are spelled in pieces so that this file does not match its own patterns.)
_PERIOD = "ses" + "sion"
DIARY = re.compile(r"\b" + _PERIOD + r"s?\b|\bdevice[- ]time budget|\bissue #?\d+", re.I)
PYTEST_SCOPE = re.compile(r"scope\s*=\s*['\"]" + _PERIOD + "|" + _PERIOD + "start|" + _PERIOD + "finish")
OUTSIDE = re.compile("SP" + r"EC §|\.\./shared|upstream-" + "lessons|h200-" + "measurements")


def test_no_file_speaks_of_work_periods_or_cites_documents_outside_the_repo():
    found = []
    for f in _tracked_files():
        if f == "CHANGELOG.md" or f.endswith((".png", ".tgz", ".pt2")):
            continue
        try:
            text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if (DIARY.search(line) and not PYTEST_SCOPE.search(line)) or OUTSIDE.search(line):
                found.append(f"{f}:{i}: {line.strip()[:80]}")
    assert not found, "\n".join(found[:20])
