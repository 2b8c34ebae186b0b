"""Helpers the notebooks share: where figures go, how titles are labelled, and
the recorder that writes each notebook's headline numbers.

Notebooks tell, ``lib`` does: a notebook calls these so that every figure is a
file under ``figures/<machine>/`` with a title that says MEASURED or PREDICTED,
and every notebook ends by recording its numbers as a small JSON that tests and
the book read without scraping output.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

BUDGETS = ("smoke", "quick", "full")


def book_root(start: Path | None = None) -> Path:
    """The folder holding ``_toc.yml`` above ``start`` (default: the cwd)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    return here


def figures_dir(machine: str) -> Path:
    """``figures/<machine>/`` of the book (or ``$GPUHIVE_FIGURES_DIR/<machine>``)."""
    base = os.environ.get("GPUHIVE_FIGURES_DIR")
    root = Path(base) if base else book_root() / "figures"
    path = root / machine
    path.mkdir(parents=True, exist_ok=True)
    return path


def label(measured: bool, backend: str, machine: str) -> str:
    """``"MEASURED on local-cpu (cpu backend)"`` or the PREDICTED form."""
    return (f"{'MEASURED' if measured else 'PREDICTED'} on {machine} "
            f"({backend} backend)")


def save_figure(fig: Any, machine: str, name: str) -> Path:
    """Save a Matplotlib figure as ``figures/<machine>/<name>.png``."""
    path = figures_dir(machine) / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def pick(budget: str, smoke: Any, quick: Any, full: Any) -> Any:
    """The value for ``budget`` (``smoke`` seconds, ``quick`` minutes, ``full``)."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; expected one of "
                         f"{', '.join(BUDGETS)}")
    return {"smoke": smoke, "quick": quick, "full": full}[budget]


def records_dir(machine: str) -> Path:
    """Where :func:`record` writes (``$GPUHIVE_RECORD_DIR`` or the build folder)."""
    base = os.environ.get("GPUHIVE_RECORD_DIR")
    path = Path(base) if base else book_root() / "_build" / "records" / machine
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(notebook: str, values: dict[str, Any], *, machine: str, backend: str,
           budget: str, seed: int) -> Path:
    """Write a notebook's headline numbers as ``<notebook>.json``; return the path."""
    path = records_dir(machine) / f"{notebook}.json"
    payload = {"notebook": notebook, "machine": machine, "backend": backend,
               "budget": budget, "seed": seed,
               "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "values": values}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float))
    os.replace(tmp, path)
    return path
