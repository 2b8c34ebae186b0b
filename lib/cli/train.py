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
    count_type,
    output_folder,
)
from lib.contract import BACKENDS

HELP = "the three-stage training pipeline (cost model, noisy calibrated model, " \
       "measured runs)"
#: The learners, read from the training package only when ``train`` needs them.
LEARNERS = LazyChoices("lib.training", "LEARNERS")
#: The ablations' feature sets, read from the learned policy's module likewise.
FEATURES = LazyChoices("lib.policies.learned", "FEATURE_SETS")
#: The backends a measured stage can run on.
REAL_BACKENDS = tuple(b for b in BACKENDS if b != "model")
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
                   choices=FEATURES, metavar="SET",
                   help="ablation: the state features the policy sees, one of "
                        "%(choices)s (default: %(default)s)")
    p.add_argument("--no-mask", action="store_true",
                   help="ablation: act without the action mask")
    p.add_argument("--no-curriculum", action="store_true",
                   help="ablation: train on the target machine only")
    p.add_argument("--pretrain-steps", type=count_type, metavar="N",
                   help="environment steps on the cost model (stages 1 and 2 "
                        "together, in the budget's proportions; default: the "
                        "budget's)")
    p.add_argument("--finetune-steps", type=count_type, metavar="N",
                   help="measured steps on the machine's real devices "
                        "(stage 3; 0 skips it; default: the budget's)")
    p.add_argument("--finetune-backend", choices=REAL_BACKENDS, metavar="B",
                   help="the backend of the measured stage, one of "
                        "%(choices)s (default: the machine's first real "
                        "backend)")
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
                         curriculum=not args.no_curriculum,
                         pretrain_steps=args.pretrain_steps,
                         finetune_steps=args.finetune_steps,
                         finetune_backend=args.finetune_backend)
    out = output_folder(args.out or f"_build/train/{Path(args.machine).stem}-"
                        f"{args.budget}-{args.seed}", "--out")
    result = train(config, out, progress=not args.json, resume=not args.fresh)
    saved = out / "policy.npz"
    if args.json:
        summary = result.summary()
        summary["policy_path"] = str(saved) if saved.is_file() else None
        print(json.dumps(summary, indent=2, default=str))
    elif result.interrupted:
        print(f"interrupted: the checkpoint is in {out}; run the same command "
              "to resume")
    elif saved.is_file():
        print(f"policy saved to {saved} (use it with --policy {saved})")
    else:
        print(f"no policy file: {config.learner} policies are not saved "
              f"(curves and summary in {out})")
    return 0
