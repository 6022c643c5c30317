"""One reader of a run's fault state (testbed/events/faults.py): `testbed check`, `testbed heal` (ops/remains.py), the
catalog and the report see the same faults, keyed the same, active or not by the same rule. Every history here is
written by the Recorder, as a run and heal write theirs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.catalog.folder import read_run as catalog_rows
from testbed.events import FORMAT_VERSION, active_faults, orphan_outcome, read_events, read_faults
from testbed.ops.check import check_run
from testbed.ops.remains import find
from testbed.results.html_report import faults as report_rows
from testbed.results.recorder import STRICT_ENV, Recorder

HANG = {"fault": "process.hang@rank1", "kind": "process.hang", "rank": 1, "host": "gpu02"}


def run_folder(path: Path) -> Path:
    """An empty run folder as `testbed run` starts one: run.json, and the events the test records."""
    path.mkdir(exist_ok=True)
    info = {"run": "r1", "format_version": FORMAT_VERSION, "inventory": {"name": "lab", "devices": {}}}
    (path / "run.json").write_text(json.dumps(info))
    return path


def events_of(run: Path) -> list[dict]:
    return read_events(run / "events.jsonl").records


def unhealed(run: Path) -> list[str]:
    return check_run(run).checks["every fault healed"]


@pytest.mark.unchecked_history("an unnamed fault is left active on purpose")
def test_an_unnamed_fault_is_keyed_by_its_invoke_seq_in_check_heal_the_catalog_and_the_report(tmp_path, monkeypatch):
    """A fault recorded without a name (a history from before the schema required one): every reader keys it
    seq<N>, N its injection's invoke, even when its outcome comes later with other events between.
    """
    monkeypatch.delenv(STRICT_ENV)  # the recorder records an event outside the schema, with a warning
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    recorder.emit("mark", "run.start", data={"seed": 0, "trials": 1})
    unnamed = {"kind": "process.hang", "rank": 0, "host": "gpu01"}
    recorder.emit("invoke", "fault.inject", device="gpu01", step="hang", data=unnamed)  # seq 2
    recorder.emit("invoke", "fault.inject", device="gpu02", step="hang", data=HANG)
    recorder.emit("ok", "fault.inject", device="gpu02", step="hang", data=HANG)
    recorder.emit("ok", "fault.inject", device="gpu01", step="hang", data=unnamed)  # closes seq 2
    recorder.close()
    events = events_of(run)

    assert [(f.key, f.injected, f.inject_seq, f.inject_end_seq) for f in read_faults(events)] == [
        ("seq2", "ok", 2, 5),
        ("process.hang@rank1", "ok", 3, 4),
    ]
    assert unhealed(run) == [
        "fault seq2 injected at seq 2 was never healed",
        "fault process.hang@rank1 injected at seq 3 was never healed",
    ]
    assert [(f.name, f.kind, f.device, f.certain) for f in find(events).faults] == [
        ("seq2", "process.hang", "gpu01", True),
        ("process.hang@rank1", "process.hang", "gpu02", True),
    ]
    rows = catalog_rows(run, indexed_at=0.0).children["faults"]
    assert [(r["fault"], r["kind"], r["target"], r["injected"], r["healed"]) for r in rows] == [
        ("seq2", "process.hang", "gpu01", "ok", None),
        ("process.hang@rank1", "process.hang", "gpu02", "ok", None),
    ]
    assert [(r["fault"], r["injected"], r["healed"]) for r in report_rows(events)] == [
        ("seq2", "ok", "never"),
        ("process.hang@rank1", "ok", "never"),
    ]


def test_heal_names_an_unnamed_fault_by_its_key_so_every_reader_sees_it_healed(tmp_path, monkeypatch):
    """Heal appends to the run's history through the recorder reopened, and its fault.heal names the unnamed fault
    by its key (and so fits the schema): after it, nothing is active and the sequence numbers go on rising.
    """
    monkeypatch.delenv(STRICT_ENV)
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    unnamed = {"kind": "process.hang", "rank": 0, "host": "gpu01"}
    recorder.emit("invoke", "fault.inject", device="gpu01", step="hang", data=unnamed)
    recorder.emit("ok", "fault.inject", device="gpu01", step="hang", data=unnamed)
    recorder.close()
    (fault,) = find(events_of(run)).faults
    assert fault.data == {**unnamed, "fault": "seq1"}

    monkeypatch.setenv(STRICT_ENV, "1")  # heal's events fit the schema
    healer = Recorder.reopen(run, "r1")
    healer.emit("invoke", "fault.heal", device=fault.device, step="heal", data=fault.data)
    healer.emit("ok", "fault.heal", device=fault.device, step="heal", data={**fault.data, "how": "SIGCONT"})
    healer.close()
    events = events_of(run)  # read_events refuses sequence numbers that do not rise
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    assert active_faults(events) == [] and find(events).faults == [] and unhealed(run) == []
    (row,) = catalog_rows(run, indexed_at=0.0).children["faults"]
    assert (row["fault"], row["injected"], row["healed"]) == ("seq1", "ok", "ok")
    (shown,) = report_rows(events)
    assert (shown["fault"], shown["healed"]) == ("seq1", "ok")


@pytest.mark.unchecked_history("the orphaned fault is left active on purpose")
def test_an_orphaned_injection_closed_with_info_counts_as_possibly_active(tmp_path):
    """The runner (or heal) closes an injection whose caller died with info, repeating the fault it named: the
    fault may have happened, so every reader counts it active, and heal heals it.
    """
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    invoke = recorder.emit("invoke", "fault.inject", device="gpu02", step="hang", data=HANG)
    closing = orphan_outcome("fault.inject", HANG, "outcome unknown: the runner died", invoke_seq=invoke.seq)
    recorder.emit("info", "fault.inject", device="gpu02", step="hang", data=closing)
    recorder.close()
    events = events_of(run)

    (fault,) = active_faults(events)
    assert (fault.key, fault.injected, fault.certain) == ("process.hang@rank1", "info", False)
    assert fault.data == HANG  # the fault's payload, not the closing's error
    assert unhealed(run) == ["fault process.hang@rank1 injected at seq 1, its outcome unknown, was never healed"]
    (dead,) = find(events).faults
    assert (dead.name, dead.certain, dead.data) == ("process.hang@rank1", False, HANG)
    (row,) = catalog_rows(run, indexed_at=0.0).children["faults"]
    assert (row["fault"], row["injected"], row["healed"]) == ("process.hang@rank1", "info", None)


@pytest.mark.unchecked_history("an injection is left open on purpose")
def test_an_injection_never_closed_counts_as_possibly_active(tmp_path):
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    recorder.emit("invoke", "fault.inject", device="gpu02", step="hang", data=HANG)
    recorder.close()
    (fault,) = find(events_of(run)).faults
    assert (fault.name, fault.certain) == ("process.hang@rank1", False)
    assert unhealed(run) == ["fault process.hang@rank1 injected at seq 1, its injection never ended, was never healed"]


def test_a_healed_fault_is_not_active_and_a_refused_one_never_was(tmp_path):
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    for type_ in ("invoke", "ok"):
        recorder.emit(type_, "fault.inject", device="gpu02", step="hang", data=HANG)
    for type_ in ("invoke", "ok"):
        recorder.emit(type_, "fault.heal", device="gpu02", step="hang", data=HANG)
    refused = {"fault": "gpu.fail@rank0", "kind": "gpu.fail", "host": "gpu01"}
    recorder.emit("invoke", "fault.inject", device="gpu01", step="fail", data=refused)
    recorder.emit("fail", "fault.inject", device="gpu01", step="fail", data={**refused, "error": "refused"})
    recorder.close()
    events = events_of(run)

    assert [(f.key, f.injected, f.healed, f.active) for f in read_faults(events)] == [
        ("process.hang@rank1", "ok", "ok", False),
        ("gpu.fail@rank0", "fail", None, False),
    ]
    assert unhealed(run) == [] and find(events).faults == []
    rows = catalog_rows(run, indexed_at=0.0).children["faults"]
    assert [(r["fault"], r["injected"], r["healed"]) for r in rows] == [
        ("process.hang@rank1", "ok", "ok"),
        ("gpu.fail@rank0", "fail", None),
    ]
    assert [(r["injected"], r["healed"], r["error"]) for r in report_rows(events)] == [
        ("ok", "ok", ""),
        ("failed", "never", "refused"),
    ]


@pytest.mark.unchecked_history("the second injection's heal fails on purpose")
def test_a_heal_belongs_to_the_latest_injection_of_its_fault_and_one_that_failed_leaves_it_active(tmp_path):
    """The same fault injected in two trials: each heal closes the injection before it; a failed heal leaves the
    fault active.
    """
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    for trial, heal in ((0, "ok"), (1, "fail")):
        recorder.emit("invoke", "fault.inject", device="gpu02", trial=trial, data=HANG)
        recorder.emit("ok", "fault.inject", device="gpu02", trial=trial, data=HANG)
        recorder.emit("invoke", "fault.heal", device="gpu02", trial=trial, data=HANG)
        outcome = HANG if heal == "ok" else {**HANG, "error": "SIGCONT refused"}
        recorder.emit(heal, "fault.heal", device="gpu02", trial=trial, data=outcome)
    recorder.close()
    events = events_of(run)

    assert [(f.trial, f.healed, f.heal_error, f.active) for f in read_faults(events)] == [
        (0, "ok", "", False),
        (1, "fail", "SIGCONT refused", True),
    ]
    assert unhealed(run) == ["fault process.hang@rank1 injected at seq 5 was never healed"]


def test_the_recorder_reopened_refuses_a_history_whose_last_line_is_torn(tmp_path):
    run = run_folder(tmp_path / "run")
    recorder = Recorder(run, "r1")
    recorder.emit("mark", "run.start", data={"seed": 0, "trials": 1})
    recorder.close()
    with open(run / "events.jsonl", "a") as f:
        f.write('{"seq": 2, "ty')  # the runner killed mid-write
    with pytest.raises(ValueError, match="torn"):
        Recorder.reopen(run, "r1")
