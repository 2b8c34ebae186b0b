"""Every kernel entry point gives the right answer, checked on the CPU.

Each ``kernels/<kind>.cu`` is built as host C++ against ``tests/emu/cuda_emu.h``
(see :mod:`kernel_harness`) three ways: plain, under AddressSanitizer with
UndefinedBehaviorSanitizer, and under ThreadSanitizer (a missing barrier is a
race between the block's threads). Each runs on NumPy inputs whose sizes are
not multiples of the block size, for several block sizes. Results are compared with
NumPy references written here from the kernels' formulas: exactly where the
kernel's float arithmetic is fixed by its source (elementwise, stencil,
histogram), within a bound derived from the accumulation length otherwise
(matmul, reduce). Output buffers start as NaN (or as non-zero counts) so an
element a kernel forgets to write, or overwrites instead of adding to, shows.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import kernel_harness as kh
import numpy as np
import pytest

BLOCKS = (32, 96, 256)
"""Threads per block exercised; 96 is a multiple of 32 but not a power of two."""

GRID = 3
"""Blocks per 1-D launch: few, so the grid-stride loops go round several times."""

FLOAT_DTYPES = ("fp32", "fp16", "bf16")

U32 = 2.0**-24
"""Unit roundoff of float32."""

UNIT_ROUNDOFF = {"fp32": U32, "fp16": 2.0**-11, "bf16": 2.0**-8}
"""Unit roundoff of each element type: the relative error of one rounding."""

needs_cxx = pytest.mark.skipif(
    kh.find_cxx() is None, reason="no C++ compiler (g++ or clang++) for emulation"
)


@pytest.fixture(scope="session")
def emu(tmp_path_factory):
    """Emulated drivers, built in parallel: ``emu[kind, build] -> binary``."""
    if kh.find_cxx() is None:
        pytest.skip("no C++ compiler (g++ or clang++) for the emulated build")
    out = tmp_path_factory.mktemp("emu_bin")
    jobs = [(kind, build) for kind in kh.KINDS for build in kh.BUILDS]
    jobs += [(kh.EMU_DIR / "canary.cu", build) for build in ("asan", "tsan")]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        bins = list(pool.map(lambda j: kh.build_emulated(j[0], out, j[1]), jobs))
    return {
        (str(k) if isinstance(k, str) else "canary", s): b
        for (k, s), b in zip(jobs, bins, strict=True)
    }


def _rng(*key) -> np.random.Generator:
    """A generator seeded from ``key``, the same in every process."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as the kernel's element type (bf16 as uint16 bits)."""
    if dtype == "fp32":
        return x.astype(np.float32)
    if dtype == "fp16":
        return x.astype(np.float16)
    return kh.float_to_bf16_bits(x.astype(np.float32))


def _decode(x: np.ndarray, dtype: str) -> np.ndarray:
    """Float64 values of an array in the kernel's element type."""
    if dtype == "bf16":
        return kh.bf16_bits_to_float(x).astype(np.float64)
    return x.astype(np.float64)


def _nan_output(shape, dtype: str) -> np.ndarray:
    return _encode(np.full(shape, np.nan, dtype=np.float32), dtype)


RUNS = [(b, "plain") for b in BLOCKS] + [(b, "asan") for b in BLOCKS] + [(96, "tsan")]
"""(threads per block, build) pairs every entry point runs with: each block size
plain and under ASan+UBSan; one under ThreadSanitizer, which is slower and whose
race detection does not depend on the block size."""

each_run = pytest.mark.parametrize(
    ("block", "build"), RUNS, ids=[f"{b}-{v}" for b, v in RUNS]
)


# -------------------------------------------------------------------- matmul --


@each_run
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matmul_matches_numpy(emu, dtype, block, build):
    tile = kh.macro_default("matmul", "MATMUL_TILE")
    M, N, K = 2 * tile + 3, tile + 7, 2 * tile + 5  # no side a multiple of TILE
    rng = _rng("matmul", dtype, block)
    a = _encode(rng.uniform(-1, 1, (M, K)).astype(np.float32), dtype)
    b = _encode(rng.uniform(-1, 1, (K, N)).astype(np.float32), dtype)
    grid = (-(-N // tile), -(-M // tile))
    (c,) = kh.run_emulated(
        emu["matmul", build],
        f"matmul_{dtype}",
        grid,
        block,
        [
            kh.read_only(a),
            kh.read_only(b),
            kh.read_write(_nan_output((M, N), dtype)),
            kh.i32(M),
            kh.i32(N),
            kh.i32(K),
        ],
    )
    a64, b64 = _decode(a, dtype), _decode(b, dtype)
    ref = a64 @ b64
    # float32 accumulation of K products, then one rounding to the output type.
    bound = 2 * K * U32 * (np.abs(a64) @ np.abs(b64))
    bound += UNIT_ROUNDOFF[dtype] * np.abs(ref) + 2.0**-24
    err = np.abs(_decode(c, dtype) - ref)
    assert np.all(err <= bound), f"max error {np.nanmax(err)} (NaN: unwritten)"


@needs_cxx
def test_matmul_with_another_tile_size(tmp_path):
    """MATMUL_TILE is a real tunable: a build with TILE 8 is still right."""
    binary = kh.build_emulated("matmul", tmp_path, defines={"MATMUL_TILE": 8})
    M, N, K = 13, 10, 21
    rng = _rng("matmul-tile8")
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    (c,) = kh.run_emulated(
        binary,
        "matmul_fp32",
        (2, 2),
        64,
        [
            kh.read_only(a),
            kh.read_only(b),
            kh.read_write(_nan_output((M, N), "fp32")),
            kh.i32(M),
            kh.i32(N),
            kh.i32(K),
        ],
    )
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=0, atol=K * 1e-6)


# -------------------------------------------------------------------- reduce --


@each_run
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_reduce_partials_and_total(emu, dtype, block, build):
    n = GRID * block * 4 + 37
    x = _encode(
        _rng("reduce", dtype, block).uniform(-1, 2, n).astype(np.float32), dtype
    )
    binary = emu["reduce", build]
    (partials,) = kh.run_emulated(
        binary,
        f"reduce_{dtype}",
        GRID,
        block,
        [kh.read_only(x), kh.read_write(np.full(GRID, np.nan, np.float32)), kh.i64(n)],
    )
    x64 = _decode(x, dtype)
    # Block b owns the elements i with (i // block) % GRID == b (grid stride).
    owner = (np.arange(n) // block) % GRID
    ref = np.bincount(owner, weights=x64, minlength=GRID)
    bound = 2 * n * U32 * np.bincount(owner, weights=np.abs(x64), minlength=GRID)
    assert np.all(np.abs(partials - ref) <= bound), (partials, ref)

    # The documented finish: reduce_fp32 over the partials with one block.
    (total,) = kh.run_emulated(
        binary,
        "reduce_fp32",
        1,
        block,
        [
            kh.read_only(partials),
            kh.read_write(np.full(1, np.nan, np.float32)),
            kh.i64(GRID),
        ],
    )
    assert abs(total[0] - x64.sum()) <= 2 * n * U32 * np.abs(x64).sum()


@pytest.mark.parametrize("n", [0, 1, 31])
def test_reduce_tiny_inputs(emu, n):
    """Fewer elements than threads: idle threads add zero, empty sums are 0."""
    x = np.arange(1, n + 1, dtype=np.float32)
    (out,) = kh.run_emulated(
        emu["reduce", "asan"],
        "reduce_fp32",
        2,
        64,
        [kh.read_only(x), kh.read_write(np.full(2, np.nan, np.float32)), kh.i64(n)],
    )
    np.testing.assert_array_equal(out, [x[:64].sum(), x[64:].sum()])


# --------------------------------------------------------------- elementwise --


@each_run
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_elementwise_is_exact(emu, dtype, block, build):
    n = GRID * block * 2 + 45
    rng = _rng("elementwise", dtype, block)
    x = _encode(rng.uniform(-4, 4, n).astype(np.float32), dtype)
    y = _encode(rng.uniform(-4, 4, n).astype(np.float32), dtype)
    a = np.float32(-1.7)
    (out,) = kh.run_emulated(
        emu["elementwise", build],
        f"elementwise_{dtype}",
        GRID,
        block,
        [
            kh.f32(a),
            kh.read_only(x),
            kh.read_only(y),
            kh.read_write(_nan_output(n, dtype)),
            kh.i64(n),
        ],
    )
    # In float32, one rounding per operation, then one to the element type.
    x32 = _decode(x, dtype).astype(np.float32)
    y32 = _decode(y, dtype).astype(np.float32)
    ref = _encode(a * x32 + y32, dtype)
    np.testing.assert_array_equal(out, ref)


# ------------------------------------------------------------------- stencil --


def _stencil_reference(grid: np.ndarray) -> np.ndarray:
    out = grid.copy()
    q = grid.dtype.type(0.25)
    out[1:-1, 1:-1] = q * (
        grid[:-2, 1:-1] + grid[2:, 1:-1] + grid[1:-1, :-2] + grid[1:-1, 2:]
    )
    return out


@each_run
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_stencil_sweep_is_exact(emu, dtype, block, build):
    H, W = 11, block + 19  # rows exceed the grid; a row exceeds the block
    np_dtype = np.float32 if dtype == "fp32" else np.float64
    before = _rng("stencil", dtype, block).uniform(-1, 1, (H, W)).astype(np_dtype)
    (after,) = kh.run_emulated(
        emu["stencil", build],
        f"stencil_{dtype}",
        GRID,
        block,
        [
            kh.read_only(before),
            kh.read_write(np.full((H, W), np.nan, np_dtype)),
            kh.i32(H),
            kh.i32(W),
        ],
    )
    np.testing.assert_array_equal(after, _stencil_reference(before))


@pytest.mark.parametrize("shape", [(1, 5), (2, 40), (40, 2), (3, 3)])
def test_stencil_small_grids(emu, shape):
    """Grids with no or one interior point: boundaries copied, centre averaged."""
    before = _rng("stencil-small", shape).uniform(-1, 1, shape).astype(np.float32)
    (after,) = kh.run_emulated(
        emu["stencil", "asan"],
        "stencil_fp32",
        2,
        32,
        [
            kh.read_only(before),
            kh.read_write(np.full(shape, np.nan, np.float32)),
            kh.i32(shape[0]),
            kh.i32(shape[1]),
        ],
    )
    np.testing.assert_array_equal(after, _stencil_reference(before))


# ----------------------------------------------------------------- histogram --


def _histogram_reference(x: np.ndarray, bins: int) -> np.ndarray:
    """``min(max((int)(x * B), 0), B - 1)``, saturating where int would overflow."""
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = x.astype(np.float32) * np.float32(bins)
        scaled = np.nan_to_num(np.clip(scaled, -1, bins), nan=0.0)
    idx = np.clip(np.trunc(scaled).astype(np.int64), 0, bins - 1)
    return np.bincount(idx, minlength=bins).astype(np.uint32)


def _histogram_input(n: int, bins: int, key) -> np.ndarray:
    rng = _rng("histogram", key)
    x = rng.uniform(-0.2, 1.2, n).astype(np.float32)
    edges = np.arange(0, bins + 1, max(1, bins // 16)) / np.float32(bins)
    special = np.array(
        [
            0.0,
            -0.0,
            1.0,
            np.nextafter(1, 0, dtype=np.float32),
            -1e30,
            1e30,
            np.inf,
            -np.inf,
            np.nan,
        ],
        np.float32,
    )
    return np.concatenate([x, edges.astype(np.float32), special])


@each_run
@pytest.mark.parametrize("bins", [1, 10, 257])
def test_histogram_counts_are_exact(emu, bins, block, build):
    x = _histogram_input(GRID * block * 3 + 11, bins, (bins, block))
    start = np.full(bins, 7, np.uint32)  # the kernel adds to what is there
    (counts,) = kh.run_emulated(
        emu["histogram", build],
        "histogram_fp32",
        GRID,
        block,
        [kh.read_only(x), kh.read_write(start), kh.i64(x.size), kh.i32(bins)],
    )
    np.testing.assert_array_equal(counts, start + _histogram_reference(x, bins))


def test_histogram_beyond_shared_bins(emu):
    """More bins than HISTOGRAM_MAX_BINS take the global-atomics path, still exact."""
    bins = kh.macro_default("histogram", "HISTOGRAM_MAX_BINS") + 5
    x = _histogram_input(3000, bins, "many")
    (counts,) = kh.run_emulated(
        emu["histogram", "asan"],
        "histogram_fp32",
        GRID,
        128,
        [
            kh.read_only(x),
            kh.read_write(np.zeros(bins, np.uint32)),
            kh.i64(x.size),
            kh.i32(bins),
        ],
    )
    np.testing.assert_array_equal(counts, _histogram_reference(x, bins))
    assert counts[-1] > 0 and counts.sum() == x.size


def test_histogram_reference_follows_the_formula():
    """Pinned bins for B = 4: the reference is the formula, not a copy of the kernel."""
    x = np.array(
        [-0.5, 0.0, 0.2499, 0.25, 0.74, 0.75, 0.999, 1.0, 3.0, np.nan], np.float32
    )
    np.testing.assert_array_equal(_histogram_reference(x, 4), [4, 1, 1, 4])


# ----------------------------------------------------------- largest block --


@pytest.mark.parametrize("kind", ["matmul", "reduce", "histogram"])
def test_blocks_of_1024_threads(emu, kind):
    """The kernels with barriers and shared arrays work at the largest block."""
    rng, block = _rng("1024", kind), 1024
    if kind == "matmul":
        tile = kh.macro_default("matmul", "MATMUL_TILE")
        M, N, K = tile - 1, tile - 3, 2 * tile + 1
        a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        args = [
            kh.read_only(a),
            kh.read_only(b),
            kh.read_write(_nan_output((M, N), "fp32")),
            kh.i32(M),
            kh.i32(N),
            kh.i32(K),
        ]
        (c,) = kh.run_emulated(emu[kind, "plain"], "matmul_fp32", 1, block, args)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, atol=K * 1e-6)
    elif kind == "reduce":
        n = 2 * block + 333
        x = rng.uniform(0, 1, n).astype(np.float32)
        args = [
            kh.read_only(x),
            kh.read_write(np.full(2, np.nan, np.float32)),
            kh.i64(n),
        ]
        (out,) = kh.run_emulated(emu[kind, "plain"], "reduce_fp32", 2, block, args)
        owner = (np.arange(n) // block) % 2
        ref = np.bincount(owner, weights=x.astype(np.float64))
        np.testing.assert_allclose(out, ref, rtol=n * U32)
    else:
        x = _histogram_input(3 * block, 33, "1024")
        args = [
            kh.read_only(x),
            kh.read_write(np.zeros(33, np.uint32)),
            kh.i64(x.size),
            kh.i32(33),
        ]
        (counts,) = kh.run_emulated(
            emu[kind, "plain"], "histogram_fp32", 2, block, args
        )
        np.testing.assert_array_equal(counts, _histogram_reference(x, 33))


# ---------------------------------------------------------- the emulator itself --


def test_bf16_rounding_is_to_nearest_even():
    x = np.array(
        [1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.5, np.inf], np.float32
    )
    got = kh.bf16_bits_to_float(kh.float_to_bf16_bits(x))
    np.testing.assert_array_equal(got, [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.5, np.inf])


def test_asan_stops_an_out_of_bounds_write(emu):
    with pytest.raises(kh.EmulationError, match="AddressSanitizer"):
        kh.run_emulated(
            emu["canary", "asan"],
            "canary_write_past_end",
            1,
            32,
            [kh.read_write(np.zeros(20, np.float32)), kh.i64(20)],
        )


FAR = 1 << 18
"""Elements of the buffers of the far-write canary (1 MiB of float32 each)."""


@pytest.mark.parametrize("offset", [-4_000_000, -(FAR + 4096), 4_000_000, 3 * FAR])
def test_a_write_far_past_a_buffer_faults_instead_of_landing_elsewhere(emu, offset):
    # far enough that no redzone reaches it: without the driver's guards the
    # write landed in other live memory and the run passed (4 million floats
    # before the output did, every time)
    with pytest.raises(kh.EmulationError) as err:
        kh.run_emulated(
            emu["canary", "asan"], "canary_write_far", 4, 256,
            [kh.read_only(np.ones(FAR, np.float32)),
             kh.read_write(np.zeros(FAR, np.float32)), kh.i64(FAR), kh.i64(offset)],
        )
    first = str(err.value).splitlines()[0]
    assert "AddressSanitizer" in first and ("SEGV" in first or "overflow" in first)


def test_the_far_write_canary_passes_within_its_buffer(emu):
    x = np.arange(FAR, dtype=np.float32)
    (out,) = kh.run_emulated(
        emu["canary", "asan"], "canary_write_far", 4, 256,
        [kh.read_only(x), kh.read_write(np.zeros(FAR, np.float32)), kh.i64(FAR),
         kh.i64(FAR // 2)],
    )
    want = x.copy()
    want[FAR // 2] = 1.0
    np.testing.assert_array_equal(out, want)


def test_the_finding_leads_the_message():
    stderr = ("==7==ERROR: AddressSanitizer: SEGV on unknown address 0x7f00\n"
              + "    #0 0x1 in frame\n" * 500)
    assert kh.finding(stderr) == "==7==ERROR: AddressSanitizer: SEGV on unknown " \
        "address 0x7f00"
    assert kh.finding("k.cu:3:5: runtime error: signed integer overflow") \
        == "k.cu:3:5: runtime error: signed integer overflow"
    assert kh.finding("driver: the kernel wrote to its read-only input a") \
        == "driver: the kernel wrote to its read-only input a"
    assert kh.finding("Segmentation fault") == "no sanitizer report"


def test_tsan_reports_a_missing_barrier(emu):
    with pytest.raises(kh.EmulationError, match="ThreadSanitizer: data race"):
        kh.run_emulated(
            emu["canary", "tsan"],
            "canary_missing_barrier",
            1,
            64,
            [kh.read_write(np.zeros(64, np.float32))],
        )


def test_divergent_barrier_aborts_instead_of_hanging(emu, monkeypatch):
    monkeypatch.setenv("GH_EMU_BARRIER_TIMEOUT_S", "0.5")
    lines = (kh.EMU_DIR / "canary.cu").read_text().splitlines()
    line = 1 + next(i for i, t in enumerate(lines) if "__syncthreads();" in t)
    pattern = f"divergent barriers.*__syncthreads at line {line}\\b"
    with pytest.raises(kh.EmulationError, match=pattern):
        kh.run_emulated(
            emu["canary", "asan"],
            "canary_divergent_barrier",
            1,
            32,
            [kh.read_write(np.zeros(32, np.float32))],
            timeout_s=30,
        )


@pytest.mark.parametrize("block", [32, 96])
def test_shuffles_follow_the_device_rules(emu, block):
    (out,) = kh.run_emulated(
        emu["canary", "asan"],
        "canary_shuffles",
        1,
        block,
        [kh.read_write(np.full(4 * block, -1, np.int32))],
    )
    lane = np.arange(block) % 32
    xor5, down3, down3_w8, warp_sum = out.reshape(4, block)
    np.testing.assert_array_equal(xor5, lane ^ 5)
    np.testing.assert_array_equal(down3, np.where(lane + 3 < 32, lane + 3, lane))
    np.testing.assert_array_equal(down3_w8, np.where(lane % 8 + 3 < 8, lane + 3, lane))
    t = np.arange(block)
    np.testing.assert_array_equal(warp_sum, [t[t // 32 == w].sum() for w in t // 32])


def test_half_conversions_match_numpy(emu):
    """__float2half / __float2bfloat16 round to nearest even, as the device does.

    Covers ties, subnormal halves, overflow to inf, inf and NaN; fp16 is checked
    against NumPy's float16, bf16 against the harness's bit arithmetic.
    """
    rng = np.random.default_rng(7)
    ties = np.float32(1) + np.arange(1, 40, 2, dtype=np.float32) * np.float32(2**-11)
    x = np.concatenate(
        [
            rng.standard_normal(500).astype(np.float32) * np.float32(1e3),
            rng.uniform(-(2**-13), 2**-13, 200).astype(np.float32),  # subnormal halves
            ties,
            -ties,
            np.array(
                [
                    0.0,
                    -0.0,
                    65504,
                    65519.99,
                    65520,
                    -70000,
                    2**-25,
                    2**-26,
                    3 * 2**-26,
                    3.4e38,
                    np.inf,
                    -np.inf,
                    np.nan,
                ],
                np.float32,
            ),
        ]
    ).astype(np.float32)
    n = x.size
    h, h_back, b, b_back = kh.run_emulated(
        emu["canary", "asan"],
        "canary_conversions",
        -(-n // 64),
        64,
        [
            kh.read_only(x),
            kh.read_write(np.zeros(n, np.float16)),
            kh.read_write(np.zeros(n, np.float32)),
            kh.read_write(np.zeros(n, np.uint16)),
            kh.read_write(np.zeros(n, np.float32)),
            kh.i64(n),
        ],
    )
    with np.errstate(over="ignore"):
        want_h = x.astype(np.float16)
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(h_back, want_h.astype(np.float32))
    np.testing.assert_array_equal(b, kh.float_to_bf16_bits(x))
    np.testing.assert_array_equal(b_back, kh.bf16_bits_to_float(b))


def _rounded(x: np.ndarray, nearest: np.ndarray, back: np.ndarray, ftype) -> dict:
    """The four rounding modes from round-to-nearest: ``nearest`` (in ``ftype``)
    and ``back`` (its float32 values), stepped one ulp where the mode asks."""
    with np.errstate(over="ignore", invalid="ignore"):
        up = np.nextafter(nearest, ftype(np.inf))
        down = np.nextafter(nearest, ftype(-np.inf))
        rd = np.where(back > x, down, nearest)
        ru = np.where(back < x, up, nearest)
        rz = np.where(np.abs(back) > np.abs(x), np.where(x > 0, down, up), nearest)
    return {"rn": nearest, "rz": rz, "rd": rd, "ru": ru}


def test_float_to_half_and_bf16_in_every_rounding_mode(emu):
    rng = np.random.default_rng(11)
    x = np.concatenate([
        rng.standard_normal(300).astype(np.float32) * np.float32(1e3),
        rng.uniform(-(2**-13), 2**-13, 100).astype(np.float32),
        np.array([0.0, 1.0, -1.0, 1 + 2**-11, 65504, 65519.99, 70000, -70000,
                  2**-26, -(2**-26)], np.float32)]).astype(np.float32)
    n = x.size
    h, b = kh.run_emulated(
        emu["canary", "asan"], "canary_round_modes", -(-n // 64), 64,
        [kh.read_only(x), kh.read_write(np.zeros(4 * n, np.uint16)),
         kh.read_write(np.zeros(4 * n, np.uint16)), kh.i64(n)])
    with np.errstate(over="ignore"):
        nearest = x.astype(np.float16)
    want = _rounded(x, nearest, nearest.astype(np.float32), np.float16)
    got = h.reshape(n, 4).view(np.float16)
    for m, mode in enumerate(("rn", "rz", "rd", "ru")):
        np.testing.assert_array_equal(got[:, m], want[mode], err_msg=mode)
    # bf16 (no NumPy type): the value each mode names is the nearest where
    # that already lies on the mode's side of x, else its neighbour one step
    # away on that side
    near_bits = kh.float_to_bf16_bits(x).astype(np.int32)
    near_b = kh.bf16_bits_to_float(near_bits.astype(np.uint16))
    for m, side in enumerate((None, np.abs, "down", "up")):
        bits = b.reshape(n, 4)[:, m]
        col = kh.bf16_bits_to_float(bits)
        if side is None:
            np.testing.assert_array_equal(bits, near_bits)
            continue
        if side == "down":
            ok_near, ok_col = near_b <= x, col <= x
        elif side == "up":
            ok_near, ok_col = near_b >= x, col >= x
        else:
            ok_near, ok_col = np.abs(near_b) <= np.abs(x), np.abs(col) <= np.abs(x)
        one_step = np.abs(bits.astype(np.int32) - near_bits) == 1
        assert np.all(np.where(ok_near, bits == near_bits, ok_col & one_step)), side


def test_half_arithmetic_as_kernels_write_it(emu):
    rng = np.random.default_rng(12)
    a = (rng.standard_normal(400) * 50).astype(np.float16)
    b = (rng.standard_normal(400) * 50).astype(np.float16)
    n = a.size
    (out,) = kh.run_emulated(
        emu["canary", "asan"], "canary_half_math", -(-n // 64), 64,
        [kh.read_only(a), kh.read_only(b), kh.read_write(np.zeros(8 * n, np.float32)),
         kh.i64(n)])
    out = out.reshape(n, 8)
    f16 = np.float16
    np.testing.assert_array_equal(out[:, 0], (a + b).astype(np.float32))
    np.testing.assert_array_equal(out[:, 1], (a - b).astype(np.float32))
    np.testing.assert_array_equal(out[:, 2], (a * b).astype(np.float32))
    fma = (a.astype(np.float64) * b + a).astype(f16)     # one rounding
    np.testing.assert_allclose(out[:, 3], fma.astype(np.float32), rtol=2**-10)
    np.testing.assert_array_equal(
        out[:, 4], (a + b).astype(np.float32) + (b * a).astype(np.float32))
    np.testing.assert_array_equal(out[:, 5], -a.astype(np.float32))
    np.testing.assert_array_equal(out[:, 6], np.maximum(a, b).astype(np.float32))
    np.testing.assert_array_equal(out[:, 7], np.trunc(a.astype(np.float32)))


def test_intrinsics_and_math_kernels_call(emu):
    x = np.array([1.5, 2.0**-30, 1.0 + 2.0**-12, np.nan], np.float32)
    threads = 256
    u, f, counters, dsum = kh.run_emulated(
        emu["canary", "asan"], "canary_intrinsics", 1, threads,
        [kh.read_only(x), kh.read_write(np.zeros(29, np.int64)),
         kh.read_write(np.zeros(20, np.float64)),
         kh.read_write(np.array([0, 0, 0, 0xffffffff, 0, 0], np.uint32)),
         kh.read_write(np.zeros(1, np.float64))])
    want_u = {
        0: len(range(0, threads, 3)), 1: 1, 2: 1, 3: sum(range(32)), 4: 31,
        5: int(x[:1].view(np.int32)[0]), 6: 0x3F800000, 7: 0x80000000,
        8: 0x55114400, 9: 0x18, 10: 0x10000001, 11: 0xFFFFFFFE, 12: -1,
        13: 8, 14: 63, 15: 9, 16: 2, 17: -2, 18: -3, 19: 3, 20: 0, 21: -15,
        22: 3, 23: int(np.float64(1.0).view(np.int64)),
        24: 2,      # min(-1, 2u) compares as unsigned, as CUDA's overload does
        25: 9, 26: 3, 27: -4, 28: 2**40 + 5}
    for k, v in want_u.items():
        assert u[k] == v, (k, int(u[k]), v)
    one_plus = np.float64(1.0) + np.float64(x[1])     # exact sum, between floats
    assert f[0] == 1.0 and f[1] == np.nextafter(np.float32(1), np.float32(2))
    assert f[0] < one_plus < f[1] and f[2] == 1.0
    exact_sq = np.float64(x[2]) ** 2
    assert f[3] <= exact_sq and np.float32(f[3]) == f[3]
    assert f[5] < 1 / 3 < f[4] and np.nextafter(np.float32(f[5]), np.float32(1)) == f[4]
    np.testing.assert_allclose(f[6:13], [0.5, 1.0, -1.0, 0.5, 0.4769362762044699,
                                         0.5, 7.0], rtol=1e-6)
    assert f[13] == np.float32(0.099999994) and f[14] == 16777216.0
    np.testing.assert_allclose(f[15], np.float64(x[2]) ** 2 - 1, rtol=1e-6)
    assert tuple(f[16:20]) == (0.25, 1.0, 3.0, 2.0)
    # atomics over the block's 256 threads
    # atomicInc wraps to 0 past its limit, atomicDec to its limit below 0: a
    # cycle of limit + 1 operations from 0, whatever the threads' order
    assert counters[0] == threads % 6 and counters[1] == (8 - threads % 8) % 8
    assert counters[2] == 0xFFFFFFFF and counters[3] == 0
    assert counters[4] == 0 and counters[5] == 2 * threads
    assert dsum[0] == 0.5 * threads


def test_half_atomics_add_every_threads_one(emu):
    h, b, pair = kh.run_emulated(
        emu["canary", "asan"], "canary_half_atomics", 2, 128,
        [kh.read_write(np.zeros(1, np.float16)), kh.read_write(np.zeros(1, np.uint16)),
         kh.read_write(np.zeros(2, np.float16))])
    assert h[0] == 256 and kh.bf16_bits_to_float(b)[0] == 256
    assert pair.tolist() == [256, 512]
