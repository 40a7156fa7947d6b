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
        if not os.path.relpath(path, PACKAGE).startswith("cli" + os.sep):     # not the checkout's own path
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


# ------------------------------------------------------------------ the documents' shape

MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _prose_lines(text: str):
    """(line number, line) of a Markdown text outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation other
    than ``-`` and ``_`` dropped, spaces to ``-``, ``-1``, ``-2`` ... on repeats."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: str, text: str) -> list[str]:
    """Relative links of the Markdown file ``path`` (text ``text``) whose file does not exist,
    or whose ``#anchor`` names no heading of the Markdown file it points to.  Links in code
    are not links; a link's text may run over a line break."""
    prose = dict(_prose_lines(text))
    body = "\n".join(INLINE_CODE.sub("", prose.get(i, "")) for i in range(1, len(text.splitlines()) + 1))
    bad = []
    for m in MARKDOWN_LINK.finditer(body):
        target, i = m.group(1), body.count("\n", 0, m.start(1)) + 1
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        where = f"{os.path.relpath(path, ROOT)}:{i}: {target}"
        if not file_part:                                       # an anchor in this file
            if anchor not in heading_anchors(text):
                bad.append(f"{where} (no such heading)")
            continue
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(dest):
            bad.append(f"{where} (no such file)")
        elif anchor and dest.endswith(".md"):
            with open(dest, encoding="utf-8") as f:
                if anchor not in heading_anchors(f.read()):
                    bad.append(f"{where} (no such heading)")
    return bad


def _documents() -> list[str]:
    docs = os.path.join(ROOT, "docs")
    paths = [os.path.join(ROOT, n) for n in sorted(os.listdir(ROOT)) if n.endswith(".md")]
    paths += [os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    return paths + [os.path.join(ROOT, "results", "README.md")]


def test_every_relative_link_in_the_documents_resolves():
    found = []
    for path in _documents():
        with open(path, encoding="utf-8") as f:
            found += broken_links(path, f.read())
    assert not found, "\n".join(found)


def test_the_link_checker_finds_planted_broken_links():
    path = os.path.join(ROOT, "docs", "planted.md")
    text = ("# Planted\n\n## Two words\n\n[ok](#two-words) [ok](contract.md#1-the-operation) "
            "[ok](../README.md) `[code](nowhere.md)`\n[bad](nowhere.md) [bad](contract.md#no-such-section) "
            "[bad](#three-words) [bad\ntext](nowhere.md)\n```\n[code](nowhere.md)\n```\n")
    assert broken_links(path, text) == [
        "docs/planted.md:6: nowhere.md (no such file)",
        "docs/planted.md:6: contract.md#no-such-section (no such heading)",
        "docs/planted.md:6: #three-words (no such heading)",
        "docs/planted.md:7: nowhere.md (no such file)",
    ]
    assert heading_anchors("## §1 The `a`, b\n## Twice\n## Twice\n") == {"1-the-a-b", "twice", "twice-1"}


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


README_LEADS_WITH = ["Install", "Set up a fresh machine", "Quick start"]


def readme_shape_faults(text: str, max_lines: int = 150) -> list[str]:
    """What keeps a README from being short and leading with what the software is, how to
    install it, how to set up a machine and a quick start, in that order."""
    faults = []
    if len(text.splitlines()) >= max_lines:
        faults.append(f"{len(text.splitlines())} lines, not under {max_lines}")
    prose = [line for _, line in _prose_lines(text)]
    sections = [line[3:].strip() for line in prose if line.startswith("## ")]
    if sections[:len(README_LEADS_WITH)] != README_LEADS_WITH:
        faults.append(f"sections begin {sections[:len(README_LEADS_WITH)]}, not {README_LEADS_WITH}")
    first = next((k for k, line in enumerate(prose) if line.startswith("## ")), len(prose))
    intro = [line for line in prose[:first] if line.strip() and not line.startswith("#")]
    if not prose or not prose[0].startswith("# ") or len(intro) < 2:
        faults.append("no title and paragraph saying what it is before the first section")
    return faults


def test_the_readme_is_short_and_leads_with_what_it_is_install_setup_and_quick_start():
    assert readme_shape_faults(_read("README.md")) == []


def test_the_readme_shape_check_catches_a_long_or_reordered_readme():
    good = "# x\n\nWhat x is.\nMore.\n\n## Install\n\n## Set up a fresh machine\n\n## Quick start\n\n## Levels\n"
    assert readme_shape_faults(good) == []
    assert readme_shape_faults(good + "line\n" * 150)
    assert readme_shape_faults(good.replace("## Install\n", "## Levels\n\n## Install\n"))
    assert readme_shape_faults(good.replace("What x is.\nMore.\n", ""))


def test_the_setup_commands_pin_what_ci_pins():
    """The README's two set-up commands install with CI's pins (so that a CPU machine keeps its
    CPU torch), and the test command is CI's own."""
    ci = _read(os.path.join(".ci", "run"))
    m = re.search(r'^python -m pip install ((?:"\w+==[\w.]+" )+)-e "\.\[test\]" && (.+)$', ci, re.M)
    assert m, "no pinned install line in .ci/run"
    pins, test_cmd = m.group(1), m.group(2)
    readme = _read("README.md")
    assert f'pip install {pins}-e ".[bench]" && mixstack bench' in readme
    assert f'pip install {pins}-e ".[test]" && {test_cmd}' in readme


# pip asked for the package by its name (bare, quoted, with an extra): an install from a
# package index, which cannot work (mixstack is installed from a clone).  The pattern is
# spelled in pieces so that this file does not match itself.
INDEX_INSTALL = re.compile(r"pip3? install\s+(?:-\S+\s+)*[\"']?" + "mix" + r"stack(?:\[|[\"'\s`]|$)")


def test_no_file_tells_users_to_pip_install_mixstack_from_an_index():
    found = []
    for f in _tracked_files():
        if not f.endswith((".md", ".py", ".sh", ".toml", ".txt", ".cpp")) or f.startswith("results/"):
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if INDEX_INSTALL.search(line):
                    found.append(f"{f}:{i}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line, hit", [
    ('pip install "mix' + 'stack[lammps]"', True),
    ("`pip install mix" + "stack[potential]`", True),
    ("pip install -U mix" + "stack", True),
    ('pip install -e ".[lammps]"', False),
    ("pip install mix" + "stack-extras", False),
])
def test_the_index_install_pattern(line, hit):
    assert bool(INDEX_INSTALL.search(line)) is hit


# Keep a Changelog's kinds, in its order; "Measured, not shipped" is this project's record of
# experiments that shipped nothing.
CHANGE_KINDS = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Measured, not shipped"]


def changelog_faults(text: str) -> list[str]:
    """Releases whose ``###`` headings repeat a kind, name an unknown kind, or leave
    Keep a Changelog's order."""
    faults, release, kinds = [], None, []

    def close():
        if release is None:
            return
        for k in sorted(set(kinds)):
            if kinds.count(k) > 1:
                faults.append(f"{release}: {k} x{kinds.count(k)}")
        unknown = [k for k in kinds if k not in CHANGE_KINDS]
        if unknown:
            faults.append(f"{release}: unknown kinds {unknown}")
        known = [k for k in dict.fromkeys(kinds) if k in CHANGE_KINDS]
        if known != sorted(known, key=CHANGE_KINDS.index):
            faults.append(f"{release}: kinds out of order {known}")

    for _, line in _prose_lines(text):
        if line.startswith("## "):
            close()
            release, kinds = line[3:].strip(), []
        elif line.startswith("### ") and release is not None:
            kinds.append(line[4:].strip())
    close()
    return faults


def test_each_changelog_release_has_at_most_one_heading_of_each_kind():
    assert changelog_faults(_read("CHANGELOG.md")) == []


def test_the_changelog_check_catches_repeated_unknown_and_misordered_kinds():
    good = "# Changelog\n\n## [Unreleased]\n\n### Added\n- a\n\n### Fixed\n- b\n\n## [1]\n\n### Added\n- c\n"
    assert changelog_faults(good) == []
    assert changelog_faults(good + "\n### Added\n- d\n") == ["[1]: Added x2"]
    assert changelog_faults(good.replace("### Fixed", "### Notes")) == ["[Unreleased]: unknown kinds ['Notes']"]
    assert changelog_faults(good.replace("### Added\n- a\n\n### Fixed\n- b", "### Fixed\n- b\n\n### Added\n- a")) == [
        "[Unreleased]: kinds out of order ['Fixed', 'Added']"]


# ------------------------------------------------------------------ history out of the code

# A line of the package that carries a date, a measured timing or "not yet" tells history, whose
# place is BENCHMARKS.md (organised by topic, with GPU, versions and dates beside the figures):
# the code says what and why in a line and cites the section.  The package's tables
# (mixstack/tables/*.json) are measured data and keep their dates; sources are checked.
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
TIMING = re.compile(r"(?<![\w.])\d[\d.,]*\s*(?:ms|µs|μs|us|TFLOP/s|GB/s|TB/s)(?!\w)")
NOT_YET = re.compile(r"\bnot\s+yet\b", re.I)

# Files others are cleaning: each still carries history.  The list shrinks to empty as they are
# cleaned (a cleaned file must leave it: the test below fails on an entry that no longer applies).
HISTORY_ALLOWED: set[str] = set()


def history_lines(text: str) -> list[str]:
    """``"line: text"`` of each line of ``text`` that carries a date (YYYY-MM-DD), a number next
    to a timing unit (ms, µs, us, TFLOP/s, GB/s, TB/s) or "not yet"."""
    return [f"{i}: {line.strip()[:100]}" for i, line in enumerate(text.splitlines(), 1)
            if DATE.search(line) or TIMING.search(line) or NOT_YET.search(line)]


def _package_sources() -> dict[str, str]:
    """Repository-relative path -> text of every source file of the package (.py, .cpp)."""
    out = {}
    for dirpath, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith((".py", ".cpp")):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, ROOT).replace(os.sep, "/")] = f.read()
    return out


def test_no_line_of_the_package_carries_a_date_a_measured_timing_or_not_yet():
    found = [f"{path}:{hit}" for path, text in _package_sources().items() if path not in HISTORY_ALLOWED
             for hit in history_lines(text)]
    assert not found, "history belongs in BENCHMARKS.md:\n" + "\n".join(found)


def test_every_file_allowed_to_carry_history_still_does():
    sources = _package_sources()
    stale = sorted(p for p in HISTORY_ALLOWED if p not in sources or not history_lines(sources[p]))
    assert not stale, f"cleaned (or gone): take them off HISTORY_ALLOWED: {stale}"


def test_the_history_check_finds_planted_dates_timings_and_not_yet():
    planted = ("GATE = 32   # best at S1 (H200, 2026-11-30)\n"
               "# 0.91 ms against 1.31\n"
               "# the copy ran at 4.27 TB/s and the GEMM at 42 TFLOP/s, 900 GB/s\n"
               "# 12us a launch, 3 µs a call\n"
               "# Not yet timed on a GPU\n")
    assert [hit.split(":")[0] for hit in history_lines(planted)] == ["1", "2", "3", "4", "5"]
    clean = ('"p20 ms": f"{t[\'p20_ms\']:.4g}", "median ms": x  # columns, not measurements\n'
             "# the sweep's time in milliseconds; status of the run; results/<date>-<gpu>-<purpose>/\n"
             "# a forward + backward far longer than a call costs (BENCHMARKS.md, \"The grid run\")\n")
    assert history_lines(clean) == []


# BENCHMARKS.md, "A section" (or several: "A"; "B", "A" and "B"): the code cites the design record
# by section title, or the title's beginning; a citation may run over comment lines.
BENCHMARKS_CITATION = re.compile(r'BENCHMARKS\.md,?\s+("[^"]+"(?:\s*(?:;|,|and)\s*"[^"]+")*)')


def _titles(markdown: str) -> list[str]:
    return [re.sub(r"\s+", " ", m.group(1)).strip() for _, line in _prose_lines(markdown)
            if (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line))]


def unresolved_citations(text: str, titles: list[str]) -> list[str]:
    """The section titles ``text`` cites from BENCHMARKS.md that begin no heading of ``titles``."""
    flat = re.sub(r"\s*\n\s*(?:#+\s*)?", " ", text)
    cited = [t for m in BENCHMARKS_CITATION.finditer(flat) for t in re.findall(r'"([^"]+)"', m.group(1))]
    return [t for t in cited if not any(title.startswith(t.strip()) for title in titles)]


def test_every_section_the_code_and_docs_cite_from_benchmarks_exists():
    titles = _titles(_read("BENCHMARKS.md"))
    texts = dict(_package_sources())
    for path in _documents():
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, ROOT)] = f.read()
    found = [f"{path}: {t!r}" for path, text in texts.items() for t in unresolved_citations(text, titles)]
    assert not found, "no such section of BENCHMARKS.md:\n" + "\n".join(found)


def test_the_citation_check_finds_a_planted_unknown_section():
    titles = ["Floors and ceilings", "The glue on kernels (H200, 2026-12-02)", "A cheaper sweep", "The grid run"]
    text = ('X = 1   # best of six (BENCHMARKS.md, "Floors and\n'
            '        # ceilings"; "The glue on kernels")\n'
            '"""... (BENCHMARKS.md, "A cheaper sweep" and "The grid run") ... BENCHMARKS.md, "No such section"'
            ' ... BENCHMARKS.md "The glue on pipes" """\n')
    assert unresolved_citations(text, titles) == ["No such section", "The glue on pipes"]


# ------------------------------------------------------------------ function size

MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 12

# Functions outside kernels/ allowed to be oversized, each while it is being split (an entry that
# no longer applies fails the test below).  Empty: none is.
OVERSIZED_ALLOWED: set[str] = set()


def oversized_functions(source: str) -> dict[str, str]:
    """Qualified name -> why, for each function of ``source`` longer than ``MAX_FUNCTION_LINES``
    lines (its ``def`` to its last line) or taking more than ``MAX_PARAMETERS`` parameters (a
    leading ``self`` or ``cls`` not counted; ``*args`` and ``**kwargs`` one each)."""
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                a = child.args
                params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
                params = params[1:] if params[:1] in (["self"], ["cls"]) else params
                count = len(params) + bool(a.vararg) + bool(a.kwarg)
                lines = child.end_lineno - child.lineno + 1
                why = [f"{lines} lines"] * (lines > MAX_FUNCTION_LINES) + \
                      [f"{count} parameters"] * (count > MAX_PARAMETERS)
                if why:
                    out[name] = ", ".join(why)
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def _oversized_outside_kernels() -> dict[str, str]:
    return {f"{path}:{name}": why for path, text in _package_sources().items()
            if path.endswith(".py") and not path.startswith("mixstack/kernels/")
            for name, why in oversized_functions(text).items()}


def test_no_function_outside_the_kernels_is_longer_than_80_lines_or_takes_more_than_12_parameters():
    found = {k: v for k, v in _oversized_outside_kernels().items() if k not in OVERSIZED_ALLOWED}
    assert not found, "\n".join(f"{k}: {v}" for k, v in sorted(found.items()))


def test_every_function_allowed_to_be_oversized_still_is():
    stale = sorted(OVERSIZED_ALLOWED - set(_oversized_outside_kernels()))
    assert not stale, f"split (or gone): take them off OVERSIZED_ALLOWED: {stale}"


def test_the_function_size_check_finds_planted_long_and_wide_functions():
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    planted = ("def fits(a):\n" + body +                                   # 80 lines
               "def too_long(a):\n" + body + "    return x0\n" +           # 81 lines
               "def wide(" + ", ".join(f"p{i}" for i in range(12)) + ", *args):\n    pass\n" +
               "class C:\n"
               "    def method(self, " + ", ".join(f"p{i}" for i in range(12)) + "):\n        pass\n"
               "    @classmethod\n"
               "    def wider(cls, " + ", ".join(f"p{i}" for i in range(12)) + ", *, q, **kw):\n"
               "        def inner(a, b):\n            pass\n")
    assert oversized_functions(planted) == {"too_long": "81 lines", "wide": "13 parameters",
                                            "C.wider": "14 parameters"}


def test_every_module_that_launches_a_kernel_is_one_the_launch_recorder_patches():
    """``compiler_report.record_launches`` (the compiler report, the grid's and tuner's warm-up
    workers) patches ``wrap_triton`` in ``LAUNCHING_MODULES``: a module of the stack's (or the
    convolution's launchers) left out would have its kernels run, not recorded, and never
    compiled ahead."""
    from mixstack.measure.compiler_report import LAUNCHING_MODULES

    patched = {m.__name__ for m in LAUNCHING_MODULES}
    launching = {path[:-3].replace("/", ".") for path, text in _package_sources().items()
                 if path.startswith(("mixstack/stack/", "mixstack/conv/launchers")) and "wrap_triton(" in text}
    assert "mixstack.stack.blas" in launching and "mixstack.stack.gemm" in launching
    assert sorted(launching - patched) == []
