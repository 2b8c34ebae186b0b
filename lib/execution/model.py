"""The model backend: the time comes from the cost model, Eq. (1).

It uses the machine's calibrated parameters once ``gpuhive calibrate`` has saved
them (see :mod:`lib.costmodel.calibrate`), the uncalibrated defaults before.

Nothing runs on a device. The figures are PREDICTED. When asked to verify, the
backend still computes the result shard by shard with NumPy and merges it, so
the sharding and merging the decision implies are checked against the reference
even where no device exists.
"""

from __future__ import annotations

from lib.contract import Decision, TaskSpec
from lib.costmodel import CostParams, predict
from lib.costmodel.parameters import params_for
from lib.execution.base import ExecutionMetrics, Result
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import split_rows, verify_in_blocks, workload


class ModelBackend:
    """Predicts ``T(d)`` with :func:`lib.costmodel.predict`."""

    name = "model"
    measured = False

    def __init__(self, machine: Machine, telemetry: Snapshot | None = None,
                 params: CostParams | None = None, seed: int = 0):
        self.machine = machine
        self.telemetry = telemetry
        self.params = params or params_for(machine.name)
        self.seed = seed

    def run(self, task: TaskSpec, decision: Decision, *,
            verify: bool = False) -> Result:
        """Predict the decision's time; compute and verify the result if asked."""
        pred = predict(task, decision, self.machine, self.telemetry, self.params)
        output, ok, err = None, None, None
        if verify:
            output, ok, err = host_compute_and_verify(task, decision, self.seed)
        metrics = ExecutionMetrics(
            backend=self.name, measured=False,
            per_device_seconds={d.device: d.total for d in pred.devices},
            total_seconds=pred.total, verified=ok, max_abs_error=err)
        return Result(output=output, metrics=metrics, task=task, decision=decision,
                      detail={"prediction": pred})

    def close(self) -> None:
        """Nothing to release."""


def host_compute_and_verify(task: TaskSpec, decision: Decision, seed: int = 0):
    """Compute the decision's shards with NumPy, merge, compare with the reference.

    Returns:
        ``(output, verified, max_abs_error)``.
    """
    w = workload(task)
    inputs = w.make_inputs(task, seed)
    partials = [w.compute(task, w.shard_inputs(task, inputs, lo, hi), lo, hi)
                for lo, hi in split_rows(task.split_size, decision.shares)
                if hi > lo]
    output = w.merge(task, partials)
    ok, err = verify_in_blocks(task, output, inputs=inputs)
    return output, ok, err
