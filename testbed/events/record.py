"""An event as the recorder writes it, and who sees events as they are recorded.

Types follow Jepsen histories: an operation on a device is an `invoke` followed by `ok`, `fail` or
`info` (outcome unknown, e.g. a write whose acknowledgement timed out). Two more types: `mark`, a
point in time observed inside a device actor (a milestone such as `switch_acked`), and `measure`, a
span between two marks, which is what the summary aggregates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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
        out: dict[str, object] = {
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


def now() -> tuple[int, float]:
    return time.monotonic_ns(), time.time()
