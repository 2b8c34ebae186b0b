"""The exhaustive optimum: exact shares, and never behind the static baselines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.contract import Decision, TaskSpec
from lib.costmodel import predict
from lib.costmodel.model import split_time_coefficients
from lib.platform.machines import GPU_CATALOG, machine_from_json
from lib.platform.telemetry import busy
from lib.policies.baselines import EqualSplit, ProportionalToPeak
from lib.policies.oracle import equalised_rows, optimum
from lib.security import check_decision

MODELS = sorted(GPU_CATALOG)

tasks = st.one_of(
    st.builds(lambda m, n, k: TaskSpec("matmul", {"M": m, "N": n, "K": k}),
              st.integers(64, 16384), st.integers(64, 8192), st.integers(64, 8192)),
    st.builds(lambda n: TaskSpec("reduce", {"N": n}), st.integers(1 << 10, 1 << 28)),
    st.builds(lambda n: TaskSpec("elementwise", {"N": n}),
              st.integers(1 << 10, 1 << 28)),
    st.builds(lambda h, w, t: TaskSpec("stencil", {"H": h, "W": w, "T": t}),
              st.integers(64, 16384), st.integers(64, 8192), st.integers(1, 16)),
    st.builds(lambda n, b: TaskSpec("histogram", {"N": n, "B": b}),
              st.integers(1 << 10, 1 << 28), st.integers(1, 4096)),
)


@st.composite
def machines(draw, low=1, high=5):
    models = draw(st.lists(st.sampled_from(MODELS), min_size=low, max_size=high))
    n = len(models)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    linked = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return machine_from_json({
        "name": "random", "nccl": draw(st.booleans()),
        "devices": [{"catalog": m} for m in models],
        "peers": [{"a": a, "b": b, "kind": draw(st.sampled_from(["nvlink", "pcie4"]))}
                  for a, b in linked]})


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(tasks, machines(), st.data())
def test_optimum_never_slower_than_the_baselines(task, machine, data):
    util = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 0.9]),
                              min_size=machine.n, max_size=machine.n))
    snap = busy(machine, util)
    try:
        best = optimum(task, machine, snap)
    except ValueError:
        return  # nothing fits anywhere: the baselines cannot run it either
    assert check_decision(best.decision, task, machine, snap).accepted
    assert np.isfinite(best.total) and best.total > 0
    for policy in (EqualSplit(), ProportionalToPeak()):
        d = policy.decide(task, machine, snap)
        assert best.total <= predict(task, d, machine, snap).total * (1 + 1e-12)


def test_coefficients_reproduce_the_model(hetero4):
    task = TaskSpec("stencil", {"H": 8192, "W": 4096, "T": 4})
    for i in range(hetero4.n):
        a, b, c, d, e, f = split_time_coefficients(task, hetero4, i)
        for rows in (1, 17, 1000, 4000):
            share = rows / task.split_size
            dec = Decision(gpus=(i, (i + 1) % 4), shares=(share, 1 - share),
                           chunk=task.split_size)
            t = predict(task, dec, hetero4).devices[0].total
            assert t == pytest.approx(a + b * rows + max(c + d * rows, e + f * rows),
                                      rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(tasks, machines(low=2, high=3))
def test_equalised_shares_match_a_fine_grid_search(task, machine):
    """Exact shares beat (or tie) the best of a 1/2000-step grid, both priced by
    the full model in split mode over the host path."""
    n, k = task.split_size, machine.n
    coef = np.array([split_time_coefficients(task, machine, i) for i in range(k)])
    rmax = np.full(k, float(n))
    t, rows = equalised_rows(coef, rmax, np.ones((1, k), bool), n)
    shares = rows[0] / rows[0].sum()

    def price(sh):
        d = Decision(gpus=tuple(range(k)), shares=tuple(sh), chunk=n)
        return max(x.total for x in predict(task, d, machine).devices)

    exact = price(shares)
    grid = np.linspace(0, 1, 2001)
    if k == 2:
        best = min(price((s, 1 - s)) for s in grid)
    else:
        coarse = np.linspace(0, 1, 201)
        best = min(price((x, y, max(0.0, 1 - x - y))) for x in coarse
                   for y in coarse if x + y <= 1)
    one_row = max(coef[:, 1] + np.maximum(coef[:, 3], coef[:, 5]))
    assert exact <= best + 2 * one_row + 1e-12


def test_optimum_on_hetero4_beats_equal_by_a_lot(hetero4):
    task = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192})
    best = optimum(task, hetero4)
    equal = predict(task, EqualSplit().decide(task, hetero4), hetero4).total
    assert equal / best.total > 2.0
    assert best.decision.config_hash and best.candidates > 10


def test_single_gpu_machine_gets_single_mode():
    m = machine_from_json({"name": "one", "devices": [{"catalog": "A10"}]})
    best = optimum(TaskSpec("reduce", {"N": 1 << 20}), m)
    assert best.decision.gpus == (0,) and best.decision.mode in ("single", "pipelined")


def test_unhealthy_devices_are_left_out(hetero4):
    snap = busy(hetero4, [0, 0, 0, 0], healthy=[False, True, True, True])
    best = optimum(TaskSpec("reduce", {"N": 1 << 24}), hetero4, snap)
    assert 0 not in best.decision.gpus
