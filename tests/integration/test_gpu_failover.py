"""Spare-GPU failover over the OCS, end to end on the twin: every milestone in order, the spare resumes
from the checkpoint, the ring is rewired through it, the report has the milestone table and figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli import main

MILESTONES = [
    "fault_injected",
    "failure_detected",
    "spare_selected",
    "fabric_reconfigured",
    "link_verified",
    "job_relaunched",
    "job_ready",
    "first_step",
]


@pytest.fixture(scope="module")
def run_dir(ray_cluster, repo, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    code = main(
        [
            "run",
            str(repo / "playbooks/gpu-failover.yaml"),
            "--emulate",
            "--trials",
            "2",
            "--results",
            str(results),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    assert code == 0
    return next(results.iterdir())


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_every_milestone_in_order_and_segments_add_up(run_dir):
    evs = events(run_dir)
    for trial in (0, 1):
        marks = [e for e in evs if e.get("trial") == trial and e["type"] == "mark"]
        start = next(i for i, e in enumerate(marks) if e["op"] == "fault_injected")
        times = {}
        for name in MILESTONES:
            found = [e for e in marks[start:] if e["op"] == name]
            assert found, f"trial {trial}: no {name}"
            # Every watcher records a detection (the survivors see their exits after the teardown): the
            # milestone is the earliest; job_ready is the last rank's.
            stamps = [e["mono_ns"] for e in found]
            times[name] = max(stamps) if name == "job_ready" else min(stamps)
        assert [times[m] for m in MILESTONES] == sorted(times[m] for m in MILESTONES), times
    summary = json.loads((run_dir / "summary.json").read_text())
    segments = ["detect", "select", "reconfigure", "verify", "relaunch", "ready", "first_step"]
    assert summary["spans"]["failover.total"]["n"] == 2
    total = sum(summary["spans"][f"failover.{s}"]["mean_ms"] for s in segments)
    assert total == pytest.approx(summary["spans"]["failover.total"]["mean_ms"], rel=1e-3)


def test_the_spare_resumes_from_the_checkpoint_on_a_rewired_ring(run_dir):
    evs = events(run_dir)
    chosen = [e["data"] for e in evs if e["op"] == "spare_selected"]
    resumed = [e for e in evs if e["op"] == "failover.resumed"]
    assert len(chosen) == len(resumed) == 2
    for pick, res in zip(chosen, resumed, strict=True):
        assert pick["spare"] in ("gpu09", "gpu10") and res["device"] == pick["spare"]
        assert res["data"]["resumed_from"] > 0  # a checkpoint was taken before the failure
        assert res["data"]["step"] == res["data"]["resumed_from"] + 1  # and training continues from it
    # The ring was rewired through the spare: its ports carry circuits after the failover.
    reconfigs = [e for e in evs if e["op"] == "ocs.reconfigure" and e["type"] == "invoke"]
    assert len(reconfigs) >= 4  # job.start and failover, in both trials


def test_report_prints_the_milestone_table_and_writes_figures(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "failover" in out and "first_step" in out
    assert (run_dir / "failover_cdf.png").is_file() and (run_dir / "failover_timeline.png").is_file()
    assert main(["check", str(run_dir)]) == 0


def test_compare_puts_two_runs_side_by_side(run_dir, capsys):
    assert main(["compare", str(run_dir), str(run_dir)]) == 0
    assert "failover.total" in capsys.readouterr().out


def test_the_jobs_traffic_crossed_the_emulated_fabric(run_dir):
    info = json.loads((run_dir / "run.json").read_text())
    totals = info["twin_dataplane"]
    # Every launch's ring went through relays gated by the switch's circuits: the ranks' gradients were
    # carried by the twin's data plane, and the failed rank's connections were cut when it died.
    assert totals["relays"] >= 4 and totals["bytes"] > 0
