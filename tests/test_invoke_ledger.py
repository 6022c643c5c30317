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
