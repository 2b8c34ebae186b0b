"""The GPU proof: one timed run that shows the cuda backend works on this host.

``python -m lib.execution.gpu_proof --out DIR [--dry-run] [--timeout-s 420]``

Made for a machine lent for a few minutes: one or more NVIDIA GPUs with CuPy,
NVML, NCCL, NumPy and pytest, no network, and perhaps none of the project's
other dependencies. It installs nothing and finishes within ``--timeout-s``
(default 420 s: seven minutes), whatever happens:

1. **Cases** (:func:`plan`), each run by a worker process the proof watches, so a
   case that hangs is killed at its own budget and a case that loses the CUDA
   context (a sticky error) only ends its worker: the next worker picks up the
   cases left. A failing case never stops the rest. On one GPU: every kind and
   dtype in ``single`` and ``pipelined`` mode; several shards mapped onto the one
   physical device (split and pipelined, host and p2p merges, nccl falling back
   and saying so), stencil fp64 among them; a matmul piece above the grid's old
   y limit (65535 row tiles); a reduce over 2^31 - 1 fp16 elements (the
   kernels' 64-bit indexing); a re-plan after a real CuPy out-of-memory injected
   on one shard. On two or more GPUs also: split, p2p and NCCL merges across
   devices and a re-plan between real devices.
2. **pytest** ``-m gpu`` as a subprocess with a timeout, written to
   ``DIR/pytest.log``.
3. **compute-sanitizer** (memcheck, then racecheck) over a small run of every
   kernel, where the tool exists (``DIR/sanitizer-<tool>.log``).

``DIR/report.json`` is rewritten after every step, so a run cut short still
leaves what it found: the environment and versions, every case with
``verified``/``error``/``seconds``, per-device and total times, the merge path
that ran, whether NCCL ran and whether pipelined pieces overlapped, and the
pytest and sanitizer outcomes. Exit status: 0 when everything passed, 1 when
something failed, 2 when there is no usable GPU (one line says why; nothing
runs), 3 when the proof stopped at its deadline.

Without jinja2 the code-gen plane cannot render kernels; the proof then
compiles ``kernels/<kind>.cu`` as shipped (:func:`shipped_source_provider`) and
the report says so.

Why one module: the supervisor, the worker it starts and the cases the worker
runs are one protocol (case names, a results file of JSON lines, budgets) that
only this command speaks; split up, each half would be unreadable alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.execution.cuda import (
    CODEGEN_MISSING,
    MATMUL_TILE,
    MAX_GRID_Y,
    CudaBackend,
    launch_plan,
)
from lib.platform.cudastack import probe
from lib.platform.machines import (
    Device,
    Machine,
    MachineError,
    catalog_device,
    link_of_kind,
    load_machine,
)

ROOT = Path(__file__).resolve().parents[2]
"""The project checkout: ``kernels/`` and ``tests/`` live here."""

DEFAULT_TIMEOUT_S = 420.0
CASES_SHARE = 0.6
"""Fraction of the timeout the cases may use; pytest and the sanitizer follow."""
PYTEST_SHARE = 0.22
MARGIN_S = 8.0
"""Seconds kept back at the end for writing the report."""

KIND_DTYPES = {
    "matmul": ("fp32", "fp16", "bf16"),
    "reduce": ("fp32", "fp16", "bf16"),
    "elementwise": ("fp32", "fp16", "bf16"),
    "stencil": ("fp32", "fp64"),
    "histogram": ("fp32",),
}
"""Every kernel entry point (``kernels/<kind>.cu``); held here too so the proof
plans without the code-gen plane (tests/test_gpu_proof.py checks they agree)."""

SIZES: dict[str, dict[str, int]] = {
    "matmul": {"M": 1531, "N": 1031, "K": 515},
    "reduce": {"N": 16_777_259},
    "elementwise": {"N": 16_777_259},
    "stencil": {"H": 2053, "W": 1029, "T": 3},
    "histogram": {"N": 16_777_259, "B": 1000},
}
"""Task sizes of the ordinary cases: tens of MB, none a multiple of a block."""

BIG_MATMUL = {"M": MAX_GRID_Y * MATMUL_TILE + 4097, "N": 32, "K": 32}
"""Rows beyond one launch's y limit: two row blocks."""

BIG_REDUCE = {"N": 2**31 - 1}
"""The largest N a task may have; the grid-stride index passes 2^31."""

SANITIZER_SIZES: dict[str, dict[str, int]] = {
    "matmul": {"M": 97, "N": 65, "K": 33},
    "reduce": {"N": 100_003},
    "elementwise": {"N": 100_003},
    "stencil": {"H": 67, "W": 65, "T": 2},
    "histogram": {"N": 100_003, "B": 97},
}


# --------------------------------------------------------------------------
# Cases

@dataclass(frozen=True)
class Case:
    """One check the proof runs.

    Attributes:
        name: unique, ``group/what``.
        gpus: fewest physical GPUs it needs.
        what: one line for the plan.
        budget_s: seconds after which the case is killed.
        run: ``run(ctx) -> facts``; raises on failure.
    """

    name: str
    gpus: int
    what: str
    budget_s: float
    run: Callable[[Context], dict[str, Any]]


@dataclass
class Context:
    """What the cases share inside a worker.

    Attributes:
        ordinals: CUDA devices visible.
        live: the NVML profile, or None where NVML cannot be read.
        base: the device a profile of shards on one GPU is made of.
        provider: kernel sources when the code-gen plane cannot serve them.
        notes: what the worker had to work around.
    """

    ordinals: int
    live: Machine | None
    base: Device
    provider: Any = None
    notes: list[str] = field(default_factory=list)

    def on_one_gpu(self, shards: int) -> tuple[Machine, dict[int, int]]:
        """A profile of ``shards`` devices that all run on CUDA ordinal 0."""
        devices = tuple(replace(self.base, index=i) for i in range(shards))
        link = link_of_kind("nvlink", p2p=True, note="the same physical GPU")
        machine = Machine(
            name=f"gpu-proof-{shards}-on-1",
            description="Several shards on one physical GPU (the GPU proof).",
            devices=devices, host_links=(link_of_kind("pcie5"),) * shards,
            peers={(i, j): link for i in range(shards)
                   for j in range(i + 1, shards)},
            simulated=False, nccl=False, real_backends=("cuda",))
        return machine, dict.fromkeys(range(shards), 0)

    def open(self, shards: int | None = None, cls: type[CudaBackend] = CudaBackend,
             **options: Any) -> tuple[CudaBackend, tuple[int, ...]]:
        """A backend and the profile devices to give shards to.

        ``shards`` shards on CUDA ordinal 0, or with ``shards=None`` every GPU
        CUDA sees, through the live NVML profile (mapped by PCI bus id) where
        there is one, in ordinal order.
        """
        options.setdefault("warmup", 0)
        if shards is None and self.live is not None:
            b = cls(self.live, source_provider=self.provider, **options)
            return b, tuple(sorted(b.device_map, key=b.device_map.__getitem__))
        if shards is None:  # no NVML: a made-up profile, CUDA's own numbering
            machine, _ = self.on_one_gpu(self.ordinals)
            machine = replace(machine, name=f"gpu-proof-{self.ordinals}-gpus",
                              description="Every GPU CUDA sees (the GPU proof).")
            dmap = {i: i for i in range(self.ordinals)}
        else:
            machine, dmap = self.on_one_gpu(shards)
        b = cls(machine, source_provider=self.provider, device_map=dmap, **options)
        return b, tuple(range(machine.n))


def decision(task: TaskSpec, gpus: Sequence[int], mode: str = "split",
             comm: str = "host", block: int = 256, pieces: int = 7) -> Decision:
    """Equal shares over ``gpus``; pipelined chunks make about ``pieces`` per
    shard."""
    n = len(gpus)
    shares = [1.0 / n] * n
    shares[-1] = 1.0 - math.fsum(shares[:-1])
    chunk = (max(1, task.split_size // (n * pieces)) if mode == "pipelined"
             else task.split_size)
    return Decision(gpus=tuple(gpus), shares=tuple(shares), chunk=chunk, block=block,
                    mode=mode, comm_path=comm).with_hash(task)


def facts(result: Any) -> dict[str, Any]:
    """What the report keeps of a Result."""
    m = result.metrics
    return {
        "verified": m.verified, "max_abs_error": m.max_abs_error,
        "per_device_seconds": {str(g): t for g, t in m.per_device_seconds.items()},
        "total_seconds": m.total_seconds,
        "merge_requested": getattr(m, "merge_requested", None),
        "merge_path": getattr(m, "merge_path", None),
        "merge_note": getattr(m, "merge_note", ""),
        "peer_copies": [list(c) for c in getattr(m, "peer_copies", ())],
        "overlap": {str(g): v for g, v in result.detail.get("overlap", {}).items()},
        "device_map": {str(g): o for g, o in result.detail.get("device_map",
                                                              {}).items()},
        "replanned": result.detail.get("replanned"),
        "decision": result.decision.to_json(),
    }


def _expect(out: dict[str, Any], **wanted: Any) -> dict[str, Any]:
    """``out``, raising when it is not verified or a fact differs."""
    if out["verified"] is not True:
        raise AssertionError(f"not verified (max abs error {out['max_abs_error']})")
    for key, value in wanted.items():
        if out.get(key) != value:
            raise AssertionError(f"{key} is {out.get(key)!r}, expected {value!r} "
                                 f"({out.get('merge_note') or 'no note'})")
    return out


class FaultyBackend(CudaBackend):
    """The cuda backend with a device fault injected: the shard of profile
    device :attr:`fail` first asks its GPU for a pebibyte, so CuPy raises its
    real out-of-memory error while the shards before it are already queued."""

    fail = -1

    def _launch(self, task, decision, inputs, sh):
        if sh.g == self.fail:
            with self.cp.cuda.Device(sh.ordinal):
                self.cp.empty(1 << 50, dtype=self.cp.uint8)
        super()._launch(task, decision, inputs, sh)


def kind_case(task: TaskSpec, mode: str, budget_s: float = 60.0) -> Case:
    """One kind and dtype on the first GPU (of the live profile where there is
    one), ``single`` or ``pipelined``."""
    def run(ctx: Context) -> dict[str, Any]:
        b, gpus = ctx.open()
        with b:
            out = facts(b.run(task, decision(task, gpus[:1], mode), verify=True))
        return _expect(out, merge_path="host")

    return Case(f"kinds/{task.kind}-{task.dtype}-{mode}", 1,
                f"{task.describe()}, one GPU, {mode}", budget_s, run)


def shared_case(task: TaskSpec, mode: str, comm: str, shards: int = 3,
                budget_s: float = 60.0) -> Case:
    """``shards`` shards on the one GPU, merged on ``comm``."""
    ran = {"host": "host", "p2p": "p2p", "nccl": "p2p"}[comm] \
        if task.merge == "sum" else "host"

    def run(ctx: Context) -> dict[str, Any]:
        b, gpus = ctx.open(shards)
        with b:
            out = facts(b.run(task, decision(task, gpus, mode, comm), verify=True))
        return _expect(out, merge_path=ran)

    return Case(f"one-gpu-shards/{task.kind}-{task.dtype}-{mode}-{comm}", 1,
                f"{task.describe()}, {shards} shards on one GPU, {mode}, {comm} "
                f"merge (runs {ran})", budget_s, run)


def grid_case(task: TaskSpec, budget_s: float = 90.0) -> Case:
    """A matmul piece with more row tiles than one launch's grid may have."""
    def run(ctx: Context) -> dict[str, Any]:
        launches = len(launch_plan(task, task.dims["M"], 256))
        if launches < 2:
            raise AssertionError(f"{task.describe()} fits one launch; not a test")
        b, gpus = ctx.open(1)
        with b:
            out = facts(b.run(task, decision(task, gpus, "single"), verify=True))
        return {**_expect(out), "launches": launches}

    return Case(f"limits/matmul-{task.dims['M']}-rows", 1,
                f"{task.describe()}: above the old grid y limit", budget_s, run)


def big_reduce_case(task: TaskSpec, budget_s: float = 150.0) -> Case:
    """A 1-D reduce whose indices pass 2^31 in the grid-stride loop."""
    def run(ctx: Context) -> dict[str, Any]:
        b, gpus = ctx.open(1)
        with b:
            return _expect(facts(b.run(task, decision(task, gpus, "single"),
                                       verify=True)))

    return Case(f"limits/reduce-{task.dtype}-{task.dims['N']}", 1,
                f"{task.describe()}: 64-bit indexing", budget_s, run)


def replan_case(task: TaskSpec, multi: bool = False, budget_s: float = 60.0) -> Case:
    """A real CuPy out-of-memory on the second shard, then the re-plan."""
    def run(ctx: Context) -> dict[str, Any]:
        b, gpus = ctx.open(None if multi else 2, cls=FaultyBackend,
                           allow_replan=True)
        gpus = gpus[:2]
        b.fail = gpus[1]
        with b:
            out = facts(b.run(task, decision(task, gpus, "split"), verify=True))
        _expect(out)
        if (out["replanned"] or {}).get("failed_device") != gpus[1] \
                or out["decision"]["gpus"] != [gpus[0]]:
            raise AssertionError(f"no re-plan away from device {gpus[1]}: "
                                 f"{out['replanned']}")
        return out

    where = "two GPUs" if multi else "two shards on one GPU"
    return Case(f"{'multi-gpu' if multi else 'replan'}/replan-{task.kind}", 2 if
                multi else 1, f"{task.describe()} on {where}; out of memory injected "
                "on the second, re-planned on the first", budget_s, run)


def multi_case(task: TaskSpec, mode: str, comm: str, budget_s: float = 60.0) -> Case:
    """Split over every GPU, merged on ``comm`` (which must run as asked)."""
    def run(ctx: Context) -> dict[str, Any]:
        b, gpus = ctx.open()
        with b:
            out = facts(b.run(task, decision(task, gpus, mode, comm), verify=True))
        return _expect(out, merge_path=comm if task.merge == "sum" else "host")

    return Case(f"multi-gpu/{task.kind}-{task.dtype}-{mode}-{comm}", 2,
                f"{task.describe()} split over every GPU, {mode}, {comm}", budget_s,
                run)


def plan() -> list[Case]:
    """Every case, cheapest first within its group; the heavy ones last."""
    cases = [kind_case(TaskSpec(kind, SIZES[kind], dtype=dt), mode)
             for kind, dtypes in KIND_DTYPES.items() for dt in dtypes
             for mode in ("single", "pipelined")]
    t = {k: TaskSpec(k, SIZES[k]) for k in SIZES}
    fp64_stencil = TaskSpec("stencil", SIZES["stencil"], dtype="fp64")
    cases += [
        shared_case(t["elementwise"], "split", "host"),
        shared_case(t["matmul"], "pipelined", "host"),
        shared_case(fp64_stencil, "split", "host"),
        shared_case(t["reduce"], "split", "host"),
        shared_case(t["histogram"], "split", "p2p"),
        shared_case(t["reduce"], "pipelined", "nccl"),
        replan_case(t["elementwise"]),
        multi_case(t["elementwise"], "split", "host"),
        multi_case(t["matmul"], "pipelined", "host"),
        multi_case(fp64_stencil, "split", "host"),
        multi_case(t["histogram"], "split", "p2p"),
        multi_case(t["reduce"], "split", "nccl"),
        replan_case(t["elementwise"], multi=True),
        grid_case(TaskSpec("matmul", BIG_MATMUL)),
        big_reduce_case(TaskSpec("reduce", BIG_REDUCE, dtype="fp16")),
    ]
    return cases


def shipped_source_provider(task: TaskSpec, decision: Decision):
    """Kernel source straight from ``kernels/<kind>.cu``, for hosts without the
    code-gen plane (jinja2): every entry point kept, the tunables passed as
    ``-D`` options with the values the template provider uses
    (:func:`lib.codegen.specialise.tunables`), no Gate 2a scan."""
    source = (ROOT / "kernels" / f"{task.kind}.cu").read_text()
    defines = {"matmul": {"MATMUL_TILE": MATMUL_TILE,
                          "MATMUL_MAX_THREADS": decision.block},
               "reduce": {"REDUCE_MAX_THREADS": decision.block},
               "histogram": {"HISTOGRAM_MAX_BINS": task.dims.get("B", 4096)},
               }.get(task.kind, {})
    options = ("--std=c++17", *(f"-D{k}={v}" for k, v in defines.items()))
    return source, f"{task.kind}_{task.dtype}", options


# --------------------------------------------------------------------------
# The worker (a child process: runs cases, one JSON line each)

def _line(path: Path, obj: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(obj, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def environment() -> dict[str, Any]:
    """Versions, devices and tools, each read without raising."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "numpy": np.__version__,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "codegen": CODEGEN_MISSING or "available",
        "compute_sanitizer": find_sanitizer(),
    }

    def read(key: str, fn: Callable[[], Any]) -> None:
        try:
            env[key] = fn()
        except Exception as exc:
            env[key] = f"unavailable ({_err(exc)})"

    import cupy

    rt = cupy.cuda.runtime
    read("cupy", lambda: cupy.__version__)
    read("cuda_runtime", lambda: rt.runtimeGetVersion())
    read("cuda_driver", lambda: rt.driverGetVersion())
    read("nvrtc", lambda: list(cupy.cuda.nvrtc.getVersion()))

    def nccl_version() -> Any:
        from cupy.cuda import nccl

        return nccl.get_version() if nccl.available else "library not found"

    read("nccl", nccl_version)

    def devices() -> list[dict[str, Any]]:
        out = []
        for o in range(rt.getDeviceCount()):
            props = rt.getDeviceProperties(o)
            name = props["name"]
            out.append({"ordinal": o, "name": name.decode() if isinstance(
                name, bytes) else name, "bus_id": rt.deviceGetPCIBusId(o),
                "memory_bytes": props["totalGlobalMem"],
                "compute_capability": f"{props['major']}.{props['minor']}"})
        return out

    read("devices", devices)

    def nvml() -> dict[str, Any]:
        import pynvml

        pynvml.nvmlInit()
        try:
            def text(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else str(v)

            handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(pynvml.nvmlDeviceGetCount())]
            return {"driver": text(pynvml.nvmlSystemGetDriverVersion()),
                    "devices": [{"index": i, "name": text(pynvml.nvmlDeviceGetName(h)),
                                 "bus_id": text(pynvml.nvmlDeviceGetPciInfo(h).busId)}
                                for i, h in enumerate(handles)]}
        finally:
            pynvml.nvmlShutdown()

    read("nvml", nvml)
    return env


def _context() -> Context:
    import cupy

    ordinals = cupy.cuda.runtime.getDeviceCount()
    notes = []
    try:
        live = load_machine("nvml")
        base = live.devices[0]
    except MachineError as exc:
        live = None
        base = catalog_device(0, "H100 SXM", note="placeholder: NVML unreadable")
        notes.append(f"no NVML profile ({_err(exc)}): shards use a placeholder "
                     "H100 profile with identity ordinals")
    provider = None
    if CODEGEN_MISSING:
        provider = shipped_source_provider
        notes.append(f"{CODEGEN_MISSING}: kernels compiled from kernels/*.cu as "
                     "shipped, without the code-gen plane or Gate 2a")
    return Context(ordinals, live, base, provider, notes)


def _healthy(n: int) -> bool:
    """Whether every device still answers (a sticky error ends the context)."""
    import cupy

    try:
        for o in range(n):
            cupy.cuda.Device(o).synchronize()
        return True
    except Exception:
        return False


def worker(names: Sequence[str], results: Path, deadline: float,
           with_environment: bool) -> int:
    """Run the named cases in order, a JSON line per event; 3 when the CUDA
    context is lost (the supervisor starts another worker for the rest)."""
    if with_environment:
        _line(results, {"event": "environment", "environment": environment()})
    ctx = _context()
    if ctx.notes:
        _line(results, {"event": "notes", "notes": ctx.notes})
    table = {c.name: c for c in plan()}
    for name in names:
        case = table[name]
        if time.time() + min(case.budget_s, 30.0) > deadline:
            _line(results, {"event": "case", "name": name, "skipped": "out of time"})
            continue
        _line(results, {"event": "start", "name": name})
        start = time.perf_counter()
        try:
            out = case.run(ctx)
            _line(results, {"event": "case", "name": name, "error": None,
                            "seconds": time.perf_counter() - start, **out})
        except Exception as exc:
            _line(results, {"event": "case", "name": name, "verified": False,
                            "error": _err(exc),
                            "seconds": time.perf_counter() - start})
            if not _healthy(ctx.ordinals):
                _line(results, {"event": "context_lost", "after": name})
                return 3
    return 0


def sanitizer_workload() -> int:
    """Every kernel once on small data through the backend (what
    compute-sanitizer watches); 0 when every run verified."""
    ctx = _context()
    b, _ = ctx.open(2)
    ok = True
    runs = [(TaskSpec(k, SANITIZER_SIZES[k]), "single", (0,)) for k in SANITIZER_SIZES]
    runs += [(TaskSpec("stencil", SANITIZER_SIZES["stencil"], dtype="fp64"),
              "split", (0, 1)),
             (TaskSpec("elementwise", SANITIZER_SIZES["elementwise"], dtype="fp16"),
              "pipelined", (0, 1))]
    with b:
        for task, mode, gpus in runs:
            try:
                verified = b.run(task, decision(task, gpus, mode),
                                 verify=True).metrics.verified
            except Exception as exc:
                print(f"{task.describe()}: {_err(exc)}", flush=True)
                verified = False
            print(f"{task.describe()} {mode}: verified={verified}", flush=True)
            ok = ok and verified is True
    return 0 if ok else 1


# --------------------------------------------------------------------------
# The supervisor

def find_sanitizer() -> str | None:
    """``compute-sanitizer`` on PATH or in the CUDA toolkit, or None."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                 "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "compute-sanitizer").is_file():
            return str(Path(root) / "bin" / "compute-sanitizer")
    return None


def gpu_test_files(tests: Path) -> list[str]:
    """The test files that mark tests ``gpu`` (relative to the checkout):
    collecting only these keeps modules that need other dependencies out."""
    return sorted(str(p.relative_to(ROOT)) for p in tests.glob("test_*.py")
                  if "mark.gpu" in p.read_text())


def pytest_summary(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line (``3 passed, 1 skipped in 2.1s``)."""
    counts: dict[str, int] = {}
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|"
                                                         r"skipped|error)", ln)]
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|"
                              r"xfailed|xpassed)", lines[-1] if lines else ""):
        counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
    return counts


def sanitizer_summary(text: str) -> dict[str, int] | None:
    """Errors (and racecheck's hazards) compute-sanitizer reported, or None
    when it printed no summary."""
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    r = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, "
                  r"(\d+) warnings?\)", text)
    if r:
        return {"hazards": int(r.group(1)), "errors": int(r.group(2)),
                "warnings": int(r.group(3))}
    return {"errors": int(m.group(1))} if m else None


def _run_logged(cmd: list[str], log: Path, timeout_s: float,
                started: Callable[[subprocess.Popen | None], None] = lambda p: None,
                ) -> dict[str, Any]:
    """Run ``cmd`` in its own process group, output to ``log``, killed at the
    timeout (``started`` is told of the process, then of its end)."""
    start = time.perf_counter()
    with log.open("w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started(proc)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill(proc)
            rc, timed_out = None, True
        finally:
            started(None)
    return {"rc": rc, "timed_out": timed_out, "timeout_s": round(timeout_s, 1),
            "seconds": time.perf_counter() - start, "log": str(log)}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class Proof:
    """The supervisor: workers for the cases, then pytest, then the sanitizer,
    the report rewritten after each step."""

    def __init__(self, out: Path, timeout_s: float, gpus: int):
        self.out, self.timeout_s, self.gpus = out, timeout_s, gpus
        self.t0 = time.time()
        self.deadline = self.t0 + timeout_s
        self.cases = [c for c in plan()]
        self.report: dict[str, Any] = {
            "proof": "gpuhive gpu proof", "started": time.strftime(
                "%Y-%m-%dT%H:%M:%S%z"), "timeout_s": timeout_s, "complete": False,
            "gpus": gpus, "environment": {}, "notes": [], "cases": [],
            "pytest": None, "sanitizer": None}
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None

    def left(self) -> float:
        return self.deadline - time.time()

    def _track(self, proc: subprocess.Popen | None) -> None:
        self._child = proc

    def write(self) -> None:
        with self._lock:
            self.report["seconds"] = time.time() - self.t0
            self.report["summary"] = summarise(self.report)
            tmp = self.out / "report.json.tmp"
            tmp.write_text(json.dumps(self.report, indent=2, default=str))
            tmp.replace(self.out / "report.json")

    def watchdog(self) -> None:
        """At the deadline: kill the running child, keep what was found,
        exit 3 -- the proof never runs past its timeout."""
        if self._child is not None:
            _kill(self._child)
        self.report["notes"].append("stopped at the deadline")
        self.write()
        os._exit(3)

    def run(self) -> int:
        timer = threading.Timer(max(1.0, self.timeout_s - 2.0), self.watchdog)
        timer.daemon = True
        timer.start()
        try:
            self.run_cases()
            self.write()
            self.run_pytest()
            self.write()
            self.run_sanitizer()
            self.report["complete"] = True
            self.write()
        finally:
            timer.cancel()
        s = self.report["summary"]
        return 0 if s["all_passed"] else 1

    def run_cases(self) -> None:
        todo = [c for c in self.cases if c.gpus <= self.gpus]
        for c in self.cases:
            if c.gpus > self.gpus:
                self.record({"name": c.name, "skipped": f"needs {c.gpus} GPUs, "
                             f"{self.gpus} here"})
        stop_at = self.t0 + self.timeout_s * CASES_SHARE
        first = True
        results = self.out / "cases.jsonl"
        while todo and time.time() < stop_at:
            results.write_text("")
            cmd = [sys.executable, "-m", "lib.execution.gpu_proof", "--worker",
                   "--out", str(self.out), "--deadline", f"{stop_at:.3f}",
                   "--cases", ",".join(c.name for c in todo)]
            if first:
                cmd.append("--environment")
            first = False
            done = self.watch(cmd, results, {c.name: c for c in todo}, stop_at)
            todo = [c for c in todo if c.name not in done]
        for c in todo:
            self.record({"name": c.name, "skipped": "out of time"})

    def watch(self, cmd: list[str], results: Path, cases: dict[str, Case],
              stop_at: float) -> set[str]:
        """Run one worker; the names of the cases it settled (run, failed,
        skipped, or killed while running)."""
        done: set[str] = set()
        log = (self.out / "worker.log").open("a")
        self._child = proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True)
        running: tuple[str, float] | None = None
        seen = 0
        try:
            while True:
                rc = proc.poll()
                # only whole lines: the worker may be writing the next one
                lines = results.read_text().split("\n")[:-1]
                for raw in lines[seen:]:
                    event = json.loads(raw)
                    kind = event.pop("event")
                    if kind == "environment":
                        self.report["environment"] = event["environment"]
                    elif kind == "notes":
                        self.report["notes"] += event["notes"]
                    elif kind == "start":
                        running = (event["name"], time.time())
                    elif kind == "case":
                        self.record(event)
                        done.add(event["name"])
                        running = None
                    elif kind == "context_lost":
                        self.report["notes"].append(
                            f"CUDA context lost after {event['after']}; a new "
                            "worker ran the cases left")
                seen = len(lines)
                if rc is not None:
                    if running is not None:
                        self.record({"name": running[0], "verified": False,
                                     "error": f"the worker exited with status {rc} "
                                              "during this case"})
                        done.add(running[0])
                    if rc not in (0, 3) and running is None:
                        # it failed outside any case: another would fail alike
                        for name in cases.keys() - done:
                            self.record({"name": name, "verified": False,
                                         "error": f"the worker exited with status "
                                                  f"{rc} before this case (see "
                                                  "worker.log)"})
                            done.add(name)
                    return done
                if running is not None:
                    name, since = running
                    over = time.time() - since > cases[name].budget_s
                    if over or time.time() > stop_at + cases[name].budget_s:
                        _kill(proc)
                        self.record({"name": name, "verified": False,
                                     "error": f"killed after {time.time() - since:.0f}"
                                              " s (over its budget)"})
                        done.add(name)
                        return done
                time.sleep(0.2)
        finally:
            self._child = None
            log.close()

    def record(self, event: dict[str, Any]) -> None:
        self.report["cases"].append(event)
        self.write()

    def run_pytest(self) -> None:
        budget = min(self.timeout_s * PYTEST_SHARE, self.left() - 0.12 *
                     self.timeout_s - MARGIN_S)
        if budget < 20 or not (ROOT / "tests").is_dir():
            self.report["pytest"] = {"skipped": "no time left" if budget < 20 else
                                     f"no tests/ under {ROOT}"}
            return
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
               "no:cacheprovider", "--continue-on-collection-errors",
               *gpu_test_files(ROOT / "tests")]
        out = _run_logged(cmd, self.out / "pytest.log", budget, self._track)
        out["counts"] = pytest_summary((self.out / "pytest.log").read_text())
        self.report["pytest"] = out

    def run_sanitizer(self) -> None:
        tool = find_sanitizer()
        if tool is None:
            self.report["sanitizer"] = {"skipped": "compute-sanitizer not found"}
            return
        found: dict[str, Any] = {"path": tool}
        tools = ("memcheck", "racecheck")
        for k, name in enumerate(tools):
            budget = (self.left() - MARGIN_S) / (len(tools) - k)
            if budget < 20:
                found[name] = {"skipped": "no time left"}
                continue
            cmd = [tool, "--tool", name, "--error-exitcode", "99",
                   sys.executable, "-m", "lib.execution.gpu_proof",
                   "--sanitizer-workload", "--out", str(self.out)]
            log = self.out / f"sanitizer-{name}.log"
            out = _run_logged(cmd, log, budget, self._track)
            out["summary"] = sanitizer_summary(log.read_text())
            found[name] = out
            self.report["sanitizer"] = found
            self.write()
        self.report["sanitizer"] = found


def _passed(case: dict[str, Any]) -> bool:
    return not case.get("skipped") and not case.get("error") \
        and case.get("verified") is True


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """Counts, per-device and total time, whether NCCL ran and pieces
    overlapped, and whether everything that ran passed."""
    cases = report["cases"]
    ran = [c for c in cases if not c.get("skipped")]
    per_device: dict[str, float] = {}
    for c in ran:
        for g, t in (c.get("per_device_seconds") or {}).items():
            per_device[g] = per_device.get(g, 0.0) + t
    pytest = report.get("pytest") or {}
    counts = pytest.get("counts") or {}
    sanitizer = report.get("sanitizer") or {}
    clean = all((v.get("rc") == 0 and not v.get("timed_out"))
                for k, v in sanitizer.items() if isinstance(v, dict)
                and "rc" in v)
    pytest_ok = "rc" not in pytest or (not pytest.get("timed_out")
                                       and counts.get("failed", 0) == 0
                                       and counts.get("passed", 0) > 0)
    return {
        "cases": len(cases), "passed": sum(_passed(c) for c in cases),
        "failed": sum(not _passed(c) for c in ran),
        "skipped": len(cases) - len(ran),
        "failures": [c["name"] for c in ran if not _passed(c)],
        "case_seconds": sum(c.get("seconds") or 0.0 for c in ran),
        "per_device_seconds": per_device,
        "total_seconds": sum(c.get("total_seconds") or 0.0 for c in ran),
        "nccl_ran": any(c.get("merge_path") == "nccl" for c in ran),
        "pieces_overlapped": any(any((c.get("overlap") or {}).values())
                                 for c in ran),
        "pytest_ok": pytest_ok, "sanitizer_clean": clean,
        "all_passed": all(_passed(c) for c in ran) and pytest_ok and clean,
    }


def describe_plan(timeout_s: float, gpus: int | None) -> Iterator[str]:
    """The lines ``--dry-run`` prints."""
    here = "no usable CUDA here" if not gpus else f"{gpus} GPU(s) here"
    yield (f"gpu proof: {len(plan())} cases, pytest -m gpu, compute-sanitizer; "
           f"timeout {timeout_s:.0f} s ({here})")
    if CODEGEN_MISSING:
        yield f"note: {CODEGEN_MISSING}; kernels would come from kernels/*.cu"
    for c in plan():
        need = f"{c.gpus} GPU" + ("s" if c.gpus > 1 else "")
        yield f"  [{need:>6}] {c.name:<48} {c.what}  (budget {c.budget_s:.0f} s)"
    files = " ".join(gpu_test_files(ROOT / "tests")) if (ROOT / "tests").is_dir() \
        else "(no tests/ here)"
    yield (f"  pytest: python -m pytest -q -m gpu {files} "
           f"(at most {timeout_s * PYTEST_SHARE:.0f} s) -> DIR/pytest.log")
    tool = find_sanitizer()
    yield ("  compute-sanitizer: --tool memcheck, then --tool racecheck, over every "
           "kernel once on small data -> DIR/sanitizer-<tool>.log "
           f"({'found: ' + tool if tool else 'not found here'})")
    yield "  report: DIR/report.json (rewritten after every step)"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lib.execution.gpu_proof",
                                description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the report")
    p.add_argument("--dry-run", action="store_true", help="list the cases, run none")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                   help="hard limit for the whole proof, seconds (default 420)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--environment", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--sanitizer-workload", action="store_true",
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker([n for n in args.cases.split(",") if n],
                      args.out / "cases.jsonl", args.deadline, args.environment)
    if args.sanitizer_workload:
        return sanitizer_workload()
    found = probe()
    if args.dry_run:
        try:
            for line in describe_plan(args.timeout_s, found.devices if found.usable
                                      else None):
                print(line, flush=True)
        except BrokenPipeError:  # a closed pipe (| head): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        return 0
    if not found.usable:
        print("gpu_proof: no usable GPU here, nothing run ("
              + "; ".join(found.reasons) + ")", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    return Proof(args.out, args.timeout_s, found.devices).run()


if __name__ == "__main__":
    sys.exit(main())
