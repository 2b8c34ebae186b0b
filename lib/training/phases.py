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
    config: EnvConfig | tuple[EnvConfig, ...]
    """The environments' setup, or one per environment (cycled): a mixture."""
    reward_sigma: float = 0.0
    """Std of the Gaussian noise added to every reward."""


#: Background load on the target machine in stages 1 (last part) and 2:
#: devices busy 30 % of the time, half the machine's stretches idle
#: throughout (the policy serves it idle and busy).
TARGET_P_BUSY = 0.3
TARGET_P_IDLE = 0.5
#: Environments per mixture of the target phases (the target machine takes
#: ``round(target_mix * MIX_SLOTS)`` of every such group).
MIX_SLOTS = 8


def _mixture(target: EnvConfig, others: EnvConfig | None,
             fraction: float) -> EnvConfig | tuple[EnvConfig, ...]:
    """``target`` for ``fraction`` of the environments, ``others`` for the
    rest (just ``target`` without others or with a fraction of 1)."""
    on_target = round(fraction * MIX_SLOTS)
    if others is None or on_target >= MIX_SLOTS:
        return target
    return tuple([target] * on_target + [others] * (MIX_SLOTS - on_target))


def plan_phases(config: TrainConfig, machine: Machine) -> list[Phase]:
    """Stage 1 and 2 phases of the plan, in order (stage 3 is separate).

    With the curriculum, stage 1 runs its stages, then a part on the target
    machine (tasks from 10 KB to 10 GB) mixed with the curriculum's
    last stage (``config.target_mix`` of the environments on the target), and
    stage 2 mixes the same way; without it, both parts use the target only.
    The target machine runs idle and under background load
    (:data:`TARGET_P_BUSY`, :data:`TARGET_P_IDLE`).
    """
    plan = config.plan
    out: list[Phase] = []
    base = EnvConfig(penalty=config.penalty)
    catalog = None
    if config.curriculum:
        stages = tuple(replace(s, steps=n) for s, n in
                       zip(DEFAULT_STAGES, plan.curriculum, strict=True))
        cur = Curriculum(stages=stages, seed=config.seed)
        catalog = replace(base, machine=None, curriculum=cur,
                          stage=stages[-1].name)
    if "cost-model" in config.stages:
        extra = 0
        if config.curriculum:
            for s in cur.stages:
                out.append(Phase(s.name, "cost-model", s.steps,
                                 replace(base, machine=None, curriculum=cur,
                                         stage=s.name)))
        else:
            extra = sum(plan.curriculum)
        target = replace(base, machine=machine, p_busy=TARGET_P_BUSY,
                         p_idle=TARGET_P_IDLE, task_log10_bytes=MODEL_LOG10_BYTES,
                         params=default_params())
        out.append(Phase(f"target:{machine.name}", "cost-model",
                         plan.target + extra,
                         _mixture(target, catalog, config.target_mix)))
    if "calibrated" in config.stages:
        params = load_params(machine.name) or default_params()
        # Independent log-normal factors on the two predicted times of the
        # reward log(T_eq / T) add noise_sigma * (e_1 - e_2): std sigma * sqrt 2.
        target = replace(base, machine=machine, p_busy=TARGET_P_BUSY,
                         p_idle=TARGET_P_IDLE, task_log10_bytes=MODEL_LOG10_BYTES,
                         params=params)
        out.append(Phase("calibrated", "calibrated", plan.calibrated,
                         _mixture(target, catalog, config.target_mix),
                         reward_sigma=config.noise_sigma * math.sqrt(2.0)))
    return out


def phase_iterations(phase: Phase, plan: TrainingPlan) -> int:
    """Iterations of ``phase`` under ``plan`` (``num_envs * rollout`` steps
    each; at least one)."""
    return max(1, math.ceil(phase.steps / (plan.num_envs * plan.rollout)))


def stage_seed(seed: int, phase: int, it: int) -> int:
    """The environment seed of iteration ``it`` of phase ``phase``."""
    return int(np.random.SeedSequence((seed, phase, it)).generate_state(1)[0])
