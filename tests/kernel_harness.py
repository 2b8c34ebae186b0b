"""Build and run the CUDA kernels in ``kernels/`` with and without a GPU toolchain.

The machinery lives in the code-gen plane, which needs it in production; this
module names the kernel files and re-exports it for the tests:

* :func:`nvcc_ptx` and :func:`nvcc_resource_usage`: ``nvcc -ptx`` for one
  architecture, then ``ptxas`` (through ``nvcc -cubin --resource-usage``) on that
  PTX for registers, shared memory and spills per entry point;
* :func:`nvrtc_ptx`: the runtime compiler through :mod:`lib.codegen.nvrtc`
  (``cupy.cuda.nvrtc``, no driver needed), with the ``cuda_fp16.h`` and
  ``cuda_bf16.h`` headers found by :func:`nvrtc_include_dir`;
* :func:`build_emulated` and :func:`run_emulated`: the same source compiled as
  host C++ by :mod:`lib.codegen.emulate` (a block's threads are std::threads,
  blocks run one after another) and run on NumPy arrays passed through files,
  optionally under AddressSanitizer with UndefinedBehaviorSanitizer, or under
  ThreadSanitizer (:data:`BUILDS`).

Entry points are read from the sources themselves (:func:`entry_points`), and
tunables' defaults from their ``#define`` lines (:func:`macro_default`), so the
tests never restate what a kernel file already says.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from lib import contract
from lib.codegen import emulate, specialise
from lib.codegen.emulate import (  # noqa: F401  (re-exported for the tests)
    BUILDS,
    SANITIZER_ENV,
    Buffer,
    EmulationError,
    Scalar,
    bf16_bits_to_float,
    f32,
    f64,
    find_cxx,
    finding,
    float_to_bf16_bits,
    i32,
    i64,
    read_only,
    read_write,
    run_emulated,
)
from lib.codegen.nvrtc import (  # noqa: F401  (re-exported for the tests)
    compile_ptx,
    find_nvcc,
    header_include_dirs,
    nvcc_include_dirs,
    nvcc_resource_usage,
    nvrtc_include_dir,
    nvrtc_version,
    parse_ptxas_usage,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
KERNELS_DIR = specialise.KERNELS_DIR
EMU_DIR = Path(__file__).resolve().parent / "emu"
"""The tests' own emulator fixtures (``canary.cu``); the emulator itself is in
:data:`lib.codegen.emulate.EMU_DIR`."""

KINDS = contract.KINDS
"""Every workload kind; kernels/<kind>.cu holds its entry points."""

ARCHS = (75, 80, 90)
"""Compute capabilities every kernel must compile for (Turing, Ampere, Hopper)."""


kernel_source = specialise.kernel_path
"""Path of ``kernels/<kind>.cu`` (the code-gen plane's own lookup)."""


def entry_points(kind: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions in ``kernels/<kind>.cu``."""
    return specialise.entry_points(kernel_source(kind).read_text())


def macro_default(kind: str, name: str) -> int:
    """Integer default of tunable ``name`` in its ``#ifndef``/``#define`` block."""
    text = kernel_source(kind).read_text()
    match = re.search(rf"^#define\s+{re.escape(name)}\s+(\d+)\s*$", text, re.M)
    if match is None:
        raise KeyError(f"{kind}.cu defines no integer macro {name}")
    return int(match.group(1))


def nvcc_ptx(kind: str, arch: int, out_dir: Path) -> Path:
    """Compile ``kernels/<kind>.cu`` to PTX for ``sm_<arch>``; returns the file.

    Raises RuntimeError with nvcc's output when the compile fails.
    """
    out = Path(out_dir) / f"{kind}.sm_{arch}.ptx"
    cmd = ["nvcc", "-ptx", f"-arch=sm_{arch}", str(kernel_source(kind)), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"nvcc failed on {kind}.cu for sm_{arch}:\n{proc.stdout}{proc.stderr}"
        )
    return out


def nvrtc_ptx(kind: str, arch: int, include_dir: Path | None) -> str:
    """Compile ``kernels/<kind>.cu`` with NVRTC for ``compute_<arch>``; PTX text.

    Raises :class:`lib.codegen.nvrtc.CompileError` (a RuntimeError) with the
    NVRTC log when the compile fails.
    """
    source = kernel_source(kind)
    return compile_ptx(source.read_text(), source.name, arch, include_dir=include_dir)


def build_emulated(
    source: str | Path,
    out_dir: Path,
    build: str = "plain",
    defines: Mapping[str, int] | None = None,
) -> Path:
    """:func:`lib.codegen.emulate.build_emulated` of a kind (``"matmul"``:
    ``kernels/matmul.cu``) or a ``.cu`` path."""
    path = kernel_source(source) if isinstance(source, str) else Path(source)
    return emulate.build_emulated(path, out_dir, build, defines)
