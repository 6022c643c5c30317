"""The layers of docs/architecture.md hold: no import cycle among the project's modules, drivers stand on the
contracts alone (never on the engine), the emulators on nothing of the framework, and production code reaches
the emulators only through the twin bridge, so a run on a lab never loads them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("testbed", "drivers", "emulators")
# The framework's bottom layer, which drivers may use: what a device can do, and the errors.
CONTRACTS = {"testbed", "testbed.capabilities", "testbed.errors"}
# The emulated path: the bridge from an inventory to its twin, and the tools that exist to run emulators.
TWIN_BRIDGE = {"testbed.twin", "testbed.emulate_cmd", "testbed.pytest_plugin", "testbed.replay"}


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


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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


def test_the_import_graph_has_no_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_drivers_stand_on_the_contracts_alone():
    graph = import_graph()
    wrong = {
        (m, d) for m, deps in graph.items() if m.startswith("drivers") for d in deps if d.split(".")[0] != "drivers"
    }
    assert {(m, d) for m, d in wrong if d not in CONTRACTS} == set()


def test_the_emulators_import_nothing_of_the_framework():
    graph = import_graph()
    assert {
        (m, d) for m, deps in graph.items() if m.startswith("emulators") for d in deps if not d.startswith("emulators")
    } == set()


def test_production_code_reaches_the_emulators_only_through_the_twin_bridge():
    graph = import_graph()
    wrong = {
        (m, d)
        for m, deps in graph.items()
        if m.split(".")[0] in ("testbed", "drivers") and m not in TWIN_BRIDGE
        for d in deps
        if d.startswith("emulators")
    }
    assert wrong == set()


def test_a_lab_run_s_commands_never_load_the_emulators(tmp_path):
    """validate, plan and the check of a real run's folder, as a user runs them, import no emulator."""
    probe = (
        "import sys\n"
        "from testbed.cli import main\n"
        "for argv in (['validate', 'playbooks/gpu-failover.yaml'], ['plan', 'playbooks/gpu-failover.yaml']):\n"
        "    assert main(argv) == 0, argv\n"
        "from testbed import check, heal, plan, report\n"
        "from testbed.runner import coordinator, jobs, run\n"
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
