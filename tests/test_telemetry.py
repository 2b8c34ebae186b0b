"""Telemetry sources: recorded NVML replay, /proc for local-cpu, simulated load."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from lib.platform.machines import load_machine
from lib.platform.telemetry import (
    RecordedNvml,
    SimulatedTelemetry,
    Snapshot,
    TelemetryError,
    idle,
    local_cpu_snapshot,
    nvml_snapshot,
)

RECORDING = Path(__file__).parent / "data" / "nvml_snapshot.json"


@pytest.fixture()
def record():
    return json.loads(RECORDING.read_text())


def test_recorded_nvml_per_device_values():
    snap = nvml_snapshot(RecordedNvml(RECORDING))
    assert snap.source == "nvml" and snap.measured
    assert snap.utilisation == (0.37, 0.0)
    assert snap.free_bytes == (61203283968.0, 85004255232.0)
    assert snap.clocks_mhz == (1410.0, 210.0)
    assert snap.temperature_c == (52.0, 34.0)
    assert snap.power_w == pytest.approx((187.432, 46.215))
    assert snap.healthy == (True, True)


def test_recorded_nvml_link_matrix_nvlink():
    # Card 1 reports its peer with a 4-digit PCI domain: ids still match.
    snap = nvml_snapshot(RecordedNvml(RECORDING))
    assert snap.links == (("self", "nvlink"), ("nvlink", "self"))


@pytest.mark.parametrize("level,expected", [(10, "pcie-switch"), (20, "pcie-switch"),
                                            (30, "pcie-host"), (40, "pcie-host"),
                                            (50, "system")])
def test_link_matrix_from_topology_without_nvlink(record, level, expected):
    rec = copy.deepcopy(record)
    for dev in rec["devices"]:
        for link in dev["nvlink"].values():
            link["state"] = 0
    rec["topology"] = [[None, level], [level, None]]
    snap = nvml_snapshot(RecordedNvml(rec))
    assert snap.links == (("self", expected), (expected, "self"))


def test_failing_device_is_unhealthy(record):
    rec = copy.deepcopy(record)
    rec["devices"][1]["utilization"] = {"error": "GPU is lost"}
    snap = nvml_snapshot(RecordedNvml(rec))
    assert snap.healthy == (True, False)
    assert snap.utilisation[1] == 1.0 and snap.free_bytes[1] == 0.0
    assert math.isnan(snap.clocks_mhz[1])
    assert snap.utilisation[0] == 0.37


def test_nvml_init_failure_is_one_clear_line(record):
    rec = dict(record, init_error="NVML Shared Library Not Found")
    with pytest.raises(TelemetryError, match="NVML") as info:
        nvml_snapshot(RecordedNvml(rec))
    assert "\n" not in str(info.value)


def test_nvml_without_driver_raises_telemetry_error():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        with pytest.raises(TelemetryError, match="NVML"):
            nvml_snapshot()
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")


@pytest.mark.gpu
def test_nvml_real_driver():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(str(exc))
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    snap = nvml_snapshot()
    assert len(snap.utilisation) == count and snap.measured
    assert all(0.0 <= u <= 1.0 for u in snap.utilisation)
    assert all(f > 0 for f in snap.free_bytes)
    assert len(snap.links) == count
    assert all(snap.links[i][i] == "self" for i in range(count))


@pytest.mark.serial
def test_local_cpu_snapshot_reads_the_os():
    machine = load_machine("local-cpu")
    try:
        snap = local_cpu_snapshot(machine, interval=0.05)
    except TelemetryError as exc:
        pytest.skip(str(exc))
    assert snap.measured and snap.source == "local-cpu"
    assert len(snap.utilisation) == machine.n
    assert all(0.0 <= u <= 1.0 for u in snap.utilisation)
    assert all(f > 0 for f in snap.free_bytes)


def test_snapshot_links_default_empty():
    snap = idle(load_machine("hetero-4"))
    assert snap.links == ()
    assert Snapshot("x", (0.0,), (1.0,), (True,)).links == ()


def test_simulated_telemetry_is_seeded():
    machine = load_machine("hetero-4")
    a = SimulatedTelemetry(machine, seed=7)
    b = SimulatedTelemetry(machine, seed=7)
    c = SimulatedTelemetry(machine, seed=8)
    seq_a = [a.step().utilisation for _ in range(50)]
    seq_b = [b.step().utilisation for _ in range(50)]
    seq_c = [c.step().utilisation for _ in range(50)]
    assert seq_a == seq_b
    assert seq_a != seq_c


def test_simulated_devices_go_busy_and_idle():
    machine = load_machine("hetero-4")
    sim = SimulatedTelemetry(machine, seed=0, p_busy=0.4, mean_spell=4.0)
    history = [sim.step().utilisation for _ in range(400)]
    for i in range(machine.n):
        states = [u[i] > 0 for u in history]
        assert any(states) and not all(states)
        flips = sum(1 for x, y in zip(states, states[1:], strict=False) if x != y)
        assert flips >= 4
        busy = [u[i] for u in history if u[i] > 0]
        assert all(0.3 <= u <= 0.9 for u in busy)
    frac = sum(u > 0 for row in history for u in row) / (400 * machine.n)
    assert 0.2 < frac < 0.6


def test_recorded_nvml_capacity_from_compute_processes(record):
    snap = nvml_snapshot(RecordedNvml(record), exclude_pids=[])
    # pid 4242: mean SM share of its samples (36, 44, 30, 38) % = 0.37;
    # pid 5151 is listed but has no sample: it wants nothing now.
    assert snap.capacity[0] == pytest.approx(0.63)
    assert snap.contenders[0] == pytest.approx(0.37)
    assert snap.capacity[1] == 1.0 and snap.contenders[1] == 0.0
    assert "nvmlDeviceGetProcessUtilization" in snap.capacity_provenance[0]
    assert snap.slowdown(0) == pytest.approx(1 / 0.63)


def test_recorded_nvml_our_own_process_is_not_contention(record):
    snap = nvml_snapshot(RecordedNvml(record), exclude_pids=[4242])
    assert snap.capacity == (1.0, 1.0)


def test_recorded_nvml_without_samples_counts_every_process_busy(record):
    for dev in record["devices"]:
        dev["process_utilization"] = {"error": "Not Supported"}
    snap = nvml_snapshot(RecordedNvml(record), exclude_pids=[])
    assert snap.capacity[0] == pytest.approx(1 / 3)    # two others, each always on
    assert "always busy" in snap.capacity_provenance[0]


def test_old_recording_without_process_lists_has_no_capacity(record):
    old = copy.deepcopy(record)
    for dev in old["devices"]:
        dev.pop("compute_processes")
        dev.pop("process_utilization")
    snap = nvml_snapshot(RecordedNvml(old))
    assert snap.capacity is None and snap.capacity_provenance is None
    assert snap.slowdown(0) == pytest.approx(1 / (1 - 0.37))
    new = nvml_snapshot(RecordedNvml(record))
    assert (snap.utilisation, snap.free_bytes, snap.links) == \
        (new.utilisation, new.free_bytes, new.links)


def test_device_that_cannot_list_processes_falls_back_on_utilisation(record):
    record["devices"][0].pop("compute_processes")
    snap = nvml_snapshot(RecordedNvml(record), exclude_pids=[])
    assert snap.capacity[0] == pytest.approx(1 - 0.37)
    assert "1 - utilisation" in snap.capacity_provenance[0]
    assert snap.capacity[1] == 1.0


@pytest.mark.serial
def test_local_cpu_snapshot_has_capacity():
    try:
        snap = local_cpu_snapshot(load_machine("local-cpu"), interval=0.05)
    except TelemetryError as exc:
        pytest.skip(str(exc))
    assert len(snap.capacity) == len(snap.capacity_provenance) == len(snap.utilisation)
    assert all(0.0 < c <= 1.0 for c in snap.capacity)


def test_a_gpu_nvml_cannot_read_is_unhealthy_and_says_why(record):
    """A GPU whose NVML calls fail is unhealthy, and Gate 1's refusal of a
    decision naming it says why."""
    from lib.contract import Decision, TaskSpec
    from lib.security import check_decision

    record = copy.deepcopy(record)
    record["devices"][1]["utilization"] = {"error": "GPU is lost"}
    snap = nvml_snapshot(RecordedNvml(record), exclude_pids=[])
    assert snap.healthy == (True, False)
    assert snap.unhealthy_why == ("", "NVML cannot read it (GPU is lost)")
    machine = load_machine("uni-server-2gpu-induced")
    task = TaskSpec("reduce", {"N": 1000})
    decision = Decision(gpus=(0, 1), shares=(0.5, 0.5), chunk=1000, block=256,
                        mode="split", comm_path="host").with_hash(task)
    verdict = check_decision(decision, task, machine, snap)
    assert not verdict.accepted
    assert "is unhealthy: NVML cannot read it (GPU is lost)" in verdict.summary()
