"""Calibration: fit Eq. (1)'s efficiencies and latencies to measured runs.

Input: measured executions, each ``{"task": task_json, "decision":
decision_json, "measured_seconds": s, "backend": "cpu"}`` (what
:func:`lib.execution.characterise.characterise` records under ``runs``). A run from the
model backend, or one not marked measured, is refused: a prediction is never
fitted to a prediction.

Fitted, for each device kind on the machine (:class:`CostParams`):

- ``compute_eff[(device kind, workload kind)]`` and ``memory_eff[...]``: e_k
  and e'_k of the roofline;
- ``launch_s[device kind]``: the fixed cost of starting a shard;
- ``link_scale[device kind]``: measured over profile host-link bandwidth.

Method: least squares on log time (so every run counts by its relative error),
made robust with Huber weights (iteratively re-weighted), with
Levenberg-Marquardt over the logarithms of the parameters, numeric Jacobian,
numpy only. A parameter the training runs cannot move (its roofline
limit never binds, say) keeps its uncalibrated default and is *not* listed in
``fitted``; the report says which came from measurement and which did not.

The fit is scored on runs it never saw (a split stratified by workload kind):
median and 90th-percentile absolute percentage error, in percent, and the
Spearman rank correlation of predicted against measured times. Scores use
:func:`lib.costmodel.model.predict` itself, never the fitting shortcut.

Files: :func:`save_params` writes ``<home>/calibration/<machine>.json``
atomically, with ``<home>`` = ``$GPUHIVE_HOME`` or ``~/.gpuhive``;
:func:`load_params` reads it back. :func:`calibrate_machine` goes from a
characterisation file (default ``<home>/characterisation/<machine>.json``) to
saved parameters in one call.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import KINDS, ContractError, Decision, TaskSpec
from lib.costmodel.model import CostParams, default_params, predict
from lib.platform.machines import Machine, load_machine
from lib.platform.workloads import split_rows, workload
from lib.storage import (
    calibration_path,
    characterisation_path,
    write_json_atomic,
)

#: Median held-out APE (percent) above which the report carries a warning.
WARN_APE_PCT = 30.0
#: A parameter whose largest effect on any training run's log time is below
#: this (d log T / d log theta) is not identified by the data: it keeps its
#: default and is not reported as fitted.
MIN_SENSITIVITY = 0.02
#: Weight of a weak pull towards the defaults (per parameter, in log units
#: squared, against a sum of squared log-time residuals). Where the runs pin a
#: value down it is negligible; where two parameters trade off exactly (host-link
#: bandwidth against a kind's memory efficiency when every byte count grows with
#: the same rows) it picks the solution nearest the defaults instead of drifting.
PRIOR_WEIGHT = 1e-3
#: Huber loss on log-time residuals, re-weighted this many times: a run slowed
#: by something else on the machine (timings only ever err long) pulls the fit
#: linearly, not quadratically. k = 1.345 robust standard deviations.
IRLS_ROUNDS = 3
HUBER_K = 1.345
#: Box on the fitted values (efficiencies are relative to profile peaks, which
#: for CPU cores are estimates, so values above 1 are possible and honest).
_BOUNDS = {"compute_eff": (1e-4, 1e3), "memory_eff": (1e-4, 1e3),
           "launch_s": (1e-8, 10.0), "link_scale": (1e-3, 1e3)}
SCHEMA = "gpuhive.calibration/1"


class CalibrationError(ValueError):
    """Runs or files calibration cannot use (the message names the culprit)."""


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
    """

    task: TaskSpec
    decision: Decision
    seconds: float
    backend: str


def parse_runs(runs: Sequence[Mapping[str, Any]],
               machine: Machine) -> list[MeasuredRun]:
    """Check and parse run records; raise :class:`CalibrationError` naming the run."""
    out = []
    for i, run in enumerate(runs):
        where = f"run {i}"
        if not isinstance(run, Mapping):
            raise CalibrationError(f"{where}: expected an object, got "
                                   f"{type(run).__name__}")
        backend = run.get("backend")
        if backend not in ("cpu", "cuda"):
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
        out.append(MeasuredRun(task, decision, float(seconds), backend))
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


# --------------------------------------------------------------------------
# The fit

@dataclass(frozen=True)
class _Slot:
    """Where one fitted number lives in CostParams."""

    table: str            # compute_eff / memory_eff / launch_s / link_scale
    key: Any              # (device kind, kind) or device kind

    @property
    def name(self) -> str:
        key = ",".join(self.key) if isinstance(self.key, tuple) else self.key
        return f"{self.table}[{key}]"


def _get(params: CostParams, slot: _Slot) -> float:
    if slot.table == "compute_eff":
        return params.e(*slot.key)
    if slot.table == "memory_eff":
        return params.e_mem(*slot.key)
    if slot.table == "launch_s":
        return params.launch_s.get(slot.key, 5e-6)
    return params.link_scale.get(slot.key, 1.0)


def _with(params: CostParams, slots: Sequence[_Slot], values: Sequence[float],
          source: str = "", fitted: tuple[str, ...] = ()) -> CostParams:
    tables = {"compute_eff": dict(params.compute_eff),
              "memory_eff": dict(params.memory_eff),
              "launch_s": dict(params.launch_s),
              "link_scale": dict(params.link_scale)}
    for slot, value in zip(slots, values, strict=True):
        tables[slot.table][slot.key] = float(value)
    return CostParams(**tables, source=source or params.source,
                      fitted=fitted or params.fitted)


class _FastModel:
    """Eq. (1) for one set of runs as array arithmetic, for the fit's inner loop.

    Covers ``single``/``split`` decisions whose merge does not run on a device
    (the cpu backend's runs); anything else (pipelined mode, p2p/nccl sums) is
    evaluated through :func:`predict` itself. The shortcut is checked against
    :func:`predict` in the tests; the reported scores never use it.
    """

    def __init__(self, runs: Sequence[MeasuredRun], machine: Machine,
                 slots: Sequence[_Slot], base: CostParams):
        self.runs, self.machine, self.slots, self.base = runs, machine, slots, base
        index = {s: i for i, s in enumerate(slots)}
        cols: dict[str, list[float]] = {k: [] for k in (
            "flops", "traffic", "bin", "bout", "lat_in", "lat_out", "peak", "bw",
            "link_bw", "merge")}
        e_col, m_col, l_col, s_col, owner, self.slow = [], [], [], [], [], []
        fixed: dict[str, list[float]] = {t: [] for t in _BOUNDS}
        for r, run in enumerate(runs):
            task, dec = run.task, run.decision
            k = sum(1 for lo, hi in split_rows(task.split_size, dec.shares) if hi > lo)
            if dec.mode == "pipelined" or (task.merge == "sum" and k > 1
                                           and dec.comm_path != "host"):
                self.slow.append(r)
                continue
            w = workload(task)
            for dev_index, (lo, hi) in zip(dec.gpus, split_rows(task.split_size,
                                                               dec.shares),
                                           strict=True):
                if hi == lo:
                    continue
                dev = machine.devices[dev_index]
                link = machine.host_link(dev_index)
                work = w.work(task, hi - lo)
                cols["flops"].append(work.flops)
                cols["traffic"].append(work.mem_traffic)
                cols["bin"].append(work.bytes_in)
                cols["bout"].append(work.bytes_out)
                cols["lat_in"].append(link.latency if work.bytes_in > 0 else 0.0)
                cols["lat_out"].append(link.latency if work.bytes_out > 0 else 0.0)
                cols["peak"].append(dev.peak_flops(task.dtype))
                cols["bw"].append(dev.mem_bw)
                cols["link_bw"].append(link.bandwidth)
                e_col.append(index.get(_Slot("compute_eff", (dev.kind, task.kind)),
                                       -1))
                m_col.append(index.get(_Slot("memory_eff", (dev.kind, task.kind)),
                                       -1))
                l_col.append(index.get(_Slot("launch_s", dev.kind), -1))
                s_col.append(index.get(_Slot("link_scale", dev.kind), -1))
                # Values of entries that are not fitted (never change).
                for table, key in (("compute_eff", (dev.kind, task.kind)),
                                   ("memory_eff", (dev.kind, task.kind)),
                                   ("launch_s", dev.kind), ("link_scale", dev.kind)):
                    fixed[table].append(_get(base, _Slot(table, key)))
                owner.append(r)
            # Host merges cost k * bytes / host memory bandwidth: no parameter.
            cols["merge"].append(0.0)
            if task.merge == "sum" and k > 1:
                cols["merge"][-1] = k * w.work(task, 1).bytes_out / machine.host_mem_bw
        self.cols = {k: np.asarray(v, float) for k, v in cols.items() if k != "merge"}
        self.merge = np.asarray(cols["merge"], float)
        self.e_col, self.m_col = np.asarray(e_col), np.asarray(m_col)
        self.l_col, self.s_col = np.asarray(l_col), np.asarray(s_col)
        self.owner = np.asarray(owner, int)
        self.defaults = {t: np.asarray(v, float) for t, v in fixed.items()}
        self.fast = [r for r in range(len(runs)) if r not in set(self.slow)]
        # reduceat needs each run's first row; runs are contiguous in owner.
        self.starts = np.searchsorted(self.owner, np.asarray(self.fast, int))

    def predict(self, values: np.ndarray) -> np.ndarray:
        """Predicted seconds of every run with ``values`` in the fitted slots."""
        out = np.empty(len(self.runs))
        if self.fast:
            c = self.cols

            def pick(col: np.ndarray, default: np.ndarray) -> np.ndarray:
                return np.where(col >= 0, values[np.maximum(col, 0)], default)

            d = self.defaults
            e = pick(self.e_col, d["compute_eff"])
            em = pick(self.m_col, d["memory_eff"])
            launch = pick(self.l_col, d["launch_s"])
            scale = pick(self.s_col, d["link_scale"])
            bw = c["link_bw"] * scale
            t = (launch + c["lat_in"] + c["bin"] / bw + c["lat_out"] + c["bout"] / bw
                 + np.maximum(c["flops"] / (c["peak"] * e),
                              c["traffic"] / (c["bw"] * em)))
            out[self.fast] = np.maximum.reduceat(t, self.starts) + self.merge
        if self.slow:
            full = _with(self.base, self.slots, values)
            for r in self.slow:
                run = self.runs[r]
                out[r] = predict(run.task, run.decision, self.machine, None,
                                 full).total
        return out


def _slots_for(machine: Machine, runs: Sequence[MeasuredRun]) -> list[_Slot]:
    dev_kinds = sorted({machine.devices[g].kind for r in runs for g in r.decision.gpus})
    kinds = [k for k in KINDS if any(r.task.kind == k for r in runs)]
    slots = []
    for dk in dev_kinds:
        for k in kinds:
            slots += [_Slot("compute_eff", (dk, k)), _Slot("memory_eff", (dk, k))]
        slots += [_Slot("launch_s", dk), _Slot("link_scale", dk)]
    return slots


def _levenberg_marquardt(residual, theta: np.ndarray, lo: np.ndarray,
                         hi: np.ndarray, free: np.ndarray,
                         iters: int = 200) -> np.ndarray:
    """Minimise ``|residual(theta)|^2`` over the ``free`` coordinates in a box."""
    theta = np.clip(theta, lo, hi)
    r = residual(theta)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(iters):
        jac = _jacobian(residual, theta, r, free)
        g = jac.T @ r
        h = jac.T @ jac
        improved = False
        for _ in range(12):
            a = h + lam * (np.diag(np.diag(h)) + 1e-9 * np.eye(len(h)))
            step = np.zeros_like(theta)
            step[free] = np.linalg.solve(a, -g)
            trial = np.clip(theta + step, lo, hi)
            rt = residual(trial)
            ct = float(rt @ rt)
            if ct < cost:
                improved = cost - ct > 1e-12 * max(cost, 1e-30)
                theta, r, cost = trial, rt, ct
                lam = max(lam / 5, 1e-9)
                break
            lam *= 5
        if not improved:
            break
    return theta


def _jacobian(residual, theta: np.ndarray, r: np.ndarray,
              free: np.ndarray, h: float = 1e-5) -> np.ndarray:
    cols = []
    for p in np.flatnonzero(free):
        t = theta.copy()
        t[p] += h
        cols.append((residual(t) - r) / h)
    return np.stack(cols, axis=1) if cols else np.zeros((len(r), 0))


def _huber_weights(r: np.ndarray) -> np.ndarray:
    """Huber weights ``min(1, k s / |r|)``, s the residuals' scaled MAD."""
    scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    if scale <= 0:
        return np.ones_like(r)
    return np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(r), 1e-300))


def fit_params(machine: Machine, runs: Sequence[MeasuredRun],
               base: CostParams | None = None
               ) -> tuple[CostParams, tuple[str, ...], dict[str, float]]:
    """Least-squares fit of log time; returns (params, fitted names, rel. s.e.).

    Unidentified parameters (sensitivity below :data:`MIN_SENSITIVITY`) are
    reset to ``base`` and frozen, and the fit repeated, until the set is stable.
    The relative standard errors come from the Gauss-Newton covariance
    ``s^2 (J^T J)^-1`` at the optimum (a large one means the data pin the value
    down only weakly, e.g. two parameters that trade off against each other).
    """
    base = base or default_params()
    slots = _slots_for(machine, runs)
    if not slots or not runs:
        raise CalibrationError("no runs to fit")
    fast = _FastModel(runs, machine, slots, base)
    measured = np.log([r.seconds for r in runs])
    start = np.log([_get(base, s) for s in slots])
    lo = np.log([_BOUNDS[s.table][0] for s in slots])
    hi = np.log([_BOUNDS[s.table][1] for s in slots])

    def data_residual(theta: np.ndarray) -> np.ndarray:
        return np.log(fast.predict(np.exp(theta))) - measured

    weights = np.ones(len(runs))

    def residual(theta: np.ndarray) -> np.ndarray:
        prior = math.sqrt(PRIOR_WEIGHT) * (theta - start)[free]
        return np.concatenate([np.sqrt(weights) * data_residual(theta), prior])

    free = np.ones(len(slots), bool)
    theta = start.copy()
    for _ in range(4):
        for _ in range(IRLS_ROUNDS):
            theta = _levenberg_marquardt(residual, theta, lo, hi, free)
            weights = _huber_weights(data_residual(theta))
        sens = np.abs(_jacobian(data_residual, theta, data_residual(theta),
                                np.ones(len(slots), bool))).max(axis=0)
        weak = free & (sens < MIN_SENSITIVITY)
        if not weak.any():
            break
        free &= ~weak
        theta[~free] = start[~free]
    r = data_residual(theta)
    jac = _jacobian(data_residual, theta, r, free)
    dof = max(1, len(r) - int(free.sum()))
    s2 = float(r @ r) / dof
    try:
        h = jac.T @ jac
        # A tiny ridge instead of a pseudo-inverse: a direction the data do not
        # see gets an enormous variance rather than a silently small one.
        cov = s2 * np.linalg.inv(h + 1e-12 * (np.trace(h) + 1e-30)
                                 * np.eye(len(h)))
        rel = np.sqrt(np.maximum(np.diag(cov), 0.0))   # s.e. of log = rel. s.e.
    except np.linalg.LinAlgError:
        rel = np.full(int(free.sum()), math.inf)
    names = tuple(s.name for s, f in zip(slots, free, strict=True) if f)
    uncertainty = {n: float(v) for n, v in zip(names, rel, strict=True)}
    values = [math.exp(t) if f else _get(base, s)
              for s, t, f in zip(slots, theta, free, strict=True)]
    return _with(base, slots, values, fitted=names), names, uncertainty


# --------------------------------------------------------------------------
# The report

@dataclass
class CalibrationReport:
    """How well the calibrated Eq. (1) predicts measured runs it never saw.

    Attributes:
        machine: machine name.
        params: the fitted parameters (fitted on the training runs only).
        fitted: names of the parameters that came from measurement, e.g.
            ``"compute_eff[cpu,matmul]"``; every other entry of ``params`` is
            the uncalibrated default.
        not_fitted: the defaults kept, for the machine's device kinds.
        n_train, n_heldout: runs fitted, runs scored.
        median_ape_pct, p90_ape_pct: held-out absolute percentage error, in
            percent (50th and 90th percentile).
        spearman: held-out rank correlation of predicted and measured seconds.
        train_median_ape_pct: the same error on the training runs.
        evaluated_on: ``"held-out runs"`` or ``"training runs"`` (holdout 0).
        warning: non-empty when the median APE exceeds :data:`WARN_APE_PCT`.
        notes: what the fit could not capture, measured from its residuals.
        uncertainty: fitted name -> relative standard error of the value.
        per_kind: workload kind -> held-out run count and median APE (percent).
        groups: group -> median signed error (percent, predicted over measured)
            over all runs, to expose structure Eq. (1) misses.
        heldout: one row per held-out run: task, decision, measured and
            predicted seconds, APE.
    """

    machine: str
    params: CostParams
    fitted: tuple[str, ...]
    not_fitted: tuple[str, ...]
    n_train: int
    n_heldout: int
    median_ape_pct: float
    p90_ape_pct: float
    spearman: float
    train_median_ape_pct: float
    evaluated_on: str
    warning: str = ""
    notes: list[str] = field(default_factory=list)
    uncertainty: dict[str, float] = field(default_factory=dict)
    per_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    groups: dict[str, float] = field(default_factory=dict)
    heldout: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (NaN written as null)."""
        return _finite({
            "label": "PREDICTED (calibrated model) against MEASURED runs",
            "machine": self.machine, "evaluated_on": self.evaluated_on,
            "n_train": self.n_train, "n_heldout": self.n_heldout,
            "median_ape": self.median_ape_pct, "p90_ape": self.p90_ape_pct,
            "ape_unit": "percent",
            "median_ape_pct": self.median_ape_pct, "p90_ape_pct": self.p90_ape_pct,
            "spearman": self.spearman,
            "train_median_ape_pct": self.train_median_ape_pct,
            "warning": self.warning, "notes": list(self.notes),
            "fitted": list(self.fitted), "not_fitted": list(self.not_fitted),
            "uncertainty": dict(self.uncertainty), "per_kind": self.per_kind,
            "groups": self.groups, "params": params_to_json(self.params),
            "heldout": self.heldout,
        })

    def summary(self) -> str:
        """A few lines for the command line and notebooks."""
        lines = [f"calibration of {self.machine}: {len(self.fitted)} parameters "
                 f"fitted on {self.n_train} MEASURED runs, scored on "
                 f"{self.n_heldout} {self.evaluated_on}",
                 f"  median APE {self.median_ape_pct:.1f} %   p90 APE "
                 f"{self.p90_ape_pct:.1f} %   Spearman {self.spearman:.3f}"]
        if self.warning:
            lines.append(f"  WARNING: {self.warning}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def calibrate(machine: Machine | str, runs: Sequence[Mapping[str, Any]], *,
              holdout: float = 0.3, seed: int = 0,
              base: CostParams | None = None) -> CalibrationReport:
    """Fit the machine's CostParams to measured runs and score them on held-out runs.

    Args:
        machine: the machine the runs were measured on (or its name).
        runs: measured run records (see the module docstring).
        holdout: fraction of each kind's runs held out for scoring, [0, 1).
        seed: seed of the split.
        base: starting values and the defaults of unfitted entries
            (:func:`default_params` if None).

    Returns:
        A :class:`CalibrationReport`; its ``params`` were fitted on the
        training runs only, so the held-out scores describe them.
    """
    machine = load_machine(machine)
    parsed = parse_runs(runs, machine)
    if len(parsed) < 2:
        raise CalibrationError(f"calibration needs at least 2 measured runs, got "
                               f"{len(parsed)}")
    train, held = holdout_split(parsed, holdout, seed)
    params, fitted, uncertainty = fit_params(machine, [parsed[i] for i in train],
                                             base)
    params = _with(params, [], [], source=f"calibrated on {machine.name} "
                   f"({len(train)} measured runs)", fitted=fitted)
    pred = np.array([predict(r.task, r.decision, machine, None, params).total
                     for r in parsed])
    meas = np.array([r.seconds for r in parsed])
    scored = held or train
    ape = ape_pct(pred[scored], meas[scored])
    report = CalibrationReport(
        machine=machine.name, params=params, fitted=fitted,
        not_fitted=tuple(s.name for s in _slots_for(machine, parsed)
                         if s.name not in fitted),
        n_train=len(train), n_heldout=len(held),
        median_ape_pct=float(np.median(ape)),
        p90_ape_pct=float(np.percentile(ape, 90)),
        spearman=spearman(pred[scored], meas[scored]),
        train_median_ape_pct=float(np.median(ape_pct(pred[train], meas[train]))),
        evaluated_on="held-out runs" if held else "training runs",
        uncertainty=uncertainty)
    report.per_kind = {
        k: {"n_heldout": len(ix), "median_ape_pct": float(np.median(
            ape_pct(pred[ix], meas[ix])))}
        for k in KINDS if (ix := [i for i in scored if parsed[i].task.kind == k])}
    report.groups = _group_bias(parsed, pred, meas)
    report.heldout = [{"task": parsed[i].task.to_json(),
                       "decision": parsed[i].decision.to_json(),
                       "measured_seconds": float(meas[i]),
                       "predicted_seconds": float(pred[i]),
                       "ape_pct": float(ape_pct([pred[i]], [meas[i]])[0])}
                      for i in held]
    report.notes = _notes(report, uncertainty)
    if report.median_ape_pct > WARN_APE_PCT:
        report.warning = (f"median APE {report.median_ape_pct:.1f} % exceeds "
                          f"{WARN_APE_PCT:.0f} %: the calibrated model does not "
                          f"describe {machine.name}; do not trust its predictions")
    return report


def _group_bias(runs: Sequence[MeasuredRun], pred: np.ndarray,
                meas: np.ndarray) -> dict[str, float]:
    """Median signed error (percent) per kind, device count and size third."""
    signed = 100.0 * (pred / meas - 1.0)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        active = sum(1 for lo, hi in split_rows(r.task.split_size, r.decision.shares)
                     if hi > lo)
        groups.setdefault(f"kind={r.task.kind}", []).append(i)
        groups.setdefault(f"devices={active}", []).append(i)
    order = np.argsort(meas)
    for name, part in zip(("shortest third", "middle third", "longest third"),
                          np.array_split(order, 3), strict=True):
        groups[f"time={name}"] = [int(i) for i in part]
    return {g: float(np.median(signed[ix])) for g, ix in groups.items() if ix}


def _notes(report: CalibrationReport, uncertainty: Mapping[str, float]) -> list[str]:
    notes = [f"{len(report.not_fitted)} parameter(s) not identified by these runs "
             f"kept their uncalibrated defaults: {', '.join(report.not_fitted)}"] \
        if report.not_fitted else []
    for group, bias in report.groups.items():
        if abs(bias) > 15.0:
            side = "over" if bias > 0 else "under"
            notes.append(f"Eq. (1) {side}-predicts the {group} runs by "
                         f"{abs(bias):.0f} % (median): structure the fitted "
                         f"parameters cannot capture")
    loose = [f"{n} (+-{100 * v:.0f} %)" for n, v in uncertainty.items() if v > 0.5]
    if loose:
        notes.append("weakly determined by the data (they trade off against "
                     "others): " + ", ".join(loose))
    return notes


# --------------------------------------------------------------------------
# Files

def params_to_json(params: CostParams) -> dict[str, Any]:
    """CostParams as nested JSON: ``{"compute_eff": {"cpu": {"matmul": 0.5}}}``."""
    def nest(table: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (dk, k), v in sorted(table.items()):
            out.setdefault(dk, {})[k] = float(v)
        return out
    return {"compute_eff": nest(params.compute_eff),
            "memory_eff": nest(params.memory_eff),
            "launch_s": {k: float(v) for k, v in sorted(params.launch_s.items())},
            "link_scale": {k: float(v) for k, v in sorted(params.link_scale.items())},
            "source": params.source, "fitted": list(params.fitted)}


def params_from_json(obj: Mapping[str, Any], where: str = "params") -> CostParams:
    """Inverse of :func:`params_to_json`; raises CalibrationError naming the field."""
    def number(v: Any, name: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(v) or v <= 0:
            raise CalibrationError(f"{where}: {name} must be a positive number, "
                                   f"got {v!r}")
        return float(v)

    try:
        tables = {}
        for t in ("compute_eff", "memory_eff"):
            tables[t] = {(dk, k): number(v, f"{t}.{dk}.{k}")
                         for dk, row in obj[t].items() for k, v in row.items()}
        for t in ("launch_s", "link_scale"):
            tables[t] = {dk: number(v, f"{t}.{dk}") for dk, v in obj[t].items()}
        return CostParams(**tables, source=str(obj.get("source", "file")),
                          fitted=tuple(str(n) for n in obj.get("fitted", ())))
    except (KeyError, AttributeError, TypeError) as exc:
        raise CalibrationError(f"{where}: malformed ({exc!r})") from None


def save_params(machine_name: str, params: CostParams,
                report: CalibrationReport | None = None) -> Path:
    """Write the calibrated parameters (and their report) atomically.

    Returns:
        The path written, ``<home>/calibration/<machine>.json``.
    """
    obj = {"schema": SCHEMA, "machine": machine_name,
           "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "params": params_to_json(params),
           "report": report.to_json() if report is not None else None}
    return write_json_atomic(obj, calibration_path(machine_name))


def load_params(machine_name: str) -> CostParams | None:
    """The saved calibrated parameters of a machine, or None if never calibrated.

    Raises:
        CalibrationError: the file exists but cannot be read as parameters.
    """
    path = calibration_path(machine_name)
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(obj, Mapping) or obj.get("schema") != SCHEMA:
        raise CalibrationError(f"{path}: not a {SCHEMA} file")
    return params_from_json(obj.get("params"), str(path))


def calibrate_machine(machine_name: str,
                      characterisation_path_: str | Path | None = None,
                      json_out: bool = False, *, holdout: float = 0.3,
                      seed: int = 0) -> CalibrationReport | dict[str, Any]:
    """Characterisation file -> fitted, scored and saved parameters.

    Args:
        machine_name: the machine (``local-cpu``).
        characterisation_path_: the JSON :func:`lib.execution.characterise.characterise`
            wrote; default ``<home>/characterisation/<machine>.json``.
        json_out: return ``report.to_json()`` instead of the report object.

    Raises:
        CalibrationError: no characterisation file, or one for another machine.
    """
    path = Path(characterisation_path_ or characterisation_path(machine_name))
    if not path.is_file():
        raise CalibrationError(f"no characterisation of {machine_name} at {path}; "
                               f"run: gpuhive characterise --machine {machine_name}")
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(obj, Mapping) or "runs" not in obj:
        raise CalibrationError(f"{path}: no 'runs' list (not a characterisation)")
    if obj.get("machine", machine_name) != machine_name:
        raise CalibrationError(f"{path} characterises {obj.get('machine')!r}, "
                               f"not {machine_name!r}")
    report = calibrate(load_machine(machine_name), obj["runs"], holdout=holdout,
                       seed=seed)
    save_params(machine_name, report.params, report)
    return report.to_json() if json_out else report
