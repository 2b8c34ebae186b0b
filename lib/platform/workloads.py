"""The five divisible workload classes: work counts, NumPy references, shards.

Each class answers, for a :class:`~lib.contract.TaskSpec`:

- :meth:`Workload.work` -- FLOP, bytes moved and memory needed by a shard of
  ``rows`` rows of the divisible dimension (what the cost model and Gate 1 use);
- :meth:`Workload.make_inputs` and :meth:`Workload.reference` -- seeded inputs
  and the NumPy ground truth; :meth:`Workload.make_shard_inputs` -- one
  shard's inputs drawn alone, the same values (a Dask worker's);
- :meth:`Workload.shard_inputs`, :meth:`Workload.compute` and
  :meth:`Workload.merge` -- how a share becomes a shard, what one device computes,
  and how the partial results combine.

Shard boundaries come from :func:`split_rows` (largest-remainder rounding), so
shards cover the dimension exactly: no gap, no overlap.

Host representation of dtypes: fp16 -> ``float16``; bf16 -> ``float32`` holding
values rounded to bf16 (NumPy has no bfloat16); fp32 -> ``float32``; fp64 ->
``float64``. Arithmetic on 16-bit inputs accumulates in fp32, as the kernels do.

Why one module: each kind's work counts, inputs, reference and shard cutting
describe one computation, and every backend, the cost model and Gate 1 read
them together; the shared pieces (how inputs are drawn, in blocks and by
rows; how shares become rows; how a result is verified) are what make the
five kinds agree with each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from lib.contract import TaskSpec

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True, init=False)
class ShardWork:
    """What one shard costs.

    Attributes:
        rows: rows/elements of the divisible dimension in the shard.
        flops: floating-point operations.
        mem_traffic: bytes read and written in device memory (roofline's Q).
        bytes_in_rows: host-to-device bytes that scale with the shard's rows.
        bytes_in_fixed: host-to-device bytes every shard needs whatever its size
            (matmul's B, stencil halo rows).
        bytes_out: device-to-host bytes of the shard's result.
        footprint: device memory the shard needs (inputs, outputs, scratch).
    """

    rows: int
    flops: float
    mem_traffic: float
    bytes_in_rows: float
    bytes_in_fixed: float
    bytes_out: float
    footprint: float

    def __init__(self, rows: int, flops: float, mem_traffic: float,
                 bytes_in_rows: float, bytes_in_fixed: float, bytes_out: float,
                 footprint: float) -> None:
        # what the frozen dataclass's own __init__ does, in one step: a
        # shard's work is counted for every decision
        self.__dict__.update(rows=rows, flops=flops, mem_traffic=mem_traffic,
                             bytes_in_rows=bytes_in_rows,
                             bytes_in_fixed=bytes_in_fixed, bytes_out=bytes_out,
                             footprint=footprint)

    @property
    def bytes_in(self) -> float:
        """All host-to-device bytes."""
        return self.bytes_in_rows + self.bytes_in_fixed


def split_rows(n: int, shares: Sequence[float]) -> list[tuple[int, int]]:
    """Cut ``range(n)`` into contiguous ``[lo, hi)`` pieces proportional to shares.

    Largest-remainder rounding: each piece gets ``floor(n * share)`` rows, then
    the rows left over go one each to the largest fractional remainders (ties to
    the lower index). Pieces are in order and cover ``[0, n)`` exactly.

    Args:
        n: size of the divisible dimension (>= 0).
        shares: non-negative weights; they are normalised by their sum.
    """
    bounds, lo = [], 0
    for r in split_sizes(n, shares):
        bounds.append((lo, lo + r))
        lo += r
    return bounds


def split_sizes(n: int, shares: Sequence[float]) -> list[int]:
    """The piece sizes of :func:`split_rows` (rows per piece, in order)."""
    total = math.fsum(shares)
    if total <= 0 or any(s < 0 for s in shares):
        raise ValueError("shares must be non-negative with a positive sum")
    exact = [n * s / total for s in shares]
    rows = [int(math.floor(x)) for x in exact]
    left = n - sum(rows)
    if left:
        order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - rows[i]), i))
        for i in order[:left]:
            rows[i] += 1
    return rows


def host_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that holds ``dtype`` on the host."""
    return np.dtype({"fp16": np.float16, "bf16": np.float32, "fp32": np.float32,
                     "fp64": np.float64}[dtype])


def compute_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype arithmetic accumulates in (fp32 for 16-bit inputs)."""
    return np.dtype(np.float64 if dtype == "fp64" else np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded & np.uint32(0xFFFF0000)).view(np.float32)


#: Elements drawn at a time by :func:`_uniform`: the float64 draws stay a
#: few MB, so making an input takes little more memory than the input.
DRAW_BLOCK = 1 << 20


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype: str,
             low: float = 0.0, high: float = 1.0,
             rows: tuple[int, int] | None = None) -> np.ndarray:
    """Uniform values in ``dtype``'s host type, drawn :data:`DRAW_BLOCK` at a
    time (the same values as one draw of the whole: each takes the next of
    the generator's 64-bit numbers), rounded through float32 as the devices
    hold them.

    ``rows=(lo, hi)``: only rows ``[lo, hi)`` of the first axis, the values
    the whole draw would give them; the generator skips the rest
    (``advance``), so it ends where the whole draw would, and the next input
    drawn from it is the same too."""
    lo, hi = rows if rows is not None else (0, shape[0] if shape else 1)
    per_row = math.prod(shape[1:])
    out = np.empty((hi - lo, *shape[1:]), dtype=host_dtype(dtype))
    flat = out.reshape(-1)
    step = np.float64 if dtype == "fp64" else np.float32
    if lo:
        rng.bit_generator.advance(lo * per_row)
    for start in range(0, flat.size, DRAW_BLOCK):
        x = rng.uniform(low, high, size=min(DRAW_BLOCK, flat.size - start)).astype(step)
        flat[start:start + x.size] = round_bf16(x) if dtype == "bf16" else x
    if rows is not None and hi < shape[0]:
        rng.bit_generator.advance((shape[0] - hi) * per_row)
    return out if rows is not None else out.reshape(shape)


def _draw_x(task: TaskSpec, seed: int, rows: tuple[int, int] | None) -> Arrays:
    """``x[N]`` uniform in [0, 1), whole or rows ``[lo, hi)`` of it."""
    return {"x": _uniform(np.random.default_rng(seed), (task.dims["N"],),
                          task.dtype, rows=rows)}


class Workload:
    """Base class: one workload kind. Subclasses fill in the formulas."""

    kind: ClassVar[str]
    #: ``"compute"`` or ``"memory"``: which roofline limit usually binds.
    bound: ClassVar[str]
    #: one line for tables and the book.
    summary: ClassVar[str]
    #: What a run on the cpu backend may hold in the computer's memory at
    #: once, in whole-task footprints (the inputs and output shared with the
    #: workers, the result, the workers' temporaries); see
    #: :func:`lib.execution.base.check_host_memory`. A kind that does not say
    #: is taken at the stencil's, the most a built-in kind was MEASURED to
    #: hold (2.9 footprints).
    host_footprints: ClassVar[float] = 3.5

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        raise NotImplementedError

    def total_work(self, task: TaskSpec) -> ShardWork:
        """The whole task as one shard."""
        return self.work(task, task.split_size)

    def make_inputs(self, task: TaskSpec, seed: int = 0) -> Arrays:
        """The whole task's inputs, seeded (:meth:`draw` with no rows)."""
        return self.draw(task, seed, None)

    def draw(self, task: TaskSpec, seed: int, rows: tuple[int, int] | None
             ) -> Arrays:
        """The inputs from the seed: the whole task's (``rows`` None), or what
        the shard of rows ``[lo, hi)`` needs, the values the whole would
        give it. A kind that makes its inputs whole only overrides
        :meth:`make_inputs` instead."""
        raise NotImplementedError

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        """Views of the inputs one shard needs (no copies)."""
        raise NotImplementedError

    def make_shard_inputs(self, task: TaskSpec, seed: int, lo: int, hi: int
                          ) -> Arrays:
        """What :meth:`shard_inputs` takes from :meth:`make_inputs`, made on
        its own (a Dask worker makes its shard's inputs from the seed): the
        same values, as arrays of their own. A built-in kind draws only the
        rows the shard needs (:meth:`draw`); a kind that makes its inputs
        whole only has them made and copies the shard's out."""
        if type(self).draw is not Workload.draw:
            return self.draw(task, seed, (lo, hi))
        shard = self.shard_inputs(task, self.make_inputs(task, seed), lo, hi)
        return {k: np.array(v, copy=True) for k, v in shard.items()}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        """The shard's partial result, computed with NumPy."""
        raise NotImplementedError

    def merge(self, task: TaskSpec, partials: Sequence[np.ndarray]) -> np.ndarray:
        """Combine partial results (in shard order)."""
        if task.merge == "sum":
            out = np.zeros_like(partials[0])
            for p in partials:
                out += p
            return out
        return np.concatenate(partials, axis=0)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        raise NotImplementedError

    def output_dtype(self, task: TaskSpec) -> np.dtype:
        return host_dtype(task.dtype)

    def reference(self, task: TaskSpec, inputs: Arrays) -> np.ndarray:
        """The ground truth: the whole task as one shard."""
        n = task.split_size
        return self.compute(task, self.shard_inputs(task, inputs, 0, n), 0, n)

    def tolerance(self, task: TaskSpec) -> tuple[float, float]:
        """(rtol, atol) for verification: ``|out - ref| <= atol + rtol*max|ref|``."""
        rtol = {"fp16": 1e-2, "bf16": 2e-2, "fp32": 1e-4, "fp64": 1e-10}[task.dtype]
        return rtol, 0.0


class Matmul(Workload):
    """C[M,N] = A[M,K] B[K,N]; rows of A (and C) are split, B goes to every shard."""

    kind = "matmul"
    bound = "compute"
    summary = "C = A B, rows of A split, C concatenated"
    host_footprints = 2.5   # MEASURED at most 2.0 (cpu backend)

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        _, n, k = task.dims.values()
        e = task.itemsize
        return ShardWork(
            rows=rows, flops=2.0 * rows * n * k,
            mem_traffic=float(e * (rows * k + (k * n if rows else 0) + rows * n)),
            bytes_in_rows=float(e * rows * k),
            bytes_in_fixed=float(e * k * n) if rows else 0.0,
            bytes_out=float(e * rows * n),
            footprint=float(e * (rows * k + k * n + rows * n)) if rows else 0.0,
        )

    def draw(self, task: TaskSpec, seed: int, rows: tuple[int, int] | None
             ) -> Arrays:
        m, n, k = task.dims.values()
        rng = np.random.default_rng(seed)
        return {"A": _uniform(rng, (m, k), task.dtype, -1, 1, rows),
                "B": _uniform(rng, (k, n), task.dtype, -1, 1)}

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        return {"A": inputs["A"][lo:hi], "B": inputs["B"]}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        acc = compute_dtype(task.dtype)
        out = shard["A"].astype(acc, copy=False) @ shard["B"].astype(acc, copy=False)
        return out.astype(self.output_dtype(task), copy=False)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        return (rows, task.dims["N"])

    def tolerance(self, task: TaskSpec) -> tuple[float, float]:
        rtol, atol = super().tolerance(task)
        # K-term dot products: rounding grows with sqrt(K).
        return rtol * max(1.0, math.sqrt(task.dims["K"]) / 8), atol


class Reduce(Workload):
    """sum(x[N]); each shard sums its slice, partial sums add up."""

    kind = "reduce"
    bound = "memory"
    summary = "sum of x, slices summed per device, partial sums added"
    host_footprints = 2.5   # MEASURED at most 2.0 (cpu backend)

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        e = task.itemsize
        out = 8.0 if task.dtype == "fp64" else 4.0
        return ShardWork(rows=rows, flops=float(rows), mem_traffic=float(e * rows),
                         bytes_in_rows=float(e * rows), bytes_in_fixed=0.0,
                         bytes_out=out if rows else 0.0,
                         footprint=float(e * rows + 4096) if rows else 0.0)

    def draw(self, task: TaskSpec, seed: int, rows: tuple[int, int] | None
             ) -> Arrays:
        return _draw_x(task, seed, rows)

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        return {"x": inputs["x"][lo:hi]}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        total = np.sum(shard["x"], dtype=np.float64)
        return np.array([total], dtype=self.output_dtype(task))

    def output_dtype(self, task: TaskSpec) -> np.dtype:
        return np.dtype(np.float64 if task.dtype == "fp64" else np.float32)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        return (1,)

    def tolerance(self, task: TaskSpec) -> tuple[float, float]:
        return (1e-10 if task.dtype == "fp64" else 1e-5), 0.0


class Elementwise(Workload):
    """out = a*x + y (saxpy-like, a = 2.5); slices concatenated."""

    kind = "elementwise"
    bound = "memory"
    summary = "out = a x + y, slices concatenated"
    host_footprints = 2.5   # MEASURED at most 2.0 (cpu backend)
    A = 2.5

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        e = task.itemsize
        return ShardWork(rows=rows, flops=2.0 * rows, mem_traffic=3.0 * e * rows,
                         bytes_in_rows=2.0 * e * rows, bytes_in_fixed=0.0,
                         bytes_out=float(e * rows), footprint=3.0 * e * rows)

    def draw(self, task: TaskSpec, seed: int, rows: tuple[int, int] | None
             ) -> Arrays:
        rng = np.random.default_rng(seed)
        n = task.dims["N"]
        return {"x": _uniform(rng, (n,), task.dtype, -1, 1, rows),
                "y": _uniform(rng, (n,), task.dtype, -1, 1, rows)}

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        return {"x": inputs["x"][lo:hi], "y": inputs["y"][lo:hi]}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        acc = compute_dtype(task.dtype)
        out = acc.type(self.A) * shard["x"].astype(acc) + shard["y"].astype(acc)
        return out.astype(self.output_dtype(task), copy=False)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        return (rows,)


class Stencil(Workload):
    """T Jacobi sweeps of the 5-point stencil on an HxW grid, edges held fixed.

    A shard of rows ``[lo, hi)`` is computed on the band ``[lo - T, hi + T)``
    (clipped to the grid): after T sweeps the error from the band's artificial
    edges has travelled at most T rows, so the shard's own rows are exact.
    """

    kind = "stencil"
    bound = "memory"
    summary = "T Jacobi sweeps, row bands with T halo rows each side"

    def _band(self, task: TaskSpec, lo: int, hi: int) -> tuple[int, int]:
        h, _, t = task.dims.values()
        return max(0, lo - t), min(h, hi + t)

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        h, w, t = task.dims.values()
        e = task.itemsize
        if rows == 0:
            return ShardWork(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        halo = min(2 * t, h - rows)
        band = rows + halo
        return ShardWork(
            rows=rows, flops=5.0 * band * w * t, mem_traffic=2.0 * e * band * w * t,
            bytes_in_rows=float(e * rows * w), bytes_in_fixed=float(e * halo * w),
            bytes_out=float(e * rows * w), footprint=2.0 * e * band * w,
        )

    def draw(self, task: TaskSpec, seed: int, rows: tuple[int, int] | None
             ) -> Arrays:
        h, w, _ = task.dims.values()   # a shard's band: its rows and halo
        return {"u": _uniform(np.random.default_rng(seed), (h, w), task.dtype,
                              rows=None if rows is None else self._band(task, *rows))}

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        a, b = self._band(task, lo, hi)
        return {"u": inputs["u"][a:b]}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        a, _ = self._band(task, lo, hi)
        acc = compute_dtype(task.dtype)
        u = shard["u"].astype(acc)
        nxt = u.copy()
        for _ in range(task.dims["T"]):
            nxt[1:-1, 1:-1] = acc.type(0.25) * (u[:-2, 1:-1] + u[2:, 1:-1]
                                                + u[1:-1, :-2] + u[1:-1, 2:])
            u, nxt = nxt, u
        return u[lo - a:hi - a].astype(self.output_dtype(task), copy=False)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        return (rows, task.dims["W"])


class Histogram(Workload):
    """Counts of x[N] in B equal bins over [0, 1); per-device counts add up."""

    kind = "histogram"
    bound = "memory"
    summary = "B-bin histogram, slices counted per device, counts added"
    host_footprints = 2.5   # MEASURED at most 2.0 (cpu backend)

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        e = task.itemsize
        bins = task.dims["B"]
        return ShardWork(rows=rows, flops=3.0 * rows,
                         mem_traffic=float(e * rows + 4 * bins),
                         bytes_in_rows=float(e * rows), bytes_in_fixed=0.0,
                         bytes_out=4.0 * bins if rows else 0.0,
                         footprint=float(e * rows + 4 * bins) if rows else 0.0)

    def draw(self, task: TaskSpec, seed: int, rows: tuple[int, int] | None
             ) -> Arrays:
        return _draw_x(task, seed, rows)

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        return {"x": inputs["x"][lo:hi]}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        """Counts of the shard's values, :data:`DRAW_BLOCK` at a time: the
        bin indices are int64, twice the input's size, and made whole they
        took a worker six times its shard's memory."""
        bins = task.dims["B"]
        x = shard["x"]
        counts = np.zeros(bins, dtype=np.int64)
        for start in range(0, x.shape[0], DRAW_BLOCK):
            part = x[start:start + DRAW_BLOCK].astype(np.float32)
            idx = np.clip((part * np.float32(bins)).astype(np.int64), 0, bins - 1)
            counts += np.bincount(idx, minlength=bins)
        return counts

    def output_dtype(self, task: TaskSpec) -> np.dtype:
        return np.dtype(np.int64)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        return (task.dims["B"],)

    def tolerance(self, task: TaskSpec) -> tuple[float, float]:
        return 0.0, 0.0


WORKLOADS: dict[str, Workload] = {
    w.kind: w for w in (Matmul(), Reduce(), Elementwise(), Stencil(), Histogram())
}
"""Every kind this process knows: the five built-in ones and any registered
with :func:`lib.platform.user_kinds.register_workload`."""


def workload(kind_or_task: str | TaskSpec) -> Workload:
    """The :class:`Workload` for a kind name or a task.

    Raises:
        KeyError: the kind is neither built in nor registered here.
    """
    kind = kind_or_task.kind if isinstance(kind_or_task, TaskSpec) else kind_or_task
    try:
        return WORKLOADS[kind]
    except KeyError:
        raise KeyError(f"kind {kind!r} is not known here; expected one of "
                       f"{', '.join(WORKLOADS)}") from None


#: The last :func:`whole_work`: (task, workload, sizes, work).
_LAST_WHOLE: tuple[object, ...] = (None, None, None, None)


def whole_work(task: TaskSpec) -> ShardWork:
    """``workload(task).total_work(task)``: the task's work as one shard.
    The last one is kept with the task object, workload and sizes it
    was computed for, so that the policy and Gate 1 deciding one task count
    it once; a task whose ``dims`` were changed in place, or a kind
    registered again, is counted afresh."""
    global _LAST_WHOLE
    w = workload(task)
    dims = task.dims
    sizes = tuple(dims.items())
    last = _LAST_WHOLE
    if last[0] is task and last[1] is w and last[2] == sizes:
        return last[3]
    whole = w.total_work(task)
    _LAST_WHOLE = (task, w, sizes, whole)
    return whole


def like_of(kind: str) -> str:
    """The built-in kind whose efficiencies and policy feature ``kind`` uses:
    ``kind`` itself for a built-in one."""
    w = WORKLOADS.get(kind)
    return getattr(w, "like", kind)


#: Elements compared at a time: the float64 copies a comparison makes stay a
#: few MB whatever the result's size.
VERIFY_BLOCK = 1 << 20

#: Bytes of a task's footprint one block of :func:`verify_in_blocks`'s
#: reference may cover: a task whose whole footprint fits is referenced whole.
REFERENCE_BLOCK_BYTES = 256 << 20


def _errors(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """``(max |out - ref|, max |ref|)`` of two arrays of one shape, in
    float64, :data:`VERIFY_BLOCK` elements at a time; a NaN in the error
    stays a NaN."""
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    errs, scales = [], []
    for lo in range(0, flat_out.size, VERIFY_BLOCK):
        a = flat_out[lo:lo + VERIFY_BLOCK].astype(np.float64)
        b = flat_ref[lo:lo + VERIFY_BLOCK].astype(np.float64)
        errs.append(np.abs(a - b).max())
        scales.append(np.abs(b).max())
    err = float(np.max(errs)) if errs else 0.0   # np.max keeps a NaN
    scale = float(np.max(scales)) if scales else 0.0
    return err, scale


def _within(task: TaskSpec, err: float, scale: float) -> bool:
    rtol, atol = workload(task).tolerance(task)
    return err <= atol + rtol * scale


def verify(task: TaskSpec, out: np.ndarray, ref: np.ndarray) -> tuple[bool, float]:
    """Compare a result with the reference: ``(within tolerance, max abs error)``,
    in float64, :data:`VERIFY_BLOCK` elements at a time. A NaN or an infinity
    that the reference does not have is an error of NaN, and fails."""
    if out.shape != ref.shape:
        return False, math.inf
    err, scale = _errors(out, ref)
    return _within(task, err, scale), err


def reference_block_bytes(task: TaskSpec) -> float:
    """Bytes of the task's footprint one block of :func:`verify_in_blocks`
    covers: the whole footprint where it fits in
    :data:`REFERENCE_BLOCK_BYTES`; else that many bytes of rows, and the
    inputs every block needs whole (matmul's B), which a block drawn from
    the seed draws again."""
    whole = workload(task).total_work(task)
    if whole.footprint <= REFERENCE_BLOCK_BYTES:
        return whole.footprint
    return REFERENCE_BLOCK_BYTES + whole.bytes_in_fixed


def verify_in_blocks(task: TaskSpec, out: np.ndarray, *,
                     inputs: Arrays | None = None, seed: int = 0
                     ) -> tuple[bool, float]:
    """:func:`verify` of ``out`` against the reference, computed in row
    blocks of at most :data:`REFERENCE_BLOCK_BYTES` of their rows' footprint
    (besides the inputs every block needs whole), so that the
    reference's result and temporaries stay a block whatever the task's size.
    Each block's inputs are cut from ``inputs`` (:meth:`Workload.shard_inputs`,
    views) or, where None, drawn from ``seed`` (:meth:`Workload.draw`, the
    values the whole would give them: a Dask client verifies this way, its
    workers having drawn the inputs). A stencil block takes its halo, so its
    own rows are exact; a ``sum`` kind's partials are added up before the
    comparison. A task that fits in one block is referenced whole, as
    :meth:`Workload.reference` does, and so are the blocks of a kind that
    only makes its inputs whole, from those."""
    w = workload(task)
    n = task.split_size
    if inputs is None and type(w).draw is Workload.draw:
        inputs = w.make_inputs(task, seed)
    if inputs is None:
        def block(lo: int, hi: int) -> np.ndarray:
            return w.compute(task, w.draw(task, seed, (lo, hi)), lo, hi)
    else:
        def block(lo: int, hi: int) -> np.ndarray:
            return w.compute(task, w.shard_inputs(task, inputs, lo, hi), lo, hi)
    whole = w.total_work(task)
    rows = n if whole.footprint <= REFERENCE_BLOCK_BYTES else min(n, max(1, int(
        n * REFERENCE_BLOCK_BYTES // max(whole.footprint - whole.bytes_in_fixed,
                                         1.0))))
    blocks = [(lo, min(n, lo + rows)) for lo in range(0, n, rows)]
    if task.merge == "sum" or len(blocks) == 1:
        ref = None
        for lo, hi in blocks:
            part = block(lo, hi)
            ref = part if ref is None else w.merge(task, [ref, part])
        return verify(task, out, ref)
    if tuple(out.shape) != tuple(w.output_shape(task, n)):
        return False, math.inf
    errs, scales = [], []
    for lo, hi in blocks:
        err, scale = _errors(out[lo:hi], block(lo, hi))
        errs.append(err)
        scales.append(scale)
    err, scale = float(np.max(errs)), float(np.max(scales))
    return _within(task, err, scale), err
