"""The injection suite: its table and the files it is read from, its scores,
and proof that it can fail."""

from __future__ import annotations

import json
import logging
import re
import stat

import pytest

from lib.codegen import plane
from lib.contract import Decision, TaskSpec
from lib.evaluation import audit, audit_cases, audit_tamper
from lib.security import gate1, scan, seal
from lib.security.verdict import Verdict, Violation

#: Cases that once got through; each must now be caught by its intended check.
FORMER_GAPS = {
    "g2a.fp.lambda_unary_plus": "token.function_pointer",
    "g2b.rollback_index_deleted": "seal.rollback",
    "g2b.rollback_old_index": "seal.rollback",
    "g1.chunk_count.one_row": "feasibility.chunk_count",
    "g1.negative.zero": "contract.negative_share",
    "g2b.copy_from_other_folder": "seal.placement",
    "g2b.rollback_counter_deleted": "seal.rollback",
    "g2b.fifo": "seal.io",
    "g2b.sparse_oversize": "seal.io",
    "g2b.target_arch": "seal.target",
    "g2b.loose_folder_group": "seal.folder",
}


@pytest.fixture(scope="module")
def cases():
    table, notes = audit_cases.load_cases()
    assert notes == [], notes  # the project's kernels are found in a checkout
    return table


@pytest.fixture(scope="module")
def report():
    return audit.run_audit(repeats=2, seed=0)


# ---- the table -------------------------------------------------------------


def test_case_counts(cases):
    adversarial = [c for c in cases if not c.benign]
    benign = [c for c in cases if c.benign]
    families = {c.family for c in adversarial}
    assert len(adversarial) >= 60
    assert len(families) >= 20
    assert len(benign) >= 20
    for gate in audit.GATES:
        assert any(c.gate == gate for c in adversarial), gate
        assert any(c.gate == gate for c in benign), gate
        # the end-to-end cases are few, seconds each: two families
        least = 2 if gate == "plane" else 5
        assert len({c.family for c in adversarial if c.gate == gate}) >= least, gate


def test_every_intended_check_is_in_its_gates_table(cases):
    tables = {"gate1": gate1.__doc__, "gate2a": scan.__doc__, "gate2b": seal.__doc__}
    for c in cases:
        if c.benign:
            assert c.intended_check is None, c.id
        elif c.gate == "plane":
            assert c.intended_check.removeprefix("plane.") in plane.CHECKS, c.id
        else:
            assert re.search(rf"^{re.escape(c.intended_check)}\s", tables[c.gate],
                             re.M), f"{c.id}: {c.intended_check}"


def test_project_kernels_are_benign_controls_one_per_kind(cases):
    ids = {c.id for c in cases if c.benign and c.id.startswith("g2a.ok.project_")}
    assert ids == {f"g2a.ok.project_{k}" for k in
                   ("elementwise", "histogram", "matmul", "reduce", "stencil")}


def test_malformed_table_is_refused_naming_the_case(cases):
    with pytest.raises(audit.AuditError, match="case g1.share_sum.over: duplicate"):
        audit_cases.validate_cases([cases[0], cases[0]])
    moved = audit_cases.Case("x.1", "gate2a", cases[0].family, "token.asm", {})
    with pytest.raises(audit.AuditError, match="case x.1: family 'share-sum'"):
        audit_cases.validate_cases([cases[0], moved])


def test_every_tamper_operation_is_used_by_a_case(cases):
    used = {c.payload["tamper"] for c in cases if c.gate == "gate2b"}
    assert used == set(audit_tamper.TAMPERS)


# ---- the case files ----------------------------------------------------------

GATE1_HEAD = """gate: gate1
tasks:
  base: {kind: matmul, dims: {M: 64, N: 64, K: 64}}
  half: {kind: matmul, dims: {M: 64, N: 64, K: 32}}
base_decision: {gpus: [0], shares: [1.0], chunk: 64, mode: single}
"""


def _load(folder, **files):
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(text)
    return audit_cases.load_cases(folder, kernels_dir=folder / "no-kernels")


def test_case_files_fill_placeholders_and_build_payloads(tmp_path):
    table, notes = _load(tmp_path, gate1=GATE1_HEAD + """
adversarial:
  - {id: g1.t, family: f1, check: c1, text: '"${config_hash}"'}
  - {id: g1.r, family: f1, check: c1, text: "${deep}",
     repeat: {deep: {text: "[", times: 5}}}
  - {id: g1.h, family: f1, check: c1, decision: {}, hashed_for: half}
  - {id: g1.o, family: f1, check: c1, object: {extra: 1}, drop: [block]}
  - {id: g1.u, family: f1, check: c1, decision: {block: true}, rehash: false}
benign:
  - {id: g1.ok, family: f0, decision: {}, healthy: [true], nccl: false}
""", gate2a="""gate: gate2a
adversarial:
  - {id: g2a.b, family: f2, check: c2, source: "x\\xff", as_bytes: true}
  - {id: g2a.o, family: f2, check: c2, options: ["-O3"], as_bytes: true}
benign:
  - {id: g2a.p, family: f3, project_kernel: matmul}
""", gate2b="""gate: gate2b
adversarial:
  - {id: g2b.t, family: f4, check: c4, tamper: truncate, args: {keep: 0}}
""")
    by_id = {c.id: c for c in table}
    base = Decision((0,), (1.0,), 64, mode="single")
    task, half = TaskSpec("matmul", {"M": 64, "N": 64, "K": 64}), \
        TaskSpec("matmul", {"M": 64, "N": 64, "K": 32})
    digest = base.with_hash(task).config_hash
    assert by_id["g1.t"].payload["decision"] == f'"{digest}"'
    assert by_id["g1.r"].payload["decision"] == "[" * 5
    assert by_id["g1.h"].payload == {"decision": base.with_hash(half), "task": task}
    obj = by_id["g1.o"].payload["decision"]
    assert obj["extra"] == 1 and "block" not in obj and obj["config_hash"] == digest
    assert by_id["g1.u"].payload["decision"].block is True
    assert by_id["g1.u"].payload["decision"].config_hash == digest
    assert by_id["g1.ok"].benign and by_id["g1.ok"].intended_check is None
    assert by_id["g1.ok"].payload["healthy"] == (True,)
    assert by_id["g1.ok"].payload["nccl"] is False
    assert by_id["g2a.b"].payload == {"source": b"x\xff", "kernel": "k"}
    assert by_id["g2a.o"].payload == {"options": [b"-O3"]}
    assert by_id["g2b.t"].payload == {"tamper": "truncate", "args": {"keep": 0}}
    assert "g2a.p" not in by_id  # no kernels folder: left out, with a note
    assert len(notes) == 1 and "matmul.cu not read" in notes[0]


ONE_2B = "gate: gate2b\nadversarial:\n  - {id: g2b.x, family: f, check: c, %s}\n"


@pytest.mark.parametrize("files, message", [
    ({"a": ONE_2B % "tamper: verify_fresh, tampr: 1"},
     "a.yaml: case g2b.x: unknown key 'tampr'"),
    ({"a": "gate: gate2b\nadversarial:\n  - {id: g2b.x, family: f, "
           "tamper: verify_fresh}\n"},
     "a.yaml: case g2b.x: missing field 'check'"),
    ({"a": "gate: gate2b\nadversarial:\n  - {family: f, check: c, "
           "tamper: verify_fresh}\n"},
     "a.yaml: case #1 of adversarial: missing field 'id'"),
    ({"a": ONE_2B % "tamper: verify_fresh" + "  - {id: g2b.x, family: f, check: "
                                             "c, tamper: load_fresh}\n"},
     "a.yaml: case g2b.x: duplicate id"),
    ({"a": ONE_2B % "tamper: verify_fresh", "b": ONE_2B % "tamper: load_fresh"},
     "b.yaml: case g2b.x: duplicate id"),
    ({"a": "gate: gate2b\nbenign:\n  - {id: g2b.x, family: f, check: c, "
           "tamper: verify_fresh}\n"},
     "a.yaml: case g2b.x: a benign control has no check"),
    ({"a": ONE_2B % "tamper: shred"},
     "a.yaml: case g2b.x: unknown tamper operation 'shred'"),
    ({"a": ONE_2B % "tamper: truncate"},
     "a.yaml: case g2b.x: tamper truncate: missing a required argument: 'keep'"),
    ({"a": ONE_2B % "tamper: truncate, args: {keep: 1, at: 2}"},
     "a.yaml: case g2b.x: tamper truncate: got an unexpected keyword argument"),
    ({"a": "gate: gate2a\nadversarial:\n  - {id: g2a.x, family: f, check: c, "
           "source: s, options: []}\n"},
     "a.yaml: case g2a.x: needs exactly one of source, options, project_kernel, "
     "got source, options"),
    ({"a": "gate: gate2a\nadversarial:\n  - {id: g2a.x, family: f, check: c, "
           "source: '${nope}'}\n"},
     r"a.yaml: case g2a.x: unknown placeholder \$\{nope\}"),
    ({"a": GATE1_HEAD + "adversarial:\n  - {id: g1.x, family: f, check: c, "
                        "decision: {}, task: nope}\n"},
     "a.yaml: case g1.x: task 'nope' is not one of tasks: base, half"),
    ({"a": GATE1_HEAD + "adversarial:\n  - {id: g1.x, family: f, check: c, "
                        "decision: {priority: 1}}\n"},
     "a.yaml: case g1.x: cannot build the decision: .*'priority'"),
    ({"a": GATE1_HEAD + "adversarial:\n  - {id: g1.x, family: f, check: c, "
                        "object: {}, rehash: false}\n"},
     "a.yaml: case g1.x: rehash goes only with decision"),
    ({"a": "gate: gate2b\nextra: 1\n"}, "a.yaml: unknown key 'extra'"),
    ({"a": "gate: gate3\n"}, "a.yaml: gate must be one of gate1, gate2a, gate2b"),
    ({"a": "gate: gate2b\nadversarial: [\n"}, r"a.yaml: not valid YAML \(line "),
])
def test_malformed_case_files_are_refused_in_one_line(tmp_path, files, message):
    with pytest.raises(audit.AuditError, match=message) as info:
        _load(tmp_path, **files)
    assert "\n" not in str(info.value)


def test_a_tamper_that_does_not_fit_the_entry_names_the_case(monkeypatch):
    case = audit_cases.Case("g2b.x", "gate2b", "f", "seal.mac",
                            {"tamper": "replace_in_file",
                             "args": {"old": "no such text", "new": "x"}})
    monkeypatch.setattr(audit, "load_cases", lambda: ([case], []))
    with pytest.raises(audit.AuditError, match="case g2b.x: .*expected one"):
        audit.run_audit(repeats=1)


# ---- the scores ------------------------------------------------------------


def test_recall_is_one(report):
    assert [r.case.id for r in report.adversarial if not r.caught] == []
    assert report.recall == 1.0
    assert report.recall_by_gate == {gate: 1.0 for gate in audit.QUICK_GATES}


def test_intended_accuracy_is_one(report):
    assert [r.case.id for r in report.adversarial if not r.intended_hit] == []
    assert report.intended_accuracy == 1.0


def test_former_gaps_are_caught_by_their_intended_check(report):
    by_id = {r.case.id: r for r in report.results}
    for case_id, check in FORMER_GAPS.items():
        assert by_id[case_id].case.intended_check == check, case_id
        assert by_id[case_id].checks == (check,), case_id


def test_no_false_positives(report):
    assert report.false_positive_rate == 0.0
    assert all(r.accepted for r in report.benign)


def test_verdicts_are_stable_and_independent_of_the_seed(report):
    assert all(r.stable for r in report.results)
    other = audit.run_audit(repeats=1, seed=12345)
    assert {r.case.id: r.checks for r in other.results} == \
        {r.case.id: r.checks for r in report.results}


def test_confusion_counts_add_up(report):
    conf = report.confusion
    assert sum(row["cases"] for row in conf.values()) == len(report.adversarial)
    for check, row in conf.items():
        assert sum(row["first"].values()) == row["cases"]
        assert row["any"].get(check, 0) == row["hit"]
    # Pasted 'sys##tem' is named both as the macro trick and as the OS call.
    assert conf["pp.macro_hides_forbidden"]["any"]["token.os_call"] >= 1


def test_latency_is_reported_per_gate(report):
    assert set(report.latency) == set(audit.QUICK_GATES)
    for gate, lat in report.latency.items():
        cases = sum(r.case.gate == gate for r in report.results)
        assert lat["n"] == 2 * cases
        assert 0 < lat["median_us"] <= lat["p99_us"] <= lat["max_us"]


def test_key_file_is_mode_0600(monkeypatch):
    modes = []

    class Recording(audit.Seal):
        def __init__(self, key_path):
            super().__init__(key_path)
            modes.append(stat.S_IMODE(self.key_path.stat().st_mode))

    monkeypatch.setattr(audit, "Seal", Recording)
    audit.run_audit(repeats=1)
    assert modes == [0o600, 0o600, 0o600]  # ours, a stranger's, the spare


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        audit.run_audit(repeats=0)


# ---- the suite can fail ------------------------------------------------------


def test_a_scanner_that_accepts_everything_is_caught(monkeypatch):
    monkeypatch.setattr(audit, "scan_source",
                        lambda source, kernel_name: Verdict("gate2a"))
    rep = audit.run_audit(repeats=1)
    source_cases = [r for r in rep.adversarial if "source" in r.case.payload]
    assert source_cases and not any(r.caught for r in source_cases)
    assert rep.recall < 0.8
    assert rep.recall_by_gate["gate2a"] < 0.2  # only compile options still caught
    assert rep.families["inline-asm"]["caught"] == 0
    assert rep.families["compile-options"]["caught"] == \
        rep.families["compile-options"]["cases"]
    assert re.search(r"gate2a\s+inline-asm\s+3\s+0\s+0\s+<-- miss", rep.to_text())
    assert rep.false_positive_rate == 0.0


def test_a_gate1_without_integrity_is_caught(monkeypatch):
    real = audit.check_decision

    def no_integrity(*args, **kwargs):
        v = real(*args, **kwargs)
        kept = tuple(x for x in v.violations if not x.check.startswith("integrity"))
        return Verdict(v.gate, kept, v.seconds)

    monkeypatch.setattr(audit, "check_decision", no_integrity)
    rep = audit.run_audit(repeats=1)
    for fam in ("hash-tamper", "hash-missing", "hash-replay"):
        assert rep.families[fam]["caught"] == 0, fam
    assert rep.recall_by_gate["gate1"] < 1.0


def test_a_gate_that_refuses_everything_shows_false_positives(monkeypatch):
    monkeypatch.setattr(audit, "check_compile_options", lambda options: Verdict(
        "gate2a", (Violation("options.flag", "refused"),)))
    rep = audit.run_audit(repeats=1)
    refused = {r.case.id for r in rep.benign if not r.accepted}
    assert refused == {"g2a.opt.ok.sm80_o3_tile", "g2a.opt.ok.fast_math"}
    assert rep.false_positive_rate == pytest.approx(2 / len(rep.benign))
    assert "refused: g2a.opt.ok.sm80_o3_tile by options.flag" in rep.to_text()


# ---- the output ------------------------------------------------------------


def test_to_json_is_json_and_has_the_keys(report):
    obj = report.to_json()
    text = json.dumps(obj, allow_nan=False)
    back = json.loads(text)
    for key in ("recall", "false_positive_rate", "intended_accuracy", "families",
                "confusion", "latency"):
        assert key in back, key
    assert back["counts"]["adversarial"] == len(report.adversarial)
    assert len(back["cases"]) == len(report.results)
    assert back["families"]["inline-asm"] == {"gate": "gate2a", "cases": 3,
                                              "caught": 3, "intended": 3,
                                              "recall": 1.0}


def test_to_text_has_a_line_per_family_benign_and_latency(report):
    text = report.to_text()
    for fam, row in report.families.items():
        assert re.search(rf"^{row['gate']}\s+{re.escape(fam)}\s+{row['cases']}\s",
                         text, re.M), fam
    assert f"benign controls: {len(report.benign)}, accepted " \
           f"{len(report.benign)}, refused 0" in text
    for gate in audit.QUICK_GATES:
        assert re.search(rf"^{gate}\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$", text,
                         re.M), gate
    assert "missed intended" not in text
    assert "<-- miss" not in text


@pytest.mark.slow
def test_end_to_end_attacks_leave_no_trace_and_get_the_template():
    """Attack answers through the whole plane: every one refused by the check
    it was written for, its marker never on the host, and the benign answers
    served (Gate 2a blinded where a case says so: the boundary holds alone)."""
    from lib.security import sandbox

    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    report = audit.run_audit(repeats=1, end_to_end=True)
    plane = [r for r in report.results if r.case.gate == "plane"]
    adversarial = [r for r in plane if not r.case.benign]
    assert len(adversarial) >= 10 and {r.case.family for r in adversarial} >= {
        "plane-host-payload", "plane-runtime-hazard"}
    for r in adversarial:
        assert r.checks == (r.case.intended_check,), (r.case.id, r.checks)
    assert all(r.accepted for r in plane if r.case.benign)
    assert report.recall_by_gate["plane"] == 1.0



@pytest.fixture
def quick_plane_cases(cases):
    """Plane cases refused before anything is built (Gate 2a, the sandboxed
    preprocessor, NVRTC): under a second each, seconds apart."""
    from lib.security import sandbox

    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    picked = [c for c in cases if c.id in {
        "pl.host.ifndef_rtc", "pl.host.include_blind", "pl.host.host_function_blind"}]
    assert len(picked) == 3
    return picked


def test_end_to_end_cases_give_the_same_checks_alone_or_side_by_side(
        quick_plane_cases, tmp_path):
    # side by side the results come back out of order: each must still land
    # on its own case
    picked = quick_plane_cases
    alone = {k: found for k, found, _ in audit._run_plane(picked, tmp_path / "a", 1,
                                                          progress=False)}
    both = {k: found for k, found, _ in audit._run_plane(picked, tmp_path / "b", 2,
                                                         progress=False)}
    assert alone == both == {k: (c.intended_check,) for k, c in enumerate(picked)}


def test_end_to_end_workers_log_at_the_callers_level(quick_plane_cases, tmp_path,
                                                     capfd):
    # the security chapter sets the plane's log to ERROR so that its page
    # shows no refusal lines; the worker processes must keep that level
    plane_log = logging.getLogger("lib.codegen")
    before = plane_log.level
    try:
        for level, shown in ((logging.ERROR, False), (logging.WARNING, True)):
            plane_log.setLevel(level)
            list(audit._run_plane(quick_plane_cases, tmp_path / str(level), 2,
                                  progress=False))
            err = capfd.readouterr().err
            assert ("rejected audit kernel" in err) == shown, (level, err[-500:])
    finally:
        plane_log.setLevel(before)
