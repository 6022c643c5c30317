"""Figures of a run, written as PNGs next to its results (`testbed report RUN_DIR`).

Each figure is drawn only when the run has the data for it:

- `failover_cdf.png`: the CDF of `failover.total`; without a failover, `latency_cdf.png` with one CDF per
  span named `*.total` or `*.latency`, overlaid. The median and its 95 % CI are marked; n is in the legend.
- `failover_timeline.png`: one trial's failover milestones against the time since fault_injected (the
  trial with the median total), one row per milestone, like Morphlux's recovery timeline.
- `sweep_iteration_time.png`: p50 of `iteration.time` (95 % CI of the median as error bars) against a
  numeric sweep parameter such as `delay_ms`, one line per `mode`, like Opus's figure.
- `sweep_spans.png`: a sweep whose run measures no `iteration.time` (straggler's duty cycle, say): the p50 of each
  span measured at every sweep point against the numeric sweep parameter, one line per span.
- `collective_time.png`: a collective sweep's all-reduce time (p50) against the message size, log-log, one line
  per case (collective.allreduce's measures, testbed/results/collective_view.py).

Small samples are shown honestly: a p99 is only shown from 100 samples or more (below that it is little
more than the maximum), a median CI needs 6 samples, and n is always on the figure.

Headless: figures are drawn on matplotlib's Agg canvas directly (no pyplot, no display, no global state).
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np

from testbed.contracts.errors import UserError
from testbed.events import Op, read_jsonl
from testbed.events.safe_files import UnsafeFile, atomic_writer, open_fd, read_json
from testbed.results.collective_view import collective_data
from testbed.results.milestones import MILESTONES, segment_colour, segments_of, trial_milestones
from testbed.results.stats import summarize

CDF_FILE = "failover_cdf.png"
LATENCY_CDF_FILE = "latency_cdf.png"
TIMELINE_FILE = "failover_timeline.png"
SWEEP_FILE = "sweep_iteration_time.png"
SWEEP_SPANS_FILE = "sweep_spans.png"
SWEEP_SPANS_MAX = 6  # lines on one figure; past that a sweep's spans are for the report's tables
COLLECTIVE_FILE = "collective_time.png"
FAILOVER_SPAN = "failover.total"
ITERATION_SPAN = "iteration.time"
SWEEP_X_PREFERRED = ("delay_ms", "switching_ms", "switch_ms", "switching_delay_ms")
DPI = 120


def write_plots(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write every figure the run has data for into `out_dir` (default: `run_dir`); returns the paths written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such folder; pass a folder that `testbed run` wrote")
    out = Path(out_dir) if out_dir is not None else run_dir
    written: list[Path] = []
    durations = span_durations(run_dir)
    path = plot_latency_cdf(durations, out)
    if path:
        written.append(path)
    events_path = run_dir / "events.jsonl"
    if events_path.is_file():
        path = plot_timeline(read_jsonl(events_path).records, out / TIMELINE_FILE)
        if path:
            written.append(path)
    summary = _read_json(run_dir / "summary.json")
    collective = plot_collective(run_dir, summary, out / COLLECTIVE_FILE)
    if summary:
        path = plot_sweep(summary, out / SWEEP_FILE)
        spans = measured_at_every_point(summary)
        if path is None and collective is None and 0 < len(spans) <= SWEEP_SPANS_MAX:
            path = plot_sweep(summary, out / SWEEP_SPANS_FILE, tuple(spans))  # every sweep gets its figure
        if path:
            written.append(path)
    if collective:
        written.append(collective)
    return written


# --- data --------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict | None:
    try:
        value = read_json(path)  # never through a link, from a FIFO, or too large or deep
    except (OSError, UnsafeFile):  # missing or damaged: no figure from it
        return None
    return value if isinstance(value, dict) else None


def span_durations(run_dir: Path) -> dict[str, list[float]]:
    """Measured durations (ms) per span: from trials.csv, or from events.jsonl's measure events when the
    run ended before writing trials.csv.
    """
    out: dict[str, list[float]] = {}
    trials_csv = run_dir / "trials.csv"
    if trials_csv.is_file() or trials_csv.is_symlink():
        with os.fdopen(open_fd(trials_csv, os.O_RDONLY), newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                try:
                    out.setdefault(row["span"], []).append(float(row["duration_ms"]))
                except (KeyError, TypeError, ValueError):
                    continue
        return out
    events_path = run_dir / "events.jsonl"
    if events_path.is_file():
        for event in read_jsonl(events_path).records:
            if event.get("type") == "measure" and isinstance(event.get("data"), dict) and "ms" in event["data"]:
                out.setdefault(event["op"], []).append(float(event["data"]["ms"]))
    return out


def cdf_spans(durations: dict[str, list[float]]) -> list[str]:
    """Which spans the CDF shows: failover.total if measured, else every `*.total` / `*.latency` span."""
    if durations.get(FAILOVER_SPAN):
        return [FAILOVER_SPAN]
    return sorted(n for n, v in durations.items() if v and (n.endswith(".total") or n.endswith(".latency")))


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    # Aside under a random name, then renamed: a reader never sees half a PNG, nothing is written through a link.
    with atomic_writer(path) as f:
        fig.savefig(f, format="png", dpi=DPI, bbox_inches="tight")
    return path


def _fmt(ms: float) -> str:
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.1f}" if abs(ms) >= 1 else f"{ms:.3f}"


# --- CDF ---------------------------------------------------------------------------------------------


def plot_latency_cdf(durations: dict[str, list[float]], run_dir: Path) -> Path | None:
    names = cdf_spans(durations)
    if not names:
        return None
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(names))]
    any_small = False
    for name, color in zip(names, colors, strict=True):
        x = np.sort(np.asarray(durations[name], dtype=float))
        n = len(x)
        s = summarize(list(x))
        y = np.arange(1, n + 1) / n
        label = f"{name} (n={n}): p50 {_fmt(s['p50_ms'])} ms"
        ci = s.get("p50_ci95_ms")
        label += f", 95% CI {_fmt(ci[0])}-{_fmt(ci[1])}" if ci else ", no CI (n<6)"
        if s.get("p99_reliable"):
            label += f", p99 {_fmt(s['p99_ms'])}"
        else:
            any_small = True
        label += f", max {_fmt(s['max_ms'])}"
        ax.step(np.concatenate([[x[0]], x]), np.concatenate([[0.0], y]), where="post", color=color, label=label)
        ax.axvline(s["p50_ms"], color=color, linestyle="--", linewidth=1)
        if ci:
            ax.axvspan(ci[0], ci[1], color=color, alpha=0.15, linewidth=0)
        if s.get("p99_reliable"):
            ax.axvline(s["p99_ms"], color=color, linestyle=":", linewidth=1)
    title = "failover latency (fault injected -> first step)" if names == [FAILOVER_SPAN] else "latency"
    ax.set_title(f"CDF of {title}")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of samples <= x")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    note = "dashed: median; band: its 95% CI (distribution-free)"
    if any_small:
        note += "; no p99 shown below 100 samples (it would be little more than the max)"
    else:
        note += "; dotted: p99"
    fig.text(0.01, -0.02, note, fontsize="x-small", ha="left", va="top")
    return _save(fig, run_dir / (CDF_FILE if names == [FAILOVER_SPAN] else LATENCY_CDF_FILE))


# --- timeline ----------------------------------------------------------------------------------------


def pick_median_trial(events: list[dict]) -> tuple[int, dict[str, int], int] | None:
    """The trial whose failover total is the median of the trials that have one (the lower middle for an
    even count), with its milestones; among trials that finished ok when the events say so. Falls back to
    the trials without a total (the time to their last milestone) when none has one. Returns (trial,
    milestones, number of trials ranked) or None when no trial has fault_injected and a later milestone.
    """
    found = trial_milestones(events)
    status = {
        e.get("trial"): (e.get("data") or {}).get("status")
        for e in events
        if e.get("type") == "mark" and e.get("op") == Op.TRIAL_END
    }
    eligible = {t: m for t, m in found.items() if MILESTONES[0] in m and len(m) >= 2}
    ok = {t: m for t, m in eligible.items() if status.get(t) == "ok"}
    pool = ok or eligible
    if not pool:
        return None
    complete = {t: m for t, m in pool.items() if MILESTONES[-1] in m}
    pool = complete or pool
    ranked = sorted(pool, key=lambda t: (max(pool[t].values()) - pool[t][MILESTONES[0]], t))
    trial = ranked[(len(ranked) - 1) // 2]
    return trial, pool[trial], len(ranked)


def plot_timeline(events: list[dict], path: Path) -> Path | None:
    picked = pick_median_trial(events)
    if picked is None:
        return None
    trial, found, ranked = picked
    t0 = found[MILESTONES[0]]
    rows = [name for name in MILESTONES if name in found]
    segments = {seg["to"]: seg for seg in segments_of(found) if seg["segment"] != "total"}
    fig = _figure(8.0, 0.45 * len(rows) + 1.6)
    ax = fig.add_subplot()
    end_ms = (max(found.values()) - t0) / 1e6
    for y, name in enumerate(rows):
        at = (found[name] - t0) / 1e6
        seg = segments.get(name)
        if seg:
            start = (seg["start_ns"] - t0) / 1e6
            ax.barh(y, seg["ms"], left=start, height=0.5, color=segment_colour(seg["segment"]), alpha=0.75)
            ax.text(
                at + end_ms * 0.01,
                y,
                f"{seg['segment']} +{_fmt(seg['ms'])} ms (at {_fmt(at)})",
                va="center",
                fontsize="small",
            )
        ax.plot([at], [y], marker="o", color="black", markersize=4)
    missing = [m for m in MILESTONES if m not in found]
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(-end_ms * 0.02, end_ms * 1.45 if end_ms > 0 else 1)
    ax.set_xlabel("ms since fault_injected")
    ax.grid(True, axis="x", alpha=0.3)
    total = (
        f"total {_fmt(end_ms)} ms" if MILESTONES[-1] in found else f"no first_step; last milestone at {_fmt(end_ms)} ms"
    )
    ax.set_title(f"failover timeline, trial {trial} (median of {ranked} trials): {total}")
    if missing:
        fig.text(0.01, -0.02, "not recorded: " + ", ".join(missing), fontsize="x-small", ha="left", va="top")
    return _save(fig, path)


# --- sweep -------------------------------------------------------------------------------------------


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def sweep_axes(points: list[dict]) -> tuple[str, list[str]] | None:
    """The numeric sweep parameter for x and the others that tell lines apart (e.g. `mode`)."""
    keys: list[str] = []
    for p in points:
        keys.extend(k for k in p if k not in keys)
    numeric = [k for k in keys if all(_is_number(p.get(k)) for p in points)]
    if not numeric:
        return None
    x = next((k for k in SWEEP_X_PREFERRED if k in numeric), None)
    x = x or next((k for k in numeric if "delay" in k or "switch" in k), numeric[0])
    others = [k for k in keys if k != x]
    return x, sorted(others, key=lambda k: (k != "mode", k))


def _sweep_points(summary: dict) -> list[dict]:
    return [p for p in summary.get("sweep", []) if isinstance(p, dict) and isinstance(p.get("point"), dict)]


def _measured(point: dict, span: str) -> dict | None:
    spans = point.get("spans")
    stats = spans.get(span) if isinstance(spans, dict) else None
    return stats if isinstance(stats, dict) and stats.get("n") else None


def measured_at_every_point(summary: dict) -> list[str]:
    """The spans a sweep measured at every one of its points, by name."""
    points = _sweep_points(summary)
    if len(points) < 2:
        return []
    names = {name for p in points for name in (p.get("spans") or {})}
    return sorted(name for name in names if all(_measured(p, name) for p in points))


def plot_sweep(summary: dict, path: Path, spans: tuple[str, ...] = (ITERATION_SPAN,)) -> Path | None:
    """p50 of `spans` against the sweep's numeric parameter; a line per span (when several) and per value of the
    other sweep parameters (e.g. `mode`).
    """
    points = [p for p in _sweep_points(summary) if any(_measured(p, span) for span in spans)]
    if len(points) < 2:
        return None
    axes = sweep_axes([p["point"] for p in points])
    if axes is None:
        return None
    x_key, line_keys = axes
    lines: dict[str, list[tuple[float, dict]]] = {}
    for p in points:
        label = ", ".join(f"{p['point'].get(k)}" if k == "mode" else f"{k}={p['point'].get(k)}" for k in line_keys)
        for span in spans:
            stats = _measured(p, span)
            if stats is None:
                continue
            named = f"{span}, {label}" if len(spans) > 1 and label else (span if len(spans) > 1 else label)
            lines.setdefault(named or span, []).append((float(p["point"][x_key]), stats))
    xs_all = sorted({x for line in lines.values() for x, _ in line})
    if len(xs_all) < 2:
        return None
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    no_ci = False
    for i, (label, line) in enumerate(sorted(lines.items())):
        line.sort(key=lambda xs: xs[0])
        color = f"C{i % 10}"
        ns = [s["n"] for _, s in line]
        n_label = f"n={ns[0]}" if min(ns) == max(ns) else f"n={min(ns)}-{max(ns)}"
        xs = [x for x, _ in line]
        ys = [s["p50_ms"] for _, s in line]
        ax.plot(xs, ys, color=color, marker="o", label=f"{label} ({n_label} per point)")
        with_ci = [(x, s) for x, s in line if s.get("p50_ci95_ms")]
        if with_ci:
            ax.errorbar(
                [x for x, _ in with_ci],
                [s["p50_ms"] for _, s in with_ci],
                yerr=[
                    [max(0.0, s["p50_ms"] - s["p50_ci95_ms"][0]) for _, s in with_ci],
                    [max(0.0, s["p50_ci95_ms"][1] - s["p50_ms"]) for _, s in with_ci],
                ],
                fmt="none",
                ecolor=color,
                capsize=3,
            )
        without = [(x, s) for x, s in line if not s.get("p50_ci95_ms")]
        if without:
            no_ci = True
            ax.plot(
                [x for x, _ in without],
                [s["p50_ms"] for _, s in without],
                linestyle="none",
                marker="o",
                markerfacecolor="white",
                markeredgecolor=color,
            )
    positive = [x for x in xs_all if x > 0]
    if positive and min(xs_all) >= 0 and max(xs_all) / min(positive) >= 50:
        ax.set_xscale("symlog", linthresh=min(positive))
    ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
    ax.set_xlabel(x_key)
    what = spans[0] if len(spans) == 1 else "each span"
    ax.set_ylabel(f"{spans[0]} p50 (ms)" if len(spans) == 1 else "p50 (ms)")
    ax.set_title(f"{what} against {x_key} (p50, error bars: 95% CI of the median)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    if no_ci:
        fig.text(0.01, -0.02, "hollow: fewer than 6 samples, no CI", fontsize="x-small", ha="left", va="top")
    return _save(fig, path)


# --- collective sweep ----------------------------------------------------------------------------------


def plot_collective(run_dir: Path, summary: dict | None, path: Path) -> Path | None:
    """All-reduce time p50 against message size, log-log, one line per case (testbed/results/collective_view.py)."""
    data = collective_data(run_dir, summary)
    if data is None:
        return None
    sizes, cases = data
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    for name, case in cases.items():
        xs = [s for s in sizes if case.times.get(s)]
        n = sorted({len(case.times[s]) for s in xs})
        label = f"{name} ({case.algorithm} on {case.fabric}, n={'/'.join(map(str, n))})"
        ax.plot(xs, [case.p50(s) for s in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message bytes")
    ax.set_ylabel("all-reduce time p50 (ms)")
    ax.set_title("all-reduce time against message size")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return _save(fig, path)
