"""The README's layout section names what the tree holds: every folder or module it lists exists, every package of
testbed/ (as docs/architecture.md's layer table places them) and every top-level folder is listed, and testbed's
entries come in the order of the layers, bottom first. This test reads the README, so the two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

from test_layers import ARCHITECTURE, layer_table

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# The top-level folders a reader of the README must find in it (the Python packages are found by themselves).
TOP_LEVEL = ("playbooks", "results", "tests", "bench", "docs", ".ci")


def layout_entries(text: str) -> list[tuple[str, str]]:
    """(path, what it is) for each line of the README's layout section: the path first, then its description."""
    begin, end = text.index("<!-- layout"), text.index("<!-- /layout -->")
    entries = []
    for line in text[begin:end].splitlines()[1:]:
        if not line.strip() or line.startswith("```"):
            continue
        path, _, what = line.strip().partition(" ")
        entries.append((path.rstrip("/"), what.strip()))
    return entries


def required(repo: Path) -> set[str]:
    """What the layout must list: the top-level Python packages and folders, every direct subpackage of testbed/,
    and every module at testbed/'s top (plan.py, lab.py, __init__.py, ...), each a row of the layer table.
    """
    need = {p.parent.name for p in repo.glob("*/__init__.py")} | {f for f in TOP_LEVEL if (repo / f).is_dir()}
    need |= {f"testbed/{p.parent.name}" for p in (repo / "testbed").glob("*/__init__.py")}
    need |= {f"testbed/{p.name}" for p in (repo / "testbed").glob("*.py")}
    return need


def layout_problems(text: str, repo: Path, layers: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    entries = layout_entries(text)
    named = [path for path, _ in entries]
    problems = [f"{path}: named in the layout, not in the tree" for path in named if not (repo / path).exists()]
    problems += [f"{path}: in the tree, not in the layout" for path in sorted(required(repo) - set(named))]
    problems += [f"{path}: listed twice" for path in sorted({p for p in named if named.count(p) > 1})]
    problems += [f"{path}: no description" for path, what in entries if not what]
    # testbed's entries in the order of the layer table (bottom first): each in the layer of the one before or above
    row_of = {pkg: row for row, (_, packages) in enumerate(layers) for pkg in packages}
    last = (-1, "")
    for path in named:
        if not path.startswith("testbed/"):
            continue
        module = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        row = row_of.get(module)
        if row is None:
            problems.append(f"{path}: the layer table of docs/architecture.md does not place {module}")
        else:
            if row < last[0]:
                problems.append(f"{path}: listed after {last[1]}, whose layer is above its own")
            last = (row, path)
    return problems


def test_the_readme_layout_matches_the_tree():
    layers = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert layout_problems(README.read_text(encoding="utf-8"), REPO, layers) == []


def test_the_layout_check_finds_a_missing_a_ghost_and_a_misordered_entry(tmp_path):
    for folder in ("testbed/core", "testbed/cli", "drivers", "docs"):
        (tmp_path / folder).mkdir(parents=True)
    for module in ("testbed/__init__.py", "testbed/core/__init__.py", "testbed/cli/__init__.py", "drivers/__init__.py"):
        (tmp_path / module).write_text("")
    layers = [("core", ("testbed.core",)), ("cli", ("testbed.cli",)), ("api", ("testbed",))]
    readme = (
        "## Layout\n<!-- layout -->\n```\n"
        "testbed/              the framework\n"
        "testbed/__init__.py   the API\n"
        "testbed/cli/          the command\n"
        "testbed/core/         the core\n"
        "runner/               the engine\n"
        "docs/\n"
        "```\n<!-- /layout -->\n"
    )
    assert layout_problems(readme, tmp_path, layers) == [
        "runner: named in the layout, not in the tree",
        "drivers: in the tree, not in the layout",
        "docs: no description",
        "testbed/cli: listed after testbed/__init__.py, whose layer is above its own",
        "testbed/core: listed after testbed/cli, whose layer is above its own",
    ]
