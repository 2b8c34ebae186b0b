"""Eq. (1), first version: shapes of the prediction and its basic invariants."""

from __future__ import annotations

import math
from dataclasses import replace as _replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.contract import Decision, TaskSpec
from lib.costmodel import default_params, predict
from lib.platform.dask_cluster import LINK_ESTIMATES
from lib.platform.machines import (
    GPU_CATALOG,
    Link,
    local_cpu_machine,
    machine_from_json,
)
from lib.platform.telemetry import busy
from lib.policies.baselines import EqualSplit, ProportionalToPeak
from lib.policies.oracle import optimum
from lib.security import check_decision

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


# -- invariants, property-tested --------------------------------------------------

_KIND_DIMS = {
    "matmul": lambda n: {"M": n, "N": 512, "K": 256},
    "reduce": lambda n: {"N": n * 64},
    "elementwise": lambda n: {"N": n * 64},
    "stencil": lambda n: {"H": max(3, n), "W": 256, "T": 2},
    "histogram": lambda n: {"N": n * 64, "B": 128},
}


@st.composite
def _situations(draw):
    models = draw(st.lists(st.sampled_from(sorted(GPU_CATALOG)), min_size=1,
                           max_size=4))
    machine = machine_from_json({"name": "m", "nccl": True,
                                 "devices": [{"catalog": m} for m in models]})
    kind = draw(st.sampled_from(sorted(_KIND_DIMS)))
    task = TaskSpec(kind, _KIND_DIMS[kind](draw(st.integers(3, 1 << 14))),
                    dtype=draw(st.sampled_from(["fp32", "fp16"]))
                    if kind in ("matmul", "elementwise") else "fp32")
    k = draw(st.integers(1, machine.n))
    gpus = tuple(draw(st.permutations(range(machine.n)))[:k])
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k)
                   .filter(lambda w: sum(w) > 0))
    shares = [w / sum(weights) for w in weights]
    shares[-1] = max(0.0, 1.0 - sum(shares[:-1]))  # never -2e-16
    mode = draw(st.sampled_from(["split", "pipelined"])) if k > 1 else "single"
    chunk = draw(st.integers(1, task.split_size))
    util = draw(st.lists(st.sampled_from([0.0, 0.3, 0.9]), min_size=machine.n,
                         max_size=machine.n))
    d = Decision(gpus=gpus, shares=tuple(shares), chunk=chunk, mode=mode,
                 comm_path=draw(st.sampled_from(["host", "nccl"])) if k > 1
                 else "host")
    return task, d.with_hash(task), machine, busy(machine, util)


_PROPS = settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])


@_PROPS
@given(_situations())
def test_prediction_is_finite_and_positive_for_every_legal_decision(case):
    task, d, machine, snap = case
    if not check_decision(d, task, machine, snap).accepted:
        return
    p = predict(task, d, machine, snap)
    assert math.isfinite(p.total) and p.total > 0
    assert all(math.isfinite(x.total) and x.total >= 0 for x in p.devices)


@_PROPS
@given(_situations())
def test_a_device_with_no_share_costs_nothing(case):
    task, d, machine, snap = case
    if len(d.gpus) < 2:
        return
    zeroed = (0.0,) + tuple(s / (1 - d.shares[0]) if d.shares[0] < 1 else 0.0
                            for s in d.shares[1:])
    if sum(zeroed) == 0:
        return
    p = predict(task, _replace(d, shares=zeroed), machine, snap)
    assert p.devices[0].rows == 0 and p.devices[0].total == 0.0


@_PROPS
@given(_situations(), st.integers(2, 8))
def test_more_work_never_takes_less_time(case, factor):
    task, d, machine, snap = case
    first = next(iter(task.dims))
    bigger = TaskSpec(task.kind, {**task.dims, first: task.dims[first] * factor},
                      dtype=task.dtype)
    small = predict(task, d, machine, snap).total
    big = predict(bigger, _replace(d, chunk=d.chunk * factor), machine, snap).total
    assert big >= small * (1 - 1e-12)


@_PROPS
@given(_situations(), st.floats(1.0, 8.0))
def test_a_faster_link_never_slows_a_transfer(case, speedup):
    task, d, machine, snap = case
    faster = _replace(machine, host_links=tuple(
        _replace(link, bandwidth=link.bandwidth * speedup)
        for link in machine.host_links))
    assert predict(task, d, faster, snap).total \
        <= predict(task, d, machine, snap).total * (1 + 1e-12)


# -- a Dask cluster: what the dask backend does, priced -------------------------

def _cluster(n: int = 4):
    """A four-worker cluster profile (local-cpu's cores standing in for
    workers, with loopback links between them)."""
    m = local_cpu_machine(n)
    bw, lat, _ = LINK_ESTIMATES["network"]
    net = Link(kind="network", bandwidth=bw, latency=lat, p2p=True)
    return _replace(m, name="dask-test", real_backends=("dask",),
                    host_links=(net,) * n,
                    peers={(i, j): net for i in range(n) for j in range(i + 1, n)})


def test_on_a_cluster_inputs_do_not_travel_and_a_decision_pays_its_dispatch():
    m = _cluster()
    assert m.cluster and not local_cpu_machine(4).cluster
    task = TaskSpec("matmul", {"M": 512, "N": 512, "K": 512})
    d = Decision(gpus=(0, 1), shares=(0.5, 0.5), chunk=64,
                 mode="split").with_hash(task)
    p = predict(task, d, m)
    params = default_params()
    assert all(dev.t_in == 0.0 for dev in p.devices)
    assert all(dev.t_launch == params.launch_s["dask-task"] for dev in p.devices)
    assert p.t_dispatch == params.launch_s["dask-decision"]
    assert p.total == pytest.approx(max(dev.total for dev in p.devices)
                                    + p.t_merge + p.t_dispatch)
    # pipelined runs as split on the dask backend, and is priced so
    piped = predict(task, Decision(gpus=(0, 1), shares=(0.5, 0.5), chunk=64,
                                   mode="pipelined").with_hash(task), m)
    assert piped.total == p.total and all(dev.chunks == 1 for dev in piped.devices)
    # off the cluster the same decision moves its inputs and pays no dispatch
    local = predict(task, d, local_cpu_machine(4))
    assert local.t_dispatch == 0.0 and all(dev.t_in > 0 for dev in local.devices)


def test_a_p2p_sum_on_a_cluster_is_a_tree_of_transfers_and_adds():
    m = _cluster()
    task = TaskSpec("histogram", {"N": 1 << 20, "B": 4096})
    depth = {}
    for k in (2, 4):
        d = Decision(gpus=tuple(range(k)), shares=(1 / k,) * k, chunk=1 << 20,
                     comm_path="p2p").with_hash(task)
        depth[k] = predict(task, d, m).t_merge
    link = m.peer(0, 1)
    nbytes = 4.0 * 4096
    step = link.latency + nbytes / link.bandwidth
    # two levels of (transfer + add) for four workers, one for two
    assert depth[4] - depth[2] == pytest.approx(step + 2 * nbytes / (
        m.devices[0].mem_bw * default_params().e_mem("cpu", "histogram")))


def test_the_optimum_on_a_cluster_is_priced_as_predict_prices_it():
    m = _cluster()
    for task in (TaskSpec("matmul", {"M": 2048, "N": 2048, "K": 2048}),
                 TaskSpec("reduce", {"N": 1 << 26}),
                 TaskSpec("elementwise", {"N": 64})):
        best = optimum(task, m)
        assert best.decision.mode != "pipelined"
        for rival in (EqualSplit(), ProportionalToPeak()):
            d = rival.decide(task, m, None).with_hash(task)
            assert best.prediction.total <= predict(task, d, m).total * (1 + 1e-9)
    # a tiny task's time is the cluster's fixed cost of a decision
    tiny = optimum(TaskSpec("elementwise", {"N": 64}), m).prediction
    assert tiny.t_dispatch / tiny.total > 0.9


def test_the_scheduler_wait_comes_once_per_shard_on_measured_shared_devices():
    from lib.contract import decision_from_weights
    from lib.costmodel.model import wait_seconds
    from lib.platform.machines import load_machine
    from lib.platform.telemetry import Snapshot, busy

    machine = load_machine("local-cpu")
    n = machine.n
    params = _replace(default_params(), sched_wait={"cpu": 1e-3})
    free = tuple(d.mem_bytes for d in machine.devices)
    shared = Snapshot("x", (0.0,) * n, free, (True,) * n,
                      capacity=(0.25,) + (1.0,) * (n - 1))
    # 1 ms per unit of 1/c - 1: 3 ms at a quarter of the core, none at all of it
    assert wait_seconds(machine, 0, params, shared) == pytest.approx(3e-3)
    assert wait_seconds(machine, 1, params, shared) == 0.0
    # utilisation alone, or no fitted wait: no wait
    assert wait_seconds(machine, 0, params, busy(machine, [0.75] + [0.0] * (n - 1))) \
        == 0.0
    assert wait_seconds(machine, 0, default_params(), shared) == 0.0
    task = TaskSpec("elementwise", {"N": 1 << 20})
    for mode, chunk in (("split", 1 << 19), ("pipelined", 1 << 15)):
        dec = _replace(
            decision_from_weights(task, [0, 1], [0.5, 0.5]), mode=mode,
            chunk=chunk).with_hash(task)
        with_wait = predict(task, dec, machine, shared, params).devices[0]
        without = predict(task, dec, machine, shared, default_params()).devices[0]
        assert with_wait.t_launch - without.t_launch == pytest.approx(3e-3)


def _two_cores(cache_bytes: float):
    """local-cpu with two devices and a last-level cache of ``cache_bytes``."""
    real = local_cpu_machine(2)
    return _replace(real, devices=tuple(_replace(d, cache_bytes=cache_bytes)
                                        for d in real.devices))


def test_a_task_that_fits_half_the_cache_reads_memory_faster():
    from lib.contract import decision_from_weights
    from lib.costmodel.model import CACHE_FIT, cache_factor

    machine = _two_cores(32 * 2**20)
    params = _replace(default_params(), cache_bw={"cpu": 1.5})
    # elementwise reads two fp32 arrays and writes one: 12 bytes an element
    fits = TaskSpec("elementwise", {"N": int(CACHE_FIT * 32 * 2**20) // 12})
    spills = TaskSpec("elementwise", {"N": int(CACHE_FIT * 32 * 2**20) // 12 + 1})
    assert cache_factor(fits, machine, 0, params) == 1.5
    assert cache_factor(spills, machine, 0, params) == 1.0
    # off without the fitted multiple, and on a device whose cache is unknown
    assert cache_factor(fits, machine, 0, default_params()) == 1.0
    assert cache_factor(fits, _two_cores(0.0), 0, params) == 1.0
    dec = decision_from_weights(fits, [0], [1.0]).with_hash(fits)
    fast = predict(fits, dec, machine, None, params).devices[0]
    slow = predict(fits, dec, machine, None, default_params()).devices[0]
    # elementwise is memory-bound on a core: its compute time is the memory one
    assert slow.t_comp / fast.t_comp == pytest.approx(1.5)


def test_the_cache_term_keeps_the_split_time_affine_in_rows():
    """The oracle's search reads t_i(r) off the model at r = 1 and r = 2: with
    the cache decided for the whole task, that line is what predict says at
    every r, a whole-task shard included."""
    from lib.contract import decision_from_weights
    from lib.costmodel.model import split_time_coefficients

    machine = _two_cores(32 * 2**20)
    params = _replace(default_params(), cache_bw={"cpu": 1.7})
    for n in (10_000, 1_000_000, 10_000_000):   # in the cache, and out of it
        task = TaskSpec("reduce", {"N": n})
        a, b, c, d, e, f = split_time_coefficients(task, machine, 0, params)
        for share in (0.25, 1.0):
            dec = decision_from_weights(task, [0, 1], [share, 1 - share]) \
                if share < 1 else decision_from_weights(task, [0], [1.0])
            dec = dec.with_hash(task)
            part = predict(task, dec, machine, None, params).devices[0]
            r = part.rows
            assert part.total == pytest.approx(a + b * r + max(c + d * r, e + f * r),
                                               rel=1e-9)


def test_co_running_cores_stretch_each_others_compute():
    from lib.contract import decision_from_weights

    machine = _two_cores(0.0)
    task = TaskSpec("elementwise", {"N": 1 << 22})
    params = _replace(default_params(), corun={"cpu": 0.2})
    both = decision_from_weights(task, [0, 1], [0.5, 0.5]).with_hash(task)
    alone = _replace(both, shares=(1.0, 0.0)).with_hash(task)
    with_corun = predict(task, both, machine, None, params).devices
    without = predict(task, both, machine, None, default_params()).devices
    for got, base in zip(with_corun, without, strict=True):
        assert got.t_comp == pytest.approx(1.2 * base.t_comp)   # 1 + 0.2 (2 - 1)
        assert got.t_in == base.t_in and got.t_out == base.t_out
    # one shard runs alone: nothing to share
    assert predict(task, alone, machine, None, params).devices[0].t_comp == \
        pytest.approx(predict(task, alone, machine, None,
                              default_params()).devices[0].t_comp)
