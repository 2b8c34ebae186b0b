"""A history-based performance model: what each device has done, remembered.

Eq. (1) predicts from datasheet peaks and per-kind efficiencies; it never sees
that *this* card runs *this* kernel slower than its sisters. The history does,
as StarPU's history-based models do: every MEASURED run updates, per
(machine, workload kind, dtype, device), a robust estimate of the device's
effective rate -- work of its shard (FLOP for compute-bound kinds, bytes of
memory traffic for memory-bound ones) per second it spent on the shard,
normalised by the capacity it had (a shard run on a half-taken core took twice
as long; its rate is what the device gives a shard it has to itself).

The estimate is robust: the last :data:`WINDOW` samples are kept, and the
figure is a Huber M-estimate of their logarithms started from their median
(one outlier moves it by at most ``HUBER_K`` robust standard deviations over
the window size, never more), so one run slowed by something the telemetry did
not see does not poison it.

These rates are what ``gpuhive history`` shows. Because a small shard's
seconds include its fixed costs, they are not what corrects the model: for
that the history keeps, per (kind, dtype, device), the device's speed
relative to the devices it ran beside, each against the compute seconds
Eq. (1) predicts for its shard (:mod:`lib.costmodel.speed`,
:meth:`History.speeds`), and the runtime folds a device clearly slower than
the others into the capacity the policy sees.

On disk: ``<home>/history/<machine>.json``, written with
:func:`lib.storage.write_atomic` as compact JSON. A malformed file is refused
with one line naming it, and never overwritten.

Figures are kept by device index, and beside them the file keeps each
device's :attr:`~lib.platform.machines.Device.identity`. A machine is known
by its name, and the device at an index can change under one: a profile
edited to swap a T4 for an A100, a Dask cluster whose workers are other
hosts this session. What was learned of a device the machine no longer has
there is not used (:meth:`History.fitting`), and the next run on the
machine forgets it (:meth:`History.adopt`); the other devices keep theirs.

The history also keeps, per device and length of shard, how much of the
contention on a busy device its shards felt (:mod:`lib.costmodel.contention`
says what that is and fits a burst to it; :meth:`History.burst`), and per
device and band of contention what the device cost a run beyond its time on
the shard (:mod:`lib.costmodel.overhead`; :attr:`History.overheads`).

PREDICTED runs (the model backend) teach nothing: :meth:`History.update`
refuses them. Caveat: the per-device seconds are what the backend measured for
the shard (on the cpu backend, from the worker receiving its job to its result
written), so the rate of a small shard includes its fixed costs.

Why one module: what a run teaches (:meth:`History.update`), the file it is
kept in, the strict reader that refuses a malformed file and the two paths
that skip re-reading it (:meth:`History.peek` for decisions,
:func:`record_run` for the runtime's runs) must agree field by field and on
when the file on disk is the one in memory; apart, one of them would serve a
history the others never wrote.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.costmodel.contention import (
    CONTENDED_CAPACITY,
    METHOD_FELT,
    MIN_FELT_SAMPLES,
    Burst,
    Felt,
    contention_level,
    felt_sample,
    fit_burst_cached,
    read_felt,
    similar_level,
)
from lib.costmodel.model import CostParams
from lib.costmodel.overhead import (
    METHOD_OVERHEAD,
    Overheads,
    level_of,
    overhead_band,
    read_overheads,
)
from lib.costmodel.parameters import CalibrationError
from lib.costmodel.speed import (
    METHOD_SPEED,
    OCTAVE_REACH,
    Speed,
    device_speed,
    octave_of,
    read_speed,
    run_speeds,
    shard_compute_seconds,
)
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import split_rows, workload
from lib.storage import file_stem, gpuhive_home, write_atomic

SCHEMA = "gpuhive.history/1"
#: Samples kept per figure (the most recent).
WINDOW = 32
#: Huber threshold, in robust standard deviations of the log rates.
HUBER_K = 1.345
#: Floor of the robust spread (log units), so identical samples do not make
#: every new one an outlier.
MIN_LOG_SCALE = 0.02

METHOD = ("per (kind, dtype, device): work of the device's shard (FLOP if the "
          "kind is compute-bound, bytes of memory traffic otherwise) / (MEASURED "
          "seconds on the shard x the device's capacity then); the figure is a "
          f"Huber M-estimate (k = {HUBER_K}) of the log of the last {WINDOW} "
          "samples, started from their median")


class HistoryError(CalibrationError):
    """A history file or run the history cannot use (the message names it)."""


def history_path(machine_name: str) -> Path:
    """``<home>/history/<machine>.json``."""
    return gpuhive_home() / "history" / f"{file_stem(machine_name)}.json"


def robust_rate(samples: Sequence[float]) -> tuple[float, float]:
    """(rate, spread) of positive samples: Huber M-estimate of their logs,
    started from the median; spread is the robust standard deviation of the
    logs (1.4826 MAD, at least :data:`MIN_LOG_SCALE`)."""
    x = np.log(np.asarray(samples, float))
    m = float(np.median(x))
    scale = max(MIN_LOG_SCALE, 1.4826 * float(np.median(np.abs(x - m))))
    for _ in range(10):
        r = x - m
        w = np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(r), 1e-300))
        new = float(np.sum(w * x) / np.sum(w))
        if abs(new - m) < 1e-12:
            break
        m = new
    return math.exp(m), scale


@dataclass(frozen=True)
class KnownDevice:
    """The device a history's figures of one index were learned on: its
    :attr:`~lib.platform.machines.Device.identity` and its label then."""

    identity: str
    label: str


@dataclass
class Figure:
    """What the history knows of one (kind, dtype, device).

    Attributes:
        kind, dtype, device: the key (device is the machine's device index).
        unit: ``"FLOP/s"`` or ``"B/s"``.
        samples: the last :data:`WINDOW` normalised rates (MEASURED).
        runs: every run that ever updated it (samples keep only the last).
        rate, log_scale: :func:`robust_rate` of the samples.
        updated: when last updated (ISO 8601).
    """

    kind: str
    dtype: str
    device: int
    unit: str
    samples: list[float] = field(default_factory=list)
    runs: int = 0
    rate: float = math.nan
    log_scale: float = MIN_LOG_SCALE
    updated: str = ""

    def add(self, value: float) -> None:
        self.samples = (self.samples + [float(value)])[-WINDOW:]
        self.runs += 1
        self.rate, self.log_scale = robust_rate(self.samples)
        self.updated = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "device": self.device,
                "unit": self.unit, "rate": self.rate, "log_scale": self.log_scale,
                "runs": self.runs, "samples": list(self.samples),
                "updated": self.updated, "label": "MEASURED"}


class History:
    """The learned rates of one machine's devices (see the module docstring).

    Args:
        machine: the machine's name (it names the file).
        figures: what is known already (empty for a new history).
    """

    def __init__(self, machine: str,
                 figures: Mapping[tuple[str, str, int], Figure] | None = None,
                 felt: Mapping[tuple[int, int], Felt] | None = None,
                 speeds: Mapping[tuple[str, str, int, int], Speed] | None = None,
                 overheads: Mapping[tuple[int, int], Overheads] | None = None,
                 devices: Mapping[int, KnownDevice] | None = None):
        self.machine = machine
        file_stem(machine)  # a name no file can be made of is refused here
        self.figures: dict[tuple[str, str, int], Figure] = dict(figures or {})
        self.felt: dict[tuple[int, int], Felt] = dict(felt or {})
        self.speeds_kept: dict[tuple[str, str, int, int], Speed] = dict(speeds or {})
        self.overheads: dict[tuple[int, int], Overheads] = dict(overheads or {})
        #: index -> the device the figures of that index were learned on
        #: (none in a file written before identities were kept)
        self.devices: dict[int, KnownDevice] = dict(devices or {})
        self._fitted: dict[tuple[str, ...], History] = {}

    @property
    def path(self) -> Path:
        return history_path(self.machine)

    # -- reading ------------------------------------------------------------

    @classmethod
    def load(cls, machine: str) -> History:
        """The saved history of ``machine`` (empty if it has none).

        Raises:
            HistoryError: the file exists but is not a readable history.
        """
        path = history_path(machine)
        if not path.exists():
            return cls(machine)
        return cls(machine, *_read(path, machine))

    @classmethod
    def peek(cls, machine: str) -> History:
        """:meth:`load`, remembered while the file's bytes are unchanged: for
        reading only, as every decision does (reading and hashing the file
        costs a fraction of parsing it). The object is shared: do not update
        it, and do not keep it past the decision (where this process wrote
        the file, it is the history :func:`record_run` updates next).

        Raises:
            HistoryError: the file exists but is not a readable history.
        """
        path = history_path(machine)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls(machine)
        except OSError as exc:
            raise HistoryError(f"{path}: not readable ({exc})") from None
        return _peek(machine, str(path), hashlib.blake2b(data).hexdigest(), data)

    def rate(self, kind: str, dtype: str, device: int) -> float | None:
        """The learned rate (FLOP/s or B/s, MEASURED), or None if no run yet."""
        fig = self.figures.get((kind, dtype, int(device)))
        return fig.rate if fig is not None else None

    def runs(self, kind: str, dtype: str, device: int) -> int:
        """How many runs stand behind :meth:`rate` (0 if none)."""
        fig = self.figures.get((kind, dtype, int(device)))
        return fig.runs if fig is not None else 0

    def __len__(self) -> int:
        return len(self.figures)

    def felt_samples(self, device: int, level: float | None = None
                     ) -> list[tuple[float, float]]:
        """The ``(CPU seconds, rho)`` samples of ``device`` taken at a
        contention level similar to ``level``
        (:func:`~lib.costmodel.contention.similar_level`; every one if None),
        shortest octave first (empty if its shards never ran under
        contention)."""
        return [(t, r) for (d, _), f in sorted(self.felt.items())
                if d == int(device)
                for t, r, taken in f.samples if similar_level(taken, level)]

    def levels(self, device: int) -> list[float]:
        """The contention levels ``device``'s samples were taken at (those of
        older files, unknown, left out), in the order kept."""
        return [v for (d, _), f in sorted(self.felt.items()) if d == int(device)
                for _, _, v in f.samples if v is not None]

    def burst(self, device: int, level: float | None = None) -> Burst | None:
        """The device's burst (:func:`lib.costmodel.contention.fit_burst`)
        over its :meth:`felt_samples` at ``level`` (all of them if None), or
        None below :data:`~lib.costmodel.contention.MIN_FELT_SAMPLES` such
        samples."""
        samples = self.felt_samples(device, level)
        if len(samples) < MIN_FELT_SAMPLES:
            return None
        return fit_burst_cached(int(device), tuple(samples))

    def bursts(self, levels: Mapping[int, float] | None = None) -> dict[int, Burst]:
        """Every device's burst that has enough samples (device -> Burst): at
        its level in ``levels`` (device -> contention level, as
        :func:`~lib.costmodel.contention.contention_level` of a snapshot's
        capacity gives it), over all its samples where ``levels`` is None or
        does not name it."""
        levels = levels or {}
        out = {d: self.burst(d, levels.get(d))
               for d in sorted({d for d, _ in self.felt})}
        return {d: b for d, b in out.items() if b is not None}

    def bands(self, device: int) -> list[tuple[float | None, Burst]]:
        """(level, burst) for each octave ``[2**k, 2**(k+1))`` of contention
        level ``device``'s samples were taken at: the fit the runtime makes at
        the octave's middle, ``2 ** (k + 1/2)``; one fit over all its samples
        (level None) where they carry no level."""
        octaves = sorted({math.floor(math.log2(v)) for v in self.levels(device)
                          if v > 0})
        out = []
        for level in [2.0 ** (k + 0.5) for k in octaves] or [None]:
            burst = self.burst(device, level)
            if burst is not None:
                out.append((level, burst))
        return out

    def speeds(self, kind: str, dtype: str, lengths: Mapping[int, float]
               ) -> dict[int, float]:
        """device -> ``g``, its speed on (kind, dtype) relative to the devices
        it ran beside, against Eq. (1), for shards of the length ``lengths``
        gives it (device -> modelled compute seconds, as
        :func:`lib.costmodel.speed.equal_shard_seconds` gives them): the
        median of its samples within
        :data:`~lib.costmodel.speed.OCTAVE_REACH` octaves of that length, for
        every device with enough of them."""
        out = {}
        for device, seconds in lengths.items():
            if not seconds > 0:
                continue
            o = octave_of(seconds)
            samples = [v for (k, dt, d, oc), sp in self.speeds_kept.items()
                       if (k, dt, d) == (kind, dtype, device)
                       and abs(oc - o) <= OCTAVE_REACH for v in sp.samples]
            g = device_speed(samples)
            if g is not None:
                out[device] = g
        return out

    # -- which devices it knows -----------------------------------------------

    def learned_on(self) -> set[int]:
        """The device indices anything is kept for."""
        return ({k[2] for k in self.figures} | {k[0] for k in self.felt}
                | {k[2] for k in self.speeds_kept} | {k[0] for k in self.overheads})

    def stale(self, machine: Machine) -> dict[int, str]:
        """index -> why, for each device whose figures were learned on a
        device ``machine`` no longer has there: another identity, or an
        index past its devices. An index the file names no identity for (a
        file written before they were kept) is taken to be the same device."""
        out = {}
        for i in sorted(self.learned_on() | set(self.devices)):
            known = self.devices.get(i)
            if i >= machine.n:
                was = f"learned on {known.label}; " if known is not None else ""
                out[i] = (f"device {i} ({was}{machine.name} has {machine.n} "
                          "device(s) now)")
            elif known is not None and known.identity != machine.devices[i].identity:
                out[i] = (f"device {i} (learned on {known.label}, now "
                          f"{machine.devices[i].label})")
        return out

    def without(self, devices: Sequence[int] | set[int]) -> History:
        """A copy that knows nothing of ``devices``."""
        drop = {int(d) for d in devices}
        return History(
            self.machine,
            {k: v for k, v in self.figures.items() if k[2] not in drop},
            {k: v for k, v in self.felt.items() if k[0] not in drop},
            {k: v for k, v in self.speeds_kept.items() if k[2] not in drop},
            {k: v for k, v in self.overheads.items() if k[0] not in drop},
            {k: v for k, v in self.devices.items() if k not in drop})

    def fitting(self, machine: Machine) -> History:
        """This history as far as it holds for ``machine``: itself where every
        device it knows is still there (no copy), else a copy without the
        others (:meth:`stale`), made once per machine layout. For reading
        only, as :meth:`peek`'s history is."""
        key = tuple(d.identity for d in machine.devices)
        if key not in self._fitted:
            stale = self.stale(machine)
            self._fitted[key] = self.without(stale) if stale else self
        return self._fitted[key]

    def adopt(self, machine: Machine) -> dict[int, str]:
        """Forget, in place, what was learned of devices ``machine`` no longer
        has (:meth:`stale`) and note each of its devices' identity; return
        what was forgotten (index -> why)."""
        stale = self.stale(machine)
        if stale:
            kept = self.without(stale)
            self.figures, self.felt = kept.figures, kept.felt
            self.speeds_kept, self.overheads = kept.speeds_kept, kept.overheads
        self.devices = {d.index: KnownDevice(d.identity, d.label)
                        for d in machine.devices}
        self._fitted.clear()
        return stale

    # -- learning -----------------------------------------------------------

    def update(self, task: TaskSpec, decision: Decision, result: Any,
               snapshot: Snapshot | None = None, machine: Machine | None = None,
               params: CostParams | None = None) -> list[tuple[str, str, int]]:
        """Learn from one executed run; return the keys it updated.

        Args:
            task, decision: what ran.
            result: the backend's :class:`~lib.execution.base.Result`; its
                ``metrics.per_device_seconds`` give each device's time.
            snapshot: the telemetry the run started under. Its capacity
                (``1 / slowdown``) normalises the rate when it was measured;
                an unmeasured (simulated) snapshot says nothing about a real
                run, so capacity 1 is assumed then, as without one.
            machine, params: the machine and the parameters Eq. (1) prices
                it with; given both, a run on two or more devices, every one
                free (capacity 1 as above, or measured at least
                :data:`~lib.costmodel.contention.CONTENDED_CAPACITY`), adds
                a sample of each one's relative speed
                (:func:`lib.costmodel.speed.run_speeds`).

        Raises:
            HistoryError: the run is PREDICTED (a model backend's), not MEASURED.
        """
        self._fitted.clear()    # copies made for reading hold the old figures
        metrics = result.metrics
        if not metrics.measured:
            raise HistoryError(f"history: a {metrics.label} run teaches nothing; "
                               "only MEASURED runs update it")
        if metrics.verified is False:
            return []   # timing of a wrong computation: not learned from
        w = workload(task)
        unit = "FLOP/s" if w.bound == "compute" else "B/s"
        done = []
        bounds = split_rows(task.split_size, decision.shares)
        # Eq. (1)'s compute seconds of each shard, and the seconds they took
        model = shard_compute_seconds(task, decision, machine, params) \
            if machine is not None and params is not None else {}
        measured: dict[int, float] = {}
        everyone_free = True
        for dev, (lo, hi) in zip(decision.gpus, bounds, strict=True):
            seconds = metrics.per_device_seconds.get(dev)
            if hi <= lo or seconds is None or not seconds > 0:
                continue
            cap = 1.0 / snapshot.slowdown(dev) \
                if snapshot is not None and snapshot.measured else 1.0
            cpu = metrics.per_device_cpu_seconds.get(dev)
            rho = felt_sample(float(seconds), cpu, cap) \
                if cpu is not None and snapshot is not None \
                and snapshot.capacity is not None else None
            if rho is not None:
                octave = math.floor(math.log2(cpu))
                self.felt.setdefault((int(dev), octave), Felt(int(dev), octave)
                                     ).add(cpu, rho, contention_level(cap))
            extra = metrics.per_device_overhead_seconds.get(dev)
            if extra is not None and math.isfinite(extra) and snapshot is not None \
                    and snapshot.capacity is not None:
                level = level_of(cap)
                self.overheads.setdefault(
                    (int(dev), overhead_band(level)),
                    Overheads(int(dev), overhead_band(level))).add(
                        extra, level, model.get(int(dev), 0.0))
            work = w.work(task, hi - lo)
            everyone_free &= cap >= CONTENDED_CAPACITY
            measured[int(dev)] = float(seconds)
            amount = work.flops if w.bound == "compute" else work.mem_traffic
            if amount <= 0:
                continue
            key = (task.kind, task.dtype, int(dev))
            fig = self.figures.setdefault(key, Figure(*key, unit=unit))
            fig.add(amount / (float(seconds) * cap))
            done.append(key)
        if everyone_free:
            for dev, log_s in run_speeds(model, measured).items():
                key = (task.kind, task.dtype, dev, octave_of(model[dev]))
                self.speeds_kept.setdefault(key, Speed(*key)).add(log_s)
        return done

    # -- writing ------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "machine": self.machine,
                "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "window": WINDOW,
                "method": METHOD,
                "figures": [self.figures[k].to_json() for k in sorted(self.figures)],
                "method_felt": METHOD_FELT,
                "felt": [self.felt[k].to_json() for k in sorted(self.felt)],
                "method_speed": METHOD_SPEED,
                "speeds": [self.speeds_kept[k].to_json()
                           for k in sorted(self.speeds_kept)],
                "method_overhead": METHOD_OVERHEAD,
                "overheads": [self.overheads[k].to_json()
                              for k in sorted(self.overheads)],
                "devices": [{"index": i, "identity": d.identity, "label": d.label}
                            for i, d in sorted(self.devices.items())]}

    def save(self) -> Path:
        """Write atomically to ``<home>/history/<machine>.json``.

        Raises:
            HistoryError: the file there is malformed (it is left as it is).
        """
        if self.path.exists():
            _read(self.path, self.machine)   # refuse to overwrite a bad file
        return write_atomic(self.path, self.file_bytes())

    def file_bytes(self) -> bytes:
        """What :meth:`save` writes: the history as compact JSON."""
        return (json.dumps(self.to_json(), allow_nan=False) + "\n").encode()


def record_run(task: TaskSpec, decision: Decision, result: Any,
               snapshot: Snapshot | None, machine: Machine,
               params: CostParams) -> list[tuple[str, str, int]]:
    """Teach ``machine``'s saved history one MEASURED run and save it: what
    :meth:`lib.runtime.Agent.execute` does after every run (the arguments
    are :meth:`History.update`'s; returns the keys it updated).

    What the history knew of a device ``machine`` no longer has at that
    index is forgotten first (:meth:`History.adopt`).

    The history this process last wrote is kept in memory with the digest of
    the bytes it wrote. While the file still holds those bytes, it is
    updated in place of a fresh parse, and :meth:`History.peek` hands it to
    the next decision without parsing either; a file another process (or a
    person) changed is read afresh, and a malformed one refused as
    :meth:`History.load` refuses it, before anything is written. Parsing the
    file two or three times a run cost a closed-loop runtime about ten
    milliseconds a run, MEASURED on ``local-cpu`` with a history of a few
    thousand samples.

    Raises:
        HistoryError: the run is PREDICTED, or the file is malformed.
    """
    path = history_path(machine.name)
    key = (machine.name, str(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as exc:
        raise HistoryError(f"{path}: not readable ({exc})") from None
    kept = _WRITTEN.get(key)
    if data is None:
        history = History(machine.name)
    elif kept is not None and kept[0] == hashlib.blake2b(data).hexdigest():
        history = kept[1]
    else:
        history = History(machine.name, *_read(path, machine.name, data))
    _WRITTEN.pop(key, None)  # mid-update it is not what the file holds
    history.adopt(machine)   # what it knew of devices no longer there goes
    done = history.update(task, decision, result, snapshot, machine, params)
    data = history.file_bytes()
    write_atomic(path, data)
    _WRITTEN[key] = (hashlib.blake2b(data).hexdigest(), history)
    return done


#: Per (machine, path): the digest of the bytes :func:`record_run` last
#: wrote there and the history they hold.
_WRITTEN: dict[tuple[str, str], tuple[str, History]] = {}


def _peek(machine: str, path: str, digest: str, data: bytes) -> History:
    """The history ``data`` (read from ``path``) holds, parsed once per
    ``digest`` of them."""
    kept = _WRITTEN.get((machine, path))
    if kept is not None and kept[0] == digest:
        return kept[1]      # what this process wrote there: no parse
    key = (machine, path, digest)
    if key not in _PEEKED:
        if len(_PEEKED) >= 8:
            _PEEKED.pop(next(iter(_PEEKED)))
        _PEEKED[key] = History(machine, *_read(Path(path), machine, data))
    return _PEEKED[key]


_PEEKED: dict[tuple[str, str, str], History] = {}


def _read(path: Path, machine: str, data: bytes | None = None
          ) -> tuple[dict[tuple[str, str, int], Figure], dict[tuple[int, int], Felt],
                     dict[tuple[str, str, int, int], Speed],
                     dict[tuple[int, int], Overheads], dict[int, KnownDevice]]:
    """Parse a history file into its figures, what shards felt, the speed
    points, the overheads and the devices they were learned on (the last
    four absent in a file written before the history kept them: none);
    :class:`HistoryError` in one line if malformed. ``data``: the file's
    bytes, already read."""
    def bad(what: str) -> HistoryError:
        return HistoryError(f"{path}: malformed history ({what}); not used and "
                            "not overwritten: move it aside, or remove it with "
                            f"gpuhive history --machine {machine} --forget")

    try:
        obj = json.loads(data if data is not None else path.read_text())
    except (OSError, ValueError) as exc:
        raise bad(f"not readable JSON: {exc}") from None
    if not isinstance(obj, Mapping) or obj.get("schema") != SCHEMA:
        raise bad(f"not a {SCHEMA} file")
    if obj.get("machine") != machine:
        raise bad(f"it is the history of {obj.get('machine')!r}, not {machine!r}")
    figures = obj.get("figures")
    if not isinstance(figures, list):
        raise bad("no 'figures' list")
    out: dict[tuple[str, str, int], Figure] = {}
    for i, f in enumerate(figures):
        try:
            samples = [float(v) for v in f["samples"]]
            device = f["device"]
            if isinstance(device, bool) or not isinstance(device, int) or device < 0:
                raise ValueError(f"device {device!r}")
            if not samples or not all(math.isfinite(v) and v > 0 for v in samples):
                raise ValueError("samples must be positive numbers")
            runs = int(f["runs"])
            if runs < len(samples):
                raise ValueError(f"runs {runs} < {len(samples)} samples")
            fig = Figure(str(f["kind"]), str(f["dtype"]), device, str(f["unit"]),
                         samples[-WINDOW:], runs, updated=str(f.get("updated", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"figure {i}: {exc}") from None
        fig.rate, fig.log_scale = robust_rate(fig.samples)
        out[(fig.kind, fig.dtype, fig.device)] = fig
    def entries(name: str, what: str, reader: Any) -> list[Any]:
        """The ``name`` list of the file read by ``reader`` (absent: none)."""
        items = obj.get(name, [])
        if not isinstance(items, list):
            raise bad(f"'{name}' is not a list")
        read = []
        for i, f in enumerate(items):
            try:
                read.append(reader(f))
            except (KeyError, TypeError, ValueError) as exc:
                raise bad(f"{what} entry {i}: {exc}") from None
        return read

    felt = {(e.device, e.octave): e for e in entries("felt", "felt", read_felt)}
    speeds = {(e.kind, e.dtype, e.device, e.octave): e
              for e in entries("speeds", "speed", read_speed)}
    overheads = {(e.device, e.band): e
                 for e in entries("overheads", "overhead", read_overheads)}
    devices = {i: d for i, d in entries("devices", "device", _read_device)}
    return out, felt, speeds, overheads, devices


def _read_device(entry: Any) -> tuple[int, KnownDevice]:
    """One ``devices`` entry: (index, KnownDevice); ValueError if malformed."""
    index, identity = entry["index"], entry["identity"]
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index {index!r}")
    if not isinstance(identity, str) or not re.fullmatch(r"[0-9a-f]{12}", identity):
        raise ValueError(f"identity {identity!r} is not 12 hex digits")
    return index, KnownDevice(identity, str(entry.get("label", index)))
