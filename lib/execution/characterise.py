"""Characterisation: measure a real machine so the cost model can be calibrated.

:func:`characterise` runs real work on real devices and records what it saw:

(a) **throughput** -- every workload kind at several sizes (at least three,
    spanning at least two orders of magnitude of work), one device at a time,
    on each device: median seconds of repeated runs, the FLOP/s and bytes/s that
    implies, and a straight-line fit of seconds against work per kind (its
    slope is the marginal rate, its intercept the fixed cost of a run);
(b) **host link** -- the hand-off between the host process and a device: its
    latency (a near-empty task, end to end) and bandwidth (the slope of
    end-to-end time against bytes handed over for elementwise tasks, and, on
    the cpu backend, a direct copy through a shared-memory file mapping);
(c) **device to device** -- on the cpu backend, worker cores exchange data
    through the same shared memory: a copy written on one core and read on
    another, and a pipe round trip between processes pinned to the two cores;
(d) **runs** -- every execution above plus multi-device runs (equal and uneven
    splits over all devices, every kind), as run records that
    :func:`lib.costmodel.calibrate.calibrate` fits.

Every measured number is written ``{"value", "unit", "provenance": "measured",
"method"}``. The machine profile's own estimates sit apart under ``estimated``
for comparison; the two are never pooled. Run records hold raw measured seconds
(``measured_seconds``) with their backend.

Budgets: ``smoke`` (seconds; small sizes, for tests), ``quick`` (about two
minutes on two cores), ``full`` (larger sizes, more repeats). The plan is done
in several passes, each in a fresh seeded random order, and a run's figure is
the median over all its timed repeats: background load that comes and goes
lands as scattered outliers the median discards, not as a bias on one size or
kind. A run shorter than the plan's ``min_timed_s`` is called again in each
pass until its repeats add up to that (at most ``max_calls`` calls): a
sub-millisecond figure is mostly wake-ups and hand-offs, and it needs more
samples than a long one for the same steadiness. The load on the cores
before and after is recorded too, and so is how disturbed each run was: the
runnable threads of other processes on the cores it used, looked at just
before and just after every timed run, and the capacity they left it
(:func:`lib.platform.telemetry.capacity_of`), under the run record's
``disturbance``. Calibration predicts a run at that capacity (time /
capacity), so a run taken under load still counts.

The plans per budget are :mod:`lib.execution.characterisation_plans`; the direct
shared-memory copies and round trips are :mod:`lib.execution.shm_links`.

Why one module: (a) to (d) are one pass over the machine, sharing its runner,
its disturbance checks (a run redone when other processes took the cores) and
the record format; each section is short, and a reader following one
measurement from plan to record stays in this file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lib.budgets import check_budget
from lib.contract import KINDS, Decision, TaskSpec, decision_from_weights
from lib.execution import BACKENDS, BackendUnavailable, get_backend
from lib.execution.characterisation_plans import (
    CHARACTERISATION_PLANS,
    CharacterisationPlan,
    pattern_weights,
)
from lib.execution.dask_measure import characterise_network, network_record
from lib.execution.load import CoreLoad
from lib.execution.shm import shm_root
from lib.execution.shm_links import core_ids, ping_pong_seconds, shm_copy_seconds
from lib.platform.machines import Machine, MachineError, load_machine
from lib.platform.telemetry import (
    TelemetryError,
    capacity_of,
    local_cpu_snapshot,
    own_pids,
    runnable_look,
)
from lib.platform.workloads import workload
from lib.storage import characterisation_path, write_json_atomic

SCHEMA = "gpuhive.characterisation/1"


class CharacterisationError(RuntimeError):
    """This machine/backend cannot be measured here (the message says what is
    missing)."""


# --------------------------------------------------------------------------
# Records

def measured(value: float, unit: str, method: str) -> dict[str, Any]:
    """One measured number with its unit and how it was obtained."""
    return {"value": float(value), "unit": unit, "provenance": "measured",
            "method": method}


def estimated(value: float, unit: str, method: str) -> dict[str, Any]:
    """One number from the machine profile (not measured here)."""
    return {"value": float(value), "unit": unit, "provenance": "estimated",
            "method": method}


def _check_measurable(machine_name: str, backend: str) -> Machine:
    if backend not in BACKENDS:
        raise CharacterisationError(f"unknown backend {backend!r}; expected one of "
                                    f"{', '.join(BACKENDS)}")
    if backend == "model":
        raise CharacterisationError(
            "the model backend predicts and measures nothing; characterise with "
            "a measuring backend (cpu on local-cpu, cuda on a GPU machine)")
    try:
        machine = load_machine(machine_name)
    except MachineError as exc:
        raise CharacterisationError(f"cannot characterise: {exc}") from None
    if machine.simulated:
        raise CharacterisationError(
            f"machine {machine.name} is a simulated profile: there are no real "
            f"devices to measure; characterise local-cpu with --backend cpu, or a "
            f"GPU machine (nvml) with --backend cuda")
    if backend not in machine.real_backends:
        have = ", ".join(machine.real_backends) or "none"
        raise CharacterisationError(
            f"backend {backend} cannot measure machine {machine.name}: its devices "
            f"run for real only on backend(s) {have}")
    return machine


# --------------------------------------------------------------------------
# The measurement

def _timed(result: Any) -> list[float]:
    """The timed totals of one call of a backend's ``run``."""
    return [float(t) for t in result.detail.get("all_totals",
                                                [result.metrics.total_seconds])]


def _more_calls(first: Any, budget: CharacterisationPlan) -> int:
    """How many calls a run needs in this pass beyond ``first`` for its timed
    repeats to add up to ``budget.min_timed_s`` (at most ``budget.max_calls``
    calls in all)."""
    spent = sum(_timed(first))
    if spent <= 0.0 or spent >= budget.min_timed_s:
        return 0
    return min(budget.max_calls, math.ceil(budget.min_timed_s / spent)) - 1


def _without_output(result: Any) -> Any:
    """``result`` without its output array: a run record needs its timings
    only, and every run's output kept to the end of a characterisation took
    the notebook's kernel past 2.5 GB at the quick budget (MEASURED)."""
    return dataclasses.replace(result, output=None)


def _run_record(task: TaskSpec, decision: Decision, results: Sequence[Any],
                purpose: str) -> dict[str, Any]:
    """One run record from the results of every pass (medians over all)."""
    totals = [t for r in results for t in _timed(r)]
    per_dev: dict[str, list[float]] = {}
    for r in results:
        for g, sec in r.metrics.per_device_seconds.items():
            per_dev.setdefault(str(g), []).append(float(sec))
    m = results[0].metrics
    record = {"task": task.to_json(), "decision": decision.to_json(),
            "measured_seconds": statistics.median(totals),
            "per_device_seconds": {g: statistics.median(v)
                                   for g, v in per_dev.items()},
            "backend": m.backend, "provenance": "measured", "label": m.label,
            "repeats": len(totals), "all_seconds": totals,
            "verified": None if all(r.metrics.verified is None for r in results)
            else all(r.metrics.verified is not False for r in results),
            "purpose": purpose}
    seen = [r.detail["disturbance"] for r in results if "disturbance" in r.detail]
    if seen:
        record["disturbance"] = _disturbance_record(seen)
    return record


DISTURBANCE_METHOD = (
    "runnable threads (state R) of other processes on the device's core, from "
    "/proc/<pid>/task/<tid>/stat, looked at just before and just after each "
    "pass's run (our process and its workers excluded); capacity = CFS fair "
    "share 1 / (1 + mean others), per pass, then the median over passes")


def _disturbance_record(seen: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per device: others before and after each pass, and the median capacity."""
    devices = sorted(seen[0]["capacity"])
    return {
        "others_before": {d: [s["before"][d] for s in seen] for d in devices},
        "others_after": {d: [s["after"][d] for s in seen] for d in devices},
        "capacity": {d: float(statistics.median(s["capacity"][d] for s in seen))
                     for d in devices},
        "unit": "runnable threads; capacity as a fraction of the core",
        "provenance": "measured", "method": DISTURBANCE_METHOD}


def _plan(machine: Machine, budget: CharacterisationPlan, seed: int) -> list[tuple]:
    steps: list[tuple] = []
    for kind in KINDS:
        smallest = True
        for dims in budget.sizes[kind]:
            task = TaskSpec(kind, dict(dims))
            for dev in range(machine.n):
                dec = decision_from_weights(
                    task, [dev], [1.0],
                    block=machine.block_for([dev])).with_hash(task)
                steps.append((task, dec, "throughput", smallest))
            smallest = False
        if machine.n > 1:
            for dims in budget.multi[kind]:
                task = TaskSpec(kind, dict(dims))
                for pattern in budget.patterns:
                    dec = decision_from_weights(
                        task, list(range(machine.n)),
                        pattern_weights(pattern, machine.n),
                        block=machine.block_for(range(machine.n))).with_hash(task)
                    steps.append((task, dec, f"split-{pattern}", False))
    return steps


def characterise(machine_name: str, backend: str = "cpu", *, budget: str = "quick",
                 seed: int = 0, progress: bool = True,
                 out: str | Path | None = None,
                 induce_load: int = 0) -> dict[str, Any]:
    """Measure a real machine; write and return the characterisation.

    Args:
        machine_name: a real machine profile (``local-cpu``).
        backend: the measuring backend (``cpu``; ``cuda`` where it runs).
        budget: ``smoke`` (< 30 s), ``quick`` (< 3 min on two cores) or ``full``.
        seed: seed of the inputs and of the order runs are done in.
        progress: show tqdm progress bars (on stderr).
        out: where to write the JSON; default
            :func:`lib.costmodel.calibrate.characterisation_path` of the machine
            (``$GPUHIVE_HOME/characterisation/<machine>.json``).
        induce_load: processes spinning on the first device's core while
            everything is measured (:class:`~lib.execution.load.CoreLoad`,
            cpu backend only): runs taken under load on purpose, kept as they
            are (not redone), each with the capacity it was left.

    Returns:
        The characterisation object (also written to ``out``); its ``path``
        field says where.

    Raises:
        CharacterisationError: the machine or backend cannot be measured here
            (simulated profile, no CUDA, unknown names); the message says what
            is missing.
    """
    try:
        check_budget(budget)
    except ValueError as exc:
        raise CharacterisationError(str(exc)) from None
    machine = _check_measurable(machine_name, backend)
    plan_budget = CHARACTERISATION_PLANS[budget]
    try:
        runner = get_backend(backend, machine, seed=seed,
                             repeats=plan_budget.repeats, warmup=plan_budget.warmup)
    except BackendUnavailable as exc:
        raise CharacterisationError(f"cannot measure {machine.name} with backend "
                                    f"{backend}: {exc}") from None
    if induce_load and backend != "cpu":
        runner.close()
        raise CharacterisationError(f"--induce-load loads this computer's cores: "
                                    f"the cpu backend only, not {backend}")
    started = time.time()
    load = CoreLoad(core_ids(machine)[0], procs=induce_load) if induce_load else None
    try:
        if load is not None:
            load.start()
        obj = _measure(machine, backend, runner, plan_budget, budget, seed, progress,
                       retry=load is None)
    finally:
        if load is not None:
            load.stop()
        runner.close()
    if load is not None:
        obj["induced_load"] = {"processes": induce_load,
                               "core": core_ids(machine)[0],
                               "note": "processes of another session spinning on "
                                       "the first device's core during every run "
                                       "(induced); runs were not redone"}
    obj["elapsed"] = measured(time.time() - started, "s",
                              "wall-clock time of the whole characterisation")
    path = write_characterisation(obj, out)
    obj["path"] = str(path)
    return obj


def _background(machine: Machine) -> dict[str, Any] | None:
    try:
        snap = local_cpu_snapshot(machine, interval=0.2)
    except TelemetryError:
        return None
    return {str(i): measured(u, "fraction busy",
                             "/proc/stat busy jiffies over 0.2 s on the device's "
                             "core, while nothing of ours ran")
            for i, u in enumerate(snap.utilisation)}


def _measure(machine: Machine, backend: str, runner: Any, budget: CharacterisationPlan,
             budget_name: str, seed: int, progress: bool,
             retry: bool = True) -> dict[str, Any]:
    from tqdm.auto import tqdm

    plan = _plan(machine, budget, seed)
    is_cpu = backend == "cpu" and hasattr(os, "sched_setaffinity")
    extra = machine.n + (2 if is_cpu else 0)
    load_before = _background(machine) if is_cpu else None
    results: list[list[Any]] = [[] for _ in plan]
    disturbed: list[float] = []
    rng = np.random.default_rng(seed)
    bar = tqdm(total=len(plan) * budget.passes + extra, disable=not progress,
               desc=f"characterise {machine.name} ({budget_name})", unit="run",
               file=sys.stderr)
    try:
        for p in range(budget.passes):
            for i in rng.permutation(len(plan)):
                task, dec, purpose, verify = plan[i]
                bar.set_postfix_str(f"pass {p + 1} {task.kind} {purpose}",
                                    refresh=False)
                first = _undisturbed_run(runner, task, dec, verify and p == 0,
                                         disturbed, is_cpu, retry)
                results[i].append(_without_output(first))
                for _ in range(_more_calls(first, budget)):
                    results[i].append(_without_output(_undisturbed_run(
                        runner, task, dec, False, disturbed, is_cpu, retry)))
                bar.update()
        runs = [_run_record(task, dec, results[i], purpose)
                for i, (task, dec, purpose, _) in enumerate(plan)]
        link = _host_link(machine, runner, budget, runs, bar)
        peers: dict[str, Any] = {}
        if is_cpu:
            link["shm_copy"] = _shm_host(machine, budget)
            bar.update()
            peers = _peers(machine, budget)
            bar.update()
        network = None
        if backend == "dask":  # the links between hosts the profile estimates
            bar.set_postfix_str("network between workers", refresh=False)
            network = network_record(characterise_network(
                machine, repeats=budget.repeats), machine)
    finally:
        bar.close()
    failed = [r for r in runs if r["verified"] is False]
    if failed:
        raise CharacterisationError(
            f"{len(failed)} run(s) gave wrong results (first: "
            f"{TaskSpec.from_json(failed[0]['task']).describe()}); not recording "
            "timings of wrong computations")
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    # every run says which characterisation took it, so that runs pooled from
    # several (a quiet one and one under load) keep their occasion apart
    # (lib.costmodel.fit: a machine's speed moves from one occasion to the next)
    occasion = f"{created} {os.urandom(4).hex()}"
    for record in runs:
        record["occasion"] = occasion
    return {
        "schema": SCHEMA, "machine": machine.name, "backend": backend,
        "budget": budget_name, "seed": seed, "created": created,
        "occasion": occasion,
        "host": {"platform": platform.platform(), "python": platform.python_version(),
                 "numpy": np.__version__, "cpu": _cpu_model(),
                 "cores": core_ids(machine) if is_cpu else []},
        "devices": [d.label for d in machine.devices],
        "conventions": (
            "Every measured number is {value, unit, provenance: measured, method}. "
            "Run records hold raw measured seconds (median of 'repeats' timed "
            "repeats over all passes, each after warm-up; 'all_seconds' lists "
            "them) with the backend that measured them, and the 'occasion' "
            "(this characterisation) that took them. Profile estimates are "
            "under 'estimated' only."),
        "measured": {
            "throughput": _throughput(machine, runs),
            "host_link": link,
            "device_to_device": peers,
            **({"network": network} if network is not None else {}),
            "background_load": {"before": load_before,
                                "after": _background(machine) if is_cpu else None},
        },
        "estimated": _estimates(machine),
        "disturbed_retries": {
            "count": len(disturbed),
            "note": f"runs redone (at most {RETRIES} times each) because other "
                    f"processes took more than {OTHERS_MAX:.0%} of the cores "
                    "while they ran; the last try is kept either way",
            "others_share": [measured(x, "fraction of core time",
                                      "/proc/stat busy time of all cores minus "
                                      "the CPU time of our processes, over the "
                                      "run") for x in disturbed]},
        "runs": runs,
    }


#: A run is redone when other processes took more than this share of the
#: cores' time while it ran (at most RETRIES times; the last try is kept).
OTHERS_MAX = 0.10
RETRIES = 3


def _cpu_seconds_ours(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) used so far by these processes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def _cpu_seconds_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores so far, from /proc/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / tick, sum(ticks) / tick


def _disturbance(cores: Mapping[str, int], before: Mapping[int, tuple[int, int]],
                 after: Mapping[int, tuple[int, int]]) -> dict[str, Any]:
    """Counts on each device's core before and after, and the capacity they
    leave (:func:`~lib.platform.telemetry.capacity_of`, each thread runnable
    for the fraction of the two looks it was seen in)."""
    demand: dict[int, dict[int, float]] = {}
    pids = {}
    for look in (before, after):
        for tid, (core, pid) in look.items():
            row = demand.setdefault(core, {})
            row[tid] = row.get(tid, 0.0) + 0.5
            pids[tid] = pid
    devices = list(cores)
    caps = capacity_of(demand, pids, [cores[d] for d in devices])

    def count(look: Mapping[int, tuple[int, int]], core: int) -> int:
        return sum(1 for c, _ in look.values() if c == core)
    return {"before": {d: count(before, cores[d]) for d in devices},
            "after": {d: count(after, cores[d]) for d in devices},
            "capacity": dict(zip(devices, caps, strict=True))}


def _undisturbed_run(runner: Any, task: TaskSpec, dec: Decision, verify: bool,
                     disturbed: list[float], watch: bool, retry: bool = True) -> Any:
    """Run once; on the cpu backend, redo a run other processes disturbed,
    and record in ``result.detail["disturbance"]`` how disturbed the kept try
    was (:func:`_disturbance`)."""
    cores: dict[str, int] = {}
    if watch:
        ids = core_ids(runner.machine) if hasattr(runner, "machine") else []
        cores = {str(g): ids[g] for g in dec.gpus if g < len(ids)}
    for attempt in range(RETRIES + 1):
        if not watch:
            return runner.run(task, dec, verify=verify)
        pids = [os.getpid()] + [w.pid for w in getattr(runner, "workers", [])]
        ours0, (busy0, total0) = _cpu_seconds_ours(pids), _cpu_seconds_busy()
        others0 = runnable_look(own_pids(pids))
        result = runner.run(task, dec, verify=verify)
        pids = [os.getpid()] + [w.pid for w in getattr(runner, "workers", [])]
        others1 = runnable_look(own_pids(pids))
        ours1, (busy1, total1) = _cpu_seconds_ours(pids), _cpu_seconds_busy()
        if cores:
            result.detail["disturbance"] = _disturbance(cores, others0, others1)
        span = total1 - total0
        others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / span \
            if span > 0 else 0.0
        if others <= OTHERS_MAX or attempt == RETRIES or not retry:
            return result
        disturbed.append(others)
    return result


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _single_device(run: Mapping[str, Any]) -> int | None:
    gpus = run["decision"]["gpus"]
    return gpus[0] if len(gpus) == 1 else None


def _line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` -> (a, b)."""
    b, a = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(a), float(b)


def _throughput(machine: Machine, runs: Sequence[Mapping[str, Any]]
                ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    method = ("median of every timed repeat (all passes) of one single-device "
              "run, end to end (dispatch, shared-memory hand-off, compute, "
              "result copy)")
    for dev in range(machine.n):
        per_kind: dict[str, Any] = {}
        for kind in KINDS:
            rows = [r for r in runs if r["task"]["kind"] == kind
                    and _single_device(r) == dev and r["purpose"] == "throughput"]
            if not rows:
                continue
            points = []
            for r in sorted(rows, key=lambda r: r["measured_seconds"]):
                task = TaskSpec.from_json(r["task"])
                work = workload(task).total_work(task)
                s = r["measured_seconds"]
                points.append({
                    "dims": task.to_json()["dims"], "flops": work.flops,
                    "bytes": work.mem_traffic,
                    "seconds": measured(s, "s", method),
                    "flop_rate": measured(work.flops / s, "FLOP/s",
                                          "work count (lib.platform.workloads) "
                                          "/ seconds"),
                    "byte_rate": measured(work.mem_traffic / s, "B/s",
                                          "memory traffic (lib.platform.workloads) / "
                                          "seconds"),
                })
            entry: dict[str, Any] = {"points": points}
            bound = workload(kind).bound
            x = [p["flops"] if bound == "compute" else p["bytes"] for p in points]
            if len(set(x)) >= 2:
                a, b = _line(x, [p["seconds"]["value"] for p in points])
                unit = "FLOP/s" if bound == "compute" else "B/s"
                what = "FLOP" if bound == "compute" else "bytes of memory traffic"
                fit = ("derived from the measured points: least-squares line of "
                       f"seconds against {what}")
                if b > 0:
                    entry["marginal_rate"] = measured(1.0 / b, unit,
                                                      fit + "; 1 / slope")
                entry["fixed_seconds"] = measured(a, "s", fit + "; intercept")
            per_kind[kind] = entry
        out[str(dev)] = per_kind
    return out


def _host_link(machine: Machine, runner: Any, budget: CharacterisationPlan,
               runs: list[dict[str, Any]], bar: Any) -> dict[str, Any]:
    """Latency from a near-empty task; bandwidth from elementwise runs."""
    tiny = TaskSpec("elementwise", {"N": 1})
    out: dict[str, Any] = {}
    for dev in range(machine.n):
        dec = decision_from_weights(tiny, [dev], [1.0],
                                    block=machine.block_for([dev])).with_hash(tiny)
        record = _run_record(tiny, dec, [runner.run(tiny, dec)
                                         for _ in range(budget.latency_runs)],
                             "latency")
        times = record["all_seconds"]
        runs.append(record)
        bar.update()
        entry = {"latency": measured(
            statistics.median(times), "s",
            f"median end-to-end time of {len(times)} runs of a one-element "
            "elementwise task on this device: dispatch over a pipe, mapping the "
            "shared inputs, the result's way back")}
        rows = [r for r in runs if r["task"]["kind"] == "elementwise"
                and _single_device(r) == dev and r["purpose"] == "throughput"]
        if len(rows) >= 2:
            moved, secs = [], []
            for r in rows:
                w = workload("elementwise").total_work(TaskSpec.from_json(r["task"]))
                moved.append(w.bytes_in + w.bytes_out)
                # the least disturbed repeat: other work only ever adds time,
                # and one slow repeat of a small size can tip a short line
                secs.append(min(r.get("all_seconds") or [r["measured_seconds"]]))
            _, slope = _line(moved, secs)
            if slope > 0:
                entry["bandwidth"] = measured(
                    1.0 / slope, "B/s",
                    "1 / slope of end-to-end seconds (the fastest repeat of each "
                    "run) against bytes handed over (inputs in + result out) "
                    "for single-device elementwise runs of every size; the slope "
                    "also holds the a*x+y arithmetic and the worker's own memory "
                    "traffic, so this is a lower bound on the hand-off's "
                    "bandwidth")
        out[str(dev)] = entry
    return out


def _shm_host(machine: Machine, budget: CharacterisationPlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dev, core in enumerate(core_ids(machine)):
        write_s, read_s = shm_copy_seconds(budget.copy_bytes, core, core,
                                            budget.copy_repeats)
        how = (f"median of {budget.copy_repeats} copies of {budget.copy_bytes} "
               f"bytes by this process pinned to core {core}, through a fresh "
               f"file mapping in {shm_root()} (page faults included)")
        out[str(dev)] = {
            "write_bandwidth": measured(budget.copy_bytes / write_s, "B/s",
                                        "into shared memory: " + how),
            "read_bandwidth": measured(budget.copy_bytes / read_s, "B/s",
                                       "out of shared memory: " + how)}
    return out


def _peers(machine: Machine, budget: CharacterisationPlan) -> dict[str, Any]:
    cores = core_ids(machine)
    pairs = [(i, j) for i in range(machine.n) for j in range(machine.n) if i != j]
    if not pairs:
        return {}
    latency = ping_pong_seconds(sorted({(cores[i], cores[j]) for i, j in pairs}),
                                 budget.copy_repeats)
    out: dict[str, Any] = {
        "note": "the cpu backend merges in the host process; workers never send "
                "to each other, so these figures describe the path a peer "
                "exchange would take, not one Eq. (1) uses on this backend"}
    for i, j in pairs:
        _, read_s = shm_copy_seconds(budget.copy_bytes, cores[i], cores[j],
                                      budget.copy_repeats)
        out[f"{i}->{j}"] = {
            "bandwidth": measured(
                budget.copy_bytes / read_s, "B/s",
                f"{budget.copy_bytes} bytes written to shared memory on core "
                f"{cores[i]}, copied out through a fresh mapping on core "
                f"{cores[j]}; median of {budget.copy_repeats}"),
            "latency": measured(
                latency[(cores[i], cores[j])], "s",
                f"half the median round trip of a one-byte message over a pipe "
                f"between processes pinned to cores {cores[i]} and {cores[j]}")}
    return out


def _estimates(machine: Machine) -> dict[str, Any]:
    devices = {}
    for d in machine.devices:
        devices[str(d.index)] = {
            "peak_fp32": estimated(d.peak_fp32, "FLOP/s", d.notes.get(
                "peak_fp32", "profile estimate")),
            "mem_bw": estimated(d.mem_bw, "B/s", d.notes.get(
                "mem_bw", "profile estimate"))}
    links = {str(i): {"bandwidth": estimated(link.bandwidth, "B/s", link.note),
                      "latency": estimated(link.latency, "s", link.note)}
             for i, link in enumerate(machine.host_links)
             if link.provenance == "estimated"}
    peers = {f"{i}-{j}": {"bandwidth": estimated(link.bandwidth, "B/s", link.note),
                          "latency": estimated(link.latency, "s", link.note)}
             for (i, j), link in sorted(machine.peers.items())
             if link.provenance == "estimated"}
    return {"note": "the machine profile's own figures, for comparison; not "
                    "measured here and never pooled with the measured section",
            "devices": devices, "host_links": links, "peers": peers}


def write_characterisation(obj: Mapping[str, Any],
                           path: str | Path | None = None) -> Path:
    """Write a characterisation as JSON, atomically.

    Args:
        obj: what :func:`characterise` returned.
        path: target file; default ``$GPUHIVE_HOME/characterisation/<machine>.json``.

    Returns:
        The path written.
    """
    target = Path(path) if path is not None else characterisation_path(obj["machine"])
    return write_json_atomic({k: v for k, v in obj.items() if k != "path"}, target)
