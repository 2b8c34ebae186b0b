"""Dask clusters as machines: the spec, the profile derived from the workers, and
the scheduler's view of them as telemetry.

A machine name of one of two forms names a Dask cluster whose *workers* are the
devices:

- ``dask://HOST:PORT`` -- connect to a running scheduler (``dask scheduler``
  listening on ``tcp://HOST:PORT``); ``[::1]`` style hosts work too;
- ``dask-local:N`` -- start a ``LocalCluster`` here of N worker processes, one
  thread each, on 127.0.0.1, each pinned to its own core the way the cpu
  backend pins its workers (for trying the backend on one computer).

:func:`connect` opens a cluster once per spec and keeps it in a registry, so the
machine profile and the ``dask`` backend share one client;
:func:`dask_machine` is the hook :func:`lib.platform.machines.load_machine`
calls for such names.

**The profile** (:func:`machine_from_workers`) comes from the scheduler's record
of each worker: threads, memory limit, host, and the GPU that distributed's NVML
start-up information reports (dask-cuda starts one worker per GPU). Device ``i``
is the i-th worker ordered by (host, port); its name is ``dask worker ADDRESS``.
Provenance, number by number:

- peak FLOP/s and memory bandwidth of a CPU worker: **estimated**, the
  ``local-cpu`` per-core estimate times the worker's threads (nothing is
  timed); of a GPU worker: the datasheet figures of its model (estimated);
- memory: **measured** in the sense of read from the live cluster -- the
  worker's ``memory_limit`` from the scheduler (GPU memory as NVML reports it);
- links: **estimated** until :func:`lib.execution.dask.characterise_network`
  measures them. Workers on one host talk over TCP on the loopback interface
  (kind ``loopback``); workers on different hosts over the network (kind
  ``network``). Every pair may send to each other directly (``p2p``). The
  "host" of the profile is the client: a worker's host link is the path from
  the client to it.

**Telemetry** (:func:`dask_snapshot`) is the scheduler's view of each worker: its
process CPU use over the last heartbeat, its memory, its status, and the tasks
the scheduler has it processing (:func:`worker_table` lists them all; the
:class:`~lib.platform.telemetry.Snapshot` has no field for a task count).

``dask`` and ``distributed`` are optional: they are imported inside the
functions that need them, so ``import lib`` stays light.

Why one module: the spec, the open cluster, the profile and the telemetry all
read the same scheduler records of the same workers, in one device order (by
host, then port) and under one naming convention (:data:`WORKER_PREFIX` and the
address); kept together, the order in which a profile lists the workers and the
order in which a snapshot reports them cannot drift apart.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lib.platform.machines import (
    GB,
    GPU_CATALOG,
    RESOLVERS,
    Device,
    Link,
    Machine,
    MachineError,
    catalog_device,
    catalog_model,
    local_cpu_machine,
)
from lib.platform.spawn import bare_main
from lib.platform.telemetry import Snapshot
from lib.storage import characterisation_path, gpuhive_home

DASK_PREFIXES = ("dask://", "dask-local:")
#: Prefix of a device name; the worker's address follows it.
WORKER_PREFIX = "dask worker "
#: Largest ``dask-local:N``.
MAX_LOCAL_WORKERS = 64
#: Link estimates before measurement: (bandwidth B/s, latency s, note).
LINK_ESTIMATES = {
    "loopback": (2 * GB, 100e-6, "estimate: TCP over the loopback interface "
                                 "(2 GB/s, 0.1 ms); not measured"),
    "network": (1.25 * GB, 200e-6, "estimate: 10 Gigabit Ethernet (1.25 GB/s, "
                                   "0.2 ms); not measured"),
}
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


@dataclass(frozen=True)
class DaskSpec:
    """A parsed machine spec: ``local`` with ``workers``, or ``remote`` with
    ``address`` (``tcp://HOST:PORT``)."""

    spec: str
    kind: str
    address: str = ""
    workers: int = 0


def is_dask_spec(name: object) -> bool:
    """Whether ``name`` is a Dask machine spec (``dask://...``, ``dask-local:...``)."""
    return isinstance(name, str) and name.startswith(DASK_PREFIXES)


def parse_spec(spec: str) -> DaskSpec:
    """Parse ``dask://HOST:PORT`` or ``dask-local:N``.

    Raises:
        MachineError: anything else, naming the spec.
    """
    if spec.startswith("dask-local:"):
        text = spec[len("dask-local:"):]
        if not text.isdigit() or not 1 <= int(text) <= MAX_LOCAL_WORKERS:
            raise MachineError(f"machine {spec!r}: dask-local:N needs a worker count "
                               f"N in 1..{MAX_LOCAL_WORKERS}")
        return DaskSpec(spec, "local", workers=int(text))
    if spec.startswith("dask://"):
        m = _HOST_PORT.match(spec[len("dask://"):])
        if m is None or not 1 <= int(m.group(2)) <= 65535:
            raise MachineError(f"machine {spec!r}: expected dask://HOST:PORT with a "
                               "port in 1..65535")
        return DaskSpec(spec, "remote", address=f"tcp://{m.group(1)}:{m.group(2)}")
    raise MachineError(f"machine {spec!r}: not a Dask spec (dask://HOST:PORT or "
                       "dask-local:N)")


# --------------------------------------------------------------------------
# Worker side (run through ``client.run``; importable on every worker)

def worker_facts() -> dict[str, Any]:
    """What a worker process says about its computer."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else list(range(os.cpu_count() or 1))
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        mem = 0.0
    return {"hostname": socket.gethostname(), "pid": os.getpid(), "cores": cores,
            "mem_total": mem, "blas_threads": os.environ.get("OMP_NUM_THREADS", "")}


def quiet_shutdown() -> None:
    """Run on a worker of a cluster this process is about to close: its
    logger keeps to critical messages. A worker whose heartbeat is under way
    when the scheduler closes logs an ERROR with a traceback ("Failed to
    communicate with scheduler during heartbeat"), seen in ``make book``'s
    output when a chapter closed its local cluster on a busy machine."""
    import logging
    for name in ("distributed.worker", "distributed.nanny", "distributed.core"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def pin_process(core: int) -> list[int]:
    """Pin every thread of this process to ``core`` (threads started later
    inherit it); returns the affinity now in force."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {core})
        except OSError:
            pass
    return sorted(os.sched_getaffinity(0))


# --------------------------------------------------------------------------
# The profile

def worker_address(device: Device) -> str:
    """The worker address of a device of a Dask profile.

    Raises:
        MachineError: the device is not a Dask worker.
    """
    if not device.name.startswith(WORKER_PREFIX):
        raise MachineError(f"device {device.label} is not a Dask worker")
    return device.name[len(WORKER_PREFIX):].split(" ", 1)[0]


def address_host(address: str) -> str:
    """``"tcp://10.0.0.5:4000"`` -> ``"10.0.0.5"``."""
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0].strip("[]")


def worker_order(address: str) -> tuple[str, int, str]:
    """Sort key of worker addresses: host, then port (the profile's device order)."""
    port = address.rsplit(":", 1)[-1]
    return (address_host(address), int(port) if port.isdigit() else 0, address)


def _link(kind: str, note: str = "") -> Link:
    bw, lat, why = LINK_ESTIMATES[kind]
    return Link(kind=kind, bandwidth=bw, latency=lat, p2p=True,
                provenance="estimated", note=note or why)


def machine_from_workers(name: str, workers: Mapping[str, Mapping[str, Any]],
                         facts: Mapping[str, Mapping[str, Any]] | None = None,
                         client_hostname: str | None = None,
                         gpu_workers: bool | None = None,
                         scheduler: str = "") -> Machine:
    """The profile of a cluster from the scheduler's worker records.

    Args:
        name: the machine's name (its spec).
        workers: ``client.scheduler_info()["workers"]``: address -> record with
            ``nthreads``, ``memory_limit``, ``host`` and, where distributed's NVML
            start-up information ran, ``gpu`` (``name``, ``memory-total``).
        facts: address -> :func:`worker_facts` (hostname, memory) where known.
        client_hostname: the client's host name; workers on it (or on a loopback
            address) have a ``loopback`` host link.
        gpu_workers: True/False forces every worker to be a GPU/CPU device;
            None (default) makes a worker that reports a GPU a GPU device.
        scheduler: the scheduler's address, for the description.

    Raises:
        MachineError: no workers, or a GPU the catalog does not know.
    """
    if not workers:
        raise MachineError(f"machine {name}: the scheduler has no workers")
    facts = facts or {}
    core = local_cpu_machine(1).devices[0]
    addresses = sorted(workers, key=worker_order)
    hosts = {a: facts.get(a, {}).get("hostname") or address_host(a) for a in addresses}
    here = client_hostname or socket.gethostname()
    devices, host_links = [], []
    for i, addr in enumerate(addresses):
        rec = workers[addr]
        threads = max(1, int(rec.get("nthreads") or 1))
        limit = float(rec.get("memory_limit") or 0)
        mem_note = "the worker's memory_limit, read from the scheduler"
        if limit <= 0:
            per_host = sum(1 for a in addresses if hosts[a] == hosts[addr])
            limit = float(facts.get(addr, {}).get("mem_total") or 8 * GB) / per_host
            mem_note = "no memory_limit: the host's memory divided among its workers"
        gpu = rec.get("gpu") if isinstance(rec.get("gpu"), Mapping) else None
        is_gpu = bool(gpu and gpu.get("name")) if gpu_workers is None \
            else gpu_workers
        if is_gpu:
            if not gpu or not gpu.get("name"):
                raise MachineError(f"machine {name}: worker {addr} reports no GPU")
            model = catalog_model(str(gpu["name"]))
            if model is None:
                raise MachineError(
                    f"machine {name}: worker {addr} has a {gpu['name']!r}, which "
                    f"the catalog lacks (it has {', '.join(GPU_CATALOG)}); a Dask "
                    "worker reports only its GPU's name and memory")
            dev = catalog_device(i, model)
            total = float(gpu.get("memory-total") or dev.mem_bytes)
            devices.append(dataclasses.replace(
                dev, name=f"{WORKER_PREFIX}{addr} ({model})", mem_bytes=total,
                provenance={**dev.provenance, "mem_bytes": "measured"},
                notes={**dev.notes,
                       "mem_bytes": "GPU memory read by the worker through NVML"}))
        else:
            peak = (f"estimate: {threads} thread(s) x local-cpu's per-core "
                    f"{core.notes['peak_fp32'].removeprefix('estimate: ')}; "
                    "not measured")
            devices.append(Device(
                index=i, name=f"{WORKER_PREFIX}{addr}", kind="cpu",
                peak_fp32=core.peak_fp32 * threads,
                peak_fp64=core.peak_fp64 * threads, tensor_fp16=0.0,
                tensor_bf16=0.0, mem_bytes=limit, mem_bw=core.mem_bw * threads,
                max_block=core.max_block,
                provenance={"peak_fp32": "estimated", "peak_fp64": "estimated",
                            "tensor_fp16": "estimated", "tensor_bf16": "estimated",
                            "mem_bytes": "measured", "mem_bw": "estimated"},
                notes={"peak_fp32": peak, "peak_fp64": peak,
                       "tensor_fp16": "no tensor path on a CPU worker",
                       "tensor_bf16": "no tensor path on a CPU worker",
                       "mem_bytes": mem_note,
                       "mem_bw": f"estimate: {threads} x local-cpu's per-core "
                                 "streaming bandwidth; not measured"}))
        local = hosts[addr] == here or address_host(addr) in _LOOPBACK
        host_links.append(_link("loopback" if local else "network",
                                f"client to worker {addr}: "
                                + LINK_ESTIMATES["loopback" if local
                                                 else "network"][2]))
    peers = {}
    for i, a in enumerate(addresses):
        for j in range(i + 1, len(addresses)):
            b = addresses[j]
            same = hosts[a] == hosts[b]
            peers[(i, j)] = _link("loopback" if same else "network")
    n_hosts = len(set(hosts.values()))
    return Machine(
        name=name,
        description=(f"The {len(addresses)} worker(s) of the Dask cluster"
                     f"{' at ' + scheduler if scheduler else ''} on {n_hosts} "
                     "host(s), one device each; the dask backend measures them."),
        devices=tuple(devices), host_links=tuple(host_links), peers=peers,
        host_mem_bw=local_cpu_machine(1).host_mem_bw, simulated=False,
        induced=False, nccl=False, real_backends=("dask",))


def apply_links(machine: Machine, host_links: Mapping[int, Link] | None = None,
                peers: Mapping[tuple[int, int], Link] | None = None) -> Machine:
    """``machine`` with some host links and peer links replaced (measured ones)."""
    hosts = list(machine.host_links)
    for i, link in (host_links or {}).items():
        hosts[i] = link
    merged = dict(machine.peers)
    merged.update({(min(i, j), max(i, j)): link
                   for (i, j), link in (peers or {}).items()})
    return dataclasses.replace(machine, host_links=tuple(hosts), peers=merged)


# --------------------------------------------------------------------------
# Open clusters

class DaskCluster:
    """A client on a cluster (and the LocalCluster, when this process started
    it), with the machine profile derived from its workers.

    Attributes:
        spec: the machine spec it was opened with.
        client: the ``distributed.Client``.
        local: the ``LocalCluster`` this process owns, or None.
        machine: the profile (see :func:`machine_from_workers`).
        addresses: worker address of each device, index order.
    """

    def __init__(self, spec: str, client: Any, local: Any = None,
                 gpu_workers: bool | None = None, timeout: float = 30.0):
        self.spec, self.client, self.local = spec, client, local
        self.gpu_workers = gpu_workers
        self.timeout = timeout
        self.pinned = False
        #: whether close() closes the client (not for :func:`attach`)
        self.owns_client = True
        #: the LocalCluster's scratch folder, removed on close
        self.scratch = ""
        self.machine: Machine
        self.addresses: tuple[str, ...] = ()
        self.refresh()

    def refresh(self) -> Machine:
        """Re-read the workers and re-derive the profile (a worker that died and
        was restarted comes back at a new address: a new device), pinning them
        again if they were pinned."""
        info = self.client.scheduler_info(n_workers=-1)
        workers = {a: rec for a, rec in info.get("workers", {}).items()
                   if rec.get("status", "running") == "running"}
        facts: dict[str, Any] = {}
        if workers:
            try:
                facts = self.client.run(worker_facts, workers=list(workers),
                                        wait=True)
            except Exception as exc:  # a worker that cannot import the project
                raise MachineError(f"machine {self.spec}: the workers cannot run "
                                   f"the project's code ({type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())[:160]}); install "
                                   "gpuhive on every worker") from None
        self.machine = machine_from_workers(
            self.spec, workers, facts, gpu_workers=self.gpu_workers,
            scheduler=str(info.get("address", "")))
        self.addresses = tuple(worker_address(d) for d in self.machine.devices)
        self.facts = facts
        if self.pinned:
            self.pin()
        return self.machine

    def alive(self) -> set[str]:
        """Addresses of the workers the scheduler has now."""
        return set(self.client.nthreads())

    def pin(self) -> dict[str, list[int]]:
        """Pin worker i to core i (mod the cores this process may use), as the
        cpu backend pins its workers; returns each worker's affinity."""
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else []
        if not cores:
            return {}
        self.pinned = True
        alive = self.alive()
        return {addr: self.client.run(pin_process, cores[i % len(cores)],
                                      workers=[addr])[addr]
                for i, addr in enumerate(self.addresses) if addr in alive}

    def heal(self, timeout: float | None = None) -> Machine:
        """Bring a ``dask-local`` cluster back to its N workers after some were
        removed (a killed worker is restarted by its nanny; a removed one is
        not), then :meth:`refresh`. Other clusters are only refreshed.

        Raises:
            MachineError: the workers did not come back within ``timeout``.
        """
        n = parse_spec(self.spec).workers if self.spec.startswith("dask-local:") \
            else 0
        if self.local is not None and n:
            info = self.client.scheduler_info(n_workers=-1).get("workers", {})
            present = {rec.get("name") for rec in info.values()}
            for name in [k for k in self.local.worker_spec if k not in present]:
                del self.local.worker_spec[name]
                # its nanny may still be closing; LocalCluster would wait on it
                gone = self.local.workers.pop(name, None)
                if gone is not None:
                    self.local.loop.add_callback(gone.close, timeout=5)
            while len(self.local.worker_spec) < n:  # names never used before
                self.local.worker_spec[f"healed-{uuid.uuid4().hex[:8]}"] = \
                    dict(self.local.new_spec)
            self.local.scale(n)
            try:
                self.client.wait_for_workers(n, timeout=timeout or self.timeout)
            except Exception as exc:
                raise MachineError(f"machine {self.spec}: {n} worker(s) did not "
                                   f"come back ({type(exc).__name__})") from None
        return self.refresh()

    def close(self) -> None:
        """Close the client, and the LocalCluster if this process started it.

        Futures that only reference cycles still hold (a caught error's frames)
        are collected first, so they are released while the client is alive
        rather than by a finaliser after it has gone.
        """
        _OPEN.pop(self.spec, None)
        gc.collect()
        if self.local is not None:
            try:
                self.client.run(quiet_shutdown, wait=True)
            except Exception:  # a worker already gone: nothing to quiet
                pass
        try:
            if self.owns_client:
                self.client.close(timeout=10)
        finally:
            if self.local is not None:
                self.local.close(timeout=10)
                self.local = None
            if self.scratch:
                shutil.rmtree(self.scratch, ignore_errors=True)


_OPEN: dict[str, DaskCluster] = {}
_LOCK = threading.Lock()
_AT_EXIT: list[Any] = []


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise MachineError("Dask machines need dask[distributed], which is not "
                           "installed (pip install 'dask[distributed]')") from None
    return distributed


def connect(spec: str, timeout: float = 30.0, gpu_workers: bool | None = None,
            pin: bool = True) -> DaskCluster:
    """The open cluster for ``spec``, connecting (or starting it) the first time.

    Args:
        spec: ``dask://HOST:PORT`` or ``dask-local:N``.
        timeout: seconds to connect and for the workers to arrive.
        gpu_workers: see :func:`machine_from_workers` (``dask-local`` workers are
            always CPU workers).
        pin: pin ``dask-local`` workers to one core each.

    Raises:
        MachineError: a malformed spec, no dask, an unreachable scheduler, no
            workers (one line naming the spec).
    """
    parsed = parse_spec(spec)
    with _LOCK:
        if spec in _OPEN:
            return _OPEN[spec]
        distributed = _distributed()
        import dask

        local = client = None
        scratch = ""
        try:
            if parsed.kind == "local":
                scratch = local_scratch()
                # the scheduler's scratch space follows the configuration;
                # the workers do not run the caller's script (bare_main)
                with dask.config.set({"temporary-directory": scratch}), \
                        bare_main():
                    local = distributed.LocalCluster(
                        n_workers=parsed.workers, threads_per_worker=1,
                        processes=True, host="127.0.0.1", dashboard_address=None,
                        worker_dashboard_address=None, protocol="tcp",
                        local_directory=scratch,
                        # no dashboard; its health endpoint on any free port,
                        # not 8787 (taken by a second cluster: a warning)
                        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
                client = distributed.Client(local, timeout=timeout)
                client.wait_for_workers(parsed.workers, timeout=timeout)
            else:
                client = distributed.Client(parsed.address, timeout=timeout)
                client.wait_for_workers(1, timeout=timeout)
            cluster = DaskCluster(spec, client, local,
                                  False if local is not None else gpu_workers,
                                  timeout)
            cluster.scratch = scratch
            if local is not None and pin:
                cluster.pin()
        except MachineError:
            _quietly_close(client, local, scratch)
            raise
        except Exception as exc:
            _quietly_close(client, local, scratch)
            what = ("cannot start the LocalCluster" if parsed.kind == "local"
                    else f"cannot reach the scheduler at {parsed.address}")
            raise MachineError(f"machine {spec}: {what} ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:160]})") from None
        _OPEN[spec] = cluster
        if not _AT_EXIT:
            _AT_EXIT.append(atexit.register(close_all))
        return cluster


def attach(client: Any, name: str | None = None,
           gpu_workers: bool | None = None) -> DaskCluster:
    """Register a client made elsewhere; its machine is named ``name`` or
    ``dask://HOST:PORT`` of its scheduler. The caller keeps the client:
    closing the registered cluster leaves it open."""
    address = client.scheduler.address
    name = name or "dask://" + address.split("://", 1)[-1]
    with _LOCK:
        cluster = DaskCluster(name, client, None, gpu_workers)
        cluster.owns_client = False
        _OPEN[name] = cluster
    return cluster


def cluster_for(machine: Machine | str) -> DaskCluster:
    """The open cluster behind a Dask machine (connecting by its spec if none is
    open yet).

    Raises:
        MachineError: the machine is not a Dask machine, or cannot be reached.
    """
    name = machine if isinstance(machine, str) else machine.name
    if name in _OPEN:
        return _OPEN[name]
    if not is_dask_spec(name):
        raise MachineError(f"machine {name} is not a Dask cluster "
                           "(dask://HOST:PORT or dask-local:N)")
    return connect(name)


def local_scratch() -> str:
    """A new scratch folder for a local cluster's scheduler and workers, under
    ``$GPUHIVE_HOME/dask/`` and named after this process; folders of
    processes that are gone (a run that was killed) are removed first."""
    root = gpuhive_home() / "dask"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("local-*-*"):
        try:
            os.kill(int(old.name.split("-")[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, OSError):
            pass  # not ours to judge: a name we did not write, another user's
    return tempfile.mkdtemp(prefix=f"local-{os.getpid()}-", dir=root)


def dask_machine(spec: str) -> Machine:
    """The machine profile of ``spec`` (the hook of
    :func:`~lib.platform.machines.load_machine`), with the links ``gpuhive
    characterise`` measured between its workers where it has (see
    :func:`with_measured_links`)."""
    return with_measured_links(connect(spec).machine)


def links_record(machine: Machine, host_links: Mapping[int, Link],
                 peers: Mapping[tuple[int, int], Link]) -> dict[str, Any]:
    """Measured links as the characterisation stores them (``measured.network``):
    the hosts of the workers they were measured on, and each link."""
    def one(link: Link) -> dict[str, Any]:
        return {"kind": link.kind, "bandwidth": link.bandwidth,
                "latency": link.latency, "p2p": link.p2p,
                "provenance": link.provenance, "note": link.note}
    return {"hosts": [address_host(worker_address(d)) for d in machine.devices],
            "host_links": {str(i): one(x) for i, x in sorted(host_links.items())},
            "peers": {f"{i}-{j}": one(x) for (i, j), x in sorted(peers.items())}}


def with_measured_links(machine: Machine) -> Machine:
    """``machine`` with the links its stored characterisation measured
    (``$GPUHIVE_HOME/characterisation/<spec>.json``, ``measured.network``),
    where the workers sit on the same hosts, in the same order, as when they
    were measured; ``machine`` unchanged otherwise (no file, another layout)."""
    path = characterisation_path(machine.name)
    try:
        record = json.loads(path.read_text())["measured"]["network"]
        hosts = [address_host(worker_address(d)) for d in machine.devices]
        if record["hosts"] != hosts:
            return machine

        def link(x: Mapping[str, Any]) -> Link:
            return Link(kind=str(x["kind"]), bandwidth=float(x["bandwidth"]),
                        latency=float(x["latency"]), p2p=bool(x["p2p"]),
                        provenance="measured", note=str(x["note"]))
        host_links = {int(i): link(x) for i, x in record["host_links"].items()}
        peers = {tuple(int(v) for v in k.split("-")): link(x)
                 for k, x in record["peers"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return machine  # nothing measured yet, or a file of another form
    if any(not 0 <= i < machine.n for i in host_links) or any(
            not 0 <= i < j < machine.n for i, j in peers):
        return machine
    return apply_links(machine, host_links, peers)


def close(spec: str) -> None:
    """Close the cluster opened for ``spec`` (nothing if none is open)."""
    cluster = _OPEN.get(spec)
    if cluster is not None:
        cluster.close()


def close_all() -> None:
    """Close every cluster this process opened."""
    for spec in list(_OPEN):
        try:
            close(spec)
        except Exception:
            pass


def _quietly_close(client: Any, local: Any, scratch: str = "") -> None:
    for thing in (client, local):
        if thing is not None:
            try:
                thing.close(timeout=5)
            except Exception:
                pass
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------
# Telemetry: the scheduler's view

def worker_table(cluster: DaskCluster) -> list[dict[str, Any]]:
    """One row per device: address, status, CPU %, memory, tasks processing."""
    info = cluster.client.scheduler_info(n_workers=-1).get("workers", {})
    processing = cluster.client.processing()
    return [_row(i, addr, info.get(addr), processing.get(addr, ()))
            for i, addr in enumerate(cluster.addresses)]


def _row(i: int, addr: str, rec: Mapping[str, Any] | None,
         processing: Any) -> dict[str, Any]:
    if rec is None:
        return {"device": i, "address": addr, "status": "gone", "nthreads": 0,
                "cpu_percent": float("nan"), "memory": float("nan"),
                "memory_limit": 0.0, "processing": 0, "executing": 0, "gpu": None}
    metrics = rec.get("metrics", {})
    counts = metrics.get("task_counts", {}) or {}
    return {"device": i, "address": addr, "status": rec.get("status", "?"),
            "nthreads": int(rec.get("nthreads") or 1),
            "cpu_percent": float(metrics.get("cpu") or 0.0),
            "memory": float(metrics.get("memory") or 0.0),
            "memory_limit": float(rec.get("memory_limit") or 0.0),
            "processing": len(processing),
            "executing": int(counts.get("executing", 0)),
            "gpu": metrics.get("gpu") if isinstance(metrics.get("gpu"), Mapping)
            else None,
            "gpu_memory_total": float((rec.get("gpu") or {}).get("memory-total")
                                      or 0.0)}


def snapshot_from_rows(machine: Machine, rows: list[dict[str, Any]]) -> Snapshot:
    """A :class:`~lib.platform.telemetry.Snapshot` from :func:`worker_table` rows.

    Utilisation of a CPU worker is the larger of its process's CPU use per
    thread over the last heartbeat (which counts any task it runs, ours too) and
    the tasks the scheduler has it processing per thread (a queue means it is
    busy); of a GPU worker, NVML's utilisation. Free memory is the limit less
    what the process holds (GPU: NVML's total less used). A worker the scheduler
    no longer has, or one not ``running`` (paused, closing), is unhealthy.
    """
    util, free, healthy = [], [], []
    for d, row in zip(machine.devices, rows, strict=True):
        if row["status"] != "running":
            util.append(1.0)
            free.append(0.0)
            healthy.append(False)
            continue
        threads = max(1, row["nthreads"])
        if d.kind == "gpu" and row["gpu"]:
            u = float(row["gpu"].get("utilization") or 0.0) / 100.0
            total = row["gpu_memory_total"] or d.mem_bytes
            f = total - float(row["gpu"].get("memory-used") or 0.0)
        else:
            u = max(row["cpu_percent"] / 100.0 / threads, row["processing"] / threads)
            f = (row["memory_limit"] or d.mem_bytes) - row["memory"]
        util.append(min(1.0, max(0.0, u)))
        free.append(max(0.0, f))
        healthy.append(True)
    return Snapshot(source="dask", utilisation=tuple(util), free_bytes=tuple(free),
                    healthy=tuple(healthy), measured=True)


def dask_snapshot(cluster: DaskCluster | Machine | str) -> Snapshot:
    """The scheduler's view of every device of a Dask machine, now (MEASURED:
    read from the live workers' heartbeats)."""
    if not isinstance(cluster, DaskCluster):
        cluster = cluster_for(cluster)
    return snapshot_from_rows(cluster.machine, worker_table(cluster))


# load_machine() resolves the Dask specs through this module.
RESOLVERS.update(dict.fromkeys(DASK_PREFIXES, dask_machine))
