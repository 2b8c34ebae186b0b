"""What several ``gpuhive`` commands share: the options, each defined once, and
the helpers that turn them into tasks, policies and output.

Each shared option is added by one function here, so its spelling, default and
help text exist in one place; each ``choices=`` comes from the constant that
owns the vocabulary.

Why one module: the options, the readers of the files they name (bounded,
strict inputs; outputs checked before the work) and the helpers that turn
both into tasks and policies answer bad input alike, with one
:class:`UsageError` naming the option or the file, and the helpers use each
other (``--task FILE`` is read by the file readers, ``--policy FILE`` checked
by them). Split, the readers would need the options' error and the options
the readers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lib.budgets import BUDGETS, DEFAULT_BUDGET
from lib.contract import (
    BACKENDS,
    DEFAULT_DTYPE,
    DTYPES,
    KIND_DIMS,
    KINDS,
    MEASURING_BACKENDS,
    ContractError,
    TaskSpec,
    loads_strict,
)
from lib.policies.registry import POLICIES, make_policy

if TYPE_CHECKING:
    from lib.policies.baselines import Policy

#: The machine profile most commands default to (four different GPUs, simulated).
DEFAULT_MACHINE = "hetero-4"
#: This computer's cores as devices: the default of the commands that measure.
LOCAL_MACHINE = "local-cpu"
#: The backend commands that decide default to (predicts; always available).
DEFAULT_BACKEND = "model"
#: The backend that measures on this computer (runs ``local-cpu``).
LOCAL_BACKEND = "cpu"
#: The policy ``--policy`` names by default: the shipped learned one.
DEFAULT_POLICY = "rl"
#: The most bytes an input file may hold (16 MiB): every task, decision,
#: source, characterisation or answers file is far smaller, and a cap keeps a
#: mistaken path (a disk image, ``/dev/zero``) from filling memory.
MAX_INPUT_BYTES = 16 << 20

T = TypeVar("T")


class UsageError(ValueError):
    """Bad command-line input (exit status 2)."""


class LazyChoices:
    """A ``choices=`` vocabulary read from a module's constant on first use.

    For vocabularies that live in a module too heavy to import while building
    the parser, so ``gpuhive --help`` and the other commands never load it.
    Give the option a ``metavar`` and list the choices with ``%(choices)s`` in
    its help: argparse reads the choices to build a usage line without one.
    """

    def __init__(self, module: str, name: str):
        self.module = module
        self.name = name

    def _values(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.name))

    def __contains__(self, value: object) -> bool:
        return value in self._values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())


# -- option types -----------------------------------------------------------
# argparse turns their ArgumentTypeError into one line naming the option
# ("argument --repeats: expected an integer >= 1, got 0") and exit status 2.

def _shown(text: str, width: int = 40) -> str:
    """``text`` cut to ``width`` characters for a message (a 5000-digit number
    stays one short line)."""
    return text if len(text) <= width else text[:width - 3] + "..."


def int_at_least(low: int) -> Callable[[str], int]:
    """An option type: an integer of at least ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer, got {_shown(text)!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def finite_float(low: float, high: float | None = None, *,
                 low_open: bool = False) -> Callable[[str], float]:
    """An option type: a finite number in ``[low, high)`` (``(low, high)`` with
    ``low_open``; no upper bound if ``high`` is None)."""
    span = (f"{'>' if low_open else '>='} {low:g}" if high is None else
            f"in {'(' if low_open else '['}{low:g}, {high:g})")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number, got {_shown(text)!r}") from None
        inside = (value > low if low_open else value >= low) and (
            high is None or value < high)
        if not math.isfinite(value) or not inside:
            raise argparse.ArgumentTypeError(
                f"expected a finite number {span}, got {_shown(text)!r}")
        return value
    parse.__name__ = f"number {span}"
    return parse


#: ``--repeats``: at least one timed run.
repeats_type = int_at_least(1)
#: ``--warmup`` and ``--seed``: zero or more.
count_type = int_at_least(0)


# -- options ----------------------------------------------------------------

def add_task_options(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--kind``, ``--dim NAME=VALUE`` (repeated) and ``--dtype``."""
    p.add_argument("--kind", choices=KINDS, required=required,
                   help="workload class")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="a dimension, repeated: " + "; ".join(
                       f"{k}: {','.join(d)}" for k, d in KIND_DIMS.items()))
    p.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPES,
                   help="element type (default: %(default)s)")


def add_task_file(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--task FILE``: the task as JSON (instead of the task options unless
    ``required``)."""
    what = ("the task as a JSON file ({\"kind\", \"dims\"}; dtype, divisible_dim "
            "and merge default to fp32 and the kind's own split)")
    p.add_argument("--task", required=required, metavar="TASK.json",
                   help=what if required else what + ", instead of --kind/--dim")


def add_machine(p: argparse.ArgumentParser, default: str = DEFAULT_MACHINE) -> None:
    """``--machine NAME``."""
    p.add_argument("--machine", default=default,
                   help="machine profile; gpuhive doctor lists them "
                        "(default: %(default)s)")


def add_backend(p: argparse.ArgumentParser, *, measuring: bool = False) -> None:
    """``--backend``: every backend, or (``measuring``) only those that measure."""
    if measuring:
        p.add_argument("--backend", default=LOCAL_BACKEND,
                       choices=MEASURING_BACKENDS,
                       help="the backend that measures (default: %(default)s)")
    else:
        p.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS,
                       help="model predicts with the cost model; the others "
                            "measure real runs (default: %(default)s)")


def add_policy(p: argparse.ArgumentParser) -> None:
    """``--policy NAME|FILE``: a policy by name or a policy file."""
    p.add_argument("--policy", default=DEFAULT_POLICY, metavar="NAME|FILE",
                   help=f"a policy by name ({', '.join(POLICIES)}; default "
                        f"{DEFAULT_POLICY}, the shipped learned policy) or the "
                        "path of a policy file (.npz)")


def add_budget(p: argparse.ArgumentParser) -> None:
    """``--budget``: how long the command may take."""
    p.add_argument("--budget", default=DEFAULT_BUDGET, choices=BUDGETS,
                   help="how long it may take, from seconds to the server run "
                        "(default: %(default)s)")


def add_seed(p: argparse.ArgumentParser, what: str = "random numbers") -> None:
    """``--seed N``; ``what`` says what it seeds."""
    p.add_argument("--seed", type=count_type, default=0,
                   help=f"seed of the {what} (default: %(default)s)")


#: ``--telemetry`` choices: the runtime's (:class:`lib.runtime.Agent`).
TELEMETRY_CHOICES = ("auto", "live", "none")


def add_telemetry(p: argparse.ArgumentParser, runs: bool) -> None:
    """``--telemetry auto|live|none``: whether the decision is made under the
    devices' state read now; ``runs``: the command runs the decision, so
    ``auto`` reads them on a measuring backend."""
    auto = ("auto reads them when the task runs on the cpu or cuda backend "
            "(whose telemetry leaves our own workers out) and goes on without "
            "where they cannot be read" if runs
            else "auto (as none: nothing runs here)")
    p.add_argument("--telemetry", default="auto", choices=TELEMETRY_CHOICES,
                   help="decide under the devices' state read now (on CPU "
                        "cores: what other processes leave of each, MEASURED): "
                        f"{auto}; live reads them or fails in one line (on the "
                        "model backend: the machine's real devices); none "
                        "decides as if they were idle (default: %(default)s)")


def telemetry_from_args(args: argparse.Namespace) -> str | None:
    """``--telemetry`` as :class:`lib.runtime.Agent` takes it."""
    return None if args.telemetry == "none" else args.telemetry


def describe_telemetry(snap: Any) -> str | None:
    """One line on the snapshot a decision was made under (None: none)."""
    if snap is None:
        return None
    tag = "MEASURED" if snap.measured else "given"
    if snap.capacity is not None:
        what = "capacity " + " ".join(f"{c:.2f}" for c in snap.capacity)
    else:
        what = "utilisation " + " ".join(f"{u:.2f}" for u in snap.utilisation)
    down = [str(i) for i, ok in enumerate(snap.healthy) if not ok]
    return (f"{tag} {snap.source}: {what} (device order)"
            + (f"; unhealthy: {', '.join(down)}" if down else ""))


def add_json(p: argparse.ArgumentParser) -> None:
    """``--json``: print JSON instead of text."""
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


# -- helpers ----------------------------------------------------------------

def fmt_seconds(t: float) -> str:
    """Seconds in a readable unit: ``1.23 ms``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """``["N=4096", ...]`` as ``{"N": 4096, ...}``; UsageError naming the item
    (not NAME=VALUE, not an integer, or a name given twice)."""
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--dim {_shown(item)!r}: expected NAME=VALUE, e.g. "
                             "--dim N=4096")
        if name in dims:
            raise UsageError(f"--dim {name} given twice ({name}={dims[name]} and "
                             f"{_shown(item)}); give each dimension once")
        try:
            dims[name] = int(value)
        except ValueError:
            raise UsageError(f"--dim {_shown(item)!r}: {_shown(value)!r} is not an "
                             "integer") from None
    return dims


# -- input files ------------------------------------------------------------
# Every file a command reads is read here: a regular file (a FIFO, a device or
# a folder is refused before any read, so nothing hangs), at most
# MAX_INPUT_BYTES, UTF-8 text where text is expected, strict JSON where JSON
# is. Every failure is a UsageError naming the file: one line, exit status 2.

_NOT_REGULAR = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` is no input file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
    return f"not a regular file ({what})"


def input_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` checked to be a regular file, for readers that open it
    themselves (a policy ``.npz``); UsageError naming it otherwise."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what} file {path}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if (why := _not_regular(mode)) is not None:
        raise UsageError(f"{what} file {path}: {why}")
    return Path(path)


def read_bytes(path: str | os.PathLike, what: str, *,
               limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the ``what`` file at ``path``: a regular file of at most
    ``limit`` bytes; UsageError naming it otherwise.

    The file is opened without blocking (a FIFO opens at once) and checked on
    the open descriptor, so it cannot be swapped between check and read.
    """
    where = f"{what} file {path}"
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{where}: {getattr(exc, 'strerror', None) or exc}"
                         ) from None
    try:
        st = os.fstat(fd)
        if (why := _not_regular(st.st_mode)) is not None:
            raise UsageError(f"{where}: {why}")
        too_big = UsageError(f"{where}: larger than {limit >> 20} MiB, the most an "
                             "input file may hold")
        if st.st_size > limit:
            raise too_big
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise too_big
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | os.PathLike, what: str, *,
              limit: int = MAX_INPUT_BYTES) -> str:
    """The text of the ``what`` file at ``path``, which must be UTF-8 (a
    UTF-8 byte-order mark is dropped); UsageError naming it otherwise."""
    data = read_bytes(path, what, limit=limit)
    where = f"{what} file {path}"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UsageError(f"{where}: UTF-16 text (it starts with a UTF-16 "
                         "byte-order mark); save it as UTF-8")
    if b"\0" in data:
        raise UsageError(f"{where}: holds NUL bytes at offset {data.index(0)} "
                         "(UTF-16 text, or not text); save it as UTF-8")
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        raise UsageError(f"{where}: not UTF-8 text (byte 0x{data[at]:02x} at "
                         f"offset {at}); save it as UTF-8") from None


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The ``what`` file at ``path`` decoded as strict JSON (no NaN, infinity
    or duplicate keys); UsageError naming it otherwise."""
    text = read_text(path, what)
    where = f"{what} file {path}"
    try:
        return loads_strict(text)
    except ContractError as exc:  # "json: not valid JSON: ...", "N: duplicate field"
        raise UsageError(f"{where}: "
                         f"{exc.problem if exc.field == 'json' else exc}") from None
    except (ValueError, RecursionError) as exc:  # an integer of 4300+ digits
        raise UsageError(f"{where}: not valid JSON: {_shown(str(exc), 80)}") from None


def load_file(path: str | os.PathLike, what: str,
              parse: Callable[[Any], T]) -> T:
    """``parse`` of the JSON in the ``what`` file at ``path``
    (``TaskSpec.from_json``, ``Decision.from_json``); a contract error names
    the file and the field."""
    obj = read_json(path, what)
    try:
        return parse(obj)
    except ContractError as exc:
        raise UsageError(f"{what} file {path}: {exc}") from None


def _writable_folder(folder: Path, option: str, given: str) -> None:
    """Make ``folder`` (and its parents) and write a file in it, or raise
    UsageError naming ``option``: what a command will write at its end is
    checked before it starts (``os.access`` says yes to root everywhere, so
    a file is made and removed)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gpuhive-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {given}: cannot write in {folder} "
                         f"({exc.strerror or exc})") from None


def output_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a file a command writes when it ends, checked before it
    starts: not a folder, and in a folder this user can write (made if
    missing).

    Raises:
        UsageError: naming ``option`` and the path.
    """
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{option} {path}: a folder; give a file's path")
    _writable_folder(out.parent, option, str(path))
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"{option} {path}: not writable")
    return out


def output_folder(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a folder a command writes into, checked (and made) before
    it starts.

    Raises:
        UsageError: naming ``option`` and the path.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {path}: a file, not a folder")
    _writable_folder(out, option, str(path))
    return out


#: The fields of what ``gpuhive decide`` prints (and ``gpuhive explain
#: --json``, among others): the decision, with the task and machine it was
#: made for. A decision file may hold such an object or the decision alone.
DECIDED_FIELDS = frozenset({"task", "machine", "decision"})


def decided_for(obj: Any, path: str | os.PathLike, given_task: TaskSpec | None,
                machine_name: str) -> tuple[Any, TaskSpec | None]:
    """The decision object of a decision file's JSON ``obj`` and the task it
    goes with: for ``gpuhive decide``'s output (or ``explain --json``'s), its
    decision and its task
    (checked to be ``given_task`` where one was given, and to be decided for
    the machine named ``machine_name``); for a decision alone, ``obj`` and
    ``given_task``.

    Raises:
        UsageError: the output of ``gpuhive decide`` for another task or
            machine, or a task in it that is not a task (naming the file).
    """
    if not (isinstance(obj, dict) and DECIDED_FIELDS <= set(obj)):
        return obj, given_task
    where = f"decision file {path}"
    try:
        task = TaskSpec.from_json(obj["task"])
    except ContractError as exc:
        raise UsageError(f"{where}: {exc}") from None
    if given_task is not None and given_task != task:
        raise UsageError(f"{where} was decided for {task.describe()}, not "
                         f"{given_task.describe()}")
    if obj["machine"] != machine_name:
        raise UsageError(f"{where} was decided for machine {obj['machine']!s:.80}, "
                         f"not {machine_name} (give --machine {obj['machine']!s:.80})")
    return obj["decision"], task


def check_home() -> None:
    """Refuse a home folder (``$GPUHIVE_HOME``, else ``~/.gpuhive``) that is a
    file or lies below one, before a command works for minutes and then
    cannot write."""
    from lib.storage import gpuhive_home

    home = gpuhive_home()
    name = "GPUHIVE_HOME" if os.environ.get("GPUHIVE_HOME") else "home folder"
    probe = home
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        below = "" if probe == home else f" ({probe} is a file)"
        raise UsageError(f"{name} {home} is not a folder{below}")


def check_calibration(machine_name: str) -> None:
    """Read the machine's stored calibration file, where there is one, as an
    input file and as parameters: the commands that use it fail fast, naming
    it and how to mend it, rather than deep inside a run."""
    from lib.platform.machines import MachineError
    from lib.platform.machines import machine_name as name_of
    from lib.storage import StorageError, calibration_path

    spec = machine_name
    try:
        machine_name = name_of(spec)
        path = calibration_path(machine_name)
    except (StorageError, MachineError):
        return  # the command refuses the name itself
    if not os.path.lexists(path):
        return
    from lib.costmodel.parameters import CalibrationError, load_params

    try:
        read_json(path, "calibration")
        load_params(machine_name)
    except (UsageError, CalibrationError) as exc:
        # ``gpuhive calibrate`` writes the file again whatever it holds
        raise UsageError(f"{exc}; not used: write it again with gpuhive calibrate "
                         f"--machine {spec}, or move it aside") from None


def task_from_args(args: argparse.Namespace) -> TaskSpec:
    """The task of ``--task FILE``, or of ``--kind``, ``--dim`` and ``--dtype``."""
    if getattr(args, "task", None):
        return load_file(args.task, "task",
                         lambda data: TaskSpec.from_json(data, defaults=True))
    if not args.kind:
        raise UsageError("give --kind and --dim NAME=VALUE (or --task FILE)")
    return TaskSpec(kind=args.kind, dims=parse_dims(args.dim or []),
                    dtype=args.dtype)


def policy_from_args(args: argparse.Namespace) -> Policy:
    """The policy ``--policy`` names; UsageError for an unknown name or a policy
    file that cannot be loaded."""
    if args.policy not in POLICIES and os.path.lexists(args.policy):
        input_file(args.policy, "policy")
    try:
        return make_policy(args.policy)
    except ValueError as exc:
        raise UsageError(f"--policy: {exc}") from None


def emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    """Print ``obj`` as JSON under ``--json``, else ``text``."""
    print(json.dumps(obj, indent=2) if args.json else text)
