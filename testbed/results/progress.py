"""Live progress as an observer of events: trials done, current step, last latency."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from testbed.events import Event, Op


class ProgressDisplay:
    def __init__(self, console: Console, total_trials: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[step]}"),
            TextColumn("[cyan]{task.fields[latency]}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("trials", total=total_trials, step="starting", latency="")
        self.failed = 0

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
        elif event.op == Op.TRIAL_END:
            if event.data.get("status") != "ok":
                self.failed += 1
            self.progress.advance(self.task)
        elif event.type == "fail":
            self.progress.console.print(
                f"[red]fail[/] {escape(str(event.device))}: {event.op}: {escape(first_line(event.data.get('error')))}"
            )


def first_line(error: object) -> str:
    """The first non-blank line of a fail event's error, whatever the event carries (none, empty, not text)."""
    for line in str(error if error is not None else "").splitlines():
        if line.strip():
            return line.strip()
    return "(no error text recorded)"
