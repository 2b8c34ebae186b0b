"""The runtime Agent: optimize (policy, hash, Gate 1) and execute (Gate 1, run),
with the one shipped policy on every machine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lib.contract import Decision, TaskSpec
from lib.learners.ppo import PolicyFormatError
from lib.platform.machines import load_machine, machine_from_json
from lib.platform.telemetry import Snapshot
from lib.policies.baselines import EqualSplit
from lib.policies.learned import DEFAULT_POLICY
from lib.runtime import Agent, DecisionRejected

TASK = TaskSpec("matmul", {"M": 2048, "N": 2048, "K": 2048})


def test_default_agent_uses_the_shipped_policy_on_hetero4():
    agent = Agent()
    d = agent.optimize(TASK)
    assert agent.policy.name == "rl-ppo"
    assert len(d.config_hash) == 64 and agent.validate(TASK, d).accepted
    r = agent.execute(TASK, d)
    assert r.metrics.label == "PREDICTED (model)"


@pytest.mark.parametrize("machine", ["uni-server-1gpu", "uni-server-2gpu-induced",
                                     "local-cpu"])
def test_the_shipped_policy_is_the_default_on_every_machine(machine):
    agent = Agent(machine=machine)
    assert agent.policy.name == "rl-ppo"
    d = agent.optimize(TASK)
    assert set(d.gpus) <= set(range(agent.machine.n))


def test_a_policy_file_path_is_a_policy(tmp_path):
    path = tmp_path / "mine.npz"
    path.write_bytes(DEFAULT_POLICY.read_bytes())
    for spec in (str(path), path):
        agent = Agent(policy=spec)
        assert agent.policy.name == "rl-ppo"
        assert agent.optimize(TASK) == Agent().optimize(TASK)


def test_without_a_policy_file_the_default_is_proportional(monkeypatch, tmp_path):
    import lib.policies.learned as policy

    monkeypatch.setattr(policy, "DEFAULT_POLICY", tmp_path / "missing.npz")
    assert Agent().policy.name == "proportional-peak"


def test_a_broken_shipped_file_is_an_error_not_a_baseline(monkeypatch, tmp_path):
    import lib.policies.learned as policy

    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a policy")
    monkeypatch.setattr(policy, "DEFAULT_POLICY", broken)
    with pytest.raises(PolicyFormatError, match="not a readable policy file"):
        Agent()


def test_a_policy_is_named_as_on_the_command_line(tmp_path):
    """``Agent(policy="heft")`` is the policy ``gpuhive run --policy heft``
    runs; before, a name was read as a file that did not exist."""
    task = TaskSpec("reduce", {"N": 1 << 20})
    for name in ("heft", "oracle", "equal", "rl"):
        agent = Agent(policy=name, machine="hetero-4")
        assert agent.optimize(task).config_hash
    assert Agent(policy="equal").policy.name == "equal"
    with pytest.raises(ValueError, match="unknown policy 'hetf'; known: rl, "):
        Agent(policy="hetf")
    with pytest.raises(PolicyFormatError, match="does not exist"):
        Agent(policy=tmp_path / "mine.npz")


def test_notes_say_where_a_machine_is_outside_training():
    inside = Agent(machine="hetero-4")
    assert inside.notes() == []
    big = machine_from_json({"name": "big-h200", "devices": [
        {"catalog": "H200 SXM"} for _ in range(20)]})
    notes = Agent(machine=big).notes()
    assert len(notes) == 2
    assert "20 devices" in notes[0] and "at most 16" in notes[0]
    assert "H200 SXM" in notes[1]
    assert Agent(policy=EqualSplit(), machine=big).notes() == []


def test_the_shipped_header_says_what_it_was_trained_on():
    with np.load(DEFAULT_POLICY, allow_pickle=False) as npz:
        head = json.loads(str(npz["header"]))
    seen = head["trained_on"]
    assert seen["max_devices"] >= 16
    assert "H100 SXM" in seen["models"] and "H200 SXM" not in seen["models"]


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


@pytest.mark.serial
def test_agent_on_local_cpu_measures(local_cpu):
    task = TaskSpec("reduce", {"N": 100_000})
    with Agent(machine="local-cpu", backend="cpu") as agent:
        r = agent.execute(task, agent.optimize(task), verify=True)
    assert r.metrics.measured and r.metrics.verified


def test_sixteen_devices_are_decided(hetero4):
    sixteen = machine_from_json({"name": "sixteen", "nccl": True, "devices": [
        {"catalog": d.name} for d in hetero4.devices] * 4})
    d = Agent(machine=sixteen).optimize(TaskSpec("reduce", {"N": 1 << 28}))
    assert len(d.gpus) >= 8
    assert load_machine(sixteen).n == 16


def _first_core_busy():
    """A measured local-cpu snapshot, as many cores as this computer lends,
    the first at a third of its capacity."""
    n = load_machine("local-cpu").n
    return Snapshot("local-cpu", (1.0,) + (0.0,) * (n - 1), (1e9,) * n, (True,) * n,
                    measured=True, capacity=(1 / 3,) + (1.0,) * (n - 1))


def test_the_policy_sees_what_a_shard_of_the_task_will_get_on_a_busy_core(
        tmp_path, monkeypatch):
    """With a history of what shards felt on a busy core, the policy decides
    under the capacity effective for the task's length; Gate 1 and the
    history keep the live snapshot."""
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    from lib.costmodel.history import History
    from lib.execution.base import ExecutionMetrics, Result
    class Recording(EqualSplit):
        def decide(self, task, machine, telemetry=None):
            self.seen = telemetry
            return super().decide(task, machine, telemetry)

    live = _first_core_busy()
    small = TaskSpec("elementwise", {"N": 1000})
    h = History("local-cpu")
    for _ in range(8):   # short shards on the busy core ran as on a free one
        d = EqualSplit().decide(small, load_machine("local-cpu")).with_hash(small)
        m = ExecutionMetrics(backend="cpu", measured=True,
                             per_device_seconds={g: 2e-4 for g in d.gpus},
                             total_seconds=3e-4,
                             per_device_cpu_seconds={g: 2e-4 for g in d.gpus})
        h.update(small, d, Result(None, m, small, d), live)
    policy = Recording()
    agent = Agent(policy=policy, machine="local-cpu", telemetry=live)
    agent.optimize(small)
    assert policy.seen.capacity[0] == pytest.approx(1 / 3)   # nothing saved yet
    h.save()
    agent.optimize(small)
    assert policy.seen.capacity[0] == pytest.approx(1.0)
    assert agent.telemetry is live and agent.seen_by_policy(small) is not live
    idle = Agent(policy=policy, machine="local-cpu")
    assert idle.seen_by_policy(small) is None


def test_the_calibrated_burst_stands_in_until_the_history_has_one(tmp_path,
                                                                    monkeypatch):
    """A calibration fitted on runs under load says how long a woken shard
    runs free; the runtime uses it on a busy core while the device's history
    has no figure of its own, and the history's once it has."""
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    from dataclasses import replace

    from lib.costmodel.history import History
    from lib.costmodel.model import default_params
    from lib.costmodel.parameters import save_params
    from lib.execution.base import ExecutionMetrics, Result
    live = _first_core_busy()
    short = TaskSpec("elementwise", {"N": 1000})
    long = TaskSpec("elementwise", {"N": 1 << 27})
    agent = Agent(policy=EqualSplit(), machine="local-cpu", telemetry=live)
    assert agent.seen_by_policy(short).capacity[0] == pytest.approx(1 / 3)
    save_params("local-cpu", replace(default_params(), burst_s={"cpu": 0.05}))
    assert agent.seen_by_policy(short).capacity[0] == pytest.approx(1.0)
    assert 1 / 3 < agent.seen_by_policy(long).capacity[0] < 0.5
    h = History("local-cpu")
    for _ in range(8):   # these short shards felt all of the load
        d = EqualSplit().decide(short, load_machine("local-cpu")).with_hash(short)
        m = ExecutionMetrics(backend="cpu", measured=True,
                             per_device_seconds={g: 6e-4 for g in d.gpus},
                             total_seconds=7e-4,
                             per_device_cpu_seconds={g: 2e-4 for g in d.gpus})
        h.update(short, d, Result(None, m, short, d), live)
    h.save()
    assert agent.seen_by_policy(short).capacity[0] < 0.5


def test_a_malformed_history_stops_a_decision_under_contention_in_one_line(
        tmp_path, monkeypatch):
    """The policy would decide under capacities read from a file that is not a
    history: the runtime names the file instead (and leaves it as it is)."""
    from lib.costmodel.history import HistoryError, history_path

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    path = history_path("local-cpu")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    live = _first_core_busy()
    n = len(live.capacity)
    agent = Agent(policy=EqualSplit(), machine="local-cpu", telemetry=live)
    with pytest.raises(HistoryError, match="local-cpu.json: malformed history") as err:
        agent.optimize(TaskSpec("elementwise", {"N": 1000}))
    assert "\n" not in str(err.value) and path.read_text() == "{not json"
    # without contention the history is not read, and the decision is made
    quiet = Agent(policy=EqualSplit(), machine="local-cpu")
    assert quiet.optimize(TaskSpec("elementwise", {"N": 1000})).gpus == tuple(
        range(n))


# -- live telemetry: the runtime reads its devices itself -----------------------

def _count_reads(monkeypatch, snap=None, error=None):
    """Replace the runtime's live reader; returns the list its calls append to."""
    import lib.runtime as runtime
    calls = []

    def read(machine, backend, **_):
        calls.append(backend)
        if error is not None:
            raise error
        return snap
    monkeypatch.setattr(runtime, "live_snapshot", read)
    return calls


def test_auto_reads_the_devices_on_the_cpu_and_cuda_backends(monkeypatch):
    """On the model backend nothing is read, nor on dask unless asked; on the
    cpu backend the policy
    decides under the snapshot read now, one read serving the decisions of
    the next LIVE_MAX_AGE_S seconds (the backend itself never starts)."""
    import lib.runtime as runtime

    busy = _first_core_busy()
    calls = _count_reads(monkeypatch, busy)
    model = Agent(policy=EqualSplit(), machine="local-cpu")
    assert model.telemetry is None and model.seen_by_policy(TASK) is None
    assert calls == []

    class Recording(EqualSplit):
        def decide(self, task, machine, telemetry=None):
            self.seen = telemetry
            return super().decide(task, machine, telemetry)
    policy = Recording()
    agent = Agent(policy=policy, machine="local-cpu", backend="cpu")
    agent.optimize(TASK)
    assert policy.seen.capacity[0] == pytest.approx(1 / 3)
    agent.optimize(TASK)
    assert calls == ["cpu"]                    # still young: read once
    monkeypatch.setattr(runtime, "LIVE_MAX_AGE_S", 0.0)
    agent.optimize(TASK)
    assert calls == ["cpu", "cpu"] and agent._backend is None
    none = Agent(policy=policy, machine="local-cpu", backend="cpu", telemetry=None)
    none.optimize(TASK)
    assert policy.seen is None and calls == ["cpu", "cpu"]
    # a Dask worker's heartbeat counts our own shards as load: read only if asked
    dask = Agent(policy=policy, machine="local-cpu", backend="dask")
    dask.optimize(TASK)
    assert policy.seen is None and calls == ["cpu", "cpu"]
    Agent(policy=policy, machine="local-cpu", backend="dask",
          telemetry="live").optimize(TASK)
    assert calls == ["cpu", "cpu", "dask"]


def test_auto_goes_on_without_telemetry_it_cannot_read_and_says_so(monkeypatch):
    from lib.platform.telemetry import TelemetryError

    calls = _count_reads(monkeypatch,
                         error=TelemetryError("NVML telemetry: no driver"))
    agent = Agent(policy=EqualSplit(), machine="local-cpu", backend="cuda")
    assert agent.optimize(TASK).gpus and agent.telemetry is None
    assert agent.notes() == ["deciding without telemetry: NVML telemetry: "
                             "no driver"]
    assert calls == ["cuda"]                   # not tried again each decision
    live = Agent(policy=EqualSplit(), machine="local-cpu", backend="cuda",
                 telemetry="live")
    with pytest.raises(TelemetryError, match="no driver"):
        live.optimize(TASK)
    # a reading without capacity (NVML listing no compute processes) has only
    # a utilisation that counts our own kernels: auto leaves it, live uses it
    n = load_machine("local-cpu").n
    util_only = Snapshot("nvml", (0.9,) * n, (1e9,) * n, (True,) * n, measured=True)
    _count_reads(monkeypatch, util_only)
    agent = Agent(policy=EqualSplit(), machine="local-cpu", backend="cuda")
    assert agent.telemetry is None and "utilisation only" in agent.notes()[0]
    live = Agent(policy=EqualSplit(), machine="local-cpu", backend="cuda",
                 telemetry="live")
    assert live.telemetry is util_only


def test_live_telemetry_needs_real_devices_and_a_known_word(monkeypatch):
    from lib.platform.telemetry import TelemetryError

    calls = _count_reads(monkeypatch, _first_core_busy())
    with pytest.raises(TelemetryError, match="hetero-4 is simulated"):
        Agent(machine="hetero-4", telemetry="live")
    with pytest.raises(ValueError, match="telemetry 'yes'"):
        Agent(machine="hetero-4", telemetry="yes")
    # on the model backend, live reads the machine's real devices
    Agent(policy=EqualSplit(), machine="local-cpu", telemetry="live").optimize(TASK)
    assert calls == ["cpu"]


def test_a_snapshot_with_another_device_count_is_refused(monkeypatch):
    import lib.runtime as runtime
    from lib.platform.telemetry import TelemetryError

    machine = load_machine("local-cpu")
    one_too_many = Snapshot("local-cpu", (0.0,) * (machine.n + 1),
                            (1e9,) * (machine.n + 1), (True,) * (machine.n + 1),
                            measured=True)
    monkeypatch.setattr(runtime, "local_cpu_snapshot", lambda *a, **k: one_too_many)
    with pytest.raises(TelemetryError, match=f"reports {machine.n + 1} device"):
        runtime.live_snapshot(machine, "cpu")
    with pytest.raises(TelemetryError, match="'model' has no devices"):
        runtime.live_snapshot(machine, "model")


@pytest.mark.serial
def test_a_busy_core_is_decided_for_and_learned_from_at_its_capacity(
        local_cpu, tmp_path, monkeypatch):
    """With a process spinning on the first core, the default agent on the cpu
    backend gives that core less than the others and its run teaches the
    history what the busy core's shard felt; decided as if idle (telemetry
    None), the same run would teach the history that the core is slow."""
    from lib.costmodel.history import History
    from lib.execution.load import CoreLoad

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    if local_cpu.n < 2:
        pytest.skip("one core: nothing to move work to")
    task = TaskSpec("elementwise", {"N": 1 << 22})
    load = CoreLoad(_core(0))
    load.start()
    try:
        with Agent(machine="local-cpu", backend="cpu") as agent:
            decision = agent.optimize(task)
            assert agent.telemetry.capacity[0] <= 0.6
            agent.execute(task, decision)
        history = History.load("local-cpu")
        assert any(f.device == 0 for f in history.felt.values())
        assert history.speeds_kept == {}
        with Agent(machine="local-cpu", backend="cpu", telemetry=None) as blind:
            blind.execute(task, blind.optimize(task))
        assert History.load("local-cpu").speeds_kept   # the mislearning
    finally:
        load.stop()
    pos = decision.gpus.index(0)
    assert decision.shares[pos] < max(decision.shares) - 0.1


def _core(device: int) -> int:
    import os
    return sorted(os.sched_getaffinity(0))[device]


def test_a_malformed_history_stops_a_measured_run_before_it_starts(tmp_path,
                                                                  monkeypatch):
    """A MEASURED run updates the machine's history: where that file is not a
    history, the run is refused before any work (its result would be lost),
    and the file is left as it was."""
    from lib.costmodel.history import HistoryError, history_path

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    path = history_path("local-cpu")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")

    class Measuring:
        name, measured, runs = "cpu", True, 0

        def run(self, task, decision, verify=False):
            self.runs += 1
            raise AssertionError("ran")

        def close(self):
            pass
    backend = Measuring()
    agent = Agent(policy=EqualSplit(), machine="local-cpu", backend=backend,
                  telemetry=None)
    small = TaskSpec("elementwise", {"N": 1000})
    with pytest.raises(HistoryError, match="malformed history"):
        agent.execute(small, agent.optimize(small))
    assert backend.runs == 0 and path.read_text() == "{not json"


def test_telemetry_can_be_set_after_the_agent_is_made(monkeypatch):
    """agent.telemetry takes what the constructor takes; a snapshot set on an
    agent whose model backend already runs is what the model predicts under."""
    from lib.platform.telemetry import busy as busy_snapshot

    calls = _count_reads(monkeypatch, _first_core_busy())
    agent = Agent(policy=EqualSplit(), machine="local-cpu")
    first = agent.execute(TASK, agent.optimize(TASK)).metrics.total_seconds
    m = load_machine("local-cpu")
    slow = busy_snapshot(m, [0.9] * m.n)
    agent.telemetry = slow
    assert agent.telemetry is slow
    later = agent.execute(TASK, agent.optimize(TASK)).metrics.total_seconds
    assert later > first                    # predicted under the busy devices
    agent.telemetry = "live"                # the model backend: local-cpu's cores
    assert agent.telemetry.capacity[0] == pytest.approx(1 / 3)
    assert calls == ["cpu"]
    with pytest.raises(ValueError, match="telemetry 'often'"):
        agent.telemetry = "often"
