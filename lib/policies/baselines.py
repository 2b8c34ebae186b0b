"""Baseline policies: the defaults a learned policy has to beat.

Every policy answers ``decide(task, machine, telemetry) -> Decision`` (hash not
yet computed; :class:`lib.runtime.Agent` adds it and passes Gate 1), so every
baseline drives the same execution path as the learned policy.

- :class:`EqualSplit` -- every device the same share, whatever it is
  (cuPyNumeric/Legate's even tiling, plain Dask chunking).
- :class:`ProportionalToPeak` -- shares proportional to a static capability:
  peak FLOP/s for compute-bound kinds, memory bandwidth for memory-bound ones.
- :class:`SingleBest` -- the whole task on the one device the cost model
  predicts fastest for it.
- :class:`ProportionalToLive` -- proportional to peak, scaled by each device's
  idle fraction ``1 - u`` from telemetry; unhealthy devices left out.
- :class:`HeftGreedy` -- StarPU dmda / HEFT: the task cut into chunks, each
  chunk in turn to the device whose expected finish time (free time + predicted
  compute + beta x predicted transfer) is earliest.
- :class:`RandomSplit` -- a seeded random subset with Dirichlet shares.

The seventh baseline, the exhaustive optimum under the cost model, is
:class:`lib.policies.oracle.Oracle` (it searches over these). The ones that
consult the cost model (single-best, HEFT and the optimum) use the machine's
calibrated parameters where ``gpuhive calibrate`` saved some
(:func:`lib.costmodel.parameters.params_for`), else the defaults.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from lib.contract import Decision, TaskSpec, decision_from_weights
from lib.costmodel import predict
from lib.costmodel.model import compute_seconds, transfer_seconds
from lib.costmodel.parameters import params_for
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import workload


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

class EqualSplit:
    """Equal shares over every usable device."""

    name = "equal"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        devices = usable_devices(machine, telemetry)
        return decision_from_weights(task, devices, [1.0] * len(devices),
                                     block=machine.block_for(devices))

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
        return decision_from_weights(task, devices, weights,
                                     block=machine.block_for(devices))

def _peak_weight(task: TaskSpec, machine: Machine, i: int) -> float:
    dev = machine.devices[i]
    return dev.peak_flops(task.dtype) if workload(task).bound == "compute" \
        else dev.mem_bw

class SingleBest:
    """The one device with the smallest predicted time for the task (under the
    machine's calibrated parameters where it has some)."""

    name = "single-best"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        devices = usable_devices(machine, telemetry)
        params = params_for(machine.name)
        times = {i: predict(task, decision_from_weights(
                     task, [i], [1.0], block=machine.block_for([i])), machine,
                     telemetry, params).total for i in devices}
        best = min(devices, key=lambda i: (times[i], i))
        return decision_from_weights(task, [best], [1.0],
                                     block=machine.block_for([best]))

class ProportionalToLive:
    """Proportional to peak throughput times the idle fraction ``1 - u``."""

    name = "proportional-live"

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        devices = usable_devices(machine, telemetry)
        idle = [1.0 - (telemetry.utilisation[i] if telemetry else 0.0)
                for i in devices]
        weights = [_peak_weight(task, machine, i) * max(f, 0.05)
                   for i, f in zip(devices, idle, strict=True)]
        return decision_from_weights(task, devices, weights,
                                     block=machine.block_for(devices))

class HeftGreedy:
    """StarPU dmda / HEFT-like greedy earliest finish on the cost model (the
    machine's calibrated parameters where it has some, as StarPU's dmda uses
    its calibrated performance models).

    Args:
        chunks: pieces the divisible dimension is cut into (more: finer shares).
        beta: weight of the predicted transfer time in the finish estimate.
    """

    name = "heft"

    def __init__(self, chunks: int = 64, beta: float = 1.0):
        self.chunks = chunks
        self.beta = beta

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        w = workload(task)
        devices = usable_devices(machine, telemetry)
        n = task.split_size
        pieces = max(1, min(self.chunks, n))
        size = -(-n // pieces)
        free = {i: 0.0 for i in devices}
        rows = {i: 0 for i in devices}
        left = n
        params = params_for(machine.name)
        while left > 0:
            r = min(size, left)
            best, best_t = devices[0], math.inf
            for i in devices:
                link = machine.host_link(i)
                bandwidth = link.bandwidth * params.link_scale.get(
                    machine.devices[i].kind, 1.0)
                before = w.work(task, rows[i])
                after = w.work(task, rows[i] + r)
                t_comp = compute_seconds(task, after, machine, i, params,
                                         telemetry) - compute_seconds(
                    task, before, machine, i, params, telemetry)
                moved = after.bytes_in + after.bytes_out - before.bytes_in \
                    - before.bytes_out
                t_xfer = transfer_seconds(moved, bandwidth, link.latency)
                finish = free[i] + t_comp + self.beta * t_xfer
                if finish < best_t:
                    best, best_t = i, finish
            free[best] = best_t
            rows[best] += r
            left -= r
        return decision_from_weights(task, devices, [rows[i] for i in devices],
                                     block=machine.block_for(devices))

class RandomSplit:
    """A seeded random non-empty subset with Dirichlet(1) shares."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        devices = usable_devices(machine, telemetry)
        k = int(self.rng.integers(1, len(devices) + 1))
        chosen = sorted(self.rng.choice(devices, size=k, replace=False).tolist())
        return decision_from_weights(task, chosen,
                                     self.rng.dirichlet(np.ones(k)).tolist(),
                                     block=machine.block_for(chosen))

#: The cheap baselines by name. The seventh, the exhaustive optimum, is
#: :class:`lib.policies.oracle.Oracle`; :data:`lib.policies.registry.POLICIES`
#: lists all.
BASELINES: dict[str, type] = {p.name: p for p in (
    EqualSplit, SingleBest, ProportionalToPeak, ProportionalToLive, HeftGreedy,
    RandomSplit)}

