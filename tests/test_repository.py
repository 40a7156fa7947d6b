"""Promises about the repository itself: no import cycle inside ``mixstack``, the table
lookup below the sweep that fills it, and documents that describe the software and
cite only what ships with it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

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


ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")


def floor_table(path: str = ARCHITECTURE) -> dict[str, int]:
    """Room -> floor, read from the "Import floors" table of docs/architecture.md
    (``| 4 | `stack`, `conv` | ... |``): the document is the rule the imports are held to."""
    text = open(path, encoding="utf-8").read()
    section = text.split("## Import floors", 1)[1].split("\n## ", 1)[0]
    floors = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            for room in re.findall(r"`([\w.]+)`", m.group(2)):
                floors[room] = int(m.group(1))
    return floors


def room_of(module: str) -> str:
    """``mixstack.stack.ops`` -> ``stack``; a root module is its own room (``export``)."""
    return module.split(".")[1]


def floor_violations(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """Every import edge that leaves its room for a room not on a lower floor, and every module
    whose room the table does not name."""
    bad = [f"{m}: its room {room_of(m)!r} is not in the floor table" for m in graph
           if m != "mixstack" and room_of(m) not in floors]
    for m, targets in graph.items():
        if m == "mixstack" or room_of(m) not in floors:
            continue
        for t in sorted(targets):
            if room_of(t) != room_of(m) and floors.get(room_of(t), 99) >= floors[room_of(m)]:
                bad.append(f"{m} (floor {floors[room_of(m)]}) imports {t} "
                           f"(floor {floors.get(room_of(t), '?')})")
    return bad


def test_every_import_edge_keeps_to_the_floor_table():
    floors = floor_table()
    assert {"core", "kernels", "stack", "conv", "tuning", "tuner", "measure", "cli"} <= set(floors)
    assert floor_violations(import_graph(), floors) == []


def test_the_floor_check_finds_planted_upward_and_sideways_imports():
    floors = {"core": 1, "stack": 4, "conv": 4, "bench": 9}
    graph = {"mixstack.core.layout": {"mixstack.stack.ops"},          # up
             "mixstack.stack.ops": {"mixstack.conv.ops", "mixstack.core.layout"},   # sideways; down
             "mixstack.conv.ops": set(), "mixstack.bench.grid": {"mixstack.stack.ops"},
             "mixstack.stray": set()}
    bad = floor_violations(graph, floors)
    assert len(bad) == 3 and "stray" in bad[0]
    assert any("mixstack.core.layout (floor 1) imports mixstack.stack.ops" in b for b in bad)
    assert any("mixstack.stack.ops (floor 4) imports mixstack.conv.ops" in b for b in bad)


def test_the_floor_table_names_every_room_of_the_tree():
    rooms = {room_of(m) for m in _modules() if m != "mixstack"}
    assert rooms <= set(floor_table()), rooms - set(floor_table())


def test_the_import_graph_sees_imports_inside_functions(tmp_path, monkeypatch):
    pkg = tmp_path / "mixstack"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from ..b import y\n")
    (pkg / "b.py").write_text("y = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", str(pkg))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert import_graph()["mixstack.a.x"] == {"mixstack.b"}


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
