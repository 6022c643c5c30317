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


def plot_trend(rows: list[dict], span: str, by: str, path: Path) -> Path:
    """The median of `span` per row of `trend()` in order, its 95 % CI as an error bar (none below 6 samples)."""
    fig = _figure(max(6.0, min(16.0, 0.35 * len(rows) + 4)), 4.5)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    p50 = np.array([r["p50_ms"] for r in rows])
    low = np.array([r["p50_ms"] - r["p50_ci95_ms"][0] if r.get("p50_ci95_ms") else 0.0 for r in rows])
    high = np.array([r["p50_ci95_ms"][1] - r["p50_ms"] if r.get("p50_ci95_ms") else 0.0 for r in rows])
    ax.errorbar(x, p50, yerr=[low, high], fmt="o-", markersize=3, capsize=2, linewidth=1)
    step = max(1, len(rows) // 30)  # at most ~30 labels
    ax.set_xticks(x[::step])
    labels = [r["started"][:16] if by == "date" and r.get("started") else r["label"] for r in rows]
    ax.set_xticklabels(labels[::step], rotation=60, ha="right", fontsize="x-small")
    ax.set_title(f"{span}: median and its 95% CI, {'run by run' if by == 'date' else 'commit by commit'}")
    ax.set_ylabel("ms")
    ax.grid(True, alpha=0.3)
    return _save(fig, path)
