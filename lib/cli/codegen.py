"""``gpuhive codegen``: generate the kernel for a task, through the whole plane.

``--provider recorded --answers FILE.json [--answer-id ID]`` replays a stored
answer (an LLM's, or one written by hand) through Gate 2a, NVRTC, the spot
check and the sealed cache; the output says whether the answer or the
template's fallback was used and which check refused a refused answer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lib.cli.common import (
    DEFAULT_DTYPE,
    DEFAULT_MACHINE,
    LazyChoices,
    UsageError,
    add_json,
    add_machine,
    add_policy,
    add_task_options,
    emit,
    parse_dims,
    policy_from_args,
    read_text,
)
from lib.contract import TaskSpec

if TYPE_CHECKING:
    from lib.codegen import GeneratedKernel
    from lib.codegen.llm import Provider
    from lib.contract import Decision
    from lib.policies.baselines import Policy

HELP = "CUDA source specialised to the decision for a task, through Gate 2"
#: The provider ``--provider`` names by default: the shipped templates, offline.
DEFAULT_PROVIDER = "template"
#: The providers, read from the code-generation plane only when a command
#: needs them (it loads the compilers' bindings).
PROVIDERS = LazyChoices("lib.codegen", "PROVIDERS")
def generate_for_cli(kind: str, dims: Mapping[str, int], dtype: str = DEFAULT_DTYPE,
                     machine_name: str = DEFAULT_MACHINE,
                     provider: str | Provider = DEFAULT_PROVIDER,
                     model: str | None = None,
                     policy: str | Policy | None = None
                     ) -> tuple[GeneratedKernel, Decision]:
    """What ``gpuhive codegen --kind K --dim NAME=VALUE ... [--dtype D]
    [--machine M] [--policy P] --provider X [--model Y] [--show]`` does: the
    kernel and the decision it is specialised to.

    The decision is the policy's for the task on the machine (a name or a
    policy file as ``--policy`` takes it, or a policy; default the shipped
    learned policy, as ``gpuhive decide`` and ``explain`` give it), accepted
    by Gate 1. ``--show`` prints ``kernel.source`` and nothing else; without
    it the CLI prints the decision and ``kernel.describe()``.

    Raises:
        lib.contract.ContractError: a bad kind, dimension or dtype (a
            ValueError naming the field).
        CodegenError: Gate 1 refused the decision, a provider is not
            configured for the template-only path, or no NVRTC.
    """
    from lib.codegen import CodeGenerator, CodegenError
    from lib.runtime import Agent, DecisionRejected

    task = TaskSpec(kind, dict(dims), dtype)
    agent = Agent(policy=policy, machine=machine_name)
    try:
        decision = agent.optimize(task)
    except DecisionRejected as exc:
        raise CodegenError(f"Gate 1 refused the decision for {task.describe()}: "
                           f"{exc}") from None
    return CodeGenerator().generate(task, decision, provider, model=model), decision


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``codegen`` to ``subparsers``."""
    p = subparsers.add_parser(
        "codegen", help=HELP,
        description="Generate the CUDA kernel for a task, specialised to the "
                    "policy's decision for it on the machine (the one gpuhive "
                    "decide gives), from the template or an LLM provider, "
                    "through Gate 2 and the sealed kernel cache; --provider "
                    "recorded replays a stored answer.")
    add_task_options(p, required=True)
    add_machine(p)
    add_policy(p)
    p.add_argument("--provider", default=DEFAULT_PROVIDER, choices=PROVIDERS,
                   metavar="NAME",
                   help="where the source comes from, one of %(choices)s "
                        "(default: %(default)s)")
    p.add_argument("--model", help="LLM model name (default from GPUHIVE_*_MODEL)")
    p.add_argument("--answers", metavar="FILE.json",
                   help="with --provider recorded: the stored answers, "
                        '{"answers": [{"id", "kind", "dtype", "answer"}, ...]} '
                        "(default: the shipped lib/codegen/recorded/answers.json)")
    p.add_argument("--answer-id", metavar="ID",
                   help="with --provider recorded: the answer to replay "
                        "(default: the first for the task's kind and dtype)")
    p.add_argument("--show", action="store_true",
                   help="print the final source on stdout and nothing else")
    add_json(p)
    p.set_defaults(run=run)
    return p


def recorded_provider(args: argparse.Namespace,
                      task: TaskSpec) -> tuple[Provider, str]:
    """The recorded provider of ``--answers`` and ``--answer-id`` and the id
    of the answer it replays for ``task``, checked to be there and to be an
    answer for the task's kind and dtype."""
    from lib.codegen import CodegenError
    from lib.codegen.llm import RECORDED_PATH, RecordedProvider

    if args.model:
        raise UsageError("--model does not apply to --provider recorded; name "
                         "the answer with --answer-id")
    path = args.answers or RECORDED_PATH
    # Read as every input file is (UTF-8 text); the provider parses it.
    provider = RecordedProvider(path=path, answer_id=args.answer_id,
                                raw=read_text(path, "answers").encode())
    try:
        answer = provider.find(task)
    except CodegenError:
        held = ", ".join(f"{a['id']} ({a['kind']} {a['dtype']})"
                         for a in provider.answers) or "none"
        raise UsageError(f"{path} holds no answer for {task.kind} {task.dtype}; "
                         f"its answers: {held}") from None
    if (answer["kind"], answer["dtype"]) != (task.kind, task.dtype):
        raise UsageError(f"answer {answer['id']!r} is for {answer['kind']} "
                         f"{answer['dtype']}, the task is {task.kind} "
                         f"{task.dtype}")
    return provider, answer["id"]


def run(args: argparse.Namespace) -> int:
    """Print the kernel's source (``--show``) or its description and which
    code was used; exit 0."""
    from lib.codegen import CodegenError
    from lib.codegen.plane import CHECKS

    if args.provider != "recorded" and (args.answers or args.answer_id):
        raise UsageError("--answers and --answer-id need --provider recorded")
    task = TaskSpec(args.kind, parse_dims(args.dim or []), args.dtype)
    provider: str | Provider = args.provider
    answer_id = None
    try:
        if args.provider == "recorded":
            provider, answer_id = recorded_provider(args, task)
        kernel, decision = generate_for_cli(
            task.kind, task.dims, dtype=task.dtype, machine_name=args.machine,
            provider=provider, model=args.model, policy=policy_from_args(args))
    except CodegenError as exc:
        raise UsageError(str(exc)) from None
    if args.show:
        sys.stdout.write(kernel.source if kernel.source.endswith("\n")
                         else kernel.source + "\n")
        return 0
    refused = [{"provider": name, "check": CHECKS[check], "reason": why}
               for name, why, check in zip(kernel.fell_back_from, kernel.reasons,
                                          kernel.refused_by, strict=True)]
    who = (f"recorded answer {answer_id!r}" if answer_id is not None
           else f"{args.provider} answer")
    if kernel.provider != "template":
        used = f"the {who}"
    elif refused:
        used = f"the template, as the {who} was refused by {refused[-1]['check']}"
    else:
        used = "the template"
    obj = {"decision": decision.to_json(), "kernel": kernel.kernel_name,
           "provider": kernel.provider,
           "model": kernel.model, "label": kernel.label,
           "used": "template" if kernel.provider == "template" else "answer",
           "refused": refused, "cached": kernel.cached,
           "fell_back_from": list(kernel.fell_back_from),
           "reasons": list(kernel.reasons), "ptx_bytes": kernel.ptx_bytes,
           "registers": kernel.registers}
    if answer_id is not None:
        obj.update(answers=str(provider.path), answer_id=answer_id)
    emit(args, obj, f"decision {decision.describe()}\n{kernel.describe()}\n"
                    f"used     {used}")
    return 0
