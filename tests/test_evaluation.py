"""The evaluation harness: task set, bounds, Table 4, targets, labels."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import numpy as np
import pytest

from lib.contract import KINDS, TaskSpec
from lib.evaluation import evaluate, protocol
from lib.evaluation.protocol import (
    MAX_ROUNDS,
    _measure,
    _rounds,
    figure_of,
    physical_limit,
)
from lib.evaluation.report import EvalReport, Row
from lib.execution import get_backend
from lib.execution.base import run_key
from lib.platform.machines import load_machine
from lib.platform.telemetry import busy
from lib.platform.workloads import workload
from lib.policies.oracle import optimum
from lib.policies.registry import make_policy
from lib.runtime import Agent
from lib.scoring import bootstrap_ci, geomean, task_set


def _work(task):
    w = workload(task).total_work(task)
    return max(w.flops, w.mem_traffic)


@pytest.mark.parametrize("backend", ["model", "cpu"])
def test_task_set_spans_four_orders_of_magnitude(backend):
    tasks = task_set(backend, "quick", seed=0)
    assert {t.kind for t in tasks} == set(KINDS)
    for kind in KINDS:
        work = [_work(t) for t in tasks if t.kind == kind]
        assert max(work) / min(work) >= 1e4, kind
    assert task_set(backend, "quick", seed=0) == tasks
    assert task_set(backend, "quick", seed=1) != tasks


def test_physical_limit_bounds_the_optimum(hetero4):
    snap = busy(hetero4, [0.7, 0, 0, 0])
    for task in task_set("model", "quick"):
        limit = physical_limit(task, hetero4, snap)
        assert 0 < limit <= optimum(task, hetero4, snap).total, task.describe()


def test_statistics():
    assert geomean([1, 4]) == pytest.approx(2.0)
    lo, hi = bootstrap_ci([1.0, 2.0, 4.0, 8.0], seed=0)
    assert 1.0 <= lo < geomean([1, 2, 4, 8]) < hi <= 8.0
    assert all(math.isnan(v) for v in bootstrap_ci([2.0]))


@pytest.fixture(scope="module")
def smoke_report():
    return evaluate("hetero-4", "model", "smoke", seed=0, progress=False)


def test_table4_and_labels(smoke_report):
    r = smoke_report
    assert not r.measured and r.label == "PREDICTED (model)"
    names = [t["policy"] for t in r.table4]
    for baseline in ("equal", "single-best", "proportional-peak",
                     "proportional-live", "heft", "random", "oracle"):
        assert baseline in names
    eq = next(t for t in r.table4 if t["policy"] == "equal")
    oracle = next(t for t in r.table4 if t["policy"] == "oracle")
    assert eq["speedup"] == pytest.approx(1.0)
    assert oracle["ratio_to_optimum"] == pytest.approx(1.0, rel=1e-9)
    assert oracle["speedup"] >= max(t["speedup"] for t in r.table4) - 1e-9
    assert all(row.label == "PREDICTED (model)" for row in r.rows if row.accepted)


def test_the_best_of_the_policies_per_task_bounds_every_policy(smoke_report):
    r = smoke_report
    best = r.best_per_state()
    per_state = r.per_state()
    assert set(best) == {row.state for row in r.rows}
    for state, value in best.items():
        # each task's best is at least every policy's figure on it, so its
        # geometric mean is at least every policy's, equal split's 1 included
        assert value >= max(by[state] for by in per_state.values()) - 1e-12
        assert value >= 1.0 - 1e-12
    # and it is the task-by-task maximum, not the best policy's mean
    state = next(iter(best))
    tasks = {row.task.describe() for row in r.rows if row.state == state}
    top = [max(row.speedup for row in r.rows
               if row.state == state and row.task.describe() == t) for t in tasks]
    assert best[state] == pytest.approx(float(np.exp(np.mean(np.log(top)))))
    assert r.to_json()["best_per_state"] == pytest.approx(best)


def test_targets_are_one_line_each(smoke_report):
    lines = [t.line() for t in smoke_report.targets]
    assert [line.split()[0] for line in lines] == [f"T{i}" for i in range(1, 8)]
    assert all(line.split()[1] in ("PASS", "FAIL") for line in lines)
    text = smoke_report.to_text()
    assert "WARNING" in text and all(line in text for line in lines)


def test_json_and_markdown(smoke_report):
    out = json.loads(json.dumps(smoke_report.to_json(), default=str))
    for key in ("table4", "ablations", "transfer", "targets", "rows"):
        assert key in out
    assert smoke_report.to_markdown().startswith("> **Warning: PREDICTED.**")


@pytest.mark.serial
def test_measured_rows_on_local_cpu(monkeypatch):
    # three shuffled rounds a task, not twenty-five: what is checked here is
    # the labels, the induced states and the shared runs, not the medians
    monkeypatch.setattr(protocol, "MAX_ROUNDS", 3)
    r = evaluate("local-cpu", "cpu", "smoke", seed=0, progress=False)
    assert r.measured and r.label == "MEASURED (cpu)"
    labels = {row.label for row in r.rows if row.accepted}
    assert labels == {"MEASURED (cpu)"}
    assert not r.to_markdown().startswith("> **Warning")
    states = [row.state for row in r.rows]
    assert list(dict.fromkeys(states)) == ["idle", "loaded-1", "loaded-2", "load-mid"]
    # the induced load is there, and the telemetry the policies saw says so
    cap = {s: [row.capacity[0] for row in r.rows if row.state == s] for s in states}
    assert max(cap["loaded-2"]) < 0.6 and max(cap["loaded-1"]) < 0.75
    half = len(cap["load-mid"]) // 2
    assert statistics.median(cap["load-mid"][half:]) \
        < statistics.median(cap["load-mid"][:half])
    assert any("induced" in n for n in r.notes)
    # the feature ablations are PREDICTED on every backend; the two short
    # trainings (which would run a measured stage here) are left out
    variants = [a["variant"] for a in r.ablations]
    assert variants == ["full", "no telemetry features", "no topology features",
                        "no action mask"]
    assert {a["label"] for a in r.ablations} == {"PREDICTED (model)"}
    text = r.to_text()
    assert "Speedup over equal split per state (MEASURED (cpu))" in text
    assert "from the medians of the rounds" in text
    # policies that decided alike share the runs of that decision
    seen: dict[tuple, float] = {}
    for row in r.rows:
        if row.accepted:
            key = (row.state, json.dumps(row.task.to_json(), sort_keys=True),
                   row.decision["config_hash"])
            assert seen.setdefault(key, row.seconds) == row.seconds, key
    assert len(seen) < sum(row.accepted for row in r.rows)
    # each row keeps its rounds, whose trimmed mean is its figure, with
    # their median and the equal split's beside it
    for row in r.rows:
        if row.accepted:
            assert len(row.rounds) >= 1
            assert row.seconds == pytest.approx(figure_of(row.rounds))
            assert row.median_seconds == pytest.approx(statistics.median(row.rounds))
        assert row.equal_median_seconds is not None
    by_median = r.per_state(by_median=True)
    assert set(by_median) == set(r.per_state())
    assert by_median["equal"] == pytest.approx(
        {s: 1.0 for s in ("idle", "loaded-1", "loaded-2", "load-mid")})


def test_the_figure_is_a_trimmed_mean_and_sees_both_modes():
    # bimodal rounds (a shard that started at once or after another
    # process's time slice): the median sits in one mode, the figure
    # weighs both
    fast, slow = [1.0] * 12, [5.0] * 13
    assert statistics.median(fast + slow) == 5.0
    assert figure_of(fast + slow) == pytest.approx((10 * 1.0 + 11 * 5.0) / 21)
    assert figure_of(fast + [5.0] * 11 + [1.0, 1.0]) == pytest.approx(
        (12 * 1.0 + 9 * 5.0) / 21)
    # one run stalled by something else entirely does not decide it
    calm = [2.0] * 24
    assert figure_of(calm + [500.0]) == pytest.approx(2.0)
    # under ten rounds nothing is cut
    assert figure_of([1.0, 2.0, 6.0]) == pytest.approx(3.0)


class _Clock:
    """A backend that times nothing: each run's 'seconds' is the next of a
    given sequence, and every call is logged (warm-ups included)."""

    name, measured = "clock", False

    def __init__(self, machine, seconds):
        self.model = get_backend("model", machine)
        self.seconds, self.calls = list(seconds), []

    def run(self, task, decision, *, verify=False):
        result = self.model.run(task, decision)
        self.calls.append(decision.config_hash)
        return dataclasses.replace(result, metrics=dataclasses.replace(
            result.metrics, total_seconds=self.seconds.pop(0)))

    def close(self):
        pass


def test_short_tasks_get_more_rounds_within_their_time():
    assert _rounds(3, 0.2) == 3                 # long: the budget's repeats
    assert _rounds(3, 0.05) == 5                # 0.25 s of 50 ms runs
    assert _rounds(3, 0.0005) == MAX_ROUNDS     # capped
    assert _rounds(1, 0.1) == 2 and _rounds(5, 0.1) == 5


def test_measure_interleaves_rounds_and_shares_identical_decisions(monkeypatch):
    # rounds = repeats whatever the warm-ups took
    monkeypatch.setattr(protocol, "ROUND_SECONDS", 0.0)
    machine = load_machine("hetero-4")
    task = task_set("model", "smoke", 0)[0]
    # warm-ups (two distinct decisions), then three rounds of two runs
    clock = _Clock(machine, [9.0, 9.0, 1.0, 2.0, 5.0, 3.0, 4.0, 6.0])
    decided = {}
    for name in ("equal", "proportional-peak", "equal-again"):
        agent = Agent(policy=make_policy(name.removesuffix("-again"), 0),
                      machine=machine, backend=clock)
        decided[name] = (agent, agent.optimize(task), 1.0)
    a = decided["equal"][1].config_hash
    b = decided["proportional-peak"][1].config_hash
    assert a != b and decided["equal-again"][1].config_hash == a
    out = _measure(task, decided, clock, repeats=3, bar=None)
    # warm-ups a, b; round 0 in the policies' order; rounds 1, 2 each run
    # both once, in an order of their own
    calls = clock.calls
    assert calls[:4] == [a, b, a, b]
    assert sorted(calls[4:6]) == sorted(calls[6:8]) == sorted([a, b])
    seconds = [1.0, 2.0, 5.0, 3.0, 4.0, 6.0]
    for h in (a, b):
        mine = [t for c, t in zip(calls[2:], seconds, strict=True) if c == h]
        # under ten rounds the figure is their plain mean; the rounds
        # themselves come back in the order they ran
        assert out[h][0] == pytest.approx(sum(mine) / 3)
        assert list(out[h][2]) == mine
    assert set(out) == {a, b}


def test_rounds_vary_the_order(monkeypatch):
    # On a busy core a run is slowed or spared by when it arrives and by
    # what ran before it: after the first round, each round runs the
    # distinct decisions in an order of its own (no decision always follows
    # the same one), the same orders for the same task.
    monkeypatch.setattr(protocol, "ROUND_SECONDS", 0.0)
    machine = load_machine("hetero-4")
    task = task_set("model", "smoke", 0)[0]

    def calls_of():
        clock = _Clock(machine, [1.0] * 4 * 13)
        decided = {}
        for name in ("equal", "proportional-peak", "single-best", "random"):
            agent = Agent(policy=make_policy(name, 0), machine=machine,
                          backend=clock)
            decided[name] = (agent, agent.optimize(task), 1.0)
        _measure(task, decided, clock, repeats=12, bar=None)
        keys = list(dict.fromkeys(d.config_hash for _, d, _ in decided.values()))
        return keys, clock.calls[4:]                 # the rounds

    keys, calls = calls_of()
    assert len(keys) == 4
    rounds = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert len(rounds) == 12 and all(sorted(r) == sorted(keys) for r in rounds)
    assert rounds[0] == keys
    before = {k: {r[r.index(k) - 1] for r in rounds if r.index(k)} for k in keys}
    assert all(len(v) >= 2 for v in before.values()), before
    assert calls_of()[1] == calls                    # reproducible


def test_decisions_the_backend_runs_alike_share_their_runs(monkeypatch):
    # On the cpu backend the mode, chunk and block do not change what the
    # workers do: the same rows on the same devices are one run, whatever
    # the hash. Two decisions with other rows are two.
    from lib.contract import decision_from_weights
    from lib.execution.cpu import CpuBackend
    monkeypatch.setattr(protocol, "ROUND_SECONDS", 0.0)
    machine = load_machine("local-cpu")
    task = task_set("cpu", "smoke", 0)[0]
    split = decision_from_weights(task, [0, 1], [1.0, 1.0]).with_hash(task)
    piped = dataclasses.replace(split, mode="pipelined",
                                chunk=max(1, task.split_size // 4)).with_hash(task)
    other = decision_from_weights(task, [0, 1], [3.0, 1.0]).with_hash(task)
    assert len({split.config_hash, piped.config_hash, other.config_hash}) == 3
    cpu = CpuBackend(machine)          # never started: only its run_key is used
    assert run_key(cpu, task, split) == run_key(cpu, task, piped)
    assert run_key(cpu, task, split) != run_key(cpu, task, other)

    class _CpuClock(_Clock):
        run_key = staticmethod(cpu.run_key)

    clock = _CpuClock(machine, [9.0, 9.0, 1.0, 2.0, 5.0, 3.0, 4.0, 6.0])
    agent = Agent(policy=make_policy("equal", 0), machine=machine, backend=clock)
    decided = {"a": (agent, split, 1.0), "b": (agent, piped, 1.0),
               "c": (agent, other, 1.0)}
    out = _measure(task, decided, clock, repeats=3, bar=None)
    calls = clock.calls
    assert calls[:4] == [split.config_hash, other.config_hash] * 2
    assert len(calls) == 8 and calls.count(split.config_hash) == 4
    assert out[split.config_hash] == out[piped.config_hash]
    seconds = [1.0, 2.0, 5.0, 3.0, 4.0, 6.0]
    for h in (split.config_hash, other.config_hash):
        mine = [t for c, t in zip(calls[2:], seconds, strict=True) if c == h]
        assert out[h][0] == pytest.approx(sum(mine) / 3)
    # a backend without run_key tells decisions apart by their hash
    assert run_key(object(), task, split) == split.config_hash


def test_no_optimum_leaves_out_the_oracle_and_says_t2_cannot_pass(monkeypatch):
    # the ablations (two short trainings) do not depend on the flag: skipped
    monkeypatch.setattr(protocol, "run_ablations", lambda *args, **kwargs: [])
    report = evaluate("hetero-4", "model", "smoke", seed=0, progress=False,
                      with_optimum=False)
    assert "oracle" not in {r.policy for r in report.rows}
    assert all(r.optimum_seconds is None for r in report.rows)
    t2 = next(t for t in report.targets if t.id == "T2")
    assert not t2.passed and "no optimum" in t2.value
    assert any("--no-optimum" in n for n in report.notes)


def _row(policy, n, state, seconds, equal=10.0, accepted=True):
    return Row(policy=policy, task=TaskSpec("reduce", {"N": n}), state=state,
               seconds=seconds, equal_seconds=equal, optimum_seconds=None,
               limit_seconds=1.0, decide_us=1.0, accepted=accepted,
               label="MEASURED (cpu)")


def test_head_to_head_compares_two_policies_task_by_task_under_load():
    rows = [_row("rl-ppo", 1000, "loaded-1", 4.0),
            _row("oracle", 1000, "loaded-1", 5.0),
            _row("rl-ppo", 2000, "loaded-1", 6.0),
            _row("oracle", 2000, "loaded-1", 3.0),
            _row("rl-ppo", 3000, "loaded-2", 2.0),
            _row("oracle", 3000, "loaded-2", 2.0),
            # idle is left out by default; a third policy never counts
            _row("rl-ppo", 1000, "idle", 1.0), _row("oracle", 1000, "idle", 9.0),
            _row("heft", 1000, "loaded-1", 0.1),
            # a task only one of the two decided is no pair
            _row("rl-ppo", 4000, "loaded-1", 1.0)]
    report = EvalReport(machine="local-cpu", backend="cpu", budget="smoke", seed=0,
                        measured=True, rows=rows, table4=[], ablations=[],
                        transfer=[], targets=[], notes=[], seconds=0.0)
    h = report.head_to_head("rl-ppo", "oracle")
    assert h["states"] == ["loaded-1", "loaded-2"] and h["tasks"] == 3
    assert (h["wins"], h["losses"], h["ties"]) == (1, 1, 1)
    assert h["ratio"] == pytest.approx((5 / 4 * 3 / 6 * 1.0) ** (1 / 3))
    low, high = h["ci95"]
    assert low <= h["ratio"] <= high and low < 1.0 < high
    assert report.head_to_head("rl-ppo", "oracle",
                               states=["idle"])["ratio"] == pytest.approx(9.0)
    assert report.head_to_head("rl-ppo", "random") is None
    # a state asked for without a task both decided is not named as compared
    assert report.head_to_head("rl-ppo", "oracle",
                               states=["loaded-2", "busy"])["states"] == ["loaded-2"]
    assert report.to_json()["learned_vs_optimum"]["ratio"] == pytest.approx(h["ratio"])
    assert (f"task by task in loaded-1, loaded-2 (MEASURED (cpu)): the optimum's "
            f"time over the policy's {h['ratio']:.3f}") in report.to_text()
    assert "faster on 1, slower on 1, decided alike on 1" in report.to_text()
    # a refused decision runs nothing: its row holds the equal split's time
    refused = _row("oracle", 2000, "loaded-1", 10.0, accepted=False)
    report.rows[3] = refused
    assert report.head_to_head("rl-ppo", "oracle")["ratio"] == pytest.approx(
        (5 / 4 * 10 / 6 * 1.0) ** (1 / 3))


def test_head_to_head_of_a_run_is_in_its_json(smoke_report):
    h = smoke_report.to_json()["learned_vs_optimum"]
    assert h["states"] == ["busy"] and h["label"] == "PREDICTED (model)"
    # on the model backend the optimum is the optimum: nothing beats it
    assert h["ratio"] <= 1.0 + 1e-9 and h["wins"] == 0


@pytest.mark.parametrize("machine, applies", [("uni-server-2gpu-induced", True),
                                              ("uni-server-1gpu", False)])
def test_t1_applies_to_devices_that_differ_not_to_names(machine, applies):
    """T1 is for heterogeneous machines: the induced two-GPU server (two A100s
    of one name, one clock-locked) is one, and a speedup past the bound passes
    there; on one card it cannot pass, whatever the speedup."""
    from lib.evaluation.report import LEARNED
    from lib.evaluation.targets import targets
    task = TaskSpec("reduce", {"N": 1 << 20})
    rows = [Row(policy, task, "idle", seconds, 2.0, 1.0, 10.0, 5.0, True,
                "PREDICTED (model)")
            for policy, seconds in ((LEARNED, 1.0), ("proportional-peak", 1.5))]
    report = EvalReport(machine, "model", "smoke", 0, False, rows, [], [], [], [],
                        [], 0.0, latency={"p50_us": 50.0, "p99_us": 90.0,
                                          "decisions": 1})
    t1 = next(t for t in targets(report, load_machine(machine)) if t.id == "T1")
    assert t1.passed is applies
    assert ("heterogeneous machines" in t1.note) is not applies


#: A machine a large rung of the ladder does not fit: a 1 GB card beside an H100.
SMALL_CARD = {"name": "small-card", "devices": [
    {"name": "Small", "peak_fp32": 1e12, "mem_bytes": 1e9, "mem_bw": 1e11},
    {"catalog": "H100 SXM"}]}


def test_tasks_whose_equal_split_does_not_fit_are_made_smaller():
    """On a 1 GB card the ladder's large rungs' equal split is refused, so
    their speedup over it was NaN (T1 printed 'nanx'): they are made smaller,
    keeping their fixed sizes, and the rest are left as they are."""
    from lib.env.curriculum import fitting_equal_split
    from lib.platform.machines import machine_from_json
    from lib.scoring import evaluate_policy, fit_tasks
    machine = machine_from_json(SMALL_CARD)
    tasks = task_set("model", "quick")
    assert any(fitting_equal_split(t, machine, None) is None for t in tasks)
    fitted, lines = fit_tasks(tasks, machine)
    assert len(fitted) == len(tasks) and 0 < len(lines) < len(tasks)
    for before, after in zip(tasks, fitted, strict=True):
        assert fitting_equal_split(after, machine, None) is not None
        if fitting_equal_split(before, machine, None) is not None:
            assert after == before
        else:
            assert after.split_size < before.split_size
            assert {k: v for k, v in after.dims.items() if k in ("T", "B")} == \
                {k: v for k, v in before.dims.items() if k in ("T", "B")}
            assert any(before.describe() in line for line in lines)
    ev = evaluate_policy(make_policy("proportional-peak"), machine, tasks)
    assert math.isfinite(ev["speedup_vs_equal"]) and ev["fitted"] == lines
    # where no memory is free, not even one row fits: left out, saying so
    full = dataclasses.replace(busy(machine, [0.0, 0.0]), free_bytes=(0.0, 0.0))
    kept, lines = fit_tasks(tasks[:2], machine, (None, full))
    assert kept == [] and all("left out" in line for line in lines)
