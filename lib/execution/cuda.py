"""The cuda backend: CuPy on real GPUs (where a driver exists).

:func:`probe` reports, without raising, what this machine lacks for CUDA: the
CuPy package, a driver (``libcuda``), NVRTC and NCCL. The backend refuses to
start, with that reason in one line, wherever a piece is missing.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from lib.execution.base import BackendUnavailable
from lib.machines import Machine


@dataclass(frozen=True)
class CudaProbe:
    """What the CUDA stack on this machine provides.

    Attributes:
        cupy: CuPy imports.
        driver: a CUDA driver answered (device count > 0).
        devices: CUDA devices visible.
        nvrtc: NVRTC can compile (works without a driver).
        nccl: CuPy's NCCL binding imports.
        reasons: what is missing, one short phrase each.
    """

    cupy: bool
    driver: bool
    devices: int
    nvrtc: bool
    nccl: bool
    reasons: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return self.cupy and self.driver and self.devices > 0 and self.nvrtc


def probe() -> CudaProbe:
    """Check the CUDA stack; never raises (and keeps CuPy's warnings quiet)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _probe()


def _probe() -> CudaProbe:
    reasons: list[str] = []
    try:
        import cupy  # noqa: F401
        has_cupy = True
    except Exception as exc:  # ImportError, or a broken CUDA install
        has_cupy = False
        reasons.append(f"CuPy does not import ({type(exc).__name__}); "
                       "pip install 'gpuhive[gpu]'")
    driver, count = False, 0
    if has_cupy:
        try:
            from cupy.cuda import runtime
            count = runtime.getDeviceCount()
            driver = True
        except Exception as exc:
            reasons.append(f"no CUDA driver ({_short(exc)})")
    nvrtc = False
    if has_cupy:
        try:
            from cupy.cuda import nvrtc as _nvrtc
            _nvrtc.getVersion()
            nvrtc = True
        except Exception as exc:
            reasons.append(f"NVRTC unavailable ({_short(exc)}); "
                           "pip install nvidia-cuda-nvrtc-cu12")
    nccl = False
    if has_cupy:
        try:
            from cupy.cuda import nccl as _nccl  # noqa: F401
            nccl = bool(getattr(_nccl, "available", True))
            if not nccl:
                reasons.append("NCCL unavailable in this CuPy build")
        except Exception as exc:
            reasons.append(f"NCCL unavailable ({_short(exc)})")
    if driver and count == 0:
        reasons.append("the driver reports no CUDA device")
    return CudaProbe(cupy=has_cupy, driver=driver, devices=count, nvrtc=nvrtc,
                     nccl=nccl, reasons=tuple(reasons))


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:120]


class CudaBackend:
    """Runs decisions on CUDA devices through CuPy.

    The multi-device execution path (streams, pinned copies, NVRTC-compiled
    kernels, NCCL merges) is not part of this release; on a machine with a
    working CUDA stack the constructor says so rather than pretend.
    """

    name = "cuda"
    measured = True

    def __init__(self, machine: Machine, **_: object):
        found = probe()
        if not found.usable:
            raise BackendUnavailable("cuda backend unavailable: "
                                     + "; ".join(found.reasons))
        raise BackendUnavailable("cuda backend: the CuPy execution path is not "
                                 "implemented yet; use --backend model or cpu")
