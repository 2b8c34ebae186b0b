"""The cuda backend: CuPy on real GPUs, one stream per device.

For a Decision the backend:

1. gets each kernel's source from the code-gen plane (specialised to the
   decision, scanned by Gate 2a) and compiles it with NVRTC through
   ``cupy.RawModule``, with CuPy's kernel cache kept in memory
   (``CUPY_CACHE_IN_MEMORY=1``) so nothing on disk enters the trust path;
2. shards the inputs (:func:`lib.platform.workloads.split_rows`) and, per device, on its
   own non-blocking stream: copies the shard from pinned host memory, launches
   the kernel, copies the result back, timing the three with CUDA events;
3. in ``pipelined`` mode cuts each shard into chunks that alternate between two
   streams, so the copy of one chunk overlaps the compute of the other;
4. merges on the decision's comm path: ``concat`` gathers rows into the host
   result; ``sum`` adds partials on the host (``host``), on the first device
   after peer copies (``p2p``, where ``deviceCanAccessPeer`` allows), or with an
   NCCL all-reduce (``nccl``).

Out-of-memory or a device error on one device raises
:class:`~lib.execution.base.DeviceError` naming the device, the shard and the
decision hash -- or, with ``allow_replan=True``, re-plans once on the remaining
devices (shares renormalised, the new decision through Gate 1) and says so in
``Result.detail["replanned"]``. Never a partial result marked complete.

:func:`lib.platform.cudastack.probe` reports, without raising, what this machine lacks
for CUDA.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lib.codegen import CodeGenerator
from lib.codegen.specialise import KIND_DTYPES
from lib.contract import Decision, TaskSpec
from lib.execution.base import (
    BackendUnavailable,
    DeviceError,
    ExecutionError,
    ExecutionMetrics,
    Result,
    repeat_timed,
)
from lib.platform.cudastack import probe
from lib.platform.machines import Machine
from lib.platform.workloads import Arrays, round_bf16, split_rows, workload
from lib.platform.workloads import verify as verify_output
from lib.security.gate1 import check_decision

MATMUL_TILE = 16
#: 1-D grids are capped here; the kernels' grid-stride loops cover the rest.
MAX_BLOCKS = 4096

#: (task, decision) -> (source, kernel name, NVRTC options)
SourceProvider = Callable[[TaskSpec, Decision], tuple[str, str, tuple[str, ...]]]


# --------------------------------------------------------------------------
# Pure helpers (tested without a GPU)

def entry_point(task: TaskSpec) -> str:
    """The kernel entry point for the task (``matmul_fp16``...).

    Raises:
        ExecutionError: the kernels have no entry point for the task's dtype.
    """
    if task.dtype not in KIND_DTYPES[task.kind]:
        raise ExecutionError(
            f"no {task.kind}_{task.dtype} kernel: {task.kind} runs in "
            f"{', '.join(KIND_DTYPES[task.kind])} on the cuda backend")
    return f"{task.kind}_{task.dtype}"


def launch_geometry(task: TaskSpec, rows: int, block: int) -> tuple[tuple[int, ...],
                                                                     tuple[int, ...]]:
    """``(grid, block)`` for one launch over ``rows`` rows of the task.

    matmul: a 2-D grid of TILE x TILE output tiles; stencil: one block per row of
    the band; the 1-D kernels: ``ceil(elements / block)`` blocks, capped at
    :data:`MAX_BLOCKS` (their grid-stride loops cover the rest).
    """
    if task.kind == "matmul":
        n = task.dims["N"]
        return ((math.ceil(n / MATMUL_TILE), math.ceil(rows / MATMUL_TILE), 1),
                (block, 1, 1))
    if task.kind == "stencil":
        return ((max(1, rows), 1, 1), (block, 1, 1))
    return ((max(1, min(MAX_BLOCKS, math.ceil(rows / block))), 1, 1), (block, 1, 1))


def chunk_bounds(lo: int, hi: int, chunk: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into consecutive pieces of at most ``chunk`` rows."""
    chunk = max(1, chunk)
    return [(a, min(hi, a + chunk)) for a in range(lo, hi, chunk)]


def to_device_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Host array in the layout the kernel reads (bf16 as raw 16-bit words)."""
    if dtype == "bf16":
        return (round_bf16(x.astype(np.float32)).view(np.uint32)
                >> np.uint32(16)).astype(np.uint16)
    return x


def from_device_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Inverse of :func:`to_device_dtype` (bf16 words back to float32)."""
    if dtype == "bf16" and x.dtype == np.uint16:
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x


def replan(decision: Decision, failed: int) -> Decision:
    """The decision without device ``failed``, shares renormalised (unhashed)."""
    keep = [(g, s) for g, s in zip(decision.gpus, decision.shares, strict=True)
            if g != failed and s > 0]
    if not keep:
        raise ExecutionError(f"no device left after device {failed} failed")
    total = math.fsum(s for _, s in keep)
    shares = [s / total for _, s in keep]
    shares[-1] = 1.0 - math.fsum(shares[:-1])
    mode = "single" if len(keep) == 1 and decision.mode == "split" else decision.mode
    path = decision.comm_path if len(keep) > 1 else "host"
    return replace(decision, gpus=tuple(g for g, _ in keep), shares=tuple(shares),
                   mode=mode, comm_path=path, config_hash="")


# --------------------------------------------------------------------------
# The backend

class CudaBackend:
    """Runs decisions on CUDA devices through CuPy.

    Args:
        machine: the profile; device ``i`` is CUDA ordinal
            ``device_map[i]`` (default ``i``).
        seed: seed of the inputs.
        repeats, warmup: timed and untimed runs (figures are medians).
        source_provider: where kernel source comes from; default the code-gen
            plane's template provider (Gate 2a on every source).
        allow_replan: re-plan once on the remaining devices when one fails.
        device_map: profile index -> CUDA ordinal.
    """

    name = "cuda"
    measured = True

    def __init__(self, machine: Machine, seed: int = 0, repeats: int = 1,
                 warmup: int = 1, source_provider: SourceProvider | None = None,
                 allow_replan: bool = False,
                 device_map: dict[int, int] | None = None):
        found = probe()
        if not found.usable:
            raise BackendUnavailable("cuda backend unavailable: "
                                     + "; ".join(found.reasons))
        if any(d.kind != "gpu" for d in machine.devices):
            raise BackendUnavailable(f"cuda backend: machine {machine.name} has "
                                     "non-GPU devices; use --machine nvml")
        self.device_map = device_map or {i: i for i in range(machine.n)}
        missing = [i for i, o in self.device_map.items() if o >= found.devices]
        if missing:
            raise BackendUnavailable(
                f"cuda backend: profile {machine.name} names {machine.n} device(s) "
                f"but only {found.devices} CUDA device(s) are visible")
        os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")
        import cupy

        self.cp = cupy
        self.machine = machine
        self.seed = seed
        self.repeats = max(1, repeats)
        self.warmup = max(0, warmup)
        self.allow_replan = allow_replan
        self.nccl_ok = found.nccl
        self.source_provider = source_provider or default_source_provider
        self._modules: dict[tuple[int, str, str], Any] = {}
        self._comms: dict[tuple[int, ...], list[Any]] = {}

    def close(self) -> None:
        """Free cached modules, NCCL communicators and the memory pools."""
        self._modules.clear()
        for comms in self._comms.values():
            for comm in comms:
                comm.destroy()
        self._comms.clear()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()

    def __enter__(self) -> CudaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- kernels -------------------------------------------------------------

    def _kernel(self, ordinal: int, task: TaskSpec, decision: Decision):
        source, name, options = self.source_provider(task, decision)
        key = (ordinal, name, source)
        if key not in self._modules:
            with self.cp.cuda.Device(ordinal):
                module = self.cp.RawModule(code=source, options=tuple(options),
                                           backend="nvrtc")
                self._modules[key] = module.get_function(name)
        return self._modules[key]

    # -- running -------------------------------------------------------------

    def run(self, task: TaskSpec, decision: Decision, *,
            verify: bool = False) -> Result:
        """Run the decision; MEASURED (CUDA events), medians over repeats."""
        entry_point(task)  # an unsupported dtype fails before any work
        w = workload(task)
        inputs = w.make_inputs(task, self.seed)
        try:
            result, per_dev, totals = self._timed(task, decision, inputs)
            detail: dict[str, Any] = {"all_totals": totals}
        except DeviceError as err:
            if not self.allow_replan:
                raise
            fallback = replan(decision, err.device).with_hash(task)
            verdict = check_decision(fallback, task, self.machine)
            if not verdict.accepted:
                raise ExecutionError(f"{err}; re-plan refused by "
                                     f"{verdict.summary()}") from err
            result, per_dev, totals = self._timed(task, fallback, inputs)
            detail = {"all_totals": totals, "replanned": {
                "failed_device": err.device, "reason": str(err),
                "decision": fallback.to_json()}}
            decision = fallback
        ok, err_abs = None, None
        if verify:
            ok, err_abs = verify_output(task, result, w.reference(task, inputs))
        metrics = ExecutionMetrics(
            backend="cuda", measured=True,
            per_device_seconds={g: statistics.median(v) for g, v in per_dev.items()},
            total_seconds=statistics.median(totals), verified=ok,
            max_abs_error=err_abs, repeats=self.repeats)
        return Result(output=result, metrics=metrics, task=task, decision=decision,
                      detail=detail)

    def _timed(self, task: TaskSpec, decision: Decision, inputs: Arrays):
        def once():
            start = time.perf_counter()
            result, times = self._once(task, decision, inputs)
            return result, times, time.perf_counter() - start

        return repeat_timed(once, self.warmup, self.repeats)

    def _once(self, task: TaskSpec, decision: Decision, inputs: Arrays):
        """One run: queue every shard, wait, merge. Returns (result, times)."""
        cp = self.cp
        w = workload(task)
        bounds = split_rows(task.split_size, decision.shares)
        shards: list[_Shard] = []
        for pos, (g, (lo, hi)) in enumerate(zip(decision.gpus, bounds, strict=True)):
            if hi <= lo:
                continue
            try:
                shards.append(self._launch(task, decision, inputs, pos, g, lo, hi))
            except Exception as exc:
                raise self._device_error(decision, bounds, pos, exc) from None
        times: dict[int, float] = {}
        for sh in shards:
            try:
                sh.stream.synchronize()
                times[sh.g] = cp.cuda.get_elapsed_time(*sh.events) / 1e3
            except Exception as exc:
                raise self._device_error(decision, bounds, sh.pos, exc) from None
            sh.keep.clear()  # staging buffers may go back to the pool now
        if task.merge == "concat":
            out = np.empty(w.output_shape(task, task.split_size),
                           dtype=w.output_dtype(task))
            for sh in shards:
                rows = np.concatenate(sh.outputs) if len(sh.outputs) > 1 \
                    else sh.outputs[0]
                out[sh.lo:sh.hi] = from_device_dtype(rows, task.dtype)
            return out, times
        try:
            total = self._merge_sum(decision, shards)
        except Exception as exc:
            raise ExecutionError(f"{decision.comm_path} merge of decision "
                                 f"{decision.config_hash[:12]} failed: "
                                 f"{type(exc).__name__}: {exc!s:.160}") from None
        return np.asarray(total).astype(w.output_dtype(task)), times

    def _launch(self, task, decision, inputs, pos, g, lo, hi) -> _Shard:
        """Queue one shard on device ``g``: copies, kernels, and (for sum merges)
        the device-side sum of its pieces, between two timing events."""
        cp = self.cp
        w = workload(task)
        ordinal = self.device_map[g]
        with cp.cuda.Device(ordinal):
            kernel = self._kernel(ordinal, task, decision)
            streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
            start, stop, ready = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
            start.record(streams[0])
            keep: list[Any] = []
            fixed = {}
            if task.kind == "matmul":  # B goes to the device once, first
                b_host = w.shard_inputs(task, inputs, lo, hi)["B"]
                fixed["B"] = _to_device(cp, b_host, task.dtype, streams[0], keep)
            ready.record(streams[0])
            pieces = (chunk_bounds(lo, hi, decision.chunk)
                      if decision.mode == "pipelined" and task.kind != "stencil"
                      else [(lo, hi)])
            outputs = []
            for c, (a, b) in enumerate(pieces):
                s = streams[c % 2]
                if c % 2:
                    s.wait_event(ready)
                piece = w.shard_inputs(task, inputs, a, b)
                outputs.append(self._piece(task, kernel, piece, fixed, a, b,
                                           decision.block, s, keep))
            if len(pieces) > 1:
                joined = cp.cuda.Event()
                joined.record(streams[1])
                streams[0].wait_event(joined)
            if task.merge == "sum":  # one partial per device, on the device
                with streams[0]:
                    acc = outputs[0]
                    for extra in outputs[1:]:
                        acc = acc + extra
                outputs = [acc]
            stop.record(streams[0])
        return _Shard(pos, g, lo, hi, streams[0], (start, stop), outputs, keep)

    def _piece(self, task, kernel, piece, fixed, lo, hi, block, stream, keep):
        """Copy in and launch one piece on ``stream``.

        Returns the pinned host array its rows are being copied into (concat
        merges) or its partial result on the device (sum merges).
        """
        cp = self.cp
        rows = hi - lo
        grid, blk = launch_geometry(task, rows, block)
        with stream:
            if task.kind == "matmul":
                a = _to_device(cp, piece["A"], task.dtype, stream, keep)
                n, k = task.dims["N"], task.dims["K"]
                c = cp.empty((rows, n), dtype=a.dtype)
                kernel(grid, blk, (a, fixed["B"], c, np.int32(rows), np.int32(n),
                                   np.int32(k)), stream=stream)
                return _to_host(cp, c, stream)
            if task.kind == "elementwise":
                x = _to_device(cp, piece["x"], task.dtype, stream, keep)
                y = _to_device(cp, piece["y"], task.dtype, stream, keep)
                out = cp.empty_like(x)
                kernel(grid, blk, (np.float32(2.5), x, y, out, np.int64(rows)),
                       stream=stream)
                return _to_host(cp, out, stream)
            if task.kind == "reduce":
                x = _to_device(cp, piece["x"], task.dtype, stream, keep)
                partial = cp.zeros(grid[0], dtype=cp.float32)
                kernel(grid, blk, (x, partial, np.int64(rows)), stream=stream)
                return partial.sum(dtype=cp.float64).reshape(1)
            if task.kind == "histogram":
                x = _to_device(cp, piece["x"].astype(np.float32), "fp32", stream,
                               keep)
                bins = task.dims["B"]
                counts = cp.zeros(bins, dtype=cp.uint32)
                kernel(grid, blk, (x, counts, np.int64(rows), np.int32(bins)),
                       stream=stream)
                return counts.astype(cp.int64)
            # stencil: T sweeps over the band, ping-pong between two buffers
            u = _to_device(cp, piece["u"], task.dtype, stream, keep)
            band_rows, width = piece["u"].shape
            v = u.copy()
            g2, b2 = launch_geometry(task, band_rows, block)
            for _ in range(task.dims["T"]):
                kernel(g2, b2, (u, v, np.int32(band_rows), np.int32(width)),
                       stream=stream)
                u, v = v, u
            first = lo - max(0, lo - task.dims["T"])
            return _to_host(cp, cp.ascontiguousarray(u[first:first + rows]), stream)

    def _merge_sum(self, decision: Decision, shards: list[_Shard]):
        """Add the per-device partials on the decision's comm path."""
        cp = self.cp
        partials = [sh.outputs[0] for sh in shards]
        if decision.comm_path == "host" or len(shards) == 1:
            return np.sum([cp.asnumpy(p) for p in partials], axis=0)
        ordinals = [self.device_map[sh.g] for sh in shards]
        if decision.comm_path == "nccl" and self.nccl_ok:
            return self._nccl_allreduce(partials, ordinals)
        return self._peer_sum(partials, ordinals)

    def _peer_sum(self, partials, ordinals):
        """Peer copies to the first device (through the host where no peer
        access exists), added there, one copy out."""
        cp = self.cp
        lead = ordinals[0]
        with cp.cuda.Device(lead):
            acc = partials[0].copy()
            for arr, o in zip(partials[1:], ordinals[1:], strict=True):
                if cp.cuda.runtime.deviceCanAccessPeer(lead, o):
                    tmp = cp.empty_like(arr)
                    cp.cuda.runtime.memcpyPeer(tmp.data.ptr, lead, arr.data.ptr, o,
                                               arr.nbytes)
                else:
                    tmp = cp.asarray(cp.asnumpy(arr))
                acc += tmp
            return cp.asnumpy(acc)

    def _nccl_allreduce(self, partials, ordinals):
        """NCCL ring all-reduce of the partials in place; the first device's copy
        comes back to the host."""
        cp = self.cp
        nccl = cp.cuda.nccl
        kinds = {np.dtype(np.float64): nccl.NCCL_FLOAT64,
                 np.dtype(np.int64): nccl.NCCL_INT64}
        key = tuple(ordinals)
        if key not in self._comms:  # communicators are made once per device set
            self._comms[key] = nccl.NcclCommunicator.initAll(list(ordinals))
        comms = self._comms[key]
        nccl.groupStart()
        for comm, arr, o in zip(comms, partials, ordinals, strict=True):
            with cp.cuda.Device(o):
                comm.allReduce(arr.data.ptr, arr.data.ptr, arr.size,
                               kinds[arr.dtype], nccl.NCCL_SUM,
                               cp.cuda.Stream.null.ptr)
        nccl.groupEnd()
        for o in ordinals:
            with cp.cuda.Device(o):
                cp.cuda.Stream.null.synchronize()
        with cp.cuda.Device(ordinals[0]):
            return cp.asnumpy(partials[0])

    def _device_error(self, decision, bounds, pos, exc) -> DeviceError:
        g = decision.gpus[pos]
        kind = "out of memory" if "OutOfMemory" in type(exc).__name__ else "error"
        return DeviceError(g, self.machine.devices[g].label, pos, bounds[pos],
                           decision.config_hash,
                           f"{kind}: {type(exc).__name__}: {exc!s:.160}")


@dataclass
class _Shard:
    """One device's queued work: where its result is and what must stay alive."""

    pos: int
    g: int
    lo: int
    hi: int
    stream: Any
    events: tuple[Any, Any]
    outputs: list[Any]
    keep: list[Any]


def _to_device(cp, host: np.ndarray, dtype: str, stream, keep: list):
    """Pinned staging, then an asynchronous copy on ``stream``; the staging
    buffer is appended to ``keep`` so it outlives the copy."""
    data = np.ascontiguousarray(to_device_dtype(host, dtype))
    pinned = cp.cuda.alloc_pinned_memory(max(1, data.nbytes))
    staged = np.frombuffer(pinned, data.dtype, data.size).reshape(data.shape)
    staged[...] = data
    keep.append(pinned)
    dev = cp.empty(data.shape, dtype=data.dtype)
    dev.set(staged, stream=stream)
    return dev


def _to_host(cp, dev, stream) -> np.ndarray:
    """An asynchronous copy into pinned host memory (valid after the stream
    synchronises)."""
    pinned = cp.cuda.alloc_pinned_memory(max(1, dev.nbytes))
    out = np.frombuffer(pinned, dev.dtype, dev.size).reshape(dev.shape)
    dev.get(stream=stream, out=out, blocking=False)
    return out


_GENERATOR: Any = None


def default_source_provider(task: TaskSpec, decision: Decision):
    """Kernel source from the code-gen plane's template provider: specialised to
    the decision, through Gate 2a, sealed in the cache (Gate 2b on every hit).

    Returns:
        ``(source, kernel name, options)``; architecture flags are left to
        ``cupy.RawModule``, which targets the current device.
    """
    global _GENERATOR
    if _GENERATOR is None:
        _GENERATOR = CodeGenerator(measure_resources=False)
    kernel = _GENERATOR.generate(task, decision, provider="template")
    options = tuple(o for o in kernel.options if "arch" not in o)
    return kernel.source, kernel.kernel_name, options
