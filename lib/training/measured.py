"""Stage 3: learning from measured runs on the target machine's real backend.

One environment (:class:`SplitEnv` on ``cpu`` or ``cuda``), tasks of
:data:`MEASURED_LOG10_BYTES`, small batches: each iteration measures
``batch_rows`` decisions (4 to 16) and updates the learner once. A simulated
machine has no real backend (:func:`measured_backend` is None).
"""

from __future__ import annotations

import time

import numpy as np
from tqdm.auto import tqdm

from lib.env import EnvConfig, SplitEnv
from lib.env.split import MEASURED_LOG10_BYTES
from lib.learners import TrainableLearner
from lib.platform.machines import Machine
from lib.policies.learned import action_from_choices
from lib.training.config import TrainConfig, encoder_for
from lib.training.phases import stage_seed

#: Off-policy gradient steps per measured transition (a real run is costly,
#: so each earns a full gradient step where a model step earns 1/8).
MEASURED_REPLAY_RATIO = 1.0
#: The phase index that seeds the measured stage's iterations.
MEASURED_PHASE_SEED = 99


def measured_backend(machine: Machine, requested: str | None = None) -> str | None:
    """The real backend stage 3 runs on: ``requested`` if given, else the
    machine's first real backend (``cpu``, ``cuda``, ``dask``); None if the
    machine is simulated.

    Raises:
        ValueError: ``requested`` is not one of the machine's real backends.
    """
    if machine.simulated:
        return None
    real = tuple(getattr(machine, "real_backends", ()) or ()) or ("cuda",)
    if requested is None:
        return real[0]
    if requested not in real:
        raise ValueError(f"finetune backend {requested!r}: machine "
                         f"{machine.name} runs on {', '.join(real)}")
    return requested


def run_measured(learner: TrainableLearner, config: TrainConfig, machine: Machine,
                 backend: str, curve: list[dict[str, float]],
                 progress: bool) -> int:
    """Stage 3: ``config.plan.measured`` steps of ``learner`` on rewards
    measured with ``backend``, one curve row per iteration.

    Returns:
        The iterations run.

    Raises:
        BackendUnavailable: the backend cannot run here.
    """
    steps = config.plan.measured
    batch_rows = max(4, min(16, steps))
    n_it = max(1, steps // batch_rows)
    enc = encoder_for(learner, config)
    env = SplitEnv(EnvConfig(machine=machine, backend=backend,
                             penalty=config.penalty,
                             task_log10_bytes=MEASURED_LOG10_BYTES,
                             backend_options={"seed": config.seed}))
    try:
        for it in tqdm(range(n_it), desc="measured", disable=not progress,
                       leave=False):
            obs, _ = env.reset(seed=stage_seed(config.seed, MEASURED_PHASE_SEED, it))
            t0 = time.perf_counter()
            rewards = []
            for _ in range(batch_rows):
                # A batch of one: the learner's interface is batched.
                dmask, cmasks = enc.masks(obs)
                shares, choices = learner.explore(
                    enc.flat(obs)[None], dmask[None],
                    [None if m is None else m[None] for m in cmasks])
                _, r, _, _, _ = env.step(action_from_choices(shares[0],
                                                             choices[0]))
                learner.record(np.array([r]))
                rewards.append(r)
                obs, _ = env.reset()  # every task is an episode of its own
            r = np.asarray(rewards)
            stats = learner.learn(MEASURED_REPLAY_RATIO)
            curve.append({"iteration": it, "env_steps": (it + 1) * batch_rows,
                          "phase": "measured", "reward": float(r.mean()),
                          "refused": 0.0, "seconds": time.perf_counter() - t0,
                          **{k: float(v) for k, v in stats.items()}})
    finally:
        env.close()
    return n_it
