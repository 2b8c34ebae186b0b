"""The numerical spot check: run a kernel source on a small task of its kind and
compare the result with the NumPy reference of :mod:`lib.platform.workloads`.

A generated kernel is launched exactly as the execution plane would launch the
task's kernel (the launch conventions of ``kernels/README.md``, the decision's
block size) on a small task of the same kind and dtype whose sizes are not
multiples of the block or the tile, so bounds handling is exercised, and then
on a task of a real launch's sizes (powers of two, tens of blocks), so
behaviour that waits for a larger size or grid shows. Where it runs is a
:data:`Runner`:

* ``"emulated"`` -- :mod:`lib.codegen.emulate`: the source built as host C++
  and run on the CPU (no GPU needed; what the tests use);
* ``"cuda"`` -- the hook for a machine with a CUDA device: CuPy compiles the
  same source with NVRTC and launches it on device 0;
* ``"auto"`` -- ``"cuda"`` where :func:`lib.platform.cudastack.probe` finds a
  usable device, else ``"emulated"``.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from lib.codegen import emulate
from lib.codegen.emulate import Buffer, Scalar, f32, i32, i64, read_only, read_write
from lib.codegen.nvrtc import default_include_dir
from lib.codegen.specialise import entry_name
from lib.contract import Decision, TaskSpec
from lib.platform.cudastack import probe
from lib.platform.workloads import Elementwise, verify, workload

RUNNERS = ("auto", "emulated", "cuda")

#: Dimensions of the small task each kind is checked on (none a multiple of 32).
SPOT_DIMS: dict[str, dict[str, int]] = {
    "matmul": {"M": 37, "N": 29, "K": 45},
    "reduce": {"N": 5003},
    "elementwise": {"N": 3001},
    "stencil": {"H": 19, "W": 23, "T": 1},
    "histogram": {"N": 4099},
}

GRID_1D = 3
"""Blocks of a 1-D spot launch: few, so grid-stride loops go round."""

#: The second task each kind is checked on: the sizes of a real launch
#: (powers of two, a grid of :data:`GRID_1D_LARGE` blocks), so a kernel
#: whose misbehaviour waits for a size, a grid or an alignment the small
#: task does not have shows it below these. (A trigger above them remains:
#: no spot check proves a kernel right at every size.)
LARGE_SPOT_DIMS: dict[str, dict[str, int]] = {
    # K of 64: four slices of a 16-tile; a K of 128 took the project's own
    # kernel 5.1 s of the sandbox's 5 s in emulation on two cores (a block's
    # 256 threads meet at a barrier twice a slice), refusing a sound answer
    "matmul": {"M": 128, "N": 128, "K": 64},
    "reduce": {"N": 1 << 18},
    "elementwise": {"N": 1 << 18},
    "stencil": {"H": 256, "W": 256, "T": 1},
    "histogram": {"N": 1 << 18},
}

GRID_1D_LARGE = 80
"""Blocks of a 1-D launch on the large task (more than the SMs of most
devices)."""

#: CPU limit of one sandboxed spot run of a block of up to
#: :data:`TIMEOUT_THREADS` threads, seconds: the spot task is small, so an
#: endless loop or a spin is refused in this time, and a divergent barrier
#: (no CPU burnt) in :data:`lib.codegen.emulate.WALL_SLACK` times it.
UNTRUSTED_TIMEOUT_S = 5.0
#: Threads per block the limit above is set for; a larger block gets a limit in
#: proportion (:func:`untrusted_timeout`). The emulator runs a block's threads
#: as the host's threads, so a barrier costs in proportion to them: the
#: project's own matmul kernel, 64 blocks meeting at 9 barriers each, took
#: 2.6 s in the sandbox on two cores with 256 threads a block and 11 s with
#: 1024 (MEASURED).
TIMEOUT_THREADS = 256


def untrusted_timeout(block: int) -> float:
    """The CPU limit, seconds, of a sandboxed spot run whose blocks have
    ``block`` threads (its wall-clock limit is
    :data:`lib.codegen.emulate.WALL_SLACK` times it)."""
    return UNTRUSTED_TIMEOUT_S * max(1.0, block / TIMEOUT_THREADS)

SPOT_BUILD = "asan"
"""Emulated build for spot checks: AddressSanitizer + UBSan, so an access past
a buffer or a static shared array fails the check instead of passing by luck,
and each buffer between two inaccessible guards, so does one far past it (a
write 16 MiB before an output once landed in other live memory and passed)."""


@dataclass(frozen=True)
class SpotResult:
    """The outcome of one spot check.

    Attributes:
        passed: within the workload's tolerance of the NumPy reference.
        max_abs_error: largest absolute difference (``inf`` on a shape mismatch).
        runner: ``"emulated"`` or ``"cuda"``.
        task: the small task, described (``matmul[M=37,N=29,K=45] fp32``).
        seconds: wall time of build, run and comparison.
    """

    passed: bool
    max_abs_error: float
    runner: str
    task: str
    seconds: float


@dataclass(frozen=True)
class Launch:
    """One launch: entry point, grid, block, arguments, and how the writable
    buffers (in argument order) become the workload's output array."""

    entry: str
    grid: tuple[int, ...]
    block: int
    args: tuple[Scalar | Buffer, ...]
    finish: Callable[[list[np.ndarray]], np.ndarray]


def spot_task(task: TaskSpec, large: bool = False) -> TaskSpec:
    """The small task of ``task``'s kind and dtype a kernel is checked on
    (``large``: the second one, :data:`LARGE_SPOT_DIMS`).

    Histogram keeps the task's bin count (the kernel may be specialised to it).
    """
    dims = dict((LARGE_SPOT_DIMS if large else SPOT_DIMS)[task.kind])
    if task.kind == "histogram":
        dims["B"] = task.dims["B"]
    return TaskSpec(task.kind, dims, task.dtype)


def _encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """Host values (bf16 held as rounded float32) as the kernel's element type."""
    if dtype == "bf16":
        return emulate.float_to_bf16_bits(x.astype(np.float32))
    return np.ascontiguousarray(x)


def _decode(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return emulate.bf16_bits_to_float(x)
    return x


def _nan_like(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    host = np.float64 if dtype == "fp64" else np.float32
    return _encode(np.full(shape, np.nan, dtype=host).astype(
        np.float16 if dtype == "fp16" else host), dtype)


def launch_for(task: TaskSpec, decision: Decision, inputs: dict[str, np.ndarray],
               tile: int = 16, grid_1d: int = GRID_1D) -> Launch:
    """The launch of ``task``'s kernel on ``inputs`` with ``decision``'s block.

    Args:
        tile: ``MATMUL_TILE`` the matmul source was specialised with.
        grid_1d: blocks of a one-dimensional launch.
    """
    d, block = task.dtype, int(decision.block)
    entry = entry_name(task.kind, d)
    if task.kind == "matmul":
        m, n, k = task.dims.values()
        grid = (-(-n // tile), -(-m // tile))
        args = (read_only(_encode(inputs["A"], d)), read_only(_encode(inputs["B"], d)),
                read_write(_nan_like((m, n), d)), i32(m), i32(n), i32(k))
        return Launch(entry, grid, block, args, lambda out: _decode(out[0], d))
    if task.kind == "reduce":
        n = task.dims["N"]
        args = (read_only(_encode(inputs["x"], d)),
                read_write(np.full(grid_1d, np.nan, dtype=np.float32)), i64(n))

        def finish_sum(out: list[np.ndarray]) -> np.ndarray:
            # The host adds the per-block partial sums (kernels/README.md).
            return np.array([math.fsum(out[0].astype(np.float64))], np.float32)

        return Launch(entry, (grid_1d,), block, args, finish_sum)
    if task.kind == "elementwise":
        n = task.dims["N"]
        args = (f32(Elementwise.A), read_only(_encode(inputs["x"], d)),
                read_only(_encode(inputs["y"], d)), read_write(_nan_like((n,), d)),
                i64(n))
        return Launch(entry, (grid_1d,), block, args, lambda out: _decode(out[0], d))
    if task.kind == "stencil":
        h, w, _ = task.dims.values()
        args = (read_only(inputs["u"]), read_write(_nan_like((h, w), d)), i32(h),
                i32(w))
        return Launch(entry, (grid_1d,), block, args, lambda out: out[0])
    if task.kind == "histogram":
        n, bins = task.dims.values()
        args = (read_only(inputs["x"]), read_write(np.zeros(bins, np.uint32)),
                i64(n), i32(bins))
        return Launch(entry, (grid_1d,), block, args,
                      lambda out: out[0].astype(np.int64))
    raise ValueError(f"no launch for kind {task.kind!r}")


# ---- runners ------------------------------------------------------------------

@lru_cache(maxsize=1)
def _build_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="gh_spot_"))
    atexit.register(shutil.rmtree, path, True)
    return path


@lru_cache(maxsize=64)
def _emulated_binary(source: str, sandboxed: bool = False) -> Path:
    """The emulated driver for ``source``, built once per process (in the
    sandbox, with its own folder as scratch, when ``sandboxed``)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = _build_dir() / (digest + ("-sandboxed" if sandboxed else ""))
    folder.mkdir(exist_ok=True)
    path = folder / "kernel.cu"
    path.write_text(source)
    # judged by what it computes and touches, not by its style (a warning
    # does not refuse it: emulate.emulated_build_command, strict)
    return emulate.build_emulated(path, folder, SPOT_BUILD, sandboxed=sandboxed,
                                  strict=False)


def run_emulated(source: str, launch: Launch, timeout_s: float = 30.0,
                 sandboxed: bool = False) -> np.ndarray:
    """Run ``launch`` of ``source`` through the CPU emulation harness
    (built and run in :mod:`lib.security.sandbox` when ``sandboxed``)."""
    binary = _emulated_binary(source, sandboxed)
    out = emulate.run_emulated(binary, launch.entry, launch.grid, launch.block,
                               launch.args, timeout_s=timeout_s,
                               sandboxed=sandboxed)
    return launch.finish(out)


def run_cuda(source: str, launch: Launch, timeout_s: float = 30.0,
             ptx: str | None = None) -> np.ndarray:
    """Run ``launch`` of ``source`` on CUDA device 0 (CuPy + NVRTC).

    The device hook: the same source and launch as :func:`run_emulated`.
    With ``ptx`` (what the plane compiled in the sandbox for untrusted
    source) that module is loaded instead, so nothing compiles in this
    process. ``timeout_s`` is not enforced on the device.

    Raises:
        lib.codegen.emulate.EmulationError: the kernel changed a read-only
            input (as the emulated driver refuses it).
    """
    import cupy

    if ptx is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as fh:
            fh.write(ptx)
        try:
            module = cupy.RawModule(path=fh.name)
        finally:
            Path(fh.name).unlink(missing_ok=True)
    else:
        options = ["--std=c++17"]
        if (inc := default_include_dir()) is not None:
            options.append(f"-I{inc}")
        module = cupy.RawModule(code=source, options=tuple(options))
    kernel = module.get_function(launch.entry)
    scalars = {"f": np.float32, "d": np.float64, "i": np.int32, "l": np.int64}
    args, writable, inputs = [], [], []
    for n, arg in enumerate(launch.args):
        if isinstance(arg, Scalar):
            args.append(scalars[arg.code](arg.value))
        else:
            dev = cupy.asarray(arg.array)
            args.append(dev)
            (writable if arg.writable else inputs).append((n, dev, arg.array))
    kernel(launch.grid, (launch.block,), tuple(args))
    cupy.cuda.Device().synchronize()
    for n, dev, host in inputs:  # as the emulated driver checks (exit 3)
        if cupy.asnumpy(dev).tobytes() != np.ascontiguousarray(host).tobytes():
            raise emulate.EmulationError(f"{launch.entry}: the kernel wrote to "
                                         f"its read-only input (argument {n})")
    return launch.finish([cupy.asnumpy(a) for _, a, _ in writable])


@lru_cache(maxsize=1)
def _device_usable() -> bool:
    return bool(probe().usable)


def resolve_runner(runner: str) -> str:
    """``"emulated"`` or ``"cuda"`` for a :data:`RUNNERS` name."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown spot-check runner {runner!r}; expected one of "
                         f"{', '.join(RUNNERS)}")
    if runner == "auto":
        return "cuda" if _device_usable() else "emulated"
    return runner


def spot_check(source: str, task: TaskSpec, decision: Decision,
               runner: str = "auto", seed: int = 0, tile: int = 16, *,
               sandboxed: bool = False, ptx: str | None = None) -> SpotResult:
    """Run ``source`` on the two :func:`spot_task` of ``task`` (the small one
    first) and compare each with NumPy; it passes when both do.

    Args:
        tile: the matmul tile the source was asked for (sets the 2-D grid).
        sandboxed: the source is untrusted: the emulated build and run happen
            in :mod:`lib.security.sandbox` (the plane's choice for anything
            not from ``kernels/``).
        ptx: the module compiled from ``source`` in the sandbox, for the
            ``cuda`` runner (untrusted text is not compiled in this process).

    Raises:
        lib.codegen.emulate.EmulationError: the emulated build or run failed
            (the kernel does not build as C++, crashes, or hangs).
    """
    start = time.perf_counter()
    which = resolve_runner(runner)
    passed, worst, names = True, 0.0, []
    for large, grid in ((False, GRID_1D), (True, GRID_1D_LARGE)):
        small = spot_task(task, large)
        names.append(small.describe())
        work = workload(small)
        inputs = work.make_inputs(small, seed)
        launch = launch_for(small, decision, inputs, tile, grid)
        if which == "cuda":
            out = run_cuda(source, launch, ptx=ptx)
        else:
            out = run_emulated(source, launch, sandboxed=sandboxed,
                               timeout_s=untrusted_timeout(launch.block)
                               if sandboxed else 30.0)
        ref = work.reference(small, inputs)
        ok, err = verify(small, np.asarray(out), ref)
        if not np.all(np.isfinite(np.asarray(out, dtype=np.float64))):
            ok, err = False, math.inf
        passed, worst = passed and ok, max(worst, err)
        if not ok:
            names = names[-1:]  # the task it failed on
            break
    return SpotResult(passed, worst, which, " and ".join(names),
                      time.perf_counter() - start)
