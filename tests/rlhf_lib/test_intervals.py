"""The held-out figures' intervals against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf_lib.intervals import cluster_interval, mean_interval, proportion_interval, spread, win_indicators


def test_wilson_interval_matches_the_formula():
    # 58 of 64, z = 1.959964: centre (p + z^2/2n) / (1 + z^2/n), half-width z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n).
    n, p, z = 64, 58 / 64, 1.959963984540054
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert proportion_interval(58, 64) == pytest.approx((centre - half, centre + half), abs=1e-9)
    lo, hi = proportion_interval(64, 64)
    assert hi == 1.0 and 0.9 < lo < 1.0  # an all-correct run still has an interval below 1
    assert all(math.isnan(v) for v in proportion_interval(0, 0))


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(1.0, 1.0, 50), rng.normal(1.0, 1.0, 800)
    lo, hi = mean_interval(small)
    assert lo < small.mean() < hi
    # The normal-theory half-width is 1.96 / sqrt(n): ~0.28 at 50 rows, ~0.07 at 800.
    assert (hi - lo) / 2 == pytest.approx(1.96 * small.std(ddof=1) / math.sqrt(50), rel=0.15)
    lo2, hi2 = mean_interval(large)
    assert hi2 - lo2 < (hi - lo) / 3
    assert mean_interval(small) == mean_interval(small)  # seeded: a report is reproducible
    assert mean_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert all(math.isnan(v) for v in mean_interval([1.0]))


def test_win_indicators_count_a_tie_as_half():
    assert win_indicators([1, 2, 3], [0, 2, 4]).tolist() == [1.0, 0.5, 0.0]


def test_spread_over_seeds():
    s = spread([0.8, 0.9, 1.0])
    assert s["mean"] == pytest.approx(0.9) and s["std"] == pytest.approx(0.1)
    assert (s["min"], s["max"]) == (0.8, 1.0)
    assert spread([0.5])["std"] == 0.0


def test_a_cluster_bootstrap_resamples_whole_groups():
    # Two clusters, a = (1, 1, 1) and b = (0,): a resample holds aa (mean 1), bb (0) or ab (3/4), so the 95 %
    # percentile interval runs from 0 to 1; rows resampled one by one would never reach 0.
    assert cluster_interval([1, 1, 1, 0], ["a", "a", "a", "b"]) == (0.0, 1.0)
    lo, _ = mean_interval([1, 1, 1, 0])
    assert lo > 0
    assert mean_interval([1, 1, 1, 0], groups=["a", "a", "a", "b"]) == (0.0, 1.0)
    # Labels that never repeat: the row bootstrap, unchanged.
    x = list(np.random.default_rng(1).normal(size=40))
    assert mean_interval(x, groups=[f"p{i}" for i in range(40)]) == mean_interval(x)
    assert math.isnan(cluster_interval([1.0, 0.0], ["a", "a"])[0])
    with pytest.raises(ValueError, match="3 values but 2 group labels"):
        cluster_interval([1.0, 0.0, 1.0], ["a", "b"])


def test_ten_asks_of_one_problem_count_as_one_draw():
    # 27 problems asked 10 times each, every reply to a problem right or every one wrong (14 right problems): the
    # rows are 270 but the evidence is 27 problems, so the interval is about sqrt(10) times the row bootstrap's.
    right = [1.0] * 14 + [0.0] * 13
    values = [v for v in right for _ in range(10)]
    groups = [f"What is {i} + 1?" for i in range(27) for _ in range(10)]
    rows, clusters = mean_interval(values), mean_interval(values, groups=groups)
    assert clusters == cluster_interval(values, groups)
    assert 2.5 < (clusters[1] - clusters[0]) / (rows[1] - rows[0]) < 4.0
    assert clusters[0] < 14 / 27 < clusters[1]
    # The standard error of a 27-draw share is sqrt(p (1 - p) / 27) = 0.096: the interval spans about 4 of them.
    assert (clusters[1] - clusters[0]) == pytest.approx(4 * math.sqrt(14 / 27 * 13 / 27 / 27), rel=0.15)
