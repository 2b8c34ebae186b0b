"""Kinds written by users: :class:`RegisteredKind` and the process's register.

A :class:`RegisteredKind` is a :class:`~lib.platform.workloads.Workload` made
of functions (inputs, reference, work counts) instead of a subclass.
:func:`register_workload` adds one to the contract's vocabulary and to
:data:`~lib.platform.workloads.WORKLOADS`; the checks a user's kind passes
first (Gate 2a, divisibility) are :func:`lib.codegen.kinds.register_kind`'s.
Worker processes learn a kind from :func:`kind_payload`, sent with each job,
through :func:`adopt_kind`.
"""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Callable, Mapping, Sequence

import cloudpickle  # comes with dask[distributed], a dependency
import numpy as np

from lib.contract import DTYPE_BYTES, KINDS, TaskSpec, add_kind, forget_kind
from lib.platform.workloads import WORKLOADS, Arrays, ShardWork, Workload

#: NumPy dtype kinds an output may have: bool, signed, unsigned, float (an
#: object or string output cannot live in shared memory between processes).
NUMERIC_KINDS = "biuf"
#: What an input's name must look like: it is a keyword argument of the
#: reference and names a file of the cpu backend's run folder.
INPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

#: What a registered kind's ``work`` function must return, and may.
WORK_REQUIRED = ("flops", "bytes_in", "bytes_out")
WORK_OPTIONAL = ("bytes_in_fixed", "mem_traffic", "footprint")


class RegisteredKind(Workload):
    """A kind written by a user, from functions instead of a subclass.

    Every input array has the divisible dimension as its first axis (a shard
    is rows ``[lo, hi)`` of each input named in ``sliced``) or is given whole
    to every shard (the others, as matmul's B is). A shard's result is the
    reference applied to the shard's inputs: rows ``[lo, hi)`` of the output
    for ``concat``, a partial result that adds up for ``sum``.

    Attributes:
        like: the built-in kind whose efficiencies the cost model uses and
            whose kind feature the learned policy sees (a policy was trained
            on the built-in kinds only; :func:`like_of`).
        dtypes: the dtypes the kind supports (its CUDA entry points are
            ``<kind>_<dtype>``).
        kernel_sources: dtype -> the CUDA source of that dtype's one kernel,
            as Gate 2a passed it (empty: the kind has no CUDA kernel, and runs
            on the cpu, dask and model backends only).
    """

    def __init__(self, kind: str, dims: Sequence[str], divisible: str, merge: str,
                 inputs: Callable[[TaskSpec, np.random.Generator], Arrays],
                 reference: Callable[..., np.ndarray],
                 work: Callable[[TaskSpec, int], Mapping[str, float]], *,
                 like: str, dtypes: Sequence[str] = ("fp32",),
                 kernel_sources: Mapping[str, str] | None = None,
                 sliced: Sequence[str] | None = None,
                 output_shape: Callable[[TaskSpec, int], tuple[int, ...]] | None = None,
                 output_dtype: str | None = None, summary: str = "",
                 bound: str | None = None) -> None:
        if like not in WORKLOADS or isinstance(WORKLOADS[like], RegisteredKind):
            raise ValueError(f"like {like!r}: expected a built-in kind, one of "
                             f"{', '.join(KINDS)}")
        for label, value in (("dims", dims), ("dtypes", dtypes),
                             ("sliced", () if sliced is None else sliced)):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ValueError(f"{label} {value!r}: expected a list or tuple "
                                 "of names")
        for label, fn in (("inputs", inputs), ("reference", reference),
                          ("work", work)):
            if not callable(fn):
                raise ValueError(f"{label}: expected a function, got "
                                 f"{type(fn).__name__}")
        if output_dtype is not None:
            try:
                out = np.dtype(output_dtype)
            except TypeError:
                out = None
            if out is None or out.kind not in NUMERIC_KINDS:
                raise ValueError(f"output_dtype {output_dtype!r}: expected a "
                                 "numeric NumPy dtype (bool, integer or float)")
        bad = [d for d in dtypes if d not in DTYPE_BYTES]
        if bad or not dtypes:
            raise ValueError(f"dtypes {list(dtypes)}: expected some of "
                             f"{', '.join(DTYPE_BYTES)}")
        self.kind = kind
        self.dims = tuple(dims)
        self.divisible = divisible
        self.merge_rule = merge
        self.like = like
        self.dtypes = tuple(dtypes)
        self.kernel_sources = dict(kernel_sources or {})
        self.bound = bound or WORKLOADS[like].bound
        self.summary = summary or f"{kind} (registered, behaves like {like})"
        self._inputs, self._reference, self._work = inputs, reference, work
        self._sliced = None if sliced is None else tuple(sliced)
        self._output_shape = output_shape
        self._output_dtype = output_dtype

    def _dtype_of(self, task: TaskSpec) -> None:
        if task.dtype not in self.dtypes:
            raise ValueError(f"kind {self.kind}: dtype {task.dtype!r} is not "
                             f"one it supports ({', '.join(self.dtypes)})")

    def work(self, task: TaskSpec, rows: int) -> ShardWork:
        self._dtype_of(task)
        got = dict(self._work(task, rows))
        missing = [k for k in WORK_REQUIRED if k not in got]
        extra = [k for k in got if k not in WORK_REQUIRED + WORK_OPTIONAL]
        if missing or extra:
            raise ValueError(f"kind {self.kind}: work() must return "
                             f"{', '.join(WORK_REQUIRED)} (and may return "
                             f"{', '.join(WORK_OPTIONAL)}); "
                             f"{'missing ' + ', '.join(missing) if missing else ''}"
                             f"{'unknown ' + ', '.join(extra) if extra else ''}")
        for k, v in got.items():
            if not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(v) or v < 0:
                raise ValueError(f"kind {self.kind}: work()[{k!r}] is {v!r}; "
                                 "expected a finite number >= 0")
        if rows == 0:
            return ShardWork(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        fixed = float(got.get("bytes_in_fixed", 0.0))
        moved = float(got["bytes_in"]) + fixed + float(got["bytes_out"])
        return ShardWork(rows=rows, flops=float(got["flops"]),
                         mem_traffic=float(got.get("mem_traffic", moved)),
                         bytes_in_rows=float(got["bytes_in"]), bytes_in_fixed=fixed,
                         bytes_out=float(got["bytes_out"]),
                         footprint=float(got.get("footprint", moved)))

    def make_inputs(self, task: TaskSpec, seed: int = 0) -> Arrays:
        self._dtype_of(task)
        arrays = dict(self._inputs(task, np.random.default_rng(seed)))
        for name, arr in arrays.items():
            if not isinstance(name, str) or not INPUT_NAME.fullmatch(name):
                raise ValueError(f"kind {self.kind}: input name {name!r}: "
                                 "expected an identifier (letters, digits, _)")
            if not isinstance(arr, np.ndarray):
                raise ValueError(f"kind {self.kind}: input {name!r} is a "
                                 f"{type(arr).__name__}, expected a NumPy array")
            if self._cut(name) and (arr.ndim == 0 or arr.shape[0] != task.split_size):
                raise ValueError(f"kind {self.kind}: input {name!r} has shape "
                                 f"{arr.shape}; its first axis must be the "
                                 f"divisible dimension ({task.split_size})")
        return arrays

    def _cut(self, name: str) -> bool:
        return self._sliced is None or name in self._sliced

    def shard_inputs(self, task: TaskSpec, inputs: Arrays, lo: int, hi: int) -> Arrays:
        return {k: (v[lo:hi] if self._cut(k) else v) for k, v in inputs.items()}

    def compute(self, task: TaskSpec, shard: Arrays, lo: int, hi: int) -> np.ndarray:
        """The reference on one shard, given read-only views of its inputs
        (a reference that wrote into them would change what later shards
        and the check against the whole task read)."""
        frozen = {}
        for k, v in shard.items():
            frozen[k] = v.view()  # make_inputs checked every input is an array
            frozen[k].flags.writeable = False
        try:
            out = np.asarray(self._reference(task, **frozen))
        except ValueError as exc:
            if "read-only" not in str(exc):
                raise
            raise ValueError(f"kind {self.kind}: the reference writes into its "
                             f"inputs ({exc}); it must return a new array") \
                from None
        want = self.output_shape(task, hi - lo)
        if out.shape != want:
            raise ValueError(f"kind {self.kind}: reference gave shape {out.shape} "
                             f"for rows [{lo}, {hi}), expected {want}")
        dtype = self.output_dtype(task)
        if dtype.kind in "iu" and out.dtype != dtype and out.size \
                and out.dtype.kind in "iuf":
            info = np.iinfo(dtype)
            low, high = np.nanmin(out), np.nanmax(out)
            if low < info.min or high > info.max:
                raise ValueError(f"kind {self.kind}: the reference gave values "
                                 f"in [{low:g}, {high:g}], outside the output "
                                 f"dtype {dtype} ([{info.min}, {info.max}])")
        return out.astype(dtype, copy=False)

    def output_shape(self, task: TaskSpec, rows: int) -> tuple[int, ...]:
        """``output_shape(task, rows)`` if given; else, for ``concat``, the
        rows followed by the other dimensions in order, and for ``sum`` the
        other dimensions (``(1,)`` if there are none)."""
        if self._output_shape is not None:
            return tuple(int(x) for x in self._output_shape(task, rows))
        rest = tuple(task.dims[d] for d in self.dims if d != self.divisible)
        if task.merge == "concat":
            return (rows, *rest)
        return rest or (1,)

    def output_dtype(self, task: TaskSpec) -> np.dtype:
        if self._output_dtype is not None:
            return np.dtype(self._output_dtype)
        return super().output_dtype(task)


def register_workload(w: RegisteredKind) -> None:
    """Make ``w`` a kind of this process: the contract's vocabulary
    (:func:`lib.contract.add_kind`) and :data:`WORKLOADS`. Registering a kind
    of the same name again replaces it.

    Raises:
        ContractError: see :func:`~lib.contract.add_kind`.
        ValueError: ``w`` is not a :class:`RegisteredKind`.
    """
    if not isinstance(w, RegisteredKind):
        raise ValueError(f"register_workload takes a RegisteredKind, not "
                         f"{type(w).__name__}")
    add_kind(w.kind, w.dims, [(w.dims.index(w.divisible), w.merge_rule)])
    WORKLOADS[w.kind] = w


def unregister_workload(kind: str) -> None:
    """Forget a registered kind (no-op for one never registered).

    Raises:
        ValueError: ``kind`` is built in.
    """
    if kind in KINDS:
        raise ValueError(f"{kind!r} is a built-in kind")
    WORKLOADS.pop(kind, None)
    forget_kind(kind)


def kind_payload(task: TaskSpec) -> bytes | None:
    """What a worker process needs to know ``task``'s kind: None for a
    built-in kind, else the registered kind, pickled by value (cloudpickle,
    so functions written in a notebook travel too)."""
    w = WORKLOADS.get(task.kind)
    if not isinstance(w, RegisteredKind):
        return None
    try:
        return cloudpickle.dumps(w)
    except Exception as exc:  # a function holding a lock, a file, a socket
        raise ValueError(f"kind {w.kind}: cannot be sent to a worker process "
                         f"({type(exc).__name__}: {exc}); its functions must "
                         "not hold locks, open files or sockets") from None


def adopt_kind(payload: bytes | None) -> None:
    """In a worker: register the kind :func:`kind_payload` sent (again on
    every job that carries it: the parent may have replaced it since)."""
    if payload is None:
        return
    register_workload(pickle.loads(payload))
