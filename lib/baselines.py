"""Baseline policies: the defaults a learned policy has to beat.

Every policy answers ``decide(task, machine, telemetry) -> Decision`` (hash not
yet computed; :class:`lib.runtime.Agent` adds it and passes Gate 1), so every
baseline drives the same execution path as the learned policy.

- :class:`EqualSplit` -- every device the same share, whatever it is
  (cuPyNumeric/Legate's even tiling, plain Dask chunking).
- :class:`ProportionalToPeak` -- shares proportional to a static capability:
  peak FLOP/s for compute-bound kinds, memory bandwidth for memory-bound ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from lib.contract import Decision, TaskSpec
from lib.machines import Machine
from lib.telemetry import Snapshot
from lib.workloads import workload

DEFAULT_BLOCK = 256


class Policy(Protocol):
    """What every policy, learned or not, provides."""

    name: str

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision: ...


def usable_devices(machine: Machine, telemetry: Snapshot | None) -> list[int]:
    """Indices of devices that are healthy per telemetry (all without it)."""
    if telemetry is None:
        return list(range(machine.n))
    return [i for i in range(machine.n) if telemetry.healthy[i]]


def decision_from_weights(task: TaskSpec, devices: Sequence[int],
                          weights: Sequence[float], *, block: int = DEFAULT_BLOCK,
                          comm_path: str = "host") -> Decision:
    """A split decision over ``devices`` with shares proportional to ``weights``.

    Devices with zero weight are dropped; one device left gives ``single`` mode.
    """
    pairs = [(d, w) for d, w in zip(devices, weights, strict=True) if w > 0]
    if not pairs:
        raise ValueError(f"no device has a positive weight for {task.describe()}")
    total = math.fsum(w for _, w in pairs)
    shares = [w / total for _, w in pairs]
    shares[-1] = 1.0 - math.fsum(shares[:-1])  # exact sum for Gate 1
    mode = "single" if len(pairs) == 1 else "split"
    return Decision(gpus=tuple(d for d, _ in pairs), shares=tuple(shares),
                    chunk=task.split_size, block=block, mode=mode,
                    comm_path=comm_path)


class EqualSplit:
    """Equal shares over every usable device."""

    name = "equal"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        devices = usable_devices(machine, telemetry)
        return decision_from_weights(task, devices, [1.0] * len(devices))


class ProportionalToPeak:
    """Shares proportional to peak FLOP/s (compute-bound) or bandwidth (memory)."""

    name = "proportional-peak"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        devices = usable_devices(machine, telemetry)
        if workload(task).bound == "compute":
            weights = [machine.devices[i].peak_flops(task.dtype) for i in devices]
        else:
            weights = [machine.devices[i].mem_bw for i in devices]
        return decision_from_weights(task, devices, weights)


BASELINES: dict[str, type] = {p.name: p for p in (EqualSplit, ProportionalToPeak)}


def get_policy(name: str) -> Policy:
    """A baseline policy by name."""
    if name not in BASELINES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(BASELINES)}")
    return BASELINES[name]()
