"""What a training run is: the plan of each budget, the configuration, the
learner it describes, and what a run reports."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lib.budgets import check_budget, plans
from lib.contract import BACKENDS, BLOCKS, MODES
from lib.learners import TrainableLearner
from lib.learners.setppo import SetPPOAgent, SetPPOConfig
from lib.learners.td3 import TD3Agent, TD3Config
from lib.platform.workloads import split_rows
from lib.policies.learned import (
    HEAD_SIZES,
    HEADS,
    LearnedPolicy,
    ObservationEncoder,
    flat_dim,
)
from lib.policies.observation import DEVICE_FEATURES, DEVICE_FIELDS, TASK_FEATURES

DEVICE_FIELD_NAMES = [name for name, _ in DEVICE_FIELDS]

#: The learners :class:`TrainConfig` can train: ``ppo`` is the set policy
#: (any number of devices); ``td3`` has :data:`TD3_SLOTS` fixed device slots.
LEARNERS = ("ppo", "td3")
#: Device slots of the TD3 learner (the curriculum's largest machine).
TD3_SLOTS = 16
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
    "quick": TrainingPlan((2_048, 4_096, 4_096, 4_096, 8_192), 4_096, 2_048, 64,
                          64, 32, 200, 8_000, 6_000),
    "full": TrainingPlan((50_000, 100_000, 100_000, 100_000, 200_000), 400_000,
                         100_000, 512, 128, 32, 500, 40_000, 40_000),
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
    lr: float = 5e-5
    """PPO step size at the start of a phase, annealed linearly to
    ``lr_final`` (small: PPO refines what stage 1a imitated; on the cost model
    the optimum is known, and sampled rewards tell the policy less than it
    already knows, so large steps only add noise)."""
    lr_final: float = 2e-5
    """Step size at the end of a phase (and of stage 1a)."""
    ent_coef: float = 1e-3
    """Entropy bonus at the start; annealed linearly to 0 over a stage."""
    hidden: tuple[int, ...] = (64, 64, 64)
    """Hidden widths: the set network's item encoder, item layer and set
    layer (PPO); TD3's MLP layers."""
    epochs: int = 4
    """PPO epochs per batch."""
    minibatch_size: int = 512
    """PPO rows per gradient step (and stage 1a's)."""
    kappa_init: float = 2000.0
    """PPO initial total Dirichlet concentration (a sampled share p spreads
    about sqrt(p / kappa) around the mean). Large: the policy gradient
    optimises the reward *under* the sampling noise, and since the slowest
    device sets the time, noise makes it shift work off small-share devices;
    that bias grows with the noise's variance (PREDICTED on hetero-4: 200
    moved T_rl/T_opt from 1.021 to 1.033; 1000 and above did not)."""
    kappa_min: float = 4.0
    """PPO floor of the total concentration."""
    target_mix: float = 0.5
    """Fraction of the environments of stage 1's last part and of stage 2 on
    the target machine; the rest keep drawing from the curriculum's last
    stage, so one policy keeps serving every machine."""
    penalty: float = 1.0
    """Reward of a decision Gate 1 refuses is ``-penalty``."""
    eval_seed: int = 7919
    """Seed of the held-out evaluation tasks (never an environment's)."""
    imitation_steps: int | None = None
    """Stage 1a behaviour-cloning steps; None takes the budget's, 0 skips
    stage 1a (PPO from scratch)."""
    imitation_labels: int | None = None
    """Stage 1a labelled tasks; None takes the budget's."""
    imitation_batch: int = 256
    """Stage 1a rows per gradient step."""
    pretrain_steps: int | None = None
    """Environment steps on the model (stages 1 and 2 together), spread over
    their parts in the budget's proportions (each part runs whole iterations
    of ``num_envs * rollout`` steps, at least one); None takes the budget's."""
    finetune_steps: int | None = None
    """Stage 3 (measured) environment steps; None takes the budget's."""
    finetune_backend: str | None = None
    """Stage 3's backend (``cpu``, ``cuda``, ``dask``); None takes the
    machine's first real backend."""
    imitation_lr: float = 3e-3
    """Stage 1a step size at the start, annealed linearly to ``lr_final``."""

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
        for name in ("imitation_steps", "imitation_labels", "pretrain_steps",
                     "finetune_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} {value}: expected >= 0 (or None for "
                                 f"the {self.budget} budget's)")
        real = tuple(b for b in BACKENDS if b != "model")
        if self.finetune_backend is not None and self.finetune_backend not in real:
            raise ValueError(f"finetune_backend {self.finetune_backend!r}: "
                             f"expected one of {', '.join(real)} (a measured "
                             "stage runs on real devices)")
        if not 0.0 <= self.target_mix <= 1.0:
            raise ValueError(f"target_mix {self.target_mix}: expected a "
                             "fraction in [0, 1]")

    @property
    def plan(self) -> TrainingPlan:
        """The :data:`TRAINING_PLANS` entry of :attr:`budget`, with
        :attr:`pretrain_steps` and :attr:`finetune_steps` in place of its
        step counts where they are given."""
        plan = TRAINING_PLANS[self.budget]
        if self.pretrain_steps is not None:
            plan = scale_model_steps(plan, self.pretrain_steps)
        if self.finetune_steps is not None:
            plan = replace(plan, measured=self.finetune_steps)
        return plan

    @property
    def imitation_plan(self) -> tuple[int, int]:
        """Stage 1a's ``(labelled tasks, gradient steps)``; steps 0 skips it."""
        plan = self.plan
        labels = plan.imitation_labels if self.imitation_labels is None \
            else self.imitation_labels
        steps = plan.imitation_steps if self.imitation_steps is None \
            else self.imitation_steps
        return labels, steps if labels > 0 else 0


def scale_model_steps(plan: TrainingPlan, total: int) -> TrainingPlan:
    """``plan`` with ``total`` model steps over stages 1 and 2, each part
    keeping its share of the plan's (largest-remainder rounding, so the parts
    add up to ``total`` exactly)."""
    parts = (*plan.curriculum, plan.target, plan.calibrated)
    weights = parts if sum(parts) > 0 else (1,) * len(parts)
    counts = [hi - lo for lo, hi in split_rows(total, weights)]
    n = len(plan.curriculum)
    return replace(plan, curriculum=tuple(counts[:n]), target=counts[n],
                   calibrated=counts[n + 1])


def make_learner(config: TrainConfig) -> TrainableLearner:
    """A fresh learner over the state and the four heads: a
    :class:`SetPPOAgent` (any number of devices) or a :class:`TD3Agent`
    (:data:`TD3_SLOTS` device slots, the flat observation with its masks)."""
    if config.learner == "ppo":
        hidden = tuple(config.hidden)
        if len(hidden) != 3:
            raise ValueError(f"hidden {hidden}: the set network takes three "
                             "widths (item encoder, item layer, set layer)")
        return SetPPOAgent(TASK_FEATURES, DEVICE_FEATURES, HEAD_SIZES, SetPPOConfig(
            lr=config.lr, epochs=config.epochs,
            minibatch_size=config.minibatch_size, ent_coef=config.ent_coef,
            hidden=hidden, kappa_init=config.kappa_init,
            kappa_min=config.kappa_min, share_head=HEADS.index("mode"),
            share_prior=share_prior(), seed=config.seed))
    defaults = [BLOCKS.index(256), MODES.index("split"), 0, 0]
    return TD3Agent(flat_dim(TD3_SLOTS, True), TD3_SLOTS, HEAD_SIZES, TD3Config(
        hidden=tuple(config.hidden), batch_size=256, seed=config.seed),
        default_choices=defaults)


def share_prior() -> tuple[tuple[int, int, float], ...]:
    """The set policy's per-device outputs start as estimates from the
    device rows: each mode's log whole-task time from its unit-efficiency
    cost (``cost_split`` for ``single`` and ``split``, ``cost_pipe`` for
    ``pipelined``: log10 seconds scaled to ``(x + 4) / 3``), its log fixed
    cost from three host-link latencies (``log_host_lat`` is log10 s + 5)."""
    ln10 = math.log(10.0)
    out = []
    for mode in MODES:
        cost = DEVICE_FIELD_NAMES.index("cost_pipe" if mode == "pipelined"
                                        else "cost_split")
        lat = DEVICE_FIELD_NAMES.index("log_host_lat")
        c = MODES.index(mode)
        out += [(cost, 2 * c, 3.0 * ln10), (-1, 2 * c, -4.0 * ln10),
                (lat, 2 * c + 1, ln10), (-1, 2 * c + 1, -5.0 * ln10 + math.log(3.0))]
    return tuple(out)


def encoder_for(learner: TrainableLearner, config: TrainConfig
                ) -> ObservationEncoder:
    """The observation encoder ``learner`` reads (its device slots, if it
    has a fixed number, and the run's ablations)."""
    return ObservationEncoder(config.features, config.use_mask,
                              getattr(learner, "n_devices", None))


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
