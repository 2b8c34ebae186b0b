"""Eq. (1): the predicted time of decision ``d`` on machine ``m``.

Each chosen device ``i`` gets ``r_i`` rows of the divisible dimension::

    T(d) = max_i [ t_launch + t_in,i + t_comp,i + t_out,i ] + t_merge

    t_comp,i = max(flops_i / (F_i e_k), bytes_i / (B_i e'_k mu_i)) * eta_i / c_i

- ``F_i``, ``B_i``: peak FLOP/s for the dtype and memory bandwidth of device i;
  ``e_k``, ``e'_k``: compute and memory efficiencies of kernel kind k
  (:class:`CostParams`).
- ``mu_i``: a multiple of the memory bandwidth for a task whose data stay in
  the cache: ``cache_bw[kind]`` where the whole task's inputs and outputs fit
  in half the device's last-level cache (:attr:`Device.cache_bytes`, or the
  size calibration found its runs behave as if they had), else 1
  (:func:`cache_factor`). It divides the memory limit. It is decided for the
  whole task, not for each shard, so every term stays affine in rows: the
  devices of ``local-cpu`` share their last-level cache, so the whole task's
  data is what competes for it. Off (1) until a calibration fits it from
  runs on both sides of the cache.
- ``eta_i``: co-running devices slow each other: on a device kind with a
  fitted ``corun[kind] = zeta``, a shard's compute stretches by
  ``1 + zeta (k - 1)`` where k devices of that kind run shards of the
  decision at once (the cores of one chip share their memory controller and
  caches; two hyper-threads share a core). 1 without it, and for GPUs.
- ``c_i``: the device's capacity, the share of it a shard of ours gets now,
  where telemetry measured it; otherwise ``1 - u_i`` with ``u_i`` the live
  utilisation (Eq. (1) as first written). Without telemetry, 1. The runtime
  hands a policy, and so this model, the capacity *effective for the task*:
  a short shard on a busy core often runs as on a free one, and the device's
  history says for how long (:func:`lib.costmodel.contention.effective_snapshot`),
  or until it has a figure, the calibration's ``burst_s``;
  and a device the history measured slower on this kind than the fastest
  one, against this model, gets that fraction ``g_i / max g`` of its capacity
  (:func:`lib.costmodel.speed.speed_snapshot`).
- ``t_in``, ``t_out``: bytes over the device's host link bandwidth plus its
  latency (each scaled by what calibration measured of the link,
  :func:`host_link_terms`).
- ``t_launch`` holds the launch (``launch_s`` of the device's kind, plus
  ``fixed_s`` of the kernel's kind: what its own set-up adds) and, on a device
  shared with other processes where telemetry measured its capacity, the wait
  for the scheduler ``w_kind (1 / c_i - 1)`` once per shard: a worker woken on
  a core that others keep busy may wait for their time slices before it runs,
  which matters to a short shard and not to a long one. ``w_kind`` is 0 until
  a calibration fits it from runs taken under load (``sched_wait``).
- ``t_host = sum_i h_kind(i)`` over the devices with rows: what the host does
  for each shard one after another (the cpu backend sends every worker its
  shard and collects its result from one process), so a second shard costs
  time even when it runs in parallel (``host_s``: 100 us for a CPU worker by
  default, 0 for a GPU, fitted by calibration from runs on one and on several
  devices); it is why a tiny task can be faster on one core than on two.
- ``pipelined`` mode cuts a shard into ``c = ceil(r_i / chunk)`` chunks; the
  three stages (copy in, compute, copy out) overlap, so the shard takes
  ``a + b + o + (c - 1) max(a, b, o) + c t_launch`` with a, b, o per-chunk stage
  times (bytes every chunk needs, like matmul's B, go first, unoverlapped).
- ``t_merge`` for ``concat`` is zero beyond each shard's own copy-out (shards
  land in place in the host buffer). For ``sum`` it depends on the comm path:
  ``host`` -- every partial comes to the host, which adds k of them;
  ``p2p`` -- partials go to the first device over peer links, it adds them and
  copies one result out; ``nccl`` -- ring all-reduce,
  ``2(k-1)/k * bytes / slowest ring link + 2(k-1) latency``, then one copy out.

On a Dask cluster (:attr:`~lib.platform.machines.Machine.cluster`) the same
equation holds with what the dask backend does: ``t_in = 0`` (each worker
generates its inputs from the seed before the clock starts), ``t_launch`` is
the scheduler's cost of one task, ``pipelined`` runs as ``split``, a ``p2p``
sum is a tree of ``ceil(log2 k)`` levels of worker-to-worker transfers and
adds, and every decision pays a fixed ``t_dispatch`` (submitting and
gathering, MEASURED at about 10 ms on two local workers).

All times in seconds. The prediction is finite and positive for every decision
Gate 1 accepts.

Why one module: every term of Eq. (1), the parameters that price them and
:func:`predict` that adds them up are read against each other (the book
quotes them term by term, and the oracle's vectorised search and the
calibration's array shortcut are tested against :func:`predict`); split, a
term and its parameter would live in two places.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lib.contract import KINDS, Decision, TaskSpec
from lib.platform.machines import Device, Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import (
    ShardWork,
    like_of,
    split_rows,
    whole_work,
    workload,
)

#: A task's data stay in a device's cache when they fit in this fraction of
#: its last-level cache (the rest holds what else runs there, and a set that
#: just fills an LRU cache streams through it as if it did not fit).
CACHE_FIT = 0.5


@dataclass(frozen=True)
class CostParams:
    """Efficiencies and latencies of Eq. (1), per device kind (``gpu``/``cpu``).

    Attributes:
        compute_eff: (device kind, workload kind) -> fraction of peak FLOP/s a
            kernel reaches, e_k; typically 0.3-0.9.
        memory_eff: (device kind, workload kind) -> fraction of peak memory
            bandwidth reached, e'_k; typically 0.5-0.9.
        launch_s: device kind -> seconds per kernel launch, paid by every
            shard in parallel (~5 us on a GPU and on a CPU worker).
        link_scale: device kind -> multiplier on host-link bandwidth (measured
            over datasheet); 1.0 uncalibrated.
        latency_scale: device kind -> multiplier on the host link's latency,
            each copy's fixed cost (absent: 1, the profile's figure; fitted
            from runs of tasks small enough that the copies' latencies are
            most of their time, as ``link_scale`` is from large ones).
        source: ``"default"`` or what they were fitted to.
        fitted: the names of the parameters that came from measurement.
        contention: device kind -> exponent ``gamma`` on a device's slowdown
            under contention: a shard gets ``capacity ** gamma`` of the device
            (1, the default: the scheduler's fair share; fitted from runs
            taken under load, where a shard gets less than that share, and
            never below 1: :data:`lib.costmodel.fit._BOUNDS` says why).
        sched_wait: device kind -> seconds ``w`` a shard waits for the
            scheduler on a device whose measured capacity ``c`` is below 1,
            per unit of ``1 / c - 1`` (0, the default: no wait; fitted from
            runs taken under load).
        burst_s: device kind -> seconds ``b`` a woken shard runs as on a free
            device before it feels the contention its capacity says: a shard
            of ``tau`` seconds (its device's time on an equal split) feels
            ``max(0, 1 - b / tau)`` of it, the form the runtime's history fits
            per device (:class:`lib.costmodel.contention.Burst`, with
            ``rho_inf = 1``). Absent: every shard feels all of it. Fitted
            from runs taken under load, and applied to a snapshot, not inside
            this model (:func:`lib.costmodel.contention.calibrated_bursts`):
            the history's own figure for a device takes its place.
        fixed_s: (device kind, workload kind) -> seconds a kernel of that
            kind costs beyond the launch every kind pays (``launch_s``),
            whatever its rows: its own set-up (a CPU worker's reduce or
            stencil does more around its arithmetic than an elementwise one
            does; a GPU kind that launches a second pass). Part of
            ``t_launch`` (:func:`launch_seconds`), so paid per chunk in
            pipelined mode. Absent: 0; fitted from runs of the kind at
            several sizes.
        cache_bw: device kind -> multiple of a device's memory bandwidth for a
            task whose data fit in half its last-level cache (absent: 1, the
            term off; fitted from runs on both sides of the cache).
        cache_size: device kind -> the last-level cache, in bytes, that its
            runs behave as if they had (absent: each device's reported
            :attr:`Device.cache_bytes`). Calibration chooses it from the runs
            (:func:`lib.costmodel.fit.fit_params`): a virtual machine's cores
            report the host chip's whole cache (hundreds of MiB, shared with
            every other tenant), and no run of ours behaves as if it had it.
        corun: device kind -> ``zeta``, how much co-running devices of that
            kind slow each other: a shard's compute takes ``1 + zeta (k - 1)``
            times longer when k of them run at once (absent: 0; fitted from
            runs on one and on several devices).
        host_s: device kind -> seconds the host spends, serially, on each
            shard on a device of that kind (a CPU worker: 100 us, the cpu
            backend's parent handing it its shard and collecting it; a GPU:
            0, its launch is asynchronous; fitted from runs on one and
            several devices). Not on a Dask cluster, where
            ``launch_s["dask-decision"]`` holds the host's part.
    """

    compute_eff: Mapping[tuple[str, str], float]
    memory_eff: Mapping[tuple[str, str], float]
    launch_s: Mapping[str, float]
    link_scale: Mapping[str, float] = field(default_factory=dict)
    source: str = "default"
    fitted: tuple[str, ...] = ()
    contention: Mapping[str, float] = field(default_factory=dict)
    sched_wait: Mapping[str, float] = field(default_factory=dict)
    host_s: Mapping[str, float] = field(default_factory=dict)
    cache_bw: Mapping[str, float] = field(default_factory=dict)
    corun: Mapping[str, float] = field(default_factory=dict)
    cache_size: Mapping[str, float] = field(default_factory=dict)
    latency_scale: Mapping[str, float] = field(default_factory=dict)
    burst_s: Mapping[str, float] = field(default_factory=dict)
    fixed_s: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def cache_bytes(self, device: Device) -> float:
        """The last-level cache ``device`` is priced with: the calibrated
        :attr:`cache_size` of its kind, else the size it reports."""
        return self.cache_size.get(device.kind, device.cache_bytes)

    def e(self, device_kind: str, kind: str) -> float:
        """Compute efficiency; a registered kind without its own takes that
        of the built-in kind it behaves like (:func:`like_of`)."""
        got = self.compute_eff.get((device_kind, kind))
        if got is None:
            got = self.compute_eff.get((device_kind, like_of(kind)), 0.5)
        return got

    def e_mem(self, device_kind: str, kind: str) -> float:
        """Memory efficiency, as :meth:`e` finds it."""
        got = self.memory_eff.get((device_kind, kind))
        if got is None:
            got = self.memory_eff.get((device_kind, like_of(kind)), 0.7)
        return got

    def fixed(self, device_kind: str, kind: str) -> float:
        """A shard's fixed cost ``s_k`` (``fixed_s``), as :meth:`e` finds it;
        0 where none was fitted."""
        got = self.fixed_s.get((device_kind, kind))
        if got is None:
            got = self.fixed_s.get((device_kind, like_of(kind)), 0.0)
        return got


def default_params() -> CostParams:
    """Uncalibrated starting values (estimates, not measurements)."""
    gpu_c = {"matmul": 0.7, "reduce": 0.5, "elementwise": 0.5, "stencil": 0.5,
             "histogram": 0.3}
    gpu_m = {"matmul": 0.8, "reduce": 0.85, "elementwise": 0.85, "stencil": 0.7,
             "histogram": 0.6}
    cpu_c = {"matmul": 0.5, "reduce": 0.25, "elementwise": 0.25, "stencil": 0.25,
             "histogram": 0.1}
    cpu_m = {"matmul": 0.6, "reduce": 0.7, "elementwise": 0.6, "stencil": 0.5,
             "histogram": 0.4}
    compute = {("gpu", k): gpu_c[k] for k in KINDS}
    compute.update({("cpu", k): cpu_c[k] for k in KINDS})
    memory = {("gpu", k): gpu_m[k] for k in KINDS}
    memory.update({("cpu", k): cpu_m[k] for k in KINDS})
    # "dask-decision": submitting a decision and gathering its result;
    # "dask-task": what each shard's task adds. MEASURED on dask-local:2 (a
    # 64-element task, medians of 20): 10.6 ms on one worker, 10.65 ms on two.
    # "cpu" host: the cpu backend's parent hands each worker its shard and
    # collects it, one after another. MEASURED on local-cpu (calibrated on a
    # quick characterisation): 123 us a shard, the launch itself 3 us.
    return CostParams(compute_eff=compute, memory_eff=memory,
                      launch_s={"gpu": 5e-6, "cpu": 5e-6, "dask-task": 1e-4,
                                "dask-decision": 1e-2},
                      host_s={"cpu": 1e-4})


_DEFAULT = default_params()


@dataclass(frozen=True)
class DeviceTime:
    """One device's part of a prediction (seconds; rows of the divisible dim)."""

    device: int
    label: str
    rows: int
    share: float
    t_launch: float
    t_in: float
    t_comp: float
    t_out: float
    chunks: int = 1

    @property
    def total(self) -> float:
        """This device's finish time (pipelining already folded into parts)."""
        return self.t_launch + self.t_in + self.t_comp + self.t_out


@dataclass(frozen=True)
class Prediction:
    """Eq. (1) evaluated: total seconds and the per-device breakdown.

    Always PREDICTED (``measured`` is False): a model, not a measurement.
    """

    total: float
    devices: tuple[DeviceTime, ...]
    t_merge: float
    mode: str
    comm_path: str
    params_source: str = "default"
    measured: bool = False
    t_dispatch: float = 0.0
    """A Dask cluster's fixed cost of a decision (0 elsewhere)."""
    t_host: float = 0.0
    """The host's serial cost of the shards (``host_s``; 0 without CPU workers)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "label": "PREDICTED", "total_seconds": self.total,
            "t_merge": self.t_merge, "t_dispatch": self.t_dispatch,
            "t_host": self.t_host,
            "mode": self.mode, "comm_path": self.comm_path,
            "params": self.params_source,
            "devices": [{"device": d.device, "label": d.label, "rows": d.rows,
                         "share": d.share, "t_launch": d.t_launch, "t_in": d.t_in,
                         "t_comp": d.t_comp, "t_out": d.t_out, "chunks": d.chunks,
                         "total": d.total} for d in self.devices],
        }


def roofline_terms(task: TaskSpec, work: ShardWork, machine: Machine, i: int,
                   params: CostParams = _DEFAULT,
                   telemetry: Snapshot | None = None) -> tuple[float, float]:
    """The two roofline limits of ``work`` on device ``i``, each / capacity.

    Returns:
        ``(flops / (F_i e_k), bytes / (B_i e'_k))``, both stretched by
        :meth:`Snapshot.slowdown` (``1 / capacity`` where the snapshot measured
        capacity, else ``1 / (1 - u)``) to the power ``params.contention``
        of the device's kind; the compute time is their maximum.
    """
    dev = machine.devices[i]
    slow = telemetry.slowdown(i) ** params.contention.get(dev.kind, 1.0) \
        if telemetry is not None else 1.0
    return (work.flops / (dev.peak_flops(task.dtype) * params.e(dev.kind, task.kind))
            * slow,
            work.mem_traffic / (dev.mem_bw * params.e_mem(dev.kind, task.kind)
                                * cache_factor(task, machine, i, params))
            * slow)


def cache_factor(task: TaskSpec, machine: Machine, i: int,
                 params: CostParams = _DEFAULT) -> float:
    """``mu_i`` of Eq. (1): ``params.cache_bw`` of device i's kind where the
    whole task's inputs and outputs fit in :data:`CACHE_FIT` of the device's
    last-level cache (:meth:`CostParams.cache_bytes`: calibrated, else
    reported), else 1 (and 1 where either is unknown)."""
    if not params.cache_bw:
        return 1.0
    dev = machine.devices[i]
    scale = params.cache_bw.get(dev.kind)
    return scale if scale is not None and fits_cache(task, params.cache_bytes(dev)) \
        else 1.0


def fits_cache(task: TaskSpec, cache_bytes: float) -> bool:
    """Whether the whole task's inputs and outputs fit in :data:`CACHE_FIT` of
    a last-level cache of ``cache_bytes`` (never where the size is unknown,
    0): the test behind ``mu_i``, which calibration uses too."""
    if cache_bytes <= 0:
        return False
    whole = whole_work(task)
    return whole.bytes_in + whole.bytes_out <= CACHE_FIT * cache_bytes


def corun_factors(machine: Machine, active: Sequence[int],
                  params: CostParams = _DEFAULT) -> dict[int, float]:
    """``eta_i`` of Eq. (1) for each device in ``active`` (those with rows):
    ``1 + corun[kind] (k - 1)``, k the active devices of its kind."""
    if not params.corun:
        return {i: 1.0 for i in active}
    kinds = [machine.devices[i].kind for i in active]
    return {i: 1.0 + params.corun.get(kd, 0.0) * (kinds.count(kd) - 1)
            for i, kd in zip(active, kinds, strict=True)}


def compute_seconds(task: TaskSpec, work: ShardWork, machine: Machine, i: int,
                    params: CostParams = _DEFAULT,
                    telemetry: Snapshot | None = None) -> float:
    """Roofline time of ``work`` on device ``i``: max(compute, memory) / capacity."""
    if work.rows == 0:
        return 0.0
    return max(roofline_terms(task, work, machine, i, params, telemetry))


def split_time_coefficients(task: TaskSpec, machine: Machine, i: int,
                            params: CostParams | None = None,
                            telemetry: Snapshot | None = None,
                            copy_out: bool = True) -> tuple[float, ...]:
    """Device ``i``'s split-mode finish time as a function of its rows ``r > 0``.

    Every term of Eq. (1) is affine in ``r`` (work counts are linear in rows plus
    a fixed part), so ``t_i(r) = a + b r + max(c + d r, e + f r)``: transfers and
    launch, then the roofline's compute and memory limits. The coefficients are
    read off the model itself at ``r = 1`` and ``r = 2``, not restated.

    Returns:
        ``(a, b, c, d, e, f)`` in seconds and seconds per row.
    """
    params = params or _DEFAULT
    w = workload(task)
    bw, lat = host_link_terms(machine, i, params)
    launch = launch_seconds(machine, i, params, task.kind) \
        + wait_seconds(machine, i, params, telemetry)
    inputs = 0.0 if machine.cluster else 1.0

    def parts(rows: int) -> tuple[float, float, float]:
        work = w.work(task, rows)
        xfer = launch + transfer_seconds(inputs * work.bytes_in, bw, lat)
        if copy_out:
            xfer += transfer_seconds(work.bytes_out, bw, lat)
        return (xfer, *roofline_terms(task, work, machine, i, params, telemetry))

    one, two = parts(1), parts(2)
    slopes = [y - x for x, y in zip(one, two, strict=True)]
    return (one[0] - slopes[0], slopes[0], one[1] - slopes[1], slopes[1],
            one[2] - slopes[2], slopes[2])


def host_link_terms(machine: Machine, i: int, params: CostParams = _DEFAULT
                    ) -> tuple[float, float]:
    """``(bandwidth, latency)`` of device i's host link as a shard's copies
    are priced: the profile's figures times ``link_scale`` and
    ``latency_scale`` of the device's kind."""
    link = machine.host_link(i)
    kind = machine.devices[i].kind
    return (link.bandwidth * params.link_scale.get(kind, 1.0),
            link.latency * params.latency_scale.get(kind, 1.0))


def launch_seconds(machine: Machine, i: int, params: CostParams = _DEFAULT,
                   kind: str | None = None) -> float:
    """``t_launch`` of one kernel (or, on a Dask cluster, one task) on device
    i, with what a kernel of ``kind`` adds of its own (``fixed_s``; nothing
    without a kind)."""
    dev_kind = machine.devices[i].kind
    own = params.fixed(dev_kind, kind) if kind is not None and params.fixed_s \
        else 0.0
    if machine.cluster:
        return params.launch_s.get("dask-task", 1e-4) + own
    return params.launch_s.get(dev_kind, 5e-6) + own


def wait_seconds(machine: Machine, i: int, params: CostParams = _DEFAULT,
                 telemetry: Snapshot | None = None) -> float:
    """A shard's wait for the scheduler on device i: what the runtime's
    history measured there beyond the cheapest device where the snapshot
    carries it (``telemetry.wait_s``); else ``w (1 / c - 1)`` where telemetry
    measured the device's capacity ``c`` and the calibration fitted ``w`` for
    its kind; 0 otherwise (utilisation alone says nothing of time slices)."""
    if telemetry is not None and telemetry.wait_s is not None:
        return telemetry.wait_s[i]
    if telemetry is None or telemetry.capacity is None or not params.sched_wait:
        return 0.0
    w = params.sched_wait.get(machine.devices[i].kind, 0.0)
    return w * (1.0 / max(telemetry.capacity[i], 1e-6) - 1.0) if w else 0.0


def dispatch_seconds(machine: Machine, params: CostParams = _DEFAULT) -> float:
    """``t_dispatch``: a Dask cluster's fixed cost of a decision; 0 elsewhere."""
    return params.launch_s.get("dask-decision", 1e-2) if machine.cluster else 0.0


def host_seconds(machine: Machine, active: Sequence[int],
                 params: CostParams = _DEFAULT) -> float:
    """``t_host``: the host's serial cost of shards on the devices ``active``
    (those with rows); 0 on a Dask cluster and for kinds ``host_s`` leaves out."""
    if machine.cluster or not params.host_s:
        return 0.0
    return sum(params.host_s.get(machine.devices[i].kind, 0.0) for i in active)


def transfer_seconds(nbytes: float, bandwidth: float, latency: float) -> float:
    """One copy: ``latency + nbytes / bandwidth`` (0 for nothing to move)."""
    return 0.0 if nbytes <= 0 else latency + nbytes / bandwidth


def predict(task: TaskSpec, decision: Decision, machine: Machine,
            telemetry: Snapshot | None = None,
            params: CostParams | None = None) -> Prediction:
    """Evaluate Eq. (1) for a decision Gate 1 has accepted.

    Args:
        task, decision: what to run and how.
        machine: the machine profile.
        telemetry: live state (compute stretches by ``1 / capacity``, or
            ``1 / (1 - u)`` where the snapshot has no capacity); None for idle.
        params: efficiencies and latencies; the uncalibrated defaults if None.

    Returns:
        A :class:`Prediction` (PREDICTED) with one :class:`DeviceTime` per
        device in the decision, zero-share devices included at zero cost.
    """
    params = params or _DEFAULT
    w = workload(task)
    bounds = split_rows(task.split_size, decision.shares)
    merge_on_device = task.merge == "sum" and decision.comm_path in ("p2p", "nccl") \
        and len(decision.gpus) > 1
    corun = corun_factors(machine, [g for g, (lo, hi) in
                                    zip(decision.gpus, bounds, strict=True)
                                    if hi > lo], params)
    parts = []
    for pos, (dev_index, (lo, hi)) in enumerate(zip(decision.gpus, bounds,
                                                    strict=True)):
        dev = machine.devices[dev_index]
        bw, lat = host_link_terms(machine, dev_index, params)
        rows = hi - lo
        work = w.work(task, rows)
        if rows == 0:
            parts.append(DeviceTime(dev_index, dev.label, 0, decision.shares[pos],
                                    0.0, 0.0, 0.0, 0.0, 0))
            continue
        out_bytes = 0.0 if merge_on_device else work.bytes_out
        launch = launch_seconds(machine, dev_index, params, task.kind)
        wait = wait_seconds(machine, dev_index, params, telemetry)
        t_comp = compute_seconds(task, work, machine, dev_index, params,
                                 telemetry) * corun[dev_index]
        chunks = 1
        if decision.mode == "pipelined" and not machine.cluster:
            chunks = max(1, math.ceil(rows / max(1, decision.chunk)))
        if chunks == 1:
            t_in = 0.0 if machine.cluster else \
                transfer_seconds(work.bytes_in, bw, lat)
            t_out = transfer_seconds(out_bytes, bw, lat)
            parts.append(DeviceTime(dev_index, dev.label, rows, decision.shares[pos],
                                    launch + wait, t_in, t_comp, t_out, 1))
            continue
        # Pipelined: fixed inputs first, then c chunks through three stages.
        t_fixed = transfer_seconds(work.bytes_in_fixed, bw, lat)
        a = transfer_seconds(work.bytes_in_rows / chunks, bw, lat)
        b = t_comp / chunks
        o = transfer_seconds(out_bytes / chunks, bw, lat) \
            if task.merge == "concat" else 0.0
        steady = (chunks - 1) * max(a, b, o)
        # Attribute the overlapped steady state to whichever stage bounds it.
        t_in = t_fixed + a + (steady if a >= max(b, o) else 0.0)
        t_c = b + (steady if b > a and b >= o else 0.0)
        t_o = o + (steady if o > max(a, b) else 0.0)
        if task.merge == "sum":
            t_o = transfer_seconds(out_bytes, bw, lat)
        parts.append(DeviceTime(dev_index, dev.label, rows, decision.shares[pos],
                                chunks * launch + wait, t_in, t_c, t_o, chunks))
    t_merge = merge_seconds(task, decision, machine, params, parts)
    t_dispatch = dispatch_seconds(machine, params)
    t_host = host_seconds(machine, [p.device for p in parts if p.rows > 0], params)
    total = max(p.total for p in parts) + t_merge + t_dispatch + t_host
    return Prediction(total=total, devices=tuple(parts), t_merge=t_merge,
                      mode=decision.mode, comm_path=decision.comm_path,
                      params_source=params.source, t_dispatch=t_dispatch,
                      t_host=t_host)


def merge_seconds(task: TaskSpec, decision: Decision, machine: Machine,
                  params: CostParams, parts: list[DeviceTime]) -> float:
    """``t_merge`` of Eq. (1) for the decision's merge and comm path."""
    active = [p.device for p in parts if p.rows > 0]
    k = len(active)
    if task.merge == "concat" or k <= 1:
        return 0.0
    nbytes = workload(task).work(task, 1).bytes_out
    if decision.comm_path == "host":
        return k * nbytes / machine.host_mem_bw
    lead = active[0]
    lead_dev = machine.devices[lead]
    add = k * nbytes / (lead_dev.mem_bw * params.e_mem(lead_dev.kind, task.kind))
    out = transfer_seconds(nbytes, machine.host_link(lead).bandwidth,
                           machine.host_link(lead).latency)
    if decision.comm_path == "p2p":
        gather = max(transfer_seconds(nbytes, *_pair_link(machine, lead, j))
                     for j in active[1:])
        if machine.cluster:  # a tree: each level one transfer and one add
            levels = math.ceil(math.log2(k))
            return levels * (gather + add / k * 2) + out
        return gather + add + out
    # nccl ring over the active devices in decision order
    ring = [_pair_link(machine, active[i], active[(i + 1) % k]) for i in range(k)]
    slowest = min(bw for bw, _ in ring)
    latency = max(lat for _, lat in ring)
    return 2 * (k - 1) / k * nbytes / slowest + 2 * (k - 1) * latency + out


def _pair_link(machine: Machine, i: int, j: int) -> tuple[float, float]:
    """(bandwidth, latency) between two devices: the peer link, else via host."""
    link = machine.peer(i, j)
    if link is not None and link.p2p:
        return link.bandwidth, link.latency
    hi, hj = machine.host_link(i), machine.host_link(j)
    return min(hi.bandwidth, hj.bandwidth) / 2, hi.latency + hj.latency
