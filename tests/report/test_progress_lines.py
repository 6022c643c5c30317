"""Progress where people look: a plain line per trial with its sweep point and an ETA when stdout is not a terminal
(a CI log, a file); on a terminal the bar shows the sweep point and the time left.
"""

from __future__ import annotations

import io

from rich.console import Console

from testbed.events import Event
from testbed.results.progress import ProgressDisplay


def trials(display: ProgressDisplay, points: list[dict], seconds: list[float]) -> None:
    """Feed the display the events of trials at `points` lasting `seconds` each, on the events' own clock."""
    wall, seq = 1_000.0, 0
    for trial, (point, took) in enumerate(zip(points, seconds, strict=True)):
        for op, data, at in (("trial.start", {"sweep": point}, wall), ("trial.end", {"status": "ok"}, wall + took)):
            seq += 1
            display.on_event(Event(seq, "mark", op, int(at * 1e9), at, "r", trial=trial, data=data))
        wall += took


def test_a_log_gets_a_line_per_trial_with_its_point_and_an_eta():
    out = io.StringIO()
    points = [{"mode": "static", "delay_ms": 10}, {"mode": "static", "delay_ms": 50}, {}, {}]
    with ProgressDisplay(Console(file=out, force_terminal=False, width=200), total_trials=4) as display:
        trials(display, points, [2.0, 4.0, 3.0, 3.0])
    lines = out.getvalue().splitlines()
    assert lines == [
        "trial 1/4 ok  point mode=static delay_ms=10  took 2.0 s  elapsed 0:00:02  eta 0:00:06",
        "trial 2/4 ok  point mode=static delay_ms=50  took 4.0 s  elapsed 0:00:06  eta 0:00:06",
        "trial 3/4 ok  took 3.0 s  elapsed 0:00:09  eta 0:00:03",
        "trial 4/4 ok  took 3.0 s  elapsed 0:00:12  eta 0:00:00",
    ]


def test_a_terminal_gets_a_bar_with_the_point_and_the_time_left():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    with ProgressDisplay(console, total_trials=3) as display:
        trials(display, [{"delay_ms": 250}], [1.0])
    text = out.getvalue()
    assert "delay_ms=250" in text and "1/3" in text and "eta" in text
    assert "trial 1/3 ok" not in text  # the bar, not the log's lines
