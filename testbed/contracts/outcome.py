"""What a device call came back with, as a plug-in (and `raise_failures`) reads it: the engine's `OpResult` is one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

# A procedure's call as a device's actor runs it: (step label, procedure, keyword arguments).
Call = tuple[str, str, dict[str, Any]]


class Outcome(Protocol):
    """One procedure's result on one device: whether it did it, what it returned, and when things happened."""

    @property
    def device(self) -> str:
        """The device the procedure ran on."""

    @property
    def procedure(self) -> str:
        """The procedure it ran."""

    @property
    def status(self) -> str:
        """`ok`, `fail`, or `info` (outcome unknown: a timeout after a write, a lost actor)."""

    @property
    def value(self) -> Any:
        """What the procedure returned (plain JSON-like data), None when it failed."""

    @property
    def error(self) -> str | None:
        """Why it failed, in the words of the device error (device, address, sent, received, what to change)."""

    @property
    def marks(self) -> Mapping[str, tuple[int, float]]:
        """Milestones the procedure marked at the I/O: name -> (monotonic ns, wall-clock seconds)."""
