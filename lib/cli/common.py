"""What several ``gpuhive`` commands share: the options, each defined once, and
the helpers that turn them into tasks, policies and output.

Each shared option is added by one function here, so its spelling, default and
help text exist in one place; each ``choices=`` comes from the constant that
owns the vocabulary.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lib.budgets import BUDGETS, DEFAULT_BUDGET
from lib.contract import (
    DEFAULT_DTYPE,
    DTYPES,
    KIND_DIMS,
    KINDS,
    MEASURING_BACKENDS,
    TaskSpec,
)
from lib.execution import BACKENDS
from lib.policies.baselines import Policy
from lib.policies.registry import POLICIES, make_policy

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
    p.add_argument("--task", required=required, metavar="TASK.json",
                   help="the task as a JSON file" if required
                   else "the task as a JSON file, instead of --kind/--dim")


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
    p.add_argument("--seed", type=int, default=0,
                   help=f"seed of the {what} (default: %(default)s)")


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
    """``["N=4096", ...]`` as ``{"N": 4096, ...}``; UsageError naming the item."""
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--dim {item!r}: expected NAME=VALUE, e.g. --dim N=4096")
        try:
            dims[name.strip()] = int(value)
        except ValueError:
            raise UsageError(f"--dim {item!r}: {value!r} is not an integer") from None
    return dims


def read_text(path: str, what: str) -> str:
    """The text of the ``what`` file at ``path``; UsageError naming it."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{what} file {path}: {exc.strerror or exc}") from None


def task_from_args(args: argparse.Namespace) -> TaskSpec:
    """The task of ``--task FILE``, or of ``--kind``, ``--dim`` and ``--dtype``."""
    if getattr(args, "task", None):
        return TaskSpec.from_json(read_text(args.task, "task"))
    if not args.kind:
        raise UsageError("give --kind and --dim NAME=VALUE (or --task FILE)")
    return TaskSpec(kind=args.kind, dims=parse_dims(args.dim or []),
                    dtype=args.dtype)


def policy_from_args(args: argparse.Namespace) -> Policy:
    """The policy ``--policy`` names; UsageError for an unknown name or a policy
    file that cannot be loaded."""
    try:
        return make_policy(args.policy)
    except ValueError as exc:
        raise UsageError(f"--policy: {exc}") from None


def emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    """Print ``obj`` as JSON under ``--json``, else ``text``."""
    print(json.dumps(obj, indent=2) if args.json else text)
