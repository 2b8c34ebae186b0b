"""Training a split policy in three stages, with checkpoints, curves and a verdict.

:func:`train` runs, for one target machine:

1. **cost model**, the model backend with the uncalibrated parameters, in two
   parts:

   a. *imitate the exhaustive optimum on the cost model*
      (:func:`imitation_labels`, :func:`imitate`): tasks drawn as stage 1b
      draws them are labelled with :func:`lib.policies.oracle.optimum`'s
      decision, turned into the environment's action (shares on the device
      slots; block, mode, path and chunk-count indices), and the PPO policy
      maximises their log-likelihood (:meth:`PPOAgent.imitation_update`; the
      critic regresses the optimum's reward ``log(T_eq / T_opt)``). The labels
      are drawn once and reused for every step; ``imitation_steps=0`` skips
      this part, and TD3 skips it (it fits PPO's heads);
   b. *PPO over the curriculum*: PPO (or TD3) on ``GPUHive-Split-v0`` over
      the curriculum (:data:`lib.env.DEFAULT_STAGES`: homogeneous,
      heterogeneous, small tasks, busy, catalog), then a last stage on the
      target machine itself (tasks from 10 KB to 10 GB, idle devices). With
      ``curriculum=False`` both parts use the target machine only;
2. **calibrated, noisy model** -- the target machine with its calibrated
   parameters where ``gpuhive calibrate`` saved some (``load_params``), else
   the defaults; every PREDICTED time is multiplied by an independent
   log-normal factor ``exp(N(0, noise_sigma^2))``, which turns the reward
   ``log(T_eq / T)`` into ``log(T_eq / T) + noise_sigma * (e_1 - e_2)``;
3. **measured runs** -- the target machine's real backend (``cpu`` on
   ``local-cpu``, ``cuda`` on a GPU server). A simulated machine (``hetero-4``)
   has no devices to measure: the stage is skipped and the reason printed.

Every decision is one independent task (task mode), so an iteration is a batch
of one-step episodes and the advantage is ``reward - V(s)``. Iteration ``k`` of
a stage resets its environments with a seed derived from ``(seed, stage, k)``:
the data an iteration sees depends only on the seed and the iteration, so a
run that resumes from a checkpoint (learner weights, optimiser moments,
normaliser, random generator state, curves) ends exactly where an
uninterrupted run with the same seed ends.

At the end the policy is evaluated on held-out tasks of the target machine
(:func:`evaluate`: a seed of their own, never an environment's) against equal
split, proportional-to-peak and the exhaustive optimum, labelled PREDICTED or
MEASURED with the backend.

Files under ``out_dir``: ``checkpoint.npz`` (resume state), ``curves/<stage>.csv``
(one row per iteration; ``curves/imitation.csv`` for stage 1a), ``policy.npz``
(PPO), ``summary.json``.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from lib.budgets import check_budget, plans
from lib.contract import BLOCKS, MODES, TaskSpec
from lib.costmodel import default_params, predict
from lib.costmodel.calibrate import load_params
from lib.env import (
    DEFAULT_STAGES,
    BatchModelEnv,
    Curriculum,
    EnvConfig,
    SplitEnv,
    sample_task,
)
from lib.env.split import MEASURED_LOG10_BYTES, MODEL_LOG10_BYTES
from lib.execution import BackendUnavailable, get_backend
from lib.learners.bandit import BanditConfig, ShareBandit
from lib.learners.ppo import PPOAgent, PPOConfig, interior_shares
from lib.learners.td3 import TD3Agent, TD3Config
from lib.platform.machines import Machine, load_machine
from lib.policies.actions import action_from_decision
from lib.policies.baselines import EqualSplit, ProportionalToPeak
from lib.policies.learned import (
    HEAD_MASKS,
    HEAD_SIZES,
    HEADS,
    OBS_DIM,
    LearnedPolicy,
    ObservationEncoder,
    action_from_choices,
)
from lib.policies.observation import STATE_DEVICES
from lib.policies.oracle import optimum
from lib.security import check_decision

LEARNERS = ("ppo", "td3")
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


@dataclass
class StageReport:
    """What one stage did."""

    name: str
    status: str
    """``"ran"``, ``"skipped"`` or ``"interrupted"``."""
    reason: str = ""
    iterations: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    label: str = ""
    """``PREDICTED (model)`` or ``MEASURED (cpu)``."""


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    config: TrainConfig
    policy: LearnedPolicy
    stages: list[StageReport]
    curves: dict[str, list[dict[str, float]]]
    evaluation: dict[str, Any] | None
    out_dir: Path
    wall_s: float
    interrupted: bool = False

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


# --------------------------------------------------------------------------
# Learners and their checkpoint state


def make_learner(config: TrainConfig) -> PPOAgent | TD3Agent:
    """A fresh learner over the flat observation and the four heads."""
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


def _adam_arrays(prefix: str, opt: Any) -> dict[str, np.ndarray]:
    return {**{f"{prefix}.m/{k}": v for k, v in opt.m.items()},
            **{f"{prefix}.v/{k}": v for k, v in opt.v.items()}}


def _learner_state(learner: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Everything needed to continue training: arrays and JSON-able metadata."""
    meta: dict[str, Any] = {"rng": learner.rng.bit_generator.state}
    if isinstance(learner, PPOAgent):
        arrays = {f"param/{k}": v for k, v in learner.params.items()}
        arrays.update(_adam_arrays("adam", learner.optimizer))
        meta.update(adam_t=learner.optimizer.t, obs_rms=learner.obs_rms.to_json())
        return arrays, meta
    arrays = {**{f"param/{k}": v for k, v in learner.actor_params.items()},
              **{f"param/{k}": v for k, v in learner.critic_params.items()},
              **{f"target/{k}": v for k, v in learner.target_actor.items()},
              **{f"target/{k}": v for k, v in learner.target_critic.items()},
              **_adam_arrays("actor_opt", learner.actor_opt),
              **_adam_arrays("critic_opt", learner.critic_opt)}
    buf = learner.buffer
    for k in ("obs", "device_mask", "shares", "reward", "next_obs",
              "next_device_mask", "done"):
        arrays[f"buffer/{k}"] = getattr(buf, k)[:buf.size]
    meta.update(actor_t=learner.actor_opt.t, critic_t=learner.critic_opt.t,
                critic_steps=learner.critic_steps, buffer_size=buf.size,
                buffer_next=buf._next)
    return arrays, meta


def _restore_adam(prefix: str, opt: Any, arrays: Mapping[str, np.ndarray],
                  t: int) -> None:
    for k in opt.m:
        opt.m[k][...] = arrays[f"{prefix}.m/{k}"]
        opt.v[k][...] = arrays[f"{prefix}.v/{k}"]
    opt.t = int(t)


def _restore_learner(learner: Any, arrays: Mapping[str, np.ndarray],
                     meta: Mapping[str, Any]) -> None:
    from lib.learners.normalize import RunningMeanStd

    learner.rng.bit_generator.state = meta["rng"]
    if isinstance(learner, PPOAgent):
        for k, v in learner.params.items():
            v[...] = arrays[f"param/{k}"]
        _restore_adam("adam", learner.optimizer, arrays, meta["adam_t"])
        learner.obs_rms = RunningMeanStd.from_json(meta["obs_rms"])
        return
    for group in (learner.actor_params, learner.critic_params):
        for k, v in group.items():
            v[...] = arrays[f"param/{k}"]
    for group in (learner.target_actor, learner.target_critic):
        for k, v in group.items():
            v[...] = arrays[f"target/{k}"]
    _restore_adam("actor_opt", learner.actor_opt, arrays, meta["actor_t"])
    _restore_adam("critic_opt", learner.critic_opt, arrays, meta["critic_t"])
    learner.critic_steps = int(meta["critic_steps"])
    buf = learner.buffer
    n = int(meta["buffer_size"])
    for k in ("obs", "device_mask", "shares", "reward", "next_obs",
              "next_device_mask", "done"):
        getattr(buf, k)[:n] = arrays[f"buffer/{k}"]
    buf.size, buf._next = n, int(meta["buffer_next"])


def save_checkpoint(path: Path, learner: Any, progress: Mapping[str, Any]) -> None:
    """Write the learner's state and ``progress`` (JSON) atomically."""
    arrays, meta = _learner_state(learner)
    text = json.dumps({"meta": meta, "progress": progress}, default=float)
    tmp = path.with_suffix(".tmp.npz")
    with tmp.open("wb") as fh:
        np.savez(fh, header=np.array(text), **arrays)
    tmp.replace(path)


def load_checkpoint(path: Path, learner: Any) -> dict[str, Any]:
    """Restore ``learner`` from ``path``; return the saved progress."""
    with np.load(path, allow_pickle=False) as npz:
        head = json.loads(str(npz["header"]))
        arrays = {k: npz[k] for k in npz.files if k != "header"}
    _restore_learner(learner, arrays, head["meta"])
    return head["progress"]


# --------------------------------------------------------------------------
# One stage


@dataclass
class _Phase:
    """A run of iterations on one environment setup (part of a stage)."""

    name: str
    stage: str
    steps: int
    config: EnvConfig
    reward_sigma: float = 0.0


def _phases(config: TrainConfig, machine: Machine) -> list[_Phase]:
    """Stage 1 and 2 phases of the plan, in order (stage 3 is separate)."""
    plan = config.plan
    out: list[_Phase] = []
    base = EnvConfig(penalty=config.penalty)
    if "cost-model" in config.stages:
        extra = 0
        if config.curriculum:
            stages = tuple(replace(s, steps=n) for s, n in
                           zip(DEFAULT_STAGES, plan.curriculum, strict=True))
            cur = Curriculum(stages=stages, seed=config.seed)
            for s in stages:
                out.append(_Phase(s.name, "cost-model", s.steps,
                                  replace(base, curriculum=cur, stage=s.name)))
        else:
            extra = sum(plan.curriculum)
        out.append(_Phase(f"target:{machine.name}", "cost-model",
                          plan.target + extra,
                          replace(base, machine=machine.name, p_busy=0.0,
                                  task_log10_bytes=MODEL_LOG10_BYTES,
                                  params=default_params())))
    if "calibrated" in config.stages:
        params = load_params(machine.name) or default_params()
        out.append(_Phase("calibrated", "calibrated", plan.calibrated,
                          replace(base, machine=machine.name, p_busy=0.0,
                                  task_log10_bytes=MODEL_LOG10_BYTES,
                                  params=params),
                          reward_sigma=config.noise_sigma * math.sqrt(2.0)))
    return out


def _stage_seed(seed: int, phase: int, it: int) -> int:
    return int(np.random.SeedSequence((seed, phase, it)).generate_state(1)[0])


# --------------------------------------------------------------------------
# Stage 1a: imitating the exhaustive optimum


def _label_counts(phases: list[_Phase], total: int) -> list[int]:
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
    phases = _phases(replace(config, stages=("cost-model",)), machine)
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
    """
    if agent.config.normalize_obs:
        agent.obs_rms.update(labels["obs"])
    every = max(1, steps // 50)
    bar = tqdm(total=steps, desc="cost-model/imitation", disable=not progress,
               leave=False)
    done = 0
    t0 = time.perf_counter()
    while done < steps:
        n = min(every, steps - done)
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


def _rollout_ppo(agent: PPOAgent, env: BatchModelEnv, enc: ObservationEncoder,
                 obs: dict[str, np.ndarray], rollout: int,
                 rng: np.random.Generator, sigma: float
                 ) -> tuple[dict[str, Any], np.ndarray, int]:
    """``rollout`` steps of every environment; the PPO batch, rewards, refusals."""
    rows: dict[str, list] = {k: [] for k in ("obs", "device_mask", "masks",
                                             "shares", "choices", "logp",
                                             "value", "reward")}
    refused = 0
    for _ in range(rollout):
        x = enc.flat(obs)
        dmask, cmasks = enc.masks(obs)
        out = agent.act_batch(x, dmask, cmasks)
        obs_next, r, _, _, infos = env.step(action_from_choices(out.shares,
                                                                out.choices))
        refused += sum(not i["accepted"] for i in infos)
        if sigma > 0:
            r = r + sigma * rng.standard_normal(r.shape)
        rows["obs"].append(x)
        rows["device_mask"].append(np.ones((len(r), STATE_DEVICES), dtype=bool)
                                   if dmask is None else dmask)
        rows["masks"].append(cmasks)
        for k, v in (("shares", out.shares), ("choices", out.choices),
                     ("logp", out.logp), ("value", out.value), ("reward", r)):
            rows[k].append(v)
        obs = obs_next
    cat = {k: np.concatenate(rows[k]) for k in rows if k != "masks"}
    if enc.use_mask:
        masks = [None if rows["masks"][0][h] is None
                 else np.concatenate([m[h] for m in rows["masks"]])
                 for h in range(len(HEAD_SIZES))]
    else:
        masks = None
    adv = cat["reward"] - cat["value"]
    batch = {"obs": cat["obs"], "device_mask": cat["device_mask"],
             "discrete_masks": masks, "shares": cat["shares"],
             "choices": cat["choices"], "logp": cat["logp"], "advantages": adv,
             "returns": cat["reward"]}
    return batch, cat["reward"], refused


def _rollout_td3(agent: TD3Agent, env: BatchModelEnv, enc: ObservationEncoder,
                 obs: dict[str, np.ndarray], rollout: int,
                 rng: np.random.Generator, sigma: float) -> tuple[np.ndarray, int]:
    rewards, refused = [], 0
    for _ in range(rollout):
        x = enc.flat(obs)
        dmask, cmasks = enc.masks(obs)
        dm = np.ones((x.shape[0], STATE_DEVICES), dtype=bool) if dmask is None \
            else dmask
        shares = agent.shares(x, dm, noise=agent.config.explore_noise)
        choices = np.array([agent.default_discrete(
            None if cmasks is None else [None if m is None else m[i]
                                         for m in cmasks])
            for i in range(x.shape[0])])
        obs, r, _, _, infos = env.step(action_from_choices(shares, choices))
        refused += sum(not i["accepted"] for i in infos)
        if sigma > 0:
            r = r + sigma * rng.standard_normal(r.shape)
        agent.observe(x, dm, shares, r, x, dm, np.ones_like(r))
        rewards.append(r)
    return np.concatenate(rewards), refused


def _anneal(agent: Any, config: TrainConfig, frac: float) -> None:
    """Linear schedules of step size and entropy bonus over a phase."""
    if isinstance(agent, PPOAgent):
        agent.optimizer.config.lr = config.lr + (config.lr_final - config.lr) * frac
        agent.config.ent_coef = config.ent_coef * (1.0 - frac)


def _run_phase(learner: Any, phase: _Phase, index: int, config: TrainConfig,
               start_it: int, curve: list[dict[str, float]], ckpt: Callable,
               callback: Callable | None, progress: bool,
               plan: TrainingPlan | None = None) -> tuple[int, bool]:
    """Iterations ``start_it..`` of a phase. Returns (iterations done,
    interrupted)."""
    plan = plan or config.plan
    per_it = plan.num_envs * plan.rollout
    n_it = max(1, math.ceil(phase.steps / per_it))
    enc = ObservationEncoder(config.features, config.use_mask)
    env = BatchModelEnv(plan.num_envs, replace(phase.config,
                                               episode_len=plan.rollout))
    bar = tqdm(total=n_it, initial=start_it, desc=f"{phase.stage}/{phase.name}",
               disable=not progress, leave=False)
    try:
        for it in range(start_it, n_it):
            s = _stage_seed(config.seed, index, it)
            obs, _ = env.reset(seed=s)
            noise = np.random.default_rng(s + 1)
            _anneal(learner, config, it / max(1, n_it - 1))
            t0 = time.perf_counter()
            if isinstance(learner, PPOAgent):
                batch, r, refused = _rollout_ppo(learner, env, enc, obs,
                                                 plan.rollout, noise,
                                                 phase.reward_sigma)
                stats = learner.update(batch)
            else:
                r, refused = _rollout_td3(learner, env, enc, obs, plan.rollout,
                                          noise, phase.reward_sigma)
                stats = learner.update(max(1, len(r) // 8))
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


# --------------------------------------------------------------------------
# Stage 3: measured runs


def measured_backend(machine: Machine) -> str | None:
    """The real backend of ``machine`` (``cpu``, ``cuda``) or None if simulated."""
    if machine.simulated:
        return None
    real = tuple(getattr(machine, "real_backends", ()) or ())
    return real[0] if real else "cuda"


def _run_measured(learner: Any, config: TrainConfig, machine: Machine,
                  backend: str, curve: list[dict[str, float]],
                  progress: bool) -> int:
    """Stage 3: PPO on measured rewards, small batches, one environment."""
    steps = config.plan.measured
    batch_rows = max(4, min(16, steps))
    n_it = max(1, steps // batch_rows)
    enc = ObservationEncoder(config.features, config.use_mask)
    env = SplitEnv(EnvConfig(machine=machine.name, backend=backend,
                             penalty=config.penalty, episode_len=batch_rows,
                             task_log10_bytes=MEASURED_LOG10_BYTES,
                             backend_options={"seed": config.seed}))
    try:
        for it in tqdm(range(n_it), desc="measured", disable=not progress,
                       leave=False):
            obs, _ = env.reset(seed=_stage_seed(config.seed, 99, it))
            t0 = time.perf_counter()
            xs, dms, cms, outs, rs = [], [], [], [], []
            for _ in range(batch_rows):
                x = enc.flat(obs)[None]
                dmask, cmasks = enc.masks(obs)
                dm = np.ones((1, STATE_DEVICES), bool) if dmask is None \
                    else dmask[None]
                cm = None if cmasks is None else [None if m is None else m[None]
                                                  for m in cmasks]
                if isinstance(learner, PPOAgent):
                    out = learner.act_batch(x, dm, cm)
                    shares, choices = out.shares, out.choices
                else:
                    shares = learner.shares(x, dm, noise=learner.config.explore_noise)
                    choices = np.array([learner.default_discrete(
                        None if cm is None else [None if m is None else m[0]
                                                 for m in cm])])
                    out = None
                act = action_from_choices(shares[0], choices[0])
                obs, r, _, _, _ = env.step(act)
                xs.append(x)
                dms.append(dm)
                cms.append(cm)
                outs.append(out if out is not None else shares)
                rs.append(r)
            r = np.asarray(rs)
            x = np.concatenate(xs)
            dm = np.concatenate(dms)
            if isinstance(learner, PPOAgent):
                cm = None if cms[0] is None else [
                    None if cms[0][h] is None else np.concatenate([c[h] for c in cms])
                    for h in range(len(HEAD_SIZES))]
                value = np.array([o.value[0] for o in outs])
                stats = learner.update({
                    "obs": x, "device_mask": dm, "discrete_masks": cm,
                    "shares": np.concatenate([o.shares for o in outs]),
                    "choices": np.concatenate([o.choices for o in outs]),
                    "logp": np.concatenate([o.logp for o in outs]),
                    "advantages": r - value, "returns": r})
            else:
                learner.observe(x, dm, np.concatenate(outs), r, x, dm,
                                np.ones_like(r))
                stats = learner.update(len(r))
            curve.append({"iteration": it, "env_steps": (it + 1) * batch_rows,
                          "phase": "measured", "reward": float(r.mean()),
                          "refused": 0.0, "seconds": time.perf_counter() - t0,
                          **{k: float(v) for k, v in stats.items()}})
    finally:
        env.close()
    return n_it


# --------------------------------------------------------------------------
# Training


def _write_curves(out_dir: Path, curves: Mapping[str, list[dict[str, Any]]]) -> None:
    folder = out_dir / "curves"
    folder.mkdir(parents=True, exist_ok=True)
    for stage, rows in curves.items():
        if not rows:
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with (folder / f"{stage}.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


def train(config: TrainConfig | None = None, out_dir: str | Path = "train-out",
          progress: bool = True, resume: bool = True,
          callback: Callable[[str, int, dict[str, float]], bool] | None = None,
          evaluate_policy: bool = True) -> TrainResult:
    """Train a policy for ``config.machine`` in the stages that apply.

    Args:
        config: what to train (:class:`TrainConfig`).
        out_dir: checkpoints, curves, ``policy.npz`` and ``summary.json``.
        progress: tqdm progress bars and printed stage lines.
        resume: continue from ``out_dir/checkpoint.npz`` if it is there and was
            written for the same configuration.
        callback: called after every iteration with ``(phase, iterations done,
            curve row)``; returning True stops training (after a checkpoint),
            as an interruption would.
        evaluate_policy: run :func:`evaluate` at the end.

    Returns:
        A :class:`TrainResult` (policy, stage reports, curves, evaluation).
    """
    config = config or TrainConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    machine = load_machine(config.machine)
    learner = make_learner(config)
    phases = _phases(config, machine)
    ckpt_path = out_dir / "checkpoint.npz"
    config_key = json.loads(json.dumps(asdict(config)))
    state: dict[str, Any] = {"config": config_key, "phase": 0, "iteration": 0,
                             "imitated": False, "wall": {},
                             "curves": {s: [] for s in ("imitation", *STAGES)}}
    if resume and ckpt_path.is_file():
        with np.load(ckpt_path, allow_pickle=False) as npz:
            saved = json.loads(str(npz["header"]))["progress"]
        if saved.get("config") == config_key:
            state = load_checkpoint(ckpt_path, learner)
            say(f"resuming from {ckpt_path}: phase {state['phase']}, "
                f"iteration {state['iteration']}")
    curves: dict[str, list[dict[str, float]]] = state["curves"]
    t_start = time.perf_counter()
    reports: dict[str, StageReport] = {}
    interrupted = False

    model_phases = [p for p in phases if p.stage == "cost-model"]
    n_labels, n_steps = config.imitation_plan
    if model_phases and n_steps > 0 and not state.get("imitated") \
            and state["phase"] == 0 and state["iteration"] == 0:
        if isinstance(learner, PPOAgent):
            t0 = time.perf_counter()
            labels = imitation_labels(config, machine, n_labels, progress)
            imitate(learner, labels, config, n_steps,
                    curves.setdefault("imitation", []), progress)
            state["wall"]["imitation"] = time.perf_counter() - t0
            last = curves["imitation"][-1]
            say(f"stage cost-model, imitation: {n_steps} steps on {n_labels} "
                f"labels of the optimum, {state['wall']['imitation']:.1f} s "
                f"(nll {last['nll']:.2f}, share error {last['share_error']:.3f}, "
                f"choice accuracy {last['choice_accuracy']:.3f})")
        else:
            say("stage cost-model, imitation: skipped (it fits the PPO "
                "learner's Dirichlet and categorical heads)")
        state["imitated"] = True
        save_checkpoint(ckpt_path, learner, state)

    for index, phase in enumerate(phases):
        rep = reports.setdefault(phase.stage, StageReport(
            phase.stage, "ran", label="PREDICTED (model)"))
        if index < state["phase"]:
            continue
        start = state["iteration"] if index == state["phase"] else 0

        def ckpt(i: int, done: int, _phase: _Phase = phase) -> None:
            n_it = max(1, math.ceil(_phase.steps / (config.plan.num_envs
                                                    * config.plan.rollout)))
            nxt = (i + 1, 0) if done >= n_it else (i, done)
            state.update(phase=nxt[0], iteration=nxt[1])
            save_checkpoint(ckpt_path, learner, state)

        t0 = time.perf_counter()
        rows = curves.setdefault(phase.stage, [])
        done, stop = _run_phase(learner, phase, index, config, start, rows, ckpt,
                                callback, progress)
        state["wall"][phase.name] = state["wall"].get(phase.name, 0.0) \
            + time.perf_counter() - t0
        if stop:
            rep.status = "interrupted"
            interrupted = True
            break
    for rep in reports.values():
        rows = curves.get(rep.name, [])
        rep.iterations = len(rows)
        rep.env_steps = int(sum(config.plan.num_envs * config.plan.rollout
                                for _ in rows))
        rep.wall_s = sum(v for k, v in state["wall"].items()
                         if any(p.name == k and p.stage == rep.name for p in phases))
        if rep.name == "cost-model":
            rep.wall_s += state["wall"].get("imitation", 0.0)
        if rep.status == "ran":
            say(f"stage {rep.name}: {rep.iterations} iterations, "
                f"{rep.env_steps} steps, {rep.wall_s:.1f} s ({rep.label})")

    if not interrupted and "measured" in config.stages:
        backend = measured_backend(machine)
        rep = StageReport("measured", "skipped")
        if backend is None:
            rep.reason = (f"{machine.name} is a simulated machine: only real "
                          "devices can be measured")
        elif state["phase"] > len(phases):
            rep.status = "ran"
        else:
            t0 = time.perf_counter()
            rows = curves.setdefault("measured", [])
            try:
                rep.iterations = _run_measured(learner, config, machine, backend,
                                               rows, progress)
                rep.status, rep.label = "ran", f"MEASURED ({backend})"
                rep.env_steps = int(rows[-1]["env_steps"]) if rows else 0
                state.update(phase=len(phases) + 1, iteration=0)
                save_checkpoint(ckpt_path, learner, state)
            except BackendUnavailable as exc:
                rep.reason = f"backend {backend} unavailable: {exc}"
            rep.wall_s = time.perf_counter() - t0
        if rep.status == "skipped":
            say(f"stage measured: skipped: {rep.reason}")
        else:
            say(f"stage measured: {rep.iterations} iterations ({rep.label})")
        reports["measured"] = rep

    _write_curves(out_dir, curves)
    policy = LearnedPolicy(learner, features=config.features,
                           use_mask=config.use_mask)
    result = TrainResult(config=config, policy=policy,
                         stages=list(reports.values()), curves=curves,
                         evaluation=None, out_dir=out_dir,
                         wall_s=time.perf_counter() - t_start,
                         interrupted=interrupted)
    if not interrupted and evaluate_policy:
        result.evaluation = evaluate(policy, machine, config.plan.eval_tasks,
                                     seed=config.eval_seed)
        say(format_evaluation(result.evaluation))
    if not interrupted:
        if isinstance(learner, PPOAgent):
            policy.save(out_dir / "policy.npz", result.summary())
        (out_dir / "summary.json").write_text(json.dumps(result.summary(), indent=2,
                                                         default=float))
    return result


def fine_tune(policy: LearnedPolicy, machine: str | Machine, steps: int, *,
              seed: int = 0, lr: float = 3e-4,
              progress: bool = False) -> LearnedPolicy:
    """A short PPO fine-tune of a copy of ``policy`` on ``machine`` (model
    backend, idle devices, tasks from 10 KB to 10 GB): the transfer experiment.

    ``steps`` environment steps in batches of at most 64 x 32; the step size
    decays from ``lr`` to ``lr / 10`` and there is no entropy bonus.

    Returns:
        The tuned policy (``policy`` itself is unchanged); its curve rows are
        in ``header["fine_tune_curve"]``.
    """
    if not isinstance(policy.learner, PPOAgent):
        raise TypeError(f"fine_tune needs a PPO policy, not "
                        f"{type(policy.learner).__name__}")
    import copy

    agent = copy.deepcopy(policy.learner)
    m = load_machine(machine)
    num_envs = max(1, min(64, steps))
    plan = replace(TRAINING_PLANS["smoke"], num_envs=num_envs,
                   rollout=max(1, min(32, steps // num_envs)))
    config = TrainConfig(machine=m.name, seed=seed, lr=lr, lr_final=lr / 10,
                         ent_coef=0.0, features=policy.features,
                         use_mask=policy.use_mask)
    phase = _Phase(f"fine-tune:{m.name}", "fine-tune", steps, EnvConfig(
        machine=m, p_busy=0.0, task_log10_bytes=MODEL_LOG10_BYTES,
        params=default_params()))
    curve: list[dict[str, float]] = []
    _run_phase(agent, phase, 1000, config, 0, curve, lambda *a: None, None,
               progress, plan=plan)
    header = {**policy.header, "fine_tune_curve": curve,
              "fine_tuned_on": m.name}
    return LearnedPolicy(agent, name=policy.name, features=policy.features,
                         use_mask=policy.use_mask, min_share=policy.min_share,
                         header=header)


# --------------------------------------------------------------------------
# Evaluation


def held_out_tasks(machine: Machine, count: int, seed: int = 7919,
                   log10_bytes: tuple[float, float] = MODEL_LOG10_BYTES
                   ) -> list[TaskSpec]:
    """``count`` tasks for ``machine`` from a generator of their own (training
    environments draw from SeedSequence-derived seeds, never this one)."""
    rng = np.random.default_rng((seed, 0xE7A1))
    return [sample_task(rng, machine, None, log10_bytes) for _ in range(count)]


def _geo(x: list[float]) -> float:
    return float(np.exp(np.mean(np.log(x))))


def evaluate(policy: Any, machine: str | Machine, tasks: int | list[TaskSpec] = 200,
             *, seed: int = 7919, backend: str = "model",
             penalty: float = 1.0) -> dict[str, Any]:
    """Geometric-mean time of ``policy`` against equal split, proportional to
    peak and the exhaustive optimum on held-out tasks (idle devices).

    With ``backend="model"`` times are PREDICTED with the machine's parameters
    (calibrated where saved); with a real backend they are MEASURED. A decision
    Gate 1 refuses counts ``e**penalty`` times the equal split's time.

    Returns:
        ``label``, ``tasks``, ``refused``, ``geo_seconds`` per policy,
        ``rl_over_opt`` (geo-mean of T_rl / T_opt), ``speedup_vs_equal``,
        ``speedup_vs_peak``, ``per_task`` (seconds per policy).
    """
    m = load_machine(machine)
    measured = backend != "model"
    task_list = tasks if isinstance(tasks, list) else held_out_tasks(
        m, tasks, seed, MEASURED_LOG10_BYTES if measured else MODEL_LOG10_BYTES)
    runner = get_backend(backend, m) if measured else None
    params = load_params(m.name) or default_params()
    names = ("rl", "equal", "proportional-peak", "optimum")
    times: dict[str, list[float]] = {k: [] for k in names}
    refused = 0
    try:
        for task in task_list:
            equal = EqualSplit().decide(task, m).with_hash(task)
            opt = optimum(task, m, None, params)
            choices = {"rl": policy.decide(task, m, None).with_hash(task),
                       "equal": equal,
                       "proportional-peak": ProportionalToPeak().decide(
                           task, m).with_hash(task),
                       "optimum": opt.decision}
            t_eq = None
            for name in ("equal", "proportional-peak", "optimum", "rl"):
                d = choices[name]
                if not check_decision(d, task, m, None).accepted:
                    refused += name == "rl"
                    times[name].append(t_eq * math.exp(penalty))
                    continue
                t = runner.run(task, d).metrics.total_seconds if measured \
                    else predict(task, d, m, None, params).total
                times[name].append(t)
                if name == "equal":
                    t_eq = t
    finally:
        if runner is not None:
            runner.close()
    geo = {k: _geo(v) for k, v in times.items()}
    return {"label": f"{'MEASURED' if measured else 'PREDICTED'} ({backend})",
            "machine": m.name, "policy": getattr(policy, "name", "policy"),
            "tasks": len(task_list), "refused": refused, "geo_seconds": geo,
            "rl_over_opt": geo["rl"] / geo["optimum"],
            "speedup_vs_equal": geo["equal"] / geo["rl"],
            "speedup_vs_peak": geo["proportional-peak"] / geo["rl"],
            "per_task": times}


def format_evaluation(ev: Mapping[str, Any]) -> str:
    """Printable lines of an :func:`evaluate` result."""
    geo = ev["geo_seconds"]
    lines = [f"held-out evaluation on {ev['machine']}, {ev['tasks']} tasks, "
             f"{ev['label']}: geometric-mean time"]
    for k in ("rl", "equal", "proportional-peak", "optimum"):
        lines.append(f"  {k:18s} {geo[k] * 1e3:10.4f} ms")
    lines.append(f"  T_rl/T_opt {ev['rl_over_opt']:.3f}, speedup vs equal "
                 f"{ev['speedup_vs_equal']:.2f}x, vs proportional-peak "
                 f"{ev['speedup_vs_peak']:.2f}x, refused by Gate 1: {ev['refused']}")
    return "\n".join(lines)


def bandit_curve(machine: str | Machine = "hetero-4", steps: int = 400,
                 seed: int = 0, base: LearnedPolicy | None = None,
                 chunk: int = 20) -> list[dict[str, float]]:
    """Online learning curve of :class:`ShareBandit` around a base decision
    (equal split by default) on ``machine`` (model backend, idle devices).

    The context is the state vector; the reward is Eq. (2). Returns one row
    per ``chunk`` decisions: ``step`` and the mean ``reward``.
    """
    enc = ObservationEncoder()
    bandit = ShareBandit(STATE_DEVICES, OBS_DIM, BanditConfig(seed=seed),
                         base=None if base is None else base.learner)
    env = SplitEnv(EnvConfig(machine=load_machine(machine).name, p_busy=0.0,
                             task_log10_bytes=MODEL_LOG10_BYTES,
                             episode_len=10**9))
    obs, _ = env.reset(seed=seed)
    rows, acc = [], []
    try:
        for step in range(steps):
            x = enc.flat(obs)
            dmask, cmasks = enc.masks(obs)
            shares, ch = bandit.propose(x, dmask, cmasks)
            if base is None:
                ch = [BLOCKS.index(256), MODES.index("split"), 0, 0]
            choice = bandit.last_choice
            obs, r, _, _, _ = env.step(action_from_choices(shares, ch))
            bandit.update(choice, float(r))
            acc.append(float(r))
            if len(acc) == chunk:
                rows.append({"step": step + 1, "reward": float(np.mean(acc))})
                acc = []
    finally:
        env.close()
    return rows


__all__ = [
    "STAGES", "TRAINING_PLANS", "StageReport", "TrainConfig", "TrainResult",
    "TrainingPlan",
    "bandit_curve", "evaluate", "fine_tune", "format_evaluation",
    "held_out_tasks", "imitate", "imitation_labels", "train",
]
