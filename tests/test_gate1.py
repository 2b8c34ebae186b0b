"""Gate 1: accepts legal decisions, names every violated check, never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.contract import (
    MAX_DEVICES,
    MODES,
    PIPELINE_CHUNKS,
    Decision,
    TaskSpec,
    config_hash,
)
from lib.platform.machines import load_machine, local_cpu_machine
from lib.platform.telemetry import Snapshot, busy
from lib.platform.workloads import split_rows, workload
from lib.policies.actions import decision_from_weights_row
from lib.security import check_decision
from lib.security.gate1 import MAX_CHUNKS_PER_SHARD, MAX_PIPELINE_LAUNCHES

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


# --------------------------------------------------------------------------
# The work a decision can create: pipelined chunks per shard and in all

def _pipelined(task, gpus, shares, chunk):
    return Decision(gpus=tuple(gpus), shares=tuple(shares), chunk=chunk, block=256,
                    mode="pipelined", comm_path="host").with_hash(task)


def test_chunk_one_on_the_largest_dimension_is_refused(hetero4):
    task = TaskSpec("elementwise", {"N": 2**31 - 1})
    v = check_decision(_pipelined(task, (0, 1), (0.5, 0.5), 1), task, hetero4)
    assert v.checks == ("feasibility.chunk_count",), v.summary()
    assert "shard 0 into 1073741824 pipelined chunks" in v.violations[0].message
    assert "\n" not in v.summary()


def test_chunks_per_shard_bound_is_inclusive(hetero4):
    at = _pipelined(TASK, (0, 2), (0.5, 0.5), 1)  # 4096 chunks a shard
    assert check_decision(at, TASK, hetero4).accepted
    over = _pipelined(TASK, (0, 2), (0.75, 0.25), 1)  # shard 0: 6144 chunks
    v = check_decision(over, TASK, hetero4)
    assert v.checks == ("feasibility.chunk_count",)
    assert f"at most {MAX_CHUNKS_PER_SHARD} per shard" in v.violations[0].message


def test_total_launches_bound():
    machine = local_cpu_machine(8)
    n = 8 * MAX_CHUNKS_PER_SHARD
    task = TaskSpec("elementwise", {"N": n})
    shares = [1 / 8] * 8
    v = check_decision(_pipelined(task, range(8), shares, 1), task, machine)
    assert v.checks == ("feasibility.chunk_count",), v.summary()
    assert f"{n} pipelined chunk launches over 8 shards" in v.violations[0].message
    assert check_decision(_pipelined(task, range(8), shares, 2), task,
                          machine).accepted  # 16384 in all: at the bound


def test_split_and_single_mode_ignore_the_chunk_count(hetero4):
    task = TaskSpec("elementwise", {"N": 2**31 - 1})
    d = Decision(gpus=(0, 1), shares=(0.5, 0.5), chunk=1).with_hash(task)
    assert check_decision(d, task, hetero4).accepted


def test_the_bounds_hold_what_every_policy_asks_for():
    # the optimum and the learned policy cut the largest shard into at most
    # max(PIPELINE_CHUNKS) chunks, on at most MAX_DEVICES devices
    assert max(PIPELINE_CHUNKS) <= MAX_CHUNKS_PER_SHARD
    assert max(PIPELINE_CHUNKS) * MAX_DEVICES <= MAX_PIPELINE_LAUNCHES


@settings(max_examples=200, deadline=None)
@given(_TASKS, st.lists(st.floats(0.01, 1), min_size=1, max_size=8),
       st.integers(0, len(PIPELINE_CHUNKS) - 1), st.booleans())
def test_the_learned_policy_and_optimum_chunking_is_never_refused(
        task, weights, chunks, eight):
    machine = local_cpu_machine(8) if eight else load_machine("hetero-4")
    weights = (weights * 8)[:machine.n]
    pipelined = MODES.index("pipelined")
    # the learned policy's decoder
    d = decision_from_weights_row(task, weights, 2, pipelined, 0, chunks)
    assert "feasibility.chunk_count" not in check_decision(d, task, machine).checks
    # the optimum's rule: chunk = ceil(biggest / c) for its own row counts
    biggest = max(hi - lo for lo, hi in split_rows(task.split_size, d.shares))
    for c in PIPELINE_CHUNKS:
        opt = _pipelined(task, d.gpus, d.shares, max(1, -(-biggest // c)))
        assert "feasibility.chunk_count" not in check_decision(opt, task,
                                                               machine).checks


# --------------------------------------------------------------------------
# Shares written as integers: checked and hashed by value

def test_share_written_as_1_or_1_0_parses_hashes_and_passes_the_same(hetero4):
    one = Decision(gpus=(0,), shares=(1.0,), chunk=8192, mode="single")
    digest = one.with_hash(TASK).config_hash
    spellings = ("1", "1.0", "1e0", "10e-1", "1.000")
    for spelling in spellings:
        text = (f'{{"gpus": [0], "shares": [{spelling}], "chunk": 8192, '
                f'"block": 256, "mode": "single", "comm_path": "host", '
                f'"config_hash": "{digest}"}}')
        parsed = Decision.from_json(text)
        assert parsed.shares == (1.0,) and type(parsed.shares[0]) is float
        assert config_hash(TASK, parsed) == digest, spelling
        for form in (text, json.loads(text), parsed):
            v = check_decision(form, TASK, hetero4)
            assert v.accepted, (spelling, type(form).__name__, v.summary())
    as_int = Decision(gpus=(0,), shares=(1,), chunk=8192, mode="single")
    assert as_int.with_hash(TASK).config_hash == digest
    assert check_decision(as_int.with_hash(TASK), TASK, hetero4).accepted


def test_integer_shares_in_two_devices(hetero4):
    base = good(shares=(1.0, 0.0))
    obj = {**base.to_json(), "shares": [1, 0]}
    assert check_decision(obj, TASK, hetero4).accepted
    assert Decision.from_json(obj).with_hash(TASK).config_hash == base.config_hash


def test_negative_zero_share_is_refused_by_name(hetero4):
    # -0 is the integer zero (share 0.0); -0.0 would hash apart from it
    assert check_decision({**good(shares=(1.0, 0.0)).to_json(), "shares": [1, -0]},
                          TASK, hetero4).accepted
    d = good(shares=(1.0, -0.0))
    assert d.config_hash != good(shares=(1.0, 0.0)).config_hash
    v = check_decision(d, TASK, hetero4)
    assert v.checks == ("contract.negative_share",)
    assert "negative zero" in v.violations[0].message


def test_an_integer_share_beyond_a_double_is_nonfinite(hetero4):
    obj = {**good().to_json(), "shares": [10**400, 0.25]}
    v = check_decision(obj, TASK, hetero4)
    assert v.checks == ("form.nonfinite",), v.summary()
    assert v.violations[0].message.startswith("shares[0]: must be finite, got an "
                                              "integer of 401 digits")
    huge = '{"gpus": [0], "shares": [' + "1" * 5000 + '], "chunk": 1, ' \
           '"block": 256, "mode": "single", "comm_path": "host"}'
    assert check_decision(huge, TASK, hetero4).checks == ("form.json",)
    obj = {**good().to_json(), "gpus": [10**5000, 2]}
    v = check_decision(obj, TASK, hetero4)
    assert v.checks == ("form.size",) and "about 5001 digits" in v.summary()
