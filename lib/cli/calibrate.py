"""``gpuhive calibrate``: fit the cost model to measured runs."""

from __future__ import annotations

import argparse
import os

from lib.cli.common import (
    LOCAL_MACHINE,
    UsageError,
    add_json,
    add_machine,
    add_seed,
    emit,
    finite_float,
    read_json,
)

HELP = "fit the cost model to measured runs and report its error on held-out runs"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``calibrate`` to ``subparsers``."""
    p = subparsers.add_parser(
        "calibrate", help=HELP,
        description="Fit the cost model's parameters to a machine's MEASURED "
                    "runs (from gpuhive characterise), save them, and report "
                    "the model's error on runs held out of the fit.")
    add_machine(p, default=LOCAL_MACHINE)
    p.add_argument("--characterisation", metavar="FILE", action="append",
                   help="the measured runs (default: "
                        "$GPUHIVE_HOME/characterisation/<machine>.json); repeat "
                        "to pool several, e.g. a quiet one and one taken with "
                        "characterise --induce-load (each later one gets a fitted "
                        "pace against the first; the parameters saved are the "
                        "first's)")
    p.add_argument("--holdout", type=finite_float(0.0, 1.0), default=0.3,
                   help="fraction of runs held out for scoring "
                        "(default: %(default)s)")
    p.add_argument("--folds", type=int, default=5, metavar="K",
                   help="also cross-validate the fit K-fold: every run predicted "
                        "by a fit to the other folds, a steadier figure than one "
                        "split (0: skip; default: %(default)s)")
    add_seed(p, "split into fitted and held-out runs (and of the folds)")
    p.add_argument("--score", metavar="FILE",
                   help="fit nothing: score the saved calibration of --machine on "
                        "the runs of another characterisation FILE (e.g. one "
                        "taken under load), every run held out")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Fit and report (or, with ``--score``, score); exit 0."""
    from lib.costmodel.calibrate import CalibrationError, calibrate_machine
    from lib.platform.machines import machine_name
    from lib.storage import characterisation_path

    if args.score:
        return _score(args)
    # The runs file is read here first, with every input file's checks; the
    # fit reads it again (where it is missing, the fit says how to make it).
    for runs in args.characterisation or [characterisation_path(
            machine_name(args.machine))]:
        if os.path.lexists(runs):
            read_json(runs, "characterisation")
    if args.folds < 0 or args.folds == 1:
        raise UsageError(f"--folds {args.folds}: expected 0 (no cross-validation) "
                         "or at least 2")
    try:
        report = calibrate_machine(args.machine, args.characterisation,
                                   holdout=args.holdout, seed=args.seed,
                                   folds=args.folds)
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None
    emit(args, report.to_json(), report.summary())
    return 0


def _score(args: argparse.Namespace) -> int:
    """``--score FILE``: the saved calibration's error on FILE's runs."""
    from lib.costmodel.calibrate import (
        LOADED_APE_GOAL_PCT,
        CalibrationError,
        score_runs,
    )
    from lib.costmodel.parameters import load_params
    from lib.platform.machines import machine_name
    from lib.storage import characterisation_path

    obj = read_json(args.score, "characterisation")
    if not isinstance(obj, dict) or not isinstance(obj.get("runs"), list):
        raise UsageError(f"{args.score}: no 'runs' list (not a characterisation)")
    try:
        params = load_params(machine_name(args.machine))
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None
    if params is None:
        raise UsageError(f"no saved calibration of {args.machine}; run: gpuhive "
                         f"calibrate --machine {args.machine}")
    try:
        out = score_runs(args.machine, obj["runs"], params)
    except CalibrationError as exc:
        raise UsageError(f"{args.score}: {exc}") from None
    loaded = out["loaded_median_ape_pct"]
    text = (f"{params.source}, scored on {out['runs']} MEASURED runs of "
            f"{args.score} ({out['loaded_runs']} loaded): median APE "
            f"{out['median_ape_pct']:.1f} %, p90 {out['p90_ape_pct']:.1f} %, "
            f"Spearman {out['spearman']:.3f}"
            + (f"; loaded runs median APE {loaded:.1f} %" if loaded is not None
               else ""))
    if loaded is not None and loaded > LOADED_APE_GOAL_PCT \
            and not any(name.startswith("contention[") for name in params.fitted):
        # a fit of quiet runs cannot know how much more than its share a
        # busy device costs a shard; these runs can tell it
        quiet = characterisation_path(machine_name(args.machine))
        text += (f"\nabove the {LOADED_APE_GOAL_PCT:.0f} % goal, and the saved fit "
                 "saw no run under load: fit these runs in as well with gpuhive "
                 f"calibrate --machine {args.machine} --characterisation "
                 f"{quiet if quiet.is_file() else '<the quiet runs>'} "
                 f"--characterisation {args.score}")
    emit(args, out, text)
    return 0
