"""The evaluation protocol: Table 4, ablations, transfer, falsifiable targets.

``gpuhive evaluate --machine M --backend B --budget BUDGET [--policy FILE]``
runs :func:`evaluate` (this module):

1. a fixed, seeded task set over the five kinds, with sizes spanning four orders
   of magnitude of work, under *idle* and *busy* device states;
2. every policy (the learned one and the seven baselines) decides each task
   through :class:`lib.runtime.Agent` -- policy, hash, Gate 1 -- and the decision
   runs on the chosen backend: the ``model`` backend PREDICTS, ``cpu`` (and
   ``cuda``, ``dask``) MEASURE, with warm-ups and repeats (a decision's
   figure is their trimmed mean, :func:`figure_of`). On a
   measured backend the runs of one task are interleaved: every distinct
   decision of the task is warmed up once, then run once per round, each
   round in an order of its own (so no decision inherits the same
   neighbour's load, or the same scheduler phase, in every round), and
   policies whose decisions the backend runs
   the same way share their runs (:func:`_measure`). Drift on a shared
   machine (another user's job starting) then falls on every policy alike,
   and two policies that decided alike get the same figure, not two draws of
   the noise. A
   short task gets more rounds than the budget's repeats, as many as fit in
   :data:`ROUND_SECONDS` of its slowest decision (at most
   :data:`MAX_ROUNDS`): its figure then rests on enough runs to see the
   odds of the scheduler's lottery, at little cost;
3. the results become Table 4 (policies x kinds: geometric-mean speedup over
   equal split with a bootstrap 95 % interval, ratio to the optimum, decision
   latency), the ablations of the learned policy, the transfer results, each
   task's efficiency against the physical limit, and the targets T1-T7 of the
   design, each printed as ``T<n> PASS|FAIL <value> <bound>``.

On the measured backends the device states are real and *induced*
(:data:`INDUCED_STATES`): ``idle``; ``loaded-1`` and ``loaded-2``, one and two
processes spinning on the first device's core (about 1/2 and 1/3 of it left for
a shard of ours); and ``load-mid``, one spinning process that starts half-way
through the state's tasks. The runtime is closed-loop, as in production:
telemetry (``local_cpu_snapshot`` on the cpu backend, MEASURED, capacity-aware)
is read afresh before each task, every measured run feeds the history model,
and each policy decides under the capacity a shard of the task will
effectively get, which that history learns (:meth:`Agent.seen_by_policy`: a
short shard on a busy core runs as on a free one), so the first decisions of
a state, made before either has caught up, count with the rest. On the model
backend the states are ``idle`` and ``busy`` (a simulated utilisation of 70 %
on the first device).

Every row carries MEASURED or PREDICTED; the Markdown report opens with a
warning block whenever anything in it is predicted.
"""

from __future__ import annotations

import math
import os
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from lib.budgets import pick
from lib.contract import KINDS, TaskSpec
from lib.costmodel.model import split_time_coefficients
from lib.costmodel.parameters import params_for
from lib.evaluation.experiments import learned_policy, run_ablations, run_transfer
from lib.evaluation.report import LEARNED, EvalReport, Row
from lib.evaluation.targets import targets
from lib.execution import get_backend
from lib.execution.base import run_key
from lib.execution.load import CoreLoad
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import (
    Snapshot,
    busy,
    idle,
)
from lib.policies.baselines import Policy
from lib.policies.oracle import optimum
from lib.policies.registry import POLICIES, make_policy
from lib.runtime import Agent, DecisionRejected, live_snapshot
from lib.scoring import (
    bootstrap_ci,
    decision_latency,
    fit_tasks,
    geomean,
    random_tasks,
    task_set,
)


def physical_limit(task: TaskSpec, machine: Machine,
                   telemetry: Snapshot | None = None) -> float:
    """A lower bound on the time of any decision (under the cost model).

    ``T_limit = n / sum_i r_i + t_x``: the task's ``n`` rows over the summed
    compute throughput of the usable devices (``r_i`` rows per second, the
    roofline slope of Eq. (1) without transfers or launches), plus the least
    unavoidable transfer ``t_x``: one copy's latency on the fastest host link,
    since with perfect pipelining every other byte can overlap compute.
    """
    n = task.split_size
    rates, latency = [], math.inf
    for i in range(machine.n):
        if telemetry is not None and not telemetry.healthy[i]:
            continue
        _, _, _, d, _, f = split_time_coefficients(task, machine, i,
                                                   telemetry=telemetry)
        rates.append(1.0 / max(d, f, 1e-30))
        latency = min(latency, machine.host_link(i).latency)
    return n / sum(rates) + latency


# --------------------------------------------------------------------------
# Busy cores, for real

#: The measured states: (name, spinning processes on the first device's core,
#: fraction of the state's tasks done before they start).
INDUCED_STATES: tuple[tuple[str, int, float], ...] = (
    ("idle", 0, 0.0), ("loaded-1", 1, 0.0), ("loaded-2", 2, 0.0),
    ("load-mid", 1, 0.5))


# --------------------------------------------------------------------------
# Running

def _states(machine: Machine, backend: str) -> list[tuple[str, Snapshot | None]]:
    """(name, telemetry) pairs: on the model backend ``idle`` and ``busy`` (the
    first device at 70 %); on a measured one :data:`INDUCED_STATES`, whose
    telemetry is read live before each task (None here)."""
    if backend == "model":
        util = [0.7 if i == 0 else 0.0 for i in range(machine.n)]
        return [("idle", idle(machine)), ("busy", busy(machine, util))]
    return [(name, None) for name, _, _ in INDUCED_STATES]


def evaluate(machine_name: str = "hetero-4", backend: str = "model",
             budget: str = "quick", seed: int = 0, policy_path: str | None = None,
             progress: bool = True,
             on_row: Callable[[Row], None] | None = None,
             repeats: int | None = None, with_optimum: bool = True) -> EvalReport:
    """Run the protocol; see the module docstring.

    Args:
        repeats: timed repeats per measured run (default: the budget's, 1, 3
            or 5); the figure is their trimmed mean (:func:`figure_of`).
        with_optimum: False leaves out the exhaustive optimum (the ``oracle``
            row and every ratio to it: milliseconds a task); T2 and T7 then
            do not pass, saying so.
    """
    start = time.perf_counter()
    machine = load_machine(machine_name)
    notes: list[str] = []
    measured = backend != "model"
    repeats = repeats or pick(budget, smoke=1, quick=3, full=5)
    states = _states(machine, backend)
    tasks, fitted = fit_tasks(task_set(backend, budget, seed), machine,
                              [snap for _, snap in states])
    if fitted:
        notes.append(f"{len(fitted)} of the task set's tasks did not fit on "
                     f"{machine.name} with the equal split, the reference of "
                     "every speedup, and were made smaller: " + "; ".join(fitted))
    left_out = {"rl"} if with_optimum else {"rl", "oracle"}
    policies: dict[str, Policy] = {name: make_policy(name, seed)
                                   for name in POLICIES if name not in left_out}
    if not with_optimum:
        notes.append("the exhaustive optimum was left out of the runs "
                     "(--no-optimum): no oracle row and no ratio to it there; "
                     "the ablations and the transfer still compare with it")
    learned = learned_policy(policy_path, notes)
    if learned is not None:
        policies = {LEARNED: learned, **policies}
    runner = None
    if measured:
        # one timed run a call: _measure interleaves the repeats itself
        runner = get_backend(backend, machine, seed=seed, repeats=1, warmup=0)
    rows: list[Row] = []
    bar = _progress(progress, len(tasks) * len(states) * len(policies), "evaluate")
    if measured:
        notes.append("states loaded-1, loaded-2 and load-mid are induced: "
                     "processes spinning on the first device's core "
                     f"({_core_of(0)}), as the two-GPU server's clock lock is "
                     "induced")
    try:
        for state, snap in states:
            load = None
            if measured:
                procs, start_at = {n: (p, f) for n, p, f in INDUCED_STATES}[state]
                load = CoreLoad(core=_core_of(0), procs=procs) if procs else None
            try:
                late = None
                if load is not None and start_at == 0:
                    load.start()
                elif load is not None:
                    late = (load, int(len(tasks) * start_at))
                rows += _run_state(machine, backend, runner, tasks, state, snap,
                                   policies, bar, on_row, with_optimum,
                                   live=measured, late_load=late, repeats=repeats)
            finally:
                if load is not None:
                    load.stop()
    finally:
        if runner is not None:
            runner.close()
        if bar is not None:
            bar.close()
    table4 = _table4(rows, seed)
    # PREDICTED on every backend; the two short trainings on the model one only
    ablations = run_ablations(machine, tasks, policy_path, notes, budget,
                              str(machine_name), curriculum=backend == "model") \
        if learned is not None else []
    transfer = run_transfer(learned, budget, seed, notes) \
        if learned is not None else []
    latency = decision_latency(
        learned, machine,
        random_tasks(pick(budget, smoke=100, quick=400, full=1000), seed=seed),
        states=[s for _, s in _states(machine, "model")],
        warmup=random_tasks(20, seed=seed + 1)) if learned is not None else {}
    report = EvalReport(machine=machine.name, backend=backend, budget=budget,
                        seed=seed, measured=measured, rows=rows, table4=table4,
                        ablations=ablations, transfer=transfer, targets=[],
                        notes=notes, seconds=0.0, latency=latency)
    report.targets = targets(report, machine)
    report.seconds = time.perf_counter() - start
    return report


def _progress(on: bool, total: int, desc: str) -> tqdm | None:
    if not on:
        return None
    return tqdm(total=total, desc=desc, unit="run")


def _core_of(device: int) -> int:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else [0]
    return cores[device % len(cores)]


def _live_snapshot(machine: Machine, backend: str) -> Snapshot:
    """What the measured backend's devices look like now (MEASURED), watched
    longer than a runtime decision watches them."""
    return live_snapshot(machine, backend, interval=0.2, samples=10)


def _run_state(machine, backend, runner, tasks, state, snap, policies, bar,
               on_row, with_optimum: bool = True,
               live: bool = False,
               late_load: tuple[CoreLoad, int] | None = None,
               repeats: int = 1) -> list[Row]:
    """Every policy on every task in one state; ``live``: read the telemetry
    afresh before each task (the closed loop of a measured state);
    ``late_load``: a load and the index of the task it starts before;
    ``repeats``: rounds of :func:`_measure` on a measured backend."""
    params = params_for(machine.name)
    rows = []
    for i, task in enumerate(tasks):
        if late_load is not None and i == late_load[1]:
            late_load[0].start()
        if live:
            snap = _live_snapshot(machine, backend)
        backend_obj = runner if runner is not None else get_backend(
            "model", machine, telemetry=snap, params=params)
        decided: dict[str, tuple[Agent, Any, float]] = {}
        for name, policy in policies.items():
            agent = Agent(policy=policy, machine=machine, backend=backend_obj,
                          telemetry=snap)
            t0 = time.perf_counter()
            try:
                decision = agent.optimize(task)
            except DecisionRejected:
                decision = None
            decided[name] = (agent, decision, (time.perf_counter() - t0) * 1e6)
        measured = _measure(task, decided, runner, repeats, bar)
        times: dict[str, tuple[float, float, bool, str, dict, tuple]] = {}
        for name, (_, decision, decide_us) in decided.items():
            if decision is not None:
                seconds, label, rounds = measured[decision.config_hash]
                times[name] = (seconds, decide_us, True, label, decision.to_json(),
                               rounds)
            else:  # a refused decision never runs; it costs the equal split
                times[name] = (math.nan, decide_us, False, "REFUSED", {}, ())
        equal = times["equal"][0]
        equal_median = _median(times["equal"][5]) if runner is not None else None
        opt = times["oracle"][0] if "oracle" in times else None
        if backend == "model" and with_optimum:
            opt = optimum(task, machine, snap, params).total
        limit = physical_limit(task, machine, snap)
        for name, (seconds, decide_us, accepted, label, dec_json,
                   rounds) in times.items():
            row = Row(policy=name, task=task, state=state,
                      seconds=seconds if accepted else equal, equal_seconds=equal,
                      optimum_seconds=opt, limit_seconds=limit, decide_us=decide_us,
                      accepted=accepted, label=label, decision=dec_json,
                      capacity=None if snap is None or snap.capacity is None
                      else tuple(snap.capacity),
                      rounds=rounds if runner is not None else (),
                      median_seconds=(_median(rounds) if accepted and runner
                                      is not None else equal_median),
                      equal_median_seconds=equal_median)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


#: Seconds of a task's slowest decision that its rounds may take together on a
#: measured backend (a task of up to 10 ms gets 25 rounds, a 50 ms one 5, a
#: 100 ms one the budget's repeats), and the most rounds a task gets. A task
#: of a few milliseconds with a shard on a busy core is a lottery, its shard
#: started at once or after another process's time slice; three rounds made
#: its median a coin toss (one split measured 2.9, 6.1 and 6.6 ms in its three
#: rounds, a near-identical one 2.2, 2.1 and 6.5 ms), twenty-five see the odds.
ROUND_SECONDS = 0.25
MAX_ROUNDS = 25


#: The fraction of a decision's rounds cut from each end before their mean is
#: taken (:func:`figure_of`).
TRIM = 0.1


def figure_of(seconds: Sequence[float]) -> float:
    """A decision's figure from the seconds of its rounds: their mean after
    the fastest and the slowest :data:`TRIM` of them are cut (``floor(TRIM
    n)`` from each end; under ten rounds, the plain mean).

    Not the median: on a core another process is busy on, a run's time is
    bimodal (the shard starts at once, or after that process's time slice),
    and where the two are about as likely the median is a coin toss between
    the modes. MEASURED on ``local-cpu`` with two spinning processes: the
    equal split of a reduction of 1.3 M elements had a median of 5.4 ms over
    its 12 rounds, and a split 0.50000 / 0.49999 of it, run in the same
    rounds, 1.7 ms. A runtime that runs a task again and again pays the mean;
    the cut keeps one run stalled by something else entirely from deciding
    the figure. The median stays in each row beside it
    (:attr:`Row.median_seconds`)."""
    values = np.sort(np.asarray(seconds, float))
    cut = int(TRIM * values.size)
    return float(values[cut:values.size - cut].mean())


def _median(seconds: Sequence[float]) -> float | None:
    return float(np.median(seconds)) if len(seconds) else None


def _rounds(repeats: int, slowest: float) -> int:
    """Rounds for a task whose slowest decision took ``slowest`` seconds to
    warm up: the budget's ``repeats``, or more where they are short."""
    fit = int(ROUND_SECONDS / slowest) if slowest > 0 else MAX_ROUNDS
    return max(1, int(repeats), min(MAX_ROUNDS, fit))


def _measure(task: TaskSpec, decided: dict[str, tuple[Agent, Any, float]],
             runner: Any, repeats: int, bar: tqdm | None
             ) -> dict[str, tuple[float, str, tuple[float, ...]]]:
    """Run each distinct accepted decision of ``decided`` (policy -> (agent,
    decision or None, decide_us)) and return config hash -> (seconds, label,
    the seconds of each timed round).

    Decisions are distinct when the backend would run them differently
    (:func:`lib.execution.base.run_key`: on the cpu backend, when some device
    gets other rows; elsewhere, when their hashes differ). On the model
    backend (``runner`` None) one run each: a prediction does not vary. On a
    measured one the runs are interleaved: one untimed warm-up of each
    distinct decision, then :func:`_rounds` rounds (``repeats``, or more for a
    short task), each running every distinct decision once through its first
    chooser's agent (so the run feeds the history as any execution does):
    the first round in the policies' order, each later one in an order of
    its own drawn from a generator seeded by the task; the figure is the
    trimmed mean of a decision's rounds (:func:`figure_of`), shared by every
    policy whose decision runs the same.

    Why shuffle: a shard on a core another process is using runs either at
    once or after that process's time slice, depending on when it arrives
    and on what the core ran just before. Rounds that kept one order (or
    rotated it, which keeps every decision's neighbour) replayed the same
    arrivals each round, so one decision could be slowed in every round and
    another spared in every round: on ``local-cpu`` with two spinning
    processes, a split within 3 % of equal measured 10 ms in each of its
    three rounds where the equal split measured 2.4 ms in each. (A random
    pause before each run would spread the phases too, but it lets idle
    cores fall asleep, adding about half a millisecond of wake-up to every
    short run.)
    """
    chooser: dict[Any, tuple[Agent, Any]] = {}
    key_of: dict[str, Any] = {}
    for agent, decision, _ in decided.values():
        if decision is None:
            continue
        key = run_key(runner, task, decision) if runner is not None \
            else decision.config_hash
        key_of[decision.config_hash] = key
        chooser.setdefault(key, (agent, decision))
    order = list(chooser)
    runs: dict[Any, list[float]] = {key: [] for key in order}
    labels: dict[Any, str] = {}
    rounds = 1
    if runner is not None:
        slowest = 0.0
        for key in order:  # warm-up, untimed and not taught to the history
            t0 = time.perf_counter()
            runner.run(task, chooser[key][1])
            slowest = max(slowest, time.perf_counter() - t0)
        rounds = _rounds(repeats, slowest)
    rng = np.random.default_rng(zlib.crc32(task.describe().encode()))
    for r in range(rounds):
        for i in (rng.permutation(len(order)) if r else range(len(order))):
            key = order[i]
            agent, decision = chooser[key]
            result = agent.execute(task, decision)
            runs[key].append(result.metrics.total_seconds)
            labels[key] = result.metrics.label
    if bar is not None:
        bar.update(len(decided))
    return {h: (figure_of(runs[key]), labels[key], tuple(runs[key]))
            for h, key in key_of.items()}


def _table4(rows: list[Row], seed: int) -> list[dict[str, Any]]:
    out = []
    for name in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == name]
        speed = [r.speedup for r in mine]
        per_kind = {k: geomean([r.speedup for r in mine if r.task.kind == k])
                    for k in KINDS}
        ratios = [r.seconds / r.optimum_seconds for r in mine if r.optimum_seconds]
        lat = [r.decide_us for r in mine]
        out.append({"policy": name, "per_kind": per_kind, "speedup": geomean(speed),
                    "ci95": bootstrap_ci(speed, seed=seed),
                    "ratio_to_optimum": geomean(ratios) if ratios else None,
                    "decide_p50_us": float(np.percentile(lat, 50)),
                    "decide_p99_us": float(np.percentile(lat, 99)),
                    "refused": sum(not r.accepted for r in mine),
                    "label": mine[0].label if mine else ""})
    return out
