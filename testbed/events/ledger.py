"""Which operations are still open: the one rule for the runner, `testbed heal` and `testbed check`."""

from __future__ import annotations

from testbed.events.schema import SCHEMA


class InvokeLedger:
    """Which invokes are still open. Each completion (ok / fail / info) closes the oldest open invoke of the
    same operation on the same device: an operation such as fault.inject may wrap device operations, so a
    device can have several open. The one rule for the runner (live), `testbed heal` and `testbed check`.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[str | None, str], list] = {}

    def add(self, device: str | None, op: str, type_: str, event: object) -> bool:
        """Record one event; False for a completion that closes no invoke."""
        if type_ == "invoke":
            self._open.setdefault((device, op), []).append(event)
        elif type_ in ("ok", "fail", "info"):
            queue = self._open.get((device, op))
            if not queue:
                return False
            queue.pop(0)
        return True

    def still_open(self) -> list:
        """The open invokes, operation by operation in the order each first appeared."""
        return [e for queue in self._open.values() for e in queue]


def orphan_outcome(op: str, invoke_data: dict, error: str, **extra) -> dict:
    """The payload of the `info` that closes an invoke nobody will close (its caller or the runner died).

    An operation of the framework's own (fault.inject, fault.heal) keeps one payload from invoke to outcome:
    its closing `info` repeats what the invoke said (which fault, of which kind), or heal could not tell what
    may be left active. A device procedure's outcome carries no arguments, only what happened.
    """
    spec = SCHEMA.get(op)
    carried = dict(invoke_data) if spec is not None and "invoke" in spec.types else {}
    return {**carried, "error": error, "audit_lost": True, **extra}
