"""TD3 over share vectors (Fujimoto et al., 2018), with hand-written gradients.

Actions: the actor maps an observation to one logit per device; the shares are
the softmax of those logits over the usable devices (unusable devices get
exactly 0). Exploration adds Gaussian noise to the *logits* before the softmax,
so a noisy action is still a valid share vector.

Discrete choices are not learned: each head answers its default option
(``default_choices`` at construction, 0 unless given), or the first allowed
option when the default is masked. TD3 is the continuous-shares baseline; PPO
learns the discrete heads.

The three TD3 ingredients:

- twin critics ``Q1, Q2(obs, shares)``; targets use ``min(Q1', Q2')``;
- target policy smoothing: the target action adds clipped noise to the target
  actor's logits;
- delayed actor updates: the actor and the Polyak-averaged target networks
  move once every ``policy_delay`` critic steps.

Observations are used as given (no running normalisation: a replay buffer
holds observations from many policies); scale them beforehand, as
``lib.contract.encode_state`` does.

:class:`TD3Agent` is a :class:`lib.learners.TrainableLearner`: :meth:`~TD3Agent.explore`
acts with noise on the logits, :meth:`~TD3Agent.record` stores one-step
transitions and :meth:`~TD3Agent.learn` takes gradient steps in proportion to
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.learners.nn import (
    MLP,
    Adam,
    AdamConfig,
    Params,
    copy_params,
    masked_softmax_backward,
    masked_softmax_forward,
    polyak_update,
    prefixed,
    unprefixed,
)
from lib.learners.ppo import adam_arrays, restore_adam


@dataclass
class TD3Config:
    """Hyperparameters of :class:`TD3Agent`."""

    actor_lr: float = 1e-3
    """Adam step size of the actor (1e-4 to 1e-3)."""
    critic_lr: float = 1e-3
    """Adam step size of the critics (1e-4 to 1e-3)."""
    gamma: float = 0.99
    """Discount factor (irrelevant for one-step episodes)."""
    tau: float = 0.005
    """Polyak factor of the target networks (0.001 to 0.05)."""
    explore_noise: float = 0.3
    """Std of the Gaussian noise on the actor's logits when acting."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise on the target logits."""
    noise_clip: float = 0.5
    """Clip of the target policy smoothing noise."""
    policy_delay: int = 2
    """Critic steps per actor step and target update."""
    batch_size: int = 128
    """Transitions per gradient step."""
    buffer_size: int = 100_000
    """Replay buffer capacity (transitions)."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of actor and critics."""
    activation: str = "relu"
    """Hidden activation, ``"relu"`` or ``"tanh"``."""
    max_grad_norm: float = 0.0
    """Clip each network's gradient norm (0 disables)."""
    seed: int = 0
    """Seed of initialisation, noise and replay sampling."""


class ReplayBuffer:
    """Ring buffer of transitions ``(obs, mask, shares, reward, next, done)``.

    Args:
        obs_dim: observation length.
        n_devices: device slots.
        capacity: most transitions kept (oldest overwritten).
    """

    #: The arrays of a transition, in the order of :meth:`add`'s arguments.
    FIELDS = ("obs", "device_mask", "shares", "reward", "next_obs",
              "next_device_mask", "done")

    def __init__(self, obs_dim: int, n_devices: int, capacity: int) -> None:
        self.capacity = int(capacity)
        self.obs = np.zeros((capacity, obs_dim))
        self.device_mask = np.zeros((capacity, n_devices), dtype=bool)
        self.shares = np.zeros((capacity, n_devices))
        self.reward = np.zeros(capacity)
        self.next_obs = np.zeros((capacity, obs_dim))
        self.next_device_mask = np.zeros((capacity, n_devices), dtype=bool)
        self.done = np.zeros(capacity)
        self.size = 0
        self._next = 0

    def add(self, obs: np.ndarray, device_mask: np.ndarray, shares: np.ndarray,
            reward: np.ndarray, next_obs: np.ndarray,
            next_device_mask: np.ndarray, done: np.ndarray) -> None:
        """Append a batch of transitions (leading dimension ``B``; 1-D = one)."""
        obs = np.atleast_2d(obs)
        idx = (self._next + np.arange(obs.shape[0])) % self.capacity
        self.obs[idx] = obs
        self.device_mask[idx] = np.atleast_2d(device_mask)
        self.shares[idx] = np.atleast_2d(shares)
        self.reward[idx] = np.reshape(reward, -1)
        self.next_obs[idx] = np.atleast_2d(next_obs)
        self.next_device_mask[idx] = np.atleast_2d(next_device_mask)
        self.done[idx] = np.reshape(done, -1)
        self._next = int((idx[-1] + 1) % self.capacity)
        self.size = min(self.capacity, self.size + obs.shape[0])

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``batch`` transitions drawn uniformly with replacement."""
        if self.size == 0:
            raise ValueError("the replay buffer is empty")
        idx = rng.integers(self.size, size=batch)
        return {k: getattr(self, k)[idx] for k in self.FIELDS}


class TD3Agent:
    """Deterministic share policy trained with TD3.

    Args:
        obs_dim: observation length.
        n_devices: device slots.
        discrete_sizes: options of each discrete head (answered by defaults).
        config: hyperparameters.
        default_choices: default option per discrete head (0 for each).

    Attributes:
        actor: ``obs -> logits (n_devices)``.
        critic1, critic2: ``[obs, shares] -> Q``.
        buffer: the :class:`ReplayBuffer`.
    """

    def __init__(self, obs_dim: int, n_devices: int, discrete_sizes: Sequence[int],
                 config: TD3Config | None = None,
                 default_choices: Sequence[int] | None = None) -> None:
        self.config = c = config or TD3Config()
        self.obs_dim, self.n_devices = int(obs_dim), int(n_devices)
        self.discrete_sizes = [int(s) for s in discrete_sizes]
        self.default_choices = (list(default_choices) if default_choices is not None
                                else [0] * len(self.discrete_sizes))
        self.rng = np.random.default_rng(c.seed)
        self.actor = MLP([obs_dim, *c.hidden, n_devices], self.rng,
                         activation=c.activation, out_gain=0.01)
        self.critic1 = MLP([obs_dim + n_devices, *c.hidden, 1], self.rng,
                           activation=c.activation)
        self.critic2 = MLP([obs_dim + n_devices, *c.hidden, 1], self.rng,
                           activation=c.activation)
        self.actor_params = prefixed(self.actor.params, "actor")
        self.critic_params = {**prefixed(self.critic1.params, "critic1"),
                              **prefixed(self.critic2.params, "critic2")}
        self.target_actor = copy_params(self.actor_params)
        self.target_critic = copy_params(self.critic_params)
        self.actor_opt = Adam(self.actor_params, AdamConfig(
            lr=c.actor_lr, max_grad_norm=c.max_grad_norm))
        self.critic_opt = Adam(self.critic_params, AdamConfig(
            lr=c.critic_lr, max_grad_norm=c.max_grad_norm))
        self.buffer = ReplayBuffer(obs_dim, n_devices, c.buffer_size)
        self.critic_steps = 0
        # The last explore() awaiting its rewards: (obs, device_mask, shares).
        self._explored: tuple | None = None
        # Transitions recorded since the last learn().
        self._recorded = 0

    # ------------------------------------------------------------------
    # Acting

    def shares(self, obs: np.ndarray, device_mask: np.ndarray,
               noise: float = 0.0, rng: np.random.Generator | None = None
               ) -> np.ndarray:
        """Shares ``(B, n_devices)`` for observations ``(B, obs_dim)``.

        ``noise`` is the std of Gaussian noise added to the logits.
        """
        x = np.atleast_2d(np.asarray(obs, dtype=np.float64))
        mask = np.broadcast_to(np.asarray(device_mask, dtype=bool),
                               (x.shape[0], self.n_devices))
        logits = self.actor(x)
        if noise > 0:
            logits = logits + noise * (rng or self.rng).standard_normal(logits.shape)
        return masked_softmax_forward(logits, mask)[0]

    def default_discrete(self, discrete_masks: Sequence[np.ndarray] | None
                         ) -> list[int]:
        """The default choice per head, or its first allowed option if masked."""
        out = []
        for h, d in enumerate(self.default_choices):
            if discrete_masks is None or discrete_masks[h] is None:
                out.append(int(d))
                continue
            m = np.asarray(discrete_masks[h], dtype=bool).reshape(-1)
            out.append(int(d) if m[d] else int(np.argmax(m)))
        return out

    def propose(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, list[int]]:
        """The common learner interface: deterministic ``(shares, choices)``."""
        mask = (np.ones(self.n_devices, dtype=bool) if device_mask is None
                else device_mask)
        return self.shares(obs, mask)[0], self.default_discrete(discrete_masks)

    # ------------------------------------------------------------------
    # Losses

    def critic_targets(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """``r + gamma (1 - done) min(Q1', Q2')(s', pi'(s') + clipped noise)``."""
        c = self.config
        logits = self.actor(batch["next_obs"], unprefixed(self.target_actor, "actor"))
        noise = np.clip(c.policy_noise * self.rng.standard_normal(logits.shape),
                        -c.noise_clip, c.noise_clip)
        nxt, _ = masked_softmax_forward(logits + noise, batch["next_device_mask"])
        x = np.concatenate([batch["next_obs"], nxt], axis=1)
        q1 = self.critic1(x, unprefixed(self.target_critic, "critic1"))[:, 0]
        q2 = self.critic2(x, unprefixed(self.target_critic, "critic2"))[:, 0]
        return batch["reward"] + c.gamma * (1.0 - batch["done"]) * np.minimum(q1, q2)

    def critic_loss_and_grads(self, batch: dict[str, np.ndarray],
                              targets: np.ndarray) -> tuple[float, Params]:
        """``mean((Q1 - y)^2) + mean((Q2 - y)^2)`` and its gradient."""
        x = np.concatenate([batch["obs"], batch["shares"]], axis=1)
        b = x.shape[0]
        loss, grads = 0.0, {}
        for name, net in (("critic1", self.critic1), ("critic2", self.critic2)):
            q, cache = net.forward(x)
            err = q[:, 0] - targets
            loss += float(np.mean(err**2))
            _, g = net.backward((2.0 * err / b)[:, None], cache)
            grads.update(prefixed(g, name))
        return loss, grads

    def actor_loss_and_grads(self, obs: np.ndarray,
                             device_mask: np.ndarray) -> tuple[float, Params]:
        """``-mean Q1(s, softmax_mask(actor(s)))`` and its gradient w.r.t. the actor.

        The gradient flows from Q1 back through the critic's input (the shares
        part), the masked softmax and the actor; the critic is held fixed.
        """
        logits, cache_a = self.actor.forward(obs)
        shares, cache_s = masked_softmax_forward(logits, device_mask)
        q, cache_q = self.critic1.forward(np.concatenate([obs, shares], axis=1))
        b = obs.shape[0]
        dx, _ = self.critic1.backward(np.full((b, 1), -1.0 / b), cache_q)
        dlogits = masked_softmax_backward(dx[:, self.obs_dim:], cache_s)
        _, g = self.actor.backward(dlogits, cache_a)
        return -float(np.mean(q)), prefixed(g, "actor")

    # ------------------------------------------------------------------
    # Training

    def observe(self, obs: np.ndarray, device_mask: np.ndarray, shares: np.ndarray,
                reward: np.ndarray, next_obs: np.ndarray,
                next_device_mask: np.ndarray, done: np.ndarray) -> None:
        """Store transitions in the replay buffer (see :meth:`ReplayBuffer.add`)."""
        self.buffer.add(obs, device_mask, shares, reward, next_obs,
                        next_device_mask, done)

    def update(self, steps: int = 1) -> dict[str, float]:
        """``steps`` critic steps (and the delayed actor/target steps).

        Returns:
            Means of ``critic_loss`` and (if any actor step ran) ``actor_loss``.
        """
        c = self.config
        critic_losses, actor_losses = [], []
        for _ in range(steps):
            batch = self.buffer.sample(c.batch_size, self.rng)
            y = self.critic_targets(batch)
            loss, grads = self.critic_loss_and_grads(batch, y)
            self.critic_opt.step(grads)
            critic_losses.append(loss)
            self.critic_steps += 1
            if self.critic_steps % c.policy_delay == 0:
                a_loss, a_grads = self.actor_loss_and_grads(batch["obs"],
                                                            batch["device_mask"])
                self.actor_opt.step(a_grads)
                actor_losses.append(a_loss)
                polyak_update(self.target_actor, self.actor_params, c.tau)
                polyak_update(self.target_critic, self.critic_params, c.tau)
        out: dict[str, Any] = {"critic_loss": float(np.mean(critic_losses))}
        if actor_losses:
            out["actor_loss"] = float(np.mean(actor_losses))
        return out

    # ------------------------------------------------------------------
    # Training interface (lib.learners.TrainableLearner)

    def explore(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray | None] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Noisy actions (``config.explore_noise`` on the logits) for a batch of
        observations ``(B, obs_dim)``, kept for :meth:`record`.

        ``device_mask`` ``(B, n_devices)`` (``None`` = all usable); one mask
        ``(B, size_h)`` or ``None`` per discrete head.

        Returns:
            ``(shares (B, n_devices), choices (B, H) int)``, the choices being
            :meth:`default_discrete` of every row.
        """
        b = np.atleast_2d(obs).shape[0]
        dm = (np.ones((b, self.n_devices), dtype=bool) if device_mask is None
              else device_mask)
        shares = self.shares(obs, dm, noise=self.config.explore_noise)
        choices = np.array([self.default_discrete(
            None if discrete_masks is None else [None if m is None else m[i]
                                                 for m in discrete_masks])
            for i in range(b)])
        self._explored = (obs, dm, shares)
        return shares, choices

    def record(self, reward: np.ndarray) -> None:
        """The rewards ``(B,)`` of the last :meth:`explore`, stored as one-step
        transitions (``done = 1``) in the replay buffer."""
        if self._explored is None:
            raise RuntimeError("record() needs the actions of an explore() call")
        obs, dm, shares = self._explored
        r = np.asarray(reward, dtype=np.float64).reshape(-1)
        self.observe(obs, dm, shares, r, obs, dm, np.ones_like(r))
        self._recorded += len(r)
        self._explored = None

    def learn(self, replay_ratio: float = 1.0) -> dict[str, float]:
        """:meth:`update` with ``replay_ratio`` gradient steps per transition
        recorded since the last call (at least one step).

        Returns the statistics of :meth:`update`.
        """
        steps = max(1, int(self._recorded * replay_ratio))
        self._recorded = 0
        return self.update(steps)

    def anneal(self, frac: float, lr: float, lr_final: float,
               ent_coef: float) -> None:
        """Nothing: TD3 keeps the step sizes of its :class:`TD3Config` and has
        no entropy bonus (the signature is :class:`lib.learners.TrainableLearner`'s)."""

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What training needs to continue exactly: arrays (weights
        ``param/<name>``, targets ``target/<name>``, both Adam optimisers'
        moments, the filled part of the replay buffer ``buffer/<field>``; live
        arrays, not copies) and JSON-able metadata (generator state, Adam
        steps, critic steps, buffer position)."""
        arrays = {**{f"param/{k}": v for k, v in self.actor_params.items()},
                  **{f"param/{k}": v for k, v in self.critic_params.items()},
                  **{f"target/{k}": v for k, v in self.target_actor.items()},
                  **{f"target/{k}": v for k, v in self.target_critic.items()},
                  **adam_arrays("actor_opt", self.actor_opt),
                  **adam_arrays("critic_opt", self.critic_opt)}
        buf = self.buffer
        for k in buf.FIELDS:
            arrays[f"buffer/{k}"] = getattr(buf, k)[:buf.size]
        meta = {"rng": self.rng.bit_generator.state,
                "actor_t": self.actor_opt.t, "critic_t": self.critic_opt.t,
                "critic_steps": self.critic_steps, "buffer_size": buf.size,
                "buffer_next": buf._next}
        return arrays, meta

    def load_state(self, arrays: Mapping[str, np.ndarray],
                   meta: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state` (arrays copied in place)."""
        self.rng.bit_generator.state = meta["rng"]
        for group in (self.actor_params, self.critic_params):
            for k, v in group.items():
                v[...] = arrays[f"param/{k}"]
        for group in (self.target_actor, self.target_critic):
            for k, v in group.items():
                v[...] = arrays[f"target/{k}"]
        restore_adam("actor_opt", self.actor_opt, arrays, meta["actor_t"])
        restore_adam("critic_opt", self.critic_opt, arrays, meta["critic_t"])
        self.critic_steps = int(meta["critic_steps"])
        buf = self.buffer
        n = int(meta["buffer_size"])
        for k in buf.FIELDS:
            getattr(buf, k)[:n] = arrays[f"buffer/{k}"]
        buf.size, buf._next = n, int(meta["buffer_next"])
