"""The contract: JSON forms, strict parsing, the hash, the state encoding."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.contract import ContractError, Decision, TaskSpec, canonical_json, config_hash
from lib.platform.telemetry import busy
from lib.policies.observation import (
    DEVICE_FEATURES,
    DEVICE_FIELDS,
    STATE_FIELDS,
    TASK_FEATURES,
    encode_state,
    encode_task,
)

TASK_JSON = {"kind": "matmul", "dims": {"M": 8192, "N": 8192, "K": 8192},
             "dtype": "fp32", "divisible_dim": 0, "merge": "concat"}
DECISION_JSON = {"gpus": [0, 2], "shares": [0.75, 0.25], "chunk": 4096, "block": 256,
                 "mode": "split", "comm_path": "host"}


def test_task_json_round_trip_is_exact():
    task = TaskSpec.from_json(json.dumps(TASK_JSON))
    assert task.to_json() == TASK_JSON
    assert TaskSpec.from_json(task.to_json()) == task
    assert task.split_name == "M" and task.split_size == 8192


def test_decision_json_round_trip_is_exact():
    task = TaskSpec.from_json(TASK_JSON)
    d = Decision.from_json(DECISION_JSON).with_hash(task)
    again = Decision.from_json(json.dumps(d.to_json()))
    assert again == d
    assert again.to_json() == {**DECISION_JSON, "config_hash": d.config_hash}


def test_config_hash_is_sha256_of_the_documented_text():
    task = TaskSpec.from_json(TASK_JSON)
    d = Decision.from_json(DECISION_JSON)
    text = json.dumps({"task": TASK_JSON, "decision": DECISION_JSON},
                      sort_keys=True, separators=(",", ":"))
    assert config_hash(task, d) == hashlib.sha256(text.encode()).hexdigest()


def test_config_hash_changes_with_any_field():
    task = TaskSpec.from_json(TASK_JSON)
    base = config_hash(task, Decision.from_json(DECISION_JSON))
    for field, value in [("shares", [0.7500000001, 0.2499999999]), ("block", 128),
                         ("chunk", 4095), ("gpus", [0, 1]), ("mode", "pipelined"),
                         ("comm_path", "p2p")]:
        other = Decision.from_json({**DECISION_JSON, field: value})
        assert config_hash(task, other) != base, field
    bigger = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8193})
    assert config_hash(bigger, Decision.from_json(DECISION_JSON)) != base


@pytest.mark.parametrize("patch, field", [
    ({"priority": 1}, "decision.priority"),
    ({"chunk": True}, "chunk"),
    ({"block": 256.0}, "block"),
    ({"gpus": "0,2"}, "gpus"),
    ({"gpus": [0, 2.0]}, "gpus[1]"),
    ({"shares": [0.75, False]}, "shares[1]"),
    ({"shares": [0.75, "0.25"]}, "shares[1]"),
    ({"mode": "turbo"}, "mode"),
    ({"comm_path": 3}, "comm_path"),
    ({"config_hash": "xyz"}, "config_hash"),
    ({"gpus": []}, "gpus"),
    ({"chunk": 0}, "chunk"),
])
def test_decision_parsing_names_the_field(patch, field):
    with pytest.raises(ContractError) as info:
        Decision.from_json({**DECISION_JSON, **patch})
    assert info.value.field == field
    assert str(info.value).startswith(field)


def test_missing_field_is_named():
    bad = {k: v for k, v in DECISION_JSON.items() if k != "block"}
    with pytest.raises(ContractError, match="decision.block: missing"):
        Decision.from_json(bad)


def test_a_task_file_by_hand_may_leave_out_what_has_a_default():
    """A task read whole (inside a decision file) names every field; a task
    file written by hand may leave out dtype, divisible_dim and merge, and
    gets what TaskSpec's constructor gives."""
    short = {"kind": "histogram", "dims": {"N": 1000, "B": 64}}
    with pytest.raises(ContractError, match="task.dtype: missing"):
        TaskSpec.from_json(short)
    assert TaskSpec.from_json(short, defaults=True) == \
        TaskSpec("histogram", {"N": 1000, "B": 64})
    stated = {**short, "dtype": "fp16"}
    assert TaskSpec.from_json(stated, defaults=True).dtype == "fp16"
    with pytest.raises(ContractError, match="task.dims: missing"):
        TaskSpec.from_json({"kind": "reduce"}, defaults=True)
    with pytest.raises(ContractError, match="divisible_dim: histogram cannot split B"):
        TaskSpec.from_json({**short, "divisible_dim": 1}, defaults=True)


@pytest.mark.parametrize("text", [
    '{"gpus":[0],"shares":[NaN],"chunk":1,"block":32,"mode":"single","comm_path":"host"}',
    '{"gpus":[0],"shares":[Infinity],"chunk":1,"block":32,"mode":"single",'
    '"comm_path":"host"}',
    '{"gpus":[0],"gpus":[1],"shares":[1.0],"chunk":1,"block":32,"mode":"single",'
    '"comm_path":"host"}',
    '{"gpus": [0,',
    '[1, 2]',
])
def test_bad_json_text_is_refused(text):
    with pytest.raises(ContractError):
        Decision.from_json(text)


def test_python_nan_share_is_refused():
    with pytest.raises(ContractError, match=r"shares\[0\]: must be finite"):
        Decision.from_json({**DECISION_JSON, "shares": [float("nan"), 0.25]})


@pytest.mark.parametrize("patch, field", [
    ({"kind": "fft"}, "kind"),
    ({"dims": {"M": -1, "N": 3, "K": 3}}, "dims.M"),
    ({"dims": {"M": 1.5, "N": 3, "K": 3}}, "dims.M"),
    ({"dims": {"M": 2, "N": 3}}, "dims.K"),
    ({"dims": {"M": 2, "N": 3, "K": 3, "Q": 1}}, "dims.Q"),
    ({"dtype": "int8"}, "dtype"),
    ({"merge": "max"}, "merge"),
    ({"merge": "sum"}, "divisible_dim"),
    ({"divisible_dim": 5}, "divisible_dim"),
    ({"divisible_dim": True}, "divisible_dim"),
    ({"dims": [1, 2, 3]}, "dims"),
])
def test_task_parsing_names_the_field(patch, field):
    with pytest.raises(ContractError) as info:
        TaskSpec.from_json({**TASK_JSON, **patch})
    assert info.value.field == field


def test_kind_limits():
    with pytest.raises(ContractError, match="dims.B"):
        TaskSpec("histogram", {"N": 10, "B": 5000})
    with pytest.raises(ContractError, match="dims.T"):
        TaskSpec("stencil", {"H": 10, "W": 10, "T": 0})
    assert TaskSpec("reduce", {"N": 10}).merge == "sum"


valid_decisions = st.builds(
    lambda g, s, c, b, m, p: {"gpus": g, "shares": s, "chunk": c, "block": b,
                              "mode": m, "comm_path": p},
    st.lists(st.integers(0, 63), min_size=1, max_size=8),
    st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=8),
    st.integers(1, 2**40), st.integers(1, 1 << 16),
    st.sampled_from(["single", "split", "pipelined"]),
    st.sampled_from(["host", "p2p", "nccl"]),
)


@given(valid_decisions)
def test_any_well_formed_decision_round_trips(obj):
    d = Decision.from_json(json.dumps(obj))
    assert Decision.from_json(json.dumps(d.to_json())) == d


def _nested(kids: st.SearchStrategy) -> st.SearchStrategy:
    """Lists and objects of ``kids`` (a named function: Hypothesis reads a
    lambda's source to see that it recurses, and misread this one's)."""
    return st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids,
                                                        max_size=4)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                    | st.text(max_size=5), _nested, max_leaves=12))
def test_parsing_arbitrary_values_raises_only_contract_errors(value):
    for parse in (Decision.from_json, TaskSpec.from_json):
        try:
            parse(value if not isinstance(value, str) else json.dumps(value))
        except ContractError:
            pass


def test_state_encoding_layout(hetero4):
    task = TaskSpec.from_json(TASK_JSON)
    state = encode_state(task, hetero4)
    assert state.task.shape == (TASK_FEATURES,)
    assert state.devices.shape == (4, DEVICE_FEATURES) and state.index == (0, 1, 2, 3)
    assert len(STATE_FIELDS) == TASK_FEATURES + DEVICE_FEATURES
    assert state.task[0] == 1.0 and state.task[1:5].sum() == 0  # kind one-hot
    names = [name for name, _ in DEVICE_FIELDS]
    peak = state.devices[:, names.index("peak_frac")]
    assert peak[0] > peak[3] and abs(peak.sum() - 1) < 1e-6
    assert np.isfinite(state.task).all() and np.isfinite(state.devices).all()



def test_state_encoding_reads_telemetry(hetero4):
    task = TaskSpec.from_json(TASK_JSON)
    snap = busy(hetero4, [0.0, 0.5, 0.0, 0.0], healthy=[True, True, True, False])
    state = encode_state(task, hetero4, snap)
    names = [name for name, _ in DEVICE_FIELDS]
    assert state.index == (0, 1, 2)  # the unhealthy device is not in the set
    assert state.devices[1, names.index("util")] == pytest.approx(0.5)
    assert state.devices[0, names.index("util")] == 0.0



# --------------------------------------------------------------------------
# The hash's text, written out directly, against the documented json.dumps

def _documented_json(task: TaskSpec, decision: Decision) -> str:
    return json.dumps({"task": task.to_json(),
                       "decision": decision.to_json(include_hash=False)},
                      sort_keys=True, separators=(",", ":"))


_TASKS = st.one_of(
    st.builds(lambda m, n, k, d: TaskSpec("matmul", {"M": m, "N": n, "K": k}, d),
              st.integers(1, 2**31 - 1), st.integers(1, 2**20), st.integers(1, 2**20),
              st.sampled_from(["fp16", "bf16", "fp32", "fp64"])),
    st.builds(lambda kind, n: TaskSpec(kind, {"N": n}),
              st.sampled_from(["reduce", "elementwise"]), st.integers(1, 2**31 - 1)),
    st.builds(lambda h, w, t: TaskSpec("stencil", {"H": h, "W": w, "T": t}),
              st.integers(3, 2**16), st.integers(3, 2**16), st.integers(1, 1024)),
    st.builds(lambda n, b: TaskSpec("histogram", {"N": n, "B": b}),
              st.integers(1, 2**31 - 1), st.integers(1, 4096)),
)
_SHARES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-2**70, 2**70),
                    st.floats(0, 1).map(np.float64), st.floats(0, 1).map(np.float32))
_INTS = st.one_of(st.integers(-2**70, 2**70), st.booleans(),
                  st.integers(0, 64).map(np.int64))
_WORDS = st.one_of(st.sampled_from(["single", "split", "pipelined", "host", "p2p",
                                    "nccl", "matmul", "M"]), st.text(max_size=8))


@given(_TASKS, st.lists(_INTS, max_size=9), st.lists(_SHARES, max_size=9), _INTS,
       _INTS, _WORDS, _WORDS)
def test_canonical_json_is_the_documented_json_dumps(task, gpus, shares, chunk,
                                                     block, mode, path):
    decision = Decision(gpus=tuple(gpus), shares=tuple(shares), chunk=chunk,
                        block=block, mode=mode, comm_path=path)
    expected = _documented_json(task, decision)
    assert canonical_json(task, decision) == expected
    assert canonical_json(task, decision) == expected  # the task's text cached
    assert config_hash(task, decision) == hashlib.sha256(
        expected.encode()).hexdigest()


def test_canonical_json_follows_a_task_changed_in_place():
    task = TaskSpec.from_json(TASK_JSON)
    decision = Decision.from_json(DECISION_JSON)
    before = canonical_json(task, decision)
    task.dims["K"] = 1024  # frozen by contract; the cache must not hide it
    assert canonical_json(task, decision) == _documented_json(task, decision)
    assert canonical_json(task, decision) != before
    task.dims["K"] = 1024.0
    assert canonical_json(task, decision) == _documented_json(task, decision)


@pytest.mark.parametrize("swapped", [False, 0.0])
def test_canonical_json_of_a_swapped_split_dim_is_not_a_cached_form(swapped):
    """A task whose ``divisible_dim`` was swapped for a value equal to a
    valid one (``False == 0 == 0.0``) is written as JSON writes it, not from
    the text format kept for the valid shape."""
    decision = Decision.from_json(DECISION_JSON)
    plain = TaskSpec("stencil", {"H": 64, "W": 64, "T": 2}, divisible_dim=0)
    canonical_json(plain, decision)  # keeps the form of divisible_dim 0
    task = TaskSpec("stencil", {"H": 64, "W": 64, "T": 2}, divisible_dim=0)
    object.__setattr__(task, "divisible_dim", swapped)
    assert canonical_json(task, decision) == _documented_json(task, decision)


def test_task_features_are_the_state_head(hetero4):
    task = TaskSpec("stencil", {"H": 4096, "W": 1000, "T": 7}, "fp16")
    head = np.zeros(TASK_FEATURES)
    encode_task(task, head)
    assert head.any()
    own = TASK_FEATURES - 5  # the set.* entries follow the task's own
    assert np.array_equal(head[:own], encode_state(task, hetero4).task[:own])



def test_the_hash_memo_never_outlives_a_change():
    task = TaskSpec("reduce", {"N": 1000})
    d = Decision(gpus=(0,), shares=(1.0,), chunk=10, mode="single").with_hash(task)
    assert config_hash(task, d) == d.config_hash
    # another decision object with other fields: recomputed, not the memo
    other = Decision(gpus=(1,), shares=(1.0,), chunk=10, mode="single",
                     config_hash=d.config_hash)
    assert config_hash(task, other) != d.config_hash
    # the same decision, the task's dims changed in place: recomputed
    task.dims["N"] = 999
    assert config_hash(task, d) != d.config_hash


# --------------------------------------------------------------------------
# Numbers by value: a share written 1 is the share 1.0

@pytest.mark.parametrize("spelling", ["1", "1.0", "1e0", "10e-1", "1.00", "1E+0"])
def test_a_share_hashes_by_value_not_by_spelling(spelling):
    task = TaskSpec.from_json(TASK_JSON)
    text = ('{"gpus": [0], "shares": [' + spelling + '], "chunk": 8192, '
            '"block": 256, "mode": "single", "comm_path": "host"}')
    d = Decision.from_json(text)
    assert d.shares == (1.0,) and type(d.shares[0]) is float
    documented = json.dumps(
        {"task": TASK_JSON, "decision": {**json.loads(text), "shares": [1.0]}},
        sort_keys=True, separators=(",", ":"))
    assert config_hash(task, d) == hashlib.sha256(documented.encode()).hexdigest()
    assert '"shares":[1.0]' in canonical_json(task, d)


def test_an_integer_share_built_in_python_hashes_as_its_float():
    task = TaskSpec.from_json(TASK_JSON)
    as_int = Decision(gpus=(0, 2), shares=(1, 0), chunk=4096)
    as_float = Decision(gpus=(0, 2), shares=(1.0, 0.0), chunk=4096)
    assert config_hash(task, as_int) == config_hash(task, as_float)


def test_negative_zero_is_a_different_value():
    # documented: -0 is the integer zero, -0.0 the double negative zero
    task = TaskSpec.from_json(TASK_JSON)
    base = {**DECISION_JSON, "shares": [1.0, 0.0]}
    as_int = Decision.from_json({**base, "shares": [1, -0]})
    assert config_hash(task, as_int) == config_hash(task, Decision.from_json(base))
    neg = Decision.from_json(json.dumps(base).replace("0.0]", "-0.0]"))
    assert config_hash(task, neg) != config_hash(task, as_int)


def test_an_integer_share_beyond_a_double_is_a_contract_error():
    with pytest.raises(ContractError) as info:
        Decision.from_json({**DECISION_JSON, "shares": [10**400, 0.25]})
    assert info.value.field == "shares[0]"
    assert "must be finite" in str(info.value) and "401 digits" in str(info.value)
    text = json.dumps(DECISION_JSON).replace("0.75", "1" * 5000)
    with pytest.raises(ContractError) as info:
        Decision.from_json(text)
    assert info.value.field == "json" and "4300 digits" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(ContractError, match=r"^gpus\[0\]: .*about 5001 digits"):
        Decision.from_json({**DECISION_JSON, "gpus": [10**5000, 2]})
    with pytest.raises(ContractError, match=r"^mode: .*about 5001 digits"):
        Decision.from_json({**DECISION_JSON, "mode": 10**5000})
    with pytest.raises(ContractError, match=r"^mode: expected a string, got list "
                                            r"a list$"):
        Decision.from_json({**DECISION_JSON, "mode": [10**5000]})
