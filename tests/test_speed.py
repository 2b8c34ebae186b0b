"""A device's speed against the cost model, learned from MEASURED runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lib.contract import TaskSpec, decision_from_weights
from lib.costmodel.history import History, HistoryError
from lib.costmodel.model import compute_seconds, corun_factors, default_params
from lib.costmodel.parameters import params_for
from lib.costmodel.speed import (
    MIN_SPEED_SAMPLES,
    SPEED_DEADBAND,
    device_speed,
    equal_shard_seconds,
    relative_speeds,
    run_speeds,
    speed_snapshot,
)
from lib.execution.base import ExecutionMetrics, Result
from lib.platform.machines import load_machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import workload
from lib.policies.registry import make_policy
from lib.runtime import Agent

FREE = Snapshot("local-cpu", (0.0, 0.0), (8e9, 8e9), (True, True),
                measured=True, capacity=(1.0, 1.0))
LOADED = Snapshot("local-cpu", (1.0, 0.0), (8e9, 8e9), (True, True),
                  measured=True, capacity=(1 / 3, 1.0))


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    return tmp_path


def test_a_run_measures_each_devices_speed_beside_the_others():
    # device 1 took twice the model's seconds, device 0 the model's
    logs = run_speeds({0: 0.01, 1: 0.01}, {0: 0.01, 1: 0.02})
    assert np.exp(logs[0]) == pytest.approx(2 ** 0.5)
    assert np.exp(logs[1]) == pytest.approx(2 ** -0.5)
    # whatever the run's devices share cancels: a model wrong by 3x everywhere
    assert run_speeds({0: 0.01, 1: 0.01}, {0: 0.03, 1: 0.03}) == {
        0: pytest.approx(0.0), 1: pytest.approx(0.0)}
    # a fixed cost paid alike pulls the ratio towards 1, never past it
    fixed = run_speeds({0: 0.01, 1: 0.01}, {0: 0.01 + 0.01, 1: 0.02 + 0.01})
    assert 0 < fixed[0] < logs[0]
    assert run_speeds({0: 0.01}, {0: 0.02}) == {}           # one device: nothing
    assert run_speeds({0: 0.01, 1: 0.0}, {0: 0.02, 1: 0.01}) == {}


def test_the_speed_is_a_median_and_needs_enough_samples():
    assert device_speed([0.1] * (MIN_SPEED_SAMPLES - 1)) is None
    samples = [np.log(0.5)] * 6 + [np.log(100.0), np.log(0.001)] + [np.log(0.5)]
    assert device_speed(samples) == pytest.approx(0.5)     # two outliers shrugged


def test_only_a_slower_device_outside_the_deadband_loses_capacity():
    assert relative_speeds({0: 1.0, 1: 0.5}, [0, 1]) == {1: 0.5}
    assert relative_speeds({0: 1.3, 1: 1.3 * (1 - SPEED_DEADBAND / 2)}, [0, 1]) == {}
    assert relative_speeds({0: 1.0}, [0, 1]) == {}       # device 1 never measured
    assert relative_speeds({0: 1.0, 1: 0.5}, [1]) == {}  # nothing to compare
    seen = speed_snapshot(LOADED, {0: 1.0, 1: 0.5})
    assert seen.capacity == (pytest.approx(1 / 3), pytest.approx(0.5))
    assert "history" in seen.capacity_provenance[1]
    assert speed_snapshot(FREE, {0: 1.0, 1: 0.95}) is FREE
    assert speed_snapshot(None, {0: 1.0, 1: 0.5}) is None


def _run_on(machine, task, devices, weights, slow: dict[int, float], params,
            measured: bool = True, fixed: dict[int, float] | None = None):
    """A run whose device i took ``slow[i]`` times the model's compute
    seconds, plus ``fixed[i]`` seconds (0.2 ms each by default)."""
    from lib.platform.workloads import split_rows
    dec = decision_from_weights(task, list(devices), list(weights)).with_hash(task)
    w = workload(task)
    bounds = split_rows(task.split_size, dec.shares)
    active = [g for g, (lo, hi) in zip(dec.gpus, bounds, strict=True) if hi > lo]
    corun = corun_factors(machine, active, params)
    seconds = {}
    for g, (lo, hi) in zip(dec.gpus, bounds, strict=True):
        if hi > lo:
            model = compute_seconds(task, w.work(task, hi - lo), machine, g, params)
            seconds[g] = (fixed or {}).get(g, 2e-4) + slow[g] * model * corun[g]
    metrics = ExecutionMetrics(backend="cpu", measured=measured,
                               per_device_seconds=seconds,
                               total_seconds=max(seconds.values()))
    return task, dec, Result(None, metrics, task, dec)


BIG = TaskSpec("elementwise", {"N": 1 << 24})


def _teach(h: History, machine, params, slow, snapshot=FREE, task=BIG, runs=12,
           fixed=None):
    for k in range(runs):
        t = TaskSpec(task.kind, {"N": task.dims["N"] + k})
        h.update(*_run_on(machine, t, (0, 1), (0.5, 0.5), slow, params,
                          fixed=fixed), snapshot, machine, params)


def _lengths(task, machine, params):
    return equal_shard_seconds(task, machine, params, [0, 1])


def test_the_history_learns_each_free_devices_speed_and_round_trips(home):
    machine = load_machine("local-cpu")
    params = params_for("local-cpu")
    h = History("local-cpu")
    _teach(h, machine, params, {0: 1.0, 1: 2.0})
    at = _lengths(BIG, machine, params)
    speeds = h.speeds("elementwise", "fp32", at)
    # relative to each other: device 1 at half of device 0, within the pull
    # of the 0.2 ms fixed cost towards 1
    assert speeds[1] / speeds[0] == pytest.approx(0.5, rel=0.05)
    assert speeds[1] / speeds[0] >= 0.5
    assert h.speeds("matmul", "fp32", at) == {}
    small = _lengths(TaskSpec("elementwise", {"N": 1 << 14}), machine, params)
    assert h.speeds("elementwise", "fp32", small) == {}   # no shard that short
    h.save()
    again = History.load("local-cpu")
    assert again.speeds("elementwise", "fp32", at) == speeds
    assert History.peek("local-cpu").speeds("elementwise", "fp32", at) == speeds


def test_speeds_are_kept_by_length_of_shard():
    # Device 1 pays 2 ms that device 0 does not (on the cpu backend: the host
    # process sits on its core): short shards there run at a fraction of
    # device 0's speed, long ones at nearly the same.
    machine = load_machine("local-cpu")
    params = params_for("local-cpu")
    short = TaskSpec("elementwise", {"N": 1 << 16})
    h = History("local-cpu")
    for task in (short, BIG):
        _teach(h, machine, params, {0: 1.0, 1: 1.0}, task=task,
               fixed={0: 1e-4, 1: 2.1e-3})
    s_short = h.speeds("elementwise", "fp32", _lengths(short, machine, params))
    s_long = h.speeds("elementwise", "fp32", _lengths(BIG, machine, params))
    assert s_short[1] / s_short[0] < 0.5
    assert s_long[1] / s_long[0] > 1 - SPEED_DEADBAND


def test_a_contended_device_one_device_or_no_model_gives_no_sample():
    machine = load_machine("local-cpu")
    params = params_for("local-cpu")
    h = History("local-cpu")
    _teach(h, machine, params, {0: 3.0, 1: 1.0}, snapshot=LOADED)
    assert h.speeds_kept == {}            # device 0 was loaded: no fair comparison
    task = TaskSpec("elementwise", {"N": 1 << 20})
    for _ in range(MIN_SPEED_SAMPLES + 2):
        h.update(*_run_on(machine, task, (0,), (1.0,), {0: 1.0}, params), FREE,
                 machine, params)                                # one device
        h.update(*_run_on(machine, task, (0, 1), (0.5, 0.5), {0: 1.0, 1: 1.0},
                          params), FREE)                         # no model
    assert h.speeds_kept == {}


def test_malformed_speed_entry_is_refused_in_one_line(home):
    machine = load_machine("local-cpu")
    params = default_params()
    h = History("local-cpu")
    _teach(h, machine, params, {0: 1.0, 1: 1.0})
    path = h.save()
    obj = json.loads(path.read_text())
    for bad, says in (([float("nan")], "finite"),
                      ([30.0], "finite"),
                      (["x"], "could not convert")):
        obj["speeds"][0]["samples"] = bad
        path.write_text(json.dumps(obj))
        with pytest.raises(HistoryError, match=f"speed entry 0: .*{says}") as err:
            History.load("local-cpu")
        assert "\n" not in str(err.value)
        with pytest.raises(HistoryError):
            History.peek("local-cpu")
    obj["speeds"][0]["samples"] = [0.0]
    obj["speeds"][0]["octave"] = 2.5
    path.write_text(json.dumps(obj))
    with pytest.raises(HistoryError, match="speed entry 0: octave 2.5"):
        History.load("local-cpu")


@pytest.mark.parametrize("policy", ["oracle", "heft", "rl-ppo"])
def test_every_policy_moves_work_off_a_device_the_history_measured_slower(policy):
    machine = load_machine("local-cpu")
    params = params_for("local-cpu")
    task = TaskSpec("elementwise", {"N": 1 << 24})
    chosen = make_policy(policy, 0) if policy != "rl-ppo" else None
    agent = Agent(policy=chosen, machine=machine, telemetry=FREE)
    before = agent.optimize(task)
    h = History("local-cpu")
    _teach(h, machine, params, {0: 1.0, 1: 2.0})
    h.save()
    seen = agent.seen_by_policy(task)
    assert seen.capacity[0] == 1.0 and seen.capacity[1] == pytest.approx(0.5, rel=0.05)
    after = agent.optimize(task)
    share = dict(zip(after.gpus, after.shares, strict=True)).get(1, 0.0)
    share_before = dict(zip(before.gpus, before.shares, strict=True)).get(1, 0.0)
    assert share_before == pytest.approx(0.5, abs=0.05)
    assert share < share_before - 0.1


def test_cli_shows_each_devices_speed(capsys):
    import argparse

    from lib.cli import history as history_cli
    machine = load_machine("local-cpu")
    params = params_for("local-cpu")
    h = History("local-cpu")
    _teach(h, machine, params, {0: 1.0, 1: 2.0})
    h.save()
    parser = argparse.ArgumentParser()
    history_cli.add_parser(parser.add_subparsers())
    assert history_cli.run(parser.parse_args(["history", "--machine",
                                              "local-cpu"])) == 0
    text = capsys.readouterr().out
    assert "speed beside the other devices, against the cost model" in text
    assert "elementwise  fp32        1" in text and "  0.7" in text  # 2 ** -0.5

    assert history_cli.run(parser.parse_args(["history", "--machine", "local-cpu",
                                              "--json"])) == 0
    obj = json.loads(capsys.readouterr().out)
    by_device = {s["device"]: s for s in obj["speeds"]}
    assert by_device[1]["g"] / by_device[0]["g"] == pytest.approx(0.5, rel=0.05)
    assert by_device[1]["runs"] == 12 and len(by_device[1]["samples"]) == 12
