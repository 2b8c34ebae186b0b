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
- ``link_scale[device kind]``: measured over profile host-link bandwidth;
- ``latency_scale[device kind]``: measured over profile host-link latency
  (with the launch, one fixed cost per shard where every shard copies in and
  out once: the fit then splits it nearest the defaults);
- where the runs tell them: the host's cost per shard, co-running slowdown,
  the cache's multiple and the cache size the runs see
  (:mod:`lib.costmodel.fit`), and how load slows a device.

A run recorded under load (its ``disturbance.capacity``, from
characterisation) is fitted and scored as predicted at the capacity it had:
compute time / capacity. Older runs without it count at full capacity.

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

One split of a few dozen runs gives a median that moves by several points
with the seed of the split. So the report also cross-validates the fit
(``folds``, 5 by default): the runs are dealt into k folds stratified by kind,
each fold is predicted by a fit to the other k - 1, and the error is taken
over every run, each predicted once by a fit that never saw it
(:attr:`CalibrationReport.cross_validation`). The saved parameters are still
the ones fitted on the training runs of the split.

Runs pooled from several characterisations (each run's ``occasion``) are
fitted with a pace for each occasion after the first, the factor its runs'
times take (:attr:`CalibrationReport.paces`), and scored with it: a run
held out of an occasion is predicted at the pace the occasion's other runs
gave it. The saved parameters are the first occasion's.

The fit itself is :mod:`lib.costmodel.fit`; the saved parameters are
:mod:`lib.costmodel.parameters`. :func:`calibrate_machine` goes from a
characterisation file (default ``<home>/characterisation/<machine>.json``) to
saved parameters in one call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import KINDS
from lib.costmodel.fit import fit_params, params_with, slots_for
from lib.costmodel.model import CostParams, predict
from lib.costmodel.parameters import (
    CalibrationError,
    load_params,  # noqa: F401  (importers move to lib.costmodel.parameters)
    params_for,  # noqa: F401
    params_to_json,
    save_params,
)
from lib.costmodel.runs import (
    MeasuredRun,
    ape_pct,
    cv_folds,
    holdout_split,
    parse_runs,
    spearman,
)
from lib.platform.machines import Machine, load_machine
from lib.platform.workloads import split_rows
from lib.storage import characterisation_path

#: Median held-out APE (percent) above which the report carries a warning.
WARN_APE_PCT = 30.0
#: What the calibrated model should reach on a real machine, median APE in
#: percent: on held-out runs of a quiet machine, and on runs taken while a
#: process of someone else keeps one device's core busy.
QUIET_APE_GOAL_PCT = 10.0
LOADED_APE_GOAL_PCT = 15.0


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
    by_load: dict[str, dict[str, float]] = field(default_factory=dict)
    """``quiet`` and ``loaded`` held-out runs apart (loaded: a recorded
    capacity below 0.9 on a device the run used): count and median APE."""
    paces: dict[int, float] = field(default_factory=dict)
    """Where the runs pooled several characterisations (occasions, numbered
    in the order their runs first came): each later occasion -> the factor
    its runs' times took against the first's, fitted with the rest
    (:func:`lib.costmodel.fit.pace_slots`); ``params`` are the first
    occasion's. Empty with one occasion."""
    cross_validation: dict[str, Any] = field(default_factory=dict)
    """k-fold cross-validation over every run (empty with ``folds=0``):
    ``folds``, ``runs``, ``median_ape_pct``, ``p90_ape_pct``, ``spearman``
    and ``by_load`` as above, every run predicted by a fit that never saw it."""

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
            "heldout": self.heldout, "by_load": self.by_load,
            "paces": {str(k): v for k, v in self.paces.items()},
            "cross_validation": self.cross_validation,
        })

    def summary(self) -> str:
        """A few lines for the command line and notebooks."""
        lines = [f"calibration of {self.machine}: {len(self.fitted)} parameters "
                 f"fitted on {self.n_train} MEASURED runs, scored on "
                 f"{self.n_heldout} {self.evaluated_on}",
                 f"  median APE {self.median_ape_pct:.1f} %   p90 APE "
                 f"{self.p90_ape_pct:.1f} %   Spearman {self.spearman:.3f}"]
        if len(self.by_load) > 1:
            lines.append("  " + "   ".join(
                f"{name} ({row['n']:.0f} runs): median APE "
                f"{row['median_ape_pct']:.1f} %" for name, row in self.by_load.items()))
        cv = self.cross_validation
        if cv:
            apart = "".join(f", {name} {row['median_ape_pct']:.1f} %"
                            for name, row in cv["by_load"].items()) \
                if len(cv["by_load"]) > 1 else ""
            lines.append(f"  {cv['folds']}-fold cross-validation (each of "
                         f"{cv['runs']} runs predicted by a fit without it): "
                         f"median APE {cv['median_ape_pct']:.1f} %{apart}")
        if self.paces:
            lines.append("  the runs came from several characterisations; against "
                         "the first, the later ones' runs took " + ", ".join(
                             f"{p:.2f}x (characterisation {k + 1})"
                             for k, p in self.paces.items())
                         + " the time (fitted; the parameters are the first's)")
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
              base: CostParams | None = None, folds: int = 5) -> CalibrationReport:
    """Fit the machine's CostParams to measured runs and score them on held-out runs.

    Args:
        machine: the machine the runs were measured on (or its name).
        runs: measured run records (see the module docstring).
        holdout: fraction of each kind's runs held out for scoring, [0, 1).
        seed: seed of the split.
        base: starting values and the defaults of unfitted entries
            (:func:`default_params` if None).
        folds: k of the cross-validation (0: none; at most one fold per run).

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
    params, fitted, uncertainty, paces = fit_params(
        machine, [parsed[i] for i in train], base)
    params = params_with(params, [], [], source=f"calibrated on {machine.name} "
                   f"({len(train)} measured runs)", fitted=fitted)
    pred = _predicted(machine, parsed, params, paces)
    meas = np.array([r.seconds for r in parsed])
    scored = held or train
    ape = ape_pct(pred[scored], meas[scored])
    report = CalibrationReport(
        machine=machine.name, params=params, fitted=fitted,
        not_fitted=tuple(s.name for s in slots_for(machine, parsed, params)
                         if s.name not in fitted),
        n_train=len(train), n_heldout=len(held),
        median_ape_pct=float(np.median(ape)),
        p90_ape_pct=float(np.percentile(ape, 90)),
        spearman=spearman(pred[scored], meas[scored]),
        train_median_ape_pct=float(np.median(ape_pct(pred[train], meas[train]))),
        evaluated_on="held-out runs" if held else "training runs",
        uncertainty=uncertainty, paces=paces)
    report.per_kind = {
        k: {"n_heldout": len(ix), "median_ape_pct": float(np.median(
            ape_pct(pred[ix], meas[ix])))}
        for k in KINDS if (ix := [i for i in scored if parsed[i].task.kind == k])}
    report.groups = _group_bias(parsed, pred, meas)
    report.by_load = _by_load([parsed[i] for i in scored], ape)
    report.heldout = [{"task": parsed[i].task.to_json(),
                       "decision": parsed[i].decision.to_json(),
                       "measured_seconds": float(meas[i]),
                       "predicted_seconds": float(pred[i]),
                       "ape_pct": float(ape_pct([pred[i]], [meas[i]])[0])}
                      for i in held]
    if folds and len(parsed) >= 2 * max(2, folds):
        report.cross_validation = cross_validate(machine, parsed, folds, seed, base)
    report.notes = _cache_notes(machine, params) + _notes(report, uncertainty)
    if report.median_ape_pct > WARN_APE_PCT:
        report.warning = (f"median APE {report.median_ape_pct:.1f} % exceeds "
                          f"{WARN_APE_PCT:.0f} %: the calibrated model does not "
                          f"describe {machine.name}; do not trust its predictions")
    return report


def _predicted(machine: Machine, runs: Sequence[MeasuredRun], params: CostParams,
               paces: Mapping[int, float] | None = None) -> np.ndarray:
    """Each run's predicted seconds at the capacity recorded with it, times
    its occasion's pace where the fit gave it one (the first occasion's, and
    an occasion the fit did not see, are predicted at 1)."""
    paces = paces or {}
    return np.array([predict(r.task, r.decision, machine,
                             r.snapshot(machine, params), params).total
                     * paces.get(r.occasion, 1.0) for r in runs])


def cross_validate(machine: Machine, runs: Sequence[MeasuredRun], folds: int,
                   seed: int, base: CostParams | None = None) -> dict[str, Any]:
    """k-fold cross-validation of the fit (:func:`cv_folds`): every run is
    predicted, by :func:`predict`, with parameters fitted to the other folds."""
    fold = cv_folds(runs, folds, seed)
    pred = np.empty(len(runs))
    for f in range(folds):
        params, _, _, paces = fit_params(
            machine, [r for r, k in zip(runs, fold, strict=True) if k != f], base)
        held = [i for i, k in enumerate(fold) if k == f]
        pred[held] = _predicted(machine, [runs[i] for i in held], params, paces)
    meas = np.array([r.seconds for r in runs])
    ape = ape_pct(pred, meas)
    return {"folds": folds, "runs": len(runs), "seed": seed,
            "median_ape_pct": float(np.median(ape)),
            "p90_ape_pct": float(np.percentile(ape, 90)),
            "spearman": spearman(pred, meas), "by_load": _by_load(runs, ape)}


def _by_load(runs: Sequence[MeasuredRun],
             ape: np.ndarray) -> dict[str, dict[str, float]]:
    """``quiet`` and ``loaded`` runs apart (:func:`_loaded`): count and median
    of their APEs (``ape[j]`` belongs to ``runs[j]``); a group without runs
    is left out."""
    out = {}
    for name, want in (("quiet", False), ("loaded", True)):
        ix = [j for j, r in enumerate(runs) if _loaded(r) is want]
        if ix:
            out[name] = {"n": len(ix), "median_ape_pct": float(np.median(ape[ix]))}
    return out


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


def _cache_notes(machine: Machine, params: CostParams) -> list[str]:
    """One line per device kind whose runs behave as if its last-level cache
    had another size than the one its devices report."""
    out = []
    for kind, size in sorted(params.cache_size.items()):
        told = max((d.cache_bytes for d in machine.devices if d.kind == kind),
                   default=0.0)
        said = f"{told / 2**20:.0f} MiB" if told > 0 else "no size"
        if size > 0:
            out.append(f"the {kind} devices' runs behave as if their last-level "
                       f"cache held {size / 2**20:.0f} MiB (they report {said}); "
                       f"the cost model uses {size / 2**20:.0f} MiB")
        else:
            out.append(f"the {kind} devices' runs behave as if no task's data "
                       f"stayed in their cache (they report {said}); the cache "
                       f"term is off")
    return out


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
    # past a factor of ten either way the figure says only "not determined"
    loose = [f"{n} (+-{100 * v:.0f} %)" if v <= 10.0 else f"{n} (+->1000 %)"
             for n, v in uncertainty.items() if v > 0.5]
    if loose:
        notes.append("weakly determined by the data (they trade off against "
                     "others): " + ", ".join(loose))
    return notes


def _loaded(run: MeasuredRun) -> bool:
    """Whether the run was taken under load: a recorded capacity below 0.9 on
    a device it used."""
    return any((run.capacity or {}).get(g, 1.0) < 0.9 for g in run.decision.gpus)


def score_runs(machine: Machine | str, runs: Sequence[Mapping[str, Any]],
               params: CostParams) -> dict[str, Any]:
    """The error of ``params`` (fitted before, on other runs) on measured
    ``runs``, every one held out, each predicted at the capacity recorded
    with it: median and p90 APE, Spearman, how many runs were loaded (a
    recorded capacity below 0.9 on a device they used), and each run's
    measured and predicted seconds (``scored``)."""
    machine = load_machine(machine)
    parsed = parse_runs(runs, machine)
    if not parsed:
        raise CalibrationError("no measured runs to score")
    pred = _predicted(machine, parsed, params)
    meas = np.array([r.seconds for r in parsed])
    ape = ape_pct(pred, meas)
    loaded = [i for i, r in enumerate(parsed) if _loaded(r)]
    flagged = set(loaded)
    return {"machine": machine.name, "label": "MEASURED runs, PREDICTED times",
            "params": params.source, "runs": len(parsed), "loaded_runs": len(loaded),
            "median_ape_pct": float(np.median(ape)),
            "p90_ape_pct": float(np.percentile(ape, 90)),
            "loaded_median_ape_pct": float(np.median(ape[loaded])) if loaded
            else None,
            "spearman": spearman(pred, meas),
            "scored": [{"task": r.task.describe(), "measured_seconds": float(m),
                        "predicted_seconds": float(p), "loaded": i in flagged}
                       for i, (r, m, p) in enumerate(zip(parsed, meas, pred,
                                                         strict=True))]}


def calibrate_machine(machine_name: str,
                      characterisation_path_: str | Path | Sequence[str | Path]
                      | None = None,
                      json_out: bool = False, *, holdout: float = 0.3,
                      seed: int = 0, folds: int = 5
                      ) -> CalibrationReport | dict[str, Any]:
    """Characterisation file(s) -> fitted, scored and saved parameters.

    Args:
        machine_name: the machine (``local-cpu``), or the path of a profile
            of one's own (its files are kept under the name inside it).
        characterisation_path_: the JSON :func:`lib.execution.characterise.characterise`
            wrote, or several (e.g. one quiet and one taken under
            ``--induce-load``: their runs are pooled); default
            ``<home>/characterisation/<machine>.json``.
        json_out: return ``report.to_json()`` instead of the report object.
        holdout, seed, folds: as :func:`calibrate` takes them.

    Raises:
        CalibrationError: no characterisation file, or one for another machine.
    """
    spec, machine = machine_name, load_machine(machine_name)
    machine_name = machine.name   # a profile's path: the name runs record under
    given = characterisation_path_
    paths = [Path(p) for p in (given if isinstance(given, (list, tuple)) else
                               [given or characterisation_path(machine_name)])]
    runs: list[Any] = []
    for path in paths:
        if not path.is_file():
            raise CalibrationError(f"no characterisation of {machine_name} at "
                                   f"{path}; run: gpuhive characterise --machine "
                                   f"{spec}")
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CalibrationError(f"{path}: not readable JSON ({exc})") from None
        if not isinstance(obj, Mapping) or "runs" not in obj:
            raise CalibrationError(f"{path}: no 'runs' list (not a characterisation)")
        if obj.get("machine", machine_name) != machine_name:
            raise CalibrationError(f"{path} characterises {obj.get('machine')!r}, "
                                   f"not {machine_name!r}")
        # a file written before runs said their occasion is one of its own
        runs += [{**r, "occasion": str(path)}
                 if isinstance(r, Mapping) and "occasion" not in r else r
                 for r in obj["runs"]]
    report = calibrate(machine, runs, holdout=holdout, seed=seed, folds=folds)
    save_params(machine_name, report.params, report)
    return report.to_json() if json_out else report
