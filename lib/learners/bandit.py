"""Online adaptation from measured runs: a contextual bandit around a base decision.

A learned (or baseline) policy proposes base shares; the bandit chooses among
a small set of *arms*, each a fixed perturbation of those shares:

- arm 0: the base shares unchanged;
- arm ``1 + 2 (j * n + i)``: move a fraction ``deltas[j]`` of the total onto
  device ``i``: ``(1 - delta) * base + delta * e_i``;
- arm ``2 + 2 (j * n + i)``: take a fraction ``deltas[j]`` of device ``i``'s
  share away and give it to the other usable devices in proportion to theirs.

Arms touching an unusable device (or taking from a device with nothing to
give) are unavailable for that decision. Each arm keeps a ridge regression of
reward on the context (disjoint LinUCB, Li et al., 2010): ``A_a = lambda I +
sum x x^T``, ``b_a = sum r x``, ``theta_a = A_a^-1 b_a``. Selection is either

- ``"ucb"``: ``argmax theta_a . x + beta sqrt(x^T A_a^-1 x)``, or
- ``"thompson"``: ``argmax theta~ . x`` with ``theta~ ~ N(theta_a, v^2 A_a^-1)``.

The reward of a measured run is :func:`log_speedup` ``= log(T_ref / T)``, with
``T_ref`` the time of a reference decision (the base decision, or the equal
split) on the same task, so 0 means "as good as the reference" and rewards add
across tasks of very different sizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def log_speedup(t_ref: float, t: float) -> float:
    """``log(t_ref / t)``: positive when the measured time ``t`` beats ``t_ref``."""
    if not (t_ref > 0 and t > 0):
        raise ValueError(f"times must be positive seconds, got reference {t_ref!r} "
                         f"and measured {t!r}")
    return math.log(t_ref / t)


@dataclass
class BanditConfig:
    """Hyperparameters of :class:`ShareBandit`."""

    deltas: tuple[float, ...] = (0.1, 0.25)
    """Sizes of the share perturbations (fractions in (0, 1))."""
    strategy: str = "ucb"
    """``"ucb"`` (LinUCB) or ``"thompson"`` (linear Thompson sampling)."""
    beta: float = 0.3
    """LinUCB exploration width, in reward units (0.1 to 1 for log-speedups)."""
    noise_scale: float = 0.1
    """Thompson sampling posterior scale ``v`` (about the reward noise std)."""
    ridge: float = 1.0
    """Ridge regulariser ``lambda`` of each arm's regression."""
    seed: int = 0
    """Seed of Thompson draws and tie breaking."""


@dataclass
class ArmChoice:
    """One bandit decision, to be handed back to :meth:`ShareBandit.update`."""

    arm: int
    """Index of the chosen arm."""
    shares: np.ndarray
    """``(n_devices,)`` shares of that arm."""
    context: np.ndarray
    """``(context_dim,)`` float64 context it was chosen for."""
    scores: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    """Score of every arm (``-inf`` where unavailable)."""


class ShareBandit:
    """Disjoint linear bandit over perturbations of base shares.

    Args:
        n_devices: device slots.
        context_dim: length of the context vector (a constant 1 is appended
            internally, so an empty context gives a plain multi-armed bandit).
        config: hyperparameters.
        base: optional learner with ``propose(obs, device_mask, discrete_masks)
            -> (shares, choices)`` supplying base decisions for
            :meth:`propose`; without one the base is the equal split.
    """

    def __init__(self, n_devices: int, context_dim: int,
                 config: BanditConfig | None = None, base: Any = None) -> None:
        self.config = c = config or BanditConfig()
        if c.strategy not in ("ucb", "thompson"):
            raise ValueError(f"strategy {c.strategy!r} is not 'ucb' or 'thompson'")
        if not all(0.0 < d < 1.0 for d in c.deltas):
            raise ValueError(f"deltas must lie in (0, 1), got {c.deltas}")
        self.n_devices = int(n_devices)
        self.dim = int(context_dim) + 1
        self.n_arms = 1 + 2 * len(c.deltas) * self.n_devices
        self.base = base
        self.rng = np.random.default_rng(c.seed)
        self.a_inv = np.repeat(np.eye(self.dim)[None] / c.ridge, self.n_arms, axis=0)
        self.b = np.zeros((self.n_arms, self.dim))
        self.counts = np.zeros(self.n_arms, dtype=np.int64)
        self.last_choice: ArmChoice | None = None

    def describe_arm(self, arm: int) -> str:
        """Human form of an arm, e.g. ``"+0.25 to device 2"``."""
        if arm == 0:
            return "base"
        j, rest = divmod(arm - 1, 2 * self.n_devices)
        i, away = divmod(rest, 2)
        sign = "-" if away else "+"
        prep = "from" if away else "to"
        return f"{sign}{self.config.deltas[j]:g} {prep} device {i}"

    def candidates(self, base_shares: np.ndarray,
                   device_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shares of every arm ``(n_arms, n_devices)``; availability ``(n_arms,)``.

        Unavailable arms hold the base shares, so every row is a valid split.
        """
        base = np.where(device_mask, np.asarray(base_shares, dtype=np.float64), 0.0)
        base = base / base.sum()
        n = self.n_devices
        out = np.repeat(base[None], self.n_arms, axis=0)
        ok = np.ones(self.n_arms, dtype=bool)
        for j, delta in enumerate(self.config.deltas):
            for i in range(n):
                up, down = 1 + 2 * (j * n + i), 2 + 2 * (j * n + i)
                e = np.eye(n)[i]
                out[up] = (1.0 - delta) * base + delta * e
                others = base.sum() - base[i]
                if others > 0:
                    take = delta * base[i]
                    out[down] = base + take * (base / others) * (1.0 - e) - take * e
                ok[up] = device_mask[i] and base[i] < 1.0 and base.sum() > base[i]
                ok[down] = device_mask[i] and base[i] > 0 and others > 0
        out = np.clip(out, 0.0, None)
        out = out / out.sum(axis=1, keepdims=True)
        out[~ok] = base  # an unavailable arm never holds an invalid split
        return out, ok

    def _features(self, context: np.ndarray) -> np.ndarray:
        x = np.asarray(context, dtype=np.float64).reshape(-1)
        if x.size != self.dim - 1:
            raise ValueError(f"context has {x.size} entries, the bandit expects "
                             f"{self.dim - 1}")
        return np.append(x, 1.0)

    def scores(self, context: np.ndarray) -> np.ndarray:
        """Score of every arm for ``context`` under the configured strategy."""
        c = self.config
        x = self._features(context)
        theta = np.einsum("aij,aj->ai", self.a_inv, self.b)
        if c.strategy == "ucb":
            width = np.sqrt(np.einsum("i,aij,j->a", x, self.a_inv, x))
            return theta @ x + c.beta * width
        draws = np.empty(self.n_arms)
        for a in range(self.n_arms):
            cov = c.noise_scale**2 * self.a_inv[a]
            draws[a] = self.rng.multivariate_normal(theta[a], cov) @ x
        return draws

    def select(self, context: np.ndarray, base_shares: np.ndarray,
               device_mask: np.ndarray | None = None) -> ArmChoice:
        """Choose an arm for ``context`` around ``base_shares`` ``(n_devices,)``."""
        mask = (np.ones(self.n_devices, dtype=bool) if device_mask is None
                else np.asarray(device_mask, dtype=bool))
        shares, ok = self.candidates(base_shares, mask)
        s = np.where(ok, self.scores(context), -np.inf)
        # Break ties at random so untried arms are explored in no fixed order.
        best = np.flatnonzero(s >= s.max() - 1e-12)
        arm = int(self.rng.choice(best))
        return ArmChoice(arm=arm, shares=shares[arm],
                         context=self._features(context)[:-1], scores=s)

    def update(self, choice: ArmChoice, reward: float) -> None:
        """Add the measured ``reward`` (e.g. :func:`log_speedup`) for ``choice``."""
        x = self._features(choice.context)
        a = choice.arm
        ax = self.a_inv[a] @ x
        self.a_inv[a] -= np.outer(ax, ax) / (1.0 + x @ ax)  # Sherman-Morrison
        self.b[a] += reward * x
        self.counts[a] += 1

    def propose(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, list[int]]:
        """The common learner interface, using ``obs`` as the context.

        The base learner (or the equal split) gives base shares and choices;
        the bandit picks an arm around them. The choice is kept in
        :attr:`last_choice` for a following :meth:`update`.
        """
        mask = (np.ones(self.n_devices, dtype=bool) if device_mask is None
                else np.asarray(device_mask, dtype=bool))
        if self.base is None:
            base, choices = mask / mask.sum(), [
                int(np.argmax(m)) for m in (discrete_masks or [])]
        else:
            base, choices = self.base.propose(obs, mask, discrete_masks)
        self.last_choice = self.select(obs, base, mask)
        return self.last_choice.shares, list(choices)
