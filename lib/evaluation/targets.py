"""The falsifiable targets T1-T7 of the design, judged from a report.

Each target prints ``T<n> PASS|FAIL <value> (bound <bound>)`` with the value
either way; a target that cannot be checked (no learned policy, no
characterisation) does not pass.
"""

from __future__ import annotations

import json

from lib.costmodel.calibrate import calibrate
from lib.evaluation.audit import run_audit
from lib.evaluation.report import LEARNED, EvalReport, Target
from lib.platform.machines import Machine
from lib.scoring import geomean
from lib.storage import characterisation_path


def targets(report: EvalReport, machine: Machine) -> list[Target]:
    """T1-T7 of the design, from the report (and the audit and calibration)."""
    rows = report.rows
    have_rl = any(r.policy == LEARNED for r in rows)
    rl = [r for r in rows if r.policy == LEARNED]
    out = []
    label = report.label
    hetero = machine.heterogeneous or report.measured
    bound = 1.10 if report.measured else 1.25
    if have_rl:
        s = geomean([r.speedup for r in rl])
        out.append(Target("T1", s >= bound and hetero, f"{s:.2f}x over equal split "
                          f"{label}", f">= {bound:.2f}x",
                          "" if hetero
                          else "the machine's devices are all alike: T1 is a target "
                          "for heterogeneous machines"))
        ratios = [r.seconds / r.optimum_seconds for r in rl if r.optimum_seconds]
        if ratios:
            g = geomean(ratios)
            out.append(Target("T2", g <= 1.05, f"T_rl/T_opt {g:.3f} {label}",
                              "<= 1.05"))
        else:
            out.append(Target("T2", False, "no optimum computed", "<= 1.05",
                              "a target that cannot be checked does not pass"))
        pp = {(r.task, r.state): r.seconds for r in rows
              if r.policy == "proportional-peak"}
        wins = [r.seconds <= pp[(r.task, r.state)] * (1 + 1e-9) for r in rl]
        frac = sum(wins) / len(wins)
        busy_ratio = geomean([pp[(r.task, r.state)] / r.seconds for r in rl
                              if r.state != "idle"])
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
