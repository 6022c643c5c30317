"""The layers of docs/architecture.md hold: every package imports only the layers below its own, as the doc's table
lists them (this test reads that table, so the doc and the rule cannot differ); no import cycle between modules;
no loop between the parts of any package; the emulators are reached through the twin bridge alone, so a run on a
lab never loads them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("testbed", "drivers", "emulators", "hostside")
ARCHITECTURE = REPO / "docs" / "architecture.md"
TWIN_BRIDGE = "testbed.twin"  # the one package that may import the emulators


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in its code (inside functions too)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                # `from pkg import sub` imports the submodule; any other name comes from pkg itself
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                target = next(
                    (".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mods), None
                )
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


# --- the table of layers -------------------------------------------------------------------------------------


def layer_table(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(layer, its packages) from the doc's table, bottom layer first."""
    begin, end = text.index("<!-- layers"), text.index("<!-- /layers -->")
    rows = []
    for line in text[begin:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] == "layer" or set(cells[0]) <= set("-: "):
            continue
        rows.append((cells[0], tuple(re.findall(r"`([\w.]+)`", cells[1]))))
    return rows


def placement(table: list[tuple[str, tuple[str, ...]]], module: str) -> tuple[int, str] | None:
    """(row, package) of the table that holds `module`. A package holds itself and everything inside it, unless the
    table names packages inside it too (`testbed`): then it holds only itself, and each module inside it must
    belong to one of those.
    """
    named = [(row, p) for row, (_, packages) in enumerate(table) for p in packages]
    holders = [
        (row, p)
        for row, p in named
        if module == p or (module.startswith(p + ".") and not any(q.startswith(p + ".") for _, q in named))
    ]
    return max(holders, key=lambda held: len(held[1]), default=None)


def layer_violations(table, graph: dict[str, set[str]]) -> list[str]:
    """Every import of a package by one of its own row, or of a layer above: `importer -> imported (why)`."""
    wrong = []
    for module, deps in sorted(graph.items()):
        here = placement(table, module)
        for dep in sorted(deps):
            there = placement(table, dep)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] >= here[0]:
                why = "same layer" if there[0] == here[0] else f"{table[there[0]][0]} is above {table[here[0]][0]}"
                wrong.append(f"{module} -> {dep} ({why})")
    return wrong


# --- loops ---------------------------------------------------------------------------------------------------


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _part(prefix: str, module: str) -> str | None:
    """The part of the package `prefix` names (a subpackage or module in its folder) that holds `module`."""
    if not module.startswith(prefix):
        return None
    return prefix + module[len(prefix) :].split(".")[0]


def part_loops(graph: dict[str, set[str]], packages: Iterable[str]) -> dict[str, list[list[str]]]:
    """For the repository ("") and every package: loops between its parts (the subpackages and modules side by
    side in its folder), an import from anywhere inside one part to anywhere inside another being an arrow.
    """
    found = {}
    for package in ["", *packages]:
        prefix = package + "." if package else ""
        arrows: dict[str, set[str]] = {}
        for module, deps in graph.items():
            a = _part(prefix, module)
            if a is None or a == package:
                continue
            for dep in deps:
                b = _part(prefix, dep)
                if b is not None and b != a and b != package:
                    arrows.setdefault(a, set()).add(b)
        loops = cycles(arrows)
        if loops:
            found[package or "the repository"] = loops
    return found


# --- the tests -----------------------------------------------------------------------------------------------


def test_the_import_graph_has_no_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_placed_in_a_layer_of_the_doc():
    table = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [m for m in sorted(modules()) if placement(table, m) is None] == []


def test_packages_import_only_the_layers_below_theirs():
    table = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert layer_violations(table, import_graph()) == []


def test_the_layer_check_finds_an_import_that_runs_up_or_across():
    doc = (
        "<!-- layers -->\n| layer | packages | what |\n|---|---|---|\n"
        "| base | `lib` | |\n| middle | `app.core`, `app.util` | |\n"
        "| top | `app.cli` | |\n| api | `app` | |\n<!-- /layers -->"
    )
    table = layer_table(doc)
    graph = {
        "lib.x": set(),
        "app": {"app.cli.main"},
        "app.core.a": {"lib.x", "app.cli.main"},  # up
        "app.util": {"app.core.a"},  # across
        "app.cli.main": {"app.core.a", "lib.x"},
    }
    assert layer_violations(table, graph) == [
        "app.core.a -> app.cli.main (top is above middle)",
        "app.util -> app.core.a (same layer)",
    ]


@pytest.mark.parametrize(
    ("graph", "loops"),
    [
        ({"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}, "p.a.z": set()}, {"p": [["p.a", "p.b"]]}),
        ({"p.a.x": {"p.b.y"}, "p.b.y": set(), "q": {"p.a.x"}}, {}),
        ({"p.x": {"q.y"}, "q.y": {"p.z"}, "p.z": set()}, {"the repository": [["p", "q"]]}),
    ],
)
def test_the_loop_finder_sees_loops_between_the_parts_of_a_package(graph, loops):
    assert part_loops(graph, ["p", "p.a", "p.b", "q"]) == loops


def test_no_loop_between_the_parts_of_any_package():
    mods = modules()
    packages = [m for m, path in mods.items() if path.name == "__init__.py"]
    assert part_loops(import_graph(), packages) == {}


def test_only_the_twin_bridge_imports_the_emulators():
    graph = import_graph()
    wrong = {
        (m, d)
        for m, deps in graph.items()
        if not m.startswith(("emulators", TWIN_BRIDGE + ".")) and m != TWIN_BRIDGE
        for d in deps
        if d.split(".")[0] == "emulators"
    }
    assert wrong == set()


def test_the_packages_beside_testbed_import_nothing_of_each_other():
    graph = import_graph()
    wrong = {
        (m, d)
        for m, deps in graph.items()
        if m.split(".")[0] != "testbed"
        for d in deps
        if d.split(".")[0] != m.split(".")[0]
    }
    assert wrong == set()


def test_a_lab_run_s_commands_never_load_the_emulators(tmp_path):
    """validate, plan and the check of a real run's folder, as a user runs them, import no emulator."""
    probe = (
        "import sys\n"
        "from testbed.cli import main\n"
        "for argv in (['validate', 'playbooks/gpu-failover.yaml'], ['plan', 'playbooks/gpu-failover.yaml']):\n"
        "    assert main(argv) == 0, argv\n"
        "from testbed import plan\n"
        "from testbed.ops import check, heal\n"
        "from testbed.results import report\n"
        "from testbed.engine import coordinator, job, run\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'emulators')\n"
        "print('loaded:', loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "loaded: []"


def test_the_public_api_resolves_without_loading_the_engine():
    probe = (
        "import sys, testbed\n"
        "assert all(getattr(testbed, name) is not None for name in testbed.__all__)\n"
        "print(sorted(m for m in sys.modules if m in ('ray', 'emulators')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_testbed_keeps_at_most_ten_modules_at_its_top():
    assert len(list((REPO / "testbed").glob("*.py"))) <= 10
