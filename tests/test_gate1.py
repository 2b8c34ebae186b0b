"""Gate 1: accepts legal decisions, names every violated check, never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.contract import Decision, TaskSpec
from lib.platform.telemetry import Snapshot, busy
from lib.platform.workloads import split_rows, workload
from lib.security import check_decision

TASK = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192})


def good(**patch):
    d = Decision(gpus=(0, 2), shares=(0.75, 0.25), chunk=4096, block=256,
                 mode="split", comm_path="host")
    return Decision(**{**d.__dict__, **patch}).with_hash(TASK)


def test_accepts_a_legal_decision(hetero4):
    v = check_decision(good(), TASK, hetero4)
    assert v.accepted, v.summary()


@pytest.mark.parametrize("patch, check", [
    ({"shares": (0.7, 0.25)}, "contract.share_sum"),
    ({"shares": (1.25, -0.25)}, "contract.negative_share"),
    ({"shares": (1.0,)}, "contract.length"),
    ({"gpus": (2, 2)}, "contract.duplicate_device"),
    ({"mode": "single"}, "contract.single_mode"),
    ({"gpus": (0, 7)}, "feasibility.device"),
    ({"block": 100}, "feasibility.block"),
    ({"block": 2048}, "feasibility.block"),
    ({"chunk": 8193}, "feasibility.chunk"),
    ({"comm_path": "p2p"}, "feasibility.p2p"),
    ({"gpus": (0,), "shares": (1.0,), "mode": "single", "comm_path": "nccl"},
     "feasibility.nccl"),
])
def test_each_violation_is_named(hetero4, patch, check):
    v = check_decision(good(**patch), TASK, hetero4)
    assert check in v.checks, v.summary()


def test_memory_feasibility_names_device_and_shard(hetero4):
    task = TaskSpec("matmul", {"M": 65536, "N": 65536, "K": 16384})
    d = Decision(gpus=(0, 3), shares=(0.5, 0.5), chunk=1, block=256).with_hash(task)
    v = check_decision(d, task, hetero4)
    msgs = [x.message for x in v.violations if x.check == "feasibility.memory"]
    assert msgs and "3:T4" in msgs[-1] and "shard 1" in msgs[-1]


def test_unhealthy_device_refused(hetero4):
    snap = busy(hetero4, [0, 0, 0, 0], healthy=[True, True, False, True])
    assert "feasibility.unhealthy" in check_decision(good(), TASK, hetero4, snap).checks


def test_tampered_hash_refused(hetero4):
    d = good()
    forged = Decision(**{**d.__dict__, "shares": (0.5, 0.5)})
    assert check_decision(forged, TASK, hetero4).checks == ("integrity.hash_mismatch",)
    unhashed = Decision(**{**d.__dict__, "config_hash": ""})
    assert "integrity.missing_hash" in check_decision(unhashed, TASK, hetero4).checks


def test_reports_every_violation_at_once(hetero4):
    bad = {"gpus": [0, 0, 9], "shares": [0.5, True, float("nan")], "chunk": 1.0,
           "block": 33, "mode": "warp", "comm_path": "host", "extra": 1}
    checks = check_decision(bad, TASK, hetero4).checks
    for c in ("form.unknown_field", "form.bool", "form.nonfinite",
              "form.float_as_int", "contract.mode"):
        assert c in checks


def test_json_text_is_accepted_too(hetero4):
    text = json.dumps(good().to_json())
    assert check_decision(text, TASK, hetero4).accepted
    assert check_decision("{not json", TASK, hetero4).checks == ("form.json",)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.sampled_from(["gpus", "shares", "chunk", "block", "mode",
                                       "comm_path", "config_hash", "x"]), kids,
                      max_size=7),
    max_leaves=16)


@given(json_like)
def test_never_raises_and_never_accepts_garbage(hetero4, value):
    v = check_decision(value, TASK, hetero4)
    assert not v.accepted  # nothing random carries a valid hash


# --------------------------------------------------------------------------
# The fast paths: a Decision object, the whole-task memory bound

_TASKS = st.one_of(
    st.builds(lambda m, n, k: TaskSpec("matmul", {"M": m, "N": n, "K": k}),
              st.integers(1, 2**17), st.integers(1, 2**15), st.integers(1, 2**15)),
    st.builds(lambda kind, n: TaskSpec(kind, {"N": n}),
              st.sampled_from(["reduce", "elementwise"]), st.integers(1, 2**31 - 1)),
    st.builds(lambda h, w, t: TaskSpec("stencil", {"H": h, "W": w, "T": t}),
              st.integers(3, 2**17), st.integers(3, 2**15), st.integers(1, 1024)),
    st.builds(lambda n, b: TaskSpec("histogram", {"N": n, "B": b}),
              st.integers(1, 2**31 - 1), st.integers(1, 4096)),
)


@given(_TASKS, st.floats(0, 1))
def test_no_shard_needs_more_memory_than_the_whole_task(task, frac):
    # Gate 1 skips the per-shard memory check when the whole task fits
    w = workload(task)
    rows = int(frac * task.split_size)
    assert w.work(task, rows).footprint <= w.work(task, task.split_size).footprint


def _memory_violations(task, decision, machine, telemetry):
    """Gate 1's memory check, shard by shard, as the contract states it."""
    out = []
    if sum(decision.shares) <= 0:
        return out
    rows = split_rows(task.split_size, decision.shares)
    for g, (lo, hi) in zip(decision.gpus, rows, strict=True):
        free = telemetry.free_bytes[g] if telemetry else machine.devices[g].mem_bytes
        out.append(workload(task).work(task, hi - lo).footprint > free * 0.9)
    return out


@settings(max_examples=300, deadline=None)
@given(_TASKS, st.lists(st.integers(0, 4), min_size=1, max_size=5),
       st.lists(st.floats(0, 1), min_size=5, max_size=5),
       st.sampled_from(["single", "split", "pipelined"]),
       st.sampled_from(["host", "p2p", "nccl"]), st.integers(1, 2**20),
       st.sampled_from([64, 100, 256, 1024, 2048]),
       st.lists(st.floats(0, 1), min_size=4, max_size=4), st.booleans(),
       st.booleans())
def test_a_decision_object_gets_the_verdict_of_its_json(
        hetero4, task, gpus, raw, mode, path, chunk, block, free, tampered,
        with_telemetry):
    shares = [raw[i] + 0.01 for i in range(len(gpus))]
    shares = [s / sum(shares) for s in shares]
    shares[-1] = 1.0 - sum(shares[:-1])
    decision = Decision(gpus=tuple(gpus), shares=tuple(shares), chunk=chunk,
                        block=block, mode=mode, comm_path=path).with_hash(task)
    if tampered:
        decision = Decision(**{**decision.__dict__, "chunk": chunk + 1})
    telemetry = None
    if with_telemetry:
        telemetry = busy(hetero4, [0.0] * 4)
        telemetry = Snapshot(**{**telemetry.__dict__, "free_bytes": tuple(
            f * d.mem_bytes for f, d in zip(free, hetero4.devices, strict=True))})
    verdict = check_decision(decision, task, hetero4, telemetry)
    as_json = check_decision(decision.to_json(), task, hetero4, telemetry)
    assert verdict.violations == as_json.violations
    distinct = len(set(gpus)) == len(gpus)  # else the hash is not checked
    assert ("integrity.hash_mismatch" in verdict.checks) == (tampered and distinct)
    if all(g < hetero4.n for g in gpus) and distinct:
        expected = sum(_memory_violations(task, decision, hetero4, telemetry))
        found = sum(v.check == "feasibility.memory" for v in verdict.violations)
        assert found == expected
