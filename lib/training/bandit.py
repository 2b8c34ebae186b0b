"""Online adaptation on the model backend: the learning curve of a share bandit."""

from __future__ import annotations

import numpy as np

from lib.contract import BLOCKS, MODES
from lib.env import EnvConfig, SplitEnv
from lib.env.split import MODEL_LOG10_BYTES
from lib.learners.bandit import BanditConfig, ShareBandit
from lib.platform.machines import Machine, load_machine
from lib.policies.learned import (
    OBS_DIM,
    LearnedPolicy,
    ObservationEncoder,
    action_from_choices,
)
from lib.policies.observation import STATE_DEVICES


def bandit_curve(machine: str | Machine = "hetero-4", steps: int = 400,
                 seed: int = 0, base: LearnedPolicy | None = None,
                 chunk: int = 20) -> list[dict[str, float]]:
    """Online learning curve of :class:`ShareBandit` around a base decision
    (equal split by default) on ``machine`` (model backend, idle devices).

    The context is the state vector; the reward is Eq. (2). Returns one row
    per ``chunk`` decisions: ``step`` and the mean ``reward``.
    """
    enc = ObservationEncoder()
    bandit = ShareBandit(STATE_DEVICES, OBS_DIM, BanditConfig(seed=seed),
                         base=None if base is None else base.learner)
    env = SplitEnv(EnvConfig(machine=load_machine(machine).name, p_busy=0.0,
                             task_log10_bytes=MODEL_LOG10_BYTES,
                             episode_len=10**9))
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
            obs, r, _, _, _ = env.step(action_from_choices(shares, ch))
            bandit.update(choice, float(r))
            acc.append(float(r))
            if len(acc) == chunk:
                rows.append({"step": step + 1, "reward": float(np.mean(acc))})
                acc = []
    finally:
        env.close()
    return rows
