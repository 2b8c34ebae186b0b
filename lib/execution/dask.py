"""The dask backend: the devices are the workers of a Dask cluster.

The machine is a Dask profile (:mod:`lib.platform.dask_cluster`: ``dask://HOST:PORT``
or ``dask-local:N``); device ``i`` is worker ``i``. For a Decision the backend:

1. **places the inputs once**: each shard's worker generates the task's inputs
   from the seed itself and keeps its shard's rows (matmul's B whole, stencil's
   halo band), so no input travels through the client. The placed shards stay
   on the workers for the timed repeats, and for the next run of the same
   shards (:meth:`DaskBackend.release` drops them);
2. **submits each shard to its own worker only** (``workers=[address]``,
   ``allow_other_workers=False``: a restricted task is never stolen), computing
   it with the same :meth:`lib.platform.workloads.Workload.compute` the NumPy
   reference uses;
3. **merges**: ``concat`` results are gathered in shard order straight from the
   workers and joined with :meth:`~lib.platform.workloads.Workload.merge`;
   ``sum`` partials follow the decision's ``comm_path``: ``host`` sends every
   partial to the client, which adds them; ``p2p`` (and ``nccl``, which no
   Dask cluster offers and Gate 1 refuses) adds them on the workers, a tree
   of ``submit`` calls over the links between workers (the profile's
   ``peers``: loopback on one host, the network between hosts; each add on
   the left operand's worker, the right operand sent worker to worker), and
   only the total crosses to the client. ``detail["merge"]`` says which path
   ran and which was asked. ``pipelined`` runs as ``split`` (one
   task per shard: a single-threaded worker has nothing to overlap a copy
   with), and ``detail["mode_note"]`` says so.

**Times are MEASURED.** ``total_seconds`` is wall clock at the client from the
first submit to the merged result there; ``per_device_seconds[g]`` is measured
on worker g: its shard's compute plus, for sums, the adds it ran. Placement is
timed apart (``detail["place_seconds"]``) and not in the total, as the cpu
backend's writing of its shared inputs is not. Each worker reports where it
ran; a shard that ran anywhere but its worker fails the run.

**Faults.** A worker that dies or leaves the cluster mid-run, or a shard that
raises, gives a :class:`~lib.execution.base.DeviceError` naming the device (its
worker's address), the shard and the decision's hash; with
``allow_replan=True`` the run is re-planned once over the other devices (shares
renormalised, the new decision through Gate 1, ``detail["replanned"]``), as the
cuda backend does. The run's outstanding tasks are cancelled first; no partial
result is ever returned.

**Memory.** A run is refused before anything is placed where a shard would
take its worker past the share of its memory limit where Dask pauses it, or
where the workers on this computer and the client together would not fit in
what it has available (:meth:`DaskBackend._check_memory`); the client verifies
against a reference it draws a block at a time.

:mod:`lib.execution.dask_measure` measures the links between workers and
benchmarks this backend against the cpu backend.

Why one module: placing, submitting, merging, timing, the failure path and
the memory check all turn on the one run's bookkeeping (its shards, their
workers and futures), and a re-plan runs them all again; split, each part
would take that bookkeeping as an argument it only passes on.
"""

from __future__ import annotations

import itertools
import statistics
import time
import uuid
from asyncio import CancelledError
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.execution.base import (
    HOST_MEMORY_SHARE,
    VERIFY_FOOTPRINTS,
    BackendUnavailable,
    DeviceError,
    ExecutionError,
    ExecutionMetrics,
    HostMemoryError,
    Result,
    check_devices,
    host_scale,
    repeat_timed,
    replan,
)
from lib.platform.dask_cluster import (
    DaskCluster,
    cluster_for,
    worker_address,
)
from lib.platform.hostinfo import available_memory_bytes
from lib.platform.machines import Machine, MachineError
from lib.platform.user_kinds import adopt_kind, kind_payload
from lib.platform.workloads import (
    reference_block_bytes,
    split_rows,
    verify_in_blocks,
    workload,
)
from lib.security.gate1 import check_decision


def _one_line(exc: BaseException, limit: int = 200) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def _here() -> str:
    from distributed import get_worker

    return get_worker().address


# --------------------------------------------------------------------------
# Worker side: what each task runs

def _place(task_json: dict, seed: int, lo: int, hi: int,
           kind: bytes | None = None) -> dict[str, np.ndarray]:
    """Make one shard's inputs from the seed
    (:meth:`~lib.platform.workloads.Workload.make_shard_inputs`: a built-in
    kind draws only the shard's rows, so a worker never holds the whole
    task's inputs; a user's kind makes them whole and keeps a copy of the
    shard's); ``kind`` registers a user's kind here first
    (:func:`~lib.platform.workloads.kind_payload`)."""
    adopt_kind(kind)
    task = TaskSpec.from_json(task_json)
    return workload(task).make_shard_inputs(task, seed, lo, hi)


def _shard(placed: dict[str, np.ndarray], task_json: dict, lo: int, hi: int,
           pos: int, fault: bool, stall: float,
           kind: bytes | None = None) -> dict[str, Any]:
    """Compute one shard on this worker; report the seconds and the worker."""
    if stall > 0:
        time.sleep(stall)
    if fault:
        raise RuntimeError("injected fault")
    adopt_kind(kind)
    task = TaskSpec.from_json(task_json)
    t0 = time.perf_counter()
    part = workload(task).compute(task, placed, lo, hi)
    seconds = time.perf_counter() - t0
    return {"part": part, "seconds": {pos: seconds}, "ran_on": {pos: _here()},
            "adds": {}}


def _add(a: dict[str, Any], b: dict[str, Any], task_json: dict,
         kind: bytes | None = None) -> dict[str, Any]:
    """Add two partial sums on this worker (one node of the tree)."""
    adopt_kind(kind)
    task = TaskSpec.from_json(task_json)
    t0 = time.perf_counter()
    part = workload(task).merge(task, [a["part"], b["part"]])
    seconds = time.perf_counter() - t0
    adds = dict(a["adds"])
    for addr, s in b["adds"].items():
        adds[addr] = adds.get(addr, 0.0) + s
    here = _here()
    adds[here] = adds.get(here, 0.0) + seconds
    return {"part": part, "seconds": {**a["seconds"], **b["seconds"]},
            "ran_on": {**a["ran_on"], **b["ran_on"]}, "adds": adds}


# --------------------------------------------------------------------------
# The backend

@dataclass
class _Run:
    """One run's bookkeeping, for waiting and for the failure path."""

    task: TaskSpec
    decision: Decision
    bounds: list[tuple[int, int]]
    where: dict[int, str]
    futures: list[Any] = field(default_factory=list)


class DaskBackend:
    """Runs decisions on the workers of a Dask cluster (MEASURED).

    Args:
        machine: a Dask profile (``dask://HOST:PORT``, ``dask-local:N``).
        seed: seed of the inputs.
        repeats, warmup: timed and untimed runs (figures are medians).
        timeout: seconds to wait for any phase before failing the run.
        allow_replan: re-plan once over the other devices when one fails.
        fault_devices: devices whose shard raises on purpose (fault injection).
        stall_devices: device -> seconds its shard sleeps before computing (to
            hold a shard mid-run while a test removes its worker).
        cluster: the open cluster; default the one registered for the machine.
        poll: seconds between checks that the workers are still there.
        direct: fetch results straight from the workers (True) or through the
            scheduler.

    Raises:
        BackendUnavailable: the cluster cannot be reached, or the machine has
            GPU workers (shards run with NumPy on worker CPUs).
    """

    name = "dask"
    measured = True

    def __init__(self, machine: Machine, seed: int = 0, repeats: int = 1,
                 warmup: int = 0, timeout: float = 600.0, allow_replan: bool = False,
                 fault_devices: Iterable[int] = (),
                 stall_devices: Mapping[int, float] | None = None,
                 cluster: DaskCluster | None = None, poll: float = 0.1,
                 direct: bool = True):
        try:
            self.addresses = tuple(worker_address(d) for d in machine.devices)
        except MachineError:
            raise BackendUnavailable(
                f"dask backend: machine {machine.name} is not a Dask cluster; "
                "name one as dask-local:N (N workers on this computer) or "
                "dask://HOST:PORT (a running scheduler)") from None
        gpus = [d.label for d in machine.devices if d.kind != "cpu"]
        if gpus:
            raise BackendUnavailable(
                f"dask backend: {machine.name} has GPU worker(s) {', '.join(gpus)}; "
                "shards run with NumPy on worker CPUs, so GPU workers are profiled "
                "but not run")
        try:
            self.cluster = cluster or cluster_for(machine)
        except MachineError as exc:
            raise BackendUnavailable(f"dask backend: {exc}") from None
        self.client = self.cluster.client
        self.machine = machine
        self.seed = seed
        self.repeats = max(1, repeats)
        self.warmup = max(0, warmup)
        self.timeout = timeout
        self.allow_replan = allow_replan
        self.fault_devices = set(fault_devices)
        self.stall_devices = dict(stall_devices or {})
        self.poll = poll
        self.direct = direct
        self._tag = uuid.uuid4().hex[:8]
        self._count = itertools.count()
        self._placed: tuple[Any, dict[int, Any]] | None = None

    def release(self) -> None:
        """Drop the inputs placed on the workers."""
        self._placed = None

    def close(self) -> None:
        """Release what this backend holds on the cluster (the cluster stays
        open: :func:`lib.platform.dask_cluster.close` closes it)."""
        self.release()

    def __enter__(self) -> DaskBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running --------------------------------------------------------------

    def run(self, task: TaskSpec, decision: Decision, *,
            verify: bool = False) -> Result:
        """Run the decision on the workers; MEASURED times, medians of repeats."""
        check_devices(decision, self.machine)
        detail: dict[str, Any] = {}
        try:
            merged, per_dev, totals, info = self._timed(task, decision, verify)
        except DeviceError as err:
            if not self.allow_replan:
                raise
            try:
                fallback = replan(decision, err.device).with_hash(task)
            except ExecutionError as none_left:
                raise ExecutionError(f"{err}; {none_left}") from err
            verdict = check_decision(fallback, task, self.machine)
            if not verdict.accepted:
                raise ExecutionError(f"{err}; re-plan refused by "
                                     f"{verdict.summary()}") from err
            merged, per_dev, totals, info = self._timed(task, fallback, verify)
            detail["replanned"] = {"failed_device": err.device, "reason": str(err),
                                   "decision": fallback.to_json()}
            decision = fallback
        ok, err_abs = None, None
        if verify:   # the workers drew the inputs: the client draws a block
            ok, err_abs = verify_in_blocks(task, merged, seed=self.seed)
        metrics = ExecutionMetrics(
            backend="dask", measured=True,
            per_device_seconds={g: statistics.median(v) for g, v in per_dev.items()},
            total_seconds=statistics.median(totals), verified=ok,
            max_abs_error=err_abs, repeats=self.repeats)
        detail.update(info, all_totals=totals)
        return Result(output=merged, metrics=metrics, task=task, decision=decision,
                      detail=detail)

    def _timed(self, task: TaskSpec, decision: Decision, verify: bool = False):
        bounds = split_rows(task.split_size, decision.shares)
        active = [pos for pos, (lo, hi) in enumerate(bounds) if hi > lo]
        run = _Run(task, decision, bounds,
                   {pos: self.addresses[decision.gpus[pos]] for pos in active})
        self._check_alive(run)
        self._check_memory(task, decision, bounds, active, verify)
        t0 = time.perf_counter()
        placed = self._place(run, active)
        place_seconds = time.perf_counter() - t0
        w = workload(task)
        task_json = task.to_json()
        kind = kind_payload(task)
        ran_on: dict[int, str] = {}

        def once():
            rep = next(self._count)
            start = time.perf_counter()
            shards = {}
            for pos in active:
                lo, hi = bounds[pos]
                dev = decision.gpus[pos]
                shards[pos] = self.client.submit(
                    _shard, placed[pos], task_json, lo, hi, pos,
                    dev in self.fault_devices, float(self.stall_devices.get(dev, 0)),
                    kind, key=self._key("shard", decision, rep, pos),
                    workers=[run.where[pos]], allow_other_workers=False, pure=False)
            pending = list(shards.items())
            if task.merge == "concat" or (decision.comm_path == "host"
                                          and len(active) > 1):
                outs = self._collect(run, pending, [shards[p] for p in active])
                merged = w.merge(task, [o["part"] for o in outs])
            else:
                level, depth = list(pending), 0
                while len(level) > 1:
                    depth += 1
                    nxt = []
                    for i in range(0, len(level) - 1, 2):
                        (pa, fa), (_, fb) = level[i], level[i + 1]
                        f = self.client.submit(
                            _add, fa, fb, task_json, kind,
                            key=self._key("add", decision, rep, f"{depth}-{pa}"),
                            workers=[run.where[pa]], allow_other_workers=False,
                            pure=False)
                        nxt.append((pa, f))
                        pending.append((pa, f))
                    if len(level) % 2:
                        nxt.append(level[-1])
                    level = nxt
                outs = self._collect(run, pending, [level[0][1]])
                merged = outs[0]["part"]
            elapsed = time.perf_counter() - start
            run.futures = []
            return merged, self._device_times(run, outs, ran_on), elapsed

        merged, per_dev, totals = repeat_timed(once, self.warmup, self.repeats)
        info: dict[str, Any] = {
            "place_seconds": place_seconds,
            "workers": {decision.gpus[p]: run.where[p] for p in active},
            "ran_on": ran_on,
            "merge": ({"path": "client", "requested": decision.comm_path,
                       "note": "rows gathered from the workers in shard order"}
                      if task.merge == "concat" else
                      {"path": "client", "requested": decision.comm_path,
                       "note": "every partial sent to the client and added there"}
                      if decision.comm_path == "host" and len(active) > 1 else
                      {"path": "workers", "requested": decision.comm_path,
                       "note": "partials added on the workers as a tree of tasks "
                               "over the links between them, then one transfer "
                               "to the client"})}
        if decision.mode == "pipelined":
            info["mode_note"] = "pipelined ran as split: one task per shard"
        return merged, per_dev, totals, info

    def _check_memory(self, task: TaskSpec, decision: Decision,
                      bounds: list[tuple[int, int]], active: list[int],
                      verify: bool = False, available: float | None = None
                      ) -> None:
        """Refuse a run before anything is placed where a worker would pass the
        share of its memory limit at which Dask pauses it (a paused worker
        starts no shard, and past the limit its nanny kills it mid-run), or
        where the workers on this computer and this client together would
        take more of it than :data:`~lib.execution.base.HOST_MEMORY_SHARE` of
        what is available. A worker may hold its kind's ``host_footprints``
        of its shard's footprint (MEASURED worker peaks on dask-local:2: 1.0
        to 2.5, a stencil the most); the client the result twice over (the
        parts and their merge) and, with ``verify``, a block of the reference
        (:func:`~lib.execution.base.host_bytes_needed`'s terms); all at
        :func:`~lib.execution.base.host_scale` bytes per byte.

        Raises:
            HostMemoryError: one line naming the worker or this computer.
        """
        w = workload(task)
        scale = host_scale(task)
        import dask  # the backend's dependency, loaded with the cluster

        share = min((f for f in (dask.config.get("distributed.worker.memory.pause",
                                                 None),
                                 dask.config.get(
                                     "distributed.worker.memory.terminate", None))
                     if f), default=1.0)
        here = 0.0
        for pos in active:
            lo, hi = bounds[pos]
            dev = self.machine.devices[decision.gpus[pos]]
            need = w.work(task, hi - lo).footprint * w.host_footprints * scale
            if need > share * dev.mem_bytes:
                raise HostMemoryError(
                    f"dask backend: shard {pos} (rows {lo}:{hi}) of "
                    f"{task.describe()} may need {need / 1e9:.1f} GB on "
                    f"{dev.label}, past {share:.0%} of its memory limit of "
                    f"{dev.mem_bytes / 1e9:.1f} GB, where Dask pauses it: give "
                    "the task more workers, or run a smaller one")
            if self.machine.host_link(dev.index).kind == "loopback":
                here += need
        whole = w.total_work(task)
        here += 2 * whole.bytes_out * scale
        if verify:
            here += VERIFY_FOOTPRINTS * reference_block_bytes(task) * scale
        available = available_memory_bytes() if available is None else available
        if available is not None and here > HOST_MEMORY_SHARE * available:
            raise HostMemoryError(
                f"dask backend: {task.describe()} may need {here / 1e9:.1f} GB "
                "of this computer's memory (the shards of the workers that run "
                "here and the result this client merges"
                f"{', and the reference it verifies with' if verify else ''}"
                f"), past {HOST_MEMORY_SHARE:.0%} of the {available / 1e9:.1f} GB "
                "available: give the task workers on other computers, or run a "
                "smaller one")

    def _key(self, what: str, decision: Decision, rep: int, pos: Any) -> str:
        return f"gpuhive-{what}-{decision.config_hash[:8] or 'unhashed'}-" \
               f"{self._tag}-{rep}-{pos}"

    def _place(self, run: _Run, active: list[int]) -> dict[int, Any]:
        """The shards' inputs on their workers (reused when the same shards ran
        last)."""
        task = run.task
        key = (task, self.seed, tuple((p, run.where[p], run.bounds[p])
                                      for p in active))
        if self._placed is not None and self._placed[0] == key:
            return self._placed[1]
        self._placed = None
        rep = next(self._count)
        task_json = task.to_json()
        placed = {pos: self.client.submit(
            _place, task_json, self.seed, *run.bounds[pos], kind_payload(task),
            key=self._key("place", run.decision, rep, pos),
            workers=[run.where[pos]], allow_other_workers=False, pure=False)
            for pos in active}
        self._wait(run, list(placed.items()))
        self._placed = (key, placed)
        return placed

    def _device_times(self, run: _Run, outs: list[dict[str, Any]],
                      ran_on: dict[int, str]) -> dict[int, float]:
        """Per-device seconds measured on the workers; checks each shard ran on
        its own worker."""
        times: dict[int, float] = {}
        adds: dict[str, float] = {}
        for out in outs:
            for pos, addr in out["ran_on"].items():
                if addr != run.where[pos]:
                    raise ExecutionError(
                        f"shard {pos} of decision {run.decision.config_hash[:12]} "
                        f"ran on {addr}, not on its worker {run.where[pos]}; the "
                        "result is discarded")
                ran_on[pos] = addr
            for pos, s in out["seconds"].items():
                g = run.decision.gpus[pos]
                times[g] = times.get(g, 0.0) + s
            for addr, s in out["adds"].items():
                adds[addr] = adds.get(addr, 0.0) + s
        for addr, s in adds.items():
            pos = min(p for p, a in run.where.items() if a == addr)
            g = run.decision.gpus[pos]
            times[g] = times.get(g, 0.0) + s
        return times

    # -- waiting, and the failure path ---------------------------------------

    def _wait(self, run: _Run, pending: list[tuple[int, Any]]) -> None:
        """Wait for every future, checking between polls that their workers are
        still in the cluster; a failure raises DeviceError."""
        from distributed import wait

        run.futures.extend(f for _, f in pending)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                wait([f for _, f in pending], timeout=self.poll)
                done = True
            except TimeoutError:
                done = False
            for pos, f in pending:
                if f.status == "error":
                    self._check_alive(run)
                    try:
                        why = _one_line(f.exception(timeout=self.timeout))
                    except Exception as exc:
                        why = f"its task failed ({_one_line(exc)})"
                    self._fail(run, pos, why)
                if f.status in ("cancelled", "lost"):
                    self._check_alive(run)
                    self._fail(run, pos, f"its task was {f.status}")
            if done:
                return
            self._check_alive(run)
            if time.monotonic() > deadline:
                pos = next(p for p, f in pending if f.status != "finished")
                self._fail(run, pos, f"no answer within {self.timeout:g} s")

    def _collect(self, run: _Run, pending: list[tuple[int, Any]],
                 targets: list[Any]) -> list[Any]:
        """Wait for every future of the run (:meth:`_wait`), then fetch the
        results of ``targets``, in order."""
        self._wait(run, pending)
        deadline = time.monotonic() + self.timeout
        patience = max(5.0, 10 * self.poll)
        while True:
            try:
                # Client.gather has no timeout; this is the same call, bounded.
                # The results are ready, so a try that runs out of patience
                # means a worker went away (checked) or a slow link (the next
                # try waits twice as long).
                return self.client.sync(self.client._gather, targets,
                                        direct=self.direct,
                                        callback_timeout=patience)
            except TimeoutError:
                patience *= 2
                self._check_alive(run)
                if time.monotonic() > deadline:
                    self._fail(run, min(run.where), f"results not fetched within "
                                                    f"{self.timeout:g} s")
            except (Exception, CancelledError) as exc:
                self._check_alive(run)
                erred = [p for p, f in pending if f.status == "error"]
                self._fail(run, erred[0] if erred else min(run.where),
                           _one_line(exc))

    def _check_alive(self, run: _Run) -> None:
        alive = self.cluster.alive()
        for pos in sorted(run.where):
            if run.where[pos] not in alive:
                self._fail(run, pos, "its worker left the cluster (it died or was "
                                     "removed)")

    def _fail(self, run: _Run, pos: int, reason: str) -> None:
        """Cancel the run's tasks, drop the placed inputs, raise DeviceError."""
        self._placed = None
        try:
            if run.futures:
                self.client.cancel(run.futures)
        except Exception:
            pass
        run.futures = []
        dev = run.decision.gpus[pos]
        raise DeviceError(dev, self.machine.devices[dev].label, pos, run.bounds[pos],
                          run.decision.config_hash, reason)
