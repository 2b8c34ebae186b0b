"""``gpuhive book``: execute the notebooks and build the HTML book."""

from __future__ import annotations

import argparse
import sys

from lib.cli.common import (
    add_backend,
    add_budget,
    add_machine,
    add_seed,
    check_calibration,
)

HELP = "execute the notebooks and build the HTML book"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``book`` to ``subparsers``."""
    p = subparsers.add_parser(
        "book", help=HELP,
        description="Execute every notebook for one machine, backend and "
                    "budget, then build the HTML book; run it in the project's "
                    "folder.")
    add_machine(p)
    add_backend(p)
    add_budget(p)
    add_seed(p, "notebooks' runs")
    p.add_argument("--no-html", action="store_true",
                   help="execute the notebooks only")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Build the book; exit 0, or 1 when it could not be built."""
    from lib.book import BookError, build_book

    check_calibration(args.machine)
    try:
        build_book(machine=args.machine, backend=args.backend, budget=args.budget,
                   seed=args.seed, html=not args.no_html)
    except BookError as exc:
        print(f"gpuhive: book failed: {exc}", file=sys.stderr)
        return 1
    return 0
