"""95 % intervals of held-out figures, so that a change can be told from noise: Wilson's score interval for a share
of successes (RM accuracy on held-out pairs) and a seeded percentile bootstrap (SciPy) for means and win rates.

With 64 prompts one prompt moves a win rate by 0.016, and the interval of a win rate near 0.9 is about +-0.08: two
runs whose intervals overlap that much are not distinguishable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000


def proportion_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of `successes` out of `n` (exact 0 and 1 stay inside [0, 1]); (nan, nan) for n = 0."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0,
                  resamples: int = RESAMPLES, groups: Sequence[object] | None = None) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` (rows resampled with replacement, seeded, so a report
    is reproducible). Constant values give (v, v); fewer than 2 values (nan, nan).

    With `groups` (one label per value, e.g. the prompt of each reply) that repeat, the rows of one label are
    resampled together (`cluster_interval`): ten replies to one held-out problem are one draw of a problem, not ten
    independent ones. Labels that never repeat leave the row bootstrap as it is."""
    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return float("nan"), float("nan")
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    if groups is not None and len(set(groups)) < len(groups):
        return cluster_interval(x, groups, confidence, seed, resamples)
    res = bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                    rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def cluster_interval(values: Sequence[float], groups: Sequence[object], confidence: float = CONFIDENCE,
                     seed: int = 0, resamples: int = RESAMPLES) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` whose rows come in clusters (`groups`, one label per
    row): each resample draws as many clusters as there are, with replacement, and takes the mean of all their rows
    (Davison & Hinkley 1997, section 3.8). Shapes: values (N,), groups (N,). One cluster gives (nan, nan)."""
    x = np.asarray(values, dtype=np.float64)
    if len(groups) != x.size:
        raise ValueError(f"{x.size} values but {len(groups)} group labels")
    labels, index = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    if labels.size < 2:
        return float("nan"), float("nan")
    sums, counts = np.bincount(index, weights=x), np.bincount(index).astype(np.float64)  # (G,), (G,)
    pick = np.random.default_rng(seed).integers(0, labels.size, size=(resamples, labels.size))  # (B, G)
    means = sums[pick].sum(1) / counts[pick].sum(1)  # (B,)
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of `values`: sample std (n - 1) / sqrt(n); 0 for fewer than 2 values.

    Example: [1, 2, 3] -> 1 / sqrt(3) = 0.57735."""
    x = np.asarray(values, dtype=np.float64)
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def win_indicators(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """Per row: 1 where `a` beats `b`, 0.5 on a tie, 0 otherwise; their mean is the win rate. Shapes: (N,), (N,)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a > b) + 0.5 * (a == b)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation, min and max of a figure over seeds."""
    x = np.asarray(values, dtype=np.float64)
    return {"mean": float(x.mean()), "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max())}


def with_interval(value: float | None, interval: Sequence[float] | None) -> str:
    """`0.898 [0.83, 0.95]`: a figure and its 95 % interval, as the report and the console print them."""
    if value is None:
        return ""
    if not interval or any(v != v for v in interval):  # no interval, or NaN (too few rows)
        return f"{value:.4g}"
    return f"{value:.4g} [{interval[0]:.3g}, {interval[1]:.3g}]"


def split_intervals(figures: dict[str, object]) -> tuple[dict[str, float | None], dict[str, list[float]]]:
    """A summary's eval figures split into the values and their `<name>_ci95` intervals (keyed by name)."""
    values = {k: v for k, v in figures.items() if not k.endswith("_ci95")}
    bounds = {k.removesuffix("_ci95"): v for k, v in figures.items() if k.endswith("_ci95")}
    return values, bounds
