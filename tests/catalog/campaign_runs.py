"""Real runs on the twin for the tests of report --across, trend and gate, made once per test session.

Three runs of ocs-reconfig tagged `baseline` and three tagged `rerun` on playbooks/inventory/emulated-rack.yaml (one
warm testbed.Lab), and three tagged `slow` on a copy of that inventory whose OCS switches more slowly (its
`emulation.switching_time_ms` 25 -> SLOW_SWITCHING_MS): the deliberate slowdown the gate must catch.
"""

from __future__ import annotations

import csv
from pathlib import Path

from rich.console import Console

TRIALS = 10
RUNS_PER_SIDE = 3
# The bound of a test that may be the one to make the campaign: its runs take a minute or two on an idle 2-core
# machine, several on a busy one.
CAMPAIGN_TIMEOUT_S = 900
SLOW_SWITCHING_MS = 75  # three times the switching: a difference no load on the machine blurs
_made: dict[str, Path] = {}


def campaign(repo: Path, root: Path) -> Path:
    """The results folder of the session's campaign (made by the first caller, under `root`)."""
    if "results" in _made:
        return _made["results"]
    import testbed
    from testbed.catalog import add_tag

    results = root / "results"
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    slow = slow_switch_inventory(repo, root, SLOW_SWITCHING_MS)
    playbook = repo / "playbooks/ocs-reconfig.yaml"
    quiet = Console(quiet=True)
    for file, tags in ((inventory, ("baseline", "rerun")), (slow, ("slow",))):
        with testbed.Lab(file, emulate=True, results=results, console=quiet) as lab:
            # Baseline and rerun in turn, not one side's runs and then the other's: a machine that gets busier
            # during the campaign slows both alike, as an unchanged rerun should be (the gate would rightly call a
            # rerun made under more load slower).
            for _ in range(RUNS_PER_SIDE):
                for tag in tags:
                    run = lab.run(playbook, trials=TRIALS)
                    assert run.ok, run.error
                    add_tag(run.folder, tag)
    _made["results"] = results
    return results


def slow_switch_inventory(repo: Path, root: Path, switching_ms: int) -> Path:
    """A copy of playbooks/inventory/emulated-rack.yaml in `root` whose OCS switches in `switching_ms` instead of 25
    ms: the same name, another content (the catalog tells the two apart by its digest).
    """
    text = (repo / "playbooks/inventory/emulated-rack.yaml").read_text()
    assert "switching_time_ms: 25," in text  # the line this copy changes
    slow = root / f"emulated-rack-{switching_ms}ms.yaml"
    slow.write_text(text.replace("switching_time_ms: 25,", f"switching_time_ms: {switching_ms},"))
    return slow


def folder_samples(run_dir: Path, span: str) -> list[float]:
    """A run's samples of `span` as its own folder has them (trials.csv), not through the catalog."""
    with open(run_dir / "trials.csv", newline="", encoding="utf-8") as f:
        return [float(row["duration_ms"]) for row in csv.DictReader(f) if row["span"] == span]
