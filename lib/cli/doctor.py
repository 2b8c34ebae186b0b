"""``gpuhive doctor``: the machine profiles and which backends are real here."""

from __future__ import annotations

import argparse
import importlib.util
import os

from lib.cli.common import add_json, describe_telemetry, emit

HELP = "machine profiles and which backends are real"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``doctor`` to ``subparsers``."""
    p = subparsers.add_parser(
        "doctor", help=HELP,
        description="List the machine profiles and say which backends run for "
                    "real on this computer, and what of the CUDA stack is missing.")
    p.add_argument("--machine", action="append", default=[], metavar="PROFILE",
                   help="also check this profile (a shipped name or the path "
                        "of a profile JSON; repeatable) and print its devices "
                        "and links; a bad one exits 2 naming the field")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the profiles, the backends and the CUDA stack; exit 0."""
    from lib.platform.cudastack import probe
    from lib.platform.machines import MachineError, list_machines, load_machine

    cuda = probe()
    nvml_reason = ""
    try:
        load_machine("nvml")
    except MachineError as exc:
        nvml_reason = str(exc)
    cores = load_machine("local-cpu").n  # the cores a CPU quota gives whole
    has_dask = all(importlib.util.find_spec(m) is not None
                   for m in ("dask", "distributed"))
    backends = {
        "model": {"real": False, "why": "predicts with the cost model, Eq. (1) "
                                        "(PREDICTED); always available"},
        "cpu": {"real": True, "why": f"{cores} core(s) as worker processes on "
                                     "local-cpu (MEASURED)"},
        "cuda": {"real": cuda.usable,
                 "why": (f"{cuda.devices} CUDA device(s)" if cuda.usable
                         else "; ".join(cuda.reasons))},
        "dask": {"real": has_dask,
                 "why": ("the workers of a Dask cluster (MEASURED): --machine "
                         "dask-local:N starts N here, dask://HOST:PORT joins one"
                         if has_dask else "dask and distributed are not "
                         "installed (pip install 'dask[distributed]')")},
    }
    telemetry = _telemetry(cuda.usable)
    machines = {}
    for name in list_machines():
        try:
            m = load_machine(name)
            machines[name] = {"devices": m.n, "simulated": m.simulated,
                              "induced": m.induced, "about": m.description}
        except MachineError as exc:
            machines[name] = {"error": str(exc)}
    missing = {"driver": not cuda.driver, "nvrtc": not cuda.nvrtc,
               "nccl": not cuda.nccl, "nvml": bool(nvml_reason)}
    lines = ["machines:"]
    for name, info in machines.items():
        if "error" in info:
            lines.append(f"  {name:<24} unavailable: {info['error']}")
        else:
            tags = " simulated" * info["simulated"] + " induced" * info["induced"]
            lines.append(f"  {name:<24} {info['devices']} device(s){tags}")
    checked = [load_machine(spec) for spec in args.machine]
    for m in checked:
        machines[m.name] = {"devices": m.n, "simulated": m.simulated,
                            "induced": m.induced, "about": m.description,
                            "checked": True}
        lines += [f"  {line}" for line in m.summary().splitlines()]
    lines.append("backends:")
    for name, info in backends.items():
        state = "real" if info["real"] else ("model" if name == "model" else "absent")
        lines.append(f"  {name:<6} {state:<7} {info['why']}")
    lines.append("CUDA stack: " + ", ".join(
        f"{k} {'missing' if v else 'ok'}" for k, v in missing.items()))
    lines.append("telemetry (what run reads before it decides, on the cpu and "
                 "cuda backends):")
    lines += [f"  {name:<6} {text}" for name, text in telemetry.items()]
    limits = _limits()
    lines.append("limits (what a run here may use):")
    lines += [f"  {name:<6} {text}" for name, text in limits.items()]
    emit(args, {"machines": machines, "backends": backends, "missing": missing,
                "telemetry": telemetry, "limits": limits,
                "cuda_reasons": list(cuda.reasons), "nvml": nvml_reason or "ok"},
         "\n".join(lines))
    return 0


def _telemetry(gpus: bool) -> dict[str, str]:
    """What the runtime would read now: this computer's cores and, where a
    GPU is usable, NVML; one line each, MEASURED or why not."""
    from lib.platform.machines import MachineError, load_machine
    from lib.platform.telemetry import TelemetryError
    from lib.runtime import live_snapshot

    out = {"cpu": "", "cuda": "no usable GPU"}
    for backend, machine in (("cpu", "local-cpu"), ("cuda", "nvml")):
        if backend == "cuda" and not gpus:
            continue
        try:
            out[backend] = describe_telemetry(
                live_snapshot(load_machine(machine), backend))
        except (TelemetryError, MachineError) as exc:
            out[backend] = f"unavailable: {exc}"
    return out


def _limits() -> dict[str, str]:
    """This process's memory, CPUs and shared memory, one line each: in a
    container its control group's limits, where they are tighter than the
    computer's."""
    from lib.execution.base import HOST_MEMORY_SHARE
    from lib.execution.shm import SharedMemoryError, free_bytes, shm_roots
    from lib.platform.hostinfo import (
        available_memory_bytes,
        cgroup_memory_limit,
        cpu_quota,
    )

    gb = 1e9
    available, limit = available_memory_bytes(), cgroup_memory_limit()
    memory = ("not said by the OS" if available is None else
              f"{available / gb:.1f} GB available, of which a run plans on "
              f"{HOST_MEMORY_SHARE:.0%}")
    if limit is not None:
        memory += f" (a control group's limit of {limit / gb:.1f} GB)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    quota = cpu_quota()
    cpus = f"{cores} core(s) this process may run on" + (
        "" if quota is None else f", a control group's quota of {quota:g} CPUs")
    try:
        roots = shm_roots()
        free = {root: free_bytes(root) for root in roots}
        shared = ", then ".join(
            f"{root} ({'room not said' if n is None else f'{n / gb:.2f} GB free'})"
            for root, n in free.items())
    except SharedMemoryError as exc:
        shared = str(exc)
    return {"memory": memory, "cpus": cpus, "shm": f"the cpu backend's buffers in "
                                                   f"{shared}"}
