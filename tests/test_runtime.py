"""The runtime Agent: optimize (policy, hash, Gate 1) and execute (Gate 1, run)."""

from __future__ import annotations

import pytest

from lib.contract import Decision, TaskSpec
from lib.policies.baselines import EqualSplit
from lib.runtime import Agent, DecisionRejected

TASK = TaskSpec("matmul", {"M": 2048, "N": 2048, "K": 2048})


def test_default_agent_uses_the_shipped_policy_on_hetero4():
    agent = Agent()
    d = agent.optimize(TASK)
    assert agent.policy.name == "rl-ppo"
    assert len(d.config_hash) == 64 and agent.validate(TASK, d).accepted
    r = agent.execute(TASK, d)
    assert r.metrics.label == "PREDICTED (model)"


def test_without_a_policy_file_the_default_is_proportional(monkeypatch, tmp_path):
    import lib.policies.learned as policy

    monkeypatch.setattr(policy, "DEFAULT_POLICY", tmp_path / "missing.npz")
    assert Agent().policy.name == "proportional-peak"


def test_execute_refuses_a_tampered_decision():
    agent = Agent(policy=EqualSplit())
    d = agent.optimize(TASK)
    tampered = Decision(**{**d.__dict__, "shares": (0.7, 0.1, 0.1, 0.1)})
    with pytest.raises(DecisionRejected, match="integrity.hash_mismatch"):
        agent.execute(TASK, tampered)


class _Rogue:
    name = "rogue"

    def decide(self, task, machine, telemetry=None):
        return Decision(gpus=(0, 9), shares=(0.5, 0.5), chunk=1)


def test_optimize_never_trusts_the_policy():
    with pytest.raises(DecisionRejected) as info:
        Agent(policy=_Rogue()).optimize(TASK)
    assert "feasibility.device" in info.value.verdict.checks


def test_agent_on_local_cpu_measures(local_cpu):
    task = TaskSpec("reduce", {"N": 100_000})
    with Agent(machine="local-cpu", backend="cpu") as agent:
        r = agent.execute(task, agent.optimize(task), verify=True)
    assert r.metrics.measured and r.metrics.verified
