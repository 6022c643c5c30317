"""The server's runs: a FIFO queue of submitted runs, the one running, those done; and the log of what happened to
them, which GET /events streams. Threads share it (the HTTP server's and the runner's), so every change is made
under one lock and recorded as an event in the order it was made: the order of the events is the order of the runs.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KEPT_EVENTS = 20_000  # the log's tail kept for clients that join late (GET /events?since=N)
KEPT_DONE = 500  # runs listed after they ended


@dataclass
class QueuedRun:
    """One submitted run. `status`: queued, running, ok, failed, aborted, cancelled (removed before it started)
    or refused (its playbook or options were refused when it came to run).
    """

    id: str
    uid: int
    user: str
    playbook_file: str
    options: dict[str, Any]
    plan: Any = None  # testbed.plan.Plan, made when the run was submitted
    playbook_text: str = ""  # what the plan was made from: kept in the queue file, planned again after a restart
    status: str = "queued"
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    ended: float | None = None
    run_dir: str | None = None
    error: str | None = None

    def describe(self, position: int | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "uid": self.uid,
            "playbook": self.playbook_file,
            "status": self.status,
            "position": position,
            "trials": self.options.get("trials"),
            "seed": self.options.get("seed"),
            "tags": self.options.get("tags", []),
            "submitted": self.submitted,
            "started": self.started,
            "ended": self.ended,
            "run_dir": self.run_dir,
            "error": self.error,
        }

    def record(self) -> dict[str, Any]:
        """What the queue file keeps of it (testbed.serve.queue_file): enough to plan it again."""
        return {
            "id": self.id,
            "uid": self.uid,
            "user": self.user,
            "playbook_file": self.playbook_file,
            "playbook_text": self.playbook_text,
            "options": self.options,
            "submitted": self.submitted,
            "started": self.started,
            "run_dir": self.run_dir,
        }


class Closed(Exception):
    """The queue takes no more runs: the server is stopping."""


class RunQueue:
    """`saver(running, queued)`: given the records of the run under way and of the queued runs in order after every
    change to them, inside the lock (so the saved order is the order of the changes): the queue file's save.
    """

    def __init__(self, saver: Callable[[dict | None, list[dict]], None] | None = None) -> None:
        self._lock = threading.Condition()
        self._queued: list[QueuedRun] = []
        self.running: QueuedRun | None = None
        self._done: list[QueuedRun] = []
        self._events: list[dict] = []
        self._seq = itertools.count(1)
        self._last_seq = 0
        self._listeners: list[Callable[[dict], None]] = []
        self.closed = False
        self._saver = saver

    # -- what clients do ----------------------------------------------------------------------------------

    def submit(self, uid: int, user: str, playbook_file: str, options: dict, plan, text: str = "") -> QueuedRun:
        with self._lock:
            if self.closed:
                raise Closed()
            run = QueuedRun(secrets.token_hex(4), uid, user, playbook_file, options, plan, text)
            self._queued.append(run)
            self._save()
            self._record("run.queued", run)
            self._lock.notify_all()
            return run

    def cancel(self, run: QueuedRun, by: str) -> str:
        """Remove a queued run -> "cancelled"; a running one is stopped by the runner -> "stopping"."""
        with self._lock:
            if run in self._queued:
                self._queued.remove(run)
                self._save()
                self._end(run, "cancelled", f"cancelled by {by} before it started")
                return "cancelled"
            return "stopping" if run is self.running else run.status

    def move(self, run: QueuedRun, position: int) -> int:
        """Put a queued run at `position` (1 is next; past the end is last) -> the position it has now."""
        with self._lock:
            if run not in self._queued:
                raise ValueError(f"run {run.id} is {run.status}, not queued: only a queued run moves")
            self._queued.remove(run)
            index = min(max(position, 1), len(self._queued) + 1) - 1
            self._queued.insert(index, run)
            self._save()
            self._record("run.moved", run)
            return index + 1

    # -- what the runner does -----------------------------------------------------------------------------

    def take(self) -> QueuedRun:
        """The next run, marked running; waits for one. Raises Closed once the queue is closed."""
        with self._lock:
            while not self._queued and not self.closed:
                self._lock.wait()
            if self.closed:
                raise Closed()
            run = self._queued.pop(0)
            run.status, run.started = "running", time.time()
            self.running = run
            self._save()
            self._record("run.started", run)
            return run

    def finish(self, run: QueuedRun, status: str, error: str | None = None, run_dir: str | None = None) -> None:
        with self._lock:
            if self.running is run:
                self.running = None
            run.run_dir = run_dir or run.run_dir
            self._save()
            self._end(run, status, error)

    def has_folder(self, run: QueuedRun, run_dir: str) -> None:
        """The running run has its results folder: saved with it, so a server killed now says which to heal."""
        with self._lock:
            run.run_dir = run_dir
            self._save()

    def progress(self, run: QueuedRun, data: dict) -> None:
        with self._lock:
            self._record("run.progress", run, data)

    def close(self, why: str) -> list[QueuedRun]:
        """Take no more runs and cancel those queued -> them."""
        with self._lock:
            self.closed = True
            cancelled, self._queued = self._queued, []
            self._save()
            for run in cancelled:
                self._end(run, "cancelled", why)
            self._lock.notify_all()
            return cancelled

    def restore(self, runs: list[QueuedRun], lost: list[QueuedRun]) -> None:
        """At a start: the runs the last server left queued, queued again in their order; those it left unmade
        (the one it was running, those that no longer plan) listed as ended, with their status and error as set.
        """
        with self._lock:
            for run in lost:
                self._end(run, run.status, run.error)
            self._queued.extend(runs)
            self._save()
            for run in runs:
                self._record("run.queued", run)
            self._lock.notify_all()

    # -- reading --------------------------------------------------------------------------------------------

    def find(self, run_id: str) -> QueuedRun | None:
        with self._lock:
            return next((r for r in self._all() if r.id == run_id), None)

    def listing(self) -> tuple[int, list[dict]]:
        """(the last event's seq, every run: the running one, the queued in their order (position 1 is next), then
        those done, newest first): the runs as they stand after that event.
        """
        with self._lock:
            rows = [self.running.describe(None)] if self.running is not None else []
            rows += [r.describe(i) for i, r in enumerate(self._queued, 1)]
            rows += [r.describe(None) for r in reversed(self._done)]
            return self._last_seq, rows

    def describe(self, run: QueuedRun) -> dict:
        with self._lock:
            return run.describe(self._queued.index(run) + 1 if run in self._queued else None)

    def events_since(self, seq: int, listener: Callable[[dict], None] | None = None) -> list[dict]:
        """The events after `seq`, and (given a listener) every later one passed to it as it happens: both at once
        under the lock, so a client that joins misses none and sees none twice.
        """
        with self._lock:
            if listener is not None:
                self._listeners.append(listener)
            return [e for e in self._events if e["seq"] > seq]

    def forget(self, listener: Callable[[dict], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    # -- inside the lock --------------------------------------------------------------------------------------

    def _all(self) -> list[QueuedRun]:
        return ([self.running] if self.running is not None else []) + self._queued + self._done

    def _save(self) -> None:
        if self._saver is not None:
            running = self.running.record() if self.running is not None else None
            self._saver(running, [r.record() for r in self._queued])

    def _end(self, run: QueuedRun, status: str, error: str | None) -> None:
        run.status, run.error, run.ended = status, error, time.time()
        self._done.append(run)
        del self._done[:-KEPT_DONE]
        self._record("run.ended", run)

    def _record(self, kind: str, run: QueuedRun, data: dict | None = None) -> None:
        position = self._queued.index(run) + 1 if run in self._queued else None
        self._last_seq = next(self._seq)
        event = {"seq": self._last_seq, "type": kind, "time": time.time(), "run": run.describe(position)}
        if data is not None:
            event["data"] = data
        self._events.append(event)
        del self._events[:-KEPT_EVENTS]
        for listener in list(self._listeners):
            listener(event)
