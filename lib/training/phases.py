"""The model-backend parts of a run (stages 1 and 2) and their seeds.

A phase is a run of iterations on one environment setup: each curriculum stage
of stage 1, stage 1's last part on the target machine, and stage 2. Iteration
``k`` of phase ``i`` resets its environments with :func:`stage_seed` ``(seed,
i, k)``, so what an iteration sees depends only on the seed and the iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from lib.costmodel import default_params
from lib.costmodel.calibrate import load_params
from lib.env import DEFAULT_STAGES, Curriculum, EnvConfig
from lib.env.split import MODEL_LOG10_BYTES
from lib.platform.machines import Machine
from lib.training.config import TrainConfig, TrainingPlan


@dataclass
class Phase:
    """A run of iterations on one environment setup (part of a stage)."""

    name: str
    """Curves and checkpoints call it this (``"target:hetero-4"``...)."""
    stage: str
    """The stage it belongs to (``"cost-model"``, ``"calibrated"``...)."""
    steps: int
    """Environment steps it should take (rounded up to whole iterations)."""
    config: EnvConfig
    """The environments' setup (``episode_len`` is set per iteration)."""
    reward_sigma: float = 0.0
    """Std of the Gaussian noise added to every reward."""


def plan_phases(config: TrainConfig, machine: Machine) -> list[Phase]:
    """Stage 1 and 2 phases of the plan, in order (stage 3 is separate)."""
    plan = config.plan
    out: list[Phase] = []
    base = EnvConfig(penalty=config.penalty)
    if "cost-model" in config.stages:
        extra = 0
        if config.curriculum:
            stages = tuple(replace(s, steps=n) for s, n in
                           zip(DEFAULT_STAGES, plan.curriculum, strict=True))
            cur = Curriculum(stages=stages, seed=config.seed)
            for s in stages:
                out.append(Phase(s.name, "cost-model", s.steps,
                                 replace(base, curriculum=cur, stage=s.name)))
        else:
            extra = sum(plan.curriculum)
        out.append(Phase(f"target:{machine.name}", "cost-model",
                         plan.target + extra,
                         replace(base, machine=machine.name, p_busy=0.0,
                                 task_log10_bytes=MODEL_LOG10_BYTES,
                                 params=default_params())))
    if "calibrated" in config.stages:
        params = load_params(machine.name) or default_params()
        # Independent log-normal factors on the two predicted times of the
        # reward log(T_eq / T) add noise_sigma * (e_1 - e_2): std sigma * sqrt 2.
        out.append(Phase("calibrated", "calibrated", plan.calibrated,
                         replace(base, machine=machine.name, p_busy=0.0,
                                 task_log10_bytes=MODEL_LOG10_BYTES,
                                 params=params),
                         reward_sigma=config.noise_sigma * math.sqrt(2.0)))
    return out


def phase_iterations(phase: Phase, plan: TrainingPlan) -> int:
    """Iterations of ``phase`` under ``plan`` (``num_envs * rollout`` steps
    each; at least one)."""
    return max(1, math.ceil(phase.steps / (plan.num_envs * plan.rollout)))


def stage_seed(seed: int, phase: int, it: int) -> int:
    """The environment seed of iteration ``it`` of phase ``phase``."""
    return int(np.random.SeedSequence((seed, phase, it)).generate_state(1)[0])
