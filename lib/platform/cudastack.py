"""What the CUDA stack on this machine provides, asked without raising.

The execution plane (the ``cuda`` backend), the code-gen plane (where to run a
numerical spot check) and ``gpuhive doctor`` all ask the same question; this is
the one place that answers it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class CudaProbe:
    """What the CUDA stack on this machine provides.

    Attributes:
        cupy: CuPy imports.
        driver: a CUDA driver answered.
        devices: CUDA devices visible.
        nvrtc: NVRTC can compile (works without a driver).
        nccl: CuPy's NCCL binding is usable.
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
            from cupy.cuda import nccl as _nccl
            nccl = bool(getattr(_nccl, "available", True))
            if not nccl:  # cupy/cuda/nccl.py: libnccl.so.2 did not load
                reasons.append("NCCL library not found by CuPy; pip install "
                               "'nvidia-nccl-cu12>=2.18.1,<3'")
        except Exception as exc:
            reasons.append(f"NCCL unavailable ({_short(exc)})")
    if driver and count == 0:
        reasons.append("the driver reports no CUDA device")
    return CudaProbe(cupy=has_cupy, driver=driver, devices=count, nvrtc=nvrtc,
                     nccl=nccl, reasons=tuple(reasons))


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:120]
