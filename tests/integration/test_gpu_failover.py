"""Spare-GPU failover over the OCS, end to end on the twin: every milestone in order, the spare resumes
from the checkpoint, the ring is rewired through it, the report has the milestone table and figures, and
the measured failover agrees with the twin's ground truth (the playbook's default 20 trials, as a user runs
it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from privileges import may_use_realtime

from testbed.cli.main import main
from testbed.events import read_jsonl
from testbed.results.milestones import MILESTONES, SEGMENTS

TRIALS = 20
# 20 failovers take ~35 s on an idle 2-core machine; the margin is for a loaded one.
pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def run_dir(ray_cluster, repo, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    code = main(
        [
            "run",
            str(repo / "playbooks/gpu-failover.yaml"),
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


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_every_milestone_in_order_and_segments_add_up(run_dir):
    evs = events(run_dir)
    for trial in range(TRIALS):
        marks = [e for e in evs if e.get("trial") == trial and e["type"] == "mark"]
        start = next(i for i, e in enumerate(marks) if e["op"] == "fault_injected")
        times = {}
        for name in MILESTONES:
            found = [e for e in marks[start:] if e["op"] == name]
            assert found, f"trial {trial}: no {name}"
            # Every watcher records a detection (the survivors see their exits after the teardown): the
            # milestone is the earliest; job_ready is the spare's rank's (its ready line follows an all-reduce
            # with every rank), on the watch that then sees the first step.
            spare = next(e["device"] for e in marks[start:] if e["op"] == "failover.resumed")
            stamps = [e["mono_ns"] for e in found if name != "job_ready" or e.get("device") == spare]
            times[name] = min(stamps)
        assert [times[m] for m in MILESTONES] == sorted(times[m] for m in MILESTONES), times
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["spans"]["failover.total"]["n"] == TRIALS
    total = sum(summary["spans"][f"failover.{s}"]["mean_ms"] for s in SEGMENTS)
    assert total == pytest.approx(summary["spans"]["failover.total"]["mean_ms"], rel=1e-3)


def test_the_spare_resumes_from_the_checkpoint_on_a_rewired_ring(run_dir):
    evs = events(run_dir)
    # One spare per trial, chosen for the rank the fault hit, even when a watcher saw a peer's exit first (the
    # peer's ring broke as the failed rank went away): failure_reattributed records that, and nothing is re-chosen.
    chosen = [e["data"] for e in evs if e["op"] == "spare_selected"]
    resumed = [e for e in evs if e["op"] == "failover.resumed"]
    choice_of_trial = {e["trial"]: e["data"] for e in evs if e["op"] == "spare_selected"}
    for e in (e for e in evs if e["op"] == "failure_reattributed"):
        assert choice_of_trial[e["trial"]]["rank"] == e["data"]["failed"] != e["data"]["first_seen"]
    assert len(chosen) == len(resumed) == TRIALS
    for pick, res in zip(chosen, resumed, strict=True):
        assert pick["spare"] in ("gpu09", "gpu10") and res["device"] == pick["spare"]
        assert res["data"]["rank"] == pick["rank"]
        assert res["data"]["resumed_from"] > 0  # a checkpoint was taken before the failure
        assert res["data"]["step"] == res["data"]["resumed_from"] + 1  # and training continues from it
    # The ring was rewired through the spare: its ports carry circuits after the failover.
    reconfigs = [e for e in evs if e["op"] == "ocs.reconfigure" and e["type"] == "invoke"]
    assert len(reconfigs) >= 2 * TRIALS  # job.start and failover, in every trial


def test_report_prints_the_milestone_table_and_writes_figures(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "failover" in out and "first_step" in out
    # The accuracy figure comes with the priority the twin fired the faults at, and what to do about it.
    assert ("at real-time priority" if may_use_realtime() else "normal priority: on a busy machine") in out
    assert (run_dir / "failover_cdf.png").is_file() and (run_dir / "failover_timeline.png").is_file()
    assert main(["check", str(run_dir)]) == 0


def test_compare_puts_two_runs_side_by_side(run_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: span names are not folded across lines
    assert main(["compare", str(run_dir), str(run_dir)]) == 0
    assert "failover.total" in capsys.readouterr().out


def test_the_jobs_traffic_crossed_the_emulated_fabric(run_dir):
    info = json.loads((run_dir / "run.json").read_text())
    totals = info["twin_dataplane"]
    # Every launch's ring went through relays gated by the switch's circuits: the ranks' gradients were
    # carried by the twin's data plane, and the failed rank's connections were cut when it died.
    assert totals["relays"] >= 4 and totals["bytes"] > 0


def test_the_measured_failover_agrees_with_the_twins_ground_truth(run_dir):
    """The twin logged, on its own clock, when it killed the rank and when the spare wrote the step line the
    framework took as first_step. Every failover is matched, and the measured latency is close to the truth:
    typically under a millisecond off (the SSH hop that carries the step line), never systematically off by
    more (a watch that starts late, or a coordinator busy as the step arrives, each once added 2 to 90 ms: the
    median catches that), and never by a tenth of a second. Single trials are as late as the machine schedules
    them (tens of ms on a 2-core machine kept busy by other work), so the tail against the 2 ms p99 target is a
    figure of `python bench/run_all.py`, measured on a quiet machine, not an assertion here. The fault is a timed
    trigger: the twin never applies it before the moment the framework records as fault_injected.
    """
    truth = json.loads((run_dir / "summary.json").read_text())["ground_truth"]
    assert truth["failovers"] == truth["matched"] == TRIALS, truth["unmatched"]
    errors = np.abs([row["error_ms"] for row in truth["per_trial"]])
    assert np.median(errors) <= 2.0 and errors.max() <= 100.0, sorted(errors)
    assert all(row["start_error_ms"] <= 0 for row in truth["per_trial"]), truth["per_trial"]
    # Which priority the twin fired the faults at is part of the figure: it is said, not left to guess.
    assert truth["trigger"] == ("real-time" if may_use_realtime() else "normal")
    info = json.loads((run_dir / "run.json").read_text())
    # One machine, one CLOCK_MONOTONIC: the measured offset is zero within its bound.
    assert abs(info["twin_clock"]["offset_ms"]) <= info["twin_clock"]["error_bound_ms"] + 0.05


def test_the_ground_truth_is_the_twins_own_account(run_dir):
    """The fault the twin applied killed the very rank the framework saw fail, and the spare's step lines
    continue from the checkpoint: the truth log is evidence, not a copy of the framework's events.
    """
    truth = read_jsonl(run_dir / "twin_truth.jsonl").records
    evs = events(run_dir)
    for row in json.loads((run_dir / "summary.json").read_text())["ground_truth"]["per_trial"]:
        trial = row["trial"]
        started = [e for e in evs if e.get("trial") == trial and e["op"] == "gpu.start_job" and e["type"] == "ok"]
        failed_pids = {e["data"]["value"]["pid"] for e in started if e.get("device") == row["failed"]}
        faults = [
            t for t in truth if t["event"] == "fault" and t["host"] == row["failed"] and set(t["pids"]) & failed_pids
        ]
        assert faults, f"trial {trial}: the twin killed no rank of {row['failed']}"
        assert row["truth_ms"] > 0 and row["measured_ms"] > 0
