"""How fast each device really runs a kind of kernel, next to what Eq. (1) says.

Eq. (1) prices a shard's compute from the device's datasheet peak and the
kind's calibrated efficiency; two cards of one model share the same figure
even when one of them runs 20 % slower (a throttled clock, a worse slot, an
older driver). Every MEASURED run on a free device gives a point per device:
``x``, the compute seconds Eq. (1) predicts for the shard at full capacity,
and ``y``, the seconds the device spent on it. StarPU's regression-based
models fit such points; here the line ``y = a + x / g`` is fitted by
Theil-Sen (the median of the pairwise slopes, then the median intercept), so
a run disturbed by something the telemetry did not see does not move it:

- ``a`` is the device's fixed cost of a shard the model does not price (on
  the cpu backend, the worker reading its job and mapping the buffers);
- ``g`` is the device's speed on this kind against the model's: 1 where the
  model is right, 0.5 where the device takes twice as long on large shards.
  It is measured on the shards' slope, so fixed costs do not pollute it (a
  rate taken as work over seconds would be dominated by small shards).

:func:`fit_speed` fits a line; :func:`speed_snapshot` turns the devices'
speeds for a task into capacity, the channel every policy and the cost model
already read: a device at ``g_i`` below the fastest device's ``g`` by more
than :data:`SPEED_DEADBAND` has its capacity multiplied by ``g_i / max g``.
Only relative speeds are used: the capacity cannot exceed the device, and a
model that is off by the same factor on every device splits the same way.
The runtime applies it (:meth:`lib.runtime.Agent.seen_by_policy`); the history
(:class:`lib.costmodel.history.History`) keeps the points.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lib.platform.telemetry import MIN_CAPACITY, Snapshot

#: Points kept per (kind, dtype, device): the most recent.
SPEED_WINDOW = 32
#: Points before a line is fitted.
MIN_SPEED_POINTS = 8
#: The model's compute seconds of the points must span this factor, or the
#: slope is not told apart from the fixed cost.
MIN_SPREAD = 4.0
#: Two points enter the median of slopes where their x differ by this factor.
PAIR_SPREAD = 1.5
#: A device slower than the fastest by less than this fraction keeps its
#: capacity (run-to-run noise is not a slower device).
SPEED_DEADBAND = 0.15

METHOD_SPEED = ("per (kind, dtype, device), over MEASURED runs on a free device: "
                "y = the device's seconds on its shard against x = the compute "
                "seconds Eq. (1) predicts for it at full capacity; the line y = a "
                "+ x / g is fitted by Theil-Sen over the last "
                f"{SPEED_WINDOW} points (at least {MIN_SPEED_POINTS}, x spanning "
                f"a factor {MIN_SPREAD:g}); a device whose g is below the "
                f"fastest device's by more than {SPEED_DEADBAND:.0%} gets that "
                "fraction of its capacity")


@dataclass
class Speed:
    """The points one device gave for one (kind, dtype) (MEASURED).

    Attributes:
        kind, dtype, device: what the points are of.
        points: the last :data:`SPEED_WINDOW` ``(model compute seconds,
            measured seconds)`` pairs.
        runs: every run that ever added one.
    """

    kind: str
    dtype: str
    device: int
    points: list[tuple[float, float]] = field(default_factory=list)
    runs: int = 0

    def add(self, model_seconds: float, measured_seconds: float) -> None:
        self.points = (self.points + [(float(model_seconds),
                                       float(measured_seconds))])[-SPEED_WINDOW:]
        self.runs += 1

    def line(self) -> Line | None:
        """The fitted line, or None where the points do not tell one."""
        return fit_speed_cached(tuple(self.points))

    def to_json(self) -> dict[str, Any]:
        line = self.line()
        return {"kind": self.kind, "dtype": self.dtype, "device": self.device,
                "runs": self.runs, "points": [list(p) for p in self.points],
                "g": None if line is None else line.g,
                "fixed_s": None if line is None else line.a,
                "label": "MEASURED"}


@dataclass(frozen=True)
class Line:
    """``measured = a + model / g`` (MEASURED fit).

    Attributes:
        g: the device's speed against the model's (1: as modelled).
        a: seconds of a shard the model does not price.
        points: how many points the fit rests on.
    """

    g: float
    a: float
    points: int


def fit_speed(points: Sequence[tuple[float, float]]) -> Line | None:
    """The Theil-Sen line through ``(model seconds, measured seconds)``
    points: the median slope over the pairs whose x differ by
    :data:`PAIR_SPREAD` or more, then the median intercept. None with fewer
    than :data:`MIN_SPEED_POINTS` points, x spanning less than
    :data:`MIN_SPREAD`, or a slope that is not positive."""
    if len(points) < MIN_SPEED_POINTS:
        return None
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    if not (x.min() > 0 and x.max() / x.min() >= MIN_SPREAD):
        return None
    i, j = np.triu_indices(len(x), k=1)
    lo, hi = np.minimum(x[i], x[j]), np.maximum(x[i], x[j])
    keep = hi >= PAIR_SPREAD * lo
    slope = float(np.median((y[j] - y[i])[keep] / (x[j] - x[i])[keep]))
    if not slope > 0:
        return None
    return Line(g=1.0 / slope, a=float(np.median(y - slope * x)), points=len(x))


@functools.lru_cache(maxsize=256)
def fit_speed_cached(points: tuple[tuple[float, float], ...]) -> Line | None:
    """:func:`fit_speed`, remembered (the points change only when a run is
    learned)."""
    return fit_speed(points)


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
                         f"at {f:.0%} of the fastest one's speed against the "
                         "model (history)").lstrip("; ")
    return replace(snapshot, capacity=tuple(capacity),
                   capacity_provenance=tuple(provenance))


def read_speed(obj: Any) -> Speed:
    """One stored :class:`Speed`; ValueError (or KeyError, TypeError) naming
    what is wrong."""
    device = obj["device"]
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device {device!r}")
    points = [(float(x), float(y)) for x, y in obj["points"]]
    if not points or not all(math.isfinite(v) and v > 0 for p in points for v in p):
        raise ValueError("points must be pairs of positive seconds")
    runs = int(obj["runs"])
    if runs < len(points):
        raise ValueError(f"runs {runs} < {len(points)} points")
    return Speed(str(obj["kind"]), str(obj["dtype"]), device,
                 points[-SPEED_WINDOW:], runs)
