"""What a procedure gets besides its driver: marks (timestamped milestones) and a per-device cache.

A procedure runs inside a device's actor, next to the driver, so that its timestamps are taken where the I/O
happens. Each is a plain function `(driver, ctx, **kwargs) -> JSON-able value`, registered by its family;
testbed.families.PROCEDURES holds them all by name.
"""

from __future__ import annotations

import functools
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
        return self.mark_at(name, time.monotonic_ns())

    def mark_at(self, name: str, ns: int) -> int:
        """Record a milestone that happened at monotonic ns (e.g. the midpoint of a call it happened in)."""
        self.marks[name] = (ns, time.time() - (time.monotonic_ns() - ns) / 1e9)
        if self.on_mark is not None:
            self.on_mark(name)
        return ns


def forgets_on_error(key: str):
    """A procedure that caches the device's state under `key` forgets it when it fails: after an error (a
    lost acknowledgement above all) the device may hold anything, and a diff against a stale cache would
    send the wrong commands. The next call reads the device again.
    """

    def wrap(procedure):
        @functools.wraps(procedure)
        def guarded(device, ctx: ProcedureContext, **kwargs):
            try:
                return procedure(device, ctx, **kwargs)
            except BaseException:
                ctx.cache.pop(key, None)
                raise

        return guarded

    return wrap
