"""``gpuhive security-audit``: the injection suite over the three gates, and
with ``--end-to-end`` attack answers pushed through the whole plane."""

from __future__ import annotations

import argparse
import json

from lib.cli.common import add_json, add_seed, repeats_type

HELP = "the injection suite over the three gates: recall, false positives, latency"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``security-audit`` to ``subparsers``."""
    p = subparsers.add_parser(
        "security-audit", help=HELP,
        description="Run every adversarial and benign case through its gate and "
                    "report recall, false positives and latency; exit 0 only "
                    "for a perfect score.")
    p.add_argument("--repeats", type=repeats_type, default=3,
                   help="gate calls per case (default: %(default)s)")
    p.add_argument("--end-to-end", action="store_true",
                   help="also push attack answers through the whole code-generation "
                        "plane (sandbox, NVRTC, the sanitizer spot check) and check "
                        "no payload left a trace on the host (under a minute on "
                        "two cores: the cases run side by side, one per core, "
                        "up to four)")
    add_seed(p, "run order and the flipped bytes")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 0 for a perfect score, else 1."""
    from lib.evaluation.audit import run_audit

    report = run_audit(repeats=args.repeats, seed=args.seed,
                       end_to_end=args.end_to_end, progress=args.end_to_end)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_text())
    perfect = (report.recall == 1.0 and report.intended_accuracy == 1.0
               and report.false_positive_rate == 0.0)
    return 0 if perfect else 1
