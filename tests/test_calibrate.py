"""Calibration: recovery on synthetic runs, Spearman, warnings, saved files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from lib.contract import TaskSpec, decision_from_weights
from lib.costmodel import fit as fit_module
from lib.costmodel.calibrate import calibrate, calibrate_machine, score_runs
from lib.costmodel.contention import calibrated_bursts
from lib.costmodel.fit import (
    MIN_LOADED_RUNS,
    _FastModel,
    _get,
    _Slot,
    params_with,
    slots_for,
)
from lib.costmodel.model import default_params, predict
from lib.costmodel.parameters import (
    CalibrationError,
    load_params,
    params_from_json,
    params_to_json,
    save_params,
)
from lib.costmodel.runs import average_ranks, parse_runs, spearman
from lib.platform.machines import local_cpu_machine
from lib.storage import calibration_path

#: What the synthetic machine "really" does (binding roofline terms only).
TRUTH = {("compute_eff", ("cpu", "matmul")): 1.6,
         ("memory_eff", ("cpu", "matmul")): 0.45,
         ("memory_eff", ("cpu", "reduce")): 0.8,
         ("memory_eff", ("cpu", "elementwise")): 0.9,
         ("memory_eff", ("cpu", "stencil")): 0.3,
         ("memory_eff", ("cpu", "histogram")): 0.15,
         ("launch_s", "cpu"): 4e-4,
         ("link_scale", "cpu"): 1.3,
         ("cache_bw", "cpu"): 1.5,
         ("corun", "cpu"): 0.12,
         # a reduce's and a stencil's own cost a shard, beyond the launch
         ("fixed_s", ("cpu", "reduce")): 6e-5,
         ("fixed_s", ("cpu", "stencil")): 1.2e-4}
SIZES = {"matmul": [{"M": n, "N": n, "K": n} for n in (64, 128, 256, 512, 1024)]
         + [{"M": 8, "N": n, "K": n} for n in (512, 1024, 2048)],
         "elementwise": [{"N": n} for n in (10**4, 10**5, 10**6, 10**7)],
         "reduce": [{"N": n} for n in (10**4, 10**5, 10**6, 10**7)],
         "histogram": [{"N": n, "B": 256} for n in (10**4, 10**5, 10**6, 10**7)],
         "stencil": [{"H": n, "W": n, "T": 4} for n in (64, 256, 1024, 2048)]}


#: The synthetic machine's last-level cache: fixed, so that which sizes fit
#: (and so the cache term) does not depend on the computer the tests run on.
CACHE_BYTES = 32 * 2**20


@pytest.fixture(scope="module")
def machine():
    real = local_cpu_machine(2)  # two devices: one shard against two
    return dataclasses.replace(real, devices=tuple(
        dataclasses.replace(d, cache_bytes=CACHE_BYTES) for d in real.devices))


def truth_params():
    slots = [_Slot(t, k) for t, k in TRUTH]
    return params_with(default_params(), slots, list(TRUTH.values()))


def synthetic_runs(machine, params, noise=0.01, seed=1):
    rng = np.random.default_rng(seed)
    devices = list(range(machine.n))
    patterns = [[1.0 if d == i else 0.0 for d in devices] for i in devices]
    if machine.n > 1:
        patterns += [[1.0] * machine.n, [float(i + 1) for i in devices]]
    runs = []
    for kind, sizes in SIZES.items():
        for dims in sizes:
            task = TaskSpec(kind, dims)
            for weights in patterns:
                dec = decision_from_weights(task, devices, weights).with_hash(task)
                t = predict(task, dec, machine, None, params).total
                runs.append({"task": task.to_json(), "decision": dec.to_json(),
                             "measured_seconds": t * math.exp(rng.normal(0, noise)),
                             "backend": "cpu"})
    return runs


def _base_like(params):
    """The defaults, with the launch of ``params``: these runs (every shard
    copies in and out once) leave the launch to the base, their fixed cost
    to ``latency_scale``, so the fast model reads the launch from its base."""
    return dataclasses.replace(default_params(), launch_s={
        **default_params().launch_s, "cpu": params.launch_s["cpu"]})


def test_fast_model_matches_predict(machine):
    params = truth_params()
    runs = parse_runs(synthetic_runs(machine, params, noise=0.0), machine)
    slots = slots_for(machine, runs)
    fast = _FastModel(runs, machine, slots, _base_like(params))
    got = fast.predict(np.array([_get(params, s) for s in slots]))
    want = np.array([r.seconds for r in runs])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_fit_recovers_known_parameters(machine):
    report = calibrate(machine, synthetic_runs(machine, truth_params()), seed=0)
    assert report.median_ape_pct < 3.0
    assert report.spearman > 0.99
    assert report.warning == ""
    for (table, key), value in TRUTH.items():
        if table == "launch_s":
            continue
        name = _Slot(table, key).name
        assert name in report.fitted, name
        assert _get(report.params, _Slot(table, key)) == pytest.approx(value,
                                                                      rel=0.15)
    # A shard's launch and its two copies' latencies add up to one fixed cost
    # these runs (every shard copies in and out, none is pipelined) cannot
    # split; the sum is recovered, whichever of the two holds it.
    lat = machine.host_link(0).latency
    fixed = report.params.launch_s["cpu"] \
        + 2 * lat * report.params.latency_scale.get("cpu", 1.0)
    assert fixed == pytest.approx(TRUTH[("launch_s", "cpu")] + 2 * lat, rel=0.15)
    # Never-binding terms were not fitted and kept their defaults exactly.
    default = default_params()
    for name in report.not_fitted:
        if name in ("launch_s[cpu]", "latency_scale[cpu]"):
            continue                              # the one the fixed cost left
        table, kind = name[:-1].split("[cpu,")
        assert table in ("compute_eff", "fixed_s"), name
        if table == "compute_eff":
            assert report.params.e("cpu", kind) == default.e("cpu", kind)
        else:
            assert report.params.fixed("cpu", kind) == 0.0
    # The kinds whose shards cost nothing of their own (in the truth) are
    # left at none, or fitted to next to none: a microsecond, where the two
    # fitted are 60 and 120.
    for kind in ("matmul", "elementwise", "histogram"):
        assert report.params.fixed("cpu", kind) < 1e-6, kind
    assert report.n_train + report.n_heldout == sum(
        len(v) for v in SIZES.values()) * (machine.n + (2 if machine.n > 1 else 0))


def test_random_times_give_a_warning(machine):
    runs = synthetic_runs(machine, truth_params())
    rng = np.random.default_rng(3)
    for run in runs:
        run["measured_seconds"] = float(rng.uniform(1e-4, 1.0))
    report = calibrate(machine, runs, seed=0, folds=0)  # the held-out split alone
    assert report.median_ape_pct > 30.0
    assert "exceeds 30 %" in report.warning


def test_average_ranks_with_ties():
    np.testing.assert_allclose(average_ranks([10, 20, 20, 30]), [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(average_ranks([3, 3, 3]), [2, 2, 2])
    np.testing.assert_allclose(average_ranks([5, 1, 4]), [3, 1, 2])


def test_spearman_exact_cases():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = (1, -1, 1, -1): rho = 1 - 6*4 / (4*15) = 0.6
    assert spearman([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6)
    # ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): Pearson = 0.9486833
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        4.5 / math.sqrt(4.5 * 5.0))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1], [2]))


def test_model_runs_are_refused(machine):
    runs = synthetic_runs(machine, truth_params())[:4]
    runs[2] = dict(runs[2], backend="model")
    with pytest.raises(CalibrationError, match="run 2: backend 'model'"):
        calibrate(machine, runs)


def test_unknown_device_is_refused(machine):
    run = synthetic_runs(machine, truth_params())[0]
    run["decision"] = dict(run["decision"], gpus=[machine.n + 3])
    with pytest.raises(CalibrationError, match="run 0: decision names device"):
        calibrate(machine, [run, run])


def test_save_load_round_trip(machine, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    assert load_params("local-cpu") is None
    report = calibrate(machine, synthetic_runs(machine, truth_params()), seed=0)
    path = save_params("local-cpu", report.params, report)
    assert path == tmp_path / "calibration" / "local-cpu.json"
    assert path == calibration_path("local-cpu")
    loaded = load_params("local-cpu")
    assert loaded is not None
    assert dict(loaded.compute_eff) == pytest.approx(dict(report.params.compute_eff))
    assert dict(loaded.memory_eff) == pytest.approx(dict(report.params.memory_eff))
    assert dict(loaded.launch_s) == pytest.approx(dict(report.params.launch_s))
    assert dict(loaded.link_scale) == pytest.approx(dict(report.params.link_scale))
    assert loaded.fitted == report.fitted
    saved = json.loads(path.read_text())
    assert saved["report"]["median_ape_pct"] == pytest.approx(report.median_ape_pct)
    assert not list(path.parent.glob(".*"))       # no temporary file left over
    path.write_text("{not json")
    with pytest.raises(CalibrationError, match="not readable JSON"):
        load_params("local-cpu")


def test_a_calibration_is_parsed_once_and_an_edit_is_seen_at_once(machine, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    report = calibrate(machine, synthetic_runs(machine, truth_params()), seed=0)
    path = save_params("local-cpu", report.params, report)
    first = load_params("local-cpu")
    assert load_params("local-cpu") is first          # unchanged bytes: not re-parsed
    # an edit in place, of the same length, within the same clock tick: seen
    obj = json.loads(path.read_text())
    dk, kind = next((dk, k) for dk, row in obj["params"]["compute_eff"].items()
                    for k in row)
    old = obj["params"]["compute_eff"][dk][kind]
    obj["params"]["compute_eff"][dk][kind] = 0.123456789
    text = json.dumps(obj)
    path.write_text(text)
    edited = load_params("local-cpu")
    assert edited is not first
    assert edited.compute_eff[(dk, kind)] == pytest.approx(0.123456789)
    assert old != pytest.approx(0.123456789)
    # a tampered byte after a good read is refused, not served from memory
    path.write_text(text.replace('"params"', '"params\x00', 1))
    with pytest.raises(CalibrationError, match="local-cpu.json"):
        load_params("local-cpu")


@pytest.fixture
def host_cache(monkeypatch):
    """``local-cpu`` loaded by name reports :data:`CACHE_BYTES`, as the
    ``machine`` fixture does, whatever this computer's cache (a virtual
    machine's cores can report the host chip's 480 MiB, a small one 8 MiB:
    the size calibration may choose is capped by the reported one)."""
    import lib.platform.machines as machines_module

    monkeypatch.setattr(machines_module, "last_level_cache",
                        lambda *a, **k: (float(CACHE_BYTES), "fixed by the test"))


def test_calibrate_machine_from_file(machine, tmp_path, monkeypatch, host_cache):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    with pytest.raises(CalibrationError, match="no characterisation of local-cpu"):
        calibrate_machine("local-cpu")
    path = tmp_path / "characterisation" / "local-cpu.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"machine": "local-cpu",
                                "runs": synthetic_runs(machine, truth_params())}))
    out = calibrate_machine("local-cpu", json_out=True)
    assert out["median_ape_pct"] < 3.0 and out["label"].startswith("PREDICTED")
    assert load_params("local-cpu") is not None


def _loaded(machine, runs, capacity=0.4):
    """Every other run re-timed as if each of its devices had ``capacity``
    (what Eq. (1) predicts at that capacity), with the capacity recorded."""
    from lib.costmodel.runs import MeasuredRun

    params = truth_params()
    out = []
    for i, run in enumerate(runs):
        run = dict(run)
        if i % 2:
            table = {str(g): capacity for g in run["decision"]["gpus"]}
            parsed = MeasuredRun(None, None, 1.0, "cpu",
                                 {int(g): c for g, c in table.items()})
            task = TaskSpec.from_json(run["task"])
            dec = parse_runs([run], machine)[0].decision
            exact = predict(task, dec, machine, None, params).total
            run["measured_seconds"] *= predict(
                task, dec, machine, parsed.snapshot(machine), params).total / exact
            run["disturbance"] = {"capacity": table, "provenance": "measured"}
        out.append(run)
    return out


def test_fast_model_matches_predict_at_recorded_capacity(machine):
    params = truth_params()
    runs = parse_runs(_loaded(machine, synthetic_runs(machine, params, noise=0.0)),
                      machine)
    assert any(r.capacity for r in runs) and any(not r.capacity for r in runs)
    slots = slots_for(machine, runs)
    fast = _FastModel(runs, machine, slots, _base_like(params))
    got = fast.predict(np.array([_get(params, s) for s in slots]))
    want = [predict(r.task, r.decision, machine, r.snapshot(machine), params).total
            for r in runs]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_runs_under_load_are_predicted_not_thrown_away(machine):
    runs = _loaded(machine, synthetic_runs(machine, truth_params()))
    report = calibrate(machine, runs, seed=0)
    assert report.median_ape_pct < 3.0 and report.warning == ""
    assert _get(report.params, _Slot("compute_eff", ("cpu", "matmul"))) == \
        pytest.approx(1.6, rel=0.15)
    # The same runs without the recorded capacity (an older file's form):
    # loadable, but the loaded half now looks like noise the model cannot fit.
    blind = [{k: v for k, v in r.items() if k != "disturbance"} for r in runs]
    assert calibrate(machine, blind, seed=0).median_ape_pct > report.median_ape_pct


def test_bad_recorded_capacity_is_refused_in_one_line(machine):
    run = synthetic_runs(machine, truth_params())[0]
    run["disturbance"] = {"capacity": {"0": 1.5}}
    with pytest.raises(CalibrationError, match=r"run 0: capacity of device 0"):
        parse_runs([run], machine)


def test_a_saved_calibration_is_scored_on_runs_taken_under_load(machine, tmp_path,
                                                               monkeypatch,
                                                               host_cache):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    quiet = tmp_path / "quiet.json"
    quiet.write_text(json.dumps({"machine": "local-cpu",
                                 "runs": synthetic_runs(machine, truth_params())}))
    calibrate_machine("local-cpu", quiet)
    # other runs, half of them taken at capacity 0.4 (and recorded so)
    loaded = _loaded(machine, synthetic_runs(machine, truth_params(), seed=7))
    got = score_runs("local-cpu", loaded, load_params("local-cpu"))
    assert got["runs"] == len(loaded) and got["loaded_runs"] == len(loaded) // 2
    assert got["loaded_median_ape_pct"] < 3.0 and got["median_ape_pct"] < 3.0
    # each run's figures, in the order given, flagged where it was loaded
    assert len(got["scored"]) == len(loaded)
    assert sum(s["loaded"] for s in got["scored"]) == got["loaded_runs"]
    assert [s["measured_seconds"] for s in got["scored"]] == \
        [r["measured_seconds"] for r in loaded]
    # the same loaded runs without their capacity: the model cannot know
    blind = [{k: v for k, v in r.items() if k != "disturbance"} for r in loaded]
    assert score_runs("local-cpu", blind, load_params("local-cpu"))[
        "median_ape_pct"] > got["median_ape_pct"]
    # and through the command line, one line each
    path = tmp_path / "loaded.json"
    path.write_text(json.dumps({"machine": "local-cpu", "runs": loaded}))
    p = subprocess.run([sys.executable, "-m", "lib.cli", "calibrate", "--score",
                        str(path)], capture_output=True, text=True,
                       env={**os.environ, "GPUHIVE_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert f"({len(loaded) // 2} loaded)" in p.stdout and "median APE" in p.stdout
    assert "--characterisation" not in p.stdout   # within the goal: no advice
    # runs that felt load as capacity ** 2.5, which a quiet fit cannot know:
    # the command says how to fit them in
    slower = params_with(truth_params(), [_Slot("contention", "cpu")], [2.5])
    hard = tmp_path / "hard.json"
    hard.write_text(json.dumps({"machine": "local-cpu", "runs": _under_load(
        machine, synthetic_runs(machine, slower, seed=9), slower)}))
    p = subprocess.run([sys.executable, "-m", "lib.cli", "calibrate", "--score",
                        str(hard)], capture_output=True, text=True,
                       env={**os.environ, "GPUHIVE_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert f"--characterisation {hard}" in p.stdout
    p = subprocess.run([sys.executable, "-m", "lib.cli", "calibrate", "--machine",
                        "hetero-4", "--score", str(path)], capture_output=True,
                       text=True, env={**os.environ, "GPUHIVE_HOME": str(tmp_path)})
    assert p.returncode == 2 and "no saved calibration of hetero-4" in p.stderr


def test_the_contention_exponent_is_fitted_from_runs_under_load(machine):
    # runs whose loaded half got capacity ** 1.5 of their devices, not capacity
    truth = params_with(truth_params(), [_Slot("contention", "cpu")], [1.5])
    runs = _under_load(machine, synthetic_runs(machine, truth, noise=0.005), truth)
    report = calibrate(machine, runs, seed=0)
    assert "contention[cpu]" in report.fitted
    assert report.params.contention["cpu"] == pytest.approx(1.5, rel=0.1)
    assert report.by_load["loaded"]["median_ape_pct"] < 3.0
    # quiet runs alone say nothing of it: it is not fitted, and stays 1
    quiet = calibrate(machine, synthetic_runs(machine, truth_params()), seed=0)
    assert "contention[cpu]" not in quiet.fitted
    assert quiet.params.contention.get("cpu", 1.0) == 1.0
    # it travels with the saved parameters
    again = params_from_json(params_to_json(report.params))
    assert again.contention == report.params.contention


def test_the_contention_exponent_never_goes_below_one(machine):
    """Runs whose loaded shards went faster than their measured capacity says
    (as capacity ** 0.6): the exponent stays at 1, the fair share telemetry
    measured, rather than tell the optimum a busy core is faster than its
    share (the burst is what says a short shard runs free)."""
    truth = params_with(truth_params(), [_Slot("contention", "cpu")], [0.6])
    runs = _under_load(machine, synthetic_runs(machine, truth, noise=0.005), truth)
    report = calibrate(machine, runs, seed=0)
    assert report.params.contention["cpu"] == pytest.approx(1.0)
    # a file fitted before the bound is read as a fit of its runs now gives it
    old = params_to_json(params_with(truth_params(), [_Slot("contention", "cpu")],
                                     [0.5]))
    assert old["contention"]["cpu"] == 0.5
    assert params_from_json(old).contention["cpu"] == 1.0


def test_one_disturbed_run_of_a_quiet_machine_does_not_fit_the_exponent(machine):
    # a quiet characterisation where telemetry saw a process pass during one
    # run, which it did not slow: that run cannot say how load slows a core
    runs = synthetic_runs(machine, truth_params(), noise=0.005)
    runs[1]["disturbance"] = {"capacity": {str(g): 0.5
                                           for g in runs[1]["decision"]["gpus"]}}
    assert _Slot("contention", "cpu") not in slots_for(machine,
                                                       parse_runs(runs, machine))
    report = calibrate(machine, runs, seed=0)
    assert "contention[cpu]" not in report.fitted
    assert report.params.contention.get("cpu", 1.0) == 1.0
    # as many such runs as MIN_LOADED_RUNS do open it
    for run in runs[1:1 + 2 * MIN_LOADED_RUNS:2]:
        run["disturbance"] = {"capacity": {str(g): 0.5
                                           for g in run["decision"]["gpus"]}}
    assert _Slot("contention", "cpu") in slots_for(machine, parse_runs(runs, machine))


def _under_load(machine, runs, truth):
    """Half of ``runs`` re-timed as if taken at capacity 0.3-0.7 of their
    devices under ``truth``, the capacity recorded with them."""
    for i, run in enumerate(runs):
        if i % 2:
            cap = 0.3 + 0.4 * ((i // 2) % 3) / 2  # 0.3, 0.5, 0.7
            table = {str(g): cap for g in run["decision"]["gpus"]}
            parsed = parse_runs([{**run, "disturbance": {"capacity": table}}],
                                machine)[0]
            exact = predict(parsed.task, parsed.decision, machine, None, truth).total
            run["measured_seconds"] *= predict(
                parsed.task, parsed.decision, machine,
                parsed.snapshot(machine, truth), truth).total / exact
            run["disturbance"] = {"capacity": table}
    return runs


def test_the_scheduler_wait_is_fitted_from_runs_under_load(machine):
    # a shard on a shared core waits 0.5 ms per unit of 1/c - 1 before it runs
    truth = params_with(truth_params(), [_Slot("sched_wait", "cpu")], [5e-4])
    runs = _under_load(machine, synthetic_runs(machine, truth, noise=0.005), truth)
    parsed = parse_runs(runs, machine)
    slots = slots_for(machine, parsed)
    assert _Slot("sched_wait", "cpu") in slots
    fast = _FastModel(parsed, machine, slots, _base_like(truth))
    got = fast.predict(np.array([_get(truth, s) for s in slots]))
    want = [predict(r.task, r.decision, machine, r.snapshot(machine), truth).total
            for r in parsed]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    report = calibrate(machine, runs, seed=0)
    assert "sched_wait[cpu]" in report.fitted
    assert report.params.sched_wait["cpu"] == pytest.approx(5e-4, rel=0.15)
    assert report.by_load["loaded"]["median_ape_pct"] < 3.0
    # quiet runs alone leave it off, and the model without it has no wait
    quiet = calibrate(machine, synthetic_runs(machine, truth_params()), seed=0)
    assert "sched_wait[cpu]" not in quiet.fitted and not quiet.params.sched_wait
    again = params_from_json(params_to_json(report.params))
    assert again.sched_wait == report.params.sched_wait


def test_a_woken_shards_free_run_is_fitted_from_runs_under_load(machine):
    # on a shared core a shard runs free for its first 2 ms, then feels the
    # load (and waits 0.3 ms per unit of 1/c - 1): a short shard is not slowed
    truth = params_with(truth_params(), [_Slot("sched_wait", "cpu"),
                                         _Slot("burst_s", "cpu")], [3e-4, 2e-3])
    runs = _under_load(machine, synthetic_runs(machine, truth, noise=0.005), truth)
    parsed = parse_runs(runs, machine)
    slots = slots_for(machine, parsed)
    assert _Slot("burst_s", "cpu") in slots
    fast = _FastModel(parsed, machine, slots, _base_like(truth))
    got = fast.predict(np.array([_get(truth, s) for s in slots]))
    want = [predict(r.task, r.decision, machine, r.snapshot(machine, truth),
                    truth).total for r in parsed]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the burst changes what the loaded runs take: short ones run free
    loaded = [r for r in parsed if r.capacity]
    free = [predict(r.task, r.decision, machine, r.snapshot(machine, truth),
                    truth).total / predict(r.task, r.decision, machine,
                                           r.snapshot(machine), truth).total
            for r in loaded]
    assert min(free) < 0.6 and max(free) > 0.97
    report = calibrate(machine, runs, seed=0, folds=0)
    assert "burst_s[cpu]" in report.fitted
    assert report.params.burst_s["cpu"] == pytest.approx(2e-3, rel=0.2)
    assert report.by_load["loaded"]["median_ape_pct"] < 3.0
    # without the burst the same runs cannot be fitted as well
    blind = fit_module.slots_for

    def without_burst(*args, **kwargs):
        return [s for s in blind(*args, **kwargs) if s.table != "burst_s"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fit_module, "slots_for", without_burst)
        worse = calibrate(machine, runs, seed=0, folds=0)
    assert "burst_s[cpu]" not in worse.fitted
    assert worse.by_load["loaded"]["median_ape_pct"] > \
        2 * report.by_load["loaded"]["median_ape_pct"]
    # quiet runs alone leave it off; it saves and loads
    quiet = calibrate(machine, synthetic_runs(machine, truth_params()), seed=0,
                      folds=0)
    assert "burst_s[cpu]" not in quiet.fitted and not quiet.params.burst_s
    again = params_from_json(params_to_json(report.params))
    assert again.burst_s == report.params.burst_s
    with pytest.raises(CalibrationError, match="burst_s.cpu"):
        params_from_json({**params_to_json(report.params), "burst_s": {"cpu": -1e-4}})


def test_a_stack_of_values_is_predicted_as_each_alone(machine):
    # The fit's numeric Jacobian predicts all its columns in one call: each
    # row of a stack must be what that row alone gives, whether its values
    # have a burst or not, and for a run the shortcut leaves to predict().
    truth = params_with(truth_params(), [_Slot("sched_wait", "cpu"),
                                         _Slot("burst_s", "cpu")], [3e-4, 2e-3])
    runs = _under_load(machine, synthetic_runs(machine, truth, noise=0.0), truth)
    task = TaskSpec("reduce", {"N": 10**6})
    piped = dataclasses.replace(decision_from_weights(task, [0, 1], [1.0, 1.0]),
                                mode="pipelined", chunk=task.split_size // 4)
    runs.append({"task": task.to_json(), "decision": piped.with_hash(task).to_json(),
                 "measured_seconds": 1e-3, "backend": "cpu"})
    parsed = parse_runs(runs, machine)
    slots = slots_for(machine, parsed)
    fast = _FastModel(parsed, machine, slots, _base_like(truth))
    assert fast.slow and fast.fast
    one = np.array([_get(truth, s) for s in slots])
    rows = np.repeat(one[None, :], 4, axis=0)
    burst = slots.index(_Slot("burst_s", "cpu"))
    rows[1, burst] = 0.0                       # no burst in this row
    rows[2, slots.index(_Slot("sched_wait", "cpu"))] *= 3.0
    rows[3, :] *= 1.1
    stacked = fast.predict(rows)
    assert stacked.shape == (4, len(parsed))
    for row, got in zip(rows, stacked, strict=True):
        np.testing.assert_allclose(got, fast.predict(row), rtol=1e-12)
    assert not np.allclose(stacked[0], stacked[1])  # the burst changed something
    # and the Jacobian's columns are one forward difference each
    theta = np.log([v or fit_module._START[s.table] for s, v in zip(slots, one,
                                                                     strict=True)])
    free = np.ones(len(slots), bool)
    free[burst] = False

    def residual(t):
        return np.log(fast.predict(np.exp(t)))

    jac = fit_module._jacobian(residual, theta, residual(theta), free)
    assert jac.shape == (len(parsed), len(slots) - 1)
    for col, p in enumerate(np.flatnonzero(free)):
        moved = theta.copy()
        moved[p] += 1e-5
        np.testing.assert_allclose(jac[:, col], (residual(moved) - residual(theta))
                                   / 1e-5, rtol=1e-6, atol=1e-9)


def test_parameters_that_would_not_load_are_not_saved():
    # a fit gone wrong (here a NaN) is refused by name before anything is
    # written: the calibration saved before stays as it was
    good = default_params()
    path = save_params("local-cpu", good)
    before = path.read_bytes()
    bad = params_with(good, [_Slot("launch_s", "cpu")], [math.nan])
    with pytest.raises(CalibrationError, match=r"not saved.*launch_s\.cpu"):
        save_params("local-cpu", bad)
    assert path.read_bytes() == before
    assert load_params("local-cpu") == good


def test_a_burst_the_fit_could_not_tell_saves_and_loads_as_off(machine):
    # a slot the fit offers and then freezes (the data did not move it) is
    # written at its base value, and a burst's base value is 0: a smoke
    # characterisation taken on a busy machine wrote such a file, and loading
    # it failed, and with it every later use of the machine's calibration
    frozen = _get(default_params(), _Slot("burst_s", "cpu"))
    assert frozen == 0.0
    params = params_with(default_params(), [_Slot("burst_s", "cpu")], [frozen])
    save_params("local-cpu", params)
    again = load_params("local-cpu")
    assert again.burst_s == {"cpu": 0.0}
    # 0 is no free run: the same predictions as no burst at all
    assert calibrated_bursts(machine, again) == {}
    runs = parse_runs(_under_load(machine, synthetic_runs(machine, truth_params()),
                                  truth_params()), machine)
    loaded = [r for r in runs if r.capacity]
    assert loaded
    for r in loaded:
        assert predict(r.task, r.decision, machine, r.snapshot(machine, again),
                       again).total == predict(
            r.task, r.decision, machine,
            r.snapshot(machine, replace(again, burst_s={})), again).total


def test_the_hosts_cost_per_shard_is_fitted_from_runs_on_one_and_two_devices(machine):
    truth = params_with(truth_params(), [_Slot("host_s", "cpu")], [1.5e-4])
    runs = synthetic_runs(machine, truth, noise=0.005)
    parsed = parse_runs(runs, machine)
    slots = slots_for(machine, parsed)
    assert _Slot("host_s", "cpu") in slots
    fast = _FastModel(parsed, machine, slots, _base_like(truth))
    got = fast.predict(np.array([_get(truth, s) for s in slots]))
    want = [predict(r.task, r.decision, machine, None, truth).total for r in parsed]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    report = calibrate(machine, runs, seed=0)
    assert "host_s[cpu]" in report.fitted
    assert report.params.host_s["cpu"] == pytest.approx(1.5e-4, rel=0.2)
    assert report.median_ape_pct < 3.0
    # runs on one device each cannot tell it from the launch: not fitted
    single = [r for r in runs if len(r["decision"]["gpus"]) == 1]
    assert "host_s[cpu]" not in calibrate(machine, single, seed=0).fitted
    again = params_from_json(params_to_json(report.params))
    assert again.host_s == report.params.host_s


def test_a_launch_the_hosts_cost_explains_away_stays_small(machine, monkeypatch):
    # all of a shard's fixed cost is the host's, serial: the fit drives the
    # parallel launch far below its start, where it is insensitive (here by
    # a stricter sensitivity bar); it is kept there, not reset to its 100 us
    # default
    # default. The kinds' own fixed costs are left out of this truth, whose
    # every fixed cost a shard is the host's. (The bar stays below corun's
    # largest effect on a run's log time, zeta / (1 + zeta) = 0.107: at 0.1,
    # whether corun was fitted, and the runs' median APE with it, hung on its
    # third digit.)
    monkeypatch.setattr(fit_module, "MIN_SENSITIVITY", 0.05)
    truth = params_with(truth_params(), [_Slot("launch_s", "cpu"),
                                         _Slot("host_s", "cpu"),
                                         _Slot("fixed_s", ("cpu", "reduce")),
                                         _Slot("fixed_s", ("cpu", "stencil"))],
                        [1e-8, 1.5e-4, 0.0, 0.0])
    report = calibrate(machine, synthetic_runs(machine, truth, noise=0.005), seed=0)
    assert report.params.launch_s["cpu"] < 2e-5
    assert report.params.host_s["cpu"] == pytest.approx(1.5e-4, rel=0.2)
    assert report.median_ape_pct < 3.0


def test_the_part_of_the_kinds_fixed_costs_they_share_is_the_launch(machine):
    # every kind's shard costs 30 us more than the truth says: the runs show
    # the kinds' differences, and the part all of them share goes to the
    # launch, so the cheapest kind's own cost is 0 and the others' are what
    # they add to it
    slots = [_Slot("fixed_s", ("cpu", k)) for k in SIZES]
    extra = params_with(truth_params(), slots,
                        [truth_params().fixed("cpu", k) + 3e-5 for k in SIZES])
    report = calibrate(machine, synthetic_runs(machine, extra), seed=0)
    fixed = {k: report.params.fixed("cpu", k) for k in SIZES}
    assert min(fixed.values()) == 0.0
    assert fixed["reduce"] == pytest.approx(6e-5, rel=0.15)
    assert fixed["stencil"] == pytest.approx(1.2e-4, rel=0.15)
    assert max(fixed[k] for k in ("matmul", "elementwise", "histogram")) < 1e-6
    assert report.median_ape_pct < 3.0
    # moving it changes no prediction, only where the shared part is kept
    moved = fit_module._shared_part_to_launch(extra, slots)
    assert min(moved.fixed_s.values()) == 0.0
    assert moved.launch_s["cpu"] == pytest.approx(extra.launch_s["cpu"] + 3e-5)
    for run in parse_runs(synthetic_runs(machine, extra, noise=0.0), machine)[::7]:
        assert predict(run.task, run.decision, machine, None, moved).total \
            == pytest.approx(run.seconds, rel=1e-12)


def test_a_kinds_fixed_cost_saves_loads_and_is_refused_by_name_when_bad():
    params = replace(default_params(), fixed_s={("cpu", "reduce"): 6e-5,
                                                ("cpu", "matmul"): 0.0})
    obj = params_to_json(params)
    assert obj["fixed_s"] == {"cpu": {"matmul": 0.0, "reduce": 6e-5}}
    assert params_from_json(obj).fixed_s == params.fixed_s
    # a file written before the term was fitted: none
    del obj["fixed_s"]
    assert params_from_json(obj).fixed_s == {}
    obj["fixed_s"] = {"cpu": {"reduce": -1e-5}}
    with pytest.raises(CalibrationError, match=r"fixed_s\.cpu\.reduce"):
        params_from_json(obj, "calibration of local-cpu")


def test_a_term_the_runs_left_off_saves_and_loads(machine):
    # a slot the fit found unidentified keeps its default, 0 for these two
    off = params_with(truth_params(), [_Slot("sched_wait", "cpu"),
                                       _Slot("host_s", "cpu")], [0.0, 0.0])
    again = params_from_json(params_to_json(off))
    assert again.sched_wait == {"cpu": 0.0} and again.host_s == {"cpu": 0.0}
    # a negative one is refused in one line that names it; 0 stays refused
    # for the efficiencies
    bad = params_to_json(off)
    bad["host_s"]["cpu"] = -1e-4
    with pytest.raises(CalibrationError, match=r"host_s\.cpu must be a non-negative"):
        params_from_json(bad)
    bad = params_to_json(off)
    bad["launch_s"]["cpu"] = 0.0
    with pytest.raises(CalibrationError, match=r"launch_s\.cpu must be a positive"):
        params_from_json(bad)


def test_the_cache_and_co_running_terms_save_and_load(machine):
    params = truth_params()
    assert params.cache_bw == {"cpu": 1.5} and params.corun == {"cpu": 0.12}
    again = params_from_json(params_to_json(params))
    assert again.cache_bw == params.cache_bw and again.corun == params.corun
    # a file from before the terms: both off
    old = params_to_json(params)
    del old["cache_bw"], old["corun"]
    assert params_from_json(old).cache_bw == {} and params_from_json(old).corun == {}
    bad = params_to_json(params)
    bad["cache_bw"]["cpu"] = 0.0
    with pytest.raises(CalibrationError, match=r"cache_bw\.cpu must be a positive"):
        params_from_json(bad)
    bad = params_to_json(params)
    bad["corun"]["cpu"] = -0.1
    with pytest.raises(CalibrationError, match=r"corun\.cpu must be a non-negative"):
        params_from_json(bad)


def test_a_machine_without_a_known_cache_fits_no_cache_term(machine):
    blind = dataclasses.replace(machine, devices=tuple(
        dataclasses.replace(d, cache_bytes=0.0) for d in machine.devices))
    runs = parse_runs(synthetic_runs(blind, default_params(), noise=0.0), blind)
    names = {s.name for s in slots_for(blind, runs)}
    assert "cache_bw[cpu]" not in names and "corun[cpu]" in names
    assert "cache_bw[cpu]" in {s.name for s in slots_for(machine, runs)}


def test_the_folds_of_the_cross_validation_are_stratified_and_seeded(machine):
    from lib.costmodel.runs import cv_folds

    runs = parse_runs(synthetic_runs(machine, truth_params(), noise=0.0), machine)
    fold = cv_folds(runs, 5, seed=3)
    assert fold == cv_folds(runs, 5, seed=3) and fold != cv_folds(runs, 5, seed=4)
    for kind in {r.task.kind for r in runs}:
        counts = np.bincount([f for f, r in zip(fold, runs, strict=True)
                              if r.task.kind == kind], minlength=5)
        assert counts.max() - counts.min() <= 1      # each kind dealt evenly
    with pytest.raises(CalibrationError, match="at least 2 folds"):
        cv_folds(runs, 1, seed=0)


def test_the_report_cross_validates_every_run(machine, tmp_path):
    runs = synthetic_runs(machine, truth_params(), noise=0.01)
    report = calibrate(machine, runs, seed=0)
    cv = report.cross_validation
    assert cv["folds"] == 5 and cv["runs"] == len(runs)
    assert cv["median_ape_pct"] < 3.0 and cv["spearman"] > 0.99
    assert "5-fold cross-validation" in report.summary()
    assert report.to_json()["cross_validation"]["runs"] == len(runs)
    # runs the model cannot describe (20 % noise) show in the folds' error too
    noisy = synthetic_runs(machine, truth_params(), noise=0.2)
    assert calibrate(machine, noisy, seed=0).cross_validation["median_ape_pct"] > 8.0
    assert calibrate(machine, runs, seed=0, folds=0).cross_validation == {}
    # the command line refuses one fold in one line
    p = subprocess.run([sys.executable, "-m", "lib.cli", "calibrate", "--folds", "1"],
                       capture_output=True, text=True,
                       env={**os.environ, "GPUHIVE_HOME": str(tmp_path)})
    assert p.returncode == 2 and "--folds 1" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def _reporting(machine, cache_bytes):
    """``machine`` with every device reporting a last-level cache of ``cache_bytes``."""
    return dataclasses.replace(machine, devices=tuple(
        dataclasses.replace(d, cache_bytes=cache_bytes) for d in machine.devices))


@pytest.mark.parametrize("reported", [480 * 2**20, 0.0])
def test_the_cache_size_the_runs_behave_as_if_they_had_is_found(machine, reported):
    """Runs made with a 32 MiB cache, on a machine that reports the host
    chip's 480 MiB (a virtual machine's view) or no size at all: the fit
    finds a size that splits the runs as 32 MiB does, and predicts them."""
    from lib.costmodel.model import fits_cache

    runs = synthetic_runs(machine, truth_params())
    told = _reporting(machine, reported)
    report = calibrate(told, runs, seed=0)
    size = report.params.cache_size["cpu"]
    tasks = [TaskSpec.from_json(r["task"]) for r in runs]
    assert [fits_cache(t, size) for t in tasks] == \
        [fits_cache(t, CACHE_BYTES) for t in tasks]
    assert report.median_ape_pct < 3.0
    assert "cache_bw[cpu]" in report.fitted
    # the size the machine reports, where the runs agree with it, is kept
    assert "cpu" not in calibrate(machine, runs, seed=0).params.cache_size


def test_cache_sizes_tried_stop_at_the_reported_size_and_need_runs_on_each_side(
        machine):
    from lib.costmodel.fit import MIN_CACHE_SIDE, cache_sizes
    from lib.costmodel.model import fits_cache

    runs = parse_runs(synthetic_runs(machine, truth_params()), machine)
    told = _reporting(machine, 480 * 2**20)
    sizes = cache_sizes(told, runs, default_params())["cpu"]
    assert sizes[0] == 0.0                       # none fitting: the term off
    assert all(0 < s <= 480 * 2**20 for s in sizes[1:])
    splits = [tuple(fits_cache(r.task, s) for r in runs) for s in sizes]
    assert len(set(splits)) == len(splits)       # one fit per distinct split
    assert tuple(fits_cache(r.task, 480 * 2**20) for r in runs) not in splits
    for split in splits[1:]:
        assert MIN_CACHE_SIDE <= sum(split) <= len(split) - MIN_CACHE_SIDE


def test_a_fitted_cache_size_saves_loads_and_prices(machine):
    from lib.costmodel.model import cache_factor

    params = dataclasses.replace(truth_params(), cache_size={"cpu": 2.0**20})
    back = params_from_json(params_to_json(params))
    assert back.cache_size == {"cpu": 2.0**20}
    big = TaskSpec("elementwise", {"N": 10**6})    # 12 MB: in 32 MiB, not in 1 MiB
    assert cache_factor(big, machine, 0, truth_params()) == pytest.approx(1.5)
    assert cache_factor(big, machine, 0, back) == 1.0
    old = params_to_json(truth_params())
    del old["cache_size"]                          # a file from before the field
    assert params_from_json(old).cache_size == {}
    bad = dict(old, cache_size={"cpu": -1.0})
    with pytest.raises(CalibrationError,
                       match=r"cache_size\.cpu must be a non-negative"):
        params_from_json(bad)


def test_the_report_says_which_cache_size_the_model_uses(machine):
    report = calibrate(_reporting(machine, 480 * 2**20),
                       synthetic_runs(machine, truth_params()), seed=0)
    size = report.params.cache_size["cpu"] / 2**20
    line = next(n for n in report.notes if "last-level cache" in n)
    assert f"held {size:.0f} MiB (they report 480 MiB)" in line
    assert not any("last-level cache" in n
                   for n in calibrate(machine, synthetic_runs(machine, truth_params()),
                                      seed=0).notes)


def test_a_link_faster_to_start_than_its_profile_says_is_fitted(machine):
    """The profile's latency is an estimate; runs whose copies start three
    times sooner (and whose launch is almost free) are fitted, not
    over-predicted by a fixed cost the launch cannot go below."""
    truth = dataclasses.replace(
        params_with(truth_params(), [_Slot("launch_s", "cpu")], [2e-6]),
        latency_scale={"cpu": 0.3})
    report = calibrate(machine, synthetic_runs(machine, truth), seed=0)
    assert report.median_ape_pct < 3.0
    assert "latency_scale[cpu]" in report.fitted
    lat = machine.host_link(0).latency
    fixed = report.params.launch_s["cpu"] \
        + 2 * lat * report.params.latency_scale["cpu"]
    assert fixed == pytest.approx(2e-6 + 2 * lat * 0.3, rel=0.15)


def test_a_fitted_latency_scale_saves_loads_and_prices(machine):
    from lib.costmodel.model import host_link_terms

    params = dataclasses.replace(truth_params(), latency_scale={"cpu": 0.25})
    back = params_from_json(params_to_json(params))
    assert back.latency_scale == {"cpu": 0.25}
    bw, lat = host_link_terms(machine, 0, back)
    assert lat == pytest.approx(0.25 * machine.host_link(0).latency)
    assert bw == pytest.approx(1.3 * machine.host_link(0).bandwidth)
    tiny = TaskSpec("reduce", {"N": 1})
    dec = decision_from_weights(tiny, [0], [1.0]).with_hash(tiny)
    saved = predict(tiny, dec, machine, None, truth_params()).total \
        - predict(tiny, dec, machine, None, back).total
    assert saved == pytest.approx(0.75 * 2 * machine.host_link(0).latency, rel=1e-6)
    old = params_to_json(truth_params())
    del old["latency_scale"]                       # a file from before the field
    assert params_from_json(old).latency_scale == {}
    with pytest.raises(CalibrationError,
                       match=r"latency_scale\.cpu must be a positive"):
        params_from_json(dict(old, latency_scale={"cpu": 0.0}))


def _on(occasion, runs):
    return [{**r, "occasion": occasion} for r in runs]


def test_runs_are_numbered_by_the_characterisation_that_took_them(machine):
    runs = synthetic_runs(machine, truth_params(), noise=0.0)[:6]
    tagged = _on("b", runs[:2]) + _on("a", runs[2:4]) + runs[4:5] + _on("b", runs[5:])
    assert [r.occasion for r in parse_runs(tagged, machine)] == [0, 0, 1, 1, 2, 0]
    assert {r.occasion for r in parse_runs(runs, machine)} == {0}
    for bad in (3, "", ["a"]):
        with pytest.raises(CalibrationError, match=r"^run 0: occasion must be"):
            parse_runs([{**runs[0], "occasion": bad}], machine)


def test_a_pace_is_offered_only_for_later_occasions_with_enough_runs(machine):
    from lib.costmodel.fit import MIN_OCCASION_RUNS, pace_slots

    runs = synthetic_runs(machine, truth_params(), noise=0.0)
    one = parse_runs(_on("a", runs), machine)
    assert pace_slots(one) == []
    two = parse_runs(_on("a", runs) + _on("b", runs), machine)
    assert pace_slots(two) == [_Slot("pace", 1)]
    few = parse_runs(_on("a", runs) + _on("b", runs[:MIN_OCCASION_RUNS - 1]), machine)
    assert pace_slots(few) == []


def test_a_later_characterisations_pace_is_fitted_and_the_parameters_are_the_firsts(
        machine):
    """The same runs characterised twice, the second time 30 % slower (the
    host busier): pooled, the fit finds the factor and keeps the first
    occasion's parameters; without the occasions it has to split the
    difference and misses both."""
    truth = truth_params()
    first = _on("quiet", synthetic_runs(machine, truth, noise=0.01, seed=1))
    second = [{**r, "measured_seconds": 1.3 * r["measured_seconds"]}
              for r in _on("later", synthetic_runs(machine, truth, noise=0.01,
                                                   seed=2))]
    report = calibrate(machine, first + second, seed=0)
    assert report.paces[1] == pytest.approx(1.3, rel=0.03)
    assert not any(name.startswith("pace") for name in report.fitted)
    assert report.params.e("cpu", "matmul") == pytest.approx(1.6, rel=0.15)
    assert report.params.e_mem("cpu", "histogram") == pytest.approx(0.15, rel=0.15)
    assert report.cross_validation["median_ape_pct"] < 3.0
    assert "1.30x (characterisation 2)" in report.summary()
    assert report.to_json()["paces"]["1"] == pytest.approx(report.paces[1])
    blind = calibrate(machine, [{k: v for k, v in r.items() if k != "occasion"}
                                for r in first + second], seed=0)
    assert blind.paces == {}
    assert blind.cross_validation["median_ape_pct"] > \
        3 * report.cross_validation["median_ape_pct"]


def test_alone_on_each_pairs_a_task_alone_on_a_busy_and_a_free_device():
    from lib.costmodel.runs import MeasuredRun, alone_on_each

    cpu = local_cpu_machine(2)
    a = TaskSpec("reduce", {"N": 1000}, "fp32")
    b = TaskSpec("reduce", {"N": 2000}, "fp32")
    c = TaskSpec("reduce", {"N": 4000}, "fp32")

    def on(task, gpus, seconds, capacity=None, weights=None):
        dec = decision_from_weights(task, gpus, weights or [1.0] * len(gpus))
        return MeasuredRun(task, dec, seconds, "cpu", capacity)

    runs = [on(a, [0], 3e-3, {0: 0.5}), on(a, [1], 1e-3, {1: 1.0}),
            on(a, [0], 9e-3, {0: 0.5}),                    # a second busy run
            on(b, [0], 4e-3, {0: 0.25}),                   # never alone on a free one
            on(b, [0, 1], 1e-3, {0: 0.25, 1: 1.0}),        # two devices: not alone
            on(c, [1], 2e-3), on(c, [0], 5e-3, {0: 1 / 3})]  # no capacity: free
    rows = alone_on_each(runs, cpu)
    assert [r["task"] for r in rows] == [a.describe(), c.describe()]
    first, second = rows
    assert first["slowdown"] == pytest.approx(3.0) and first["capacity_says"] == 2.0
    assert first["free_seconds"] == 1e-3 and first["busy_seconds"] == 3e-3
    assert second["slowdown"] == pytest.approx(2.5)
    assert second["capacity_says"] == pytest.approx(3.0)
    # a device counts as busy below the threshold only
    assert alone_on_each(runs, cpu, busy_below=0.3) == []


def test_a_parameter_the_runs_do_not_determine_is_not_given_a_huge_figure():
    from types import SimpleNamespace

    from lib.costmodel.calibrate import _notes

    (note,) = _notes(SimpleNamespace(not_fitted=[], groups={}),
                     {"corun[cpu]": 0.83, "fixed_s[cpu,reduce]": 949.05,
                      "compute_eff[cpu,matmul]": 0.1})
    assert note.endswith("corun[cpu] (+-83 %), fixed_s[cpu,reduce] (+->1000 %)")


def test_a_profile_path_calibrates_under_the_name_inside_it(tmp_path, monkeypatch):
    """``--machine lab/rig.json`` holding ``"name": "my-rig"``: every run
    records under ``my-rig``, so its characterisation is read, and its
    calibration saved, under that name (they were looked for under the
    path, which nothing writes, and saved where no run would read them)."""
    from lib.platform.machines import load_machine

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path / "home"))
    profile = tmp_path / "lab" / "rig.json"
    profile.parent.mkdir()
    profile.write_text(json.dumps({
        "name": "my-rig", "simulated": False, "real_backends": ["cuda"],
        "devices": [{"catalog": "A100 40GB PCIe"}, {"catalog": "T4"}]}))
    with pytest.raises(CalibrationError, match=(
            r"no characterisation of my-rig at .*my-rig\.json; run: gpuhive "
            rf"characterise --machine {profile}")):
        calibrate_machine(str(profile))
    rig = load_machine(str(profile))
    runs = tmp_path / "home" / "characterisation" / "my-rig.json"
    runs.parent.mkdir(parents=True)
    runs.write_text(json.dumps({"machine": "my-rig",
                                "runs": synthetic_runs(rig, truth_params())}))
    calibrate_machine(str(profile), folds=0)
    assert load_params("my-rig") is not None
    assert not calibration_path(str(profile)).exists()
