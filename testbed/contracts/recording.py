"""Where a plug-in records what happened: the run's event sink (the engine's `Recorder` is one)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

EventType = Literal["invoke", "ok", "fail", "info", "mark", "measure"]


class Recorded(Protocol):
    """An event once it is on disk: its number in the run and its moment on the run's monotonic clock."""

    @property
    def seq(self) -> int:
        """The event's number in the run (events.jsonl order)."""

    @property
    def mono_ns(self) -> int:
        """CLOCK_MONOTONIC in ns: the moment the event stands for."""


class EventSink(Protocol):
    """Appends one event to the run's history, flushed before it returns (results/README.md lists them)."""

    @property
    def run_id(self) -> str:
        """The run's id (its folder's name)."""

    def emit(
        self,
        type: EventType,
        op: str,
        *,
        mono_ns: int | None = None,
        wall: float | None = None,
        device: str | None = None,
        node: str | None = None,
        data: dict[str, Any] | None = None,
        trial: int | None = None,
        step: str | None = None,
    ) -> Recorded:
        """Record one event; `mono_ns`/`wall` default to now; the schema of `op` is checked."""
