"""One event vocabulary for the recorder, the live display and the report.

Types follow Jepsen histories: an operation on a device is an `invoke` followed by `ok`, `fail` or
`info` (outcome unknown, e.g. a write whose acknowledgement timed out). Two more types: `mark`, a
point in time observed inside a device actor (a milestone such as `switch_acked`), and `measure`, a
span between two marks, which is what the summary aggregates.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

EventType = Literal["invoke", "ok", "fail", "info", "mark", "measure"]


@dataclass(frozen=True)
class Event:
    seq: int
    type: EventType
    op: str  # e.g. "run.start", "reconfigure", "switch_acked", "reconfig.ack"
    mono_ns: int  # time.monotonic_ns() where it happened (inside the device actor for device I/O)
    wall: float  # time.time() at the same moment
    run: str
    trial: int | None = None
    step: str | None = None
    node: str | None = None
    device: str | None = None
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        # Built by hand: dataclasses.asdict deep-copies `data`, which costs more than the write itself.
        out = {
            "seq": self.seq,
            "type": self.type,
            "op": self.op,
            "mono_ns": self.mono_ns,
            "wall": self.wall,
            "run": self.run,
        }
        for key in ("trial", "step", "node", "device"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.data:
            out["data"] = self.data
        return out


class Observer(Protocol):
    """Sees every event as it is recorded (the progress display, the summary collector)."""

    def on_event(self, event: Event) -> None: ...


class InvokeLedger:
    """Which invokes are still open. Each completion (ok / fail / info) closes the oldest open invoke of the
    same operation on the same device: an operation such as fault.inject may wrap device operations, so a
    device can have several open. The one rule for the runner (live), `testbed heal` and `testbed check`."""

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


def now() -> tuple[int, float]:
    return time.monotonic_ns(), time.time()


def read_events(path: Path) -> Iterator[dict]:
    """events.jsonl, line by line; a line cut short (an aborted run) is skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event
