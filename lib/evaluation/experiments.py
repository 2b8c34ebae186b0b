"""The experiments around the learned policy: ablations, transfer, acceptance.

All are PREDICTED on the model backend and scored by the one evaluator,
:func:`lib.scoring.evaluate_policy`, which charges a decision Gate 1 refuses
what the environment charges it (its ``penalty``: ``e**penalty`` equal splits):

- ablations: the shipped policy with parts of its observation removed at
  decision time, without its action mask, and two short trainings with and
  without the curriculum;
- transfer: zero-shot on machines never trained on (the first with 12 or
  more devices), then after a short fine-tune;
- acceptance: per machine and state (idle, busy), the policy's time over the
  optimum's and its speedup over equal split against HEFT's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

from lib.budgets import pick
from lib.contract import TaskSpec
from lib.costmodel.parameters import params_for
from lib.env.curriculum import held_out_machines
from lib.env.split import EnvConfig
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot, busy, idle
from lib.policies.baselines import HeftGreedy, Policy
from lib.policies.learned import LearnedPolicy, load_policy
from lib.scoring import evaluate_policy, task_set
from lib.training import TrainConfig, fine_tune, train


def learned_policy(path: str | None, notes: list[str],
                   **options: Any) -> LearnedPolicy | None:
    """The learned policy (the shipped one, or the file at ``path``), or None
    with the reason appended to ``notes``."""
    try:
        return load_policy(path, **options)
    except (FileNotFoundError, ValueError) as exc:
        notes.append(f"learned policy not loaded: {exc}")
        return None


#: What a refused decision costs here: the environment's penalty (log units).
PENALTY = EnvConfig().penalty


def _score(policy: Policy, machine: Machine, tasks: Sequence[TaskSpec],
           snap: Snapshot | None) -> tuple[float, float]:
    """(geo-mean speedup over equal, geo-mean T/T_opt) on the model backend; a
    refused decision costs what the environment charges it, ``e**PENALTY``
    equal splits."""
    ev = evaluate_policy(policy, machine, tasks, telemetry=snap,
                         params=params_for(machine.name), penalty=PENALTY)
    return ev["speedup_vs_equal"], ev["rl_over_opt"]


def states(machine: Machine) -> list[tuple[str, Snapshot]]:
    """The evaluation's two states: idle, and busy (the first device at 70 %)."""
    return [("idle", idle(machine)),
            ("busy", busy(machine, [0.7 if i == 0 else 0.0
                                    for i in range(machine.n)]))]


def acceptance(policy: Policy, machines: Sequence[Machine],
               tasks: Sequence[TaskSpec] | None = None) -> list[dict[str, Any]]:
    """The learned policy against the optimum and HEFT, per machine and state
    (PREDICTED, model backend, the machines' parameters).

    Args:
        policy: the policy scored.
        machines: where.
        tasks: the task set (default ``task_set("model", "quick")``).

    Returns:
        One row per machine and state: ``machine``, ``devices``, ``state``,
        ``rl_over_opt``, ``speedup``, ``heft_speedup``, ``heft_over_opt``,
        ``peak_over_opt`` (proportional to peak's T/T_opt), ``refused``,
        ``notes`` (the policy's, where it says), ``label``.
    """
    tasks = list(tasks) if tasks is not None else task_set("model", "quick")
    heft = HeftGreedy()
    rows = []
    for machine in machines:
        notes = getattr(policy, "notes", None)
        for name, snap in states(machine):
            params = params_for(machine.name)
            ev = evaluate_policy(policy, machine, tasks, telemetry=snap,
                                 params=params, penalty=PENALTY)
            eh = evaluate_policy(heft, machine, tasks, telemetry=snap,
                                 params=params, penalty=PENALTY)
            rows.append({"machine": machine.name, "devices": machine.n,
                         "state": name, "rl_over_opt": ev["rl_over_opt"],
                         "speedup": ev["speedup_vs_equal"],
                         "heft_speedup": eh["speedup_vs_equal"],
                         "heft_over_opt": eh["rl_over_opt"],
                         "peak_over_opt": (ev["geo_seconds"]["proportional-peak"]
                                           / ev["geo_seconds"]["optimum"]),
                         "refused": ev["refused"],
                         "notes": notes(machine) if callable(notes) else [],
                         "label": ev["label"]})
    return rows


def run_ablations(machine, tasks, policy_path, notes, budget,
                  source: str | None = None, curriculum: bool = True
                  ) -> list[dict[str, Any]]:
    """The learned policy without parts of what it sees (PREDICTED).

    Args:
        source: what names ``machine`` for training (its profile's path
            where it came from one); default its name.
        curriculum: also train two short policies, with and without the
            curriculum (:func:`_curriculum_ablation`); a measured evaluation
            leaves them out, since training for a real machine runs its
            measured stage there.
    """
    out = []
    snap = busy(machine, [0.7 if i == 0 else 0.0 for i in range(machine.n)])
    variants = [("full", {}, "the shipped policy"),
                ("no telemetry features", {"features": "no-telemetry"},
                 "telemetry entries of the state zeroed at decision time"),
                ("no topology features", {"features": "no-topology"},
                 "topology entries of the state zeroed at decision time"),
                ("no action mask", {"use_mask": False},
                 "masks ignored; Gate 1 refuses what is illegal (a refusal "
                 "costs what the environment charges)")]
    for name, options, how in variants:
        policy = learned_policy(policy_path, notes, **options)
        if policy is None:
            continue
        speed, ratio = _score(policy, machine, tasks, snap)
        out.append({"variant": name, "speedup": speed, "ratio_to_optimum": ratio,
                    "how": how, "label": "PREDICTED (model)"})
    if curriculum:
        out += _curriculum_ablation(machine, tasks, snap, budget,
                                    source or machine.name)
    return out


def _curriculum_ablation(machine, tasks, snap, budget, source: str
                         ) -> list[dict[str, Any]]:
    """Two short trainings for ``source`` (a machine's name or profile path),
    with and without the curriculum, compared alike."""
    out = []
    short = "smoke" if budget != "full" else "quick"
    for name, flag in (("curriculum (short run)", True),
                       ("no curriculum (short run)", False)):
        with tempfile.TemporaryDirectory() as tmp:
            result = train(TrainConfig(machine=source, budget=short, seed=1,
                                       curriculum=flag), tmp, progress=False)
            speed, ratio = _score(result.policy, machine, tasks, snap)
        out.append({"variant": name, "speedup": speed, "ratio_to_optimum": ratio,
                    "how": f"trained from scratch with the {short} budget",
                    "label": "PREDICTED (model)"})
    return out


def run_transfer(learned, budget: str, seed: int, notes: list[str]
              ) -> list[dict[str, Any]]:
    """Zero-shot on machines never trained on (the first has 12 or more
    devices), then after a short fine-tune."""
    count = pick(budget, smoke=1, quick=2, full=4)
    out = []
    for machine in held_out_machines(seed, count):
        tasks = task_set("model", "smoke", seed)
        snap = idle(machine)
        speed, ratio = _score(learned, machine, tasks, snap)
        names = "+".join(sorted({d.name for d in machine.devices}))
        out.append({"machine": f"{machine.name} ({names})", "when": "zero-shot",
                    "speedup": speed, "ratio_to_optimum": ratio})
        tuned = fine_tune(learned, machine, steps=pick(budget, smoke=64, quick=512,
                                                       full=4096), seed=seed)
        speed, ratio = _score(tuned, machine, tasks, snap)
        out.append({"machine": f"{machine.name} ({names})", "when": "fine-tuned",
                    "speedup": speed, "ratio_to_optimum": ratio})
    return out
