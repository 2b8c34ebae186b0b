"""``gpuhive history``: what the history-based model has learned of a machine."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from lib.cli.common import LOCAL_MACHINE, add_json, add_machine, emit, fmt_seconds

HELP = ("show the devices' learned rates, what shards felt on busy devices, and "
        "how many MEASURED runs stand behind each")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``history`` to ``subparsers``."""
    p = subparsers.add_parser(
        "history", help=HELP,
        description="Show what the history-based performance model has learned "
                    "on a machine: per workload kind, dtype and device, the "
                    "effective rate (normalised by the capacity the device had) "
                    "and how many MEASURED runs stand behind it; and, per device "
                    "and length of shard, how much of the contention on a busy "
                    "device such shards felt (0: as on a free core, 1: the "
                    "measured capacity), which the runtime uses to tell a "
                    "policy what a task's shard will effectively get; and, per "
                    "kind, dtype and device, the device's speed beside the "
                    "devices it ran with, against the cost model (1: as the "
                    "model says, next to them); a device slower than the "
                    "fastest by more than 15 % is shown to the policy with that "
                    "fraction of its capacity; and, per device and contention, "
                    "what a run cost the device beyond its time on the shard "
                    "(waking its worker, handing over the job and the result), "
                    "which the runtime adds to a short shard on a device dearer "
                    "than the cheapest. --forget removes it all, so the runtime "
                    "learns the machine afresh from its next run (after new "
                    "hardware, or a history that no longer fits it).")
    add_machine(p, default=LOCAL_MACHINE)
    p.add_argument("--forget", action="store_true",
                   help="remove the machine's history (a malformed one too) "
                        "and say what it held")
    add_json(p)
    p.set_defaults(run=run)
    return p


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _span(octave: int) -> str:
    """An octave of shard CPU seconds, ``[2**k, 2**(k+1))``, as text."""
    return f"{fmt_seconds(2.0 ** octave)}-{fmt_seconds(2.0 ** (octave + 1))}"


def _band(level: float) -> str:
    """The capacities of the octave of contention level ``level`` is the
    middle of, as text."""
    from lib.costmodel.contention import capacity_band
    low, high = capacity_band(level)
    return f" beside capacity {low:.2f}-{high:.2f}"


def run(args: argparse.Namespace) -> int:
    """Print the learned figures; exit 0 (an empty history is not an error)."""
    from lib.costmodel.contention import METHOD_FELT
    from lib.costmodel.history import METHOD, History
    from lib.costmodel.overhead import FREE_BAND, METHOD_OVERHEAD
    from lib.costmodel.speed import METHOD_SPEED
    from lib.platform.machines import machine_name

    if args.forget:
        return forget(args)
    name = machine_name(args.machine)
    history = History.load(name)
    obj = history.to_json()
    obj["path"] = str(history.path)
    stale = _stale(history, args.machine)
    obj["stale"] = {str(i): why for i, why in stale.items()}
    bursts = [(level, b) for d in sorted({d for d, _ in history.felt})
              for level, b in history.bands(d)]
    obj["bursts"] = [{**dataclasses.asdict(b), "level": level}
                     for level, b in bursts]
    if not len(history):
        # A mistyped name finds no runs either: say which machines have some.
        kept = sorted(p.stem for p in history.path.parent.glob("*.json")
                      if p != history.path)
        obj["histories_kept"] = kept
        text = (f"history of {name}: no MEASURED runs recorded yet "
                f"({history.path})")
        if kept:
            text += f"; runs are recorded for: {', '.join(kept)}"
    else:
        lines = [f"history of {name}: MEASURED rates ({history.path})",
                 f"  {'kind':<12} {'dtype':<6} {'device':>6} {'rate':>14} "
                 f"{'spread':>7} {'runs':>5}"]
        for key in sorted(history.figures):
            f = history.figures[key]
            lines.append(f"  {f.kind:<12} {f.dtype:<6} {f.device:>6} "
                         f"{_rate(f.rate, f.unit):>14} "
                         f"{100 * f.log_scale:>6.0f}% {f.runs:>5}")
        lines.append(f"  method: {METHOD}")
        if history.felt:
            lines += ["", "what shards felt on busy devices (MEASURED)",
                      f"  {'device':>6} {'shard CPU time':>20} {'felt':>5} "
                      f"{'runs':>5}"]
            for key in sorted(history.felt):
                f = history.felt[key]
                lines.append(f"  {f.device:>6} {_span(f.octave):>20} "
                             f"{f.rho:>5.2f} {f.runs:>5}")
            for level, b in bursts:
                beside = "" if level is None else _band(level)
                lines.append(f"  device {b.device}{beside}: runs free for "
                             f"{fmt_seconds(b.b)} after waking, then feels "
                             f"{b.rho_inf:.2f} of the contention (fit of "
                             f"{b.samples} samples, mean deviation {b.error:.2f})")
            lines.append(f"  method: {METHOD_FELT}")
        if history.speeds_kept:
            lines += ["", "speed beside the other devices, against the cost model "
                      "(MEASURED)",
                      f"  {'kind':<12} {'dtype':<6} {'device':>6} "
                      f"{'modelled shard':>20} {'speed':>6} {'samples':>7} "
                      f"{'runs':>5}"]
            for key in sorted(history.speeds_kept):
                sp = history.speeds_kept[key]
                g = "-" if sp.g is None else f"{sp.g:.2f}"
                lines.append(f"  {sp.kind:<12} {sp.dtype:<6} {sp.device:>6} "
                             f"{_span(sp.octave):>20} {g:>6} "
                             f"{len(sp.samples):>7} {sp.runs:>5}")
            lines.append(f"  method: {METHOD_SPEED}")
        if history.overheads:
            lines += ["", "overhead beyond the shard (MEASURED)",
                      f"  {'device':>6} {'contention':>22} {'mean':>9} "
                      f"{'median':>9} {'samples':>7} {'runs':>5}"]
            for key in sorted(history.overheads):
                o = history.overheads[key]
                mean, median = o.summary()
                where = "free" if o.band == FREE_BAND \
                    else _band(2.0 ** (o.band + 0.5)).strip()
                lines.append(f"  {o.device:>6} {where:>22} "
                             f"{fmt_seconds(mean):>9} {fmt_seconds(median):>9} "
                             f"{len(o.samples):>7} {o.runs:>5}")
            lines.append(f"  method: {METHOD_OVERHEAD}")
        if history.devices or stale:
            lines += ["", "devices the figures were learned on",
                      f"  {'device':>6} {'identity':<12}  learned on"]
            for i in sorted(set(history.devices) | set(stale)):
                known = history.devices.get(i)
                lines.append(f"  {i:>6} {known.identity if known else '-':<12}  "
                             f"{known.label if known else '(not recorded)'}"
                             + ("  NOT USED: " + stale[i] if i in stale else ""))
            if stale:
                lines.append("  what was learned of a device the machine no "
                             "longer has is not used, and its next MEASURED run "
                             "forgets it")
        text = "\n".join(lines)
    emit(args, obj, text)
    return 0


def _stale(history: Any, name: str) -> dict[int, str]:
    """What of ``history`` was learned on devices machine ``name`` no longer
    has (:meth:`~lib.costmodel.history.History.stale`); empty where the
    machine cannot be looked at without starting something (a Dask
    cluster, ``dask://`` or ``dask-local:``) or cannot be loaded here."""
    from lib.platform.machines import MachineError, load_machine

    if not history.devices or name.startswith("dask"):
        return {}
    try:
        machine = load_machine(name)
    except (MachineError, OSError, RuntimeError):
        return {}   # nvml without a driver, a profile moved away
    return history.stale(machine)


def forget(args: argparse.Namespace) -> int:
    """Remove the machine's history file and say what it held; exit 0 (a
    machine with none has nothing to forget, and says so)."""
    from lib.costmodel.history import History, HistoryError, history_path
    from lib.platform.machines import machine_name

    name = machine_name(args.machine)
    path = history_path(name)
    if not path.is_file():
        emit(args, {"machine": name, "path": str(path), "removed": False},
             f"history of {name}: none to forget ({path})")
        return 0
    try:
        held = History.load(name)
        runs = sum(f.runs for f in held.figures.values())
        what = f"{len(held)} rate(s) from {runs} MEASURED shard run(s)"
    except HistoryError:
        runs, what = None, "a malformed file"
    path.unlink()
    emit(args, {"machine": name, "path": str(path), "removed": True,
                "runs": runs},
         f"history of {name}: forgot {what} (removed {path}); the "
         "runtime learns it afresh from its next MEASURED run")
    return 0
