"""Backends: the model predicts, the cpu workers measure, failures are named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from lib.contract import Decision, TaskSpec
from lib.execution import (
    BackendUnavailable,
    CpuBackend,
    DeviceError,
    ExecutionError,
    get_backend,
)
from lib.execution.cpu import HEAP_KEEP_MAX, heap_keep
from lib.execution.shm import allocate
from lib.platform.spawn import bare_main
from lib.policies.baselines import EqualSplit

#: the cpu backend's tests measure this computer
pytestmark = pytest.mark.serial

SMALL = {
    "matmul": {"M": 203, "N": 64, "K": 48},
    "reduce": {"N": 1_000_003},
    "elementwise": {"N": 100_001},
    "stencil": {"H": 129, "W": 33, "T": 4},
    "histogram": {"N": 200_003, "B": 97},
}


@pytest.fixture(scope="module")
def cpu(local_cpu):
    with CpuBackend(local_cpu, seed=1) as backend:
        yield backend


def test_model_backend_predicts_and_verifies(hetero4):
    task = TaskSpec("reduce", {"N": 1 << 20})
    d = EqualSplit().decide(task, hetero4).with_hash(task)
    r = get_backend("model", hetero4).run(task, d, verify=True)
    assert r.metrics.measured is False and r.metrics.label == "PREDICTED (model)"
    assert r.metrics.verified is True and r.output is not None
    assert set(r.metrics.per_device_seconds) == {0, 1, 2, 3}
    lazy = get_backend("model", hetero4).run(task, d)
    assert lazy.output is None and lazy.metrics.verified is None


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_cpu_backend_measures_and_verifies(cpu, local_cpu, kind):
    task = TaskSpec(kind, SMALL[kind])
    d = EqualSplit().decide(task, local_cpu).with_hash(task)
    r = cpu.run(task, d, verify=True)
    assert r.metrics.measured and r.metrics.label == "MEASURED (cpu)"
    assert r.metrics.verified, r.metrics.max_abs_error
    assert set(r.metrics.per_device_seconds) == set(d.gpus)
    assert all(t > 0 for t in r.metrics.per_device_seconds.values())
    assert r.metrics.total_seconds >= max(r.metrics.per_device_seconds.values())
    # each worker's CPU seconds on its shard: positive, and never more than
    # its wall seconds beyond the two clocks' grain
    cpu_s, wall = r.metrics.per_device_cpu_seconds, r.metrics.per_device_seconds
    assert set(cpu_s) == set(wall)
    assert all(0 < cpu_s[g] <= wall[g] + 1e-3 for g in wall)


def test_cpu_backend_uneven_shares_and_zero_share(cpu, local_cpu):
    task = TaskSpec("matmul", SMALL["matmul"])
    gpus = tuple(range(local_cpu.n))
    shares = (1.0,) + (0.0,) * (local_cpu.n - 1)
    d = Decision(gpus=gpus, shares=shares, chunk=203,
                 mode="split" if len(gpus) > 1 else "single").with_hash(task)
    r = cpu.run(task, d, verify=True)
    assert r.metrics.verified and list(r.metrics.per_device_seconds) == [0]


def test_repeats_give_medians(local_cpu):
    task = TaskSpec("elementwise", {"N": 50_000})
    d = EqualSplit().decide(task, local_cpu).with_hash(task)
    with CpuBackend(local_cpu, repeats=3, warmup=1) as b:
        r = b.run(task, d)
    assert r.metrics.repeats == 3 and len(r.detail["all_totals"]) == 3
    assert set(r.metrics.per_device_cpu_seconds) == set(r.metrics.per_device_seconds)
    assert r.metrics.to_json()["per_device_cpu_seconds"].keys() == {
        str(g) for g in r.metrics.per_device_seconds}


def test_each_device_reports_what_its_run_cost_beyond_the_shard(local_cpu):
    # from just before the job is sent to just after its result is read,
    # less the worker's own seconds: never negative, and in one timed run
    # the shard and its overhead fit inside the run's total
    task = TaskSpec("reduce", {"N": 200_000})
    d = EqualSplit().decide(task, local_cpu).with_hash(task)
    with CpuBackend(local_cpu, repeats=1, warmup=0) as b:
        for _ in range(3):
            m = b.run(task, d).metrics
            over, wall = m.per_device_overhead_seconds, m.per_device_seconds
            assert set(over) == set(wall) == set(d.gpus)
            assert all(0.0 < over[g] for g in over)
            assert all(wall[g] + over[g] <= m.total_seconds for g in wall)
    assert m.to_json()["per_device_overhead_seconds"].keys() == {
        str(g) for g in wall}


def _mapped_runs(pid: int) -> list[str]:
    """The run buffers (``gpuhive-<pid>-...`` folders) a process has mapped."""
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[-2] if line.rstrip().endswith("(deleted)")
                else line.split()[-1] for line in f if "/gpuhive-" in line]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_workers_keep_a_runs_buffers_mapped_until_it_ends(local_cpu):
    # a worker maps the run's buffers with its first job and keeps them for
    # the run's repeats; the run's end unmaps them, and the next run (other
    # buffers, other shapes) computes from its own
    small, large = TaskSpec("stencil", {"H": 64, "W": 33, "T": 2}), \
        TaskSpec("stencil", {"H": 150, "W": 40, "T": 3})
    with CpuBackend(local_cpu, repeats=4, warmup=1) as b:
        for task in (small, large, small):
            d = EqualSplit().decide(task, local_cpu).with_hash(task)
            r = b.run(task, d, verify=True)
            assert r.metrics.verified, r.metrics.max_abs_error
            left = {pid: _mapped_runs(pid) for pid in b.worker_pids()}
            for _ in range(200):  # the release message is not waited for
                if not any(left.values()):
                    break
                time.sleep(0.01)
                left = {pid: _mapped_runs(pid) for pid in b.worker_pids()}
            assert not any(left.values()), left


def test_failing_worker_names_device_shard_and_hash(local_cpu):
    task = TaskSpec("reduce", {"N": 10_000})
    last = local_cpu.n - 1
    d = EqualSplit().decide(task, local_cpu).with_hash(task)
    with CpuBackend(local_cpu, fault_devices={last}) as b:
        with pytest.raises(DeviceError) as info:
            b.run(task, d)
    err = info.value
    assert err.device == last and err.shard == d.gpus.index(last)
    assert d.config_hash[:12] in str(err) and "injected fault" in str(err)
    assert f"CPU core {last}" in str(err)


def test_killed_worker_is_an_error_not_a_partial_result(local_cpu):
    task = TaskSpec("reduce", {"N": 10_000})
    d = EqualSplit().decide(task, local_cpu).with_hash(task)
    with CpuBackend(local_cpu) as b:
        b.run(task, d)  # workers up
        victim = b.workers[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        b.start = lambda: None  # keep the dead pool: the run must notice it
        with pytest.raises(DeviceError, match="device 0:CPU core 0 failed on shard 0"):
            b.run(task, d)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_start_returns_when_every_worker_is_ready(local_cpu):
    # A worker pins itself to its core and then says it is ready; a start
    # that did not wait would find them still starting (a spawned interpreter
    # takes a good part of a second), on every core the parent may use.
    with CpuBackend(local_cpu) as b:
        b.start()
        assert len(b.workers) == local_cpu.n
        for core, proc in zip(b._cores(), b.workers, strict=True):
            assert proc.is_alive()
            with open(f"/proc/{proc.pid}/status") as fh:
                allowed = next(x for x in fh if x.startswith("Cpus_allowed_list"))
            assert allowed.split()[1] == str(core), (core, allowed)
        assert not any(conn.poll() for conn in b._conns)  # each word was read


def test_a_worker_that_dies_before_it_is_ready_is_named(local_cpu):
    from multiprocessing import get_context

    ctx = get_context("spawn")
    b = CpuBackend(local_cpu, timeout=60)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=os._exit, args=(3,))  # dies at once, says nothing
    proc.start()
    child.close()
    b.workers, b._conns = [proc], [parent]
    with pytest.raises(ExecutionError, match="the worker for device 0:CPU core 0 "
                                             "exited before it was ready"):
        b._wait_ready()
    assert b.workers == [] and not proc.is_alive()


def test_a_cpu_worker_imports_neither_the_cuda_nor_the_dask_backend(fresh_python):
    # What a spawned worker imports before its first job: this package and
    # the cpu backend. The other backends load when they are asked for.
    code = ("import sys\n"
            "import lib.execution.cpu\n"
            "print(' '.join(m for m in ('lib.execution.cuda', 'lib.execution.dask',"
            " 'lib.codegen', 'lib.security') if m in sys.modules))\n"
            "from lib.execution import CudaBackend, get_backend\n"
            "print(CudaBackend.__module__, 'lib.execution.cuda' in sys.modules)\n")
    assert fresh_python(code).splitlines() == ["", "lib.execution.cuda True"]


def test_cpu_backend_refuses_gpu_profiles(hetero4):
    with pytest.raises(BackendUnavailable, match="non-CPU devices"):
        get_backend("cpu", hetero4)


def test_cpu_backend_refuses_missing_device(cpu):
    task = TaskSpec("reduce", {"N": 100})
    with pytest.raises(ExecutionError, match="device 9 does not exist"):
        cpu.run(task, Decision(gpus=(9,), shares=(1.0,), chunk=100))


def test_cuda_backend_says_why(hetero4):
    from lib.execution.cuda import probe

    if probe().usable:
        pytest.skip("a CUDA stack is present")
    with pytest.raises(BackendUnavailable, match="cuda backend unavailable: "):
        get_backend("cuda", hetero4)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        get_backend("tpu", None)


def test_a_worker_keeps_its_heap_and_the_output_pages_are_allocated_first(tmp_path):
    # a worker serves a large array from its heap, not from a fresh mapping
    # (which it would fault in afresh on every run)
    probe = (
        "import ctypes, sys, numpy as np\n"
        "from lib.execution.cpu import keep_heap\n"
        "sbrk = ctypes.CDLL(None).sbrk\n"
        "sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]\n"
        "ok = keep_heap(1 << 28) if sys.argv[1] == 'keep' else True\n"
        "before = sbrk(0)\n"
        "a = np.ones(1 << 23)\n"  # 64 MiB: from the heap, or a mapping of its own
        "print(ok, sbrk(0) - before >= a.nbytes // 2)\n")
    runs = {how: subprocess.run([sys.executable, "-c", probe, how], capture_output=True,
                                text=True, check=True).stdout.split()
            for how in ("keep", "plain")}
    if runs["keep"][0] != "True":
        pytest.skip("this C library has no mallopt")
    assert runs["keep"][1] == "True" and runs["plain"][1] == "False"
    # each worker may keep at most HEAP_KEEP_MAX, and all together a quarter
    # of the machine's memory
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert heap_keep(1) <= HEAP_KEEP_MAX
    assert heap_keep(4096) * 4096 <= memory // 4 + 4096
    # the output buffer's pages exist before a worker writes to it
    path = tmp_path / "out.bin"
    np.memmap(path, dtype=np.float32, mode="w+", shape=(1 << 20,)).flush()
    assert os.stat(path).st_blocks * 512 < (1 << 22)
    allocate(str(path), 1 << 22, "out")
    assert os.stat(path).st_blocks * 512 >= (1 << 22)


#: A user's script with no ``if __name__ == "__main__":`` guard: it prints a
#: line at its top level, registers a kind of its own (its functions live in
#: the script) and runs that kind and a built-in one on the cpu workers.
UNGUARDED_SCRIPT = '''
import numpy as np
from lib.contract import TaskSpec
from lib.codegen.kinds import register_kind
from lib.runtime import Agent

print("top level ran", flush=True)
register_kind(
    "triple", dims=("N",), divisible="N", merge="concat",
    inputs=lambda t, rng: {"x": rng.standard_normal(t.dims["N"]).astype(np.float32)},
    reference=lambda t, x: 3 * x,
    work=lambda t, rows: {"flops": 1.0 * rows, "bytes_in": 4.0 * rows,
                          "bytes_out": 4.0 * rows})
with Agent(machine=MACHINE, backend=BACKEND) as agent:
    for task in (TaskSpec("reduce", {"N": 100_000}), TaskSpec("triple", {"N": 10_001})):
        r = agent.execute(task, agent.optimize(task), verify=True)
        print(task.kind, r.metrics.label, r.metrics.verified, flush=True)
'''


@pytest.mark.parametrize("machine,backend,how", [("local-cpu", "cpu", "file"),
                                                ("local-cpu", "cpu", "stdin"),
                                                ("dask-local:2", "dask", "file")])
def test_a_script_without_a_main_guard_runs_on_workers_once(tmp_path, machine,
                                                            backend, how):
    """A spawned worker (of the cpu backend, or of a ``dask-local`` cluster)
    does not import the caller's script: the script's top level runs once
    (before, every worker ran it again and died starting workers of its own),
    and a script on standard input runs at all."""
    source = (f"MACHINE, BACKEND = {machine!r}, {backend!r}\n"
              + UNGUARDED_SCRIPT)
    script = tmp_path / "mine.py"
    script.write_text(source)
    argv, stdin = ([sys.executable, str(script)], None) if how == "file" \
        else ([sys.executable, "-"], source)
    run = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                         cwd=tmp_path, timeout=180,
                         env={**os.environ, "GPUHIVE_HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("top level ran") == 1, run.stdout
    assert f"reduce MEASURED ({backend}) True" in run.stdout
    assert f"triple MEASURED ({backend}) True" in run.stdout


def test_bare_main_puts_the_callers_main_module_back():
    main = sys.modules["__main__"]
    with pytest.raises(KeyError), bare_main():
        assert sys.modules["__main__"] is not main
        assert not hasattr(sys.modules["__main__"], "__file__")
        with bare_main():
            pass
        assert sys.modules["__main__"] is not main   # the outer one is open
        raise KeyError("inside")
    assert sys.modules["__main__"] is main


def test_a_run_cut_short_leaves_the_workers_right_for_the_next(local_cpu, monkeypatch):
    """Ctrl-C reaches the parent, not its workers (they ignore SIGINT, so a
    terminal shows one line, not a traceback per worker); the replies to the
    interrupted run's jobs, still in the pipes, are not taken as the next
    run's."""
    import lib.execution.cpu as cpu_module

    big = TaskSpec("matmul", {"M": 1200, "N": 600, "K": 600})
    small = TaskSpec("reduce", {"N": 2_000_003})
    with CpuBackend(local_cpu, seed=1, warmup=0, repeats=1) as backend:
        backend.start()
        pids = backend.worker_pids()
        for pid in pids:   # what a terminal's Ctrl-C sends the whole group
            os.kill(pid, signal.SIGINT)
        real_wait = cpu_module.connection.wait

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(cpu_module.connection, "wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            backend.run(big, EqualSplit().decide(big, local_cpu).with_hash(big))
        monkeypatch.setattr(cpu_module.connection, "wait", real_wait)
        time.sleep(1.0)   # the cut-short jobs finish; their replies wait
        assert backend.worker_pids() == pids   # nobody died of either
        d = EqualSplit().decide(small, local_cpu).with_hash(small)
        for _ in range(3):
            r = backend.run(small, d, verify=True)
            assert r.metrics.verified, r.metrics.max_abs_error


def test_a_run_too_large_for_the_computers_memory_is_refused_before_it_starts(
        local_cpu, monkeypatch):
    """A run that would take more than the available memory (here, as the
    OS is made to report 1 GB) is one line with both figures, raised before
    the inputs are made or a worker starts, instead of the out-of-memory
    killer ending a process; a run that fits goes ahead."""
    from lib.execution import base
    from lib.execution.base import HostMemoryError, check_host_memory, host_bytes_needed
    from lib.platform.workloads import REFERENCE_BLOCK_BYTES

    task = TaskSpec("elementwise", {"N": 50_000_000})   # 0.6 GB footprint
    assert host_bytes_needed(task, verify=True) > host_bytes_needed(task)
    # bf16 is held as float32 on the host, and 16-bit values are computed in
    # float32: half the footprint, the same bytes
    for dtype in ("bf16", "fp16"):
        half = TaskSpec("elementwise", {"N": 50_000_000}, dtype=dtype)
        assert host_bytes_needed(half) == pytest.approx(host_bytes_needed(task))
    # verification holds one block of the reference, whatever the task's size
    big = TaskSpec("elementwise", {"N": 500_000_000})
    assert host_bytes_needed(big, verify=True) - host_bytes_needed(big) == \
        pytest.approx(base.VERIFY_FOOTPRINTS * REFERENCE_BLOCK_BYTES)
    check_host_memory(task, available=1e12)              # fits: no error
    with pytest.raises(HostMemoryError) as err:
        check_host_memory(task, verify=True, available=1e9)
    text = str(err.value)
    assert "elementwise[N=50000000]" in text and "90% of the 1.0 GB available" in text
    assert "with --verify" in text and "\n" not in text
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 1e9)
    d = EqualSplit().decide(task, local_cpu).with_hash(task)
    with CpuBackend(local_cpu) as b:
        with pytest.raises(HostMemoryError):
            b.run(task, d)
        assert b.workers == []   # refused before a worker started
    small = TaskSpec("elementwise", {"N": 1000})
    with CpuBackend(local_cpu) as b:
        assert b.run(small, EqualSplit().decide(small, local_cpu).with_hash(small),
                     verify=True).metrics.verified
