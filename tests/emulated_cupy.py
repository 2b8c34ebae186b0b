"""A CuPy stand-in whose kernels run on the CPU: a test double for the cuda backend.

:func:`make_cupy` builds an object that looks, to :mod:`lib.execution.cuda`, like
the ``cupy`` module on a machine with a few GPUs; :func:`install` puts it into
``sys.modules`` (as ``cupy``, ``cupy.cuda`` and its submodules) for one test, so
the backend's own code -- its probe, its constructor, ``run`` -- runs unchanged
against it. Only the part of CuPy that the backend uses is there, and where
CuPy 14 fails, the stand-in fails the same way (the CuPy source each rule
mirrors is named where the rule is implemented).

What is real and what is modelled:

* **Kernels are real.** ``RawModule`` builds the CUDA source it is given as host
  C++ with :mod:`lib.codegen.emulate` (one binary per source, comments aside,
  built once per session by :class:`KernelBuilds`), and a launch runs that binary
  with the launch's grid, block and arguments. Each launch is first checked
  against the kernel's signature: one argument per parameter, pointer element
  types (fp16 as ``float16``, bf16 as ``uint16`` words), scalar types
  (``np.int32`` for ``int``, ``np.int64`` for ``long long``, ``np.float32`` for
  ``float``), every array on the current device, the stream on that device.
* **Launch limits are the hardware's.** A grid over 2^31-1 blocks in x or over
  65535 in y or z (:data:`MAX_GRID_YZ`, lowerable per stand-in so a test can
  cross it cheaply), a block over 1024 threads or (1024, 1024, 64), or static
  plus dynamic shared memory over 48 KiB fails the launch with
  ``CUDADriverError: CUDA_ERROR_INVALID_VALUE``; a kernel whose static shared
  memory alone is over 48 KiB fails to compile (``CompileException``). Static
  shared memory is read from the PTX the real NVRTC makes of the source.
* **Streams are queues.** Stream-ordered work -- copies, launches, array
  arithmetic, memsets, event records, NCCL collectives -- is queued on its stream
  (the current one where none is given) and runs only when the host waits for it
  (``synchronize`` of a stream, event or device, a blocking copy,
  ``memcpyPeer``), or when a stream that ``wait_event``-ed on it reaches the
  wait. Device memory and pinned buffers start as 0xFF bytes (NaN for floats, -1
  or the maximum for integers), so a result read before its stream was waited
  for, or computed from data another stream had not produced yet, comes out
  wrong and fails verification. Streams are non-blocking (they never wait for
  the null stream implicitly); entering a stream while another device is
  current raises, as CuPy does. Nothing runs concurrently: the double checks
  ordering and arithmetic, not overlap.
* **Event times follow an eager device.** Queued work runs late, but each op
  is given the virtual start ``max(when the host queued it, when the op before
  it on its stream ended)`` and lasts what its emulation took (a wait lasts
  until what it waits for ended). An event's time is its virtual start, so an
  event recorded on an idle stream reads the host's clock at the record, and
  host work between two records shows up between their times, as on a GPU.
* **Memory is pooled as CuPy pools it.** Every device has its own memory pool;
  a device array whose last reference goes returns its block at once to the
  pool arena of the stream that was current when it was allocated, and the next
  allocation of that size there gets the same block. Returning a block that
  work on *another* stream may still touch is recorded as a race (CuPy orders
  reuse only within the arena's stream). ``free_all_blocks`` empties the current
  device's pool only. Pinned host memory comes from one pool that hands a freed
  block out again at once, with no stream tracking at all: returning a block
  that a queued copy still reads or writes is recorded as a race.
* **Copies follow CuPy 13 and later.** ``ndarray.get`` and ``asnumpy`` block the
  host by default (``blocking=True``), with or without a stream; ``set`` with a
  stream and ``asarray`` do not. A copy to or from pageable (not pinned) host
  memory blocks, as ``cudaMemcpyAsync`` does.
* **Peer access is per direction and must be enabled.**
  ``deviceEnablePeerAccess`` grants the current device access to a peer's
  memory (twice raises ``cudaErrorPeerAccessAlreadyEnabled``; where
  ``deviceCanAccessPeer`` says no, ``cudaErrorPeerAccessUnsupported``).
  ``memcpyPeer`` works either way, as CUDA's does, but the log records whether
  the copy was direct (access enabled from the destination to the source) or
  staged through the host.
* **NCCL is there only when its library is** (``nccl=True``): otherwise
  ``cupy.cuda.nccl`` holds ``available = False`` and nothing else, as
  ``cupy/cuda/nccl.py`` does when ``libnccl.so.2`` is missing; and, as in
  ``cupy/cuda/__init__.py``, ``cupy.cuda.nccl`` is not an attribute of
  ``cupy.cuda`` until the code that uses it imports it. ``allReduce`` calls
  between ``groupStart`` and ``groupEnd`` form one collective that runs when
  every rank's stream has reached it; a collective over several ranks outside a
  group is refused (from one thread it would deadlock).
* **Races are found.** Every queued access to device memory is checked against
  the last write to (and the reads since of) the same block: it must be ordered
  after them by stream order, ``wait_event``, a host wait or a collective
  (vector clocks). An unordered pair is recorded in :attr:`Gpus.races`,
  whichever order the queues happen to run in.
* **Failures**: an allocation larger than the device's memory (``memory_bytes``)
  raises :class:`OutOfMemoryError`, as CuPy's pool does when ``cudaMalloc``
  fails; allocations on the ordinals in ``fail_alloc`` always do.

:attr:`Gpus.log` records in host order each launch queued (``("launch", ordinal,
kernel, queue)``), each host wait (``("host_wait", ordinal, queue)``), each event
record (``("event", ordinal, queue)``), each pinned allocation (``("pinned",
bytes, reused)``), each peer copy (``("memcpy_peer", dst, src, bytes,
direct)``) and each all-reduce, so a test can check what ran where, and when
the host blocked.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import re
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
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

MAX_BLOCK_DIMS = (1024, 1024, 64)
"""Largest block extent per dimension (cudaDeviceProp.maxThreadsDim)."""

MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
"""Largest grid extent in x, and in y and z (cudaDeviceProp.maxGridSize)."""

SHARED_LIMIT = 48 * 1024
"""Bytes of shared memory a block may use without opting in (static + dynamic)."""

MEMORY_BYTES = 80 * 2**30
"""Each emulated device's memory, bytes (an allocation over it fails)."""

DEVICE_UNIT = 512
"""Device allocations are rounded up to this (memory.pyx ALLOCATION_UNIT_SIZE)."""

PINNED_UNIT = 512
"""Pinned allocations are rounded up to a power of two of at least this many
bytes (pinned_memory.pyx PinnedMemoryPool._allocation_unit_size, clp2)."""

# cudaError_t values (driver_types.h), as cupy_backends' runtime exposes them.
ERROR_INVALID_VALUE = 1
ERROR_MEMORY_ALLOCATION = 2
ERROR_INVALID_DEVICE = 101
ERROR_PEER_ACCESS_UNSUPPORTED = 217
ERROR_PEER_ACCESS_ALREADY_ENABLED = 704


class CUDARuntimeError(RuntimeError):
    """What the CUDA runtime reports; ``status`` is the cudaError_t."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class CUDADriverError(RuntimeError):
    """What the CUDA driver reports (a launch refused); ``status`` is the
    CUresult."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class CompileException(Exception):
    """A kernel that does not compile (``cupy.cuda.compiler.CompileException``)."""


class OutOfMemoryError(MemoryError):
    """An allocation the device cannot serve (``cupy.cuda.memory``'s class)."""


# ----------------------------------------------------------------------------
# Emulator binaries


def _code_only(source: str) -> str:
    """``source`` without its whole-line ``//`` comments (they cannot change
    what the compiler makes of it)."""
    return "\n".join(
        line for line in source.splitlines() if not line.lstrip().startswith("//")
    )


def static_shared_bytes(source: str, defines: Mapping[str, int]) -> int | None:
    """Bytes of static ``__shared__`` memory the module declares, read from the
    PTX the real NVRTC makes of ``source`` (one kernel per module, as Gate 2a
    requires, so the module's total is its kernel's); None without NVRTC."""
    try:
        from lib.codegen.nvrtc import compile_ptx

        ptx = compile_ptx(source, "stand_in.cu", 80,
                          [f"-D{k}={v}" for k, v in defines.items()])
    except Exception:  # no NVRTC or no headers: the limit goes unchecked
        return None
    total = 0
    for m in re.finditer(r"^\s*\.shared\s+(?:\.align\s+\d+\s+)?\.[a-z]+(\d+)\s+"
                         r"[\w$]+\[(\d+)\]", ptx, re.M):
        total += int(m.group(1)) // 8 * int(m.group(2))
    return total


class KernelBuilds:
    """Emulator binaries, one per kernel source and set of defines, each built
    once (in a thread pool, so :meth:`prebuild` compiles in parallel), and the
    static shared memory of each.

    Args:
        out_dir: where sources and binaries are written.
        workers: compiler processes at a time; default the CPU count.
    """

    def __init__(self, out_dir: Path, workers: int | None = None):
        self.out_dir = Path(out_dir)
        self._pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2)
        self._lock = threading.Lock()
        self._builds: dict[str, Future[Path]] = {}
        self._shared: dict[str, Future[int | None]] = {}

    @staticmethod
    def _key(source: str, defines: Mapping[str, int]) -> str:
        return hashlib.sha256(
            (_code_only(source) + repr(sorted(defines.items()))).encode()
        ).hexdigest()[:16]

    def _future(self, source: str, defines: Mapping[str, int]) -> Future[Path]:
        key = self._key(source, defines)
        with self._lock:
            if key not in self._builds:
                path = self.out_dir / f"k{key}.cu"
                path.write_text(source)
                self._builds[key] = self._pool.submit(
                    emulate.build_emulated, path, self.out_dir, "plain", defines
                )
                if key not in self._shared:
                    self._shared[key] = self._pool.submit(
                        static_shared_bytes, source, dict(defines))
            return self._builds[key]

    def binary(self, source: str, defines: Mapping[str, int] | None = None) -> Path:
        """The emulator binary for ``source`` (built now unless already built)."""
        return self._future(source, defines or {}).result()

    def shared_bytes(self, source: str,
                     defines: Mapping[str, int] | None = None) -> int | None:
        """:func:`static_shared_bytes` of ``source`` (computed once)."""
        key = self._key(source, defines or {})
        with self._lock:
            if key not in self._shared:
                self._shared[key] = self._pool.submit(
                    static_shared_bytes, source, dict(defines or {}))
        return self._shared[key].result()

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


_SESSION: dict[str, KernelBuilds] = {}


def session_builds(out_dir: Path) -> KernelBuilds:
    """One :class:`KernelBuilds` per test process, so every test module's
    fixture shares its binaries (``out_dir`` is used by the first caller)."""
    if "builds" not in _SESSION:
        _SESSION["builds"] = KernelBuilds(out_dir)
    return _SESSION["builds"]


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
        CUDADriverError: no such kernel (CUDA_ERROR_NOT_FOUND).
    """
    m = re.search(
        r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
        + re.escape(name)
        + r"\s*\(([^)]*)\)",
        source,
    )
    if m is None:
        raise CUDADriverError("CUDA_ERROR_NOT_FOUND: named symbol not found "
                              f"({name})", 500)
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
    the op at position ``p``. ``vend`` is the virtual time (``perf_counter``
    seconds) the last op run ended, ``vnow`` the virtual start of the op
    running, ``vtimes[p]`` the virtual end of the op at position ``p``.
    """

    _ids = itertools.count(1)

    def __init__(self, ordinal: int, name: str):
        self.ordinal, self.name, self.id = ordinal, name, next(self._ids)
        self.ops: deque[Callable[[], None]] = deque()
        self.queued = self.done = 0
        self.clock: Clock = {}
        self.clocks: dict[int, Clock] = {0: {}}
        self.vend = self.vnow = 0.0
        self.vtimes: dict[int, float] = {0: 0.0}

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


Access = tuple[tuple[int, int], str]
"""((queue id, position), what) of one access; queue id 0 is the host."""


@dataclass(eq=False)
class _Block:
    """One block of device memory: its fake address, device, bytes, the pool
    arena (queue id) it returns to, and for race checks its last write and the
    reads since."""

    ptr: int
    ordinal: int
    buf: np.ndarray
    arena: int
    last_write: Access | None = None
    reads: list[Access] = field(default_factory=list)
    freed: bool = False


class _Allocation:
    """What a device array holds on to: while any array over the block lives,
    the block stays out of the pool (``cupy.cuda.memory.MemoryPointer``)."""

    def __init__(self, gpus: Gpus, block: _Block):
        self.block = block
        weakref.finalize(self, gpus.release, block).atexit = False


@dataclass(eq=False)
class _PinnedBlock:
    """One pinned host block of the pool and the queued copies that use it."""

    mem: bytearray
    uses: list[tuple[_Queue, int]] = field(default_factory=list)


class Gpus:
    """The state behind one stand-in: devices, queues, memory, the log.

    Args:
        n: devices (ordinals ``0 .. n-1``).
        builds: where kernel binaries come from.
        peer_access: ``(a, b) -> bool`` for ``deviceCanAccessPeer``; default
            every pair of distinct devices.
        fail_alloc: ordinals whose every allocation raises OutOfMemoryError.
        max_grid_yz: largest grid extent in y and z.
        bus_ids: PCI bus id of each ordinal (``deviceGetPCIBusId``).
        memory_bytes: each device's memory.
    """

    def __init__(self, n: int, builds: KernelBuilds,
                 peer_access: Callable[[int, int], bool] | None = None,
                 fail_alloc: Iterable[int] = (), max_grid_yz: int = MAX_GRID_YZ,
                 bus_ids: Sequence[str] | None = None,
                 memory_bytes: int = MEMORY_BYTES):
        self.n, self.builds, self.memory_bytes = n, builds, memory_bytes
        self.peer_access = peer_access or (lambda a, b: a != b)
        self.fail_alloc = set(fail_alloc)
        self.max_grid_yz = max_grid_yz
        self.bus_ids = list(bus_ids or [f"0000:{0x17 + o:02X}:00.0"
                                        for o in range(n)])
        self.device_stack = [0]
        self.stream_stack: list[Any] = []
        self.null = {o: _Queue(o, f"null@{o}") for o in range(n)}
        self.queues = {q.id: q for q in self.null.values()}
        self.streams: dict[int, Any] = {}
        self.blocks: list[_Block] = []
        self.pools: dict[int, dict[tuple[int, int], list[_Block]]] = {
            o: {} for o in range(n)}
        self.pinned_free: dict[int, list[_PinnedBlock]] = {}
        self.peers_enabled: set[tuple[int, int]] = set()
        self._addr = {o: (o + 1) << 40 for o in range(n)}
        self._ids = itertools.count(1)
        self.log: list[tuple[Any, ...]] = []
        self.group: list[tuple[Any, ...]] | None = None
        self.pool_frees = dict.fromkeys(range(n), 0)
        self.pinned_pool_frees = 0
        self.nccl_module: types.ModuleType | None = None
        self.host_clock: Clock = {}
        self.races: list[str] = []
        self._host_ops = 0

    def put(self, q: _Queue, op: Callable[[], float | None], what: str,
            reads: Iterable[Any] = (), writes: Iterable[Any] = ()) -> int:
        """Queue ``op`` on ``q`` after checking its accesses (arrays or blocks)
        are ordered; its position. ``op`` may return the virtual time it
        waited for (a wait lasts until then, not for as long as it ran)."""
        q.clock = _merge(q.clock, self.host_clock)
        q.clock[q.id] = q.queued + 1
        self._access((q.id, q.queued + 1), q.clock, f"{what} on {q.name}", reads,
                     writes)
        enqueued = time.perf_counter()
        position = q.queued + 1

        def timed() -> None:
            start = max(enqueued, q.vend)
            q.vnow = start
            began = time.perf_counter()
            ready = op()
            q.vend = (max(start, ready) if ready is not None
                      else start + time.perf_counter() - began)
            q.vtimes[position] = q.vend

        pos = q.put(timed)
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
        def unordered(prev: Access) -> bool:
            (qid, pos), _ = prev
            return clock.get(qid, 0) < pos

        def note(kind: str, prev: Access, b: _Block) -> None:
            self.races.append(f"{what} {kind} memory at {b.ptr:#x} (device "
                              f"{b.ordinal}) unordered with {prev[1]}")

        reads = [_block_of(a) for a in reads]
        writes = [_block_of(a) for a in writes]
        for b in reads:
            if b.last_write and unordered(b.last_write):
                note("reads", b.last_write, b)
        for b in writes:
            for prev in ([b.last_write] if b.last_write else []) + b.reads:
                if unordered(prev):
                    note("writes", prev, b)
        for b in reads:
            b.reads.append((stamp, what))
        for b in writes:
            b.last_write, b.reads = (stamp, what), []

    def pending(self, accesses: Iterable[Access]) -> list[tuple[_Queue, str]]:
        """Of ``accesses``, the queued ones that have not run yet."""
        out = []
        for (qid, pos), what in accesses:
            q = self.queues.get(qid)
            if q is not None and q.done < pos:
                out.append((q, what))
        return out

    @property
    def device(self) -> int:
        """The current device."""
        return self.device_stack[-1]

    def check_ordinal(self, ordinal: int) -> int:
        if not 0 <= ordinal < self.n:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device "
                                   f"ordinal {ordinal} ({self.n} devices)",
                                   ERROR_INVALID_DEVICE)
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

    # -- device memory: memory.pyx SingleDeviceMemoryPool, one per device ------

    def alloc(self, nbytes: int) -> _Block:
        """A block for ``nbytes`` on the current device, from the arena of the
        current stream: a freed block of the same size there first."""
        ordinal = self.device
        if ordinal in self.fail_alloc or nbytes > self.memory_bytes:
            self.log.append(("alloc_failed", ordinal, nbytes))
            raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes on "
                                   f"device {ordinal}")
        size = -(-max(nbytes, 1) // DEVICE_UNIT) * DEVICE_UNIT
        arena = self.current_queue().id
        free = self.pools[ordinal].get((arena, size))
        if free:
            block = free.pop()
            buf = block.buf

            def refill() -> None:  # fresh-looking again, in stream order
                buf[...] = GARBAGE

            self.put(self.queues[arena], refill, "reuse")
            return block
        ptr = self._addr[ordinal]
        self._addr[ordinal] += size
        block = _Block(ptr, ordinal, np.full(size, GARBAGE, np.uint8), arena)
        self.blocks.append(block)
        return block

    def release(self, block: _Block) -> None:
        """The last array over ``block`` is gone: back to its arena at once
        (memory.pyx SingleDeviceMemoryPool.free, stream-ordered per arena)."""
        accesses = ([block.last_write] if block.last_write else []) + block.reads
        for q, what in self.pending(accesses):
            if q.id != block.arena:
                self.races.append(
                    f"device memory at {block.ptr:#x} (device {block.ordinal}) went "
                    f"back to the pool of {self.queues[block.arena].name} while "
                    f"{what} was still queued")
        self.pools[block.ordinal].setdefault((block.arena, block.buf.size),
                                             []).append(block)

    def free_all_blocks(self) -> None:
        """Release the current device's free blocks (memory.pyx
        MemoryPool.free_all_blocks acts on ``device_pool()`` only)."""
        ordinal = self.device
        for blocks in self.pools[ordinal].values():
            for b in blocks:
                b.freed = True
        self.blocks = [b for b in self.blocks if not b.freed]
        self.pools[ordinal].clear()
        self.pool_frees[ordinal] += 1

    def resolve(self, ptr: int, nbytes: int) -> tuple[_Block, int]:
        """The block holding ``[ptr, ptr + nbytes)`` and the offset in it."""
        for b in self.blocks:
            if b.ptr <= ptr and ptr + nbytes <= b.ptr + b.buf.size:
                return b, ptr - b.ptr
        raise CUDARuntimeError(f"cudaErrorInvalidValue: {nbytes} bytes at "
                               f"{ptr:#x} are not inside one allocation",
                               ERROR_INVALID_VALUE)

    # -- pinned memory: pinned_memory.pyx PinnedMemoryPool -----------------------

    def alloc_pinned(self, size: int) -> Any:
        """``cupy.cuda.alloc_pinned_memory``: a block rounded up to a power of
        two, the last freed one of that size first, whatever still uses it."""
        unit = max(1, -(-size // PINNED_UNIT)) * PINNED_UNIT
        rounded = 1 << (unit - 1).bit_length()
        free = self.pinned_free.get(rounded)
        reused = bool(free)
        block = free.pop() if free else _PinnedBlock(bytearray([GARBAGE]) * rounded)
        self.log.append(("pinned", rounded, reused))
        owner = _pinned_type(rounded).from_buffer(block.mem)
        owner._pinned_block = block
        weakref.finalize(owner, self.release_pinned, block).atexit = False
        return owner

    def release_pinned(self, block: _PinnedBlock) -> None:
        """The last view of a pinned buffer is gone: back to the pool at once
        (PooledPinnedMemory.free); the pool tracks no stream."""
        for q, pos in block.uses:
            if q.done < pos:
                self.races.append(
                    f"pinned host memory ({len(block.mem)} bytes) went back to the "
                    f"pool while a copy queued on {q.name} still used it")
        block.uses = [(q, p) for q, p in block.uses if q.done < p]
        self.pinned_free.setdefault(len(block.mem), []).append(block)

    def next_id(self) -> int:
        return next(self._ids)


_PINNED_TYPES: dict[int, type] = {}


def _pinned_type(size: int) -> type:
    """A ctypes array type of ``size`` bytes: an object NumPy wraps without
    copying and keeps alive (``np.frombuffer``), as CuPy's PinnedMemoryPointer."""
    if size not in _PINNED_TYPES:
        _PINNED_TYPES[size] = type(f"PinnedMemory{size}", (ctypes.c_uint8 * size,),
                                   {"__doc__": "A pooled page-locked buffer."})
    return _PINNED_TYPES[size]


def _block_of(a: Any) -> _Block:
    return a._alloc.block if isinstance(a, ndarray) else a


def _pinned_of(a: np.ndarray) -> tuple[_PinnedBlock, np.ndarray] | None:
    """The pinned block under ``a`` and a view of the same bytes that does not
    keep the buffer alive (a queued copy holds a pointer, not a reference), or
    None for pageable or non-contiguous memory."""
    obj: Any = a
    while obj is not None:
        block = getattr(obj, "_pinned_block", None)
        if block is not None:
            if not a.flags.c_contiguous:
                return None
            raw = np.frombuffer(block.mem, np.uint8)
            offset = (a.__array_interface__["data"][0]
                      - raw.__array_interface__["data"][0])
            view = raw[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
            return block, view
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
    return None


@dataclass(frozen=True)
class _MemoryPointer:
    ptr: int


class ndarray:  # noqa: N801  (CuPy's name)
    """A device array: a NumPy view of a block's bytes, plus its device.

    Only stream-ordered code touches the bytes; the host reaches them through
    ``get``/``asnumpy`` (``__array__`` refuses, as CuPy does). Queued work holds
    the bytes, not the array, so dropping the last array returns the block to
    the pool even while work that uses it is queued -- as in CuPy.
    """

    def __init__(self, gpus: Gpus, a: np.ndarray, alloc: _Allocation):
        self._gpus, self._a, self._alloc = gpus, a, alloc

    @classmethod
    def _new(cls, gpus: Gpus, shape: Any, dtype: Any) -> ndarray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        block = gpus.alloc(nbytes)
        return cls(gpus, block.buf[:nbytes].view(dtype).reshape(shape),
                   _Allocation(gpus, block))

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    device_id = property(lambda self: self._alloc.block.ordinal)

    @property
    def data(self) -> _MemoryPointer:
        block = self._alloc.block
        offset = self._a.__array_interface__["data"][0] \
            - block.buf.__array_interface__["data"][0]
        return _MemoryPointer(block.ptr + offset)

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
        if not np.shares_memory(a, self._alloc.block.buf):
            raise NotImplementedError("the stand-in supports views only here")
        return ndarray(self._gpus, a, self._alloc)

    def __getitem__(self, key: Any) -> ndarray:
        return self._view(self._a[key])

    def reshape(self, *shape: Any) -> ndarray:
        return self._view(self._a.reshape(*shape))

    def _fill(self, what: str, fill: Callable[[], Any],
              reads: tuple[ndarray, ...] = ()) -> ndarray:
        """Queue ``self[...] = fill()`` on the current stream; ``self``.
        ``fill`` must hold NumPy views, never an ndarray (see the class)."""
        target = self._a

        def op() -> None:
            target[...] = fill()

        gpus = self._gpus
        gpus.put(gpus.current_queue(), op, what, reads=reads, writes=(self,))
        return self

    def copy(self) -> ndarray:
        self._here()
        out = ndarray._new(self._gpus, self.shape, self.dtype)
        src = self._a
        return out._fill("copy", lambda: src, (self,))

    def astype(self, dtype: Any) -> ndarray:
        self._here()
        out = ndarray._new(self._gpus, self.shape, dtype)
        src, to = self._a, out.dtype
        return out._fill("astype", lambda: src.astype(to), (self,))

    def sum(self, dtype: Any = None) -> ndarray:
        self._here()
        out = ndarray._new(self._gpus, (), np.sum(np.zeros(1, self.dtype),
                                                   dtype=dtype).dtype)
        src = self._a
        return out._fill("sum", lambda: src.sum(dtype=dtype), (self,))

    def __add__(self, other: ndarray) -> ndarray:
        self._here(other)
        out = ndarray._new(self._gpus, np.broadcast_shapes(self.shape, other.shape),
                           np.result_type(self.dtype, other.dtype))
        a, b = self._a, other._a
        return out._fill("add", lambda: a + b, (self, other))

    def __iadd__(self, other: ndarray) -> ndarray:
        self._here(other)
        a, b = self._a, other._a

        def op() -> None:
            np.add(a, b, out=a, casting="same_kind")

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
                f"{self.device_id} on a stream of device {stream.device_id}", 400)
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
            pinned = _pinned_of(arr)
            src = pinned[1] if pinned else arr.copy()  # pageable: staged now
            dst = self._a

            def op() -> None:
                dst[...] = src

            pos = self._gpus.put(q, op, "copy to device", writes=(self,))
            if pinned:
                pinned[0].uses.append((q, pos))
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
            pinned = _pinned_of(out)
            dst = pinned[1] if pinned else out
            src = self._a

            def op() -> None:
                dst[...] = src

            pos = self._gpus.put(q, op, "copy to host", reads=(self,))
            if pinned:
                pinned[0].uses.append((q, pos))
            if blocking or not pinned:
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
        gpus.queues[self._queue.id] = self._queue

    def __enter__(self) -> Stream:
        # stream.pyx check_stream_device_match: only on the device it was made on
        if self.device_id != self._gpus.device:
            raise RuntimeError(f"The device that the stream is created on "
                               f"({self.device_id}) does not match with the "
                               f"current device ({self._gpus.device})")
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

        def wait() -> float:
            source.run_until(position)
            return source.vtimes[position]

        self._gpus.put(self._queue, wait, "wait_event")


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
                f"recorded on a stream of device {q.ordinal}", 400)
        token = object()
        self._token, self.time = token, None

        def stamp() -> None:
            if self._token is token:
                self.time = q.vnow

        self._gpus.log.append(("event", q.ordinal, q.name))
        self._queue, self._pos = q, self._gpus.put(q, stamp, "event record")

    def synchronize(self) -> None:
        if self._queue is not None:
            self._gpus.host_wait(self._queue, self._pos)

    @property
    def done(self) -> bool:
        return self._queue is None or self._queue.done >= self._pos


def _elapsed_ms(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise CUDARuntimeError("cudaErrorNotReady: an event has not completed", 600)
    return (end.time - start.time) * 1e3


class MemoryPool:
    """``cupy.get_default_memory_pool()``: one pool per device; each call acts
    on the current device's (memory.pyx MemoryPool.device_pool)."""

    def __init__(self, gpus: Gpus):
        self._gpus = gpus

    def free_all_blocks(self, stream: Any = None) -> None:
        self._gpus.free_all_blocks()

    def n_free_blocks(self) -> int:
        return sum(len(b) for b in self._gpus.pools[self._gpus.device].values())


class PinnedMemoryPool:
    """``cupy.get_default_pinned_memory_pool()``: one pool for the host."""

    def __init__(self, gpus: Gpus):
        self._gpus = gpus

    def free_all_blocks(self) -> None:
        self._gpus.pinned_free.clear()
        self._gpus.pinned_pool_frees += 1

    def n_free_blocks(self) -> int:
        return sum(len(b) for b in self._gpus.pinned_free.values())


def _check_launch(gpus: Gpus, name: str, grid: tuple[int, ...],
                  block: tuple[int, ...], shared_mem: int,
                  static_shared: int | None) -> None:
    """What cuLaunchKernel refuses (function.pyx _launch passes the launch to
    the driver unchanged): CUDA_ERROR_INVALID_VALUE."""
    limits = (MAX_GRID_X, gpus.max_grid_yz, gpus.max_grid_yz)
    bad = (len(grid) > 3 or len(block) > 3 or min(grid + block) < 1
           or any(g > lim for g, lim in zip(grid, limits, strict=False))
           or any(b > lim for b, lim in zip(block, MAX_BLOCK_DIMS, strict=False))
           or int(np.prod(block)) > MAX_THREADS
           or shared_mem + (static_shared or 0) > SHARED_LIMIT)
    if bad:
        raise CUDADriverError(f"CUDA_ERROR_INVALID_VALUE: invalid argument ({name} "
                              f"grid {grid} block {block} shared {shared_mem} B)", 1)


class RawKernel:
    """One entry point; calling it queues an emulated launch (the emulator
    binary is waited for when the launch runs)."""

    def __init__(self, gpus: Gpus, binary: Callable[[], Path], name: str,
                 params: list[Param], static_shared: int | None):
        self._gpus, self.binary, self.name, self.params = gpus, binary, name, params
        self.static_shared = static_shared

    def __call__(self, grid: Any, block: Any, args: tuple, *, shared_mem: int = 0,
                 stream: Any = None) -> None:
        gpus = self._gpus
        grid = tuple(grid) if isinstance(grid, tuple) else (grid, 1, 1)
        block = tuple(block) if isinstance(block, tuple) else (block, 1, 1)
        _check_launch(gpus, self.name, grid, block, shared_mem, self.static_shared)
        q = stream._queue if stream is not None else gpus.current_queue()
        if q.ordinal != gpus.device:
            raise CUDARuntimeError(
                f"cudaErrorInvalidResourceHandle: {self.name} launched on device "
                f"{gpus.device} on a stream of device {q.ordinal}", 400)
        if not isinstance(args, tuple) or len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got "
                            f"{args!r:.80}")
        plan: list[tuple[Any, bool | None]] = []
        arrays, written = [], []
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
                plan.append((arg._a, p.const))  # the bytes, not the array
                arrays.append(arg)
                if not p.const:
                    written.append(arg)
            else:
                if not isinstance(arg, np.generic) or arg.dtype != p.dtype:
                    raise TypeError(f"{where}: expected a {p.dtype} scalar, got "
                                    f"{type(arg).__name__} {arg!r}")
                plan.append((SCALARS[p.dtype](arg.item()), None))
        gpus.log.append(("launch", gpus.device, self.name, q.name))
        binary, name = self.binary, self.name

        def op() -> None:
            emu_args = [emulate.Buffer(a.copy(), not const) if const is not None
                        else a for a, const in plan]
            results = iter(emulate.run_emulated(binary(), name, grid, block,
                                                emu_args, timeout_s=60.0))
            for a, const in plan:
                if const is False:
                    a[...] = next(results)

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
        self.code, self.defines = code, defines

    def get_function(self, name: str) -> RawKernel:
        # raw.pyx RawModule compiles on first use; ptxas refuses static shared
        # memory over the 48 KiB a block may have without opting in.
        builds = self._gpus.builds
        shared = builds.shared_bytes(self.code, self.defines)
        if shared is not None and shared > SHARED_LIMIT:
            raise CompileException(f"ptxas error   : Entry function '{name}' uses "
                                   f"too much shared data ({shared:#x} bytes, "
                                   f"{SHARED_LIMIT:#x} max)")
        code, defines = self.code, self.defines
        builds._future(code, defines)  # built meanwhile; waited for at the launch
        return RawKernel(self._gpus, lambda: builds.binary(code, defines), name,
                         kernel_params(code, name), shared)


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
        views, blocks = [], []
        for ptr in (sendbuf, recvbuf):
            block, offset = gpus.resolve(ptr, count * dtype.itemsize)
            if block.ordinal != dev:
                raise RuntimeError(f"NCCL error: buffer on device {block.ordinal} "
                                   f"for the rank on device {dev}")
            views.append(block.buf[offset:offset + count * dtype.itemsize]
                         .view(dtype))
            blocks.append(block)
        q = gpus.null[dev] if stream == 0 else gpus.streams[stream]._queue
        if q.ordinal != dev:
            raise RuntimeError(f"NCCL error: stream of device {q.ordinal} for the "
                               f"rank on device {dev}")
        call = (self, views[0], views[1], count, dtype, q, blocks[0], blocks[1])
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
        self.ended = 0.0

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

    def run(self) -> float:
        if self.done:
            return self.ended
        for call, pos in zip(self.calls, self.positions, strict=True):
            call[5].run_until(pos - 1)
        total = np.sum([c[1] for c in self.calls], axis=0, dtype=self.calls[0][4])
        for c in self.calls:
            c[2][...] = total
        self.done = True
        self.ended = max(c[5].vtimes[pos - 1]
                         for c, pos in zip(self.calls, self.positions, strict=True))
        return self.ended


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
    """``cudaMemcpyPeer``: serialised with all work on both devices; direct
    where the destination device has peer access to the source, else staged
    through the host (CUDA copies either way)."""
    (d, doff), (s, soff) = gpus.resolve(dst, nbytes), gpus.resolve(src, nbytes)
    if d.ordinal != dst_dev or s.ordinal != src_dev:
        raise CUDARuntimeError(
            f"cudaErrorInvalidValue: memcpyPeer named devices {dst_dev} <- "
            f"{src_dev} for memory on {d.ordinal} <- {s.ordinal}", ERROR_INVALID_VALUE)
    for o in {dst_dev, src_dev}:
        for q in gpus.queues_of(o):
            gpus.host_wait(q)
    direct = (dst_dev, src_dev) in gpus.peers_enabled
    gpus.log.append(("memcpy_peer", dst_dev, src_dev, nbytes, direct))
    gpus.host_access("memcpyPeer", reads=(s,), writes=(d,))
    d.buf[doff:doff + nbytes] = s.buf[soff:soff + nbytes]


def _enable_peer_access(gpus: Gpus, peer: int) -> None:
    """``cudaDeviceEnablePeerAccess(peer, 0)`` from the current device
    (runtime.pyx deviceEnablePeerAccess: check_status raises on any error)."""
    me = gpus.device
    gpus.check_ordinal(peer)
    if peer == me:
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal",
                               ERROR_INVALID_DEVICE)
    if not gpus.peer_access(me, peer):
        raise CUDARuntimeError("cudaErrorPeerAccessUnsupported: peer access is not "
                               "supported between these two devices",
                               ERROR_PEER_ACCESS_UNSUPPORTED)
    if (me, peer) in gpus.peers_enabled:
        raise CUDARuntimeError("cudaErrorPeerAccessAlreadyEnabled: peer access is "
                               "already enabled", ERROR_PEER_ACCESS_ALREADY_ENABLED)
    gpus.peers_enabled.add((me, peer))
    gpus.log.append(("peer_enabled", me, peer))


# ----------------------------------------------------------------------------
# The module


def _bound(cls: type, gpus: Gpus, **extra: Any) -> type:
    return type(cls.__name__, (cls,), {"_gpus": gpus, **extra})


def _no_attribute(module: str, lazy: Iterable[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that knows nothing: submodules in ``lazy`` are
    reached only by importing them (cupy/cuda/__init__.py's ``__getattr__``
    does not offer ``nccl``)."""
    names = set(lazy)

    def missing(key: str) -> Any:
        hint = " (import it first)" if key in names else ""
        raise AttributeError(f"module '{module}' has no attribute '{key}'{hint}")

    return missing


def make_cupy(devices: int, builds: KernelBuilds, *,
              peer_access: Callable[[int, int], bool] | None = None,
              fail_alloc: Iterable[int] = (), nccl: bool = True,
              max_grid_yz: int = MAX_GRID_YZ,
              bus_ids: Sequence[str] | None = None,
              memory_bytes: int = MEMORY_BYTES) -> types.ModuleType:
    """A fresh stand-in ``cupy`` module over ``devices`` emulated GPUs.

    Args:
        devices: how many devices ``getDeviceCount`` reports.
        builds: the (session-wide) emulator binaries.
        peer_access: ``deviceCanAccessPeer(a, b)``; default every distinct pair.
        fail_alloc: ordinals on which every allocation runs out of memory.
        nccl: whether NCCL's library is there (else ``cupy.cuda.nccl`` has only
            ``available = False``).
        max_grid_yz: largest grid extent in y and z (65535 on every GPU; a test
            lowers it to cross the limit with a small task).
        bus_ids: ``deviceGetPCIBusId`` of each ordinal; default made up.
        memory_bytes: each device's memory; a larger allocation fails.

    Returns:
        The module; ``module.gpus`` is its :class:`Gpus` (state and log).
    """
    gpus = Gpus(devices, builds, peer_access, fail_alloc, max_grid_yz, bus_ids,
                memory_bytes)
    cp = types.ModuleType("cupy", "An emulated CuPy (tests/emulated_cupy.py).")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    driver = types.ModuleType("cupy.cuda.driver")
    memory = types.ModuleType("cupy.cuda.memory")
    compiler = types.ModuleType("cupy.cuda.compiler")
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

    def bus_id(ordinal: int) -> str:
        return gpus.bus_ids[gpus.check_ordinal(ordinal)]

    pools = (MemoryPool(gpus), PinnedMemoryPool(gpus))
    cp.__dict__.update(
        gpus=gpus, ndarray=ndarray, empty=empty, empty_like=empty_like, zeros=zeros,
        asarray=asarray, asnumpy=asnumpy, ascontiguousarray=ascontiguousarray,
        float16=np.float16, float32=np.float32, float64=np.float64,
        uint8=np.uint8, uint16=np.uint16, uint32=np.uint32, int32=np.int32,
        int64=np.int64,
        RawModule=_bound(RawModule, gpus), cuda=cuda,
        get_default_memory_pool=lambda: pools[0],
        get_default_pinned_memory_pool=lambda: pools[1],
    )
    runtime.__dict__.update(
        getDeviceCount=lambda: gpus.n,
        deviceCanAccessPeer=lambda a, b: int(a != b and bool(gpus.peer_access(a, b))),
        deviceEnablePeerAccess=lambda peer: _enable_peer_access(gpus, peer),
        deviceGetPCIBusId=bus_id,
        memcpyPeer=lambda *args: _memcpy_peer(gpus, *args),
        CUDARuntimeError=CUDARuntimeError,
        errorInvalidValue=ERROR_INVALID_VALUE,
        errorMemoryAllocation=ERROR_MEMORY_ALLOCATION,
        errorPeerAccessAlreadyEnabled=ERROR_PEER_ACCESS_ALREADY_ENABLED,
    )
    driver.__dict__.update(CUDADriverError=CUDADriverError)
    memory.__dict__.update(OutOfMemoryError=OutOfMemoryError, MemoryPool=MemoryPool)
    compiler.__dict__.update(CompileException=CompileException)
    nccl_mod.available = nccl
    gpus.nccl_module = nccl_mod  # reached through sys.modules only (install)
    if nccl:  # cupy/cuda/nccl.py: the names come from the library or not at all
        nccl_mod.__dict__.update(
            NCCL_INT64=4, NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_SUM=0,
            NcclCommunicator=_bound(NcclCommunicator, gpus),
            groupStart=lambda: _group_start(gpus), groupEnd=lambda: _group_end(gpus),
            NcclError=RuntimeError,
        )
    cuda.__dict__.update(
        Device=_bound(Device, gpus), Event=_bound(Event, gpus),
        Stream=_bound(Stream, gpus, null=_NullStream(gpus)),
        get_elapsed_time=_elapsed_ms, alloc_pinned_memory=gpus.alloc_pinned,
        runtime=runtime, driver=driver, memory=memory, compiler=compiler,
        __getattr__=_no_attribute("cupy.cuda", ("nccl",)),
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
    cuda = cp.cuda
    for name, module in (("cupy", cp), ("cupy.cuda", cuda),
                         ("cupy.cuda.runtime", cuda.runtime),
                         ("cupy.cuda.driver", cuda.driver),
                         ("cupy.cuda.memory", cuda.memory),
                         ("cupy.cuda.compiler", cuda.compiler),
                         ("cupy.cuda.nccl", cp.gpus.nccl_module)):
        monkeypatch.setitem(sys.modules, name, module)
