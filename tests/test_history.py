"""The history-based performance model: robust learned rates per device."""

from __future__ import annotations

import argparse
import json

import pytest

from lib.cli import history as history_cli
from lib.contract import TaskSpec, decision_from_weights
from lib.costmodel.history import (
    History,
    HistoryError,
    history_path,
    model_rate,
    params_with_history,
    robust_rate,
)
from lib.costmodel.model import default_params, predict
from lib.execution.base import ExecutionMetrics, Result
from lib.platform.machines import load_machine
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


def test_no_history_leaves_params_and_predictions_unchanged():
    machine = load_machine("local-cpu")
    params = default_params()
    assert params_with_history(params, History("local-cpu"), machine) is params
    h = History("local-cpu")
    h.update(*_run({0: 0.5}))              # one run: below MIN_RUNS
    assert params_with_history(params, h, machine) is params


def test_learned_rate_corrects_the_device():
    machine = load_machine("local-cpu")
    params = default_params()
    assumed = model_rate(machine, params, "matmul", "fp32", 0)
    h = History("local-cpu")
    for _ in range(3):                     # the device gives half the assumed rate
        h.update(*_run({0: FLOPS / (assumed / 2)}))
    corrected = params_with_history(params, h, machine)
    assert corrected.device_eff[(0, "matmul", "fp32")] == pytest.approx(0.5)
    assert "history" in corrected.source
    dec = decision_from_weights(TASK, [0], [1.0]).with_hash(TASK)
    before = predict(TASK, dec, machine, None, params).devices[0].t_comp
    after = predict(TASK, dec, machine, None, corrected).devices[0].t_comp
    assert after == pytest.approx(2 * before)


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
    assert "no MEASURED runs" in capsys.readouterr().out
