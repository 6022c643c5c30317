"""Steps in a span's history: where the level of a series (one span at one sweep point of one playbook, run by run or
commit by commit) changed, for `testbed trend` to mark and `testbed gate --against-trend` to start its baseline after.

The method is binary segmentation with a bootstrap test of each step (docs/catalog.md, "Steps in a history"): the
history's members (runs, or commits) are split where the sum of absolute deviations of their medians from their
segment's median (an L1 cost, robust to one odd run) is least; the split is a step when the ratio of the pooled
medians after / before has its 95 % bootstrap interval wholly beyond the tolerance (above 1 + tolerance or below
1 / (1 + tolerance)), the interval of `gate` (testbed.results.stats.median_ratio_interval: members resampled whole
when a side has three or more). Each side of an accepted step is split again the same way. A segment has at least
MIN_SEGMENT members, the fewest the interval resamples whole: so one or two odd runs are never a level of their own,
and a change undone within a few runs, or one in the last two runs, is not a step (`gate --against-trend` judges the
newest runs).
"""

from __future__ import annotations

import numpy as np

from testbed.results.stats import RUNS_TO_RESAMPLE, median_ratio_interval

MIN_SEGMENT = RUNS_TO_RESAMPLE
DEFAULT_TOLERANCE_PCT = 5.0
METHOD = "binary segmentation (L1 cost on the members' medians), each step a bootstrap interval of the median ratio"


def find_steps(members: list[np.ndarray], tolerance_pct: float = DEFAULT_TOLERANCE_PCT, seed: int = 0) -> list[dict]:
    """The steps of a history, `members` in order (each a run's or a commit's samples): [{index (the first member
    of the new level), ratio (after / before), interval}], in order.
    """
    arrays = [np.asarray(m, dtype=float) for m in members]
    medians = np.array([np.median(a) if len(a) else np.nan for a in arrays])
    limit = 1 + tolerance_pct / 100
    steps: list[dict] = []

    def split(lo: int, hi: int) -> None:
        if hi - lo < 2 * MIN_SEGMENT or not np.all(np.isfinite(medians[lo:hi])):
            return
        splits = range(lo + MIN_SEGMENT, hi - MIN_SEGMENT + 1)
        k = min(splits, key=lambda k: _cost(medians[lo:k]) + _cost(medians[k:hi]))
        stats = median_ratio_interval(arrays[lo:k], arrays[k:hi], seed=seed)
        interval = stats["interval"]
        if interval is None or not (interval[0] > limit or interval[1] < 1 / limit):
            return  # within the tolerance, or straddling it: no step these runs can tell
        steps.append({"index": k, "ratio": stats["ratio"], "interval": interval})
        split(lo, k)
        split(k, hi)

    split(0, len(arrays))
    return sorted(steps, key=lambda s: s["index"])


def _cost(medians: np.ndarray) -> float:
    return float(np.abs(medians - np.median(medians)).sum())
