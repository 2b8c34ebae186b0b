"""Measurements of a Dask cluster beyond one run (MEASURED, dask backend).

- :func:`characterise_network` times a small and a bulk transfer between two
  workers and from a worker to the client, and returns the links with
  provenance ``measured`` for the profile (:meth:`NetworkLinks.apply`), in place
  of :mod:`lib.platform.dask_cluster`'s estimates;
- :func:`benchmark` times one decision on the cpu backend and on the dask
  backend over the same two cores: matmul 2048^3 (goal: dask at most 1.3x the
  cpu backend's time) and a tiny task, the fixed cost of a decision (goal:
  20 ms at most on dask).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.execution.base import ExecutionError
from lib.execution.cpu import CpuBackend
from lib.execution.dask import DaskBackend
from lib.platform.dask_cluster import (
    DaskCluster,
    address_host,
    apply_links,
    cluster_for,
    connect,
    links_record,
    machine_from_workers,
    worker_address,
)
from lib.platform.machines import Link, Machine, local_cpu_machine
from lib.security.gate1 import check_decision

# --------------------------------------------------------------------------
# The network between workers

def _payload(nbytes: int) -> np.ndarray:
    """Incompressible bytes (random), so the transfer moves all of them."""
    return np.random.default_rng(nbytes).integers(0, 256, size=nbytes, dtype=np.uint8)


def _size(x: np.ndarray) -> int:
    return int(x.nbytes)


def _incoming(key: str, dask_worker: Any = None) -> list[tuple[float, int]]:
    """(seconds, bytes) of each transfer of ``key`` into this worker, from its
    incoming-transfer log (start and stop as the worker timed them)."""
    return [(e["stop"] - e["start"], int(e["total"]))
            for e in dask_worker.transfer_incoming_log if key in e["keys"]]


@dataclass(frozen=True)
class NetworkLinks:
    """Links measured by :func:`characterise_network` (provenance ``measured``).

    Attributes:
        host_links: device -> its link from the client.
        peers: ``(i, j)`` -> the link between workers i and j.
        records: one row per measurement (what, bytes, seconds, label).
    """

    host_links: dict[int, Link]
    peers: dict[tuple[int, int], Link]
    records: list[dict[str, Any]]

    def apply(self, machine: Machine) -> Machine:
        """``machine`` with these links in place of its estimates."""
        return apply_links(machine, self.host_links, self.peers)


def network_record(links: NetworkLinks, machine: Machine) -> dict[str, Any]:
    """What the characterisation stores of ``links`` (``measured.network``):
    the links, which :func:`~lib.platform.dask_cluster.dask_machine` applies to
    the profile from then on, and the raw measurements."""
    return {**links_record(machine, links.host_links, links.peers),
            "records": links.records}


def characterise_network(cluster: Any, nbytes: int = 16 << 20, tiny: int = 8,
                         repeats: int = 3, timeout: float = 60.0) -> NetworkLinks:
    """Time a small and a bulk transfer between workers, and from workers to the
    client (MEASURED). One pair stands for every pair of the same two hosts.

    Worker to worker: the receiving worker's own timing of the transfer (its
    incoming-transfer log); latency is the ``tiny``-byte transfer, bandwidth
    ``(nbytes - tiny) / (t_bulk - t_tiny)``. Client from worker: the client's
    wall clock around fetching a ``tiny``-byte and an ``nbytes`` result.
    Medians of ``repeats``.

    Args:
        cluster: a :class:`~lib.platform.dask_cluster.DaskCluster`, a Dask
            machine, or a ``distributed.Client`` (workers then in profile order).
    """
    from distributed import Client, wait

    if isinstance(cluster, Client):
        info = cluster.scheduler_info(n_workers=-1)
        machine = machine_from_workers("dask", info["workers"])
        client = cluster
    else:
        cluster = cluster if isinstance(cluster, DaskCluster) else cluster_for(cluster)
        machine, client = cluster.machine, cluster.client
    addresses = [worker_address(d) for d in machine.devices]
    records: list[dict[str, Any]] = []

    def made(where: str, size: int) -> Any:
        f = client.submit(_payload, size, workers=[where], allow_other_workers=False,
                          pure=False)
        wait([f], timeout=timeout)
        return f

    def worker_to_worker(src: str, dst: str, size: int) -> float:
        f = made(src, size)
        g = client.submit(_size, f, workers=[dst], allow_other_workers=False,
                          pure=False)
        wait([g], timeout=timeout)
        logged = client.run(_incoming, f.key, workers=[dst])[dst]
        if not logged:
            raise ExecutionError(f"worker {dst} logged no transfer of {size} B "
                                 f"from {src}")
        return logged[-1][0]

    def to_client(src: str, size: int) -> float:
        f = made(src, size)
        t0 = time.perf_counter()
        client.gather(f, direct=True)
        return time.perf_counter() - t0

    def measured(kind: str, small: float, bulk: float, what: str) -> Link:
        spread = bulk - small
        bw = (nbytes - tiny) / spread if spread > 0 else nbytes / bulk
        records.append({"what": what, "bytes": nbytes, "tiny_bytes": tiny,
                        "tiny_seconds": small, "bulk_seconds": bulk,
                        "bandwidth": bw, "latency": small,
                        "label": "MEASURED (dask)"})
        return Link(kind=kind, bandwidth=bw, latency=small, p2p=True,
                    provenance="measured",
                    note=f"measured: {what}, {nbytes} B and {tiny} B transfers, "
                         f"median of {repeats}")

    peers: dict[tuple[int, int], Link] = {}
    seen: dict[tuple[str, str], Link] = {}
    for (i, j), est in sorted(machine.peers.items()):
        group = tuple(sorted((address_host(addresses[i]), address_host(addresses[j]))))
        if group not in seen:
            a, b = addresses[i], addresses[j]
            small = statistics.median(worker_to_worker(a, b, tiny)
                                      for _ in range(repeats))
            bulk = statistics.median(worker_to_worker(a, b, nbytes)
                                     for _ in range(repeats))
            seen[group] = measured(est.kind, small, bulk,
                                   f"worker {a} to worker {b} (devices {i}-{j})")
        peers[(i, j)] = seen[group]
    host_links: dict[int, Link] = {}
    by_host: dict[str, Link] = {}
    for i, addr in enumerate(addresses):
        host = address_host(addr)
        if host not in by_host:
            small = statistics.median(to_client(addr, tiny) for _ in range(repeats))
            bulk = statistics.median(to_client(addr, nbytes) for _ in range(repeats))
            by_host[host] = measured(machine.host_links[i].kind, small, bulk,
                                     f"worker {addr} to the client (device {i})")
        host_links[i] = by_host[host]
    return NetworkLinks(host_links=host_links, peers=peers, records=records)


# --------------------------------------------------------------------------
# Benchmark: the same decision on the cpu and the dask backend, same two cores

def benchmark(size: int = 2048, tiny: int = 64, repeats: int = 5,
              tiny_repeats: int = 20, cluster: DaskCluster | None = None,
              seed: int = 0) -> dict[str, Any]:
    """Time matmul ``size``^3 and a tiny elementwise task, split evenly over two
    devices, on the cpu backend (``local-cpu``, two cores) and on the dask
    backend (``dask-local:2``, its workers pinned to the same two cores).
    MEASURED; medians.

    Returns:
        ``{"matmul": {...}, "tiny": {...}}`` with each backend's median total,
        the ratio dask/cpu and the goal met or not: matmul at most 1.3x the cpu
        backend, the tiny task's total at most 20 ms on dask.
    """
    own = cluster is None
    cluster = cluster or connect("dask-local:2")
    if cluster.machine.n < 2:
        raise ExecutionError(f"benchmark: {cluster.spec} has {cluster.machine.n} "
                             "worker(s); it needs two")
    cpu_machine = local_cpu_machine(2)
    out: dict[str, Any] = {"label": "MEASURED", "cores": 2}
    try:
        jobs = (("matmul", TaskSpec("matmul", {"M": size, "N": size, "K": size}),
                 repeats, 1.3, None),
                ("tiny", TaskSpec("elementwise", {"N": tiny}), tiny_repeats, None,
                 0.020))
        for name, task, reps, ratio_goal, dask_goal in jobs:
            decision = Decision(gpus=(0, 1), shares=(0.5, 0.5),
                                chunk=task.split_size).with_hash(task)
            row: dict[str, Any] = {"task": task.describe(),
                                   "decision": decision.describe()}
            for backend_name, machine in (("cpu", cpu_machine),
                                          ("dask", cluster.machine)):
                verdict = check_decision(decision, task, machine)
                if not verdict.accepted:
                    raise ExecutionError(f"benchmark: {verdict.summary()}")
                backend = (CpuBackend(machine, seed=seed, repeats=reps, warmup=1)
                           if backend_name == "cpu" else
                           DaskBackend(machine, seed=seed, repeats=reps, warmup=1,
                                       cluster=cluster))
                with backend:
                    result = backend.run(task, decision, verify=True)
                    # One whole run() per call, inputs placed afresh each time:
                    # what a new decision costs end to end.
                    backend.repeats, backend.warmup = 1, 0
                    calls = []
                    for _ in range(5 if name == "tiny" else 0):
                        if backend_name == "dask":
                            backend.release()
                        t0 = time.perf_counter()
                        backend.run(task, decision)
                        calls.append(time.perf_counter() - t0)
                totals = sorted(result.detail["all_totals"])
                row[backend_name] = {
                    "label": result.metrics.label,
                    "total_s": result.metrics.total_seconds,
                    "min_s": totals[0], "max_s": totals[-1],
                    "per_device_s": result.metrics.per_device_seconds,
                    "verified": result.metrics.verified,
                    "run_call_s": statistics.median(calls) if calls else None}
            row["ratio"] = row["dask"]["total_s"] / row["cpu"]["total_s"]
            if ratio_goal is not None:
                row["goal"] = f"dask at most {ratio_goal}x the cpu backend"
                row["pass"] = row["ratio"] <= ratio_goal
            else:
                row["goal"] = f"dask total at most {dask_goal * 1e3:.0f} ms"
                row["pass"] = row["dask"]["total_s"] <= dask_goal
            out[name] = row
    finally:
        if own:
            cluster.close()
    return out


def benchmark_lines(out: Mapping[str, Any]) -> list[str]:
    """The benchmark's figures as lines to print."""
    lines = [f"dask vs cpu backend on the same {out['cores']} cores "
             f"({out['label']}, medians):"]
    for name in ("matmul", "tiny"):
        r = out[name]
        call = ""
        if r["dask"]["run_call_s"] is not None:
            call = (f"; whole run() call, inputs placed afresh: dask "
                    f"{r['dask']['run_call_s'] * 1e3:.1f} ms, cpu "
                    f"{r['cpu']['run_call_s'] * 1e3:.1f} ms")
        span = {b: f"{r[b]['total_s'] * 1e3:.1f} ms ({r[b]['min_s'] * 1e3:.1f}-"
                   f"{r[b]['max_s'] * 1e3:.1f})" for b in ("cpu", "dask")}
        lines.append(f"  {r['task']}: cpu {span['cpu']}, dask {span['dask']}, "
                     f"ratio {r['ratio']:.2f} (goal: {r['goal']}) "
                     f"{'PASS' if r['pass'] else 'FAIL'}{call}")
    return lines
