"""Appends every event to events.jsonl and every device exchange to audit.jsonl, flushed as written.

One writer per file, in the coordinator's process: a crash of any other process loses nothing that
was recorded, and a line is never torn because only one thread writes it, in a single write call.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from drivers.audit import AuditRecord
from testbed.contracts.recording import EventSink
from testbed.events import Event, EventType, Observer, now, read_events
from testbed.events.safe_files import open_append, open_fd
from testbed.events.schema import SchemaError, check_event
from testbed.families import PROCEDURES
from testbed.results.redact import StreamRedactor, redact

log = logging.getLogger(__name__)
# Tests set it: an event outside the schema is then an error, not a warning (a lab run keeps going).
STRICT_ENV = "TESTBED_STRICT_EVENTS"
NOT_RUN = "not run: an earlier step on this device failed"


class Recorder(EventSink):
    """The run's event sink: events.jsonl and audit.jsonl, each event checked against the schema and flushed."""

    def __init__(self, run_dir: Path, run_id: str, observers: list[Observer] | None = None) -> None:
        self._run_id = run_id
        # Appended to as regular files of the folder, never through a link planted there (safe_files).
        self._events = os.fdopen(open_append(run_dir / "events.jsonl"), "a", encoding="utf-8")
        self._audit = os.fdopen(open_append(run_dir / "audit.jsonl"), "a", encoding="utf-8")
        self._observers = list(observers or [])
        self._seq = 0
        self._lock = threading.Lock()
        self.trial: int | None = None
        self.step: str | None = None
        self._strict = os.environ.get(STRICT_ENV) == "1"
        self._procedures = PROCEDURES.marks()  # the registered families' procedures and their marks
        self._warned: set[tuple[str, str]] = set()
        self._streams = StreamRedactor()  # a device's writes, each redacted knowing the one before

    @classmethod
    def reopen(cls, run_dir: Path, run_id: str) -> Recorder:
        """The recorder of a run that has stopped (ended, or its runner died), opened again to append to its history
        (`testbed heal`): sequence numbers go on from its last event. Its files must end with a whole line: a torn
        last line is set aside first (testbed.events.set_aside_torn_line), or the next event would be glued to it.
        """
        events = read_events(run_dir / "events.jsonl")
        if events.torn:
            raise ValueError(f"{run_dir}: {events.torn}; set it aside before appending")
        recorder = cls(run_dir, run_id)
        recorder._seq = events.records[-1]["seq"] if events.records else 0
        return recorder

    @property
    def run_id(self) -> str:
        """The run's id (its folder's name)."""
        return self._run_id

    def add_observer(self, observer: Observer) -> None:
        self._observers.append(observer)

    def emit(
        self,
        type: EventType,
        op: str,
        *,
        mono_ns: int | None = None,
        wall: float | None = None,
        device: str | None = None,
        node: str | None = None,
        data: dict | None = None,
        trial: int | None = None,
        step: str | None = None,
    ) -> Event:
        self._check(type, op, data or {}, device)
        if mono_ns is None:
            mono_ns, wall = now()
        elif wall is None:
            wall = time.time()  # the caller's monotonic time stands; wall time is only for humans
        with self._lock:
            self._seq += 1
            event = Event(
                seq=self._seq,
                type=type,
                op=op,
                mono_ns=mono_ns,
                wall=wall,
                run=self.run_id,
                trial=self.trial if trial is None else trial,
                step=step or self.step,
                node=node,
                device=device,
                data=data or {},
            )
            self._events.write(json.dumps(redact(event.to_dict()), default=str) + "\n")
            self._events.flush()
        for observer in self._observers:
            observer.on_event(event)
        return event

    def _check(self, type_: str, op: str, data: dict, device: str | None) -> None:
        """Every event fits testbed/events/schema.py (results/README.md documents it)."""
        try:
            check_event(type_, op, data, device=device, procedures=self._procedures)
        except SchemaError:
            if self._strict:
                raise
            if (type_, op) not in self._warned:
                self._warned.add((type_, op))
                log.warning("event outside the schema (recorded all the same)", exc_info=True)

    # --- a device operation: one way to record it, for a run's coordinator and for heal -----------------------

    def invoke(self, device: str, procedure: str, kwargs: dict, step: str) -> Event:
        """An operation about to start on a device (its outcome follows as `outcome`)."""
        return self.emit("invoke", procedure, device=device, step=step, data=summarise(kwargs))

    def outcome(self, device: str, step: str, procedure: str, result) -> None:
        """What an operation did: its audit records, its marks and its outcome, from the device actor's OpResult
        (testbed.engine.device_actor); None is a call not run because an earlier call of its program failed.
        """
        if result is None:
            self.emit("fail", procedure, device=device, step=step, data={"error": NOT_RUN})
            return
        self.audit(result.audit)
        for name, (ns, wall) in sorted(result.marks.items(), key=lambda m: m[1][0]):
            self.emit("mark", name, mono_ns=ns, wall=wall, device=device, node=result.node, step=step)
        if result.status == "ok":
            data = {"value": result.value}
        else:
            data = {"error": result.error, "error_type": result.error_type}
        data["duration_ms"] = (result.end[0] - result.start[0]) / 1e6
        self.emit(
            result.status,
            result.procedure,
            mono_ns=result.end[0],
            wall=result.end[1],
            device=device,
            node=result.node,
            step=step,
            data=data,
        )

    def audit(self, records: list[AuditRecord]) -> None:
        if not records:
            return
        with self._lock:
            self._audit.write("".join(json.dumps(self._redacted(r)) + "\n" for r in records))
            self._audit.flush()

    def _redacted(self, record: AuditRecord) -> dict:
        """A device exchange with its secrets masked, a secret split over two writes of one stream included."""
        out = record.to_dict()
        out["data"] = self._streams.redact((record.device, record.direction), record.data)
        return redact(out)

    def close(self) -> None:
        with self._lock:
            self._events.close()
            self._audit.close()


def summarise(kwargs: dict) -> dict:
    """Keep invoke events readable: long lists become counts."""
    return {k: f"{len(v)} items" if isinstance(v, list) and len(v) > 8 else v for k, v in kwargs.items()}


def count_lines(path: Path) -> int:
    """Complete lines in a file (the position of the next audit record)."""
    try:
        fd = open_fd(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    with os.fdopen(fd, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
