"""Online adaptation on the model backend: the learning curve of a share bandit."""

from __future__ import annotations

from typing import Any

import numpy as np

from lib.contract import BLOCKS, MODES
from lib.env import EnvConfig, SplitEnv
from lib.env.split import MODEL_LOG10_BYTES
from lib.learners.bandit import BanditConfig, ShareBandit
from lib.platform.machines import Machine, load_machine
from lib.policies.learned import (
    LearnedPolicy,
    ObservationEncoder,
    action_from_choices,
    flat_dim,
)


class _PolicyBase:
    """A learned policy as the bandit's base learner: its deterministic
    action for the environment's current task (the observation the bandit
    passes is its context, not the policy's)."""

    def __init__(self, policy: LearnedPolicy, env: SplitEnv) -> None:
        self.policy, self.env = policy, env

    def propose(self, obs: Any, device_mask: Any = None, discrete_masks: Any = None
                ) -> tuple[np.ndarray, list[int]]:
        e = self.env
        shares, choices, _ = self.policy.act(e.task, e.machine, e.telemetry)
        return shares, choices


def bandit_curve(machine: str | Machine = "hetero-4", steps: int = 400,
                 seed: int = 0, base: LearnedPolicy | None = None,
                 chunk: int = 20) -> list[dict[str, float]]:
    """Online learning curve of :class:`ShareBandit` around a base decision
    (equal split by default, else ``base``'s) on ``machine`` (model backend,
    idle devices).

    The bandit has one device slot per device of ``machine``; its context is
    the flat observation over those slots; the reward is Eq. (2). Returns one
    row per ``chunk`` decisions: ``step`` and the mean ``reward``.
    """
    m = load_machine(machine)
    enc = ObservationEncoder(slots=m.n)
    env = SplitEnv(EnvConfig(machine=m, p_busy=0.0,
                             task_log10_bytes=MODEL_LOG10_BYTES))
    bandit = ShareBandit(m.n, flat_dim(m.n, True), BanditConfig(seed=seed),
                         base=None if base is None else _PolicyBase(base, env))
    obs, _ = env.reset(seed=seed)
    rows, acc = [], []
    try:
        for step in range(steps):
            x = enc.flat(obs)
            dmask, cmasks = enc.masks(obs)
            shares, ch = bandit.propose(x, dmask, cmasks)
            if base is None:
                ch = [BLOCKS.index(256), MODES.index("split"), 0, 0]
            choice = bandit.last_choice
            _, r, _, _, _ = env.step(action_from_choices(shares, ch))
            bandit.update(choice, float(r))
            obs, _ = env.reset()
            acc.append(float(r))
            if len(acc) == chunk:
                rows.append({"step": step + 1, "reward": float(np.mean(acc))})
                acc = []
    finally:
        env.close()
    return rows
