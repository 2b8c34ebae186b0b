"""A network over a set of items (devices) that does not care about their order
or number, with hand-written gradients.

Every item of a set is described by the same features; the set as a whole by a
context vector (the task). :class:`SetNet` encodes each item with shared
weights, pools over the items present (mean and max), lets each item see the
pool, pools again and reads out:

    h1_i = tanh([ctx, x_i] W1 + b1)                         (B, N, H1)
    g1   = [mean_i h1_i, max_i h1_i]                        (B, 2 H1)
    h2_i = tanh(h1_i W2 + g1 V2 + b2)                       (B, N, H2)
                                          (or h2_i = h1_i, without the layer)
    z_i  = h2_i Wz + x_i Ws + bz                            (B, N, P) per item
    g2   = [mean_i h2_i, max_i h2_i]                        (B, 2 H2)
    h3   = tanh([g2, ctx] W3 + b3)                          (B, H3)
    y    = h3 Wy + by                                       (B, Q)   per set

Pools run over the items a mask marks present; the outputs of absent items are
computed but meaningless (callers mask them). Permuting the items of a set
permutes ``z`` and leaves ``y`` unchanged; any number of items from one works.

Layers come in pairs ``*_forward(...) -> (out, cache)`` and
``*_backward(dout, cache) -> gradients``, float64 throughout, so
``tests/test_agent_setnet.py`` holds them to centred finite differences.
This module imports only :mod:`lib.learners.nn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from lib.learners.nn import (
    Params,
    affine_backward,
    affine_forward,
    orthogonal_init,
    tanh_backward,
    tanh_forward,
)

# --------------------------------------------------------------------------
# Layers


def item_affine_forward(x: np.ndarray, w: np.ndarray,
                        b: np.ndarray) -> tuple[np.ndarray, tuple]:
    """``out = x @ w + b`` on every item: ``x`` ``(B, N, F)`` -> ``(B, N, O)``.

    The cache is that of :func:`lib.learners.nn.affine_forward` on the
    items flattened to ``(B N, F)`` and the leading shape.
    """
    lead = x.shape[:-1]
    out, cache = affine_forward(x.reshape(-1, x.shape[-1]), w, b)
    return out.reshape(*lead, w.shape[1]), (cache, lead)


def item_affine_backward(dout: np.ndarray, cache: tuple
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`item_affine_forward`: ``(dx, dw, db)``."""
    inner, lead = cache
    dx, dw, db = affine_backward(dout.reshape(-1, dout.shape[-1]), inner)
    return dx.reshape(*lead, dx.shape[-1]), dw, db


def masked_pool_forward(h: np.ndarray, mask: np.ndarray
                        ) -> tuple[np.ndarray, tuple]:
    """Mean and max over the present items of each set.

    Args:
        h: ``(B, N, H)`` item features.
        mask: ``(B, N)`` bool, at least one True per row.

    Returns:
        ``(B, 2H)``: ``[mean, max]`` over the masked items, and the cache.
    """
    m = mask[..., None]
    count = np.maximum(mask.sum(axis=1), 1)[:, None].astype(np.float64)
    mean = np.where(m, h, 0.0).sum(axis=1) / count
    masked = np.where(m, h, -np.inf)
    arg = np.argmax(masked, axis=1)  # (B, H): the item holding each max
    top = np.take_along_axis(h, arg[:, None, :], axis=1)[:, 0, :]
    return np.concatenate([mean, top], axis=1), (mask, count, arg, h.shape)


def masked_pool_backward(dpool: np.ndarray, cache: tuple) -> np.ndarray:
    """Gradient of :func:`masked_pool_forward` w.r.t. ``h`` ``(B, N, H)``.

    The mean spreads its gradient evenly over the present items; the max
    sends it to the item that holds it (ties: the first, as ``argmax``).
    Absent items get 0.
    """
    mask, count, arg, shape = cache
    hdim = shape[2]
    dmean, dmax = dpool[:, :hdim], dpool[:, hdim:]
    dh = np.where(mask[..., None], (dmean / count)[:, None, :], 0.0)
    b_idx = np.arange(shape[0])[:, None]
    h_idx = np.arange(hdim)[None, :]
    np.add.at(dh, (b_idx, arg, h_idx), dmax)
    return dh


def broadcast_forward(ctx: np.ndarray, n: int) -> np.ndarray:
    """A per-set vector ``(B, F)`` repeated for ``n`` items: ``(B, n, F)``."""
    return np.broadcast_to(ctx[:, None, :], (ctx.shape[0], n, ctx.shape[1]))


def broadcast_backward(dout: np.ndarray) -> np.ndarray:
    """Gradient of :func:`broadcast_forward`: the items' gradients summed."""
    return dout.sum(axis=1)


# --------------------------------------------------------------------------
# The network


@dataclass(frozen=True)
class SetNetSizes:
    """Widths of a :class:`SetNet`."""

    context: int
    """Features of the set as a whole (the task), ``ctx``."""
    item: int
    """Features of one item (a device), ``x_i``."""
    item_out: int
    """Outputs per item, ``P`` (0: none)."""
    set_out: int
    """Outputs per set, ``Q``."""
    hidden: tuple[int, int, int] = (64, 64, 64)
    """``(H1, H2, H3)``: item encoder, item layer after the pool (0: none),
    set layer."""


class SetNet:
    """The permutation-equivariant network of the module docstring.

    Args:
        sizes: the widths; ``H2 = 0`` leaves out the item layer after the
            pool (then ``h2_i = h1_i``, ``g2 = g1``: a plain deep set whose
            item outputs see their own item only, for a decision at a time
            in fewer operations).
        rng: seeded generator for the initial weights (orthogonal, gain
            ``sqrt(2)`` for hidden layers).
        item_gain, set_gain: scale of the output weights (0.01 for policy
            logits, 1.0 for a value).

    ``params`` holds ``W1 b1 W3 b3 Wy by``, ``W2 V2 b2`` with the item layer
    and ``Wz Ws bz`` with item outputs (shapes in the module docstring).
    """

    def __init__(self, sizes: SetNetSizes, rng: np.random.Generator, *,
                 item_gain: float = 0.01, set_gain: float = 0.01) -> None:
        self.sizes = sizes
        c, f = sizes.context, sizes.item
        h1, h2, h3 = sizes.hidden
        g = float(np.sqrt(2.0))
        width = h2 or h1
        p: Params = {"W1": orthogonal_init((c + f, h1), g, rng), "b1": np.zeros(h1)}
        if h2:
            p["W2"] = orthogonal_init((h1, h2), g, rng)
            p["V2"] = orthogonal_init((2 * h1, h2), g, rng) / np.sqrt(2.0)
            p["b2"] = np.zeros(h2)
        p["W3"] = orthogonal_init((2 * width + c, h3), g, rng)
        p["b3"] = np.zeros(h3)
        p["Wy"] = orthogonal_init((h3, sizes.set_out), set_gain, rng)
        p["by"] = np.zeros(sizes.set_out)
        if sizes.item_out:
            p["Wz"] = orthogonal_init((width, sizes.item_out), item_gain, rng)
            p["Ws"] = np.zeros((f, sizes.item_out))
            p["bz"] = np.zeros(sizes.item_out)
        self.params = p

    def forward(self, ctx: np.ndarray, items: np.ndarray, mask: np.ndarray,
                params: Mapping[str, np.ndarray] | None = None
                ) -> tuple[np.ndarray | None, np.ndarray, tuple]:
        """Outputs for a batch of sets.

        Args:
            ctx: ``(B, C)`` per-set features.
            items: ``(B, N, F)`` item features (absent items: anything finite).
            mask: ``(B, N)`` bool, the present items (at least one per set).
            params: other weights of the same shapes (default :attr:`params`).

        Returns:
            ``(z, y, cache)``: ``z`` ``(B, N, P)`` (None without item
            outputs), ``y`` ``(B, Q)``.
        """
        p = self.params if params is None else params
        n = items.shape[1]
        u = np.concatenate([broadcast_forward(ctx, n), items], axis=2)
        a1, c1 = item_affine_forward(u, p["W1"], p["b1"])
        h1, t1 = tanh_forward(a1)
        g1, cp1 = masked_pool_forward(h1, mask)
        layer = None
        h2, g2 = h1, g1
        if "W2" in p:
            a2, c2 = item_affine_forward(h1, p["W2"], p["b2"])
            ag, cg = affine_forward(g1, p["V2"], np.zeros(p["V2"].shape[1]))
            h2, t2 = tanh_forward(a2 + broadcast_forward(ag, n))
            g2, cp2 = masked_pool_forward(h2, mask)
            layer = (c2, cg, t2, cp2)
        z, cz, cs = None, None, None
        if "Wz" in p:
            zz, cz = item_affine_forward(h2, p["Wz"], p["bz"])
            zs, cs = item_affine_forward(items, p["Ws"], np.zeros(p["Ws"].shape[1]))
            z = zz + zs
        a3, c3 = affine_forward(np.concatenate([g2, ctx], axis=1), p["W3"],
                                p["b3"])
        h3, t3 = tanh_forward(a3)
        y, cy = affine_forward(h3, p["Wy"], p["by"])
        cache = (c1, t1, cp1, layer, cz, cs, c3, t3, cy, g2.shape[1])
        return z, y, cache

    def backward(self, dz: np.ndarray | None, dy: np.ndarray, cache: tuple
                 ) -> Params:
        """Parameter gradients for upstream ``dz`` ``(B, N, P)`` (or None)
        and ``dy`` ``(B, Q)``, keyed like :attr:`params` (inputs get none:
        they are observations)."""
        (c1, t1, cp1, layer, cz, cs, c3, t3, cy, g2w) = cache
        grads: Params = {}
        dh3, grads["Wy"], grads["by"] = affine_backward(dy, cy)
        da3 = tanh_backward(dh3, t3)
        din3, grads["W3"], grads["b3"] = affine_backward(da3, c3)
        dg2 = din3[:, :g2w]
        dh2 = None
        if cz is not None:
            dz = np.zeros((*cz[1], self.sizes.item_out)) if dz is None else dz
            dh2, grads["Wz"], grads["bz"] = item_affine_backward(dz, cz)
            _, grads["Ws"], _ = item_affine_backward(dz, cs)
        if layer is None:
            dh1 = masked_pool_backward(dg2, cp1)
            if dh2 is not None:
                dh1 = dh1 + dh2
        else:
            c2, cg, t2, cp2 = layer
            dh2 = masked_pool_backward(dg2, cp2) + (0.0 if dh2 is None else dh2)
            da2 = tanh_backward(dh2, t2)
            dag = broadcast_backward(da2)
            dg1, grads["V2"], _ = affine_backward(dag, cg)
            dh1, grads["W2"], grads["b2"] = item_affine_backward(da2, c2)
            dh1 = dh1 + masked_pool_backward(dg1, cp1)
        da1 = tanh_backward(dh1, t1)
        _, grads["W1"], grads["b1"] = item_affine_backward(da1, c1)
        return grads

    def __call__(self, ctx: np.ndarray, items: np.ndarray, mask: np.ndarray
                 ) -> tuple[np.ndarray | None, np.ndarray]:
        """Forward pass without the cache: ``(z, y)``."""
        z, y, _ = self.forward(ctx, items, mask)
        return z, y

    def forward_one(self, ctx: np.ndarray, items: np.ndarray,
                    first: np.ndarray | None = None
                    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Outputs for one set of present items, no batch axis, no caches.

        Args:
            ctx: ``(C,)`` the set's features.
            items: ``(k, F)`` the present items only.
            first: ``(k, H1)``, the items' part of the first layer,
                ``items @ W1[C:]``, where the caller keeps it between calls
                (it depends on the items only); None computes it.

        Returns:
            ``(z (k, P) or None, y (Q,))``, the values of :meth:`forward`.
        """
        p = self.params
        c = self.sizes.context
        if first is None:
            first = items @ p["W1"][c:]
        h = np.tanh(first + (ctx @ p["W1"][:c] + p["b1"]))
        if "W2" in p:
            g1 = np.concatenate([h.mean(axis=0), h.max(axis=0)])
            h = np.tanh(h @ p["W2"] + (g1 @ p["V2"] + p["b2"]))
        z = None
        if "Wz" in p:
            z = h @ p["Wz"] + items @ p["Ws"] + p["bz"]
        g2 = np.concatenate([h.mean(axis=0), h.max(axis=0), ctx])
        h3 = np.tanh(g2 @ p["W3"] + p["b3"])
        return z, h3 @ p["Wy"] + p["by"]


# --------------------------------------------------------------------------
# Water-filling: shares that equalise finish times


def waterfill_forward(log_time: np.ndarray, log_fixed: np.ndarray,
                      mask: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Shares that make affine finish times equal, per set.

    Item ``i`` would take ``time_i = exp(log_time_i)`` for the whole job and
    ``fixed_i = exp(log_fixed_i)`` before it starts, so a share ``s_i`` ends at
    ``fixed_i + s_i time_i``. The shares that make every item that takes part
    end at one time ``T`` (and leave out the items whose fixed cost alone
    exceeds ``T``) are ``s_i = max(0, T - fixed_i) / time_i`` with ``sum s =
    1``: items enter in order of their fixed cost, and ``T = (1 + sum_A
    fixed_i / time_i) / sum_A 1 / time_i`` over the active set ``A``. Fixed
    costs are taken relative to the smallest present one (``T`` too), so
    large fixed costs do not cancel in ``T - fixed_i``.

    Args:
        log_time, log_fixed: ``(B, N)``.
        mask: ``(B, N)`` bool, the present items (at least one per row).

    Returns:
        ``(B, N)`` shares (rows sum to 1, exactly 0 for absent and left-out
        items) and the cache.
    """
    rate = np.where(mask, np.exp(-np.clip(log_time, -700.0, 700.0)), 0.0)
    fixed = np.where(mask, np.exp(np.clip(log_fixed, -700.0, 700.0)), np.inf)
    fixed = fixed - fixed.min(axis=1, keepdims=True)
    order = np.argsort(fixed, axis=1, kind="stable")
    f_sorted = np.take_along_axis(fixed, order, axis=1)
    r_sorted = np.take_along_axis(rate, order, axis=1)
    big_r = np.cumsum(r_sorted, axis=1)
    big_f = np.cumsum(r_sorted * np.where(np.isfinite(f_sorted), f_sorted, 0.0),
                      axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_m = (1.0 + big_f) / big_r
    nxt = np.concatenate([f_sorted[:, 1:], np.full((len(f_sorted), 1), np.inf)],
                         axis=1)
    # the first prefix whose time comes before the next item could start
    stop = np.argmax((t_m <= nxt) & np.isfinite(t_m), axis=1)
    t = np.take_along_axis(t_m, stop[:, None], axis=1)
    fixed = np.where(mask, fixed, 0.0)
    s = np.where(mask, np.maximum(t - fixed, 0.0) * rate, 0.0)
    active = mask & (s > 0)
    # the gradient needs the absolute fixed costs (their offset cancels)
    absolute = np.where(mask, np.exp(np.clip(log_fixed, -700.0, 700.0)), 0.0)
    return s, (rate, fixed, absolute, t[:, 0], active)


def waterfill_backward(ds: np.ndarray, cache: tuple
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of :func:`waterfill_forward` w.r.t. ``log_time`` and
    ``log_fixed`` for upstream ``ds`` ``(B, N)`` (0 for items outside the
    active set: their shares stay 0 nearby)."""
    rate, fixed, absolute, t, active = cache
    big_r = np.where(active, rate, 0.0).sum(axis=1)
    g = np.where(active, ds, 0.0)
    mean = (g * rate).sum(axis=1) / big_r  # sum_i g_i r_i / R
    dr = np.where(active, (t[:, None] - fixed) * (g - mean[:, None]), 0.0)
    dfix = np.where(active, rate * (mean[:, None] - g), 0.0)
    return -rate * dr, absolute * dfix
