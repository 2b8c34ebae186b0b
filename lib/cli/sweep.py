"""``gpuhive sweep``: a small timed sweep, every kind on one device and on all
devices.

``make gpu-check`` runs it on the GPU server (``--machine nvml --backend cuda``);
here it runs on ``local-cpu`` with the ``cpu`` backend. Every row is verified
against the NumPy reference and labelled with its backend.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from lib.cli.common import (
    LOCAL_MACHINE,
    add_backend,
    add_json,
    add_machine,
    emit,
    finite_float,
    fmt_seconds,
    output_file,
    repeats_type,
)
from lib.contract import TaskSpec, decision_from_weights

HELP = "every kind on one device and on all devices, timed and verified " \
       "(make gpu-check)"
#: small tasks per kind: a sweep must finish within minutes
SWEEP_TASKS = {
    "matmul": {"M": 1024, "N": 1024, "K": 1024},
    "reduce": {"N": 1 << 24},
    "elementwise": {"N": 1 << 24},
    "stencil": {"H": 2048, "W": 2048, "T": 4},
    "histogram": {"N": 1 << 24, "B": 256},
}


def sweep(machine_name: str, backend: str, *, scale: float = 1.0, seed: int = 0,
          repeats: int = 3, out: Path | None = None) -> dict[str, Any]:
    """Run every kind on device 0 alone and split equally over all devices.

    Args:
        machine_name: profile (``nvml`` on a GPU server, ``local-cpu`` here).
        backend: ``cuda`` or ``cpu``.
        scale: multiplies the divisible dimension of every task.
        out: where to write the JSON (also returned).
    """
    from lib.execution import get_backend
    from lib.platform.machines import load_machine
    from lib.policies.baselines import EqualSplit

    machine = load_machine(machine_name)
    rows = []
    start = time.perf_counter()
    with get_backend(backend, machine, seed=seed, repeats=repeats,
                     warmup=1) as runner:
        for kind, dims in SWEEP_TASKS.items():
            dims = dict(dims)
            first = next(iter(dims))
            dims[first] = max(16, int(dims[first] * scale))
            task = TaskSpec(kind, dims)
            plans = {"one device": decision_from_weights(
                task, [0], [1.0], block=machine.block_for([0]))}
            if machine.n > 1:
                plans["all devices"] = EqualSplit().decide(task, machine)
            for name, decision in plans.items():
                decision = decision.with_hash(task)
                result = runner.run(task, decision, verify=True)
                m = result.metrics
                rows.append({"kind": kind, "task": task.to_json(), "plan": name,
                             "devices": list(decision.gpus), "label": m.label,
                             "total_seconds": m.total_seconds,
                             "per_device_seconds": m.per_device_seconds,
                             "verified": m.verified,
                             "max_abs_error": m.max_abs_error})
    report = {"machine": machine.name, "backend": backend,
              "wall_seconds": time.perf_counter() - start, "rows": rows,
              "all_verified": all(r["verified"] for r in rows)}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
    return report


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``sweep`` to ``subparsers``."""
    p = subparsers.add_parser(
        "sweep", help=HELP,
        description="Run a small task of every kind on device 0 alone and split "
                    "equally over all devices, each timed and verified against "
                    "the NumPy reference; exit 0 only if every row verified.")
    add_machine(p, default=LOCAL_MACHINE)
    add_backend(p, measuring=True)
    p.add_argument("--scale", type=finite_float(0.0, low_open=True), default=1.0,
                   help="multiplies every task's divisible dimension "
                        "(default: %(default)s)")
    p.add_argument("--repeats", type=repeats_type, default=3,
                   help="timed repeats per row (default: %(default)s)")
    p.add_argument("--out", metavar="FILE", help="write the JSON here")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the rows; exit 0 if every row verified, else 1."""
    out = output_file(args.out, "--out") if args.out else None
    report = sweep(args.machine, args.backend, scale=args.scale,
                   repeats=args.repeats, out=out)
    lines = [f"sweep on {report['machine']} ({args.backend} backend), "
             f"{report['wall_seconds']:.1f} s"]
    for r in report["rows"]:
        lines.append(f"  {r['kind']:<12} {r['plan']:<12} "
                     f"{fmt_seconds(r['total_seconds']):>10} {r['label']:<16} "
                     f"verified {str(r['verified']).lower()}")
    if args.out:
        lines.append(f"written to {args.out}")
    emit(args, report, "\n".join(lines))
    return 0 if report["all_verified"] else 1
