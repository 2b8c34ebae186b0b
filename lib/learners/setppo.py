"""PPO over a set of devices: one policy for any number of devices in any order.

:class:`SetPPOAgent` is :class:`~lib.learners.ppo.PPOAgent`'s clipped PPO with
the flat MLP replaced by a :class:`~lib.learners.setnet.SetNet`: each device is
encoded with shared weights, so the policy takes sets of 1 to any number of
devices and permuting them permutes its shares and changes nothing else.

- shares: per device the network gives the log of its time for the whole job
  and of its fixed cost (one pair per option of the share head, the mode);
  :func:`~lib.learners.setnet.waterfill_forward` turns them into the shares
  ``s`` that equalise the finish times, leaving out devices whose fixed cost
  alone would come later (the structure of the optimum of Eq. (1)). The
  deterministic action is ``s``; exploration samples a
  :class:`~lib.learners.distributions.MaskedDirichlet` over the usable
  devices with concentrations ``kappa s + alpha_floor`` (``kappa`` a
  set-level output);
- one :class:`~lib.learners.distributions.MaskedCategorical` per discrete head
  (set-level outputs);
- a value from a second :class:`SetNet` (no gradient reaches the actor).

Observations are flat rows ``(B, context + N item)``: the set's features then
``N`` devices' features, ``N`` read from the device mask ``(B, N)`` (pad rows
of absent devices, masked out). A rollout batch for :meth:`SetPPOAgent.update`
is :class:`~lib.learners.ppo.PPOAgent`'s (``obs``, ``device_mask``,
``discrete_masks``, ``shares``, ``choices``, ``logp``, ``advantages``,
``returns``). Features are expected scaled to a few units (no running
normalisation: a decision depends on its own observation only).

Imitation (:meth:`SetPPOAgent.imitation_update`) fits the expert's shares by
cross-entropy (``-sum t log(s + eps)``) plus a linear penalty on any share
given to a device the expert leaves out, and each head's choice by
cross-entropy (weighted per row and head, e.g. 0 for the chunk count where the
expert does not pipeline).

Why one module: it is one class whose acting, losses, updates and files read
one layout of the actor's outputs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lib.learners.distributions import MaskedCategorical, MaskedDirichlet
from lib.learners.nn import (
    Adam,
    AdamConfig,
    Params,
    assign_params,
    inv_softplus,
    prefixed,
    sigmoid,
    softplus,
)
from lib.learners.ppo import (
    ActOutput,
    OneStepRollouts,
    PolicyFormatError,
    _spec_diff,
    adam_arrays,
    restore_adam,
)
from lib.learners.setnet import (
    SetNet,
    SetNetSizes,
    waterfill_backward,
    waterfill_forward,
)

#: Format tag and version written into every saved set policy.
POLICY_FORMAT = "lib.agent.setppo"
POLICY_VERSION = 1


@dataclass
class SetPPOConfig:
    """Hyperparameters of :class:`SetPPOAgent` (one field, one line)."""

    lr: float = 3e-4
    """Adam step size (1e-4 to 1e-3)."""
    clip: float = 0.2
    """Clipping range epsilon of the probability ratio (0.1 to 0.3)."""
    epochs: int = 4
    """Passes over each rollout batch per update (3 to 10)."""
    minibatch_size: int = 256
    """Rows per gradient step (64 to 1024)."""
    ent_coef: float = 1e-3
    """Weight of the entropy bonus (0 to 0.01)."""
    vf_coef: float = 0.5
    """Weight of the value loss ``0.5 (V - R)^2``."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this (0 disables)."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    hidden: tuple[int, int, int] = (64, 64, 64)
    """Widths of the set network: item encoder, item layer, set layer."""
    kappa_init: float = 100.0
    """Initial Dirichlet concentration in total (larger: samples nearer the
    mean shares; a share p has spread about sqrt(p / kappa))."""
    kappa_min: float = 4.0
    """Floor of the total concentration."""
    alpha_floor: float = 0.02
    """Added to every device's concentration (keeps log densities tame)."""
    share_head: int = -1
    """Index of the discrete head whose choice selects the share column (the
    mode: shares that suit split mode differ from pipelined ones); -1: one
    column for every choice."""
    share_prior: tuple[tuple[int, int, float], ...] = ()
    """Initial skip weights from the device features to the per-device
    outputs, ``(feature, output, weight)`` (feature -1: the output's bias), so
    a feature that already estimates a log time starts as it. Output ``2c``
    is option ``c``'s log whole-job time, ``2c + 1`` its log fixed cost."""
    share_eps: float = 1e-4
    """Imitation: added to the shares inside the cross-entropy's log."""
    exclude_weight: float = 10.0
    """Imitation: weight of the penalty on shares given to left-out devices."""
    makespan_weight: float = 1.0
    """Imitation: weight of the smooth maximum over the expert's devices of
    ``log(share / expert's share)``: the device given the most beyond its
    due finishes last, so it sets the time (the cross-entropy alone weighs an
    overloaded device only through the others' shortfall)."""
    makespan_sharpness: float = 20.0
    """Imitation: sharpness beta of that smooth maximum (log-sum-exp / beta)."""
    bc_coef: float = 1.0
    """Weight of the imitation loss on demonstrations (:meth:`demonstrate`)
    added to every PPO step, as DAPG does (0: plain PPO): it keeps the
    policy near what it imitated while the reward refines it."""
    value_every: int = 4
    """Imitation: the critic regresses the expert's rewards every this many
    steps (the actor fits every step; the critic's task is easier)."""
    target_kl: float = 0.0
    """Stop an update's epochs early once approx. KL exceeds this (0 disables)."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    seed: int = 0
    """Seed of the weights, the sampling and the minibatch order."""

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (tuples become lists)."""
        out = asdict(self)
        out["hidden"] = list(self.hidden)
        out["share_prior"] = [list(x) for x in self.share_prior]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SetPPOConfig:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        data["hidden"] = tuple(data["hidden"])
        data["share_prior"] = tuple(tuple(x) for x in data.get("share_prior", ()))
        return cls(**data)


class SetPPOAgent(OneStepRollouts):
    """Actor-critic over device sets trained with clipped PPO.

    Args:
        context_dim: features of the set as a whole (the task), ``C``.
        item_dim: features of one device, ``F``.
        discrete_sizes: options of each discrete head.
        config: hyperparameters.

    Attributes:
        params: every trainable array, ``"actor.W1"``... ``"critic.by"``.
        n_devices: None: any number of devices.
    """

    n_devices = None

    def __init__(self, context_dim: int, item_dim: int,
                 discrete_sizes: Sequence[int],
                 config: SetPPOConfig | None = None) -> None:
        self.config = c = config or SetPPOConfig()
        self.context_dim, self.item_dim = int(context_dim), int(item_dim)
        self.discrete_sizes = [int(s) for s in discrete_sizes]
        if any(s < 1 for s in self.discrete_sizes):
            raise ValueError(f"head sizes must be >= 1, got {self.discrete_sizes}")
        if c.kappa_init <= c.kappa_min:
            raise ValueError(f"kappa_init {c.kappa_init} must exceed kappa_min "
                             f"{c.kappa_min}")
        self.rng = np.random.default_rng(c.seed)
        heads = sum(self.discrete_sizes)
        if not -1 <= c.share_head < len(self.discrete_sizes):
            raise ValueError(f"share_head {c.share_head}: expected -1 or a head "
                             f"index below {len(self.discrete_sizes)}")
        columns = 1 if c.share_head < 0 else self.discrete_sizes[c.share_head]
        self.actor = SetNet(SetNetSizes(self.context_dim, self.item_dim,
                                        2 * columns, heads + 1, tuple(c.hidden)),
                            self.rng)
        self.actor.params["by"][heads] = inv_softplus(c.kappa_init - c.kappa_min)
        for feature, col, weight in c.share_prior:
            if feature < 0:
                self.actor.params["bz"][int(col)] = float(weight)
            else:
                self.actor.params["Ws"][int(feature), int(col)] = float(weight)
        self.critic = SetNet(SetNetSizes(self.context_dim, self.item_dim, 0, 1,
                                         tuple(c.hidden)), self.rng, set_gain=1.0)
        self.params: Params = {**prefixed(self.actor.params, "actor"),
                               **prefixed(self.critic.params, "critic")}
        self.optimizer = Adam(self.params, AdamConfig(
            lr=c.lr, eps=c.adam_eps, max_grad_norm=c.max_grad_norm))
        offsets = np.cumsum([0, *self.discrete_sizes])
        self._slices = [slice(int(a), int(b))
                        for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        self._kappa = heads
        #: The header of the file this agent was loaded from (else ``None``).
        self.loaded_header: dict[str, Any] | None = None
        self._explored: tuple | None = None
        self._rollout: list[tuple] = []
        self._demos: dict[str, Any] | None = None
        self._demo_iter: Any = iter(())

    def demonstrate(self, batch: Mapping[str, Any] | None) -> None:
        """Keep ``batch`` (an imitation batch, :meth:`imitation_update`'s
        form) as demonstrations for :attr:`SetPPOConfig.bc_coef`; None drops
        them. They are data, not state: checkpoints do not hold them."""
        self._demos = None if batch is None else {
            k: (v if k == "discrete_masks" else np.asarray(v))
            for k, v in batch.items() if v is not None and k != "returns"}
        self._demo_iter = iter(())

    def _demo_batch(self, size: int) -> dict[str, Any]:
        mb = next(self._demo_iter, None)
        if mb is None:
            self._demo_iter = self._minibatches(self._demos, size)
            mb = next(self._demo_iter)
        return mb

    # ------------------------------------------------------------------
    # Observations

    def split(self, obs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Flat rows ``(B, C + n F)`` as ``(ctx (B, C), items (B, n, F))``."""
        x = np.atleast_2d(np.asarray(obs, dtype=np.float64))
        want = self.context_dim + n * self.item_dim
        if x.shape[1] != want:
            raise ValueError(f"observation has {x.shape[1]} features; {n} devices "
                             f"need {want} ({self.context_dim} + {n} x "
                             f"{self.item_dim})")
        return x[:, :self.context_dim], x[:, self.context_dim:].reshape(
            x.shape[0], n, self.item_dim)

    def _prep(self, obs: np.ndarray, device_mask: np.ndarray,
              discrete_masks: Sequence[np.ndarray | None] | None):
        dm = np.atleast_2d(np.asarray(device_mask, dtype=bool))
        ctx, items = self.split(obs, dm.shape[1])
        b = ctx.shape[0]
        dm = np.broadcast_to(dm, (b, dm.shape[1]))
        if discrete_masks is None:
            discrete_masks = [None] * len(self.discrete_sizes)
        if len(discrete_masks) != len(self.discrete_sizes):
            raise ValueError(f"{len(discrete_masks)} discrete masks for "
                             f"{len(self.discrete_sizes)} discrete heads")
        masks = [np.ones((b, s), dtype=bool) if m is None
                 else np.broadcast_to(np.asarray(m, dtype=bool), (b, s))
                 for m, s in zip(discrete_masks, self.discrete_sizes, strict=True)]
        return ctx, items, dm, masks

    def column(self, choices: np.ndarray) -> np.ndarray:
        """``(B,)`` the share column each row's choices select."""
        h = self.config.share_head
        return np.zeros(len(choices), dtype=np.int64) if h < 0 \
            else np.asarray(choices)[:, h].astype(np.int64)

    def _shares(self, z: np.ndarray, dm: np.ndarray, column: np.ndarray
                ) -> tuple[np.ndarray, tuple]:
        """``(B, N)`` shares from each row's column pair of ``z`` (log time,
        log fixed cost) by water-filling, and the cache."""
        pick = 2 * column[:, None, None]
        a = np.take_along_axis(z, pick, axis=2)[..., 0]
        b = np.take_along_axis(z, pick + 1, axis=2)[..., 0]
        s, cache = waterfill_forward(a, b, dm)
        return s, (cache, pick, z.shape)

    def _shares_backward(self, ds: np.ndarray, cache: tuple) -> np.ndarray:
        """The gradient of :meth:`_shares` back on ``z`` (every column)."""
        wcache, pick, shape = cache
        da, db = waterfill_backward(ds, wcache)
        dz = np.zeros(shape)
        np.put_along_axis(dz, pick, da[..., None], axis=2)
        np.put_along_axis(dz, pick + 1, db[..., None], axis=2)
        return dz

    def _dists(self, z: np.ndarray, y: np.ndarray, dm: np.ndarray,
               column: np.ndarray):
        """The Dirichlet around the shares, the shares and the caches."""
        c = self.config
        s, scache = self._shares(z, dm, column)
        u = y[:, self._kappa]
        kappa = softplus(u) + c.kappa_min
        alpha = kappa[:, None] * s + c.alpha_floor
        return MaskedDirichlet(alpha, dm), s, (scache, s, u, kappa, dm)

    def _dists_backward(self, dalpha: np.ndarray, cache: tuple
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Gradients w.r.t. ``z`` and the concentration logit ``u``."""
        scache, s, u, kappa, dm = cache
        dalpha = np.where(dm, dalpha, 0.0)
        dkappa = (dalpha * s).sum(axis=1)
        dz = self._shares_backward(kappa[:, None] * dalpha, scache)
        return dz, dkappa * sigmoid(u)

    def _cats_and_choices(self, y, masks, rng, deterministic):
        cats = self._cats(y, masks)
        if deterministic:
            choices = [cat.mode() for cat in cats]
        else:
            choices = [cat.sample(rng) for cat in cats]
        ch = (np.stack(choices, axis=1) if choices
              else np.zeros((y.shape[0], 0), dtype=np.int64))
        return cats, ch

    # ------------------------------------------------------------------
    # Acting

    def act_batch(self, obs: np.ndarray, device_mask: np.ndarray,
                  discrete_masks: Sequence[np.ndarray | None] | None = None,
                  rng: np.random.Generator | None = None,
                  deterministic: bool = False) -> ActOutput:
        """Actions for a batch: ``deterministic`` takes the mean shares
        ``softmax(z)`` and the most probable choices, else samples."""
        ctx, items, dm, masks = self._prep(obs, device_mask, discrete_masks)
        z, y = self.actor(ctx, items, dm)
        rng = self.rng if rng is None else rng
        # the heads first: the share head's choice picks the share column
        cats, ch = self._cats_and_choices(y, masks, rng, deterministic)
        dirichlet, s, _ = self._dists(z, y, dm, self.column(ch))
        shares = s if deterministic else dirichlet.sample(rng)
        logp = dirichlet.log_prob(shares)
        for h, cat in enumerate(cats):
            logp = logp + cat.log_prob(ch[:, h])
        _, v = self.critic(ctx, items, dm)
        return ActOutput(shares=shares, choices=ch, logp=logp, value=v[:, 0],
                         extras={"alpha": dirichlet.alpha,
                                 "probs": [cat.probs for cat in cats]})

    def propose(self, obs: np.ndarray, device_mask: np.ndarray,
                discrete_masks: Sequence[np.ndarray | None] | None = None
                ) -> tuple[np.ndarray, list[int]]:
        """The common learner interface: deterministic ``(shares, choices)``
        for one observation."""
        out = self.act_batch(obs, device_mask, discrete_masks, deterministic=True)
        return out.shares[0], [int(a) for a in out.choices[0]]

    # ------------------------------------------------------------------
    # PPO

    def loss_and_grads(self, mb: Mapping[str, Any]
                       ) -> tuple[float, Params, dict[str, float]]:
        """Clipped PPO loss of a minibatch and its gradient w.r.t.
        :attr:`params` (the loss of :meth:`PPOAgent.loss_and_grads`; at ties
        the unclipped branch is taken)."""
        c = self.config
        ctx, items, dm, masks = self._prep(mb["obs"], mb["device_mask"],
                                           mb.get("discrete_masks"))
        b = ctx.shape[0]
        shares = np.asarray(mb["shares"], dtype=np.float64)
        choices = np.asarray(mb["choices"], dtype=np.int64).reshape(b, -1)
        adv = np.asarray(mb["advantages"], dtype=np.float64)
        if c.normalize_advantages and b > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        z, y, cache = self.actor.forward(ctx, items, dm)
        column = self.column(choices)
        dirichlet, _, ccache = self._dists(z, y, dm, column)
        cats = self._cats(y, masks)
        logp = dirichlet.log_prob(shares)
        ent = dirichlet.entropy()
        for h, cat in enumerate(cats):
            logp = logp + cat.log_prob(choices[:, h])
            ent = ent + cat.entropy()
        old = np.asarray(mb["logp"], dtype=np.float64)
        ratio = np.exp(logp - old)
        s1 = ratio * adv
        s2 = np.clip(ratio, 1.0 - c.clip, 1.0 + c.clip) * adv
        unclipped = s1 <= s2
        pg_loss = -float(np.mean(np.where(unclipped, s1, s2)))
        dlogp = -np.where(unclipped, s1, 0.0) / b
        dent = np.full(b, -c.ent_coef / b)
        dalpha = (dirichlet.log_prob_backward_alpha(shares, dlogp)
                  + dirichlet.entropy_backward_alpha(dent))
        dz, du = self._dists_backward(dalpha, ccache)
        dy = np.zeros_like(y)
        dy[:, self._kappa] = du
        for h, (s, cat) in enumerate(zip(self._slices, cats, strict=True)):
            dy[:, s] = (cat.log_prob_backward(choices[:, h], dlogp)
                        + cat.entropy_backward(dent))
        g_actor = self.actor.backward(dz, dy, cache)
        v, _, g_critic, v_loss = self._value(ctx, items, dm,
                                             mb["returns"], b)
        ent_mean = float(np.mean(ent))
        loss = pg_loss + c.vf_coef * v_loss - c.ent_coef * ent_mean
        log_ratio = logp - old
        stats = {"loss": loss, "policy_loss": pg_loss, "value_loss": v_loss,
                 "entropy": ent_mean,
                 "approx_kl": float(np.mean(np.expm1(log_ratio) - log_ratio)),
                 "clip_frac": float(np.mean(np.abs(ratio - 1.0) > c.clip))}
        return loss, {**prefixed(g_actor, "actor"),
                      **prefixed(g_critic, "critic")}, stats

    def _value(self, ctx, items, dm, returns, b):
        """Critic output, its loss ``0.5 mean (V - R)^2`` and gradients."""
        _, v, cache = self.critic.forward(ctx, items, dm)
        err = v[:, 0] - np.asarray(returns, dtype=np.float64)
        dv = (self.config.vf_coef * err / b)[:, None]
        return v[:, 0], err, self.critic.backward(None, dv, cache), \
            0.5 * float(np.mean(err**2))

    def _minibatches(self, data: Mapping[str, Any], size: int):
        """One pass over ``data`` in minibatches of about ``size`` rows of
        sets of similar size, each cut to its own widest set.

        Rows are sorted by their last usable device (random order among
        equals) and cut into runs of ``size``, taken in random order: a
        batch of mostly small machines padded to its largest one would
        spend most of its work on absent devices."""
        dm = np.asarray(data["device_mask"], dtype=bool)
        b, n = dm.shape
        width = np.where(dm.any(axis=1), n - np.argmax(dm[:, ::-1], axis=1), 1)
        order = np.lexsort((self.rng.random(b), width))
        runs = [order[i:i + size] for i in range(0, b, size)]
        for r in self.rng.permutation(len(runs)):
            idx = runs[r]
            w = int(width[idx].max())
            yield {k: self._cut(k, v, idx, w) for k, v in data.items()
                   if v is not None}

    def _cut(self, key: str, value: Any, idx: np.ndarray, width: int) -> Any:
        """Rows ``idx`` of one batch entry, device axes cut to ``width``."""
        if key == "discrete_masks":
            return [None if m is None else m[idx] for m in value]
        if key == "obs":
            return value[idx, :self.context_dim + width * self.item_dim]
        if key in ("device_mask", "shares"):
            return value[idx, :width]
        return value[idx]

    def update(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """Several epochs of minibatch Adam steps on one rollout batch.

        Returns means over the steps of the loss statistics and
        ``grad_norm``, plus ``steps`` and ``explained_variance``.
        """
        c = self.config
        data = dict(batch)
        ctx, items, dm, _ = self._prep(data["obs"], data["device_mask"], None)
        _, v = self.critic(ctx, items, dm)
        history: list[dict[str, float]] = []
        for _ in range(c.epochs):
            kls = []
            for mb in self._minibatches(data, max(1, c.minibatch_size)):
                _, grads, stats = self.loss_and_grads(mb)
                if self._demos is not None and c.bc_coef > 0:
                    _, bc, bc_stats = self.imitation_loss_and_grads(
                        self._demo_batch(max(1, c.minibatch_size)))
                    for k, g in bc.items():
                        grads[k] = grads[k] + c.bc_coef * g
                    stats["bc_loss"] = bc_stats["loss"]
                stats.update(self.optimizer.step(grads))
                history.append(stats)
                kls.append(stats["approx_kl"])
            if c.target_kl > 0 and np.mean(kls) > c.target_kl:
                break
        out = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
        out["steps"] = float(len(history))
        ret = np.asarray(data["returns"], dtype=np.float64)
        var = float(np.var(ret))
        out["explained_variance"] = float(1.0 - np.var(ret - v[:, 0]) / var) \
            if var > 0 else float("nan")
        return out

    # ------------------------------------------------------------------
    # Training interface (lib.learners.TrainableLearner)

    def explore(self, obs: np.ndarray, device_mask: np.ndarray,
                discrete_masks: Sequence[np.ndarray | None] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions for ``obs`` ``(B, C + N F)`` under the masks
        (``device_mask`` ``(B, N)``), kept for :meth:`record`."""
        out = self.act_batch(obs, device_mask, discrete_masks)
        self._explored = (np.asarray(obs, dtype=np.float64),
                          np.asarray(device_mask, dtype=bool), discrete_masks, out)
        return out.shares, out.choices

    def learn(self, replay_ratio: float = 1.0) -> dict[str, float]:
        """:meth:`update` on every step recorded since the last call
        (advantage ``reward - V(s)``; ``replay_ratio`` is ignored). Steps
        with fewer device slots are padded with absent devices."""
        steps, self._rollout = self._rollout, []
        if not steps:
            raise RuntimeError("learn() needs steps recorded by record()")
        n = max(s[1].shape[1] for s in steps)
        obs, dms, shares = [], [], []
        for x, dm, _, out, _ in steps:
            pad = n - dm.shape[1]
            obs.append(np.pad(x, ((0, 0), (0, pad * self.item_dim))))
            dms.append(np.pad(dm, ((0, 0), (0, pad))))
            shares.append(np.pad(out.shares, ((0, 0), (0, pad))))
        masks = None
        if steps[0][2] is not None:
            masks = [None if steps[0][2][h] is None else
                     np.concatenate([np.broadcast_to(
                         s[2][h], (len(s[4]), self.discrete_sizes[h]))
                         for s in steps])
                     for h in range(len(self.discrete_sizes))]
        reward = np.concatenate([s[4] for s in steps])
        value = np.concatenate([s[3].value for s in steps])
        return self.update({
            "obs": np.concatenate(obs), "device_mask": np.concatenate(dms),
            "discrete_masks": masks, "shares": np.concatenate(shares),
            "choices": np.concatenate([s[3].choices for s in steps]),
            "logp": np.concatenate([s[3].logp for s in steps]),
            "advantages": reward - value, "returns": reward})

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Weights and Adam moments (live arrays) and JSON-able metadata."""
        arrays = {f"param/{k}": v for k, v in self.params.items()}
        arrays.update(adam_arrays("adam", self.optimizer))
        return arrays, {"rng": self.rng.bit_generator.state,
                        "adam_t": self.optimizer.t,
                        "ent_coef": self.config.ent_coef}

    def load_state(self, arrays: Mapping[str, np.ndarray],
                   meta: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state` (weights copied in place)."""
        self.rng.bit_generator.state = meta["rng"]
        for k, v in self.params.items():
            v[...] = arrays[f"param/{k}"]
        restore_adam("adam", self.optimizer, arrays, meta["adam_t"])
        self.config.ent_coef = float(meta.get("ent_coef", self.config.ent_coef))

    # ------------------------------------------------------------------
    # Imitation

    def imitation_loss_and_grads(self, mb: Mapping[str, Any]
                                 ) -> tuple[float, Params, dict[str, float]]:
        """Behaviour-cloning loss of a minibatch of expert actions and its
        gradient w.r.t. :attr:`params`.

        ``loss = mean_b [-sum_i t_i log(p_i + eps) + w_x sum_{i: t_i = 0} p_i
        - sum_h w_bh log pi_h(a_bh)] + vf_coef 0.5 mean (V - R)^2``: ``t``
        the expert's shares (zeros allowed), ``p`` the policy's (water-filled,
        in the column of the expert's choice of the share head), ``eps`` =
        ``share_eps``, ``w_x`` = ``exclude_weight``, ``w_bh`` the rows'
        ``choice_weights`` (default 1); the value term only with ``returns``.

        Returns:
            ``(loss, grads, stats)``; stats ``loss``, ``share_ce``,
            ``choice_nll``, ``value_loss``, ``share_error`` (mean over rows of
            ``sum_i |p_i - t_i|``), ``excluded_ok`` (fraction of left-out
            devices the policy leaves out too) and ``choice_accuracy``
            (weighted fraction of heads whose most probable option is the
            expert's).
        """
        c = self.config
        ctx, items, dm, masks = self._prep(mb["obs"], mb["device_mask"],
                                           mb.get("discrete_masks"))
        b = ctx.shape[0]
        target = np.where(dm, np.asarray(mb["shares"], dtype=np.float64), 0.0)
        target = target / target.sum(axis=1, keepdims=True)
        choices = np.asarray(mb["choices"], dtype=np.int64).reshape(b, -1)
        weights = np.ones(choices.shape) if mb.get("choice_weights") is None \
            else np.asarray(mb["choice_weights"], dtype=np.float64)
        z, y, cache = self.actor.forward(ctx, items, dm)
        column = self.column(choices)
        p, scache = self._shares(z, dm, column)
        used = target > 0
        ce = -np.where(used, target * np.log(p + c.share_eps), 0.0).sum(axis=1)
        left_out = dm & ~used
        hinge = np.where(left_out, p, 0.0).sum(axis=1)
        # smooth max over the expert's devices of log(p / t): the makespan
        beta = c.makespan_sharpness
        ratio = np.where(used, np.log((p + c.share_eps)
                                      / np.where(used, target, 1.0)), -np.inf)
        top = ratio.max(axis=1, keepdims=True)
        e = np.where(used, np.exp(beta * (ratio - top)), 0.0)
        span = top[:, 0] + np.log(e.sum(axis=1)) / beta
        weight = e / e.sum(axis=1, keepdims=True)
        dp = np.where(used, -target / (p + c.share_eps)
                      + c.makespan_weight * weight / (p + c.share_eps), 0.0) \
            + c.exclude_weight * left_out
        dz = self._shares_backward(np.where(dm, dp, 0.0) / b, scache)
        dy = np.zeros_like(y)
        nll, hits = np.zeros(b), []
        for h, (s, cat) in enumerate(zip(self._slices,
                                         self._cats(y, masks), strict=True)):
            w = weights[:, h]
            nll -= w * cat.log_prob(choices[:, h])
            dy[:, s] = cat.log_prob_backward(choices[:, h], -w / b)
            hits.append((cat.mode() == choices[:, h], w))
        g_actor = self.actor.backward(dz, dy, cache)
        v_loss = 0.0
        if mb.get("returns") is not None:
            _, _, g_critic, v_loss = self._value(ctx, items, dm, mb["returns"], b)
        else:
            g_critic = {}
        share_ce = float(np.mean(ce + c.exclude_weight * hinge
                                 + c.makespan_weight * span))
        choice_nll = float(np.mean(nll))
        loss = share_ce + choice_nll + c.vf_coef * v_loss
        total_w = sum(float(w.sum()) for _, w in hits)
        stats = {"loss": loss, "share_ce": share_ce, "choice_nll": choice_nll,
                 "value_loss": v_loss,
                 "share_error": float(np.mean(np.abs(p - target).sum(axis=1))),
                 "excluded_ok": float(1.0 - (left_out & (p > 0)).sum()
                                      / max(1, left_out.sum())),
                 "choice_accuracy": (sum(float((hit * w).sum()) for hit, w in hits)
                                     / total_w) if total_w > 0 else 1.0}
        return loss, {**prefixed(g_actor, "actor"),
                      **prefixed(g_critic, "critic")}, stats

    def _cats(self, y: np.ndarray, masks: Sequence[np.ndarray]
              ) -> list[MaskedCategorical]:
        return [MaskedCategorical(y[:, s], m)
                for s, m in zip(self._slices, masks, strict=True)]

    def imitation_update(self, batch: Mapping[str, Any], steps: int,
                         minibatch_size: int | None = None) -> dict[str, float]:
        """``steps`` Adam steps of :meth:`imitation_loss_and_grads` on
        minibatches of ``batch`` (:meth:`_minibatches`, a new order every
        pass).

        Returns means over the steps of the statistics and ``grad_norm``,
        plus ``steps`` (empty statistics for 0 steps).
        """
        data = {k: np.asarray(v) if k != "discrete_masks" else v
                for k, v in batch.items() if v is not None}
        b = len(data["shares"])
        mbs = max(1, min(minibatch_size or self.config.minibatch_size, b))
        history: list[dict[str, float]] = []
        passes = iter(())
        every = max(1, self.config.value_every)
        for step in range(int(steps)):
            mb = next(passes, None)
            if mb is None:
                passes = self._minibatches(data, mbs)
                mb = next(passes)
            if step % every:
                mb = {k: v for k, v in mb.items() if k != "returns"}
            _, grads, stats = self.imitation_loss_and_grads(mb)
            stats.update(self.optimizer.step(grads))
            history.append(stats)
        if not history:
            return {"steps": 0.0}
        out = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
        out["steps"] = float(len(history))
        return out

    # ------------------------------------------------------------------
    # Files

    def header(self, user: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON header :meth:`save` writes (user fields merged in)."""
        head = dict(user or {})
        head.update({"format": POLICY_FORMAT, "version": POLICY_VERSION,
                     "context_dim": self.context_dim, "item_dim": self.item_dim,
                     "discrete_sizes": self.discrete_sizes,
                     "config": self.config.to_json()})
        return head

    def save(self, path: str | Path, header: Mapping[str, Any] | None = None
             ) -> Path:
        """Write the weights and a JSON header to an ``.npz`` file (exactly
        at ``path``); :meth:`load` compares ``header["spec"]``."""
        path = Path(path)
        text = json.dumps(self.header(header), sort_keys=True)
        with path.open("wb") as fh:
            np.savez(fh, header=np.array(text),
                     **{f"param/{k}": v for k, v in self.params.items()})
        return path

    @classmethod
    def load(cls, path: str | Path, expected_spec: Any = None) -> SetPPOAgent:
        """Read a policy written by :meth:`save`.

        Raises:
            PolicyFormatError: not a policy file, another format or version,
                a spec other than ``expected_spec`` (the differing keys
                named) or arrays that do not fit the recorded sizes; the
                message's first line says which.
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
            want = json.loads(json.dumps(expected_spec))
            if head.get("spec") != want:
                raise PolicyFormatError(f"{path}: feature spec differs from the "
                                        "expected one: "
                                        f"{_spec_diff(head.get('spec'), want)}")
        try:
            agent = cls(head["context_dim"], head["item_dim"],
                        head["discrete_sizes"],
                        SetPPOConfig.from_json(head["config"]))
            assign_params(agent.params, arrays)
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyFormatError(f"{path}: header and arrays do not describe "
                                    f"a policy of this version: {exc}") from exc
        agent.loaded_header = head
        return agent
