"""Data-driven config tests: every file in cases/ says, in its first lines, what loading it must give.

# expect: ok
# expect: <line> <key.path> <substring of the message>     (one line per expected problem)
# inventory: <file next to it>                               (playbooks only; default the emulated rack)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main

CASES = sorted((Path(__file__).parent / "cases").glob("*.yaml"))


def expectations(path: Path) -> tuple[list[tuple[int, str, str]] | None, str | None]:
    expected, inventory = [], None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("# ")
        if body == "expect: ok":
            return None, inventory
        if body.startswith("expect:"):
            lineno, key, message = body[len("expect:") :].strip().split(" ", 2)
            expected.append((int(lineno), key, message))
        if body.startswith("inventory:"):
            inventory = str(path.parent / body.split(":", 1)[1].strip())
    return expected, inventory


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_validate_reports_each_problem_at_file_line_and_key(case: Path, capsys, repo):
    expected, inventory = expectations(case)
    argv = ["validate", str(case)] + (
        ["--inventory", inventory]
        if inventory
        else ["--inventory", str(repo / "playbooks/inventory/emulated-rack.yaml")]
    )
    code = main(argv)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    if expected is None:
        assert code == 0, text
        return
    assert code == 2, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == len(expected), text
    for lineno, key, message in expected:
        prefix = f"error: {case}:{lineno}: " + ("" if key == "<none>" else f"{key}: ")
        assert any(e.startswith(prefix) and message in e for e in errors), f"{prefix}...{message} not in:\n{text}"


def test_every_shipped_file_validates(repo, capsys):
    """Every inventory, and every playbook against the default lab, but the Opus playbooks (opus-*.yaml), which
    name the hosts of playbooks/inventory/opus-2048.yaml.
    """
    files = sorted(p for p in (repo / "playbooks").rglob("*.yaml"))
    opus = [str(p) for p in files if p.name.startswith("opus-") and p.parent.name == "playbooks"]
    rest = [str(p) for p in files if str(p) not in opus]
    assert opus and main(["validate", *rest]) == 0, capsys.readouterr().out
    opus_inventory = str(repo / "playbooks/inventory/opus-2048.yaml")
    assert main(["validate", "--inventory", opus_inventory, *opus]) == 0, capsys.readouterr().out
