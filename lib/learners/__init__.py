"""Learners that split one divisible task over several devices.

Every learner here answers the same question, environment-agnostic: given an
observation vector and masks, which shares and which discrete options?

    propose(obs, device_mask, discrete_masks) -> (shares, choices)

- ``obs``: float array ``(obs_dim,)``, e.g. :func:`lib.contract.encode_state`.
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

Modules:

- :mod:`lib.learners.nn` -- layers with paired forward/backward passes, MLP, Adam.
- :mod:`lib.learners.distributions` -- masked categorical and masked Dirichlet,
  digamma/trigamma, with gradients.
- :mod:`lib.learners.normalize` -- running observation statistics.
- :mod:`lib.learners.ppo` -- GAE, :class:`PPOAgent` (Dirichlet allocation head,
  masked categorical heads, value head), policy files.
- :mod:`lib.learners.td3` -- :class:`TD3Agent` over softmax shares, replay buffer.
- :mod:`lib.learners.bandit` -- :class:`ShareBandit`, LinUCB / Thompson sampling
  over perturbations of a base decision, for online adaptation.
- :mod:`lib.learners.toy` -- a one-step problem with a known optimum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from lib.learners.bandit import BanditConfig, ShareBandit, log_speedup
from lib.learners.ppo import PolicyFormatError, PPOAgent, PPOConfig, gae
from lib.learners.td3 import TD3Agent, TD3Config


@runtime_checkable
class Learner(Protocol):
    """What every learner provides (see the module docstring)."""

    def propose(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, list[int]]: ...


__all__ = [
    "BanditConfig", "Learner", "PPOAgent", "PPOConfig",
    "PolicyFormatError", "ShareBandit", "TD3Agent", "TD3Config", "gae",
    "log_speedup",
]
