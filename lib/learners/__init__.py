"""Learners that split one divisible task over several devices.

Every learner here answers the same question, environment-agnostic: given an
observation vector and masks, which shares and which discrete options?

    propose(obs, device_mask, discrete_masks) -> (shares, choices)

- ``obs``: float array ``(obs_dim,)`` (a set learner's: the set's features
  then one row per device slot, e.g. :func:`lib.policies.observation.encode_state`).
- ``device_mask``: bool ``(n_devices,)``, ``True`` for usable devices.
- ``discrete_masks``: one bool array ``(size_h,)`` per discrete head (e.g. mode,
  comm path), ``True`` for allowed options; ``None`` allows everything.
- ``shares``: float64 ``(n_devices,)`` summing to 1, exactly 0 on unusable
  devices.
- ``choices``: ``list[int]``, one allowed option index per discrete head.

:class:`Learner` states it as a protocol. The decision plane wraps a learner
into a policy ``decide(task, machine, telemetry) -> Decision`` (encode the state,
build the masks, map shares and choices onto a :class:`lib.contract.Decision`):
that is :class:`lib.policies.learned.LearnedPolicy`, one layer up. Nothing here
knows about tasks, machines or decisions: these are pure NumPy learners.

:class:`TrainableLearner` adds what a training loop needs from any learner
(:class:`PPOAgent` and :class:`TD3Agent` provide it), for one-step episodes:

    explore(obs, device_mask, discrete_masks) -> (shares, choices)   # a batch
    record(reward)                  # the rewards of the last explore()
    learn(replay_ratio) -> stats    # update on what was recorded since
    anneal(frac, lr, lr_final, ent_coef)  # point frac of the schedules
    state() -> (arrays, meta); load_state(arrays, meta)   # checkpoints

:class:`ShareBandit` learns online from one measured reward at a time
(``propose`` then ``update``) and is a :class:`Learner` only.

Modules:

- :mod:`lib.learners.nn` -- layers with paired forward/backward passes, MLP, Adam.
- :mod:`lib.learners.setnet` -- layers over sets of items (per-item affine,
  masked mean/max pooling), :class:`SetNet` (any number of items, in any
  order) and water-filling (shares that equalise finish times).
- :mod:`lib.learners.distributions` -- masked categorical and masked Dirichlet,
  digamma/trigamma, with gradients.
- :mod:`lib.learners.normalize` -- running observation statistics.
- :mod:`lib.learners.ppo` -- GAE, :class:`PPOAgent` (Dirichlet allocation head,
  masked categorical heads, value head), policy files.
- :mod:`lib.learners.setppo` -- :class:`SetPPOAgent`, PPO over sets of devices
  (water-filled shares, a Dirichlet around them, masked categorical heads,
  imitation with a makespan term, demonstrations in every PPO step).
- :mod:`lib.learners.td3` -- :class:`TD3Agent` over softmax shares, replay buffer.
- :mod:`lib.learners.bandit` -- :class:`ShareBandit`, LinUCB / Thompson sampling
  over perturbations of a base decision, for online adaptation.
- :mod:`lib.learners.toy` -- a one-step problem with a known optimum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lib.learners.bandit import BanditConfig, ShareBandit, log_speedup
from lib.learners.ppo import PolicyFormatError, PPOAgent, PPOConfig, gae
from lib.learners.setppo import SetPPOAgent, SetPPOConfig
from lib.learners.td3 import TD3Agent, TD3Config


@runtime_checkable
class Learner(Protocol):
    """What every learner provides (see the module docstring)."""

    def propose(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, list[int]]: ...


@runtime_checkable
class TrainableLearner(Learner, Protocol):
    """A :class:`Learner` a training loop can improve, checkpoint and resume.

    An iteration calls :meth:`explore` on a batch of observations, steps the
    environment with the returned actions, hands the rewards to
    :meth:`record` (repeated as often as the loop likes), then calls
    :meth:`learn` once. Every action is a one-step episode: its reward ends it.
    """

    def explore(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray | None] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Exploratory actions for ``obs`` ``(B, obs_dim)`` under the masks
        (``(B, n_devices)`` bool; one ``(B, size_h)`` bool or ``None`` per
        head; ``None`` allows everything): ``shares (B, n_devices)`` and
        ``choices (B, H)`` int. The learner keeps them for :meth:`record`."""
        ...

    def record(self, reward: np.ndarray) -> None:
        """The rewards ``(B,)`` of the actions of the last :meth:`explore`."""
        ...

    def learn(self, replay_ratio: float = 1.0) -> dict[str, float]:
        """Update on the steps recorded since the last call; ``replay_ratio``
        is the gradient steps per recorded step of an off-policy learner
        (on-policy learners ignore it). Returns scalar statistics."""
        ...

    def anneal(self, frac: float, lr: float, lr_final: float,
               ent_coef: float) -> None:
        """Set the learner to point ``frac`` (0 to 1) of linear schedules from
        step size ``lr`` to ``lr_final`` and entropy bonus ``ent_coef`` to 0
        (a learner without such settings ignores it)."""
        ...

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Everything needed to continue training bit for bit: named arrays
        and JSON-able metadata (generator state included)."""
        ...

    def load_state(self, arrays: Mapping[str, np.ndarray],
                   meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state` returned."""
        ...


__all__ = [
    "BanditConfig", "Learner", "PPOAgent", "PPOConfig",
    "PolicyFormatError", "SetPPOAgent", "SetPPOConfig", "ShareBandit",
    "TD3Agent", "TD3Config",
    "TrainableLearner", "gae", "log_speedup",
]
