"""Gate 1: accepts legal decisions, names every violated check, never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.contract import Decision, TaskSpec
from lib.security import check_decision
from lib.telemetry import busy

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
