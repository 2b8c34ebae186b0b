"""The book's Sphinx extension (``_config.yml`` lists ``lib.book``): MathJax
served from the build itself, so equations render without a network, and the
findings chapter's numbers from the evaluation chapter's record."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lib.storage import machine_file

# --------------------------------------------------------------------------
# The Sphinx extension: MathJax served from the build, not from a CDN
#
# MathJax 3 comes from PyPI (``django-static-mathjax``, in the ``book`` extra:
# the library's own ``es5`` files, nothing of Django is imported). After the
# HTML is written, the files a page needs are copied to
# ``_static/mathjax/``; ``_config.yml`` points ``mathjax_path`` there, so every
# page loads ``_static/mathjax/tex-mml-chtml.js`` relative to itself and the
# book reads the same offline.

#: Where MathJax goes under ``_static`` and the file ``mathjax_path`` names.
MATHJAX_DIR = "mathjax"
MATHJAX_ENTRY = "tex-mml-chtml.js"
#: What of MathJax's ``es5`` folder the entry point loads (fonts, TeX
#: extensions it loads on demand, the menu and its accessibility parts).
_MATHJAX_PARTS = (MATHJAX_ENTRY, "input", "output", "ui", "a11y", "sre", "adaptors")
#: A small stylesheet: a display equation wider than the page scrolls inside
#: its own box instead of running off the page.
BOOK_CSS = "gpuhive-book.css"
_CSS = """/* written by lib.book */
div.math, .math { max-width: 100%; overflow-x: auto; overflow-y: hidden; }
"""


class MathJaxMissing(RuntimeError):
    """MathJax's files are not installed (``make install`` installs them)."""


def mathjax_source() -> Path:
    """The installed MathJax 3 ``es5`` folder (``django-static-mathjax``).

    Raises:
        MathJaxMissing: the package is not installed.
    """
    spec = importlib.util.find_spec("mathjax")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        es5 = Path(folder) / "static" / "mathjax" / "es5"
        if (es5 / MATHJAX_ENTRY).is_file():
            return es5
    raise MathJaxMissing("MathJax is not installed: run make install (or pip install "
                         "'django-static-mathjax>=3.2'); the book serves it itself")


def copy_mathjax(static: Path) -> Path:
    """Copy what the book needs of MathJax under ``static/mathjax``; return the
    entry point's path."""
    src = mathjax_source()
    dest = static / MATHJAX_DIR
    dest.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("svg", "svg.js", "*.map")
    for part in _MATHJAX_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, ignore=skip, dirs_exist_ok=True)
        elif (src / part).is_file():
            shutil.copy2(src / part, dest / part)
    return dest / MATHJAX_ENTRY


def _local_mathjax_path(app: Any) -> None:
    """Refuse a ``mathjax_path`` that points off the build (a URL)."""
    from sphinx.errors import ExtensionError

    path = str(app.config.mathjax_path or "")
    if "://" in path or path.startswith("//"):
        raise ExtensionError(f"mathjax_path is {path!r}: the book serves MathJax "
                             f"itself; set it to {MATHJAX_DIR}/{MATHJAX_ENTRY}")
    try:
        mathjax_source()
    except MathJaxMissing as exc:
        raise ExtensionError(str(exc)) from None


def _copy_static(app: Any, exception: BaseException | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    copy_mathjax(static)
    (static / BOOK_CSS).write_text(_CSS)


# --------------------------------------------------------------------------
# The findings chapter's numbers: MyST substitutions from the evaluation run
#
# ``book/findings.md`` types no number of its own: it writes ``{{ t2_value }}``
# and the like, and at ``config-inited`` this extension reads the record the
# evaluation chapter wrote (``_build/records/<machine>/m09-evaluation.json``,
# the machine ``build_book`` ran) and turns it into ``myst_substitutions``. A
# rebuild on another machine therefore cannot contradict its own text.

#: The record the findings chapter discusses.
FINDINGS_RECORD = "m09-evaluation"
#: The targets the evaluation judges.
TARGET_IDS = tuple(f"T{i}" for i in range(1, 8))
#: Policies of Table 4 the findings name (the optimum's row is ``oracle``).
FINDINGS_POLICIES = {"rl": "rl-ppo", "heft": "heft", "peak": "proportional-peak",
                     "optimum": "oracle"}
#: What the findings say where the record lacks a value.
MISSING = "n/a"


def _num(value: Any, spec: str) -> str:
    """``value`` formatted by ``spec``, or :data:`MISSING`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return MISSING
    return format(value, spec)


def across_table(rows: list[dict[str, Any]]) -> str:
    """The across-machines rows of the evaluation record as a Markdown table."""
    if not rows:
        return "(the evaluation run recorded no machines)"
    lines = ["| machine | state | $T_\\text{rl}/T_\\text{opt}$ | speedup over equal "
             "| HEFT's speedup | HEFT's $T/T_\\text{opt}$ |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| `{r.get('machine', '')}` | {r.get('state', '')} "
                     f"| {_num(r.get('rl_over_opt'), '.3f')} "
                     f"| {_num(r.get('speedup'), '.2f')}x "
                     f"| {_num(r.get('heft_speedup'), '.2f')}x "
                     f"| {_num(r.get('heft_over_opt'), '.3f')} |")
    return "\n".join(lines)


#: The policies the findings' table of device states shows, in its order.
STATE_POLICIES = ("rl-ppo", "oracle", "heft", "proportional-peak", "single-best")


def states_table(per_state: dict[str, dict[str, float]]) -> str:
    """The evaluation record's speedups over equal split per device state
    (policy -> state -> geometric mean) as a Markdown table, one row a
    policy of :data:`STATE_POLICIES` the run had, one column a state."""
    rows = [p for p in STATE_POLICIES if per_state.get(p)]
    if not rows:
        return "(the evaluation run recorded no device states)"
    states = list(dict.fromkeys(s for p in rows for s in per_state[p]))
    lines = ["| policy | " + " | ".join(states) + " |",
             "| --- |" + " --- |" * len(states)]
    for p in rows:
        lines.append(f"| `{p}` | " + " | ".join(
            f"{_num(per_state[p].get(s), '.2f')}x" for s in states) + " |")
    return "\n".join(lines)


def against_optimum(ratio: float | None) -> str:
    """``T / T_opt`` as words before "the optimum": "2.4 % slower than", or,
    where MEASURED noise puts a policy ahead, "0.8 % faster than" (not
    "-0.8 % slower than"); "as fast as" within a twentieth of a percent."""
    if not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
        return MISSING
    pct = 100.0 * (ratio - 1.0)
    if abs(pct) < 0.05:
        return "as fast as"
    return f"{abs(pct):.1f} % {'slower' if pct > 0 else 'faster'} than"


def findings_substitutions(record: dict[str, Any] | None) -> dict[str, str]:
    """The MyST substitutions ``book/findings.md`` uses, from an evaluation
    record (what :func:`record` wrote for ``m09-evaluation``; None or an empty
    one gives :data:`MISSING` everywhere, with the same keys).

    Every value is a string, formatted as the evaluation chapter prints it.
    """
    record = record or {}
    values = record.get("values", {}) or {}
    subs: dict[str, str] = {
        "eval_machine": str(record.get("machine", MISSING)),
        "eval_backend": str(record.get("backend", MISSING)),
        "eval_budget": str(record.get("budget", MISSING)),
        "eval_seed": str(record.get("seed", MISSING)),
        "eval_label": str(values.get("label", MISSING)),
    }
    targets = values.get("targets", {}) or {}
    for tid in TARGET_IDS:
        t = targets.get(tid, {}) or {}
        key = tid.lower()
        subs[f"{key}_verdict"] = ("PASS" if t.get("passed") else "FAIL") if t \
            else MISSING
        subs[f"{key}_value"] = str(t.get("value", MISSING))
        subs[f"{key}_bound"] = str(t.get("bound", MISSING))
    table4 = values.get("table4", {}) or {}
    for short, name in FINDINGS_POLICIES.items():
        row = table4.get(name, {}) or {}
        ci = list(row.get("ci95") or [None, None])
        ratio = row.get("ratio_to_optimum")
        subs[f"{short}_speedup"] = _num(row.get("speedup"), ".2f")
        subs[f"{short}_ci_low"] = _num(ci[0], ".2f")
        subs[f"{short}_ci_high"] = _num(ci[1], ".2f")
        subs[f"{short}_ratio"] = _num(ratio, ".3f")
        subs[f"{short}_against_optimum"] = against_optimum(ratio)
        subs[f"{short}_p50_us"] = _num(row.get("decide_p50_us"), ".0f")
    latency = values.get("latency", {}) or {}
    subs["latency_p50_us"] = _num(latency.get("p50_us"), ".0f")
    subs["latency_p99_us"] = _num(latency.get("p99_us"), ".0f")
    zero = [x for x in values.get("transfer", []) or [] if x.get("when") == "zero-shot"]
    subs["transfer_machines"] = str(len(zero)) if zero else MISSING
    subs["transfer_worst_ratio"] = _num(max((x.get("ratio_to_optimum", 0.0)
                                             for x in zero), default=None), ".3f")
    across = values.get("across", []) or []
    subs["across_table"] = across_table(across)
    subs["states_table"] = states_table(values.get("per_state") or {})
    gaps = [r["rl_over_opt"] for r in across if isinstance(r.get("rl_over_opt"), float)]
    subs["across_worst_gap_pct"] = _num(100 * (max(gaps) - 1) if gaps else None, ".1f")
    h2h = values.get("learned_vs_optimum") or {}
    ci = list(h2h.get("ci95") or [None, None])
    subs["h2h_ratio"] = _num(h2h.get("ratio"), ".3f")
    subs["h2h_ci_low"] = _num(ci[0], ".3f")
    subs["h2h_ci_high"] = _num(ci[1], ".3f")
    for key in ("tasks", "wins", "losses", "ties"):
        subs[f"h2h_{key}"] = str(h2h[key]) if key in h2h else MISSING
    subs["h2h_states"] = ", ".join(h2h["states"]) if h2h.get("states") else MISSING
    subs["ablations_finding"] = ablations_finding(values.get("ablations") or [],
                                                  subs["eval_backend"])
    return subs


#: How much above the shipped policy's ``T / T_opt`` an ablation must be for
#: the findings to say the policy leans on what it took away (half a percent).
LEANS = 1.005


def ablations_finding(ablations: Sequence[Mapping[str, Any]], backend: str) -> str:
    """What the findings say of the ablations: each variant's ``T / T_opt``
    against the shipped policy's and, from them, what the policy leans on;
    where the evaluation has none (it had no learned policy to take apart),
    that, instead of numbers that are not there."""
    ratio = {a.get("variant"): a.get("ratio_to_optimum") for a in ablations}
    full, tel, top = (ratio.get(k) for k in ("full", "no telemetry features",
                                               "no topology features"))
    if not all(isinstance(v, (int, float)) and math.isfinite(v)
               for v in (full, tel, top)):
        return ("This book's evaluation (on the "
                f"{backend} backend) recorded no ablations (the policy with "
                "parts of what it sees zeroed, PREDICTED): it had no learned "
                "policy to take apart.")
    how = {name: "leans" if v > LEANS * full else "better" if v * LEANS < full
           else "same" for name, v in (("telemetry", tel), ("topology", top))}
    if set(how.values()) == {"leans"}:
        verdict = "It leans on both."
    elif set(how.values()) == {"same"}:
        verdict = "Neither changes it much here."
    else:
        said = {"leans": "it leans on {}", "better": "without {} it does better here",
                "same": "without {} it does about as well"}
        order = sorted(how, key=lambda name: how[name] != "leans")
        text = "; ".join(said[how[name]].format(name) for name in order)
        verdict = text[0].upper() + text[1:] + "."
    return (f"Zeroing features at decision time, in the busy state: without "
            f"telemetry the policy's time is {tel:.3f} times the optimum's, "
            f"without topology {top:.3f}, against {full:.3f} as shipped. "
            f"{verdict}")


def findings_record_path(srcdir: Path, machine: str | None = None) -> Path | None:
    """The evaluation record the findings read: under ``$GPUHIVE_RECORD_DIR``
    where it is set (``build_book`` sets it), else the first
    ``_build/records/<machine>/`` at or above ``srcdir`` (machine:
    ``$GPUHIVE_BOOK_MACHINE``, default ``hetero-4``)."""
    name = f"{FINDINGS_RECORD}.json"
    base = os.environ.get("GPUHIVE_RECORD_DIR")
    if base:
        return Path(base) / name if (Path(base) / name).is_file() else None
    machine = machine or os.environ.get("GPUHIVE_BOOK_MACHINE", "hetero-4")
    srcdir = Path(srcdir).resolve()
    for folder in (srcdir, *srcdir.parents):
        path = folder / "_build" / "records" / machine_file(machine) / name
        if path.is_file():
            return path
    return None


def _findings_config(app: Any, config: Any) -> None:
    """``config-inited``: the evaluation record's numbers as substitutions
    (the book's own ``myst_substitutions`` win where a key is in both)."""
    import json

    path = findings_record_path(Path(app.srcdir))
    record = json.loads(path.read_text()) if path else None
    subs = findings_substitutions(record)
    subs.update(getattr(config, "myst_substitutions", None) or {})
    config.myst_substitutions = subs


def setup(app: Any) -> dict[str, Any]:
    """Sphinx entry point: local MathJax, the book's stylesheet, and the
    findings chapter's numbers from the evaluation run."""
    app.connect("config-inited", _findings_config)
    app.connect("builder-inited", _local_mathjax_path)
    app.connect("build-finished", _copy_static)
    app.add_css_file(BOOK_CSS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
