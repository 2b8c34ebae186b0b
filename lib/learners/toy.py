"""A one-step contextual problem with a known optimum, for sanity checks.

Each context is a machine of ``n_devices`` slots, some unusable, with a random
speed per usable device, plus a "right" discrete option. Splitting a divisible
task with shares ``s`` finishes in ``T(s) = max_i s_i / speed_i``, minimised by
shares proportional to speed. The reward is

    log(T(equal split) / T(s)) + bonus * [choice == right option]

so the equal split scores 0 and the optimum ``log(T_eq / T_opt) + bonus``.
The observation is ``[log speed_i (0 if unusable), usable_i, one-hot(right)]``;
the discrete mask forbids one wrong option per context.

The tests, the benchmarks and the book use it; no learner depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.learners.ppo import gae


@dataclass
class SpeedShareProblem:
    """The problem's sizes and ranges."""

    n_devices: int = 4
    """Device slots."""
    n_options: int = 3
    """Options of the single discrete head."""
    min_usable: int = 2
    """Fewest usable devices per context."""
    log_speed_range: float = 1.0
    """Speeds are ``exp(uniform(-r, r))`` (1.0: a factor of e either way)."""
    bonus: float = 0.2
    """Reward for picking the right discrete option."""

    @property
    def obs_dim(self) -> int:
        """Observation length ``2 * n_devices + n_options``."""
        return 2 * self.n_devices + self.n_options

    def sample(self, rng: np.random.Generator, batch: int
               ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], dict[str, Any]]:
        """``batch`` contexts.

        Returns:
            ``obs`` ``(batch, obs_dim)``, ``device_mask`` ``(batch, n)`` bool,
            ``[discrete_mask (batch, n_options) bool]`` and ``info`` with
            ``speeds`` ``(batch, n)`` (0 where unusable) and ``right``
            ``(batch,)``.
        """
        n, k = self.n_devices, self.n_options
        usable = rng.random((batch, n)) < 0.75
        for row in range(batch):
            while usable[row].sum() < self.min_usable:
                usable[row, rng.integers(n)] = True
        log_s = np.where(usable, rng.uniform(-self.log_speed_range,
                                             self.log_speed_range, (batch, n)), 0.0)
        speeds = np.where(usable, np.exp(log_s), 0.0)
        right = rng.integers(k, size=batch)
        dmask = np.ones((batch, k), dtype=bool)
        banned = (right + rng.integers(1, k, size=batch)) % k
        dmask[np.arange(batch), banned] = False
        obs = np.concatenate([log_s, usable.astype(np.float64),
                              np.eye(k)[right]], axis=1)
        return obs, usable, [dmask], {"speeds": speeds, "right": right}

    def reward(self, info: dict[str, Any], shares: np.ndarray,
               choices: np.ndarray) -> np.ndarray:
        """Rewards ``(batch,)`` for ``shares (batch, n)`` and ``choices (batch, 1)``."""
        speeds = info["speeds"]
        usable = speeds > 0
        k = usable.sum(axis=1, keepdims=True)
        safe = np.where(usable, speeds, 1.0)
        t_eq = np.where(usable, 1.0 / (k * safe), 0.0).max(axis=1)
        t = np.where(usable, np.asarray(shares) / safe, 0.0).max(axis=1)
        hit = np.asarray(choices).reshape(len(t), -1)[:, 0] == info["right"]
        return np.log(t_eq / np.maximum(t, 1e-12)) + self.bonus * hit

    def optimum(self, info: dict[str, Any]) -> np.ndarray:
        """Best reward per context, ``(batch,)``."""
        speeds = info["speeds"]
        best = speeds / speeds.sum(axis=1, keepdims=True)
        return self.reward(info, best, info["right"][:, None])


def train_ppo(agent: Any, problem: SpeedShareProblem, iterations: int,
              batch: int, rng: np.random.Generator,
              evaluate_every: int = 1) -> list[dict[str, float]]:
    """Train a :class:`~lib.learners.ppo.PPOAgent` on one-step episodes.

    With one-step episodes GAE reduces to ``advantage = reward - value``.

    Returns:
        Per iteration: ``reward`` (mean of the sampled actions),
        ``greedy_reward`` (mean of deterministic actions on 256 fresh contexts,
        measured *before* the update every ``evaluate_every`` iterations, NaN
        otherwise or when 0) and the update's statistics.
    """
    history = []
    for it in range(iterations):
        greedy = (evaluate(agent, problem, rng, 256)
                  if evaluate_every and it % evaluate_every == 0 else float("nan"))
        obs, dmask, cmasks, info = problem.sample(rng, batch)
        out = agent.act_batch(obs, dmask, cmasks, rng)
        r = problem.reward(info, out.shares, out.choices)
        adv, ret = gae(r, out.value, np.ones(batch), 0.0, agent.config.gamma,
                       agent.config.lam)
        stats = agent.update({"obs": obs, "device_mask": dmask,
                              "discrete_masks": cmasks, "shares": out.shares,
                              "choices": out.choices, "logp": out.logp,
                              "advantages": adv, "returns": ret})
        history.append({"reward": float(r.mean()), "greedy_reward": greedy,
                        **stats})
    return history


def evaluate(learner: Any, problem: SpeedShareProblem,
             rng: np.random.Generator, batch: int) -> float:
    """Mean reward of ``learner.propose`` on ``batch`` fresh contexts."""
    obs, dmask, cmasks, info = problem.sample(rng, batch)
    shares = np.zeros((batch, problem.n_devices))
    choices = np.zeros((batch, 1), dtype=np.int64)
    for i in range(batch):
        s, ch = learner.propose(obs[i], dmask[i], [m[i] for m in cmasks])
        shares[i] = s
        choices[i, 0] = ch[0] if ch else 0
    return float(problem.reward(info, shares, choices).mean())
