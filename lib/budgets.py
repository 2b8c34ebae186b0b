"""The budgets: one vocabulary for how long anything may take.

Every notebook, command and stage takes one of :data:`BUDGETS`:

- ``smoke`` -- seconds: proves the path runs (the test suite's notebook runs);
- ``quick`` -- minutes on a small machine: what ``make book`` uses;
- ``full`` -- the server run, for numbers worth publishing.

Each stage that spends a budget (training, characterisation, evaluation) keeps
its own plan per budget, keyed by these names and checked here, so a fourth
budget cannot appear in one place only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

BUDGETS: tuple[str, ...] = ("smoke", "quick", "full")
#: The budget a command uses when none is given.
DEFAULT_BUDGET = "quick"

T = TypeVar("T")


def check_budget(budget: str) -> str:
    """``budget`` if it is one of :data:`BUDGETS`; ValueError naming it otherwise."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; expected one of "
                         f"{', '.join(BUDGETS)}")
    return budget


def pick(budget: str, smoke: Any, quick: Any, full: Any) -> Any:
    """The value for ``budget`` (``smoke`` seconds, ``quick`` minutes, ``full``)."""
    return {"smoke": smoke, "quick": quick, "full": full}[check_budget(budget)]


def plans(table: Mapping[str, T], what: str) -> dict[str, T]:
    """``table`` as a dict, after checking it has one entry per budget exactly.

    Used at import time by every module that keeps a plan per budget, so a plan
    table and :data:`BUDGETS` cannot drift apart.
    """
    if tuple(table) != BUDGETS:
        raise AssertionError(f"{what} must list exactly the budgets "
                             f"{', '.join(BUDGETS)}, in order; has {', '.join(table)}")
    return dict(table)
