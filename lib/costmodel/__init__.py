"""The cost model, Eq. (1): predicted time of a decision on a machine.

See :mod:`lib.costmodel.model` for the equation and :class:`CostParams` for the
efficiencies and latencies that calibration fits.
"""

from lib.costmodel.model import (
    CostParams,
    DeviceTime,
    Prediction,
    default_params,
    predict,
)

__all__ = ["CostParams", "DeviceTime", "Prediction", "default_params", "predict"]
