"""write_plots: PNGs next to the results, each only when the run has the data for it; headless."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.contracts.errors import UserError
from testbed.results.plots import (
    CDF_FILE,
    LATENCY_CDF_FILE,
    SWEEP_FILE,
    SWEEP_SPANS_FILE,
    TIMELINE_FILE,
    cdf_spans,
    measured_at_every_point,
    pick_median_trial,
    span_durations,
    sweep_axes,
    write_plots,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    """A real PNG that matplotlib drew something into: signature, IHDR size, and pixels that vary."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 150
    assert len(data) > 10_000
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[:2] == (height, width)
    rgb = pixels[..., :3]
    assert rgb.std() > 0.02  # not a blank canvas
    assert (rgb.reshape(-1, 3) < 0.5).all(axis=1).mean() > 0.001  # some dark ink: text, axes, lines


def test_failover_run_gets_cdf_and_timeline(runs):
    run = runs("failover")
    written = write_plots(run)
    assert sorted(p.name for p in written) == sorted([CDF_FILE, TIMELINE_FILE])
    for path in written:
        assert path.parent == run
        assert_png(path)
    assert not (run / SWEEP_FILE).exists()
    assert not (run / LATENCY_CDF_FILE).exists()
    assert not list(run.glob("*.tmp"))


def test_sweep_run_gets_only_the_sweep_figure(runs):
    run = runs("sweep")
    written = write_plots(run)
    assert [p.name for p in written] == [SWEEP_FILE]
    assert_png(written[0])
    summary = json.loads((run / "summary.json").read_text())
    assert sweep_axes([p["point"] for p in summary["sweep"]]) == ("delay_ms", ["mode"])


def test_a_sweep_without_iteration_time_gets_a_figure_of_its_spans(runs):
    """Straggler's duty-cycle sweep measures baseline.time and straggled.time, not iteration.time: its figure has
    a line for each against the duty cycle, and no iteration-time figure is drawn empty.
    """
    run = runs("straggler")
    summary = json.loads((run / "summary.json").read_text())
    assert measured_at_every_point(summary) == ["baseline.time", "straggled.time"]
    written = write_plots(run)
    assert [p.name for p in written] == [SWEEP_SPANS_FILE]
    assert_png(written[0])
    assert not (run / SWEEP_FILE).exists()
    # A sweep of iteration.time keeps its own figure, not this one
    assert not (runs("sweep") / SWEEP_SPANS_FILE).exists()


def test_sweep_with_too_few_samples_for_a_ci_still_plots(runs):
    written = write_plots(runs("sweep", per_point=3))
    assert [p.name for p in written] == [SWEEP_FILE]
    assert_png(written[0])


def test_without_failover_one_cdf_per_total_or_latency_span(runs):
    run = runs("latency")
    assert cdf_spans(span_durations(run)) == ["link.latency", "reconfig.total"]
    written = write_plots(run)
    assert [p.name for p in written] == [LATENCY_CDF_FILE]
    assert_png(written[0])


def test_failover_total_wins_over_other_spans():
    durations = {"failover.total": [1.0, 2.0], "reconfig.total": [3.0], "x.latency": [4.0]}
    assert cdf_spans(durations) == ["failover.total"]
    assert cdf_spans({"reconfig.ack": [1.0], "failover.total": []}) == []


def test_no_data_no_plots(runs, tmp_path):
    assert write_plots(runs("plain", values_ms=[1.0, 2.0, 3.0], span="reconfig.ack")) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_plots(empty) == []
    assert list(empty.iterdir()) == []
    with pytest.raises(UserError):
        write_plots(tmp_path / "missing")


def test_measures_read_from_events_when_trials_csv_is_missing(runs):
    run = runs("latency")
    from_csv = span_durations(run)
    (run / "trials.csv").unlink()
    from_events = span_durations(run)
    assert from_events.keys() == from_csv.keys()
    for name in from_csv:
        assert from_events[name] == pytest.approx(from_csv[name], abs=1e-5)


def test_timeline_picks_the_trial_with_the_median_total(runs):
    run = runs("failover", trials=9)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    totals = {e["trial"]: e["data"]["ms"] for e in events if e["op"] == "failover.total"}
    trial, found, ranked = pick_median_trial(events)
    assert ranked == 9
    assert totals[trial] == pytest.approx(float(np.median(list(totals.values()))))
    assert (found["first_step"] - found["fault_injected"]) / 1e6 == pytest.approx(totals[trial])


def test_timeline_with_missing_milestones(runs):
    run = runs("failover", skip=("spare_selected", "link_verified"))
    written = write_plots(run)
    assert TIMELINE_FILE in [p.name for p in written]
    assert_png(run / TIMELINE_FILE)


def test_no_timeline_without_fault_injected(runs):
    run = runs("failover", trials=6, skip=("fault_injected",))
    names = [p.name for p in write_plots(run)]
    assert TIMELINE_FILE not in names
    assert CDF_FILE not in names  # no fault_injected: no total either


def test_headless_in_a_fresh_interpreter_without_display(runs):
    """No DISPLAY, no MPLBACKEND: the figures are drawn on the Agg canvas, pyplot is never imported."""
    run = runs("failover", trials=6)
    code = (
        "import sys; from testbed.results.plots import write_plots; "
        f"paths = write_plots({str(run)!r}); "
        "assert 'matplotlib.pyplot' not in sys.modules; print(len(paths))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(run), "MPLCONFIGDIR": str(run / ".mpl")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"


def test_each_segment_has_one_colour_in_every_timeline(runs):
    """The PNG timeline and the HTML page's timeline draw a segment in the same colour, whatever else the trial
    has; in-job's publish takes relaunch's (its place); a joined segment (a milestone skipped) its first part's.
    """
    from matplotlib.colors import to_rgb

    from testbed.results.html_report import timeline_svg
    from testbed.results.milestones import (
        SEGMENT_COLOURS,
        SEGMENT_NAMES,
        segment_colour,
        segments_of,
        trial_milestones,
    )

    assert SEGMENT_NAMES <= set(SEGMENT_COLOURS)
    assert len({SEGMENT_COLOURS[s] for s in SEGMENT_NAMES if s != "publish"}) == len(SEGMENT_NAMES) - 1
    assert segment_colour("publish") == segment_colour("relaunch")
    assert segment_colour("verify+relaunch") == segment_colour("verify")

    for skip in ((), ("spare_selected", "link_verified")):
        run = runs("failover", skip=skip, trials=5)
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        svg = timeline_svg(trial_milestones(events))
        drawn = re.findall(r'fill="(#[0-9a-f]{6})"><title>([a-z_]+) -&gt; ([a-z_]+):', svg)
        assert drawn
        segments = {f"{a}->{b}": colour for colour, a, b in drawn}
        assert segments["fault_injected->failure_detected"] == SEGMENT_COLOURS["detect"]
        # The PNG's bars (the median trial's): each wide segment's colour is on the figure (blended with white at
        # the bars' alpha), a joined one in its first part's.
        (png,) = [p for p in write_plots(run) if p.name == TIMELINE_FILE]
        from matplotlib.image import imread

        _, found, _ = pick_median_trial(events)
        wide = [seg["segment"] for seg in segments_of(found) if seg["segment"] != "total" and seg["ms"] >= 20]
        assert ("select+reconfigure" in wide) == bool(skip)
        pixels = imread(png)[..., :3].reshape(-1, 3)
        for colour in {segment_colour(name) for name in wide}:
            blended = 0.75 * np.array(to_rgb(colour)) + 0.25
            assert (np.abs(pixels - blended).max(axis=1) < 0.02).any(), colour
