"""Masked action distributions with hand-written gradients.

- :class:`MaskedCategorical` -- one discrete choice among ``n`` options, some
  of them forbidden. Masking follows Stable-Baselines3 (``MaskableCategorical``):
  forbidden logits are replaced by :data:`~lib.learners.nn.MASK_LOGIT`, so their
  probability is exactly 0, they contribute nothing to the entropy and receive
  no gradient.
- :class:`MaskedDirichlet` -- the allocation head: a Dirichlet over the usable
  devices only; unusable devices get share exactly 0 and are left out of the
  density (it is a density on the simplex of the usable devices).

Both take a boolean ``mask`` of the same shape as their parameters
(``True`` = allowed). The mask must be stored with the rollout and passed again
at update time, so that the log-probabilities the update recomputes are those of
the distribution the action was drawn from.

Special functions: :func:`digamma` and :func:`trigamma` (recurrence up to
``x >= 6``, then the asymptotic series) and :func:`lgamma` (``math.lgamma``
vectorised). All arrays are float64.
"""

from __future__ import annotations

import math

import numpy as np

from lib.learners.nn import MASK_LOGIT, sigmoid, softplus

# --------------------------------------------------------------------------
# Special functions

_SHIFT_TO = 6.0
_lgamma = np.frompyfunc(math.lgamma, 1, 1)


def lgamma(x: np.ndarray | float) -> np.ndarray:
    """``log |Gamma(x)|`` elementwise (``math.lgamma`` vectorised), float64."""
    return np.asarray(_lgamma(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def _shift(x: np.ndarray, power: int) -> tuple[np.ndarray, np.ndarray]:
    """Shift ``x`` up to ``>= 6``; returns the shifted x and ``sum 1/x_k**power``."""
    x = np.array(x, dtype=np.float64)
    acc = np.zeros_like(x)
    for _ in range(int(_SHIFT_TO)):
        small = x < _SHIFT_TO
        if not small.any():
            break
        acc += np.where(small, 1.0 / np.where(small, x, 1.0) ** power, 0.0)
        x = np.where(small, x + 1.0, x)
    return x, acc


def digamma(x: np.ndarray | float) -> np.ndarray:
    """The digamma function ``psi(x) = d/dx log Gamma(x)`` for ``x > 0``.

    ``psi(x) = psi(x + 1) - 1/x`` shifts ``x`` to at least 6, where the
    asymptotic series ``log x - 1/(2x) - sum_k B_2k / (2k x^2k)`` (seven terms)
    is accurate to about 1e-13. Returns NaN where ``x <= 0``.
    """
    x = np.asarray(x, dtype=np.float64)
    bad = ~(x > 0)
    y, acc = _shift(np.where(bad, 1.0, x), 1)
    z = 1.0 / (y * y)
    series = z * (1 / 12 - z * (1 / 120 - z * (1 / 252 - z * (
        1 / 240 - z * (1 / 132 - z * (691 / 32760 - z / 12))))))
    out = np.log(y) - 0.5 / y - series - acc
    return np.where(bad, np.nan, out)


def trigamma(x: np.ndarray | float) -> np.ndarray:
    """The trigamma function ``psi'(x)`` for ``x > 0``.

    ``psi'(x) = psi'(x + 1) + 1/x^2`` shifts ``x`` to at least 6, then
    ``1/x + 1/(2x^2) + sum_k B_2k / x^(2k+1)`` (seven terms). NaN where ``x <= 0``.
    """
    x = np.asarray(x, dtype=np.float64)
    bad = ~(x > 0)
    y, acc = _shift(np.where(bad, 1.0, x), 2)
    z = 1.0 / (y * y)
    series = z / y * (1 / 6 - z * (1 / 30 - z * (1 / 42 - z * (
        1 / 30 - z * (5 / 66 - z * (691 / 2730 - z * 7 / 6))))))
    out = 1.0 / y + 0.5 * z + series + acc
    return np.where(bad, np.nan, out)


# --------------------------------------------------------------------------
# Masks


def check_mask(mask: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``mask`` as a bool array of ``shape`` with at least one True per row."""
    mask = np.asarray(mask)
    if mask.shape != shape:
        raise ValueError(f"{what} mask has shape {mask.shape}, expected {shape}")
    mask = mask.astype(bool)
    empty = np.flatnonzero(~mask.any(axis=-1))
    if empty.size:
        raise ValueError(f"{what} mask allows nothing in row(s) "
                         f"{empty[:5].tolist()}: at least one option must be "
                         f"allowed")
    return mask


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[None, :] if a.ndim == 1 else a


def _mask_rows(mask: np.ndarray) -> np.ndarray:
    return np.atleast_2d(np.asarray(mask).astype(bool))


# --------------------------------------------------------------------------
# Masked categorical


class MaskedCategorical:
    """Categorical over ``n`` options per row with forbidden options masked out.

    Args:
        logits: shape ``(batch, n)`` (or ``(n,)``, treated as one row), float64.
        mask: bool, same shape; ``True`` = allowed. Default: all allowed.

    Attributes:
        logits: the logits with forbidden ones set to ``MASK_LOGIT``.
        log_probs: normalised log-probabilities ``(batch, n)`` (very negative
            where forbidden).
        probs: probabilities ``(batch, n)``; exactly 0 where forbidden.
    """

    def __init__(self, logits: np.ndarray, mask: np.ndarray | None = None) -> None:
        raw = _rows(logits)
        self.mask = (np.ones(raw.shape, dtype=bool) if mask is None
                     else check_mask(_mask_rows(mask), raw.shape, "categorical"))
        self.logits = np.where(self.mask, raw, MASK_LOGIT)
        top = self.logits.max(axis=1, keepdims=True)
        shifted = self.logits - top
        lse = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        self.log_probs = shifted - lse
        self.probs = np.exp(self.log_probs)

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        """``log p(a)`` per row for integer ``actions`` ``(batch,)`` -> ``(batch,)``."""
        a = np.asarray(actions, dtype=np.int64).reshape(-1)
        return self.log_probs[np.arange(a.size), a]

    def entropy(self) -> np.ndarray:
        """``-sum p log p`` over allowed options, ``(batch,)`` (nats)."""
        plogp = np.where(self.mask, self.probs * self.log_probs, 0.0)
        return -plogp.sum(axis=1)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One option per row, ``(batch,)`` int64; never a forbidden one."""
        cdf = np.cumsum(self.probs, axis=1)
        u = rng.random((cdf.shape[0], 1)) * cdf[:, -1:]
        a = (u >= cdf).sum(axis=1)
        # Guard against rounding at the top end landing on a masked tail.
        last_allowed = self.mask.shape[1] - 1 - np.argmax(self.mask[:, ::-1], axis=1)
        return np.minimum(a, last_allowed).astype(np.int64)

    def mode(self) -> np.ndarray:
        """The most probable allowed option per row, ``(batch,)`` int64."""
        return np.argmax(self.logits, axis=1).astype(np.int64)

    def log_prob_backward(self, actions: np.ndarray,
                          dlogp: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the raw logits of ``sum dlogp * log_prob(actions)``.

        ``d log p(a) / d logit_j = [j == a] - p_j``; 0 for forbidden ``j``.
        Returns shape ``(batch, n)``.
        """
        a = np.asarray(actions, dtype=np.int64).reshape(-1)
        d = -self.probs.copy()
        d[np.arange(a.size), a] += 1.0
        return np.where(self.mask, d * np.reshape(dlogp, (-1, 1)), 0.0)

    def entropy_backward(self, dent: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the raw logits of ``sum dent * entropy()``.

        ``dH / d logit_j = -p_j (log p_j + H)``; 0 for forbidden ``j``.
        """
        h = self.entropy()[:, None]
        d = -self.probs * (np.where(self.mask, self.log_probs, 0.0) + h)
        return np.where(self.mask, d * np.reshape(dent, (-1, 1)), 0.0)


# --------------------------------------------------------------------------
# Masked Dirichlet


def concentration_forward(z: np.ndarray, alpha_min: float) -> np.ndarray:
    """Concentrations ``alpha = softplus(z) + alpha_min`` (always > 0)."""
    return softplus(z) + alpha_min


def concentration_backward(dalpha: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Gradient through :func:`concentration_forward`: ``dalpha * sigmoid(z)``."""
    return dalpha * sigmoid(z)


class MaskedDirichlet:
    """Dirichlet over the usable devices of each row.

    Args:
        alpha: concentrations ``(batch, n)`` (or ``(n,)``), > 0 where usable;
            entries where the mask is False are ignored.
        mask: bool ``(batch, n)``, ``True`` = usable. Default: all usable.

    The density is over the ``K = mask.sum(axis=1)`` usable shares only, so a
    row with one usable device is a point mass (log-density 0, entropy 0).
    Mean share of usable device ``i`` is ``alpha_i / sum_usable alpha``.
    """

    #: Shares below this are clipped in :meth:`log_prob` (log 0 is -inf).
    TINY = 1e-12

    def __init__(self, alpha: np.ndarray, mask: np.ndarray | None = None) -> None:
        a = _rows(alpha)
        self.mask = (np.ones(a.shape, dtype=bool) if mask is None
                     else check_mask(_mask_rows(mask), a.shape, "device"))
        bad = self.mask & ~(a > 0)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ValueError(f"Dirichlet concentration of device {col} (row {row}) "
                             f"is {a[row, col]!r}; it must be > 0")
        self.alpha = np.where(self.mask, a, 1.0)
        self.k = self.mask.sum(axis=1)
        self.alpha0 = np.where(self.mask, self.alpha, 0.0).sum(axis=1)

    @property
    def mean(self) -> np.ndarray:
        """Mean shares ``(batch, n)``; exactly 0 where masked."""
        return np.where(self.mask, self.alpha, 0.0) / self.alpha0[:, None]

    def _log_norm(self) -> np.ndarray:
        """``log B(alpha) = sum lgamma(alpha_i) - lgamma(alpha0)`` per row."""
        lg = np.where(self.mask, lgamma(self.alpha), 0.0).sum(axis=1)
        return lg - lgamma(self.alpha0)

    def _log_x(self, x: np.ndarray) -> np.ndarray:
        x = _rows(x)
        return np.where(self.mask, np.log(np.maximum(x, self.TINY)), 0.0)

    def log_prob(self, x: np.ndarray) -> np.ndarray:
        """Log-density ``(batch,)`` of shares ``x`` ``(batch, n)`` (usable simplex)."""
        term = np.where(self.mask, (self.alpha - 1.0) * self._log_x(x), 0.0)
        return term.sum(axis=1) - self._log_norm()

    def entropy(self) -> np.ndarray:
        """Differential entropy per row, ``(batch,)`` (nats; may be negative).

        ``log B(alpha) + (alpha0 - K) psi(alpha0) - sum (alpha_i - 1) psi(alpha_i)``.
        """
        term = np.where(self.mask, (self.alpha - 1.0) * digamma(self.alpha), 0.0)
        return (self._log_norm() + (self.alpha0 - self.k) * digamma(self.alpha0)
                - term.sum(axis=1))

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """Shares ``(batch, n)``: normalised gamma draws; exactly 0 where masked.

        Draws that underflow to all zeros (tiny concentrations) fall back to
        the mean, so every row sums to 1.
        """
        g = np.where(self.mask, rng.gamma(self.alpha), 0.0)
        total = g.sum(axis=1, keepdims=True)
        ok = total[:, 0] > 0
        out = self.mean.copy()
        out[ok] = g[ok] / total[ok]
        return out

    def log_prob_backward_alpha(self, x: np.ndarray,
                                dlogp: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. ``alpha`` of ``sum dlogp * log_prob(x)``, ``(batch, n)``.

        ``d log p / d alpha_i = log x_i + psi(alpha0) - psi(alpha_i)``; 0 if masked.
        """
        d = self._log_x(x) + digamma(self.alpha0)[:, None] - digamma(self.alpha)
        return np.where(self.mask, d * np.reshape(dlogp, (-1, 1)), 0.0)

    def entropy_backward_alpha(self, dent: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. ``alpha`` of ``sum dent * entropy()``, ``(batch, n)``.

        ``dH / d alpha_i = (alpha0 - K) psi'(alpha0) - (alpha_i - 1) psi'(alpha_i)``.
        """
        d = ((self.alpha0 - self.k) * trigamma(self.alpha0))[:, None] \
            - (self.alpha - 1.0) * trigamma(self.alpha)
        return np.where(self.mask, d * np.reshape(dent, (-1, 1)), 0.0)

