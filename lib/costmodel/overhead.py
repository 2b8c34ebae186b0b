"""What a device costs a shard before and after the shard: learned per device.

Eq. (1) gives every device of a kind the latency of its host link, the same
for each. On this computer it is not the same. The cpu backend times each
job from just before it is sent to just after its result is read; take away
the worker's own seconds on the shard and what is left is the device's
*overhead* for that run: waking its worker, handing it the job, and handing
the result back. A worker on the core the dispatching process runs on wakes
sooner than one on another core (MEASURED on ``local-cpu``: about 0.37 ms
against 0.49 ms, idle). A worker on a core another process is busy on often
wakes at once but now and then waits out that process's time slice first
(the same computer with two processes spinning there: a median of 0.43 ms,
a mean of 1.2 ms).

The history keeps each device's last :data:`OVERHEAD_WINDOW` samples per
band of contention (:class:`Overheads`; a free device's apart from a busy
one's, so a flood of idle runs does not push out what a busy core did), each
with the contention level it was taken at. :func:`expected_overhead` is the
*mean* of a device's samples taken at a level like the present one
(as :func:`~lib.costmodel.contention.similar_level` has it; free with free): a runtime
pays the occasional long wait as often as it comes, and the median would not
see it.

:func:`overhead_snapshot` folds what a device costs beyond the cheapest
device into the capacity the policy sees, for the task at hand: a device
whose shard in an equal split takes ``L`` seconds (Eq. (1)) at capacity ``c``
and pays ``e`` seconds more than the cheapest gets ``c' = L / (L / c + e)``.
A 0.5 ms shard on a core 0.1 ms dearer is then a core at 83 %; a 50 ms shard
barely moves. Backends that report no overhead (model, cuda, dask) teach
nothing here, and a snapshot is then used as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lib.contract import TaskSpec
from lib.costmodel.contention import (
    CONTENDED_CAPACITY,
    LEVEL_REACH,
    contention_level,
    equal_split_seconds,
)
from lib.costmodel.model import CostParams
from lib.platform.machines import Machine
from lib.platform.telemetry import MIN_CAPACITY, Snapshot

#: Samples kept per device and band of contention (the most recent).
OVERHEAD_WINDOW = 64
#: Samples at a like level before a device's overhead is used.
MIN_OVERHEAD_SAMPLES = 8
#: A sample longer than this (seconds) counts as this long: a run stalled by
#: something else entirely does not decide the mean.
OVERHEAD_CAP = 0.05
#: The band of a free device's samples (contended bands are octaves of the
#: contention level, ``floor(log2(level))``, at least -4 below capacity 0.9).
FREE_BAND = -99

METHOD_OVERHEAD = (
    "per device: seconds from just before its job was sent to just after its "
    "result was read, less the worker's own seconds on the shard (MEASURED, "
    f"cpu backend), each capped at {OVERHEAD_CAP * 1e3:g} ms; the last "
    f"{OVERHEAD_WINDOW} per band of contention level are kept, and a device's "
    "overhead is the mean of its samples taken at a level like the present "
    "one (free with free)")


def overhead_band(level: float) -> int:
    """The band a sample taken at contention ``level`` is kept in:
    :data:`FREE_BAND` for a free device (level 0), else the octave
    ``floor(log2(level))``."""
    return FREE_BAND if level <= 0.0 else math.floor(math.log2(level))


def level_of(capacity: float) -> float:
    """The contention level a run's capacity says, 0 for a device counted free
    (capacity at least :data:`~lib.costmodel.contention.CONTENDED_CAPACITY`)."""
    return 0.0 if capacity >= CONTENDED_CAPACITY else contention_level(capacity)


@dataclass
class Overheads:
    """One device's overhead samples in one band of contention (MEASURED).

    Attributes:
        device: the machine's device index.
        band: :func:`overhead_band` of the samples' level.
        samples: the last :data:`OVERHEAD_WINDOW` ``(seconds, level)`` pairs.
        runs: every run that ever added one.
    """

    device: int
    band: int
    samples: list[tuple[float, float]] = field(default_factory=list)
    runs: int = 0
    _arrays: tuple[np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False)

    def add(self, seconds: float, level: float) -> None:
        sample = (min(OVERHEAD_CAP, max(0.0, float(seconds))), float(level))
        self.samples = (self.samples + [sample])[-OVERHEAD_WINDOW:]
        self.runs += 1
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples' seconds and levels as arrays (kept until the next
        :meth:`add`: every decision reads them)."""
        if self._arrays is None:
            values = np.array(self.samples, float).reshape(-1, 2)
            self._arrays = (values[:, 0], values[:, 1])
        return self._arrays

    def summary(self) -> tuple[float, float]:
        """(mean, median) seconds of the samples, as ``gpuhive history`` and
        the evaluation chapter show them."""
        seconds, _ = self.arrays()
        return float(seconds.mean()), float(np.median(seconds))

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "band": self.band, "runs": self.runs,
                "samples": [list(s) for s in self.samples], "label": "MEASURED"}


def read_overheads(obj: Any) -> Overheads:
    """One stored :class:`Overheads`; ValueError (or KeyError, TypeError)
    naming what is wrong."""
    device, band = obj["device"], obj["band"]
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device {device!r}")
    if isinstance(band, bool) or not isinstance(band, int):
        raise ValueError(f"band {band!r}")
    samples = []
    for pair in obj["samples"]:
        seconds, level = (float(v) for v in pair)
        if not (0.0 <= seconds <= OVERHEAD_CAP and math.isfinite(level)
                and level >= 0.0 and overhead_band(level) == band):
            raise ValueError(f"sample {list(pair)!r} does not fit band {band}")
        samples.append((seconds, level))
    if not samples:
        raise ValueError("no samples")
    runs = int(obj["runs"])
    if runs < len(samples):
        raise ValueError(f"runs {runs} < {len(samples)} samples")
    return Overheads(device, band, samples[-OVERHEAD_WINDOW:], runs)


def expected_overhead(kept: Sequence[Overheads], device: int, level: float
                      ) -> float | None:
    """The mean overhead of ``device`` over its samples in ``kept`` taken at
    a contention level like ``level``; None below
    :data:`MIN_OVERHEAD_SAMPLES` of them."""
    total, count = 0.0, 0
    for o in kept:
        if o.device != device:
            continue
        seconds, taken = o.arrays()
        if level <= 0.0:        # as similar_level: free only with free
            like = taken == level
        else:
            ratio = taken / level
            like = (taken > 0.0) & (ratio >= 1.0 / LEVEL_REACH) & (ratio <= LEVEL_REACH)
        total += float(seconds[like].sum())
        count += int(like.sum())
    if count < MIN_OVERHEAD_SAMPLES:
        return None
    return total / count


def overhead_snapshot(task: TaskSpec, machine: Machine, snapshot: Snapshot | None,
                      params: CostParams, kept: Sequence[Overheads],
                      levels: Mapping[int, float] | None = None
                      ) -> Snapshot | None:
    """``snapshot`` with each healthy device's capacity lowered by what it
    costs a shard of ``task`` beyond the cheapest healthy device (module
    docstring): ``c' = L / (L / c + e)``.

    Args:
        kept: the history's :class:`Overheads`.
        levels: device -> the contention level its overhead is looked up at
            (default: from ``snapshot``'s capacity, :func:`level_of`); pass
            the raw telemetry's when ``snapshot``'s capacity already has
            other corrections folded in.

    The same object where nothing changes: no capacity, fewer than two healthy
    devices with an expected overhead, or none dearer than the cheapest.
    """
    if snapshot is None or snapshot.capacity is None or not kept:
        return snapshot
    usable = [i for i, ok in enumerate(snapshot.healthy) if ok]
    if levels is None:
        levels = {i: level_of(snapshot.capacity[i]) for i in usable}
    known = {i: o for i in usable
             if (o := expected_overhead(kept, i, levels.get(i, 0.0))) is not None}
    if len(known) < 2:
        return snapshot
    least = min(known.values())
    dearer = {i: o - least for i, o in known.items() if o > least}
    if not dearer:
        return snapshot
    lengths = equal_split_seconds(task, machine, params, usable)
    capacity = list(snapshot.capacity)
    provenance = list(snapshot.capacity_provenance or [""] * machine.n)
    for i, extra in dearer.items():
        length = lengths.get(i, 0.0)
        if not length > 0:
            continue
        c = max(capacity[i], MIN_CAPACITY)
        capacity[i] = max(MIN_CAPACITY, length / (length / c + extra))
        provenance[i] = (f"{provenance[i]}; {capacity[i]:.2f} with its overhead: "
                         f"{1e3 * extra:.2g} ms more than the cheapest device "
                         f"on a {1e3 * length:.3g} ms shard (history)").lstrip("; ")
    return replace(snapshot, capacity=tuple(capacity),
                   capacity_provenance=tuple(provenance))
