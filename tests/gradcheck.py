"""Centred finite differences for the gradient checks of the hand-written
backward passes (float64; relative error below 1e-6 away from kinks)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def numeric_grad(f: Callable[[], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Centred differences of scalar ``f()`` w.r.t. ``x``, perturbed in place."""
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        up = f()
        x[i] = old - h
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * h)
    return grad


def rel_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """Largest absolute difference over the larger of the two magnitudes."""
    scale = max(np.abs(analytic).max(), np.abs(numeric).max(), 1e-12)
    return float(np.abs(analytic - numeric).max() / scale)
