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
                  resamples: int = RESAMPLES) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` (rows resampled with replacement, seeded, so a report
    is reproducible). Constant values give (v, v); fewer than 2 values (nan, nan)."""
    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return float("nan"), float("nan")
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    res = bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                    rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


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
