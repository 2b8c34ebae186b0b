"""``gpuhive train``: the three-stage training pipeline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lib.cli.common import (
    LazyChoices,
    add_budget,
    add_json,
    add_machine,
    add_seed,
    check_calibration,
)
from lib.policies.learned import FEATURE_SETS

HELP = "the three-stage training pipeline (cost model, noisy calibrated model, " \
       "measured runs)"
#: The learners, read from the training package only when ``train`` needs them.
LEARNERS = LazyChoices("lib.training", "LEARNERS")
#: The learner ``--learner`` names by default.
DEFAULT_LEARNER = "ppo"
#: The feature set ``--features`` names by default: the whole state.
DEFAULT_FEATURES = "all"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``train`` to ``subparsers``."""
    p = subparsers.add_parser(
        "train", help=HELP,
        description="Train a policy for a machine in three stages: on the cost "
                    "model, on a noisy calibrated model, then on measured runs; "
                    "checkpoints let an interrupted run resume.")
    add_machine(p)
    add_budget(p)
    add_seed(p, "weights, environments and noise")
    p.add_argument("--learner", default=DEFAULT_LEARNER, choices=LEARNERS,
                   metavar="NAME",
                   help="the learning algorithm, one of %(choices)s "
                        "(default: %(default)s)")
    p.add_argument("--features", default=DEFAULT_FEATURES,
                   choices=tuple(FEATURE_SETS),
                   help="ablation: the state features the policy sees "
                        "(default: %(default)s)")
    p.add_argument("--no-mask", action="store_true",
                   help="ablation: act without the action mask")
    p.add_argument("--no-curriculum", action="store_true",
                   help="ablation: train on the target machine only")
    p.add_argument("--out", metavar="DIR", help="checkpoints, curves and the "
                   "policy (default _build/train/<machine>-<budget>-<seed>)")
    p.add_argument("--fresh", action="store_true",
                   help="ignore checkpoints and start over")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Train and write the policy; exit 0."""
    from lib.training import TrainConfig, train

    check_calibration(args.machine)
    config = TrainConfig(machine=args.machine, budget=args.budget, seed=args.seed,
                         learner=args.learner, features=args.features,
                         use_mask=not args.no_mask,
                         curriculum=not args.no_curriculum)
    out = Path(args.out or f"_build/train/{args.machine}-{args.budget}-{args.seed}")
    result = train(config, out, progress=not args.json, resume=not args.fresh)
    if args.json:
        print(json.dumps(result.summary(), indent=2, default=str))
    return 0
