"""The findings chapter types no number of its own: every number on the page
is a MyST substitution that ``lib.book`` fills from the evaluation chapter's
record at build time, so a rebuild on another machine cannot contradict its
own text. No book is built here: the page is read as text and the
substitutions are computed from a sample record.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from lib import book

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "book" / "findings.md"
SUBSTITUTION = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
#: What may hold digits without being a typed number: substitutions, inline
#: code (file and machine names), a role's target (citation keys, page
#: paths), a directive's line and its options, and names such as T1 or Gate 1.
_ALLOWED = [
    SUBSTITUTION,
    re.compile(r"^\s*(```|:::)\{[^}]*\}.*$", re.M),
    re.compile(r"`[^`\n]*`"),
    re.compile(r"^\s*:[a-z-]+:.*$", re.M),
    re.compile(r"\bT[1-7]\b"),
    re.compile(r"\bGate [12][ab]?\b"),
]

SAMPLE = {
    "notebook": "m09-evaluation", "machine": "hetero-4", "backend": "model",
    "budget": "quick", "seed": 0, "written": "2026-01-01T00:00:00",
    "values": {
        "label": "PREDICTED (model)",
        "table4": {
            "rl-ppo": {"speedup": 2.0609, "ci95": [1.8743, 2.2816],
                       "ratio_to_optimum": 1.02422, "decide_p50_us": 133.9},
            "heft": {"speedup": 1.5371, "ci95": [1.4005, 1.6876],
                     "ratio_to_optimum": 1.37328, "decide_p50_us": 1049.7},
            "proportional-peak": {"speedup": 1.4824, "ci95": [1.3813, 1.5894],
                                  "ratio_to_optimum": 1.42394,
                                  "decide_p50_us": 26.3},
            "oracle": {"speedup": 2.1109, "ci95": [1.9127, 2.3412],
                       "ratio_to_optimum": 1.0, "decide_p50_us": 7591.0},
        },
        "targets": {f"T{i}": {"passed": i != 6, "line": f"T{i} ...",
                              "value": f"value {i}.5", "bound": f"<= {i}.0",
                              "note": ""} for i in range(1, 8)},
        "ablations": [
            {"variant": "full", "speedup": 1.99, "ratio_to_optimum": 1.0271,
             "how": "the shipped policy"},
            {"variant": "no telemetry features", "speedup": 1.93,
             "ratio_to_optimum": 1.0592, "how": "zeroed"},
            {"variant": "no topology features", "speedup": 1.81,
             "ratio_to_optimum": 1.1314, "how": "zeroed"},
        ],
        "transfer": [
            {"machine": "held-out-a", "when": "zero-shot", "ratio_to_optimum": 1.018},
            {"machine": "held-out-a", "when": "fine-tuned", "ratio_to_optimum": 1.017},
            {"machine": "held-out-b", "when": "zero-shot", "ratio_to_optimum": 1.024},
        ],
        "latency": {"p50_us": 73.4, "p99_us": 100.2, "decisions": 800},
        "learned_vs_optimum": {"a": "rl-ppo", "b": "oracle", "states": ["busy"],
                               "tasks": 20, "ratio": 0.98765,
                               "ci95": [0.9712, 0.99871], "wins": 0,
                               "losses": 7, "ties": 13,
                               "label": "PREDICTED (model)"},
        "per_state": {"rl-ppo": {"idle": 2.134, "busy": 1.987},
                      "equal": {"idle": 1.0, "busy": 1.0},
                      "oracle": {"idle": 2.18, "busy": 2.04},
                      "heft": {"idle": 1.58, "busy": 1.501}},
        "across": [
            {"machine": "hetero-4", "state": "idle", "rl_over_opt": 1.021,
             "heft_over_opt": 1.382, "peak_over_opt": 1.439, "speedup": 2.14,
             "heft_speedup": 1.58},
            {"machine": "hetero-4", "state": "busy", "rl_over_opt": 1.0365,
             "heft_over_opt": 1.365, "peak_over_opt": 1.409, "speedup": 1.99,
             "heft_speedup": 1.50},
        ],
    },
}


def _typed_numbers(text: str) -> list[str]:
    for pattern in _ALLOWED:
        text = pattern.sub(" ", text)
    return [line.strip() for line in text.splitlines() if re.search(r"\d", line)]


def test_findings_type_no_number():
    typed = _typed_numbers(FINDINGS.read_text())
    assert not typed, f"numbers typed in findings.md (substitute them): {typed}"


def test_the_check_catches_a_typed_number():
    assert _typed_numbers("about 2.06x faster, {{ rl_speedup }}x")
    assert _typed_numbers("within 3.5 % of the optimum")
    assert not _typed_numbers("T1 and Gate 1 in `hetero-4`, {cite}`li2010linucb`")


def test_no_substitution_sits_in_inline_code():
    """Inline code is literal: a substitution there would print its braces."""
    code = re.findall(r"`[^`\n]*`", FINDINGS.read_text())
    assert not [c for c in code if SUBSTITUTION.search(c)]


def test_every_substitution_the_page_uses_is_provided():
    used = set(SUBSTITUTION.findall(FINDINGS.read_text()))
    assert used, "findings.md uses no substitution"
    for record in (SAMPLE, None):  # the keys are there even without a record
        missing = used - set(book.findings_substitutions(record))
        assert not missing, f"no substitution for {sorted(missing)}"


def test_substitutions_equal_the_recorded_values():
    subs = book.findings_substitutions(SAMPLE)
    values = SAMPLE["values"]
    rl = values["table4"]["rl-ppo"]
    assert subs["eval_machine"] == "hetero-4" and subs["eval_budget"] == "quick"
    assert subs["eval_label"] == "PREDICTED (model)"
    assert (subs["h2h_ratio"], subs["h2h_ci_low"], subs["h2h_ci_high"]) == \
        ("0.988", "0.971", "0.999")
    assert (subs["h2h_tasks"], subs["h2h_wins"], subs["h2h_losses"],
            subs["h2h_ties"], subs["h2h_states"]) == ("20", "0", "7", "13", "busy")
    assert subs["rl_speedup"] == f"{rl['speedup']:.2f}" == "2.06"
    assert subs["rl_ci_low"] == "1.87" and subs["rl_ci_high"] == "2.28"
    assert subs["rl_ratio"] == f"{rl['ratio_to_optimum']:.3f}" == "1.024"
    assert subs["rl_against_optimum"] == "2.4 % slower than"
    assert subs["heft_speedup"] == "1.54" and subs["peak_ratio"] == "1.424"
    assert subs["optimum_speedup"] == "2.11" and subs["optimum_ratio"] == "1.000"
    for i in range(1, 8):
        t = values["targets"][f"T{i}"]
        assert subs[f"t{i}_value"] == t["value"] and subs[f"t{i}_bound"] == t["bound"]
        assert subs[f"t{i}_verdict"] == ("PASS" if t["passed"] else "FAIL")
    assert subs["latency_p50_us"] == "73" and subs["latency_p99_us"] == "100"
    assert subs["ablations_finding"] == (
        "Zeroing features at decision time, in the busy state: without "
        "telemetry the policy's time is 1.059 times the optimum's, without "
        "topology 1.131, against 1.027 as shipped. It leans on both.")
    assert subs["transfer_machines"] == "2" and subs["transfer_worst_ratio"] == "1.024"
    assert subs["across_worst_gap_pct"] == "3.6"
    table = subs["across_table"].splitlines()
    assert len(table) == 2 + len(values["across"])
    assert "| 1.021 | 2.14x | 1.58x | 1.382 |" in table[2]
    states = subs["states_table"].splitlines()
    assert states[0] == "| policy | idle | busy |"
    # the policies in the table's order; equal split (1x by definition) left out
    assert states[2:] == ["| `rl-ppo` | 2.13x | 1.99x |",
                          "| `oracle` | 2.18x | 2.04x |",
                          "| `heft` | 1.58x | 1.50x |"]


def test_without_a_record_every_number_says_so():
    subs = book.findings_substitutions(None)
    assert subs["rl_speedup"] == subs["t2_value"] == book.MISSING


def test_the_extension_reads_the_machines_record(tmp_path, monkeypatch):
    folder = tmp_path / "_build" / "records" / "hetero-4"
    folder.mkdir(parents=True)
    (folder / "m09-evaluation.json").write_text(json.dumps(SAMPLE))
    stage = tmp_path / "_build" / "book-src"  # where build_book stages the book
    stage.mkdir()
    monkeypatch.delenv("GPUHIVE_RECORD_DIR", raising=False)
    monkeypatch.setenv("GPUHIVE_BOOK_MACHINE", "hetero-4")

    class App:
        srcdir = str(stage)

    class Config:
        myst_substitutions = {"eval_seed": "kept"}

    config = Config()
    book._findings_config(App(), config)
    assert config.myst_substitutions["rl_speedup"] == "2.06"
    assert config.myst_substitutions["eval_seed"] == "kept"  # the book's own win
    monkeypatch.setenv("GPUHIVE_RECORD_DIR", str(folder))
    assert book.findings_record_path(tmp_path / "elsewhere") == \
        folder / "m09-evaluation.json"


def test_the_book_enables_substitutions():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "substitution" in config["parse"]["myst_enable_extensions"]
    assert "lib.book" in config["sphinx"]["extra_extensions"]


def test_a_machine_given_by_path_or_address_writes_inside_the_book(tmp_path,
                                                                   monkeypatch):
    # a profile given by its absolute path once made the figures' folder the
    # profile file itself; an address's "//" made folders of its parts
    from lib.book.pages import figures_dir, records_dir
    from lib.storage import machine_file

    profile = tmp_path / "profiles" / "box.json"
    profile.parent.mkdir()
    profile.write_text("{}")
    monkeypatch.setenv("GPUHIVE_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.delenv("GPUHIVE_RECORD_DIR", raising=False)
    monkeypatch.setattr("lib.book.pages.book_root", lambda: tmp_path / "book")
    for spec in (str(profile), "dask://10.0.0.5:8786", "hetero-4"):
        folder = machine_file(spec)
        assert "/" not in folder and folder
        fig, rec = figures_dir(spec), records_dir(spec)
        assert fig == tmp_path / "figures" / folder and fig.is_dir()
        assert rec == tmp_path / "book" / "_build" / "records" / folder
    assert machine_file("hetero-4") == "hetero-4"
    assert profile.is_file()  # untouched
    folder = tmp_path / "_build" / "records" / machine_file("dask://10.0.0.5:8786")
    folder.mkdir(parents=True)
    (folder / "m09-evaluation.json").write_text(json.dumps(SAMPLE))
    assert book.findings_record_path(tmp_path, "dask://10.0.0.5:8786") == \
        folder / "m09-evaluation.json"


def test_a_policy_ahead_of_the_optimum_is_said_to_be_faster_not_negatively_slower():
    from lib.book.sphinx import MISSING, against_optimum

    assert against_optimum(1.024) == "2.4 % slower than"
    assert against_optimum(0.811) == "18.9 % faster than"
    assert against_optimum(1.0002) == against_optimum(0.9998) == "as fast as"
    assert against_optimum(None) == against_optimum(float("nan")) == MISSING


def test_the_ablations_finding_says_what_the_numbers_say_or_that_there_are_none():
    from lib.book.sphinx import ablations_finding

    def abl(full, tel, top):
        return [{"variant": "full", "ratio_to_optimum": full},
                {"variant": "no telemetry features", "ratio_to_optimum": tel},
                {"variant": "no topology features", "ratio_to_optimum": top}]

    assert ablations_finding(abl(1.0, 1.2, 1.1), "model").endswith(
        "It leans on both.")
    assert ablations_finding(abl(1.0, 1.2, 1.001), "model").endswith(
        "It leans on telemetry; without topology it does about as well.")
    assert ablations_finding(abl(1.0, 1.0, 1.0), "model").endswith(
        "Neither changes it much here.")
    assert ablations_finding(abl(1.086, 1.072, 1.123), "cpu").endswith(
        "It leans on topology; without telemetry it does better here.")
    assert ablations_finding(abl(1.0, 0.9, 1.0), "model").endswith(
        "Without telemetry it does better here; without topology it does "
        "about as well.")
    none = ablations_finding([], "cpu")
    assert "(on the cpu backend) recorded no ablations" in none
    assert "n/a" not in none and not any(c.isdigit() for c in none)
