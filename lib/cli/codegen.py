"""``gpuhive codegen``: generate the kernel for a task, through the whole plane."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from lib.cli.common import (
    DEFAULT_DTYPE,
    DEFAULT_MACHINE,
    UsageError,
    add_json,
    add_machine,
    add_task_options,
    emit,
    parse_dims,
)
from lib.codegen import PROVIDERS, CodeGenerator, CodegenError, GeneratedKernel
from lib.contract import TaskSpec
from lib.platform.machines import load_machine
from lib.policies.baselines import ProportionalToPeak
from lib.security import check_decision

HELP = "CUDA source specialised to the decision for a task, through Gate 2"
#: The provider ``--provider`` names by default: the shipped templates, offline.
DEFAULT_PROVIDER = "template"


def generate_for_cli(kind: str, dims: Mapping[str, int], dtype: str = DEFAULT_DTYPE,
                     machine_name: str = DEFAULT_MACHINE,
                     provider: str = DEFAULT_PROVIDER,
                     model: str | None = None) -> GeneratedKernel:
    """What ``gpuhive codegen --kind K --dim NAME=VALUE ... [--dtype D]
    [--machine M] --provider P [--model X] [--show]`` does.

    The decision is the proportional-to-peak baseline's for the task on the
    machine, checked by Gate 1. ``--show`` prints ``kernel.source`` and nothing
    else; without it the CLI prints ``kernel.describe()``.

    Raises:
        lib.contract.ContractError: a bad kind, dimension or dtype (a
            ValueError naming the field).
        CodegenError: Gate 1 refused the decision, a provider is not
            configured for the template-only path, or no NVRTC.
    """
    task = TaskSpec(kind, dict(dims), dtype)
    machine = load_machine(machine_name)
    decision = ProportionalToPeak().decide(task, machine, None).with_hash(task)
    verdict = check_decision(decision, task, machine)
    if not verdict.accepted:
        raise CodegenError(f"Gate 1 refused the decision for {task.describe()}: "
                           f"{verdict.summary()}")
    return CodeGenerator().generate(task, decision, provider, model=model)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``codegen`` to ``subparsers``."""
    p = subparsers.add_parser(
        "codegen", help=HELP,
        description="Generate the CUDA kernel for a task, specialised to the "
                    "proportional-to-peak decision on the machine, from the "
                    "template or an LLM provider, through Gate 2 and the "
                    "sealed kernel cache.")
    add_task_options(p, required=True)
    add_machine(p)
    p.add_argument("--provider", default=DEFAULT_PROVIDER, choices=PROVIDERS,
                   help="where the source comes from (default: %(default)s)")
    p.add_argument("--model", help="LLM model name (default from GPUHIVE_*_MODEL)")
    p.add_argument("--show", action="store_true",
                   help="print the final source on stdout and nothing else")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the kernel's source (``--show``) or its description; exit 0."""
    try:
        kernel = generate_for_cli(args.kind, parse_dims(args.dim or []),
                                  dtype=args.dtype, machine_name=args.machine,
                                  provider=args.provider, model=args.model)
    except CodegenError as exc:
        raise UsageError(str(exc)) from None
    if args.show:
        sys.stdout.write(kernel.source if kernel.source.endswith("\n")
                         else kernel.source + "\n")
        return 0
    emit(args, {"kernel": kernel.kernel_name, "provider": kernel.provider,
                "model": kernel.model, "label": kernel.label,
                "cached": kernel.cached, "fell_back_from": list(kernel.fell_back_from),
                "reasons": list(kernel.reasons), "ptx_bytes": kernel.ptx_bytes,
                "registers": kernel.registers}, kernel.describe())
    return 0
