from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from testbed.results.stats import median_ci, summarize


def test_summary_fields_on_a_known_sample():
    s = summarize([float(x) for x in range(1, 21)])
    assert s["n"] == 20
    assert s["p50_ms"] == 10.5
    assert s["max_ms"] == 20.0 and s["min_ms"] == 1.0
    assert s["p50_ci95_ms"] == [6.0, 15.0]  # the textbook order statistics for n = 20
    assert s["p99_reliable"] is False


def test_tiny_samples_have_no_median_interval():
    assert summarize([1.0, 2.0, 3.0])["p50_ci95_ms"] is None
    assert summarize([]) == {"n": 0}


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=6, max_size=400))
def test_median_interval_contains_the_median_and_is_ordered(values):
    x = np.sort(np.asarray(values))
    lo, hi = median_ci(x)
    assert lo <= np.median(x) <= hi


def test_median_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(2000):
        x = np.sort(rng.exponential(size=20))
        lo, hi = median_ci(x)
        hits += lo <= np.log(2) <= hi  # the median of Exp(1)
    assert 0.94 <= hits / 2000 <= 0.985  # exact coverage for n = 20 is 95.9 %
