"""Defects of the cuda backend, each pinned by a test that fails on the backend as
it was, run on the CuPy stand-in (``tests/emulated_cupy.py``), which fails where
CuPy fails:

1. the failure path waits for every device before anything goes back to a pool;
2. the metrics say which merge path ran (a sum asked for on nccl without NCCL
   runs as peer copies, and says so);
3. peer access is enabled before peer copies, and each copy says whether it had it;
4. the nvml profile maps onto CUDA ordinals by PCI bus id;
5. a matmul piece over the grid's y limit is launched in row blocks;
6. device times leave out host staging;
7. ``close`` frees every used device's pool; NCCL is imported where it is used;
   source, compile, argument and launch errors are not device faults (no
   re-plan); matmul's B outlives the kernels that read it.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from dataclasses import replace

import emulated_cupy as ec
import numpy as np
import pytest
from test_cuda_emulated import (
    DEVICES,
    ELEMENTWISE,
    FAILING,
    HISTOGRAM,
    MATMUL,
    REDUCE,
    decide,
    launches,
    reference,
    run,
)

from lib.codegen import CodegenError
from lib.codegen.emulate import find_cxx
from lib.contract import TaskSpec
from lib.execution import cuda as cuda_mod
from lib.execution.base import BackendUnavailable, DeviceError, ExecutionError
from lib.execution.cuda import (
    MATMUL_TILE,
    MAX_GRID_Y,
    CudaBackend,
    busy_seconds,
    default_source_provider,
    is_device_fault,
    launch_plan,
    map_by_bus_id,
    normalise_bus_id,
    overlapped,
)

pytestmark = pytest.mark.skipif(
    find_cxx() is None, reason="no C++ compiler (g++ or clang++) for emulated kernels"
)


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """The session's emulator binaries (shared with test_cuda_emulated)."""
    cases = [(ELEMENTWISE, 96), (REDUCE, 32), (HISTOGRAM, 96), (MATMUL, 96)]
    try:
        sources = [default_source_provider(t, decide(t, (0,), (1.0,), b))[0]
                   for t, b in cases]
    except Exception as exc:  # no NVRTC, hence no template kernels
        pytest.skip(f"the code-gen plane serves no kernel source here "
                    f"({type(exc).__name__}: {exc!s:.120})")
    kb = ec.session_builds(tmp_path_factory.mktemp("emulated_cupy"))
    kb.prebuild(sources)
    return kb


@pytest.fixture
def gpus(builds, hetero4, monkeypatch):
    """``gpus(**options) -> cupy``: a fresh stand-in installed as ``cupy``."""
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")

    def linked(a: int, b: int) -> bool:
        link = hetero4.peer(min(a, b), max(a, b))
        return link is not None and link.p2p

    def make(devices: int = DEVICES, **options):
        options.setdefault("peer_access", linked)
        cp = ec.make_cupy(devices, builds, **options)
        ec.install(cp, monkeypatch)
        return cp

    return make


# -- 1. the failure path --------------------------------------------------------


def test_a_failed_run_waits_for_every_device_before_releasing(gpus, hetero4):
    """Device 0's shard is queued when device 2 runs out of memory: before the
    error leaves the backend, device 0's queues have run, so no buffer went back
    to a pool while a copy still used it."""
    cp = gpus(fail_alloc={2})
    with pytest.raises(DeviceError) as info, CudaBackend(hetero4, warmup=0) as b:
        b.run(ELEMENTWISE, FAILING)
    assert launches(cp.gpus.log, 0), "device 0 had work queued"
    assert [q.name for q in cp.gpus.queues.values() if q.done < q.queued] == []
    del info
    gc.collect()
    assert cp.gpus.races == []


def test_replan_stages_again_only_after_the_failed_run_was_waited_for(gpus, hetero4):
    cp = gpus(fail_alloc={2})
    result, log = run(cp, hetero4, ELEMENTWISE, FAILING, allow_replan=True)
    assert result.metrics.verified is True
    failed = next(i for i, e in enumerate(log) if e[0] == "alloc_failed")
    restaged = next(i for i, e in enumerate(log)
                    if i > failed and e[0] == "pinned")
    busy = {e[3] for e in log[:failed] if e[0] == "launch" and e[1] == 0}
    waited = {e[2] for e in log[failed:restaged] if e[0] == "host_wait"
              and e[1] == 0}
    assert busy and busy <= waited


# -- 2. the merge path that ran ---------------------------------------------------


def test_a_sum_asked_on_nccl_without_nccl_says_peer_copies_ran(gpus, hetero4):
    cp = gpus(nccl=False)
    d = decide(REDUCE, (0, 1), (0.5, 0.5), 32, comm="nccl")
    result, log = run(cp, hetero4, REDUCE, d)
    m = result.metrics
    assert m.verified is True
    assert (m.merge_requested, m.merge_path) == ("nccl", "p2p")
    assert "NCCL library not found" in m.merge_note and "nvidia-nccl-cu12" in \
        m.merge_note
    assert m.to_json()["merge_path"] == "p2p"
    assert not [e for e in log if e[0] == "allreduce"]


def test_nccl_runs_where_its_library_is_and_the_metrics_say_so(gpus, hetero4):
    """Also 7: ``cupy.cuda.nccl`` is no attribute until imported, as in CuPy."""
    cp = gpus()
    d = decide(REDUCE, (0, 1, 2, 3), (0.1, 0.2, 0.3, 0.4), 32, comm="nccl")
    result, log = run(cp, hetero4, REDUCE, d)
    m = result.metrics
    assert m.verified is True and (m.merge_path, m.merge_note) == ("nccl", "")
    assert [e for e in log if e[0] == "allreduce"] == [("allreduce", (0, 1, 2, 3))]


def test_nccl_over_shards_sharing_a_device_runs_peer_copies_and_says_why(gpus,
                                                                         hetero4):
    cp = gpus()
    d = decide(HISTOGRAM, (0, 1, 2), (0.3, 0.3, 0.4), 96, comm="nccl")
    result, _ = run(cp, hetero4, HISTOGRAM, d, device_map={0: 0, 1: 0, 2: 1, 3: 2})
    m = result.metrics
    assert m.verified is True and m.merge_path == "p2p"
    assert "share a device" in m.merge_note
    assert m.peer_copies == ((1, 0, True),)  # the second shard on 0 added in place
    assert np.array_equal(result.output, reference(HISTOGRAM))


# -- 3. peer access ---------------------------------------------------------------


def test_peer_copies_enable_peer_access_once_and_record_it(gpus, hetero4):
    cp = gpus()
    d = decide(HISTOGRAM, (0, 1), (0.65, 0.35), 96, comm="p2p")
    result, log = run(cp, hetero4, HISTOGRAM, d, repeats=2)
    assert result.metrics.verified is True
    assert [e for e in log if e[0] == "peer_enabled"] == [("peer_enabled", 0, 1)]
    copies = [e for e in log if e[0] == "memcpy_peer"]
    assert len(copies) == 2 and all(e[4] for e in copies)  # direct, both runs
    assert result.metrics.peer_copies == ((1, 0, True),)


def test_peer_access_enabled_before_is_not_an_error(gpus, hetero4):
    cp = gpus()
    cp.gpus.peers_enabled.add((0, 1))  # enabled by someone else in the process
    d = decide(HISTOGRAM, (0, 1), (0.65, 0.35), 96, comm="p2p")
    result, log = run(cp, hetero4, HISTOGRAM, d)
    assert result.metrics.verified is True
    assert result.metrics.peer_copies == ((1, 0, True),)
    assert not [e for e in log if e[0] == "peer_enabled"]


def test_a_copy_without_peer_access_says_it_went_through_the_host(gpus, hetero4):
    cp = gpus(peer_access=lambda a, b: False)
    d = decide(HISTOGRAM, (1, 2), (0.65, 0.35), 96, comm="p2p")
    result, log = run(cp, hetero4, HISTOGRAM, d)
    assert result.metrics.verified is True
    assert result.metrics.peer_copies == ((2, 1, False),)
    assert not [e for e in log if e[0] in ("memcpy_peer", "peer_enabled")]


# -- 4. NVML index is not CUDA ordinal ------------------------------------------------

NVML_BUSES = ["00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0",
              "00000000:CA:00.0"]
"""NVML's bus ids (8-digit domain), by NVML index."""


def test_bus_ids_map_nvml_devices_onto_cuda_ordinals():
    cuda = ["0000:b1:00.0", "0000:17:00.0", "0000:ca:00.0", "0000:31:00.0"]
    assert map_by_bus_id(NVML_BUSES, cuda) == {2: 0, 0: 1, 3: 2, 1: 3}
    # CUDA_VISIBLE_DEVICES=3,1: two ordinals, the rest have none
    assert map_by_bus_id(NVML_BUSES, [cuda[2], cuda[3]]) == {3: 0, 1: 1}
    assert normalise_bus_id(b"00000000:B1:00.0\x00") == "0000:b1:00.0"


@pytest.mark.parametrize(("nvml", "cuda", "says"), [
    (NVML_BUSES, ["0000:17:00.0", "0000:99:00.0"], "CUDA device(s) 1 (0000:99:00.0)"),
    (NVML_BUSES[:1] * 2, ["0000:17:00.0"], "more than once"),
    (NVML_BUSES, ["GPU-1234"], "is not a PCI bus id"),
], ids=["stray", "repeated", "malformed"])
def test_bus_ids_that_cannot_be_matched_are_a_clear_error(nvml, cuda, says):
    with pytest.raises(BackendUnavailable, match="^cuda backend: ") as info:
        map_by_bus_id(nvml, cuda)
    assert says in str(info.value) and "\n" not in str(info.value)


def _fake_nvml(buses: list[str]) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.__dict__.update(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(buses),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=buses[h].encode()),
    )
    return nvml


def test_the_nvml_profile_runs_where_the_bus_ids_say(gpus, hetero4, monkeypatch):
    cp = gpus(bus_ids=["0000:b1:00.0", "0000:17:00.0", "0000:ca:00.0",
                       "0000:31:00.0"])
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(NVML_BUSES))
    nvml = replace(hetero4, name="nvml")
    d = decide(ELEMENTWISE, (0, 2), (0.5, 0.5), 96)
    result, log = run(cp, nvml, ELEMENTWISE, d)
    assert result.metrics.verified is True
    assert result.detail["device_map"] == {0: 1, 2: 0}
    assert [len(launches(log, o)) for o in range(DEVICES)] == [1, 1, 0, 0]


def test_a_device_cuda_does_not_see_is_refused_by_name(gpus, hetero4, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus(devices=2, bus_ids=["0000:b1:00.0", "0000:17:00.0"])
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(NVML_BUSES))
    nvml = replace(hetero4, name="nvml")
    with CudaBackend(nvml, warmup=0) as b:
        assert b.device_map == {2: 0, 0: 1}
        with pytest.raises(ExecutionError, match="no CUDA ordinal: "
                           "CUDA_VISIBLE_DEVICES=2,0 hides it") as info:
            b.run(ELEMENTWISE, decide(ELEMENTWISE, (0, 1), (0.5, 0.5), 96))
    assert not isinstance(info.value, DeviceError)


# -- 5. the grid's y limit ----------------------------------------------------------


def test_launch_plan_keeps_every_matmul_grid_within_the_y_limit():
    task = TaskSpec("matmul", {"M": 1_100_000, "N": 33, "K": 8})
    plan = launch_plan(task, 1_100_000, 128)
    assert len(plan) == 2 and all(grid[1] <= MAX_GRID_Y for _, _, grid, _ in plan)
    assert [(first, rows) for first, rows, _, _ in plan] == [
        (0, MAX_GRID_Y * MATMUL_TILE), (MAX_GRID_Y * MATMUL_TILE,
                                        1_100_000 - MAX_GRID_Y * MATMUL_TILE)]
    assert all(grid[0] == 3 and blk == (128, 1, 1) for _, _, grid, blk in plan)
    assert len(launch_plan(task, MAX_GRID_Y * MATMUL_TILE, 128)) == 1
    assert len(launch_plan(task, MAX_GRID_Y * MATMUL_TILE + 1, 128)) == 2
    red = TaskSpec("reduce", {"N": 2**31 - 1})
    assert launch_plan(red, 2**31 - 1, 256) == [(0, 2**31 - 1, (4096, 1, 1),
                                                 (256, 1, 1))]


def test_a_matmul_piece_over_the_grid_limit_runs_in_row_blocks(gpus, hetero4,
                                                               monkeypatch):
    """37 rows are 3 row tiles; with the y limit lowered to 2 (in the backend and
    the stand-in alike) the piece must go in two launches."""
    monkeypatch.setattr(cuda_mod, "MAX_GRID_Y", 2, raising=False)
    cp = gpus(max_grid_yz=2)
    d = decide(MATMUL, (1,), (1.0,), 96, mode="single")
    result, log = run(cp, hetero4, MATMUL, d)
    assert result.metrics.verified is True
    assert len(launches(log, 1)) == 2


# -- 6. device time is device time ------------------------------------------------


def test_device_time_leaves_out_host_staging(gpus, hetero4, monkeypatch):
    """Each piece's staging sleeps 0.3 s (x and y, three pieces: 1.8 s); the
    device time must not contain it (three small emulated launches), the total
    must."""
    cp = gpus()
    convert = cuda_mod.to_device_dtype

    def slow(x, dtype):
        time.sleep(0.3)
        return convert(x, dtype)

    monkeypatch.setattr(cuda_mod, "to_device_dtype", slow)
    d = decide(ELEMENTWISE, (1,), (1.0,), 96, mode="pipelined", chunk=1500)
    result, _ = run(cp, hetero4, ELEMENTWISE, d)
    m = result.metrics
    assert m.verified is True and m.total_seconds >= 1.8
    assert m.per_device_seconds[1] < 0.9
    spans = result.detail["pieces"][1]
    assert len(spans) == 3 and {s[0] for s in spans} == {0, 1}
    assert all(start <= end for _, start, end in spans)


def test_busy_seconds_and_overlap_are_about_spans():
    assert busy_seconds([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert busy_seconds([]) == 0.0
    assert overlapped([(0, 0.0, 1.0), (1, 0.5, 2.0)])
    assert not overlapped([(0, 0.0, 1.0), (0, 0.5, 2.0), (1, 2.0, 3.0)])


# -- 7. pools, errors that are not device faults, matmul's B -----------------------


def test_close_frees_the_pool_of_every_device_used(gpus, hetero4):
    cp = gpus()
    run(cp, hetero4, ELEMENTWISE, decide(ELEMENTWISE, (1, 3), (0.5, 0.5), 96))
    assert cp.gpus.pool_frees == {0: 0, 1: 1, 2: 0, 3: 1}
    assert all(cp.gpus.pools[o] == {} for o in range(DEVICES))


WRONG_SIGNATURE = "int n"
TOO_MUCH_SHARED = r'''
extern "C" __global__ void elementwise_fp32(float a, const float* x, const float* y,
                                            float* out, long long n) {
    __shared__ float big[16384];  // 64 KiB: over the 48 KiB a block may have
    big[threadIdx.x] = a;
    __syncthreads();
    if ((long long)threadIdx.x < n) out[threadIdx.x] = big[0] * x[0] + y[0];
}
'''


def _broken(kind: str):
    def provider(task, decision):
        provider.calls += 1
        if kind == "codegen":
            raise CodegenError("the template refused the decision")
        if kind == "shared":
            return TOO_MUCH_SHARED, "elementwise_fp32", ("--std=c++17",)
        source, name, options = default_source_provider(task, decision)
        return source.replace("long long n", WRONG_SIGNATURE), name, options

    provider.calls = 0
    return provider


@pytest.mark.parametrize(("kind", "says"), [
    ("codegen", "CodegenError: the template refused"),
    ("signature", "TypeError: elementwise_fp32 argument 4"),
    ("shared", "CompileException: ptxas error"),
])
def test_kernel_errors_are_not_device_faults_and_do_not_replan(gpus, hetero4, kind,
                                                               says):
    gpus()
    provider = _broken(kind)
    with pytest.raises(ExecutionError) as info, \
            CudaBackend(hetero4, warmup=0, allow_replan=True,
                        source_provider=provider) as b:
        b.run(ELEMENTWISE, FAILING)
    err = info.value
    assert type(err) is ExecutionError and provider.calls == 1
    assert says in str(err) and "not a device fault" in str(err)


def test_a_launch_the_driver_refuses_is_not_a_device_fault(gpus, hetero4):
    """The stand-in's y limit is 2, the backend's the real one: the driver
    refuses the launch, on any device alike."""
    gpus(max_grid_yz=2)
    d = decide(MATMUL, (0, 1), (0.9, 0.1), 96)
    with pytest.raises(ExecutionError) as info, \
            CudaBackend(hetero4, warmup=0, allow_replan=True) as b:
        b.run(MATMUL, d)
    assert not isinstance(info.value, DeviceError)
    assert "CUDA_ERROR_INVALID_VALUE" in str(info.value)


def test_fault_classification():
    faults = (ec.OutOfMemoryError, ec.CUDARuntimeError, ec.CUDADriverError)
    assert is_device_fault(ec.OutOfMemoryError("out of memory"), faults)
    assert is_device_fault(ec.CUDARuntimeError("cudaErrorIllegalAddress: an illegal "
                                               "memory access"), faults)
    assert is_device_fault(ec.CUDARuntimeError("cudaErrorECCUncorrectable: x"), faults)
    assert not is_device_fault(ec.CUDADriverError("CUDA_ERROR_INVALID_VALUE: "
                                                  "invalid argument"), faults)
    assert not is_device_fault(MemoryError("host"), faults)  # not CuPy's
    assert not is_device_fault(TypeError("argument 4"), faults)


def test_matmul_b_stays_allocated_until_both_streams_are_done(gpus, hetero4):
    """B is read by the kernels of both streams; dropped when the shard was
    queued, its block went back to a pool those streams do not order."""
    cp = gpus()
    d = decide(MATMUL, (0,), (1.0,), 96, mode="pipelined", chunk=5)
    mark = len(cp.gpus.log)
    with CudaBackend(hetero4, warmup=0) as b:
        result = b.run(MATMUL, d, verify=True)
    assert result.metrics.verified is True
    assert len({queue for _, queue in launches(cp.gpus.log[mark:], 0)}) == 2
    assert cp.gpus.races == []
