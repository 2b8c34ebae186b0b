"""What every backend returns, and the errors it raises.

Every backend answers ``run(task, decision, verify=False) -> Result``. The model
backend predicts; the cpu and cuda backends measure. :class:`ExecutionMetrics`
says which, so a modelled number is never mistaken for a measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lib.contract import Decision, TaskSpec
from lib.platform.hostinfo import available_memory_bytes
from lib.platform.machines import Machine
from lib.platform.workloads import compute_dtype, reference_block_bytes, workload


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (the message says why)."""


class ExecutionError(RuntimeError):
    """A run failed; no result is returned, partial or otherwise."""


class DeviceError(ExecutionError):
    """One device failed on its shard.

    Attributes:
        device: device index in the machine profile.
        shard: position of the shard in the decision.
        config_hash: the decision's hash.
    """

    def __init__(self, device: int, label: str, shard: int, rows: tuple[int, int],
                 config_hash: str, reason: str):
        self.device, self.shard, self.config_hash = device, shard, config_hash
        super().__init__(
            f"device {label} failed on shard {shard} (rows {rows[0]}:{rows[1]}) of "
            f"decision {config_hash[:12] or '(unhashed)'}: {reason}")


#: What ``verify`` adds to a run's
#: :attr:`~lib.platform.workloads.Workload.host_footprints`, in footprints of
#: one block of the reference (:func:`~lib.platform.workloads.verify_in_blocks`:
#: the whole task where it is smaller than a block): the block's result and
#: temporaries. A stencil's reference keeps two grids and two temporaries of
#: its block; made whole, it took 3.2 footprints more than the run without
#: ``verify`` (MEASURED, stencil fp32 of 0.79 GB).
VERIFY_FOOTPRINTS = 3.25
#: The share of the available memory a run may plan to take; the rest is for
#: the workers' temporaries and the other processes.
HOST_MEMORY_SHARE = 0.9


class HostMemoryError(ExecutionError):
    """A run would need more of this computer's memory than is available."""


def host_scale(task: TaskSpec) -> float:
    """Bytes the host holds per byte of the task's footprint: 2 for fp16 and
    bf16 (bf16 is held as float32, and 16-bit values are computed in
    float32), 1 otherwise. MEASURED: a bf16 elementwise run held 3.6
    footprints, where the fp32 one held 2.3 (and the check allowed 2.5)."""
    return compute_dtype(task.dtype).itemsize / task.itemsize


def host_bytes_needed(task: TaskSpec, verify: bool = False) -> float:
    """Bytes of this computer's memory a run of ``task`` may hold at once:
    its kind's ``host_footprints`` whole-task footprints, and with ``verify``
    :data:`VERIFY_FOOTPRINTS` footprints of one block of the reference, all
    at :func:`host_scale` bytes per byte.

    MEASURED peaks of the cpu backend on local-cpu (MemAvailable sampled
    every 5 ms; every kind and dtype, footprints of 0.3 to 2.4 GB), in
    footprints at :func:`host_scale`: at most 2.3 without ``verify`` (3.0 for
    a bf16 stencil) and 3.1 with it (4.4 for a bf16 stencil); an fp32
    stencil's ``verify`` took 5.1 footprints before its reference was cut
    into blocks, 3.1 after. The allowance is 2.5 to 3.5 footprints without
    ``verify`` and up to 3.25 more with it."""
    w = workload(task)
    scale = host_scale(task)
    footprint = w.total_work(task).footprint
    need = footprint * w.host_footprints
    if verify:
        need += VERIFY_FOOTPRINTS * reference_block_bytes(task)
    return need * scale


def check_host_memory(task: TaskSpec, verify: bool = False,
                      available: float | None = None, backend: str = "cpu") -> None:
    """Refuse a run on ``backend`` that would take more than
    :data:`HOST_MEMORY_SHARE` of the available memory (``MemAvailable``),
    before it allocates anything:
    past it the kernel's out-of-memory killer ends a process, perhaps the
    user's notebook. Nothing is refused where the OS does not say.

    Raises:
        HostMemoryError: one line with both figures.
    """
    available = available_memory_bytes() if available is None else available
    need = host_bytes_needed(task, verify)
    if available is not None and need > HOST_MEMORY_SHARE * available:
        raise HostMemoryError(
            f"{backend} backend: {task.describe()} may need {need / 1e9:.1f} GB of "
            f"this computer's memory (its inputs and output, shared with the "
            f"workers, the result and the workers' temporaries"
            f"{'; with --verify also the reference' if verify else ''}), past "
            f"{HOST_MEMORY_SHARE:.0%} of the {available / 1e9:.1f} GB available: "
            "run a smaller task")



@dataclass(frozen=True)
class ExecutionMetrics:
    """How long a run took and whether its result is right.

    Attributes:
        backend: ``"model"``, ``"cpu"`` or ``"cuda"``.
        measured: True for wall-clock measurements, False for predictions.
        per_device_seconds: device index -> seconds that device spent on its shard.
        total_seconds: end-to-end seconds (dispatch to merged result).
        verified: True/False after comparing with the NumPy reference; None when
            verification was not asked for.
        max_abs_error: largest absolute difference from the reference (None if
            not verified).
        repeats: timed repeats behind the figures (medians when > 1).
        per_device_cpu_seconds: device index -> CPU seconds its worker spent
            on its shard (the cpu backend; empty elsewhere). Over
            ``per_device_seconds`` it is the share of the core the shard got.
        per_device_overhead_seconds: device index -> seconds from the job's
            dispatch to its result's arrival that were not the device's own
            time on the shard: waking its worker, handing the job over and
            the result back (the cpu backend; empty elsewhere).
    """

    backend: str
    measured: bool
    per_device_seconds: dict[int, float]
    total_seconds: float
    verified: bool | None = None
    max_abs_error: float | None = None
    repeats: int = 1
    per_device_cpu_seconds: dict[int, float] = field(default_factory=dict)
    per_device_overhead_seconds: dict[int, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``"MEASURED (cpu)"`` or ``"PREDICTED (model)"``."""
        return f"{'MEASURED' if self.measured else 'PREDICTED'} ({self.backend})"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "backend": self.backend,
                "measured": self.measured,
                "per_device_seconds": {str(k): v for k, v in
                                       self.per_device_seconds.items()},
                "total_seconds": self.total_seconds, "verified": self.verified,
                "max_abs_error": self.max_abs_error, "repeats": self.repeats,
                "per_device_cpu_seconds": {str(k): v for k, v in
                                           self.per_device_cpu_seconds.items()},
                "per_device_overhead_seconds": {
                    str(k): v for k, v in self.per_device_overhead_seconds.items()}}


@dataclass
class Result:
    """The outcome of one run.

    Attributes:
        output: the merged result (None when a model run was not asked to verify).
        metrics: timings and verification.
        task, decision: what ran.
        detail: backend-specific extras (the model's per-device breakdown...).
    """

    output: np.ndarray | None
    metrics: ExecutionMetrics
    task: TaskSpec
    decision: Decision
    detail: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """An execution backend: the only thing that turns a Decision into a Result.

    A backend that cannot run on every device of its machine says which it
    can with a ``runnable`` tuple of device indices (the cuda backend: those
    with a CUDA ordinal), and may say why not with ``unrunnable_why(device)``;
    the agent then decides over those only, and Gate 1's refusal of another
    names the reason.
    """

    name: str
    measured: bool

    def run(self, task: TaskSpec, decision: Decision, *,
            verify: bool = False) -> Result: ...

    def close(self) -> None: ...


def run_key(backend: Any, task: TaskSpec, decision: Decision) -> Any:
    """What ``backend`` executes for ``decision``: two decisions with the same
    key run the same work the same way there, so one's runs are the other's.
    A backend says so with a ``run_key(task, decision)`` method (the cpu
    backend: which device gets which rows, since its workers ignore the
    mode, chunk, block and path); otherwise the decision's hash, which
    covers every field."""
    own = getattr(backend, "run_key", None)
    return own(task, decision) if own is not None else decision.config_hash


def repeat_timed(once: Callable[[], tuple[Any, dict[int, float], float]],
                 warmup: int, repeats: int
                 ) -> tuple[Any, dict[int, list[float]], list[float]]:
    """Run ``once`` ``warmup`` times untimed, then ``repeats`` times timed.

    ``once()`` returns ``(result, per-device seconds, total seconds)``; the
    backend measures the total itself, so it decides what belongs to the run.

    Returns:
        ``(last result, device -> seconds of each timed run, totals)``.
    """
    per_dev: dict[int, list[float]] = {}
    totals: list[float] = []
    result = None
    for rep in range(warmup + repeats):
        result, times, total = once()
        if rep >= warmup:
            totals.append(total)
            for g, t in times.items():
                per_dev.setdefault(g, []).append(t)
    return result, per_dev, totals


def replan(decision: Decision, failed: int) -> Decision:
    """The decision without device ``failed``, shares renormalised (unhashed)."""
    left = decision.without(failed)
    if left is None:
        raise ExecutionError(f"no device left after device {failed} failed")
    return left


def check_devices(decision: Decision, machine: Machine) -> None:
    """ExecutionError naming the first device of ``decision`` that ``machine``
    does not have (a backend's first check, before anything is staged)."""
    for g in decision.gpus:
        if not 0 <= g < machine.n:
            raise ExecutionError(f"device {g} does not exist on {machine.name}")
