"""The cuda backend end to end on emulated GPUs, checked against NumPy.

``tests/emulated_cupy.py`` stands in for CuPy at its boundary: kernels are the
code-gen plane's real sources built as host C++ and run by the emulator, streams
are queues that run only when the host or another stream waits for them, and
fresh memory is garbage. :func:`emulated_cupy.install` puts it into
``sys.modules`` as ``cupy`` for one test, so ``CudaBackend`` is built by its own
constructor (its probe sees four devices) and runs unchanged: argument order,
launch geometry, dtype layouts, stream and event order, chunking, stencil halos
and the three sum merges are all on the path, and results must match the NumPy
reference. Sizes are small and not multiples of the block (32 or 96 threads).
"""

from __future__ import annotations

import ctypes
import time

import emulated_cupy as ec
import numpy as np
import pytest

from lib.codegen.emulate import find_cxx
from lib.contract import Decision, TaskSpec
from lib.execution.base import DeviceError
from lib.execution.cuda import CudaBackend, chunk_bounds, default_source_provider
from lib.platform.workloads import round_bf16, split_rows, workload

pytestmark = pytest.mark.skipif(
    find_cxx() is None, reason="no C++ compiler (g++ or clang++) for emulated kernels"
)

DEVICES = 4
"""Emulated devices: one per device of hetero-4 (device_map identity)."""

MATMUL = TaskSpec("matmul", {"M": 37, "N": 29, "K": 45})
REDUCE = TaskSpec("reduce", {"N": 5003})
ELEMENTWISE = TaskSpec("elementwise", {"N": 3001})
STENCIL = TaskSpec("stencil", {"H": 19, "W": 23, "T": 2})
HISTOGRAM = TaskSpec("histogram", {"N": 4099, "B": 37})

EXACT = ("elementwise", "stencil", "histogram")
"""Kinds whose fp32 kernels compute what NumPy computes, bit for bit."""


def decide(task: TaskSpec, gpus: tuple[int, ...], shares: tuple[float, ...],
           block: int, mode: str = "split", comm: str = "host",
           chunk: int | None = None) -> Decision:
    return Decision(gpus=gpus, shares=shares, chunk=chunk or task.split_size,
                    block=block, mode=mode, comm_path=comm).with_hash(task)


FP32_SPLIT = [
    (MATMUL, (0, 1, 2), (0.5, 0.3, 0.2), 96),
    (REDUCE, (0, 1, 3), (0.45, 0.35, 0.2), 32),
    (ELEMENTWISE, (1, 2, 3), (0.2, 0.5, 0.3), 96),
    (STENCIL, (0, 1, 2), (0.4, 0.35, 0.25), 32),
    (HISTOGRAM, (0, 2, 3), (0.3, 0.3, 0.4), 96),
]
"""(task, gpus, shares, block): every kind split unevenly over three devices."""

LOW_PRECISION = [
    (TaskSpec(t.kind, t.dims, dtype=dt), gpus, shares, block)
    for t, gpus, shares, block in [
        (MATMUL, (0, 3), (0.7, 0.3), 96),
        (REDUCE, (1, 2), (0.55, 0.45), 32),
        (ELEMENTWISE, (0, 2), (0.62, 0.38), 32),
    ]
    for dt in ("fp16", "bf16")
]
"""The 16-bit kinds over two devices (bf16 travels as uint16 words)."""


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """Emulator binaries for the session, the cases' kernels built up front in
    parallel (one per kind, dtype and block-dependent define)."""
    cases = FP32_SPLIT + LOW_PRECISION
    try:
        sources = [default_source_provider(t, decide(t, g, s, b))[0]
                   for t, g, s, b in cases]
    except Exception as exc:  # no NVRTC, hence no template kernels
        pytest.skip(f"the code-gen plane serves no kernel source here "
                    f"({type(exc).__name__}: {exc!s:.120})")
    kb = ec.session_builds(tmp_path_factory.mktemp("emulated_cupy"))
    kb.prebuild(sources)
    return kb


@pytest.fixture
def gpus(builds, hetero4, monkeypatch):
    """``gpus(**options) -> cupy``: a fresh stand-in, installed as ``cupy`` for
    this test; peer access as hetero-4's links allow unless told otherwise."""
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")  # restored after the test

    def linked(a: int, b: int) -> bool:
        link = hetero4.peer(min(a, b), max(a, b))
        return link is not None and link.p2p

    def make(**options):
        options.setdefault("peer_access", linked)
        cp = ec.make_cupy(DEVICES, builds, **options)
        ec.install(cp, monkeypatch)
        return cp

    return make


def run(cp, machine, task, decision, **backend):
    """Run with verification; the result and the stand-in's log of this run."""
    mark = len(cp.gpus.log)
    with CudaBackend(machine, warmup=backend.pop("warmup", 0), **backend) as b:
        result = b.run(task, decision, verify=True)
    assert cp.gpus.races == []
    return result, cp.gpus.log[mark:]


def launches(log, ordinal: int) -> list[tuple[str, str]]:
    """(kernel, queue) of each launch queued on ``ordinal``."""
    return [(e[2], e[3]) for e in log if e[0] == "launch" and e[1] == ordinal]


def reference(task: TaskSpec) -> np.ndarray:
    w = workload(task)
    return w.reference(task, w.make_inputs(task, 0))


# -- every kind, fp32, split ------------------------------------------------------


@pytest.mark.parametrize(("task", "gpus_", "shares", "block"), FP32_SPLIT,
                         ids=[t.kind for t, *_ in FP32_SPLIT])
def test_every_kind_splits_and_verifies(gpus, hetero4, task, gpus_, shares, block):
    cp = gpus()
    d = decide(task, gpus_, shares, block)
    result, log = run(cp, hetero4, task, d)
    m = result.metrics
    assert m.verified is True and m.label == "MEASURED (cuda)"
    assert set(m.per_device_seconds) == set(gpus_)
    assert all(t > 0 for t in m.per_device_seconds.values()) and m.total_seconds > 0
    sweeps = task.dims["T"] if task.kind == "stencil" else 1
    for g in range(DEVICES):
        assert len(launches(log, g)) == (sweeps if g in gpus_ else 0)
    if task.kind in EXACT:
        assert np.array_equal(result.output, reference(task))
    # close() emptied the pool of every device it used, and the pinned pool
    assert cp.gpus.pool_frees == {g: int(g in gpus_) for g in range(DEVICES)}
    assert cp.gpus.pinned_pool_frees == 1


@pytest.mark.parametrize(("task", "gpus_", "shares", "block"), LOW_PRECISION,
                         ids=[f"{t.kind}-{t.dtype}" for t, *_ in LOW_PRECISION])
def test_fp16_and_bf16_verify(gpus, hetero4, task, gpus_, shares, block):
    result, _ = run(gpus(), hetero4, task, decide(task, gpus_, shares, block))
    assert result.metrics.verified is True
    out = result.output
    assert out.dtype == workload(task).output_dtype(task)
    if task.dtype == "bf16" and task.merge == "concat":
        # bf16 words came back and were widened: every value is a bf16 value.
        assert np.array_equal(round_bf16(out), out) and np.isfinite(out).all()


# -- pipelined: several chunks per device, both streams ---------------------------

PIPELINED = [
    (MATMUL, (0, 1), (0.6, 0.4), 96, "host", 5),
    (ELEMENTWISE, (1, 2, 3), (0.5, 0.3, 0.2), 96, "host", 400),
    (REDUCE, (0, 3), (0.7, 0.3), 32, "nccl", 1000),
    (HISTOGRAM, (1, 2), (0.65, 0.35), 96, "p2p", 900),
    (STENCIL, (0, 1, 2), (0.4, 0.35, 0.25), 32, "host", 4),
]


@pytest.mark.parametrize(("task", "gpus_", "shares", "block", "comm", "chunk"),
                         PIPELINED, ids=[t.kind for t, *_ in PIPELINED])
def test_pipelined_chunks_alternate_streams(gpus, hetero4, task, gpus_, shares,
                                            block, comm, chunk):
    cp = gpus()
    d = decide(task, gpus_, shares, block, mode="pipelined", comm=comm, chunk=chunk)
    result, log = run(cp, hetero4, task, d)
    assert result.metrics.verified is True
    for g, (lo, hi) in zip(gpus_, split_rows(task.split_size, shares), strict=True):
        done = launches(log, g)
        if task.kind == "stencil":  # bands are never chunked: T sweeps, one stream
            assert len(done) == task.dims["T"] and len({q for _, q in done}) == 1
            continue
        pieces = chunk_bounds(lo, hi, chunk)
        assert len(pieces) >= 2
        assert len(done) == len(pieces) and len({q for _, q in done}) == 2
    if task.kind in EXACT:
        assert np.array_equal(result.output, reference(task))


# -- sum merges ---------------------------------------------------------------------

SUM_PATHS = {
    "host": ((0, 2, 3), (0.3, 0.3, 0.4)),
    "p2p": ((1, 2), (0.65, 0.35)),
    "nccl": ((0, 1, 2, 3), (0.1, 0.2, 0.3, 0.4)),
}


@pytest.mark.parametrize("comm", list(SUM_PATHS))
@pytest.mark.parametrize("task", [REDUCE, HISTOGRAM], ids=["reduce", "histogram"])
def test_sum_merges_on_each_path(gpus, hetero4, task, comm):
    cp = gpus()
    gpus_, shares = SUM_PATHS[comm]
    block = 32 if task.kind == "reduce" else 96
    result, log = run(cp, hetero4, task, decide(task, gpus_, shares, block,
                                                comm=comm))
    assert result.metrics.verified is True
    peer = [e for e in log if e[0] == "memcpy_peer"]
    reduced = [e for e in log if e[0] == "allreduce"]
    if comm == "host":
        assert not peer and not reduced
    elif comm == "p2p":  # the second partial copied to the first device
        assert [(e[1], e[2]) for e in peer] == [(1, 2)] and not reduced
    else:
        assert reduced == [("allreduce", gpus_)] and not peer
    if task.kind == "histogram":
        assert np.array_equal(result.output, reference(task))


def test_peer_sum_goes_through_the_host_without_peer_access(gpus, hetero4):
    cp = gpus(peer_access=lambda a, b: False)
    d = decide(HISTOGRAM, (1, 2), (0.65, 0.35), 96, comm="p2p")
    result, log = run(cp, hetero4, HISTOGRAM, d)
    assert result.metrics.verified is True
    assert not [e for e in log if e[0] == "memcpy_peer"]


def test_nccl_path_without_nccl_falls_back_to_peer_copies(gpus, hetero4):
    """Only 0-1 is a peer link on hetero-4: one peer copy, two through the host."""
    cp = gpus(nccl=False)
    d = decide(REDUCE, (0, 1, 2, 3), (0.1, 0.2, 0.3, 0.4), 32, comm="nccl")
    result, log = run(cp, hetero4, REDUCE, d)
    assert result.metrics.verified is True
    assert [(e[1], e[2]) for e in log if e[0] == "memcpy_peer"] == [(0, 1)]
    assert not [e for e in log if e[0] == "allreduce"]


# -- a device with no share, a device that fails ---------------------------------


@pytest.mark.parametrize(("task", "comm"), [(ELEMENTWISE, "host"), (REDUCE, "nccl")],
                         ids=["concat", "sum-nccl"])
def test_a_zero_share_device_does_nothing(gpus, hetero4, task, comm):
    cp = gpus()
    block = 32 if task.kind == "reduce" else 96
    d = decide(task, (0, 1, 2), (0.6, 0.0, 0.4), block, comm=comm)
    result, log = run(cp, hetero4, task, d)
    assert result.metrics.verified is True
    assert set(result.metrics.per_device_seconds) == {0, 2}
    assert not launches(log, 1) and not [e for e in log if e[1:2] == (1,)]
    if comm == "nccl":
        assert [e for e in log if e[0] == "allreduce"] == [("allreduce", (0, 2))]


FAILING = decide(ELEMENTWISE, (0, 2, 3), (0.4, 0.3, 0.3), 96)


def test_out_of_memory_names_device_shard_and_hash(gpus, hetero4):
    gpus(fail_alloc={2})
    with pytest.raises(DeviceError) as info:
        with CudaBackend(hetero4, warmup=0) as b:
            b.run(ELEMENTWISE, FAILING)
    err = info.value
    assert (err.device, err.shard, err.config_hash) == (2, 1, FAILING.config_hash)
    lo, hi = split_rows(ELEMENTWISE.split_size, FAILING.shares)[1]
    label = hetero4.devices[2].label
    assert f"device {label} failed on shard 1 (rows {lo}:{hi})" in str(err)
    text = str(err)
    assert FAILING.config_hash[:12] in text and "out of memory" in text


def test_replan_finishes_on_the_remaining_devices(gpus, hetero4):
    cp = gpus(fail_alloc={2})
    result, log = run(cp, hetero4, ELEMENTWISE, FAILING, allow_replan=True)
    assert result.metrics.verified is True
    assert np.array_equal(result.output, reference(ELEMENTWISE))
    replanned = result.detail["replanned"]
    assert replanned["failed_device"] == 2 and "out of memory" in replanned["reason"]
    assert result.decision.gpus == (0, 3)
    assert result.decision.shares == pytest.approx((4 / 7, 3 / 7))
    assert replanned["decision"]["config_hash"] == result.decision.config_hash != ""
    assert set(result.metrics.per_device_seconds) == {0, 3}
    assert not launches(log, 2)


def test_profile_devices_map_to_cuda_ordinals(gpus, hetero4):
    """device_map reversed: profile device g runs on ordinal 3 - g, and a failure
    on ordinal 1 is reported as profile device 2."""
    reverse = {g: DEVICES - 1 - g for g in range(DEVICES)}
    cp = gpus()
    result, log = run(cp, hetero4, ELEMENTWISE, FAILING, device_map=reverse)
    assert result.metrics.verified is True
    assert [len(launches(log, o)) for o in range(DEVICES)] == [1, 1, 0, 1]
    failing = gpus(fail_alloc={1})
    with pytest.raises(DeviceError) as info:
        run(failing, hetero4, ELEMENTWISE, FAILING, device_map=reverse)
    assert info.value.device == 2


# -- several shards on one physical device ------------------------------------------

ONE_DEVICE = [
    (ELEMENTWISE, "split", "host", 96, 3001),
    (MATMUL, "pipelined", "host", 96, 5),
    (REDUCE, "pipelined", "host", 32, 1000),
    (HISTOGRAM, "split", "p2p", 96, 4099),
    (STENCIL, "split", "host", 32, 19),
]


@pytest.mark.parametrize(("task", "mode", "comm", "block", "chunk"), ONE_DEVICE,
                         ids=[f"{t.kind}-{m}-{c}" for t, m, c, *_ in ONE_DEVICE])
def test_several_shards_run_on_one_device(gpus, hetero4, task, mode, comm, block,
                                          chunk):
    """Three profile devices mapped onto ordinal 3: each shard has its own
    streams there, and a p2p sum adds the partials in place (no copy)."""
    cp = gpus()
    d = decide(task, (0, 1, 2), (0.4, 0.35, 0.25), block, mode=mode, comm=comm,
               chunk=chunk)
    result, log = run(cp, hetero4, task, d, device_map={0: 3, 1: 3, 2: 3})
    assert result.metrics.verified is True
    assert all(not launches(log, o) for o in range(3))
    streams = {q for _, q in launches(log, 3)}
    assert len(streams) == (3 if task.kind == "stencil" or mode == "split" else 6)
    assert set(result.detail["device_map"].values()) == {3}
    if comm == "p2p":
        assert result.metrics.merge_path == "p2p"
        assert result.metrics.peer_copies == ()


# -- when the host waits ----------------------------------------------------------


def test_every_shard_is_queued_before_the_host_waits_sum(gpus, hetero4):
    """A sum merge keeps partials on the devices: all work is queued first."""
    cp = gpus()
    d = decide(REDUCE, (0, 1, 3), (0.45, 0.35, 0.2), 32, mode="pipelined",
               chunk=1000)
    _, log = run(cp, hetero4, REDUCE, d)
    kinds = [e[0] for e in log]
    assert kinds.index("host_wait") > max(i for i, k in enumerate(kinds)
                                          if k == "launch")


def test_every_shard_is_queued_before_the_host_waits_concat(gpus, hetero4):
    cp = gpus()
    d = decide(ELEMENTWISE, (1, 2, 3), (0.5, 0.3, 0.2), 96, mode="pipelined",
               chunk=400)
    _, log = run(cp, hetero4, ELEMENTWISE, d)
    kinds = [e[0] for e in log]
    assert kinds.index("host_wait") > max(i for i, k in enumerate(kinds)
                                          if k == "launch")


# -- the stand-in itself ------------------------------------------------------------


def test_stand_in_shows_reads_before_their_producer_ran(gpus):
    """Smoke test of the double: an async copy lands only when its stream is
    waited for, and a stream does not see another stream's pending work."""
    cp = gpus()
    host = np.arange(5, dtype=np.float32)
    with cp.cuda.Device(1):
        s = cp.cuda.Stream(non_blocking=True)
        x = cp.asarray(host)  # queued on the null stream
        cp.cuda.Stream.null.synchronize()
        out = np.frombuffer(cp.cuda.alloc_pinned_memory(20), np.float32, 5)
        x.get(stream=s, out=out, blocking=False)
        assert np.isnan(out).all()
        s.synchronize()
        assert np.array_equal(out, host)
        y = cp.zeros(5, dtype=cp.float32)  # a memset on the null stream, not waited
        y.get(stream=s, out=out, blocking=False)
        s.synchronize()
        assert np.isnan(out).all()


def test_stand_in_reports_unordered_accesses(gpus):
    """A stream reading what another stream writes needs a wait_event between."""
    cp = gpus()
    host = np.frombuffer(cp.cuda.alloc_pinned_memory(16), np.float32, 4)
    host[...] = 1  # pinned, so the copy below does not block the host
    with cp.cuda.Device(0):
        writer, reader = (cp.cuda.Stream(non_blocking=True) for _ in range(2))
        x = cp.empty(4, dtype=cp.float32)
        with writer:
            x.set(host, stream=writer)
        with reader:
            x.sum()
        assert len(cp.gpus.races) == 1 and "sum on stream" in cp.gpus.races[0]
        done = cp.cuda.Event()
        done.record(writer)
        reader.wait_event(done)
        with reader:
            x.sum()
        assert len(cp.gpus.races) == 1


def test_stand_in_refuses_launches_that_mismatch_the_signature(gpus):
    cp = gpus()
    d = decide(ELEMENTWISE, (0,), (1.0,), 96, mode="single")
    source, name, options = default_source_provider(ELEMENTWISE, d)
    kernel = cp.RawModule(code=source, options=options).get_function(name)
    with cp.cuda.Device(0):
        x = cp.empty(8, dtype=cp.float32)
        half = cp.empty(8, dtype=cp.float16)
        args = (np.float32(2.5), x, x, x, np.int64(8))
        kernel((1, 1, 1), (32, 1, 1), args)  # accepted
        with pytest.raises(TypeError, match="argument 4: expected a int64 scalar"):
            kernel((1, 1, 1), (32, 1, 1), args[:4] + (np.int32(8),))
        with pytest.raises(TypeError, match="argument 1: expected contiguous float32"):
            kernel((1, 1, 1), (32, 1, 1), (args[0], half) + args[2:])
    with cp.cuda.Device(1), pytest.raises(ValueError, match="on device 0"):
        kernel((1, 1, 1), (32, 1, 1), args)


TOO_MUCH_SHARED = r'''
extern "C" __global__ void big_shared(float* out) {
    __shared__ float tile[16384];  // 64 KiB
    tile[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = tile[0];
}
'''


def test_stand_in_pools_device_memory_per_device_and_per_stream(gpus):
    """memory.pyx: a freed block goes back to the arena of the stream it was
    allocated on, and comes out again at once; freeing it while another stream
    still has work on it is a race; free_all_blocks is per device."""
    cp = gpus()
    pool = cp.get_default_memory_pool()
    with cp.cuda.Device(1):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.zeros(100, dtype=cp.float32)
            ptr = x.data.ptr
            x.sum()  # queued on s, not run
            del x  # s's own arena: reuse is ordered after the sum
            assert cp.empty(100, dtype=cp.float32).data.ptr == ptr
        assert cp.gpus.races == []
        z = cp.zeros(100, dtype=cp.float32)  # the null stream's arena
        cp.cuda.Stream.null.synchronize()
        with s:
            z.sum()
        del z
        assert len(cp.gpus.races) == 1
        assert "went back to the pool of null@1 while sum on stream" in \
            cp.gpus.races[0]
        assert pool.n_free_blocks() > 0
    with cp.cuda.Device(0):
        pool.free_all_blocks()
    with cp.cuda.Device(1):
        assert pool.n_free_blocks() > 0  # device 0's call left device 1's pool
        pool.free_all_blocks()
        assert pool.n_free_blocks() == 0
    assert cp.gpus.pool_frees == {0: 1, 1: 1, 2: 0, 3: 0}


def test_stand_in_pinned_pool_hands_a_freed_block_out_at_once(gpus):
    """pinned_memory.pyx: no stream tracking. A block dropped while a copy into
    it is queued is handed out again, and the stale copy lands in it later."""
    cp = gpus()
    with cp.cuda.Device(0):
        s = cp.cuda.Stream(non_blocking=True)
        x = cp.zeros(4, dtype=cp.float32)
        cp.cuda.Stream.null.synchronize()
        buf = cp.cuda.alloc_pinned_memory(16)
        address = ctypes.addressof(buf)
        x.get(stream=s, out=np.frombuffer(buf, np.float32, 4), blocking=False)
        del buf
        assert len(cp.gpus.races) == 1 and "pinned host memory" in cp.gpus.races[0]
        again = cp.cuda.alloc_pinned_memory(16)
        assert ctypes.addressof(again) == address
        assert cp.gpus.log[-1] == ("pinned", 512, True)
        staged = np.frombuffer(again, np.float32, 4)
        staged[...] = 7.0
        s.synchronize()
        assert (staged == 0).all()  # the old copy overwrote the new owner's data


def test_stand_in_refuses_launches_over_the_hardware_limits(gpus, builds):
    cp = gpus()
    d = decide(REDUCE, (0,), (1.0,), 32, mode="single")
    source, name, options = default_source_provider(REDUCE, d)
    kernel = cp.RawModule(code=source, options=options).get_function(name)
    assert kernel.static_shared == 32 * 4  # REDUCE_MAX_THREADS floats
    with cp.cuda.Device(0):
        x = cp.empty(8, dtype=cp.float32)
        out = cp.empty(8, dtype=cp.float32)
        args = (x, out, np.int64(8))
        kernel((1, ec.MAX_GRID_YZ, 1), (32, 1, 1), args)  # queued, never run
        kernel((1, 1, 1), (32, 1, 1), args, shared_mem=ec.SHARED_LIMIT - 128)
        for grid, block, shared in [((1, ec.MAX_GRID_YZ + 1, 1), (32, 1, 1), 0),
                                    ((1, 1, ec.MAX_GRID_YZ + 1), (32, 1, 1), 0),
                                    ((1, 1, 1), (1056, 1, 1), 0),
                                    ((1, 1, 1), (1, 1, 65), 0),
                                    ((1, 1, 1), (32, 1, 1), ec.SHARED_LIMIT - 124)]:
            with pytest.raises(ec.CUDADriverError, match="CUDA_ERROR_INVALID_VALUE"):
                kernel(grid, block, args, shared_mem=shared)
    with pytest.raises(ec.CompileException, match="too much shared data"):
        cp.RawModule(code=TOO_MUCH_SHARED).get_function("big_shared")


def test_stand_in_streams_belong_to_their_device(gpus):
    """stream.pyx check_stream_device_match."""
    cp = gpus()
    with cp.cuda.Device(1):
        s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(0), pytest.raises(RuntimeError, match=r"created on \(1\)"):
        with s:
            pass


def test_stand_in_has_nccl_only_with_its_library(gpus):
    """cupy/cuda/nccl.py without libnccl: ``available`` and nothing else; and
    cupy.cuda has no nccl attribute until imported (cupy/cuda/__init__.py)."""
    cp = gpus(nccl=False)
    from cupy.cuda import nccl

    assert nccl.available is False and not hasattr(nccl, "NcclCommunicator")
    with pytest.raises(AttributeError, match="no attribute 'nccl'"):
        cp.cuda.nccl  # noqa: B018
    gpus(nccl=True)
    from cupy.cuda import nccl

    assert nccl.available is True and hasattr(nccl, "NcclCommunicator")


def test_stand_in_peer_access_is_per_direction_and_enabled_once(gpus):
    cp = gpus()  # hetero-4: 0-1 is a peer link, 0-3 is not
    rt = cp.cuda.runtime
    with cp.cuda.Device(0):
        rt.deviceEnablePeerAccess(1)
        for peer, status in [(1, rt.errorPeerAccessAlreadyEnabled), (3, 217),
                             (0, 101)]:
            with pytest.raises(ec.CUDARuntimeError) as info:
                rt.deviceEnablePeerAccess(peer)
            assert info.value.status == status
        a = cp.zeros(4, dtype=cp.float32)
    with cp.cuda.Device(1):
        b = cp.zeros(4, dtype=cp.float32)
    rt.memcpyPeer(a.data.ptr, 0, b.data.ptr, 1, 16)  # 0 reads 1: enabled
    rt.memcpyPeer(b.data.ptr, 1, a.data.ptr, 0, 16)  # 1 reads 0: not enabled
    copies = [e for e in cp.gpus.log if e[0] == "memcpy_peer"]
    assert copies == [("memcpy_peer", 0, 1, 16, True), ("memcpy_peer", 1, 0, 16, False)]


def test_stand_in_event_times_follow_an_eager_device(gpus):
    """An event on an idle stream reads the host's clock when recorded, though
    the stand-in runs the stream's work later."""
    cp = gpus()
    with cp.cuda.Device(2):
        s = cp.cuda.Stream(non_blocking=True)
        first, second = cp.cuda.Event(), cp.cuda.Event()
        first.record(s)
        time.sleep(0.2)
        second.record(s)
        time.sleep(0.2)
        s.synchronize()
    # the host's 0.2 s between the records, not the 0.2 s after them
    assert 200 <= cp.cuda.get_elapsed_time(first, second) < 400


# -- a GPU the backend cannot see ----------------------------------------------------


def test_a_gpu_cuda_cannot_see_is_not_decided_for(gpus, hetero4, monkeypatch):
    """With profile device 0 (the H100) hidden from CUDA, as
    ``CUDA_VISIBLE_DEVICES`` hides a card, the agent's policy decides over
    the other three, the decision runs and verifies, and Gate 1 refuses a
    decision naming device 0 before anything runs; with every device seen,
    the same large task does use device 0."""
    from lib.runtime import Agent, DecisionRejected

    big = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cp = gpus()
    with Agent(machine=hetero4, backend=CudaBackend(hetero4, warmup=0),
               telemetry=None) as every:
        assert 0 in every.optimize(big).gpus
    hidden = CudaBackend(hetero4, warmup=0, device_map={1: 1, 2: 2, 3: 3})
    with Agent(machine=hetero4, backend=hidden, telemetry=None) as agent:
        assert 0 not in agent.optimize(big).gpus
        decision = agent.optimize(ELEMENTWISE)
        assert 0 not in decision.gpus
        mark = len(cp.gpus.log)
        assert agent.execute(ELEMENTWISE, decision, verify=True).metrics.verified
        with pytest.raises(DecisionRejected, match="device 0:H100 SXM is "
                           "unhealthy: CUDA does not see it"):
            agent.execute(ELEMENTWISE, decide(ELEMENTWISE, (0, 1), (0.5, 0.5), 96))
    assert not launches(cp.gpus.log[mark:], 0)


def test_a_profile_of_ones_own_takes_the_gpus_in_pci_bus_order(gpus, hetero4):
    """CUDA numbers the fastest card first; a profile written by hand lists
    the cards as nvidia-smi does, by PCI bus. With CUDA's ordinals on buses
    in the reverse order, profile device 0 (the first bus) runs on ordinal 3."""
    cp = gpus(bus_ids=[f"0000:{0x80 - 0x10 * o:02X}:00.0" for o in range(DEVICES)])
    with CudaBackend(hetero4, warmup=0) as b:
        assert b.device_map == {0: 3, 1: 2, 2: 1, 3: 0}
    mark = len(cp.gpus.log)
    result, _ = run(cp, hetero4, ELEMENTWISE, decide(ELEMENTWISE, (0,), (1.0,), 96))
    assert result.metrics.verified
    assert launches(cp.gpus.log[mark:], 3) and not launches(cp.gpus.log[mark:], 0)


def test_the_hosts_memory_is_checked_before_a_run_on_the_gpus(gpus, hetero4,
                                                             monkeypatch):
    """The host holds the whole task's inputs and result on the way to and
    from the GPUs: a run it has no room for is one line before anything is
    made or copied."""
    from lib.execution import base
    from lib.execution.base import HostMemoryError

    cp = gpus()
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 1e5)
    mark = len(cp.gpus.log)
    with CudaBackend(hetero4, warmup=0) as b, \
            pytest.raises(HostMemoryError, match=r"^cuda backend: elementwise"):
        b.run(ELEMENTWISE, decide(ELEMENTWISE, (0, 1), (0.5, 0.5), 96))
    assert not [e for e in cp.gpus.log[mark:] if e[0] == "launch"]
