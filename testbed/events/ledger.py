"""Which operations are still open: the one rule for the runner, `testbed heal` and `testbed check`."""

from __future__ import annotations


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
