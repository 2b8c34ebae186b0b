"""What the split environment shows a policy, what it accepts, and the masks.

Observation, a ``spaces.Dict`` (slot ``i`` of every per-device key is device
``i`` of the machine; slots past the machine's devices are zero):

=============  ======================================  ===========================
key            space                                   meaning
=============  ======================================  ===========================
task           Box(-8, 8, (TASK_FEATURES,), f32)       the task row
devices        Box(-8, 8, (64, DEVICE_FEATURES), f32)  a row per device slot
device_mask    MultiBinary(64), int8                   slot holds a usable device
mode_mask      MultiBinary(3), int8                    :data:`~lib.contract.MODES`
path_mask      MultiBinary(3), int8                    ``COMM_PATHS`` allowed
block_mask     MultiBinary(len(BLOCKS)), int8          block sizes allowed
=============  ======================================  ===========================

(:mod:`lib.policies.observation` documents the rows; 64 is
:data:`~lib.contract.MAX_DEVICES`.) A device is *usable* when telemetry marks it
healthy and it can hold at least one row of the task in its free memory.

Action, a ``spaces.Dict``:

=========  ==========================  ==========================================
key        space                       meaning
=========  ==========================  ==========================================
shares     Box(0, 1, (64,), f32)       relative weight per device slot
block      Discrete(len(BLOCKS))       CUDA threads per block, ``BLOCKS[i]``
mode       Discrete(3)                 ``MODES[i]``
comm_path  Discrete(3)                 ``COMM_PATHS[i]``
chunks     Discrete(len(CHUNKS))       pipelined: chunks per largest shard
=========  ==========================  ==========================================

Masks. The observation's masks allow, with ``k`` usable devices: ``single`` and
``pipelined`` always, ``split`` with ``k >= 2``; ``host`` always, ``p2p`` for
``sum`` merges with ``k >= 2`` and a peer-to-peer link between two usable
devices, ``nccl`` for ``sum`` merges with ``k >= 2`` on a machine with NCCL;
the blocks every usable device can launch. Which devices a decision uses is
known only once the shares are, so :class:`Decoder` completes the masks when it
turns an action into a decision, and makes a Gate 1 refusal impossible
wherever the rule is local:

- weights of unusable slots count as zero, negative weights as zero, ``single``
  keeps the largest weight only, weights below ``min_share`` of the total are
  dropped (so an all-ones action over the usable devices *is* the equal split);
- memory per shard: a share over what its device can hold (Gate 1's margin,
  less one row for rounding) is capped there and the excess goes to the other
  chosen devices in proportion (then to the other usable ones);
- one device means the host path (and ``single`` unless ``pipelined``);
  ``nccl`` needs two or more devices and a machine that has it; ``p2p`` only
  when every pair of the chosen devices has a peer-to-peer link; a ``concat``
  merge lands each shard in place, so its path is ``host``. A path the chosen
  devices cannot take becomes ``host``;
- the block is at most every chosen device's limit.

An action with no positive finite weight, or a non-finite weight on a usable
device, becomes a decision with no devices, and an out-of-range index a value
Gate 1 refuses: those are not local rules a mask can keep, they are malformed
actions. In pipelined mode the chunk is ``ceil(largest shard's rows /
CHUNKS[i])``; in the other modes it is the whole divisible dimension.

Why one module: the spaces, the masks and the decoder state one vocabulary and
one set of rules (Gate 1's local ones, mirrored); the environment, the policy
and the optimum's labels must read them identically, so they are read
together.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from lib.contract import (
    BLOCKS,
    COMM_PATHS,
    DEFAULT_BLOCK,
    MODES,
    Decision,
    TaskSpec,
    normalised_shares,
)
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import split_sizes, whole_work, workload
from lib.policies.observation import (
    DEVICE_FEATURES,
    STATE_MAX_DEVICES,
    TASK_FEATURES,
    MachineView,
    encode_state,
)
from lib.security.gate1 import MEMORY_MARGIN

#: Chunks per largest shard in pipelined mode: the grid the learned policy
#: chooses from (the optimum searches these and more).
CHUNKS: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: Device slots of the observation and the action (the contract's bound).
SLOTS = STATE_MAX_DEVICES
#: Bounds of the ``task`` and ``devices`` boxes; the encoding scales to a few units.
STATE_BOUND = 8.0
#: Observation keys (:func:`flatten_observation` concatenates them in order).
OBS_KEYS = ("task", "devices", "device_mask", "mode_mask", "path_mask",
            "block_mask")

SINGLE, SPLIT, PIPELINED = (MODES.index(m) for m in ("single", "split", "pipelined"))
HOST, P2P, NCCL = (COMM_PATHS.index(p) for p in ("host", "p2p", "nccl"))


def observation_space() -> spaces.Dict:
    """The observation space (see the module docstring for each key)."""
    return spaces.Dict({
        "task": spaces.Box(-STATE_BOUND, STATE_BOUND, (TASK_FEATURES,), np.float32),
        "devices": spaces.Box(-STATE_BOUND, STATE_BOUND, (SLOTS, DEVICE_FEATURES),
                              np.float32),
        "device_mask": spaces.MultiBinary(SLOTS),
        "mode_mask": spaces.MultiBinary(len(MODES)),
        "path_mask": spaces.MultiBinary(len(COMM_PATHS)),
        "block_mask": spaces.MultiBinary(len(BLOCKS)),
    })


def action_space() -> spaces.Dict:
    """The action space (see the module docstring for each key)."""
    return spaces.Dict({
        "shares": spaces.Box(0.0, 1.0, (SLOTS,), np.float32),
        "block": spaces.Discrete(len(BLOCKS)),
        "mode": spaces.Discrete(len(MODES)),
        "comm_path": spaces.Discrete(len(COMM_PATHS)),
        "chunks": spaces.Discrete(len(CHUNKS)),
    })


def _memory_rows(task: TaskSpec, free: float) -> float:
    """Most rows a device with ``free`` bytes can hold under Gate 1's margin."""
    w = workload(task)
    f1, f2 = w.work(task, 1).footprint, w.work(task, 2).footprint
    slope, base = f2 - f1, f1 - (f2 - f1)
    room = free * (1.0 - MEMORY_MARGIN) - base
    if room < slope:
        return 0.0
    return float(task.split_size) if slope <= 0 else min(
        float(task.split_size), math.floor(room / slope))


class Decoder:
    """Actions into decisions for one machine under one telemetry snapshot,
    with the masks of the module docstring.

    Args:
        machine: the machine.
        telemetry: its state (None: idle, every device healthy).
        min_share: weights below this fraction of the total are dropped.
    """

    def __init__(self, machine: Machine, telemetry: Snapshot | None = None,
                 min_share: float = 1e-3) -> None:
        self.machine, self.telemetry = machine, telemetry
        self.min_share = float(min_share)
        n = machine.n
        self.n = n
        self.healthy = [telemetry is None or bool(telemetry.healthy[i])
                        for i in range(n)]
        self.free = [float(telemetry.free_bytes[i]) if telemetry is not None
                     else machine.devices[i].mem_bytes for i in range(n)]
        self.max_block = [machine.devices[i].max_block for i in range(n)]
        self.nccl = bool(machine.nccl)
        self.p2p = frozenset((a, b) for a, b in itertools.combinations(range(n), 2)
                             if (link := machine.peer(a, b)) is not None
                             and link.p2p)
        #: Gate 1's room per device, and the least over the healthy ones
        #: (None where that is empty or not a number: then compare each).
        self._room = [f * (1.0 - MEMORY_MARGIN) for f in self.free]
        healthy_room = [r for r, h in zip(self._room, self.healthy, strict=True)
                        if h]
        self._least_room = min(healthy_room) if healthy_room and not any(
            r != r for r in healthy_room) else None
        self._caps: tuple[TaskSpec, list[float] | None] | None = None
        self._allowed: dict[str, Any] = {}

    def caps(self, task: TaskSpec, footprint: float | None = None
             ) -> list[float] | None:
        """Rows each device can hold, or None where the whole task fits on
        every healthy device (the common case: no cap binds).
        ``footprint``: the whole task's, where the caller has it."""
        if self._caps is not None and self._caps[0] is task:
            return self._caps[1]
        whole = whole_work(task).footprint if footprint is None else footprint
        if self._least_room is not None:
            binds = whole > self._least_room
        else:
            binds = any(whole > r for r, h in zip(self._room, self.healthy,
                                                   strict=True) if h)
        caps = [_memory_rows(task, f) for f in self.free] if binds else None
        self._caps = (task, caps)
        return caps

    def usable(self, task: TaskSpec) -> list[bool]:
        """Per device: healthy and able to hold at least one row of ``task``
        (a list the caller must not change)."""
        caps = self.caps(task)
        if caps is None:
            return self.healthy
        return [h and c >= 1 for h, c in zip(self.healthy, caps, strict=True)]

    def allowed(self, task: TaskSpec, footprint: float | None = None
                ) -> tuple[list[bool], tuple[list[bool], list[bool], list[bool]]]:
        """:meth:`masks` as lists of bools for one decision: the usable
        devices and the allowed blocks, modes and paths (lists the caller
        must not change; kept per merge while no memory cap binds).
        ``footprint``: the whole task's, where the caller has it."""
        caps = self.caps(task, footprint)
        key = task.merge
        if caps is None and key in self._allowed:
            return self._allowed[key]
        m = self.masks(task, self.n)
        out = ([bool(u) for u in m["device_mask"]],
               tuple([bool(x) for x in m[k]] for k in ("block_mask", "mode_mask",
                                                        "path_mask")))
        if caps is None:
            self._allowed[key] = out
        return out

    def masks(self, task: TaskSpec, slots: int = SLOTS) -> dict[str, np.ndarray]:
        """The observation's four masks (int8; ``slots`` device slots)."""
        usable = self.usable(task)
        devices = [i for i, u in enumerate(usable) if u]
        multi = len(devices) >= 2
        dmask = np.zeros(slots, dtype=np.int8)
        dmask[devices] = 1
        path = np.array([1, 0, 0], dtype=np.int8)
        if task.merge == "sum" and multi:
            chosen = set(devices)
            path[P2P] = any(a in chosen and b in chosen for a, b in self.p2p)
            path[NCCL] = self.nccl
        limit = min((self.max_block[i] for i in devices), default=0)
        return {"device_mask": dmask,
                "mode_mask": np.array([1, multi, 1], dtype=np.int8),
                "path_mask": path,
                "block_mask": np.array([b <= limit for b in BLOCKS], dtype=np.int8)}

    def decide(self, task: TaskSpec, weights: Sequence[float], block: int,
               mode: int, comm_path: int, chunks: int, *,
               hashed: bool = True) -> Decision:
        """The decision an action stands for, the masks applied.

        Args:
            task: the task decided.
            weights: raw share weight per device slot (at least ``machine.n``;
                slot ``i`` is device ``i``).
            block, mode, comm_path, chunks: the heads' indices.
            hashed: compute ``config_hash`` (else it is empty).
        """
        n = self.n
        usable = self.usable(task)
        w = project_share_row(weights[:n], usable, mode, self.min_share)
        chosen = [i for i in range(n) if w[i] > 0]
        caps = self.caps(task)
        if caps is not None and chosen:
            w = _cap_shares(w, chosen, caps, usable, task.split_size)
            chosen = [i for i in range(n) if w[i] > 0]
        if len(chosen) <= 1 or task.merge == "concat":
            comm_path = HOST if 0 <= comm_path < len(COMM_PATHS) else comm_path
        elif comm_path == NCCL and not self.nccl:
            comm_path = HOST
        elif comm_path == P2P and not all(
                pair in self.p2p for pair in itertools.combinations(chosen, 2)):
            comm_path = HOST
        if 0 <= block < len(BLOCKS) and chosen:
            limit = min(self.max_block[i] for i in chosen)
            while block > 0 and BLOCKS[block] > limit:
                block -= 1
        return decision_from_weights_row(task, w, block, mode, comm_path, chunks,
                                         hashed=hashed)


def _cap_shares(w: list[float], chosen: list[int], caps: Sequence[float],
                usable: Sequence[bool], n: int) -> list[float]:
    """Water-fill: shares over what their device holds (less one row, for the
    rounding of :func:`split_rows`) are capped and the excess spread over the
    other chosen devices in proportion to their shares, then over the other
    usable devices in proportion to their room. Returns the shares (summing
    to 1 unless even the usable devices together cannot hold the task)."""
    total = math.fsum(w[i] for i in chosen)
    share = [0.0] * len(w)
    for i in chosen:
        share[i] = w[i] / total
    limit = [1.0 if c >= n else max(0.0, c - 1.0) / n for c in caps]
    everyone = [i for i in range(len(w)) if usable[i]]
    for pool, by_share in ((chosen, True), (everyone, False)):
        for _ in range(len(w) + 1):
            share = [min(s, lim) for s, lim in zip(share, limit, strict=True)]
            missing = 1.0 - math.fsum(share)
            if missing <= 1e-15:
                return share
            room = [i for i in pool if share[i] < limit[i] - 1e-15
                    and (share[i] > 0 or not by_share)]
            if not room:
                break
            weights = [share[i] if by_share else limit[i] - share[i] for i in room]
            scale = missing / math.fsum(weights)
            for i, wt in zip(room, weights, strict=True):
                share[i] += wt * scale
    return share


def project_shares(shares: np.ndarray, device_mask: np.ndarray, mode: np.ndarray,
                   min_share: float) -> np.ndarray:
    """Weights the decision keeps, for a batch of actions at once.

    Args:
        shares: ``(N, S)`` raw share weights from the policy.
        device_mask: ``(N, S)`` usable slots (nonzero = usable).
        mode: ``(N,)`` mode indices (``single`` keeps only the largest weight).
        min_share: weights below this fraction of the row's total are dropped
            (typically 1e-3 to 1e-2).

    Returns:
        ``(N, S)`` float64 non-negative weights; an all-zero row means the
        action names no device (or put a non-finite weight on a usable one).
    """
    s = np.asarray(shares, dtype=np.float64)
    usable = np.asarray(device_mask) != 0
    finite = np.isfinite(s)
    w = np.where(usable & finite, np.maximum(s, 0.0), 0.0)
    rows = np.arange(w.shape[0])
    top = np.argmax(w, axis=1)
    only_top = np.zeros_like(w)
    only_top[rows, top] = w[rows, top]
    w = np.where((np.asarray(mode) == SINGLE)[:, None], only_top, w)
    total = w.sum(axis=1, keepdims=True)
    frac = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    w = np.where(frac >= min_share, w, 0.0)
    w[(usable & ~finite).any(axis=1)] = 0.0
    return w


def project_share_row(shares: Sequence[float], device_mask: Sequence[Any],
                      mode: int, min_share: float) -> list[float]:
    """One row of :func:`project_shares`, bit for bit, without the batch
    machinery (a decision for one observation).

    Args:
        shares: raw share weights (floats or a float array).
        device_mask: usable slots (nonzero = usable), as long as ``shares``.
        mode: the mode index.
        min_share: as in :func:`project_shares`.

    Returns:
        The kept weights as floats (all zero: no device).
    """
    w = [0.0] * len(shares)
    for i, (s, usable) in enumerate(zip(shares, device_mask, strict=True)):
        if usable:
            s = float(s)
            if not math.isfinite(s):
                return [0.0] * len(shares)
            w[i] = s if s > 0.0 else 0.0  # np.maximum(s, 0.0)
    if mode == SINGLE:
        top = max(range(len(w)), key=w.__getitem__)  # first maximum, as argmax
        w = [v if i == top else 0.0 for i, v in enumerate(w)]
    # Any sum of the weights is within a few ulps of numpy's pairwise one
    # (the batch path's), so it settles every weight not within 1e-9 of the
    # min_share boundary; numpy's sum settles the rest.
    total = sum(w)
    if 0.0 < total < math.inf:
        band = 1e-9 * min_share
        out = []
        for v in w:
            frac = v / total
            if -band <= frac - min_share <= band:
                break
            out.append(v if frac >= min_share else 0.0)
        else:
            return out
    total = float(np.add.reduce(np.array(w)))
    if total > 0:
        return [v if v / total >= min_share else 0.0 for v in w]
    return [v if 0.0 >= min_share else 0.0 for v in w]


def decision_from_weights_row(task: TaskSpec, weights: Sequence[float], block: int,
                              mode: int, comm_path: int, chunks: int, *,
                              hashed: bool = True) -> Decision:
    """One projected action row as a :class:`Decision` (not yet gated), hashed
    unless ``hashed=False`` (then ``config_hash`` is empty). No mask is
    applied here beyond the ``concat`` merge's host path (:class:`Decoder`
    applies them).

    Out-of-range indices become values Gate 1 refuses (block 0, an unknown
    mode or path) rather than exceptions: the gate, not the environment, says
    what is wrong with a malformed action.
    """
    block_v = BLOCKS[block] if 0 <= block < len(BLOCKS) else 0
    mode_v = MODES[mode] if 0 <= mode < len(MODES) else f"mode#{mode}"
    path_v = COMM_PATHS[comm_path] if 0 <= comm_path < len(COMM_PATHS) \
        else f"path#{comm_path}"
    if task.merge == "concat":
        path_v = "host"  # the merge lands in place: the path does not matter
    w = weights.tolist() if isinstance(weights, np.ndarray) else list(weights)
    gpus = [i for i, v in enumerate(w) if v > 0]
    if not gpus:
        decision = Decision(gpus=(), shares=(), chunk=task.split_size,
                            block=block_v, mode=mode_v, comm_path=path_v)
        return decision.with_hash(task) if hashed else decision
    # decision_from_weights, built once whatever the mode
    shares = normalised_shares([float(w[i]) for i in gpus])
    chunk = task.split_size
    if mode_v == "pipelined":
        rows = max(split_sizes(chunk, shares))
        count = CHUNKS[chunks] if 0 <= chunks < len(CHUNKS) else 0
        chunk = max(1, math.ceil(rows / count)) if count else 0
    elif mode_v in MODES:
        mode_v = "single" if len(gpus) == 1 else "split"
    decision = Decision(tuple(gpus), tuple(shares), chunk, block_v, mode_v, path_v)
    return decision.with_hash(task) if hashed else decision


def observe(task: TaskSpec, machine: Machine, telemetry: Snapshot | None = None,
            seen: Snapshot | None = None, decoder: Decoder | None = None
            ) -> dict[str, np.ndarray]:
    """The observation of ``task`` on ``machine`` (module docstring).

    Args:
        seen: the snapshot the state shows, where it differs from the one the
            masks follow (stream mode shows the backlog as utilisation).
        decoder: the machine's :class:`Decoder` under ``telemetry``.
    """
    decoder = decoder or Decoder(machine, telemetry)
    m = decoder.masks(task)
    state = encode_state(task, machine, seen if seen is not None else telemetry,
                         MachineView(machine, seen if seen is not None
                                     else telemetry, task.dtype))
    devices = np.zeros((SLOTS, DEVICE_FEATURES), dtype=np.float32)
    devices[list(state.index)] = np.clip(state.devices, -STATE_BOUND, STATE_BOUND)
    return {"task": np.clip(state.task, -STATE_BOUND, STATE_BOUND).astype(
                np.float32), "devices": devices, **m}


def masks(task: TaskSpec, machine: Machine,
          telemetry: Snapshot | None) -> dict[str, np.ndarray]:
    """The four masks of the observation, int8 arrays (module docstring)."""
    return Decoder(machine, telemetry).masks(task)


def decision_from_action(action: Mapping[str, Any], task: TaskSpec,
                         machine: Machine, telemetry: Snapshot | None = None,
                         min_share: float = 1e-3) -> Decision:
    """The hashed decision an action stands for (module docstring)."""
    shares = np.asarray(action["shares"], dtype=np.float64).reshape(-1)
    if shares.size < machine.n:
        raise ValueError(f"action shares: {shares.size} entries for "
                         f"{machine.n} devices")
    return Decoder(machine, telemetry, min_share).decide(
        task, shares, int(action["block"]), int(action["mode"]),
        int(action["comm_path"]), int(action["chunks"]))


def action_from_decision(task: TaskSpec, decision: Decision,
                         slots: int = SLOTS) -> dict[str, Any]:
    """An action that stands for ``decision`` (for baselines and the optimum).

    Shares go to their slots as float64; block and chunk count snap to the
    nearest choice (on a log scale); a path other than ``host`` on a ``concat``
    task is kept (the decoder ignores it there).
    """
    shares = np.zeros(slots)
    for g, s in zip(decision.gpus, decision.shares, strict=True):
        shares[g] = s
    log_blocks = np.log2(BLOCKS)
    block = int(np.argmin(np.abs(log_blocks - math.log2(max(1, decision.block)))))
    chunks = 0
    if decision.mode == "pipelined":
        rows = max(split_sizes(task.split_size, decision.shares))
        count = math.ceil(rows / max(1, decision.chunk))
        chunks = int(np.argmin(np.abs(np.log2(CHUNKS) - math.log2(count))))
    return {"shares": shares, "block": block, "mode": MODES.index(decision.mode),
            "comm_path": COMM_PATHS.index(decision.comm_path), "chunks": chunks}


def equal_split_action(obs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The action that is exactly the equal split over the usable devices."""
    return {"shares": np.asarray(obs["device_mask"], dtype=np.float32),
            "block": BLOCKS.index(DEFAULT_BLOCK), "mode": SPLIT,
            "comm_path": HOST, "chunks": 0}


def sample_masked_actions(rng: np.random.Generator,
                          obs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Uniformly random actions that respect a batch of observations' masks
    (leading axis N on every key of ``obs`` and of the result)."""
    def pick(mask: np.ndarray) -> np.ndarray:
        return np.argmax(rng.random(mask.shape) * mask, axis=-1)

    device_mask = np.asarray(obs["device_mask"])
    return {"shares": (rng.random(device_mask.shape) * device_mask).astype(
                np.float32),
            "block": pick(obs["block_mask"]), "mode": pick(obs["mode_mask"]),
            "comm_path": pick(obs["path_mask"]),
            "chunks": rng.integers(len(CHUNKS), size=device_mask.shape[0])}


def sample_masked_action(rng: np.random.Generator,
                         obs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """One uniformly random action that respects the observation's masks."""
    batch = sample_masked_actions(rng, {k: np.asarray(v)[None]
                                        for k, v in obs.items()})
    return {"shares": batch["shares"][0],
            **{k: int(v[0]) for k, v in batch.items() if k != "shares"}}


def flatten_observation(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """One float32 vector: the keys of :data:`OBS_KEYS` concatenated (the
    device rows flattened; leading batch axes are kept)."""
    parts = []
    for k in OBS_KEYS:
        a = np.asarray(obs[k], dtype=np.float32)
        if k == "devices":
            a = a.reshape(*a.shape[:-2], -1)
        parts.append(a)
    return np.concatenate(parts, axis=-1)


def unflatten_observation(flat: np.ndarray) -> dict[str, np.ndarray]:
    """The inverse of :func:`flatten_observation` (masks back to int8)."""
    out, start = {}, 0
    flat = np.asarray(flat)
    subspaces = observation_space().spaces
    for key in OBS_KEYS:
        shape = subspaces[key].shape
        size = int(np.prod(shape))
        part = flat[..., start:start + size].reshape(*flat.shape[:-1], *shape)
        out[key] = part.astype(np.int8 if key.endswith("mask") else np.float32)
        start += size
    if start != flat.shape[-1]:
        raise ValueError(f"flat observation: expected {start} entries, got "
                         f"{flat.shape[-1]}")
    return out
