"""Many split environments on the model backend, stepped as one batch.

:class:`BatchModelEnv` holds N :class:`~lib.env.split.SplitEnv` (model backend)
and takes one dict of actions with a leading batch axis. Each environment turns
its row into a Decision with its own decoder (the masks depend on its machine
and state), hashes it, runs Gate 1 and Eq. (1) (:func:`lib.costmodel.predict`)
and draws the next task. Environment ``i`` of a batch reset with seed ``s`` is
``SplitEnv`` reset with seed ``s + i``, so the same actions earn the same rewards.
The environments may each have their own configuration (a mixture of
curriculum stages and fixed machines).

An environment whose episode ends is reset in the same step: its last
observation is in ``info["final_observation"]`` and the returned observation
starts its next episode (seeded from its own generator).

:func:`lib.evaluation.bench.env_steps_per_second` measures both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from lib.env.split import EnvConfig, SplitEnv
from lib.policies.actions import OBS_KEYS, action_space, observation_space


def stack_observations(obs: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Observations of single environments as one batch (leading axis N)."""
    return {k: np.stack([o[k] for o in obs]) for k in OBS_KEYS}


class BatchModelEnv:
    """N model-backend split environments stepped together.

    Args:
        num_envs: N, the batch size (typically 8-256).
        config: an :class:`EnvConfig` (its backend must be ``"model"``), or a
            sequence of them, environment ``i`` taking ``config[i % len]``;
            keyword arguments override their fields.
    """

    def __init__(self, num_envs: int,
                 config: EnvConfig | Sequence[EnvConfig] | None = None,
                 **overrides: Any):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        configs = list(config) if isinstance(config, (list, tuple)) else [config]
        self.envs = [SplitEnv(configs[i % len(configs)], **overrides)
                     for i in range(num_envs)]
        if self.envs[0].measured:
            raise ValueError(f"BatchModelEnv steps the model backend only, not "
                             f"{self.envs[0].config.backend!r}")
        self.num_envs = num_envs
        self.single_observation_space = observation_space()
        self.single_action_space = action_space()
        self.observation_space = batch_space(self.single_observation_space,
                                             num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None):
        """Reset every environment (env ``i`` with ``seed + i``).

        Returns:
            ``(obs, infos)``: obs a dict of arrays with leading axis N, infos a
            list of N dicts.
        """
        results = [env.reset(seed=None if seed is None else seed + i,
                             options=options) for i, env in enumerate(self.envs)]
        obs = stack_observations([o for o, _ in results])
        return obs, [info for _, info in results]

    def step(self, actions: Mapping[str, np.ndarray]):
        """Step every environment with its row of ``actions``.

        Args:
            actions: ``shares`` ``(N, S)`` float (``S`` slots, at least each
                machine's devices), ``block``, ``mode``, ``comm_path``,
                ``chunks`` ``(N,)`` ints.

        Returns:
            ``(obs, rewards, terminated, truncated, infos)``: rewards ``(N,)``
            float64, the flags ``(N,)`` bool, infos a list of N dicts.
        """
        mode = np.asarray(actions["mode"]).astype(np.int64).reshape(self.num_envs)
        block = np.asarray(actions["block"]).astype(np.int64).reshape(self.num_envs)
        path = np.asarray(actions["comm_path"]).astype(np.int64).reshape(
            self.num_envs)
        chunks = np.asarray(actions["chunks"]).astype(np.int64).reshape(
            self.num_envs)
        shares = np.asarray(actions["shares"], dtype=np.float64).reshape(
            self.num_envs, -1)
        obs, infos = [], []
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            decision = env.decoder.decide(env.task, shares[i], int(block[i]),
                                          int(mode[i]), int(path[i]),
                                          int(chunks[i]))
            o, rewards[i], terminated[i], truncated[i], info = \
                env.step_decision(decision)
            if terminated[i] or truncated[i]:
                info["final_observation"] = o
                o, _ = env.reset()
            obs.append(o)
            infos.append(info)
        batch = stack_observations(obs)
        return batch, rewards, terminated, truncated, infos

    def close(self) -> None:
        for env in self.envs:
            env.close()
