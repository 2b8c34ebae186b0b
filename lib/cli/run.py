"""``gpuhive run``: decide, check (Gate 1), execute and optionally verify a task."""

from __future__ import annotations

import argparse
from typing import Any

from lib.cli.common import (
    UsageError,
    add_backend,
    add_json,
    add_machine,
    add_policy,
    add_seed,
    add_task_file,
    add_task_options,
    add_telemetry,
    check_calibration,
    count_type,
    decided_for,
    describe_telemetry,
    emit,
    fmt_seconds,
    policy_from_args,
    read_json,
    repeats_type,
    task_from_args,
    telemetry_from_args,
)
from lib.contract import MEASURING_BACKENDS, ContractError

HELP = "decide, validate, execute, optionally verify"
#: Untimed runs before the timed ones on a measuring backend, by default.
DEFAULT_WARMUP = 1


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``run`` to ``subparsers``."""
    p = subparsers.add_parser(
        "run", help=HELP,
        description="Decide how to split a task (or take a decision file), check "
                    "the decision with Gate 1, execute it on a backend and, with "
                    "--verify, compare the result with the NumPy reference.")
    add_task_options(p)
    add_task_file(p)
    add_machine(p)
    add_policy(p)
    add_json(p)
    add_backend(p)
    add_telemetry(p, runs=True)
    p.add_argument("--decision", metavar="FILE",
                   help="run this decision instead of the policy's: a decision "
                        "JSON (give its task too), or what gpuhive decide "
                        "printed (its task and machine come with it)")
    p.add_argument("--rehash", action="store_true",
                   help="recompute the decision file's config_hash (any "
                        "hash it holds, well-formed or not, is ignored)")
    p.add_argument("--verify", action="store_true",
                   help="compare the result with the NumPy reference")
    add_seed(p, "inputs")
    p.add_argument("--repeats", type=repeats_type, default=1,
                   help="timed runs on a measuring backend, 1 or more; the "
                        "figure is their median (default: %(default)s)")
    p.add_argument("--warmup", type=count_type, default=DEFAULT_WARMUP,
                   help="untimed runs first on a measuring backend, 0 or more "
                        "(default: %(default)s: a worker's first run of a task "
                        "maps its buffers and finds them cold, which the "
                        "figure should not hold)")
    p.set_defaults(run=run)
    return p


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """The backend's options: the inputs' seed, and on a measuring backend
    (cpu, cuda, dask) the timed repeats and the warm-ups."""
    options: dict[str, Any] = {"seed": args.seed}
    if args.backend in MEASURING_BACKENDS:
        options.update(repeats=args.repeats, warmup=args.warmup)
    return options


def run(args: argparse.Namespace) -> int:
    """Execute the task; exit 0, or 1 when verification failed."""
    from lib.contract import Decision
    from lib.runtime import Agent

    given = task_from_args(args) if args.kind or args.task or not args.decision \
        else None
    check_calibration(args.machine)
    agent = Agent(policy=policy_from_args(args), machine=args.machine,
                  backend=args.backend, telemetry=telemetry_from_args(args),
                  **backend_options(args))
    decision = None
    snap = None
    try:
        task = given
        if args.decision:  # a decision alone, or gpuhive decide's output
            obj, task = decided_for(read_json(args.decision, "decision"),
                                    args.decision, given, agent.machine.name)
            if task is None:
                raise UsageError(f"decision file {args.decision} holds a "
                                 "decision alone: give its task (--kind and "
                                 "--dim, or --task FILE)")
            if args.rehash and isinstance(obj, dict):  # the hash is recomputed
                obj = {k: v for k, v in obj.items() if k != "config_hash"}
            try:
                decision = Decision.from_json(obj)
            except ContractError as exc:
                raise UsageError(f"decision file {args.decision}: {exc}") from None
        snap = agent.telemetry  # read now; the decision and the run share it
        if decision is None:
            decision = agent.optimize(task)
        elif args.rehash:
            decision = decision.with_hash(task)
        notes = agent.notes()  # before the run, whose record may mend one
        result = agent.execute(task, decision, verify=args.verify)
    finally:
        agent.close()
    m = result.metrics
    tag = "MEASURED" if m.measured else "PREDICTED"
    seen = describe_telemetry(snap)
    lines = [f"{m.label} {task.describe()} on {agent.machine.name}",
             *(f"note      {note}" for note in notes),
             f"telemetry {seen or 'none (decided as if every device were idle)'}",
             f"decision  {decision.describe()}"]
    # a Dask worker's label is its address: the column widens to hold it
    width = max([20, *(len(agent.machine.devices[g].label) for g in decision.gpus)])
    lines.append(f"  {'device':<{width}} {'share':>6} {'seconds':>10}")
    for pos, g in enumerate(decision.gpus):
        if g in m.per_device_seconds:
            lines.append(f"  {agent.machine.devices[g].label:<{width}} "
                         f"{decision.shares[pos]:6.3f} "
                         f"{fmt_seconds(m.per_device_seconds[g]):>10}  {tag}")
    how = [f"{m.backend} backend"]
    if m.measured:
        how.append(f"after {args.warmup} warm-up{'s' if args.warmup > 1 else ''}"
                   if args.warmup else "no warm-up")
    if m.repeats > 1:
        how.append(f"median of {m.repeats}")
    lines.append(f"total {fmt_seconds(m.total_seconds)} {tag} ({', '.join(how)})")
    lines += [f"note      {note}" for note in result.detail.get("notes", ())]
    if m.verified is not None:
        lines.append(f"verified {str(m.verified).lower()} (max abs error "
                     f"{m.max_abs_error:.3g})")
    emit(args, {"task": task.to_json(), "machine": agent.machine.name,
                "notes": notes, "telemetry": seen,
                "decision": decision.to_json(), "metrics": m.to_json(),
                "warmup": args.warmup if m.measured else 0},
         "\n".join(lines))
    return 0 if m.verified is not False else 1
