"""``gpuhive codegen``: generate the kernel for a task, through the whole plane."""

from __future__ import annotations

from collections.abc import Mapping

from lib.codegen import CodeGenerator, CodegenError, GeneratedKernel
from lib.contract import TaskSpec
from lib.platform.machines import load_machine
from lib.policies.baselines import ProportionalToPeak
from lib.security import check_decision


def generate_for_cli(kind: str, dims: Mapping[str, int], dtype: str = "fp32",
                     machine_name: str = "hetero-4", provider: str = "template",
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


