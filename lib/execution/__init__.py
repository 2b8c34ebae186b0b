"""The execution plane: four backends behind one interface.

``get_backend(name, machine) -> backend``; ``backend.run(task, decision,
verify=False) -> Result``. ``model`` predicts (PREDICTED), ``cpu`` runs real
worker processes on this computer's cores (MEASURED), ``cuda`` runs on GPUs
(MEASURED) where a CUDA stack exists, ``dask`` runs on the workers of a Dask
cluster (MEASURED; machines ``dask://HOST:PORT`` and ``dask-local:N``).
"""

from __future__ import annotations

from typing import Any

from lib.contract import BACKENDS
from lib.execution.base import (
    Backend,
    BackendUnavailable,
    DeviceError,
    ExecutionError,
    ExecutionMetrics,
    Result,
)
from lib.execution.cpu import CpuBackend
from lib.execution.cuda import CudaBackend
from lib.execution.dask import DaskBackend
from lib.execution.model import ModelBackend
from lib.platform.machines import Machine

__all__ = [
    "BACKENDS", "Backend", "BackendUnavailable", "CpuBackend", "CudaBackend",
    "DaskBackend", "DeviceError", "ExecutionError", "ExecutionMetrics",
    "ModelBackend", "Result", "get_backend",
]


def get_backend(name: str, machine: Machine, **options: Any) -> Backend:
    """The backend called ``name`` for ``machine``.

    Raises:
        ValueError: unknown name.
        BackendUnavailable: the backend cannot run here (the message says why).
    """
    if name == "model":
        return ModelBackend(machine, **options)
    if name == "cpu":
        return CpuBackend(machine, **options)
    if name == "cuda":
        return CudaBackend(machine, **options)
    if name == "dask":
        return DaskBackend(machine, **options)
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
