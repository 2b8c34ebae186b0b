"""``gpuhive history``: what the history-based model has learned of a machine."""

from __future__ import annotations

import argparse

from lib.cli.common import LOCAL_MACHINE, add_json, add_machine, emit

HELP = "show the devices' learned rates and how many MEASURED runs stand behind each"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``history`` to ``subparsers``."""
    p = subparsers.add_parser(
        "history", help=HELP,
        description="Show what the history-based performance model has learned "
                    "on a machine: per workload kind, dtype and device, the "
                    "effective rate (normalised by the capacity the device had) "
                    "and how many MEASURED runs stand behind it.")
    add_machine(p, default=LOCAL_MACHINE)
    add_json(p)
    p.set_defaults(run=run)
    return p


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def run(args: argparse.Namespace) -> int:
    """Print the learned figures; exit 0 (an empty history is not an error)."""
    from lib.costmodel.history import METHOD, History

    history = History.load(args.machine)
    obj = history.to_json()
    obj["path"] = str(history.path)
    if not len(history):
        text = (f"history of {args.machine}: no MEASURED runs recorded yet "
                f"({history.path})")
    else:
        lines = [f"history of {args.machine}: MEASURED rates ({history.path})",
                 f"  {'kind':<12} {'dtype':<6} {'device':>6} {'rate':>14} "
                 f"{'spread':>7} {'runs':>5}"]
        for key in sorted(history.figures):
            f = history.figures[key]
            lines.append(f"  {f.kind:<12} {f.dtype:<6} {f.device:>6} "
                         f"{_rate(f.rate, f.unit):>14} "
                         f"{100 * f.log_scale:>6.0f}% {f.runs:>5}")
        lines.append(f"  method: {METHOD}")
        text = "\n".join(lines)
    emit(args, obj, text)
    return 0
