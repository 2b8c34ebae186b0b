"""The injection suite: how well do the three gates catch what they should?

The table is data: ``cases/*.yaml``, loaded and checked by
:mod:`lib.evaluation.audit_cases`, one :class:`~lib.evaluation.audit_cases.Case`
per input for one gate: a Gate 1 decision, a Gate 2a CUDA source or list of
compile options, or a Gate 2b tamper operation
(:mod:`lib.evaluation.audit_tamper`) applied to a freshly sealed cache entry.
An adversarial case names the one check id meant to catch it
(``intended_check``); a benign control (``benign=True``) must be accepted.

:func:`run_audit` runs every case through its gate ``repeats`` times and
returns an :class:`AuditReport`:

- recall: adversarial cases refused by any check, over all adversarial cases
  (overall, per gate, per family);
- intended accuracy: adversarial cases whose intended check is among the
  checks that fired;
- confusion: for each intended check, which checks fired first and which
  fired at all (so a case caught "by accident" by another check is visible);
- false-positive rate: benign controls refused, over all benign controls;
- latency: median and p99 wall time of one gate call, per gate, microseconds.

Gates are looked up in this module's namespace at run time
(``check_decision``, ``scan_source``, ``check_compile_options``, ``Seal``), so
a test can swap one for a broken gate and watch the suite notice.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import stat
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lib.codegen import CodeGenerator, KernelCache, plane
from lib.codegen.llm import FixedAnswer
from lib.contract import Decision, TaskSpec
from lib.evaluation.audit_cases import GATES, AuditError, Case, load_cases
from lib.evaluation.audit_tamper import TAMPERS, SealBench
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import busy
from lib.security.gate1 import check_decision
from lib.security.scan import check_compile_options, scan_source
from lib.security.seal import Seal
from lib.security.verdict import Verdict, Violation

#: The gates the quick audit runs (microseconds a case); ``plane`` runs only
#: with ``end_to_end`` (seconds a case).
QUICK_GATES = tuple(g for g in GATES if g != "plane")

MACHINE = "hetero-4"
"""The machine the Gate 1 cases are written for (device indices, memory)."""
PLANE_DIMS = {"elementwise": {"N": 1 << 16}, "reduce": {"N": 1 << 16},
              "matmul": {"M": 256, "N": 256, "K": 256},
              "stencil": {"H": 256, "W": 256, "T": 2},
              "histogram": {"N": 1 << 16, "B": 64}}
"""Task sizes of the plane's end-to-end cases (the spot check shrinks them)."""
PLANE_WORKERS = 4
"""At most this many end-to-end cases at once (each builds and runs a
sanitized emulator: a core and a few hundred MB)."""


@dataclass(frozen=True)
class CaseResult:
    """What the gate said about one case.

    Attributes:
        case: the case.
        checks: distinct check ids that fired, in order of first appearance.
        seconds: wall time of each repeat of the gate call, seconds.
        stable: every repeat gave the same checks.
    """

    case: Case
    checks: tuple[str, ...]
    seconds: tuple[float, ...]
    stable: bool = True

    @property
    def accepted(self) -> bool:
        return not self.checks

    @property
    def caught(self) -> bool:
        """An adversarial case refused by some check."""
        return not self.case.benign and not self.accepted

    @property
    def intended_hit(self) -> bool:
        """An adversarial case refused by its intended check (among others)."""
        return not self.case.benign and self.case.intended_check in self.checks

    @property
    def first(self) -> str | None:
        return self.checks[0] if self.checks else None


def _ratio(num: int, den: int) -> float:
    return num / den if den else float("nan")


@dataclass
class AuditReport:
    """Results of :func:`run_audit`.

    Attributes:
        results: one :class:`CaseResult` per case, in table order.
        latency: gate -> ``{"n", "median_us", "p99_us", "max_us"}`` over every
            repeat of every case of that gate.
        repeats: gate calls per case.
        seed: seed of the run order.
        notes: anything the run could not do (e.g. kernels not found).
    """

    results: tuple[CaseResult, ...]
    latency: dict[str, dict[str, float]]
    repeats: int
    seed: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def adversarial(self) -> list[CaseResult]:
        return [r for r in self.results if not r.case.benign]

    @property
    def benign(self) -> list[CaseResult]:
        return [r for r in self.results if r.case.benign]

    @property
    def recall(self) -> float:
        """Adversarial cases refused by any check / adversarial cases."""
        adv = self.adversarial
        return _ratio(sum(r.caught for r in adv), len(adv))

    @property
    def recall_by_gate(self) -> dict[str, float]:
        out = {}
        for gate in GATES:
            adv = [r for r in self.adversarial if r.case.gate == gate]
            if adv:  # the plane's end-to-end cases run only when asked for
                out[gate] = _ratio(sum(r.caught for r in adv), len(adv))
        return out

    @property
    def recall_by_family(self) -> dict[str, float]:
        return {f: row["recall"] for f, row in self.families.items()}

    @property
    def intended_accuracy(self) -> float:
        """Adversarial cases whose intended check fired / adversarial cases."""
        adv = self.adversarial
        return _ratio(sum(r.intended_hit for r in adv), len(adv))

    @property
    def false_positive_rate(self) -> float:
        """Benign controls refused / benign controls."""
        ben = self.benign
        return _ratio(sum(not r.accepted for r in ben), len(ben))

    @property
    def families(self) -> dict[str, dict[str, Any]]:
        """Family -> gate, cases, caught, intended, recall (adversarial only)."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.adversarial:
            row = out.setdefault(r.case.family, {"gate": r.case.gate, "cases": 0,
                                                 "caught": 0, "intended": 0})
            row["cases"] += 1
            row["caught"] += r.caught
            row["intended"] += r.intended_hit
        for row in out.values():
            row["recall"] = _ratio(row["caught"], row["cases"])
        return dict(sorted(out.items(), key=lambda kv: (kv[1]["gate"], kv[0])))

    @property
    def confusion(self) -> dict[str, dict[str, Any]]:
        """Intended check -> ``cases``, ``hit`` (intended fired), ``first``
        (check that fired first -> count) and ``any`` (every check that
        fired -> count; the intended one included)."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.adversarial:
            row = out.setdefault(r.case.intended_check, {
                "cases": 0, "hit": 0, "first": Counter(), "any": Counter()})
            row["cases"] += 1
            row["hit"] += r.intended_hit
            row["first"][r.first or "(accepted)"] += 1
            row["any"].update(r.checks or ("(accepted)",))
        return {k: {"cases": v["cases"], "hit": v["hit"],
                    "first": dict(v["first"].most_common()),
                    "any": dict(v["any"].most_common())}
                for k, v in sorted(out.items())}

    def to_json(self) -> dict[str, Any]:
        """Everything as plain JSON types (NaN where a ratio has no cases)."""
        return {
            "machine": MACHINE, "repeats": self.repeats, "seed": self.seed,
            "counts": {"adversarial": len(self.adversarial),
                       "benign": len(self.benign),
                       "families": len(self.families)},
            "recall": self.recall,
            "recall_by_gate": self.recall_by_gate,
            "intended_accuracy": self.intended_accuracy,
            "false_positive_rate": self.false_positive_rate,
            "families": self.families,
            "confusion": self.confusion,
            "latency": self.latency,
            "cases": [{"id": r.case.id, "gate": r.case.gate,
                       "family": r.case.family, "benign": r.case.benign,
                       "intended_check": r.case.intended_check,
                       "checks": list(r.checks), "stable": r.stable}
                      for r in self.results],
            "notes": list(self.notes),
        }

    def to_text(self) -> str:
        """A readable report: families, benign controls, misses, latency."""
        lines = [f"Injection suite on {MACHINE}: {len(self.adversarial)} adversarial "
                 f"cases in {len(self.families)} families, {len(self.benign)} "
                 f"benign controls, {self.repeats} repeat(s)", "",
                 f"{'gate':<7} {'family':<26} {'cases':>5} {'caught':>6} "
                 f"{'intended':>8}"]
        for fam, row in self.families.items():
            flag = "" if row["intended"] == row["cases"] else "  <-- miss"
            lines.append(f"{row['gate']:<7} {fam:<26} {row['cases']:>5} "
                         f"{row['caught']:>6} {row['intended']:>8}{flag}")
        adv = self.adversarial
        lines.append(f"{'all':<7} {'(adversarial)':<26} {len(adv):>5} "
                     f"{sum(r.caught for r in adv):>6} "
                     f"{sum(r.intended_hit for r in adv):>8}")
        ben = self.benign
        refused = [r for r in ben if not r.accepted]
        lines += ["", f"benign controls: {len(ben)}, accepted "
                      f"{len(ben) - len(refused)}, refused {len(refused)} "
                      f"(false-positive rate {self.false_positive_rate:.3f})"]
        lines += [f"  refused: {r.case.id} by {', '.join(r.checks)}"
                  for r in refused]
        by_gate = self.recall_by_gate
        lines += ["", "recall " + "  ".join(f"{g} {v:.3f}" for g, v in by_gate.items())
                  + f"  overall {self.recall:.3f}; intended accuracy "
                  f"{self.intended_accuracy:.3f}"]
        misses = [r for r in adv if not r.intended_hit]
        lines += [f"  missed intended: {r.case.id} ({r.case.intended_check}) "
                  f"fired: {', '.join(r.checks) or 'nothing'}" for r in misses]
        others = {k: {c: n for c, n in v["any"].items() if c != k}
                  for k, v in self.confusion.items()}
        others = {k: v for k, v in others.items() if v}
        if others:
            lines += ["", "other checks that also fired (intended -> check x cases)"]
            lines += [f"  {k:<28} " + ", ".join(f"{c} x{n}" for c, n in v.items())
                      for k, v in others.items()]
        lines += ["", f"latency per gate call ({self.repeats} repeat(s) per case)",
                  f"{'gate':<7} {'calls':>6} {'median us':>10} {'p99 us':>10} "
                  f"{'max us':>10}"]
        for gate, lat in self.latency.items():
            lines.append(f"{gate:<7} {lat['n']:>6} {lat['median_us']:>10.1f} "
                         f"{lat['p99_us']:>10.1f} {lat['max_us']:>10.1f}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Running

def _gate_call(case: Case, machine: Machine, bench: SealBench,
               root: Path) -> Callable[[], Verdict]:
    """The zero-argument gate call for ``case`` (setup done here, untimed)."""
    p = case.payload
    if case.gate == "gate1":
        snap = None
        if "healthy" in p or "free" in p:
            snap = dataclasses.replace(
                busy(machine, [0.0] * machine.n, p.get("healthy")),
                free_bytes=tuple(p.get("free", (d.mem_bytes for d in
                                                machine.devices))))
        nccl = p.get("nccl")
        return lambda: check_decision(p["decision"], p["task"], machine, snap,
                                      nccl_available=nccl)
    if case.gate == "gate2a":
        if "options" in p:
            return lambda: check_compile_options(p["options"])
        return lambda: scan_source(p["source"], p["kernel"])
    if case.gate == "plane":
        return _plane_call(case, root / "plane" / case.id)
    folder = root / "cache" / case.id
    folder.mkdir(parents=True)
    try:
        return TAMPERS[p["tamper"]](bench, folder, **p["args"])
    except ValueError as exc:
        # a tamper operation whose arguments do not fit the sealed entry
        raise AuditError(f"case {case.id}: {exc}") from exc


def _accept_everything(source: str, entry: str | None = None,
                       **options: object) -> Verdict:
    return Verdict("gate2a", [])


def _accept_all_ptx(ptx: str, entry: str | None = None,
                    block: int | None = None) -> Verdict:
    return Verdict("gate2c", [])


def _plane_call(case: Case, folder: Path) -> Callable[[], Verdict]:
    """The answer of ``case`` through the whole code-generation plane, as a
    gate: the checks are those that refused it (``plane.<check>``), none when
    it was served. A payload that left its marker on the host counts as
    served (a miss), whatever refused it afterwards: the boundary failed."""
    p = case.payload
    folder.mkdir(parents=True, mode=0o700)
    marker = folder / "host-marker"
    task = TaskSpec(p["kind"], PLANE_DIMS[p["kind"]], p["dtype"])
    decision = Decision((0,), (1.0,), task.split_size, 128,
                        "single").with_hash(task)
    answer = FixedAnswer(p["answer"].replace("${marker}", str(marker)), name="audit")

    def call() -> Verdict:
        gen = CodeGenerator(cache=KernelCache(folder / "kernels",
                                              folder / "keys" / "seal.key"),
                            spot_runner="emulated", measure_resources=False)
        saved = plane.scan_source, plane.check_ptx
        if p["blind_scanner"]:  # both static scans, of the source and the PTX
            plane.scan_source, plane.check_ptx = _accept_everything, \
                _accept_all_ptx
        try:
            kernel = gen.generate(task, decision, answer)
        finally:
            plane.scan_source, plane.check_ptx = saved
        if marker.exists():
            return Verdict("plane", [])
        return Verdict("plane", [Violation(f"plane.{c}", why) for c, why in
                                 zip(kernel.refused_by, kernel.reasons,
                                     strict=True)])
    return call


def _plane_verdict(case: Case, folder: str) -> tuple[tuple[str, ...], float]:
    """One end-to-end case, in a worker process: (its checks, its seconds)."""
    call = _plane_call(case, Path(folder))
    start = time.perf_counter()
    verdict = call()
    return verdict.checks, time.perf_counter() - start


def _log_at(level: int) -> None:
    """A worker's start: the plane's log at the level its caller set (the
    security chapter keeps refusals out of its page; a spawned process
    would otherwise print each one)."""
    plane.log.setLevel(level)


def _run_plane(cases: Sequence[Case], root: Path, workers: int, progress: bool
               ) -> Iterator[tuple[int, tuple[str, ...], float]]:
    """(index, checks, seconds) of each end-to-end case, as each finishes.

    The cases run in up to ``workers`` processes: each spends seconds
    compiling and running its answer, in subprocesses of its own, under CPU
    limits, so running them side by side on separate cores changes no
    verdict. A case blinds the static scans by swapping module functions,
    which a process keeps to itself; the plane's log keeps the level the
    caller gave it."""
    bar = tqdm(total=len(cases), desc="end-to-end cases", unit="case",
               disable=not progress)
    try:
        if workers <= 1:
            for i, case in enumerate(cases):
                yield (i, *_plane_verdict(case, str(root / "plane" / case.id)))
                bar.update()
            return
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                 initializer=_log_at,
                                 initargs=(plane.log.getEffectiveLevel(),)) as pool:
            futures = {pool.submit(_plane_verdict, case,
                                   str(root / "plane" / case.id)): i
                       for i, case in enumerate(cases)}
            for done in as_completed(futures):
                yield (futures[done], *done.result())
                bar.update()
    finally:
        bar.close()


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of non-empty ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def run_audit(repeats: int = 3, seed: int = 0, end_to_end: bool = False,
              progress: bool = False) -> AuditReport:
    """Run every case through its gate ``repeats`` times.

    Args:
        repeats: gate calls per case (>= 1); the first gives the verdict, all
            give latency, and a case whose checks differ between repeats is
            marked unstable.
        seed: seeds the run order (shuffled per repeat) and the byte flipped
            by the ``flip_random_binary_bit`` tamper; no result should depend
            on it.
        end_to_end: also push the ``plane`` cases through the whole
            code-generation plane (seconds each: a sandboxed compile, an
            emulated build under the sanitizers), once each, after the
            other gates' cases, side by side in up to :data:`PLANE_WORKERS`
            processes (one per core).
        progress: show a progress bar over the end-to-end cases.

    Returns:
        An :class:`AuditReport`. Gate 2b keys and entries live in a temporary
        folder (key file mode 0600) removed before returning.

    Raises:
        ValueError: ``repeats`` below 1.
        AuditError: the case table is malformed, a tamper operation does not
            fit the sealed entry, or a key file is not 0600.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    cases, notes = load_cases()
    if not end_to_end:
        cases = [c for c in cases if c.gate != "plane"]
    rng = random.Random(seed)
    machine = load_machine(MACHINE)
    with tempfile.TemporaryDirectory(prefix="gpuhive-audit-") as tmp:
        root = Path(tmp)
        bench = SealBench(Seal(root / "keys" / "seal.key"),
                          Seal(root / "stranger" / "seal.key"),
                          Seal(root / "spare" / "seal.key"), rng)
        for key in (bench.seal, bench.stranger, bench.spare):
            mode = stat.S_IMODE(key.key_path.stat().st_mode)
            if mode != 0o600:
                raise AuditError(f"key file {key.key_path} has mode {mode:04o}, "
                                 "expected 0600")
        quick = [i for i, c in enumerate(cases) if c.gate != "plane"]
        calls = {i: _gate_call(cases[i], machine, bench, root) for i in quick}
        checks: list[list[tuple[str, ...]]] = [[] for _ in cases]
        seconds: list[list[float]] = [[] for _ in cases]
        for _ in range(repeats):
            rng.shuffle(quick)
            for i in quick:
                start = time.perf_counter()
                verdict = calls[i]()
                seconds[i].append(time.perf_counter() - start)
                checks[i].append(verdict.checks)
        # end to end once each (seconds, not microseconds), after the
        # microsecond gates so that their latencies are taken alone
        plane = [i for i, c in enumerate(cases) if c.gate == "plane"]
        workers = min(PLANE_WORKERS, len(os.sched_getaffinity(0)), len(plane))
        for k, found, took in _run_plane([cases[i] for i in plane], root, workers,
                                         progress):
            seconds[plane[k]].append(took)
            checks[plane[k]].append(found)
    results = tuple(CaseResult(c, checks[i][0], tuple(seconds[i]),
                               stable=len(set(checks[i])) == 1)
                    for i, c in enumerate(cases))
    latency = {}
    for gate in GATES:
        times = [s * 1e6 for r in results if r.case.gate == gate for s in r.seconds]
        if times:
            latency[gate] = {"n": len(times),
                             "median_us": statistics.median(times),
                             "p99_us": _percentile(times, 99),
                             "max_us": max(times)}
    unstable = [r.case.id for r in results if not r.stable]
    if unstable:
        notes.append(f"checks differed between repeats: {', '.join(unstable)}")
    return AuditReport(results, latency, repeats, seed, tuple(notes))
