"""The learned policy's observation: a fixed-length vector of (task, machine,
telemetry), documented entry by entry in :data:`STATE_FIELDS`.

Part of the policy, not of the contract: the contract is what every policy and
backend exchange (:class:`~lib.contract.TaskSpec`, :class:`~lib.contract.Decision`);
this is what one family of policies looks at. :data:`STATE_VERSION` is written
into every policy file, so a file trained on another layout is refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lib.contract import DTYPES, KINDS, ContractError, TaskSpec

#: Device slots in the state vector; machines with more devices are refused.
STATE_DEVICES = 8
STATE_VERSION = 1

_TASK_FIELDS: list[tuple[str, str]] = (
    [(f"task.kind.{k}", f"1 if kind is {k}, else 0") for k in KINDS]
    + [(f"task.dtype.{d}", f"1 if dtype is {d}, else 0") for d in DTYPES]
    + [(f"task.log2_dim{i}", f"log2 of the kind's dimension {i} / 32 (0 if the "
                             f"kind has fewer)") for i in range(3)]
    + [("task.log2_split", "log2 of the divisible dimension's size / 32")]
)
_DEVICE_FIELDS: list[tuple[str, str]] = [
    ("present", "1 if the slot holds a device of the machine, else 0"),
    ("log_peak", "log10(peak FLOP/s for the task's dtype) - 12, /3"),
    ("log_mem_bw", "log10(memory bandwidth in B/s) - 11, /2"),
    ("log_mem", "log10(memory in bytes) - 10, /2"),
    ("log_host_bw", "log10(host link bandwidth in B/s) - 10, /2"),
    ("peak_frac", "peak FLOP/s over the machine's sum"),
    ("bw_frac", "memory bandwidth over the machine's sum"),
    ("peer_frac", "fraction of other devices reachable peer-to-peer"),
    ("util", "live utilisation in [0, 1] (0 without telemetry)"),
    ("free_frac", "free memory over total memory (1 without telemetry)"),
    ("healthy", "1 if healthy per telemetry (1 without telemetry)"),
]

#: Every entry of the state vector, ``(name, meaning)``, in order.
STATE_FIELDS: tuple[tuple[str, str], ...] = tuple(
    _TASK_FIELDS
    + [(f"dev{i}.{name}", text) for i in range(STATE_DEVICES)
       for name, text in _DEVICE_FIELDS]
)
STATE_DIM = len(STATE_FIELDS)
TASK_FEATURES = len(_TASK_FIELDS)
DEVICE_FEATURES = len(_DEVICE_FIELDS)


def encode_task(task: TaskSpec, out: np.ndarray) -> None:
    """Write the task's entries of the state (the first :data:`TASK_FEATURES`
    of :func:`encode_state`) into ``out``, a zeroed float32 array at least that
    long. The rest of the state depends on the machine and telemetry only
    (and on ``task.dtype``), so a caller may reuse it between tasks."""
    out[KINDS.index(task.kind)] = 1.0
    out[len(KINDS) + DTYPES.index(task.dtype)] = 1.0
    base = len(KINDS) + len(DTYPES)
    for i, size in enumerate(task.dims.values()):
        out[base + i] = math.log2(size) / 32.0
    out[base + 3] = math.log2(task.split_size) / 32.0


def encode_state(task: TaskSpec, machine: Any, telemetry: Any = None) -> np.ndarray:
    """Fixed-length feature vector of (task, machine, telemetry) for policies.

    Args:
        task: the task.
        machine: a :class:`lib.platform.machines.Machine` (duck-typed: ``devices`` with
            ``peak_flops(dtype)``, ``mem_bw``, ``mem_bytes``; ``host_link(i)``
            with ``bandwidth``; ``peer(i, j)`` returning a link or ``None``).
        telemetry: optional snapshot with per-device sequences ``utilisation``,
            ``free_bytes`` and ``healthy``.

    Returns:
        float32 array of shape ``(STATE_DIM,)``; :data:`STATE_FIELDS` names each
        entry. Values are scaled to roughly [-1, 2].
    """
    n = len(machine.devices)
    if n > STATE_DEVICES:
        raise ContractError("machine", f"{n} devices exceed the state's "
                                       f"{STATE_DEVICES} device slots")
    x = np.zeros(STATE_DIM, dtype=np.float32)
    encode_task(task, x)

    peaks = [d.peak_flops(task.dtype) for d in machine.devices]
    bws = [d.mem_bw for d in machine.devices]
    for i, dev in enumerate(machine.devices):
        peers = sum(1 for j in range(n) if j != i and machine.peer(i, j) is not None)
        util, free_frac, healthy = 0.0, 1.0, 1.0
        if telemetry is not None:
            util = float(telemetry.utilisation[i])
            free_frac = float(telemetry.free_bytes[i]) / dev.mem_bytes
            healthy = 1.0 if telemetry.healthy[i] else 0.0
        o = TASK_FEATURES + i * DEVICE_FEATURES
        x[o:o + DEVICE_FEATURES] = (
            1.0,
            (math.log10(peaks[i]) - 12.0) / 3.0,
            (math.log10(bws[i]) - 11.0) / 2.0,
            (math.log10(dev.mem_bytes) - 10.0) / 2.0,
            (math.log10(machine.host_link(i).bandwidth) - 10.0) / 2.0,
            peaks[i] / sum(peaks),
            bws[i] / sum(bws),
            peers / (n - 1) if n > 1 else 0.0,
            util, free_frac, healthy,
        )
    return x
