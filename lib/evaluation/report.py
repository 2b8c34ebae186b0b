"""What an evaluation produced: rows, targets, and the report that prints them.

Every row and table carries MEASURED or PREDICTED; the text and Markdown forms
open with a warning whenever anything in them is predicted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lib.contract import KINDS, TaskSpec
from lib.scoring import bootstrap_ci, geomean

#: the learned policy's name in the tables
LEARNED = "rl-ppo"


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
    capacity: tuple[float, ...] | None = None
    """Each device's capacity as the telemetry the policies saw measured it
    (None where it measured none)."""
    rounds: tuple[float, ...] = ()
    """Seconds of each timed run of the decision on a measured backend (its
    rounds, in the order they ran); empty for a prediction or a refusal."""
    median_seconds: float | None = None
    equal_median_seconds: float | None = None
    """The median of the decision's rounds and of the equal split's, beside
    the figures (``seconds``, ``equal_seconds``: their trimmed means) on a
    measured backend; None elsewhere."""

    @property
    def speedup(self) -> float:
        return self.equal_seconds / self.seconds

    @property
    def median_speedup(self) -> float | None:
        """The speedup the medians of the rounds give (None without them)."""
        if self.median_seconds is None or self.equal_median_seconds is None:
            return None
        return self.equal_median_seconds / self.median_seconds


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

    def per_state(self, by_median: bool = False) -> dict[str, dict[str, float]]:
        """Policy -> state -> geometric-mean speedup over equal split;
        ``by_median``: from the medians of the rounds in place of the
        figures (states without them are left out)."""
        out: dict[str, dict[str, list[float]]] = {}
        for r in self.rows:
            speedup = r.median_speedup if by_median else r.speedup
            if speedup is not None:
                out.setdefault(r.policy, {}).setdefault(r.state, []).append(speedup)
        return {p: {s: geomean(v) for s, v in by.items()} for p, by in out.items()}

    def best_per_state(self) -> dict[str, float]:
        """State -> geometric mean, over its tasks, of the best speedup any
        policy's decision reached on the task: how much the decisions tried
        left to win. Optimistic on a measured backend, where it takes the
        largest of several noisy figures of each task."""
        best: dict[str, dict[str, float]] = {}
        for r in self.rows:
            tasks = best.setdefault(r.state, {})
            key = r.task.describe()
            tasks[key] = max(tasks.get(key, 0.0), r.speedup)
        return {s: geomean(list(v.values())) for s, v in best.items()}

    def head_to_head(self, a: str, b: str, states: Sequence[str] | None = None,
                     seed: int = 0) -> dict[str, Any] | None:
        """Policy ``a`` against policy ``b``, task by task, on the tasks of
        ``states`` (default: every state but ``idle``, the ones under load;
        ``states`` in the result names those with a task compared):
        ``ratio``, the geometric mean of ``b``'s time over ``a``'s (above 1:
        ``a`` is faster), its 95 % bootstrap interval ``ci95`` over the
        tasks, and how many tasks ``a`` was faster on (``wins``), slower
        (``losses``) and timed the same (``ties``: the two decided alike, so
        they share one measurement). A refused decision counts at the equal
        split's time, as everywhere in the tables. None where the two have no
        task in common there."""
        want = set(states) if states is not None else \
            {r.state for r in self.rows} - {"idle"}
        times: dict[tuple[str, str], dict[str, float]] = {}
        for r in self.rows:
            if r.state in want and r.policy in (a, b):
                times.setdefault((r.state, r.task.describe()), {})[r.policy] = \
                    r.seconds
        paired = {key: t[b] / t[a] for key, t in times.items() if a in t and b in t}
        if not paired:
            return None
        ratios = list(paired.values())
        low, high = bootstrap_ci(ratios, seed=seed)
        return {"a": a, "b": b, "states": sorted({state for state, _ in paired}),
                "tasks": len(ratios),
                "ratio": geomean(ratios), "ci95": [low, high],
                "wins": sum(x > 1.0 for x in ratios),
                "losses": sum(x < 1.0 for x in ratios),
                "ties": sum(x == 1.0 for x in ratios), "label": self.label}

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine, "backend": self.backend, "budget": self.budget,
            "seed": self.seed, "label": self.label, "measured": self.measured,
            "seconds": self.seconds, "table4": self.table4,
            "per_state": self.per_state(),
            "per_state_by_median": self.per_state(by_median=True),
            "best_per_state": self.best_per_state(),
            "learned_vs_optimum": self.head_to_head(LEARNED, "oracle",
                                                    seed=self.seed),
            "ablations": self.ablations, "transfer": self.transfer,
            "targets": [t.__dict__ | {"line": t.line()} for t in self.targets],
            "latency": self.latency, "notes": self.notes,
            "rows": [{"policy": r.policy, "task": r.task.to_json(), "state": r.state,
                      "seconds": r.seconds, "equal_seconds": r.equal_seconds,
                      "optimum_seconds": r.optimum_seconds,
                      "limit_seconds": r.limit_seconds, "decide_us": r.decide_us,
                      "accepted": r.accepted, "label": r.label,
                      "efficiency": r.limit_seconds / r.seconds,
                      "decision": r.decision, "capacity": r.capacity,
                      "rounds": list(r.rounds), "median_seconds": r.median_seconds,
                      "equal_median_seconds": r.equal_median_seconds}
                     for r in self.rows],
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
        per_state = self.per_state()
        states = list(dict.fromkeys(r.state for r in self.rows))
        if len(states) > 1:
            lines += ["", f"Speedup over equal split per state ({self.label})"]
            lines.append(f"  {'policy':<18}" + "".join(f"{s:>11}" for s in states))
            lines += [f"  {p:<18}" + "".join(f"{by.get(s, math.nan):>11.2f}"
                                             for s in states)
                      for p, by in per_state.items()]
            by_median = self.per_state(by_median=True)
            if by_median:
                lines += ["", "The same from the medians of the rounds (the figures "
                          "above are their trimmed means)"]
                lines += [f"  {p:<18}" + "".join(f"{by.get(s, math.nan):>11.2f}"
                                                 for s in states)
                          for p, by in by_median.items()]
        h2h = self.head_to_head(LEARNED, "oracle", seed=self.seed)
        if h2h is not None:
            lines += ["", f"The learned policy against the optimum, task by task in "
                          f"{', '.join(h2h['states'])} ({self.label}): the "
                          f"optimum's time over the policy's {h2h['ratio']:.3f} "
                          f"[{h2h['ci95'][0]:.3f}, {h2h['ci95'][1]:.3f}] over "
                          f"{h2h['tasks']} tasks; faster on {h2h['wins']}, slower "
                          f"on {h2h['losses']}, decided alike on {h2h['ties']}"]
        if self.ablations:
            lines += ["", "Ablations of the learned policy (PREDICTED, model "
                          "backend, busy state)"]
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
