"""The contract: the two objects every plane exchanges, their JSON and their hash.

A :class:`TaskSpec` says *what* to compute; a :class:`Decision` says *how* to
spread it over the devices of a machine. Everything downstream of the policy
consumes only these two objects, so a decision can be logged, diffed,
hand-written or loaded from JSON, and every policy drives the same path.

JSON forms (exactly these fields, nothing else)::

    {"kind": "matmul", "dims": {"M": 8192, "N": 8192, "K": 8192},
     "dtype": "fp32", "divisible_dim": 0, "merge": "concat"}

    {"gpus": [0, 2], "shares": [0.75, 0.25], "chunk": 4096, "block": 256,
     "mode": "split", "comm_path": "host", "config_hash": "<64 hex digits>"}

``config_hash`` is the SHA-256 hex digest of::

    json.dumps({"task": task_json, "decision": decision_json_without_config_hash},
               sort_keys=True, separators=(",", ":"))

Numbers are hashed by value, not by spelling. A share is a JSON number read as
the nearest IEEE-754 double and written into the hashed text as Python's
``float.__repr__`` of that double, so ``1``, ``1.0``, ``1e0`` and ``10e-1`` are
one share (``1.0``) with one hash, whether the decision was parsed with
:meth:`Decision.from_json`, handed to Gate 1 as JSON text or as a decoded
object, or built in Python with ``shares=(1,)``. Two spellings differ in value
and so in hash: an integer beyond the double range (refused: ``shares[i]: must
be finite``), and ``-0.0``, the double negative zero, which is written
``-0.0`` (``-0`` is the integer zero, read as ``0.0``); Gate 1 refuses a share
whose sign bit is set (``contract.negative_share``), so no accepted decision
carries it. Integers (``gpus``, ``chunk``, ``block``, dims) must be written as
integers: ``4096.0`` is refused where an integer is due.

Parsing untrusted JSON (:meth:`TaskSpec.from_json`, :meth:`Decision.from_json`)
checks *form*: unknown or missing fields, NaN/Infinity, bools where numbers are
due, floats where integers are due and wrong types each raise a
:class:`ContractError` naming the field. Whether a decision is *feasible* on a
machine (shares summing to one, devices that exist, memory that fits) is Gate 1's
job, in :mod:`lib.security`.

This module imports nothing of the project.

Why one module: the contract's vocabulary (kinds, dtypes, modes, paths), the two
objects, their strict parsers and the canonical form the hash is taken over must
agree to the character; read together they can be checked against each other in
one sitting, and anyone re-implementing the hash (the C++ reader, a reviewer)
needs only this file.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# --------------------------------------------------------------------------
# Vocabulary

#: Workload classes and the order of their dimensions.
#: matmul: C[M,N] = A[M,K] B[K,N]; reduce: sum of x[N]; elementwise:
#: out = a*x + y over N; stencil: T sweeps of a 5-point Jacobi on an HxW grid;
#: histogram: counts of x[N] in B equal bins over [0, 1).
KIND_DIMS: dict[str, tuple[str, ...]] = {
    "matmul": ("M", "N", "K"),
    "reduce": ("N",),
    "elementwise": ("N",),
    "stencil": ("H", "W", "T"),
    "histogram": ("N", "B"),
}
KINDS: tuple[str, ...] = tuple(KIND_DIMS)
"""The five built-in kinds: what the policies were trained on and the tables
list. A kind registered at run time (:func:`add_kind`) joins
:data:`KIND_DIMS` and :data:`KIND_SPLITS`, never this tuple."""

#: (divisible_dim, merge) pairs each kind supports.
KIND_SPLITS: dict[str, tuple[tuple[int, str], ...]] = {
    "matmul": ((0, "concat"),),
    "reduce": ((0, "sum"),),
    "elementwise": ((0, "concat"),),
    "stencil": ((0, "concat"),),
    "histogram": ((0, "sum"),),
}

#: Bytes per element of each dtype.
DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)
DEFAULT_DTYPE = "fp32"
MERGES: tuple[str, ...] = ("concat", "sum")
MODES: tuple[str, ...] = ("single", "split", "pipelined")
COMM_PATHS: tuple[str, ...] = ("host", "p2p", "nccl")
#: Execution backends: ``model`` PREDICTS with the cost model; the others MEASURE.
BACKENDS: tuple[str, ...] = ("model", "cpu", "cuda", "dask")
MEASURING_BACKENDS: tuple[str, ...] = ("cpu", "cuda", "dask")
#: Block sizes (threads per block) a policy chooses from, and the default.
BLOCKS: tuple[int, ...] = (64, 128, 256, 512, 1024)
DEFAULT_BLOCK = 256
#: Chunks per largest shard in pipelined mode that the eight-slot policy chose
#: from; the learned policy now chooses from ``lib.policies.actions.CHUNKS`` and
#: the optimum searches a superset (``lib.policies.oracle.CHUNK_COUNTS``) and
#: refines the chunk size.
PIPELINE_CHUNKS: tuple[int, ...] = (2, 4, 8, 16, 32, 64)

#: Largest value of any dimension (kernels index with 64-bit offsets, but a
#: single dimension stays within a signed 32-bit launch argument).
MAX_DIM = 2**31 - 1
#: Per-dimension limits that are tighter than MAX_DIM: (low, high).
DIM_LIMITS: dict[tuple[str, str], tuple[int, int]] = {
    ("stencil", "T"): (1, 1024),
    ("histogram", "B"): (1, 4096),
    ("stencil", "H"): (3, MAX_DIM),
    ("stencil", "W"): (3, MAX_DIM),
}
#: Form bounds on a decision (Gate 1 holds it to the machine's actual limits).
MAX_DEVICES = 64
MAX_CHUNK = 2**40
MAX_BLOCK = 1 << 16
HASH_HEX_LEN = 64

TASK_FIELDS = ("kind", "dims", "dtype", "divisible_dim", "merge")
#: The fields a task file written by hand may leave out (``TaskSpec.from_json``
#: with ``defaults``).
TASK_DEFAULTED = ("dtype", "divisible_dim", "merge")
DECISION_FIELDS = (
    "gpus", "shares", "chunk", "block", "mode", "comm_path", "config_hash",
)


class NoFeasibleDecision(ValueError):
    """No decision can run the task on the machine: no set of its usable
    devices holds the task's data (the message names the task and the
    machine)."""


class ContractError(ValueError):
    """A task or decision that breaks the contract's form.

    Attributes:
        field: dotted path of the offending field (``"dims.M"``, ``"shares[1]"``).
    """

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


_KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_DIM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,15}")


def add_kind(name: str, dims: Sequence[str], splits: Sequence[tuple[int, str]],
             limits: Mapping[str, tuple[int, int]] | None = None) -> None:
    """Add a kind to the vocabulary: its dimensions, the (divisible dimension,
    merge) pairs it supports and any dimension limits tighter than
    ``(1, MAX_DIM)``. Adding a kind of the same name again replaces it.

    Raises:
        ContractError: a malformed name, dimension or split, or one of the
            built-in :data:`KINDS`.
    """
    if not isinstance(name, str) or not _KIND_NAME.fullmatch(name):
        raise ContractError("kind", f"{shown(name)} is not a kind name: lower-case "
                                    "letters, digits and _, starting with a letter")
    if name in KINDS:
        raise ContractError("kind", f"{name!r} is a built-in kind")
    dims = tuple(dims)
    bad = [d for d in dims if not isinstance(d, str) or not _DIM_NAME.fullmatch(d)]
    if not dims or bad or len(set(dims)) != len(dims):
        raise ContractError("dims", f"{name}: expected distinct dimension names "
                                    f"(letters, digits, _), got {list(dims)}")
    splits = tuple((int(d), m) for d, m in splits)
    for d, m in splits:
        if not 0 <= d < len(dims) or m not in MERGES:
            raise ContractError("divisible_dim", f"{name}: split ({d}, {m!r}) needs "
                                                 f"a dimension index below {len(dims)} "
                                                 f"and a merge in {', '.join(MERGES)}")
    if not splits:
        raise ContractError("divisible_dim", f"{name}: no divisible dimension")
    limits = {dim: (int(low), int(high)) for dim, (low, high) in (limits or {}).items()}
    for dim, (low, high) in limits.items():
        if dim not in dims or not 1 <= low <= high <= MAX_DIM:
            raise ContractError(f"dims.{dim}", f"{name}: limits ({low}, {high}) "
                                               "need a dimension of the kind and "
                                               f"1 <= low <= high <= {MAX_DIM}")
    # Checked: now change the vocabulary, all of it or nothing.
    for key in [k for k in DIM_LIMITS if k[0] == name]:
        del DIM_LIMITS[key]
    DIM_LIMITS.update({(name, dim): lim for dim, lim in limits.items()})
    KIND_DIMS[name] = dims
    KIND_SPLITS[name] = splits


def forget_kind(name: str) -> None:
    """Remove a kind :func:`add_kind` added (no-op for an unknown name).

    Raises:
        ContractError: ``name`` is one of the built-in :data:`KINDS`.
    """
    if name in KINDS:
        raise ContractError("kind", f"{name!r} is a built-in kind")
    KIND_DIMS.pop(name, None)
    KIND_SPLITS.pop(name, None)
    for key in [k for k in DIM_LIMITS if k[0] == name]:
        del DIM_LIMITS[key]


# --------------------------------------------------------------------------
# Strict value checks (shared by both objects)

def _type_name(value: Any) -> str:
    return type(value).__name__


def shown(value: Any) -> str:
    """``value`` for a one-line error message: an integer of more than 30
    digits is named by its digit count (one of 5,000 cannot even be printed),
    anything else by its ``repr``, cut at 60 characters."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = int(value)
        if abs(value) < 10**30:
            return str(value)
        if value.bit_length() < 14000:  # str() works below 4300 digits
            return f"an integer of {len(str(abs(value)))} digits"
        return (f"an integer of about "
                f"{int(value.bit_length() * math.log10(2)) + 1} digits")
    try:
        return f"{value!r:.60}"
    except ValueError:  # it holds an integer too long to print
        return f"a {_type_name(value)}"


def expect_int(value: Any, field: str, low: int, high: int) -> int:
    """Return ``value`` if it is an int (not a bool, not a float) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ContractError(
            field, f"expected an integer, got {_type_name(value)} {shown(value)}"
        )
    value = int(value)
    if not low <= value <= high:
        raise ContractError(field, f"must be in [{low}, {high}], got "
                                   f"{shown(value)}")
    return value


def expect_number(value: Any, field: str) -> float:
    """Return ``value`` as float if it is a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise ContractError(
            field, f"expected a number, got {_type_name(value)} {shown(value)}"
        )
    try:
        value = float(value)
    except OverflowError:  # an integer beyond the double range
        raise ContractError(field, f"must be finite, got {shown(value)} (beyond "
                                   "the range of a double)") from None
    if not math.isfinite(value):
        raise ContractError(field, f"must be finite, got {value}")
    return value


def expect_choice(value: Any, field: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of the strings in ``choices``."""
    if not isinstance(value, str):
        raise ContractError(
            field, f"expected a string, got {_type_name(value)} {shown(value)}"
        )
    if value not in choices:
        raise ContractError(
            field, f"unknown value {value!r:.60}; expected one of "
                   f"{', '.join(choices)}"
        )
    return value


def _expect_fields(obj: Any, what: str, allowed: Sequence[str],
                   optional: Sequence[str] = ()) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise ContractError(what, f"expected a JSON object, got {_type_name(obj)}")
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise ContractError(f"{what}.{unknown[0]}", "unknown field")
    required = [k for k in allowed if k not in optional]
    missing = [k for k in required if k not in obj]
    if missing:
        raise ContractError(f"{what}.{missing[0]}", f"missing field (a {what} "
                            f"has {', '.join(required)})")
    return obj


def _reject_constant(name: str) -> Any:
    raise ContractError("json", f"{name} is not allowed (numbers must be finite)")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ContractError(str(key), "duplicate field")
        seen[key] = value
    return seen


def loads_strict(text: str | bytes) -> Any:
    """Parse JSON refusing NaN, Infinity and duplicate keys."""
    try:
        return json.loads(
            text, parse_constant=_reject_constant,
            object_pairs_hook=_no_duplicate_keys,
        )
    except json.JSONDecodeError as exc:
        raise ContractError("json", f"not valid JSON: {exc.msg} at line "
                                    f"{exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ContractError("json", "nested too deeply") from None
    except ContractError:
        raise
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ContractError("json", "not valid JSON: "
                                    f"{str(exc).split(':')[0][:80]}") from None


def _as_obj(data: str | bytes | Mapping[str, Any]) -> Any:
    return loads_strict(data) if isinstance(data, (str, bytes)) else data


# --------------------------------------------------------------------------
# TaskSpec

@dataclass(frozen=True, eq=True)
class TaskSpec:
    """One divisible task.

    Attributes:
        kind: one of :data:`KINDS`.
        dims: dimension name -> size, in the kind's order (:data:`KIND_DIMS`).
        dtype: element type, one of :data:`DTYPES`.
        divisible_dim: index into the kind's dims of the dimension that is
            split; default (None) the kind's first split with ``merge``, if
            given (0 for the built-in kinds; a registered kind's
            ``divisible``).
        merge: how shard results combine: ``"concat"`` or ``"sum"``; default
            the merge of the kind's first split of ``divisible_dim``.

    The constructor validates everything and raises :class:`ContractError`.
    """

    kind: str
    dims: Mapping[str, int]
    dtype: str = DEFAULT_DTYPE
    divisible_dim: int | None = None
    merge: str = ""

    def __post_init__(self) -> None:
        kind = expect_choice(self.kind, "kind", KIND_DIMS)
        if not isinstance(self.dims, Mapping):
            raise ContractError("dims", f"expected an object of sizes, got "
                                        f"{_type_name(self.dims)}")
        names = KIND_DIMS[kind]
        extra = [k for k in self.dims if k not in names]
        if extra:
            raise ContractError(f"dims.{extra[0]}", f"unknown dimension for {kind}; "
                                                    f"{kind} takes {', '.join(names)}")
        missing = [k for k in names if k not in self.dims]
        if missing:
            raise ContractError(f"dims.{missing[0]}", f"missing; {kind} needs "
                                                      f"{', '.join(names)}")
        dims = {}
        for name in names:
            low, high = DIM_LIMITS.get((kind, name), (1, MAX_DIM))
            dims[name] = expect_int(self.dims[name], f"dims.{name}", low, high)
        object.__setattr__(self, "dims", dims)
        expect_choice(self.dtype, "dtype", DTYPES)
        splits = KIND_SPLITS[kind]
        if self.merge:
            expect_choice(self.merge, "merge", MERGES)
        if self.divisible_dim is None:
            dim = next((d for d, m in splits if m == (self.merge or m)),
                       splits[0][0])
        else:
            dim = expect_int(self.divisible_dim, "divisible_dim", 0, len(names) - 1)
        object.__setattr__(self, "divisible_dim", dim)
        merge = self.merge or next((m for d, m in splits if d == dim), splits[0][1])
        object.__setattr__(self, "merge", merge)
        if (dim, merge) not in splits:
            ok = ", ".join(f"{names[d]} with {m}" for d, m in splits)
            raise ContractError(
                "divisible_dim", f"{kind} cannot split {names[dim]} with merge "
                                 f"{merge!r}; it supports {ok}")

    def __hash__(self) -> int:
        return hash((self.kind, tuple(self.dims.items()), self.dtype,
                     self.divisible_dim, self.merge))

    @property
    def split_name(self) -> str:
        """Name of the divisible dimension (``"M"`` for matmul)."""
        return KIND_DIMS[self.kind][self.divisible_dim]

    @property
    def split_size(self) -> int:
        """Size of the divisible dimension: what shares are shares of."""
        return self.dims[self.split_name]

    @property
    def itemsize(self) -> int:
        """Bytes per element of :attr:`dtype`."""
        return DTYPE_BYTES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        """The contract's JSON object (plain dict, dims in the kind's order)."""
        return {"kind": self.kind, "dims": dict(self.dims), "dtype": self.dtype,
                "divisible_dim": self.divisible_dim, "merge": self.merge}

    @classmethod
    def from_json(cls, data: str | bytes | Mapping[str, Any], *,
                  defaults: bool = False) -> TaskSpec:
        """Parse untrusted JSON (text or an already-decoded object), strictly.

        ``defaults``: ``dtype``, ``divisible_dim`` and ``merge`` may be left
        out and take the constructor's defaults (fp32, the kind's own split),
        as in a task file written by hand; a task inside a decision file is
        read whole.
        """
        optional = TASK_DEFAULTED if defaults else ()
        obj = _expect_fields(_as_obj(data), "task", TASK_FIELDS, optional)
        if not isinstance(obj["dims"], Mapping):
            raise ContractError("dims", "expected an object of sizes, got "
                                        f"{_type_name(obj['dims'])}")
        return cls(kind=obj["kind"], dims=dict(obj["dims"]),
                   dtype=obj.get("dtype", DEFAULT_DTYPE),
                   divisible_dim=obj.get("divisible_dim"),
                   merge=obj.get("merge", ""))

    def describe(self) -> str:
        """Short human form: ``matmul[M=8192,N=8192,K=8192] fp32``."""
        dims = ",".join(f"{k}={v}" for k, v in self.dims.items())
        return f"{self.kind}[{dims}] {self.dtype}"


# --------------------------------------------------------------------------
# Decision

@dataclass(frozen=True)
class Decision:
    """How one task is spread over devices.

    Attributes:
        gpus: device indices of the machine profile, in the order shards are cut.
        shares: fraction of the divisible dimension per device (sum to 1).
        chunk: rows/elements of the divisible dimension per pipelined chunk
            (in ``split`` and ``single`` mode, conventionally the whole dimension).
        block: CUDA threads per block (a multiple of 32 in [32, 1024]).
        mode: ``"single"`` (one device), ``"split"`` (one shard per device) or
            ``"pipelined"`` (each shard in chunks, copies overlapping compute).
        comm_path: how partial results meet: ``"host"``, ``"p2p"`` or ``"nccl"``.
        config_hash: SHA-256 of task and decision (see :func:`config_hash`).

    Construction does not validate: a policy's output is untrusted until Gate 1
    (:func:`lib.security.check_decision`) has passed it.
    """

    gpus: tuple[int, ...]
    shares: tuple[float, ...]
    chunk: int
    block: int = 256
    mode: str = "split"
    comm_path: str = "host"
    config_hash: str = field(default="", compare=True)

    def __post_init__(self) -> None:
        if isinstance(self.gpus, list):
            object.__setattr__(self, "gpus", tuple(self.gpus))
        if isinstance(self.shares, (list, np.ndarray)):
            object.__setattr__(self, "shares", tuple(self.shares))

    def to_json(self, include_hash: bool = True) -> dict[str, Any]:
        """The contract's JSON object; without ``config_hash`` when asked."""
        out: dict[str, Any] = {
            "gpus": [int(g) for g in self.gpus],
            "shares": [float(s) for s in self.shares],
            "chunk": int(self.chunk), "block": int(self.block),
            "mode": self.mode, "comm_path": self.comm_path,
        }
        if include_hash:
            out["config_hash"] = self.config_hash
        return out

    @classmethod
    def from_json(cls, data: str | bytes | Mapping[str, Any]) -> Decision:
        """Parse untrusted JSON strictly (form only; Gate 1 checks feasibility).

        ``config_hash`` may be absent (then empty; Gate 1 rejects it until it is
        recomputed with :meth:`with_hash`).
        """
        obj = _expect_fields(_as_obj(data), "decision", DECISION_FIELDS,
                             optional=("config_hash",))
        gpus = _expect_list(obj["gpus"], "gpus")
        shares = _expect_list(obj["shares"], "shares")
        digest = obj.get("config_hash", "")
        if not isinstance(digest, str):
            raise ContractError("config_hash", f"expected a string, got "
                                               f"{_type_name(digest)}")
        if digest and (len(digest) != HASH_HEX_LEN
                       or any(c not in "0123456789abcdef" for c in digest)):
            raise ContractError("config_hash", "expected 64 lowercase hex digits")
        return cls(
            gpus=tuple(expect_int(g, f"gpus[{i}]", 0, MAX_DEVICES - 1)
                       for i, g in enumerate(gpus)),
            shares=tuple(expect_number(s, f"shares[{i}]")
                         for i, s in enumerate(shares)),
            chunk=expect_int(obj["chunk"], "chunk", 1, MAX_CHUNK),
            block=expect_int(obj["block"], "block", 1, MAX_BLOCK),
            mode=expect_choice(obj["mode"], "mode", MODES),
            comm_path=expect_choice(obj["comm_path"], "comm_path", COMM_PATHS),
            config_hash=digest,
        )

    def with_hash(self, task: TaskSpec) -> Decision:
        """This decision with ``config_hash`` computed for ``task``.

        The task remembers the result and its digest (:func:`config_hash`
        reuses the digest for that very decision object while its fields and
        the task's text are the ones hashed: Gate 1 asks again at once).
        """
        text = _canonical_text(task, self)
        digest = hashlib.sha256((canonical_json(task, self) if text is None
                                 else text).encode()).hexdigest()
        # a copy with the digest, past the constructor (the fields are
        # already as it leaves them): a tenth of dataclasses.replace's cost
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.__dict__["config_hash"] = digest
        if text is not None:  # the task's text is cached on it: remember
            task.__dict__["_hashed"] = (out, out.gpus, out.shares, out.chunk,
                                        out.block, out.mode, out.comm_path,
                                        task.__dict__["_canonical"][1], digest)
        return out

    def without(self, device: int) -> Decision | None:
        """This decision with ``device`` (and any device of share 0) left
        out, the other shares renormalised, unhashed; ``single`` mode and the
        host path where one device is left, None where none is."""
        keep = [(g, s) for g, s in zip(self.gpus, self.shares, strict=True)
                if g != device and s > 0]
        if not keep:
            return None
        total = math.fsum(s for _, s in keep)
        shares = [s / total for _, s in keep]
        shares[-1] = 1.0 - math.fsum(shares[:-1])
        mode = "single" if len(keep) == 1 and self.mode == "split" else self.mode
        path = self.comm_path if len(keep) > 1 else "host"
        return Decision(gpus=tuple(g for g, _ in keep), shares=tuple(shares),
                        chunk=self.chunk, block=self.block, mode=mode,
                        comm_path=path)

    def describe(self) -> str:
        """Short human form: ``split gpus=[0,2] shares=[0.750,0.250] ...``."""
        shares = ",".join(f"{s:.3f}" for s in self.shares)
        gpus = ",".join(str(g) for g in self.gpus)
        return (f"{self.mode} gpus=[{gpus}] shares=[{shares}] chunk={self.chunk} "
                f"block={self.block} path={self.comm_path}")


def _expect_list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise ContractError(field, f"expected a list, got {_type_name(value)}")
    if not 1 <= len(value) <= MAX_DEVICES:
        raise ContractError(field, f"must hold 1 to {MAX_DEVICES} entries, "
                                   f"got {len(value)}")
    return value


#: Strings whose JSON form is the string in double quotes (no escapes): the
#: vocabulary and the dimension names, the only strings a valid pair holds.
_PLAIN_STRINGS = frozenset(KINDS + DTYPES + MERGES + MODES + COMM_PATHS + tuple(
    name for names in KIND_DIMS.values() for name in names))


def _plain(value: Any) -> bool:
    return type(value) is str and value in _PLAIN_STRINGS


def _task_text(task: TaskSpec) -> str | None:
    """The task's part of :func:`canonical_json`, or ``None`` (see there).

    Kept on the task (it is frozen) with the sizes it was written for, so a
    task whose ``dims`` dict was changed in place is written afresh.
    """
    dims = task.dims
    if type(dims) is not dict:
        return None
    sizes = tuple(dims.items())
    if not all([type(v) is int for _, v in sizes]):
        return None
    cached = task.__dict__.get("_canonical")
    if cached is not None and cached[0] == sizes:
        return cached[1]
    dim = task.divisible_dim
    if type(dim) is not int:  # True or 1.0 would find the form of 1
        return None
    names = tuple(dims)
    shape = (task.kind, names, dim, task.dtype, task.merge)
    try:
        form = _TASK_FORMS.get(shape)
    except TypeError:  # a field swapped for an unhashable value
        return None
    if form is None:
        if not (_plain(task.kind) and _plain(task.dtype) and _plain(task.merge)
                and all(_plain(k) for k in names)):
            return None
        order = sorted(range(len(names)), key=names.__getitem__)
        named = ",".join(f'"{names[i]}":%d' for i in order)
        form = (f'{{"dims":{{{named}}},"divisible_dim":{dim},"dtype":'
                f'"{task.dtype}","kind":"{task.kind}","merge":"{task.merge}"}}',
                tuple(order))
        if len(_TASK_FORMS) < 4096:
            _TASK_FORMS[shape] = form
    text = form[0] % tuple([sizes[i][1] for i in form[1]])
    task.__dict__["_canonical"] = (sizes, text)
    return text


#: :func:`_task_text`'s format per task shape (kind, dimension names in
#: order, split dimension, dtype, merge): the text with the sizes left out
#: (``%d``, in sorted name order) and where each size comes from.
_TASK_FORMS: dict[tuple[Any, ...], tuple[str, tuple[int, ...]]] = {}


def _canonical_text(task: TaskSpec, decision: Decision) -> str | None:
    """:func:`canonical_json` written out directly, or ``None`` where a value
    is one the shortcut does not cover (the caller then asks :mod:`json`).

    Byte for byte what ``json.dumps`` writes (sorted keys, no spaces): ints
    and finite floats print as their ``repr``, plain strings in quotes. The
    general encoder costs about 10 us a call; this 2 to 4 us (most of it the
    shares' ``repr``).
    """
    mode, path = decision.mode, decision.comm_path
    if not (_plain(mode) and _plain(path)):
        return None
    task_text = _task_text(task)
    if task_text is None:
        return None
    shares = [float(s) for s in decision.shares]
    if not all(map(math.isfinite, shares)):  # json writes NaN, Infinity
        return None
    return ('{"decision":{"block":' + str(int(decision.block))
            + ',"chunk":' + str(int(decision.chunk))
            + ',"comm_path":"' + path
            + '","gpus":[' + ",".join([str(int(g)) for g in decision.gpus])
            + '],"mode":"' + mode
            + '","shares":[' + ",".join(map(float.__repr__, shares))
            + ']},"task":' + task_text + "}")


def canonical_json(task: TaskSpec, decision: Decision) -> str:
    """The exact text whose SHA-256 is the config hash::

        json.dumps({"task": task.to_json(),
                    "decision": decision.to_json(include_hash=False)},
                   sort_keys=True, separators=(",", ":"))
    """
    text = _canonical_text(task, decision)
    if text is not None:
        return text
    return json.dumps(
        {"task": task.to_json(), "decision": decision.to_json(include_hash=False)},
        sort_keys=True, separators=(",", ":"),
    )


def config_hash(task: TaskSpec, decision: Decision) -> str:
    """SHA-256 hex digest of :func:`canonical_json` (anyone can recompute it).

    The last decision :meth:`Decision.with_hash` made for a task is kept on
    the task (it is frozen) with the field objects (immutable) and task text
    it hashed, and the digest: for that very decision object, with those
    very fields, and the task's text unchanged, this returns the digest
    without hashing again. Anything else is hashed afresh.
    """
    memo = getattr(task, "__dict__", {}).get("_hashed")
    if memo is not None and memo[0] is decision and memo[1] is decision.gpus \
            and memo[2] is decision.shares and memo[3] is decision.chunk \
            and memo[4] is decision.block and memo[5] is decision.mode \
            and memo[6] is decision.comm_path and memo[7] == _task_text(task):
        return memo[8]
    return hashlib.sha256(canonical_json(task, decision).encode()).hexdigest()


def decision_from_weights(task: TaskSpec, devices: Sequence[int],
                          weights: Sequence[float], *, block: int = DEFAULT_BLOCK,
                          comm_path: str = "host") -> Decision:
    """A split decision over ``devices`` with shares proportional to ``weights``.

    Devices with zero weight are dropped; one device left gives ``single`` mode.
    The shares sum to exactly 1 (the last one takes the rounding), as Gate 1
    requires. The hash is not computed (:meth:`Decision.with_hash`).
    """
    pairs = [(d, w) for d, w in zip(devices, weights, strict=True) if w > 0]
    if not pairs:
        raise ValueError(f"no device has a positive weight for {task.describe()}")
    shares = normalised_shares([w for _, w in pairs])
    mode = "single" if len(pairs) == 1 else "split"
    return Decision(gpus=tuple(d for d, _ in pairs), shares=tuple(shares),
                    chunk=task.split_size, block=block, mode=mode,
                    comm_path=comm_path)


def normalised_shares(weights: Sequence[float]) -> list[float]:
    """Positive ``weights`` as shares summing to exactly 1: each over their
    sum, the last one taking the rounding (as Gate 1 requires)."""
    total = math.fsum(weights)
    shares = [w / total for w in weights]
    shares[-1] = 1.0 - math.fsum(shares[:-1])
    return shares
