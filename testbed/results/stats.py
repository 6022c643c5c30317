"""Latency statistics for the summary. Small samples are reported honestly: with fewer samples than a
percentile needs, the value is the sample maximum and `p99_reliable` says so."""

from __future__ import annotations

import math

import numpy as np


def summarize(durations_ms: list[float]) -> dict:
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
        "p50_ci95_ms": [round(lo, 4), round(hi, 4)] if lo is not None else None,
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
    alpha = 1 - confidence
    k = 0
    tail = 0.0  # P(B <= k-1)
    while True:
        next_tail = tail + math.comb(n, k) / 2**n  # P(B <= k)
        if 2 * next_tail > alpha or k + 1 > n - k:
            break
        tail = next_tail
        k += 1
    if k == 0:
        return None, None
    return float(sorted_x[k - 1]), float(sorted_x[n - k])
