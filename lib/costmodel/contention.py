"""How a device under contention treats a shard *of a given length*.

Capacity says what share of a core a long computation gets; a short one often
gets the whole core, because a scheduler lets a task that has slept run ahead
of a busy one for a while (Linux's EEVDF keeps a sleeping task's lag). On the
cpu backend each worker reports the CPU seconds it spent on its shard next to
the wall seconds, so every run on a device of measured capacity ``c < 1``
gives one sample of the contention the shard *felt*:
``rho = (wall / cpu - 1) / (1 / c - 1)``, 0 where it ran as on a free core, 1
where it got exactly its capacity (:func:`felt_sample`).

The history (:class:`lib.costmodel.history.History`) keeps the samples per
device and per octave of the shard's CPU seconds (:data:`FELT_WINDOW` each, so
a flood of short shards does not push the long ones out; :class:`Felt`), each
with the strength of the contention it was taken under, ``level = 1 / c - 1``
(:func:`contention_level`: 1 for one spinning thread, 2 for two). A burst is
fitted to a device's samples taken at a level within a factor
:data:`LEVEL_REACH` of the present one (:func:`similar_level`,
:func:`fit_burst`, :class:`Burst`): what shards felt beside a process that
reads as a fifth of a core (most often one that mostly sleeps) says nothing
of what they feel beside two spinning ones. The fit: a woken shard runs free
for its first ``b`` seconds and feels ``rho_inf`` of the contention after,
so a shard of ``tau`` CPU seconds feels ``rho(tau) = rho_inf (1 - b / tau)``
past ``b`` and nothing before (least absolute deviations: single runs
disturbed either way do not move it).

:func:`effective_snapshot` turns it into the capacity a shard of *this* task
will effectively get, ``1 / (1 + rho (1 / c - 1))``, and the runtime
(:meth:`lib.runtime.Agent.seen_by_policy`) hands that to the policy and its
cost model. Backends that do not report CPU seconds (cuda, dask) give no
samples, and without samples a snapshot is used as it is.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lib.contract import TaskSpec, decision_from_weights
from lib.costmodel.model import CostParams, predict
from lib.platform.machines import Machine
from lib.platform.telemetry import MIN_CAPACITY, Snapshot

#: Samples kept per device and octave of shard length (the most recent).
FELT_WINDOW = 32
#: A device counts as under contention in a run where its measured capacity
#: was below this (a sample of what a shard felt is taken only then).
CONTENDED_CAPACITY = 0.9
#: Felt contention is clipped to [0, FELT_MAX] (a shard can fare worse than its
#: capacity says, when it waits for another's time slice, but not without
#: bound).
FELT_MAX = 2.0
#: Samples of a device before its burst model is fitted and used.
MIN_FELT_SAMPLES = 8
#: The fit's prior sample: a shard this many times the longest seen feels the
#: contention its capacity says (rho = 1).
PRIOR_REACH = 64.0
#: The burst lengths the fit tries: 24 steps per decade (10 % apart) from
#: 10 us to 10 s.
BURST_GRID = tuple(float(b) for b in np.logspace(-5, 1, 6 * 24 + 1))
#: Shards below this many CPU seconds give no sample (the clock's grain).
MIN_CPU_SECONDS = 2e-5
#: A sample joins the fit for a contention level within this factor of the
#: level it was taken at (one telemetry reading of a loaded core moves by
#: about this much from one look to the next).
LEVEL_REACH = 2.0

METHOD_FELT = ("over runs on a device whose capacity c was below "
               f"{CONTENDED_CAPACITY}: rho = (wall / CPU seconds - 1) / (1 / c - 1), "
               "the contention a shard felt (0: as on a free core, 1: its "
               f"capacity); the last {FELT_WINDOW} samples per octave of shard CPU "
               "time are kept, and rho(tau) = rho_inf max(0, 1 - b / tau) is "
               "fitted by least absolute deviations to a device's samples taken at "
               "a contention level 1 / c - 1 within a factor "
               f"{LEVEL_REACH:g} of the present one, with one prior sample of "
               f"rho = 1 at {PRIOR_REACH:g} times the longest of them")



def contention_level(capacity: float) -> float:
    """The strength of the contention a capacity ``c`` says, ``1 / c - 1``: how
    many threads as busy as a shard share its core (0 on a free core)."""
    return 1.0 / max(float(capacity), MIN_CAPACITY) - 1.0


def capacity_band(level: float) -> tuple[float, float]:
    """The capacities ``(low, high)`` of the octave ``[2**k, 2**(k+1))`` of
    contention level that ``level`` falls in."""
    k = math.floor(math.log2(level))
    return 1.0 / (1.0 + 2.0 ** (k + 1)), 1.0 / (1.0 + 2.0 ** k)


def similar_level(taken: float | None, level: float | None) -> bool:
    """Whether a sample ``taken`` at one contention level speaks for another:
    within a factor :data:`LEVEL_REACH`. An unknown level on either side (a
    sample from a file written before levels were kept, or a question about
    every level) is similar to every level."""
    if taken is None or level is None:
        return True
    if taken <= 0.0 or level <= 0.0:
        return taken == level
    return 1.0 / LEVEL_REACH <= taken / level <= LEVEL_REACH


def felt_sample(wall: float, cpu: float, capacity: float) -> float | None:
    """The contention a shard felt, ``(wall / cpu - 1) / (1 / c - 1)`` clipped
    to ``[0, FELT_MAX]``; None where the run says nothing of it (the device
    was not contended, or the shard too short for the clocks)."""
    if not (cpu >= MIN_CPU_SECONDS and wall > 0 and capacity < CONTENDED_CAPACITY):
        return None
    c = max(capacity, MIN_CAPACITY)
    return min(FELT_MAX, max(0.0, (wall / cpu - 1.0) / (1.0 / c - 1.0)))


@dataclass
class Felt:
    """The contention shards of one length felt on one device (MEASURED).

    Attributes:
        device: the machine's device index.
        octave: ``floor(log2(CPU seconds))`` of the shards.
        samples: the last :data:`FELT_WINDOW` ``(CPU seconds, rho, level)``
            triples (module docstring); ``level`` is None for a sample read
            from a file written before levels were kept.
        runs: every run that ever added one.
    """

    device: int
    octave: int
    samples: list[tuple[float, float, float | None]] = field(default_factory=list)
    runs: int = 0

    @property
    def rho(self) -> float:
        """The median of the samples' ``rho`` (what ``gpuhive history`` shows)."""
        return float(np.median([s[1] for s in self.samples]))

    def add(self, cpu_seconds: float, rho: float, level: float | None) -> None:
        sample = (float(cpu_seconds), float(rho),
                  None if level is None else float(level))
        self.samples = (self.samples + [sample])[-FELT_WINDOW:]
        self.runs += 1

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "octave": self.octave, "rho": self.rho,
                "runs": self.runs,
                "samples": [[t, r] if v is None else [t, r, v]
                            for t, r, v in self.samples],
                "label": "MEASURED"}


def read_felt(obj: Any) -> Felt:
    """One stored :class:`Felt`; ValueError (or KeyError, TypeError) naming
    what is wrong. A sample is ``[CPU seconds, rho, level]``, or ``[CPU
    seconds, rho]`` from a file written before levels were kept (level
    unknown)."""
    device, octave = obj["device"], obj["octave"]
    for name, v in (("device", device), ("octave", octave)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} {v!r}")
    if device < 0:
        raise ValueError(f"device {device!r}")
    samples = []
    for p in obj["samples"]:
        if isinstance(p, (str, bytes)) or len(p) not in (2, 3):
            raise ValueError(f"sample {p!r} is not [CPU seconds, rho, level]")
        level = float(p[2]) if len(p) == 3 else None
        if level is not None and not (math.isfinite(level) and level >= 0.0):
            raise ValueError(f"sample level {level!r} must be a number >= 0")
        samples.append((float(p[0]), float(p[1]), level))
    if not samples or not all(0.0 <= r <= FELT_MAX for _, r, _ in samples):
        raise ValueError(f"samples' rho must lie in [0, {FELT_MAX}]")
    if not all(2.0 ** octave <= t < 2.0 ** (octave + 1) for t, _, _ in samples):
        raise ValueError(f"samples' CPU seconds outside octave {octave}")
    runs = int(obj["runs"])
    if runs < len(samples):
        raise ValueError(f"runs {runs} < {len(samples)} samples")
    return Felt(device, octave, samples[-FELT_WINDOW:], runs)


@dataclass(frozen=True)
class Burst:
    """A device's fitted burst model: shards feel ``rho_inf (1 - b / tau)``
    of the contention past ``b`` CPU seconds, none before (MEASURED fit).

    Attributes:
        device: the machine's device index.
        b: seconds a woken shard runs free.
        rho_inf: the contention a long shard feels (1: its capacity).
        samples: how many samples the fit rests on.
        error: their mean absolute deviation from the fit.
    """

    device: int
    b: float
    rho_inf: float
    samples: int
    error: float

    def rho(self, cpu_seconds: float) -> float:
        """The contention a shard of ``cpu_seconds`` feels."""
        return self.rho_inf * max(0.0, 1.0 - self.b / cpu_seconds) \
            if cpu_seconds > 0 else 0.0


def fit_burst(device: int, samples: Sequence[tuple[float, float]]) -> Burst:
    """The burst model of one device's ``(CPU seconds, rho)`` samples.

    For each ``b`` of :data:`BURST_GRID`, the ``rho_inf`` that minimises the
    sum of ``|rho - rho_inf (1 - b / tau)|`` is a weighted median (of
    ``rho / w`` with weights ``w = 1 - b / tau`` over the samples past
    ``b``); the pair of least total deviation wins, the shortest ``b`` on a
    tie. One prior sample joins them: ``rho = 1`` (the capacity as measured)
    for a shard :data:`PRIOR_REACH` times the longest seen, so that where
    every shard seen ran free the fit says nothing better of longer ones;
    among hundreds of samples it is one vote.
    """
    tau = np.array([t for t, _ in samples] + [PRIOR_REACH * max(t for t, _ in samples)],
                   float)
    rho = np.array([r for _, r in samples] + [1.0], float)
    best: tuple[float, float, float] | None = None
    for b in BURST_GRID:
        w = np.clip(1.0 - b / tau, 0.0, None)
        past = w > 0
        rho_inf = _weighted_median(rho[past] / w[past], w[past]) if past.any() \
            else 1.0
        cost = float(np.abs(rho - rho_inf * w).sum())
        if best is None or cost < best[0] - 1e-12:
            best = (cost, b, rho_inf)
    assert best is not None
    return Burst(device, best[1], best[2], len(samples), best[0] / len(tau))


@functools.lru_cache(maxsize=16)
def fit_burst_cached(device: int, samples: tuple[tuple[float, float], ...]) -> Burst:
    """:func:`fit_burst`, remembered: every decision under contention asks for
    the fit, and the samples change only when a run is learned."""
    return fit_burst(device, samples)


def calibrated_bursts(machine: Machine, params: CostParams) -> dict[int, Burst]:
    """The bursts a calibration fitted (``params.burst_s``, per device kind,
    from runs taken under load), as one :class:`Burst` per device of a kind
    that has one: a shard runs free for ``b`` seconds and feels all of its
    capacity's contention after (``rho_inf = 1``). What the cost model
    predicts a run under a measured capacity with where the device's own
    history has no figure yet (:meth:`lib.runtime.Agent.seen_by_policy`,
    :meth:`lib.costmodel.runs.MeasuredRun.snapshot`)."""
    return {i: Burst(i, params.burst_s[d.kind], 1.0, 0, 0.0)
            for i, d in enumerate(machine.devices)
            if params.burst_s.get(d.kind, 0.0) > 0.0}


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, 0.5 * cum[-1])])


def equal_split_seconds(task: TaskSpec, machine: Machine, params: CostParams,
                        devices: Sequence[int]) -> dict[int, float]:
    """Each of ``devices``' seconds on its shard of an equal split over them
    (Eq. (1) whole, latencies included, no contention): the length a shard of
    ``task`` is judged at here and in :mod:`lib.costmodel.overhead`. (The
    speeds are looked up at the compute part alone,
    :func:`lib.costmodel.speed.equal_shard_seconds`.)"""
    equal = decision_from_weights(task, list(devices), [1.0] * len(devices))
    return {d.device: d.total for d in predict(task, equal, machine, None,
                                               params).devices}


def effective_snapshot(task: TaskSpec, machine: Machine, snapshot: Snapshot | None,
                       params: CostParams, bursts: Mapping[int, Burst]
                       ) -> Snapshot | None:
    """``snapshot`` with each contended device's capacity replaced by what a
    shard of ``task`` will effectively get there, from the device's burst
    (``bursts``: device -> :class:`Burst`, as
    :meth:`lib.costmodel.history.History.bursts` gives them):
    ``1 / (1 + rho (1 / c - 1))``.

    The shard's length is its device's time at full capacity (Eq. (1)) in an
    equal split over the healthy devices. ``bursts`` should be fitted at each
    device's present contention level (:meth:`History.bursts
    <lib.costmodel.history.History.bursts>` with the snapshot's levels).
    Devices at capacity 1, or whose history has no figure, keep theirs; with
    nothing to change (no measured capacity, no contended device, no
    figures) the same object comes back.
    """
    if snapshot is None or snapshot.capacity is None or not bursts:
        return snapshot
    contended = [i for i, c in enumerate(snapshot.capacity)
                 if c < CONTENDED_CAPACITY and snapshot.healthy[i]]
    if not contended:
        return snapshot
    usable = [i for i in range(machine.n) if snapshot.healthy[i]]
    lengths = equal_split_seconds(task, machine, params, usable)
    capacity = list(snapshot.capacity)
    provenance = list(snapshot.capacity_provenance or [""] * machine.n)
    changed = False
    for i in contended:
        burst = bursts.get(i)
        if burst is None:
            continue
        rho = burst.rho(lengths.get(i, 0.0))
        c = max(capacity[i], MIN_CAPACITY)
        capacity[i] = 1.0 / (1.0 + rho * (1.0 / c - 1.0))
        provenance[i] = (f"{provenance[i]}; effective {capacity[i]:.2f} for a "
                         f"{1e3 * lengths[i]:.3g} ms shard: such shards felt "
                         f"{rho:.2f} of the contention (history)").lstrip("; ")
        changed = True
    if not changed:
        return snapshot
    return replace(snapshot, capacity=tuple(capacity),
                   capacity_provenance=tuple(provenance))
