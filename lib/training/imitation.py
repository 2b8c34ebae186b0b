"""Stage 1a: imitating the exhaustive optimum on the cost model.

Tasks drawn as stage 1b draws them are labelled with
:func:`lib.policies.oracle.optimum`'s decision, turned into the environment's
action (shares on the device slots; block, mode, path and chunk-count
indices), and the PPO policy maximises their log-likelihood
(:meth:`PPOAgent.imitation_update`; the critic regresses the optimum's reward
``log(T_eq / T_opt)``). The labels are drawn once and reused for every step.
Only PPO imitates: the labels fit its Dirichlet and categorical heads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from lib.env import SplitEnv
from lib.learners.ppo import PPOAgent, interior_shares
from lib.platform.machines import Machine
from lib.policies.actions import action_from_decision
from lib.policies.learned import HEAD_MASKS, HEAD_SIZES, HEADS, ObservationEncoder
from lib.policies.observation import STATE_DEVICES
from lib.policies.oracle import optimum
from lib.training.config import TrainConfig
from lib.training.phases import Phase, plan_phases


def can_imitate(learner: Any) -> bool:
    """Whether ``learner`` has the heads stage 1a fits (a :class:`PPOAgent`)."""
    return isinstance(learner, PPOAgent)


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
    """The exhaustive optimum's decisions on ``count`` tasks of stage 1, as a
    behaviour-cloning batch for :meth:`PPOAgent.imitation_update`.

    Tasks come from the environment of each part of stage 1 (the curriculum
    stages' machines, task sizes and load, then the target ``machine``; the
    target only with ``config.curriculum=False``), ``count`` split in
    proportion to the parts' steps, from seeds of their own. Each label is
    :func:`lib.policies.oracle.optimum` (about 10 ms a task) turned into the
    environment's action by :func:`lib.policies.actions.action_from_decision`: the
    shares on their device slots, the block, mode and path indices, and the
    pipelined chunk count snapped to the nearest of :data:`CHUNKS` (log scale).

    Returns:
        ``obs`` ``(N, OBS_DIM)``, ``device_mask`` ``(N, 8)`` bool,
        ``discrete_masks`` (one ``(N, size)`` bool array per head, or None
        without masks), ``shares`` ``(N, 8)`` (the optimum's, moved inside the
        simplex by :func:`interior_shares` with ``config.imitation_eps``),
        ``choices`` ``(N, 4)`` int64 and ``returns`` ``(N,)``, the optimum's
        reward ``log(T_eq / T_opt)``.
    """
    phases = plan_phases(replace(config, stages=("cost-model",)), machine)
    enc = ObservationEncoder(config.features, config.use_mask)
    rows: dict[str, list] = {k: [] for k in ("obs", "device_mask", "masks",
                                             "shares", "choices", "returns")}
    counts = _label_counts(phases, count)
    bar = tqdm(total=sum(counts), desc="cost-model/imitation labels",
               disable=not progress, leave=False)
    for index, (phase, n) in enumerate(zip(phases, counts, strict=True)):
        if n == 0:
            continue
        env = SplitEnv(replace(phase.config, episode_len=n + 1))
        try:
            seed = np.random.SeedSequence((config.seed, 0x1A, index))
            obs, _ = env.reset(seed=int(seed.generate_state(1)[0]))
            for _ in range(n):
                best = optimum(env.task, env.machine, env.telemetry,
                               env.config.params).decision
                action = action_from_decision(env.task, best)
                dmask, cmasks = enc.masks(obs)
                rows["obs"].append(enc.flat(obs))
                rows["device_mask"].append(np.ones(STATE_DEVICES, dtype=bool)
                                           if dmask is None else dmask)
                rows["masks"].append(cmasks)
                rows["shares"].append(np.asarray(action["shares"], np.float64))
                rows["choices"].append([int(action[h]) for h in HEADS])
                obs, reward, _, _, info = env.step_decision(best)
                if not info["accepted"]:
                    raise RuntimeError(f"Gate 1 refused the optimum for "
                                       f"{info['task'].describe()}: "
                                       f"{info['gate1']}")
                rows["returns"].append(reward)
                bar.update(1)
        finally:
            env.close()
    bar.close()
    dm = np.array(rows["device_mask"])
    masks = None if not config.use_mask else [
        None if HEAD_MASKS[h] is None else np.array([m[h] for m in rows["masks"]])
        for h in range(len(HEAD_SIZES))]
    return {"obs": np.array(rows["obs"]), "device_mask": dm,
            "discrete_masks": masks,
            "shares": interior_shares(np.array(rows["shares"]), dm,
                                      config.imitation_eps),
            "choices": np.array(rows["choices"], dtype=np.int64),
            "returns": np.array(rows["returns"])}


def imitate(agent: PPOAgent, labels: Mapping[str, Any], config: TrainConfig,
            steps: int, curve: list[dict[str, float]],
            progress: bool = False) -> None:
    """Stage 1a: ``steps`` behaviour-cloning steps of ``agent`` on ``labels``.

    The labels' observations are merged into the agent's running statistics
    first; the step size decays linearly from ``config.lr`` to
    ``config.lr_final``. A curve row every ``max(1, steps // 50)`` steps.

    Raises:
        TypeError: ``agent`` is not a :class:`PPOAgent` (:func:`can_imitate`).
    """
    if not can_imitate(agent):
        raise TypeError(f"imitation fits a PPO learner's Dirichlet and "
                        f"categorical heads; {type(agent).__name__} has none")
    if agent.config.normalize_obs:
        agent.obs_rms.update(labels["obs"])
    every = max(1, steps // 50)
    bar = tqdm(total=steps, desc="cost-model/imitation", disable=not progress,
               leave=False)
    done = 0
    t0 = time.perf_counter()
    while done < steps:
        n = min(every, steps - done)
        # The step size only (not PPOAgent.anneal): imitation has no entropy
        # bonus to schedule.
        agent.optimizer.config.lr = config.lr + (config.lr_final - config.lr) \
            * done / max(1, steps)
        stats = agent.imitation_update(dict(labels), n)
        done += n
        curve.append({"step": done, "labels": len(labels["returns"]),
                      "seconds": time.perf_counter() - t0,
                      **{k: float(v) for k, v in stats.items()}})
        bar.update(n)
        bar.set_postfix(nll=f"{stats['nll']:.2f}")
    bar.close()
