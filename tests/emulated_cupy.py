"""A CuPy stand-in whose kernels run on the CPU: a test double for the cuda backend.

:func:`make_cupy` builds an object that looks, to :mod:`lib.execution.cuda`, like
the ``cupy`` module on a machine with a few GPUs; :func:`install` puts it into
``sys.modules`` (as ``cupy``, ``cupy.cuda``, ``cupy.cuda.runtime`` and
``cupy.cuda.nccl``) for one test, so the backend's own code -- its probe, its
constructor, ``run`` -- runs unchanged against it. Only the part of CuPy that the
backend uses is there.

What is real and what is modelled:

* **Kernels are real.** ``RawModule`` builds the CUDA source it is given as host
  C++ with :mod:`lib.codegen.emulate` (one binary per source, comments aside,
  built once per session by :class:`KernelBuilds`), and a launch runs that binary
  with the launch's grid, block and arguments. Each launch is first checked
  against the kernel's signature: one argument per parameter, pointer element
  types (fp16 as ``float16``, bf16 as ``uint16`` words), scalar types
  (``np.int32`` for ``int``, ``np.int64`` for ``long long``, ``np.float32`` for
  ``float``), every array on the current device, the stream on that device.
* **Streams are queues.** Stream-ordered work -- copies, launches, array
  arithmetic, memsets, event records, NCCL collectives -- is queued on its stream
  (the current one where none is given) and runs only when the host waits for it
  (``synchronize`` of a stream, event or device, a blocking copy,
  ``memcpyPeer``), or when a stream that ``wait_event``-ed on it reaches the
  wait. Device memory and pinned buffers start as 0xFF bytes (NaN for floats, -1
  or the maximum for integers), so a result read before its stream was waited
  for, or computed from data another stream had not produced yet, comes out
  wrong and fails verification. Streams are non-blocking (they never wait for
  the null stream implicitly). Nothing runs concurrently: the double checks
  ordering and arithmetic, not overlap.
* **Copies follow CuPy 13 and later.** ``ndarray.get`` and ``asnumpy`` block the
  host by default (``blocking=True``), with or without a stream; ``set`` with a
  stream and ``asarray`` do not. A copy to or from pageable (not pinned) host
  memory blocks, as ``cudaMemcpyAsync`` does.
* **NCCL reduces.** ``allReduce`` calls between ``groupStart`` and ``groupEnd``
  form one collective that runs when every rank's stream has reached it; a
  collective over several ranks outside a group is refused (from one thread it
  would deadlock).
* **Races are found.** Every queued access to device memory is checked against
  the last write to (and the reads since of) the same allocation: it must be
  ordered after them by stream order, ``wait_event``, a host wait or a
  collective (vector clocks). An unordered pair is recorded in
  :attr:`Gpus.races`, whichever order the queues happen to run in.
* **Failures** are injected: allocations on the ordinals in ``fail_alloc`` raise
  :class:`OutOfMemoryError`.

:attr:`Gpus.log` records in host order each launch queued (``("launch", ordinal,
kernel, queue)``), each host wait (``("host_wait", ordinal, queue)``), each peer
copy and each all-reduce, so a test can check what ran where, and when the host
blocked.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.codegen import emulate

GARBAGE = 0xFF
"""The byte fresh device and pinned memory holds."""

MAX_THREADS = 1024
"""Threads per block a launch may have."""


class CUDARuntimeError(RuntimeError):
    """What the CUDA runtime reports (an invalid device, a launch refused...)."""


class OutOfMemoryError(MemoryError):
    """An allocation the device cannot serve (named as CuPy names it)."""


# ----------------------------------------------------------------------------
# Emulator binaries


def _code_only(source: str) -> str:
    """``source`` without its whole-line ``//`` comments (they cannot change
    what the compiler makes of it)."""
    return "\n".join(
        line for line in source.splitlines() if not line.lstrip().startswith("//")
    )


class KernelBuilds:
    """Emulator binaries, one per kernel source and set of defines, each built
    once (in a thread pool, so :meth:`prebuild` compiles in parallel).

    Args:
        out_dir: where sources and binaries are written.
        workers: compiler processes at a time; default the CPU count.
    """

    def __init__(self, out_dir: Path, workers: int | None = None):
        self.out_dir = Path(out_dir)
        self._pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2)
        self._lock = threading.Lock()
        self._builds: dict[str, Future[Path]] = {}

    def _future(self, source: str, defines: Mapping[str, int]) -> Future[Path]:
        key = hashlib.sha256(
            (_code_only(source) + repr(sorted(defines.items()))).encode()
        ).hexdigest()[:16]
        with self._lock:
            if key not in self._builds:
                path = self.out_dir / f"k{key}.cu"
                path.write_text(source)
                self._builds[key] = self._pool.submit(
                    emulate.build_emulated, path, self.out_dir, "plain", defines
                )
            return self._builds[key]

    def binary(self, source: str, defines: Mapping[str, int] | None = None) -> Path:
        """The emulator binary for ``source`` (built now unless already built)."""
        return self._future(source, defines or {}).result()

    def prebuild(self, sources: Iterable[str]) -> None:
        """Build every source, in parallel, before the tests need them."""
        for future in [self._future(s, {}) for s in sources]:
            future.result()

    @property
    def built(self) -> int:
        """Distinct binaries built or being built."""
        return len(self._builds)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its NumPy dtype, and for pointers whether const."""

    dtype: np.dtype
    pointer: bool
    const: bool


PARAM_DTYPES = {
    "float": np.float32, "double": np.float64, "__half": np.float16,
    "__nv_bfloat16": np.uint16, "unsigned int": np.uint32, "int": np.int32,
    "long long": np.int64,
}  # fmt: skip
"""C type of a kernel parameter -> the NumPy dtype the host passes for it."""

SCALARS: dict[np.dtype, Callable[[Any], emulate.Scalar]] = {
    np.dtype(np.float32): emulate.f32,
    np.dtype(np.float64): emulate.f64,
    np.dtype(np.int32): emulate.i32,
    np.dtype(np.int64): emulate.i64,
}


def kernel_params(source: str, name: str) -> list[Param]:
    """Parameters of the ``extern "C" __global__`` kernel ``name`` in ``source``.

    Raises:
        CUDARuntimeError: no such kernel (CUDA_ERROR_NOT_FOUND).
    """
    m = re.search(
        r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
        + re.escape(name)
        + r"\s*\(([^)]*)\)",
        source,
    )
    if m is None:
        raise CUDARuntimeError(f"CUDA_ERROR_NOT_FOUND: no kernel named {name}")
    params = []
    for raw in m.group(1).split(","):
        text = " ".join(raw.replace("__restrict__", " ").split())
        pointer = "*" in text
        const = text.startswith("const ")
        ctype = text.split("*")[0] if pointer else text.rsplit(" ", 1)[0]
        ctype = ctype.replace("const ", "").strip()
        params.append(Param(np.dtype(PARAM_DTYPES[ctype]), pointer, const))
    return params


# ----------------------------------------------------------------------------
# Devices, queues, memory


Clock = dict[int, int]
"""A vector clock: queue id -> the last position of that queue ordered before."""


def _merge(a: Clock, b: Clock) -> Clock:
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in a.keys() | b.keys()}


class _Queue:
    """One stream's work, in order; ``done`` ops of ``queued`` have run.

    ``clock`` is what the next op is ordered after; ``clocks[p]`` the clock of
    the op at position ``p``.
    """

    _ids = itertools.count(1)

    def __init__(self, ordinal: int, name: str):
        self.ordinal, self.name, self.id = ordinal, name, next(self._ids)
        self.ops: deque[Callable[[], None]] = deque()
        self.queued = self.done = 0
        self.clock: Clock = {}
        self.clocks: dict[int, Clock] = {0: {}}

    def put(self, op: Callable[[], None]) -> int:
        """Queue ``op``; its position (run it with ``run_until(position)``)."""
        self.ops.append(op)
        self.queued += 1
        return self.queued

    def run_until(self, position: int) -> None:
        while self.done < position:
            op = self.ops.popleft()
            self.done += 1
            op()


@dataclass
class _Alloc:
    """One device allocation: its fake address, its device and its bytes, and
    for race checks its last write and the reads since ((queue id, position),
    what)."""

    ptr: int
    ordinal: int
    buf: np.ndarray
    last_write: tuple[tuple[int, int], str] | None = None
    reads: list[tuple[tuple[int, int], str]] = field(default_factory=list)


class Gpus:
    """The state behind one stand-in: devices, queues, allocations, the log.

    Args:
        n: devices (ordinals ``0 .. n-1``).
        builds: where kernel binaries come from.
        peer_access: ``(a, b) -> bool`` for ``deviceCanAccessPeer``; default
            every pair of distinct devices.
        fail_alloc: ordinals whose every allocation raises OutOfMemoryError.
    """

    def __init__(self, n: int, builds: KernelBuilds,
                 peer_access: Callable[[int, int], bool] | None = None,
                 fail_alloc: Iterable[int] = ()):
        self.n, self.builds = n, builds
        self.peer_access = peer_access or (lambda a, b: a != b)
        self.fail_alloc = set(fail_alloc)
        self.device_stack = [0]
        self.stream_stack: list[Any] = []
        self.null = {o: _Queue(o, f"null@{o}") for o in range(n)}
        self.streams: dict[int, Any] = {}
        self.allocs: list[_Alloc] = []
        self._addr = {o: (o + 1) << 40 for o in range(n)}
        self._ids = itertools.count(1)
        self.log: list[tuple[Any, ...]] = []
        self.group: list[tuple[Any, ...]] | None = None
        self.pool_frees = 0
        self.host_clock: Clock = {}
        self.races: list[str] = []
        self._host_ops = 0

    def put(self, q: _Queue, op: Callable[[], None], what: str,
            reads: Iterable[Any] = (), writes: Iterable[Any] = ()) -> int:
        """Queue ``op`` on ``q`` after checking its accesses (arrays or
        allocations) are ordered; its position."""
        q.clock = _merge(q.clock, self.host_clock)
        q.clock[q.id] = q.queued + 1
        self._access((q.id, q.queued + 1), q.clock, f"{what} on {q.name}", reads,
                     writes)
        pos = q.put(op)
        q.clocks[pos] = dict(q.clock)
        return pos

    def host_access(self, what: str, reads: Iterable[Any] = (),
                    writes: Iterable[Any] = ()) -> None:
        """A host-synchronous access (after the waits that order it)."""
        self._host_ops += 1
        self.host_clock = {**self.host_clock, 0: self._host_ops}
        self._access((0, self._host_ops), self.host_clock, f"{what} on the host",
                     reads, writes)

    def _access(self, stamp: tuple[int, int], clock: Clock, what: str,
                reads: Iterable[Any], writes: Iterable[Any]) -> None:
        def unordered(prev: tuple[tuple[int, int], str]) -> bool:
            (qid, pos), _ = prev
            return clock.get(qid, 0) < pos

        def note(kind: str, prev: tuple[tuple[int, int], str], a: _Alloc) -> None:
            self.races.append(f"{what} {kind} memory at {a.ptr:#x} (device "
                              f"{a.ordinal}) unordered with {prev[1]}")

        reads = [_alloc_of(a) for a in reads]
        writes = [_alloc_of(a) for a in writes]
        for a in reads:
            if a.last_write and unordered(a.last_write):
                note("reads", a.last_write, a)
        for a in writes:
            for prev in ([a.last_write] if a.last_write else []) + a.reads:
                if unordered(prev):
                    note("writes", prev, a)
        for a in reads:
            a.reads.append((stamp, what))
        for a in writes:
            a.last_write, a.reads = (stamp, what), []

    @property
    def device(self) -> int:
        """The current device."""
        return self.device_stack[-1]

    def check_ordinal(self, ordinal: int) -> int:
        if not 0 <= ordinal < self.n:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device "
                                   f"ordinal {ordinal} ({self.n} devices)")
        return ordinal

    def current_queue(self) -> _Queue:
        """The current stream of the current device (its null stream if none)."""
        top = self.stream_stack[-1] if self.stream_stack else None
        if top is not None and top.device_id == self.device:
            return top._queue
        return self.null[self.device]

    def queues_of(self, ordinal: int) -> list[_Queue]:
        return [self.null[ordinal]] + [
            s._queue for s in self.streams.values() if s.device_id == ordinal
        ]

    def host_wait(self, queue: _Queue, position: int | None = None) -> None:
        """The host blocks until ``queue`` has run up to ``position`` (all)."""
        position = queue.queued if position is None else position
        self.log.append(("host_wait", queue.ordinal, queue.name))
        queue.run_until(position)
        self.host_clock = _merge(self.host_clock, queue.clocks[position])

    def alloc(self, nbytes: int) -> _Alloc:
        ordinal = self.device
        if ordinal in self.fail_alloc:
            self.log.append(("alloc_failed", ordinal, nbytes))
            raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes on "
                                   f"device {ordinal} (injected)")
        ptr = self._addr[ordinal]
        self._addr[ordinal] += -(-max(nbytes, 1) // 512) * 512
        found = _Alloc(ptr, ordinal, np.full(max(nbytes, 1), GARBAGE, np.uint8))
        self.allocs.append(found)
        return found

    def resolve(self, ptr: int, nbytes: int) -> tuple[_Alloc, int]:
        """The allocation holding ``[ptr, ptr + nbytes)`` and the offset in it."""
        for a in self.allocs:
            if a.ptr <= ptr and ptr + nbytes <= a.ptr + a.buf.size:
                return a, ptr - a.ptr
        raise CUDARuntimeError(f"cudaErrorInvalidValue: {nbytes} bytes at "
                               f"{ptr:#x} are not inside one allocation")

    def next_id(self) -> int:
        return next(self._ids)


def _alloc_of(a: Any) -> _Alloc:
    return a._alloc if isinstance(a, ndarray) else a


class PinnedMemory(bytearray):
    """A page-locked host buffer: bytes NumPy can wrap (``np.frombuffer``)."""

    def __init__(self, size: int):
        super().__init__(bytes([GARBAGE]) * size)


def _is_pinned(a: np.ndarray) -> bool:
    obj: Any = a
    while obj is not None:
        if isinstance(obj, PinnedMemory):
            return True
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
    return False


@dataclass(frozen=True)
class _MemoryPointer:
    ptr: int


class ndarray:  # noqa: N801  (CuPy's name)
    """A device array: a NumPy view of an allocation's bytes, plus its device.

    Only stream-ordered code touches the bytes; the host reaches them through
    ``get``/``asnumpy`` (``__array__`` refuses, as CuPy does).
    """

    def __init__(self, gpus: Gpus, a: np.ndarray, alloc: _Alloc):
        self._gpus, self._a, self._alloc = gpus, a, alloc

    @classmethod
    def _new(cls, gpus: Gpus, shape: Any, dtype: Any) -> ndarray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        alloc = gpus.alloc(nbytes)
        return cls(gpus, alloc.buf[:nbytes].view(dtype).reshape(shape), alloc)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    device_id = property(lambda self: self._alloc.ordinal)

    @property
    def data(self) -> _MemoryPointer:
        offset = self._a.__array_interface__["data"][0] \
            - self._alloc.buf.__array_interface__["data"][0]
        return _MemoryPointer(self._alloc.ptr + offset)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __repr__(self) -> str:
        return (f"<emulated ndarray {self.shape} {self.dtype} on device "
                f"{self.device_id}>")

    def _here(self, *others: ndarray) -> None:
        for a in (self, *others):
            if not isinstance(a, ndarray):
                raise TypeError(f"expected an emulated ndarray, got "
                                f"{type(a).__name__}")
            if a.device_id != self._gpus.device:
                raise ValueError(f"array on device {a.device_id} used while device "
                                 f"{self._gpus.device} is current")

    def _view(self, a: np.ndarray) -> ndarray:
        if not np.shares_memory(a, self._alloc.buf):
            raise NotImplementedError("the stand-in supports views only here")
        return ndarray(self._gpus, a, self._alloc)

    def __getitem__(self, key: Any) -> ndarray:
        return self._view(self._a[key])

    def reshape(self, *shape: Any) -> ndarray:
        return self._view(self._a.reshape(*shape))

    def _fill(self, what: str, fill: Callable[[], Any],
              reads: tuple[ndarray, ...] = ()) -> ndarray:
        """Queue ``self[...] = fill()`` on the current stream; ``self``."""
        def op() -> None:
            self._a[...] = fill()

        gpus = self._gpus
        gpus.put(gpus.current_queue(), op, what, reads=reads, writes=(self,))
        return self

    def copy(self) -> ndarray:
        self._here()
        out = ndarray._new(self._gpus, self.shape, self.dtype)
        return out._fill("copy", lambda: self._a, (self,))

    def astype(self, dtype: Any) -> ndarray:
        self._here()
        out = ndarray._new(self._gpus, self.shape, dtype)
        return out._fill("astype", lambda: self._a.astype(out.dtype), (self,))

    def sum(self, dtype: Any = None) -> ndarray:
        self._here()
        out = ndarray._new(self._gpus, (), np.sum(np.zeros(1, self.dtype),
                                                   dtype=dtype).dtype)
        return out._fill("sum", lambda: self._a.sum(dtype=dtype), (self,))

    def __add__(self, other: ndarray) -> ndarray:
        self._here(other)
        out = ndarray._new(self._gpus, np.broadcast_shapes(self.shape, other.shape),
                           np.result_type(self.dtype, other.dtype))
        return out._fill("add", lambda: self._a + other._a, (self, other))

    def __iadd__(self, other: ndarray) -> ndarray:
        self._here(other)

        def op() -> None:
            np.add(self._a, other._a, out=self._a, casting="same_kind")

        gpus = self._gpus
        gpus.put(gpus.current_queue(), op, "add in place", reads=(self, other),
                 writes=(self,))
        return self

    def _stream_queue(self, stream: Any) -> _Queue:
        if stream is None:
            return self._gpus.current_queue()
        if stream.device_id != self.device_id:
            raise CUDARuntimeError(
                f"cudaErrorInvalidResourceHandle: copy for an array on device "
                f"{self.device_id} on a stream of device {stream.device_id}")
        return stream._queue

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Host -> device; asynchronous from pinned memory on a stream."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: "
                             f"{arr.shape}")
        with self._gpus_device():
            q = self._stream_queue(stream)
            pinned = _is_pinned(arr)
            src = arr if pinned else arr.copy()  # pageable: staged now

            def op() -> None:
                self._a[...] = src

            pos = self._gpus.put(q, op, "copy to device", writes=(self,))
            if not pinned or q is self._gpus.null[self.device_id]:
                self._gpus.host_wait(q, pos)

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        """Device -> host; blocks the host unless ``blocking=False`` and ``out``
        is pinned (CuPy 13 and later)."""
        if out is None:
            out = np.empty(self.shape, self.dtype)
        if out.dtype != self.dtype or out.shape != self.shape:
            raise ValueError(f"out {out.shape} {out.dtype} does not match "
                             f"{self.shape} {self.dtype}")
        if not out.flags.c_contiguous:
            raise RuntimeError("`out` cannot be specified when copying to "
                               "non-contiguous ndarray")
        with self._gpus_device():
            q = self._stream_queue(stream)

            def op() -> None:
                out[...] = self._a

            pos = self._gpus.put(q, op, "copy to host", reads=(self,))
            if blocking or not _is_pinned(out):
                self._gpus.host_wait(q, pos)
        return out

    def _gpus_device(self) -> Any:
        return _DeviceContext(self._gpus, self.device_id)


class _DeviceContext:
    def __init__(self, gpus: Gpus, ordinal: int):
        self.gpus, self.id = gpus, gpus.check_ordinal(ordinal)

    def __enter__(self) -> _DeviceContext:
        self.gpus.device_stack.append(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        self.gpus.device_stack.pop()


# ----------------------------------------------------------------------------
# cupy.cuda: Device, Stream, Event, runtime, nccl


class Device(_DeviceContext):
    """``cupy.cuda.Device(i)``: a context manager making ``i`` current."""

    _gpus: Gpus

    def __init__(self, device: int | None = None):
        super().__init__(self._gpus, self._gpus.device if device is None else device)

    def synchronize(self) -> None:
        for q in self.gpus.queues_of(self.id):
            self.gpus.host_wait(q)


class Stream:
    """``cupy.cuda.Stream(non_blocking=True)`` on the current device."""

    _gpus: Gpus
    null: Any

    def __init__(self, null: bool = False, non_blocking: bool = False,
                 ptds: bool = False):
        if not non_blocking or null or ptds:
            raise NotImplementedError("the stand-in models non-blocking streams only")
        gpus = self._gpus
        self.device_id = gpus.device
        self.ptr = gpus.next_id()
        self._queue = _Queue(self.device_id, f"stream{self.ptr}@{self.device_id}")
        gpus.streams[self.ptr] = self

    def __enter__(self) -> Stream:
        self._gpus.stream_stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._gpus.stream_stack.pop()

    def synchronize(self) -> None:
        self._gpus.host_wait(self._queue)

    def wait_event(self, event: Event) -> None:
        """Work queued after this runs after the work before ``event``."""
        if event._queue is None:
            return
        source, position = event._queue, event._pos
        self._queue.clock = _merge(self._queue.clock, source.clocks[position])
        self._gpus.put(self._queue, lambda: source.run_until(position),
                       "wait_event")


class _NullStream:
    """``Stream.null``: the legacy default stream of the current device."""

    ptr = 0

    def __init__(self, gpus: Gpus):
        self._gpus = gpus

    @property
    def device_id(self) -> int:
        return self._gpus.device

    @property
    def _queue(self) -> _Queue:
        return self._gpus.null[self._gpus.device]

    def synchronize(self) -> None:
        self._gpus.host_wait(self._queue)


class Event:
    """``cupy.cuda.Event()``: a timestamp taken when its stream reaches it."""

    _gpus: Gpus

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False):
        self.device_id = self._gpus.device
        self._queue: _Queue | None = None
        self._pos = 0
        self.time: float | None = None

    def record(self, stream: Any = None) -> None:
        q = stream._queue if stream is not None else self._gpus.current_queue()
        if q.ordinal != self.device_id:
            raise CUDARuntimeError(
                f"cudaErrorInvalidResourceHandle: event of device {self.device_id} "
                f"recorded on a stream of device {q.ordinal}")
        token = object()
        self._token, self.time = token, None

        def stamp() -> None:
            if self._token is token:
                self.time = time.perf_counter()

        self._queue, self._pos = q, self._gpus.put(q, stamp, "event record")

    def synchronize(self) -> None:
        if self._queue is not None:
            self._gpus.host_wait(self._queue, self._pos)

    @property
    def done(self) -> bool:
        return self._queue is None or self._queue.done >= self._pos


def _elapsed_ms(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise CUDARuntimeError("cudaErrorNotReady: an event has not completed")
    return (end.time - start.time) * 1e3


class _Pool:
    """A memory pool: only ``free_all_blocks`` is used."""

    def __init__(self, gpus: Gpus):
        self._gpus = gpus

    def free_all_blocks(self) -> None:
        self._gpus.pool_frees += 1


class RawKernel:
    """One entry point; calling it queues an emulated launch."""

    def __init__(self, gpus: Gpus, binary: Path, name: str, params: list[Param]):
        self._gpus, self.binary, self.name, self.params = gpus, binary, name, params

    def __call__(self, grid: Any, block: Any, args: tuple, *, shared_mem: int = 0,
                 stream: Any = None) -> None:
        gpus = self._gpus
        grid = tuple(grid) if isinstance(grid, tuple) else (grid, 1, 1)
        block = tuple(block) if isinstance(block, tuple) else (block, 1, 1)
        if (len(grid) > 3 or len(block) > 3 or min(grid + block) < 1
                or int(np.prod(block)) > MAX_THREADS or shared_mem):
            raise CUDARuntimeError(f"cudaErrorInvalidConfiguration: {self.name} "
                                   f"grid {grid} block {block}")
        q = stream._queue if stream is not None else gpus.current_queue()
        if q.ordinal != gpus.device:
            raise CUDARuntimeError(
                f"cudaErrorInvalidResourceHandle: {self.name} launched on device "
                f"{gpus.device} on a stream of device {q.ordinal}")
        if not isinstance(args, tuple) or len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got "
                            f"{args!r:.80}")
        plan = []
        for k, (p, arg) in enumerate(zip(self.params, args, strict=True)):
            where = f"{self.name} argument {k}"
            if p.pointer:
                if not isinstance(arg, ndarray):
                    raise TypeError(f"{where}: expected a device array, got "
                                    f"{type(arg).__name__}")
                arg._here()
                if arg.dtype != p.dtype or not arg._a.flags.c_contiguous:
                    raise TypeError(f"{where}: expected contiguous {p.dtype}, got "
                                    f"{arg.dtype}")
                plan.append((arg, p.const))
            else:
                if not isinstance(arg, np.generic) or arg.dtype != p.dtype:
                    raise TypeError(f"{where}: expected a {p.dtype} scalar, got "
                                    f"{type(arg).__name__} {arg!r}")
                plan.append((SCALARS[p.dtype](arg.item()), None))
        gpus.log.append(("launch", gpus.device, self.name, q.name))
        arrays = [a for a, _ in plan if isinstance(a, ndarray)]
        written = [a for a, const in plan if isinstance(a, ndarray) and not const]

        def op() -> None:
            emu_args = [emulate.Buffer(a._a.copy(), not const)
                        if isinstance(a, ndarray) else a for a, const in plan]
            results = iter(emulate.run_emulated(self.binary, self.name, grid, block,
                                                emu_args, timeout_s=60.0))
            for a, const in plan:
                if isinstance(a, ndarray) and not const:
                    a._a[...] = next(results)

        gpus.put(q, op, self.name, reads=arrays, writes=written)


class RawModule:
    """``cupy.RawModule(code=..., options=..., backend="nvrtc")``."""

    _gpus: Gpus

    def __init__(self, code: str, options: tuple = (), backend: str = "nvrtc",
                 **kwargs: Any):
        if backend != "nvrtc" or kwargs:
            raise NotImplementedError(f"the stand-in compiles with nvrtc only "
                                      f"(backend={backend!r}, {sorted(kwargs)})")
        if not isinstance(options, tuple):
            raise TypeError("options must be a tuple")
        defines = {}
        for opt in options:
            if opt.startswith("-D"):
                name, _, value = opt[2:].partition("=")
                defines[name] = int(value or 1)
        self.code = code
        self.binary = self._gpus.builds.binary(code, defines)

    def get_function(self, name: str) -> RawKernel:
        return RawKernel(self._gpus, self.binary, name, kernel_params(self.code, name))


NCCL_DTYPES = {4: np.dtype(np.int64), 7: np.dtype(np.float32),
               8: np.dtype(np.float64)}
"""ncclDataType_t -> NumPy dtype (ncclInt64, ncclFloat32, ncclFloat64)."""


class NcclCommunicator:
    """One rank of a clique made by :meth:`initAll`."""

    _gpus: Gpus

    def __init__(self, clique: tuple[int, ...], rank: int):
        self.clique, self.rank = clique, rank

    @classmethod
    def initAll(cls, devices: list[int]) -> list[NcclCommunicator]:  # noqa: N802
        clique = tuple(cls._gpus.check_ordinal(d) for d in devices)
        if len(set(clique)) != len(clique):
            raise RuntimeError(f"NCCL error: duplicate devices in {clique}")
        return [cls(clique, r) for r in range(len(clique))]

    def device_id(self) -> int:
        return self.clique[self.rank]

    def destroy(self) -> None:
        """Release the rank (nothing to free here)."""

    def allReduce(  # noqa: N802  (NCCL's name)
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
        stream: int,
    ) -> None:
        gpus, dev = self._gpus, self.device_id()
        if datatype not in NCCL_DTYPES or op != 0:
            raise RuntimeError(f"NCCL error: unsupported datatype {datatype} or "
                               f"op {op}")
        dtype = NCCL_DTYPES[datatype]
        views, allocs = [], []
        for ptr in (sendbuf, recvbuf):
            alloc, offset = gpus.resolve(ptr, count * dtype.itemsize)
            if alloc.ordinal != dev:
                raise RuntimeError(f"NCCL error: buffer on device {alloc.ordinal} "
                                   f"for the rank on device {dev}")
            views.append(alloc.buf[offset:offset + count * dtype.itemsize]
                         .view(dtype))
            allocs.append(alloc)
        q = gpus.null[dev] if stream == 0 else gpus.streams[stream]._queue
        if q.ordinal != dev:
            raise RuntimeError(f"NCCL error: stream of device {q.ordinal} for the "
                               f"rank on device {dev}")
        call = (self, views[0], views[1], count, dtype, q, allocs[0], allocs[1])
        if gpus.group is not None:
            gpus.group.append(call)
        elif len(self.clique) > 1:
            raise RuntimeError("NCCL collective on one of several ranks outside "
                               "groupStart/groupEnd: from one thread it deadlocks")
        else:
            _Collective(gpus, [call]).queue()


class _Collective:
    """An all-reduce: runs once every rank's stream has reached it."""

    def __init__(self, gpus: Gpus, calls: list[tuple[Any, ...]]):
        self.gpus, self.calls, self.done = gpus, calls, False
        self.positions: list[int] = []

    def queue(self) -> None:
        ranks = [c[0].device_id() for c in self.calls]
        self.gpus.log.append(("allreduce", tuple(ranks)))
        clock: Clock = self.gpus.host_clock
        for c in self.calls:  # a collective orders every rank after all ranks
            clock = _merge(clock, c[5].clock)
        for c in self.calls:
            c[5].clock = dict(clock)
        self.positions = [self.gpus.put(c[5], self.run, "allreduce", reads=(c[6],),
                                        writes=(c[7],)) for c in self.calls]

    def run(self) -> None:
        if self.done:
            return
        for call, pos in zip(self.calls, self.positions, strict=True):
            call[5].run_until(pos - 1)
        total = np.sum([c[1] for c in self.calls], axis=0, dtype=self.calls[0][4])
        for c in self.calls:
            c[2][...] = total
        self.done = True


def _group_start(gpus: Gpus) -> None:
    if gpus.group is not None:
        raise RuntimeError("NCCL groups do not nest in the stand-in")
    gpus.group = []


def _group_end(gpus: Gpus) -> None:
    calls, gpus.group = gpus.group or [], None
    cliques: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}
    for c in calls:
        cliques.setdefault(c[0].clique, []).append(c)
    for clique, group in cliques.items():
        ranks = sorted(c[0].rank for c in group)
        if ranks != list(range(len(clique))):
            raise RuntimeError(f"NCCL error: ranks {ranks} of {clique} in one group "
                               "(every rank exactly once)")
        if len({(c[3], c[4]) for c in group}) != 1:
            raise RuntimeError("NCCL error: ranks disagree on count or datatype")
        _Collective(gpus, sorted(group, key=lambda c: c[0].rank)).queue()


def _memcpy_peer(gpus: Gpus, dst: int, dst_dev: int, src: int, src_dev: int,
                 nbytes: int) -> None:
    """``cudaMemcpyPeer``: serialised with all work on both devices."""
    (d, doff), (s, soff) = gpus.resolve(dst, nbytes), gpus.resolve(src, nbytes)
    if d.ordinal != dst_dev or s.ordinal != src_dev:
        raise CUDARuntimeError(
            f"cudaErrorInvalidValue: memcpyPeer named devices {dst_dev} <- "
            f"{src_dev} for memory on {d.ordinal} <- {s.ordinal}")
    for o in {dst_dev, src_dev}:
        for q in gpus.queues_of(o):
            gpus.host_wait(q)
    gpus.log.append(("memcpy_peer", dst_dev, src_dev, nbytes))
    gpus.host_access("memcpyPeer", reads=(s,), writes=(d,))
    d.buf[doff:doff + nbytes] = s.buf[soff:soff + nbytes]


# ----------------------------------------------------------------------------
# The module


def _bound(cls: type, gpus: Gpus, **extra: Any) -> type:
    return type(cls.__name__, (cls,), {"_gpus": gpus, **extra})


def make_cupy(devices: int, builds: KernelBuilds, *,
              peer_access: Callable[[int, int], bool] | None = None,
              fail_alloc: Iterable[int] = (), nccl: bool = True) -> types.ModuleType:
    """A fresh stand-in ``cupy`` module over ``devices`` emulated GPUs.

    Args:
        devices: how many devices ``getDeviceCount`` reports.
        builds: the (session-wide) emulator binaries.
        peer_access: ``deviceCanAccessPeer(a, b)``; default every distinct pair.
        fail_alloc: ordinals on which every allocation runs out of memory.
        nccl: whether ``cupy.cuda.nccl`` says it is available.

    Returns:
        The module; ``module.gpus`` is its :class:`Gpus` (state and log).
    """
    gpus = Gpus(devices, builds, peer_access, fail_alloc)
    cp = types.ModuleType("cupy", "An emulated CuPy (tests/emulated_cupy.py).")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    nccl_mod = types.ModuleType("cupy.cuda.nccl")

    def empty(shape: Any, dtype: Any = float) -> ndarray:
        return ndarray._new(gpus, shape, dtype)

    def empty_like(a: ndarray, dtype: Any = None) -> ndarray:
        return ndarray._new(gpus, a.shape, dtype or a.dtype)  # on the current device

    def zeros(shape: Any, dtype: Any = float) -> ndarray:
        return empty(shape, dtype)._fill("memset", lambda: 0)  # on the stream

    def asarray(a: Any, dtype: Any = None) -> ndarray:
        if isinstance(a, ndarray) and dtype is None and a.device_id == gpus.device:
            return a
        host = np.array(a, dtype=dtype)  # staged now, copied on the stream
        return empty(host.shape, host.dtype)._fill("copy to device", lambda: host)

    def asnumpy(a: Any, stream: Any = None, order: str = "C",
                out: np.ndarray | None = None, *, blocking: bool = True) -> np.ndarray:
        if isinstance(a, ndarray):
            return a.get(stream=stream, out=out, blocking=blocking)
        return np.asarray(a, order=order)

    def ascontiguousarray(a: ndarray) -> ndarray:
        return a if a._a.flags.c_contiguous else a.copy()

    pools = (_Pool(gpus), _Pool(gpus))
    cp.__dict__.update(
        gpus=gpus, ndarray=ndarray, empty=empty, empty_like=empty_like, zeros=zeros,
        asarray=asarray, asnumpy=asnumpy, ascontiguousarray=ascontiguousarray,
        float16=np.float16, float32=np.float32, float64=np.float64,
        uint16=np.uint16, uint32=np.uint32, int32=np.int32, int64=np.int64,
        RawModule=_bound(RawModule, gpus), cuda=cuda,
        get_default_memory_pool=lambda: pools[0],
        get_default_pinned_memory_pool=lambda: pools[1],
    )
    runtime.__dict__.update(
        getDeviceCount=lambda: gpus.n,
        deviceCanAccessPeer=lambda a, b: int(a != b and bool(gpus.peer_access(a, b))),
        memcpyPeer=lambda *args: _memcpy_peer(gpus, *args),
        CUDARuntimeError=CUDARuntimeError,
    )
    nccl_mod.__dict__.update(
        available=nccl, NCCL_INT64=4, NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_SUM=0,
        NcclCommunicator=_bound(NcclCommunicator, gpus),
        groupStart=lambda: _group_start(gpus), groupEnd=lambda: _group_end(gpus),
    )
    cuda.__dict__.update(
        Device=_bound(Device, gpus), Event=_bound(Event, gpus),
        Stream=_bound(Stream, gpus, null=_NullStream(gpus)),
        get_elapsed_time=_elapsed_ms, alloc_pinned_memory=PinnedMemory,
        runtime=runtime, nccl=nccl_mod,
    )
    try:  # the code-gen plane compiles with the real NVRTC, which needs no GPU
        from cupy.cuda import nvrtc as real_nvrtc

        cuda.nvrtc = real_nvrtc
    except Exception:  # no CuPy: the probe then says NVRTC is unavailable
        pass
    return cp


def install(cp: types.ModuleType, monkeypatch: Any) -> None:
    """Make ``import cupy`` (and its submodules the backend imports) give ``cp``
    until the test ends (``monkeypatch`` restores ``sys.modules``)."""
    for name, module in (("cupy", cp), ("cupy.cuda", cp.cuda),
                         ("cupy.cuda.runtime", cp.cuda.runtime),
                         ("cupy.cuda.nccl", cp.cuda.nccl)):
        monkeypatch.setitem(sys.modules, name, module)
