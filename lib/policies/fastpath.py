"""The learned policy's one-decision kernel, compiled: the folded network of
:class:`lib.policies.learned._Context` from the task's figures to the shares
and head choices, in one call.

A decision of the set policy is a few hundred multiply-adds and a few hundred
``tanh`` over arrays of four to sixteen rows: NumPy spends more on calling
its two dozen operations than on computing them. :func:`act` does the same
arithmetic in one compiled call (Numba, compiled once per machine and cached
beside this file, or in the user's cache where this folder is read-only).

It computes exactly what these steps of :meth:`LearnedPolicy._act` compute,
up to rounding (``tests/test_policy_latency.py`` holds it to the batch
network, :meth:`lib.learners.setnet.SetNet.forward`):

1. the per-device times ``t = inv * scale + lat`` (rows: host in, host out,
   compute, fixed bytes, split cost, pipelined cost, memory time), compute =
   max(compute, memory), and their ``log10`` as the first six inputs of each
   device's row ``x``; the task's ``ext`` entries after them;
2. ``h1 = tanh(x @ w1x + first)``; with a second set layer, ``h2 =
   tanh(h1 @ w2 + v2t @ [sum h1, max h1, 1])``;
3. ``h3 = tanh(w3t @ [sum h2, max h2, ext])``, the heads' logits ``y = wyt @
   [h3, 1]`` and the share outputs ``z = x @ wzx + skip + h2 @ wz``;
4. each head's first largest allowed logit (a NaN wins, as in ``np.argmax``);
5. the shares that equalise finish times (:func:`waterfill`) from the two
   share outputs the share head picked.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: Float flags the kernel is compiled with: sums may be reordered and
#: multiply-adds fused, so that the loops vectorise; NaN and infinity keep
#: their meaning. A division by zero gives infinity, as in NumPy (Python's
#: check for it would keep the loops from vectorising).
FASTMATH = {"reassoc", "contract"}

_jit = njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")

#: ``1 / n!`` for n = 13 down to 0: the Taylor series of ``e^y`` after its
#: 14th term, in Horner order.
_TAYLOR = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy",
      inline="always")
def _tanh(x: float) -> float:
    """``tanh(x)`` within 1e-14 of the library's, in a form the loops
    vectorise (the library's is a call per element, five times slower):
    ``1 - 2 / (e^(2|x|) + 1)`` with the sign of ``x``, ``e^(2|x|) =
    (e^(|x|/32))^64`` and ``e^y`` for ``y <= 0.625`` by its Taylor series to
    the 14th power (|x| above 20 gives 1 exactly, as the library's; NaN
    stays NaN)."""
    a = min(abs(x), 20.0)
    y = a * 0.03125
    p = 1.0 / 87178291200.0  # 1 / 14!, then Horner down to 1 / 0!
    for c in _TAYLOR:
        p = p * y + c
    for _ in range(6):  # e^(2|x|) = (e^y)^64
        p = p * p
    r = 1.0 - 2.0 / (p + 1.0)
    return r if x >= 0.0 else -r


@_jit
def _layer(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """``out += x @ w`` for a matrix ``x`` (rows), by rows of ``w``, four
    rows of ``x`` at a time (each row of ``w`` loaded once for the four)."""
    k = x.shape[0]
    width = w.shape[1]
    d = 0
    while d + 4 <= k:
        for i in range(x.shape[1]):
            a0 = x[d, i]
            a1 = x[d + 1, i]
            a2 = x[d + 2, i]
            a3 = x[d + 3, i]
            for j in range(width):
                wij = w[i, j]
                out[d, j] += a0 * wij
                out[d + 1, j] += a1 * wij
                out[d + 2, j] += a2 * wij
                out[d + 3, j] += a3 * wij
        d += 4
    for r in range(d, k):
        for i in range(x.shape[1]):
            a = x[r, i]
            for j in range(width):
                out[r, j] += a * w[i, j]


@_jit
def _pool(h: np.ndarray, out: np.ndarray) -> None:
    """``out[:H] = sum of h over rows``, ``out[H:2H] = max of h over rows``
    (NaN propagates, as ``np.maximum.reduce``)."""
    width = h.shape[1]
    for j in range(width):
        s = h[0, j]
        m = h[0, j]
        for d in range(1, h.shape[0]):
            v = h[d, j]
            s += v
            if v > m or v != v:
                m = v
        out[j] = s
        out[width + j] = m


@_jit
def waterfill(log_time: np.ndarray, log_fixed: np.ndarray) -> np.ndarray:
    """The shares that equalise finish times ``fixed_i + share_i / rate_i``,
    ``rate = exp(-log_time)``, ``fixed = exp(log_fixed)`` (both clipped to
    ``exp(+-700)``): :func:`lib.learners.setnet.waterfill_forward` for one set
    of present devices."""
    k = log_time.shape[0]
    rate = np.empty(k)
    fixed = np.empty(k)
    for i in range(k):
        a = min(max(log_time[i], -700.0), 700.0) if log_time[i] == log_time[i] \
            else log_time[i]
        b = min(max(log_fixed[i], -700.0), 700.0) if log_fixed[i] == log_fixed[i] \
            else log_fixed[i]
        rate[i] = math.exp(-a)
        fixed[i] = math.exp(b)
    low = fixed.min()
    fixed -= low  # relative: no cancellation in T - f
    order = np.argsort(fixed, kind="mergesort")
    big_r = 0.0
    big_f = 0.0
    t = math.inf
    for m in range(k):
        i = order[m]
        big_r += rate[i]
        big_f += rate[i] * fixed[i]
        t = (1.0 + big_f) / big_r
        if m == k - 1 or t <= fixed[order[m + 1]]:
            break
    out = np.empty(k)
    for i in range(k):
        gap = t - fixed[i]
        out[i] = (0.0 if gap < 0.0 else gap) * rate[i]
    return out


@_jit
def act(ext, scale, inv, lat, w1x, first, w2, v2t, w3t, wyt, wzx, skip, wz,
        allowed, bounds, share_head):
    """One decision's shares ``(k,)`` and head choices ``(heads,)`` (int64).

    Args:
        ext: the task's ``ne`` entries (task row, separable parts, 1), a
            tuple of floats (cheaper to pass than an array).
        scale: the task's (bytes in, bytes out, FLOP, fixed bytes, 0, 0,
            memory traffic), a tuple of floats.
        inv, lat: ``(7, k)`` per device, the factors and offsets of the times.
        w1x, first: the first layer's folded weights ``(6 + ne, H1)`` and
            per-device part ``(k, H1)``.
        w2, v2t: the second set layer ``(H1, W)`` and its pooled weights
            ``(W, 2 H1 + 1)``; ``(0, 0)`` arrays where there is none.
        w3t: ``(H3, 2 W + ne)``; wyt: ``(Q, H3 + 1)``.
        wzx, skip, wz: the share outputs' folded weights ``(6 + ne, P)``,
            per-device part ``(k, P)`` and set part ``(W, P)``.
        allowed: ``(Q,)`` nonzero where a head's option may be chosen.
        bounds: ``(heads + 1,)`` where each head's logits start in ``y``.
        share_head: the head whose choice picks the share outputs (-1: none).
    """
    n_terms = inv.shape[0] - 1
    k = inv.shape[1]
    ne = len(ext)
    width1 = w1x.shape[1]
    # the task's entries are the same in every device's row: their part of
    # the first layer once
    base = np.zeros(width1)
    for r in range(ne):
        e = ext[r]
        for j in range(width1):
            base[j] += e * w1x[n_terms + r, j]
    x = np.empty((k, n_terms))
    for d in range(k):
        t0 = inv[0, d] * scale[0] + lat[0, d]
        t1 = inv[1, d] * scale[1] + lat[1, d]
        t2 = inv[2, d] * scale[2] + lat[2, d]
        t3 = inv[3, d] * scale[3] + lat[3, d]
        mem = inv[n_terms, d] * scale[n_terms] + lat[n_terms, d]
        if mem > t2 or mem != mem:
            t2 = mem
        pipe = t0
        if t1 > pipe or t1 != t1:
            pipe = t1
        if t2 > pipe or t2 != t2:
            pipe = t2
        x[d, 0] = math.log10(t0)
        x[d, 1] = math.log10(t1)
        x[d, 2] = math.log10(t2)
        x[d, 3] = math.log10(t3)
        x[d, 4] = math.log10(t0 + t1 + t2)
        x[d, 5] = math.log10(pipe)
    h1 = np.empty((k, width1))
    for d in range(k):
        for j in range(width1):
            h1[d, j] = first[d, j] + base[j]
    _layer(x, w1x, h1)
    _tanh_all(h1)
    h2 = h1
    if w2.shape[0] > 0:
        g1 = np.ones(2 * width1 + 1)
        _pool(h1, g1)
        h2 = np.empty((k, w2.shape[1]))
        for j in range(w2.shape[1]):
            s = 0.0
            for i in range(g1.shape[0]):
                s += v2t[j, i] * g1[i]
            for d in range(k):
                h2[d, j] = s
        _layer(h1, w2, h2)
        _tanh_all(h2)
    width = h2.shape[1]
    g2 = np.empty(2 * width + ne)
    _pool(h2, g2)
    for r in range(ne):
        g2[2 * width + r] = ext[r]
    h3 = np.ones(w3t.shape[0] + 1)
    for j in range(w3t.shape[0]):
        s = 0.0
        for i in range(g2.shape[0]):
            s += w3t[j, i] * g2[i]
        h3[j] = _tanh(s)
    heads = bounds.shape[0] - 1
    choices = np.zeros(heads, dtype=np.int64)
    for h in range(heads):
        best = -math.inf
        at = 0
        for q in range(bounds[h], bounds[h + 1]):
            if allowed[q] == 0:
                continue
            v = 0.0
            for i in range(h3.shape[0]):
                v += wyt[q, i] * h3[i]
            if v != v:  # a NaN wins, as in np.argmax
                at = q - bounds[h]
                break
            if v > best:
                best = v
                at = q - bounds[h]
        choices[h] = at
    c = 2 * (choices[share_head] if share_head >= 0 else 0)
    z0 = 0.0
    z1 = 0.0
    for r in range(ne):
        z0 += ext[r] * wzx[n_terms + r, c]
        z1 += ext[r] * wzx[n_terms + r, c + 1]
    log_time = np.empty(k)
    log_fixed = np.empty(k)
    for d in range(k):
        a0 = skip[d, c] + z0
        a1 = skip[d, c + 1] + z1
        for i in range(n_terms):
            a0 += x[d, i] * wzx[i, c]
            a1 += x[d, i] * wzx[i, c + 1]
        for i in range(width):
            a0 += h2[d, i] * wz[i, c]
            a1 += h2[d, i] * wz[i, c + 1]
        log_time[d] = a0
        log_fixed[d] = a1
    return waterfill(log_time, log_fixed), choices


@_jit
def _tanh_all(h: np.ndarray) -> None:
    """``h = tanh(h)`` in place (a C-contiguous matrix)."""
    flat = h.reshape(h.size)
    for i in range(flat.shape[0]):
        flat[i] = _tanh(flat[i])
