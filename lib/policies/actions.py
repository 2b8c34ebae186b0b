"""What the split environment shows a policy, what it accepts, and the masks.

Observation, a ``spaces.Dict`` (all arrays, one entry per key):

=============  ===============================  ====================================
key            space                            meaning
=============  ===============================  ====================================
state          Box(-8, 8, (STATE_DIM,), f32)    :func:`lib.contract.encode_state`
device_mask    MultiBinary(8), int8             slot holds a present, healthy device
mode_mask      MultiBinary(3), int8             :data:`~lib.contract.MODES` allowed
path_mask      MultiBinary(3), int8             :data:`~lib.contract.COMM_PATHS`
block_mask     MultiBinary(len(BLOCKS)), int8   block sizes every usable device takes
=============  ===============================  ====================================

Mask rules (``k`` usable devices: present and healthy):

- ``single`` is always allowed (the device with the largest share runs it all);
  ``split`` only with ``k >= 2``; ``pipelined`` always (with one device it
  overlaps copies and compute on that device, still a single-device action). So
  on ``uni-server-1gpu`` every multi-device action is masked out.
- ``host`` is always allowed; ``p2p`` only for ``sum`` merges with ``k >= 2`` and
  a peer-to-peer link between two usable devices; ``nccl`` only for ``sum``
  merges with ``k >= 2`` on a machine with NCCL. A ``concat`` merge lands each
  shard in place in the host buffer whatever the path, so for ``concat`` tasks
  only ``host`` is allowed and the environment sets it.
- The masks are necessary conditions, not sufficient ones: ``p2p`` over two
  devices without a peer link is still refused by Gate 1 (and penalised).

Action, a ``spaces.Dict``:

=========  ==========================  ==========================================
key        space                       meaning
=========  ==========================  ==========================================
shares     Box(0, 1, (8,), f32)        relative weight per device slot
block      Discrete(len(BLOCKS))       CUDA threads per block, ``BLOCKS[i]``
mode       Discrete(3)                 ``MODES[i]``
comm_path  Discrete(3)                 ``COMM_PATHS[i]``
chunks     Discrete(len(CHUNKS))       pipelined: chunks per largest shard
=========  ==========================  ==========================================

:func:`decision_from_action` turns an action into a :class:`Decision`: weights of
masked slots are forced to zero, negative weights count as zero, ``single`` keeps
the largest weight only, weights below ``min_share`` of the total are dropped and
the rest normalised (:func:`lib.contract.decision_from_weights`, so an all-ones
action over the usable devices *is* the equal split). In pipelined mode the chunk
is ``ceil(largest shard's rows / CHUNKS[i])``; in the other modes it is the whole
divisible dimension. An action with no positive finite weight, or a non-finite
weight on a usable device, becomes a decision with no devices, which Gate 1
refuses. :func:`flatten_observation` and :func:`unflatten_observation` convert
to and from one float32 vector for policies that want a flat input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium import spaces

from lib.contract import (
    BLOCKS,
    COMM_PATHS,
    DEFAULT_BLOCK,
    MODES,
    PIPELINE_CHUNKS,
    Decision,
    TaskSpec,
    decision_from_weights,
)
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import split_rows
from lib.policies.observation import STATE_DEVICES, STATE_DIM

#: Chunks per largest shard in pipelined mode (the optimum's grid).
CHUNKS: tuple[int, ...] = PIPELINE_CHUNKS
#: Bounds of the ``state`` box; encode_state scales to roughly [-1, 2].
STATE_BOUND = 8.0
#: Observation keys in the order :func:`flatten_observation` concatenates them.
OBS_KEYS = ("state", "device_mask", "mode_mask", "path_mask", "block_mask")

SINGLE, SPLIT, PIPELINED = (MODES.index(m) for m in ("single", "split", "pipelined"))
HOST = COMM_PATHS.index("host")


def observation_space() -> spaces.Dict:
    """The observation space (see the module docstring for each key)."""
    return spaces.Dict({
        "state": spaces.Box(-STATE_BOUND, STATE_BOUND, (STATE_DIM,), np.float32),
        "device_mask": spaces.MultiBinary(STATE_DEVICES),
        "mode_mask": spaces.MultiBinary(len(MODES)),
        "path_mask": spaces.MultiBinary(len(COMM_PATHS)),
        "block_mask": spaces.MultiBinary(len(BLOCKS)),
    })


def action_space() -> spaces.Dict:
    """The action space (see the module docstring for each key)."""
    return spaces.Dict({
        "shares": spaces.Box(0.0, 1.0, (STATE_DEVICES,), np.float32),
        "block": spaces.Discrete(len(BLOCKS)),
        "mode": spaces.Discrete(len(MODES)),
        "comm_path": spaces.Discrete(len(COMM_PATHS)),
        "chunks": spaces.Discrete(len(CHUNKS)),
    })


def usable_mask(machine: Machine, telemetry: Snapshot | None) -> np.ndarray:
    """``(8,)`` bool: slot ``i`` holds a device that is present and healthy."""
    mask = np.zeros(STATE_DEVICES, dtype=bool)
    for i in range(machine.n):
        mask[i] = telemetry is None or bool(telemetry.healthy[i])
    return mask


def masks(task: TaskSpec, machine: Machine,
          telemetry: Snapshot | None) -> dict[str, np.ndarray]:
    """The four masks of the observation, int8 arrays (rules in the docstring)."""
    usable = usable_mask(machine, telemetry)
    devices = np.flatnonzero(usable).tolist()
    multi = len(devices) >= 2
    mode = np.array([1, multi, 1], dtype=np.int8)
    path = np.array([1, 0, 0], dtype=np.int8)
    if task.merge == "sum" and multi:
        path[COMM_PATHS.index("p2p")] = any(
            (link := machine.peer(a, b)) is not None and link.p2p
            for a in devices for b in devices if a < b)
        path[COMM_PATHS.index("nccl")] = machine.nccl
    limit = min(machine.devices[i].max_block for i in devices) if devices else 0
    block = np.array([b <= limit for b in BLOCKS], dtype=np.int8)
    return {"device_mask": usable.astype(np.int8), "mode_mask": mode,
            "path_mask": path, "block_mask": block}


def project_shares(shares: np.ndarray, device_mask: np.ndarray, mode: np.ndarray,
                   min_share: float) -> np.ndarray:
    """Weights the decision keeps, for a batch of actions at once.

    Args:
        shares: ``(N, 8)`` raw share weights from the policy.
        device_mask: ``(N, 8)`` usable slots (nonzero = usable).
        mode: ``(N,)`` mode indices (``single`` keeps only the largest weight).
        min_share: weights below this fraction of the row's total are dropped
            (typically 1e-3 to 1e-2).

    Returns:
        ``(N, 8)`` float64 non-negative weights; an all-zero row means the
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
    machinery (a decision for one observation: about 4 us instead of 25).

    Args:
        shares: ``(8,)`` raw share weights (floats or a float array).
        device_mask: ``(8,)`` usable slots (nonzero = usable).
        mode: the mode index.
        min_share: as in :func:`project_shares`.

    Returns:
        The 8 kept weights as floats (all zero: no device).
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
    # numpy's pairwise sum, so a weight on the min_share boundary falls the
    # same side as in the batch path
    total = float(np.add.reduce(np.array(w)))
    if total > 0:
        return [v if v / total >= min_share else 0.0 for v in w]
    return [v if 0.0 >= min_share else 0.0 for v in w]


def decision_from_weights_row(task: TaskSpec, weights: Sequence[float], block: int,
                              mode: int, comm_path: int, chunks: int, *,
                              hashed: bool = True) -> Decision:
    """One projected action row as a :class:`Decision` (not yet gated), hashed
    unless ``hashed=False`` (then ``config_hash`` is empty).

    Out-of-range indices become values Gate 1 refuses (block 0, an unknown
    mode or path) rather than exceptions: the gate, not the environment, says
    what is wrong with a policy's output.
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
    decision = decision_from_weights(task, gpus, [float(w[i]) for i in gpus],
                                     block=block_v, comm_path=path_v)
    if mode_v == "pipelined":
        rows = max(hi - lo for lo, hi in split_rows(task.split_size,
                                                    decision.shares))
        count = CHUNKS[chunks] if 0 <= chunks < len(CHUNKS) else 0
        chunk = max(1, math.ceil(rows / count)) if count else 0
        decision = replace(decision, mode="pipelined", chunk=chunk)
    elif mode_v not in MODES:
        decision = replace(decision, mode=mode_v)
    return decision.with_hash(task) if hashed else decision


def decision_from_action(action: Mapping[str, Any], task: TaskSpec,
                         device_mask: np.ndarray, min_share: float = 1e-3
                         ) -> Decision:
    """The hashed decision an action stands for (rules in the module docstring)."""
    shares = np.asarray(action["shares"], dtype=np.float64).reshape(1, -1)
    if shares.shape != (1, STATE_DEVICES):
        raise ValueError(f"action shares: expected {STATE_DEVICES} entries, got "
                         f"{shares.size}")
    mode = int(action["mode"])
    w = project_shares(shares, np.asarray(device_mask).reshape(1, -1),
                       np.array([mode]), min_share)
    return decision_from_weights_row(task, w[0], int(action["block"]), mode,
                                     int(action["comm_path"]), int(action["chunks"]))


def action_from_decision(task: TaskSpec, decision: Decision) -> dict[str, Any]:
    """An action that stands for ``decision`` (for baselines and the optimum).

    Shares go to their slots as float32; block and chunk count snap to the
    nearest choice (on a log scale); a path other than ``host`` on a ``concat``
    task is kept (the environment ignores it there).
    """
    shares = np.zeros(STATE_DEVICES, dtype=np.float32)
    for g, s in zip(decision.gpus, decision.shares, strict=True):
        shares[g] = s
    log_blocks = np.log2(BLOCKS)
    block = int(np.argmin(np.abs(log_blocks - math.log2(max(1, decision.block)))))
    chunks = 0
    if decision.mode == "pipelined":
        rows = max(hi - lo for lo, hi in split_rows(task.split_size,
                                                    decision.shares))
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
    """One float32 vector: the keys of :data:`OBS_KEYS` concatenated on the last
    axis (leading batch axes are kept)."""
    return np.concatenate([np.asarray(obs[k], dtype=np.float32) for k in OBS_KEYS],
                          axis=-1)


def unflatten_observation(flat: np.ndarray) -> dict[str, np.ndarray]:
    """The inverse of :func:`flatten_observation` (masks back to int8)."""
    out, start = {}, 0
    subspaces = observation_space().spaces
    for key in OBS_KEYS:
        size = int(np.prod(subspaces[key].shape))
        part = np.asarray(flat)[..., start:start + size]
        out[key] = part.astype(np.float32 if key == "state" else np.int8)
        start += size
    if start != np.asarray(flat).shape[-1]:
        raise ValueError(f"flat observation: expected {start} entries, got "
                         f"{np.asarray(flat).shape[-1]}")
    return out
