"""Running mean and variance of observations, for input normalisation.

Batches are merged with the parallel algorithm of Chan, Golub and LeVeque
(1979), so the result does not depend on how the data were cut into batches.
The statistics travel with a saved policy: a policy is only meaningful with the
normalisation it was trained under.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RunningMeanStd:
    """Running per-feature mean and variance.

    Args:
        dim: number of features.
        clip: normalised values are clipped to ``[-clip, clip]`` (10 typical).
        eps: added to the variance before the square root.

    Attributes:
        mean, var: float64 arrays of shape ``(dim,)``.
        count: number of observations merged (starts at ``eps`` so that an
            unused normaliser is the identity).
    """

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.dim = int(dim)
        self.clip = float(clip)
        self.eps = float(eps)
        self.mean = np.zeros(self.dim)
        self.var = np.ones(self.dim)
        self.count = self.eps

    def update(self, x: np.ndarray) -> None:
        """Merge a batch ``(batch, dim)`` (or one ``(dim,)`` observation)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        if x.shape[1] != self.dim:
            raise ValueError(f"observation has {x.shape[1]} features, the "
                             f"normaliser {self.dim}")
        n = x.shape[0]
        b_mean, b_var = x.mean(axis=0), x.var(axis=0)
        delta = b_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """``clip((x - mean) / sqrt(var + eps))``, float64, same shape as ``x``."""
        z = (np.asarray(x, dtype=np.float64) - self.mean) / np.sqrt(self.var + self.eps)
        return np.clip(z, -self.clip, self.clip)

    def to_json(self) -> dict[str, Any]:
        """JSON-able statistics (saved in a policy file's header)."""
        return {"dim": self.dim, "clip": self.clip, "eps": self.eps,
                "mean": self.mean.tolist(), "var": self.var.tolist(),
                "count": self.count}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunningMeanStd:
        """Inverse of :meth:`to_json`."""
        out = cls(int(data["dim"]), float(data["clip"]), float(data["eps"]))
        out.mean = np.asarray(data["mean"], dtype=np.float64)
        out.var = np.asarray(data["var"], dtype=np.float64)
        out.count = float(data["count"])
        if out.mean.shape != (out.dim,) or out.var.shape != (out.dim,):
            raise ValueError(f"normaliser statistics do not have {out.dim} entries")
        return out
