"""Layers with hand-written gradients, a small MLP and the Adam optimiser.

Every layer is a pair ``*_forward(...) -> (out, cache)`` and
``*_backward(dout, cache) -> gradients``; the cache holds exactly what the
backward pass needs. Arrays are float64 throughout: the nets are small, and
float64 lets the finite-difference checks in ``tests/test_agent_gradients.py``
hold gradients to a relative error below 1e-6.

Parameters live in plain ``dict[str, np.ndarray]`` objects. A learner gathers
the dicts of its modules under dotted names (:func:`prefixed`) *without copying*,
so :class:`Adam` updating the gathered dict in place updates the modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Params = dict[str, np.ndarray]

#: Logit given to forbidden options: ``exp`` of it underflows to exactly 0
#: (Stable-Baselines3 uses the same value for invalid-action masking).
MASK_LOGIT = -1e8

# --------------------------------------------------------------------------
# Layers


def affine_forward(x: np.ndarray, w: np.ndarray,
                   b: np.ndarray) -> tuple[np.ndarray, tuple]:
    """``out = x @ w + b``.

    Args:
        x: inputs, shape ``(batch, d_in)``.
        w: weights, shape ``(d_in, d_out)``.
        b: biases, shape ``(d_out,)``.

    Returns:
        ``out`` of shape ``(batch, d_out)`` and the cache ``(x, w)``.
    """
    return x @ w + b, (x, w)


def affine_backward(dout: np.ndarray,
                    cache: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`affine_forward`: ``(dx, dw, db)`` shaped like its inputs."""
    x, w = cache
    return dout @ w.T, x.T @ dout, dout.sum(axis=0)


def relu_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``max(x, 0)`` elementwise; the cache is ``x``."""
    return np.maximum(x, 0.0), x


def relu_backward(dout: np.ndarray, cache: np.ndarray) -> np.ndarray:
    """Gradient of :func:`relu_forward` (0 at the kink ``x == 0``)."""
    return dout * (cache > 0)


def tanh_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``tanh(x)`` elementwise; the cache is the output."""
    out = np.tanh(x)
    return out, out


def tanh_backward(dout: np.ndarray, cache: np.ndarray) -> np.ndarray:
    """Gradient of :func:`tanh_forward`: ``dout * (1 - tanh(x)**2)``."""
    return dout * (1.0 - cache * cache)


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))`` without overflow."""
    return np.logaddexp(0.0, x)


def inv_softplus(y: float) -> float:
    """The ``x`` with ``softplus(x) == y`` (``y > 0``): a bias that makes a
    softplus output start at ``y``."""
    return float(y + np.log(-np.expm1(-y)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow (the derivative of softplus)."""
    return np.exp(-np.logaddexp(0.0, -x))


def masked_softmax_forward(logits: np.ndarray,
                           mask: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Softmax over the allowed entries of each row; forbidden entries get 0.

    Args:
        logits: shape ``(batch, n)``.
        mask: bool ``(batch, n)``, ``True`` = allowed, at least one per row.

    Returns:
        ``probs`` ``(batch, n)`` (rows sum to 1, exactly 0 where forbidden) and
        the cache ``(probs, mask)``.
    """
    z = np.where(mask, logits, MASK_LOGIT)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    probs = e / e.sum(axis=1, keepdims=True)
    return probs, (probs, mask)


def masked_softmax_backward(dprobs: np.ndarray, cache: tuple) -> np.ndarray:
    """Gradient of :func:`masked_softmax_forward`: ``p * (dp - sum(dp * p))``.

    Forbidden entries get gradient 0 (their output is a constant 0).
    """
    probs, mask = cache
    inner = (dprobs * probs).sum(axis=1, keepdims=True)
    return np.where(mask, probs * (dprobs - inner), 0.0)


_ACTIVATIONS = {
    "tanh": (tanh_forward, tanh_backward),
    "relu": (relu_forward, relu_backward),
}

# --------------------------------------------------------------------------
# Initialisation


def orthogonal_init(shape: tuple[int, int], gain: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Orthogonal matrix of ``shape`` scaled by ``gain`` (Saxe et al., 2014).

    Rows (or columns, whichever are fewer) are orthonormal before scaling;
    ``gain = sqrt(2)`` suits ReLU/tanh hidden layers, 0.01 policy outputs and
    1.0 value outputs (the choice of the common PPO implementations).
    """
    rows, cols = shape
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))  # makes the distribution uniform (Haar)
    if rows < cols:
        q = q.T
    return gain * q[:rows, :cols]


def he_init(shape: tuple[int, int], gain: float,
            rng: np.random.Generator) -> np.ndarray:
    """Gaussian weights with std ``gain * sqrt(2 / fan_in)`` (He et al., 2015)."""
    return gain * rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])


_INITS = {"orthogonal": orthogonal_init, "he": he_init}

# --------------------------------------------------------------------------
# MLP


class MLP:
    """A stack of affine layers with an activation between them (none at the end).

    Args:
        sizes: layer widths ``[d_in, h_1, ..., d_out]``.
        rng: seeded generator for the initial weights.
        activation: ``"tanh"`` or ``"relu"``.
        init: ``"orthogonal"`` or ``"he"``.
        hidden_gain: weight scale of the hidden layers (``sqrt(2)`` typical).
        out_gain: weight scale of the output layer (0.01 for policy logits,
            1.0 for values).

    ``params`` holds ``W0, b0, W1, b1, ...``; ``W{i}`` has shape
    ``(sizes[i], sizes[i+1])``.
    """

    def __init__(self, sizes: Sequence[int], rng: np.random.Generator, *,
                 activation: str = "tanh", init: str = "orthogonal",
                 hidden_gain: float = float(np.sqrt(2.0)),
                 out_gain: float = 1.0) -> None:
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs at least input and output sizes, "
                             f"got {list(sizes)}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of "
                             f"{sorted(_ACTIVATIONS)}")
        if init not in _INITS:
            raise ValueError(f"init {init!r} is not one of {sorted(_INITS)}")
        self.sizes = [int(s) for s in sizes]
        self.activation = activation
        self.params: Params = {}
        n_layers = len(self.sizes) - 1
        for i in range(n_layers):
            gain = out_gain if i == n_layers - 1 else hidden_gain
            shape = (self.sizes[i], self.sizes[i + 1])
            self.params[f"W{i}"] = _INITS[init](shape, gain, rng)
            self.params[f"b{i}"] = np.zeros(self.sizes[i + 1])

    @property
    def n_layers(self) -> int:
        """Number of affine layers."""
        return len(self.sizes) - 1

    def forward(self, x: np.ndarray,
                params: Mapping[str, np.ndarray] | None = None
                ) -> tuple[np.ndarray, list]:
        """Outputs ``(batch, sizes[-1])`` for inputs ``(batch, sizes[0])``, and caches.

        ``params`` (default :attr:`params`) evaluates the same architecture with
        other weights, e.g. a target network's.
        """
        p = self.params if params is None else params
        act_fwd, _ = _ACTIVATIONS[self.activation]
        caches: list = []
        out = x
        for i in range(self.n_layers):
            out, c_aff = affine_forward(out, p[f"W{i}"], p[f"b{i}"])
            c_act = None
            if i < self.n_layers - 1:
                out, c_act = act_fwd(out)
            caches.append((c_aff, c_act))
        return out, caches

    def backward(self, dout: np.ndarray,
                 caches: list) -> tuple[np.ndarray, Params]:
        """Gradients for upstream ``dout`` ``(batch, sizes[-1])``.

        Returns:
            ``dx`` of shape ``(batch, sizes[0])`` (used to push a critic's
            gradient into an action) and a dict of parameter gradients keyed
            like :attr:`params`.
        """
        _, act_bwd = _ACTIVATIONS[self.activation]
        grads: Params = {}
        d = dout
        for i in reversed(range(self.n_layers)):
            c_aff, c_act = caches[i]
            if c_act is not None:
                d = act_bwd(d, c_act)
            d, grads[f"W{i}"], grads[f"b{i}"] = affine_backward(d, c_aff)
        return d, grads

    def __call__(self, x: np.ndarray,
                 params: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Forward pass without caches."""
        return self.forward(x, params)[0]

    def scratch(self) -> list[np.ndarray]:
        """Output buffers for :meth:`forward_one`, one per layer."""
        return [np.empty(size) for size in self.sizes[1:]]

    def forward_one(self, x: np.ndarray,
                    scratch: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """Outputs ``(sizes[-1],)`` for one input ``(sizes[0],)`` float64.

        Each layer is ``h @ W + b`` on the 1-D ``h`` (then the activation), for
        a decision at a time: no batch axis and no caches, and with ``scratch``
        (from :meth:`scratch`) no allocations, so the result is the last
        scratch buffer and the next call overwrites it.
        """
        p = self.params
        bufs = self.scratch() if scratch is None else scratch
        h = x
        last = self.n_layers - 1
        for i in range(self.n_layers):
            out = bufs[i]
            np.dot(h, p[f"W{i}"], out=out)
            np.add(out, p[f"b{i}"], out=out)
            if i < last:
                if self.activation == "tanh":
                    np.tanh(out, out=out)
                else:
                    np.maximum(out, 0.0, out=out)
            h = out
        return h


# --------------------------------------------------------------------------
# Parameter dicts


def prefixed(params: Mapping[str, np.ndarray], prefix: str) -> Params:
    """``{f"{prefix}.{k}": v}`` sharing the arrays (no copies)."""
    return {f"{prefix}.{k}": v for k, v in params.items()}


def unprefixed(params: Mapping[str, np.ndarray], prefix: str) -> Params:
    """The entries under ``prefix.`` with the prefix removed (arrays shared)."""
    head = prefix + "."
    return {k[len(head):]: v for k, v in params.items() if k.startswith(head)}


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """Euclidean norm of all gradients taken as one vector."""
    return float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))


def clip_by_global_norm(grads: Mapping[str, np.ndarray],
                        max_norm: float) -> tuple[Params, float]:
    """Scale all gradients by ``min(1, max_norm / norm)``; returns them and the norm.

    ``max_norm <= 0`` or ``inf`` disables clipping.
    """
    norm = global_norm(grads)
    scale = 1.0
    if 0.0 < max_norm < np.inf and norm > max_norm:
        scale = max_norm / (norm + 1e-12)
    return {k: g * scale for k, g in grads.items()}, norm


def copy_params(params: Mapping[str, np.ndarray]) -> Params:
    """Deep copy of a parameter dict."""
    return {k: v.copy() for k, v in params.items()}


def assign_params(dst: Mapping[str, np.ndarray],
                  src: Mapping[str, np.ndarray]) -> None:
    """Copy ``src`` into the arrays of ``dst`` in place (same keys and shapes)."""
    if set(dst) != set(src):
        missing = sorted(set(dst) - set(src))
        extra = sorted(set(src) - set(dst))
        raise KeyError(f"parameter names differ: missing {missing}, "
                       f"unexpected {extra}")
    for k, v in dst.items():
        if v.shape != np.shape(src[k]):
            raise ValueError(f"parameter {k}: shape {np.shape(src[k])} where "
                             f"{v.shape} is needed")
        v[...] = src[k]


def polyak_update(target: Mapping[str, np.ndarray],
                  source: Mapping[str, np.ndarray], tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source`` in place."""
    for k, v in target.items():
        v *= 1.0 - tau
        v += tau * source[k]


# --------------------------------------------------------------------------
# Adam


@dataclass
class AdamConfig:
    """Hyperparameters of :class:`Adam`."""

    lr: float = 3e-4
    """Step size (1e-4 to 1e-3 typical)."""
    beta1: float = 0.9
    """Decay of the first-moment estimate."""
    beta2: float = 0.999
    """Decay of the second-moment estimate."""
    eps: float = 1e-8
    """Added to the root of the second moment (1e-8; PPO often uses 1e-5)."""
    max_grad_norm: float = 0.0
    """Clip gradients to this global norm before the step (0 disables)."""


class Adam:
    """Adam (Kingma & Ba, 2015) over a parameter dict, updating it in place.

    Args:
        params: the arrays to optimise (updated in place by :meth:`step`).
        config: step size, moment decays, epsilon and gradient clipping.
    """

    def __init__(self, params: Params, config: AdamConfig | None = None) -> None:
        self.params = params
        self.config = config or AdamConfig()
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: Mapping[str, np.ndarray],
             lr: float | None = None) -> dict[str, float]:
        """One update with ``grads`` (keys a subset of ``params``).

        Args:
            grads: gradients of the loss to *minimise*.
            lr: step size for this step (default ``config.lr``).

        Returns:
            ``{"grad_norm": norm before clipping}``.
        """
        c = self.config
        grads, norm = clip_by_global_norm(grads, c.max_grad_norm)
        self.t += 1
        step = (c.lr if lr is None else lr)
        step *= np.sqrt(1.0 - c.beta2 ** self.t) / (1.0 - c.beta1 ** self.t)
        for k, g in grads.items():
            m, v = self.m[k], self.v[k]
            m *= c.beta1
            m += (1.0 - c.beta1) * g
            v *= c.beta2
            v += (1.0 - c.beta2) * g * g
            self.params[k] -= step * m / (np.sqrt(v) + c.eps)
        return {"grad_norm": norm}

    def state(self) -> dict[str, Any]:
        """Moments and step count (for checkpoints)."""
        return {"t": self.t, "m": self.m, "v": self.v}
