"""Measured runs as calibration reads them, their held-out split, and the
statistics a calibration is scored with (APE, Spearman's rank correlation).

A run taken under load is not thrown away: where its record says what capacity
each device had (``disturbance.capacity``, written by characterisation), the
model predicts it at that capacity (compute time / capacity), as it would a
live snapshot's (:meth:`MeasuredRun.snapshot`). Runs without the field (older
files) are predicted at full capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.contract import KINDS, MEASURING_BACKENDS, ContractError, Decision, TaskSpec
from lib.costmodel.contention import (
    CONTENDED_CAPACITY,
    calibrated_bursts,
    effective_snapshot,
)
from lib.costmodel.model import CostParams
from lib.costmodel.parameters import CalibrationError
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot

# --------------------------------------------------------------------------
# Statistics

def average_ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of ``x``; tied values share the average of their ranks."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of average ranks).

    NaN when fewer than two pairs or when either side is constant.
    """
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} values against {len(b)}")
    if len(a) < 2:
        return math.nan
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / denom if denom > 0 else math.nan


def ape_pct(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """Absolute percentage errors ``100 |p - m| / m``."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    return 100.0 * np.abs(p - m) / m


# --------------------------------------------------------------------------
# Runs

@dataclass(frozen=True)
class MeasuredRun:
    """One measured execution, parsed.

    Attributes:
        task, decision: what ran.
        seconds: measured end-to-end seconds (MEASURED).
        backend: the measuring backend (``cpu`` or ``cuda``).
        capacity: device index -> the share of it the run had (MEASURED, from
            the record's ``disturbance``); None where the record does not say.
        occasion: which of the characterisations pooled in one call took the
            run, numbered in the order they first appear (the record's
            ``occasion``; records without one share an occasion of their own).
    """

    task: TaskSpec
    decision: Decision
    seconds: float
    backend: str
    capacity: Mapping[int, float] | None = None
    occasion: int = 0

    def snapshot(self, machine: Machine,
                 params: CostParams | None = None) -> Snapshot | None:
        """The run's capacity as telemetry for :func:`predict` (None without):
        where ``params`` carry a calibrated burst (``burst_s``), the capacity
        a shard of this task effectively gets
        (:func:`lib.costmodel.contention.calibrated_bursts`), as the runtime
        hands it to a policy."""
        if not self.capacity:
            return None
        n = machine.n
        snap = Snapshot(source="characterisation", utilisation=(0.0,) * n,
                        free_bytes=tuple(d.mem_bytes for d in machine.devices),
                        healthy=(True,) * n, measured=True,
                        capacity=tuple(self.capacity.get(i, 1.0) for i in range(n)),
                        capacity_provenance=("recorded with the run",) * n)
        if params is None or not params.burst_s:
            return snap
        return effective_snapshot(self.task, machine, snap, params,
                                  calibrated_bursts(machine, params))


def _run_capacity(run: Mapping[str, Any], where: str,
                  machine: Machine) -> dict[int, float] | None:
    """``disturbance.capacity`` of a run record, checked (None if absent)."""
    dist = run.get("disturbance")
    if dist is None:
        return None
    table = dist.get("capacity") if isinstance(dist, Mapping) else None
    if not isinstance(table, Mapping):
        raise CalibrationError(f"{where}: disturbance has no capacity table")
    out = {}
    for dev, cap in table.items():
        try:
            index = int(dev)
        except (TypeError, ValueError):
            raise CalibrationError(f"{where}: disturbance names device {dev!r}") \
                from None
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) \
                or not 0.0 < cap <= 1.0 or not 0 <= index < machine.n:
            raise CalibrationError(f"{where}: capacity of device {dev} must be in "
                                   f"(0, 1] on an existing device, got {cap!r}")
        out[index] = float(cap)
    return out


def parse_runs(runs: Sequence[Mapping[str, Any]],
               machine: Machine) -> list[MeasuredRun]:
    """Check and parse run records; raise :class:`CalibrationError` naming the run."""
    out = []
    occasions: dict[str | None, int] = {}
    for i, run in enumerate(runs):
        where = f"run {i}"
        if not isinstance(run, Mapping):
            raise CalibrationError(f"{where}: expected an object, got "
                                   f"{type(run).__name__}")
        backend = run.get("backend")
        if backend not in MEASURING_BACKENDS:
            raise CalibrationError(
                f"{where}: backend {backend!r} is not a measuring backend (cpu or "
                "cuda); calibration fits measurements only, never predictions")
        if run.get("measured", True) is not True \
                or run.get("provenance", "measured") != "measured":
            raise CalibrationError(f"{where}: not marked measured")
        seconds = run.get("measured_seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not math.isfinite(seconds) or seconds <= 0:
            raise CalibrationError(f"{where}: measured_seconds must be a positive "
                                   f"number, got {seconds!r}")
        try:
            task = TaskSpec.from_json(run["task"])
            decision = Decision.from_json(run["decision"])
        except KeyError as exc:
            raise CalibrationError(f"{where}: missing field {exc.args[0]!r}") from None
        except ContractError as exc:
            raise CalibrationError(f"{where}: {exc}") from None
        bad = [g for g in decision.gpus if g >= machine.n]
        if bad or len(decision.gpus) != len(decision.shares) or not decision.gpus:
            raise CalibrationError(f"{where}: decision names device(s) {bad or '?'} "
                                   f"that machine {machine.name} ({machine.n} "
                                   "devices) does not have")
        occasion = run.get("occasion")
        if occasion is not None and not (isinstance(occasion, str) and occasion):
            raise CalibrationError(f"{where}: occasion must be a non-empty string "
                                   f"(the characterisation's), got {occasion!r}")
        out.append(MeasuredRun(task, decision, float(seconds), backend,
                               _run_capacity(run, where, machine),
                               occasions.setdefault(occasion, len(occasions))))
    return out


def holdout_split(runs: Sequence[MeasuredRun], holdout: float,
                  seed: int) -> tuple[list[int], list[int]]:
    """Indices (train, held-out), stratified by workload kind, seeded.

    Each kind keeps at least one training run; ``holdout=0`` holds none out.
    """
    if not 0.0 <= holdout < 1.0:
        raise CalibrationError(f"holdout must be in [0, 1), got {holdout}")
    rng = np.random.default_rng(seed)
    train, held = [], []
    for kind in KINDS:
        idx = [i for i, r in enumerate(runs) if r.task.kind == kind]
        if not idx:
            continue
        idx = [idx[j] for j in rng.permutation(len(idx))]
        n_held = min(len(idx) - 1, int(round(holdout * len(idx))))
        held += idx[:n_held]
        train += idx[n_held:]
    return sorted(train), sorted(held)


def cv_folds(runs: Sequence[MeasuredRun], folds: int, seed: int) -> list[int]:
    """The fold (``0 .. folds - 1``) of each run for k-fold cross-validation,
    stratified by workload kind and seeded: each kind's runs, shuffled, are
    dealt to the folds in turn, so every fold holds about 1/k of each kind."""
    if folds < 2:
        raise CalibrationError(f"cross-validation needs at least 2 folds, got {folds}")
    rng = np.random.default_rng(seed)
    fold = [0] * len(runs)
    for kind in dict.fromkeys(r.task.kind for r in runs):
        idx = [i for i, r in enumerate(runs) if r.task.kind == kind]
        for j, i in enumerate(idx[k] for k in rng.permutation(len(idx))):
            fold[i] = j % folds
    return fold


def alone_on_each(runs: Sequence[MeasuredRun], machine: Machine,
                  busy_below: float = CONTENDED_CAPACITY) -> list[dict[str, Any]]:
    """The same task run alone on a busy device and alone on a free one of the
    same kind, taken from ``runs`` (one characterisation under induced load
    holds both): what load did to it, with no model in between (MEASURED).

    A device is busy in a run whose recorded capacity there is below
    ``busy_below`` (the threshold the history's contention samples use),
    free where it is at least that (or not recorded). Where a
    task has several runs of one sort, the first is taken.

    Returns:
        One row per task that has both, in the order the busy runs come:
        ``task`` (its short form), ``kind``, ``device_kind``, ``free_seconds``,
        ``busy_seconds``, ``capacity`` (the busy device's), ``slowdown``
        (busy over free) and ``capacity_says`` (``1 / capacity``, the slowdown
        Eq. (1) divides by).
    """
    free: dict[tuple[str, str], MeasuredRun] = {}
    busy: list[tuple[tuple[str, str], MeasuredRun, float]] = []
    for run in runs:
        active = [g for g, s in zip(run.decision.gpus, run.decision.shares,
                                    strict=True) if s > 0]
        if len(active) != 1:
            continue
        device = active[0]
        key = (run.task.describe(), machine.devices[device].kind)
        capacity = (run.capacity or {}).get(device, 1.0)
        if capacity < busy_below:
            busy.append((key, run, capacity))
        else:
            free.setdefault(key, run)
    out, seen = [], set()
    for key, run, capacity in busy:
        if key in seen or key not in free:
            continue
        seen.add(key)
        alone = free[key].seconds
        out.append({"task": key[0], "kind": run.task.kind, "device_kind": key[1],
                    "free_seconds": alone, "busy_seconds": run.seconds,
                    "capacity": capacity, "slowdown": run.seconds / alone,
                    "capacity_says": 1.0 / capacity})
    return out
