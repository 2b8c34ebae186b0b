"""``gpuhive server-setup``: set up a GPU server and check it worked, in one
command (what the original ``scripts/server_setup.sh`` did).

The steps, in order; a step whose prerequisite failed is skipped, and says so:

1. ``environment`` -- CuPy, NVML and NCCL import in this environment (made by
   ``conda env create -f environment.yml`` or ``make install``), and NVML sees
   the cards: names, driver, bus ids;
2. ``doctor`` -- ``gpuhive doctor``: which backends are real here, and why not;
3. ``gpu-proof`` -- ``make gpu-proof``: every kernel on the GPU, time-boxed;
4. ``characterise`` -- ``gpuhive characterise --machine nvml --backend cuda``;
5. ``calibrate`` -- ``gpuhive calibrate --machine nvml``.

It writes ``OUT/server-setup.json`` (every step with its status, seconds and
summary) and prints a short report. ``--dry-run`` prints every step and its
command and runs nothing: the way to read what it will do on a machine that
has no GPU, like the one this project is developed on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib.cli.common import add_json, output_folder

HELP = "set up a GPU server and check it worked (environment, doctor, GPU proof, "\
    "characterisation, calibration)"
#: How to make the environment when CuPy, NVML or NCCL is missing.
INSTALL_HINT = ("conda env create -f environment.yml && conda activate gpuhive "
                "(or: make install)")


@dataclass(frozen=True)
class Step:
    """One step: a name, what it checks, and the command it runs (None: a
    check made in this process)."""

    name: str
    what: str
    command: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()


def steps(out: Path) -> list[Step]:
    """The steps, with their commands for results under ``out``."""
    py = sys.executable
    return [
        Step("environment", "CuPy, NVML and NCCL import; NVML sees the cards "
             f"(if not: {INSTALL_HINT})"),
        Step("doctor", "which backends are real here, and why not",
             (py, "-m", "lib", "doctor", "--json"), ("environment",)),
        Step("gpu-proof", "every kernel kind and dtype on the GPU, at most 7 "
             "minutes (make gpu-proof)",
             (py, "-m", "lib.execution.gpu_proof", "--out", str(out / "gpu-proof"),
              "--timeout-s", "420"), ("environment",)),
        Step("characterise", "measure the cards and their links",
             (py, "-m", "lib", "characterise", "--machine", "nvml", "--backend",
              "cuda", "--json"), ("environment",)),
        Step("calibrate", "fit Eq. (1) to the measured runs",
             (py, "-m", "lib", "calibrate", "--machine", "nvml", "--json"),
             ("characterise",)),
    ]


def check_environment(nvml: Any | None = None) -> tuple[bool, str, dict[str, Any]]:
    """Whether this environment can drive the GPUs: CuPy with a driver, NVML
    and NCCL (``lib.platform.cudastack.probe``), and what NVML reports
    (``nvml``: the pynvml module, or a recorded stand-in in tests)."""
    from lib.platform.cudastack import probe
    from lib.platform.telemetry import TelemetryError, nvml_snapshot

    found = probe()
    facts: dict[str, Any] = {"cupy": found.cupy, "driver": found.driver,
                             "devices": found.devices, "nvrtc": found.nvrtc,
                             "nccl": found.nccl, "reasons": list(found.reasons)}
    try:
        snap = nvml_snapshot(nvml) if nvml is not None else nvml_snapshot()
    except TelemetryError as exc:
        facts["nvml"] = str(exc)
        return False, f"NVML: {exc}; {INSTALL_HINT}", facts
    facts["nvml"] = {"devices": len(snap.utilisation),
                     "free_bytes": list(snap.free_bytes),
                     "healthy": list(snap.healthy)}
    missing = [name for name, ok in (("CuPy with a CUDA driver", found.usable),
                                     ("NCCL", found.nccl)) if not ok]
    summary = (f"NVML sees {len(snap.utilisation)} device(s), "
               f"{sum(snap.healthy)} healthy")
    if missing:
        return False, f"{summary}; missing: {', '.join(missing)} ({INSTALL_HINT})", \
            facts
    return True, f"{summary}; CuPy sees {found.devices}, NCCL present", facts


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``server-setup`` to ``subparsers``."""
    p = subparsers.add_parser(
        "server-setup", help=HELP,
        description="On a GPU server: check the environment (CuPy, NVML, NCCL), "
                    "run gpuhive doctor, the GPU proof, characterisation and "
                    "calibration, and write a short report. --dry-run prints the "
                    "steps and runs nothing.")
    p.add_argument("--out", metavar="DIR", default="_build/server-setup",
                   help="where the report and the GPU proof go (default: "
                        "%(default)s)")
    p.add_argument("--dry-run", action="store_true",
                   help="print every step and its command; run nothing")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run (or list) the steps; exit 0 when every step passed, 1 when one
    failed, 2 when the environment cannot drive a GPU at all."""
    out = Path(args.out)
    plan = steps(out)
    if args.dry_run:
        rows = [{"step": s.name, "what": s.what,
                 "command": " ".join(s.command) if s.command else "(a check)",
                 "needs": list(s.needs)} for s in plan]
        if args.json:
            print(json.dumps({"dry_run": True, "steps": rows}, indent=2))
        else:
            for i, r in enumerate(rows, 1):
                print(f"{i}. {r['step']:<13} {r['what']}\n   {r['command']}")
        return 0
    output_folder(out, "--out")  # made, and written in, before any step
    results: dict[str, dict[str, Any]] = {}
    for s in plan:
        start = time.perf_counter()
        if any(results.get(n, {}).get("status") != "ok" for n in s.needs):
            results[s.name] = {"status": "skipped", "summary": "needs "
                               + ", ".join(s.needs), "seconds": 0.0}
            continue
        if s.command is None:
            ok, summary, facts = check_environment()
            results[s.name] = {"status": "ok" if ok else "failed",
                               "summary": summary, "facts": facts}
        else:
            proc = subprocess.run(s.command, capture_output=True, text=True)
            (out / f"{s.name}.log").write_text(proc.stdout + proc.stderr)
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            results[s.name] = {"status": "ok" if proc.returncode == 0 else "failed",
                               "summary": f"exit {proc.returncode}: {tail[0][:200]}",
                               "log": str(out / f"{s.name}.log")}
        results[s.name]["seconds"] = round(time.perf_counter() - start, 2)
    report = {"steps": results, "all_ok": all(r["status"] == "ok"
                                              for r in results.values())}
    (out / "server-setup.json").write_text(json.dumps(report, indent=2,
                                                      default=str) + "\n")
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        for name, r in results.items():
            print(f"{name:<13} {r['status']:<8} {r['summary']}")
        print(f"report: {out / 'server-setup.json'}")
    if results["environment"]["status"] != "ok":
        return 2
    return 0 if report["all_ok"] else 1
