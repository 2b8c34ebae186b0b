"""The cpu backend: each device of ``local-cpu`` is a real worker process.

One worker process per device, pinned to its own core, single-threaded BLAS.
For a run the parent writes the inputs once into files in shared memory
(``/dev/shm`` where it exists); each worker maps them once for the run's
repeats (:func:`_open_run`), computes its shard with
NumPy (the same :meth:`lib.platform.workloads.Workload.compute` the reference uses) and
writes its rows, or its partial sum, straight into a shared output buffer.
Arrays never travel as pickles; the messages carry paths, shapes and row ranges.

Memory is held as a device runtime holds it. A worker's allocator keeps what
its shards' temporaries freed (:func:`keep_heap`: large arrays come from the
heap, not a fresh mapping each, and up to :func:`heap_keep` bytes are not
given back), as CuPy's memory pool keeps device memory between kernels; and
the parent allocates the output buffer's pages before the timed region
(:func:`reserve`), as a GPU runtime allocates device buffers before it
launches. Without them, a shard's time said more about glibc than about the
device: temporaries over glibc's moving mmap threshold were mapped and
faulted in afresh on every run (a histogram shard of 0.7 of 674,166 elements
took ten times one of 0.5 of them, and which side of the threshold a shard
fell depended on the jobs before it), and the first touch of every output
page was paid inside the timed run.

The workers start before the clock does, as a GPU's context is created before
its first kernel is timed: :meth:`CpuBackend.start` returns when every worker
has pinned itself to its core and said it is ready. A spawned worker is a
fresh interpreter that imports this package first; while the first run waited
for that, its figure held it: 0.31 s for a reduction of 2^20 elements over
two cores whose second run measured 3 ms (MEASURED on ``local-cpu``; the
first run now measures 2 to 4 ms).

Times are wall-clock measurements (MEASURED):

- per device: from the worker receiving its job to its result written;
- total: from the first job sent to the merged result in the parent.

A worker that raises or dies yields a :class:`~lib.execution.base.DeviceError`
naming the device, the shard and the decision; no partial result is returned.

A crash leaves nothing behind. Workers watch their parent and exit when it is
gone (killed with SIGKILL included), and each run's buffers live in a folder
named after the process that owns it (``gpuhive-<pid>-...`` under the shared
memory root), so the next backend to start removes the folders of owners that
no longer exist (:func:`lib.execution.shm.reclaim_orphans`).

Why one module: the worker's loop and the parent's side of it
(:meth:`CpuBackend.start`, :meth:`CpuBackend._dispatch`) are the two ends of
one protocol over a pipe (``ready``, a job, its ``ok`` or ``error``, a
run's ``release`` and ``last``), and the memory each end holds for a run
(the mapped inputs, the kept heap, the reserved output) is one arrangement;
a change to either end is a change to both, read in one place.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterable
from multiprocessing import connection, get_context
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.execution.base import (
    BackendUnavailable,
    DeviceError,
    ExecutionError,
    ExecutionMetrics,
    Result,
    check_devices,
    check_host_memory,
    repeat_timed,
)
from lib.execution.shm import allocate, place, reclaim_orphans, shm_root
from lib.platform.machines import Machine
from lib.platform.spawn import bare_main
from lib.platform.user_kinds import adopt_kind, kind_payload
from lib.platform.workloads import host_dtype, split_rows, verify_in_blocks, workload

#: Environment each worker starts with: one BLAS thread, so a device is a core.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1"}
_ENV_LOCK = threading.Lock()


#: glibc's mallopt parameters (``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: The most freed memory a worker keeps, bytes (also at most a quarter of the
#: machine's memory shared among its workers: :func:`heap_keep`).
HEAP_KEEP_MAX = 1 << 30


def heap_keep(workers: int) -> int:
    """Bytes of freed memory each of ``workers`` workers may keep: at most
    :data:`HEAP_KEEP_MAX`, and together at most a quarter of physical memory."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return HEAP_KEEP_MAX
    return int(min(HEAP_KEEP_MAX, memory // (4 * max(1, workers))))


def keep_heap(keep: int) -> bool:
    """Have this process's allocator serve every array from its heap (no
    fresh mapping per large array) and keep up to ``keep`` freed bytes instead
    of trimming them; False where the C library has no ``mallopt`` (not
    glibc), which leaves the allocator as it was."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, min(int(keep), 2**31 - 1)))


def _open(desc: tuple[str, str, tuple[int, ...]], mode: str) -> np.ndarray:
    path, dtype, shape = desc
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode=mode, shape=tuple(shape))


#: How often a worker checks that its parent is still there, seconds.
PARENT_POLL_S = 0.25


def _watch_parent(parent: int) -> None:
    """Exit this worker as soon as ``parent`` is gone (its pid changes to the
    reaper's): a worker computing a long shard would otherwise run on as an
    orphan. A thread, not ``PR_SET_PDEATHSIG``, which fires when the *thread*
    that started the worker ends, not the process."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _worker_main(conn: connection.Connection, core: int | None,
                 parent: int | None = None, keep: int = 0) -> None:
    """Worker loop: receive a job, compute the shard, write it, report times
    (the allocator keeps ``keep`` freed bytes: :func:`keep_heap`).

    Ctrl-C is its parent's to handle: a terminal sends SIGINT to the whole
    foreground group, and a worker that took it printed a traceback of its
    own beside the parent's one-line "interrupted". The parent stops its
    workers as it exits, and a worker whose parent is gone exits by itself
    (:func:`_watch_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if keep:
        keep_heap(keep)
    if parent is not None:
        if os.getppid() != parent:  # the parent died before we got here
            os._exit(1)
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="parent-watch").start()
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {core})
        except OSError:
            pass
    conn.send(("ready", os.getpid()))
    run: dict[str, Any] = {}  # the current run's task and mapped buffers
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        if job.get("release"):  # the run is over: unmap its buffers
            run.clear()
            continue
        try:
            conn.send(_do_job(run, job))
        except BaseException as exc:  # report, never die silently
            run.clear()
            conn.send(("error", job["id"], f"{type(exc).__name__}: {exc}"))
        if job.get("last"):  # unmapped after the reply: off the run's clock
            run.clear()


def _do_job(run: dict[str, Any], job: dict[str, Any]) -> tuple:
    """Compute one shard into the run's output; the ``ok`` message with the
    shard's compute, wall and CPU seconds. ``run`` keeps what the run's
    other jobs reuse (:func:`_open_run`); nothing else outlives the job."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    if job.get("fault"):
        raise RuntimeError("injected fault")
    if run.get("out_desc") != job["out"]:
        run.clear()
        run.update(_open_run(job))
    task, w = run["task"], run["workload"]
    lo, hi = job["lo"], job["hi"]
    shard = w.shard_inputs(task, run["inputs"], lo, hi)
    t0 = time.perf_counter()
    part = w.compute(task, shard, lo, hi)
    t_compute = time.perf_counter() - t0
    out = run["out"]
    if task.merge == "concat":
        out[lo:hi] = part
    else:
        out[job["pos"]] = part
    if isinstance(out, np.memmap):
        out.flush()
    return ("ok", job["id"], t_compute, time.perf_counter() - start,
            time.thread_time() - cpu_start)


def _open_run(job: dict[str, Any]) -> dict[str, Any]:
    """What a worker keeps for the length of one run: the parsed task, its
    workload and its buffers mapped once. A run's repeats then pay only for
    their shard, as a GPU runtime's launches reuse buffers it allocated once;
    mapping three files afresh for every job took more than half of a small
    job's time. The worker unmaps them after replying to the job the parent
    marks ``last`` (or on a ``release`` message, which ends a run cut
    short), so nothing of a run stays mapped once it is over."""
    adopt_kind(job.get("kind"))
    task = TaskSpec.from_json(job["task"])
    return {"out_desc": job["out"], "task": task, "workload": workload(task),
            "inputs": {k: _open(v, "r") for k, v in job["inputs"].items()},
            "out": _open(job["out"], "r+")}


class CpuBackend:
    """Runs decisions on real worker processes, one per device of the machine.

    Args:
        machine: a profile whose devices are CPU cores (``local-cpu``).
        seed: seed of the inputs.
        repeats: timed repeats per run (figures are medians).
        warmup: untimed runs before the timed ones.
        timeout: seconds to wait for a shard before declaring the device failed.
        fault_devices: devices whose worker raises on purpose (fault injection,
            to exercise the failure path).
    """

    name = "cpu"
    measured = True

    def __init__(self, machine: Machine, seed: int = 0, repeats: int = 1,
                 warmup: int = 0, timeout: float = 600.0,
                 fault_devices: Iterable[int] = ()):
        if any(d.kind != "cpu" for d in machine.devices):
            raise BackendUnavailable(
                f"cpu backend: machine {machine.name} has non-CPU devices; use "
                "--machine local-cpu")
        self.machine = machine
        self.seed = seed
        self.repeats = max(1, repeats)
        self.warmup = max(0, warmup)
        self.timeout = timeout
        self.fault_devices = set(fault_devices)
        self.workers: list[Any] = []
        self._conns: list[connection.Connection] = []
        self._next_id = 0

    # -- worker pool --------------------------------------------------------

    def _cores(self) -> list[int | None]:
        if hasattr(os, "sched_getaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            return [cores[i % len(cores)] for i in range(self.machine.n)]
        return [None] * self.machine.n

    def start(self) -> None:
        """Start the worker processes, and return when every one is ready
        (done lazily by :meth:`run`, before its clock starts).

        A spawned worker is a fresh interpreter that imports this package
        before it can take a job: about 0.3 s on ``local-cpu``. Waiting for
        its word here keeps that out of the first timed run.

        Raises:
            ExecutionError: a worker exited, or said nothing within the
                backend's timeout, before it was ready.
        """
        if self.workers and all(p.is_alive() for p in self.workers):
            return
        self.close()
        reclaim_orphans()
        ctx = get_context("spawn")
        with _ENV_LOCK, bare_main():
            saved = {k: os.environ.get(k) for k in WORKER_ENV}
            os.environ.update(WORKER_ENV)
            try:
                for core in self._cores():
                    parent, child = ctx.Pipe()
                    proc = ctx.Process(target=_worker_main,
                                       args=(child, core, os.getpid(),
                                             heap_keep(self.machine.n)),
                                       daemon=True, name=f"gpuhive-cpu-{core}")
                    proc.start()
                    child.close()
                    self.workers.append(proc)
                    self._conns.append(parent)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Read each worker's ``ready``; tear the pool down and raise
        ExecutionError if one exits or stays silent past the timeout."""
        deadline = time.monotonic() + self.timeout
        waiting = dict(enumerate(self._conns))
        while waiting:
            for conn in connection.wait(list(waiting.values()), timeout=0.2):
                dev = self._conns.index(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    msg = None
                if not (isinstance(msg, tuple) and msg[:1] == ("ready",)):
                    self._not_ready(dev, "exited before it was ready")
                del waiting[dev]
            for dev in list(waiting):
                if not self.workers[dev].is_alive():
                    self._not_ready(dev, "exited before it was ready (code "
                                         f"{self.workers[dev].exitcode})")
            if waiting and time.monotonic() > deadline:
                self._not_ready(next(iter(waiting)), "said nothing within "
                                f"{self.timeout:.0f} s of its start")

    def _not_ready(self, dev: int, what: str) -> None:
        label = self.machine.devices[dev].label
        self.close()
        raise ExecutionError(f"cpu backend: the worker for device {label} "
                             f"{what}")

    def close(self) -> None:
        """Stop the workers."""
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for proc in self.workers:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        for conn in self._conns:
            conn.close()
        self.workers, self._conns = [], []

    def _release(self) -> None:
        """Tell each worker the run is over, so it unmaps the run's buffers
        (a worker that is gone has nothing mapped)."""
        for conn in self._conns:
            try:
                conn.send({"release": True})
            except (OSError, BrokenPipeError):
                pass

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (telemetry counts them as ours, not
        as contention: :func:`lib.platform.telemetry.local_cpu_snapshot`)."""
        return [p.pid for p in self.workers if p.pid is not None and p.is_alive()]

    def __enter__(self) -> CpuBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- running ------------------------------------------------------------

    def run_key(self, task: TaskSpec, decision: Decision) -> tuple:
        """Which device gets which rows: all a run here depends on (a worker
        computes its rows in one go, whatever the decision's mode, chunk,
        block and path)."""
        bounds = split_rows(task.split_size, decision.shares)
        return tuple((g, lo, hi) for g, (lo, hi) in zip(decision.gpus, bounds,
                                                        strict=True) if hi > lo)

    def run(self, task: TaskSpec, decision: Decision, *,
            verify: bool = False) -> Result:
        """Run the decision on the workers; MEASURED times, medians of repeats."""
        check_devices(decision, self.machine)
        check_host_memory(task, verify, backend="cpu")
        w = workload(task)
        what = f"cpu backend: {task.describe()}"
        shared = place(w.total_work(task).footprint
                       * host_dtype(task.dtype).itemsize / task.itemsize, what)
        inputs = w.make_inputs(task, self.seed)
        bounds = split_rows(task.split_size, decision.shares)
        self.start()
        root = tempfile.mkdtemp(prefix=f"gpuhive-{os.getpid()}-", dir=shared)
        ok, err = None, None
        try:
            # each input moves to the memory shared with the workers: this
            # process keeps no copy of its own (the reference reads the same)
            descs = {}
            for name in list(inputs):
                descs[name] = self._to_shared(root, name, inputs.pop(name),
                                              f"{what}'s input {name}")
            active = [pos for pos, (lo, hi) in enumerate(bounds) if hi > lo]
            if task.merge == "concat":
                shape = w.output_shape(task, task.split_size)
            else:
                shape = (len(decision.gpus), *w.output_shape(task, 1))
            out_desc = (str(Path(root) / "out.bin"), w.output_dtype(task).str, shape)
            # its pages allocated now: a worker's first write maps a page
            # rather than allocating one, and cannot find the folder full
            allocate(out_desc[0], math.prod(shape) * w.output_dtype(task).itemsize,
                     f"{what}'s output")
            out = _open(out_desc, "r+")

            cpu_runs: list[dict[int, float]] = []
            overhead_runs: list[dict[int, float]] = []

            def once():
                start = time.perf_counter()
                last = len(cpu_runs) + 1 == self.warmup + self.repeats
                times, cpu, overhead = self._dispatch(task, decision, bounds,
                                                      active, descs, out_desc,
                                                      last)
                cpu_runs.append(cpu)
                overhead_runs.append(overhead)
                if task.merge == "sum":
                    merged = w.merge(task, [out[p] for p in active])
                # Concat shards already sit in place in the host buffer: the
                # copy out of the temporary mapping is not part of the run,
                # and only the last run's result is kept.
                elapsed = time.perf_counter() - start
                if task.merge == "concat":
                    merged = np.array(out) if last else None
                return merged, times, elapsed

            result, per_dev, totals = repeat_timed(once, self.warmup, self.repeats)
            if verify:
                ok, err = verify_in_blocks(task, result, inputs={
                    n: self._from_shared(d) for n, d in descs.items()})
        except BaseException:
            self._release()  # a run cut short: its last jobs never went out
            raise
        finally:
            shutil.rmtree(root, ignore_errors=True)
        timed_cpu = cpu_runs[self.warmup:]  # as repeat_timed: warm-ups first
        timed_overhead = overhead_runs[self.warmup:]
        metrics = ExecutionMetrics(
            backend="cpu", measured=True,
            per_device_seconds={g: statistics.median(v) for g, v in per_dev.items()},
            total_seconds=statistics.median(totals), verified=ok, max_abs_error=err,
            repeats=self.repeats,
            per_device_cpu_seconds={g: statistics.median(c[g] for c in timed_cpu)
                                    for g in per_dev},
            per_device_overhead_seconds={
                g: statistics.median(o[g] for o in timed_overhead)
                for g in per_dev})
        return Result(output=result, metrics=metrics, task=task, decision=decision,
                      detail={"all_totals": totals, "buffers": shared,
                              "notes": [] if shared == shm_root() else [
                                  f"its buffers lay in {shared}: {shm_root()} had "
                                  "no room for them"]})

    @staticmethod
    def _to_shared(root: str, name: str, arr: np.ndarray, what: str):
        path = str(Path(root) / f"{name}.bin")
        if arr.size:
            allocate(path, arr.nbytes, what)
            mm = np.memmap(path, dtype=arr.dtype, mode="r+", shape=arr.shape)
            mm[...] = arr
            mm.flush()
            del mm
        return (path, arr.dtype.str, arr.shape)

    @staticmethod
    def _from_shared(desc) -> np.ndarray:
        """The array :meth:`_to_shared` wrote, mapped copy-on-write (a
        reference that writes to its inputs changes no one else's)."""
        path, dtype, shape = desc
        if not math.prod(shape):
            return np.empty(shape, dtype=np.dtype(dtype))
        return np.memmap(path, dtype=np.dtype(dtype), mode="c", shape=shape)

    def _dispatch(self, task, decision, bounds, active, descs, out_desc,
                  last=False):
        """Send one job per active shard and wait for all; return each device's
        seconds on its shard, the CPU seconds its worker spent on it and the
        seconds of the job's round trip that were not the worker's (from
        just before the job is sent to just after the result is read).

        A reply is taken by its job's id: a run cut short (Ctrl-C in a
        notebook, which the workers ignore) leaves the replies of the jobs it
        sent in the pipes, and read in order they would be taken as the next
        run's, its result read before its workers wrote it."""
        pending: dict[int, int] = {}
        ids: dict[int, int] = {}
        sent: dict[int, float] = {}
        task_json = task.to_json()
        kind = kind_payload(task)  # a registered kind travels with its jobs
        for pos in active:
            dev = decision.gpus[pos]
            lo, hi = bounds[pos]
            self._next_id += 1
            job = {"id": self._next_id, "task": task_json, "kind": kind,
                   "lo": lo, "hi": hi,
                   "pos": pos, "inputs": descs, "out": out_desc,
                   "fault": dev in self.fault_devices, "last": last}
            sent[dev] = time.perf_counter()
            ids[dev] = self._next_id
            try:
                self._conns[dev].send(job)
            except (OSError, BrokenPipeError):
                self._fail(task, decision, bounds, pos, "worker process is gone")
            pending[dev] = pos
        times: dict[int, float] = {}
        cpu: dict[int, float] = {}
        overhead: dict[int, float] = {}
        deadline = time.monotonic() + self.timeout
        while pending:
            ready = connection.wait([self._conns[d] for d in pending], timeout=0.2)
            for conn in ready:
                dev = self._conns.index(conn)
                pos = pending[dev]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self._fail(task, decision, bounds, pos, "worker process exited")
                if msg[1] != ids[dev]:  # a reply to a job of a run cut short
                    continue
                del pending[dev]
                if msg[0] != "ok":
                    self._fail(task, decision, bounds, pos, msg[2])
                times[dev], cpu[dev] = msg[3], msg[4]
                overhead[dev] = max(0.0, time.perf_counter() - sent[dev] - msg[3])
            for dev, pos in list(pending.items()):
                proc = self.workers[dev]
                if not proc.is_alive():
                    self._fail(task, decision, bounds, pos,
                               f"worker process exited with code {proc.exitcode}")
            if time.monotonic() > deadline:
                dev, pos = next(iter(pending.items()))
                self._fail(task, decision, bounds, pos,
                           f"no answer within {self.timeout:.0f} s")
        return times, cpu, overhead

    def _fail(self, task, decision, bounds, pos, reason):
        """Tear the pool down (its state is unknown) and raise DeviceError."""
        dev = decision.gpus[pos]
        self.close()
        raise DeviceError(dev, self.machine.devices[dev].label, pos, bounds[pos],
                          decision.config_hash, reason)

