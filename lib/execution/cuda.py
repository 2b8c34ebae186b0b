"""The cuda backend: CuPy on real GPUs, two streams per device.

For a Decision the backend:

1. gets each kernel's source from the code-gen plane (specialised to the
   decision, scanned by Gate 2a) and compiles it with NVRTC through
   ``cupy.RawModule``, with CuPy's kernel cache kept in memory
   (``CUPY_CACHE_IN_MEMORY=1``) so nothing on disk enters the trust path;
2. shards the inputs (:func:`lib.platform.workloads.split_rows`) and, per
   device, on its own two non-blocking streams, for each piece: stages the
   piece's rows in pinned host memory (host work), then queues the copy in, the
   launch(es) and the copy back between two CUDA events;
3. in ``pipelined`` mode cuts each shard into chunks that alternate between the
   two streams, so the copy of one chunk overlaps the compute of the other;
4. merges: ``concat`` gathers rows into the host result; ``sum`` adds partials
   on the host (``host``), on the first device after peer copies (``p2p``;
   peer access is enabled first wherever ``deviceCanAccessPeer`` allows), or
   with an NCCL all-reduce (``nccl``).

**Timings.** ``per_device_seconds[g]`` is device time: the union of the spans
between each piece's two events -- the start event is recorded after the
piece's host staging, so staging is not in it -- plus, for matmul, B's upload
and, for sums, the on-device add of a shard's partials. Time the device spent
waiting for the host is not counted. ``total_seconds`` is host wall clock from
dispatch to the merged result (staging, queuing, waiting, merging).
``Result.detail["pieces"]`` holds each span as ``(stream, start, end)`` in
seconds from the device's first event; ``detail["overlap"]`` says whether spans
on a device's two streams overlapped.

**Merge paths.** :class:`CudaMetrics` says which path ran (``merge_path``) and
what was asked (``merge_requested``). A sum asked for on ``nccl`` where NCCL
cannot run -- the library is missing, or shards share a device, which NCCL
allows one rank each -- runs as peer copies and ``merge_note`` says why: the
run is not refused (a decision stays runnable wherever some path exists), and
the result says what it measured. Each copy of a partial to the first device is
recorded with whether it had peer access (``peer_copies``).

**Devices.** Profile device ``g`` runs on CUDA ordinal ``device_map[g]``. For
the ``nvml`` profile (devices in NVML order) the map is made by PCI bus id
(:func:`map_by_bus_id`): CUDA numbers devices its own way (fastest first, after
``CUDA_VISIBLE_DEVICES``), so NVML index ``i`` is not CUDA device ``i`` in
general. Any other profile's devices are the GPUs CUDA sees in PCI bus order
(``nvidia-smi``'s numbering). A device CUDA does not see has no ordinal: the
agent does not decide for it, and a decision naming it fails with an
:class:`~lib.execution.base.ExecutionError`. Several profile devices may share
one ordinal (several shards on one physical GPU).

**Failures.** A device fault (:func:`is_device_fault`: out of memory, or a CUDA
error that is not a caller error) raises
:class:`~lib.execution.base.DeviceError` naming the device, the shard and the
decision hash -- or, with ``allow_replan=True``, re-plans once on the remaining
devices (shares renormalised, the new decision through Gate 1) and says so in
``Result.detail["replanned"]``. Before either, every device the run touched is
synchronised, and only then are its buffers released: CuPy's pinned pool hands a
freed block out again at once with no stream tracking, so a re-planned run
could otherwise stage into memory a queued copy still uses. Errors that are not
device faults -- kernel source and compile errors, argument types, launch
configurations -- raise ExecutionError and never re-plan: they would follow the
work to any device. Never a partial result marked complete.

:func:`lib.platform.cudastack.probe` reports, without raising, what this machine
lacks for CUDA.

Why one module: the backend is one object whose methods share the same CuPy
handles, shard bookkeeping and failure path (queue, synchronise, release); the
pure helpers beside it (launch plans, spans, bus-id mapping, fault
classification) exist for it alone and are tested without a GPU.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.execution.base import (
    BackendUnavailable,
    DeviceError,
    ExecutionError,
    ExecutionMetrics,
    Result,
    check_host_memory,
    repeat_timed,
    replan,
)
from lib.platform.cudastack import probe
from lib.platform.machines import Machine
from lib.platform.user_kinds import RegisteredKind
from lib.platform.workloads import (
    Arrays,
    host_dtype,
    round_bf16,
    split_rows,
    verify_in_blocks,
    workload,
)
from lib.security.gate1 import check_decision

try:  # the code-gen plane renders kernels with jinja2, which a bare GPU host may
    # lack; the backend still imports (a caller's source_provider then serves)
    from lib.codegen import CodeGenerator
    from lib.codegen.specialise import KIND_DTYPES

    CODEGEN_MISSING = ""
except ModuleNotFoundError as _missing:
    if _missing.name != "jinja2":
        raise
    CodeGenerator = None  # type: ignore[assignment,misc]
    KIND_DTYPES = None  # type: ignore[assignment]
    CODEGEN_MISSING = "the code-gen plane needs jinja2, which is not installed"

MATMUL_TILE = 16
#: 1-D grids are capped here; the kernels' grid-stride loops cover the rest.
MAX_BLOCKS = 4096
#: Largest grid extent in y on every CUDA GPU (cudaDeviceProp.maxGridSize[1]);
#: a matmul piece of more than MAX_GRID_Y * MATMUL_TILE rows is launched in row
#: blocks (:func:`launch_plan`).
MAX_GRID_Y = 65535

#: Names of CUDA runtime and driver errors that are the caller's, not the
#: device's: a bad launch, handle, image or argument fails the same on any
#: device, so it never triggers a re-plan (:func:`is_device_fault`).
CALLER_ERRORS = frozenset({
    "cudaErrorInvalidValue", "cudaErrorInvalidConfiguration",
    "cudaErrorInvalidDeviceFunction", "cudaErrorInvalidDevice",
    "cudaErrorInvalidPitchValue", "cudaErrorInvalidSymbol",
    "cudaErrorInvalidResourceHandle", "cudaErrorInvalidPtx",
    "cudaErrorInvalidKernelImage", "cudaErrorNoKernelImageForDevice",
    "cudaErrorSymbolNotFound", "cudaErrorNotSupported",
    "cudaErrorLaunchOutOfResources", "cudaErrorInvalidMemcpyDirection",
    "cudaErrorPeerAccessAlreadyEnabled", "cudaErrorPeerAccessNotEnabled",
    "cudaErrorPeerAccessUnsupported", "cudaErrorUnsupportedPtxVersion",
    "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_HANDLE",
    "CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_INVALID_PTX",
    "CUDA_ERROR_INVALID_SOURCE", "CUDA_ERROR_NO_BINARY_FOR_GPU",
    "CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_NOT_SUPPORTED",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
})

#: (task, decision) -> (source, kernel name, NVRTC options)
SourceProvider = Callable[[TaskSpec, Decision], tuple[str, str, tuple[str, ...]]]

Launch = tuple[int, int, tuple[int, ...], tuple[int, ...]]
"""One launch over part of a piece: (first row, rows, grid, block)."""


# --------------------------------------------------------------------------
# Pure helpers (tested without a GPU)

def entry_point(task: TaskSpec) -> str:
    """The kernel entry point for the task (``matmul_fp16``...).

    Raises:
        ExecutionError: the kernels have no entry point for the task's dtype.
    """
    w = workload(task)
    if isinstance(w, RegisteredKind):
        if task.dtype not in w.dtypes:
            raise ExecutionError(f"no {task.kind}_{task.dtype} kernel: the "
                                 f"registered kind {task.kind} runs in "
                                 f"{', '.join(w.dtypes)}")
        if task.dtype not in w.kernel_sources:
            raise ExecutionError(f"kind {task.kind} was registered without CUDA "
                                 "source: it runs on the cpu, dask and model "
                                 "backends")
        return f"{task.kind}_{task.dtype}"
    if KIND_DTYPES is not None and task.dtype not in KIND_DTYPES[task.kind]:
        raise ExecutionError(
            f"no {task.kind}_{task.dtype} kernel: {task.kind} runs in "
            f"{', '.join(KIND_DTYPES[task.kind])} on the cuda backend")
    return f"{task.kind}_{task.dtype}"


def launch_geometry(task: TaskSpec, rows: int, block: int) -> tuple[tuple[int, ...],
                                                                     tuple[int, ...]]:
    """``(grid, block)`` for one launch over ``rows`` rows of the task.

    matmul: a 2-D grid of TILE x TILE output tiles; stencil: one block per row of
    the band; the 1-D kernels: ``ceil(elements / block)`` blocks, capped at
    :data:`MAX_BLOCKS` (their grid-stride loops cover the rest). A matmul over
    more than ``MAX_GRID_Y * MATMUL_TILE`` rows needs :func:`launch_plan`.
    """
    if task.kind == "matmul":
        n = task.dims["N"]
        return ((math.ceil(n / MATMUL_TILE), math.ceil(rows / MATMUL_TILE), 1),
                (block, 1, 1))
    if task.kind == "stencil":
        return ((max(1, rows), 1, 1), (block, 1, 1))
    return ((max(1, min(MAX_BLOCKS, math.ceil(rows / block))), 1, 1), (block, 1, 1))


def launch_plan(task: TaskSpec, rows: int, block: int) -> list[Launch]:
    """The launches that cover a piece of ``rows`` rows, each within the grid
    limits: ``(first row, rows, grid, block)``.

    matmul: row blocks of at most :data:`MAX_GRID_Y` ``* MATMUL_TILE`` rows, each
    launched on its own offsets into A and C (the kernel reads ``blockIdx.y`` as
    a row tile and takes the row count as ``M``); every other kind: one launch
    (their grids are 1-D, limited at 2^31 - 1 blocks).
    """
    if task.kind != "matmul":
        return [(0, rows, *launch_geometry(task, rows, block))]
    step = MAX_GRID_Y * MATMUL_TILE
    plan = []
    for first in range(0, max(rows, 1), step):
        count = min(rows, first + step) - first
        plan.append((first, count, *launch_geometry(task, count, block)))
    return plan


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


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` spans (overlaps once)."""
    total, reached = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def overlapped(pieces: Sequence[tuple[int, float, float]]) -> bool:
    """Whether two ``(stream, start, end)`` spans on different streams overlap
    in time."""
    return any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
               for i, a in enumerate(pieces) for b in pieces[i + 1:])


_BUS_RE = re.compile(r"^([0-9a-f]{1,8}):([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")


def normalise_bus_id(bus_id: str | bytes) -> str:
    """A PCI bus id as ``"dddd:bb:dd.f"`` in lower case: NVML writes an 8-digit
    domain (``"00000000:17:00.0"``), CUDA a 4-digit one (``"0000:17:00.0"``).

    Raises:
        BackendUnavailable: not a PCI bus id.
    """
    text = (bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id))
    m = _BUS_RE.match(text.strip().rstrip("\x00").lower())
    if m is None:
        raise BackendUnavailable(f"cuda backend: {text!r} is not a PCI bus id")
    domain, bus, dev, fn = (int(v, 16) for v in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def map_by_bus_id(profile_bus_ids: Sequence[str | bytes],
                  cuda_bus_ids: Sequence[str | bytes]) -> dict[int, int]:
    """Profile device -> CUDA ordinal, matched by PCI bus id.

    Args:
        profile_bus_ids: NVML's bus id of each profile device, in profile order
            (``nvmlDeviceGetPciInfo(handle).busId`` by NVML index).
        cuda_bus_ids: ``cudaDeviceGetPCIBusId`` of each CUDA ordinal, in CUDA's
            numbering (after ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``).

    Returns:
        ``{profile index: ordinal}`` for every profile device CUDA sees; a device
        CUDA does not see (hidden by ``CUDA_VISIBLE_DEVICES``) has no entry.

    Raises:
        BackendUnavailable: a bus id is malformed or repeated (MIG instances
            share one), or a CUDA device is not among the profile's.
    """
    profile = [normalise_bus_id(b) for b in profile_bus_ids]
    cuda = [normalise_bus_id(b) for b in cuda_bus_ids]
    for what, ids in (("NVML", profile), ("CUDA", cuda)):
        repeated = sorted({b for b in ids if ids.count(b) > 1})
        if repeated:
            raise BackendUnavailable(f"cuda backend: {what} lists bus id(s) "
                                     f"{', '.join(repeated)} more than once; "
                                     "devices cannot be told apart")
    where = {b: i for i, b in enumerate(profile)}
    strays = [f"{o} ({b})" for o, b in enumerate(cuda) if b not in where]
    if strays:
        raise BackendUnavailable(f"cuda backend: CUDA device(s) {', '.join(strays)} "
                                 "are not among the NVML devices of the profile")
    return {where[b]: o for o, b in enumerate(cuda)}


def is_device_fault(exc: BaseException,
                    fault_types: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` is the device's fault, so that re-planning without the
    device may help: CuPy's out-of-memory, or a CUDA runtime/driver error
    (``fault_types``) whose name is not in :data:`CALLER_ERRORS`."""
    if not fault_types or not isinstance(exc, fault_types):
        return False
    if isinstance(exc, MemoryError):
        return True
    return str(exc).split(":", 1)[0].strip() not in CALLER_ERRORS


def _one_line(exc: BaseException, limit: int = 160) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


# --------------------------------------------------------------------------
# The backend

@dataclass(frozen=True)
class CudaMetrics(ExecutionMetrics):
    """:class:`~lib.execution.base.ExecutionMetrics` plus how the run merged.

    Attributes:
        merge_requested: the decision's ``comm_path``.
        merge_path: the path that ran: ``"host"`` (concat rows gathered, or
            partials added, on the host), ``"p2p"`` or ``"nccl"``.
        merge_note: why ``merge_path`` differs from ``merge_requested`` (empty
            when it does not).
        peer_copies: ``(source ordinal, destination ordinal, peer access)`` of
            each partial copied to the first device on the p2p path; without
            peer access the copy went through the host.
    """

    merge_requested: str = "host"
    merge_path: str = "host"
    merge_note: str = ""
    peer_copies: tuple[tuple[int, int, bool], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(merge_requested=self.merge_requested, merge_path=self.merge_path,
                   merge_note=self.merge_note,
                   peer_copies=[list(c) for c in self.peer_copies])
        return out


@dataclass(frozen=True)
class _Merge:
    path: str
    note: str = ""
    peer_copies: tuple[tuple[int, int, bool], ...] = ()


@dataclass(eq=False)
class _Shard:
    """One device's queued work: its streams, timing events, results, and the
    buffers that must outlive the streams (released only after they are
    synchronised)."""

    pos: int
    g: int
    ordinal: int
    lo: int
    hi: int
    streams: list[Any] = field(default_factory=list)
    spans: list[tuple[int, Any, Any]] = field(default_factory=list)
    pieces: list[tuple[int, float, float]] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)

    def release(self) -> None:
        self.keep.clear()
        self.outputs = []
        self.spans = []


class CudaBackend:
    """Runs decisions on CUDA devices through CuPy.

    Args:
        machine: the profile; device ``g`` is CUDA ordinal ``device_map[g]``.
        seed: seed of the inputs.
        repeats, warmup: timed and untimed runs (figures are medians).
        source_provider: where kernel source comes from; default the code-gen
            plane's template provider (Gate 2a on every source).
        allow_replan: re-plan once on the remaining devices when one faults.
        device_map: profile index -> CUDA ordinal; default by PCI bus id for the
            ``nvml`` profile; for any other, its devices are the GPUs CUDA
            sees in PCI bus order (:meth:`_bus_order_map`). Ordinals may repeat.

    Raises:
        BackendUnavailable: no usable CUDA, a non-GPU profile, or devices that
            cannot be mapped onto CUDA ordinals.
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
        os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")
        import cupy

        self.cp = cupy
        self.machine = machine
        if device_map is not None:
            self.device_map = dict(device_map)
        elif machine.name == "nvml":
            self.device_map = self._nvml_map(found.devices)
        else:
            self.device_map = self._bus_order_map(found.devices)
        stray = sorted({o for o in self.device_map.values()
                        if not 0 <= o < found.devices})
        if stray or len(self.device_map) < min(machine.n, 1):
            raise BackendUnavailable(
                f"cuda backend: profile {machine.name} names {machine.n} device(s) "
                f"but only {found.devices} CUDA device(s) are visible")
        self.seed = seed
        self.repeats = max(1, repeats)
        self.warmup = max(0, warmup)
        self.allow_replan = allow_replan
        self.nccl_ok = found.nccl
        self.nccl_reason = "; ".join(r for r in found.reasons if "NCCL" in r) \
            or "NCCL unavailable"
        self.source_provider = source_provider or default_source_provider
        self._modules: dict[tuple[int, str, str], Any] = {}
        self._comms: dict[tuple[int, ...], list[Any]] = {}
        self._peers: dict[tuple[int, int], bool] = {}
        self._used: set[int] = set()
        self._faults = self._fault_types()

    @property
    def runnable(self) -> tuple[int, ...]:
        """The profile devices this backend can run a shard on: those with a
        CUDA ordinal (a GPU ``CUDA_VISIBLE_DEVICES`` hides has none)."""
        return tuple(sorted(self.device_map))

    def _bus_order_map(self, cuda_count: int) -> dict[int, int]:
        """A profile's devices are the GPUs CUDA sees, in PCI bus order: the
        order ``nvidia-smi`` numbers them, which a profile written by hand
        follows. CUDA's own numbering puts the fastest card first (unless
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so on a computer of mixed cards
        ordinal ``i`` is not the profile's device ``i``. Identity where the
        bus ids cannot be read, or the profile names more devices than CUDA
        sees (which the constructor then refuses)."""
        identity = {i: i for i in range(self.machine.n)}
        if self.machine.n > cuda_count:
            return identity
        try:
            runtime = self.cp.cuda.runtime
            buses = [normalise_bus_id(runtime.deviceGetPCIBusId(o))
                     for o in range(cuda_count)]
        except Exception:
            return identity
        order = sorted(range(cuda_count), key=buses.__getitem__)
        return {i: order[i] for i in range(self.machine.n)}

    def _nvml_map(self, cuda_count: int) -> dict[int, int]:
        """The nvml profile's devices mapped by PCI bus id (see
        :func:`map_by_bus_id`)."""
        try:
            nvml = _nvml_bus_ids()
            runtime = self.cp.cuda.runtime
            cuda = [runtime.deviceGetPCIBusId(o) for o in range(cuda_count)]
        except Exception as exc:
            raise BackendUnavailable(f"cuda backend: cannot read PCI bus ids to map "
                                     f"NVML devices onto CUDA ({_one_line(exc)})"
                                     ) from None
        if len(nvml) != self.machine.n:
            raise BackendUnavailable(f"cuda backend: NVML now lists {len(nvml)} "
                                     f"device(s), the profile {self.machine.n}")
        return map_by_bus_id(nvml, cuda)

    def _fault_types(self) -> tuple[type[BaseException], ...]:
        """CuPy's out-of-memory, runtime and driver error classes."""
        cuda = self.cp.cuda
        found = []
        for owner, name in ((getattr(cuda, "memory", None), "OutOfMemoryError"),
                            (getattr(cuda, "runtime", None), "CUDARuntimeError"),
                            (getattr(cuda, "driver", None), "CUDADriverError")):
            kind = getattr(owner, name, None)
            if isinstance(kind, type) and issubclass(kind, BaseException):
                found.append(kind)
        return tuple(found)

    def close(self) -> None:
        """Free cached modules, NCCL communicators, and the memory pools of every
        device the backend used (a pool belongs to one device) and the pinned
        pool."""
        cp = self.cp
        self._modules.clear()
        for comms in self._comms.values():
            for comm in comms:
                comm.destroy()
        self._comms.clear()
        pool = cp.get_default_memory_pool()
        for ordinal in sorted(self._used):
            # memory.pyx MemoryPool.free_all_blocks frees device_pool() only:
            # the current device's.
            with cp.cuda.Device(ordinal):
                pool.free_all_blocks()
        self._used.clear()
        cp.get_default_pinned_memory_pool().free_all_blocks()

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

    def unrunnable_why(self, g: int) -> str:
        """Why device ``g`` has no CUDA ordinal (one line)."""
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (f"CUDA_VISIBLE_DEVICES={seen} hides it from CUDA" if seen is not None
                else "CUDA does not see it")

    def _ordinal(self, g: int) -> int:
        if g not in self.device_map:
            raise ExecutionError(f"device {self.machine.devices[g].label} has no "
                                 f"CUDA ordinal: {self.unrunnable_why(g)}")
        return self.device_map[g]

    # -- running -------------------------------------------------------------

    def run(self, task: TaskSpec, decision: Decision, *,
            verify: bool = False) -> Result:
        """Run the decision; MEASURED (CUDA events), medians over repeats."""
        entry_point(task)  # an unsupported dtype fails before any work
        check_host_memory(task, verify, backend="cuda")  # the host's side
        w = workload(task)
        inputs = w.make_inputs(task, self.seed)
        detail: dict[str, Any] = {}
        try:
            (result, merge, spans), per_dev, totals = self._timed(task, decision,
                                                                   inputs)
        except DeviceError as err:
            if not self.allow_replan:
                raise
            fallback = replan(decision, err.device).with_hash(task)
            verdict = check_decision(fallback, task, self.machine)
            if not verdict.accepted:
                raise ExecutionError(f"{err}; re-plan refused by "
                                     f"{verdict.summary()}") from err
            (result, merge, spans), per_dev, totals = self._timed(task, fallback,
                                                                   inputs)
            detail["replanned"] = {"failed_device": err.device, "reason": str(err),
                                   "decision": fallback.to_json()}
            decision = fallback
        ok, err_abs = None, None
        if verify:
            ok, err_abs = verify_in_blocks(task, result, inputs=inputs)
        metrics = CudaMetrics(
            backend="cuda", measured=True,
            per_device_seconds={g: statistics.median(v) for g, v in per_dev.items()},
            total_seconds=statistics.median(totals), verified=ok,
            max_abs_error=err_abs, repeats=self.repeats,
            merge_requested=decision.comm_path, merge_path=merge.path,
            merge_note=merge.note, peer_copies=merge.peer_copies)
        detail.update(
            all_totals=totals,
            device_map={g: self.device_map[g] for g in decision.gpus
                        if g in self.device_map},
            pieces={g: [list(p) for p in pieces] for g, pieces in spans.items()},
            overlap={g: overlapped(pieces) for g, pieces in spans.items()})
        return Result(output=result, metrics=metrics, task=task, decision=decision,
                      detail=detail)

    def _timed(self, task: TaskSpec, decision: Decision, inputs: Arrays):
        def once():
            start = time.perf_counter()
            result, times = self._once(task, decision, inputs)
            return result, times, time.perf_counter() - start

        return repeat_timed(once, self.warmup, self.repeats)

    def _once(self, task: TaskSpec, decision: Decision, inputs: Arrays):
        """One run: queue every shard, wait, merge.

        Returns:
            ``((result, merge, device -> spans), device -> busy seconds)``.
        """
        bounds = split_rows(task.split_size, decision.shares)
        shards: list[_Shard] = []
        try:
            for pos, (g, (lo, hi)) in enumerate(zip(decision.gpus, bounds,
                                                    strict=True)):
                if hi <= lo:
                    continue
                sh = _Shard(pos, g, self._ordinal(g), lo, hi)
                shards.append(sh)  # before queuing: a failure must wait for it
                try:
                    self._launch(task, decision, inputs, sh)
                except Exception as exc:
                    raise self._failure(decision, bounds, pos, exc) from None
            times: dict[int, float] = {}
            for sh in shards:
                try:
                    times[sh.g] = self._wait(sh)
                except Exception as exc:
                    raise self._failure(decision, bounds, sh.pos, exc) from None
            result, merge = self._merge(task, decision, shards)
            return (result, merge, {sh.g: sh.pieces for sh in shards}), times
        except BaseException:
            self._drain(shards)
            raise
        finally:
            for sh in shards:  # after every wait: the pools may have them now
                sh.release()

    def _drain(self, shards: list[_Shard]) -> None:
        """Wait for everything queued on the shards' devices (the failure path:
        nothing may go back to a pool while a queued copy or kernel uses it)."""
        for ordinal in dict.fromkeys(sh.ordinal for sh in shards):
            try:
                self.cp.cuda.Device(ordinal).synchronize()
            except Exception:  # a faulted device reports its error again; its
                pass           # queued work is dead and there is nothing to wait

    def _launch(self, task: TaskSpec, decision: Decision, inputs: Arrays,
                sh: _Shard) -> None:
        """Queue one shard on its device: per piece, host staging first, then
        copies and kernels between two timing events; for sums, the device-side
        sum of the shard's pieces."""
        cp = self.cp
        w = workload(task)
        with cp.cuda.Device(sh.ordinal):
            self._used.add(sh.ordinal)
            kernel = self._kernel(sh.ordinal, task, decision)
            sh.streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
            first = sh.streams[0]
            fixed: dict[str, Any] = {}
            ready = None
            if task.kind == "matmul":  # B goes to the device once, first
                b_host = w.shard_inputs(task, inputs, sh.lo, sh.hi)["B"]
                staged = _stage(cp, b_host, task.dtype, sh.keep)
                start = self._event(first)
                with first:
                    fixed["B"] = _upload(cp, staged, first)
                ready = self._event(first)
                sh.spans.append((0, start, ready))
                # Both streams read B: it stays referenced until both are
                # synchronised, or its block could be handed out again.
                sh.keep.append(fixed["B"])
            pieces = (chunk_bounds(sh.lo, sh.hi, decision.chunk)
                      if decision.mode == "pipelined" and task.kind != "stencil"
                      else [(sh.lo, sh.hi)])
            outputs = []
            for c, (a, b) in enumerate(pieces):
                s = sh.streams[c % 2]
                if c % 2 and ready is not None:
                    s.wait_event(ready)
                staged_piece = self._stage_piece(task, inputs, a, b, sh.keep)
                start = self._event(s)  # after staging: device time only
                outputs.append(self._piece(task, kernel, staged_piece, fixed, a, b,
                                           decision.block, s))
                sh.spans.append((c % 2, start, self._event(s)))
            if len(pieces) > 1:
                first.wait_event(self._event(sh.streams[1]))
            if task.merge == "sum":  # one partial per device, on the device
                # Partials made on the second stream are read on the first.
                sh.keep.extend(outputs)
                if len(outputs) > 1:
                    start = self._event(first)
                    with first:
                        acc = outputs[0]
                        for extra in outputs[1:]:
                            acc = acc + extra
                    sh.spans.append((0, start, self._event(first)))
                    outputs = [acc]
            sh.outputs = outputs

    def _event(self, stream: Any) -> Any:
        event = self.cp.cuda.Event()
        event.record(stream)
        return event

    def _stage_piece(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int,
                     keep: list) -> dict[str, np.ndarray]:
        """Host work for one piece: its inputs in pinned memory in the kernel's
        layout, and the pinned buffer its rows come back into (concat)."""
        cp = self.cp
        w = workload(task)
        piece = w.shard_inputs(task, inputs, lo, hi)
        rows = hi - lo
        if isinstance(w, RegisteredKind):
            staged = {k: _stage(cp, v, _layout(v, task), keep)
                      for k, v in piece.items()}
            if task.merge == "concat":  # rows come back in the kernel's layout
                od = w.output_dtype(task)
                layout = np.uint16 if task.dtype == "bf16" and od == host_dtype(
                    "bf16") else od
                staged["out"] = _pinned(cp, w.output_shape(task, rows), layout, keep)
            return staged
        if task.kind == "matmul":
            a = _stage(cp, piece["A"], task.dtype, keep)
            return {"A": a, "out": _pinned(cp, (rows, task.dims["N"]), a.dtype, keep)}
        if task.kind == "elementwise":
            x = _stage(cp, piece["x"], task.dtype, keep)
            return {"x": x, "y": _stage(cp, piece["y"], task.dtype, keep),
                    "out": _pinned(cp, x.shape, x.dtype, keep)}
        if task.kind == "reduce":
            return {"x": _stage(cp, piece["x"], task.dtype, keep)}
        if task.kind == "histogram":
            return {"x": _stage(cp, piece["x"].astype(np.float32), "fp32", keep)}
        u = _stage(cp, piece["u"], task.dtype, keep)
        return {"u": u, "out": _pinned(cp, (rows, u.shape[1]), u.dtype, keep)}

    def _piece(self, task, kernel, staged, fixed, lo, hi, block, stream):
        """Queue one staged piece on ``stream``: copy in, launch, copy back.

        Returns the pinned host array its rows are being copied into (concat
        merges) or its partial result on the device (sum merges).
        """
        cp = self.cp
        rows = hi - lo
        w = workload(task)
        with stream:
            if isinstance(w, RegisteredKind):
                return self._registered_piece(task, w, kernel, staged, rows, block,
                                              stream)
            if task.kind == "matmul":
                a = _upload(cp, staged["A"], stream)
                n, k = task.dims["N"], task.dims["K"]
                c = cp.empty((rows, n), dtype=a.dtype)
                for first, count, grid, blk in launch_plan(task, rows, block):
                    part = slice(first, first + count)
                    kernel(grid, blk, (a[part], fixed["B"], c[part], np.int32(count),
                                       np.int32(n), np.int32(k)), stream=stream)
                return _to_host(c, stream, staged["out"])
            grid, blk = launch_geometry(task, rows, block)
            if task.kind == "elementwise":
                x = _upload(cp, staged["x"], stream)
                y = _upload(cp, staged["y"], stream)
                out = cp.empty_like(x)
                kernel(grid, blk, (np.float32(2.5), x, y, out, np.int64(rows)),
                       stream=stream)
                return _to_host(out, stream, staged["out"])
            if task.kind == "reduce":
                x = _upload(cp, staged["x"], stream)
                partial = cp.zeros(grid[0], dtype=cp.float32)
                kernel(grid, blk, (x, partial, np.int64(rows)), stream=stream)
                return partial.sum(dtype=cp.float64).reshape(1)
            if task.kind == "histogram":
                x = _upload(cp, staged["x"], stream)
                bins = task.dims["B"]
                counts = cp.zeros(bins, dtype=cp.uint32)
                kernel(grid, blk, (x, counts, np.int64(rows), np.int32(bins)),
                       stream=stream)
                return counts.astype(cp.int64)
            # stencil: T sweeps over the band, ping-pong between two buffers
            u = _upload(cp, staged["u"], stream)
            band_rows, width = staged["u"].shape
            v = u.copy()
            g2, b2 = launch_geometry(task, band_rows, block)
            for _ in range(task.dims["T"]):
                kernel(g2, b2, (u, v, np.int32(band_rows), np.int32(width)),
                       stream=stream)
                u, v = v, u
            first = lo - max(0, lo - task.dims["T"])
            return _to_host(cp.ascontiguousarray(u[first:first + rows]), stream,
                            staged["out"])

    def _registered_piece(self, task, w, kernel, staged, rows, block, stream):
        """A registered kind's piece: its inputs in the order ``inputs``
        returned them, the output, then ``long long`` rows and every
        dimension in the kind's order; a 1-D grid of ``ceil(rows / block)``
        blocks (capped; the kernel loops over the rest). A ``sum`` kind's
        output starts at zero and the kernel adds into it."""
        cp = self.cp
        args = [_upload(cp, arr, stream) for name, arr in staged.items()
                if name != "out"]
        if task.merge == "concat":
            out = cp.empty(staged["out"].shape, dtype=staged["out"].dtype)
        else:
            out = cp.zeros(w.output_shape(task, rows), dtype=w.output_dtype(task))
        grid, blk = launch_geometry(task, rows, block)
        kernel(grid, blk, (*args, out, np.int64(rows),
                           *(np.int64(v) for v in task.dims.values())),
               stream=stream)
        if task.merge == "concat":
            return _to_host(out, stream, staged["out"])
        return out

    def _wait(self, sh: _Shard) -> float:
        """Wait for the shard's streams; its busy seconds (spans resolved)."""
        cp = self.cp
        for s in sh.streams:
            s.synchronize()
        ref = sh.spans[0][1]
        sh.pieces = [(k, cp.cuda.get_elapsed_time(ref, a) / 1e3,
                      cp.cuda.get_elapsed_time(ref, b) / 1e3) for k, a, b in sh.spans]
        return busy_seconds((a, b) for _, a, b in sh.pieces)

    def _failure(self, decision: Decision, bounds, pos: int,
                 exc: Exception) -> ExecutionError:
        """The error to raise for ``exc`` on shard ``pos``: a DeviceError for a
        device fault (re-plannable), an ExecutionError for anything else."""
        if isinstance(exc, ExecutionError):
            return exc
        g = decision.gpus[pos]
        label = self.machine.devices[g].label
        if is_device_fault(exc, self._faults):
            kind = "out of memory" if isinstance(exc, MemoryError) else "device fault"
            return DeviceError(g, label, pos, bounds[pos], decision.config_hash,
                               f"{kind}: {_one_line(exc)}")
        lo, hi = bounds[pos]
        return ExecutionError(
            f"shard {pos} (rows {lo}:{hi}) of decision "
            f"{decision.config_hash[:12] or '(unhashed)'} on device {label} failed, "
            f"not a device fault so no re-plan: {_one_line(exc)}")

    # -- merging ---------------------------------------------------------------

    def _merge(self, task: TaskSpec, decision: Decision,
               shards: list[_Shard]) -> tuple[np.ndarray, _Merge]:
        w = workload(task)
        if task.merge == "concat":
            out = np.empty(w.output_shape(task, task.split_size),
                           dtype=w.output_dtype(task))
            for sh in shards:
                rows = np.concatenate(sh.outputs) if len(sh.outputs) > 1 \
                    else sh.outputs[0]
                out[sh.lo:sh.hi] = from_device_dtype(rows, task.dtype)
            note = ("" if decision.comm_path == "host"
                    else "concatenated rows are gathered on the host")
            return out, _Merge("host", note)
        try:
            total, merge = self._merge_sum(decision, shards)
        except Exception as exc:
            raise ExecutionError(f"{decision.comm_path} merge of decision "
                                 f"{decision.config_hash[:12]} failed: "
                                 f"{_one_line(exc)}") from None
        return np.asarray(total).astype(w.output_dtype(task)), merge

    def _merge_sum(self, decision: Decision, shards: list[_Shard]):
        """Add the per-device partials; ``(host total, what ran)``."""
        cp = self.cp
        partials = [sh.outputs[0] for sh in shards]
        asked = decision.comm_path
        if asked == "host" or len(shards) == 1:
            note = "" if asked == "host" else "one shard: nothing to add on a device"
            return np.sum([cp.asnumpy(p) for p in partials], axis=0), \
                _Merge("host", note)
        ordinals = [sh.ordinal for sh in shards]
        note = ""
        if asked == "nccl":
            if not self.nccl_ok:
                note = f"nccl asked for, peer copies ran: {self.nccl_reason}"
            elif len(set(ordinals)) < len(ordinals):
                note = ("nccl asked for, peer copies ran: shards share a device "
                        "and NCCL takes one rank per device")
            else:
                return self._nccl_allreduce(partials, ordinals), _Merge("nccl")
        total, copies = self._peer_sum(partials, ordinals)
        return total, _Merge("p2p", note, copies)

    def _peer_access(self, lead: int, other: int) -> bool:
        """Whether ``lead`` can read ``other``'s memory directly, enabling the
        access the first time (cached per pair)."""
        key = (lead, other)
        if key not in self._peers:
            runtime = self.cp.cuda.runtime
            can = bool(runtime.deviceCanAccessPeer(lead, other))
            if can:
                with self.cp.cuda.Device(lead):
                    try:
                        runtime.deviceEnablePeerAccess(other)
                    except runtime.CUDARuntimeError as exc:
                        # runtime.pyx _deviceEnsurePeerAccess: already enabled is
                        # success (check_status has cleared the error state).
                        if getattr(exc, "status", None) != \
                                runtime.errorPeerAccessAlreadyEnabled:
                            raise
            self._peers[key] = can
        return self._peers[key]

    def _peer_sum(self, partials, ordinals):
        """Partials copied to the first device (peer to peer with access
        enabled, else through the host; a partial already there is added in
        place), added there, one copy out."""
        cp = self.cp
        lead = ordinals[0]
        copies: list[tuple[int, int, bool]] = []
        with cp.cuda.Device(lead):
            acc = partials[0].copy()
            for arr, o in zip(partials[1:], ordinals[1:], strict=True):
                if o == lead:
                    acc += arr
                    continue
                if self._peer_access(lead, o):
                    tmp = cp.empty_like(arr)
                    cp.cuda.runtime.memcpyPeer(tmp.data.ptr, lead, arr.data.ptr, o,
                                               arr.nbytes)
                    copies.append((o, lead, True))
                else:
                    tmp = cp.asarray(cp.asnumpy(arr))
                    copies.append((o, lead, False))
                acc += tmp
            return cp.asnumpy(acc), tuple(copies)

    def _nccl_allreduce(self, partials, ordinals):
        """NCCL ring all-reduce of the partials in place; the first device's copy
        comes back to the host."""
        # cupy.cuda offers no ``nccl`` attribute until the submodule is imported
        # (cupy/cuda/__init__.py __getattr__), so it is imported here.
        from cupy.cuda import nccl

        cp = self.cp
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


def _pinned(cp, shape: tuple[int, ...], dtype: np.dtype, keep: list) -> np.ndarray:
    """A pinned host array (kept in ``keep`` until the streams are waited for)."""
    count = int(np.prod(shape, dtype=np.int64))
    buf = cp.cuda.alloc_pinned_memory(max(1, count * np.dtype(dtype).itemsize))
    out = np.frombuffer(buf, dtype, count).reshape(shape)
    keep.append(out)
    return out


def _layout(arr: np.ndarray, task: TaskSpec) -> str:
    """The dtype name to stage ``arr`` as: the task's for an array of the
    task's host dtype (so bf16 goes as 16-bit words), ``"fp32"`` (meaning: as
    it is) for any other array, such as integer indices."""
    return task.dtype if arr.dtype == host_dtype(task.dtype) else "fp32"


def _stage(cp, host: np.ndarray, dtype: str, keep: list) -> np.ndarray:
    """``host`` in the kernel's layout, copied into pinned memory (host work)."""
    data = np.ascontiguousarray(to_device_dtype(host, dtype))
    staged = _pinned(cp, data.shape, data.dtype, keep)
    staged[...] = data
    return staged


def _upload(cp, staged: np.ndarray, stream) -> Any:
    """An asynchronous copy of a pinned array to a new device array on
    ``stream`` (allocated in that stream's pool arena)."""
    dev = cp.empty(staged.shape, dtype=staged.dtype)
    dev.set(staged, stream=stream)
    return dev


def _to_host(dev, stream, out: np.ndarray) -> np.ndarray:
    """An asynchronous copy into the pinned ``out`` (valid after the stream
    synchronises)."""
    dev.get(stream=stream, out=out, blocking=False)
    return out


def _nvml_bus_ids() -> list[str]:
    """NVML's PCI bus id of each device, by NVML index."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId
                for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


_GENERATOR: Any = None


def default_source_provider(task: TaskSpec, decision: Decision):
    """Kernel source from the code-gen plane's template provider: specialised to
    the decision, through Gate 2a, sealed in the cache (Gate 2b on every hit).

    Returns:
        ``(source, kernel name, options)``; architecture flags are left to
        ``cupy.RawModule``, which targets the current device.

    Raises:
        ExecutionError: the code-gen plane cannot be imported here.
    """
    global _GENERATOR
    w = workload(task)
    if isinstance(w, RegisteredKind):  # Gate 2a passed it at registration
        return w.kernel_sources[task.dtype], entry_point(task), ()
    if CodeGenerator is None:
        raise ExecutionError(f"no kernel source: {CODEGEN_MISSING}; pass a "
                             "source_provider")
    if _GENERATOR is None:
        _GENERATOR = CodeGenerator(measure_resources=False)
    kernel = _GENERATOR.generate(task, decision, provider="template")
    options = tuple(o for o in kernel.options if "arch" not in o)
    return kernel.source, kernel.kernel_name, options
