"""The dask backend on a real LocalCluster (127.0.0.1, two single-threaded worker
processes): verified results for every kind, MEASURED labels, shards on their own
workers, a killed worker named or re-planned around, the scheduler's telemetry,
the profile, the network links, and a policy deciding through the Agent."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from lib.contract import Decision, TaskSpec
from lib.execution import (
    BackendUnavailable,
    DaskBackend,
    DeviceError,
    ExecutionError,
    get_backend,
)
from lib.execution.characterise import characterise
from lib.execution.dask_measure import (
    benchmark,
    benchmark_lines,
    characterise_network,
)
from lib.platform import dask_cluster as dc
from lib.platform.machines import MachineError, load_machine
from lib.platform.telemetry import Snapshot
from lib.policies.registry import make_policy
from lib.runtime import Agent

#: every test here starts a Dask cluster or measures this computer
pytestmark = pytest.mark.serial

distributed = pytest.importorskip("distributed")
get_task_stream = distributed.get_task_stream

SMALL = {
    "matmul": {"M": 203, "N": 64, "K": 48},
    "reduce": {"N": 1_000_003},
    "elementwise": {"N": 100_001},
    "stencil": {"H": 129, "W": 33, "T": 4},
    "histogram": {"N": 200_003, "B": 97},
}
WAIT = 60.0


@pytest.fixture(scope="module")
def cluster():
    c = dc.connect("dask-local:2", timeout=WAIT)
    yield c
    c.close()


@pytest.fixture
def fresh(cluster):
    """The cluster with two live workers and a profile that matches them."""
    cluster.client.wait_for_workers(2, timeout=WAIT)
    if set(cluster.addresses) != cluster.alive():
        cluster.refresh()
    assert cluster.machine.n == 2
    return cluster


def _recover(cluster, dead: str, removed: bool) -> None:
    """After a test took a worker away: a killed one comes back (its nanny
    restarts it at a new address); a removed one is replaced by heal()."""
    assert wait_for(lambda: dead not in cluster.alive())
    if removed:
        cluster.heal(timeout=WAIT)
    else:
        cluster.client.wait_for_workers(2, timeout=WAIT)
        cluster.refresh()
    assert cluster.machine.n == 2 and dead not in cluster.addresses


def wait_for(predicate, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def decide(task: TaskSpec, gpus=(0, 1), shares=(0.6, 0.4), path="host") -> Decision:
    return Decision(gpus=tuple(gpus), shares=tuple(shares), chunk=task.split_size,
                    comm_path=path).with_hash(task)


# -- spec and profile ---------------------------------------------------------

def test_specs_parse_and_bad_ones_are_one_line():
    assert dc.parse_spec("dask-local:3").workers == 3
    assert dc.parse_spec("dask://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    assert dc.parse_spec("dask://[::1]:8786").address == "tcp://[::1]:8786"
    assert dc.is_dask_spec("dask-local:2") and not dc.is_dask_spec("local-cpu")
    for bad in ("dask-local:0", "dask-local:x", "dask://host", "dask://h:99999",
                "dask://a b:1"):
        with pytest.raises(MachineError) as err:
            dc.parse_spec(bad)
        assert bad in str(err.value) and "\n" not in str(err.value)


def test_unreachable_scheduler_is_one_line():
    t0 = time.monotonic()
    with pytest.raises(MachineError) as err:
        dc.connect("dask://127.0.0.1:9", timeout=2)
    msg = str(err.value)
    assert "dask://127.0.0.1:9" in msg and "cannot reach" in msg and "\n" not in msg
    assert time.monotonic() - t0 < 30


def test_profile_from_worker_records():
    gb = 1e9
    workers = {
        "tcp://10.0.0.2:4001": {"nthreads": 4, "memory_limit": 16 * gb,
                                "host": "10.0.0.2"},
        "tcp://10.0.0.1:4000": {"nthreads": 1, "memory_limit": 8 * gb,
                                "host": "10.0.0.1"},
        "tcp://10.0.0.1:4002": {"nthreads": 1, "memory_limit": 0,
                                "host": "10.0.0.1",
                                "gpu": {"name": "NVIDIA H100 80GB HBM3",
                                        "memory-total": 81 * gb}},
    }
    facts = {"tcp://10.0.0.1:4000": {"hostname": "a", "mem_total": 64 * gb},
             "tcp://10.0.0.1:4002": {"hostname": "a", "mem_total": 64 * gb},
             "tcp://10.0.0.2:4001": {"hostname": "b", "mem_total": 32 * gb}}
    m = dc.machine_from_workers("dask://s:1", workers, facts, client_hostname="a")
    assert [dc.worker_address(d) for d in m.devices] == [
        "tcp://10.0.0.1:4000", "tcp://10.0.0.1:4002", "tcp://10.0.0.2:4001"]
    cpu, gpu, big = m.devices
    assert (cpu.kind, gpu.kind, big.kind) == ("cpu", "gpu", "cpu")
    assert big.peak_fp32 == 4 * cpu.peak_fp32 and big.mem_bytes == 16 * gb
    assert cpu.provenance["peak_fp32"] == "estimated"
    assert "not measured" in cpu.notes["peak_fp32"]
    assert cpu.provenance["mem_bytes"] == "measured"
    assert "H100" in gpu.name and gpu.mem_bytes == 81 * gb
    assert gpu.provenance["peak_fp32"] == "estimated"
    # hosts: 0 and 1 share host "a" (the client's); 2 is elsewhere
    assert [h.kind for h in m.host_links] == ["loopback", "loopback", "network"]
    assert m.peer(0, 1).kind == "loopback" and m.peer(0, 2).kind == "network"
    assert all(link.p2p and link.provenance == "estimated"
               for link in m.peers.values())
    assert m.real_backends == ("dask",) and not m.simulated
    forced = dc.machine_from_workers("x", workers, facts, gpu_workers=False)
    assert all(d.kind == "cpu" for d in forced.devices)
    with pytest.raises(MachineError, match="no workers"):
        dc.machine_from_workers("dask://s:1", {})
    # a card the catalog lacks is named, not taken for the nearest name (an
    # L40S is not an L4)
    unknown = {**workers, "tcp://10.0.0.1:4002": {
        **workers["tcp://10.0.0.1:4002"],
        "gpu": {"name": "NVIDIA L40S", "memory-total": 48 * gb}}}
    with pytest.raises(MachineError, match=r"worker tcp://10.0.0.1:4002 has a "
                       r"'NVIDIA L40S', which the catalog lacks"):
        dc.machine_from_workers("dask://s:1", unknown, facts)
    # GPU workers are profiled, not run
    with pytest.raises(BackendUnavailable, match="GPU worker"):
        DaskBackend(m)
    # a profile that is not a Dask cluster is named as such, with what would be
    with pytest.raises(BackendUnavailable, match="machine hetero-4 is not a Dask "
                       "cluster; name one as dask-local:N"):
        DaskBackend(load_machine("hetero-4"))


def test_snapshot_from_scheduler_rows():
    workers = {"tcp://h:1": {"nthreads": 2, "memory_limit": 4e9},
               "tcp://h:2": {"nthreads": 1, "memory_limit": 4e9,
                             "gpu": {"name": "T4", "memory-total": 16e9}},
               "tcp://h:3": {"nthreads": 1, "memory_limit": 4e9}}
    m = dc.machine_from_workers("x", workers)
    rows = [{"status": "running", "nthreads": 2, "cpu_percent": 50.0,
             "memory": 1e9, "memory_limit": 4e9, "processing": 0, "gpu": None,
             "gpu_memory_total": 0.0},
            {"status": "running", "nthreads": 1, "cpu_percent": 3.0, "memory": 1e9,
             "memory_limit": 4e9, "processing": 0,
             "gpu": {"utilization": 40, "memory-used": 6e9},
             "gpu_memory_total": 16e9},
            {"status": "gone", "nthreads": 0}]
    snap = dc.snapshot_from_rows(m, rows)
    assert snap.measured and snap.source == "dask"
    assert snap.utilisation == pytest.approx((0.25, 0.4, 1.0))
    assert snap.free_bytes == pytest.approx((3e9, 10e9, 0.0))
    assert snap.healthy == (True, True, False)


def test_profile_of_the_local_cluster(fresh):
    m = fresh.machine
    assert m.name == "dask-local:2" and m.n == 2 and m.real_backends == ("dask",)
    assert all(d.kind == "cpu" and d.name.startswith("dask worker tcp://127.0.0.1:")
               for d in m.devices)
    assert list(fresh.addresses) == sorted(fresh.alive(), key=dc.worker_order)
    assert all(f["blas_threads"] == "1" for f in fresh.facts.values())
    assert {link.kind for link in m.host_links} == {"loopback"}
    # the hook load_machine calls, and the registry: one cluster per spec
    assert dc.dask_machine("dask-local:2") is fresh.machine
    assert dc.cluster_for(m) is fresh
    if len(os.sched_getaffinity(0)) >= 2:  # each worker pinned to its own core
        pins = fresh.client.run(lambda: tuple(sorted(os.sched_getaffinity(0))))
        assert all(len(v) == 1 for v in pins.values()) and len(set(pins.values())) == 2


def test_a_running_scheduler_by_address_and_an_attached_client(fresh):
    port = fresh.client.scheduler.address.rsplit(":", 1)[1]
    spec = f"dask://127.0.0.1:{port}"
    remote = dc.connect(spec, timeout=WAIT)  # a second client, same scheduler
    try:
        assert remote is not fresh and remote.machine.name == spec
        assert remote.addresses == fresh.addresses
        assert all(d.kind == "cpu" for d in remote.machine.devices)
        task = TaskSpec("reduce", SMALL["reduce"])
        r = get_backend("dask", remote.machine, timeout=WAIT).run(
            task, decide(task), verify=True)
        assert r.metrics.verified and r.metrics.label == "MEASURED (dask)"
    finally:
        dc.close(spec)
    attached = dc.attach(fresh.client, name="dask://attached:1")
    assert dc.cluster_for("dask://attached:1") is attached
    dc.close("dask://attached:1")
    assert fresh.client.status == "running"  # the caller's client stays open


# -- running ------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(SMALL))
def test_every_kind_measured_and_verified(fresh, kind):
    task = TaskSpec(kind, SMALL[kind])
    backend = get_backend("dask", fresh.machine, seed=3, repeats=2, timeout=WAIT)
    assert isinstance(backend, DaskBackend)
    r = backend.run(task, decide(task), verify=True)
    assert r.metrics.measured and r.metrics.label == "MEASURED (dask)"
    assert r.metrics.verified, r.metrics.max_abs_error
    assert set(r.metrics.per_device_seconds) == {0, 1}
    assert all(t > 0 for t in r.metrics.per_device_seconds.values())
    assert r.metrics.total_seconds >= max(r.metrics.per_device_seconds.values())
    assert r.metrics.repeats == 2 and len(r.detail["all_totals"]) == 2
    assert r.detail["merge"]["path"] == "client"  # the host path, asked for


def test_shards_run_on_their_own_workers_and_sums_add_there(fresh):
    client, addr = fresh.client, fresh.addresses
    backend = DaskBackend(fresh.machine, timeout=WAIT)
    for kind in ("elementwise", "histogram"):
        task = TaskSpec(kind, SMALL[kind])
        d = decide(task, gpus=(1, 0), shares=(0.3, 0.7), path="p2p")
        with get_task_stream(client) as ts:
            r = backend.run(task, d, verify=True)
        assert r.metrics.verified
        ran = {}
        for rec in ts.data:
            key = str(rec["key"])
            if key.startswith(("gpuhive-shard-", "gpuhive-add-")):
                ran[key] = rec["worker"]
        shards = {k: w for k, w in ran.items() if k.startswith("gpuhive-shard-")}
        assert len(shards) == 2
        for key, worker in shards.items():
            pos = int(key.rsplit("-", 1)[1])
            assert worker == addr[d.gpus[pos]], (key, worker)
        assert r.detail["ran_on"] == {0: addr[1], 1: addr[0]}
        adds = [w for k, w in ran.items() if k.startswith("gpuhive-add-")]
        if task.merge == "sum":  # one add, on shard 0's worker (device 1)
            assert adds == [addr[1]]
        else:
            assert adds == []


def test_a_deeper_sum_tree_adds_every_partial_once(fresh):
    # Gate 1 would refuse a device twice; the backend itself takes it, which
    # gives a two-level tree of adds on two workers.
    task = TaskSpec("reduce", SMALL["reduce"])
    d = Decision(gpus=(0, 1, 0, 1, 1), shares=(0.2,) * 5, chunk=task.split_size,
                 comm_path="p2p").with_hash(task)
    with get_task_stream(fresh.client) as ts:
        r = DaskBackend(fresh.machine, timeout=WAIT).run(task, d, verify=True)
    assert r.metrics.verified, r.metrics.max_abs_error
    adds = [str(rec["key"]) for rec in ts.data
            if str(rec["key"]).startswith("gpuhive-add-")]
    assert len(adds) == 4 and len(set(adds)) == 4


def test_a_host_path_sum_adds_the_partials_at_the_client(fresh):
    task = TaskSpec("histogram", SMALL["histogram"])
    d = decide(task, gpus=(0, 1), shares=(0.4, 0.6), path="host")
    with get_task_stream(fresh.client) as ts:
        r = DaskBackend(fresh.machine, timeout=WAIT).run(task, d, verify=True)
    assert r.metrics.verified
    assert r.detail["merge"]["path"] == "client"
    assert r.detail["merge"]["requested"] == "host"
    assert not [rec for rec in ts.data if str(rec["key"]).startswith("gpuhive-add-")]


def test_zero_share_and_single_device(fresh):
    task = TaskSpec("matmul", SMALL["matmul"])
    backend = DaskBackend(fresh.machine, timeout=WAIT)
    r = backend.run(task, decide(task, shares=(1.0, 0.0)), verify=True)
    assert r.metrics.verified and set(r.metrics.per_device_seconds) == {0}
    one = Decision(gpus=(1,), shares=(1.0,), chunk=203, mode="single").with_hash(task)
    r = backend.run(task, one, verify=True)
    assert r.metrics.verified and set(r.metrics.per_device_seconds) == {1}
    with pytest.raises(ExecutionError, match="does not exist"):
        backend.run(task, Decision(gpus=(5,), shares=(1.0,), chunk=203))


def test_a_run_too_large_for_a_worker_or_this_computer_is_refused_before_placing(
        fresh, monkeypatch):
    """A shard whose worker would pass the share of its memory limit where
    Dask pauses it is refused in one line naming the shard and the worker,
    before anything is placed (a worker past its limit is killed mid-run);
    so is a run whose local workers and client together would take more of
    this computer's memory than is available. A run that fits still runs."""
    import lib.execution.dask as dask_backend

    backend = DaskBackend(fresh.machine, timeout=WAIT)
    limit = min(d.mem_bytes for d in fresh.machine.devices)
    n = int(limit / 12 * 2)   # inputs and output of a shard about the limit
    task = TaskSpec("elementwise", {"N": n})
    placed = []
    monkeypatch.setattr(DaskBackend, "_place",
                        lambda self, run, active: placed.append(run) or {})
    with pytest.raises(ExecutionError) as err:
        backend.run(task, decide(task, shares=(0.5, 0.5)))
    text = str(err.value)
    assert text.startswith("dask backend: shard 0 (rows 0:") and "\n" not in text
    assert f"on 0:{fresh.machine.devices[0].name}" in text
    assert "memory limit" in text and placed == []
    monkeypatch.undo()
    small = TaskSpec("elementwise", SMALL["elementwise"])
    monkeypatch.setattr(dask_backend, "available_memory_bytes", lambda: 1e6)
    with pytest.raises(ExecutionError, match="this computer's memory.*reference"):
        backend.run(small, decide(small), verify=True)
    monkeypatch.undo()
    assert backend.run(small, decide(small), verify=True).metrics.verified


def test_a_failing_shard_names_worker_shard_and_hash(fresh):
    task = TaskSpec("reduce", SMALL["reduce"])
    d = decide(task)
    backend = DaskBackend(fresh.machine, fault_devices={1}, timeout=WAIT)
    with pytest.raises(DeviceError) as err:
        backend.run(task, d)
    msg = str(err.value)
    assert "\n" not in msg and fresh.addresses[1] in msg
    assert "shard 1" in msg and d.config_hash[:12] in msg and "injected" in msg
    assert err.value.device == 1 and err.value.shard == 1


def _run_and_kill(cluster, backend, task, d, victim: int, remove: bool = False):
    """Run in a thread; kill the victim's worker process (or remove the worker
    from the cluster) while its shard is held mid-run; return (result or
    exception, seconds from kill to answer, snapshot and table just before)."""
    client, addr = cluster.client, cluster.addresses[victim]
    pid = client.run(os.getpid, workers=[addr])[addr]
    box: dict = {}

    def go():
        try:
            box["result"] = backend.run(task, d, verify=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: not thread.is_alive() or any(
            str(k).startswith("gpuhive-shard-")
            for k in client.processing().get(addr, ()))), "shard never arrived"
        assert thread.is_alive(), box
        snap = dc.dask_snapshot(cluster)  # the scheduler sees the held shard
        table = dc.worker_table(cluster)
        killed = time.monotonic()
        if remove:
            client.retire_workers([addr], close_workers=True, remove=True)
        else:
            os.kill(pid, signal.SIGKILL)
        thread.join(WAIT)
        assert not thread.is_alive(), "the run did not answer after the kill"
        return box, time.monotonic() - killed, snap, table
    finally:
        _recover(cluster, addr, remove)


def test_killed_worker_mid_run_is_a_device_error(fresh):
    task = TaskSpec("elementwise", SMALL["elementwise"])
    d = decide(task)
    backend = DaskBackend(fresh.machine, stall_devices={1: 30.0}, timeout=WAIT,
                          poll=0.05)
    victim = fresh.addresses[1]
    box, after, snap, table = _run_and_kill(fresh, backend, task, d, 1)
    assert "result" not in box, "a partial result was returned"
    err = box["error"]
    assert isinstance(err, DeviceError), repr(err)
    msg = str(err)
    assert "\n" not in msg and victim in msg and "shard 1" in msg
    assert d.config_hash[:12] in msg and "left the cluster" in msg
    assert after < 20, f"took {after:.1f} s to notice"
    # telemetry taken while the shard was held: worker 1 processing one task
    assert isinstance(snap, Snapshot) and snap.measured and snap.source == "dask"
    assert snap.healthy == (True, True) and snap.utilisation[1] == 1.0
    assert table[1]["processing"] >= 1 and table[1]["address"] == victim
    assert all(f > 0 for f in snap.free_bytes)


def test_killed_worker_mid_run_is_replanned(fresh):
    task = TaskSpec("histogram", SMALL["histogram"])
    d = decide(task, path="p2p")
    backend = DaskBackend(fresh.machine, stall_devices={1: 30.0}, timeout=WAIT,
                          allow_replan=True, poll=0.05)
    victim = fresh.addresses[1]
    box, after, _, _ = _run_and_kill(fresh, backend, task, d, 1)
    assert "error" not in box, repr(box.get("error"))
    r = box["result"]
    assert r.metrics.verified and r.metrics.label == "MEASURED (dask)"
    assert r.decision.gpus == (0,) and r.decision.shares == (1.0,)
    assert r.detail["replanned"]["failed_device"] == 1
    assert victim in r.detail["replanned"]["reason"]
    assert set(r.metrics.per_device_seconds) == {0}


def test_removed_worker_mid_run_is_a_device_error(fresh):
    task = TaskSpec("stencil", SMALL["stencil"])
    d = decide(task)
    # a short hold: a removed worker closes once its running task ends
    backend = DaskBackend(fresh.machine, stall_devices={0: 5.0}, timeout=WAIT,
                          poll=0.05)
    victim = fresh.addresses[0]
    box, after, _, _ = _run_and_kill(fresh, backend, task, d, 0, remove=True)
    assert "result" not in box, "a partial result was returned"
    err = box["error"]
    assert isinstance(err, DeviceError), repr(err)
    msg = str(err)
    assert "\n" not in msg and victim in msg and "shard 0" in msg
    assert d.config_hash[:12] in msg and after < 5


# -- telemetry, network, policy, benchmark ---------------------------------------

def test_snapshot_of_idle_workers(fresh):
    snap = dc.dask_snapshot(fresh.machine)
    assert snap.measured and len(snap.utilisation) == 2
    assert snap.healthy == (True, True)
    assert all(0.0 <= u <= 1.0 for u in snap.utilisation)
    rows = dc.worker_table(fresh)
    assert [r["address"] for r in rows] == list(fresh.addresses)


def test_network_between_workers_is_measured(fresh):
    links = characterise_network(fresh, nbytes=1 << 20, repeats=1)
    peer = links.peers[(0, 1)]
    assert peer.provenance == "measured" and peer.kind == "loopback" and peer.p2p
    assert peer.bandwidth > 0 and peer.latency > 0
    assert set(links.host_links) == {0, 1}
    assert all(r["label"] == "MEASURED (dask)" for r in links.records)
    m = links.apply(fresh.machine)
    assert m.peer(0, 1).provenance == "measured"
    assert m.host_link(1).provenance == "measured"
    assert fresh.machine.peer(0, 1).provenance == "estimated"


def test_characterise_measures_the_network_and_the_profile_uses_it(fresh, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    assert dc.with_measured_links(fresh.machine).peer(0, 1).provenance == "estimated"
    obj = characterise("dask-local:2", "dask", budget="smoke", progress=False)
    net = obj["measured"]["network"]
    assert net["hosts"] == ["127.0.0.1", "127.0.0.1"]
    assert net["peers"]["0-1"]["provenance"] == "measured"
    assert all(r["label"] == "MEASURED (dask)" for r in net["records"])
    m = dc.with_measured_links(fresh.machine)
    assert m.peer(0, 1).provenance == "measured"
    assert m.peer(0, 1).bandwidth == net["peers"]["0-1"]["bandwidth"]
    assert m.host_link(0).latency == net["host_links"]["0"]["latency"]
    # workers on other hosts than those measured: the estimates stay
    path = tmp_path / "characterisation" / "dask-local:2.json"
    stored = json.loads(path.read_text())
    stored["measured"]["network"]["hosts"] = ["10.0.0.1", "10.0.0.2"]
    path.write_text(json.dumps(stored))
    assert dc.with_measured_links(fresh.machine).peer(0, 1).provenance == "estimated"
    path.write_text("{ not json")  # a damaged file is ignored, not fatal
    assert dc.with_measured_links(fresh.machine) == fresh.machine


def test_a_policy_decides_over_the_workers_through_the_agent(fresh):
    task = TaskSpec("matmul", {"M": 256, "N": 96, "K": 64})
    snap = dc.dask_snapshot(fresh)
    with Agent(policy=make_policy("proportional-peak"), machine=fresh.machine,
               backend="dask", telemetry=snap, seed=2, timeout=WAIT) as agent:
        d = agent.optimize(task)
        assert sorted(d.gpus) == [0, 1]
        r = agent.execute(task, d, verify=True)
    assert r.metrics.label == "MEASURED (dask)" and r.metrics.verified
    assert load_machine(fresh.machine) is fresh.machine


def test_a_cluster_named_by_its_address_is_characterised_calibrated_and_run(
        fresh, tmp_path, monkeypatch):
    # a scheduler's address holds "/" and ":": its files take a stem of it, and
    # every step that reads or writes them works, the default policy included
    from lib.costmodel.calibrate import calibrate_machine
    from lib.costmodel.parameters import load_params
    from lib.storage import StorageError, calibration_path, characterisation_path

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    spec = f"dask://127.0.0.1:{fresh.client.scheduler.address.rsplit(':', 1)[1]}"
    try:
        machine = load_machine(spec)
        assert machine.name == spec
        obj = characterise(spec, "dask", budget="smoke", progress=False)
        assert obj["machine"] == spec
        stored = characterisation_path(spec)
        assert stored.parent == tmp_path / "characterisation" and stored.is_file()
        assert "/" not in stored.name and ":" not in stored.name
        calibrate_machine(spec, folds=0)
        assert calibration_path(spec).is_file() and load_params(spec) is not None
        task = TaskSpec("reduce", SMALL["reduce"])
        with Agent(machine=spec, backend="dask", seed=1, timeout=WAIT) as agent:
            r = agent.execute(task, agent.optimize(task), verify=True)
        assert r.metrics.label == "MEASURED (dask)" and r.metrics.verified
    finally:
        dc.close(spec)
    with pytest.raises(StorageError, match=r"'\.\./x' cannot name a file"):
        calibration_path("../x")


def test_benchmark_runs_both_backends(fresh):
    out = benchmark(size=96, tiny=64, repeats=1, tiny_repeats=2, cluster=fresh)
    for name in ("matmul", "tiny"):
        row = out[name]
        assert row["cpu"]["label"] == "MEASURED (cpu)"
        assert row["dask"]["label"] == "MEASURED (dask)"
        assert row["cpu"]["verified"] and row["dask"]["verified"]
        assert row["ratio"] > 0 and isinstance(row["pass"], bool)
    lines = benchmark_lines(out)
    assert len(lines) == 3 and "MEASURED" in lines[0]


def test_a_local_clusters_scratch_stays_in_the_home_and_a_dead_runs_is_reclaimed(
        tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    dead = tmp_path / "dask" / "local-999999999-abc"
    dead.mkdir(parents=True)
    foreign = tmp_path / "dask" / "notes"
    foreign.mkdir()
    fresh = dc.local_scratch()
    assert fresh.startswith(str(tmp_path / "dask" / f"local-{os.getpid()}-"))
    assert not dead.exists() and foreign.exists()  # only a dead owner's goes
    assert os.path.isdir(fresh)
