"""Run a CUDA kernel source on the CPU: the code-gen plane's numerical check.

The same ``.cu`` text that NVRTC compiles is built as host C++17 against
``lib/codegen/emu/cuda_emu.h`` (a block's threads are ``std::thread``s meeting
at barriers, blocks run one after another, ``__shared__`` is ``static``) and
driven by ``emu/driver.cpp``, which takes the launch shape and one argument per
kernel parameter on its command line (buffers as raw files). So a generated
kernel can be checked against the NumPy reference on a machine with no GPU.

* :func:`build_emulated` compiles the driver for one source (:data:`BUILDS`:
  plain, AddressSanitizer + UBSan, ThreadSanitizer);
* :func:`run_emulated` launches one entry point on NumPy arrays
  (:func:`read_only`, :func:`read_write`, :func:`f32`, :func:`i32`, ...).

With ``sandboxed=True`` (what the code-generation plane uses for any source it
did not write) both steps run in :mod:`lib.security.sandbox`: the build with
its folder as the only writable path, the run with exec and fork denied, under
CPU, wall and memory limits (sanitizer builds reserve terabytes of shadow
address space, so their runs have no address-space limit; CPU, wall, file and
output limits still hold).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lib.codegen import isolation
from lib.codegen.specialise import ENTRY_RE
from lib.security import sandbox

EMU_DIR = Path(__file__).resolve().parent / "emu"
"""``cuda_emu.h``, ``driver.cpp`` and the stand-in ``include/cuda_fp16.h``."""

SANITIZER_ENV = {
    "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=0",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:print_stacktrace=1",
    "TSAN_OPTIONS": "halt_on_error=1:abort_on_error=1",
}
"""Environment that makes a sanitizer finding kill the emulated run."""

BUILDS = {
    "plain": ["-O1"],
    "asan": ["-O0", "-g1", "-fsanitize=address,undefined",
             "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "tsan": ["-O1", "-g1", "-fsanitize=thread"],
}  # fmt: skip
"""Flavours of the emulated build and their compiler flags.

``asan`` adds AddressSanitizer and UndefinedBehaviorSanitizer (out-of-bounds
accesses, signed overflow in index arithmetic), built at ``-O0`` so nothing is
optimised away from their view; in it the driver puts each buffer in its own
mapping between two inaccessible 32 GiB guards, so an access far past a buffer,
beyond any redzone, faults instead of landing in another live allocation
(``emu/driver.cpp``); ``tsan`` adds ThreadSanitizer, which sees a
missing ``__syncthreads`` as a data race between the block's threads. With
:data:`SANITIZER_ENV` every finding is fatal.
"""


class EmulationError(RuntimeError):
    """The emulated build or run failed (a sanitizer finding, a hang)."""


#: Limits of a sandboxed emulated build (the sanitizer builds are the slow ones).
BUILD_LIMITS = sandbox.SandboxLimits(cpu_seconds=120, wall_seconds=180.0,
                                     memory_bytes=4 << 30)


def _inside(argv: Sequence[str], folder: Path) -> list[str]:
    """``argv`` with the host path of ``folder`` replaced by the sandbox's
    scratch path (the folder is bound there)."""
    host = str(Path(folder).resolve())
    return [a.replace(host, sandbox.SCRATCH) for a in argv]


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, **kwargs)


def find_cxx() -> str | None:
    """A C++17 compiler for the emulated build: ``$CXX``, g++ or clang++."""
    for name in (os.environ.get("CXX"), "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def emulated_build_command(
    source: Path,
    out: Path,
    build: str = "plain",
    defines: Mapping[str, int] | None = None,
    strict: bool = True,
) -> list[str]:
    """The compiler command that builds the emulated driver for one source.

    Args:
        source: the ``.cu`` file.
        out: the binary to write.
        build: a key of :data:`BUILDS`.
        defines: tunables to override, e.g. ``{"MATMUL_TILE": 8}``.
        strict: every warning is an error (``-Werror``), as the project
            holds its own kernels to; False for a kernel someone else wrote,
            which the spot check judges by what it computes and touches
            (the sanitizers), not by style: an unused variable or an ``int``
            compared with ``threadIdx.x`` is common, legal CUDA that NVRTC
            compiles without a word.

    FMA contraction is off, so float results are those of the C expression
    evaluated one rounding at a time, as NumPy evaluates it.
    """
    cxx = find_cxx()
    if cxx is None:
        raise EmulationError("no C++ compiler (g++ or clang++) for the emulated "
                             "build")
    if build not in BUILDS:
        raise ValueError(f"unknown build {build!r}; expected one of {list(BUILDS)}")
    path = Path(source)
    entries = " ".join(f"GH_ENTRY({e})" for e in ENTRY_RE.findall(path.read_text()))
    cmd = [
        cxx, "-std=c++17", "-pthread", "-ffp-contract=off", "-frounding-math",
        "-Wall", "-Wextra", *(["-Werror"] if strict else []),
        "-Wno-unknown-pragmas",
        f"-I{EMU_DIR / 'include'}",
        f'-DGH_KERNEL_SOURCE="{path.resolve()}"',
        f"-DGH_ENTRIES={entries}",
    ]  # fmt: skip
    cmd += [f"-D{name}={value}" for name, value in (defines or {}).items()]
    return cmd + BUILDS[build] + [str(EMU_DIR / "driver.cpp"), "-o", str(out)]


def build_emulated(
    source: Path,
    out_dir: Path,
    build: str = "plain",
    defines: Mapping[str, int] | None = None,
    sandboxed: bool = False,
    strict: bool = True,
) -> Path:
    """Compile the emulated driver for ``source`` into ``out_dir``; the binary.

    Arguments as for :func:`emulated_build_command`; with ``sandboxed`` the
    source must lie in ``out_dir``, which is the build's only writable folder.
    Raises :class:`EmulationError` with the compiler's output when the build
    fails (or, sandboxed, hits :data:`BUILD_LIMITS`).
    """
    path = Path(source)
    tag = build + "".join(f"_{k}{v}" for k, v in sorted((defines or {}).items())) \
        + ("" if strict else "_lenient")
    out = Path(out_dir) / f"{path.stem}_emu_{tag}"
    cmd = emulated_build_command(path, out, build, defines, strict)
    if not sandboxed:
        proc = _run(cmd)
        if proc.returncode != 0:
            raise EmulationError(
                f"emulated build of {path.name} ({tag}) failed:\n{proc.stderr}"
            )
        return out
    if path.resolve().parent != Path(out_dir).resolve():
        raise ValueError(f"a sandboxed build needs {path.name} inside {out_dir}")
    result = sandbox.run(_inside(cmd, Path(out_dir)), scratch=Path(out_dir),
                         limits=BUILD_LIMITS, allow_exec=True,
                         hide=isolation.secret_dirs(),
                         expose=isolation.runtime_paths())
    if result.returncode != 0 or result.timed_out:
        why = result.killed_by_limit or f"exit {result.returncode}"
        raise EmulationError(f"sandboxed emulated build of {path.name} ({tag}) "
                             f"failed ({why}):\n"
                             + result.stderr.decode(errors="replace")[-4000:])
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
    sandboxed: bool = False,
) -> list[np.ndarray]:
    """Launch ``entry`` with ``grid`` blocks of ``block`` threads on the host.

    Args:
        binary: a driver from :func:`build_emulated`, of any build.
        entry: entry-point name, e.g. ``"matmul_fp16"``.
        grid: blocks per dimension, an int or up to three ints.
        block: threads per block (a multiple of 32 in [32, 1024]).
        args: one :class:`Scalar` or :class:`Buffer` per kernel parameter.
        timeout_s: wall-clock limit for the run, seconds; sandboxed, its
            CPU limit, and the wall clock gets :data:`WALL_SLACK` times it.
        sandboxed: run in :mod:`lib.security.sandbox` with exec and fork
            denied; the binary's folder is its scratch.

    Returns:
        The final contents of every writable buffer, in argument order, with
        the dtype and shape it went in with.

    Raises:
        EmulationError: the run failed; the message holds its stderr.
    """
    if sandboxed:
        return _run_sandboxed(Path(binary), entry, grid, block, args, timeout_s)
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
                f"{sandbox.exit_status(proc.returncode)}: {finding(proc.stderr)}\n"
                f"{proc.stderr[-4000:]}"
            )
        return [
            np.fromfile(path, dtype=a.dtype).reshape(a.shape) for path, a in outputs
        ]


_FINDING = re.compile(r"^(?:==\d+==)?\s*(?:ERROR|WARNING): \w+Sanitizer: .*$|"
                      r"^.*runtime error: .*$|^driver: .*$", re.MULTILINE)


def finding(stderr: str) -> str:
    """The line of an emulated run's ``stderr`` that says what went wrong (a
    sanitizer's report, UBSan's runtime error, the driver's own refusal): a
    sanitizer's stack trace can run past what an error message keeps, and its
    headline is at the top. "no sanitizer report" where there is none."""
    m = _FINDING.search(stderr)
    return m.group(0).strip() if m else "no sanitizer report"


#: A sandboxed run's wall-clock limit is this many times its CPU limit. The
#: CPU limit is the work an answer may do; the wall clock also counts the time
#: other work on the machine (or, on a virtual machine, the host) took the
#: cores, and a sound answer that ran in 2.2 s on a quiet machine was refused at
#: 5 s in a full test run on a busy one.
#: A run that burns no CPU (threads stuck at a barrier) still ends, later.
WALL_SLACK = 3.0


def _run_sandboxed(binary: Path, entry: str, grid: int | Sequence[int],
                   block: int, args: Sequence[Scalar | Buffer],
                   timeout_s: float) -> list[np.ndarray]:
    """:func:`run_emulated` inside the sandbox, in the binary's folder."""
    folder = binary.parent
    argv = [f"{sandbox.SCRATCH}/{binary.name}", entry, _dims(grid), _dims(block)]
    outputs, written = [], []
    tag = secrets.token_hex(4)
    try:
        for n, arg in enumerate(args):
            if isinstance(arg, Scalar):
                argv.append(arg.render())
                continue
            path = folder / f"arg{n}-{tag}.bin"
            arg.array.tofile(path)
            written.append(path)
            argv.append(("io:" if arg.writable else "in:")
                        + f"{sandbox.SCRATCH}/{path.name}")
            if arg.writable:
                outputs.append((path, arg.array))
        sanitized = "_emu_asan" in binary.name or "_emu_tsan" in binary.name
        wall = WALL_SLACK * timeout_s
        limits = sandbox.SandboxLimits(
            cpu_seconds=max(1, int(timeout_s)), wall_seconds=wall,
            memory_bytes=None if sanitized else 2 << 30)
        result = sandbox.run(argv, scratch=folder, limits=limits,
                             allow_exec=False, kill_denied=True, env=SANITIZER_ENV,
                             hide=isolation.secret_dirs(),
                             expose=isolation.runtime_paths())
        if result.killed_by_limit == "cpu":
            raise EmulationError(f"{entry} (grid {grid}, block {block}) ran past "
                                 f"{timeout_s} s of CPU time (sandboxed)")
        if result.timed_out or result.killed_by_limit == "wall":
            raise EmulationError(f"{entry} (grid {grid}, block {block}) ran past "
                                 f"{wall:g} s of wall-clock time (sandboxed)")
        if result.returncode != 0:
            stderr = result.stderr.decode(errors="replace")
            raise EmulationError(
                f"{entry} (grid {grid}, block {block}) exited with "
                f"{sandbox.exit_status(result.returncode)} (sandboxed): "
                f"{finding(stderr)}\n"
                + stderr[-4000:])
        return [np.fromfile(path, dtype=a.dtype).reshape(a.shape)
                for path, a in outputs]
    finally:
        for path in written:
            path.unlink(missing_ok=True)


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
