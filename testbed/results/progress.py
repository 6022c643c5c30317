"""Live progress as an observer of events: trials done, the time left, the sweep point, the current step, the last
latency; a plain line per trial where stdout is not a terminal.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from testbed.events import Event, Op
from testbed.results.points import point_label


class ProgressDisplay:
    """On a terminal, a bar: trials done, elapsed, the time left, the sweep point, the step, the last latency. Where
    stdout is not a terminal (a CI log, a file, a pipe), a plain line per trial as it ends: its number of the total,
    its status, its sweep point, its duration, the time elapsed and an ETA (what a bar would show, in a form a log
    keeps). The ETA is the mean duration of the trials done so far times the trials left.
    """

    def __init__(self, console: Console, total_trials: int) -> None:
        self.console = console
        self.total = total_trials
        self.lines = not console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[point]}"),
            TextColumn("{task.fields[step]}"),
            TextColumn("[cyan]{task.fields[latency]}"),
            console=console,
            transient=False,
            disable=self.lines,
        )
        self.task = self.progress.add_task("trials", total=total_trials, step="starting", latency="", point="")
        self.failed = 0
        self.done = 0
        self.first_wall: float | None = None  # the first trial's start: the ETA's clock is the events'
        self.started: dict[int | None, float] = {}
        self.points: dict[int | None, str] = {}

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def on_event(self, event: Event) -> None:
        if event.type == "invoke" and event.step:
            self.progress.update(self.task, step=event.step)
        elif event.type == "measure":
            self.progress.update(self.task, latency=f"last {event.op} {event.data['ms']:.2f} ms")
        elif event.op == Op.TRIAL_START:
            point = point_label(event.data.get("sweep") or {})
            self.points[event.trial] = point
            self.started[event.trial] = event.wall
            if self.first_wall is None:
                self.first_wall = event.wall
            self.progress.update(self.task, point="" if point == "-" else f"[magenta]{escape(point)}[/]")
        elif event.op == Op.TRIAL_END:
            status = str(event.data.get("status", "?"))
            if status != "ok":
                self.failed += 1
            self.done += 1
            self.progress.advance(self.task)
            if self.lines:
                self.console.print(self.trial_line(event, status), markup=False, highlight=False, soft_wrap=True)
        elif event.type == "fail":
            self.console.print(
                f"[red]fail[/] {escape(str(event.device))}: {event.op}: {escape(first_line(event.data.get('error')))}"
            )

    def trial_line(self, event: Event, status: str) -> str:
        """`trial 3/42 ok  point mode=static delay_ms=10  took 1.2 s  elapsed 0:00:05  eta 0:00:40`."""
        parts = [f"trial {self.done}/{self.total} {status}"]
        point = self.points.get(event.trial, "-")
        if point != "-":
            parts.append(f"point {point}")
        began = self.started.get(event.trial)
        if began is not None:
            parts.append(f"took {event.wall - began:.1f} s")
        if self.first_wall is not None:
            elapsed = max(0.0, event.wall - self.first_wall)
            left = max(0, self.total - self.done)
            parts.append(f"elapsed {_clock(elapsed)}")
            parts.append(f"eta {_clock(elapsed / self.done * left)}" if self.done else "eta -")
        return "  ".join(parts)


def _clock(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def first_line(error: object) -> str:
    """The first non-blank line of a fail event's error, whatever the event carries (none, empty, not text)."""
    for line in str(error if error is not None else "").splitlines():
        if line.strip():
            return line.strip()
    return "(no error text recorded)"
