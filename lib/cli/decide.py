"""``gpuhive decide``: just the decision, as JSON, for programs to read.

The small, stable output a C++ or CUDA program asks for (see
``kernels/gpuhive/README.md``): the task, the machine, the policy and the
decision, hashed and accepted by Gate 1, and nothing computed besides.
"""

from __future__ import annotations

import argparse
import json
import sys

from lib.cli.common import (
    add_machine,
    add_policy,
    add_task_file,
    add_task_options,
    add_telemetry,
    describe_telemetry,
    policy_from_args,
    task_from_args,
    telemetry_from_args,
)

HELP = "the decision for a task as JSON (for programs: C++, CUDA, scripts)"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``decide`` to ``subparsers``."""
    p = subparsers.add_parser(
        "decide", help=HELP,
        description="Decide how to split a task and print only "
                    '{"task", "machine", "policy", "decision"} as JSON: the '
                    "decision hashed and accepted by Gate 1 (with --telemetry "
                    "live, also the devices' state it was decided under). No "
                    "prediction is computed; kernels/gpuhive/decision.hpp reads "
                    "this output.")
    add_task_options(p)
    add_task_file(p)
    add_machine(p)
    add_policy(p)
    add_telemetry(p, runs=False)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the decision document; exit 0 (2 where Gate 1 refuses it)."""
    from lib.runtime import Agent

    task = task_from_args(args)
    agent = Agent(policy=policy_from_args(args), machine=args.machine,
                  telemetry=telemetry_from_args(args))
    snap = agent.telemetry
    decision = agent.optimize(task)
    doc = {"task": task.to_json(), "machine": agent.machine.name,
           "policy": agent.policy.name, "decision": decision.to_json()}
    if snap is not None:  # --telemetry live: what it was decided under
        doc["telemetry"] = describe_telemetry(snap)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
