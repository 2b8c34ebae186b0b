"""How fast each device really runs a kind of kernel, next to the others.

Eq. (1) prices a shard's compute from the device's datasheet peak and the
kind's calibrated efficiency; two cards of one model share the same figure
even when one of them runs 20 % slower (a throttled clock, a worse slot, an
older driver). What a split needs is the devices' speeds *relative to each
other*, and a run that used several free devices measures exactly that:
each device's seconds on its shard over the compute seconds Eq. (1) predicts
for it, ``q_i = y_i / x_i``, and the device's relative speed in that run is
``s_i = (geometric mean of the run's q) / q_i`` (above 1: faster than the
run's devices on average, against the model).

Whatever the run's devices share cancels in the ratio: the regime the
runtime's runs are in (a woken worker, buffers mapped afresh), the machine's
memory traffic, the model's error on the kind. What they do not share does
not, and it depends on the shard's length: on the cpu backend a short shard
on the core the host process sits on waits for the host, a long one does
not. So, as StarPU keys its history by the task's size, the history keeps
the last :data:`SPEED_WINDOW` samples of ``log s_i`` per (kind, dtype,
device) *and octave of the shard's modelled compute seconds*, and a task is
judged by the samples of its own length (:data:`OCTAVE_REACH` octaves either
side; :func:`device_speed`, the median, so a run disturbed by something the
telemetry did not see does not move it).

:func:`speed_snapshot` turns the devices' speeds for a task into capacity,
the channel every policy and the cost model already read: a device whose
speed is below the fastest device's by more than :data:`SPEED_DEADBAND` has
its capacity multiplied by ``g_i / max g``. The runtime applies it
(:meth:`lib.runtime.Agent.seen_by_policy`); the history
(:class:`lib.costmodel.history.History`) keeps the samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec, decision_from_weights
from lib.costmodel.model import CostParams, compute_seconds, corun_factors
from lib.platform.machines import Machine
from lib.platform.telemetry import MIN_CAPACITY, Snapshot
from lib.platform.workloads import split_rows, workload

#: Samples kept per (kind, dtype, device): the most recent.
SPEED_WINDOW = 32
#: Samples before a device's speed is used.
MIN_SPEED_SAMPLES = 8
#: A task's length is judged by the samples of shards this many octaves of
#: modelled compute seconds either side of its own.
OCTAVE_REACH = 1
#: A device slower than the fastest by less than this fraction keeps its
#: capacity (run-to-run noise is not a slower device).
SPEED_DEADBAND = 0.15

METHOD_SPEED = ("per (kind, dtype, device, octave of the shard's modelled compute "
                "seconds), over MEASURED runs on two or more "
                "free devices: q = the device's seconds on its shard / the "
                "compute seconds Eq. (1) predicts for it, and the device's "
                "relative speed in the run is the geometric mean of the run's q "
                f"over its own; the last {SPEED_WINDOW} are kept; a task's figure "
                f"is the median of those within {OCTAVE_REACH} octave of its "
                f"shards' length (at least {MIN_SPEED_SAMPLES}); a device slower "
                f"than the fastest by more than {SPEED_DEADBAND:.0%} gets that "
                "fraction of its capacity")


@dataclass
class Speed:
    """One device's relative speeds on one (kind, dtype) and length of shard
    (MEASURED).

    Attributes:
        kind, dtype, device: what the samples are of.
        octave: ``floor(log2(modelled compute seconds))`` of the shards.
        samples: the last :data:`SPEED_WINDOW` ``log s`` (module docstring).
        runs: every run that ever added one.
    """

    kind: str
    dtype: str
    device: int
    octave: int
    samples: list[float] = field(default_factory=list)
    runs: int = 0

    def add(self, log_speed: float) -> None:
        self.samples = (self.samples + [float(log_speed)])[-SPEED_WINDOW:]
        self.runs += 1

    @property
    def g(self) -> float | None:
        """:func:`device_speed` of this octave's samples alone."""
        return device_speed(self.samples)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "device": self.device,
                "octave": self.octave, "runs": self.runs,
                "samples": list(self.samples), "g": self.g, "label": "MEASURED"}


def octave_of(seconds: float) -> int:
    """``floor(log2(seconds))``: the octave a shard's modelled compute
    seconds fall in."""
    return math.floor(math.log2(seconds))


def device_speed(samples: Sequence[float]) -> float | None:
    """``exp(median(log s))``, the device's speed relative to the devices it
    ran beside (1: as the model says, next to them); None below
    :data:`MIN_SPEED_SAMPLES` samples."""
    if len(samples) < MIN_SPEED_SAMPLES:
        return None
    return math.exp(float(np.median(samples)))


def shard_compute_seconds(task: TaskSpec, decision: Decision, machine: Machine,
                          params: CostParams) -> dict[int, float]:
    """The compute seconds Eq. (1) predicts for each device's shard of
    ``decision`` at full capacity, co-running devices' slowdown included
    (devices with no rows left out): the ``x`` of a speed sample."""
    w = workload(task)
    bounds = split_rows(task.split_size, decision.shares)
    active = [g for g, (lo, hi) in zip(decision.gpus, bounds, strict=True)
              if hi > lo]
    corun = corun_factors(machine, active, params)
    return {g: compute_seconds(task, w.work(task, hi - lo), machine, g, params)
            * corun[g] for g, (lo, hi) in zip(decision.gpus, bounds, strict=True)
            if hi > lo}


def equal_shard_seconds(task: TaskSpec, machine: Machine, params: CostParams,
                        devices: Sequence[int]) -> dict[int, float]:
    """:func:`shard_compute_seconds` of an equal split of ``task`` over
    ``devices``: the length the task's speeds are looked up at."""
    return shard_compute_seconds(
        task, decision_from_weights(task, list(devices), [1.0] * len(devices)),
        machine, params)


def run_speeds(model: Mapping[int, float], measured: Mapping[int, float]
               ) -> dict[int, float]:
    """``log s_i`` of each device of one run (module docstring): ``model``
    and ``measured`` map each free device that ran a shard to the compute
    seconds Eq. (1) predicts for it and the seconds it took. Empty with fewer
    than two such devices."""
    devices = [d for d in model if model[d] > 0 and measured.get(d, 0.0) > 0]
    if len(devices) < 2:
        return {}
    logq = {d: math.log(measured[d] / model[d]) for d in devices}
    mean = sum(logq.values()) / len(logq)
    return {d: mean - logq[d] for d in devices}


def relative_speeds(speeds: Mapping[int, float], devices: Sequence[int]
                    ) -> dict[int, float]:
    """``g_i / max g`` for each of ``devices`` below ``1 - SPEED_DEADBAND``;
    empty unless every one of ``devices`` has a speed (a device never measured
    cannot be compared)."""
    if len(devices) < 2 or any(d not in speeds for d in devices):
        return {}
    top = max(speeds[d] for d in devices)
    return {d: speeds[d] / top for d in devices
            if speeds[d] / top < 1.0 - SPEED_DEADBAND}


def speed_snapshot(snapshot: Snapshot | None, speeds: Mapping[int, float]
                   ) -> Snapshot | None:
    """``snapshot`` with each healthy device's capacity multiplied by its
    relative speed (:func:`relative_speeds` over the healthy devices;
    ``speeds``: device -> ``g`` for the task's kind and dtype). The same
    object where nothing changes, or the snapshot has no capacity."""
    if snapshot is None or snapshot.capacity is None:
        return snapshot
    usable = [i for i, ok in enumerate(snapshot.healthy) if ok]
    factors = relative_speeds(speeds, usable)
    if not factors:
        return snapshot
    capacity = list(snapshot.capacity)
    provenance = list(snapshot.capacity_provenance or [""] * len(capacity))
    for i, f in factors.items():
        capacity[i] = max(MIN_CAPACITY, capacity[i] * f)
        provenance[i] = (f"{provenance[i]}; x {f:.2f}: this device ran this kind "
                         f"at {f:.0%} of the fastest one's speed, against the "
                         "model (history)").lstrip("; ")
    return replace(snapshot, capacity=tuple(capacity),
                   capacity_provenance=tuple(provenance))


def read_speed(obj: Any) -> Speed:
    """One stored :class:`Speed`; ValueError (or KeyError, TypeError) naming
    what is wrong."""
    device, octave = obj["device"], obj["octave"]
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device {device!r}")
    if isinstance(octave, bool) or not isinstance(octave, int):
        raise ValueError(f"octave {octave!r}")
    samples = [float(v) for v in obj["samples"]]
    if not samples or not all(math.isfinite(v) and abs(v) < 20 for v in samples):
        raise ValueError("samples must be logs of speeds (finite, |log s| < 20)")
    runs = int(obj["runs"])
    if runs < len(samples):
        raise ValueError(f"runs {runs} < {len(samples)} samples")
    return Speed(str(obj["kind"]), str(obj["dtype"]), device, octave,
                 samples[-SPEED_WINDOW:], runs)
