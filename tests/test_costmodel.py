"""Eq. (1), first version: shapes of the prediction and its basic invariants."""

from __future__ import annotations

import math

import pytest

from lib.baselines import EqualSplit, ProportionalToPeak
from lib.contract import Decision, TaskSpec
from lib.costmodel import predict
from lib.telemetry import busy

MATMUL = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192})


def test_proportional_gives_the_t4_less_than_the_h100(hetero4):
    d = ProportionalToPeak().decide(MATMUL, hetero4)
    shares = dict(zip(d.gpus, d.shares, strict=True))
    assert shares[3] < shares[0]
    assert math.fsum(d.shares) == pytest.approx(1.0, abs=1e-12)


def test_proportional_beats_equal_on_hetero4(hetero4):
    eq = predict(MATMUL, EqualSplit().decide(MATMUL, hetero4), hetero4)
    pp = predict(MATMUL, ProportionalToPeak().decide(MATMUL, hetero4), hetero4)
    assert pp.total < eq.total


def test_breakdown_adds_up(hetero4):
    d = EqualSplit().decide(MATMUL, hetero4)
    p = predict(MATMUL, d, hetero4)
    assert len(p.devices) == 4 and not p.measured
    assert p.total == pytest.approx(max(x.total for x in p.devices) + p.t_merge)
    assert all(x.t_comp > 0 and x.t_in > 0 for x in p.devices)


def test_zero_share_device_costs_nothing(hetero4):
    d = Decision(gpus=(0, 3), shares=(1.0, 0.0), chunk=8192)
    p = predict(MATMUL, d, hetero4)
    assert p.devices[1].total == 0.0 and p.devices[1].rows == 0


def test_more_work_never_takes_less_time(hetero4):
    d = Decision(gpus=(0, 1), shares=(0.5, 0.5), chunk=1024)
    last = 0.0
    for m in (256, 1024, 4096, 8192, 16384):
        t = predict(TaskSpec("matmul", {"M": m, "N": 4096, "K": 4096}), d,
                    hetero4).total
        assert t >= last
        last = t


def test_busy_device_is_slower(hetero4):
    d = Decision(gpus=(0,), shares=(1.0,), chunk=8192, mode="single")
    idle_t = predict(MATMUL, d, hetero4).total
    busy_t = predict(MATMUL, d, hetero4, busy(hetero4, [0.5, 0, 0, 0])).total
    assert busy_t > idle_t


def test_pipelining_overlaps_copy_and_compute(hetero4):
    task = TaskSpec("elementwise", {"N": 1 << 28})
    split = Decision(gpus=(0,), shares=(1.0,), chunk=1 << 28, mode="single")
    piped = Decision(gpus=(0,), shares=(1.0,), chunk=1 << 24, mode="pipelined")
    assert predict(task, piped, hetero4).total < predict(task, split, hetero4).total


def test_sum_merge_paths_are_priced(hetero4):
    task = TaskSpec("histogram", {"N": 1 << 26, "B": 4096})
    totals = {}
    for path in ("host", "p2p", "nccl"):
        d = Decision(gpus=(0, 1), shares=(0.6, 0.4), chunk=1 << 26, comm_path=path)
        p = predict(task, d, hetero4)
        assert p.t_merge > 0 and math.isfinite(p.total)
        totals[path] = p.total
    assert len(set(totals.values())) == 3
