"""Compile CUDA source to PTX with NVRTC, and measure the PTX with ptxas.

* :func:`nvrtc_include_dir` finds the ``cuda_fp16.h``/``cuda_bf16.h`` headers
  NVRTC needs (it ships none of its own);
* :func:`compile_ptx` runs NVRTC through the low-level ``cupy.cuda.nvrtc``
  bindings, which need no driver and no GPU;
* :func:`ptxas_resources` assembles PTX with the toolkit's ``nvcc`` (when on
  PATH) and returns registers, static shared memory and spills per entry point.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path


class CompileError(RuntimeError):
    """NVRTC or ptxas refused a source; the message holds the compiler log."""


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, **kwargs)


def find_nvcc() -> str | None:
    """Path of ``nvcc`` on PATH, or None."""
    return shutil.which("nvcc")


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


@lru_cache(maxsize=1)
def default_include_dir() -> Path | None:
    """:func:`nvrtc_include_dir`, looked up once per process."""
    return nvrtc_include_dir()


def compiler_name() -> str:
    """``"nvrtc 12.9"``: what a sealed cache entry records as its compiler."""
    major, minor = nvrtc_version()
    return f"nvrtc {major}.{minor}"


def compile_ptx(source: str, name: str, arch: int,
                options: Sequence[str] = (), include_dir: Path | None = None,
                ) -> str:
    """Compile CUDA ``source`` with NVRTC for ``compute_<arch>``; PTX text.

    Args:
        source: the ``.cu`` text.
        name: a file name for the compiler's messages, e.g. ``"matmul.cu"``.
        arch: compute capability as an int (80 for sm_80).
        options: extra NVRTC options (``-DNAME=VALUE`` is passed through).
        include_dir: where ``cuda_fp16.h`` lives; default
            :func:`default_include_dir`.

    Raises:
        CompileError: the compile failed; the message holds NVRTC's log.
    """
    from cupy.cuda import nvrtc

    include_dir = include_dir if include_dir is not None else default_include_dir()
    opts = [f"--gpu-architecture=compute_{arch}", "--std=c++17", *options]
    if include_dir is not None:
        opts.append(f"--include-path={include_dir}")
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as err:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(
                f"NVRTC failed on {name} for compute_{arch} ({err}):\n{log}"
            ) from err
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx.decode().rstrip("\x00") if isinstance(ptx, bytes) else ptx


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


def ptxas_argv(nvcc: str, ptx: str, cubin: str, arch: int) -> list[str]:
    """The nvcc command that assembles ``ptx`` for ``sm_<arch>`` into
    ``cubin`` and reports each function's resources."""
    return [nvcc, "-cubin", f"-arch=sm_{arch}", "--resource-usage", ptx, "-o",
            cubin]


def nvcc_resource_usage(ptx: Path, arch: int) -> dict[str, dict[str, int]]:
    """Assemble the PTX file ``ptx`` for ``sm_<arch>`` with nvcc; its usage.

    Raises:
        CompileError: ptxas refused the PTX.
    """
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "out.cubin"
        proc = _run(ptxas_argv("nvcc", str(ptx), str(cubin), arch))
    if proc.returncode != 0:
        raise CompileError(f"ptxas failed on {ptx} for sm_{arch}:\n{proc.stderr}")
    return parse_ptxas_usage(proc.stdout + proc.stderr)


def ptxas_resources(ptx: str, arch: int) -> dict[str, dict[str, int]] | None:
    """:func:`nvcc_resource_usage` of PTX text; None when nvcc is not on PATH."""
    if find_nvcc() is None:
        return None
    with tempfile.TemporaryDirectory(prefix="gh_ptx_") as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        return nvcc_resource_usage(path, arch)
