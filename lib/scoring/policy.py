"""One evaluator for every policy: :func:`evaluate_policy`.

A policy decides each task of a set; its decision is held against three
references on the same task and state: the equal split (the reward's
reference, Eq. (2)), proportional to peak (the static rule a user would write)
and the exhaustive optimum under the cost model (the bound). A decision Gate 1
refuses never runs; it is charged ``e**penalty`` times the equal split's time,
so a policy cannot look good by being refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lib.contract import TaskSpec
from lib.costmodel import CostParams, predict
from lib.costmodel.parameters import params_for
from lib.execution import get_backend
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import Snapshot
from lib.policies.baselines import EqualSplit, Policy, ProportionalToPeak
from lib.policies.oracle import optimum
from lib.scoring.metrics import geomean
from lib.scoring.tasks import fit_tasks
from lib.security import check_decision

#: The names of a result's ``geo_seconds``, the evaluated policy first.
REFERENCES = ("rl", "equal", "proportional-peak", "optimum")


def evaluate_policy(policy: Policy, machine: str | Machine,
                    tasks: Sequence[TaskSpec], *,
                    telemetry: Snapshot | None = None, backend: str = "model",
                    params: CostParams | None = None,
                    penalty: float = 1.0) -> dict[str, Any]:
    """Geometric-mean time of ``policy`` against equal split, proportional to
    peak and the exhaustive optimum on ``tasks``.

    Args:
        policy: anything with ``decide(task, machine, telemetry) -> Decision``.
        machine: a profile name or a machine.
        tasks: the task set (see :mod:`lib.scoring.tasks`); a task whose
            equal split does not fit on ``machine`` is made smaller
            (:func:`~lib.scoring.tasks.fit_tasks`).
        telemetry: the device state every decision and prediction sees.
        backend: ``"model"`` PREDICTS with ``params`` (default: the machine's
            calibrated parameters where saved); a real backend MEASURES.
        params: cost-model parameters for the predictions and the optimum.
        penalty: a refused decision costs ``e**penalty`` equal splits
            (0: as much as the equal split).

    Returns:
        ``label``, ``machine``, ``policy``, ``tasks``, ``fitted`` (a line for
        each task made smaller to fit), ``refused`` (the
        policy's decisions Gate 1 refused), ``geo_seconds`` per name of
        :data:`REFERENCES`, ``rl_over_opt`` (geo-mean T_policy / T_opt),
        ``speedup_vs_equal``, ``speedup_vs_peak``, ``per_task`` (seconds per
        name, in task order).
    """
    m = load_machine(machine)
    tasks, fitted = fit_tasks(tasks, m, (telemetry,))
    measured = backend != "model"
    runner = get_backend(backend, m) if measured else None
    params = params if params is not None else params_for(m.name)
    times: dict[str, list[float]] = {k: [] for k in REFERENCES}
    refused = 0
    try:
        for task in tasks:
            equal = EqualSplit().decide(task, m, telemetry).with_hash(task)
            opt = optimum(task, m, telemetry, params)
            choices = {"rl": policy.decide(task, m, telemetry).with_hash(task),
                       "equal": equal,
                       "proportional-peak": ProportionalToPeak().decide(
                           task, m, telemetry).with_hash(task),
                       "optimum": opt.decision}
            t_eq = math.nan
            for name in ("equal", "proportional-peak", "optimum", "rl"):
                d = choices[name]
                if not check_decision(d, task, m, telemetry).accepted:
                    refused += name == "rl"
                    times[name].append(t_eq * math.exp(penalty))
                    continue
                t = runner.run(task, d).metrics.total_seconds if measured \
                    else predict(task, d, m, telemetry, params).total
                times[name].append(t)
                if name == "equal":
                    t_eq = t
    finally:
        if runner is not None:
            runner.close()
    geo = {k: geomean(v) for k, v in times.items()}
    return {"label": f"{'MEASURED' if measured else 'PREDICTED'} ({backend})",
            "machine": m.name, "policy": getattr(policy, "name", "policy"),
            "tasks": len(tasks), "fitted": fitted, "refused": refused,
            "geo_seconds": geo,
            "rl_over_opt": geo["rl"] / geo["optimum"],
            "speedup_vs_equal": geo["equal"] / geo["rl"],
            "speedup_vs_peak": geo["proportional-peak"] / geo["rl"],
            "per_task": times}


def format_evaluation(ev: Mapping[str, Any]) -> str:
    """Printable lines of an :func:`evaluate_policy` result."""
    geo = ev["geo_seconds"]
    lines = [f"held-out evaluation on {ev['machine']}, {ev['tasks']} tasks, "
             f"{ev['label']}: geometric-mean time"]
    for k in REFERENCES:
        lines.append(f"  {k:18s} {geo[k] * 1e3:10.4f} ms")
    lines.append(f"  T_rl/T_opt {ev['rl_over_opt']:.3f}, speedup vs equal "
                 f"{ev['speedup_vs_equal']:.2f}x, vs proportional-peak "
                 f"{ev['speedup_vs_peak']:.2f}x, refused by Gate 1: {ev['refused']}")
    return "\n".join(lines)
