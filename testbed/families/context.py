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
from typing import Concatenate, ParamSpec, TypeVar

Driver = TypeVar("Driver")
Params = ParamSpec("Params")
Result = TypeVar("Result")


@dataclass
class ProcedureContext:
    """One device's procedure call as its procedure sees it: the device, its marks, and the device's cache."""

    device: str
    address: str
    # Survives between calls: one actor owns one device. Each family keeps values of its own types under its own
    # keys (a switch's circuits, a host's job handles), so the one who reads a key knows what is under it.
    cache: dict[str, object] = field(default_factory=dict)
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


def forgets_on_error(
    key: str,
) -> Callable[
    [Callable[Concatenate[Driver, ProcedureContext, Params], Result]],
    Callable[Concatenate[Driver, ProcedureContext, Params], Result],
]:
    """A procedure that caches the device's state under `key` forgets it when it fails: after an error (a
    lost acknowledgement above all) the device may hold anything, and a diff against a stale cache would
    send the wrong commands. The next call reads the device again.
    """

    def wrap(
        procedure: Callable[Concatenate[Driver, ProcedureContext, Params], Result],
    ) -> Callable[Concatenate[Driver, ProcedureContext, Params], Result]:
        @functools.wraps(procedure)
        def guarded(device: Driver, ctx: ProcedureContext, /, *args: Params.args, **kwargs: Params.kwargs) -> Result:
            try:
                return procedure(device, ctx, *args, **kwargs)
            except BaseException:
                ctx.cache.pop(key, None)
                raise

        return guarded

    return wrap
