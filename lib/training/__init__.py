"""Training a split policy in three stages, with checkpoints, curves and a verdict.

:func:`train` runs, for one target machine:

1. **cost model**, the model backend with the uncalibrated parameters, in two
   parts:

   a. *imitate the exact optimum on the cost model*
      (:func:`imitation_labels`, :func:`imitate`): tasks drawn as stage 1b
      draws them (every curriculum stage, then the target machine mixed with
      the catalog) are labelled with :func:`lib.policies.oracle.optimum`'s
      decision, turned into the environment's action (shares on the device
      slots; block, mode, path and chunk-count indices), and the set policy
      fits them (:meth:`SetPPOAgent.imitation_update`: cross-entropy and a
      makespan term on the water-filled shares, cross-entropy on the heads;
      the critic regresses the optimum's reward ``log(T_eq / T_opt)``). The
      labels are drawn once, reused for every step, and kept as PPO's
      demonstrations; ``imitation_steps=0`` skips this part, and TD3 skips it;
   b. *PPO over the curriculum* (:data:`lib.env.DEFAULT_STAGES`: identical,
      mixed, shipped, busy, catalog; 1 to 16 devices), every step with the
      imitation loss on the demonstrations added (as DAPG does), then a last
      part that mixes the target machine (idle and loaded) with the catalog
      (``target_mix``), so the one policy keeps serving every machine. With
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
of one-step episodes (each terminates) and the advantage is ``reward - V(s)``.
Iteration ``k`` of a stage resets its environments with a seed derived from
``(seed, stage, k)``: the data an iteration sees depends only on the seed and
the iteration, so a run that resumes from a checkpoint (learner weights,
optimiser moments, random generator state, curves; the demonstrations from
``imitation.npz``) ends exactly where an uninterrupted run with the same seed
ends. The learner is any
:class:`lib.learners.TrainableLearner` (PPO or TD3).

At the end the policy is evaluated on held-out tasks of the target machine
(:func:`lib.scoring.evaluate_policy` on :func:`lib.scoring.held_out_tasks`, a
seed of their own, never an environment's) against equal split,
proportional-to-peak and the exhaustive optimum, labelled PREDICTED or MEASURED
with the backend.

Modules:

- :mod:`lib.training.config` -- :class:`TrainingPlan` per budget,
  :class:`TrainConfig`, :func:`make_learner`, the reports;
- :mod:`lib.training.checkpoints` -- learner state and progress in one file;
- :mod:`lib.training.phases` -- the model-backend parts of a run and their seeds;
- :mod:`lib.training.imitation` -- stage 1a, labels of the optimum and cloning;
- :mod:`lib.training.rollouts` -- iterations of a model-backend phase;
- :mod:`lib.training.measured` -- stage 3 on the real backend;
- :mod:`lib.training.trainer` -- :func:`train` and :func:`fine_tune`;
- :mod:`lib.training.bandit` -- :func:`bandit_curve`, online adaptation;
- :mod:`lib.training.threads` -- one BLAS thread while training.
"""

from lib.training.bandit import bandit_curve
from lib.training.checkpoints import load_checkpoint, save_checkpoint
from lib.training.config import (
    LEARNERS,
    STAGES,
    TRAINING_PLANS,
    StageReport,
    TrainConfig,
    TrainingPlan,
    TrainResult,
    make_learner,
)
from lib.training.imitation import imitate, imitation_labels
from lib.training.measured import measured_backend
from lib.training.trainer import fine_tune, train

__all__ = [
    "LEARNERS", "STAGES", "TRAINING_PLANS", "StageReport", "TrainConfig",
    "TrainResult", "TrainingPlan",
    "bandit_curve", "fine_tune", "imitate", "imitation_labels", "load_checkpoint",
    "make_learner", "measured_backend", "save_checkpoint", "train",
]
