"""The seven baselines: legal decisions, and the behaviour each one promises."""

from __future__ import annotations

import pytest

from lib.contract import TaskSpec
from lib.costmodel import predict
from lib.platform.machines import load_machine, machine_from_json
from lib.platform.telemetry import busy
from lib.policies.baselines import (
    BASELINES,
    HeftGreedy,
    ProportionalToLive,
    ProportionalToPeak,
    RandomSplit,
    SingleBest,
)
from lib.policies.registry import POLICIES, make_policy
from lib.security import check_decision

SEVEN = [name for name in POLICIES if name != "rl"]

TASKS = [TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192}),
         TaskSpec("reduce", {"N": 1 << 26}),
         TaskSpec("stencil", {"H": 8192, "W": 8192, "T": 4}),
         TaskSpec("histogram", {"N": 1 << 24, "B": 512}),
         TaskSpec("elementwise", {"N": 1 << 22}, dtype="fp16")]


def test_seven_baselines():
    assert set(SEVEN) == {"equal", "single-best", "proportional-peak",
                          "proportional-live", "heft", "random", "oracle"}
    assert set(BASELINES) == set(SEVEN) - {"oracle"}
    with pytest.raises(ValueError, match="unknown policy 'magic'"):
        make_policy("magic")


#: A profile whose first card launches blocks of at most 100 threads (the
#: schema allows 64 to 1024): below the default block of 256.
SMALL_BLOCKS = {"name": "small-blocks", "devices": [
    {"catalog": "T4", "max_block": 100}, {"catalog": "L4"}, {"catalog": "A10"}]}


@pytest.mark.parametrize("name", SEVEN)
@pytest.mark.parametrize("machine", ["hetero-4", "uni-server-1gpu",
                                     "uni-server-2gpu-induced", "local-cpu",
                                     "small-blocks"])
def test_every_baseline_is_legal(name, machine):
    m = machine_from_json(SMALL_BLOCKS) if machine == "small-blocks" \
        else load_machine(machine)
    snap = busy(m, [0.5] + [0.0] * (m.n - 1))
    for task in TASKS:
        d = make_policy(name).decide(task, m, snap).with_hash(task)
        v = check_decision(d, task, m, snap)
        assert v.accepted, (name, machine, task.describe(), v.summary())


def test_a_block_every_chosen_card_can_launch():
    """Every baseline and the optimum used the default block of 256 whatever
    the cards, so on a card of max_block 100 each was refused by Gate 1 (the
    optimum said no subset of devices could hold the task)."""
    m = machine_from_json(SMALL_BLOCKS)
    assert m.block_for([0]) == 64 and m.block_for([1, 2]) == 256
    assert m.block_for([0, 1, 2]) == 64 and m.block_for([1], preferred=1024) == 1024
    for name in SEVEN:
        d = make_policy(name).decide(TASKS[1], m)
        assert d.block == m.block_for(d.gpus), name


def test_oracle_bounds_every_baseline(hetero4):
    snap = busy(hetero4, [0.0, 0.7, 0.0, 0.3])
    for task in TASKS:
        times = {name: predict(task, make_policy(name).decide(task, hetero4, snap),
                               hetero4, snap).total for name in SEVEN}
        assert times["oracle"] <= min(times.values()) * (1 + 1e-12), task.describe()


def test_live_shifts_work_off_a_busy_device(hetero4):
    task = TASKS[0]
    snap = busy(hetero4, [0.8, 0.0, 0.0, 0.0])
    peak = ProportionalToPeak().decide(task, hetero4, snap)
    live = ProportionalToLive().decide(task, hetero4, snap)
    assert live.shares[0] < peak.shares[0] / 2
    assert predict(task, live, hetero4, snap).total \
        < predict(task, peak, hetero4, snap).total


def test_single_best_follows_the_load(hetero4):
    task = TASKS[0]
    assert SingleBest().decide(task, hetero4).gpus == (0,)
    assert SingleBest().decide(task, hetero4, busy(hetero4, [0.9, 0, 0, 0])).gpus \
        == (1,)


def test_heft_beats_the_static_splits_on_hetero4(hetero4):
    for task in TASKS[:3]:
        heft = predict(task, HeftGreedy().decide(task, hetero4), hetero4).total
        peak = predict(task, ProportionalToPeak().decide(task, hetero4),
                       hetero4).total
        assert heft <= peak * 1.02, task.describe()


def test_random_is_seeded(hetero4):
    a = [RandomSplit(seed=3).decide(TASKS[1], hetero4) for _ in range(1)]
    b = [RandomSplit(seed=3).decide(TASKS[1], hetero4) for _ in range(1)]
    assert a == b
    assert RandomSplit(seed=4).decide(TASKS[1], hetero4) != a[0]


def test_the_optimum_searches_the_machines_calibrated_model(tmp_path, monkeypatch):
    """A calibration that makes every extra shard cost the host a second
    keeps the optimum on one core, where the default model splits the task."""
    from dataclasses import replace

    from lib.costmodel.model import default_params
    from lib.costmodel.parameters import save_params
    from lib.policies.oracle import Oracle

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    machine = load_machine("local-cpu")
    if machine.n < 2:
        pytest.skip("local-cpu has one core here: nothing to split")
    task = TaskSpec("matmul", {"M": 2048, "N": 1024, "K": 1024})
    assert len(Oracle().decide(task, machine).gpus) == machine.n   # defaults
    costly = replace(default_params(), host_s={"cpu": 1.0},
                     source="a test's calibration")
    save_params("local-cpu", costly)
    assert len(Oracle().decide(task, machine).gpus) == 1
