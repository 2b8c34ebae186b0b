"""The exhaustive optimum under the cost model: the oracle every policy is held to.

For every non-empty subset of the usable devices the shares are *exact*: each
device's split-mode finish time is ``t_i(r) = a + b r + max(c + d r, e + f r)``
(:func:`~lib.costmodel.model.split_time_coefficients`), so the rows a device can
finish by time ``T`` are ``r_i(T) = min((T-a-c)/(b+d), (T-a-e)/(b+f))``, clipped
to what fits in its memory, and the finish times are equalised by bisection on
``T`` until ``sum_i r_i(T) = n``. All subsets are solved at once (NumPy arrays of
subsets x devices).

The best subsets are then priced with the full model, :func:`predict`, over every
comm path the machine allows and over ``split`` and ``pipelined`` modes (chunk
sizes from a grid, shares kept), after integer rounding of the rows. The two
static baselines (equal split and proportional to peak over all usable devices)
are priced too, so integer rounding can never leave the oracle behind them.
Block size does not enter the model; the optimum keeps the default block.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from lib.contract import DEFAULT_BLOCK, PIPELINE_CHUNKS, Decision, TaskSpec
from lib.costmodel.model import (
    CostParams,
    Prediction,
    predict,
    split_time_coefficients,
)
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import workload
from lib.policies.baselines import EqualSplit, ProportionalToPeak
from lib.security.gate1 import MEMORY_MARGIN, check_decision

#: subsets per merge variant priced with the full model.
TOP_SUBSETS = 6
BISECTION_STEPS = 80


@dataclass(frozen=True)
class Optimum:
    """The best decision found and what finding it took.

    Attributes:
        decision: the best decision, hashed and accepted by Gate 1.
        prediction: its PREDICTED time (Eq. (1)).
        candidates: decisions priced with the full model.
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


def equalised_rows(coef: np.ndarray, rmax: np.ndarray, masks: np.ndarray,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """Equalise finish times over each subset.

    Args:
        coef: ``(k, 6)`` coefficients ``a, b, c, d, e, f`` per device.
        rmax: ``(k,)`` most rows each device may take.
        masks: ``(S, k)`` bool, the subsets.
        n: rows to place.

    Returns:
        ``(T, rows)``: ``(S,)`` equalised finish times (inf where the subset
        cannot hold ``n`` rows) and ``(S, k)`` continuous rows per device.
    """
    a, b, c, d, e, f = (coef[:, j] for j in range(6))
    s1 = np.maximum(b + d, 1e-30)
    s2 = np.maximum(b + f, 1e-30)

    def rows_at(t: np.ndarray) -> np.ndarray:
        r = np.minimum((t[:, None] - a - c) / s1, (t[:, None] - a - e) / s2)
        return np.where(masks, np.clip(r, 0.0, rmax), 0.0)

    feasible = (masks * rmax).sum(axis=1) >= n
    hi_one = a + b * n + np.maximum(c + d * n, e + f * n)
    hi = np.full(masks.shape[0], float(hi_one.max()) * 1.001 + 1e-9)
    lo = np.zeros(masks.shape[0])
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        enough = rows_at(mid).sum(axis=1) >= n
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    t = np.where(feasible, hi, np.inf)
    return t, rows_at(hi)


def _decision(gpus: list[int], rows: np.ndarray, task: TaskSpec, mode: str,
              path: str, chunk: int) -> Decision:
    total = float(rows.sum())
    shares = [float(r) / total for r in rows]
    shares[-1] = 1.0 - math.fsum(shares[:-1])
    if len(gpus) == 1:
        mode = "single" if mode == "split" else mode
    return Decision(gpus=tuple(gpus), shares=tuple(shares), chunk=chunk,
                    block=DEFAULT_BLOCK, mode=mode, comm_path=path)


def optimum(task: TaskSpec, machine: Machine, telemetry: Snapshot | None = None,
            params: CostParams | None = None) -> Optimum:
    """The best decision for ``task`` on ``machine`` under the cost model.

    Returns:
        An :class:`Optimum` whose decision Gate 1 accepts.

    Raises:
        ValueError: no subset of the usable devices can hold the task.
    """
    start = time.perf_counter()
    usable = [i for i in range(machine.n)
              if telemetry is None or telemetry.healthy[i]]
    n = task.split_size
    k = len(usable)
    masks = np.array([[bool(m >> j & 1) for j in range(k)]
                      for m in range(1, 1 << k)])
    rmax = np.array([_memory_rows(task, machine, i, telemetry) for i in usable])
    is_sum = task.merge == "sum"
    variants = [("host", True)]
    if is_sum and machine.nccl:
        variants.append(("nccl", False))
    if is_sum and any(link.p2p for link in machine.peers.values()):
        variants.append(("p2p", False))
    candidates: list[Decision] = []
    for path, copy_out in variants:
        coef = np.array([split_time_coefficients(task, machine, i, params,
                                                 telemetry, copy_out)
                         for i in usable])
        t, rows = equalised_rows(coef, rmax, masks, n)
        order = np.argsort(t)
        picked = 0
        for s in order:
            if not np.isfinite(t[s]) or picked >= TOP_SUBSETS:
                break
            members = [j for j in range(k) if rows[s, j] > 0]
            if path != "host" and len(members) < 2:
                continue
            if path == "p2p" and not all(
                    (link := machine.peer(usable[x], usable[y])) is not None
                    and link.p2p for x, y in itertools.combinations(members, 2)):
                continue
            picked += 1
            gpus = [usable[j] for j in members]
            r = rows[s, members]
            candidates.append(_decision(gpus, r, task, "split", path, n))
            biggest = int(math.ceil(r.max()))
            for c in PIPELINE_CHUNKS:
                chunk = max(1, math.ceil(biggest / c))
                candidates.append(_decision(gpus, r, task, "pipelined", path, chunk))
    for baseline in (EqualSplit(), ProportionalToPeak()):
        candidates.append(baseline.decide(task, machine, telemetry))
    best: tuple[float, Decision, Prediction] | None = None
    for cand in candidates:
        cand = cand.with_hash(task)
        pred = predict(task, cand, machine, telemetry, params)
        if best is not None and pred.total >= best[0]:
            continue
        if check_decision(cand, task, machine, telemetry).accepted:
            best = (pred.total, cand, pred)
    if best is None:
        raise ValueError(f"no feasible decision for {task.describe()} on "
                         f"{machine.name}: no subset of devices can hold it")
    return Optimum(decision=best[1], prediction=best[2], candidates=len(candidates),
                   seconds=time.perf_counter() - start)


class Oracle:
    """The exhaustive optimum as a policy: the bound every policy is held to,
    not one a runtime could afford on every task (milliseconds a decision)."""

    name = "oracle"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        return optimum(task, machine, telemetry).decision
