"""The seeded task sets every score is computed on.

Three distributions, each for its own question, all here so that none is
written twice:

- :func:`task_set` -- the evaluation's ladder: every kind at sizes spaced
  geometrically between a small and a large end (four orders of magnitude of
  work), the same for the same seed. Table 4 is computed on it.
- :func:`random_tasks` -- log-uniform sizes over the same range, every task
  different: for decision latency, where a repeated task would hit a cache.
- :func:`held_out_tasks` -- the training distribution
  (:func:`lib.env.curriculum.sample_task`) drawn from a generator of its own,
  so no training environment ever sees these tasks.

A ladder is one for every machine, and a large rung may not fit a machine
with little memory: its equal split, the reference of every speedup, would be
refused by Gate 1 and could not run. :func:`fit_tasks` makes such a task
smaller, as the training distribution does, and says which.

The size ranges differ by backend: large enough on the model backend to stress
real GPUs, small enough on measured CPU cores to finish in minutes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from lib.budgets import pick
from lib.contract import KINDS, TaskSpec
from lib.env.curriculum import fitting_equal_split, sample_task
from lib.env.split import MODEL_LOG10_BYTES
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot

Ladder = dict[str, tuple[dict[str, int], dict[str, int]]]

#: Sizes per kind as (small, large); the ladder between them is geometric.
SIZES_MODEL: Ladder = {
    "matmul": ({"M": 256, "N": 256, "K": 256}, {"M": 16384, "N": 8192, "K": 8192}),
    "reduce": ({"N": 1 << 16}, {"N": 1 << 30}),
    "elementwise": ({"N": 1 << 15}, {"N": 1 << 29}),
    "stencil": ({"H": 128, "W": 128, "T": 4}, {"H": 16384, "W": 16384, "T": 4}),
    "histogram": ({"N": 1 << 15, "B": 256}, {"N": 1 << 29, "B": 256}),
}
SIZES_MEASURED: Ladder = {
    "matmul": ({"M": 16, "N": 64, "K": 64}, {"M": 2048, "N": 1024, "K": 1024}),
    "reduce": ({"N": 1 << 11}, {"N": 1 << 25}),
    "elementwise": ({"N": 1 << 10}, {"N": 1 << 24}),
    "stencil": ({"H": 8, "W": 64, "T": 2}, {"H": 8192, "W": 1024, "T": 2}),
    "histogram": ({"N": 1 << 10, "B": 256}, {"N": 1 << 24, "B": 256}),
}
#: Dimensions that stay at the small end (time steps, bins): not a size.
FIXED_DIMS = ("T", "B")
#: Each step of :func:`fit_tasks` scales a task's sizes by this.
SHRINK_STEP = 0.8


def ladder(backend: str) -> Ladder:
    """The size range for ``backend`` (model: GPU sizes; measured: CPU sizes)."""
    return SIZES_MODEL if backend == "model" else SIZES_MEASURED


def task_set(backend: str, budget: str, seed: int = 0) -> list[TaskSpec]:
    """The evaluation tasks: every kind on a geometric ladder of sizes.

    The ladder scales the dimensions from the small to the large end
    (``smoke`` 2 rungs over the lower half of the range in log scale, ``quick``
    4 over all of it, ``full`` 6); a seeded jitter of a few percent keeps sizes
    off round numbers, the same for the same seed.
    """
    rungs = pick(budget, smoke=2, quick=4, full=6)
    reach = pick(budget, smoke=0.5, quick=1.0, full=1.0)  # smoke: the lower half
    ladders = ladder(backend)
    rng = np.random.default_rng((seed, 0xE7A1))
    tasks = []
    for kind in KINDS:
        small, large = ladders[kind]
        for r in range(rungs):
            f = reach * r / max(1, rungs - 1)
            dims = {}
            for name in small:
                lo, hi = small[name], large[name]
                fixed = name in FIXED_DIMS
                value = lo if fixed else lo * (hi / lo) ** f
                jitter = 1.0 if fixed else 1.0 + 0.03 * rng.random()
                dims[name] = max(1, int(value * jitter))
            tasks.append(TaskSpec(kind, dims))
    return tasks


def random_tasks(n: int, backend: str = "model", seed: int = 0) -> list[TaskSpec]:
    """``n`` tasks of random kinds and log-uniform sizes over the ladders' range
    (every one different: for latency, where a repeated task would be cached)."""
    ladders = ladder(backend)
    rng = np.random.default_rng((seed, 0x1A7E))
    out = []
    for _ in range(n):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        small, large = ladders[kind]
        f = float(rng.random())
        out.append(TaskSpec(kind, {k: max(1, int(small[k] * (large[k] / small[k]) ** f
                                                 * (1 + 0.01 * rng.random())))
                                   if k not in FIXED_DIMS else small[k]
                                   for k in small}))
    return out


def held_out_tasks(machine: Machine, count: int, seed: int = 7919,
                   log10_bytes: tuple[float, float] = MODEL_LOG10_BYTES
                   ) -> list[TaskSpec]:
    """``count`` tasks for ``machine`` from the training distribution, drawn from
    a generator of their own (training environments draw from
    SeedSequence-derived seeds, never this one)."""
    rng = np.random.default_rng((seed, 0xE7A1))
    return [sample_task(rng, machine, None, log10_bytes) for _ in range(count)]


def fit_tasks(tasks: Sequence[TaskSpec], machine: Machine,
              snapshots: Sequence[Snapshot | None] = (None,)
              ) -> tuple[list[TaskSpec], list[str]]:
    """The tasks, each made smaller where its equal split does not fit on
    ``machine`` under one of ``snapshots`` (Gate 1 refuses it, for memory),
    so that the speedup over the equal split is defined on every task.

    A task's sizes but its fixed ones (:data:`FIXED_DIMS`) shrink by
    :data:`SHRINK_STEP` a step, keeping their proportions, until its equal
    split fits everywhere; a task that does not fit even at one row is left
    out.

    Returns:
        The tasks, in order, and one line for each task made smaller or left
        out (empty when every task fits as it is).
    """
    out, changed = [], []
    for task in tasks:
        fitted = _fit(task, machine, snapshots)
        if fitted is None:
            changed.append(f"{task.describe()} left out: its equal split does "
                           f"not fit on {machine.name} even at one row")
            continue
        if fitted != task:
            changed.append(f"{task.describe()} made {fitted.describe()}: its "
                           f"equal split did not fit in {machine.name}'s memory")
        out.append(fitted)
    return out, changed


def _fit(task: TaskSpec, machine: Machine,
         snapshots: Sequence[Snapshot | None]) -> TaskSpec | None:
    """``task``, or the first smaller one whose equal split fits; None where
    none does."""
    scale = 1.0
    while True:
        dims = {k: v if k in FIXED_DIMS else max(1, int(v * scale))
                for k, v in task.dims.items()}
        smaller = dataclasses.replace(task, dims=dims)
        if all(fitting_equal_split(smaller, machine, snap) is not None
               for snap in snapshots):
            return smaller
        if all(v == 1 for k, v in dims.items() if k not in FIXED_DIMS):
            return None
        scale *= SHRINK_STEP
