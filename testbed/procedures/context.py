"""What a procedure gets besides its driver: marks (timestamped milestones) and a per-device cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ProcedureContext:
    device: str
    address: str
    cache: dict = field(default_factory=dict)  # survives between calls: one actor owns one device
    marks: dict[str, tuple[int, float]] = field(default_factory=dict)
    on_mark: Callable[[str], None] | None = None  # lets the actor tell a waiting coordinator

    def mark(self, name: str) -> int:
        """Record a milestone now (monotonic ns and wall time), in the actor's process."""
        ns = time.monotonic_ns()
        self.marks[name] = (ns, time.time())
        if self.on_mark is not None:
            self.on_mark(name)
        return ns
