"""Decision latency: what a runtime pays to decide a task it has not seen.

Timed exactly as :meth:`lib.runtime.Agent.optimize` spends it: the policy's
``decide``, the configuration hash, and Gate 1. MEASURED wall clock on this
computer whatever the backend (a benchmark: it measures, never fails).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from lib.contract import TaskSpec
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.policies.baselines import Policy
from lib.security import check_decision


def decision_latency(policy: Policy, machine: Machine, tasks: Sequence[TaskSpec],
                     *, states: Sequence[Snapshot | None] = (None,),
                     repeats: int = 1,
                     warmup: Sequence[TaskSpec] | None = None) -> dict[str, float]:
    """Latency of decide + hash + Gate 1 over ``tasks`` in each state.

    Args:
        policy: the policy timed.
        machine: the machine it decides for.
        tasks: the timed tasks (use :func:`lib.scoring.tasks.random_tasks` for
            tasks the policy has not seen).
        states: telemetry snapshots; every task is decided once per state and
            repeat.
        repeats: passes over ``tasks`` per state.
        warmup: tasks decided untimed first in each state (default: the first
            20 of ``tasks``), so caches are warm as in a running runtime.

    Returns:
        ``p50_us``, ``p99_us``, ``mean_us`` (microseconds), ``decisions``
        timed, and ``refused`` (decisions Gate 1 refused).
    """
    warm = tasks[:20] if warmup is None else warmup
    lat, refused = [], 0
    for snap in states:
        for task in warm:
            decision = policy.decide(task, machine, snap).with_hash(task)
            check_decision(decision, task, machine, snap)
        for _ in range(repeats):
            for task in tasks:
                t0 = time.perf_counter()
                decision = policy.decide(task, machine, snap).with_hash(task)
                ok = check_decision(decision, task, machine, snap).accepted
                lat.append(time.perf_counter() - t0)
                refused += not ok
    us = np.asarray(lat) * 1e6
    return {"p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)),
            "mean_us": float(us.mean()), "decisions": len(lat),
            "refused": refused}
