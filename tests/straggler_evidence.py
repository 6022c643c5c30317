"""What a straggler run recorded that shows the straggler slowed the job, without comparing wall-clock figures.

A persistent straggler stops one rank for `duty` of every `period_ms`; in a ring every rank waits for it, so the
measured rank's iterations (job.measure's "intervals_ms", one per step) include the stops. Each stop lasts at
least duty x period_ms whatever else runs on the machine (a stopped process cannot be woken early, and a late
SIGCONT only lengthens it), and no step of the ring completes while a rank is stopped, so a stop falls inside one
interval. So among the straggled intervals there are stalls, and together they hold at least the stops of the
whole periods the measurement spanned. A busy machine lengthens steps and intervals alike, which only adds
periods, and stops, to the window: it cannot make the check fail, where comparing the two phases' medians could.

Margins: a stall is counted from half a stop, for the part of the stop the measured rank spent on its own step
(a step's compute and sleep: the straggler may be a step ahead) and the delay in reading the lines; two periods
are discounted, for the fault starting after the measurement and for the partial period at its end.
"""

from __future__ import annotations

import json
from pathlib import Path


def straggled_intervals(run_dir: Path, measure: str = "straggled") -> list[float]:
    """The per-step intervals (ms) job.measure recorded for `measure`.time in the run's events."""
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "measure" and event.get("op") == f"{measure}.time":
            return event["data"]["intervals_ms"]
    raise AssertionError(f"no {measure}.time measurement in {run_dir / 'events.jsonl'}")


def assert_the_stops_slowed_the_job(intervals: list[float], duty: float, period_ms: float) -> None:
    """The straggled iterations hold the straggler's stops (see the module's docstring)."""
    stop_ms = duty * period_ms
    window_ms = sum(intervals)
    stalls = [ms for ms in intervals if ms >= stop_ms / 2]
    whole_periods = int(window_ms // period_ms) - 2
    assert stalls, f"no iteration of {stop_ms / 2:g} ms or more with the straggler: {intervals}"
    assert sum(stalls) >= stop_ms / 2 * whole_periods, (
        f"{len(stalls)} stalls ({sum(stalls):.0f} ms) over {window_ms:.0f} ms: fewer than the straggler's "
        f"{whole_periods} whole periods of {period_ms:g} ms: {intervals}"
    )
