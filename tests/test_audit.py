"""The injection suite: its table, its scores, and proof that it can fail."""

from __future__ import annotations

import json
import re
import stat

import pytest

from lib.evaluation import audit
from lib.security import gate1, scan, seal
from lib.security.verdict import Verdict, Violation

#: Cases that once got through; each must now be caught by its intended check.
FORMER_GAPS = {
    "g2a.fp.lambda_unary_plus": "token.function_pointer",
    "g2b.rollback_index_deleted": "seal.rollback",
    "g2b.rollback_old_index": "seal.rollback",
}


@pytest.fixture(scope="module")
def cases():
    table, notes = audit.default_cases()
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
        assert len({c.family for c in adversarial if c.gate == gate}) >= 5, gate


def test_every_intended_check_is_in_its_gates_table(cases):
    tables = {"gate1": gate1.__doc__, "gate2a": scan.__doc__, "gate2b": seal.__doc__}
    for c in cases:
        if c.benign:
            assert c.intended_check is None, c.id
        else:
            assert re.search(rf"^{re.escape(c.intended_check)}\s", tables[c.gate],
                             re.M), f"{c.id}: {c.intended_check}"


def test_project_kernels_are_benign_controls_one_per_kind(cases):
    ids = {c.id for c in cases if c.benign and c.id.startswith("g2a.ok.project_")}
    assert ids == {f"g2a.ok.project_{k}" for k in
                   ("elementwise", "histogram", "matmul", "reduce", "stencil")}


def test_malformed_table_is_refused_naming_the_case(cases):
    with pytest.raises(audit.AuditError, match="case g1.share_sum.over: duplicate"):
        audit.validate_cases([cases[0], cases[0]])
    moved = audit.Case("x.1", "gate2a", cases[0].family, "token.asm", {})
    with pytest.raises(audit.AuditError, match="case x.1: family 'share-sum'"):
        audit.validate_cases([cases[0], moved])


# ---- the scores ------------------------------------------------------------


def test_recall_is_one(report):
    assert [r.case.id for r in report.adversarial if not r.caught] == []
    assert report.recall == 1.0
    assert report.recall_by_gate == {gate: 1.0 for gate in audit.GATES}


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
    assert set(report.latency) == set(audit.GATES)
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
    for gate in audit.GATES:
        assert re.search(rf"^{gate}\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$", text,
                         re.M), gate
    assert "missed intended" not in text
    assert "<-- miss" not in text
