"""Scoring: how any policy is measured, in one place, below training.

SB3's ``common/evaluation.py`` is the model: one evaluator for every policy
(learned, baseline or the optimum), used by the training pipeline for its
held-out check and by the evaluation harness (:mod:`lib.evaluation`) for
Table 4, the ablations and the transfer test.

- :mod:`lib.scoring.metrics` -- geometric mean and its bootstrap interval;
- :mod:`lib.scoring.tasks` -- the seeded task sets (the evaluation ladder,
  log-uniform fresh tasks, held-out tasks from the training distribution);
- :mod:`lib.scoring.policy` -- :func:`evaluate_policy`: a policy against equal
  split, proportional to peak and the exhaustive optimum on a task set;
- :mod:`lib.scoring.latency` -- :func:`decision_latency`: ``optimize``
  (decide, hash, Gate 1) timed on fresh tasks.
"""

from lib.scoring.latency import decision_latency
from lib.scoring.metrics import bootstrap_ci, geomean
from lib.scoring.policy import evaluate_policy, format_evaluation
from lib.scoring.tasks import fit_tasks, held_out_tasks, random_tasks, task_set

__all__ = [
    "bootstrap_ci", "decision_latency", "evaluate_policy", "format_evaluation",
    "fit_tasks", "geomean", "held_out_tasks", "random_tasks", "task_set",
]
