"""Build and run the CUDA kernels in ``kernels/`` with and without a GPU toolchain.

Three ways to turn a kernel source into something checkable, one source each:

* :func:`nvcc_ptx` and :func:`nvcc_resource_usage`: ``nvcc -ptx`` for one
  architecture, then ``ptxas`` (through ``nvcc -cubin --resource-usage``) on that
  PTX for registers, shared memory and spills per entry point;
* :func:`nvrtc_ptx`: the runtime compiler through the low-level
  ``cupy.cuda.nvrtc`` bindings, which need no driver, with the ``cuda_fp16.h``
  and ``cuda_bf16.h`` headers found by :func:`nvrtc_include_dir`;
* :func:`build_emulated` and :func:`run_emulated`: the same source compiled as
  host C++ against ``tests/emu/cuda_emu.h`` (a block's threads are std::threads,
  blocks run one after another) and run on NumPy arrays passed through files,
  optionally under AddressSanitizer with UndefinedBehaviorSanitizer, or under
  ThreadSanitizer (:data:`BUILDS`).

Entry points are read from the sources themselves (:func:`entry_points`), and
tunables' defaults from their ``#define`` lines (:func:`macro_default`), so the
tests never restate what a kernel file already says.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
KERNELS_DIR = REPO_ROOT / "kernels"
EMU_DIR = Path(__file__).resolve().parent / "emu"

KINDS = ("matmul", "reduce", "elementwise", "stencil", "histogram")
"""Every workload kind; kernels/<kind>.cu holds its entry points."""

ARCHS = (75, 80, 90)
"""Compute capabilities every kernel must compile for (Turing, Ampere, Hopper)."""

SANITIZER_ENV = {
    "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=0",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:print_stacktrace=1",
    "TSAN_OPTIONS": "halt_on_error=1:abort_on_error=1",
}
"""Environment that makes a sanitizer finding kill the emulated run."""

_ENTRY_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)


def kernel_source(kind: str) -> Path:
    """Path of ``kernels/<kind>.cu``; raises if ``kind`` has no source."""
    path = KERNELS_DIR / f"{kind}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source for kind {kind!r} at {path}")
    return path


def entry_points(kind: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions in ``kernels/<kind>.cu``."""
    return _ENTRY_RE.findall(kernel_source(kind).read_text())


def macro_default(kind: str, name: str) -> int:
    """Integer default of tunable ``name`` in its ``#ifndef``/``#define`` block."""
    text = kernel_source(kind).read_text()
    match = re.search(rf"^#define\s+{re.escape(name)}\s+(\d+)\s*$", text, re.M)
    if match is None:
        raise KeyError(f"{kind}.cu defines no integer macro {name}")
    return int(match.group(1))


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, **kwargs)


# --------------------------------------------------------------------- nvcc --


def find_nvcc() -> str | None:
    """Path of ``nvcc`` on PATH, or None."""
    return shutil.which("nvcc")


def nvcc_ptx(kind: str, arch: int, out_dir: Path) -> Path:
    """Compile ``kernels/<kind>.cu`` to PTX for ``sm_<arch>``; returns the file.

    Raises RuntimeError with nvcc's output when the compile fails.
    """
    out = Path(out_dir) / f"{kind}.sm_{arch}.ptx"
    cmd = ["nvcc", "-ptx", f"-arch=sm_{arch}", str(kernel_source(kind)), "-o", str(out)]
    proc = _run(cmd)
    if proc.returncode != 0:
        raise RuntimeError(
            f"nvcc failed on {kind}.cu for sm_{arch}:\n{proc.stdout}{proc.stderr}"
        )
    return out


def parse_ptxas_usage(text: str) -> dict[str, dict[str, int]]:
    """Per-entry resource usage from ``ptxas -v`` (``--resource-usage``) output.

    Returns ``{entry: {"registers", "shared_bytes", "barriers", "stack_bytes",
    "spill_store_bytes", "spill_load_bytes"}}``; shared memory is the static
    amount, in bytes.
    """
    usage: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            current = usage.setdefault(m.group(1), {})
        elif current is not None and "spill stores" in line:
            nums = [int(n) for n in re.findall(r"(\d+) bytes", line)]
            current.update(
                stack_bytes=nums[0], spill_store_bytes=nums[1], spill_load_bytes=nums[2]
            )
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            bars = re.search(r"used (\d+) barriers", line)
            current.update(
                registers=int(m.group(1)),
                shared_bytes=int(smem.group(1)) if smem else 0,
                barriers=int(bars.group(1)) if bars else 0,
            )
    return usage


def nvcc_resource_usage(ptx: Path, arch: int) -> dict[str, dict[str, int]]:
    """Assemble ``ptx`` for ``sm_<arch>`` and return :func:`parse_ptxas_usage`."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "out.cubin"
        cmd = [
            "nvcc",
            "-cubin",
            f"-arch=sm_{arch}",
            "--resource-usage",
            str(ptx),
            "-o",
            str(cubin),
        ]
        proc = _run(cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed on {ptx} for sm_{arch}:\n{proc.stderr}")
    return parse_ptxas_usage(proc.stdout + proc.stderr)


def nvcc_include_dirs() -> list[Path]:
    """The include directories nvcc itself passes to its front end.

    Asked of ``nvcc -dryrun`` rather than guessed from nvcc's path, which is
    often a wrapper script outside the toolkit.
    """
    if find_nvcc() is None:
        return []
    proc = _run(["nvcc", "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    dirs = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if m := re.search(r'INCLUDES="([^"]*)"', line):
            dirs += [Path(p).resolve() for p in re.findall(r"-I(\S+)", m.group(1))]
    return dirs


# -------------------------------------------------------------------- NVRTC --


def _cudart_version(include_dir: Path) -> int | None:
    header = include_dir / "cuda_runtime_api.h"
    if not header.is_file():
        return None
    m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text())
    return int(m.group(1)) if m else None


def header_include_dirs() -> list[Path]:
    """Directories holding both ``cuda_fp16.h`` and ``cuda_bf16.h``.

    Looked for, in order: ``$CUDA_PATH``/``$CUDA_HOME``, the include folders of
    the ``nvidia-cuda-runtime-cu12`` and ``nvidia-cuda-nvrtc-cu12`` wheels (the
    ``nvidia`` namespace package), the include folders nvcc uses, and
    ``/usr/local/cuda/include``. Duplicates are dropped.
    """
    candidates: list[Path] = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    try:
        import nvidia  # namespace package of the NVIDIA wheels

        for root in nvidia.__path__:
            for sub in ("cuda_runtime", "cuda_nvrtc", "cu13", "cu12"):
                candidates.append(Path(root) / sub / "include")
    except ImportError:
        pass
    candidates += nvcc_include_dirs()
    candidates.append(Path("/usr/local/cuda/include"))
    found: list[Path] = []
    for d in candidates:
        d = d.resolve()
        ok = (d / "cuda_fp16.h").is_file() and (d / "cuda_bf16.h").is_file()
        if ok and d not in found:
            found.append(d)
    return found


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library cupy loads; raises if none loads."""
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getVersion())


def nvrtc_include_dir() -> Path | None:
    """The header folder NVRTC should use, or None when there is none.

    Among :func:`header_include_dirs`, the first whose ``CUDART_VERSION`` has the
    same major version as NVRTC wins (headers newer than the compiler may use
    builtins it lacks); otherwise the first found.
    """
    dirs = header_include_dirs()
    if not dirs:
        return None
    major = nvrtc_version()[0]
    for d in dirs:
        version = _cudart_version(d)
        if version is not None and version // 1000 == major:
            return d
    return dirs[0]


def nvrtc_ptx(kind: str, arch: int, include_dir: Path | None) -> str:
    """Compile ``kernels/<kind>.cu`` with NVRTC for ``compute_<arch>``; PTX text.

    Raises RuntimeError with the NVRTC log when the compile fails.
    """
    from cupy.cuda import nvrtc

    name = f"{kind}.cu"
    prog = nvrtc.createProgram(kernel_source(kind).read_text(), name, [], [])
    options = [f"--gpu-architecture=compute_{arch}", "--std=c++17"]
    if include_dir is not None:
        options.append(f"--include-path={include_dir}")
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as err:
            log = nvrtc.getProgramLog(prog)
            raise RuntimeError(
                f"NVRTC failed on {name} for compute_{arch} ({err}):\n{log}"
            ) from err
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


# ---------------------------------------------------------------- emulation --


def find_cxx() -> str | None:
    """A C++17 compiler for the emulated build: ``$CXX``, g++ or clang++."""
    for name in (os.environ.get("CXX"), "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _source_path(source: str | Path) -> Path:
    return kernel_source(source) if isinstance(source, str) else Path(source)


BUILDS = {
    "plain": ["-O1"],
    "asan": ["-O0", "-g1", "-fsanitize=address,undefined",
             "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "tsan": ["-O1", "-g1", "-fsanitize=thread"],
}  # fmt: skip
"""Flavours of the emulated build and their compiler flags.

``asan`` adds AddressSanitizer and UndefinedBehaviorSanitizer (out-of-bounds
accesses, signed overflow in index arithmetic), built at ``-O0`` so nothing is
optimised away from their view; ``tsan`` adds ThreadSanitizer, which sees a
missing ``__syncthreads`` as a data race between the block's threads. With
:data:`SANITIZER_ENV` every finding is fatal.
"""


def emulated_build_command(
    source: str | Path,
    out: Path,
    build: str = "plain",
    defines: Mapping[str, int] | None = None,
) -> list[str]:
    """The compiler command that builds the emulated driver for one source.

    Args:
        source: a kind (``"matmul"``: ``kernels/matmul.cu``) or a ``.cu`` path.
        out: the binary to write.
        build: a key of :data:`BUILDS`.
        defines: tunables to override, e.g. ``{"MATMUL_TILE": 8}``.

    FMA contraction is off, so float results are those of the C expression
    evaluated one rounding at a time, as NumPy evaluates it.
    """
    cxx = find_cxx()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or clang++) for the emulated build")
    if build not in BUILDS:
        raise ValueError(f"unknown build {build!r}; expected one of {list(BUILDS)}")
    path = _source_path(source)
    entries = " ".join(f"GH_ENTRY({e})" for e in _ENTRY_RE.findall(path.read_text()))
    cmd = [
        cxx, "-std=c++17", "-pthread", "-ffp-contract=off",
        "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
        f"-I{EMU_DIR / 'include'}",
        f'-DGH_KERNEL_SOURCE="{path.resolve()}"',
        f"-DGH_ENTRIES={entries}",
    ]  # fmt: skip
    cmd += [f"-D{name}={value}" for name, value in (defines or {}).items()]
    return cmd + BUILDS[build] + [str(EMU_DIR / "driver.cpp"), "-o", str(out)]


def build_emulated(
    source: str | Path,
    out_dir: Path,
    build: str = "plain",
    defines: Mapping[str, int] | None = None,
) -> Path:
    """Compile the emulated driver for ``source`` into ``out_dir``; the binary.

    Arguments as for :func:`emulated_build_command`. Raises RuntimeError with the
    compiler's output when the build fails.
    """
    path = _source_path(source)
    tag = build + "".join(f"_{k}{v}" for k, v in sorted((defines or {}).items()))
    out = Path(out_dir) / f"{path.stem}_emu_{tag}"
    proc = _run(emulated_build_command(path, out, build, defines))
    if proc.returncode != 0:
        raise RuntimeError(
            f"emulated build of {path.name} ({tag}) failed:\n{proc.stderr}"
        )
    return out


@dataclass(frozen=True)
class Scalar:
    """A by-value kernel argument; ``code`` is the driver's prefix (f, d, i, l)."""

    code: str
    value: float | int

    def render(self) -> str:
        if self.code == "f":
            return "f:" + float(np.float32(self.value)).hex()
        if self.code == "d":
            return "d:" + float(self.value).hex()
        return f"{self.code}:{int(self.value)}"


def f32(v: float) -> Scalar:
    """A ``float`` argument (rounded to float32 first)."""
    return Scalar("f", v)


def f64(v: float) -> Scalar:
    """A ``double`` argument."""
    return Scalar("d", v)


def i32(v: int) -> Scalar:
    """An ``int`` argument."""
    return Scalar("i", v)


def i64(v: int) -> Scalar:
    """A ``long long`` argument."""
    return Scalar("l", v)


@dataclass(frozen=True)
class Buffer:
    """A pointer argument: ``array``'s bytes; written back if ``writable``."""

    array: np.ndarray
    writable: bool


def read_only(a: np.ndarray) -> Buffer:
    """A ``const T*`` argument holding ``a`` (C-contiguous bytes)."""
    return Buffer(np.ascontiguousarray(a), False)


def read_write(a: np.ndarray) -> Buffer:
    """A ``T*`` argument starting as ``a``; its final contents are returned."""
    return Buffer(np.ascontiguousarray(a), True)


class EmulationError(RuntimeError):
    """The emulated kernel exited with an error (a sanitizer finding, a hang)."""


def _dims(d: int | Sequence[int]) -> str:
    dims = [d] if isinstance(d, int) else list(d)
    return ",".join(str(int(v)) for v in dims)


def run_emulated(
    binary: Path,
    entry: str,
    grid: int | Sequence[int],
    block: int,
    args: Sequence[Scalar | Buffer],
    timeout_s: float = 120.0,
) -> list[np.ndarray]:
    """Launch ``entry`` with ``grid`` blocks of ``block`` threads on the host.

    Args:
        binary: a driver from :func:`build_emulated`, of any build.
        entry: entry-point name, e.g. ``"matmul_fp16"``.
        grid: blocks per dimension, an int or up to three ints.
        block: threads per block (a multiple of 32 in [32, 1024]).
        args: one :class:`Scalar` or :class:`Buffer` per kernel parameter.
        timeout_s: wall-clock limit for the run, seconds.

    Returns:
        The final contents of every writable buffer, in argument order, with
        the dtype and shape it went in with.

    Raises:
        EmulationError: the run failed; the message holds its stderr.
    """
    with tempfile.TemporaryDirectory(prefix="gh_emu_") as tmp:
        argv = [str(binary), entry, _dims(grid), _dims(block)]
        outputs = []
        for n, arg in enumerate(args):
            if isinstance(arg, Scalar):
                argv.append(arg.render())
                continue
            path = Path(tmp) / f"arg{n}.bin"
            arg.array.tofile(path)
            argv.append(("io:" if arg.writable else "in:") + str(path))
            if arg.writable:
                outputs.append((path, arg.array))
        env = {**os.environ, **SANITIZER_ENV}
        try:
            proc = _run(argv, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise EmulationError(
                f"{entry} (grid {grid}, block {block}) ran past {timeout_s} s"
            ) from err
        if proc.returncode != 0:
            raise EmulationError(
                f"{entry} (grid {grid}, block {block}) exited with "
                f"{proc.returncode}:\n{proc.stderr[-4000:]}"
            )
        return [
            np.fromfile(path, dtype=a.dtype).reshape(a.shape) for path, a in outputs
        ]


# ------------------------------------------------------------------ bfloat16 --


def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of ``x``, rounded to nearest even.

    NaN stays a quiet NaN, as ``__float2bfloat16`` does.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x)
    rounded = np.where(nan, (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def bf16_bits_to_float(b: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16); exact."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
