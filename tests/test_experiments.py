"""The experiments' scoring: a refused decision costs what the environment
charges it, in Table 4's ablations and the transfer test alike."""

from __future__ import annotations

import math

import pytest

from lib.contract import Decision
from lib.env.split import EnvConfig
from lib.evaluation.experiments import PENALTY, _score, acceptance, states
from lib.platform.machines import load_machine
from lib.policies.baselines import EqualSplit
from lib.scoring import task_set


class _Refused:
    """Every decision names a device the machine does not have."""

    name = "refused"

    def decide(self, task, machine, telemetry=None):
        return Decision(gpus=(machine.n,), shares=(1.0,), chunk=task.split_size)


def test_a_refused_decision_costs_the_environments_penalty(hetero4):
    assert PENALTY == EnvConfig().penalty == 1.0
    tasks = task_set("model", "smoke")
    speedup, ratio = _score(_Refused(), hetero4, tasks, None)
    assert speedup == pytest.approx(math.exp(-PENALTY))
    equal_speedup, equal_ratio = _score(EqualSplit(), hetero4, tasks, None)
    assert equal_speedup == pytest.approx(1.0)
    assert ratio == pytest.approx(equal_ratio * math.exp(PENALTY))


def test_acceptance_rows_cover_both_states(hetero4):
    rows = acceptance(EqualSplit(), [load_machine("uni-server-2gpu-induced")],
                      task_set("model", "smoke"))
    assert [r["state"] for r in rows] == [s for s, _ in states(hetero4)]
    for r in rows:
        assert r["speedup"] == pytest.approx(1.0) and r["rl_over_opt"] >= 1.0
        assert r["label"] == "PREDICTED (model)" and r["notes"] == []
