"""Workloads: exact shard cover, references, shard-and-merge equals reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.contract import TaskSpec
from lib.platform.workloads import WORKLOADS, round_bf16, split_rows, verify, workload


@given(st.integers(0, 10**7),
       st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=9)
       .filter(lambda s: sum(s) > 0))
def test_split_rows_covers_exactly(n, shares):
    bounds = split_rows(n, shares)
    assert len(bounds) == len(shares)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (_, hi), (lo, _) in zip(bounds, bounds[1:], strict=False):
        assert hi == lo  # no gap, no overlap
    total = sum(shares)
    for (lo, hi), s in zip(bounds, shares, strict=True):
        assert hi >= lo
        assert abs((hi - lo) - n * s / total) < 1.0 + 1e-9


def test_split_rows_largest_remainder():
    assert split_rows(10, [1, 1, 1]) == [(0, 4), (4, 7), (7, 10)]
    assert split_rows(7, [0.5, 0.0, 0.5]) == [(0, 4), (4, 4), (4, 7)]
    with pytest.raises(ValueError):
        split_rows(5, [0.0, 0.0])


SMALL = {
    "matmul": {"M": 37, "N": 19, "K": 23},
    "reduce": {"N": 10007},
    "elementwise": {"N": 1001},
    "stencil": {"H": 41, "W": 17, "T": 3},
    "histogram": {"N": 5003, "B": 13},
}


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
@pytest.mark.parametrize("dtype", ["fp32", "fp64", "fp16", "bf16"])
def test_shards_merge_to_the_reference(kind, dtype):
    task = TaskSpec(kind, SMALL[kind], dtype=dtype)
    w = workload(task)
    inputs = w.make_inputs(task, seed=3)
    ref = w.reference(task, inputs)
    for shares in ([1.0], [0.5, 0.5], [0.6, 0.0, 0.3, 0.1], [0.01, 0.99]):
        parts = [w.compute(task, w.shard_inputs(task, inputs, lo, hi), lo, hi)
                 for lo, hi in split_rows(task.split_size, shares) if hi > lo]
        ok, err = verify(task, w.merge(task, parts), ref)
        assert ok, (kind, dtype, shares, err)


def test_verify_catches_a_wrong_answer():
    task = TaskSpec("stencil", SMALL["stencil"])
    w = workload(task)
    inputs = w.make_inputs(task)
    ref = w.reference(task, inputs)
    bad = ref.copy()
    bad[5, 5] += 1e-2
    assert verify(task, bad, ref) == (False, pytest.approx(1e-2, rel=1e-3))
    assert not verify(task, ref[:-1], ref)[0]


def test_stencil_halo_is_needed():
    """Without halo rows a band's edge rows would be wrong: the halo matters."""
    task = TaskSpec("stencil", {"H": 30, "W": 12, "T": 4})
    w = workload(task)
    u = w.make_inputs(task)["u"]
    ref = w.reference(task, {"u": u})
    no_halo = w.compute(TaskSpec("stencil", {"H": 15, "W": 12, "T": 4}),
                        {"u": u[:15]}, 0, 15)
    assert not np.allclose(no_halo[-1], ref[14])
    assert np.allclose(w.compute(task, w.shard_inputs(task, {"u": u}, 0, 15), 0, 15),
                       ref[:15])


def test_reference_values_by_hand():
    task = TaskSpec("histogram", {"N": 6, "B": 4})
    x = np.array([0.0, 0.24, 0.25, 0.99, 1.0, 0.5], dtype=np.float32)
    assert workload(task).reference(task, {"x": x}).tolist() == [2, 1, 1, 2]
    task = TaskSpec("elementwise", {"N": 2})
    out = workload(task).reference(task, {"x": np.array([1, 2], np.float32),
                                          "y": np.array([1, 1], np.float32)})
    assert out.tolist() == [3.5, 6.0]


@settings(max_examples=50)
@given(st.floats(-float(np.float32(1e30)), float(np.float32(1e30)), width=32))
def test_bf16_rounding_keeps_8_bits(v):
    r = round_bf16(np.array([v], dtype=np.float32))
    assert (r.view(np.uint32) & 0xFFFF).item() == 0
    assert abs(float(r[0]) - v) <= abs(v) * 2**-8 + 1e-38


def test_work_counts():
    task = TaskSpec("matmul", {"M": 100, "N": 50, "K": 20})
    w = workload(task).work(task, 10)
    assert w.flops == 2 * 10 * 50 * 20
    assert w.bytes_in_rows == 4 * 10 * 20 and w.bytes_in_fixed == 4 * 20 * 50
    assert w.bytes_out == 4 * 10 * 50
    assert workload(task).work(task, 0).footprint == 0


def test_inputs_drawn_in_blocks_are_those_of_one_draw(monkeypatch):
    """Inputs are drawn a block at a time (so making one takes little more
    memory than it), and are the values one draw of the whole gives."""
    from lib.platform import workloads as wl

    task = TaskSpec("matmul", {"M": 37, "N": 5, "K": 29})
    whole = workload(task).make_inputs(task, 7)
    monkeypatch.setattr(wl, "DRAW_BLOCK", 100)   # many blocks, one partial
    blocks = workload(task).make_inputs(task, 7)
    for name in whole:
        assert np.array_equal(whole[name], blocks[name])
    rng = np.random.default_rng(7)
    expected = rng.uniform(-1, 1, size=(37, 29)).astype(np.float32)
    assert np.array_equal(blocks["A"], expected)
    for dtype in ("fp16", "bf16", "fp64"):
        t = TaskSpec("elementwise", {"N": 1001}, dtype=dtype)
        x = workload(t).make_inputs(t, 3)["x"]
        one = np.random.default_rng(3).uniform(-1, 1, size=1001)
        one = one.astype(np.float64 if dtype == "fp64" else np.float32)
        one = round_bf16(one) if dtype == "bf16" else one.astype(x.dtype)
        assert np.array_equal(x, one), dtype


def test_histogram_counts_in_blocks_as_in_one(monkeypatch):
    from lib.platform import workloads as wl

    task = TaskSpec("histogram", {"N": 10_007, "B": 13})
    w = workload(task)
    x = w.make_inputs(task, 1)["x"]
    one = np.bincount(np.clip((x * np.float32(13)).astype(np.int64), 0, 12),
                      minlength=13)
    monkeypatch.setattr(wl, "DRAW_BLOCK", 1000)
    got = w.compute(task, {"x": x}, 0, 10_007)
    assert got.dtype == np.int64 and np.array_equal(got, one)


def test_verify_compares_in_blocks_and_fails_on_nan_and_inf(monkeypatch):
    from lib.platform import workloads as wl

    monkeypatch.setattr(wl, "VERIFY_BLOCK", 64)
    task = TaskSpec("elementwise", {"N": 1000})
    ref = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert verify(task, ref.copy(), ref) == (True, 0.0)
    for bad, err in ((np.nan, None), (np.inf, np.inf), (2.0, None)):
        out = ref.copy()
        out[999] = bad   # in the last, partial block
        ok, got = verify(task, out, ref)
        assert not ok
        assert (np.isnan(got) if err is None and np.isnan(bad) else
                got == err if err is not None else got > 0.5)


CASES = [("matmul", {"M": 53, "N": 7, "K": 31}), ("reduce", {"N": 5003}),
         ("elementwise", {"N": 4001}), ("stencil", {"H": 61, "W": 19, "T": 3}),
         ("histogram", {"N": 3001, "B": 9})]


@pytest.mark.parametrize(("kind", "dims"), CASES, ids=[k for k, _ in CASES])
@pytest.mark.parametrize("dtype", ["fp32", "fp64", "fp16", "bf16"])
def test_a_shards_inputs_made_alone_are_those_cut_from_the_whole(
        kind, dims, dtype, monkeypatch):
    """A Dask worker makes its shard's inputs alone, drawing only the rows it
    needs (and a stencil's halo); they are the values, types and shapes the
    shard would have cut from the whole task's inputs, for every kind and
    dtype, over several blocks and for a shard with no rows."""
    from lib.platform import workloads as wl

    task = TaskSpec(kind, dims, dtype=dtype)
    try:
        w = workload(task)
    except ValueError:
        pytest.skip(f"{kind} has no {dtype}")
    monkeypatch.setattr(wl, "DRAW_BLOCK", 97)
    whole = w.make_inputs(task, 5)
    n = task.split_size
    for lo, hi in ((0, n), (0, 1), (n - 1, n), (n // 3, 2 * n // 3), (5, 5)):
        alone = w.make_shard_inputs(task, 5, lo, hi)
        cut = w.shard_inputs(task, whole, lo, hi)
        assert alone.keys() == cut.keys()
        for name in cut:
            assert alone[name].dtype == cut[name].dtype
            assert np.array_equal(alone[name], cut[name]), (lo, hi, name)


@pytest.mark.parametrize(("kind", "dims"), CASES, ids=[k for k, _ in CASES])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("source", ["seed", "inputs"])
def test_a_reference_in_row_blocks_verifies_as_the_whole_does(
        kind, dims, dtype, source, monkeypatch):
    """Verification computes the reference in row blocks, cut from the
    inputs a backend holds or drawn from the seed (a Dask client, which never
    makes the whole task's inputs). It passes the whole reference, and fails
    a result with one element wrong in its last block, a row too many, or
    another seed's inputs."""
    from lib.platform import workloads as wl

    task = TaskSpec(kind, dims, dtype=dtype)
    w = workload(task)
    inputs = w.make_inputs(task, 11)
    good = w.reference(task, inputs)
    # at most ~7 rows a block: several blocks, none on a shard's edge (a
    # block's bytes are those of its rows; matmul's B comes with each)
    whole_work = w.total_work(task)
    monkeypatch.setattr(wl, "REFERENCE_BLOCK_BYTES",
                        (whole_work.footprint - whole_work.bytes_in_fixed) * 7
                        // task.split_size)

    def whole(*_args):
        raise AssertionError("made the whole task's inputs")

    monkeypatch.setattr(type(w), "make_inputs", whole)
    computed = []
    compute = type(w).compute

    def counted(self, task, shard, lo, hi):
        computed.append(hi - lo)
        return compute(self, task, shard, lo, hi)

    monkeypatch.setattr(type(w), "compute", counted)
    given = {"inputs": inputs} if source == "inputs" else {}
    ok, err = wl.verify_in_blocks(task, good, seed=11, **given)
    assert ok and err <= 1e-6 * float(np.abs(good.astype(np.float64)).max()), err
    assert len(computed) > 2 and max(computed) <= 7 and sum(computed) == task.split_size
    bad = good.copy()
    bad.reshape(-1)[-1] += 1000
    ok, err = wl.verify_in_blocks(task, bad, seed=11, **given)
    assert not ok and err == pytest.approx(1000, rel=0.02)
    if task.merge == "concat":
        extra = np.concatenate([good, good[:1]])
        assert wl.verify_in_blocks(task, extra, seed=11, **given) == (False, np.inf)
    if source == "seed":
        assert not wl.verify_in_blocks(task, good, seed=12)[0]


def test_a_reference_block_counts_its_rows_and_the_inputs_every_block_needs():
    """A block covers a share of the rows' bytes and, drawn from the seed,
    matmul's whole B again; a task under a block is covered whole."""
    from lib.platform.workloads import REFERENCE_BLOCK_BYTES, reference_block_bytes

    small = TaskSpec("matmul", {"M": 64, "N": 64, "K": 64})
    assert reference_block_bytes(small) == workload(small).total_work(small).footprint
    big = TaskSpec("matmul", {"M": 65536, "N": 8192, "K": 8192})
    assert reference_block_bytes(big) == REFERENCE_BLOCK_BYTES + 4 * 8192 * 8192
    flat = TaskSpec("elementwise", {"N": 500_000_000})
    assert reference_block_bytes(flat) == REFERENCE_BLOCK_BYTES
