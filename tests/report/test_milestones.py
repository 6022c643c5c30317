"""milestone_spans: consecutive failover segments per trial, merged (and named so) over missing milestones."""

from __future__ import annotations

import json

import pytest

from testbed.events import Event
from testbed.results.milestones import (
    IN_JOB_MILESTONES,
    MILESTONES,
    SEGMENTS,
    milestone_prefixes,
    milestone_segments,
    milestone_spans,
)
from testbed.results.report import milestone_table, milestone_tables

MS = 1_000_000


def mark(op: str, ms: float, trial: int | None = 0) -> dict:
    return {"seq": 0, "type": "mark", "op": op, "mono_ns": int(1_000 * MS + ms * MS), "wall": 0.0, "trial": trial}


def all_marks(trial: int = 0, milestones: tuple[str, ...] = MILESTONES) -> list[dict]:
    at = [0, 40, 45, 70, 80, 230, 530, 730]  # ms after fault_injected
    return [mark(name, ms, trial) for name, ms in zip(milestones, at, strict=True)]


def test_all_milestones_give_every_segment_and_the_total():
    spans = milestone_spans(all_marks())
    assert [s["segment"] for s in spans] == [*SEGMENTS, "total"]
    ms = {s["segment"]: s["ms"] for s in spans}
    assert ms == pytest.approx(
        {
            "detect": 40,
            "select": 5,
            "reconfigure": 25,
            "verify": 10,
            "relaunch": 150,
            "ready": 300,
            "first_step": 200,
            "total": 730,
        }
    )
    assert sum(ms[s] for s in SEGMENTS) == pytest.approx(ms["total"])
    detect = spans[0]
    assert (detect["from"], detect["to"], detect["trial"]) == ("fault_injected", "failure_detected", 0)
    assert detect["end_ns"] - detect["start_ns"] == 40 * MS


def test_an_in_job_trial_publishes_a_generation_where_a_restart_relaunches():
    """recovery: in-job marks generation_published where restart marks job_relaunched: its segment is `publish`,
    and a run with trials of both kinds keeps each trial's own chain.
    """
    in_job = milestone_spans(all_marks(0, IN_JOB_MILESTONES))
    names = [s["segment"] for s in in_job]
    assert names == ["detect", "select", "reconfigure", "verify", "publish", "ready", "first_step", "total"]
    publish = in_job[4]
    assert (publish["from"], publish["to"], publish["ms"]) == ("link_verified", "generation_published", 150)
    assert in_job[5]["from"] == "generation_published"
    without_light = [e for e in all_marks(0, IN_JOB_MILESTONES) if e["op"] != "link_verified"]
    assert "verify+publish" in [s["segment"] for s in milestone_spans(without_light)]
    both = milestone_spans(all_marks(0, IN_JOB_MILESTONES) + all_marks(1))
    assert {s["trial"]: s["segment"] for s in both if s["segment"] in ("publish", "relaunch")} == {
        0: "publish",
        1: "relaunch",
    }
    spans = list(dict.fromkeys(f"failover.{s['segment']}" for s in both))
    assert milestone_segments(spans, "failover") == [
        "detect",
        "select",
        "reconfigure",
        "verify",
        "publish",  # in one place of the order, the two ways back by name
        "relaunch",
        "ready",
        "first_step",
        "total",
    ]
    assert milestone_prefixes(["failover.publish"]) == ["failover"]


def test_missing_milestones_merge_segments_and_keep_the_total():
    events = [e for e in all_marks() if e["op"] not in ("spare_selected", "link_verified")]
    spans = milestone_spans(events)
    names = [s["segment"] for s in spans]
    assert names == ["detect", "select+reconfigure", "verify+relaunch", "ready", "first_step", "total"]
    ms = {s["segment"]: s["ms"] for s in spans}
    assert ms["select+reconfigure"] == pytest.approx(30)
    assert ms["verify+relaunch"] == pytest.approx(160)
    assert sum(v for k, v in ms.items() if k != "total") == pytest.approx(ms["total"]) == pytest.approx(730)


def test_no_total_without_both_ends():
    no_first = milestone_spans([e for e in all_marks() if e["op"] != "first_step"])
    assert "total" not in [s["segment"] for s in no_first]
    assert no_first[-1]["segment"] == "ready"
    no_fault = milestone_spans([e for e in all_marks() if e["op"] != "fault_injected"])
    assert [s["segment"] for s in no_fault][0] == "select"
    assert "total" not in [s["segment"] for s in no_fault]
    assert milestone_spans([mark("fault_injected", 0)]) == []
    assert milestone_spans([]) == []


def test_marks_before_the_fault_are_not_the_relaunch():
    """The job's first launch marks job_ready and first_step before the fault; the relaunch's are later."""
    events = [mark("job_ready", -500), mark("first_step", -400), *all_marks()]
    ms = {s["segment"]: s["ms"] for s in milestone_spans(events)}
    assert ms["ready"] == pytest.approx(300)
    assert ms["total"] == pytest.approx(730)


def test_trials_are_separate_and_other_events_ignored():
    events = all_marks(0) + [
        {**e, "mono_ns": e["mono_ns"] + 10_000 * MS} for e in all_marks(1) if e["op"] != "job_relaunched"
    ]
    events += [
        mark("job_ready", 5, trial=None),  # outside any trial
        {"type": "measure", "op": "fault_injected", "mono_ns": 0, "trial": 0, "data": {"ms": 1}},
        mark("sent", 3),
    ]
    spans = milestone_spans(events)
    assert {s["trial"] for s in spans} == {0, 1}
    by_trial = {t: [s["segment"] for s in spans if s["trial"] == t] for t in (0, 1)}
    assert by_trial[0] == [*SEGMENTS, "total"]
    assert by_trial[1] == ["detect", "select", "reconfigure", "verify", "relaunch+ready", "first_step", "total"]


def test_accepts_event_objects_as_recorded():
    events = [
        Event(seq=i, type=e["type"], op=e["op"], mono_ns=e["mono_ns"], wall=0.0, run="r", trial=0)
        for i, e in enumerate(all_marks())
    ]
    assert milestone_spans(events) == milestone_spans(all_marks())


def test_milestone_table_orders_segments_then_total(runs):
    from rich.console import Console

    summary = json.loads((runs("failover", skip=("link_verified",)) / "summary.json").read_text())
    table = milestone_table(summary)
    console = Console(record=True, width=200)
    console.print(table)
    text = console.export_text()
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    assert rows == ["detect", "select", "reconfigure", "verify+relaunch", "ready", "first_step", "total"]
    assert "20" in text and "*" in text  # n shown; p99 from 20 samples starred
    assert milestone_table({"spans": {"reconfig.total": {"n": 1}}}) is None


def test_several_marks_per_milestone():
    """failure_detected: the first rank to notice; job_ready: the last rank (the job is ready when all are)."""
    events = all_marks()
    events += [mark("failure_detected", 42), mark("failure_detected", 60)]  # other ranks notice later
    events += [mark("job_ready", 500), mark("job_ready", 520)]  # ranks ready before the last (530)
    events += [mark("job_ready", 900)]  # a mark after first_step (730) is not this relaunch's
    ms = {s["segment"]: s["ms"] for s in milestone_spans(events)}
    assert ms["detect"] == pytest.approx(40)
    assert ms["ready"] == pytest.approx(300)
    assert ms["first_step"] == pytest.approx(200)
    only_ranks = [e for e in all_marks() if e["op"] != "job_ready"] + [mark("job_ready", 400), mark("job_ready", 450)]
    ms = {s["segment"]: s["ms"] for s in milestone_spans(only_ranks)}
    assert ms["ready"] == pytest.approx(450 - 230)
    assert ms["first_step"] == pytest.approx(730 - 450)


def test_milestone_prefixes_follow_the_playbooks_measure_name():
    names = ["reconfig.ack", "reconfig.total", "detect.latency", "failover.detect", "failover.total", "swap.ready"]
    assert milestone_prefixes(names) == ["failover", "swap"]
    assert milestone_prefixes(["x.total", "y.select+reconfigure"]) == ["y"]
    spans = {n: {"n": 1, "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0} for n in names}
    assert len(milestone_tables({"spans": spans})) == 2
