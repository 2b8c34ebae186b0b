"""The injection suite's table: cases read from ``cases/*.yaml`` and checked.

Every ``*.yaml`` file in :data:`CASES_DIR` is read (in name order) with
``yaml.safe_load``. A file is a mapping:

- ``gate``: which gate its cases go to (``gate1``, ``gate2a``, ``gate2b``, or
  ``plane``: an answer pushed end to end through the code-generation plane);
- ``adversarial``: a list of cases the gate must refuse, each naming the one
  check meant to catch it (``check``);
- ``benign``: a list of controls the gate must accept (no ``check``);
- for Gate 1 also ``tasks`` (name -> task; ``base`` is the default) and
  ``base_decision`` (the legal decision the cases change).

Each case is a mapping with ``id``, ``family``, ``check`` (adversarial only),
an optional ``note``, and the keys that make its payload, which differ per
gate; each file's header comment describes them. Unknown keys, missing
fields, a wrong type, duplicate ids and the like stop the load with a
one-line :class:`AuditError` naming the file and the case.

The strings of a Gate 1 payload and a Gate 2a source may hold placeholders
``${name}``, filled on load: Gate 1 offers the base decision's hash
(:data:`HASH_NAMES`), and a case may define its own with
``repeat: {name: {text: ..., times: n}}`` (``text`` repeated ``n`` times: an
input too long to write out).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lib.codegen.specialise import KERNELS_DIR, single_kernel
from lib.contract import Decision, TaskSpec
from lib.evaluation.audit_tamper import TAMPERS, flip_hex

GATES = ("gate1", "gate2a", "gate2b", "plane")
#: Where the case files live (shipped with the package).
CASES_DIR = Path(__file__).resolve().with_name("cases")
#: Gate 1 placeholders: the base decision's hash for the base task, as is, in
#: upper case, and with its first digit changed.
HASH_NAMES = ("config_hash", "config_hash_upper", "config_hash_flipped")


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
            (per-device free bytes for it) and ``nccl`` (overrides the
            machine's NCCL flag). Gate 2a: ``source`` and ``kernel`` (the
            expected kernel name), or ``options``. Gate 2b: ``tamper``, a key
            of :data:`~lib.evaluation.audit_tamper.TAMPERS`, and ``args``, its
            arguments. Plane: ``answer`` (an LLM's answer, ``${marker}``
            standing for a host path the payload must never create), ``kind``
            and ``dtype`` of the task, and ``blind_scanner`` (Gate 2a accepts
            everything, so the sandbox and the spot check must hold alone).
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


# ---------------------------------------------------------------------------
# The keys a file and a case may have

_SECTIONS = ("adversarial", "benign")
_FILE_KEYS = {"gate1": {"tasks", "base_decision"}, "gate2a": set(), "gate2b": set(),
              "plane": set()}
_CASE_KEYS = {"id", "family", "check", "note"}
#: Per gate: the keys of which a case has exactly one (its payload's form),
#: and the keys it may add.
_FORMS = {"gate1": ("decision", "object", "text", "value"),
          "gate2a": ("source", "options", "project_kernel"),
          "gate2b": ("tamper",),
          "plane": ("answer",)}
_EXTRAS = {"gate1": {"rehash", "drop", "task", "hashed_for", "healthy", "free",
                     "nccl", "repeat"},
           "gate2a": {"kernel", "as_bytes", "repeat"},
           "gate2b": {"args"},
           "plane": {"kind", "dtype", "blind_scanner"}}
#: Keys that only go with one form.
_ONLY_WITH = {"rehash": "decision", "drop": "object", "kernel": "source"}
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_]\w*)\}")


class _Where:
    """The file and case being read, for error messages."""

    def __init__(self, file: str | None, case: str | None = None) -> None:
        self.file, self.case = file, case

    def error(self, message: str) -> AuditError:
        parts = [self.file] if self.file else []
        parts += [f"case {self.case}"] if self.case else []
        return AuditError(": ".join([*parts, message]))


#: How an error names the type a key needs, in YAML's words.
_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string",
               int: "a whole number", bool: "true or false"}


def _expect(where: _Where, value: Any, kind: type, what: str) -> Any:
    """``value``, if it is a ``kind`` (a bool is not a number here)."""
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise where.error(f"{what} must be {_TYPE_NAMES[kind]}, got "
                          f"{type(value).__name__}")
    return value


def _fill(where: _Where, value: Any, names: Mapping[str, str]) -> Any:
    """``value`` with every ``${name}`` in its strings replaced."""
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            if m[1] not in names:
                raise where.error(f"unknown placeholder ${{{m[1]}}}")
            return names[m[1]]
        return _PLACEHOLDER.sub(sub, value)
    if isinstance(value, list):
        return [_fill(where, v, names) for v in value]
    if isinstance(value, dict):
        return {k: _fill(where, v, names) for k, v in value.items()}
    return value


def _repeats(where: _Where, spec: Any) -> dict[str, str]:
    """The placeholders a case's ``repeat`` defines."""
    out = {}
    for name, row in _expect(where, spec, dict, "repeat").items():
        row = _expect(where, row, dict, f"repeat {name}")
        if set(row) != {"text", "times"}:
            raise where.error(f"repeat {name} needs exactly 'text' and 'times'")
        out[name] = _expect(where, row["text"], str, f"repeat {name} text") * \
            _expect(where, row["times"], int, f"repeat {name} times")
    return out


# ---------------------------------------------------------------------------
# Payloads per gate

@dataclass(frozen=True)
class _Gate1Context:
    """What a Gate 1 file shares among its cases."""

    tasks: Mapping[str, TaskSpec]
    base: Decision
    hashes: Mapping[str, str]


def _gate1_context(where: _Where, doc: Mapping[str, Any]) -> _Gate1Context:
    tasks = {}
    for name, spec in _expect(where, doc.get("tasks"), dict, "tasks").items():
        try:
            tasks[name] = TaskSpec(**_expect(where, spec, dict, f"task {name}"))
        except (TypeError, ValueError) as exc:
            raise where.error(f"task {name}: {exc}") from exc
    if "base" not in tasks:
        raise where.error("tasks has no 'base'")
    try:
        base = Decision(**_expect(where, doc.get("base_decision"), dict,
                                  "base_decision"))
    except TypeError as exc:
        raise where.error(f"base_decision: {exc}") from exc
    digest = base.with_hash(tasks["base"]).config_hash
    hashes = dict(zip(HASH_NAMES, (digest, digest.upper(), flip_hex(digest)),
                      strict=True))
    return _Gate1Context(tasks, base, hashes)


def _gate1_payload(where: _Where, case: Mapping[str, Any],
                   ctx: _Gate1Context) -> dict[str, Any]:
    def task(key: str, default: str) -> TaskSpec:
        name = case.get(key, default)
        if name not in ctx.tasks:
            raise where.error(f"{key} {name!r} is not one of tasks: "
                              f"{', '.join(ctx.tasks)}")
        return ctx.tasks[name]

    sent = task("task", "base")
    hashed_for = task("hashed_for", case.get("task", "base"))
    names = {**ctx.hashes, **_repeats(where, case.get("repeat", {}))}
    try:
        if "decision" in case:
            fields = _fill(where, _expect(where, case["decision"], dict,
                                          "decision"), names)
            if _expect(where, case.get("rehash", True), bool, "rehash"):
                if "config_hash" in fields:
                    raise where.error("a decision that sets config_hash needs "
                                      "rehash: false")
                decision = dataclasses.replace(ctx.base, **fields) \
                    .with_hash(hashed_for)
            else:
                decision = dataclasses.replace(ctx.base.with_hash(hashed_for),
                                               **fields)
        elif "object" in case:
            decision = ctx.base.with_hash(hashed_for).to_json()
            decision.update(_fill(where, _expect(where, case["object"], dict,
                                                 "object"), names))
            for key in _expect(where, case.get("drop", []), list, "drop"):
                del decision[key]
        elif "text" in case:
            decision = _fill(where, _expect(where, case["text"], str, "text"),
                             names)
        else:
            decision = case["value"]
    except (TypeError, KeyError) as exc:
        raise where.error(f"cannot build the decision: {exc}") from exc
    payload: dict[str, Any] = {"decision": decision, "task": sent}
    for key in ("healthy", "free"):
        if key in case:
            payload[key] = tuple(_expect(where, case[key], list, key))
    if "nccl" in case:
        payload["nccl"] = _expect(where, case["nccl"], bool, "nccl")
    return payload


def _as_bytes(value: Any) -> Any:
    """Text as bytes, one byte per character (so ``\\xff`` is the byte 0xff)."""
    if isinstance(value, list):
        return [_as_bytes(v) for v in value]
    return value.encode("latin-1") if isinstance(value, str) else value


def _project_kernel(where: _Where, kind: Any, kernels_dir: Path,
                    notes: list[str]) -> tuple[dict[str, Any], str] | None:
    """A project kernel cut down to its fp32 entry point, and a note saying so;
    ``None`` (and a note) when it cannot be read."""
    path = kernels_dir / f"{_expect(where, kind, str, 'project_kernel')}.cu"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        notes.append(f"project kernel {path} not read ({exc.strerror}); its "
                     "benign control is left out")
        return None
    name = f"{kind}_fp32"
    return ({"source": single_kernel(text, name), "kernel": name},
            f"{path.name} cut down to {name}")


def _gate2a_payload(where: _Where, case: Mapping[str, Any]) -> dict[str, Any]:
    if "options" in case:
        payload = {"options": case["options"]}
    else:
        names = _repeats(where, case.get("repeat", {}))
        payload = {"source": _fill(where, case["source"], names),
                   "kernel": _expect(where, case.get("kernel", "k"), str, "kernel")}
    if _expect(where, case.get("as_bytes", False), bool, "as_bytes"):
        form = next(iter(payload))
        try:
            payload[form] = _as_bytes(payload[form])
        except UnicodeEncodeError as exc:
            raise where.error(f"as_bytes: {form} holds a character above "
                              f"\\xff ({exc.object[exc.start]!r})") from exc
    return payload


def _gate2b_payload(where: _Where, case: Mapping[str, Any]) -> dict[str, Any]:
    return {"tamper": _expect(where, case["tamper"], str, "tamper"),
            "args": _expect(where, case.get("args", {}), dict, "args")}


def _plane_payload(where: _Where, case: Mapping[str, Any]) -> dict[str, Any]:
    return {"answer": _expect(where, case["answer"], str, "answer"),
            "kind": _expect(where, case.get("kind", "elementwise"), str, "kind"),
            "dtype": _expect(where, case.get("dtype", "fp32"), str, "dtype"),
            "blind_scanner": _expect(where, case.get("blind_scanner", False), bool,
                                     "blind_scanner")}


# ---------------------------------------------------------------------------
# Reading

def _read(path: Path) -> dict[str, Any]:
    where = _Where(path.name)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise where.error(f"not valid YAML ({line}{problem})") from exc
    doc = _expect(where, doc, dict, "the file")
    gate = doc.get("gate")
    if gate not in GATES:
        raise where.error(f"gate must be one of {', '.join(GATES)}, got {gate!r}")
    unknown = set(doc) - {"gate", *_SECTIONS} - _FILE_KEYS[gate]
    if unknown:
        raise where.error(f"unknown key {sorted(unknown)[0]!r}")
    return doc


def _check_keys(where: _Where, gate: str, case: Mapping[str, Any],
                benign: bool) -> None:
    unknown = set(case) - _CASE_KEYS - set(_FORMS[gate]) - _EXTRAS[gate]
    if unknown:
        raise where.error(f"unknown key {sorted(unknown)[0]!r}")
    required = ("id", "family") if benign else ("id", "family", "check")
    for key in required:
        if key not in case:
            raise where.error(f"missing field {key!r}")
        _expect(where, case[key], str, key)
    if benign and "check" in case:
        raise where.error("a benign control has no check")
    _expect(where, case.get("note", ""), str, "note")
    forms = [k for k in _FORMS[gate] if k in case]
    if len(forms) != 1:
        raise where.error(f"needs exactly one of {', '.join(_FORMS[gate])}"
                          + (f", got {', '.join(forms)}" if forms else ""))
    for key, form in _ONLY_WITH.items():
        if key in case and form not in case:
            raise where.error(f"{key} goes only with {form}")


def _case(where: _Where, gate: str, row: Mapping[str, Any], benign: bool,
          ctx: _Gate1Context | None, kernels_dir: Path,
          notes: list[str]) -> Case | None:
    """One case from its mapping; ``None`` for a control that cannot be built."""
    _check_keys(where, gate, row, benign)
    note = row.get("note", "")
    if gate == "gate1":
        payload = _gate1_payload(where, row, ctx)
    elif "project_kernel" in row:
        built = _project_kernel(where, row["project_kernel"], kernels_dir, notes)
        if built is None:
            return None
        payload, note = built[0], note or built[1]
    elif gate == "gate2a":
        payload = _gate2a_payload(where, row)
    elif gate == "plane":
        payload = _plane_payload(where, row)
    else:
        payload = _gate2b_payload(where, row)
    return Case(row["id"], gate, row["family"], row.get("check"), payload,
                benign=benign, note=note)


def load_cases(folder: Path = CASES_DIR,
               kernels_dir: Path = KERNELS_DIR) -> tuple[list[Case], list[str]]:
    """The whole table, and notes on controls that could not be built.

    Args:
        folder: where the ``*.yaml`` case files are.
        kernels_dir: where the project's kernels are (a source checkout); a
            control built from one that cannot be read is left out, with a
            note.

    Raises:
        AuditError: a malformed file or case (see the module docstring), or a
            table :func:`validate_cases` refuses.
    """
    cases: list[Case] = []
    files: list[str] = []
    notes: list[str] = []
    paths = sorted(folder.glob("*.yaml"))
    if not paths:
        raise AuditError(f"{folder}: no case files (*.yaml)")
    for path in paths:
        doc = _read(path)
        gate = doc["gate"]
        ctx = _gate1_context(_Where(path.name), doc) if gate == "gate1" else None
        for section in _SECTIONS:
            rows = _expect(_Where(path.name), doc.get(section, []), list, section)
            for i, row in enumerate(rows):
                where = _Where(path.name, f"#{i + 1} of {section}")
                _expect(where, row, dict, "a case")
                if isinstance(row.get("id"), str):
                    where.case = row["id"]
                case = _case(where, gate, row, section == "benign", ctx,
                             kernels_dir, notes)
                if case is not None:
                    cases.append(case)
                    files.append(path.name)
    validate_cases(cases, files)
    return cases, notes


def _tamper_problem(payload: Mapping[str, Any]) -> str | None:
    """Why a Gate 2b payload names no valid operation call, or ``None``."""
    op: Callable[..., Any] | None = TAMPERS.get(payload.get("tamper"))
    if op is None:
        return f"unknown tamper operation {payload.get('tamper')!r}"
    try:
        inspect.signature(op).bind(None, None, **payload.get("args", {}))
    except TypeError as exc:
        return f"tamper {payload['tamper']}: {exc}"
    return None


def validate_cases(cases: list[Case], files: Sequence[str] | None = None) -> None:
    """Refuse a malformed table, naming the case (and its file, when given)."""
    seen: set[str] = set()
    gate_of: dict[str, str] = {}
    for i, c in enumerate(cases):
        where = _Where(files[i] if files else None, c.id)
        if c.id in seen:
            raise where.error("duplicate id")
        seen.add(c.id)
        if c.gate not in GATES:
            raise where.error(f"unknown gate {c.gate!r}")
        if gate_of.setdefault(c.family, c.gate) != c.gate:
            raise where.error(f"family {c.family!r} already belongs to "
                              f"{gate_of[c.family]}")
        if c.benign != (c.intended_check is None):
            raise where.error("a benign case has no intended check, an "
                              "adversarial one has exactly one")
        problem = _tamper_problem(c.payload) if c.gate == "gate2b" else None
        if problem:
            raise where.error(problem)
