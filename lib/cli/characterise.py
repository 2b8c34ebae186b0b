"""``gpuhive characterise``: measure what a machine profile only estimates."""

from __future__ import annotations

import argparse

from lib.cli.common import (
    LOCAL_MACHINE,
    UsageError,
    add_backend,
    add_budget,
    add_json,
    add_machine,
    add_seed,
    count_type,
    emit,
    output_file,
)

HELP = "measure what a profile only estimates (runs real workloads)"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``characterise`` to ``subparsers``."""
    p = subparsers.add_parser(
        "characterise", help=HELP,
        description="Run real workloads on a machine to measure its throughput, "
                    "host link and device-to-device copies, and write the "
                    "MEASURED runs for gpuhive calibrate.")
    add_machine(p, default=LOCAL_MACHINE)
    add_backend(p, measuring=True)
    add_budget(p)
    add_seed(p, "inputs and of the order of the runs")
    p.add_argument("--induce-load", type=count_type, default=0, metavar="N",
                   help="measure under load on purpose: N processes of another "
                        "session spinning on the first device's core (cpu "
                        "backend; then score a calibration on them with "
                        "gpuhive calibrate --score FILE)")
    p.add_argument("--out", metavar="FILE", help="where to write the runs "
                   "(default: $GPUHIVE_HOME/characterisation/<machine>.json)")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Measure and write the runs; exit 0."""
    from lib.execution.characterise import CharacterisationError, characterise

    out = output_file(args.out, "--out") if args.out else None
    try:
        obj = characterise(args.machine, args.backend, budget=args.budget,
                           seed=args.seed, progress=not args.json,
                           out=out,
                           induce_load=args.induce_load)
    except CharacterisationError as exc:
        raise UsageError(str(exc)) from None
    runs = obj.get("runs", [])
    text = (f"characterised {args.machine} on the {args.backend} backend: "
            f"{len(runs)} MEASURED runs written to {obj.get('path')}\n"
            f"next: gpuhive calibrate --machine {args.machine}")
    emit(args, {"path": str(obj.get("path")), "runs": len(runs),
                "machine": args.machine, "backend": args.backend}, text)
    return 0
