"""The evaluation protocol: Table 4, ablations, transfer, falsifiable targets.

``gpuhive evaluate --machine M --backend B --budget BUDGET [--policy FILE]``
runs :func:`evaluate`:

1. a fixed, seeded task set over the five kinds, with sizes spanning four orders
   of magnitude of work, under *idle* and *busy* device states;
2. every policy (the learned one and the seven baselines) decides each task
   through :class:`lib.runtime.Agent` -- policy, hash, Gate 1 -- and the decision
   runs on the chosen backend: the ``model`` backend PREDICTS, ``cpu`` (and
   ``cuda``) MEASURE, with warm-ups and repeats (medians);
3. the results become Table 4 (policies x kinds: geometric-mean speedup over
   equal split with a bootstrap 95 % interval, ratio to the optimum, decision
   latency), the ablations of the learned policy, the transfer results, each
   task's efficiency against the physical limit, and the targets T1-T7 of the
   design, each printed as ``T<n> PASS|FAIL <value> <bound>``.

On the ``cpu`` backend the *busy* state is real: a spinning process is pinned to
the first core while those tasks run, and the policies see it through
``local_cpu_snapshot`` telemetry (MEASURED). On the model backend the busy state
is a simulated utilisation.

Every row carries MEASURED or PREDICTED; the Markdown report opens with a
warning block whenever anything in it is predicted.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lib.budgets import pick
from lib.contract import KINDS, TaskSpec
from lib.costmodel.model import split_time_coefficients
from lib.execution import get_backend
from lib.execution.model import params_for
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import Snapshot, busy, idle
from lib.policies.baselines import Policy
from lib.policies.registry import POLICIES, make_policy
from lib.runtime import Agent, DecisionRejected

#: Sizes per kind as (small, large) of the first dimension; the ladder between
#: them is geometric. Large enough on the model backend to stress real GPUs;
#: small enough on measured CPU cores to finish in minutes.
SIZES_MODEL: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "matmul": ({"M": 256, "N": 256, "K": 256}, {"M": 16384, "N": 8192, "K": 8192}),
    "reduce": ({"N": 1 << 16}, {"N": 1 << 30}),
    "elementwise": ({"N": 1 << 15}, {"N": 1 << 29}),
    "stencil": ({"H": 128, "W": 128, "T": 4}, {"H": 16384, "W": 16384, "T": 4}),
    "histogram": ({"N": 1 << 15, "B": 256}, {"N": 1 << 29, "B": 256}),
}
SIZES_MEASURED: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "matmul": ({"M": 16, "N": 64, "K": 64}, {"M": 2048, "N": 1024, "K": 1024}),
    "reduce": ({"N": 1 << 11}, {"N": 1 << 25}),
    "elementwise": ({"N": 1 << 10}, {"N": 1 << 24}),
    "stencil": ({"H": 8, "W": 64, "T": 2}, {"H": 8192, "W": 1024, "T": 2}),
    "histogram": ({"N": 1 << 10, "B": 256}, {"N": 1 << 24, "B": 256}),
}

#: the learned policy's name in the tables
LEARNED = "rl-ppo"


def task_set(backend: str, budget: str, seed: int = 0) -> list[TaskSpec]:
    """The evaluation tasks: every kind on a geometric ladder of sizes.

    The ladder scales the dimensions from the small to the large end
    (``smoke`` 2 rungs over the lower half of the range in log scale, ``quick``
    4 over all of it, ``full`` 6); a seeded jitter of a few percent keeps sizes
    off round numbers, the same for the same seed.
    """
    rungs = pick(budget, smoke=2, quick=4, full=6)
    reach = pick(budget, smoke=0.5, quick=1.0, full=1.0)  # smoke: the lower half
    ladders = SIZES_MODEL if backend == "model" else SIZES_MEASURED
    rng = np.random.default_rng((seed, 0xE7A1))
    tasks = []
    for kind in KINDS:
        small, large = ladders[kind]
        for r in range(rungs):
            f = reach * r / max(1, rungs - 1)
            dims = {}
            for name in small:
                lo, hi = small[name], large[name]
                value = lo * (hi / lo) ** f if name not in ("T", "B") else lo
                jitter = 1.0 + 0.03 * rng.random() if name not in ("T", "B") else 1.0
                dims[name] = max(1, int(value * jitter))
            tasks.append(TaskSpec(kind, dims))
    return tasks


def physical_limit(task: TaskSpec, machine: Machine,
                   telemetry: Snapshot | None = None) -> float:
    """A lower bound on the time of any decision (under the cost model).

    ``T_limit = n / sum_i r_i + t_x``: the task's ``n`` rows over the summed
    compute throughput of the usable devices (``r_i`` rows per second, the
    roofline slope of Eq. (1) without transfers or launches), plus the least
    unavoidable transfer ``t_x``: one copy's latency on the fastest host link,
    since with perfect pipelining every other byte can overlap compute.
    """
    n = task.split_size
    rates, latency = [], math.inf
    for i in range(machine.n):
        if telemetry is not None and not telemetry.healthy[i]:
            continue
        _, _, _, d, _, f = split_time_coefficients(task, machine, i,
                                                   telemetry=telemetry)
        rates.append(1.0 / max(d, f, 1e-30))
        latency = min(latency, machine.host_link(i).latency)
    return n / sum(rates) + latency


def random_tasks(n: int, backend: str = "model", seed: int = 0) -> list[TaskSpec]:
    """``n`` tasks of random kinds and log-uniform sizes over the ladders' range
    (every one different: for latency, where a repeated task would be cached)."""
    ladders = SIZES_MODEL if backend == "model" else SIZES_MEASURED
    rng = np.random.default_rng((seed, 0x1A7E))
    out = []
    for _ in range(n):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        small, large = ladders[kind]
        f = float(rng.random())
        out.append(TaskSpec(kind, {k: max(1, int(small[k] * (large[k] / small[k]) ** f
                                                 * (1 + 0.01 * rng.random())))
                                   if k not in ("T", "B") else small[k]
                                   for k in small}))
    return out


def decision_latency(policy: Policy, machine: Machine,
                     states: Sequence[Snapshot | None], n: int = 400,
                     seed: int = 0) -> dict[str, float]:
    """Latency of ``Agent.optimize`` (decide, hash, Gate 1) on fresh tasks.

    Each of ``n`` different tasks is decided once per state, after a warm-up on
    other tasks: what a runtime pays for a task it has not seen. MEASURED on
    this computer, whatever the backend.
    """
    warm, fresh = random_tasks(20, seed=seed + 1), random_tasks(n, seed=seed)
    lat = []
    for snap in states:
        agent = Agent(policy=policy, machine=machine, telemetry=snap)
        for task in warm:
            agent.optimize(task)
        for task in fresh:
            t0 = time.perf_counter()
            agent.optimize(task)
            lat.append(time.perf_counter() - t0)
    us = np.asarray(lat) * 1e6
    return {"p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)), "decisions": len(lat)}


def geomean(x: Sequence[float]) -> float:
    """Geometric mean (nan for an empty sequence)."""
    return float(np.exp(np.mean(np.log(x)))) if len(x) else math.nan


def bootstrap_ci(x: Sequence[float], n: int = 1000, seed: int = 0
                 ) -> tuple[float, float]:
    """95 % bootstrap interval of the geometric mean of ``x``."""
    if len(x) < 2:
        return (math.nan, math.nan)
    logs = np.log(np.asarray(x, float))
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, len(logs), (n, len(logs)))].mean(axis=1)
    return float(np.exp(np.percentile(means, 2.5))), float(np.exp(
        np.percentile(means, 97.5)))


# --------------------------------------------------------------------------
# Busy cores, for real

def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


class CoreLoad:
    """A spinning process pinned to one core: real background load."""

    def __init__(self, core: int, seconds: float = 3600.0):
        self.core, self.seconds = core, seconds
        self.proc: Any = None

    def __enter__(self) -> CoreLoad:
        ctx = mp.get_context("spawn")
        self.proc = ctx.Process(target=_spin, args=(self.seconds,), daemon=True)
        self.proc.start()
        if hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(self.proc.pid, {self.core})
            except OSError:
                pass
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)


# --------------------------------------------------------------------------
# Results

@dataclass
class Row:
    """One (policy, task, state) run."""

    policy: str
    task: TaskSpec
    state: str
    seconds: float
    equal_seconds: float
    optimum_seconds: float | None
    limit_seconds: float
    decide_us: float
    accepted: bool
    label: str
    decision: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.equal_seconds / self.seconds


@dataclass
class Target:
    """One falsifiable target: PASS or FAIL with the value either way."""

    id: str
    passed: bool
    value: str
    bound: str
    note: str = ""

    def line(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        return (f"{self.id} {'PASS' if self.passed else 'FAIL'} {self.value} "
                f"(bound {self.bound}){note}")


@dataclass
class EvalReport:
    """Everything :func:`evaluate` measured or predicted."""

    machine: str
    backend: str
    budget: str
    seed: int
    measured: bool
    rows: list[Row]
    table4: list[dict[str, Any]]
    ablations: list[dict[str, Any]]
    transfer: list[dict[str, Any]]
    targets: list[Target]
    notes: list[str]
    seconds: float
    latency: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{'MEASURED' if self.measured else 'PREDICTED'} ({self.backend})"

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine, "backend": self.backend, "budget": self.budget,
            "seed": self.seed, "label": self.label, "measured": self.measured,
            "seconds": self.seconds, "table4": self.table4,
            "ablations": self.ablations, "transfer": self.transfer,
            "targets": [t.__dict__ | {"line": t.line()} for t in self.targets],
            "latency": self.latency, "notes": self.notes,
            "rows": [{"policy": r.policy, "task": r.task.to_json(), "state": r.state,
                      "seconds": r.seconds, "equal_seconds": r.equal_seconds,
                      "optimum_seconds": r.optimum_seconds,
                      "limit_seconds": r.limit_seconds, "decide_us": r.decide_us,
                      "accepted": r.accepted, "label": r.label,
                      "efficiency": r.limit_seconds / r.seconds,
                      "decision": r.decision} for r in self.rows],
        }

    def to_text(self) -> str:
        lines = [f"evaluation on {self.machine}, {self.label}, budget {self.budget}, "
                 f"{len({(r.task, r.state) for r in self.rows})} task-states, "
                 f"{self.seconds:.0f} s"]
        if not self.measured:
            lines.append("WARNING: every time below is PREDICTED by the cost model, "
                         "not measured.")
        lines += ["", "Table 4: geometric-mean speedup over equal split "
                      f"({self.label})"]
        head = f"  {'policy':<18}" + "".join(f"{k[:11]:>12}" for k in KINDS) + \
            f"{'all':>8} {'95% CI':>15} {'vs opt':>8} {'p50 us':>8}"
        lines.append(head)
        for t in self.table4:
            ci = t["ci95"]
            opt = f"{t['ratio_to_optimum']:.3f}" if t["ratio_to_optimum"] else "-"
            lines.append(
                f"  {t['policy']:<18}"
                + "".join(f"{t['per_kind'].get(k, math.nan):>12.2f}" for k in KINDS)
                + f"{t['speedup']:>8.2f} {f'[{ci[0]:.2f}, {ci[1]:.2f}]':>15} "
                  f"{opt:>8} {t['decide_p50_us']:>8.0f}")
        if self.ablations:
            lines += ["", "Ablations of the learned policy"]
            lines += [f"  {a['variant']:<22} speedup {a['speedup']:.2f}x  vs opt "
                      f"{a['ratio_to_optimum']:.3f}  ({a['how']})"
                      for a in self.ablations]
        if self.transfer:
            lines += ["", "Transfer (PREDICTED, model backend)"]
            lines += [f"  {x['machine']:<26} {x['when']:<12} T_rl/T_opt "
                      f"{x['ratio_to_optimum']:.3f}  speedup {x['speedup']:.2f}x"
                      for x in self.transfer]
        effs = [r.limit_seconds / r.seconds for r in self.rows
                if r.policy == self._headline_policy()]
        if effs:
            lines += ["", f"Efficiency against the physical limit "
                          f"({self._headline_policy()}): median "
                          f"{statistics.median(effs):.2f}, min {min(effs):.2f}"]
        if self.latency:
            lines += ["", f"Decision latency of the learned policy (optimize incl. "
                          f"Gate 1, fresh tasks, MEASURED on this computer): p50 "
                          f"{self.latency['p50_us']:.0f} us, p99 "
                          f"{self.latency['p99_us']:.0f} us"]
        lines += ["", "Targets"] + [t.line() for t in self.targets]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        out = []
        if not self.measured:
            out.append("> **Warning: PREDICTED.** Every time in this report comes "
                       "from the cost model (model backend), not from a measurement.\n")
        out.append(f"# Evaluation on {self.machine} ({self.label}, budget "
                   f"{self.budget})\n")
        out.append("| policy | " + " | ".join(KINDS) + " | all | 95 % CI | vs optimum "
                   "| decision p50 (us) |")
        out.append("|" + "---|" * (len(KINDS) + 5))
        for t in self.table4:
            opt = f"{t['ratio_to_optimum']:.3f}" if t["ratio_to_optimum"] else "-"
            out.append(f"| {t['policy']} | " + " | ".join(
                f"{t['per_kind'].get(k, math.nan):.2f}" for k in KINDS)
                + f" | {t['speedup']:.2f} | {t['ci95'][0]:.2f}-{t['ci95'][1]:.2f} "
                  f"| {opt} | {t['decide_p50_us']:.0f} |")
        out.append("\n## Targets\n")
        out += [f"- `{t.line()}`" for t in self.targets]
        return "\n".join(out) + "\n"

    def _headline_policy(self) -> str:
        names = {r.policy for r in self.rows}
        return LEARNED if LEARNED in names else "proportional-peak"


# --------------------------------------------------------------------------
# Running

def _learned_policy(path: str | None, notes: list[str], **options: Any):
    try:
        from lib.policies.learned import load_policy
    except ImportError:
        notes.append("no learned policy in this build: the rl rows are missing")
        return None
    try:
        return load_policy(path, **options)
    except (FileNotFoundError, ValueError) as exc:
        notes.append(f"learned policy not loaded: {exc}")
        return None


def _states(machine: Machine, backend: str) -> list[tuple[str, Snapshot | None]]:
    """(name, telemetry) pairs; the busy state loads the first device."""
    if backend == "model":
        util = [0.7 if i == 0 else 0.0 for i in range(machine.n)]
        return [("idle", idle(machine)), ("busy", busy(machine, util))]
    return [("idle", None), ("busy", None)]  # read live, under real load


def evaluate(machine_name: str = "hetero-4", backend: str = "model",
             budget: str = "quick", seed: int = 0, policy_path: str | None = None,
             progress: bool = True,
             on_row: Callable[[Row], None] | None = None) -> EvalReport:
    """Run the protocol; see the module docstring."""
    start = time.perf_counter()
    machine = load_machine(machine_name)
    notes: list[str] = []
    measured = backend != "model"
    repeats = pick(budget, smoke=1, quick=3, full=5)
    tasks = task_set(backend, budget, seed)
    policies: dict[str, Policy] = {name: make_policy(name, seed)
                                   for name in POLICIES if name != "rl"}
    learned = _learned_policy(policy_path, notes)
    if learned is not None:
        policies = {LEARNED: learned, **policies}
    runner = None
    if measured:
        runner = get_backend(backend, machine, seed=seed, repeats=repeats, warmup=1)
    rows: list[Row] = []
    bar = _progress(progress, len(tasks) * 2 * len(policies), "evaluate")
    try:
        for state, snap in _states(machine, backend):
            load = CoreLoad(core=_core_of(0)) if (measured and state == "busy") \
                else None
            if load is not None:
                load.__enter__()
            try:
                if measured:
                    snap = _live_snapshot(machine, backend)
                rows += _run_state(machine, backend, runner, tasks, state, snap,
                                   policies, bar, on_row)
            finally:
                if load is not None:
                    load.__exit__()
    finally:
        if runner is not None:
            runner.close()
        if bar is not None:
            bar.close()
    table4 = _table4(rows, seed)
    ablations = _ablations(machine, tasks, policy_path, notes, budget) \
        if learned is not None and backend == "model" else []
    transfer = _transfer(learned, budget, seed, notes) \
        if learned is not None else []
    latency = decision_latency(learned, machine, [s for _, s in _states(
        machine, "model")], n=pick(budget, smoke=100, quick=400, full=1000),
        seed=seed) if learned is not None else {}
    report = EvalReport(machine=machine.name, backend=backend, budget=budget,
                        seed=seed, measured=measured, rows=rows, table4=table4,
                        ablations=ablations, transfer=transfer, targets=[],
                        notes=notes, seconds=0.0, latency=latency)
    report.targets = targets(report, machine)
    report.seconds = time.perf_counter() - start
    return report


def _progress(on: bool, total: int, desc: str):
    if not on:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run")


def _core_of(device: int) -> int:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else [0]
    return cores[device % len(cores)]


def _live_snapshot(machine: Machine, backend: str) -> Snapshot:
    from lib.platform.telemetry import local_cpu_snapshot, nvml_snapshot

    return local_cpu_snapshot(machine, interval=0.2) if backend == "cpu" \
        else nvml_snapshot()


def _run_state(machine, backend, runner, tasks, state, snap, policies, bar,
               on_row) -> list[Row]:
    from lib.policies.oracle import optimum

    params = params_for(machine.name)
    rows = []
    for task in tasks:
        backend_obj = runner if runner is not None else get_backend(
            "model", machine, telemetry=snap, params=params)
        times: dict[str, tuple[float, float, bool, str, dict]] = {}
        for name, policy in policies.items():
            agent = Agent(policy=policy, machine=machine, backend=backend_obj,
                          telemetry=snap)
            t0 = time.perf_counter()
            try:
                decision = agent.optimize(task)
                accepted = True
            except DecisionRejected:
                decision, accepted = None, False
            decide_us = (time.perf_counter() - t0) * 1e6
            if accepted:
                result = agent.execute(task, decision)
                seconds = result.metrics.total_seconds
                label = result.metrics.label
                dec_json = decision.to_json()
            else:  # a refused decision never runs; it costs the equal split
                seconds, label, dec_json = math.nan, "REFUSED", {}
            times[name] = (seconds, decide_us, accepted, label, dec_json)
            if bar is not None:
                bar.update(1)
        equal = times["equal"][0]
        opt = times["oracle"][0] if "oracle" in times else None
        if backend == "model":
            opt = optimum(task, machine, snap, params).total
        limit = physical_limit(task, machine, snap)
        for name, (seconds, decide_us, accepted, label, dec_json) in times.items():
            row = Row(policy=name, task=task, state=state,
                      seconds=seconds if accepted else equal, equal_seconds=equal,
                      optimum_seconds=opt, limit_seconds=limit, decide_us=decide_us,
                      accepted=accepted, label=label, decision=dec_json)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _table4(rows: list[Row], seed: int) -> list[dict[str, Any]]:
    out = []
    for name in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == name]
        speed = [r.speedup for r in mine]
        per_kind = {k: geomean([r.speedup for r in mine if r.task.kind == k])
                    for k in KINDS}
        ratios = [r.seconds / r.optimum_seconds for r in mine if r.optimum_seconds]
        lat = [r.decide_us for r in mine]
        out.append({"policy": name, "per_kind": per_kind, "speedup": geomean(speed),
                    "ci95": bootstrap_ci(speed, seed=seed),
                    "ratio_to_optimum": geomean(ratios) if ratios else None,
                    "decide_p50_us": float(np.percentile(lat, 50)),
                    "decide_p99_us": float(np.percentile(lat, 99)),
                    "refused": sum(not r.accepted for r in mine),
                    "label": mine[0].label if mine else ""})
    return out


def _score(policy, machine: Machine, tasks: Sequence[TaskSpec],
           snap: Snapshot | None) -> tuple[float, float]:
    """(geo-mean speedup over equal, geo-mean T/T_opt) on the model backend."""
    from lib.costmodel import predict
    from lib.policies.baselines import EqualSplit
    from lib.policies.oracle import optimum
    from lib.security import check_decision

    params = params_for(machine.name)
    speed, ratio = [], []
    for task in tasks:
        eq = predict(task, EqualSplit().decide(task, machine, snap), machine, snap,
                     params).total
        opt = optimum(task, machine, snap, params).total
        d = policy.decide(task, machine, snap).with_hash(task)
        t = predict(task, d, machine, snap, params).total \
            if check_decision(d, task, machine, snap).accepted else eq
        speed.append(eq / t)
        ratio.append(t / opt)
    return geomean(speed), geomean(ratio)


def _ablations(machine, tasks, policy_path, notes, budget) -> list[dict[str, Any]]:
    """The learned policy without parts of what it sees (PREDICTED)."""
    out = []
    snap = busy(machine, [0.7 if i == 0 else 0.0 for i in range(machine.n)])
    variants = [("full", {}, "the shipped policy"),
                ("no telemetry features", {"features": "no-telemetry"},
                 "telemetry entries of the state zeroed at decision time"),
                ("no topology features", {"features": "no-topology"},
                 "topology entries of the state zeroed at decision time"),
                ("no action mask", {"use_mask": False},
                 "masks ignored; Gate 1 refuses what is illegal (costs equal split)")]
    for name, options, how in variants:
        policy = _learned_policy(policy_path, notes, **options)
        if policy is None:
            continue
        speed, ratio = _score(policy, machine, tasks, snap)
        out.append({"variant": name, "speedup": speed, "ratio_to_optimum": ratio,
                    "how": how, "label": "PREDICTED (model)"})
    curriculum = _curriculum_ablation(machine, tasks, snap, budget, notes)
    out += curriculum
    return out


def _curriculum_ablation(machine, tasks, snap, budget, notes) -> list[dict[str, Any]]:
    """Two short trainings, with and without the curriculum, compared alike."""
    try:
        from lib.training.pipeline import TrainConfig, train
    except ImportError:
        notes.append("curriculum ablation skipped: no training pipeline")
        return []
    import tempfile

    out = []
    short = "smoke" if budget != "full" else "quick"
    for name, flag in (("curriculum (short run)", True),
                       ("no curriculum (short run)", False)):
        with tempfile.TemporaryDirectory() as tmp:
            result = train(TrainConfig(machine=machine.name, budget=short, seed=1,
                                       curriculum=flag), tmp, progress=False)
            speed, ratio = _score(result.policy, machine, tasks, snap)
        out.append({"variant": name, "speedup": speed, "ratio_to_optimum": ratio,
                    "how": f"trained from scratch with the {short} budget",
                    "label": "PREDICTED (model)"})
    return out


def _transfer(learned, budget: str, seed: int, notes: list[str]
              ) -> list[dict[str, Any]]:
    """Zero-shot on machines never trained on, then after a short fine-tune."""
    from lib.env.curriculum import held_out_machines

    count = pick(budget, smoke=1, quick=2, full=4)
    out = []
    for machine in held_out_machines(seed, count):
        tasks = task_set("model", "smoke", seed)
        snap = idle(machine)
        speed, ratio = _score(learned, machine, tasks, snap)
        names = "+".join(sorted({d.name for d in machine.devices}))
        out.append({"machine": f"{machine.name} ({names})", "when": "zero-shot",
                    "speedup": speed, "ratio_to_optimum": ratio})
        try:
            from lib.training.pipeline import fine_tune
        except ImportError:
            continue
        tuned = fine_tune(learned, machine, steps=pick(budget, smoke=64, quick=512,
                                                       full=4096), seed=seed)
        speed, ratio = _score(tuned, machine, tasks, snap)
        out.append({"machine": f"{machine.name} ({names})", "when": "fine-tuned",
                    "speedup": speed, "ratio_to_optimum": ratio})
    return out


def targets(report: EvalReport, machine: Machine) -> list[Target]:
    """T1-T7 of the design, from the report (and the audit and calibration)."""
    rows = report.rows
    have_rl = any(r.policy == LEARNED for r in rows)
    rl = [r for r in rows if r.policy == LEARNED]
    out = []
    label = report.label
    hetero = len({d.name for d in machine.devices}) > 1 or report.measured
    bound = 1.10 if report.measured else 1.25
    if have_rl:
        s = geomean([r.speedup for r in rl])
        out.append(Target("T1", s >= bound and hetero, f"{s:.2f}x over equal split "
                          f"{label}", f">= {bound:.2f}x",
                          "" if hetero else "the machine's devices are identical"))
        ratios = [r.seconds / r.optimum_seconds for r in rl if r.optimum_seconds]
        g = geomean(ratios)
        out.append(Target("T2", g <= 1.05, f"T_rl/T_opt {g:.3f} {label}", "<= 1.05"))
        pp = {(r.task, r.state): r.seconds for r in rows
              if r.policy == "proportional-peak"}
        wins = [r.seconds <= pp[(r.task, r.state)] * (1 + 1e-9) for r in rl]
        frac = sum(wins) / len(wins)
        busy_ratio = geomean([pp[(r.task, r.state)] / r.seconds for r in rl
                              if r.state == "busy"])
        out.append(Target("T3", frac >= 0.9 and busy_ratio >= 1.05,
                          f"as fast as proportional-to-peak on {frac:.0%} of tasks, "
                          f"{busy_ratio:.2f}x when busy {label}",
                          ">= 90 % and >= 1.05x"))
        p50, p99 = report.latency["p50_us"], report.latency["p99_us"]
        out.append(Target("T4", p50 <= 100 and p99 <= 1000,
                          f"decision latency p50 {p50:.0f} us, p99 {p99:.0f} us "
                          f"MEASURED on this computer (optimize incl. Gate 1, "
                          f"{report.latency['decisions']} fresh tasks)",
                          "p50 <= 100 us, p99 <= 1000 us"))
    else:
        for tid in ("T1", "T2", "T3", "T4"):
            out.append(Target(tid, False, "no learned policy evaluated", "-",
                              "a target that cannot be checked does not pass"))
    from lib.evaluation.audit import run_audit

    audit = run_audit(repeats=1)
    ok = audit.recall == 1.0 and audit.intended_accuracy == 1.0 \
        and audit.false_positive_rate == 0.0
    out.append(Target("T5", ok, f"recall {audit.recall:.3f}, intended "
                      f"{audit.intended_accuracy:.3f}, false positives "
                      f"{audit.false_positive_rate:.3f}",
                      "1.000 / 1.000 / 0.000"))
    out.append(_t6())
    zero = [x for x in report.transfer if x["when"] == "zero-shot"]
    if zero:
        g = geomean([x["ratio_to_optimum"] for x in zero])
        out.append(Target("T7", g <= 1.10, f"zero-shot T_rl/T_opt {g:.3f} on "
                          f"{len(zero)} unseen machine(s) PREDICTED", "<= 1.10"))
    else:
        out.append(Target("T7", False, "no transfer run", "<= 1.10",
                          "a target that cannot be checked does not pass"))
    return out


def _t6() -> Target:
    """T6 from the local-cpu characterisation, re-scored (nothing is saved)."""
    import json

    from lib.costmodel.calibrate import calibrate, characterisation_path

    path = characterisation_path("local-cpu")
    if not path.is_file():
        return Target("T6", False, "no characterisation of local-cpu",
                      "median APE <= 15 %, Spearman >= 0.9",
                      "run: gpuhive characterise --machine local-cpu")
    rep = calibrate("local-cpu", json.loads(path.read_text())["runs"])
    ok = rep.median_ape_pct <= 15 and rep.spearman >= 0.9
    return Target("T6", ok, f"median APE {rep.median_ape_pct:.1f} %, Spearman "
                  f"{rep.spearman:.3f} on {rep.n_heldout} held-out MEASURED runs",
                  "<= 15 %, >= 0.9")
