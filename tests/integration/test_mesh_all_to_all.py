"""The photonic chip as a circuit switch, end to end: calibrate, cycle the all-to-all matchings with light
verified on every output, report per matching, and `testbed check` the run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

TRIALS = 2


@pytest.fixture(scope="module")
def run_dir(ray_cluster, repo, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    code = main(
        [
            "run",
            str(repo / "playbooks/mesh-all-to-all.yaml"),
            "--emulate",
            "--trials",
            str(TRIALS),
            "--results",
            str(results),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    assert code == 0
    return next(results.iterdir())


def test_every_matching_is_lit_and_measured(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["spans"]["matching.total"]["n"] == 7 * TRIALS  # N-1 matchings of 8 hosts, every trial
    per_matching = summary["by_step"]["matching.total"]
    assert sorted(per_matching) == [f"apply a2a[{k}]" for k in range(1, 8)]
    assert all(s["n"] == TRIALS for s in per_matching.values())


def test_calibration_is_kept_with_the_run(run_dir):
    calibration = json.loads((run_dir / "calibration-chip1.json").read_text())
    assert calibration["size"] == 8 and len(calibration["heaters"]) == 112
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    done = next(e for e in events if e["op"] == "mesh.calibrate" and e["type"] == "ok")
    assert done["data"]["value"]["path"] == str(run_dir / "calibration-chip1.json")


def test_crosstalk_per_output_port_is_reported_and_labelled(run_dir, capsys):
    crosstalk = json.loads((run_dir / "summary.json").read_text())["crosstalk"]["chip1"]
    assert crosstalk["source"] == "twin ground truth"
    assert sorted(int(p) for p in crosstalk["worst_db"]) == list(range(9, 17))
    assert all(db < -20 for db in crosstalk["worst_db"].values())  # a calibrated chip: >= 20 dB extinction
    assert main(["report", str(run_dir)]) == 0
    assert "worst crosstalk per output port" in capsys.readouterr().out


def test_the_run_passes_its_history_checks(run_dir):
    assert main(["check", str(run_dir)]) == 0
