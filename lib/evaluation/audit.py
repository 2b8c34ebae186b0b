"""The injection suite: how well do the three gates catch what they should?

A table of :class:`Case` objects, each one input for one gate: a Gate 1
decision, a Gate 2a CUDA source or list of compile options, or a Gate 2b
tampering recipe applied to a freshly sealed cache entry. An adversarial case
names the one check id meant to catch it (``intended_check``); a benign
control (``benign=True``) must be accepted.

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
import json
import math
import os
import random
import stat
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lib.codegen.specialise import KERNELS_DIR, single_kernel
from lib.contract import Decision, TaskSpec
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import busy
from lib.security.gate1 import check_decision
from lib.security.scan import check_compile_options, scan_source
from lib.security.seal import Seal, SealedEntry
from lib.security.verdict import Verdict

GATES = ("gate1", "gate2a", "gate2b")
MACHINE = "hetero-4"
#: Where the project's own kernels live (a source checkout; not packaged).


class AuditError(ValueError):
    """A malformed case table (the message names the case)."""


@dataclass(frozen=True)
class Case:
    """One input for one gate.

    Attributes:
        id: unique, stable name of the case (``"g1.share_sum.over"``).
        gate: ``"gate1"``, ``"gate2a"`` or ``"gate2b"``.
        family: the kind of attack (or ``"benign"``-prefixed control group);
            a family belongs to one gate.
        intended_check: the one check id meant to catch it; ``None`` for a
            benign control.
        payload: the input. Gate 1: ``decision``, ``task``, optional
            ``healthy`` (per-device flags for a telemetry snapshot), ``free``
            (per-device free bytes for it) and
            ``nccl`` (overrides the machine's NCCL flag). Gate 2a: ``source``
            and ``kernel`` (the expected kernel name), or ``options``. Gate
            2b: ``recipe``, a key of the recipe table (see :func:`_recipes`).
        benign: a control that must be accepted.
        note: why the case is what it is, when that is not obvious.
    """

    id: str
    gate: str
    family: str
    intended_check: str | None
    payload: Mapping[str, Any]
    benign: bool = False
    note: str = ""


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
        lines += ["", "recall " + "  ".join(f"{g} {by_gate[g]:.3f}" for g in GATES)
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
# Gate 1 cases

TASK = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192})
#: The same shapes in fp16: a decision hashed for it is replayed against TASK.
OTHER_TASK = TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192}, dtype="fp16")
HUGE_TASK = TaskSpec("matmul", {"M": 65536, "N": 65536, "K": 16384})
_BASE = Decision(gpus=(0, 2), shares=(0.75, 0.25), chunk=4096, block=256,
                 mode="split", comm_path="host")


def _decision(task: TaskSpec = TASK, **patch: Any) -> Decision:
    """The legal base decision with ``patch`` applied, hashed for ``task``."""
    d = dataclasses.replace(_BASE, **patch)
    return d.with_hash(task) if "config_hash" not in patch else d


def _raw(**patch: Any) -> Decision:
    """A decision holding wrong types: hashed first, then patched (no re-hash,
    since hashing calls int() and float() on the fields)."""
    return dataclasses.replace(_decision(), **patch)


def _as_dict(**patch: Any) -> dict[str, Any]:
    obj = _decision().to_json()
    obj.update(patch)
    return obj


def _without(name: str) -> dict[str, Any]:
    obj = _decision().to_json()
    del obj[name]
    return obj


def _flip_hex(digest: str) -> str:
    return ("0" if digest[0] != "0" else "1") + digest[1:]


def _g1(cid: str, family: str, check: str | None, decision: Any,
        task: TaskSpec = TASK, note: str = "", **extra: Any) -> Case:
    return Case(f"g1.{cid}", "gate1", family, check,
                {"decision": decision, "task": task, **extra},
                benign=check is None, note=note)


def _gate1_cases() -> list[Case]:
    legal_json = json.dumps(_decision().to_json())
    tampered = dataclasses.replace(_decision(), shares=(0.5, 0.5))
    return [
        _g1("share_sum.over", "share-sum", "contract.share_sum",
            _decision(shares=(0.75, 0.3))),
        _g1("share_sum.under", "share-sum", "contract.share_sum",
            _decision(shares=(0.7, 0.25))),
        _g1("share_sum.just_outside", "share-sum", "contract.share_sum",
            _decision(shares=(0.75, 0.25 + 2e-9))),
        _g1("share_sum.zero", "share-sum", "contract.share_sum",
            _decision(shares=(0.0, 0.0))),
        _g1("negative.pair", "negative-share", "contract.negative_share",
            _decision(shares=(1.25, -0.25))),
        _g1("negative.tiny", "negative-share", "contract.negative_share",
            _decision(gpus=(0, 1, 2), shares=(0.5, 0.5 + 1e-12, -1e-12))),
        _g1("nonfinite.nan", "nan-inf", "form.nonfinite",
            _raw(shares=(math.nan, 1.0))),
        _g1("nonfinite.inf", "nan-inf", "form.nonfinite",
            _raw(shares=(math.inf, -math.inf))),
        _g1("nonfinite.json_nan", "nan-inf", "form.json",
            legal_json.replace("0.25", "NaN"),
            note="JSON text: NaN is not JSON, so the strict parser refuses it"),
        _g1("bool.gpu", "bool-as-int", "form.bool", _raw(gpus=(True, 2))),
        _g1("bool.block", "bool-as-int", "form.bool", _raw(block=True)),
        _g1("bool.share", "bool-as-int", "form.bool", _raw(shares=(True, False))),
        _g1("float.chunk", "float-as-int", "form.float_as_int", _raw(chunk=4096.0)),
        _g1("float.gpu", "float-as-int", "form.float_as_int", _raw(gpus=(0.0, 2))),
        _g1("float.block", "float-as-int", "form.float_as_int", _raw(block=256.0)),
        _g1("unknown.priority", "unknown-field", "form.unknown_field",
            _as_dict(priority=99)),
        _g1("unknown.proto", "unknown-field", "form.unknown_field",
            _as_dict(__proto__={"gpus": [0]})),
        _g1("missing.block", "missing-field", "form.missing_field",
            _without("block")),
        _g1("type.gpus_string", "wrong-type", "form.type", _raw(gpus="0,2")),
        _g1("type.mode_int", "wrong-type", "form.type", _raw(mode=1)),
        _g1("type.not_object", "wrong-type", "form.object", [0, 2]),
        _g1("json.truncated", "wrong-type", "form.json", legal_json[:-5]),
        _g1("json.duplicate_key", "wrong-type", "form.json",
            legal_json[:-1] + ', "block": 1024}'),
        _g1("json.deep", "wrong-type", "form.json", "[" * 100_000),
        _g1("enum.mode", "enum-value", "contract.mode", _raw(mode="warp")),
        _g1("enum.comm_path", "enum-value", "contract.comm_path",
            _raw(comm_path="rdma")),
        _g1("length.mismatch", "share-length", "contract.length",
            _decision(shares=(1.0,))),
        _g1("single.two_devices", "single-mode", "contract.single_mode",
            _decision(mode="single")),
        _g1("duplicate.twice", "duplicate-device", "contract.duplicate_device",
            _decision(gpus=(2, 2), shares=(0.5, 0.5))),
        _g1("duplicate.three", "duplicate-device", "contract.duplicate_device",
            _decision(gpus=(0, 1, 0), shares=(0.4, 0.3, 0.3))),
        _g1("device.past_end", "nonexistent-device", "feasibility.device",
            _decision(gpus=(0, 4))),
        _g1("device.seven", "nonexistent-device", "feasibility.device",
            _decision(gpus=(0, 7))),
        _g1("device.negative", "nonexistent-device", "form.size",
            _decision(gpus=(0, -1)),
            note="a negative index is outside the contract's [0, 63] bound, "
                 "refused before feasibility looks at the machine"),
        _g1("unhealthy.used", "unhealthy-device", "feasibility.unhealthy",
            _decision(), healthy=(True, True, False, True)),
        _g1("memory.t4_alone", "memory-overflow", "feasibility.memory",
            _decision(HUGE_TASK, gpus=(3,), shares=(1.0,), mode="single"),
            task=HUGE_TASK),
        _g1("memory.t4_half", "memory-overflow", "feasibility.memory",
            _decision(HUGE_TASK, gpus=(0, 3), shares=(0.5, 0.5)), task=HUGE_TASK),
        _g1("memory.busy_device", "memory-overflow", "feasibility.memory",
            _decision(gpus=(0, 1), shares=(0.5, 0.5)),
            free=(80e9, 0.2e9, 32e9, 16e9),
            note="telemetry says device 1 has 0.2 GB free; its shard needs 0.54 GB"),
        _g1("block.not_multiple", "block-limits", "feasibility.block",
            _decision(block=100)),
        _g1("block.too_large", "block-limits", "feasibility.block",
            _decision(block=2048)),
        _g1("block.below_warp", "block-limits", "feasibility.block",
            _decision(block=16)),
        _g1("block.1056", "block-limits", "feasibility.block",
            _decision(block=1056)),
        _g1("chunk.past_dim", "chunk-range", "feasibility.chunk",
            _decision(chunk=8193)),
        _g1("chunk.huge", "chunk-range", "feasibility.chunk",
            _decision(chunk=2**30)),
        _g1("chunk.zero", "chunk-range", "form.size", _decision(chunk=0),
            note="0 is outside the contract's [1, 2**40] bound, refused by the "
                 "form layer before feasibility"),
        _g1("p2p.no_link", "p2p-without-link", "feasibility.p2p",
            _decision(comm_path="p2p")),
        _g1("p2p.h100_t4", "p2p-without-link", "feasibility.p2p",
            _decision(gpus=(0, 3), comm_path="p2p")),
        _g1("nccl.single", "nccl-misuse", "feasibility.nccl",
            _decision(gpus=(0,), shares=(1.0,), mode="single", comm_path="nccl")),
        _g1("nccl.unavailable", "nccl-misuse", "feasibility.nccl",
            _decision(comm_path="nccl"), nccl=False),
        _g1("hash.tampered_shares", "hash-tamper", "integrity.hash_mismatch",
            tampered),
        _g1("hash.flipped_digit", "hash-tamper", "integrity.hash_mismatch",
            _raw(config_hash=_flip_hex(_decision().config_hash))),
        _g1("hash.uppercase", "hash-tamper", "integrity.hash_mismatch",
            _raw(config_hash=_decision().config_hash.upper())),
        _g1("hash.empty", "hash-missing", "integrity.missing_hash",
            _raw(config_hash="")),
        _g1("hash.absent_field", "hash-missing", "integrity.missing_hash",
            _without("config_hash")),
        _g1("replay.other_dtype", "hash-replay", "integrity.hash_mismatch",
            _decision(OTHER_TASK),
            note="a legal decision hashed for the fp16 task, sent with fp32"),
        _g1("replay.other_shape", "hash-replay", "integrity.hash_mismatch",
            _decision(TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 4096}))),
        # Benign controls at the edges of legality.
        _g1("ok.base", "benign-decision", None, _decision()),
        _g1("ok.json_text", "benign-decision", None, legal_json),
        _g1("ok.share_sum_1e-10", "benign-decision", None,
            _decision(gpus=(0, 1, 2), shares=(0.25, 0.25, 0.5 + 9e-11))),
        _g1("ok.thirds", "benign-decision", None,
            _decision(gpus=(0, 1, 2), shares=(1 / 3, 1 / 3, 1 / 3))),
        _g1("ok.block_32", "benign-decision", None, _decision(block=32)),
        _g1("ok.block_1024", "benign-decision", None, _decision(block=1024)),
        _g1("ok.chunk_1", "benign-decision", None,
            _decision(chunk=1, mode="pipelined")),
        _g1("ok.chunk_dim", "benign-decision", None, _decision(chunk=8192)),
        _g1("ok.zero_share", "benign-decision", None,
            _decision(gpus=(0, 1, 3), shares=(0.6, 0.4, 0.0))),
        _g1("ok.p2p_nvlink", "benign-decision", None,
            _decision(gpus=(0, 1), comm_path="p2p")),
        _g1("ok.p2p_pcie", "benign-decision", None,
            _decision(gpus=(2, 3), comm_path="p2p")),
        _g1("ok.nccl_two", "benign-decision", None,
            _decision(gpus=(0, 1), comm_path="nccl")),
        _g1("ok.single", "benign-decision", None,
            _decision(gpus=(3,), shares=(1.0,), mode="single")),
        _g1("ok.unhealthy_unused", "benign-decision", None, _decision(),
            healthy=(True, True, True, False)),
    ]


# ---------------------------------------------------------------------------
# Gate 2a cases

def _kernel(body: str = "", head: str = "", name: str = "k",
            prefix: str = 'extern "C" __global__') -> str:
    """A small benign kernel with ``body`` lines inside and ``head`` above."""
    return (f"{head}{prefix} void {name}(const float* x, float* y, int n) {{\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"{body}"
            "    if (i < n) y[i] = 2.0f * x[i];\n"
            "}\n")


_HELPER = "__device__ void helper(float* p) { p[0] = 0.0f; }\n"


def _project_kernel_cases(kernels_dir: Path) -> tuple[list[Case], list[str]]:
    cases, notes = [], []
    for kind in ("elementwise", "histogram", "matmul", "reduce", "stencil"):
        path = kernels_dir / f"{kind}.cu"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            notes.append(f"project kernel {path} not read ({exc.strerror}); its "
                         "benign control is left out")
            continue
        name = f"{kind}_fp32"
        cases.append(Case(f"g2a.ok.project_{kind}", "gate2a", "benign-source", None,
                          {"source": single_kernel(text, name), "kernel": name},
                          benign=True, note=f"{path.name} cut down to {name}"))
    return cases, notes


def _g2a(cid: str, family: str, check: str | None, source: Any,
         kernel: str = "k", note: str = "") -> Case:
    return Case(f"g2a.{cid}", "gate2a", family, check,
                {"source": source, "kernel": kernel}, benign=check is None,
                note=note)


def _opts(cid: str, family: str, check: str | None, options: Any) -> Case:
    return Case(f"g2a.opt.{cid}", "gate2a", family, check, {"options": options},
                benign=check is None)


_BOMB = "".join(f"#define A{i} A{i - 1} A{i - 1}\n" for i in range(1, 24))


def _gate2a_cases() -> list[Case]:
    k = _kernel
    return [
        _g2a("trigraph.include", "trigraph-digraph", "pp.trigraph",
             k(head="??=include <stdio.h>\n")),
        _g2a("trigraph.asm_brackets", "trigraph-digraph", "pp.trigraph",
             k("    float t??(1??) = {0};\n")),
        _g2a("digraph.include", "trigraph-digraph", "pp.include",
             k(head="%:include <stdio.h>\n")),
        _g2a("digraph.paste", "macro-pasting", "pp.macro_hides_forbidden",
             k('    CAT(sys, tem)("id");\n', "#define CAT(a, b) a %:%: b\n")),
        _g2a("digraph.pragma", "trigraph-digraph", "pp.pragma",
             k(head="%:pragma GCC poison helper\n")),
        _g2a("splice.include", "line-splice", "pp.include",
             k(head="#inc\\\nlude <stdio.h>\n")),
        _g2a("splice.system", "line-splice", "token.os_call",
             k('    sys\\\ntem("ls");\n')),
        _g2a("splice.asm", "line-splice", "token.asm", k('    as\\\nm("trap;");\n')),
        _g2a("splice.whitespace", "line-splice", "pp.splice_whitespace",
             k("    int j = 0; \\  \n    (void)j;\n")),
        _g2a("paste.system", "macro-pasting", "pp.macro_hides_forbidden",
             k('    CAT(sys, tem)("id");\n', "#define CAT(a, b) a##b\n")),
        _g2a("paste.asm", "macro-pasting", "pp.macro_hides_forbidden",
             k('    J(a, sm)("trap;");\n', "#define J(a, b) a ## b\n")),
        _g2a("paste.nested", "macro-pasting", "pp.macro_hides_forbidden",
             k('    OUT(pr, intf)("x");\n',
               "#define P2(a, b) a##b\n#define OUT(a, b) P2(a, b)\n")),
        _g2a("macro.body_printf", "macro-pasting", "pp.macro_hides_forbidden",
             k('    SAY("x");\n', "#define SAY printf\n"),
             note="the directive itself also holds 'printf'"),
        _g2a("comment.spliced_end", "comment-escape", "token.os_call",
             k('    /* looks closed later *\\\n/ system("x"); // */\n')),
        _g2a("comment.nested", "comment-escape", "token.os_call",
             k('    /* outer /* inner */ system("x"); /* */\n')),
        _g2a("comment.escaped_quote", "comment-escape", "token.os_call",
             k('    const char* s = "\\\\"; system("x"); (void)s; // "\n')),
        _g2a("comment.char_quote", "comment-escape", "token.os_call",
             k("    char q = '\"'; system(\"x\"); (void)q; // '\"'\n")),
        _g2a("comment.lone_cr", "comment-escape", "token.os_call",
             k('    // a remark\r    system("x");\n'),
             note="a lone CR ends the line comment for the compiler"),
        _g2a("cond.if0_asm", "conditional-hiding", "token.asm",
             k('#if 0\n    asm("trap;");\n#endif\n')),
        _g2a("cond.else_asm", "conditional-hiding", "token.asm",
             k('#ifdef __CUDA_ARCH__\n    y[0] = 0.0f;\n#else\n'
               '    asm volatile("exit;");\n#endif\n')),
        _g2a("cond.two_defs", "conditional-hiding", "pp.macro_hides_forbidden",
             k('    F("x");\n', "#ifdef FAST\n#define F system\n#else\n"
                               "#define F(s) (void)0\n#endif\n")),
        _g2a("cond.elif_system", "conditional-hiding", "token.os_call",
             k('#if defined(A)\n    y[0] = 1.0f;\n#elif 1\n    system("x");\n'
               "#endif\n")),
        _g2a("pragma_op.direct", "pragma-operator", "pp._Pragma",
             k('    _Pragma("nv_diag_suppress 177")\n')),
        _g2a("pragma_op.macro", "pragma-operator", "pp._Pragma",
             k("    P(GCC poison x)\n", "#define P(x) _Pragma(#x)\n")),
        _g2a("pragma_op.pasted", "pragma-operator", "pp._Pragma",
             k('    PR("once")\n', "#define PR _Pra##gma\n")),
        _g2a("pragma_op.msvc", "pragma-operator", "pp._Pragma",
             k("    __pragma(warning(disable: 4996))\n")),
        _g2a("bidi.comment", "trojan-source", "bytes.bidi",
             k("    /* \u202e } \u2066 if (isAdmin) { \u2069 \u2066 */\n")),
        _g2a("bidi.string", "trojan-source", "bytes.bidi",
             k('    const char* s = "user\u202e \u2066// admin";\n    (void)s;\n')),
        _g2a("homoglyph.cyrillic_e", "homoglyph", "bytes.non_ascii",
             k('    syst\u0435m("ls");\n')),
        _g2a("homoglyph.greek_kernel", "homoglyph", "bytes.non_ascii",
             k(name="k\u03bf"), kernel="k\u03bf"),
        _g2a("ucn.system", "ucn-identifier", "bytes.ucn",
             k('    sys\\u0074em("ls");\n')),
        _g2a("ucn.asm", "ucn-identifier", "bytes.ucn",
             k('    \\u0061sm("trap;");\n')),
        _g2a("asm.plain", "inline-asm", "token.asm", k('    asm("trap;");\n')),
        _g2a("asm.gnu", "inline-asm", "token.asm",
             k('    __asm__ __volatile__("exit;");\n')),
        _g2a("asm.ptx_clock", "inline-asm", "token.asm",
             k('    unsigned c;\n    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));'
               "\n")),
        _g2a("file.fopen", "file-io", "token.file_io",
             k('    FILE* f = fopen("/etc/passwd", "r");\n')),
        _g2a("file.write", "file-io", "token.file_io",
             k('    write(1, "x", 1);\n')),
        _g2a("file.fread", "file-io", "token.file_io",
             k("    char b[4];\n    fread(b, 1, 4, 0);\n")),
        _g2a("os.system", "os-call", "token.os_call", k('    system("rm -rf /");\n')),
        _g2a("os.socket", "os-call", "token.os_call",
             k("    int s = socket(2, 1, 0);\n    connect(s, 0, 0);\n")),
        _g2a("os.getenv", "os-call", "token.os_call",
             k('    const char* h = getenv("HOME");\n')),
        _g2a("os.execve", "os-call", "token.os_call",
             k('    execve("/bin/sh", 0, 0);\n')),
        _g2a("os.popen", "os-call", "token.os_call", k('    popen("id", "r");\n')),
        _g2a("print.printf", "device-printf-malloc", "token.printf",
             k('    printf("%d\\n", i);\n')),
        _g2a("alloc.malloc", "device-printf-malloc", "token.malloc",
             k("    float* p = (float*)malloc(64);\n")),
        _g2a("alloc.new", "device-printf-malloc", "token.malloc",
             k("    float* p = new float[16];\n")),
        _g2a("alloc.free", "device-printf-malloc", "token.malloc",
             k("    free(y);\n")),
        _g2a("trap.trap", "trap-assert", "token.trap", k("    if (n < 0) __trap();\n")),
        _g2a("trap.assert", "trap-assert", "token.trap", k("    assert(i < n);\n")),
        _g2a("trap.brkpt", "trap-assert", "token.trap", k("    __brkpt();\n")),
        _g2a("fp.declarator", "function-pointer", "token.function_pointer",
             k("    void (*fp)(float*) = helper;\n    fp(y);\n", _HELPER)),
        _g2a("fp.address", "function-pointer", "token.function_pointer",
             k("    auto f = &helper;\n    f(y);\n", _HELPER)),
        _g2a("fp.typedef", "function-pointer", "token.function_pointer",
             k("", "typedef void Fn(float*);\n")),
        _g2a("fp.lambda_unary_plus", "function-pointer", "token.function_pointer",
             k("    auto p = +[](float* q) { q[0] = 1.0f; };\n    p(y);\n"),
             note="unary plus turns a captureless lambda into a function pointer"),
        _g2a("fp.virtual", "function-pointer", "token.function_pointer",
             k("", "struct S { virtual void f(); };\n")),
        _g2a("launch.chevrons", "device-launch", "token.device_launch",
             k("    child<<<1, 32>>>(y);\n",
               "__global__ void child(float* y);\n"),
             note="also a second, non-extern-C kernel declaration"),
        _g2a("launch.api", "device-launch", "token.device_launch",
             k("    cudaLaunchDevice(0, 0, dim3(1), dim3(1), 0, 0);\n")),
        _g2a("launch.graph", "device-launch", "token.device_launch",
             k("    cudaGraphLaunch(0, 0);\n")),
        _g2a("kernel.two", "kernel-shape", "kernel.count",
             k() + k(name="k2")),
        _g2a("kernel.none", "kernel-shape", "kernel.count",
             "__device__ float twice(float v) { return 2.0f * v; }\n"),
        _g2a("kernel.wrong_name", "kernel-shape", "kernel.name", k(name="evil")),
        _g2a("kernel.not_extern_c", "kernel-shape", "kernel.extern_c",
             k(prefix="__global__")),
        _g2a("kernel.attribute_global", "kernel-shape", "kernel.count",
             k() + "__attribute__((global)) void k3(float* y) { y[0] = 1.0f; }\n"),
        _g2a("kernel.macro_global", "kernel-shape", "kernel.count",
             k() + k(name="k2", head="#define G __global__\n",
                     prefix='extern "C" G')),
        _g2a("include.stdio", "disallowed-include", "pp.include",
             k(head="#include <stdio.h>\n")),
        _g2a("include.etc_passwd", "disallowed-include", "pp.include",
             k(head='#include "/etc/passwd"\n')),
        _g2a("include.next", "disallowed-include", "pp.include",
             k(head="#include_next <cuda_fp16.h>\n")),
        _g2a("include.has_include", "disallowed-include", "pp.include",
             k(head="#if __has_include(<stdio.h>)\n#endif\n")),
        _g2a("include.import", "disallowed-include", "pp.include",
             k(head="#import <stdio.h>\n")),
        _g2a("include.computed", "computed-include", "pp.computed_include",
             k(head="#define HDR <stdio.h>\n#include HDR\n")),
        _g2a("include.computed_str", "computed-include", "pp.computed_include",
             k(head='#define HDR "cuda_fp16.h"\n#include HDR\n'),
             note="even an allowed header is refused when named through a macro"),
        _g2a("line.directive", "line-marker", "pp.line",
             k(head='#line 1 "trusted.cu"\n')),
        _g2a("line.marker", "line-marker", "pp.line", k(head='# 12 "other.cu"\n')),
        _g2a("pragma.poison", "disallowed-pragma", "pp.pragma",
             k(head="#pragma GCC poison helper\n")),
        _g2a("pragma.diag", "disallowed-pragma", "pp.pragma",
             k(head="#pragma nv_diag_suppress 177\n")),
        _g2a("pragma.unroll_extra", "disallowed-pragma", "pp.pragma",
             k("#pragma unroll 4 system\n    for (int r = 0; r < 4; ++r) y[r] = 0;\n")),
        _g2a("directive.ident", "odd-directive", "pp.directive",
             k(head='#ident "x"\n')),
        _g2a("directive.stray_hash", "odd-directive", "pp.stray_hash",
             k("    int j = 1 # 2;\n")),
        _g2a("directive.define_global", "odd-directive", "pp.define_reserved",
             k(head="#define __global__ __device__\n")),
        _g2a("directive.bomb", "odd-directive", "pp.expansion_limit",
             k("    A23;\n", "#define A0 x x\n" + _BOMB)),
        _g2a("bytes.nul", "raw-bytes", "bytes.control", k("    int z = 0;\x00\n")),
        _g2a("bytes.invalid_utf8", "raw-bytes", "bytes.utf8",
             k("    // \n").encode() + b"\xff\xfe\n"),
        _g2a("bytes.oversize", "raw-bytes", "bytes.size",
             k("    // " + "x" * 300_000 + "\n")),
        _g2a("bytes.not_text", "raw-bytes", "bytes.type", 12345),
        _g2a("bytes.raw_string", "raw-bytes", "token.raw_string",
             k('    const char* s = R"(system("x"))";\n')),
        _opts("xcompiler", "compile-options", "options.flag",
              ["-arch=sm_80", "-Xcompiler=-fplugin=/tmp/evil.so"]),
        _opts("include_dir", "compile-options", "options.flag", ["-I/etc"]),
        _opts("pre_include", "compile-options", "options.flag",
              ["--pre-include=/etc/passwd"]),
        _opts("include_flag", "compile-options", "options.flag",
              ["-include", "/etc/passwd"]),
        _opts("ccbin", "compile-options", "options.flag", ["-ccbin=/tmp/evil"]),
        _opts("two_in_one", "compile-options", "options.flag", ["-O3 -Xlinker=-x"]),
        _opts("arch_old", "compile-options", "options.arch", ["-arch=sm_50"]),
        _opts("define_shell", "compile-options", "options.define",
              ["-DX=$(rm -rf /)"]),
        _opts("define_lower", "compile-options", "options.define", ["-Dtile=16"]),
        _opts("define_undef", "compile-options", "options.flag", ["-U__CUDA_ARCH__"]),
        _opts("define_reserved", "compile-options", "options.define",
              ["-D__CUDA_ARCH__=1"]),
        _opts("options_file", "compile-options", "options.flag",
              ["--options-file=/tmp/more-options"]),
        _opts("as_string", "compile-options", "options.type", "-O3"),
        _opts("as_bytes_item", "compile-options", "options.type", [b"-O3"]),
        # Benign controls.
        _g2a("ok.minimal", "benign-source", None, k()),
        _g2a("ok.comment_words", "benign-source", None,
             k("    // system(), printf, asm, fopen, malloc, __trap: not here\n"
               "    /* #include <stdio.h> and <<<1, 1>>> in a comment */\n")),
        _g2a("ok.string_words", "benign-source", None,
             k('    const char* s = "system printf asm fopen";\n    (void)s;\n')),
        _g2a("ok.identifiers", "benign-source", None,
             k("    int system_load = 1, printf_count = 2, asm_count = 3;\n"
               "    int free_bytes = system_load + printf_count + asm_count;\n"
               "    (void)free_bytes;\n")),
        _g2a("ok.atomic", "benign-source", None,
             k("    if (i < n) atomicAdd(&y[0], x[i]);\n")),
        _g2a("ok.shuffle", "benign-source", None,
             k("    float v = i < n ? x[i] : 0.0f;\n"
               "    for (int o = 16; o > 0; o /= 2)\n"
               "        v += __shfl_down_sync(0xffffffffu, v, o);\n")),
        _g2a("ok.shared", "benign-source", None,
             k("    __shared__ float tile[256];\n"
               "    tile[threadIdx.x] = i < n ? x[i] : 0.0f;\n"
               "    __syncthreads();\n")),
        _g2a("ok.pragma_unroll", "benign-source", None,
             k("#pragma unroll\n    for (int r = 0; r < 4; ++r) (void)r;\n"
               "#pragma unroll 4\n    for (int r = 0; r < 8; ++r) (void)r;\n")),
        _g2a("ok.fp16_include", "benign-source", None,
             k("    __half h = __float2half(1.0f);\n    (void)h;\n",
               "#include <cuda_fp16.h>\n")),
        _g2a("ok.bf16_include", "benign-source", None,
             k("    __nv_bfloat16 b = __float2bfloat16(1.0f);\n    (void)b;\n",
               "#include <cuda_bf16.h>\n")),
        _g2a("ok.macro_tile", "benign-source", None,
             k("    float t[TILE];\n    t[0] = 0.0f;\n",
               "#ifndef TILE\n#define TILE 16\n#endif\n")),
        _opts("ok.sm80_o3_tile", "benign-options", None,
              ["-arch=sm_80", "-O3", "-DTILE=16"]),
        _opts("ok.fast_math", "benign-options", None,
              ["--gpu-architecture=compute_90", "-std=c++17", "--use_fast_math",
               "-lineinfo", "-DT=__half"]),
    ]


# ---------------------------------------------------------------------------
# Gate 2b cases: recipes that tamper with a freshly sealed entry

HASH_A = "a" * 64
HASH_B = "b" * 64
SEAL_SOURCE = _kernel()
SEAL_OPTIONS = ("-arch=sm_90", "-O3")
#: A recipe prepares its entry in ``folder`` and returns the gate call to time.
Recipe = Callable[["_SealBench", Path], Callable[[], Verdict]]


@dataclass
class _SealBench:
    """Our key, a stranger's, a spare one and a seeded byte picker.

    The spare key is for the case that corrupts a key's high-water index:
    done to ours, it would refuse every other case's entry too.
    """

    seal: Seal
    stranger: Seal
    spare: Seal
    rng: random.Random

    def entry(self, config_hash: str = HASH_A, by: Seal | None = None,
              binary: bytes = bytes(range(256)) * 4) -> SealedEntry:
        return (by or self.seal).seal(SEAL_SOURCE, binary, config_hash,
                                      SEAL_OPTIONS, "sm_90", "nvrtc 12.4")

    def written(self, folder: Path, entry: SealedEntry | None = None) -> Path:
        path = folder / "entry.sealed"
        self.seal.write(entry or self.entry(), path)
        return path

    def load(self, path: Path, expected: str = HASH_A) -> Callable[[], Verdict]:
        return lambda: self.seal.load(path, expected)[1]

    def verify(self, entry: Any, expected: str = HASH_A) -> Callable[[], Verdict]:
        return lambda: self.seal.verify(entry, expected)


def _edit_file(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    if data.count(old) != 1:
        raise AuditError(f"{path}: expected one {old!r} to replace, found "
                         f"{data.count(old)}")
    path.write_bytes(data.replace(old, new))


def _rewrite_body(path: Path, edit: Callable[[dict], None]) -> None:
    """Re-encode the entry file canonically after ``edit`` changes its body."""
    head, body = path.read_bytes().split(b"\n", 1)
    obj = json.loads(body)
    edit(obj)
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode("ascii")
    path.write_bytes(b" ".join(head.split(b" ")[:2]) + f" {len(body)}\n".encode()
                     + body)


def _flip_binary(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    e = b.entry()
    pos = b.rng.randrange(len(e.binary))
    raw = bytearray(e.binary)
    raw[pos] ^= 0x01
    return b.verify(dataclasses.replace(e, binary=bytes(raw)))


def _flip_source_file(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    path = b.written(folder)
    _edit_file(path, b"2.0f", b"3.0f")
    return b.load(path)


def _flip_binary_file(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    path = b.written(folder)
    _rewrite_body(path, lambda o: o.update(binary="B" + o["binary"][1:]))
    return b.load(path)


def _flip_mac_file(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    path = b.written(folder)
    _rewrite_body(path, lambda o: o.update(mac=_flip_hex(o["mac"])))
    return b.load(path)


def _swap_file(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    path = b.written(folder, b.entry(HASH_B))
    return b.load(path, HASH_A)


def _relabel(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    return b.verify(dataclasses.replace(b.entry(HASH_B), config_hash=HASH_A))


def _rollback(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    path = b.written(folder, b.entry(binary=b"old, vulnerable build"))
    old = path.read_bytes()
    b.written(folder, b.entry(binary=b"new, fixed build"))
    path.write_bytes(old)
    return b.load(path)


def _rollback_copy(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    old = b.written(folder, b.entry(binary=b"old build")).read_bytes()
    b.written(folder, b.entry(binary=b"new build"))
    copy = folder / "other-name.sealed"
    copy.write_bytes(old)
    return b.load(copy)


def _folder_files(folder: Path) -> dict[Path, bytes]:
    """Every file the attacker can reach in a cache folder, with its bytes."""
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _rollback_index_deleted(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    """Put the old entry back and delete every other file in the cache folder
    (a high-water index kept there would go with them)."""
    recipe = _rollback(b, folder)
    for p in _folder_files(folder):
        if p.name != "entry.sealed":
            p.unlink()
    return recipe


def _rollback_old_index(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    """Snapshot the whole cache folder after the old write and restore it after
    the new one (an index kept there would be restored with the entry)."""
    path = b.written(folder, b.entry(binary=b"old, vulnerable build"))
    snapshot = _folder_files(folder)
    b.written(folder, b.entry(binary=b"new, fixed build"))
    for p in _folder_files(folder):
        if p not in snapshot:
            p.unlink()
    for p, data in snapshot.items():
        p.write_bytes(data)
    return b.load(path)


def _truncate(keep: Callable[[int], int]) -> Recipe:
    def recipe(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
        path = b.written(folder)
        data = path.read_bytes()
        path.write_bytes(data[:keep(len(data))])
        return b.load(path)
    return recipe


def _append(tail: bytes, head: bytes = b"") -> Recipe:
    """Append ``tail`` to the file; with ``head``, replace its first bytes."""
    def recipe(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
        path = b.written(folder)
        data = path.read_bytes()
        path.write_bytes(head + data[len(head):] + tail)
        return b.load(path)
    return recipe


def _missing_mac_file(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    path = b.written(folder)
    _rewrite_body(path, lambda o: o.pop("mac"))
    return b.load(path)


def _foreign_file(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    theirs = folder / "theirs"
    b.stranger.write(b.entry(by=b.stranger), theirs / "entry.sealed")
    path = folder / "entry.sealed"
    path.write_bytes((theirs / "entry.sealed").read_bytes())
    return b.load(path)


def _tamper_index(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    """Lower the marks in the high-water index next to the (spare) key.

    The index lives in the trusted key folder, out of the cache attacker's
    reach; this is corruption, or an attacker without the key who got in
    there. Either way the index MAC must refuse it."""
    path = folder / "entry.sealed"
    b.spare.write(b.entry(by=b.spare), path)
    index = b.spare.index_path
    obj = json.loads(index.read_bytes())
    obj["high_water"] = {f: {k: 0 for k in row}
                         for f, row in obj["high_water"].items()}
    index.write_bytes(json.dumps(obj).encode())
    return lambda: b.spare.load(path, HASH_A)[1]


def _symlink(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    real = b.written(folder)
    link = folder / "link.sealed"
    os.symlink(real, link)
    return b.load(link)


def _fresh_load(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
    return b.load(b.written(folder))


def _recipes() -> dict[str, Recipe]:
    """Recipe name -> recipe; each gets its own folder."""
    def mem(**change: Any) -> Recipe:
        def recipe(b: _SealBench, folder: Path) -> Callable[[], Verdict]:
            e = b.entry()
            fields = {k: (v(e) if callable(v) else v) for k, v in change.items()}
            return b.verify(dataclasses.replace(e, **fields))
        return recipe

    return {
        "fresh_verify": lambda b, folder: b.verify(b.entry()),
        "fresh_load": _fresh_load,
        "flip_source": mem(source=lambda e: e.source.replace("2.0f", "3.0f")),
        "flip_binary": _flip_binary,
        "flip_mac": mem(mac=lambda e: _flip_hex(e.mac)),
        "mac_uppercase": mem(mac=lambda e: e.mac.upper()),
        "flip_source_file": _flip_source_file,
        "flip_binary_file": _flip_binary_file,
        "flip_mac_file": _flip_mac_file,
        "forge_counter": mem(counter=lambda e: e.counter + 1000),
        "forge_options": mem(options=lambda e: e.options + ("-Xcompiler=-x",)),
        "forge_arch": mem(arch="sm_75"),
        "swap_memory": lambda b, folder: b.verify(b.entry(HASH_B), HASH_A),
        "swap_file": _swap_file,
        "relabel_config_hash": _relabel,
        "rollback": _rollback,
        "rollback_copy": _rollback_copy,
        "rollback_index_deleted": _rollback_index_deleted,
        "rollback_old_index": _rollback_old_index,
        "truncate_half": _truncate(lambda n: n // 2),
        "truncate_header": _truncate(lambda n: 10),
        "truncate_empty": _truncate(lambda n: 0),
        "missing_mac": mem(mac=""),
        "missing_mac_file": _missing_mac_file,
        "foreign_key": lambda b, folder: b.verify(b.entry(by=b.stranger)),
        "foreign_key_file": _foreign_file,
        "tamper_index": _tamper_index,
        "symlink": _symlink,
        "missing_file": lambda b, folder: b.load(folder / "absent.sealed"),
        "not_an_entry": lambda b, folder: b.verify({"mac": "0" * 64}),
        "trailing_bytes": _append(b"\n"),
        "bad_header": _append(b"", head=b"GPUHIVE-SEAL 2"),
    }


def _gate2b_cases() -> list[Case]:
    rows = [
        ("flip_source", "seal-flipped-byte", "seal.mac"),
        ("flip_binary", "seal-flipped-byte", "seal.mac"),
        ("flip_mac", "seal-flipped-byte", "seal.mac"),
        ("mac_uppercase", "seal-flipped-byte", "seal.mac"),
        ("flip_source_file", "seal-flipped-byte", "seal.mac"),
        ("flip_binary_file", "seal-flipped-byte", "seal.mac"),
        ("flip_mac_file", "seal-flipped-byte", "seal.mac"),
        ("forge_counter", "seal-forged-field", "seal.mac"),
        ("forge_options", "seal-forged-field", "seal.mac"),
        ("forge_arch", "seal-forged-field", "seal.mac"),
        ("swap_memory", "seal-swap", "seal.key_mismatch"),
        ("swap_file", "seal-swap", "seal.key_mismatch"),
        ("relabel_config_hash", "seal-swap", "seal.mac"),
        ("rollback", "seal-rollback", "seal.rollback"),
        ("rollback_copy", "seal-rollback", "seal.rollback"),
        ("rollback_index_deleted", "seal-rollback", "seal.rollback"),
        ("rollback_old_index", "seal-rollback", "seal.rollback"),
        ("truncate_half", "seal-truncation", "seal.truncated"),
        ("truncate_header", "seal-truncation", "seal.truncated"),
        ("truncate_empty", "seal-truncation", "seal.truncated"),
        ("missing_mac", "seal-missing-mac", "seal.missing_mac"),
        ("missing_mac_file", "seal-missing-mac", "seal.missing_mac"),
        ("foreign_key", "seal-foreign-key", "seal.mac"),
        ("foreign_key_file", "seal-foreign-key", "seal.mac"),
        ("tamper_index", "seal-index", "seal.index"),
        ("symlink", "seal-io", "seal.io"),
        ("missing_file", "seal-io", "seal.io"),
        ("not_an_entry", "seal-format", "seal.format"),
        ("trailing_bytes", "seal-format", "seal.format"),
        ("bad_header", "seal-format", "seal.format"),
        ("fresh_verify", "benign-seal", None),
        ("fresh_load", "benign-seal", None),
    ]
    return [Case(f"g2b.{name}", "gate2b", family, check, {"recipe": name},
                 benign=check is None) for name, family, check in rows]


def default_cases(kernels_dir: Path = KERNELS_DIR) -> tuple[list[Case], list[str]]:
    """The whole table, and notes on controls that could not be built.

    Raises:
        AuditError: a duplicate case id, a family spread over two gates, or
            an adversarial case without an intended check.
    """
    project, notes = _project_kernel_cases(kernels_dir)
    cases = _gate1_cases() + _gate2a_cases() + project + _gate2b_cases()
    validate_cases(cases)
    return cases, notes


def validate_cases(cases: list[Case]) -> None:
    """Refuse a malformed table, naming the case."""
    seen: set[str] = set()
    gate_of: dict[str, str] = {}
    recipes = _recipes()
    for c in cases:
        if c.id in seen:
            raise AuditError(f"case {c.id}: duplicate id")
        seen.add(c.id)
        if c.gate not in GATES:
            raise AuditError(f"case {c.id}: unknown gate {c.gate!r}")
        if gate_of.setdefault(c.family, c.gate) != c.gate:
            raise AuditError(f"case {c.id}: family {c.family!r} already belongs "
                             f"to {gate_of[c.family]}")
        if c.benign != (c.intended_check is None):
            raise AuditError(f"case {c.id}: a benign case has no intended check, "
                             "an adversarial one has exactly one")
        if c.gate == "gate2b" and c.payload.get("recipe") not in recipes:
            raise AuditError(f"case {c.id}: unknown recipe "
                             f"{c.payload.get('recipe')!r}")


# ---------------------------------------------------------------------------
# Running

def _gate_call(case: Case, machine: Machine, bench: _SealBench,
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
    folder = root / "cache" / case.id
    folder.mkdir(parents=True)
    return _recipes()[p["recipe"]](bench, folder)


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of non-empty ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def run_audit(repeats: int = 3, seed: int = 0) -> AuditReport:
    """Run every case through its gate ``repeats`` times.

    Args:
        repeats: gate calls per case (>= 1); the first gives the verdict, all
            give latency, and a case whose checks differ between repeats is
            marked unstable.
        seed: seeds the run order (shuffled per repeat) and the byte flipped
            in the binary-flip recipe; no result should depend on it.

    Returns:
        An :class:`AuditReport`. Gate 2b keys and entries live in a temporary
        folder (key file mode 0600) removed before returning.

    Raises:
        ValueError: ``repeats`` below 1.
        AuditError: the case table is malformed, or a key file is not 0600.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    cases, notes = default_cases()
    rng = random.Random(seed)
    machine = load_machine(MACHINE)
    with tempfile.TemporaryDirectory(prefix="gpuhive-audit-") as tmp:
        root = Path(tmp)
        bench = _SealBench(Seal(root / "keys" / "seal.key"),
                           Seal(root / "stranger" / "seal.key"),
                           Seal(root / "spare" / "seal.key"), rng)
        for key in (bench.seal, bench.stranger, bench.spare):
            mode = stat.S_IMODE(key.key_path.stat().st_mode)
            if mode != 0o600:
                raise AuditError(f"key file {key.key_path} has mode {mode:04o}, "
                                 "expected 0600")
        calls = [_gate_call(c, machine, bench, root) for c in cases]
        checks: list[list[tuple[str, ...]]] = [[] for _ in cases]
        seconds: list[list[float]] = [[] for _ in cases]
        order = list(range(len(cases)))
        for _ in range(repeats):
            rng.shuffle(order)
            for i in order:
                start = time.perf_counter()
                verdict = calls[i]()
                seconds[i].append(time.perf_counter() - start)
                checks[i].append(verdict.checks)
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
