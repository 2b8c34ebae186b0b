"""Untrusted CUDA source on the host: one program for every compiler, and only
inside the sandbox.

Source that did not come from the project's ``kernels/`` (an LLM's answer, a
recorded answer) is untrusted. Gate 2a scans it, but a scanner is a filter,
not a boundary; this module is the boundary's other half, with
:mod:`lib.security.sandbox`:

1. :func:`canonicalise` preprocesses the text once, with ``g++ -E`` inside the
   sandbox, under exactly the macros NVRTC predefines for the target
   (:func:`device_macros`: ``__CUDACC__``, ``__CUDACC_RTC__``,
   ``__CUDA_ARCH__``...; none of the host compiler's own, ``-undef``). The
   output has no conditionals left, so ``#ifndef __CUDACC_RTC__`` cannot give
   the host emulation and the device different programs: NVRTC, the emulated
   spot check and the cache all take this one text. ``#pragma unroll EXPR``
   lines keep their meaning (the expression is expanded first), and the only
   headers allowed, ``cuda_fp16.h`` and ``cuda_bf16.h``, stay as includes.
2. :func:`compile_ptx_isolated` runs NVRTC on it in a sandboxed child process
   with CPU, wall and memory limits (deeply nested templates that keep NVRTC
   busy for minutes are refused in :data:`NVRTC_LIMITS`' 10 s).
3. The emulated spot check builds and runs the canonical text in the sandbox
   too (:mod:`lib.codegen.emulate` with ``sandboxed=True``).

Where no sandbox can start, :func:`require_sandbox` says why, and the plane
refuses the untrusted text and serves the template: it never runs it bare.
Every sandboxed step hides :data:`SECRET_DIRS` (the seal's key among them).
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from lib.codegen.nvrtc import (
    CompileError,
    find_nvcc,
    nvrtc_version,
    parse_ptxas_usage,
    ptxas_argv,
)
from lib.security import sandbox
from lib.storage import gpuhive_home

#: The only ``#include`` lines untrusted text may have; kept verbatim as the
#: canonical text's first lines (NVRTC and the emulator each bring their own).
ALLOWED_INCLUDE_RE = re.compile(
    r'^\s*#\s*include\s*[<"](cuda_fp16\.h|cuda_bf16\.h)[>"]\s*$')
#: ``#pragma unroll`` with an optional expression; GCC does not expand macros
#: in a pragma it does not know, so the line is rewritten to ``_Pragma`` first.
PRAGMA_UNROLL_RE = re.compile(r"^\s*#\s*pragma\s+unroll\b(.*)$")
_UNROLL_PRELUDE = ("#define GH_STR_(x) #x\n"
                   "#define GH_UNROLL_(x) _Pragma(GH_STR_(unroll x))\n")

#: Limits of the preprocessing step: an argument-amplifying macro file stops
#: at the output cap, a recursive one at the CPU limit.
PREPROCESS_LIMITS = sandbox.SandboxLimits(cpu_seconds=5, wall_seconds=10.0,
                                          memory_bytes=1 << 30,
                                          output_bytes=4 << 20)
#: Limits of one NVRTC compile (CUDA's libraries map several GB of address
#: space, hence the memory bound).
NVRTC_LIMITS = sandbox.SandboxLimits(cpu_seconds=10, wall_seconds=10.0,
                                     memory_bytes=16 << 30,
                                     output_bytes=16 << 20)


class IsolationError(RuntimeError):
    """Untrusted source could not be handled safely (the message says why)."""


def secret_dirs() -> list[Path]:
    """Folders no sandboxed step may read: GPUHive's home (the seal's key, the
    cache) and the usual places of credentials in the user's home."""
    home = Path.home()
    found = [gpuhive_home(), *(home / n for n in (".ssh", ".aws", ".config",
                                                   ".gnupg", ".docker"))]
    return [p for p in found if p.is_dir()]


def runtime_paths() -> list[Path]:
    """What a sandboxed step must read that the sandbox's fresh ``/tmp`` would
    cover: this Python environment (the NVRTC child imports CuPy from it) and
    the package itself (the emulator's headers), when they live under /tmp, as
    in a fresh clone there."""
    tmp = Path("/tmp").resolve()
    wanted = [Path(sys.prefix), Path(__file__).resolve().parents[1],
              *(Path(p) for p in sys.path if p)]
    found: list[Path] = []
    for path in wanted:
        real = path.resolve()
        if real.is_relative_to(tmp) and real.exists() and real not in found \
                and not any(real.is_relative_to(f) for f in found):
            found.append(real)
    return found


def require_sandbox() -> None:
    """Raise :class:`IsolationError` where no sandbox starts (one line why)."""
    reason = sandbox.available()
    if reason is not None:
        raise IsolationError(f"no sandbox to run untrusted code in ({reason}); "
                             "it is refused, never run bare")


def device_macros(arch: int) -> dict[str, str]:
    """The macros NVRTC predefines when it compiles for ``compute_<arch>``.

    Found by compiling probes with NVRTC (``#ifdef X`` / ``#error``): it
    defines these and not ``__GNUC__``, ``__linux__``, ``__x86_64__`` or
    ``__clang__``, which the host compiler would.
    """
    try:
        major, minor = nvrtc_version()
    except Exception:  # no NVRTC here: the CUDA 12 runtime's numbering
        major, minor = 12, 0
    return {"__CUDACC__": "1", "__CUDACC_RTC__": "1",
            "__CUDA_ARCH__": str(arch * 10),
            "__CUDA_ARCH_LIST__": str(arch * 10),
            "__CUDACC_VER_MAJOR__": str(major), "__CUDACC_VER_MINOR__": str(minor),
            "__CUDACC_VER_BUILD__": "0", "__CUDA_API_VER_MAJOR__": str(major),
            "__CUDACC_VER__": str(major * 10000 + minor * 100),
            "__LP64__": "1"}


def _split_source(source: str) -> tuple[list[str], str]:
    """(allowed include lines, the rest with pragma-unroll lines rewritten)."""
    text = source.removeprefix("\ufeff").replace("\r\n", "\n")
    includes, body = [], []
    for line in text.split("\n"):
        if ALLOWED_INCLUDE_RE.match(line):
            includes.append(line.strip())
            body.append("")  # keep line numbers for the compiler's messages
        elif m := PRAGMA_UNROLL_RE.match(line):
            body.append(f"GH_UNROLL_({m.group(1).strip()})")
        else:
            body.append(line)
    return includes, "\n".join(body)


def canonicalise(source: str, arch: int,
                 defines: Mapping[str, str] | None = None) -> str:
    """The one text every compiler takes: ``source`` preprocessed in the
    sandbox under :func:`device_macros` (plus ``defines``, the ``-D`` options
    the compile will use), the allowed includes first.

    Raises:
        IsolationError: no sandbox, or the preprocessor refused the text (an
            include other than cuda_fp16.h/cuda_bf16.h, a directive error, a
            limit of :data:`PREPROCESS_LIMITS`); the message says which.
    """
    require_sandbox()
    includes, body = _split_source(source)
    macros = {**device_macros(arch), **(defines or {})}
    with tempfile.TemporaryDirectory(prefix="gh_canon_") as tmp:
        Path(tmp, "kernel.cu").write_text(_UNROLL_PRELUDE + body)
        # -H lists every file the preprocessor opens: none is allowed (the
        # two CUDA headers were taken out above), whatever spelling reached it
        argv = ["g++", "-E", "-H", "-P", "-undef", "-nostdinc", "-x", "c++",
                "-std=c++17", *(f"-D{k}={v}" for k, v in macros.items()),
                f"{sandbox.SCRATCH}/kernel.cu"]
        result = sandbox.run(argv, scratch=Path(tmp), limits=PREPROCESS_LIMITS,
                             allow_exec=True, hide=secret_dirs())
    if result.killed_by_limit or result.timed_out or result.truncated:
        raise IsolationError("preprocessing stopped at the sandbox's "
                             f"{result.killed_by_limit or 'wall'} limit "
                             "(runaway macro expansion)")
    stderr = result.stderr.decode(errors="replace")
    opened = [ln.lstrip(". ").strip() for ln in stderr.splitlines()
              if ln.startswith(". ")]
    if opened:
        raise IsolationError("preprocessing refused: the text includes "
                             f"{opened[0]!r}; only cuda_fp16.h and cuda_bf16.h "
                             "may be included")
    if result.returncode != 0:
        raise IsolationError("preprocessing refused: " + _first_line(stderr))
    text = result.stdout.decode(errors="replace")
    return "\n".join(includes + [text.strip("\n")]) + "\n"


_NVRTC_SCRIPT = r"""
import sys
from cupy.cuda import nvrtc
src = open("/scratch/kernel.cu", encoding="utf-8").read()
opts = [a for a in sys.argv[2:]]
prog = nvrtc.createProgram(src, sys.argv[1], [], [])
try:
    nvrtc.compileProgram(prog, opts)
except nvrtc.NVRTCError as err:
    sys.stderr.write(f"{err}\n{nvrtc.getProgramLog(prog)}")
    sys.exit(3)
ptx = nvrtc.getPTX(prog)
ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
open("/scratch/kernel.ptx", "w").write(ptx.rstrip("\x00"))
"""


def compile_ptx_isolated(source: str, name: str, arch: int,
                         options: Sequence[str] = (),
                         include_dir: Path | None = None) -> str:
    """:func:`lib.codegen.nvrtc.compile_ptx`, in a sandboxed child process.

    Raises:
        CompileError: NVRTC refused the source (its log), as in-process.
        IsolationError: no sandbox, or the compile hit :data:`NVRTC_LIMITS`.
    """
    require_sandbox()
    opts = [f"--gpu-architecture=compute_{arch}", "--std=c++17", *options]
    if include_dir is not None:
        opts.append(f"--include-path={include_dir}")
    with tempfile.TemporaryDirectory(prefix="gh_nvrtc_") as tmp:
        Path(tmp, "kernel.cu").write_text(source)
        result = sandbox.run([sys.executable, "-c", _NVRTC_SCRIPT, name, *opts],
                             scratch=Path(tmp), limits=NVRTC_LIMITS,
                             allow_exec=False, hide=secret_dirs(),
                             expose=runtime_paths())
        if result.timed_out or result.killed_by_limit:
            raise IsolationError(
                f"NVRTC on {name} stopped at the sandbox's "
                f"{result.killed_by_limit or 'wall'} limit "
                f"({NVRTC_LIMITS.wall_seconds:.0f} s wall, "
                f"{NVRTC_LIMITS.cpu_seconds} s CPU)")
        if result.returncode == 3:
            raise CompileError(f"NVRTC failed on {name} for compute_{arch}:\n"
                               + result.stderr.decode(errors="replace"))
        if result.returncode != 0:
            raise IsolationError(f"NVRTC child on {name} exited with "
                                 f"{sandbox.exit_status(result.returncode)}: "
                                 + _first_line(
                                     result.stderr.decode(errors="replace")))
        return Path(tmp, "kernel.ptx").read_text()


def ptxas_resources_isolated(ptx: str, arch: int) -> dict[str, dict[str, int]] | None:
    """:func:`lib.codegen.nvrtc.ptxas_resources` of untrusted PTX, with nvcc
    (and the ptxas it runs) in the sandbox; None when nvcc is not on PATH.

    Raises:
        CompileError: ptxas refused the PTX (its log).
        IsolationError: no sandbox, or ptxas hit :data:`NVRTC_LIMITS`.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    require_sandbox()
    with tempfile.TemporaryDirectory(prefix="gh_ptxas_") as tmp:
        Path(tmp, "kernel.ptx").write_text(ptx)
        argv = ptxas_argv(nvcc, f"{sandbox.SCRATCH}/kernel.ptx",
                          f"{sandbox.SCRATCH}/kernel.cubin", arch)
        result = sandbox.run(argv, scratch=Path(tmp), limits=NVRTC_LIMITS,
                             allow_exec=True, hide=secret_dirs(),
                             expose=runtime_paths())
    if result.timed_out or result.killed_by_limit:
        raise IsolationError(f"ptxas stopped at the sandbox's "
                             f"{result.killed_by_limit or 'wall'} limit")
    out = result.stdout.decode(errors="replace") \
        + result.stderr.decode(errors="replace")
    if result.returncode != 0:
        raise CompileError(f"ptxas failed for sm_{arch}:\n{out}")
    return parse_ptxas_usage(out)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return ((errors or lines or ["(no message)"])[0])[:240]
