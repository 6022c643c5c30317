"""InvokeLedger: the one rule for which invokes are open (runner, heal and check all use it)."""

from __future__ import annotations

from testbed.events import InvokeLedger


def test_a_completion_closes_the_oldest_open_invoke_of_its_operation_on_its_device():
    ledger = InvokeLedger()
    events = [
        ("sw", "fault.inject", "invoke", 1),
        ("sw", "ocs.reconfigure", "invoke", 2),  # wrapped by the fault: both open at once
        ("sw", "ocs.reconfigure", "invoke", 3),
        ("sw", "ocs.reconfigure", "ok", 4),  # closes 2, not 3
        (None, "run.step", "invoke", 5),
    ]
    assert all(ledger.add(d, op, t, seq) for d, op, t, seq in events)
    assert ledger.still_open() == [1, 3, 5]
    assert ledger.add("sw", "ocs.reconfigure", "info", 6) and ledger.still_open() == [1, 5]
    assert not ledger.add("sw", "ocs.reconfigure", "fail", 7)  # nothing left to close
    assert not ledger.add("other", "fault.inject", "ok", 8)  # a device's completion closes only its own
    assert ledger.add("sw", "sent", "mark", 9) and ledger.still_open() == [1, 5]  # marks open nothing


def test_an_orphaned_injection_is_closed_with_the_fault_it_named_so_heal_knows_what_may_be_left(tmp_path):
    """The runner closes what a dead actor's callers left open (the injection and the device call inside it):
    the injection's `info` still names its fault and kind, so heal later heals that very fault, while the
    device call's `info` says only what happened. Recorded under the strict schema the tests run with.
    """
    from testbed.engine.coordinator import OpenInvokes
    from testbed.events import read_jsonl
    from testbed.ops.remains import find
    from testbed.results.recorder import Recorder

    recorder = Recorder(tmp_path, "run")
    orphans = OpenInvokes()
    recorder.add_observer(orphans)
    fault = {"fault": "process.hang@rank1", "kind": "process.hang", "rank": 1, "host": "gpu02"}
    recorder.emit("invoke", "fault.inject", device="gpu02", step="hang", data=fault)
    recorder.emit("invoke", "gpu.kill_job", device="gpu02", step="hang", data={"job": {"pid": 7}, "signal": "STOP"})
    assert orphans.close_all(recorder, "outcome unknown: the actor of gpu02 died") == 2
    recorder.close()

    events = read_jsonl(tmp_path / "events.jsonl").records
    closed = {e["op"]: e["data"] for e in events if e["type"] == "info"}
    lost = {"error": "outcome unknown: the actor of gpu02 died", "audit_lost": True}
    assert closed == {"fault.inject": {**fault, **lost}, "gpu.kill_job": lost}
    found = find(events)
    assert found.open_invokes == []
    assert [(f.name, f.kind, f.device, f.certain) for f in found.faults] == [
        ("process.hang@rank1", "process.hang", "gpu02", False)  # it may have happened: heal heals it
    ]
