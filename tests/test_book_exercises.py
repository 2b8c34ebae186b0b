"""The milestone notebooks' exercises: every chapter has solutions in dropdowns
and at least one automatically checked coding exercise, and every solution
passes its checker against the library.

A checked exercise is two code cells: the reader's stub (tagged ``exercise``),
which defines the function to write and a checker that compares it with the
library, and the solution (tagged ``solution`` and ``hide-input``, so the built
page folds it), which defines the function and calls the checker. Here both run
in a fresh namespace, without the rest of the notebook, as papermill runs them
in ``make book``.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("m0[1-9]*.ipynb"))
#: A MyST dropdown whose title starts with "Solution".
DROPDOWN = re.compile(r"^\s*(?::{3,}|`{3,})\{dropdown\}\s*Solution"
                      r"|^\s*(?::{3,}|`{3,})\{admonition\}\s*Solution[^\n]*\n\s*:class:"
                      r"[^\n]*\bdropdown\b", re.M)


def _tagged(nb, tag: str) -> list:
    return [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]


def _run(cells, namespace: dict) -> tuple[str, float]:
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        for cell in cells:
            exec(compile(cell.source, "<notebook cell>", "exec"), namespace)
    return out.getvalue(), time.perf_counter() - start


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path / "home"))


def test_every_milestone_is_here():
    assert [p.name[:3] for p in NOTEBOOKS] == [f"m0{i}" for i in range(1, 10)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_chapter_has_exercises_with_solutions(path):
    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert DROPDOWN.search(markdown), f"{path.name}: no solution in a dropdown"
    exercises, solutions = _tagged(nb, "exercise"), _tagged(nb, "solution")
    assert exercises, f"{path.name}: no exercise cell"
    assert solutions, f"{path.name}: no solution cell"
    for cell in exercises + solutions:
        assert cell.cell_type == "code"
        assert not cell.get("outputs") and not cell.get("execution_count")
    for cell in solutions:
        assert "hide-input" in cell.metadata["tags"], "the built page must fold it"
        assert re.search(r"^def \w+", cell.source, re.M), "it defines a function"
        assert re.search(r"^check_\w+\(", cell.source, re.M), "and calls a checker"
    # the recorder stays the last cell, after the exercises
    assert "book.record(" in nb.cells[-1].source
    assert nb.metadata["kernelspec"]["name"] == "gpuhive"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_solutions_pass_their_checks(path):
    nb = nbformat.read(path, as_version=4)
    namespace: dict = {"__name__": "__exercise__"}
    stub_out, _ = _run(_tagged(nb, "exercise"), namespace)
    # unanswered, a stub says so and raises nothing (the book runs it too)
    assert "not answered yet" in stub_out, stub_out
    out, seconds = _run(_tagged(nb, "solution"), namespace)
    assert "correct" in out, out
    assert seconds < 5, f"{path.name}: solutions took {seconds:.1f} s (< 2 s wanted)"


def _checker(stem: str) -> tuple[dict, str]:
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    namespace: dict = {"__name__": "__exercise__"}
    _run(_tagged(nb, "exercise"), namespace)
    names = [n for n in namespace if n.startswith("check_")]
    assert len(names) == 1, names
    return namespace, names[0]


def test_a_wrong_answer_fails_its_check():
    """The checkers are not vacuous: plausible mistakes are caught."""
    ns, check = _checker("m01-contract")
    with pytest.raises(AssertionError):  # plain rounding instead of largest remainder
        ns[check](lambda n, shares: [(round(n * sum(shares[:i])),
                                      round(n * sum(shares[:i + 1])))
                                     for i in range(len(shares))])
    ns, check = _checker("m05-environment")
    with pytest.raises(AssertionError):  # the ratio upside down
        import math
        ns[check](lambda te, td, ok, penalty=1.0: math.log(td / te) if ok else -penalty)
    ns, check = _checker("m06-training")
    with pytest.raises(AssertionError):  # the normaliser left out
        import math
        ns[check](lambda a, x, m: sum((a[i] - 1) * math.log(x[i])
                                      for i in range(len(a)) if m[i]))
