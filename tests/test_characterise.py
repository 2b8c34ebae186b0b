"""Characterisation: a real smoke run on local-cpu, and refusals."""

from __future__ import annotations

import json
import os
import statistics

import pytest

from lib.contract import KINDS, Decision, TaskSpec
from lib.execution.characterise import (
    CHARACTERISATION_PLANS,
    CharacterisationError,
    characterise,
    write_characterisation,
)
from lib.platform.workloads import workload

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                reason="the cpu backend pins workers (Linux only)")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    saved = os.environ.get("GPUHIVE_HOME")
    os.environ["GPUHIVE_HOME"] = str(home)
    try:
        obj = characterise("local-cpu", "cpu", budget="smoke", seed=0,
                           progress=False)
    finally:
        if saved is None:
            os.environ.pop("GPUHIVE_HOME", None)
        else:
            os.environ["GPUHIVE_HOME"] = saved
    return home, obj


def _numbers(obj, path=""):
    """Every (path, tagged number) under a section."""
    if isinstance(obj, dict):
        if "value" in obj and "provenance" in obj:
            yield path, obj
            return
        for k, v in obj.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")


def test_smoke_budget_spans_two_orders_of_work():
    for budget in CHARACTERISATION_PLANS.values():
        for kind in KINDS:
            works = []
            for dims in budget.sizes[kind]:
                task = TaskSpec(kind, dict(dims))
                w = workload(task).total_work(task)
                works.append(w.flops if workload(kind).bound == "compute"
                             else w.mem_traffic)
            assert len(works) >= 3
            assert max(works) / min(works) >= 100, kind


@pytest.mark.serial
def test_smoke_writes_default_path(smoke):
    home, obj = smoke
    path = home / "characterisation" / "local-cpu.json"
    assert obj["path"] == str(path)
    on_disk = json.loads(path.read_text())
    assert on_disk["machine"] == "local-cpu" and on_disk["backend"] == "cpu"
    assert on_disk["runs"] == obj["runs"]


def test_every_measured_number_is_tagged(smoke):
    _, obj = smoke
    measured = list(_numbers(obj["measured"]))
    assert len(measured) > 50
    for path, num in measured:
        assert num["provenance"] == "measured", path
        assert num["method"] and num["unit"], path
        assert isinstance(num["value"], float), path
    for path, num in _numbers(obj["estimated"]):
        assert num["provenance"] == "estimated", path
    # its wall time is a measured number too (a speed goal, not asserted here)
    assert obj["elapsed"]["provenance"] == "measured" and obj["elapsed"]["value"] > 0


def test_throughput_and_links_present(smoke):
    _, obj = smoke
    m = obj["measured"]
    for dev in ("0", "1"):
        for kind in KINDS:
            entry = m["throughput"][dev][kind]
            assert len(entry["points"]) >= 3
            assert all(p["seconds"]["value"] > 0 for p in entry["points"])
        link = m["host_link"][dev]
        assert 0 < link["latency"]["value"] < 0.5
        assert link["bandwidth"]["value"] > 0
        assert m["host_link"]["shm_copy"][dev]["read_bandwidth"]["value"] > 0
    assert m["device_to_device"]["0->1"]["latency"]["value"] > 0


def test_runs_are_measured_records(smoke):
    _, obj = smoke
    runs = obj["runs"]
    assert {TaskSpec.from_json(r["task"]).kind for r in runs} == set(KINDS)
    multi = [r for r in runs if len(r["decision"]["gpus"]) > 1]
    assert multi and {r["purpose"] for r in multi} == {"split-equal", "split-ramp"}
    for r in runs:
        task = TaskSpec.from_json(r["task"])
        dec = Decision.from_json(r["decision"])
        assert dec.with_hash(task).config_hash == dec.config_hash
        assert r["backend"] == "cpu" and r["provenance"] == "measured"
        assert r["measured_seconds"] > 0
        assert set(r["per_device_seconds"]) <= {str(g) for g in dec.gpus}
        assert r["verified"] in (None, True)
        # which characterisation took it, so that pooled runs keep it apart
        assert r["occasion"] == obj["occasion"]
    assert any(r["verified"] is True for r in runs)
    assert isinstance(obj["occasion"], str) and obj["created"] in obj["occasion"]


def test_short_runs_are_called_again_until_their_repeats_add_up():
    """A run whose timed repeats fall short of the plan's ``min_timed_s`` is
    called again, whole calls, at most ``max_calls`` in a pass."""
    from types import SimpleNamespace

    from lib.execution.characterise import _more_calls

    plan = CHARACTERISATION_PLANS["quick"]

    def call(*totals):
        return SimpleNamespace(detail={"all_totals": list(totals)},
                               metrics=SimpleNamespace(total_seconds=totals[-1]))

    assert plan.min_timed_s > 0 and plan.max_calls > 1
    assert _more_calls(call(plan.min_timed_s), plan) == 0
    assert _more_calls(call(plan.min_timed_s / 4, plan.min_timed_s / 4), plan) == 1
    assert _more_calls(call(plan.min_timed_s / 5), plan) == 4
    assert _more_calls(call(1e-9), plan) == plan.max_calls - 1


def test_short_runs_have_more_repeats_in_the_record(smoke):
    _, obj = smoke
    plan = CHARACTERISATION_PLANS["smoke"]
    base = plan.passes * plan.repeats
    counts = {r["repeats"] for r in obj["runs"]}
    assert all(base <= n <= base * plan.max_calls and n % plan.repeats == 0
               for n in counts), counts
    shortest = min(obj["runs"], key=lambda r: r["measured_seconds"])
    longest = max(obj["runs"], key=lambda r: r["measured_seconds"])
    assert shortest["repeats"] > base >= longest["repeats"]
    assert len(shortest["all_seconds"]) == shortest["repeats"]


def test_write_characterisation_round_trip(smoke, tmp_path):
    _, obj = smoke
    path = write_characterisation(obj, tmp_path / "c.json")
    assert json.loads(path.read_text())["runs"] == obj["runs"]


@pytest.mark.parametrize("machine,backend,needle", [
    ("local-cpu", "cuda", "cuda"),
    ("hetero-4", "cpu", "simulated"),
    ("local-cpu", "model", "measures nothing"),
    ("no-such-machine", "cpu", "unknown machine"),
    ("local-cpu", "tpu", "unknown backend"),
])
def test_impossible_machine_or_backend(machine, backend, needle):
    with pytest.raises(CharacterisationError, match=needle):
        characterise(machine, backend, budget="smoke", progress=False)


def test_runs_record_how_disturbed_they_were(smoke):
    _, obj = smoke
    timed = [r for r in obj["runs"] if r["purpose"] != "latency"]
    assert timed
    for r in timed:
        d = r["disturbance"]
        used = {str(g) for g in r["decision"]["gpus"]}
        assert set(d["capacity"]) == used and d["provenance"] == "measured"
        assert all(0.0 < c <= 1.0 for c in d["capacity"].values())
        assert all(isinstance(n, int) and n >= 0
                   for v in (*d["others_before"].values(),
                             *d["others_after"].values()) for n in v)


@pytest.mark.parametrize("grouped, expected", [(False, 1 / 3), (True, 0.2)])
def test_disturbance_from_two_looks(monkeypatch, grouped, expected):
    from lib.execution.characterise import _disturbance
    from lib.platform import telemetry

    monkeypatch.setattr(telemetry, "autogroups_enabled", lambda: grouped)
    # processes 999991 and 999992, each in a session of its own, weight 1
    monkeypatch.setattr(telemetry, "autogroup_of",
                        lambda pid: (f"/autogroup-{pid}", 1.0))
    got = _disturbance({"0": 0, "1": 1}, {11: (0, 999991), 12: (0, 999992)},
                       {12: (0, 999992)})
    # thread 12 runnable in both looks (wants the core), 11 in one (half).
    assert got["before"] == {"0": 2, "1": 0} and got["after"] == {"0": 1, "1": 0}
    # thread by thread: fair share against 1 and 1/2; by autogroup our
    # session's weight is spread over both cores: 1/2 against 1 and 1/2
    assert got["capacity"]["0"] == pytest.approx(expected)
    assert got["capacity"]["1"] == 1.0


def test_old_characterisation_without_disturbance_still_calibrates(smoke):
    from lib.costmodel.calibrate import calibrate

    _, obj = smoke
    old = [{k: v for k, v in r.items() if k != "disturbance"} for r in obj["runs"]]
    report = calibrate("local-cpu", old, seed=0)
    assert report.n_train > 0


@pytest.mark.serial
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux")
def test_characterise_under_induced_load_records_the_capacity_it_left(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    obj = characterise("local-cpu", "cpu", budget="smoke", seed=0, progress=False,
                       out=tmp_path / "loaded.json", induce_load=1)
    assert obj["induced_load"]["processes"] == 1
    assert obj["disturbed_retries"]["count"] == 0  # kept, not redone
    on_core0 = [r["disturbance"]["capacity"]["0"] for r in obj["runs"]
                if "0" in r.get("disturbance", {}).get("capacity", {})]
    assert on_core0 and statistics.median(on_core0) < 0.75
    assert {r["occasion"] for r in obj["runs"]} == {obj["occasion"]}
    with pytest.raises(CharacterisationError, match="cpu backend only"):
        characterise("dask-local:2", "dask", budget="smoke", progress=False,
                     out=tmp_path / "x.json", induce_load=1)
