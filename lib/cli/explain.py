"""``gpuhive explain``: the decision for a task and its predicted per-device
breakdown, against the equal split and the exhaustive optimum."""

from __future__ import annotations

import argparse

from lib.cli.common import (
    add_json,
    add_machine,
    add_policy,
    add_task_file,
    add_task_options,
    add_telemetry,
    check_calibration,
    describe_telemetry,
    emit,
    fmt_seconds,
    policy_from_args,
    task_from_args,
    telemetry_from_args,
)

HELP = "the decision for a task and its predicted per-device breakdown"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``explain`` to ``subparsers``."""
    p = subparsers.add_parser(
        "explain", help=HELP,
        description="Decide how to split a task and print the cost model's "
                    "PREDICTED per-device breakdown, with the equal split and "
                    "the exhaustive optimum for comparison.")
    add_task_options(p)
    add_task_file(p)
    add_machine(p)
    add_policy(p)
    add_telemetry(p, runs=False)
    add_json(p)
    p.set_defaults(run=run)
    return p


def breakdown_table(pred) -> list[str]:
    """The lines of a prediction's per-device table and its merge."""
    # a Dask worker's label is its address: the column widens to hold it
    w = max([20, *(len(d.label) for d in pred.devices)])
    lines = [f"  {'device':<{w}} {'share':>6} {'rows':>10} {'launch':>9} {'in':>9} "
             f"{'compute':>9} {'out':>9} {'total':>9}"]
    for d in pred.devices:
        lines.append(
            f"  {d.label:<{w}} {d.share:6.3f} {d.rows:10d} "
            f"{fmt_seconds(d.t_launch):>9} {fmt_seconds(d.t_in):>9} "
            f"{fmt_seconds(d.t_comp):>9} {fmt_seconds(d.t_out):>9} "
            f"{fmt_seconds(d.total):>9}")
    lines.append(f"  merge ({pred.comm_path}): {fmt_seconds(pred.t_merge)}")
    # the terms of the total beside the slowest device and the merge
    if pred.t_host > 0:
        lines.append(f"  host's serial work for the shards: {fmt_seconds(pred.t_host)}")
    if pred.t_dispatch > 0:
        lines.append(f"  dispatch (the cluster's fixed cost of a decision): "
                     f"{fmt_seconds(pred.t_dispatch)}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the decision and its breakdown; exit 0."""
    from lib.costmodel import predict
    from lib.costmodel.calibrate import params_for
    from lib.policies.baselines import EqualSplit
    from lib.policies.oracle import optimum
    from lib.runtime import Agent
    from lib.security import check_decision

    task = task_from_args(args)
    check_calibration(args.machine)
    agent = Agent(policy=policy_from_args(args), machine=args.machine,
                  telemetry=telemetry_from_args(args))
    params = params_for(agent.machine.name)
    snap = agent.telemetry
    # every figure below is priced under what the policy decided under
    view = agent.seen_by_policy(task, snap)
    decision = agent.optimize(task)
    pred = predict(task, decision, agent.machine, view, params=params)
    equal = EqualSplit().decide(task, agent.machine, view).with_hash(task)
    ref = predict(task, equal, agent.machine, view, params=params) \
        if check_decision(equal, task, agent.machine, snap).accepted else None
    seen = describe_telemetry(snap)
    lines = [f"task        {task.describe()} on {agent.machine.name}"
             f"{' (simulated)' if agent.machine.simulated else ''}",
             f"policy      {agent.policy.name}",
             *(f"note        {note}" for note in agent.notes()),
             *([f"telemetry   {seen}"] if seen else []),
             f"decision    {decision.describe()}",
             f"config_hash {decision.config_hash}",
             f"PREDICTED breakdown (model backend, cost model Eq. (1), "
             f"{pred.params_source} parameters):"]
    lines += breakdown_table(pred)
    summary = f"PREDICTED total: {fmt_seconds(pred.total)}"
    if ref is not None:
        summary += (f"  (equal split: {fmt_seconds(ref.total)}, "
                    f"{ref.total / pred.total:.2f}x)")
    lines.append(summary)
    best = optimum(task, agent.machine, view, params=params)
    lines.append(f"exhaustive optimum: {fmt_seconds(best.total)} "
                 f"({best.decision.describe()}); this decision takes "
                 f"{pred.total / best.total:.2f}x of it")
    emit(args, {"task": task.to_json(), "machine": agent.machine.name,
                "policy": agent.policy.name, "notes": agent.notes(),
                "telemetry": seen, "decision": decision.to_json(),
                "prediction": pred.to_json(),
                "equal_split_seconds": ref.total if ref else None,
                "optimum_seconds": best.total,
                "optimum_decision": best.decision.to_json()},
         "\n".join(lines))
    return 0
