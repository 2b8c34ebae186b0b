"""Running a phase of the model stages: batched one-step rollouts and updates.

An iteration resets ``num_envs`` environments with the phase's seed for that
iteration, lets the learner act ``rollout`` times in each
(:meth:`TrainableLearner.explore`, :meth:`~TrainableLearner.record`), then
updates it once (:meth:`~TrainableLearner.learn`); the learner's schedules are
annealed linearly over the phase's iterations.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from tqdm.auto import tqdm

from lib.env import BatchModelEnv
from lib.learners import TrainableLearner
from lib.policies.learned import ObservationEncoder, action_from_choices
from lib.training.config import TrainConfig, TrainingPlan, encoder_for
from lib.training.phases import Phase, phase_iterations, stage_seed

#: Off-policy gradient steps per model-backend transition (model steps are
#: cheap, so each is replayed less than a measured one).
REPLAY_RATIO = 1 / 8


def rollout(learner: TrainableLearner, env: BatchModelEnv,
            enc: ObservationEncoder, obs: dict[str, np.ndarray], steps: int,
            rng: np.random.Generator, sigma: float) -> tuple[np.ndarray, int]:
    """``steps`` steps of every environment of ``env`` from ``obs``, recorded
    in ``learner``; rewards get Gaussian noise of std ``sigma`` from ``rng``.

    Returns:
        ``(rewards (steps * num_envs,), decisions Gate 1 refused)``.
    """
    rewards, refused = [], 0
    for _ in range(steps):
        x = enc.flat(obs)
        dmask, cmasks = enc.masks(obs)
        shares, choices = learner.explore(x, dmask, cmasks)
        obs, r, _, _, infos = env.step(action_from_choices(shares, choices))
        refused += sum(not i["accepted"] for i in infos)
        if sigma > 0:
            r = r + sigma * rng.standard_normal(r.shape)
        learner.record(r)
        rewards.append(r)
    return np.concatenate(rewards), refused


def run_phase(learner: TrainableLearner, phase: Phase, index: int,
              config: TrainConfig, start_it: int, curve: list[dict[str, float]],
              ckpt: Callable[[int, int], None],
              callback: Callable[[str, int, dict[str, float]], bool] | None,
              progress: bool, plan: TrainingPlan | None = None
              ) -> tuple[int, bool]:
    """Iterations ``start_it..`` of ``phase`` (the ``index``-th of the run).

    Args:
        learner: trained in place.
        phase: what to run; ``index`` seeds its iterations.
        config: seed, features, masks, schedules, checkpoint interval.
        start_it: first iteration (a resumed run's).
        curve: one row per iteration is appended.
        ckpt: ``ckpt(index, iterations done)`` writes a checkpoint.
        callback: ``callback(phase name, iterations done, row)``; True stops.
        progress: show a tqdm bar.
        plan: batch shape (default ``config.plan``).

    Returns:
        ``(iterations done, interrupted)``.
    """
    plan = plan or config.plan
    per_it = plan.num_envs * plan.rollout
    n_it = phase_iterations(phase, plan)
    enc = encoder_for(learner, config)
    env = BatchModelEnv(plan.num_envs, phase.config)
    bar = tqdm(total=n_it, initial=start_it, desc=f"{phase.stage}/{phase.name}",
               disable=not progress, leave=False)
    try:
        for it in range(start_it, n_it):
            s = stage_seed(config.seed, index, it)
            obs, _ = env.reset(seed=s)
            noise = np.random.default_rng(s + 1)
            learner.anneal(it / max(1, n_it - 1), config.lr, config.lr_final,
                           config.ent_coef)
            t0 = time.perf_counter()
            r, refused = rollout(learner, env, enc, obs, plan.rollout, noise,
                                 phase.reward_sigma)
            stats = learner.learn(REPLAY_RATIO)
            row = {"iteration": it, "env_steps": (it + 1) * per_it,
                   "phase": phase.name, "reward": float(r.mean()),
                   "refused": refused / len(r),
                   "seconds": time.perf_counter() - t0,
                   **{k: float(v) for k, v in stats.items()}}
            curve.append(row)
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}")
            done = it + 1
            stop = bool(callback and callback(phase.name, done, row))
            if stop or done % config.checkpoint_every == 0 or done == n_it:
                ckpt(index, done)
            if stop:
                return done, True
        return n_it, False
    finally:
        bar.close()
        env.close()
