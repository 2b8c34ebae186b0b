"""Stage 1a: imitating the exact optimum on the cost model.

Tasks drawn as stage 1b draws them (every curriculum stage's machines, task
sizes and loads, then the target machine mixed with the catalog) are labelled
with :func:`lib.policies.oracle.optimum`'s decision, turned into the
environment's action (shares on the device slots; block, mode, path and
chunk-count indices), and the set policy fits them
(:meth:`SetPPOAgent.imitation_update`: cross-entropy on the shares, a hinge
that pushes every device the optimum leaves out below a share it drops,
cross-entropy on each head; the critic regresses the optimum's reward
``log(T_eq / T_opt)``). A head's label counts only where it matters: the
chunk count where the optimum pipelines, the path where partial results add
up. The labels are drawn once and reused for every step. Only the set PPO
learner imitates: the labels fit its heads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from lib.env import SplitEnv
from lib.learners.setppo import SetPPOAgent
from lib.platform.machines import Machine
from lib.policies.actions import action_from_decision
from lib.policies.learned import HEAD_MASKS, HEADS, ObservationEncoder
from lib.policies.oracle import optimum
from lib.training.config import TrainConfig
from lib.training.phases import Phase, plan_phases

_CHUNKS, _PATH = HEADS.index("chunks"), HEADS.index("comm_path")


def can_imitate(learner: Any) -> bool:
    """Whether ``learner`` has the heads stage 1a fits (a :class:`SetPPOAgent`)."""
    return isinstance(learner, SetPPOAgent)


def _label_counts(phases: list[Phase], total: int) -> list[int]:
    """``total`` labels over ``phases`` in proportion to their steps (at least
    one each when ``total`` allows)."""
    steps = np.array([p.steps for p in phases], dtype=np.float64)
    raw = total * steps / steps.sum()
    counts = np.maximum(np.floor(raw), 1 if total >= len(phases) else 0)
    counts = counts.astype(int)
    for i in np.argsort(-(raw - np.floor(raw))):
        if counts.sum() >= total:
            break
        counts[i] += 1
    return counts.tolist()


def imitation_labels(config: TrainConfig, machine: Machine, count: int,
                     progress: bool = False) -> dict[str, Any]:
    """The optimum's decisions on ``count`` tasks of stage 1, as a
    behaviour-cloning batch for :meth:`SetPPOAgent.imitation_update`.

    Tasks come from the environments of each part of stage 1, ``count`` split
    in proportion to the parts' steps, from seeds of their own (a mixture
    part cycles through its environments). Each label is
    :func:`lib.policies.oracle.optimum` (a few ms a task) turned into the
    environment's action by :func:`lib.policies.actions.action_from_decision`:
    the shares on their device slots, the block, mode and path indices, and
    the pipelined chunk count snapped to the nearest of :data:`CHUNKS` (log
    scale).

    Returns:
        ``obs`` ``(N, TASK_FEATURES + S DEVICE_FEATURES)`` (``S`` the most
        devices of any labelled machine), ``device_mask`` ``(N, S)`` bool,
        ``discrete_masks`` (one ``(N, size)`` bool array per head, or None
        where unmasked), ``shares`` ``(N, S)`` (the optimum's, zeros where it
        leaves a device out), ``choices`` ``(N, 4)`` int64,
        ``choice_weights`` ``(N, 4)`` and ``returns`` ``(N,)``, the
        optimum's reward ``log(T_eq / T_opt)``.
    """
    phases = plan_phases(replace(config, stages=("cost-model",)), machine)
    enc = ObservationEncoder(config.features, config.use_mask)
    rows: list[tuple] = []
    counts = _label_counts(phases, count)
    bar = tqdm(total=sum(counts), desc="cost-model/imitation labels",
               disable=not progress, leave=False)
    for index, (phase, n) in enumerate(zip(phases, counts, strict=True)):
        if n == 0:
            continue
        configs = phase.config if isinstance(phase.config, tuple) \
            else (phase.config,)
        envs = [SplitEnv(c) for c in configs]
        try:
            seed = np.random.SeedSequence((config.seed, 0x1A, index))
            for j, env in enumerate(envs):
                env.reset(seed=int(seed.generate_state(1)[0]) + j)
            for i in range(n):
                env = envs[i % len(envs)]
                obs = env._observation()
                best = optimum(env.task, env.machine, env.telemetry,
                               env.config.params).decision
                _, reward, _, _, info = env.step_decision(best)
                if not info["accepted"]:
                    raise RuntimeError(f"Gate 1 refused the optimum for "
                                       f"{info['task'].describe()}: "
                                       f"{info['gate1']}")
                rows.append(_label(env, obs, best, reward))
                env.reset()
                bar.update(1)
        finally:
            for env in envs:
                env.close()
    bar.close()
    width = max(r[0]["devices"].shape[0] for r in rows)
    batch_obs = {k: np.stack([_fit(r[0][k], width) if k in ("devices",
                                                            "device_mask")
                              else r[0][k] for r in rows])
                 for k in rows[0][0]}
    task = batch_obs["task"].astype(np.float64) * enc.keep_task
    dev = batch_obs["devices"].astype(np.float64) * enc.keep_device
    masks = [None if k is None or not config.use_mask
             else batch_obs[k] != 0 for k in HEAD_MASKS]
    return {"obs": np.concatenate([task, dev.reshape(len(rows), -1)], axis=1),
            "device_mask": batch_obs["device_mask"] != 0,
            "discrete_masks": masks,
            "shares": np.stack([_fit(r[1], width) for r in rows]),
            "choices": np.array([r[2] for r in rows], dtype=np.int64),
            "choice_weights": np.array([r[3] for r in rows]),
            "returns": np.array([r[4] for r in rows])}


def _fit(a: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` device slots of ``a`` (zero-padded)."""
    if a.shape[0] >= width:
        return a[:width]
    pad = [(0, width - a.shape[0])] + [(0, 0)] * (a.ndim - 1)
    return np.pad(a, pad)


def _label(env: SplitEnv, obs: Mapping[str, np.ndarray], best: Any,
           reward: float) -> tuple:
    """One label: the observation trimmed to the machine's devices, the
    optimum's shares per slot, head choices, head weights and reward."""
    n = env.machine.n
    trimmed = {k: (v[:n] if k in ("devices", "device_mask") else v)
               for k, v in obs.items()}
    action = action_from_decision(env.task, best, slots=n)
    choices = [int(action[h]) for h in HEADS]
    weights = [1.0] * len(HEADS)
    if best.mode != "pipelined":
        weights[_CHUNKS] = 0.0  # the chunk count means nothing here
    if env.task.merge != "sum" or len(best.gpus) < 2:
        weights[_PATH] = 0.0  # the decoder takes the host path anyway
    return trimmed, np.asarray(action["shares"]), choices, weights, reward


def imitate(agent: SetPPOAgent, labels: Mapping[str, Any], config: TrainConfig,
            steps: int, curve: list[dict[str, float]],
            progress: bool = False) -> None:
    """Stage 1a: ``steps`` behaviour-cloning steps of ``agent`` on ``labels``.

    The step size decays linearly from ``config.imitation_lr`` to
    ``config.lr_final``. A curve row every ``max(1, steps // 50)`` steps.

    Raises:
        TypeError: ``agent`` is not a :class:`SetPPOAgent` (:func:`can_imitate`).
    """
    if not can_imitate(agent):
        raise TypeError(f"imitation fits the set PPO learner's heads; "
                        f"{type(agent).__name__} has none")
    every = max(1, steps // 50)
    bar = tqdm(total=steps, desc="cost-model/imitation", disable=not progress,
               leave=False)
    done = 0
    t0 = time.perf_counter()
    while done < steps:
        n = min(every, steps - done)
        # The step size only (not anneal): imitation has no entropy bonus.
        agent.optimizer.config.lr = config.imitation_lr + (
            config.lr_final - config.imitation_lr) * done / max(1, steps)
        stats = agent.imitation_update(dict(labels), n, config.imitation_batch)
        done += n
        curve.append({"step": done, "labels": len(labels["returns"]),
                      "seconds": time.perf_counter() - t0,
                      **{k: float(v) for k, v in stats.items()}})
        bar.update(n)
        bar.set_postfix(loss=f"{stats['loss']:.3f}")
    bar.close()


def save_labels(path: Path, labels: Mapping[str, Any]) -> None:
    """Write an imitation batch to ``path`` (``.npz``; the per-head masks as
    ``mask<h>``), so a resumed run keeps its demonstrations."""
    arrays = {k: np.asarray(v) for k, v in labels.items()
              if k != "discrete_masks" and v is not None}
    for h, m in enumerate(labels.get("discrete_masks") or []):
        if m is not None:
            arrays[f"mask{h}"] = np.asarray(m)
    tmp = path.with_suffix(".tmp.npz")
    with tmp.open("wb") as fh:
        np.savez(fh, **arrays)
    tmp.replace(path)


def load_labels(path: Path) -> dict[str, Any]:
    """Read what :func:`save_labels` wrote."""
    with np.load(path, allow_pickle=False) as npz:
        out: dict[str, Any] = {k: npz[k] for k in npz.files
                               if not k.startswith("mask")}
        masks = [npz[f"mask{h}"] if f"mask{h}" in npz.files else None
                 for h in range(len(HEADS))]
    out["discrete_masks"] = masks if any(m is not None for m in masks) else None
    return out
