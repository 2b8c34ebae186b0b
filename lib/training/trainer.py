"""Training runs: :func:`train` (every stage that applies, with checkpoints)
and :func:`fine_tune` (a short PPO run on another machine).

Files under ``out_dir``: ``checkpoint.npz`` (resume state), ``imitation.npz``
(stage 1a's labels, PPO's demonstrations on a resumed run too),
``curves/<stage>.csv`` (one row per iteration; ``curves/imitation.csv`` for
stage 1a), ``policy.npz`` (PPO), ``summary.json``.
"""

from __future__ import annotations

import copy
import csv
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from lib import scoring
from lib.costmodel import default_params
from lib.env import DEFAULT_STAGES, EnvConfig
from lib.env.curriculum import TRAINING_MODELS, TRAINING_TOPOLOGIES
from lib.env.split import MODEL_LOG10_BYTES
from lib.execution import BackendUnavailable
from lib.learners import TrainableLearner
from lib.learners.setppo import SetPPOAgent
from lib.platform.machines import Machine, load_machine
from lib.policies.learned import LearnedPolicy
from lib.training.checkpoints import load_checkpoint, read_progress, save_checkpoint
from lib.training.config import (
    STAGES,
    TRAINING_PLANS,
    StageReport,
    TrainConfig,
    TrainResult,
    make_learner,
)
from lib.training.imitation import (
    can_imitate,
    imitate,
    imitation_labels,
    load_labels,
    save_labels,
)
from lib.training.measured import measured_backend, run_measured
from lib.training.phases import Phase, phase_iterations, plan_phases
from lib.training.rollouts import run_phase
from lib.training.threads import single_blas_thread


def _write_curves(out_dir: Path, curves: Mapping[str, list[dict[str, Any]]]) -> None:
    """One CSV per stage with rows under ``out_dir/curves``."""
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


def _imitation_stage(learner: TrainableLearner, config: TrainConfig,
                     machine: Machine, state: dict[str, Any], progress: bool,
                     say: Callable[..., None], labels_path: Path) -> None:
    """Stage 1a on ``learner`` where it can imitate; records it in ``state``
    and keeps the labels at ``labels_path`` (PPO's demonstrations)."""
    n_labels, n_steps = config.imitation_plan
    if can_imitate(learner):
        curves = state["curves"]
        t0 = time.perf_counter()
        labels = imitation_labels(config, machine, n_labels, progress)
        save_labels(labels_path, labels)
        imitate(learner, labels, config, n_steps,
                curves.setdefault("imitation", []), progress)
        learner.demonstrate(labels)
        state["wall"]["imitation"] = time.perf_counter() - t0
        last = curves["imitation"][-1]
        say(f"stage cost-model, imitation: {n_steps} steps on {n_labels} "
            f"labels of the optimum, {state['wall']['imitation']:.1f} s "
            f"(share error {last['share_error']:.3f}, left-out devices "
            f"{last['excluded_ok']:.3f}, choice accuracy "
            f"{last['choice_accuracy']:.3f})")
    else:
        say("stage cost-model, imitation: skipped (it fits the set PPO "
            "learner's heads)")
    state["imitated"] = True


def _measured_stage(learner: TrainableLearner, config: TrainConfig,
                    machine: Machine, state: dict[str, Any], n_phases: int,
                    ckpt_path: Path, progress: bool) -> StageReport:
    """Stage 3 where the machine has a real backend (else its report says why
    not); a checkpoint after it."""
    backend = measured_backend(machine, config.finetune_backend)
    rep = StageReport("measured", "skipped")
    if backend is None:
        rep.reason = (f"{machine.name} is a simulated machine: only real "
                      "devices can be measured")
    elif config.plan.measured == 0:
        rep.reason = "0 fine-tune steps asked for"
    elif state["phase"] > n_phases:
        rep.status = "ran"
    else:
        t0 = time.perf_counter()
        rows = state["curves"].setdefault("measured", [])
        try:
            rep.iterations = run_measured(learner, config, machine, backend,
                                          rows, progress)
            rep.status, rep.label = "ran", f"MEASURED ({backend})"
            rep.env_steps = int(rows[-1]["env_steps"]) if rows else 0
            state.update(phase=n_phases + 1, iteration=0)
            save_checkpoint(ckpt_path, learner, state)
        except BackendUnavailable as exc:
            rep.reason = f"backend {backend} unavailable: {exc}"
        rep.wall_s = time.perf_counter() - t0
    return rep


def train(config: TrainConfig | None = None, out_dir: str | Path = "train-out",
          progress: bool = True, resume: bool = True,
          callback: Callable[[str, int, dict[str, float]], bool] | None = None,
          evaluate_policy: bool = True) -> TrainResult:
    """Train a policy for ``config.machine`` in the stages that apply (see
    :func:`_train`), with one BLAS thread (:mod:`lib.training.threads`)."""
    with single_blas_thread():
        return _train(config, out_dir, progress, resume, callback, evaluate_policy)


def _train(config: TrainConfig | None = None, out_dir: str | Path = "train-out",
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
    if "measured" in config.stages:
        measured_backend(machine, config.finetune_backend)  # refuse before training
    learner = make_learner(config)
    phases = plan_phases(config, machine)
    ckpt_path = out_dir / "checkpoint.npz"
    labels_path = out_dir / "imitation.npz"
    config_key = json.loads(json.dumps(asdict(config)))
    state: dict[str, Any] = {"config": config_key, "phase": 0, "iteration": 0,
                             "imitated": False, "wall": {},
                             "curves": {s: [] for s in ("imitation", *STAGES)}}
    if resume and ckpt_path.is_file() \
            and read_progress(ckpt_path).get("config") == config_key:
        state = load_checkpoint(ckpt_path, learner)
        say(f"resuming from {ckpt_path}: phase {state['phase']}, "
            f"iteration {state['iteration']}")
    curves: dict[str, list[dict[str, float]]] = state["curves"]
    t_start = time.perf_counter()
    reports: dict[str, StageReport] = {}
    interrupted = False

    if any(p.stage == "cost-model" for p in phases) \
            and config.imitation_plan[1] > 0 and not state.get("imitated") \
            and state["phase"] == 0 and state["iteration"] == 0:
        _imitation_stage(learner, config, machine, state, progress, say,
                         labels_path)
        save_checkpoint(ckpt_path, learner, state)
    elif can_imitate(learner) and labels_path.is_file():
        learner.demonstrate(load_labels(labels_path))  # a resumed run's

    for index, phase in enumerate(phases):
        rep = reports.setdefault(phase.stage, StageReport(
            phase.stage, "ran", label="PREDICTED (model)"))
        if index < state["phase"]:
            continue
        start = state["iteration"] if index == state["phase"] else 0

        def ckpt(i: int, done: int, _phase: Phase = phase) -> None:
            nxt = (i + 1, 0) if done >= phase_iterations(_phase, config.plan) \
                else (i, done)
            state.update(phase=nxt[0], iteration=nxt[1])
            save_checkpoint(ckpt_path, learner, state)

        t0 = time.perf_counter()
        rows = curves.setdefault(phase.stage, [])
        done, stop = run_phase(learner, phase, index, config, start, rows, ckpt,
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
        rep = _measured_stage(learner, config, machine, state, len(phases),
                              ckpt_path, progress)
        if rep.status == "skipped":
            say(f"stage measured: skipped: {rep.reason}")
        else:
            say(f"stage measured: {rep.iterations} iterations, "
                f"{rep.env_steps} steps, {rep.wall_s:.1f} s ({rep.label})")
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
        tasks = scoring.held_out_tasks(machine, config.plan.eval_tasks,
                                       config.eval_seed)
        result.evaluation = scoring.evaluate_policy(policy, machine, tasks)
        say(scoring.format_evaluation(result.evaluation))
    if not interrupted:
        # Policy files hold set PPO learners only (LearnedPolicy.save).
        if isinstance(learner, SetPPOAgent):
            policy.save(out_dir / "policy.npz", result.summary(),
                        trained_on(config, machine))
        (out_dir / "summary.json").write_text(json.dumps(result.summary(), indent=2,
                                                         default=float))
    return result


def trained_on(config: TrainConfig, machine: Machine) -> dict[str, Any]:
    """What a run trains on, for the policy file's header (and
    :meth:`LearnedPolicy.notes`): the most devices, the card models and
    device kinds, the topologies."""
    models = {d.name for d in machine.devices if d.kind != "cpu"}
    most = machine.n
    kinds = {d.kind for d in machine.devices}
    if config.curriculum:
        models |= set(TRAINING_MODELS)
        most = max(most, max(s.devices[1] for s in DEFAULT_STAGES))
        kinds |= {"gpu", "cpu"}
    return {"max_devices": most, "models": sorted(models), "kinds": sorted(kinds),
            "topologies": list(TRAINING_TOPOLOGIES) if config.curriculum else []}


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

    Raises:
        TypeError: ``policy`` does not hold a :class:`SetPPOAgent` (the
            schedule above is PPO's).
    """
    if not isinstance(policy.learner, SetPPOAgent):
        raise TypeError(f"fine_tune needs a PPO policy, not "
                        f"{type(policy.learner).__name__}")
    agent = copy.deepcopy(policy.learner)
    m = load_machine(machine)
    num_envs = max(1, min(64, steps))
    plan = replace(TRAINING_PLANS["smoke"], num_envs=num_envs,
                   rollout=max(1, min(32, steps // num_envs)))
    config = TrainConfig(machine=m.name, seed=seed, lr=lr, lr_final=lr / 10,
                         ent_coef=0.0, features=policy.features,
                         use_mask=policy.use_mask)
    phase = Phase(f"fine-tune:{m.name}", "fine-tune", steps, EnvConfig(
        machine=m, p_busy=0.0, task_log10_bytes=MODEL_LOG10_BYTES,
        params=default_params()))
    curve: list[dict[str, float]] = []
    # Phase index 1000: seeds of their own, apart from any training run's.
    with single_blas_thread():
        run_phase(agent, phase, 1000, config, 0, curve, lambda *a: None, None,
                  progress, plan=plan)
    header = {**policy.header, "fine_tune_curve": curve,
              "fine_tuned_on": m.name}
    return LearnedPolicy(agent, name=policy.name, features=policy.features,
                         use_mask=policy.use_mask, min_share=policy.min_share,
                         header=header)
