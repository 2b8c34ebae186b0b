"""The optimum under the cost model: the bound every policy is held to.

Split mode. Each device's finish time is ``t_i(r) = a + b r + max(c + d r,
e + f r)`` (:func:`~lib.costmodel.model.split_time_coefficients`), so the rows a
device can finish by time ``T`` are ``r_i(T) = min((T-a-c)/(b+d), (T-a-e)/(b+f))``,
clipped to ``[0, rows that fit in its memory]``, and the finish times are
equalised by bisection on ``T`` until ``sum_i r_i(T) = n``. A device whose fixed
cost exceeds ``T`` gets no rows, so over the usable devices this is already the
best subset when the merge costs nothing (``concat``) and the host nothing per
shard. For ``sum`` merges the merge cost depends on which devices take part,
and so does the host's serial cost of the shards where the calibration
fitted one (``host_s``), so then subsets are searched: all of
them up to :data:`EXHAUSTIVE_DEVICES` usable devices (NumPy arrays of subsets x
devices), beyond that the prefixes of the devices ordered by the rows they take
when all are used, and for ``p2p`` the cliques of the peer-to-peer graph grown
greedily in that order.

Pipelined mode: a joint search over the chunk size and the shares. A shard of
``r`` rows in chunks of ``C`` rows takes ``c = ceil(r / C)`` chunks, so its time
is no longer affine in ``r`` and the best shares differ from split mode's
(pipelining hides transfers, which favours devices behind slow links). For every
chunk count of :data:`CHUNK_COUNTS` per largest shard (a superset of the learned
policy's :data:`~lib.contract.PIPELINE_CHUNKS`), on the best subsets of split
mode, the whole usable set and the best single devices, each device's pipelined
time is linearised around its current rows (a secant through the exact model),
the linearised times are equalised as above, and the rows and the chunk size
``ceil(largest shard / count)`` are updated; :data:`PIPELINE_ROUNDS` rounds.

Every candidate is rounded to whole rows (largest remainder, as the shards are
cut) and priced exactly by the same per-device formulas as
:func:`~lib.costmodel.model.predict`, vectorised. Around the best pipelined
candidates the chunk size is then searched on a fine grid (:meth:`polish`), and
the best two, and the best split over several devices, are refined by a local
search over whole rows (:meth:`refine`: chunk counts are whole, so a device's
time jumps where its rows cross a multiple of the chunk size). The best few are
priced with :func:`predict` itself and passed through Gate 1, with the two
static baselines (equal split and proportional to peak over all usable
devices). Block size does not enter the model; the optimum keeps the default
block. All decisions list their devices in index order, as every policy's do.
No decision of any policy (the baselines, perturbations of the optimum's own,
the learned policy) beats it by more than rounding (``tests/test_optimum.py``
holds it to 0.5 %), with rare exceptions: in runs of 1,200 to 4,000
generated machines and tasks a perturbation beat it by more than that once
at most (by 0.56 %: a pipelined matmul whose best chunk size lies just where
its largest shard needs one chunk fewer, between two sizes of the fine grid).
One run since found a larger one: a stencil of five sweeps (1351 x 2249) on
an A10 and an H200 SXM, pipelined, beaten by 1.7 % by shares of 0.292/0.708
in chunks of 192 rows, which end the A10's shard just past two whole chunks;
the search prices chunk counts linearised before it rounds them, and neither
more refined candidates nor a wider chunk grid finds that pair.

Why one module: the subsets, the equalisations, the pipelined search, the
refinement and the exact vectorised pricing all work on one representation of
the machine's usable devices (:class:`_Devices`, :class:`_Search`), which must
price a decision to the last bit as :func:`predict` does; split over modules,
that contract would have no single place.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lib.contract import (
    PIPELINE_CHUNKS,
    Decision,
    NoFeasibleDecision,
    TaskSpec,
)
from lib.costmodel.model import (
    CostParams,
    Prediction,
    cache_factor,
    default_params,
    host_seconds,
    launch_seconds,
    predict,
    split_time_coefficients,
    wait_seconds,
)
from lib.costmodel.parameters import params_for
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import workload
from lib.policies.baselines import EqualSplit, ProportionalToPeak
from lib.security.gate1 import MEMORY_MARGIN, check_decision

#: Subsets per comm path whose split solution seeds the pipelined search.
TOP_SUBSETS = 4
#: Single devices (fastest in split mode) the pipelined search always tries.
TOP_SINGLES = 2
#: Up to this many usable devices every subset is searched (2^k - 1 of them).
EXHAUSTIVE_DEVICES = 8
#: Chunks per largest shard the pipelined search tries (includes the policy's).
CHUNK_COUNTS: tuple[int, ...] = tuple(sorted(set(PIPELINE_CHUNKS) | {
    3, 6, 12, 24, 48, 96, 128}))
#: Linearise-and-equalise rounds of the pipelined search.
PIPELINE_ROUNDS = 3
#: Pipelined candidates whose chunk size is refined on a fine grid.
POLISH_CANDIDATES = 3
#: Ratio between neighbouring chunk sizes of that grid, and steps either side.
POLISH_RATIO = 1.05
POLISH_STEPS = 10
#: Best pipelined candidates refined by a local search over whole rows (and
#: the best split one over several devices), and the most moves it makes.
REFINE_CANDIDATES = 2
REFINE_STEPS = 24
#: Devices whose finish times are this close to the last one's move together.
TIE = 5e-3
#: Candidates priced with :func:`predict` and Gate 1 at the end.
FINAL_CANDIDATES = 6


@dataclass(frozen=True)
class Optimum:
    """The best decision found and what finding it took.

    Attributes:
        decision: the best decision, hashed and accepted by Gate 1.
        prediction: its PREDICTED time (Eq. (1)).
        candidates: decisions priced (vectorised and with the full model).
        seconds: wall time of the search.
    """

    decision: Decision
    prediction: Prediction
    candidates: int
    seconds: float

    @property
    def total(self) -> float:
        return self.prediction.total


def _memory_rows(task: TaskSpec, machine: Machine, i: int,
                 telemetry: Snapshot | None) -> float:
    """Most rows device ``i`` can hold under Gate 1's memory margin."""
    w = workload(task)
    f1, f2 = w.work(task, 1).footprint, w.work(task, 2).footprint
    slope, base = f2 - f1, f1 - (f2 - f1)
    free = telemetry.free_bytes[i] if telemetry is not None \
        else machine.devices[i].mem_bytes
    room = free * (1.0 - MEMORY_MARGIN) - base
    if room < slope:
        return 0.0
    return min(float(task.split_size), math.floor(room / slope) if slope > 0
               else float(task.split_size))


def _equalise(a1: np.ndarray, s1: np.ndarray, a2: np.ndarray, s2: np.ndarray,
              cap: np.ndarray, masks: np.ndarray, n: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """Equalised finish time and rows when device ``i`` finishes
    ``r_i(T) = clip(min((T - a1)/s1, (T - a2)/s2), 0, cap_i)`` rows by ``T``.

    The sum over the devices is piecewise linear and increasing in ``T``; its
    breakpoints are where a device starts, where its two lines cross and
    where it fills up, so the ``T`` at which it reaches ``n`` is found
    exactly between two breakpoints (no iteration).

    Args:
        a1, s1, a2, s2: ``(..., k)`` intercepts (s) and slopes (s/row) of the
            two limits, one set per problem (leading axes) and device.
        cap: ``(k,)`` or ``(..., k)`` most rows each device may take.
        masks: ``(..., k)`` bool, the devices each problem may use.
        n: rows to place.

    Returns:
        ``(T, rows)``: ``(...)`` times (inf where the devices cannot hold
        ``n`` rows) and ``(..., k)`` rows (as many as they hold there).
    """
    s1, s2 = np.maximum(s1, 1e-30), np.maximum(s2, 1e-30)
    cap = np.where(masks, cap, 0.0)
    a1 = np.where(masks, a1, np.inf)
    a2 = np.where(masks, a2, np.inf)

    def rows_at(t: np.ndarray) -> np.ndarray:
        r = np.minimum((t[..., None] - a1[..., None, :]) / s1[..., None, :],
                       (t[..., None] - a2[..., None, :]) / s2[..., None, :])
        return np.clip(r, 0.0, cap[..., None, :])

    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (a1 / s1 - a2 / s2) / (1.0 / s1 - 1.0 / s2)
    points = np.concatenate([np.maximum(a1, a2), cross,
                             np.maximum(a1 + s1 * cap, a2 + s2 * cap)], axis=-1)
    points = np.where(np.isfinite(points) & (points >= 0), points, np.inf)
    points = np.sort(points, axis=-1)
    filled = rows_at(np.where(np.isfinite(points), points, 0.0)).sum(axis=-1)
    filled = np.where(np.isfinite(points), filled, -1.0)
    feasible = cap.sum(axis=-1) >= n
    # rounding may leave the last breakpoint a hair short of n: it counts
    enough = filled >= n * (1.0 - 1e-12)
    last = np.isfinite(points).sum(axis=-1) - 1
    j = np.where(enough.any(axis=-1), np.argmax(enough, axis=-1),
                 np.maximum(last, 0))
    j = np.where(feasible, j, 0)
    hi_t = np.take_along_axis(points, j[..., None], -1)[..., 0]
    hi_f = np.take_along_axis(filled, j[..., None], -1)[..., 0]
    prev = np.maximum(j - 1, 0)[..., None]
    lo_t = np.where(j > 0, np.take_along_axis(points, prev, -1)[..., 0], hi_t)
    lo_f = np.where(j > 0, np.take_along_axis(filled, prev, -1)[..., 0], hi_f)
    gap = hi_f - lo_f
    frac = np.where(gap > 0, (n - lo_f) / np.where(gap > 0, gap, 1.0), 1.0)
    t = np.where(feasible, lo_t + np.clip(frac, 0.0, 1.0) * (hi_t - lo_t), np.inf)
    at = np.where(feasible, t, 1e300)  # infeasible: every device full
    with np.errstate(over="ignore", invalid="ignore"):
        rows = np.clip(np.minimum((at[..., None] - a1) / s1,
                                  (at[..., None] - a2) / s2), 0.0, cap)
    return t, np.where(masks, rows, 0.0)


def equalised_rows(coef: np.ndarray, rmax: np.ndarray, masks: np.ndarray,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """Equalise split-mode finish times over each subset.

    Args:
        coef: ``(k, 6)`` coefficients ``a, b, c, d, e, f`` per device.
        rmax: ``(k,)`` most rows each device may take.
        masks: ``(S, k)`` bool, the subsets.
        n: rows to place.

    Returns:
        ``(T, rows)``: ``(S,)`` equalised finish times (inf where the subset
        cannot hold ``n`` rows) and ``(S, k)`` continuous rows per device.
    """
    a, b, c, d, e, f = (np.broadcast_to(coef[:, j], masks.shape) for j in range(6))
    return _equalise(a + c, b + d, a + e, b + f, rmax, masks, n)


def equalised_affine(alpha: np.ndarray, beta: np.ndarray, rmax: np.ndarray,
                     masks: np.ndarray, n: int) -> np.ndarray:
    """Rows that equalise affine finish times ``alpha + beta r`` per problem.

    Args:
        alpha, beta: ``(..., k)`` intercepts (s) and slopes (s/row), one
            linearisation per problem (leading axes) and device.
        rmax: ``(k,)`` most rows each device may take.
        masks: ``(..., k)`` bool, the devices each problem may use.
        n: rows to place.

    Returns:
        ``(..., k)`` continuous rows, summing to ``n`` where the devices can
        hold it.
    """
    return _equalise(alpha, beta, alpha, beta, rmax, masks, n)[1]


class _Devices:
    """Eq. (1)'s per-device terms over the usable devices, as arrays ``(k,)``.

    Every work count is affine in the rows ``r >= 1`` (read off the workload at
    one and two rows), so :meth:`times` evaluates a device's finish time for
    any rows, chunk size and mode at once, exactly as :func:`predict` does.
    """

    def __init__(self, task: TaskSpec, machine: Machine, usable: Sequence[int],
                 params: CostParams, telemetry: Snapshot | None) -> None:
        w = workload(task)
        one, two = w.work(task, 1), w.work(task, 2)

        def affine(name: str) -> tuple[float, float]:
            slope = getattr(two, name) - getattr(one, name)
            return getattr(one, name) - slope, slope

        self.flops0, self.flops1 = affine("flops")
        self.mem0, self.mem1 = affine("mem_traffic")
        self.inr0, self.inr1 = affine("bytes_in_rows")
        self.inf0, self.inf1 = affine("bytes_in_fixed")
        self.out0, self.out1 = affine("bytes_out")
        # A stencil shard's halo, min(2T, H - r) rows, stops being affine when
        # the shard nears the whole grid: it is counted exactly.
        self.halo = None
        if task.kind == "stencil":
            h, width, steps = task.dims.values()
            self.halo = (float(h), float(2 * steps), float(width), float(steps),
                         float(task.itemsize))
        self.concat = task.merge == "concat"
        devs = [machine.devices[i] for i in usable]
        links = [machine.host_link(i) for i in usable]
        slow = np.array([telemetry.slowdown(i) ** params.contention.get(
            machine.devices[i].kind, 1.0) if telemetry is not None else 1.0
            for i in usable])
        self.peak = np.array([d.peak_flops(task.dtype) * params.e(d.kind, task.kind)
                              for d in devs]) / slow
        self.bw_mem = np.array([d.mem_bw * params.e_mem(d.kind, task.kind)
                                * cache_factor(task, machine, i, params)
                                for i, d in zip(usable, devs, strict=True)]) / slow
        self.bw = np.array([lk.bandwidth * params.link_scale.get(d.kind, 1.0)
                            for lk, d in zip(links, devs, strict=True)])
        self.lat = np.array([lk.latency * params.latency_scale.get(d.kind, 1.0)
                             for lk, d in zip(links, devs, strict=True)])
        self.launch = np.array([launch_seconds(machine, i, params, task.kind)
                                for i in usable])
        #: the scheduler wait, once per shard however many chunks it has
        self.wait = np.array([wait_seconds(machine, i, params, telemetry)
                              for i in usable])
        # On a Dask cluster the inputs are generated on the workers.
        self.inputs = 0.0 if machine.cluster else 1.0

    def _xfer(self, nbytes: np.ndarray) -> np.ndarray:
        return np.where(nbytes > 0, self.lat + nbytes / self.bw, 0.0)

    def times(self, rows: np.ndarray, chunk: np.ndarray | float, pipelined: bool,
              copy_out: np.ndarray | bool = True, exact: bool = True
              ) -> np.ndarray:
        """Finish times ``(..., k)`` of ``rows`` ``(..., k)`` per device.

        Args:
            rows: rows per device (0: the device does nothing and takes 0 s).
            chunk: ``(...)`` or scalar, pipelined chunk size in rows.
            pipelined: pipelined mode (else split; one chunk is split too).
            copy_out: ``(...)`` or scalar: whether each shard copies its
                result to the host (False for a ``sum`` merged on the devices).
            exact: ``ceil(r / C)`` chunks as the model counts them; False uses
                ``max(1, r / C)``, a smooth stand-in for the linearisation.
        """
        r = np.asarray(rows, dtype=np.float64)
        pos = r > 0
        b_rows = self.inr0 + self.inr1 * r
        if self.halo is None:
            flops = self.flops0 + self.flops1 * r
            mem = self.mem0 + self.mem1 * r
            b_fix = self.inf0 + self.inf1 * r
        else:  # lib.platform.workloads.Stencil.work
            h, most, width, steps, e = self.halo
            band = r + np.minimum(most, h - r)
            flops = 5.0 * band * width * steps
            mem = 2.0 * e * band * width * steps
            b_fix = e * (band - r) * width
        b_rows, b_fix = b_rows * self.inputs, b_fix * self.inputs
        comp = np.maximum(flops / self.peak, mem / self.bw_mem)
        keep = np.asarray(copy_out, dtype=np.float64)
        if keep.ndim:
            keep = keep[..., None]
        b_out = (self.out0 + self.out1 * r) * keep
        split = self.launch + self.wait + self._xfer(b_rows + b_fix) + comp \
            + self._xfer(b_out)
        if not pipelined:
            return np.where(pos, split, 0.0)
        size = np.maximum(np.asarray(chunk, dtype=np.float64), 1.0)
        if size.ndim:
            size = size[..., None]
        c = np.ceil(r / size) if exact else r / size
        c = np.maximum(c, 1.0)
        a = self._xfer(b_rows / c)
        b = comp / c
        o = self._xfer(b_out / c) if self.concat else np.zeros_like(a)
        t = c * self.launch + self.wait + self._xfer(b_fix) + a + b + o \
            + (c - 1.0) * np.maximum(np.maximum(a, b), o)
        if not self.concat:
            t = t + self._xfer(b_out)
        one = (c <= 1.0) if exact else np.zeros_like(pos)
        return np.where(pos, np.where(one, split, t), 0.0)


def whole_rows(rows: np.ndarray, n: int) -> np.ndarray:
    """Continuous rows ``(M, k)`` cut into whole rows as :func:`split_rows`
    cuts shares ``rows / sum(rows)`` (largest remainder, ties to the lower
    index)."""
    total = rows.sum(axis=1, keepdims=True)
    exact = n * rows / np.where(total > 0, total, 1.0)
    base = np.floor(exact)
    left = (n - base.sum(axis=1)).astype(np.int64)
    order = np.argsort(-(exact - base), axis=1, kind="stable")
    rank = np.argsort(order, axis=1, kind="stable")
    return base + (rank < left[:, None])


class _Search:
    """One optimum search: the machine's usable devices for one task."""

    def __init__(self, task: TaskSpec, machine: Machine,
                 telemetry: Snapshot | None, params: CostParams) -> None:
        self.task, self.machine, self.telemetry = task, machine, telemetry
        self.params = params
        self.n = task.split_size
        healthy = [i for i in range(machine.n)
                   if telemetry is None or telemetry.healthy[i]]
        rmax = [_memory_rows(task, machine, i, telemetry) for i in healthy]
        self.usable = [i for i, r in zip(healthy, rmax, strict=True) if r >= 1]
        self.rmax = np.array([r for r in rmax if r >= 1])
        self.k = len(self.usable)
        self.dev = _Devices(task, machine, self.usable, params, telemetry)
        self.is_sum = task.merge == "sum"
        #: whether a decision's cost depends on which devices take part
        #: beyond their finish times: a sum's merge, the host's shards
        self.per_set = self.is_sum or host_seconds(machine, self.usable, params) > 0
        self.nbytes = workload(task).work(task, 1).bytes_out
        self.candidates: list[tuple[np.ndarray, str, bool, float]] = []
        #: Candidates priced so far (vectorised), over every pass.
        self.count = 0

    # -- subsets and merges --------------------------------------------------

    def paths(self) -> list[str]:
        out = ["host"]
        if self.is_sum and self.k >= 2 and self.machine.nccl:
            out.append("nccl")
        if self.is_sum and self.k >= 2 and any(self._p2p(a, b) for a, b in
                                              itertools.combinations(self.usable,
                                                                     2)):
            out.append("p2p")
        return out

    def _p2p(self, a: int, b: int) -> bool:
        link = self.machine.peer(a, b)
        return link is not None and link.p2p

    def _pair(self, i: int, j: int) -> tuple[float, float]:
        link = self.machine.peer(i, j)
        if link is not None and link.p2p:
            return link.bandwidth, link.latency
        hi, hj = self.machine.host_link(i), self.machine.host_link(j)
        return min(hi.bandwidth, hj.bandwidth) / 2, hi.latency + hj.latency

    def merge(self, active: Sequence[int], path: str) -> float:
        """``t_merge`` of Eq. (1) for the active devices (machine indices, in
        order), as :func:`lib.costmodel.model.merge_seconds` computes it."""
        k = len(active)
        if not self.is_sum or k <= 1:
            return 0.0
        nb = self.nbytes
        if path == "host":
            return k * nb / self.machine.host_mem_bw
        lead = active[0]
        dev = self.machine.devices[lead]
        add = k * nb / (dev.mem_bw * self.params.e_mem(dev.kind, self.task.kind))
        link = self.machine.host_link(lead)
        out = link.latency + nb / link.bandwidth if nb > 0 else 0.0
        if path == "p2p":
            gather = max((lat + nb / bw) if nb > 0 else 0.0
                         for bw, lat in (self._pair(lead, j) for j in active[1:]))
            if self.machine.cluster:  # a tree of adds, as merge_seconds prices it
                return math.ceil(math.log2(k)) * (gather + add / k * 2) + out
            return gather + add + out
        ring = [self._pair(active[i], active[(i + 1) % k]) for i in range(k)]
        slowest = min(bw for bw, _ in ring)
        latency = max(lat for _, lat in ring)
        return 2 * (k - 1) / k * nb / slowest + 2 * (k - 1) * latency + out

    def set_cost(self, active: Sequence[int], path: str) -> float:
        """What the devices ``active`` cost together beyond their finish
        times: ``t_merge`` and ``t_host`` of Eq. (1)."""
        return self.merge(active, path) + host_seconds(self.machine, active,
                                                       self.params)

    def subsets(self, path: str, order: np.ndarray) -> np.ndarray:
        """``(S, k)`` bool subsets of the usable devices searched for ``path``
        (``order``: device positions, most rows first, when all are used)."""
        k = self.k
        if not self.per_set:
            return np.ones((1, k), dtype=bool)
        if k <= EXHAUSTIVE_DEVICES:
            masks = ((np.arange(1, 1 << k)[:, None] >> np.arange(k)) & 1).astype(bool)
        else:
            masks = np.zeros((k, k), dtype=bool)
            for m in range(k):
                masks[m, order[:m + 1]] = True
        if path != "host":
            masks = masks[masks.sum(axis=1) >= 2]
        if path == "p2p":
            ok = [all(self._p2p(self.usable[a], self.usable[b])
                      for a, b in itertools.combinations(np.flatnonzero(s), 2))
                  for s in masks]
            masks = masks[np.array(ok, dtype=bool)] if masks.size else masks
            if k > EXHAUSTIVE_DEVICES:
                masks = np.concatenate([masks, self._cliques(order)])
        return masks

    def _cliques(self, order: np.ndarray) -> np.ndarray:
        """Peer-to-peer cliques grown greedily from each device in ``order``,
        with every prefix of each (at least two devices)."""
        out = []
        for seed in order:
            members = [int(seed)]
            for j in order:
                if j != seed and all(self._p2p(self.usable[j], self.usable[m])
                                     for m in members):
                    members.append(int(j))
            for m in range(2, len(members) + 1):
                row = np.zeros(self.k, dtype=bool)
                row[members[:m]] = True
                out.append(row)
        return np.array(out, dtype=bool).reshape(-1, self.k)

    # -- searches ------------------------------------------------------------

    def split(self, path: str) -> tuple[np.ndarray, np.ndarray]:
        """Split mode on ``path``: ``(subsets (S, k), rows (S, k))`` of the
        best subsets, best first (at most :data:`TOP_SUBSETS`), all also
        recorded as candidates."""
        copy_out = path == "host"
        coef = np.array([split_time_coefficients(self.task, self.machine, i,
                                                 self.params, self.telemetry,
                                                 copy_out) for i in self.usable])
        full = np.ones((1, self.k), dtype=bool)
        _, rows_all = equalised_rows(coef, self.rmax, full, self.n)
        order = np.argsort(-rows_all[0], kind="stable")
        masks = self.subsets(path, order)
        if not len(masks):
            return masks, np.zeros((0, self.k))
        t, rows = equalised_rows(coef, self.rmax, masks, self.n)
        merges = np.array([self.set_cost([self.usable[j]
                                          for j in np.flatnonzero(r > 0)], path)
                           for r in rows]) if self.per_set else np.zeros(len(masks))
        total = t + merges
        best = [s for s in np.argsort(total, kind="stable")
                if np.isfinite(total[s])][:TOP_SUBSETS]
        for s in best:
            self.candidates.append((rows[s], path, False, float(self.n)))
        return masks[best], rows[best]

    def pipelined(self, path: str, masks: np.ndarray, seeds: np.ndarray, *,
                  counts: Sequence[float] = CHUNK_COUNTS,
                  chunks: np.ndarray | None = None) -> None:
        """The joint search over chunk sizes and shares on each subset of
        ``masks`` ``(S, k)`` from its rows ``seeds`` ``(S, k)``; records
        every round's candidates.

        Args:
            counts: chunks per largest shard: the chunk size follows the rows.
            chunks: ``(Q, S)`` fixed chunk sizes instead (``counts`` unused).
        """
        if not len(masks):
            return
        fixed = chunks is not None
        per = np.asarray(chunks if fixed else counts, dtype=np.float64)
        q, s = per.shape[0], len(masks)
        if not fixed:
            per = np.broadcast_to(per[:, None], (q, s))
        m = np.broadcast_to(masks, (q, s, self.k))
        rows = np.broadcast_to(seeds, (q, s, self.k)).copy()
        copy_out = np.broadcast_to(
            (path == "host") | (masks.sum(axis=1) < 2), (q, s))
        reference = np.broadcast_to(self.n / np.maximum(masks.sum(axis=1), 1)
                                    [:, None], (q, s, self.k))
        for round_ in range(PIPELINE_ROUNDS + 1):
            chunk = per if fixed else np.ceil(rows.max(axis=-1) / per)
            self.candidates += [(rows[a, b], path, True, float(chunk[a, b]))
                                for a in range(q) for b in range(s)]
            if round_ == PIPELINE_ROUNDS:
                break
            # a secant through the smooth model around each device's rows (or
            # an even share for a device that has none, so it can come back)
            r1 = np.minimum(np.where(rows >= 1.0, rows, reference), self.rmax)
            r2 = np.minimum(r1 * 1.25 + 1.0, self.rmax)
            r2 = np.where(r2 > r1, r2, r1 * 0.8)  # at the cap: look below it
            t1 = self.dev.times(r1, chunk, True, copy_out, exact=False)
            t2 = self.dev.times(r2, chunk, True, copy_out, exact=False)
            # more rows never finish sooner: a flat or falling secant (a
            # stencil's shrinking halo) is held to a small positive slope
            beta = np.maximum((t2 - t1) / (r2 - r1), 1e-9 * t1 / r1)
            alpha = t1 - beta * r1
            rows = equalised_affine(alpha, beta, self.rmax, m, self.n)

    def polish(self, priced: list[tuple[float, tuple[int, ...], np.ndarray, str,
                                        bool, int]]) -> None:
        """Around the best pipelined candidates, chunk sizes on a fine grid
        (:data:`POLISH_STEPS` either side, ratio :data:`POLISH_RATIO`), each
        with its shares equalised again; records the candidates."""
        seen = set()
        for _, gpus, rows, path, pipe, chunk in priced:
            if not pipe or (gpus, path) in seen:
                continue
            seen.add((gpus, path))
            mask = np.isin(self.usable, gpus)[None]
            seed = np.zeros((1, self.k))
            seed[0, mask[0]] = rows
            grid = chunk * POLISH_RATIO ** np.arange(-POLISH_STEPS,
                                                     POLISH_STEPS + 1)
            grid = np.unique(np.clip(np.round(grid), 1, self.n))
            self.pipelined(path, mask, seed, chunks=grid[:, None])
            if len(seen) >= POLISH_CANDIDATES:
                break

    # -- pricing -------------------------------------------------------------

    def priced(self, keep: int = 24) -> list[tuple[float, tuple[int, ...],
                                                 np.ndarray, str, bool, int]]:
        """The candidates cut into whole rows and priced exactly (vectorised
        Eq. (1)), the best ``keep`` first: ``(seconds, gpus, rows, path,
        pipelined, chunk)``; :meth:`decision` turns one into a
        :class:`Decision`."""
        if not self.candidates:
            return []
        self.count += len(self.candidates)
        cont = np.array([c[0] for c in self.candidates])
        rows = whole_rows(cont, self.n)
        placed = np.abs(cont.sum(axis=1) - self.n) <= 0.5  # finite, all rows
        active = rows > 0
        count = active.sum(axis=1)
        chunk = np.array([c[3] for c in self.candidates])
        total = np.full(len(rows), np.inf)
        paths = np.array([c[1] for c in self.candidates])
        pipes = np.array([c[2] for c in self.candidates])
        merges: dict[tuple[bytes, str], float] = {}
        for path in dict.fromkeys(paths.tolist()):
            for pipe in (False, True):
                idx = np.flatnonzero((paths == path) & (pipes == pipe))
                if not idx.size:
                    continue
                copy_out = (path == "host") | (count[idx] < 2)
                total[idx] = self.dev.times(rows[idx], chunk[idx], pipe,
                                            copy_out).max(axis=1)
            if not self.per_set:
                continue
            for i in np.flatnonzero(paths == path):
                if path != "host" and count[i] < 2:
                    total[i] = np.inf
                    continue
                key = (active[i].tobytes(), path)
                if key not in merges:
                    merges[key] = self.set_cost(
                        [self.usable[j] for j in np.flatnonzero(active[i])], path)
                total[i] += merges[key]
        total[~placed] = np.inf
        usable = np.array(self.usable)
        out = []
        for i in np.argsort(total, kind="stable")[:keep]:
            if not np.isfinite(total[i]):
                break
            out.append((float(total[i]), tuple(usable[active[i]].tolist()),
                        rows[i][active[i]], str(paths[i]), bool(pipes[i]),
                        int(chunk[i])))
        return out

    def refine(self, entry: tuple[float, tuple[int, ...], np.ndarray, str, bool,
                                  int]) -> tuple[float, tuple[int, ...],
                                                 np.ndarray, str, bool, int]:
        """A local search over whole rows from one priced entry (pipelined,
        or split over several devices).

        Chunk counts are whole (``ceil(r / C)``), so a device's time jumps as
        its rows cross a multiple of the chunk size, and a stencil's halo
        makes a shard's time uneven in its rows: the smooth search can stop a
        little short. Each step moves rows from the device that
        finishes last to another one (powers of two, and the rows past its
        last chunk boundary), and from all the devices that finish within
        :data:`TIE` of it to the one that finishes first; pipelined, each
        move is priced with the chunk size as it is and as it follows the
        largest shard at the same chunk count (as the policy's action states
        chunks). Every move is priced exactly and the best kept;
        :data:`REFINE_STEPS` steps at most. Returns the entry improved (or
        unchanged)."""
        total, gpus, rows, path, pipe, chunk = entry
        pos = np.flatnonzero(np.isin(self.usable, gpus))
        full = np.zeros(self.k)
        full[pos] = rows
        copy_out = path == "host" or len(gpus) < 2
        merge = self.set_cost(list(gpus), path) if self.per_set else 0.0
        best = float(self.dev.times(full, chunk, pipe, copy_out).max())
        for _ in range(REFINE_STEPS):
            t = self.dev.times(full, chunk, pipe, copy_out)
            slow = int(np.argmax(t))
            have = full[slow]
            steps = [2.0 ** e for e in range(int(math.log2(max(have, 1.0))))]
            steps.append(have % chunk)
            steps = [d for d in dict.fromkeys(steps) if 0 < d < have]
            others = [j for j in pos if j != slow]
            if not steps or not others:
                break
            moves = np.repeat(full[None], len(steps) * len(others), axis=0)
            row = 0
            for j in others:
                for d in steps:
                    moves[row, slow] -= d
                    moves[row, j] += d
                    row += 1
            # and from all the devices that finish (nearly) last together to
            # the one that finishes first: a single move cannot lower a tie
            near = np.flatnonzero(t >= t[slow] * (1.0 - TIE))
            fast = min(pos, key=lambda j: t[j])
            if len(near) > 1 and fast not in near:
                for d in steps:
                    move = full.copy()
                    take = np.minimum(move[near] - 1.0, d)
                    move[near] -= take
                    move[fast] += take.sum()
                    moves = np.vstack([moves, move[None]])
            moves = np.minimum(moves, self.rmax)
            moves[:, slow] = self.n - (moves.sum(axis=1) - moves[:, slow])
            chunks = np.full(len(moves), float(chunk))
            if pipe:  # the same chunk count of the largest shard, as the
                # policy's action states it, with the chunk size following
                count = math.ceil(full.max() / chunk)
                chunks = np.concatenate(
                    [chunks, np.ceil(moves.max(axis=1) / count)])
                moves = np.concatenate([moves, moves])
            times = self.dev.times(moves, chunks, pipe, copy_out).max(axis=1)
            pick = int(np.argmin(times))
            if times[pick] >= best * (1.0 - 1e-12):
                break
            best, full, chunk = float(times[pick]), moves[pick], int(chunks[pick])
        return (best + merge, gpus, full[pos], path, pipe, chunk)

    def decision(self, priced: tuple[float, tuple[int, ...], np.ndarray, str,
                                     bool, int]) -> Decision:
        """The decision of one row of :meth:`priced` (not hashed)."""
        _, gpus, rows, path, pipe, chunk = priced
        return self._decision(list(gpus), rows, path, pipe, chunk)

    def _decision(self, gpus: list[int], rows: np.ndarray, path: str,
                  pipelined: bool, chunk: int) -> Decision:
        shares = [float(x) / self.n for x in rows]
        shares[-1] = 1.0 - math.fsum(shares[:-1])
        mode = "pipelined" if pipelined else ("single" if len(gpus) == 1
                                              else "split")
        return Decision(gpus=tuple(gpus), shares=tuple(shares),
                        chunk=chunk if pipelined else self.n,
                        block=self.machine.block_for(gpus), mode=mode,
                        comm_path=path)


def optimum(task: TaskSpec, machine: Machine, telemetry: Snapshot | None = None,
            params: CostParams | None = None) -> Optimum:
    """The best decision for ``task`` on ``machine`` under the cost model.

    Returns:
        An :class:`Optimum` whose decision Gate 1 accepts.

    Raises:
        NoFeasibleDecision: no subset of the usable devices can hold the task.
    """
    start = time.perf_counter()
    params = params or default_params()
    search = _Search(task, machine, telemetry, params)
    if search.k and search.rmax.sum() >= search.n:
        singles = np.zeros((0, search.k), dtype=bool)
        for path in search.paths():
            masks, seeds = search.split(path)
            if path == "host":
                t_one = search.dev.times(np.diag(np.full(search.k,
                                                         float(search.n))),
                                         search.n, False).max(axis=1)
                fits = search.rmax >= search.n
                best = [j for j in np.argsort(t_one) if fits[j]][:TOP_SINGLES]
                singles = np.eye(search.k, dtype=bool)[best]
                masks = np.concatenate([masks, singles])
                seeds = np.concatenate([seeds, singles * float(search.n)])
                if search.is_sum and search.k > 1:
                    full = np.ones((1, search.k), dtype=bool)
                    masks = np.concatenate([masks, full])
                    seeds = np.concatenate([seeds, np.full(
                        (1, search.k), search.n / search.k)])
            if not machine.cluster:  # a Dask cluster runs pipelined as split
                search.pipelined(path, masks, seeds)
    priced = search.priced()
    search.candidates = []
    search.polish(priced)
    priced = sorted(priced + search.priced(), key=lambda x: x[0])
    pipes = [p for p in priced if p[4]][:REFINE_CANDIDATES] \
        + [p for p in priced if not p[4] and len(p[1]) > 1][:1]
    refined = [search.refine(p) for p in pipes]
    priced = sorted(priced + refined, key=lambda x: x[0])
    finals = [search.decision(p) for p in priced[:FINAL_CANDIDATES]]
    finals += [EqualSplit().decide(task, machine, telemetry),
               ProportionalToPeak().decide(task, machine, telemetry)]
    best: tuple[float, Decision, Prediction] | None = None
    for cand in finals:
        cand = cand.with_hash(task)
        pred = predict(task, cand, machine, telemetry, params)
        if best is not None and pred.total >= best[0]:
            continue
        if check_decision(cand, task, machine, telemetry).accepted:
            best = (pred.total, cand, pred)
    if best is None:
        raise NoFeasibleDecision(f"no feasible decision for {task.describe()} on "
                         f"{machine.name}: no subset of devices can hold it")
    return Optimum(decision=best[1], prediction=best[2],
                   candidates=search.count + len(refined) + 2,
                   seconds=time.perf_counter() - start)


class Oracle:
    """The optimum as a policy: the bound every policy is held to, not one a
    runtime could afford on every task (milliseconds a decision). It searches
    the machine's own cost model: its calibrated parameters where
    ``gpuhive calibrate`` saved some (:func:`params_for`), else the defaults."""

    name = "oracle"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        return optimum(task, machine, telemetry, params_for(machine.name)).decision
