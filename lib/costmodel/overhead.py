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

How long that wait is depends on the shards: the scheduler owes a worker
that slept after short shards its turn, and makes one that has just run long
shards beside the spinning process wait longer (the same core beside one
spinning process, in one measured evaluation: medians of 0.25-0.54 ms before
shards Eq. (1) puts at 0.25-0.5 ms, 1.6-2.1 ms before shards of 4-16 ms;
the means, 1.2-1.8 ms, carry the odd long wait). So the history
keeps up to :data:`OVERHEAD_WINDOW` samples per device and band of
contention (:class:`Overheads`; a free device's apart from a busy one's, so a
flood of idle runs does not push out what a busy core did), each with the
contention level it was taken at and the length of its shard (Eq. (1)'s
compute seconds), and a full window loses the oldest sample of its most
crowded octave of length. :func:`expected_overhead` is the *mean* of a
device's samples taken at a level like the present one (as
:func:`~lib.costmodel.contention.similar_level` has it; free with free) on
shards within an octave of the task's (two or three where one holds too
few): a runtime pays the occasional long wait as often as it comes, and the
median would not see it.

:func:`overhead_snapshot` hands each device's cost beyond the cheapest
device to the decision as a wait (``Snapshot.wait_s``), which Eq. (1) adds to
the device's launch (:func:`~lib.costmodel.model.wait_seconds`): any share on
a device that waits ``e`` costs at least ``e``, so a task shorter than the
wait is done sooner without that device, and the cost model's optimum leaves
it out. A consumer that sees capacity alone (the learned policy's network)
gets the wait folded into capacity for the task at hand (:func:`fold_wait`:
a device whose shard in an equal split takes ``L`` seconds at capacity ``c``
and waits ``e`` more gets ``c' = L / (L / c + e)``; a 0.5 ms shard on a core
0.1 ms dearer is a core at 83 %, a 50 ms shard barely moves), and its decision
then loses each device whose wait costs more than its share saves
(:func:`leave_out_waits`). Backends that report no overhead (model, cuda,
dask) teach nothing here, and a snapshot is then used as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.costmodel.contention import (
    CONTENDED_CAPACITY,
    LEVEL_REACH,
    contention_level,
    equal_split_seconds,
)
from lib.costmodel.model import CostParams, predict
from lib.platform.machines import Machine
from lib.platform.telemetry import MIN_CAPACITY, Snapshot

#: Samples kept per device and band of contention: past it, the oldest of the
#: octave of shard length that holds the most goes (a flood of short runs
#: keeps what the few long ones taught).
OVERHEAD_WINDOW = 96
#: Samples at a like level before a device's overhead is used.
MIN_OVERHEAD_SAMPLES = 8
#: A sample longer than this (seconds) counts as this long: a run stalled by
#: something else entirely does not decide the mean.
OVERHEAD_CAP = 0.05
#: The band of a free device's samples (contended bands are octaves of the
#: contention level, ``floor(log2(level))``, at least -4 below capacity 0.9).
FREE_BAND = -99

#: Octaves of shard length a sample is looked up within, nearest first: the
#: nearest reach with enough samples decides, else every length does.
LENGTH_REACH = (1, 2, 3)

METHOD_OVERHEAD = (
    "per device: seconds from just before its job was sent to just after its "
    "result was read, less the worker's own seconds on the shard (MEASURED, "
    f"cpu backend), each capped at {OVERHEAD_CAP * 1e3:g} ms, with the "
    "shard's compute seconds as Eq. (1) predicts them; "
    f"{OVERHEAD_WINDOW} per band of contention level are kept (past that the "
    "oldest of the octave of length holding the most goes), and a device's "
    "overhead is the mean of its samples "
    "taken at a level like the present one (free with free) on shards within "
    "an octave of the task's (two, three, or any where too few are)")


def overhead_band(level: float) -> int:
    """The band a sample taken at contention ``level`` is kept in:
    :data:`FREE_BAND` for a free device (level 0), else the octave
    ``floor(log2(level))``."""
    return FREE_BAND if level <= 0.0 else math.floor(math.log2(level))


def level_of(capacity: float) -> float:
    """The contention level a run's capacity says, 0 for a device counted free
    (capacity at least :data:`~lib.costmodel.contention.CONTENDED_CAPACITY`)."""
    return 0.0 if capacity >= CONTENDED_CAPACITY else contention_level(capacity)


def length_octave(length: float) -> int | None:
    """The octave of a shard length (seconds), None where it is unknown (0)."""
    return math.floor(math.log2(length)) if length > 0 else None


@dataclass
class Overheads:
    """One device's overhead samples in one band of contention (MEASURED).

    Attributes:
        device: the machine's device index.
        band: :func:`overhead_band` of the samples' level.
        samples: ``(seconds, level, length)`` triples, at most
            :data:`OVERHEAD_WINDOW` (:func:`_trimmed`); ``length`` is the
            shard's compute seconds by Eq. (1), 0 where the run did not say.
        runs: every run that ever added one.
    """

    device: int
    band: int
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    runs: int = 0
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False)

    def add(self, seconds: float, level: float, length: float = 0.0) -> None:
        sample = (min(OVERHEAD_CAP, max(0.0, float(seconds))), float(level),
                  max(0.0, float(length)))
        self.samples = _trimmed(self.samples + [sample])
        self.runs += 1
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The samples' seconds, levels and lengths as arrays (kept until the
        next :meth:`add`: every decision reads them)."""
        if self._arrays is None:
            values = np.array(self.samples, float).reshape(-1, 3)
            self._arrays = (values[:, 0], values[:, 1], values[:, 2])
        return self._arrays

    def summary(self) -> tuple[float, float]:
        """(mean, median) seconds of the samples, as ``gpuhive history`` and
        the evaluation chapter show them."""
        seconds = self.arrays()[0]
        return float(seconds.mean()), float(np.median(seconds))

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "band": self.band, "runs": self.runs,
                "samples": [list(s) for s in self.samples], "label": "MEASURED"}


def _trimmed(samples: list[tuple[float, float, float]]
             ) -> list[tuple[float, float, float]]:
    """``samples`` cut to :data:`OVERHEAD_WINDOW`, oldest first from the octave
    of length that holds the most."""
    if len(samples) <= OVERHEAD_WINDOW:
        return samples
    samples = list(samples)
    octaves = [length_octave(s[2]) for s in samples]
    while len(samples) > OVERHEAD_WINDOW:
        counts: dict[int | None, int] = {}
        for o in octaves:
            counts[o] = counts.get(o, 0) + 1
        crowded = max(counts, key=lambda o: counts[o])
        k = octaves.index(crowded)
        del samples[k], octaves[k]
    return samples


def read_overheads(obj: Any) -> Overheads:
    """One stored :class:`Overheads`; ValueError (or KeyError, TypeError)
    naming what is wrong. A sample written before lengths were kept, a
    ``(seconds, level)`` pair, is read with length 0 (unknown)."""
    device, band = obj["device"], obj["band"]
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device {device!r}")
    if isinstance(band, bool) or not isinstance(band, int):
        raise ValueError(f"band {band!r}")
    samples = []
    for entry in obj["samples"]:
        if len(entry) not in (2, 3):
            raise ValueError(f"sample {list(entry)!r} is not (seconds, level, length)")
        seconds, level, length = (*(float(v) for v in entry), 0.0)[:3]
        if not (0.0 <= seconds <= OVERHEAD_CAP and math.isfinite(level)
                and level >= 0.0 and overhead_band(level) == band
                and math.isfinite(length) and length >= 0.0):
            raise ValueError(f"sample {list(entry)!r} does not fit band {band}")
        samples.append((seconds, level, length))
    if not samples:
        raise ValueError("no samples")
    runs = int(obj["runs"])
    if runs < len(samples):
        raise ValueError(f"runs {runs} < {len(samples)} samples")
    return Overheads(device, band, _trimmed(samples), runs)


def expected_overhead(kept: Sequence[Overheads], device: int, level: float,
                      length: float = 0.0) -> float | None:
    """The mean overhead of ``device`` over its samples in ``kept`` taken at
    a contention level like ``level`` on shards like ``length`` (seconds of
    compute by Eq. (1); 0: any): within the nearest of :data:`LENGTH_REACH`
    octaves that holds :data:`MIN_OVERHEAD_SAMPLES`, else at any length; a
    sample of unknown length counts as near. None below
    :data:`MIN_OVERHEAD_SAMPLES` at a like level."""
    seconds, near = [], []
    for o in kept:
        if o.device != device:
            continue
        secs, taken, lengths = o.arrays()
        if level <= 0.0:        # as similar_level: free only with free
            like = taken == level
        else:
            ratio = taken / level
            like = (taken > 0.0) & (ratio >= 1.0 / LEVEL_REACH) & (ratio <= LEVEL_REACH)
        seconds.append(secs[like])
        lens = lengths[like]
        dist = np.zeros(lens.size)     # an unknown length is near any
        if length > 0.0:
            known = lens > 0.0
            dist[known] = np.abs(np.log2(lens[known] / length))
        near.append(dist)
    if not seconds:
        return None
    secs, dist = np.concatenate(seconds), np.concatenate(near)
    if secs.size < MIN_OVERHEAD_SAMPLES:
        return None
    for reach in LENGTH_REACH:
        close = dist <= reach
        if int(close.sum()) >= MIN_OVERHEAD_SAMPLES:
            return float(secs[close].mean())
    return float(secs.mean())


def overhead_snapshot(snapshot: Snapshot | None, kept: Sequence[Overheads],
                      levels: Mapping[int, float] | None = None,
                      lengths: Mapping[int, float] | None = None
                      ) -> Snapshot | None:
    """``snapshot`` with ``wait_s``: each healthy device's expected overhead
    beyond the cheapest healthy device's (0 for that one, and for a device
    with too few samples), which the cost model adds to the device's launch
    (:func:`~lib.costmodel.model.wait_seconds`).

    Args:
        kept: the history's :class:`Overheads`.
        levels: device -> the contention level its overhead is looked up at
            (default: from ``snapshot``'s capacity, :func:`level_of`); pass
            the raw telemetry's when ``snapshot``'s capacity already has
            other corrections folded in.
        lengths: device -> the compute seconds (Eq. (1)) of its shard of the
            task at hand, which its overhead is looked up near (default: any
            length).

    The same object where nothing changes: no capacity, fewer than two healthy
    devices with an expected overhead, or none dearer than the cheapest.
    """
    if snapshot is None or snapshot.capacity is None or not kept:
        return snapshot
    usable = [i for i, ok in enumerate(snapshot.healthy) if ok]
    if levels is None:
        levels = {i: level_of(snapshot.capacity[i]) for i in usable}
    lengths = lengths or {}
    known = {i: o for i in usable
             if (o := expected_overhead(kept, i, levels.get(i, 0.0),
                                        lengths.get(i, 0.0))) is not None}
    if len(known) < 2:
        return snapshot
    least = min(known.values())
    if all(o <= least for o in known.values()):
        return snapshot
    wait = [0.0] * len(snapshot.healthy)
    for i, o in known.items():
        wait[i] = o - least
    return replace(snapshot, wait_s=tuple(wait))


def fold_wait(task: TaskSpec, machine: Machine, snapshot: Snapshot | None,
              params: CostParams) -> Snapshot | None:
    """``snapshot`` with each device's ``wait_s`` folded into its capacity, for
    a consumer that sees capacity alone (the learned policy's network): a
    device whose shard in an equal split takes ``L`` seconds (Eq. (1)) at
    capacity ``c`` and waits ``e`` seconds more than the cheapest gets
    ``c' = L / (L / c + e)``, and ``wait_s`` is dropped. The same object
    without waits."""
    if snapshot is None or snapshot.wait_s is None or snapshot.capacity is None:
        return snapshot
    usable = [i for i, ok in enumerate(snapshot.healthy) if ok]
    lengths = equal_split_seconds(task, machine, params, usable)
    capacity = list(snapshot.capacity)
    provenance = list(snapshot.capacity_provenance or [""] * machine.n)
    for i in usable:
        extra, length = snapshot.wait_s[i], lengths.get(i, 0.0)
        if not (extra > 0 and length > 0):
            continue
        c = max(capacity[i], MIN_CAPACITY)
        capacity[i] = max(MIN_CAPACITY, length / (length / c + extra))
        provenance[i] = (f"{provenance[i]}; {capacity[i]:.2f} with its overhead: "
                         f"{1e3 * extra:.2g} ms more than the cheapest device "
                         f"on a {1e3 * length:.3g} ms shard (history)").lstrip("; ")
    return replace(snapshot, capacity=tuple(capacity),
                   capacity_provenance=tuple(provenance), wait_s=None)


def leave_out_waits(task: TaskSpec, decision: Decision, machine: Machine,
                    snapshot: Snapshot | None, params: CostParams) -> Decision:
    """``decision`` less each device whose wait costs more than its share
    saves: while leaving out a device with a wait (``snapshot.wait_s``) is
    predicted faster (Eq. (1), waits included), the one whose absence is
    fastest is left out, the others keeping their proportions
    (:meth:`~lib.contract.Decision.without`). Any share on a device that
    waits ``e`` costs at least ``e``: on a busy core a 3 ms task is done
    sooner on the free core alone, a 100 ms one still gains from a small
    share there. The same object where nothing is left out."""
    if snapshot is None or snapshot.wait_s is None or len(decision.gpus) < 2:
        return decision
    best, best_t = decision, predict(task, decision, machine, snapshot, params).total
    while len(best.gpus) > 1:
        options = [d for g in best.gpus
                   if snapshot.wait_s[g] > 0 and (d := best.without(g)) is not None]
        if not options:
            break
        t, d = min(((predict(task, d, machine, snapshot, params).total, d)
                    for d in options), key=lambda pair: pair[0])
        if not t < best_t:
            break
        best, best_t = d, t
    return best
