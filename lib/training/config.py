"""What a training run is: the plan of each budget, the configuration, the
learner it describes, and what a run reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lib.budgets import check_budget, plans
from lib.contract import BLOCKS, MODES
from lib.learners import TrainableLearner
from lib.learners.ppo import PPOAgent, PPOConfig
from lib.learners.td3 import TD3Agent, TD3Config
from lib.policies.learned import (
    HEAD_SIZES,
    OBS_DIM,
    LearnedPolicy,
    ObservationEncoder,
)
from lib.policies.observation import STATE_DEVICES

#: The learners :class:`TrainConfig` can train.
LEARNERS = ("ppo", "td3")
#: The stages of a run, in order.
STAGES = ("cost-model", "calibrated", "measured")


@dataclass(frozen=True)
class TrainingPlan:
    """Environment steps of each part of a training run."""

    curriculum: tuple[int, ...]
    """Steps of each stage of :data:`lib.env.DEFAULT_STAGES` (stage 1)."""
    target: int
    """Stage 1's last part, on the target machine."""
    calibrated: int
    """Stage 2 (calibrated, noisy model)."""
    measured: int
    """Stage 3 (measured runs; each step is one real run plus the equal split)."""
    num_envs: int
    """Environments stepped together (model backend)."""
    rollout: int
    """Steps per environment per iteration (batch = num_envs * rollout)."""
    eval_tasks: int
    """Held-out tasks of the final evaluation."""
    imitation_labels: int = 0
    """Stage 1a: tasks labelled with the exhaustive optimum (about 10 ms each)."""
    imitation_steps: int = 0
    """Stage 1a: behaviour-cloning gradient steps on those labels (0: none)."""


TRAINING_PLANS: dict[str, TrainingPlan] = plans({
    "smoke": TrainingPlan((256,) * 5, 512, 256, 8, 32, 8, 12, 24, 4),
    "quick": TrainingPlan((8_192, 16_384, 16_384, 16_384, 24_576), 163_840, 24_576, 64,
                    64, 32, 200, 4_096, 4_000),
    "full": TrainingPlan((50_000, 100_000, 100_000, 100_000, 200_000), 2_000_000,
                   200_000, 512, 128, 32, 500, 16_384, 20_000),
}, "training plans")


@dataclass
class TrainConfig:
    """What to train, for which machine, how long (CleanRL-style fields)."""

    machine: str = "hetero-4"
    """Target machine profile (``hetero-4``, ``local-cpu``, ``nvml``...)."""
    budget: str = "quick"
    """``"smoke"`` (seconds), ``"quick"`` (minutes on 2 cores), ``"full"``."""
    seed: int = 0
    """Seeds weights, environments, minibatches and noise."""
    learner: str = "ppo"
    """``"ppo"`` (shares and every discrete head) or ``"td3"`` (shares only)."""
    features: str = "all"
    """Ablation: ``"all"``, ``"no-telemetry"`` or ``"no-topology"``."""
    use_mask: bool = True
    """Ablation: False trains and acts without the action masks."""
    curriculum: bool = True
    """Ablation: False spends stage 1's curriculum steps on the target machine."""
    stages: tuple[str, ...] = STAGES
    """Which of :data:`STAGES` to run (those that apply)."""
    noise_sigma: float = 0.1
    """Stage 2: std of the log-normal factor on every predicted time."""
    checkpoint_every: int = 10
    """Iterations between checkpoints (and at the end of every stage)."""
    lr: float = 1e-3
    """Adam step size at the start; annealed linearly to ``lr_final``."""
    lr_final: float = 1e-4
    """Adam step size at the end of a stage."""
    ent_coef: float = 3e-3
    """Entropy bonus at the start; annealed linearly to 0 over a stage."""
    hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of actor and critic."""
    epochs: int = 4
    """PPO epochs per batch."""
    minibatch_size: int = 512
    """PPO rows per gradient step."""
    alpha_init: float = 8.0
    """PPO initial Dirichlet concentration per device."""
    alpha_min: float = 0.05
    """PPO floor of every Dirichlet concentration (0.01 to 1). The policy acts
    on the Dirichlet mean, where a left-out device keeps a share of about
    ``alpha_min / sum(alpha)``: well below 1 lets it leave devices out (share
    under ``min_share``, 1e-3) as the optimum does, without concentrations in
    the thousands."""
    penalty: float = 1.0
    """Reward of a decision Gate 1 refuses is ``-penalty``."""
    eval_seed: int = 7919
    """Seed of the held-out evaluation tasks (never an environment's)."""
    imitation_steps: int | None = None
    """Stage 1a behaviour-cloning steps; None takes the budget's, 0 skips
    stage 1a (PPO from scratch)."""
    imitation_labels: int | None = None
    """Stage 1a labelled tasks; None takes the budget's."""
    imitation_eps: float = 1e-3
    """Stage 1a: weight of the uniform mix that moves the optimum's shares
    inside the simplex (:func:`interior_shares`). Keep ``eps / K`` (K usable
    devices) under the 1e-3 share the policy drops, or the imitated mean keeps
    a sliver on devices the optimum leaves out (1e-4 to 1e-3)."""

    def __post_init__(self) -> None:
        check_budget(self.budget)
        if self.learner not in LEARNERS:
            raise ValueError(f"learner {self.learner!r}: expected one of "
                             f"{', '.join(LEARNERS)}")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ValueError(f"unknown stages {unknown}; expected some of "
                             f"{', '.join(STAGES)}")
        ObservationEncoder(self.features)  # validates the name
        for name in ("imitation_steps", "imitation_labels"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} {value}: expected >= 0 (or None for "
                                 f"the {self.budget} budget's)")
        if not 0.0 < self.imitation_eps < 1.0:
            raise ValueError(f"imitation_eps {self.imitation_eps}: expected a "
                             "weight in (0, 1), typically 1e-3")

    @property
    def plan(self) -> TrainingPlan:
        """The :data:`TRAINING_PLANS` entry of :attr:`budget`."""
        return TRAINING_PLANS[self.budget]

    @property
    def imitation_plan(self) -> tuple[int, int]:
        """Stage 1a's ``(labelled tasks, gradient steps)``; steps 0 skips it."""
        plan = self.plan
        labels = plan.imitation_labels if self.imitation_labels is None \
            else self.imitation_labels
        steps = plan.imitation_steps if self.imitation_steps is None \
            else self.imitation_steps
        return labels, steps if labels > 0 else 0


def make_learner(config: TrainConfig) -> TrainableLearner:
    """A fresh learner over the flat observation and the four heads: a
    :class:`PPOAgent` or a :class:`TD3Agent` (``config.learner``)."""
    if config.learner == "ppo":
        return PPOAgent(OBS_DIM, STATE_DEVICES, HEAD_SIZES, PPOConfig(
            lr=config.lr, epochs=config.epochs,
            minibatch_size=config.minibatch_size, ent_coef=config.ent_coef,
            hidden=tuple(config.hidden), alpha_init=config.alpha_init,
            alpha_min=config.alpha_min, seed=config.seed))
    defaults = [BLOCKS.index(256), MODES.index("split"), 0, 0]
    return TD3Agent(OBS_DIM, STATE_DEVICES, HEAD_SIZES, TD3Config(
        hidden=tuple(config.hidden), batch_size=256, seed=config.seed),
        default_choices=defaults)


@dataclass
class StageReport:
    """What one stage did."""

    name: str
    """One of :data:`STAGES`."""
    status: str
    """``"ran"``, ``"skipped"`` or ``"interrupted"``."""
    reason: str = ""
    """Why the stage was skipped (empty otherwise)."""
    iterations: int = 0
    """Iterations of the stage (one curve row each)."""
    env_steps: int = 0
    """Environment steps of the stage."""
    wall_s: float = 0.0
    """Wall-clock seconds spent in the stage."""
    label: str = ""
    """``PREDICTED (model)`` or ``MEASURED (cpu)``."""


@dataclass
class TrainResult:
    """What :func:`lib.training.train` returns."""

    config: TrainConfig
    """The configuration that was trained."""
    policy: LearnedPolicy
    """The trained learner as a policy."""
    stages: list[StageReport]
    """One report per stage that applies, in order."""
    curves: dict[str, list[dict[str, float]]]
    """Rows per iteration, by stage (``"imitation"`` for stage 1a)."""
    evaluation: dict[str, Any] | None
    """The held-out evaluation (:func:`lib.training.evaluate`), if it ran."""
    out_dir: Path
    """Where checkpoints, curves, policy and summary were written."""
    wall_s: float
    """Wall-clock seconds of this call."""
    interrupted: bool = False
    """A callback stopped the run (resume it from the checkpoint)."""

    def summary(self) -> dict[str, Any]:
        """JSON-able summary (written as ``summary.json``)."""
        cfg = asdict(self.config)
        ev = None if self.evaluation is None else {
            k: v for k, v in self.evaluation.items() if k != "per_task"}
        return {"machine": self.config.machine, "budget": self.config.budget,
                "seed": self.config.seed, "learner": self.config.learner,
                "config": cfg, "stages": [asdict(s) for s in self.stages],
                "env_steps": sum(s.env_steps for s in self.stages),
                "wall_s": self.wall_s, "evaluation": ev,
                "interrupted": self.interrupted}
