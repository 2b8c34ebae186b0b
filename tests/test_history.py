"""The history-based performance model: robust learned rates per device."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import pytest

from lib.cli import history as history_cli
from lib.contract import TaskSpec, decision_from_weights
from lib.costmodel.contention import (
    contention_level,
    effective_snapshot,
    fit_burst,
    similar_level,
)
from lib.costmodel.history import (
    History,
    HistoryError,
    history_path,
    record_run,
    robust_rate,
)
from lib.costmodel.model import default_params, predict, wait_seconds
from lib.costmodel.overhead import (
    FREE_BAND,
    MIN_OVERHEAD_SAMPLES,
    OVERHEAD_CAP,
    OVERHEAD_WINDOW,
    Overheads,
    expected_overhead,
    fold_wait,
    leave_out_waits,
    overhead_snapshot,
)
from lib.costmodel.speed import shard_compute_seconds
from lib.execution.base import ExecutionMetrics, Result
from lib.platform.machines import load_machine, machine_from_json, machine_name
from lib.platform.telemetry import Snapshot, busy
from lib.platform.workloads import workload

TASK = TaskSpec("matmul", {"M": 256, "N": 256, "K": 256})
FLOPS = workload(TASK).total_work(TASK).flops


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))
    return tmp_path


def _run(seconds: dict[int, float], devices=(0,), weights=(1.0,), measured=True,
         task: TaskSpec = TASK) -> tuple:
    dec = decision_from_weights(task, list(devices), list(weights)).with_hash(task)
    metrics = ExecutionMetrics(backend="cpu" if measured else "model",
                               measured=measured, per_device_seconds=seconds,
                               total_seconds=max(seconds.values()))
    return task, dec, Result(None, metrics, task, dec)


def test_rate_is_work_per_second_and_round_trips(home):
    h = History("box")
    assert h.rate("matmul", "fp32", 0) is None and h.runs("matmul", "fp32", 0) == 0
    assert h.update(*_run({0: 0.5})) == [("matmul", "fp32", 0)]
    assert h.rate("matmul", "fp32", 0) == pytest.approx(FLOPS / 0.5)
    assert h.runs("matmul", "fp32", 0) == 1
    path = h.save()
    assert path == history_path("box") == home / "history" / "box.json"
    again = History.load("box")
    assert again.rate("matmul", "fp32", 0) == pytest.approx(FLOPS / 0.5)
    assert again.runs("matmul", "fp32", 0) == 1


def test_predicted_runs_teach_nothing():
    h = History("box")
    with pytest.raises(HistoryError, match="PREDICTED"):
        h.update(*_run({0: 0.5}, measured=False))
    assert len(h) == 0


def test_rate_is_normalised_by_the_capacity_the_device_had():
    loaded = Snapshot("local-cpu", (1.0, 0.0), (1.0, 1.0), (True, True),
                      measured=True, capacity=(0.5, 1.0))
    h = History("box")
    h.update(*_run({0: 2.0}), loaded)      # took twice as long on half a core
    assert h.rate("matmul", "fp32", 0) == pytest.approx(FLOPS / 1.0)
    # A simulated snapshot says nothing about a real run: capacity 1 assumed.
    h2 = History("box")
    h2.update(*_run({0: 2.0}), busy(load_machine("hetero-4"), [0.5] * 4))
    assert h2.rate("matmul", "fp32", 0) == pytest.approx(FLOPS / 2.0)


def test_one_outlier_does_not_poison_the_figure():
    h = History("box")
    for k in range(10):
        h.update(*_run({0: 0.1 * (1 + 0.01 * (k % 3 - 1))}))
    h.update(*_run({0: 10.0}))             # a run 100x slower than the rest
    assert h.rate("matmul", "fp32", 0) == pytest.approx(FLOPS / 0.1, rel=0.03)
    assert h.runs("matmul", "fp32", 0) == 11
    rate, _ = robust_rate([1.0, 1.0, 1.0, 1000.0])
    assert rate < 1.1


def test_split_runs_update_each_device_with_its_shard():
    h = History("box")
    h.update(*_run({0: 0.25, 1: 0.5}, devices=(0, 1), weights=(0.5, 0.5)))
    half = FLOPS / 2
    assert h.rate("matmul", "fp32", 0) == pytest.approx(half / 0.25, rel=0.01)
    assert h.rate("matmul", "fp32", 1) == pytest.approx(half / 0.5, rel=0.01)


def test_malformed_file_is_refused_in_one_line_and_not_overwritten(home):
    path = history_path("box")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(HistoryError) as exc:
        History.load("box")
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    h = History("box")
    h.update(*_run({0: 0.5}))
    with pytest.raises(HistoryError, match="not overwritten"):
        h.save()
    assert path.read_text() == "{not json"


def test_file_of_another_machine_is_refused(home):
    History("box").save()
    path = history_path("box")
    obj = json.loads(path.read_text())
    obj["machine"] = "other"
    path.write_text(json.dumps(obj))
    with pytest.raises(HistoryError, match="'other'"):
        History.load("box")


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    history_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["history", *argv])


def test_cli_shows_rates_and_runs(capsys):
    h = History("box")
    for _ in range(4):
        h.update(*_run({0: 0.5}))
    h.save()
    assert history_cli.run(_cli(["--machine", "box", "--json"])) == 0
    obj = json.loads(capsys.readouterr().out)
    (fig,) = obj["figures"]
    assert fig["runs"] == 4 and fig["label"] == "MEASURED"
    assert fig["rate"] == pytest.approx(FLOPS / 0.5)
    assert history_cli.run(_cli(["--machine", "box"])) == 0
    text = capsys.readouterr().out
    assert "MEASURED" in text and "matmul" in text and " 4" in text


def test_cli_with_no_history(capsys):
    assert history_cli.run(_cli(["--machine", "empty"])) == 0
    text = capsys.readouterr().out
    assert "no MEASURED runs" in text and "recorded for" not in text


def test_cli_with_no_history_names_the_machines_that_have_some(capsys):
    """A mistyped name finds no runs: the answer says whose runs there are."""
    h = History("box")
    h.update(*_run({0: 0.5}))
    h.save()
    assert history_cli.run(_cli(["--machine", "bxo"])) == 0
    assert "runs are recorded for: box" in capsys.readouterr().out
    assert history_cli.run(_cli(["--machine", "bxo", "--json"])) == 0
    assert json.loads(capsys.readouterr().out)["histories_kept"] == ["box"]


def test_cli_forget_removes_a_history_and_says_what_it_held(capsys):
    h = History("box")
    for _ in range(3):
        h.update(*_run({0: 0.5}))
    h.save()
    History("other").save()
    assert history_cli.run(_cli(["--machine", "box", "--forget", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["removed"] is True and out["runs"] == 3
    assert not history_path("box").exists() and history_path("other").exists()
    assert history_cli.run(_cli(["--machine", "box", "--forget"])) == 0
    assert "none to forget" in capsys.readouterr().out


def test_cli_forget_removes_a_malformed_history_the_error_names():
    path = history_path("box")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.raises(HistoryError, match="gpuhive history --machine box --forget"):
        History.load("box")
    assert history_cli.run(_cli(["--machine", "box", "--forget"])) == 0
    assert not path.exists() and len(History.load("box")) == 0


# --------------------------------------------------------------------------
# What shards of a given length felt on a contended device

LOADED = Snapshot("local-cpu", (1.0, 0.0), (1.0, 1.0), (True, True),
                  measured=True, capacity=(1 / 3, 1.0))


def _felt_run(wall: float, cpu: float, devices=(0,), weights=(1.0,)) -> tuple:
    task, dec, result = _run({d: wall for d in devices}, devices, weights)
    metrics = replace(result.metrics, per_device_cpu_seconds={d: cpu for d in devices})
    return task, dec, replace(result, metrics=metrics)


def test_a_shard_on_a_contended_device_records_the_contention_it_felt():
    h = History("box")
    h.update(*_felt_run(wall=0.002, cpu=0.002), LOADED)   # ran as on a free core
    h.update(*_felt_run(wall=0.060, cpu=0.020), LOADED)   # got its third
    h.update(*_felt_run(wall=0.040, cpu=0.020), LOADED)   # got a half
    # each sample keeps the level it was taken at: capacity 1/3, level 2
    assert h.felt[(0, -9)].samples == [(0.002, 0.0, 2.0)]  # 2 ms: octave -9
    assert h.felt[(0, -6)].samples == [(0.02, pytest.approx(1.0), 2.0),
                                       (0.02, pytest.approx(0.5), 2.0)]
    assert h.felt[(0, -6)].runs == 2


def test_nothing_is_felt_without_contention_or_cpu_seconds():
    h = History("box")
    h.update(*_felt_run(wall=0.06, cpu=0.02))                   # no snapshot
    h.update(*_felt_run(wall=0.06, cpu=0.02), Snapshot(
        "local-cpu", (0.0, 0.0), (1.0, 1.0), (True, True), measured=True,
        capacity=(1.0, 1.0)))                                   # free cores
    h.update(*_run({0: 0.06}), LOADED)        # a backend without CPU seconds
    assert h.felt == {}
    assert h.runs("matmul", "fp32", 0) == 3   # the rates still learn


def test_felt_contention_is_clipped_and_round_trips(home):
    h = History("box")
    h.update(*_felt_run(wall=1.0, cpu=0.01), LOADED)   # waited far past a slice
    h.update(*_felt_run(wall=0.009, cpu=0.01), LOADED)  # timer grain: below 0
    assert [[s[1] for s in f.samples] for f in h.felt.values()] == [[2.0, 0.0]]
    h.save()
    again = History.load("box")
    assert again.felt == h.felt


def _burst_samples(b: float, rho_inf: float, lengths) -> list[tuple[float, float]]:
    return [(t, rho_inf * max(0.0, 1 - b / t)) for t in lengths]


def test_the_burst_fit_recovers_a_burst_and_shrugs_off_outliers():
    lengths = list(np.geomspace(1e-4, 0.2, 40))
    clean = fit_burst(0, _burst_samples(3e-3, 0.8, lengths))
    assert clean.b == pytest.approx(3e-3, rel=0.1)
    assert clean.rho_inf == pytest.approx(0.8, rel=0.05)
    assert clean.error < 0.02
    noisy = _burst_samples(3e-3, 0.8, lengths)
    noisy[5] = (noisy[5][0], 2.0)       # a short shard that waited a slice
    noisy[35] = (noisy[35][0], 0.0)     # a long one that ran free
    fit = fit_burst(0, noisy)
    assert fit.b == pytest.approx(3e-3, rel=0.2)
    assert fit.rho_inf == pytest.approx(0.8, rel=0.1)
    assert fit.rho(1e-3) == 0.0 and fit.rho(1.0) == pytest.approx(0.8, rel=0.1)


def test_with_only_short_shards_seen_long_ones_keep_their_capacity():
    fit = fit_burst(0, [(t, 0.0) for t in np.geomspace(1e-4, 2e-3, 12)])
    assert fit.rho_inf == pytest.approx(1.0, abs=0.05)   # the prior's vote
    assert 2e-3 <= fit.b <= 2.3e-3          # just past the longest seen
    assert fit.rho(1e-3) == 0.0 and fit.rho(0.1) > 0.95


def test_the_burst_needs_enough_samples_and_is_per_device():
    h = History("box")
    for t in np.geomspace(1e-3, 0.1, 7):
        h.update(*_felt_run(wall=3 * t, cpu=t), LOADED)
    assert h.burst(0) is None                              # 7 < 8 samples
    h.update(*_felt_run(wall=0.6, cpu=0.2), LOADED)
    assert h.burst(0) is not None
    assert h.burst(0).rho_inf == pytest.approx(1.0, rel=1e-2)
    assert h.burst(1) is None                              # never contended


def test_malformed_felt_entry_is_refused_in_one_line(home):
    h = History("box")
    h.update(*_felt_run(wall=0.06, cpu=0.02), LOADED)
    path = h.save()
    obj = json.loads(path.read_text())
    good = obj["felt"][0]["samples"]
    for bad, says in (([[0.02, 7.5]], "rho must lie"),
                      ([[0.5, 1.0]], "outside octave -6"),
                      ([[0.02, 1.0, -1.0]], "level -1.0 must be"),
                      ([[0.02, 1.0, 2.0, 5.0]], "is not \\[CPU seconds"),
                      ([0.02], "has no len")):
        obj["felt"][0]["samples"] = bad
        path.write_text(json.dumps(obj))
        with pytest.raises(HistoryError, match=f"felt entry 0: .*{says}") as err:
            History.load("box")
        assert "\n" not in str(err.value)
    obj["felt"][0]["samples"] = good
    path.write_text(json.dumps(obj))
    assert History.load("box").felt == h.felt


def test_a_sample_from_a_file_without_levels_is_read_as_of_unknown_level(home):
    h = History("box")
    h.update(*_felt_run(wall=0.06, cpu=0.02), LOADED)
    path = h.save()
    obj = json.loads(path.read_text())
    obj["felt"][0]["samples"] = [s[:2] for s in obj["felt"][0]["samples"]]
    path.write_text(json.dumps(obj))
    old = History.load("box")
    assert old.felt[(0, -6)].samples == [(0.02, pytest.approx(1.0), None)]
    # an unknown level speaks for every level, as before levels were kept
    assert old.felt_samples(0, level=0.25) == old.felt_samples(0, level=4.0) \
        == [(0.02, pytest.approx(1.0))]


LIGHT = Snapshot("local-cpu", (0.2, 0.0), (1.0, 1.0), (True, True),
                 measured=True, capacity=(0.8, 1.0))


def test_the_burst_is_fitted_at_the_present_contention_level():
    # Long shards ran free beside something that read as a fifth of the core
    # (it mostly slept); then a spinner came, and only short shards have run
    # beside it yet. The fit for the spinner's level must not take the light
    # readings' word that long shards run free.
    h = History("box")
    for t in np.geomspace(0.04, 0.1, 10):
        h.update(*_felt_run(wall=t, cpu=t), LIGHT)             # level 0.25
    for t in np.geomspace(2e-4, 1e-3, 10):
        h.update(*_felt_run(wall=t, cpu=t), LOADED)            # level 2
    light = contention_level(0.8)
    heavy = contention_level(1 / 3)
    assert light == pytest.approx(0.25) and heavy == pytest.approx(2.0)
    assert len(h.felt_samples(0, heavy)) == 10 and len(h.felt_samples(0)) == 20
    assert h.burst(0, heavy).b <= 1.2e-3                    # just past 1 ms
    assert h.burst(0, heavy).rho(0.013) > 0.9               # a 13 ms shard
    assert h.burst(0).rho(0.013) == 0.0                     # all levels: free
    assert h.bursts({0: heavy})[0] == h.burst(0, heavy)
    # and the runtime fits at the level its snapshot reads
    machine = load_machine("local-cpu")
    loaded = _first_core_loaded(machine)
    task = TaskSpec("elementwise", {"N": 1 << 22})
    seen = effective_snapshot(task, machine, loaded, default_params(),
                              h.bursts({0: heavy}))
    assert seen.capacity[0] < 0.5


def test_levels_within_a_factor_of_two_are_similar():
    assert similar_level(2.0, 1.0) and similar_level(1.0, 2.0)
    assert not similar_level(0.25, 2.0) and not similar_level(4.5, 2.0)
    assert similar_level(None, 2.0) and similar_level(0.25, None)
    assert similar_level(0.0, 0.0) and not similar_level(0.0, 1.0)


def _first_core_loaded(machine) -> Snapshot:
    """A measured snapshot of ``machine`` with its first device at 1/3."""
    n = machine.n
    return Snapshot(machine.name, (1.0,) + (0.0,) * (n - 1), (1.0,) * n,
                    (True,) * n, measured=True,
                    capacity=(1 / 3,) + (1.0,) * (n - 1))


def test_effective_snapshot_gives_a_short_shard_the_core_and_a_long_one_its_share():
    machine = load_machine("local-cpu")
    loaded = _first_core_loaded(machine)
    h = History("local-cpu")
    for _ in range(4):
        h.update(*_felt_run(wall=2e-4, cpu=2e-4), LOADED)     # short: ran free
        h.update(*_felt_run(wall=0.3, cpu=0.1), LOADED)       # long: a third
    params = default_params()
    short = TaskSpec("elementwise", {"N": 1000})
    long = TaskSpec("elementwise", {"N": 1 << 27})
    seen_short = effective_snapshot(short, machine, loaded, params, h.bursts())
    seen_long = effective_snapshot(long, machine, loaded, params, h.bursts())
    assert seen_short.capacity[0] == pytest.approx(1.0)
    assert seen_long.capacity[0] == pytest.approx(1 / 3, rel=1e-2)
    assert seen_short.capacity[1:] == seen_long.capacity[1:] == loaded.capacity[1:]
    assert "history" in seen_short.capacity_provenance[0]
    # the model then predicts the short shard on the busy core as on a free one
    dec = decision_from_weights(short, [0], [1.0])
    assert predict(short, dec, machine, seen_short, params).total == pytest.approx(
        predict(short, dec, machine, None, params).total)


def test_effective_snapshot_without_history_or_contention_is_the_same_object():
    machine = load_machine("local-cpu")
    loaded = _first_core_loaded(machine)
    params = default_params()
    task = TaskSpec("elementwise", {"N": 1000})
    assert effective_snapshot(task, machine, loaded, params,
                              History("local-cpu").bursts()) is loaded
    h = History("local-cpu")
    for _ in range(8):
        h.update(*_felt_run(wall=0.3, cpu=0.1), LOADED)
    n = machine.n
    free = Snapshot("local-cpu", (0.0,) * n, (1.0,) * n, (True,) * n,
                    measured=True, capacity=(1.0,) * n)
    assert effective_snapshot(task, machine, free, params, h.bursts()) is free
    assert effective_snapshot(task, machine, None, params, h.bursts()) is None


def test_cli_shows_what_shards_felt(capsys):
    h = History("box")
    for _ in range(4):
        h.update(*_felt_run(wall=0.002, cpu=0.002), LOADED)   # 2 ms: ran free
        h.update(*_felt_run(wall=0.060, cpu=0.020), LOADED)   # 20 ms: a third
    h.save()
    assert history_cli.run(_cli(["--machine", "box"])) == 0
    text = capsys.readouterr().out
    assert "what shards felt on busy devices" in text
    assert "1.95 ms-3.91 ms  0.00     4" in text
    assert "15.6 ms-31.2 ms  1.00     4" in text
    assert "device 0 beside capacity 0.20-0.33: runs free for" in text
    assert history_cli.run(_cli(["--machine", "box", "--json"])) == 0
    obj = json.loads(capsys.readouterr().out)
    assert [(f["octave"], f["rho"], f["runs"]) for f in obj["felt"]] == [
        (-9, 0.0, 4), (-6, pytest.approx(1.0), 4)]
    (burst,) = obj["bursts"]
    assert burst["device"] == 0 and burst["samples"] == 8
    assert burst["level"] == pytest.approx(2 ** 1.5)   # level 2's octave
    assert 2e-3 <= burst["b"] <= 2.3e-3
    assert burst["rho_inf"] == pytest.approx(1.0, abs=0.15)


# --------------------------------------------------------------------------
# What a device costs a run beyond its time on the shard

FREE = Snapshot("local-cpu", (0.0, 0.0), (1.0, 1.0), (True, True),
                measured=True, capacity=(1.0, 1.0))


def _overhead_run(over: dict[int, float], task: TaskSpec = TASK) -> tuple:
    devices = sorted(over)
    task, dec, result = _run({d: 0.001 for d in devices}, devices,
                             [1.0] * len(devices), task=task)
    metrics = replace(result.metrics, per_device_overhead_seconds=dict(over))
    return task, dec, replace(result, metrics=metrics)


def test_overheads_are_kept_per_device_and_contention_and_round_trip(home):
    h = History("box")
    h.update(*_overhead_run({0: 4e-4, 1: 3e-4}), FREE)
    h.update(*_overhead_run({0: 9e-3}), LOADED)          # beside two spinners
    h.update(*_overhead_run({0: 5.0}), LOADED)           # a stalled run: capped
    h.update(*_overhead_run({0: 1e-3}))                  # no telemetry: no level
    assert sorted(h.overheads) == [(0, FREE_BAND), (0, 1), (1, FREE_BAND)]
    # no machine and parameters given: the shard's length is unknown (0)
    assert h.overheads[(0, FREE_BAND)].samples == [(4e-4, 0.0, 0.0)]
    assert h.overheads[(0, 1)].samples == [(9e-3, pytest.approx(2.0), 0.0),
                                           (OVERHEAD_CAP, pytest.approx(2.0), 0.0)]
    machine, params = load_machine("local-cpu"), default_params()
    task, dec, result = _overhead_run({0: 4e-4, 1: 3e-4})
    h.update(task, dec, result, FREE, machine, params)
    length = shard_compute_seconds(task, dec, machine, params)[0]
    assert h.overheads[(0, FREE_BAND)].samples[-1] == (4e-4, 0.0,
                                                       pytest.approx(length))
    h.save()
    again = History.load("box")
    assert again.overheads == h.overheads


def test_overheads_are_looked_up_near_the_shards_length():
    # a busy core's worker that ran long shards waits out a time slice before
    # the next; one that ran short ones mostly starts at once
    o = Overheads(0, 1)
    n = MIN_OVERHEAD_SAMPLES
    for _ in range(n):
        o.add(4e-3, 2.0, 200e-3)   # after 200 ms shards: a 4 ms wait
        o.add(3e-4, 2.0, 1e-3)     # after 1 ms shards: 0.3 ms
    assert expected_overhead([o], 0, 2.0, 150e-3) == pytest.approx(4e-3)
    assert expected_overhead([o], 0, 2.0, 0.8e-3) == pytest.approx(3e-4)
    assert expected_overhead([o], 0, 2.0) == pytest.approx((4e-3 + 3e-4) / 2)
    # nothing within three octaves: every length
    assert expected_overhead([o], 0, 2.0, 14e-3) == pytest.approx((4e-3 + 3e-4) / 2)
    # a full window loses the oldest of its most crowded length: a flood of
    # short runs does not push out what the long ones taught
    for k in range(3 * OVERHEAD_WINDOW):
        o.add(3e-4 + k * 1e-9, 2.0, 1e-3)
    assert len(o.samples) == OVERHEAD_WINDOW
    assert sum(1 for s in o.samples if s[2] == 200e-3) == n
    assert min(s[0] for s in o.samples if s[2] == 1e-3) == pytest.approx(
        3e-4 + (3 * OVERHEAD_WINDOW - (OVERHEAD_WINDOW - n)) * 1e-9)   # newest kept
    assert expected_overhead([o], 0, 2.0, 150e-3) == pytest.approx(4e-3)


def test_overheads_written_before_lengths_were_kept_still_read(home):
    h = History("box")
    h.update(*_overhead_run({0: 4e-4}), FREE)
    obj = h.to_json()
    obj["overheads"][0]["samples"] = [[4e-4, 0.0]]
    path = history_path("box")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    assert History.load("box").overheads[(0, FREE_BAND)].samples == [(4e-4, 0.0, 0.0)]


def test_expected_overhead_is_the_mean_at_a_like_level():
    h = History("box")
    for _ in range(MIN_OVERHEAD_SAMPLES - 1):
        h.update(*_overhead_run({0: 4e-4}), LOADED)
        h.update(*_overhead_run({0: 2e-4}), FREE)
    kept = list(h.overheads.values())
    assert expected_overhead(kept, 0, 2.0) is None        # one sample short
    h.update(*_overhead_run({0: 4e-3}), LOADED)            # a long wait
    h.update(*_overhead_run({0: 2e-4}), FREE)
    kept = list(h.overheads.values())
    n = MIN_OVERHEAD_SAMPLES
    assert expected_overhead(kept, 0, 2.0) == pytest.approx(((n - 1) * 4e-4 + 4e-3) / n)
    assert expected_overhead(kept, 0, 0.0) == pytest.approx(2e-4)   # free: apart
    assert expected_overhead(kept, 0, 8.0) is None         # no like level
    assert expected_overhead(kept, 1, 0.0) is None         # another device


def _free(machine):
    n = machine.n
    return Snapshot("local-cpu", (0.0,) * n, (1.0,) * n, (True,) * n,
                    measured=True, capacity=(1.0,) * n)


def test_overhead_snapshot_carries_each_devices_wait_beyond_the_cheapest():
    machine = load_machine("local-cpu")
    h = History("local-cpu")
    for _ in range(MIN_OVERHEAD_SAMPLES):
        h.update(*_overhead_run({0: 5e-4, 1: 3e-4}), FREE)
    kept = list(h.overheads.values())
    n = machine.n
    free = _free(machine)
    seen = overhead_snapshot(free, kept)
    assert seen.wait_s[0] == pytest.approx(2e-4)
    assert seen.wait_s[1:] == (0.0,) * (n - 1)              # the cheapest: none
    assert seen.capacity == free.capacity                   # capacity untouched
    # nothing to carry: no history, one device known, or no snapshot capacity
    assert overhead_snapshot(free, []) is free
    one = History("local-cpu")
    for _ in range(MIN_OVERHEAD_SAMPLES):
        one.update(*_overhead_run({0: 5e-4}), FREE)
    assert overhead_snapshot(free, list(one.overheads.values())) is free
    assert overhead_snapshot(busy(machine, [0.5] + [0.0] * (n - 1)),
                             kept).capacity is None


def test_the_cost_model_adds_a_measured_wait_in_place_of_the_fitted_one():
    machine = load_machine("local-cpu")
    fitted = replace(default_params(), sched_wait={"cpu": 1e-3})
    n = machine.n
    half = replace(_free(machine), capacity=(0.5,) + (1.0,) * (n - 1))
    assert wait_seconds(machine, 0, fitted, half) == pytest.approx(1e-3)
    waits = replace(half, wait_s=(3e-3,) + (0.0,) * (n - 1))
    assert wait_seconds(machine, 0, fitted, waits) == pytest.approx(3e-3)
    assert wait_seconds(machine, 1, fitted, waits) == 0.0
    task = TaskSpec("reduce", {"N": 100_000})
    d = decision_from_weights(task, list(range(n)), [1.0] * n)
    slower = predict(task, d, machine, waits, fitted).devices[0].total \
        - predict(task, d, machine, half, fitted).devices[0].total
    assert slower == pytest.approx(2e-3)


def test_fold_wait_slows_a_waiting_device_for_short_shards_only():
    machine = load_machine("local-cpu")
    params = default_params()
    n = machine.n
    free = replace(_free(machine), wait_s=(2e-4,) + (0.0,) * (n - 1))
    short = TaskSpec("elementwise", {"N": 20_000})
    long = TaskSpec("elementwise", {"N": 1 << 26})
    seen_short = fold_wait(short, machine, free, params)
    seen_long = fold_wait(long, machine, free, params)
    equal = decision_from_weights(short, list(range(n)), [1.0] * n)
    length = predict(short, equal, machine, None, params).devices[0].total
    assert seen_short.capacity[0] == pytest.approx(length / (length + 2e-4))
    assert seen_short.capacity[0] < 0.9
    assert 0.99 < seen_long.capacity[0] < 1.0
    assert seen_short.capacity[1:] == free.capacity[1:]      # the cheapest keeps
    assert "overhead" in seen_short.capacity_provenance[0]
    assert seen_short.wait_s is None                          # folded, not twice
    assert fold_wait(short, machine, _free(machine), params) is not None
    assert fold_wait(short, machine, _free(machine), params).wait_s is None


@pytest.mark.parametrize("task, kept", [
    (TaskSpec("reduce", {"N": 1 << 20}), False),      # shorter than the wait
    (TaskSpec("reduce", {"N": 1 << 28}), True),       # far longer: a share pays
])
def test_a_device_whose_wait_outweighs_its_share_is_left_out(task, kept):
    machine = load_machine("local-cpu")
    params = default_params()
    n = machine.n
    waits = replace(_free(machine), capacity=(0.5,) + (1.0,) * (n - 1),
                    wait_s=(5e-3,) + (0.0,) * (n - 1))
    d = decision_from_weights(task, list(range(n)), [1.0] + [2.0] * (n - 1))
    out = leave_out_waits(task, d, machine, waits, params)
    assert (0 in out.gpus) is kept
    before = predict(task, d, machine, waits, params).total
    after = predict(task, out, machine, waits, params).total
    assert after <= before
    if not kept:
        assert after < before and out.gpus == tuple(range(1, n))
        assert out.shares == pytest.approx((1.0 / (n - 1),) * (n - 1))
    # no waits: the decision as it came
    assert leave_out_waits(task, d, machine, _free(machine), params) is d


def test_the_learned_policy_leaves_out_a_busy_core_for_a_short_task():
    from lib.policies.learned import load_policy
    machine = load_machine("local-cpu")
    n = machine.n
    busy_core = replace(_free(machine), capacity=(0.2,) + (1.0,) * (n - 1),
                        free_bytes=tuple(d.mem_bytes for d in machine.devices))
    waiting = replace(busy_core, wait_s=(5e-3,) + (0.0,) * (n - 1))
    policy = load_policy()
    task = TaskSpec("reduce", {"N": 1_322_556})
    assert 0 in policy.decide(task, machine, busy_core).gpus   # a share there
    assert 0 not in policy.decide(task, machine, waiting).gpus  # not worth it
    long = TaskSpec("reduce", {"N": 1 << 28})
    assert 0 in policy.decide(long, machine, waiting).gpus


def test_the_runtime_shows_the_policy_a_dearer_device(home):
    from lib.policies.registry import make_policy
    from lib.runtime import Agent
    machine = load_machine("local-cpu")
    h = History("local-cpu")
    for _ in range(MIN_OVERHEAD_SAMPLES):
        h.update(*_overhead_run({0: 8e-4, 1: 3e-4}), FREE)
    h.save()
    agent = Agent(policy=make_policy("equal", 0), machine=machine, backend="model",
                  telemetry=_free(machine))
    seen = agent.seen_by_policy(TaskSpec("reduce", {"N": 10_000}))
    assert seen.wait_s[0] == pytest.approx(5e-4) and seen.wait_s[1] == 0.0
    assert seen.capacity == (1.0,) * machine.n


@pytest.mark.parametrize("entry, says", [
    ({"device": 0, "band": -99, "runs": 1, "samples": [[-1e-4, 0.0]]}, "band -99"),
    ({"device": 0, "band": -99, "runs": 1, "samples": [[1e-4, 2.0]]}, "band -99"),
    ({"device": 0, "band": 1, "runs": 0, "samples": [[1e-4, 2.0]]}, "runs 0"),
    ({"device": "0", "band": 1, "runs": 1, "samples": [[1e-4, 2.0]]}, "device '0'"),
    ({"device": 0, "band": 1, "runs": 1, "samples": []}, "no samples"),
    ({"device": 0, "band": 1, "runs": 1, "samples": [[1e-4, 2.0, 1e-3, 7.0]]},
     "is not (seconds, level, length)"),
    ({"device": 0, "band": 1, "runs": 1, "samples": [[1e-4, 2.0, -1e-3]]},
     "does not fit band 1"),
])
def test_malformed_overhead_entry_is_refused_in_one_line(home, entry, says):
    h = History("box")
    h.update(*_overhead_run({0: 4e-4}), FREE)
    obj = h.to_json()
    obj["overheads"] = [entry]
    path = history_path("box")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    with pytest.raises(HistoryError) as err:
        History.load("box")
    msg = str(err.value)
    assert "overhead entry 0" in msg and says in msg and "\n" not in msg
    assert json.loads(path.read_text())["overheads"] == [entry]   # left as it was


def test_cli_shows_the_overheads(capsys):
    h = History("box")
    for seconds in (3e-4, 4e-4, 5e-4, 2e-3):
        h.update(*_overhead_run({0: seconds}), LOADED)
    h.save()
    assert history_cli.run(_cli(["--machine", "box"])) == 0
    text = capsys.readouterr().out
    assert "overhead beyond the shard (MEASURED)" in text
    row = next(line for line in text.splitlines()
               if line.strip().startswith("0 beside capacity"))
    # mean 0.8 ms, median 0.45 ms, four samples, four runs
    assert row.split()[-6:] == ["800", "us", "450", "us", "4", "4"]


def test_recording_runs_parses_the_file_once_and_keeps_it_whole(home, monkeypatch):
    """The runtime's learning step: the history it wrote is updated in memory
    while the file holds what it wrote, and the file always holds every run."""
    from lib.costmodel import history as history_module

    machine = load_machine("local-cpu")
    parsed = []
    real_read = history_module._read
    monkeypatch.setattr(history_module, "_read",
                        lambda *a, **k: parsed.append(a[0]) or real_read(*a, **k))
    for seconds in (0.5, 0.25, 0.125):
        record_run(*_run({0: seconds}), None, machine, default_params())
    assert parsed == []                                 # never read back
    assert History.peek("local-cpu").runs("matmul", "fp32", 0) == 3
    assert parsed == []                                 # nor by the next decision
    monkeypatch.setattr(history_module, "_read", real_read)
    on_disk = History.load("local-cpu")
    assert on_disk.runs("matmul", "fp32", 0) == 3
    assert on_disk.to_json() == History.peek("local-cpu").to_json()


def test_a_history_changed_by_another_writer_is_read_before_a_run_is_added(home):
    machine = load_machine("local-cpu")
    record_run(*_run({0: 0.5}), None, machine, default_params())
    other = History.load("local-cpu")               # another process's runs
    other.update(*_run({1: 0.5}, devices=(1,)))
    other.save()
    record_run(*_run({0: 0.25}), None, machine, default_params())
    back = History.load("local-cpu")
    assert back.runs("matmul", "fp32", 0) == 2 and back.runs("matmul", "fp32", 1) == 1


def test_recording_a_run_refuses_a_malformed_history_and_leaves_it(home):
    machine = load_machine("local-cpu")
    record_run(*_run({0: 0.5}), None, machine, default_params())
    path = history_path("local-cpu")
    path.write_text("{not json")                    # damaged between two runs
    with pytest.raises(HistoryError) as exc:
        record_run(*_run({0: 0.25}), None, machine, default_params())
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    assert path.read_text() == "{not json"
    path.unlink()
    with pytest.raises(HistoryError, match="teaches nothing"):
        record_run(*_run({0: 0.25}, measured=False), None, machine, default_params())


# --------------------------------------------------------------------------
# The devices the figures were learned on

def _box(second: str = "T4", name: str = "my-box") -> dict:
    return {"name": name, "description": "a profile of one's own",
            "devices": [{"catalog": "H100 SXM"}, {"catalog": second}]}


def _two_device_run(machine) -> tuple:
    task, dec, result = _run({0: 0.01, 1: 0.02}, devices=(0, 1), weights=(0.5, 0.5))
    return task, dec, result, None, machine, default_params()


def test_what_was_learned_of_a_replaced_card_is_not_used_and_then_forgotten():
    """A profile edited under its name to swap the T4 for an A100: the T4's
    figures are not applied to the A100, and the next run forgets them; the
    H100 at index 0 keeps what it learned."""
    t4 = machine_from_json(_box("T4"))
    a100 = machine_from_json(_box("A100 40GB PCIe"))
    for _ in range(3):
        record_run(*_two_device_run(t4))
    seen = History.peek("my-box")
    assert seen.stale(t4) == {}
    assert seen.fitting(t4) is seen
    stale = seen.stale(a100)
    assert list(stale) == [1] and "1:T4" in stale[1] and "1:A100 40GB PCIe" in stale[1]
    fitted = seen.fitting(a100)
    assert fitted.rate("matmul", "fp32", 1) is None
    assert fitted.rate("matmul", "fp32", 0) == seen.rate("matmul", "fp32", 0)
    assert seen.runs("matmul", "fp32", 1) == 3       # the shared object is untouched
    record_run(*_two_device_run(a100))
    kept = History.load("my-box")
    assert kept.runs("matmul", "fp32", 0) == 4
    assert kept.runs("matmul", "fp32", 1) == 1
    assert kept.devices[1].identity == a100.devices[1].identity
    assert kept.devices[1].label == "1:A100 40GB PCIe"
    assert kept.stale(a100) == {} and list(kept.stale(t4)) == [1]


def test_a_machine_with_fewer_devices_leaves_out_the_others():
    h = History("my-box")
    two = machine_from_json(_box())
    h.adopt(two)
    h.update(*_two_device_run(two)[:3])
    one = machine_from_json({"name": "my-box", "devices": [{"catalog": "H100 SXM"}]})
    stale = h.stale(one)
    assert list(stale) == [1] and "has 1 device(s) now" in stale[1]
    assert h.fitting(one).rate("matmul", "fp32", 1) is None
    assert h.adopt(one) == stale and h.rate("matmul", "fp32", 1) is None
    assert h.rate("matmul", "fp32", 0) is not None


def test_a_history_written_before_identities_is_taken_as_the_same_devices():
    h = History("my-box")
    h.update(*_two_device_run(machine_from_json(_box()))[:3])
    h.save()
    obj = json.loads(history_path("my-box").read_text())
    assert obj["devices"] == []
    again = History.load("my-box")
    assert again.stale(machine_from_json(_box("A100 40GB PCIe"))) == {}


def test_a_local_cluster_worker_keeps_its_identity_on_another_port():
    core = load_machine("local-cpu").devices[0]
    here = replace(core, name="dask worker tcp://127.0.0.1:36799")
    assert here.identity == replace(core, name="dask worker tcp://127.0.0.1:4101").identity
    assert here.identity != replace(core, name="dask worker tcp://10.0.0.7:36799").identity
    assert here.identity != replace(here, peak_fp32=2 * here.peak_fp32).identity
    assert here.identity == replace(here, mem_bytes=here.mem_bytes / 2).identity


@pytest.mark.parametrize("entry, says", [
    ({"index": -1, "identity": "0123456789ab"}, "index -1"),
    ({"index": 0, "identity": "xyz"}, "12 hex digits"),
    ({"identity": "0123456789ab"}, "index"),
])
def test_a_malformed_devices_entry_is_refused_in_one_line(entry, says):
    h = History("my-box")
    h.update(*_run({0: 0.5}))
    h.save()
    obj = json.loads(history_path("my-box").read_text())
    obj["devices"] = [entry]
    history_path("my-box").write_text(json.dumps(obj))
    with pytest.raises(HistoryError, match=f"device entry 0: .*{says}") as info:
        History.load("my-box")
    assert "\n" not in str(info.value)


def test_the_agent_says_what_of_the_history_it_leaves_out(tmp_path):
    t4, a100 = machine_from_json(_box("T4")), machine_from_json(_box("A100 40GB PCIe"))
    record_run(*_two_device_run(t4))
    from lib.runtime import Agent
    assert not any("history" in n for n in Agent(policy="equal", machine=t4).notes())
    (note,) = [n for n in Agent(policy="equal", machine=a100).notes() if "history" in n]
    assert "my-box" in note and "learned on 1:T4, now 1:A100 40GB PCIe" in note


def test_cli_reads_a_profile_path_under_the_name_inside_it(tmp_path, capsys):
    """Runs record under the profile's own name; ``--machine FILE`` shows them
    (it looked for a history named after the path), and marks a device the
    file no longer has."""
    record_run(*_two_device_run(machine_from_json(_box("T4"))))
    path = tmp_path / "lab" / "box.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_box("A100 40GB PCIe")))
    assert machine_name(str(path)) == "my-box"
    assert machine_name("dask://host:8786") == "dask://host:8786"
    assert machine_name("local-cpu") == "local-cpu"
    assert history_cli.run(_cli(["--machine", str(path), "--json"])) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["machine"] == "my-box" and len(obj["figures"]) == 2
    assert list(obj["stale"]) == ["1"]
    assert history_cli.run(_cli(["--machine", str(path)])) == 0
    assert "NOT USED: device 1 (learned on 1:T4" in capsys.readouterr().out
