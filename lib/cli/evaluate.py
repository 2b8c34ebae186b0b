"""``gpuhive evaluate``: Table 4, the ablations, transfer and the targets T1-T7."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lib.cli.common import (
    UsageError,
    add_backend,
    add_budget,
    add_json,
    add_machine,
    add_seed,
    check_calibration,
    input_file,
    output_file,
    repeats_type,
)

HELP = "Table 4, ablations, transfer and the targets T1-T7"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``evaluate`` to ``subparsers``."""
    p = subparsers.add_parser(
        "evaluate", help=HELP,
        description="Score the learned policy against the baselines and the "
                    "exhaustive optimum (Table 4), run the ablations and the "
                    "transfer test, and check the targets T1-T7.")
    add_machine(p)
    add_backend(p)
    add_budget(p)
    add_seed(p, "task set, the random baseline and the inputs")
    # A file only, unlike the shared --policy: the protocol scores every
    # baseline itself; this names the learned policy set against them.
    p.add_argument("--policy", metavar="FILE", help="a trained policy (.npz); "
                                                   "default the shipped one")
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown "
                                                     "report here")
    p.add_argument("--repeats", type=repeats_type, default=None,
                   help="on a measured backend, the least rounds a task gets "
                        "(short tasks get more, up to 25): each round runs "
                        "every distinct decision once, and a decision's "
                        "figure is the mean of its rounds with the fastest "
                        "and slowest tenth cut (default: the budget's: 1, 3 "
                        "or 5)")
    p.add_argument("--no-optimum", action="store_true",
                   help="leave out the exhaustive optimum (the oracle row and "
                        "every ratio to it); T2 and T7 then do not pass")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 0."""
    from lib.policies.learned import load_policy

    if args.policy:
        # Loaded here so a file that is no policy is refused (exit 2) rather
        # than left out of the report with a note.
        input_file(args.policy, "policy")
        try:
            load_policy(args.policy)
        except ValueError as exc:
            raise UsageError(f"--policy: {exc}") from None
    if args.markdown:
        output_file(args.markdown, "--markdown")
    check_calibration(args.machine)
    from lib.evaluation import evaluate

    report = evaluate(args.machine, args.backend, args.budget, seed=args.seed,
                      policy_path=args.policy, progress=not args.json,
                      repeats=args.repeats, with_optimum=not args.no_optimum)
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown())
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print(report.to_text())
    return 0
