"""Capacity, not utilisation: fair share, /proc runnable threads, the model's use.

The spinner tests run real processes pinned to a core with
``os.sched_setaffinity``. The machine the tests run on is shared, so other
processes that were already there when a test starts are excluded from its
snapshots (``exclude_pids``): the figure then isolates the spinners the test
started. The spinners are started through a shell that exits at once, so they
are not descendants of the test process (which telemetry counts as ours).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lib.contract import TaskSpec, decision_from_weights
from lib.costmodel.model import predict
from lib.platform.machines import load_machine
from lib.platform.telemetry import (
    Snapshot,
    TelemetryError,
    autogroups_enabled,
    busy,
    capacity_of,
    fair_share,
    group_capacity,
    local_cpu_snapshot,
    own_pids,
    session_groups,
    weighted_share,
)

LINUX = hasattr(os, "sched_setaffinity") and os.path.exists("/proc/stat")


def test_fair_share_of_always_runnable_threads():
    assert fair_share([]) == 1.0
    assert fair_share([1.0]) == pytest.approx(0.5)
    assert fair_share([1.0, 1.0]) == pytest.approx(1 / 3)


def test_fair_share_of_partial_demands():
    assert fair_share([0.3]) == pytest.approx(0.7)          # it wants less
    assert fair_share([0.0, 0.0]) == 1.0                     # idle contenders
    assert fair_share([0.2, 1.0]) == pytest.approx(0.4)      # 0.2 + 2 x 0.4


def test_snapshot_without_capacity_keeps_one_over_one_minus_u():
    snap = busy(load_machine("hetero-4"), [0.5, 0.0, 0.2, 0.99])
    assert snap.capacity is None and snap.capacity_provenance is None
    assert snap.slowdown(0) == pytest.approx(2.0)
    assert snap.slowdown(3) == pytest.approx(20.0)           # clipped at 0.95


def test_snapshot_capacity_replaces_utilisation():
    snap = Snapshot("x", (0.9, 0.9), (1.0, 1.0), (True, True),
                    capacity=(0.5, 1.0), capacity_provenance=("t", "t"))
    assert snap.slowdown(0) == pytest.approx(2.0)
    assert snap.slowdown(1) == 1.0


def test_model_divides_compute_by_capacity():
    machine = load_machine("hetero-4")
    task = TaskSpec("matmul", {"M": 2048, "N": 2048, "K": 2048})
    dec = decision_from_weights(task, [0], [1.0]).with_hash(task)
    n = machine.n
    free = tuple(d.mem_bytes for d in machine.devices)
    full = Snapshot("x", (0.0,) * n, free, (True,) * n, capacity=(1.0,) * n)
    half = Snapshot("x", (0.0,) * n, free, (True,) * n,
                    capacity=(0.5,) + (1.0,) * (n - 1))
    p_full = predict(task, dec, machine, full).devices[0]
    p_half = predict(task, dec, machine, half).devices[0]
    assert p_half.t_comp == pytest.approx(2 * p_full.t_comp)
    assert p_full.t_comp == predict(task, dec, machine, None).devices[0].t_comp


def _spin(core: int, seconds: float = 30.0) -> int:
    """Start a process spinning on ``core`` (not our descendant); its pid."""
    code = (f"import os,time; os.sched_setaffinity(0,{{{core}}}); "
            f"end=time.time()+{seconds}\nwhile time.time()<end: pass")
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{code}" '
                          '>/dev/null 2>&1 & echo $!'],
                         capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    deadline = time.time() + 5
    while time.time() < deadline:     # running, on its core
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] == "R" and int(fields[36]) == core \
                    and os.sched_getaffinity(pid) == {core}:
                break
        except (OSError, IndexError):
            pass
        time.sleep(0.02)
    return pid


@pytest.fixture()
def spinners():
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.serial
@pytest.mark.skipif(not LINUX, reason="needs /proc and sched_setaffinity")
@pytest.mark.parametrize("count, expected", [(1, 0.5), (2, 1 / 3)])
def test_spinners_on_core_zero_take_their_share(spinners, count, expected):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    machine = load_machine("local-cpu")
    already = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for _ in range(count):
        pid = _spin(cores[0])
        assert pid not in own_pids()
        spinners.append(pid)
    groups = session_groups(spinners) if autogroups_enabled() else None
    if groups is not None and any(groups[p] != groups[os.getpid()] for p in spinners):
        # the spinners landed in other sessions: groups share the core first
        expected = group_capacity({cores[0]: {p: 1.0 for p in spinners}}, groups,
                                  [cores[0], cores[1]], groups[os.getpid()])[0]
    readings = []
    for _ in range(3):   # the machine is shared: up to three looks
        try:
            snap = local_cpu_snapshot(machine, interval=0.3, samples=10,
                                      exclude_pids=already)
        except TelemetryError as exc:
            pytest.skip(str(exc))
        readings.append((snap.capacity[0], snap.capacity[1], snap.contenders[0]))
        if abs(snap.capacity[0] - expected) <= 0.12:
            break
    cap0, cap1, _ = readings[-1]
    assert cap0 == pytest.approx(expected, abs=0.12), (readings, groups)
    assert cap1 >= 0.7, readings
    assert "core" in snap.capacity_provenance[0]
    assert snap.contenders[0] == pytest.approx(count, abs=0.5), readings


@pytest.mark.serial
@pytest.mark.skipif(not LINUX, reason="needs /proc and sched_setaffinity")
def test_our_own_children_are_not_contention():
    cores = sorted(os.sched_getaffinity(0))
    machine = load_machine("local-cpu")
    already = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    child = subprocess.Popen([sys.executable, "-c",
                              f"import os; os.sched_setaffinity(0, {{{cores[0]}}})\n"
                              "while True: pass"])
    try:
        time.sleep(0.3)
        assert child.pid in own_pids()
        snap = local_cpu_snapshot(machine, interval=0.2, samples=5,
                                  exclude_pids=already)
        assert snap.capacity[0] >= 0.7
    finally:
        child.kill()
        child.wait()


def test_autogroups_share_a_core_between_sessions_first():
    # core 0: one spinning thread of another session; our run uses cores 0, 1
    one = group_capacity({0: {101: 1.0}}, {101: ("/autogroup-9", 1.0)}, [0, 1],
                         ("/autogroup-1", 1.0))
    # our session's weight is spread over two cores: 1/2 against 1 on core 0
    assert one == pytest.approx((1 / 3, 1.0))
    two = group_capacity({0: {101: 1.0, 102: 1.0}},
                         {101: ("/autogroup-9", 1.0), 102: ("/autogroup-8", 1.0)},
                         [0, 1], ("/autogroup-1", 1.0))
    assert two == pytest.approx((1 / 5, 1.0))
    # two threads of one other session count as one group: 1/2 against 1
    same = group_capacity({0: {101: 1.0, 102: 1.0}},
                          {101: ("/autogroup-9", 1.0), 102: ("/autogroup-9", 1.0)},
                          [0, 1], ("/autogroup-1", 1.0))
    assert same == pytest.approx((1 / 3, 1.0))
    # a thread of our own session competes inside our group, not against it
    ours = group_capacity({0: {101: 1.0}}, {101: ("/autogroup-1", 1.0)}, [0, 1],
                          ("/autogroup-1", 1.0))
    assert ours == pytest.approx((0.5, 1.0))
    # a run on core 0 alone puts our whole weight there: 1 against 1
    alone = group_capacity({0: {101: 1.0}}, {101: ("/autogroup-9", 1.0)}, [0],
                           ("/autogroup-1", 1.0))
    assert alone == pytest.approx((0.5,))
    # a niced session weighs less (nice 5: 1.25 ** -5)
    niced = group_capacity({0: {101: 1.0}}, {101: ("/autogroup-9", 1.25 ** -5)},
                           [0, 1], ("/autogroup-1", 1.0))
    assert niced[0] == pytest.approx(0.5 / (0.5 + 1.25 ** -5))


def test_weighted_share_is_fair_share_with_equal_weights():
    for demands in ([], [1.0], [1.0, 1.0], [0.3], [0.2, 0.9, 1.0]):
        assert weighted_share(1.0, [(1.0, d) for d in demands]) \
            == pytest.approx(fair_share(demands))


def test_a_contender_whose_group_is_unreadable_is_a_group_of_its_own(monkeypatch):
    from lib.platform import telemetry

    gone = 2 ** 22 + 12345          # above the kernel's pid_max: never a process
    # pid 1 (always there) shows no autogroup, as a process of another PID
    # namespace does; ours and every other shows one
    monkeypatch.setattr(telemetry, "autogroup_of", lambda pid: None if pid in (1, gone)
                        else ("/autogroup-7" if pid == os.getpid()
                              else f"/autogroup-{pid}", 1.0))
    groups = session_groups([1])
    assert groups is not None and groups[1][0] != "/autogroup-7"
    # so one of its threads spinning on core 0 takes from us there what any
    # other session's spinner takes (our weight is spread over two cores),
    # and what it does on another core never turns the sharing thread by thread
    assert capacity_of({0: {101: 1.0}}, {101: 1}, [0, 1], grouped=True) \
        == pytest.approx((1 / 3, 1.0))
    assert capacity_of({0: {101: 1.0}, 1: {102: 0.2}}, {101: 8, 102: 1}, [0, 1],
                       grouped=True)[0] == pytest.approx(1 / 3)
    assert capacity_of({0: {101: 1.0}}, {101: 1}, [0, 1], grouped=False) \
        == pytest.approx((0.5, 1.0))
    # a contender that has ended since the look contends no more
    assert session_groups([gone]) == {os.getpid(): ("/autogroup-7", 1.0)}
    assert capacity_of({0: {101: 1.0}}, {101: gone}, [0, 1], grouped=True) \
        == pytest.approx((1.0, 1.0))


@pytest.mark.skipif(not os.path.exists("/proc/2/stat"), reason="no /proc (not Linux)")
def test_a_kernel_thread_is_a_group_of_its_own():
    from lib.platform.telemetry import kernel_thread_group

    # pid 2 is kthreadd on Linux, a kernel thread; we are not one
    name, weight = kernel_thread_group(2)
    assert name.startswith("kernel-thread-") and weight > 0
    assert kernel_thread_group(os.getpid()) is None
    assert kernel_thread_group(2 ** 22 + 12345) is None
