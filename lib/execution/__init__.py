"""The execution plane: four backends behind one interface.

``get_backend(name, machine) -> backend``; ``backend.run(task, decision,
verify=False) -> Result``. ``model`` predicts (PREDICTED), ``cpu`` runs real
worker processes on this computer's cores (MEASURED), ``cuda`` runs on GPUs
(MEASURED) where a CUDA stack exists, ``dask`` runs on the workers of a Dask
cluster (MEASURED; machines ``dask://HOST:PORT`` and ``dask-local:N``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lib.contract import BACKENDS
from lib.execution.base import (
    Backend,
    BackendUnavailable,
    DeviceError,
    ExecutionError,
    ExecutionMetrics,
    Result,
)
from lib.platform.machines import Machine

if TYPE_CHECKING:
    from lib.execution.cpu import CpuBackend
    from lib.execution.cuda import CudaBackend
    from lib.execution.dask import DaskBackend
    from lib.execution.model import ModelBackend

#: Each backend's class and the module that defines it, imported on first use
#: (``from lib.execution import CpuBackend`` works as ever). A cpu worker is a
#: fresh interpreter that imports this package before it takes a job, and the
#: CUDA and Dask backends' modules (code generation, the gates, the cluster
#: client) were more than half of that: importing the cpu backend took 0.47 s
#: with them and takes 0.20 s without (median of seven, MEASURED on
#: ``local-cpu``).
_BACKEND_MODULES = {"CpuBackend": "lib.execution.cpu",
                    "CudaBackend": "lib.execution.cuda",
                    "DaskBackend": "lib.execution.dask",
                    "ModelBackend": "lib.execution.model"}


def __getattr__(name: str) -> Any:
    module = _BACKEND_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


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
    classes = {"model": "ModelBackend", "cpu": "CpuBackend", "cuda": "CudaBackend",
               "dask": "DaskBackend"}
    if name in classes:
        return __getattr__(classes[name])(machine, **options)
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
