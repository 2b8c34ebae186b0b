"""Live device state: one snapshot per decision.

A :class:`Snapshot` holds, per device, utilisation, free memory and health
(plus clocks, temperature and power where the source has them). Policies read it
through :func:`lib.contract.encode_state`; Gate 1 refuses unhealthy devices and
shards that do not fit in free memory; the cost model slows a busy device down
by ``1 / (1 - utilisation)``.

Sources:

- :func:`idle` -- every device idle, all memory free (the default);
- :func:`busy` -- chosen utilisations (for experiments and tests);
- :class:`SimulatedTelemetry` -- seeded background load that comes and goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lib.machines import Machine

#: Utilisation is clipped here so a busy device is slow, never infinitely so.
MAX_UTILISATION = 0.95


@dataclass(frozen=True)
class Snapshot:
    """Device state at one instant.

    Attributes:
        source: where it came from (``"idle"``, ``"simulated"``, ``"nvml"``...).
        utilisation: per device, fraction of time busy with other work, [0, 1].
        free_bytes: per device, free memory in bytes.
        healthy: per device, whether it may be used.
        clocks_mhz, temperature_c, power_w: per device where known, else empty.
        measured: whether the numbers were read from real devices.
    """

    source: str
    utilisation: tuple[float, ...]
    free_bytes: tuple[float, ...]
    healthy: tuple[bool, ...]
    clocks_mhz: tuple[float, ...] = field(default_factory=tuple)
    temperature_c: tuple[float, ...] = field(default_factory=tuple)
    power_w: tuple[float, ...] = field(default_factory=tuple)
    measured: bool = False

    def slowdown(self, i: int) -> float:
        """Factor by which device ``i``'s compute stretches: ``1 / (1 - u)``."""
        return 1.0 / (1.0 - min(self.utilisation[i], MAX_UTILISATION))


def idle(machine: Machine) -> Snapshot:
    """Every device idle and healthy with all its memory free."""
    n = machine.n
    return Snapshot(source="idle", utilisation=(0.0,) * n,
                    free_bytes=tuple(d.mem_bytes for d in machine.devices),
                    healthy=(True,) * n)


def busy(machine: Machine, utilisation: Sequence[float],
         healthy: Sequence[bool] | None = None) -> Snapshot:
    """A snapshot with the given per-device utilisation (memory all free)."""
    if len(utilisation) != machine.n:
        raise ValueError(f"utilisation has {len(utilisation)} entries; machine "
                         f"{machine.name} has {machine.n} devices")
    return Snapshot(
        source="busy", utilisation=tuple(float(u) for u in utilisation),
        free_bytes=tuple(d.mem_bytes for d in machine.devices),
        healthy=tuple(healthy) if healthy is not None else (True,) * machine.n)


class SimulatedTelemetry:
    """Seeded background load: each device flips between idle and busy spells.

    Each call to :meth:`step` advances time by one decision. A device is busy
    with probability ``p_busy`` in steady state; a busy spell has a utilisation
    drawn from ``[0.3, 0.9]`` and lasts a geometric number of steps with mean
    ``mean_spell``. Busy devices also hold some memory.
    """

    def __init__(self, machine: Machine, seed: int = 0, p_busy: float = 0.3,
                 mean_spell: float = 5.0):
        self.machine = machine
        self.rng = np.random.default_rng(seed)
        self.p_busy = p_busy
        self.p_end = 1.0 / mean_spell
        self.p_start = self.p_end * p_busy / max(1e-9, 1.0 - p_busy)
        self.util = np.zeros(machine.n)

    def step(self) -> Snapshot:
        """Advance one step and return the snapshot."""
        n = self.machine.n
        busy_now = self.util > 0
        end = busy_now & (self.rng.random(n) < self.p_end)
        start = ~busy_now & (self.rng.random(n) < self.p_start)
        self.util[end] = 0.0
        self.util[start] = self.rng.uniform(0.3, 0.9, size=int(start.sum()))
        mem = np.array([d.mem_bytes for d in self.machine.devices])
        return Snapshot(source="simulated", utilisation=tuple(self.util.tolist()),
                        free_bytes=tuple((mem * (1.0 - 0.3 * self.util)).tolist()),
                        healthy=(True,) * n)
