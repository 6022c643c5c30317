"""Figures across runs, as PNGs: a span's CDF with one curve per run (`report --across`), and a span's median with
its 95 % CI run by run or commit by commit (`trend`). Headless, on matplotlib's Agg canvas, as a run's own figures
are (testbed/results/plots.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from testbed.events.safe_files import atomic_writer
from testbed.results.plots import DPI

LEGEND_MAX = 12  # more runs than this: no legend (it would hide the curves); the title gives their number


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:  # aside under a random name, then renamed: never half a PNG, never via a link
        fig.savefig(f, format="png", dpi=DPI, bbox_inches="tight")
    return path


def plot_cdf_overlay(runs: list[dict], span: str, path: Path) -> Path | None:
    """One step CDF of `span` per run (the runs of `across()`); None when no run measured it."""
    measured = [r for r in runs if span in r["spans"] and len(r["spans"][span])]
    if not measured:
        return None
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    many = len(measured) > LEGEND_MAX
    for i, run in enumerate(measured):
        x = np.sort(run["spans"][span])
        y = np.arange(1, len(x) + 1) / len(x)
        p50 = run["stats"][span]["p50_ms"]
        ax.step(
            np.concatenate([[x[0]], x]),
            np.concatenate([[0.0], y]),
            where="post",
            color=f"C{i % 10}",
            linewidth=0.6 if many else 1.2,
            alpha=0.5 if many else 1.0,
            label=None if many else f"{run['run_id']} (n={len(x)}, p50 {p50:.3g} ms)",
        )
    ax.set_title(f"CDF of {span}: {len(measured)} runs")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of samples <= x")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if not many:
        ax.legend(loc="lower right", fontsize="x-small")
    return _save(fig, path)


def _draw_medians(ax, x: np.ndarray, rows: list[dict], color: str, label: str | None) -> None:
    """`rows`' medians at `x` joined by a line, each with its 95 % CI as an error bar (none where a row has no CI),
    and a red ring on each row with a run that did not end ok.
    """
    p50 = np.array([r["p50_ms"] for r in rows])
    low = np.array([r["p50_ms"] - r["p50_ci95_ms"][0] if r.get("p50_ci95_ms") else 0.0 for r in rows])
    high = np.array([r["p50_ci95_ms"][1] - r["p50_ms"] if r.get("p50_ci95_ms") else 0.0 for r in rows])
    ax.errorbar(
        x, p50, yerr=[low, high], fmt="o-", markersize=3, capsize=2, linewidth=1, color=color, label=label
    )  # fmt: skip
    bad = [j for j, r in enumerate(rows) if any(s != "ok" for s in r.get("statuses", ["ok"]))]
    if bad:
        ax.scatter(x[bad], p50[bad], s=60, facecolors="none", edgecolors="red", zorder=3)


def plot_trend(rows: list[dict], span: str, by: str, path: Path) -> Path:
    """The median of `span` per row of `trend()` in order, its 95 % CI as an error bar (none below 6 samples): one
    line per series (a sweep point), a run, commit or tag at one x for every series; a red ring marks a row with a run
    that did not end ok, a dashed line a step in a series' level (trend's `step`). Tag by tag with a sweep, the
    sweep's curve of each tag instead (_plot_sweep_curves).
    """
    series = list(dict.fromkeys(r.get("series", "-") for r in rows))
    if by not in ("date", "commit") and len(series) > 1:  # tags or a param's values: categories, not a history
        return _plot_sweep_curves(rows, span, series, path, by.partition(":")[2] or by)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    where = {label: i for i, label in enumerate(labels)}
    fig = _figure(max(6.0, min(16.0, 0.35 * len(labels) + 4)), 4.5)
    ax = fig.add_subplot()
    for i, name in enumerate(series):
        mine = [r for r in rows if r.get("series", "-") == name]
        x = np.array([where[r["label"]] for r in mine])
        _draw_medians(ax, x, mine, f"C{i % 10}", None if name == "-" else name)
        for j, r in enumerate(mine):
            if r.get("step"):  # a step of this series' level: between this row and the one before
                ax.axvline(x[j] - 0.5, color=f"C{i % 10}", linestyle="--", linewidth=0.8)
    step = max(1, len(labels) // 30)  # at most ~30 labels
    ticks = np.arange(len(labels))
    ax.set_xticks(ticks[::step])
    started: dict[str, str] = {r["label"]: r.get("started") or "" for r in rows}
    shown = [started[label][:16] if by == "date" and started[label] else label for label in labels]
    ax.set_xticklabels(shown[::step], rotation=60, ha="right", fontsize="x-small")
    what = {"date": "run by run", "commit": "commit by commit", "tag": "tag by tag"}.get(by) or f"by {by}"
    ax.set_title(f"{span}: median and its 95% CI, {what}")
    ax.set_ylabel("ms")
    ax.grid(True, alpha=0.3)
    if 1 < len(series) <= LEGEND_MAX or (len(series) == 1 and series[0] != "-"):
        ax.legend(fontsize="x-small", title="sweep point", title_fontsize="x-small")
    return _save(fig, path)


def _plot_sweep_curves(rows: list[dict], span: str, series: list[str], path: Path, what: str) -> Path:
    """Tag by tag (or a param's value by value) over a sweep: the sweep points along x (in trend's order), one line
    per tag, so that tags are compared point by point as curves laid over each other (rail25 against rail40: two
    lines); a red ring marks a point with a run that did not end ok.
    """
    tags = list(dict.fromkeys(r["label"] for r in rows))
    where = {name: i for i, name in enumerate(series)}
    fig = _figure(max(6.0, min(16.0, 0.45 * len(series) + 4)), 4.5)
    ax = fig.add_subplot()
    many = len(tags) > LEGEND_MAX
    for i, tag in enumerate(tags):
        mine = [r for r in rows if r["label"] == tag]
        x = np.array([where[r["series"]] for r in mine])
        label = None if many else f"{tag} ({len({run for r in mine for run in r['runs']})} runs)"
        _draw_medians(ax, x, mine, f"C{i % 10}", label)
    ax.set_xticks(np.arange(len(series)))
    ax.set_xticklabels(series, rotation=60, ha="right", fontsize="x-small")
    ax.set_title(f"{span}: median and its 95% CI at each sweep point, a line per {what}")
    ax.set_xlabel("sweep point")
    ax.set_ylabel("ms")
    ax.grid(True, alpha=0.3)
    if not many:
        ax.legend(fontsize="x-small", title=what, title_fontsize="x-small")
    return _save(fig, path)
