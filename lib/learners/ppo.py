"""PPO with a Dirichlet allocation head and masked categorical heads.

The policy (Schulman et al., 2017, clipped objective; GAE from Schulman et al.,
2016) maps a normalised observation to

- shares over ``n_devices`` from a :class:`MaskedDirichlet` over the usable
  devices (unusable ones get share exactly 0);
- one choice per discrete head from a :class:`MaskedCategorical` (head sizes
  given at construction, each with its own mask, e.g. mode or comm path);
- a value estimate.

Architecture: the actor is one :class:`~lib.learners.nn.MLP`
``obs -> hidden... -> [z (n_devices) | logits_1 | ... | logits_H]``: the hidden
layers are a shared trunk and the heads are slices of its last affine layer;
concentrations are ``alpha = softplus(z) + alpha_min``. The critic is a separate
MLP ``obs -> hidden... -> 1`` (no value gradient reaches the actor). Every
gradient is hand-written (see :meth:`PPOAgent.loss_and_grads`).

A rollout batch for :meth:`PPOAgent.update` is a dict of arrays (``B`` rows,
``n = n_devices``, ``H = len(discrete_sizes)``)::

    obs            (B, obs_dim) float   raw observations (normalised inside)
    device_mask    (B, n)       bool    usable devices when the action was taken
    discrete_masks list of H arrays (B, size_h) bool, the masks at acting time
    shares         (B, n)       float   the allocation taken
    choices        (B, H)       int     the discrete choices taken
    logp           (B,)         float   log-probability when acting
    advantages     (B,)         float   e.g. from :func:`gae`
    returns        (B,)         float   value targets (advantages + values)

Observation normalisation: :meth:`PPOAgent.act` normalises with the current
running statistics without changing them; :meth:`PPOAgent.update` normalises the
batch with those same statistics (so the recomputed log-probabilities match the
ones recorded) and merges the batch into the statistics at the end.

:class:`PPOAgent` is a :class:`lib.learners.TrainableLearner`: :meth:`~PPOAgent.explore`
and :meth:`~PPOAgent.record` build such a batch from one-step episodes (advantage
``reward - V(s)``) and :meth:`~PPOAgent.learn` hands it to :meth:`~PPOAgent.update`.

Why one module: it is one class. Acting, the PPO and imitation losses, the
updates and the training interface all read the same private layout of the
actor's output (``_slices``, ``_prep``, ``_dists``), and the policy file stores
exactly that layout's sizes and weights; spread over several files, the layout
would have no single place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.learners.distributions import (
    MaskedCategorical,
    MaskedDirichlet,
    concentration_backward,
    concentration_forward,
)
from lib.learners.nn import (
    MLP,
    Adam,
    AdamConfig,
    Params,
    assign_params,
    inv_softplus,
    prefixed,
)
from lib.learners.normalize import RunningMeanStd

#: Format tag and version written into every saved policy.
POLICY_FORMAT = "lib.agent.ppo"
POLICY_VERSION = 1


class PolicyFormatError(ValueError):
    """A saved policy cannot be used: wrong format, version, spec or arrays."""


@dataclass
class PPOConfig:
    """Hyperparameters of :class:`PPOAgent` (CleanRL-style: one field, one line)."""

    lr: float = 3e-4
    """Adam step size (1e-4 to 1e-3)."""
    clip: float = 0.2
    """Clipping range epsilon of the probability ratio (0.1 to 0.3)."""
    gamma: float = 0.99
    """Discount factor per decision (irrelevant for one-step episodes)."""
    lam: float = 0.95
    """GAE lambda (0.9 to 1)."""
    epochs: int = 10
    """Passes over each rollout batch per update (3 to 10)."""
    minibatch_size: int = 64
    """Rows per gradient step (32 to 512)."""
    ent_coef: float = 1e-3
    """Weight of the entropy bonus (Dirichlet + categoricals; 0 to 0.01)."""
    vf_coef: float = 0.5
    """Weight of the value loss ``0.5 * (V - R)^2``."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this (0 disables)."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of actor trunk and critic."""
    activation: str = "tanh"
    """Hidden activation, ``"tanh"`` or ``"relu"``."""
    alpha_min: float = 1.0
    """Floor added to the Dirichlet concentrations (>= 1 keeps it unimodal)."""
    alpha_init: float = 4.0
    """Initial concentration of every device (larger = samples nearer equal split)."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    normalize_obs: bool = True
    """Keep running observation statistics and normalise inputs with them."""
    target_kl: float = 0.0
    """Stop an update's epochs early once approx. KL exceeds this (0 disables)."""
    seed: int = 0
    """Seed of the weight initialisation and minibatch shuffling."""

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (tuples become lists)."""
        out = asdict(self)
        out["hidden"] = list(self.hidden)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PPOConfig:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        data["hidden"] = tuple(data["hidden"])
        return cls(**data)


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray,
        last_value: np.ndarray | float, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns.

    Args:
        rewards: ``(T,)`` or ``(T, n_envs)``; reward after step ``t``.
        values: same shape; ``V(s_t)``.
        dones: same shape; 1 if the episode ended at step ``t`` (no
            bootstrapping from ``t + 1``).
        last_value: ``V(s_T)`` of the state after the last step (scalar or
            ``(n_envs,)``).
        gamma: discount factor.
        lam: GAE lambda (0: one-step TD, 1: Monte Carlo minus baseline).

    Returns:
        ``(advantages, returns)``, float64, shaped like ``rewards``;
        ``returns = advantages + values``.
    """
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    adv = np.zeros_like(r)
    next_v = np.asarray(last_value, dtype=np.float64)
    running = np.zeros_like(r[0]) if r.ndim > 1 else 0.0
    for t in reversed(range(r.shape[0])):
        live = 1.0 - d[t]
        delta = r[t] + gamma * live * next_v - v[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
        next_v = v[t]
    return adv, adv + v


def interior_shares(shares: np.ndarray, device_mask: np.ndarray | None = None,
                    eps: float = 1e-3) -> np.ndarray:
    """Shares moved strictly inside the simplex of the usable devices.

    ``(1 - eps) * shares + eps * uniform`` over the usable devices of each
    row, 0 elsewhere: a Dirichlet has no density where a usable share is 0,
    so an expert's shares (which leave devices out) must be mixed before
    :meth:`PPOAgent.imitation_loss_and_grads` scores them.

    Args:
        shares: ``(B, n)`` non-negative, rows summing to 1 over usable devices.
        device_mask: ``(B, n)`` bool (``None`` = all usable).
        eps: weight of the uniform part (1e-4 to 1e-2). A left-out device's
            label is ``eps / K``: the smaller, the harder the fitted Dirichlet
            pushes its concentration (and mean share) toward 0.

    Returns:
        ``(B, n)`` float64, rows summing to 1, positive exactly where usable.
    """
    s = np.atleast_2d(np.asarray(shares, dtype=np.float64))
    usable = np.ones(s.shape, dtype=bool) if device_mask is None \
        else np.broadcast_to(np.asarray(device_mask, dtype=bool), s.shape)
    s = np.where(usable, np.maximum(s, 0.0), 0.0)
    s = s / s.sum(axis=1, keepdims=True)
    uniform = usable / usable.sum(axis=1, keepdims=True)
    return (1.0 - eps) * s + eps * uniform


def adam_arrays(prefix: str, opt: Adam) -> dict[str, np.ndarray]:
    """An optimiser's moments as checkpoint arrays ``<prefix>.m/<param>`` and
    ``<prefix>.v/<param>`` (the live arrays, not copies)."""
    return {**{f"{prefix}.m/{k}": v for k, v in opt.m.items()},
            **{f"{prefix}.v/{k}": v for k, v in opt.v.items()}}


def restore_adam(prefix: str, opt: Adam, arrays: Mapping[str, np.ndarray],
                 t: int) -> None:
    """Inverse of :func:`adam_arrays`: copy the moments into ``opt`` in place
    and set its step count to ``t``."""
    for k in opt.m:
        opt.m[k][...] = arrays[f"{prefix}.m/{k}"]
        opt.v[k][...] = arrays[f"{prefix}.v/{k}"]
    opt.t = int(t)


@dataclass
class ActOutput:
    """What :meth:`PPOAgent.act_batch` returns (``B`` rows)."""

    shares: np.ndarray
    """``(B, n_devices)`` float64, rows sum to 1, 0 on unusable devices."""
    choices: np.ndarray
    """``(B, H)`` int64 discrete choices."""
    logp: np.ndarray
    """``(B,)`` joint log-probability of shares and choices."""
    value: np.ndarray
    """``(B,)`` value estimates."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Distribution parameters for inspection (``alpha``, ``probs``)."""


class OneStepRollouts:
    """What a PPO learner does between acting and updating, for one-step
    episodes: keep each explored batch with its rewards, and follow a run's
    linear schedules. Used by :class:`PPOAgent` and the set learner
    (:class:`lib.learners.setppo.SetPPOAgent`), which differ in how they act
    and learn, not in this."""

    def record(self, reward: np.ndarray) -> None:
        """The rewards ``(B,)`` of the last :meth:`explore`; each ends its
        one-step episode."""
        if self._explored is None:
            raise RuntimeError("record() needs the actions of an explore() call")
        r = np.asarray(reward, dtype=np.float64).reshape(-1)
        self._rollout.append((*self._explored, r))
        self._explored = None

    def anneal(self, frac: float, lr: float, lr_final: float,
               ent_coef: float) -> None:
        """Point ``frac`` (0 to 1) of a run's linear schedules: the Adam step
        size goes from ``lr`` to ``lr_final``, the entropy bonus from
        ``ent_coef`` to 0."""
        self.optimizer.config.lr = lr + (lr_final - lr) * frac
        self.config.ent_coef = ent_coef * (1.0 - frac)


class PPOAgent(OneStepRollouts):
    """Actor-critic trained with clipped PPO.

    Args:
        obs_dim: observation length.
        n_devices: device slots of the allocation head.
        discrete_sizes: number of options of each discrete head (may be empty).
        config: hyperparameters.

    Attributes:
        params: every trainable array, ``"actor.W0"``, ..., ``"critic.b2"``.
        obs_rms: the running observation statistics.
    """

    def __init__(self, obs_dim: int, n_devices: int, discrete_sizes: Sequence[int],
                 config: PPOConfig | None = None) -> None:
        self.config = c = config or PPOConfig()
        self.obs_dim = int(obs_dim)
        self.n_devices = int(n_devices)
        self.discrete_sizes = [int(s) for s in discrete_sizes]
        if self.n_devices < 1 or any(s < 1 for s in self.discrete_sizes):
            raise ValueError(f"need n_devices >= 1 and head sizes >= 1, got "
                             f"{self.n_devices} and {self.discrete_sizes}")
        self.rng = np.random.default_rng(c.seed)
        out_dim = self.n_devices + sum(self.discrete_sizes)
        self.actor = MLP([self.obs_dim, *c.hidden, out_dim], self.rng,
                         activation=c.activation, out_gain=0.01)
        self.critic = MLP([self.obs_dim, *c.hidden, 1], self.rng,
                          activation=c.activation, out_gain=1.0)
        last = f"b{self.actor.n_layers - 1}"
        if c.alpha_init <= c.alpha_min:
            raise ValueError(f"alpha_init {c.alpha_init} must exceed alpha_min "
                             f"{c.alpha_min}")
        self.actor.params[last][: self.n_devices] = inv_softplus(
            c.alpha_init - c.alpha_min)
        self.params: Params = {**prefixed(self.actor.params, "actor"),
                               **prefixed(self.critic.params, "critic")}
        self.optimizer = Adam(self.params, AdamConfig(
            lr=c.lr, eps=c.adam_eps, max_grad_norm=c.max_grad_norm))
        self.obs_rms = RunningMeanStd(self.obs_dim)
        #: The header of the file this agent was loaded from (else ``None``).
        self.loaded_header: dict[str, Any] | None = None
        offsets = np.cumsum([0, self.n_devices, *self.discrete_sizes])
        self._slices = [slice(int(a), int(b))
                        for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        # The last explore() awaiting its rewards, and the explored steps with
        # their rewards awaiting learn(): (obs, device_mask, discrete_masks,
        # ActOutput[, reward]).
        self._explored: tuple | None = None
        self._rollout: list[tuple] = []

    # ------------------------------------------------------------------
    # Acting

    def _unpack(self, mb: dict[str, Any], normalized: bool):
        """A minibatch's arrays: normalised observations, device and discrete
        masks, the taken shares ``(b, n)`` and discrete choices ``(b, heads)``."""
        x, dm, masks = self._prep(mb["obs"], mb["device_mask"],
                                  mb.get("discrete_masks"))
        xn = x if normalized else self._normalize(x)
        shares = np.asarray(mb["shares"], dtype=np.float64)
        choices = np.asarray(mb["choices"], dtype=np.int64).reshape(x.shape[0], -1)
        return xn, dm, masks, shares, choices

    def _prep(self, obs: np.ndarray, device_mask: np.ndarray | None,
              discrete_masks: Sequence[np.ndarray] | None
              ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        x = np.atleast_2d(np.asarray(obs, dtype=np.float64))
        if x.shape[1] != self.obs_dim:
            raise ValueError(f"observation has {x.shape[1]} features, the policy "
                             f"expects {self.obs_dim}")
        b = x.shape[0]
        dm = (np.ones((b, self.n_devices), dtype=bool) if device_mask is None
              else np.broadcast_to(np.asarray(device_mask, dtype=bool),
                                   (b, self.n_devices)))
        if discrete_masks is None:
            discrete_masks = [None] * len(self.discrete_sizes)
        if len(discrete_masks) != len(self.discrete_sizes):
            raise ValueError(f"{len(discrete_masks)} discrete masks for "
                             f"{len(self.discrete_sizes)} discrete heads")
        masks = [np.ones((b, s), dtype=bool) if m is None
                 else np.broadcast_to(np.asarray(m, dtype=bool), (b, s))
                 for m, s in zip(discrete_masks, self.discrete_sizes, strict=True)]
        return x, dm, masks

    def _normalize(self, x: np.ndarray) -> np.ndarray:
        return self.obs_rms.normalize(x) if self.config.normalize_obs else x

    def _dists(self, out: np.ndarray, device_mask: np.ndarray,
               masks: Sequence[np.ndarray]
               ) -> tuple[MaskedDirichlet, list[MaskedCategorical]]:
        z = out[:, self._slices[0]]
        dirichlet = MaskedDirichlet(concentration_forward(z, self.config.alpha_min),
                                    device_mask)
        cats = [MaskedCategorical(out[:, s], m)
                for s, m in zip(self._slices[1:], masks, strict=True)]
        return dirichlet, cats

    def act_batch(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                  discrete_masks: Sequence[np.ndarray] | None = None,
                  rng: np.random.Generator | None = None,
                  deterministic: bool = False) -> ActOutput:
        """Actions for a batch of raw observations ``(B, obs_dim)``.

        Masks broadcast to ``(B, n_devices)`` and ``(B, size_h)`` (``None`` =
        all allowed). ``deterministic`` takes the Dirichlet mean and the most
        probable choices; otherwise samples with ``rng`` (default: the agent's).
        """
        x, dm, masks = self._prep(obs, device_mask, discrete_masks)
        xn = self._normalize(x)
        dirichlet, cats = self._dists(self.actor(xn), dm, masks)
        rng = self.rng if rng is None else rng
        if deterministic:
            shares = dirichlet.mean
            choices = [c.mode() for c in cats]
        else:
            shares = dirichlet.sample(rng)
            choices = [c.sample(rng) for c in cats]
        logp = dirichlet.log_prob(shares)
        for c, a in zip(cats, choices, strict=True):
            logp = logp + c.log_prob(a)
        ch = (np.stack(choices, axis=1) if choices
              else np.zeros((x.shape[0], 0), dtype=np.int64))
        return ActOutput(shares=shares, choices=ch, logp=logp,
                         value=self.critic(xn)[:, 0],
                         extras={"alpha": dirichlet.alpha,
                                 "probs": [c.probs for c in cats]})

    def act(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
            discrete_masks: Sequence[np.ndarray] | None = None,
            rng: np.random.Generator | None = None, deterministic: bool = False
            ) -> tuple[np.ndarray, list[int], float, float]:
        """One decision for one raw observation ``(obs_dim,)``.

        Returns:
            ``(shares (n_devices,), choices list[int], logp, value)``.
        """
        out = self.act_batch(obs, device_mask, discrete_masks, rng, deterministic)
        return (out.shares[0], [int(a) for a in out.choices[0]],
                float(out.logp[0]), float(out.value[0]))

    def propose(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, list[int]]:
        """The common learner interface: deterministic ``(shares, choices)``."""
        shares, choices, _, _ = self.act(obs, device_mask, discrete_masks,
                                         deterministic=True)
        return shares, choices

    # ------------------------------------------------------------------
    # Loss

    def loss_and_grads(self, mb: dict[str, Any], normalized: bool = False
                       ) -> tuple[float, Params, dict[str, float]]:
        """Clipped PPO loss of a minibatch and its gradient w.r.t. :attr:`params`.

        ``loss = -mean(min(r A, clip(r, 1-eps, 1+eps) A))
        + vf_coef * 0.5 * mean((V - R)^2) - ent_coef * mean(H)`` with
        ``r = exp(logp - logp_old)`` and ``H`` the Dirichlet entropy plus the
        categorical entropies. At ties the unclipped branch is taken, so the
        gradient is exact away from the kinks ``r = 1 +- eps``.

        Args:
            mb: minibatch dict (see the module docstring).
            normalized: ``mb["obs"]`` is already normalised.

        Returns:
            ``(loss, grads, stats)``; grads keyed like :attr:`params`.
        """
        c = self.config
        xn, dm, masks, shares, choices = self._unpack(mb, normalized)
        b = xn.shape[0]
        adv = np.asarray(mb["advantages"], dtype=np.float64)
        if c.normalize_advantages and b > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)

        out, cache_a = self.actor.forward(xn)
        dirichlet, cats = self._dists(out, dm, masks)
        logp = dirichlet.log_prob(shares)
        ent = dirichlet.entropy()
        for h, cat in enumerate(cats):
            logp = logp + cat.log_prob(choices[:, h])
            ent = ent + cat.entropy()
        ratio = np.exp(logp - np.asarray(mb["logp"], dtype=np.float64))
        s1 = ratio * adv
        s2 = np.clip(ratio, 1.0 - c.clip, 1.0 + c.clip) * adv
        unclipped = s1 <= s2
        pg_loss = -np.mean(np.where(unclipped, s1, s2))
        ent_mean = float(np.mean(ent))

        dlogp = -np.where(unclipped, s1, 0.0) / b
        dent = np.full(b, -c.ent_coef / b)
        dout = np.zeros_like(out)
        z = out[:, self._slices[0]]
        dalpha = (dirichlet.log_prob_backward_alpha(shares, dlogp)
                  + dirichlet.entropy_backward_alpha(dent))
        dout[:, self._slices[0]] = concentration_backward(dalpha, z)
        for h, (s, cat) in enumerate(zip(self._slices[1:], cats, strict=True)):
            dout[:, s] = (cat.log_prob_backward(choices[:, h], dlogp)
                          + cat.entropy_backward(dent))
        _, g_actor = self.actor.backward(dout, cache_a)

        v, cache_c = self.critic.forward(xn)
        err = v[:, 0] - np.asarray(mb["returns"], dtype=np.float64)
        v_loss = 0.5 * float(np.mean(err**2))
        _, g_critic = self.critic.backward((c.vf_coef * err / b)[:, None], cache_c)

        loss = float(pg_loss + c.vf_coef * v_loss - c.ent_coef * ent_mean)
        log_ratio = logp - np.asarray(mb["logp"], dtype=np.float64)
        stats = {
            "loss": loss, "policy_loss": float(pg_loss), "value_loss": v_loss,
            "entropy": ent_mean,
            "approx_kl": float(np.mean(np.expm1(log_ratio) - log_ratio)),
            "clip_frac": float(np.mean(np.abs(ratio - 1.0) > c.clip)),
        }
        grads = {**prefixed(g_actor, "actor"), **prefixed(g_critic, "critic")}
        return loss, grads, stats

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """Several epochs of minibatch Adam steps on one rollout batch.

        Returns:
            Means over the gradient steps of ``loss``, ``policy_loss``,
            ``value_loss``, ``entropy``, ``approx_kl``, ``clip_frac``,
            ``grad_norm``; plus ``steps`` and ``explained_variance``.
        """
        c = self.config
        x, dm, masks = self._prep(batch["obs"], batch["device_mask"],
                                  batch.get("discrete_masks"))
        b = x.shape[0]
        data = {
            "obs": self._normalize(x), "device_mask": dm, "discrete_masks": masks,
            "shares": np.asarray(batch["shares"], dtype=np.float64),
            "choices": np.asarray(batch["choices"], dtype=np.int64).reshape(b, -1),
            "logp": np.asarray(batch["logp"], dtype=np.float64),
            "advantages": np.asarray(batch["advantages"], dtype=np.float64),
            "returns": np.asarray(batch["returns"], dtype=np.float64),
        }
        values = self.critic(data["obs"])[:, 0]
        history: list[dict[str, float]] = []
        mbs = max(1, min(c.minibatch_size, b))
        for _ in range(c.epochs):
            order = self.rng.permutation(b)
            epoch_kl = []
            for start in range(0, b, mbs):
                idx = order[start:start + mbs]
                mb = {k: ([m[idx] for m in v] if k == "discrete_masks" else v[idx])
                      for k, v in data.items()}
                _, grads, stats = self.loss_and_grads(mb, normalized=True)
                stats.update(self.optimizer.step(grads))
                history.append(stats)
                epoch_kl.append(stats["approx_kl"])
            if c.target_kl > 0 and np.mean(epoch_kl) > c.target_kl:
                break
        out = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
        out["steps"] = float(len(history))
        var = float(np.var(data["returns"]))
        out["explained_variance"] = (float(1.0 - np.var(data["returns"] - values)
                                           / var) if var > 0 else float("nan"))
        if c.normalize_obs:
            self.obs_rms.update(x)
        return out

    # ------------------------------------------------------------------
    # Training interface (lib.learners.TrainableLearner)

    def explore(self, obs: np.ndarray, device_mask: np.ndarray | None = None,
                discrete_masks: Sequence[np.ndarray | None] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions for a batch of raw observations ``(B, obs_dim)``,
        kept (with their log-probabilities and values) for :meth:`record`.

        Masks as for :meth:`act_batch` (``None`` = all allowed).

        Returns:
            ``(shares (B, n_devices), choices (B, H) int64)``.
        """
        out = self.act_batch(obs, device_mask, discrete_masks)
        dm = (np.ones((out.shares.shape[0], self.n_devices), dtype=bool)
              if device_mask is None else device_mask)
        self._explored = (obs, dm, discrete_masks, out)
        return out.shares, out.choices

    def learn(self, replay_ratio: float = 1.0) -> dict[str, float]:
        """:meth:`update` on every step recorded since the last call, with
        advantages ``reward - V(s)`` and returns ``reward``.

        ``replay_ratio`` is ignored: PPO reuses a batch through its own
        ``epochs``. Returns the statistics of :meth:`update`.
        """
        steps, self._rollout = self._rollout, []
        if not steps:
            raise RuntimeError("learn() needs steps recorded by record()")
        obs, dms, masks, outs, rewards = zip(*steps, strict=True)
        if masks[0] is None:
            discrete_masks = None
        else:
            discrete_masks = [None if masks[0][h] is None
                              else np.concatenate([m[h] for m in masks])
                              for h in range(len(self.discrete_sizes))]
        reward = np.concatenate(rewards)
        value = np.concatenate([o.value for o in outs])
        return self.update({
            "obs": np.concatenate(obs), "device_mask": np.concatenate(dms),
            "discrete_masks": discrete_masks,
            "shares": np.concatenate([o.shares for o in outs]),
            "choices": np.concatenate([o.choices for o in outs]),
            "logp": np.concatenate([o.logp for o in outs]),
            "advantages": reward - value, "returns": reward})

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What training needs to continue exactly: arrays (weights
        ``param/<name>``, Adam moments; the live arrays, not copies) and
        JSON-able metadata (generator state, Adam step, observation
        statistics). Steps recorded but not yet learned are not included."""
        arrays = {f"param/{k}": v for k, v in self.params.items()}
        arrays.update(adam_arrays("adam", self.optimizer))
        meta = {"rng": self.rng.bit_generator.state, "adam_t": self.optimizer.t,
                "obs_rms": self.obs_rms.to_json()}
        return arrays, meta

    def load_state(self, arrays: Mapping[str, np.ndarray],
                   meta: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state` (weights copied in place)."""
        self.rng.bit_generator.state = meta["rng"]
        for k, v in self.params.items():
            v[...] = arrays[f"param/{k}"]
        restore_adam("adam", self.optimizer, arrays, meta["adam_t"])
        self.obs_rms = RunningMeanStd.from_json(meta["obs_rms"])

    # ------------------------------------------------------------------
    # Imitation (behaviour cloning)

    def imitation_loss_and_grads(self, mb: dict[str, Any], normalized: bool = False
                                 ) -> tuple[float, Params, dict[str, float]]:
        """Behaviour-cloning loss of a minibatch of expert actions and its
        gradient w.r.t. :attr:`params`.

        ``loss = -mean(log pi(a* | s)) + vf_coef * 0.5 * mean((V - R*)^2)``,
        the second term only where ``mb`` has ``returns`` (the expert's reward,
        a value target for the critic). Unlike :meth:`loss_and_grads` nothing
        is normalised or clipped: every row's log-likelihood counts with weight
        ``1 / B``, and there is no entropy bonus.

        Args:
            mb: ``obs``, ``device_mask``, ``discrete_masks``, ``shares`` and
                ``choices`` as in the module docstring (the expert's action;
                shares strictly inside the simplex of the usable devices, see
                :func:`interior_shares`), optionally ``returns`` ``(B,)``.
            normalized: ``mb["obs"]`` is already normalised.

        Returns:
            ``(loss, grads, stats)``; grads keyed like :attr:`params` (zero for
            the critic without ``returns``); stats ``loss``, ``nll``,
            ``value_loss``, ``share_error`` (mean absolute difference between
            the Dirichlet mean and the expert's shares, summed over devices)
            and ``choice_accuracy`` (fraction of discrete heads whose most
            probable option is the expert's).
        """
        c = self.config
        xn, dm, masks, shares, choices = self._unpack(mb, normalized)
        b = xn.shape[0]

        out, cache_a = self.actor.forward(xn)
        dirichlet, cats = self._dists(out, dm, masks)
        logp = dirichlet.log_prob(shares)
        hits = []
        for h, cat in enumerate(cats):
            logp = logp + cat.log_prob(choices[:, h])
            hits.append(cat.mode() == choices[:, h])
        nll = -float(np.mean(logp))

        dlogp = np.full(b, -1.0 / b)
        dout = np.zeros_like(out)
        z = out[:, self._slices[0]]
        dalpha = dirichlet.log_prob_backward_alpha(shares, dlogp)
        dout[:, self._slices[0]] = concentration_backward(dalpha, z)
        for h, (s, cat) in enumerate(zip(self._slices[1:], cats, strict=True)):
            dout[:, s] = cat.log_prob_backward(choices[:, h], dlogp)
        _, g_actor = self.actor.backward(dout, cache_a)

        v_loss = 0.0
        if mb.get("returns") is not None:
            v, cache_c = self.critic.forward(xn)
            err = v[:, 0] - np.asarray(mb["returns"], dtype=np.float64)
            v_loss = 0.5 * float(np.mean(err**2))
            _, g_critic = self.critic.backward((c.vf_coef * err / b)[:, None],
                                               cache_c)
        else:
            g_critic = {k: np.zeros_like(v) for k, v in self.critic.params.items()}

        loss = nll + c.vf_coef * v_loss
        stats = {
            "loss": loss, "nll": nll, "value_loss": v_loss,
            "share_error": float(np.mean(np.abs(dirichlet.mean - shares).sum(
                axis=1))),
            "choice_accuracy": float(np.mean(hits)) if hits else 1.0,
        }
        grads = {**prefixed(g_actor, "actor"), **prefixed(g_critic, "critic")}
        return loss, grads, stats

    def imitation_update(self, batch: dict[str, Any], steps: int,
                         minibatch_size: int | None = None) -> dict[str, float]:
        """``steps`` Adam steps of :meth:`imitation_loss_and_grads` on
        minibatches drawn from ``batch`` (reshuffled after every pass).

        The batch is normalised with the current observation statistics and
        they are left unchanged (merge the expert observations into
        :attr:`obs_rms` first if they should shape them).

        Args:
            batch: as for :meth:`imitation_loss_and_grads`, ``B`` rows.
            steps: gradient steps (0 returns empty statistics).
            minibatch_size: rows per step (default ``config.minibatch_size``).

        Returns:
            Means over the steps of the loss statistics and ``grad_norm``, plus
            ``steps``.
        """
        x, dm, masks = self._prep(batch["obs"], batch["device_mask"],
                                  batch.get("discrete_masks"))
        b = x.shape[0]
        data: dict[str, Any] = {
            "obs": self._normalize(x), "device_mask": dm, "discrete_masks": masks,
            "shares": np.asarray(batch["shares"], dtype=np.float64),
            "choices": np.asarray(batch["choices"], dtype=np.int64).reshape(b, -1),
        }
        if batch.get("returns") is not None:
            data["returns"] = np.asarray(batch["returns"], dtype=np.float64)
        mbs = max(1, min(minibatch_size or self.config.minibatch_size, b))
        history: list[dict[str, float]] = []
        order, start = self.rng.permutation(b), 0
        for _ in range(int(steps)):
            if start + mbs > b:
                order, start = self.rng.permutation(b), 0
            idx = order[start:start + mbs]
            start += mbs
            mb = {k: ([m[idx] for m in v] if k == "discrete_masks" else v[idx])
                  for k, v in data.items()}
            _, grads, stats = self.imitation_loss_and_grads(mb, normalized=True)
            stats.update(self.optimizer.step(grads))
            history.append(stats)
        if not history:
            return {"steps": 0.0}
        out = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
        out["steps"] = float(len(history))
        return out

    # ------------------------------------------------------------------
    # Files

    def header(self, user: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON header written by :meth:`save` (user fields merged in)."""
        head = dict(user or {})
        head.update({
            "format": POLICY_FORMAT, "version": POLICY_VERSION,
            "obs_dim": self.obs_dim, "n_devices": self.n_devices,
            "discrete_sizes": self.discrete_sizes,
            "config": self.config.to_json(), "obs_norm": self.obs_rms.to_json(),
        })
        return head

    def save(self, path: str | Path, header: dict[str, Any] | None = None) -> Path:
        """Write weights and a JSON header to an ``.npz`` file.

        Args:
            path: file to write (written exactly there, suffix included).
            header: JSON-able fields to store, typically ``{"spec": <the
                machine feature spec, e.g. contract.STATE_FIELDS names and
                STATE_VERSION>}``; :meth:`load` compares ``header["spec"]``.

        The header also records format, version, sizes, config and the
        observation normalisation statistics.
        """
        path = Path(path)
        text = json.dumps(self.header(header), sort_keys=True)
        arrays = {f"param/{k}": v for k, v in self.params.items()}
        with path.open("wb") as fh:
            np.savez(fh, header=np.array(text), **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path, expected_spec: Any = None) -> PPOAgent:
        """Read a policy written by :meth:`save`.

        Args:
            path: the ``.npz`` file.
            expected_spec: if not ``None``, must equal the saved
                ``header["spec"]`` (after a JSON round trip).

        Raises:
            PolicyFormatError: not a policy file, another format or version,
                a spec that differs (the differing keys are named) or arrays
                that do not fit the recorded sizes.
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as npz:
                head = json.loads(str(npz["header"]))
                arrays = {k[len("param/"):]: npz[k] for k in npz.files
                          if k.startswith("param/")}
        except (OSError, ValueError, KeyError) as exc:
            raise PolicyFormatError(f"{path}: not a readable policy file "
                                    f"({exc})") from exc
        if head.get("format") != POLICY_FORMAT:
            raise PolicyFormatError(f"{path}: format {head.get('format')!r}, "
                                    f"expected {POLICY_FORMAT!r}")
        if head.get("version") != POLICY_VERSION:
            raise PolicyFormatError(f"{path}: version {head.get('version')!r}, "
                                    f"this code reads version {POLICY_VERSION}")
        if expected_spec is not None:
            saved = head.get("spec")
            want = json.loads(json.dumps(expected_spec))
            if saved != want:
                raise PolicyFormatError(f"{path}: feature spec differs from the "
                                        f"expected one: {_spec_diff(saved, want)}")
        try:
            agent = cls(head["obs_dim"], head["n_devices"], head["discrete_sizes"],
                        PPOConfig.from_json(head["config"]))
            assign_params(agent.params, arrays)
            agent.obs_rms = RunningMeanStd.from_json(head["obs_norm"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyFormatError(f"{path}: header and arrays do not describe "
                                    f"a policy of this version: {exc}") from exc
        agent.loaded_header = head
        return agent


def _spec_diff(saved: Any, want: Any) -> str:
    """Short description of how two specs differ."""
    if isinstance(saved, dict) and isinstance(want, dict):
        keys = sorted(k for k in set(saved) | set(want)
                      if saved.get(k) != want.get(k))
        parts = [f"{k}: saved {_short(saved.get(k))}, expected {_short(want.get(k))}"
                 for k in keys[:5]]
        return "; ".join(parts) + ("" if len(keys) <= 5 else f"; and {len(keys) - 5}"
                                   f" more")
    return f"saved {_short(saved)}, expected {_short(want)}"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
