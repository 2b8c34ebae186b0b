"""The cuda backend: pure helpers checked here; real runs where CUDA exists."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lib.contract import Decision, TaskSpec
from lib.execution import BackendUnavailable, ExecutionError, get_backend
from lib.execution.base import replan
from lib.execution.cuda import (
    MATMUL_TILE,
    MAX_BLOCKS,
    MAX_GRID_Y,
    chunk_bounds,
    entry_point,
    from_device_dtype,
    launch_geometry,
    launch_plan,
    probe,
    to_device_dtype,
)
from lib.platform.workloads import round_bf16
from lib.policies.baselines import EqualSplit


def test_entry_points_follow_the_kernels():
    assert entry_point(TaskSpec("matmul", {"M": 4, "N": 4, "K": 4},
                                dtype="bf16")) == "matmul_bf16"
    with pytest.raises(ExecutionError, match="no matmul_fp64 kernel"):
        entry_point(TaskSpec("matmul", {"M": 4, "N": 4, "K": 4}, dtype="fp64"))
    assert entry_point(TaskSpec("stencil", {"H": 4, "W": 4, "T": 1},
                                dtype="fp64")) == "stencil_fp64"


def test_launch_geometry():
    mm = TaskSpec("matmul", {"M": 100, "N": 33, "K": 7})
    grid, block = launch_geometry(mm, 100, 128)
    assert grid == (3, 7, 1) and block == (128, 1, 1)
    assert grid[0] * MATMUL_TILE >= 33 and grid[1] * MATMUL_TILE >= 100
    red = TaskSpec("reduce", {"N": 10**9})
    assert launch_geometry(red, 10**9, 256)[0] == (MAX_BLOCKS, 1, 1)
    assert launch_geometry(red, 10, 256)[0] == (1, 1, 1)
    st = TaskSpec("stencil", {"H": 50, "W": 9, "T": 2})
    assert launch_geometry(st, 54, 64)[0] == (54, 1, 1)


def test_chunk_bounds_cover_exactly():
    assert chunk_bounds(10, 35, 10) == [(10, 20), (20, 30), (30, 35)]
    assert chunk_bounds(0, 5, 100) == [(0, 5)]
    assert chunk_bounds(3, 3, 4) == []


def test_bf16_words_round_trip():
    x = round_bf16(np.random.default_rng(0).standard_normal(101).astype(np.float32))
    words = to_device_dtype(x, "bf16")
    assert words.dtype == np.uint16
    assert np.array_equal(from_device_dtype(words, "bf16"), x)
    y = np.ones(3, np.float32)
    assert to_device_dtype(y, "fp32") is y


def test_replan_drops_the_failed_device():
    d = Decision(gpus=(0, 1, 3), shares=(0.5, 0.3, 0.2), chunk=10, mode="split",
                 comm_path="nccl", config_hash="x" * 64)
    r = replan(d, 1)
    assert r.gpus == (0, 3) and r.shares == pytest.approx((0.5 / 0.7, 0.2 / 0.7))
    assert sum(r.shares) == pytest.approx(1.0, abs=1e-15) and r.config_hash == ""
    one = replan(r, 0)
    assert one.gpus == (3,) and one.mode == "single" and one.comm_path == "host"
    with pytest.raises(ExecutionError, match="no device left"):
        replan(one, 3)


def test_without_cuda_the_backend_says_why(hetero4):
    found = probe()
    if found.usable:
        pytest.skip("a CUDA stack is present")
    assert found.reasons
    with pytest.raises(BackendUnavailable) as info:
        get_backend("cuda", hetero4)
    assert str(info.value).startswith("cuda backend unavailable: ")
    assert "\n" not in str(info.value)


@pytest.mark.serial
def test_sweep_runs_every_kind_on_local_cpu(tmp_path):
    from lib.cli.sweep import sweep

    out = tmp_path / "sweep.json"
    report = sweep("local-cpu", "cpu", scale=0.02, repeats=1, out=out)
    kinds = {r["kind"] for r in report["rows"]}
    assert kinds == {"matmul", "reduce", "elementwise", "stencil", "histogram"}
    assert report["all_verified"] and out.exists()
    assert all(r["label"] == "MEASURED (cpu)" for r in report["rows"])


# -- real GPUs ------------------------------------------------------------------

GPU_TASKS = [
    TaskSpec("matmul", {"M": 1000, "N": 300, "K": 200}),
    TaskSpec("matmul", {"M": 257, "N": 129, "K": 65}, dtype="fp16"),
    TaskSpec("reduce", {"N": 3_000_001}),
    TaskSpec("reduce", {"N": 1_000_003}, dtype="bf16"),
    TaskSpec("elementwise", {"N": 2_000_003}),
    TaskSpec("stencil", {"H": 513, "W": 257, "T": 3}),
    TaskSpec("histogram", {"N": 2_000_003, "B": 1000}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("task", GPU_TASKS, ids=lambda t: t.describe())
@pytest.mark.parametrize("mode", ["split", "pipelined"])
def test_cuda_runs_verify(task, mode):
    from lib.platform.machines import load_machine

    machine = load_machine("nvml")
    d = EqualSplit().decide(task, machine)
    if mode == "pipelined":
        d = Decision(**{**d.__dict__, "mode": "pipelined",
                        "chunk": max(1, task.split_size // 7)})
    d = d.with_hash(task)
    with get_backend("cuda", machine, repeats=1) as backend:
        r = backend.run(task, d, verify=True)
    assert r.metrics.label == "MEASURED (cuda)"
    assert r.metrics.verified, r.metrics.max_abs_error


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["host", "p2p", "nccl"])
def test_cuda_sum_merge_paths(path):
    """Every path verifies, and the metrics name the path that ran (nccl runs
    as peer copies only where NCCL is missing, and says so)."""
    from lib.platform.machines import load_machine

    machine = load_machine("nvml")
    if machine.n < 2 and path != "host":
        pytest.skip(f"{path} needs two devices; this machine has {machine.n}")
    task = TaskSpec("histogram", {"N": 1_000_003, "B": 77})
    d = EqualSplit().decide(task, machine)
    d = Decision(**{**d.__dict__, "comm_path": path}).with_hash(task)
    with get_backend("cuda", machine) as backend:
        m = backend.run(task, d, verify=True).metrics
        ran = path if path != "nccl" or backend.nccl_ok else "p2p"
    assert m.verified
    assert m.merge_path == (ran if len(d.gpus) > 1 else "host"), m.merge_note
    if ran == "p2p":
        assert len(m.peer_copies) == len(d.gpus) - 1


def _on_the_first_gpu(shards: int):
    """The live profile's first device, ``shards`` times, all on one ordinal."""
    from lib.platform.machines import load_machine

    live = load_machine("nvml")
    with get_backend("cuda", live, warmup=0) as b:
        first = min(b.device_map, key=b.device_map.__getitem__)
        ordinal = b.device_map[first]
    devices = tuple(replace(live.devices[first], index=i) for i in range(shards))
    machine = replace(live, name=f"{shards}-on-1", devices=devices,
                      host_links=(live.host_links[first],) * shards, peers={})
    return machine, dict.fromkeys(range(shards), ordinal)


@pytest.mark.gpu
def test_cuda_matmul_above_the_grid_y_limit():
    machine, dmap = _on_the_first_gpu(1)
    task = TaskSpec("matmul", {"M": MAX_GRID_Y * MATMUL_TILE + 33, "N": 32, "K": 16})
    assert len(launch_plan(task, task.split_size, 256)) == 2
    d = Decision(gpus=(0,), shares=(1.0,), chunk=task.split_size,
                 mode="single").with_hash(task)
    with get_backend("cuda", machine, warmup=0, device_map=dmap) as backend:
        assert backend.run(task, d, verify=True).metrics.verified


@pytest.mark.gpu
@pytest.mark.parametrize(("path", "ran"), [("host", "host"), ("p2p", "p2p"),
                                           ("nccl", "p2p")])
def test_cuda_several_shards_on_one_gpu(path, ran):
    machine, dmap = _on_the_first_gpu(3)
    task = TaskSpec("reduce", {"N": 3_000_017})
    d = Decision(gpus=(0, 1, 2), shares=(0.5, 0.3, 0.2), chunk=400_000,
                 mode="pipelined", comm_path=path).with_hash(task)
    with get_backend("cuda", machine, warmup=0, device_map=dmap) as backend:
        m = backend.run(task, d, verify=True).metrics
    assert m.verified and m.merge_path == ran and m.peer_copies == ()
