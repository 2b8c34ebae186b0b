"""Live device state: one snapshot per decision.

A :class:`Snapshot` holds, per device, utilisation, free memory and health
(plus clocks, temperature and power where the source has them). Policies read it
through :func:`lib.contract.encode_state`; Gate 1 refuses unhealthy devices and
shards that do not fit in free memory; the cost model slows a busy device down
by ``1 / capacity`` where the snapshot measured capacity, else by
``1 / (1 - utilisation)``.

Capacity, not utilisation: utilisation says how busy a device was, which
includes our own work and says nothing of what a new shard would get. Capacity
is the share of the device a shard of ours would get now, in (0, 1], from who
else wants it: on a CPU core the runnable threads of other processes
(``/proc/<pid>/task/<tid>/stat``), on a GPU the other compute processes NVML
lists, each weighted by its recent SM time slice. Both turn into a share by
:func:`fair_share` (max-min fair sharing: CFS for threads on a core, the time
slicer for contexts on a GPU). Where the kernel schedules by autogroup (one
group per session, the default on desktop Linux), CFS shares a core between
sessions first, and a session's weight is spread over the cores it loads, so
:func:`group_capacity` weighs each session: a shard of ours next to one
process of another session gets 1/3 of the core, not 1/2, when our run also
uses a second core (MEASURED here: 0.36). A documented approximation: it
ignores per-thread nice values and cache and memory-bandwidth interference. Sources that
cannot tell (idle, busy, simulated) leave ``capacity`` None, and the model is
then exactly what it was.

Sources:

- :func:`idle` -- every device idle, all memory free (the default);
- :func:`busy` -- chosen utilisations (for experiments and tests);
- :class:`SimulatedTelemetry` -- seeded background load that comes and goes;
- :func:`nvml_snapshot` -- read from NVIDIA GPUs through NVML (nvidia-ml-py),
  including the link matrix from the PCIe topology and NVLink state; tests
  replay a recorded snapshot at the pynvml boundary with :class:`RecordedNvml`;
- :func:`local_cpu_snapshot` -- this computer's cores, read from ``/proc``
  (utilisation from ``/proc/stat``, capacity from the runnable threads of other
  processes on each core).

Only the last two are measurements (``measured=True``).

Why one module: every source fills the same :class:`Snapshot`, and the two
measuring ones share the capacity logic (:func:`fair_share`, the process tree
that is ours); a reader following one field from its source to the model stays
in this file. Each source is a short section of its own.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.platform.hostinfo import available_memory_bytes
from lib.platform.machines import Machine
from lib.platform.nvml_topology import bus_key, link_matrix, start

#: Utilisation is clipped here so a busy device is slow, never infinitely so.
MAX_UTILISATION = 0.95
#: Capacity is clipped here for the same reason (the same floor: 1 - 0.95).
MIN_CAPACITY = 1.0 - MAX_UTILISATION


class TelemetryError(RuntimeError):
    """A telemetry source cannot be read here (the message names what is missing)."""


@dataclass(frozen=True)
class Snapshot:
    """Device state at one instant.

    Attributes:
        source: where it came from (``"idle"``, ``"simulated"``, ``"nvml"``...).
        utilisation: per device, fraction of time busy with other work, [0, 1].
        free_bytes: per device, free memory in bytes.
        healthy: per device, whether it may be used.
        clocks_mhz, temperature_c, power_w: per device where known, else empty
            (NaN for a device whose reading failed).
        measured: whether the numbers were read from real devices.
        links: ``links[i][j]`` is how devices i and j are connected, one of
            :data:`~lib.platform.nvml_topology.LINK_CLASSES`; empty where the
            source does not know.
        capacity: per device, the share of it a shard of ours would get now,
            in (0, 1]; None where the source cannot tell.
        capacity_provenance: per device, how its capacity was obtained (one
            line); None with ``capacity``.
        contenders: per device, how much other work wants it (mean runnable
            threads of other processes on a core; other compute processes on a
            GPU, each weighted by its SM time slice); None where not measured.
        wait_s: per device, seconds a shard there waits beyond what a shard
            on the cheapest device waits (its worker woken, the job and the
            result handed over: MEASURED runs, learned by the runtime's
            history); None where nothing was learned. The cost model adds it
            to the device's launch (:func:`lib.costmodel.model.wait_seconds`).
        unhealthy_why: per device, why it is unhealthy (one line; empty for
            a healthy device), which Gate 1's refusal names; None where the
            source does not say.
    """

    source: str
    utilisation: tuple[float, ...]
    free_bytes: tuple[float, ...]
    healthy: tuple[bool, ...]
    clocks_mhz: tuple[float, ...] = field(default_factory=tuple)
    temperature_c: tuple[float, ...] = field(default_factory=tuple)
    power_w: tuple[float, ...] = field(default_factory=tuple)
    measured: bool = False
    links: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    capacity: tuple[float, ...] | None = None
    capacity_provenance: tuple[str, ...] | None = None
    contenders: tuple[float, ...] | None = None
    wait_s: tuple[float, ...] | None = None
    unhealthy_why: tuple[str, ...] | None = None

    def slowdown(self, i: int) -> float:
        """Factor by which device ``i``'s compute stretches: ``1 / capacity``
        where the snapshot has capacity, else ``1 / (1 - u)``."""
        if self.capacity is not None:
            return 1.0 / max(self.capacity[i], MIN_CAPACITY)
        return 1.0 / (1.0 - min(self.utilisation[i], MAX_UTILISATION))


def idle(machine: Machine) -> Snapshot:
    """Every device idle and healthy with all its memory free."""
    n = machine.n
    return Snapshot(source="idle", utilisation=(0.0,) * n,
                    free_bytes=tuple(d.mem_bytes for d in machine.devices),
                    healthy=(True,) * n)


def busy(machine: Machine, utilisation: Sequence[float],
         healthy: Sequence[bool] | None = None) -> Snapshot:
    """A snapshot with the given per-device utilisation (memory all free)."""
    if len(utilisation) != machine.n:
        raise ValueError(f"utilisation has {len(utilisation)} entries; machine "
                         f"{machine.name} has {machine.n} devices")
    return Snapshot(
        source="busy", utilisation=tuple(float(u) for u in utilisation),
        free_bytes=tuple(d.mem_bytes for d in machine.devices),
        healthy=tuple(healthy) if healthy is not None else (True,) * machine.n)


class SimulatedTelemetry:
    """Seeded background load: each device flips between idle and busy spells.

    Each call to :meth:`step` advances time by one decision. A device is busy
    with probability ``p_busy`` in steady state; a busy spell has a utilisation
    drawn from ``[0.3, 0.9]`` and lasts a geometric number of steps with mean
    ``mean_spell``. Busy devices also hold some memory.
    """

    def __init__(self, machine: Machine, seed: int = 0, p_busy: float = 0.3,
                 mean_spell: float = 5.0):
        self.machine = machine
        self.rng = np.random.default_rng(seed)
        self.p_busy = p_busy
        self.p_end = 1.0 / mean_spell
        self.p_start = self.p_end * p_busy / max(1e-9, 1.0 - p_busy)
        self.util = np.zeros(machine.n)

    def step(self) -> Snapshot:
        """Advance one step and return the snapshot."""
        n = self.machine.n
        busy_now = self.util > 0
        end = busy_now & (self.rng.random(n) < self.p_end)
        start = ~busy_now & (self.rng.random(n) < self.p_start)
        self.util[end] = 0.0
        self.util[start] = self.rng.uniform(0.3, 0.9, size=int(start.sum()))
        mem = np.array([d.mem_bytes for d in self.machine.devices])
        return Snapshot(source="simulated", utilisation=tuple(self.util.tolist()),
                        free_bytes=tuple((mem * (1.0 - 0.3 * self.util)).tolist()),
                        healthy=(True,) * n)


# --------------------------------------------------------------------------
# Capacity: the share a shard of ours would get

def fair_share(demands: Sequence[float]) -> float:
    """Our share of a device that others want, under max-min fair sharing.

    Each other contender ``j`` wants a fraction ``demands[j]`` of the device
    (1 for a thread that is always runnable); we want all of it. Fair sharing
    gives everyone the same level L, or less if they want less:
    ``L + sum(min(d_j, L)) = 1``; our share is L. With n always-runnable
    contenders this is ``1 / (1 + n)`` (CFS between equal-weight threads); a
    contender that wants 0.3 leaves us 0.7. An approximation: priorities, nice
    values and interference in caches and memory bandwidth are ignored.
    """
    left, sharers = 1.0, 1
    pending = sorted(min(1.0, max(0.0, float(d))) for d in demands)
    sharers += len(pending)
    for d in pending:
        if d > left / sharers:
            break
        left -= d
        sharers -= 1
    return min(1.0, max(MIN_CAPACITY, left / sharers))


def weighted_share(ours: float, others: Sequence[tuple[float, float]]) -> float:
    """Our share of a device shared by weighted entities, max-min fair.

    We have weight ``ours`` and want all of the device; other entity ``j`` has
    weight ``w_j`` and wants a fraction ``d_j`` of it (``others`` holds
    ``(w_j, d_j)``). Fair sharing gives each entity ``w * L`` for one level
    ``L``, or what it wants if that is less: ``ours L + sum(min(d_j, w_j L))
    = 1``. With equal weights this is :func:`fair_share`.
    """
    live = sorted(((min(1.0, max(0.0, d)), w) for w, d in others if w > 0 and d > 0),
                  key=lambda x: x[0] / x[1])
    left, weight = 1.0, ours + sum(w for _, w in live)
    for d, w in live:
        if d > w * left / weight:
            break
        left -= d
        weight -= w
    return min(1.0, max(MIN_CAPACITY, ours * left / weight))


def autogroups_enabled() -> bool:
    """Whether the kernel schedules by autogroup (one group per session,
    ``/proc/sys/kernel/sched_autogroup_enabled``): then a core is shared
    between sessions first, and a session's weight is spread over the cores
    where its threads run."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as fh:
            return fh.read().strip() == "1"
    except OSError:
        return False


def autogroup_of(pid: int) -> tuple[str, float] | None:
    """``(group, weight)`` of process ``pid`` from ``/proc/<pid>/autogroup``
    (``/autogroup-17 nice 0``: CFS weight ``1.25 ** -nice``, 1 at nice 0);
    None where the file cannot be read (the process ended, or this kernel or
    container does not show it)."""
    try:
        with open(f"/proc/{pid}/autogroup") as fh:
            name, _, nice = fh.read().split()
        return name, 1.25 ** -int(nice)
    except (OSError, ValueError):
        return None


#: ``PF_KTHREAD`` in the flags of ``/proc/<pid>/stat``: a kernel thread.
_PF_KTHREAD = 0x00200000


def kernel_thread_group(pid: int) -> tuple[str, float] | None:
    """``(group, weight)`` for a kernel thread (``kworker``, ``kcompactd``):
    it belongs to no autogroup, and CFS schedules it as an entity of its own
    in the root group, weighted by its nice value; None for anything else
    (or a thread that has ended)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    try:
        if fields is None or not int(fields[6]) & _PF_KTHREAD:
            return None
        return f"kernel-thread-{pid}", 1.25 ** -int(fields[16])
    except (IndexError, ValueError):
        return None


def session_groups(pids: Iterable[int]) -> dict[int, tuple[str, float]] | None:
    """The autogroup of each process in ``pids`` and of this one
    (:func:`autogroup_of`); a process that has ended since it was seen is
    left out (it contends no more). None if our own group cannot be read
    (then the caller shares thread by thread).

    A live contender whose group cannot be read is a group of its own: a
    kernel thread is one (:func:`kernel_thread_group`), and so, in all
    likelihood, is a process another PID namespace hides from us (nice 0
    assumed). Sharing thread by thread instead would make our capacity on a
    core beside one spinning process jump from 1/3 to 1/2 whenever a
    ``kworker`` on the *other* core is runnable in one of five looks (a third
    of the snapshots on local-cpu).
    """
    out: dict[int, tuple[str, float]] = {}
    for pid in {*pids, os.getpid()}:
        group = autogroup_of(pid)
        if group is None and pid == os.getpid():
            return None
        if group is None and os.path.exists(f"/proc/{pid}"):
            group = kernel_thread_group(pid) or (f"unreadable-{pid}", 1.0)
        if group is not None:
            out[pid] = group
    return out


def group_capacity(demand: Mapping[int, Mapping[int, float]],
                   groups: Mapping[int, tuple[str, float]], mine: Sequence[int],
                   own: tuple[str, float] = ("", 1.0)) -> tuple[float, ...]:
    """Each of our devices' capacity under autogroup scheduling.

    ``demand``: core -> {thread id: fraction of looks runnable} for the
    threads of other processes on every core; ``groups``: thread id -> its
    autogroup and weight; ``mine``: the core of each of our devices, one
    worker each (a run over all of them: a run on fewer devices spreads our
    session's weight over fewer cores and gets more); ``own``: our session's
    autogroup and weight (other processes of our session compete inside it).

    CFS shares a core between groups first: each group's weight there is its
    weight times its share of the group's runnable load (ours: our workers
    plus our session's other threads), and our group's time on a core is then
    shared fairly between its threads there.
    """
    load: dict[str, float] = {own[0]: float(len(mine))}
    per_core: dict[int, dict[str, float]] = {}
    weight = {own[0]: own[1]}
    for core, threads in demand.items():
        for tid, d in threads.items():
            g, w = groups[tid]
            weight[g] = w
            load[g] = load.get(g, 0.0) + d
            row = per_core.setdefault(core, {})
            row[g] = row.get(g, 0.0) + d
    out = []
    for core in mine:
        workers = mine.count(core)
        same = [d for t, d in demand.get(core, {}).items() if groups[t][0] == own[0]]
        ours = own[1] * (workers + sum(same)) / load[own[0]]
        others = [(weight[g] * d / load[g], d)
                  for g, d in per_core.get(core, {}).items()
                  if g != own[0] and load[g] > 0]
        inside = fair_share(same + [1.0] * (workers - 1))
        out.append(max(MIN_CAPACITY, weighted_share(ours, others) * inside))
    return tuple(out)


def capacity_of(demand: Mapping[int, Mapping[int, float]],
                pids: Mapping[int, int], mine: Sequence[int],
                grouped: bool | None = None) -> tuple[float, ...]:
    """Our capacity on each core of ``mine`` from other processes' runnable
    threads (``demand``: core -> {tid: fraction of looks runnable}, over every
    core where ``grouped``; ``pids``: tid -> its process): by autogroup where
    the kernel schedules so and every group can be read
    (:func:`group_capacity`), else thread by thread (:func:`fair_share`)."""
    return _capacity(demand, pids, mine, grouped)[0]


def _capacity(demand: Mapping[int, Mapping[int, float]], pids: Mapping[int, int],
              mine: Sequence[int], grouped: bool | None = None
              ) -> tuple[tuple[float, ...], bool]:
    """:func:`capacity_of` and whether it shared by autogroup."""
    if grouped is None:
        grouped = autogroups_enabled()
    owners = session_groups(set(pids.values())) if grouped else None
    if owners is not None:
        live = {c: {t: d for t, d in row.items() if pids[t] in owners}
                for c, row in demand.items()}
        return (group_capacity(live, {t: owners[p] for t, p in pids.items()
                                      if p in owners},
                               mine, owners[os.getpid()]), True)
    return tuple(fair_share(list(demand.get(c, {}).values())) for c in mine), False


def _stat_fields(path: str) -> list[str] | None:
    """Fields of a ``/proc/.../stat`` file after the command name (state is
    ``[0]``, ppid ``[1]``, processor ``[36]``); None if it vanished."""
    try:
        with open(path) as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def own_pids(extra: Sequence[int] = ()) -> set[int]:
    """This process, every process descended from it (the cpu backend's
    workers included) and the processes ``extra`` (not their descendants):
    the work that is ours, not contention."""
    ours = {os.getpid()}
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return ours
    for name in entries:
        if name.isdigit():
            fields = _stat_fields(f"/proc/{name}/stat")
            if fields is not None and len(fields) > 1:
                parents[int(name)] = int(fields[1])
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                grew = True
    return ours | {int(p) for p in extra}


def runnable_threads(exclude: set[int]) -> dict[int, int]:
    """One look at ``/proc``: thread id -> core, for every runnable (state R)
    thread of a process not in ``exclude``. The core is the ``processor``
    field, the core the thread last ran on."""
    return {tid: core for tid, (core, _) in runnable_look(exclude).items()}


def runnable_look(exclude: set[int]) -> dict[int, tuple[int, int]]:
    """One look: tid -> (core, pid) of every runnable thread of a process not
    in ``exclude`` (:func:`runnable_threads` with each thread's process)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid in exclude:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
            if fields is not None and len(fields) > 36 and fields[0] == "R":
                out[int(tid)] = (int(fields[36]), pid)
    return out


def runnable_demand(cores: Sequence[int], exclude_pids: Sequence[int] = (),
                    samples: int = 5, interval: float = 0.1
                    ) -> dict[int, dict[int, float]]:
    """core -> {thread id: fraction of ``samples`` looks it was runnable there},
    for the threads of other processes (:func:`own_pids` of ``exclude_pids``
    excluded), the looks spread evenly over ``interval`` seconds."""
    return _looks(cores, exclude_pids, samples, interval)[0]


def _looks(cores: Sequence[int] | None, exclude_pids: Sequence[int] = (),
           samples: int = 5, interval: float = 0.1
           ) -> tuple[dict[int, dict[int, float]], dict[int, int]]:
    """:func:`runnable_demand` (on every core where ``cores`` is None) and the
    process of each thread seen."""
    exclude = own_pids(exclude_pids)
    samples = max(1, int(samples))
    counts: dict[int, dict[int, int]] = {c: {} for c in cores or ()}
    pids: dict[int, int] = {}
    for k in range(samples):
        if k:
            time.sleep(max(0.0, interval) / max(1, samples - 1))
        for tid, (core, pid) in runnable_look(exclude).items():
            if cores is None or core in counts:
                row = counts.setdefault(core, {})
                row[tid] = row.get(tid, 0) + 1
                pids[tid] = pid
    return ({c: {t: n / samples for t, n in row.items()} for c, row in counts.items()},
            pids)


# --------------------------------------------------------------------------
# NVML (real GPUs, or a recorded snapshot replayed at the pynvml boundary)

def nvml_snapshot(nvml: Any = None, exclude_pids: Sequence[int] | None = None
                  ) -> Snapshot:
    """Read every GPU's state and the link matrix through NVML.

    Args:
        nvml: the ``pynvml`` module (default), or an object with the same
            function and constant names, such as :class:`RecordedNvml`.
        exclude_pids: the processes that are ours (not contention); default
            :func:`own_pids` (this process and its descendants).

    Returns:
        A measured :class:`Snapshot` (``source="nvml"``): utilisation in [0, 1]
        (NVML's percentage over 100), free memory in bytes, SM clock in MHz,
        temperature in C, power in W, and ``links`` from the PCIe topology and
        NVLink state. A device whose calls fail is unhealthy, with utilisation
        1, no free memory and NaN readings. Capacity (see :func:`gpu_capacity`)
        where at least one device lists its compute processes, else None.

    Raises:
        TelemetryError: nvidia-ml-py is not installed, or NVML cannot start (no
            NVIDIA driver).
    """
    nvml, error = start(nvml, TelemetryError, "NVML telemetry")
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        util, free, ok, clocks, temps, power, buses = [], [], [], [], [], [], []
        why: list[str] = []
        for h in handles:
            try:
                u = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
                f = float(nvml.nvmlDeviceGetMemoryInfo(h).free)
                c = float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
                t = float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
                p = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                bus = bus_key(nvml.nvmlDeviceGetPciInfo(h).busId)
                row = (min(1.0, max(0.0, u)), f, True, c, t, p, bus)
                why.append("")
            except error as exc:
                row = (1.0, 0.0, False, math.nan, math.nan, math.nan, None)
                why.append(f"NVML cannot read it ({exc})")
            for store, value in zip((util, free, ok, clocks, temps, power, buses),
                                    row, strict=True):
                store.append(value)
        links, _ = link_matrix(nvml, handles, buses, error)
        ours = own_pids() if exclude_pids is None else set(exclude_pids)
        caps = [gpu_capacity(nvml, h, ours, error) for h in handles]
    finally:
        try:
            nvml.nvmlShutdown()
        except error:
            pass
    return Snapshot(source="nvml", utilisation=tuple(util), free_bytes=tuple(free),
                    healthy=tuple(ok), clocks_mhz=tuple(clocks),
                    temperature_c=tuple(temps), power_w=tuple(power), measured=True,
                    links=links, unhealthy_why=tuple(why),
                    **_gpu_capacity_fields(caps, util))


def gpu_capacity(nvml: Any, handle: Any, ours: set[int],
                 error: type[BaseException]) -> tuple[float, float, str] | None:
    """(capacity, contenders, provenance) of one GPU, or None if NVML cannot
    list its compute processes.

    Every compute process on the device that is not ours
    (``nvmlDeviceGetComputeRunningProcesses``) contends for its time slices.
    Each wants the fraction of the device its recent samples show it using
    (``nvmlDeviceGetProcessUtilization``: mean ``smUtil`` / 100; a listed
    process with no sample in the buffer wants 0), or all of it where NVML
    keeps no per-process samples. :func:`fair_share` of those demands is the
    capacity.
    """
    try:
        procs = [int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except error:
        return None
    others = sorted({p for p in procs if p not in ours})
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    except error:
        samples = None
    if samples is None:
        demands = [1.0] * len(others)
        how = (f"{len(others)} other compute process(es) "
               "(nvmlDeviceGetComputeRunningProcesses), each counted as always "
               "busy (no per-process samples); time-slice fair share")
    else:
        seen: dict[int, list[float]] = {}
        for smp in samples:
            seen.setdefault(int(smp.pid), []).append(float(smp.smUtil) / 100.0)
        demands = [sum(seen[p]) / len(seen[p]) if p in seen else 0.0
                   for p in others]
        how = (f"{len(others)} other compute process(es) "
               "(nvmlDeviceGetComputeRunningProcesses), each weighted by its mean "
               "SM share (nvmlDeviceGetProcessUtilization); time-slice fair share")
    return fair_share(demands), float(sum(demands)), how


def _gpu_capacity_fields(caps: Sequence[tuple[float, float, str] | None],
                         util: Sequence[float]) -> dict[str, Any]:
    """Snapshot fields from per-device :func:`gpu_capacity` readings: None if
    no device could tell; a device that could not falls back on ``1 - u``
    (which the model would have used anyway) and says so."""
    if all(c is None for c in caps):
        return {}
    capacity, contenders, provenance = [], [], []
    for c, u in zip(caps, util, strict=True):
        if c is None:
            capacity.append(1.0 - min(u, MAX_UTILISATION))
            contenders.append(math.nan)
            provenance.append("1 - utilisation (NVML lists no compute processes "
                              "for this device)")
        else:
            capacity.append(c[0])
            contenders.append(c[1])
            provenance.append(c[2])
    return {"capacity": tuple(capacity), "contenders": tuple(contenders),
            "capacity_provenance": tuple(provenance)}


class RecordedNvmlError(Exception):
    """What a recorded call that failed raises (stands in for pynvml.NVMLError)."""


class _Reading:
    """Attribute access to a recorded NVML struct (``.gpu``, ``.free``...)."""

    def __init__(self, fields: Mapping[str, Any]):
        self.__dict__.update(fields)


class RecordedNvml:
    """A recorded NVML snapshot, replayed with pynvml's function names.

    The recording (``tests/data/nvml_snapshot.json``) holds per device what each
    call returned: ``name``, ``pci_bus_id``, ``utilization`` (``gpu``/``memory``
    percent), ``memory`` (``total``/``free``/``used`` bytes), ``clocks``
    (``sm``/``mem`` MHz), ``temperature_c``, ``power_mw``, ``nvlink`` (link
    number -> ``{"state": 0|1, "remote_bus_id": ...}``), optionally
    ``compute_processes`` (``[{"pid", "usedGpuMemory"}]``) and
    ``process_utilization`` (``[{"pid", "timeStamp", "smUtil", "memUtil"}]``,
    pynvml's field names), ``cores``, ``max_clocks`` (``sm``/``mem`` MHz),
    ``memory_bus_width`` (bits), ``compute_capability`` (``[major, minor]``)
    and ``pcie_generation`` (recordings without them replay as NVML's "not
    supported"); and a ``topology`` matrix of common-ancestor levels and
    optionally a ``p2p_read`` matrix (whether peer-to-peer reads work). A value
    ``{"error": "..."}`` makes that call raise :attr:`NVMLError`, as NVML
    does; a link number absent from ``nvlink`` raises as well (NVML's "not
    supported").

    Args:
        source: path of the JSON recording, or the already-loaded object.
    """

    NVMLError = RecordedNvmlError
    # pynvml's constant values, so the code under test sees the same numbers.
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_TEMPERATURE_GPU = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_TOPOLOGY_INTERNAL = 0
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_HOSTBRIDGE = 30
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50

    def __init__(self, source: str | Path | Mapping[str, Any]):
        if isinstance(source, Mapping):
            self.record = source
        else:
            self.record = json.loads(Path(source).read_text())
        self.devices = list(self.record["devices"])
        self.topology = self.record.get("topology", [])
        self.initialised = False

    def _get(self, handle: int, *path: str) -> Any:
        value: Any = self.devices[handle]
        for key in path:
            if isinstance(value, Mapping) and "error" in value:
                break
            if not isinstance(value, Mapping) or key not in value:
                raise RecordedNvmlError(f"Not Supported ({'.'.join(path)})")
            value = value[key]
        if isinstance(value, Mapping) and "error" in value:
            raise RecordedNvmlError(value["error"])
        return value

    def nvmlInit(self) -> None:
        if "init_error" in self.record:
            raise RecordedNvmlError(self.record["init_error"])
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.devices):
            raise RecordedNvmlError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._get(handle, "name")

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Reading:
        return _Reading(self._get(handle, "utilization"))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Reading:
        return _Reading(self._get(handle, "memory"))

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return self._get(handle, "clocks", "sm" if clock == self.NVML_CLOCK_SM
                         else "mem")

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._get(handle, "temperature_c")

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._get(handle, "power_mw")

    def nvmlDeviceGetPciInfo(self, handle: int) -> _Reading:
        return _Reading({"busId": self._get(handle, "pci_bus_id")})

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        return self._get(handle, "nvlink", str(link), "state")

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> _Reading:
        return _Reading({"busId": self._get(handle, "nvlink", str(link),
                                            "remote_bus_id")})

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Reading]:
        return [_Reading(p) for p in self._get(handle, "compute_processes")]

    def nvmlDeviceGetProcessUtilization(self, handle: int,
                                        last_seen: int) -> list[_Reading]:
        return [_Reading(p) for p in self._get(handle, "process_utilization")
                if int(p.get("timeStamp", 0)) > last_seen]

    def nvmlDeviceGetNumGpuCores(self, handle: int) -> int:
        return self._get(handle, "cores")

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        return self._get(handle, "max_clocks", "sm" if clock == self.NVML_CLOCK_SM
                         else "mem")

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return self._get(handle, "memory_bus_width")

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._get(handle, "compute_capability")
        return int(major), int(minor)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._get(handle, "pcie_generation")

    def nvmlDeviceGetP2PStatus(self, h1: int, h2: int, index: int) -> int:
        matrix = self.record.get("p2p_read")
        if matrix is None:
            raise RecordedNvmlError("Not Supported (p2p_read)")
        return self.NVML_P2P_STATUS_OK if matrix[h1][h2] else \
            self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: int, h2: int) -> int:
        level = self.topology[h1][h2]
        if level is None:
            raise RecordedNvmlError("Not Supported")
        return level


# --------------------------------------------------------------------------
# This computer's cores, from /proc

def _proc_stat_times() -> dict[int, tuple[int, int]]:
    """core -> (busy jiffies, total jiffies) from ``/proc/stat``."""
    out: dict[int, tuple[int, int]] = {}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            ticks = [int(v) for v in values[:8]]
            idle = ticks[3] + ticks[4]   # idle + iowait
            total = sum(ticks)
            out[int(name[3:])] = (total - idle, total)
    return out


def _mem_available_bytes() -> float:
    available = available_memory_bytes()
    if available is None:
        raise TelemetryError("local-cpu telemetry: /proc/meminfo has no "
                             "MemAvailable")
    return available


def local_cpu_snapshot(machine: Machine, interval: float = 0.1,
                       exclude_pids: Sequence[int] = (),
                       samples: int = 5) -> Snapshot:
    """Per-core load, capacity and free memory of this computer, read from the OS.

    Device i is the core ``sorted(os.sched_getaffinity(0))[i % cores]`` (the
    core the cpu backend pins worker i to). Its utilisation is the fraction of
    ``interval`` seconds the core spent busy (``/proc/stat`` deltas; idle and
    iowait count as not busy), which includes this process's own work if it
    runs there. Its capacity is :func:`fair_share` of the runnable threads of
    other processes on that core, looked at ``samples`` times over the same
    ``interval`` (this process, its descendants -- the cpu backend's workers --
    and ``exclude_pids`` do not count): 0.5 with one thread spinning there, 1/3
    with two. Free memory is ``MemAvailable`` from ``/proc/meminfo`` split
    evenly over the devices.

    Raises:
        TelemetryError: no ``/proc`` (not Linux).
    """
    if not (hasattr(os, "sched_getaffinity") and os.path.exists("/proc/stat")):
        raise TelemetryError("local-cpu telemetry needs /proc/stat and "
                             "sched_getaffinity (Linux)")
    cores = sorted(os.sched_getaffinity(0))
    mine = [cores[i % len(cores)] for i in range(machine.n)]
    grouped = autogroups_enabled()
    before = _proc_stat_times()
    demand, pids = _looks(None if grouped else sorted(set(mine)), exclude_pids,
                          samples, interval)
    after = _proc_stat_times()
    util = []
    for core in mine:
        if core not in before or core not in after:
            raise TelemetryError(f"local-cpu telemetry: /proc/stat has no line "
                                 f"for core {core}")
        busy_ticks = after[core][0] - before[core][0]
        total_ticks = after[core][1] - before[core][1]
        util.append(min(1.0, max(0.0, busy_ticks / total_ticks))
                    if total_ticks > 0 else 0.0)
    free = _mem_available_bytes() / machine.n
    looks = max(1, int(samples))
    capacity, by_group = _capacity(demand, pids, mine, grouped)
    how = (f"runnable threads of other processes on core {{core}} (state R, "
           f"/proc/<pid>/task/<tid>/stat), {looks} looks over {interval:g} s; "
           + ("CFS fair share between autogroups (sessions), each group's "
              "weight spread over the cores it loads, ours over every device"
              if by_group else "CFS fair share between threads"
              + (" (autogroups unreadable)" if grouped else "")))
    return Snapshot(source="local-cpu", utilisation=tuple(util),
                    free_bytes=(free,) * machine.n, healthy=(True,) * machine.n,
                    measured=True, capacity=capacity,
                    capacity_provenance=tuple(how.format(core=c) for c in mine),
                    contenders=tuple(float(sum(demand.get(c, {}).values()))
                                     for c in mine))
