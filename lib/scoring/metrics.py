"""Summary statistics of speedups and time ratios.

Speedups and ratios multiply, so they are averaged geometrically; the
uncertainty of that mean is a percentile bootstrap over tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def geomean(x: Sequence[float]) -> float:
    """Geometric mean (nan for an empty sequence)."""
    return float(np.exp(np.mean(np.log(x)))) if len(x) else math.nan


def bootstrap_ci(x: Sequence[float], n: int = 1000, seed: int = 0
                 ) -> tuple[float, float]:
    """95 % bootstrap interval of the geometric mean of ``x`` (``n`` resamples;
    nan, nan for fewer than two values)."""
    if len(x) < 2:
        return (math.nan, math.nan)
    logs = np.log(np.asarray(x, float))
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, len(logs), (n, len(logs)))].mean(axis=1)
    return float(np.exp(np.percentile(means, 2.5))), float(np.exp(
        np.percentile(means, 97.5)))
