"""``gpuhive validate``: Gate 1 on a decision file."""

from __future__ import annotations

import argparse
import json

from lib.cli.common import (
    UsageError,
    add_json,
    add_machine,
    decided_for,
    emit,
    load_file,
    read_text,
)

HELP = "Gate 1 on a decision file"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``validate`` to ``subparsers``."""
    p = subparsers.add_parser(
        "validate", help=HELP,
        description="Check a decision file against a task and a machine with "
                    "Gate 1; exit 0 if accepted, 1 if rejected (text that is not "
                    "a decision included), 2 if a file cannot be read as UTF-8 "
                    "text. The file may hold a decision alone (give --task) or "
                    "what gpuhive decide printed.")
    p.add_argument("decision", metavar="DECISION.json",
                   help="the decision as a JSON file, or what gpuhive decide "
                        "printed (its task and machine come with it)")
    p.add_argument("--task", metavar="TASK.json",
                   help="the task as a JSON file (for a decision file that "
                        "holds a decision alone)")
    add_machine(p)
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the verdict; exit 0 if accepted, 1 if rejected."""
    from lib.contract import ContractError, TaskSpec, loads_strict
    from lib.platform.machines import load_machine
    from lib.security import check_decision

    task = load_file(args.task, "task", TaskSpec.from_json) if args.task else None
    # The decision goes to Gate 1 as text: text that is not a decision (not
    # JSON, NaN, a duplicate key) is Gate 1's to reject (exit 1); a file that
    # cannot be read as UTF-8 text is bad input (exit 2).
    text = read_text(args.decision, "decision")
    machine = load_machine(args.machine)
    try:
        obj = loads_strict(text)
    except ContractError:
        obj = None   # not strict JSON: Gate 1 says why, from the text
    decision, task = decided_for(obj, args.decision, task, machine.name)
    if decision is not obj:   # gpuhive decide's output: its decision, strictly read
        text = json.dumps(decision)
    if task is None:
        raise UsageError(f"give --task TASK.json: {args.decision} holds a "
                         "decision alone (what gpuhive decide prints holds its "
                         "task)")
    verdict = check_decision(text, task, machine)
    lines = [verdict.summary()] + [f"  {v}" for v in verdict.violations[1:]]
    emit(args, {"accepted": verdict.accepted,
                "violations": [{"check": v.check, "message": v.message}
                               for v in verdict.violations]}, "\n".join(lines))
    return 0 if verdict.accepted else 1
