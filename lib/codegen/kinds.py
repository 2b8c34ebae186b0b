"""A sixth kind, written by a user: one call registers it with every plane.

:func:`register_kind` takes what defines a divisible workload -- its
dimensions, the one it splits, how shard results merge, a NumPy reference,
its work counts for Eq. (1) and, for the ``cuda`` backend, its CUDA source --
and makes it a kind of this process: :class:`~lib.contract.TaskSpec` accepts
it, every policy decides for it, Gate 1 checks it, and the ``model``,
``cpu``, ``dask`` and ``cuda`` backends run it (the worker processes of the
``cpu`` and ``dask`` backends receive the kind with each job).

Before anything is registered, the call checks what it was given, so that a
mistake fails here, in one line that names it, rather than inside a run:

1. **Gate 2a** scans each dtype's kernel (``<name>_<dtype>``, cut out of the
   source alone, as it will be compiled) exactly as it scans generated code;
   a refused kernel refuses the kind.
2. **The reference divides:** on the example task, three uneven shards
   computed separately and merged equal the reference on the whole task
   (within the kind's tolerance).
3. **The work counts are affine in the rows** (the optimum reads them at one
   and two rows and extrapolates) and the output has the declared shape.

The CUDA launch convention (what the ``cuda`` backend passes):
``<name>_<dtype>(inputs..., out, long long rows, long long dim...)`` -- the
inputs in the order ``inputs`` returns them (a shard's rows of each sliced
input, the whole of the others), then the output (a shard's rows for
``concat``; for ``sum`` the whole output, zeroed, which the kernel adds
into), then the shard's row count and every dimension of the task in the
kind's order, on a 1-D grid of ``ceil(rows / block)`` blocks (capped at
65,535; loop with a grid stride).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields

import numpy as np

from lib.codegen.specialise import CodegenError, entry_points, single_kernel
from lib.contract import KIND_DIMS, KINDS, MERGES, ContractError, TaskSpec
from lib.platform.user_kinds import (
    RegisteredKind,
    register_workload,
    unregister_workload,
)
from lib.platform.workloads import WORKLOADS, ShardWork, split_rows, verify
from lib.security.scan import scan_source

#: Shares of the three uneven shards the divisibility check computes.
CHECK_SHARES = (0.5, 0.3, 0.2)
#: Size of every dimension of the default example task.
EXAMPLE_SIZE = 64


class KindError(ValueError):
    """A kind that cannot be registered (the message names the kind and why)."""


def register_kind(name: str, *, dims: Sequence[str], divisible: str, merge: str,
                  inputs: Callable[[TaskSpec, np.random.Generator], dict],
                  reference: Callable[..., np.ndarray],
                  work: Callable[[TaskSpec, int], Mapping[str, float]],
                  cuda_source: str | None = None,
                  dtypes: Sequence[str] = ("fp32",), like: str = "elementwise",
                  sliced: Sequence[str] | None = None,
                  output_shape: Callable[[TaskSpec, int], tuple[int, ...]]
                  | None = None,
                  output_dtype: str | None = None,
                  example: Mapping[str, int] | None = None,
                  summary: str = "") -> RegisteredKind:
    """Register a kind with every plane; return it.

    Args:
        name: the kind's name (lower-case letters, digits, ``_``), not a
            built-in one; registering a name again replaces that kind.
        dims: its dimension names, in order (``("R", "C")``).
        divisible: the dimension shards split.
        merge: ``"concat"`` (shards own rows of the output) or ``"sum"``
            (shards' partial results add up).
        inputs: ``inputs(task, rng) -> {name: array}``, seeded inputs; arrays
            named in ``sliced`` (default: all) have the divisible dimension
            first.
        reference: ``reference(task, **shard_inputs) -> array``: the result of
            a shard (the whole task's result when given all rows).
        work: ``work(task, rows) -> {"flops", "bytes_in", "bytes_out"}`` for a
            shard of ``rows`` rows, optionally ``"bytes_in_fixed"`` (bytes
            every shard needs whatever its size), ``"mem_traffic"`` and
            ``"footprint"`` (both default to all bytes moved); affine in rows.
        cuda_source: CUDA C++ defining ``extern "C" __global__ void
            <name>_<dtype>(...)`` for each dtype (the module docstring gives
            the arguments); None: the kind runs on the cpu, dask and model
            backends only.
        dtypes: the dtypes the kind supports.
        like: the built-in kind whose efficiencies the cost model uses and
            whose kind feature the learned policy sees.
        sliced: the inputs cut by rows (default: all of them).
        output_shape: ``output_shape(task, rows)``, where the default (rows
            then the other dimensions for concat; the other dimensions for sum)
            is not the shape.
        output_dtype: the output's NumPy dtype name, where it is not the
            task's.
        example: the dimensions of the task the checks run on (default
            :data:`EXAMPLE_SIZE` for each).
        summary: one line for tables.

    Raises:
        KindError: a check above failed; nothing was registered (a kind of
            the same name registered before is kept as it was).
    """
    try:
        kind = RegisteredKind(
            name, dims, divisible, merge, inputs, reference, work, like=like,
            dtypes=dtypes, sliced=sliced, output_shape=output_shape,
            output_dtype=output_dtype, summary=summary)
        if divisible not in tuple(dims):
            raise KindError(f"kind {name}: divisible {divisible!r} is not one of "
                            f"its dims {list(dims)}")
        if merge not in MERGES:
            raise KindError(f"kind {name}: merge {merge!r}; expected one of "
                            f"{', '.join(MERGES)}")
        kind.kernel_sources = _gate2a(name, cuda_source, kind.dtypes)
    except (ValueError, ContractError) as exc:
        raise KindError(str(exc) if str(exc).startswith(f"kind {name}")
                        else f"kind {name}: {exc}") from None
    except Exception as exc:  # a wrong type, a source the splitter cannot read
        raise KindError(f"kind {name}: {type(exc).__name__}: {exc}") from None
    if name in KINDS:
        raise KindError(f"kind {name}: the name of a built-in kind")
    before = _registered(name)
    try:
        register_workload(kind)
        for dtype in kind.dtypes:
            _self_check(kind, TaskSpec(name, dict(example or {
                d: EXAMPLE_SIZE for d in kind.dims}), dtype,
                divisible_dim=kind.dims.index(kind.divisible)))
    except Exception as exc:
        unregister_workload(name)
        if before is not None:
            register_workload(before)
        if isinstance(exc, KindError):
            raise
        text = str(exc)
        raise KindError(text if text.startswith(f"kind {name}:")
                        else f"kind {name}: {type(exc).__name__}: {text}") from None
    return kind


def _registered(name: str) -> RegisteredKind | None:
    """The kind registered under ``name`` now, if any."""
    w = WORKLOADS.get(name) if name in KIND_DIMS else None
    return w if isinstance(w, RegisteredKind) else None


def _gate2a(name: str, source: str | None, dtypes: Sequence[str]) -> dict[str, str]:
    """Each dtype's kernel alone, as Gate 2a passed it.

    Raises:
        KindError: an entry point is missing or Gate 2a refuses a kernel.
    """
    if source is None:
        return {}
    found = entry_points(source) if isinstance(source, str) else []
    out = {}
    for dtype in dtypes:
        entry = f"{name}_{dtype}"
        if entry not in found:
            raise KindError(f"kind {name}: the CUDA source has no extern \"C\" "
                            f"__global__ {entry}(...); it defines "
                            f"{', '.join(found) or 'none'}")
        try:
            alone = single_kernel(source, entry)
        except CodegenError as exc:
            raise KindError(f"kind {name}: {exc}") from None
        verdict = scan_source(alone, entry)
        if not verdict.accepted:
            raise KindError(f"kind {name}: {entry} refused by {verdict.summary()}")
        out[dtype] = alone
    return out


def _self_check(kind: RegisteredKind, task: TaskSpec) -> None:
    """The reference divides and the work counts are affine, on ``task``.

    Raises:
        KindError: naming the kind, the dtype and what did not hold.
    """
    where = f"kind {kind.kind} ({task.dtype}, {dict(task.dims)})"
    n = task.split_size
    if n >= 3:
        at = [kind.work(task, r) for r in (1, 2, 3)]
        for f in fields(ShardWork):
            a, b, c = (float(getattr(w, f.name)) for w in at)
            if not math.isclose(c - b, b - a, rel_tol=1e-9, abs_tol=1e-9):
                raise KindError(f"{where}: work {f.name} at 1, 2, 3 rows is {a:g}, "
                                f"{b:g}, {c:g}: not affine in rows")
    inputs = kind.make_inputs(task, seed=0)
    ref = kind.reference(task, inputs)
    if ref.dtype.kind == "f" and not np.all(np.isfinite(ref)):
        raise KindError(f"{where}: the reference gives NaN or inf on the "
                        "example task")
    parts = [kind.compute(task, kind.shard_inputs(task, inputs, lo, hi), lo, hi)
             for lo, hi in split_rows(n, CHECK_SHARES) if hi > lo]
    ok, err = verify(task, kind.merge(task, parts), ref)
    if not ok:
        raise KindError(f"{where}: three shards merged with {task.merge} differ "
                        f"from the reference on the whole task (max error {err:g}): "
                        "the reference does not divide over the rows")
