"""The fit behind calibration: robust least squares of Eq. (1) to measured runs.

Least squares on log time (so every run counts by its relative error), made
robust with Huber weights (iteratively re-weighted), with Levenberg-Marquardt
over the logarithms of the parameters, numeric Jacobian (its columns in one
evaluation of the array model, each a row of parameter values), NumPy only. A
parameter the runs cannot move (its roofline limit never binds, say) keeps its
default and is not listed as fitted. The runs it reads, their held-out split
and the statistics the report scores with are :mod:`lib.costmodel.runs`.

A run taken under load is not thrown away: where its record says what capacity
each device had (``disturbance.capacity``, written by characterisation), the
model predicts it at that capacity (compute time / capacity), as it would a
live snapshot's. Runs without the field (older files) are predicted at full
capacity, as before.

Which runs' data stayed in the cache is decided by the last-level cache's
size, and the size a device reports is not always the one its runs see: a
virtual machine's two cores can report the host chip's whole L3 (480 MiB,
shared with every other tenant), and then every characterisation task
"fits", the cache term cannot be told from the memory efficiencies, and the
model misses the runs that stream from memory. So :func:`fit_params` also
chooses, per device kind, the size the runs behave as if they had
(``CostParams.cache_size``): each distinct split of the runs into fitting
and not fitting that a power-of-two number of MiB up to the reported size
makes (and none fitting) is ranked by one robust pass of the fit, the two
best are fitted in full, and the reported size stays unless one of them
leaves a mean absolute log error lower by :data:`CACHE_GAIN`.

Each kernel kind's own fixed cost a shard (``CostParams.fixed_s``, a part of
its launch) is offered for the kinds whose runs have more than one size.
The runs tell only the kinds' differences apart: the part they all share is
the launch's, so after the fit it is moved there and the cheapest kind adds
nothing of its own (:func:`_shared_part_to_launch`; every run is predicted
as before).

Runs pooled from several characterisations (occasions: a quiet one and
one taken under load, say) are not asked to share one speed. The same runs
characterised twice minutes apart on a virtual machine differ by a median
factor of 1.1 to 1.3, as its host's other tenants come and go, so each
occasion after the first gets a pace of its own, a factor on its runs'
times fitted with the rest (:func:`pace_slots`); the parameters are the
first occasion's. Without it the fit could only split the difference,
between the two occasions' speeds and, for the runs under load, between
the speed and the load.

Why one module: the entries the runs can fit (:func:`slots_for`), the array
shortcut of Eq. (1) the fit's inner loop evaluates (:class:`_FastModel`), the
fit and the choice of cache size must agree on which entries exist and on
which side of the cache each run falls; apart, a change to one would fit
parameters the others price differently, and nothing would say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lib.contract import KINDS, decision_from_weights
from lib.costmodel.model import (
    CACHE_FIT,
    CostParams,
    default_params,
    fits_cache,
    predict,
)
from lib.costmodel.parameters import CalibrationError
from lib.costmodel.runs import MeasuredRun
from lib.platform.machines import Machine
from lib.platform.workloads import split_rows, whole_work, workload

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
#: Runs under load on a device kind (a recorded capacity below 1 on a device
#: of it) the fit needs before it fits how load slows that kind
#: (``contention``, ``sched_wait``). A quiet characterisation has the odd run
#: during which telemetry saw another process pass; fitted from one such run,
#: the exponent reached its bound and every loaded prediction on the machine
#: came out at 0.6 of the measured time.
MIN_LOADED_RUNS = 8

#: Box on the fitted values (efficiencies are relative to profile peaks, which
#: for CPU cores are estimates, so values above 1 are possible and honest).
#: The contention exponent is at least 1: capacity telemetry measures the
#: share a shard of ours gets (other sessions' weights, how often their
#: threads are runnable), and a shard short enough to run before it feels the
#: contention is the burst's (``burst_s``), so nothing is left for an
#: exponent below 1 to say but noise. With 0.5 allowed, a fit of nine loaded
#: runs put it there (+-441 %), and the optimum then gave the busy core 0.35
#: of a long task with one other process there (its share was about 0.26)
#: and 0.29 with two (about 0.17): those splits took 1.2 to 1.7 times as long
#: as the learned policy's (MEASURED, local-cpu, cpu backend). On the same
#: 133 runs, the exponent came out 0.90 free and 1 held at 1, with a
#: cross-validated median error of 11.4 % and 11.1 %.
_BOUNDS = {"compute_eff": (1e-4, 1e3), "memory_eff": (1e-4, 1e3),
           "launch_s": (1e-8, 10.0), "link_scale": (1e-3, 1e3),
           "latency_scale": (1e-2, 10.0),
           "contention": (1.0, 4.0), "sched_wait": (1e-7, 0.1),
           "host_s": (1e-8, 1.0), "cache_bw": (0.1, 10.0), "corun": (1e-4, 4.0),
           "burst_s": (1e-6, 1.0), "fixed_s": (1e-8, 0.1), "pace": (0.25, 4.0)}
#: Where the fit starts (and its prior is centred) for a term whose default is
#: off (0): the scheduler wait starts at 0.1 ms, a fraction of a time slice;
#: the host's cost of a shard at 10 us, a message to a worker and back; two
#: co-running devices at 5 % slower each; a woken shard runs free for 0.1 ms;
#: a kind's own fixed cost a shard at 10 us.
_START = {"sched_wait": 1e-4, "host_s": 1e-5, "corun": 0.05, "burst_s": 1e-4,
          "fixed_s": 1e-5}
#: A cache size other than the reported one is kept when its fit's mean
#: absolute log error on the runs is lower by this fraction (one more
#: partition of the runs must earn its place, not win by noise).
CACHE_GAIN = 0.05
#: Runs needed on each side of a cache size before it is tried (a split that
#: puts one run in the cache gives the cache term one run to fit exactly).
MIN_CACHE_SIDE = 3
#: Runs each of several pooled characterisations (occasions) needs before
#: the fit gives the later ones a pace of their own against the first.
MIN_OCCASION_RUNS = 8
#: The smallest cache size tried (no last-level cache is smaller); the
#: others are its powers of two (:func:`cache_sizes`).
_MIB = 2.0 ** 20



# --------------------------------------------------------------------------
# The fit

@dataclass(frozen=True)
class _Slot:
    """Where one fitted number lives in CostParams."""

    table: str            # compute_eff / memory_eff / launch_s / link_scale /
                          # latency_scale / contention / sched_wait / host_s /
                          # cache_bw / corun / burst_s / fixed_s; or pace, an
                          # occasion's, which is the fit's and not CostParams'
    key: Any              # (device kind, kind), device kind, or occasion

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
    if slot.table == "contention":
        return params.contention.get(slot.key, 1.0)
    if slot.table == "sched_wait":
        return params.sched_wait.get(slot.key, 0.0)
    if slot.table == "host_s":
        return params.host_s.get(slot.key, 0.0)
    if slot.table == "cache_bw":
        return params.cache_bw.get(slot.key, 1.0)
    if slot.table == "corun":
        return params.corun.get(slot.key, 0.0)
    if slot.table == "latency_scale":
        return params.latency_scale.get(slot.key, 1.0)
    if slot.table == "burst_s":
        return params.burst_s.get(slot.key, 0.0)
    if slot.table == "fixed_s":
        return params.fixed(*slot.key)
    if slot.table == "pace":
        return 1.0
    return params.link_scale.get(slot.key, 1.0)


def params_with(params: CostParams, slots: Sequence[_Slot], values: Sequence[float],
          source: str = "", fitted: tuple[str, ...] = ()) -> CostParams:
    tables = {"compute_eff": dict(params.compute_eff),
              "memory_eff": dict(params.memory_eff),
              "launch_s": dict(params.launch_s),
              "link_scale": dict(params.link_scale),
              "contention": dict(params.contention),
              "sched_wait": dict(params.sched_wait),
              "host_s": dict(params.host_s),
              "cache_bw": dict(params.cache_bw),
              "corun": dict(params.corun),
              "latency_scale": dict(params.latency_scale),
              "burst_s": dict(params.burst_s),
              "fixed_s": dict(params.fixed_s)}
    for slot, value in zip(slots, values, strict=True):
        if slot.table != "pace":  # an occasion's, not the machine's
            tables[slot.table][slot.key] = float(value)
    return CostParams(**tables, cache_size=dict(params.cache_size),
                      source=source or params.source, fitted=fitted or params.fitted)


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
        g_col: list[int] = []
        t_col: list[int] = []       # latency_scale slot
        w_col: list[int] = []
        h_col: list[int] = []
        c_col: list[int] = []       # cache_bw slot, where the task fits the cache
        r_col: list[int] = []       # corun slot
        peers: list[float] = []     # k - 1: co-running devices of the same kind
        fits: list[float] = []      # 1 where the task's data fit the cache
        stretch: list[float] = []   # 1 / capacity the run had on the device
        b_col: list[int] = []       # burst_s slot
        f_col: list[int] = []       # fixed_s slot
        # the device's shard of an equal split over the machine, the length a
        # calibrated burst is judged at (lib.costmodel.contention.calibrated_bursts)
        eq: dict[str, list[float]] = {k: [] for k in (
            "flops", "traffic", "bin", "bout", "lat_in", "lat_out", "peers")}
        fixed: dict[str, list[float]] = {t: [] for t in _BOUNDS}
        for r, run in enumerate(runs):
            task, dec = run.task, run.decision
            k = sum(1 for lo, hi in split_rows(task.split_size, dec.shares) if hi > lo)
            if dec.mode == "pipelined" or (task.merge == "sum" and k > 1
                                           and dec.comm_path != "host"):
                self.slow.append(r)
                continue
            w = workload(task)
            active = [g for g, (lo, hi) in zip(dec.gpus, split_rows(
                task.split_size, dec.shares), strict=True) if hi > lo]
            equal = split_rows(task.split_size, decision_from_weights(
                task, range(machine.n), [1.0] * machine.n).shares)
            equal_active = [g for g, (lo, hi) in enumerate(equal) if hi > lo]
            for dev_index, (lo, hi) in zip(dec.gpus, split_rows(task.split_size,
                                                               dec.shares),
                                           strict=True):
                if hi == lo:
                    continue
                dev = machine.devices[dev_index]
                fit = fits_cache(task, base.cache_bytes(dev))
                fits.append(1.0 if fit else 0.0)
                c_col.append(index.get(_Slot("cache_bw", dev.kind), -1) if fit
                             else -1)
                r_col.append(index.get(_Slot("corun", dev.kind), -1))
                peers.append(float(sum(machine.devices[g].kind == dev.kind
                                       for g in active) - 1))
                link = machine.host_link(dev_index)
                work = w.work(task, hi - lo)
                cols["flops"].append(work.flops)
                cols["traffic"].append(work.mem_traffic)
                # On a Dask cluster the inputs are made on the workers (Eq. (1)).
                moved_in = 0.0 if machine.cluster else work.bytes_in
                cols["bin"].append(moved_in)
                cols["bout"].append(work.bytes_out)
                cols["lat_in"].append(link.latency if moved_in > 0 else 0.0)
                cols["lat_out"].append(link.latency if work.bytes_out > 0 else 0.0)
                cols["peak"].append(dev.peak_flops(task.dtype))
                cols["bw"].append(dev.mem_bw)
                cols["link_bw"].append(link.bandwidth)
                stretch.append(1.0 / (run.capacity or {}).get(dev_index, 1.0))
                b_col.append(index.get(_Slot("burst_s", dev.kind), -1))
                f_col.append(index.get(_Slot("fixed_s", (dev.kind, task.kind)), -1))
                lo_eq, hi_eq = equal[dev_index]
                work_eq = w.work(task, hi_eq - lo_eq)
                in_eq = 0.0 if machine.cluster else work_eq.bytes_in
                eq["flops"].append(work_eq.flops)
                eq["traffic"].append(work_eq.mem_traffic)
                eq["bin"].append(in_eq)
                eq["bout"].append(work_eq.bytes_out)
                eq["lat_in"].append(link.latency if in_eq > 0 else 0.0)
                eq["lat_out"].append(link.latency if work_eq.bytes_out > 0 else 0.0)
                eq["peers"].append(float(sum(machine.devices[g].kind == dev.kind
                                             for g in equal_active) - 1))
                e_col.append(index.get(_Slot("compute_eff", (dev.kind, task.kind)),
                                       -1))
                m_col.append(index.get(_Slot("memory_eff", (dev.kind, task.kind)),
                                       -1))
                launch_key = launch_slot(machine, dev.kind)
                l_col.append(index.get(_Slot("launch_s", launch_key), -1))
                s_col.append(index.get(_Slot("link_scale", dev.kind), -1))
                t_col.append(index.get(_Slot("latency_scale", dev.kind), -1))
                g_col.append(index.get(_Slot("contention", dev.kind), -1))
                w_col.append(index.get(_Slot("sched_wait", dev.kind), -1))
                h_col.append(index.get(_Slot("host_s", dev.kind), -1))
                # Values of entries that are not fitted (never change).
                for table, key in (("compute_eff", (dev.kind, task.kind)),
                                   ("memory_eff", (dev.kind, task.kind)),
                                   ("launch_s", launch_key), ("link_scale", dev.kind),
                                   ("latency_scale", dev.kind),
                                   ("contention", dev.kind),
                                   ("sched_wait", dev.kind),
                                   ("host_s", dev.kind), ("cache_bw", dev.kind),
                                   ("corun", dev.kind), ("burst_s", dev.kind),
                                   ("fixed_s", (dev.kind, task.kind))):
                    fixed[table].append(_get(base, _Slot(table, key)))
                owner.append(r)
            # Host merges cost k * bytes / host memory bandwidth: no parameter.
            cols["merge"].append(0.0)
            if task.merge == "sum" and k > 1:
                cols["merge"][-1] = k * w.work(task, 1).bytes_out / machine.host_mem_bw
        self.cols = {k: np.asarray(v, float) for k, v in cols.items() if k != "merge"}
        self.merge = np.asarray(cols["merge"], float)
        self.stretch = np.asarray(stretch, float)
        self.eq = {k: np.asarray(v, float) for k, v in eq.items()}
        self.stretched = bool(np.any(self.stretch != 1.0))
        self.peers = np.asarray(peers, float)
        self.fits = np.asarray(fits, float)
        #: t_host applies off a Dask cluster only (lib.costmodel.model.host_seconds)
        self.host_on = 0.0 if machine.cluster else 1.0
        self.owner = np.asarray(owner, int)
        self.fast = [r for r in range(len(runs)) if r not in set(self.slow)]
        # reduceat needs each run's first row; runs are contiguous in owner.
        self.starts = np.searchsorted(self.owner, np.asarray(self.fast, int))
        # each run's occasion's pace (-1: the first occasion's, 1)
        self.pace_col = np.asarray([index.get(_Slot("pace", run.occasion), -1)
                                    for run in runs], int)
        # Every entry a row reads, in one gather from ``values`` and the fixed
        # values after it: a fitted slot's column, else the row's own default.
        columns = {"compute_eff": e_col, "memory_eff": m_col, "launch_s": l_col,
                   "link_scale": s_col, "latency_scale": t_col, "contention": g_col,
                   "sched_wait": w_col, "host_s": h_col, "cache_bw": c_col,
                   "corun": r_col, "burst_s": b_col, "fixed_s": f_col}
        n_rows = len(self.owner)
        self.tables = tuple(columns)
        self.gather = np.stack([
            np.where(col >= 0, col, len(slots) + k * n_rows + np.arange(n_rows))
            for k, col in enumerate(np.asarray(c, int) for c in columns.values())])
        self.fixed_values = np.concatenate([np.asarray(fixed[t], float)
                                            for t in self.tables])

    def predict(self, values: np.ndarray) -> np.ndarray:
        """Predicted seconds of every run with ``values`` in the fitted slots.

        ``values`` is one vector of slot values, or a stack of them (one per
        row, as the fit's numeric Jacobian asks for); the result has a row of
        runs for each. The arithmetic is element by element, so each row is
        what ``values``' row alone would give.
        """
        values = np.asarray(values, float)
        out = np.empty(values.shape[:-1] + (len(self.runs),))
        if self.fast:
            c = self.cols
            every = np.concatenate([values, np.broadcast_to(
                self.fixed_values, values.shape[:-1] + self.fixed_values.shape)],
                axis=-1)
            # each table's entry for every row: (..., rows)
            v = dict(zip(self.tables, np.moveaxis(every[..., self.gather], -2, 0),
                         strict=True))
            e, em, lat, corun = (v["compute_eff"], v["memory_eff"],
                                 v["latency_scale"], v["corun"])
            bw = c["link_bw"] * v["link_scale"]
            # the cache's multiple applies where the task fits (else 1)
            cache = np.where(self.fits > 0, v["cache_bw"], 1.0)
            # a kernel of this kind's own cost beside the shared launch
            launch = v["launch_s"] + v["fixed_s"]

            def shard(cols: dict[str, np.ndarray], peers: np.ndarray,
                      start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                """(launch, latencies and copies; compute) of each row's shard."""
                comp = np.maximum(cols["flops"] / (c["peak"] * e),
                                  cols["traffic"] / (c["bw"] * em * cache)) \
                    * (1.0 + corun * peers)
                return start + (cols["lat_in"] + cols["lat_out"]) * lat \
                    + (cols["bin"] + cols["bout"]) / bw, comp

            fixed, comp = shard(c, self.peers, launch)
            if self.stretched:
                stretch = self.stretch
                b = v["burst_s"]
                burst = np.any(b > 0, axis=-1, keepdims=True)
                if np.any(burst):
                    # the part of the contention a shard of this length feels
                    # (lib.costmodel.contention.calibrated_bursts)
                    eq_fixed, eq_comp = shard(self.eq, self.eq["peers"], launch)
                    tau = eq_fixed + eq_comp
                    felt = np.where(b > 0, np.clip(1.0 - b / np.maximum(tau, 1e-300),
                                                   0.0, None), 1.0)
                    # a set of values without a burst keeps the stretch as it is
                    stretch = np.where(burst, 1.0 + felt * (stretch - 1.0), stretch)
                comp = comp * stretch ** v["contention"]
                # the scheduler wait (lib.costmodel.model.wait_seconds)
                fixed = fixed + v["sched_wait"] * (stretch - 1.0)
            t = fixed + comp
            host = v["host_s"] * self.host_on
            t, host = np.broadcast_arrays(t, host)
            out[..., self.fast] = np.maximum.reduceat(t, self.starts, axis=-1) \
                + self.merge + np.add.reduceat(host, self.starts, axis=-1)
        if self.slow:
            for row in np.ndindex(values.shape[:-1]):
                full = params_with(self.base, self.slots, values[row])
                for r in self.slow:
                    run = self.runs[r]
                    out[row + (r,)] = predict(run.task, run.decision, self.machine,
                                              run.snapshot(self.machine, full),
                                              full).total
        # a later occasion's runs take its pace times what the first's would
        return out * np.where(self.pace_col >= 0,
                              values[..., np.maximum(self.pace_col, 0)], 1.0)


def slots_for(machine: Machine, runs: Sequence[MeasuredRun],
              params: CostParams | None = None) -> list[_Slot]:
    """The entries the runs can fit, with ``params``' cache sizes deciding
    which runs' data stay in the cache (default: the reported sizes)."""
    params = params or default_params()
    dev_kinds = sorted({machine.devices[g].kind for r in runs for g in r.decision.gpus})
    kinds = [k for k in KINDS if any(r.task.kind == k for r in runs)]
    slots = []
    for dk in dev_kinds:
        for k in kinds:
            slots += [_Slot("compute_eff", (dk, k)), _Slot("memory_eff", (dk, k))]
        if len(kinds) > 1 and not machine.cluster:
            # a kind's own fixed cost, where its runs have more than one size
            # (with one kind, the shared fixed costs are all there is to tell;
            # on a Dask cluster the launch is the cluster's, not the kind's)
            slots += [_Slot("fixed_s", (dk, k)) for k in kinds
                      if len(_sizes_of(machine, runs, dk, k)) > 1]
        if machine.cluster:
            slots += [_Slot("launch_s", launch_slot(machine, dk)),
                      _Slot("link_scale", dk)]
        elif _launch_apart(machine, runs, dk):
            slots += [_Slot("launch_s", dk), _Slot("link_scale", dk),
                      _Slot("latency_scale", dk)]
        else:  # one fixed cost a shard: the latency's scale holds it all
            slots += [_Slot("link_scale", dk), _Slot("latency_scale", dk)]
        counts = {sum(1 for g, s in zip(r.decision.gpus, r.decision.shares,
                                        strict=True)
                      if s > 0 and machine.devices[g].kind == dk) for r in runs}
        if 1 in counts and any(c > 1 for c in counts):
            if not machine.cluster:
                slots.append(_Slot("host_s", dk))  # one shard against several
            slots.append(_Slot("corun", dk))
        fit = {fits_cache(r.task, params.cache_bytes(machine.devices[g])) for r in runs
               for g in r.decision.gpus if machine.devices[g].kind == dk}
        if fit == {True, False}:
            slots.append(_Slot("cache_bw", dk))  # runs on both sides of the cache
        loaded = sum(any((r.capacity or {}).get(g, 1.0) < 1.0
                             for g in r.decision.gpus
                             if machine.devices[g].kind == dk) for r in runs)
        if loaded >= MIN_LOADED_RUNS:
            # only runs under load tell these, and only enough of them
            slots += [_Slot("contention", dk), _Slot("sched_wait", dk),
                      _Slot("burst_s", dk)]
    return slots + pace_slots(runs)


def pace_slots(runs: Sequence[MeasuredRun]) -> list[_Slot]:
    """A pace for each occasion after the first, where the runs come from
    several (characterisations pooled in one fit) and each has
    :data:`MIN_OCCASION_RUNS`: the factor its runs' times take against the
    first occasion's. A machine's speed moves from one occasion to the next
    (on a virtual machine, with the other tenants of its host), and one set
    of efficiencies asked to serve two occasions misses both; the
    parameters are the first occasion's."""
    counts: dict[int, int] = {}
    for r in runs:
        counts[r.occasion] = counts.get(r.occasion, 0) + 1
    if len(counts) < 2 or min(counts.values()) < MIN_OCCASION_RUNS:
        return []
    first = min(counts)
    return [_Slot("pace", k) for k in sorted(counts) if k != first]


def _sizes_of(machine: Machine, runs: Sequence[MeasuredRun], device_kind: str,
              kind: str) -> set[int]:
    """The shard sizes (rows) runs of ``kind`` gave devices of ``device_kind``."""
    return {hi - lo for r in runs if r.task.kind == kind
            for g, (lo, hi) in zip(r.decision.gpus, split_rows(r.task.split_size,
                                                              r.decision.shares),
                                   strict=True)
            if hi > lo and machine.devices[g].kind == device_kind}


def _launch_apart(machine: Machine, runs: Sequence[MeasuredRun], kind: str) -> bool:
    """Whether the runs tell a shard's launch from its copies' latencies on
    devices of ``kind``: a pipelined run (a launch and copies per chunk) or
    shards that copy a different number of times (one with nothing to copy
    out, say). Where every shard launches once and copies in and out once,
    Eq. (1) sees only their sum: two parameters for it would trade off
    without end, so the latency's scale takes it all (it can go below the
    profile's estimate, as a launch cannot go below zero) and the launch
    keeps its default."""
    copies = set()
    for r in runs:
        w = workload(r.task)
        for g, (lo, hi) in zip(r.decision.gpus, split_rows(r.task.split_size,
                                                          r.decision.shares),
                               strict=True):
            if hi <= lo or machine.devices[g].kind != kind:
                continue
            if r.decision.mode == "pipelined":
                return True
            work = w.work(r.task, hi - lo)
            copies.add((work.bytes_in > 0) + (work.bytes_out > 0))
    return len(copies) > 1


def launch_slot(machine: Machine, device_kind: str) -> str:
    """The ``launch_s`` entry a run's fixed cost is fitted to: the device
    kind's launch, or on a Dask cluster the decision's fixed cost
    (``dask-decision``), which a per-device constant cannot tell apart."""
    return "dask-decision" if machine.cluster else device_kind


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
    """Forward differences of ``residual`` in the ``free`` coordinates, one
    column each. ``residual`` takes a stack of parameter vectors (one per
    row) as well as one, so all the columns cost one call."""
    moved = np.flatnonzero(free)
    if not len(moved):
        return np.zeros((len(r), 0))
    trial = np.repeat(theta[None, :], len(moved), axis=0)
    trial[np.arange(len(moved)), moved] += h
    return ((residual(trial) - r) / h).T


def _huber_weights(r: np.ndarray) -> np.ndarray:
    """Huber weights ``min(1, k s / |r|)``, s the residuals' scaled MAD."""
    scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    if scale <= 0:
        return np.ones_like(r)
    return np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(r), 1e-300))


def fit_params(machine: Machine, runs: Sequence[MeasuredRun],
               base: CostParams | None = None
               ) -> tuple[CostParams, tuple[str, ...], dict[str, float],
                          dict[int, float]]:
    """Least-squares fit of log time; returns (params, fitted names, rel. s.e.,
    paces).

    The cache size of each device kind is chosen as the module docstring
    says (:func:`cache_sizes` lists the sizes tried); a size other than the
    device's reported one is carried in ``params.cache_size``. Where the runs
    come from several occasions (:func:`pace_slots`), ``params`` are the
    first occasion's and ``paces`` maps each later one to the factor its
    runs' times take (:func:`predict` times it is what the fit predicts a
    run of that occasion at; empty with one occasion). The rest is
    :func:`_fit_once`.
    """
    base = base or default_params()
    best = _fit_once(machine, runs, base)
    for kind, sizes in cache_sizes(machine, runs, base).items():
        # a shorter fit (one robust pass) ranks the sizes; the full fit
        # decides between the reported size and the two best of them
        start = best[0]
        ranked = sorted(sizes, key=lambda size: _fit_once(
            machine, runs, _sized(base, start, kind, size), quick=True)[3])
        kept = best[3]
        for size in ranked[:2]:
            trial = _fit_once(machine, runs, _sized(base, start, kind, size))
            if trial[3] < (1.0 - CACHE_GAIN) * kept and trial[3] < best[3]:
                best = trial
    return best[0], best[1], best[2], best[4]


def _sized(base: CostParams, chosen: CostParams, kind: str, size: float
           ) -> CostParams:
    """``base`` with the cache sizes ``chosen`` has and ``size`` for ``kind``."""
    return replace(base, cache_size={**chosen.cache_size, kind: size})


def cache_sizes(machine: Machine, runs: Sequence[MeasuredRun],
                params: CostParams) -> dict[str, list[float]]:
    """Per device kind, the cache sizes :func:`fit_params` tries besides the
    one ``params`` prices with: powers of two of MiB up to that size (up to
    twice the largest task's data where the devices report none), one per
    distinct split of the kind's runs into fitting and not fitting, with
    :data:`MIN_CACHE_SIDE` runs on each side, and none fitting (size 0, the
    cache term off)."""
    out: dict[str, list[float]] = {}
    for kind in sorted({machine.devices[g].kind
                        for r in runs for g in r.decision.gpus}):
        devs = [d for d in machine.devices if d.kind == kind]
        tasks = [r.task for r in runs
                 if any(machine.devices[g].kind == kind for g in r.decision.gpus)]
        reported = max(params.cache_bytes(d) for d in devs)
        top = reported if reported > 0 else max(
            2.0 * (w.bytes_in + w.bytes_out) / CACHE_FIT
            for w in (whole_work(t) for t in tasks))
        seen = {tuple(fits_cache(t, reported) for t in tasks)}
        sizes = []
        for size in [0.0] + [_MIB * 2.0 ** k for k in range(0, 40)
                             if _MIB * 2.0 ** k <= top]:
            split = tuple(fits_cache(t, size) for t in tasks)
            inside = sum(split)
            if split in seen or (size > 0 and min(inside, len(split) - inside)
                                 < MIN_CACHE_SIDE):
                continue
            seen.add(split)
            sizes.append(size)
        if sizes:
            out[kind] = sizes
    return out


def _fit_once(machine: Machine, runs: Sequence[MeasuredRun], base: CostParams,
              quick: bool = False
              ) -> tuple[CostParams, tuple[str, ...], dict[str, float], float,
                         dict[int, float]]:
    """The fit at ``base``'s cache sizes: (params, fitted names, rel. s.e.,
    mean absolute log error on ``runs``, the occasions' paces); ``quick``:
    one robust pass, the unidentified parameters left free, and only the
    error returned (with ``base``, no names, no errors, no paces): enough to
    compare cache sizes.

    Unidentified parameters (sensitivity below :data:`MIN_SENSITIVITY`) are
    reset to ``base`` and frozen, and the fit repeated, until the set is stable;
    one the fit drove down (to its lower bound, or 3x below its start) stays
    there.
    The relative standard errors come from the Gauss-Newton covariance
    ``s^2 (J^T J)^-1`` at the optimum (a large one means the data pin the value
    down only weakly, e.g. two parameters that trade off against each other).
    """
    slots = slots_for(machine, runs, base)
    if not slots or not runs:
        raise CalibrationError("no runs to fit")
    fast = _FastModel(runs, machine, slots, base)
    measured = np.log([r.seconds for r in runs])
    start = np.log([_get(base, s) or _START[s.table] for s in slots])
    lo = np.log([_BOUNDS[s.table][0] for s in slots])
    hi = np.log([_BOUNDS[s.table][1] for s in slots])

    def data_residual(theta: np.ndarray) -> np.ndarray:
        return np.log(fast.predict(np.exp(theta))) - measured

    weights = np.ones(len(runs))

    def residual(theta: np.ndarray) -> np.ndarray:
        prior = math.sqrt(PRIOR_WEIGHT) * (theta - start)[..., free]
        return np.concatenate([np.sqrt(weights) * data_residual(theta), prior],
                              axis=-1)

    free = np.ones(len(slots), bool)
    theta = start.copy()
    for _ in range(4):
        for _ in range(1 if quick else IRLS_ROUNDS):
            theta = _levenberg_marquardt(residual, theta, lo, hi, free)
            weights = _huber_weights(data_residual(theta))
        if quick:
            return base, (), {}, float(np.mean(np.abs(data_residual(theta)))), {}
        sens = np.abs(_jacobian(data_residual, theta, data_residual(theta),
                                np.ones(len(slots), bool))).max(axis=0)
        # A parameter the data pushed down (to its lower bound, or 3x below
        # where it started, against the prior that holds a confounded one near
        # its start: a launch the host's cost per shard explains away) is
        # insensitive there because it is small, not unidentified. It stays.
        floor = (theta <= lo + 1e-9) | (theta < start - math.log(3.0))
        weak = free & (sens < MIN_SENSITIVITY) & ~floor
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
    paces = {s.key: v for s, v in zip(slots, values, strict=True)
             if s.table == "pace"}
    params = _shared_part_to_launch(
        params_with(base, slots, values, fitted=tuple(
            s.name for s, f in zip(slots, free, strict=True)
            if f and s.table != "pace")),
        [s for s in slots if s.table == "fixed_s"])
    return params, params.fitted, uncertainty, float(np.mean(np.abs(r))), paces


def _shared_part_to_launch(params: CostParams, offered: Sequence[_Slot]
                           ) -> CostParams:
    """``params`` with the part of the kinds' fixed costs that every kind
    the fit ``offered`` one shares moved into its device kind's launch
    (``launch_s``). A kernel's launch is ``launch_s + fixed_s``, so each run
    is predicted as before; but the runs tell only the kinds' differences
    apart, the prior would leave each kind near its start, and a kind no run
    showed (or a registered one) would miss the shared part. So the cheapest
    such kind's own cost is 0 and the launch holds what they share (nothing
    moves where one of them was left at 0, unidentified)."""
    moved: dict[str, float] = {}
    for dk in {s.key[0] for s in offered}:
        moved[dk] = min(params.fixed(*s.key) for s in offered if s.key[0] == dk)
    if not any(v > 0 for v in moved.values()):
        return params
    fixed = {key: v - moved[key[0]] if key[0] in moved else v
             for key, v in params.fixed_s.items()}
    launch = {**params.launch_s, **{dk: params.launch_s.get(dk, 5e-6) + v
                                    for dk, v in moved.items()}}
    fitted_names = params.fitted + tuple(
        f"launch_s[{dk}]" for dk in sorted(moved)
        if moved[dk] > 0 and f"launch_s[{dk}]" not in params.fitted)
    return replace(params, fixed_s=fixed, launch_s=launch, fitted=fitted_names)


