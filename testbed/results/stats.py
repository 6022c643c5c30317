"""Latency statistics for the summary. Small samples are reported honestly: with fewer samples than a
percentile needs, the value is the sample maximum and `p99_reliable` says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


def summarize(durations_ms: Sequence[float] | np.ndarray) -> dict:
    n = len(durations_ms)
    if n == 0:
        return {"n": 0}
    x = np.sort(np.asarray(durations_ms, dtype=float))
    lo, hi = median_ci(x)
    return {
        "n": n,
        "min_ms": round(float(x[0]), 4),
        "mean_ms": round(float(x.mean()), 4),
        "p50_ms": round(float(np.percentile(x, 50)), 4),
        "p90_ms": round(float(np.percentile(x, 90)), 4),
        "p99_ms": round(float(np.percentile(x, 99)), 4),
        "max_ms": round(float(x[-1]), 4),
        "p50_ci95_ms": [round(lo, 4), round(hi, 4)] if lo is not None and hi is not None else None,  # both or none
        # A p99 needs >= 100 samples before it is more than the maximum of a few.
        "p99_reliable": n >= 100,
    }


def median_ci(sorted_x: np.ndarray, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Distribution-free confidence interval of the median from order statistics.

    [x_(k), x_(n-k+1)] (1-based) covers the median with probability 1 - 2 P(B <= k-1), B ~ Bin(n, 1/2);
    we take the largest k that keeps the coverage at or above `confidence`. None when n is too small
    for any k (n < 6 at 95 %).
    """
    n = len(sorted_x)
    k = _median_ci_rank(n, confidence)
    if k == 0:
        return None, None
    return float(sorted_x[k - 1]), float(sorted_x[n - k])


@functools.lru_cache(maxsize=4096)
def _median_ci_rank(n: int, confidence: float) -> int:
    """The k of `median_ci`: it depends on n alone, and runs of a campaign share a few n (a trend over 1,000 runs)."""
    alpha = 1 - confidence
    k = 0
    tail = 0.0  # P(B <= k-1)
    while True:
        next_tail = tail + math.comb(n, k) / 2**n  # P(B <= k)
        if 2 * next_tail > alpha or k + 1 > n - k:
            break
        tail = next_tail
        k += 1
    return k


# --- two selections of runs: did a span get slower? (testbed gate; docs/catalog.md states the rule) ---------------

RUNS_TO_RESAMPLE = 3  # from this many runs a side is resampled run by run; below, sample by sample


def median_ratio_interval(
    baseline: list[np.ndarray],
    candidate: list[np.ndarray],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    limit: float | None = None,
) -> dict:
    """The ratio of the pooled medians (candidate / baseline) with a percentile bootstrap interval.

    Each side is a list of runs, each run an array of samples. A side of RUNS_TO_RESAMPLE runs or more is resampled
    by runs (a run's trials share its lab or twin state, so its samples are not independent of one another: drawing
    whole runs keeps the run-to-run spread in the interval); a side of fewer runs is resampled by samples, which
    treats them as independent and gives a narrower interval than the data warrant (`unit` says which). The seed is
    fixed, so the same runs give the same interval. None for the ratio when the baseline's median is 0.
    With `limit`, `p_above_limit` is the one-sided bootstrap p-value of "the ratio is at most `limit`": the share
    of resampled ratios at or below it (1.0 when there is no ratio); its resolution is 1/resamples.
    """
    rng = np.random.default_rng(seed)
    sides = {}
    for name, runs in (("baseline", baseline), ("candidate", candidate)):
        runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
        if not runs:
            raise ValueError(f"the {name} has no samples")
        by_runs = len(runs) >= RUNS_TO_RESAMPLE
        sides[name] = (_WeightedMedian(runs, by_runs), by_runs, runs)
    medians = {name: float(np.median(np.concatenate(runs))) for name, (_, _, runs) in sides.items()}
    draws = {name: resampler.draw(rng, resamples) for name, (resampler, _, _) in sides.items()}
    out = {
        "baseline_median": medians["baseline"],
        "candidate_median": medians["candidate"],
        "unit": {name: "runs" if by_runs else "samples" for name, (_, by_runs, _) in sides.items()},
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "ratio": None,
        "interval": None,
    }
    if limit is not None:
        out["p_above_limit"] = 1.0
    if medians["baseline"] == 0:
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = draws["candidate"] / draws["baseline"]
    ratios = ratios[np.isfinite(ratios)]
    tail = (1 - confidence) / 2
    out["ratio"] = medians["candidate"] / medians["baseline"]
    if len(ratios):
        out["interval"] = [float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))]
        if limit is not None:
            out["p_above_limit"] = float(np.mean(ratios <= limit))
    return out


class _WeightedMedian:
    """Bootstrap medians of a pool of samples without building each resample: the samples are sorted once, a
    resample is how many times each unit (a run, or a sample) is drawn, and its median is read off the cumulative
    counts (the same value np.median gives of the resample written out).
    """

    def __init__(self, runs: list[np.ndarray], by_runs: bool) -> None:
        values = np.concatenate(runs)
        order = np.argsort(values, kind="stable")
        self.sorted = values[order]
        self.owner: np.ndarray | None
        if by_runs:
            owner = np.repeat(np.arange(len(runs)), [len(r) for r in runs])[order]
            self.units, self.owner = len(runs), owner
        else:
            self.units, self.owner = len(values), None  # each sample its own unit: its position after sorting

    def draw(self, rng: np.random.Generator, resamples: int) -> np.ndarray:
        out = np.empty(resamples)
        k = self.units
        for b in range(resamples):
            counts = np.bincount(rng.integers(0, k, k), minlength=k)
            weights = counts if self.owner is None else counts[self.owner]
            cumulative = np.cumsum(weights)
            total = int(cumulative[-1])
            low = self.sorted[np.searchsorted(cumulative, (total - 1) // 2, side="right")]
            high = self.sorted[np.searchsorted(cumulative, total // 2, side="right")]
            out[b] = (low + high) / 2
        return out
