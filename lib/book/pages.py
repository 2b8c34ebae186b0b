"""What a notebook calls: where figures and records go, titles that say
MEASURED or PREDICTED, tables that fit the page and the line that says what
built it."""

from __future__ import annotations

import html
import math
import os
import time
from pathlib import Path
from typing import Any

from lib.storage import machine_file, write_json_atomic

#: The Jupyter kernel the notebooks ask for: the project's environment,
#: registered by ``make install`` (``python -m ipykernel install --sys-prefix
#: --name gpuhive``), so JupyterLab and papermill both run them in it.
KERNEL_NAME = "gpuhive"


def book_root(start: Path | None = None) -> Path:
    """The folder holding ``_toc.yml`` above ``start`` (default: the cwd)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    return here


def figures_dir(machine: str) -> Path:
    """``figures/<machine>/`` of the book (or ``$GPUHIVE_FIGURES_DIR/<machine>``),
    the folder named as the machine's files are
    (:func:`lib.storage.machine_file`: a profile given by its path or a Dask
    cluster's address gets a stem of it, never a folder outside the book's)."""
    base = os.environ.get("GPUHIVE_FIGURES_DIR")
    root = Path(base) if base else book_root() / "figures"
    path = root / machine_file(machine)
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


#: The README's headline figure: tracked in git, so the repository's own page
#: shows it on a fresh clone; the evaluation chapter writes it from its run on
#: the default machine and backend (and nowhere else).
HEADLINE = "headline.png"


def save_headline(fig: Any, machine: str, backend: str) -> Path | None:
    """Also save ``fig`` as ``figures/headline.png`` when it comes from the
    default machine on the model backend (the figure the README shows)."""
    if (machine, backend) != ("hetero-4", "model"):
        return None
    # beside figures/<machine>/ (a test's own folder where it redirects them)
    path = figures_dir(machine).parent / HEADLINE
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def records_dir(machine: str) -> Path:
    """Where :func:`record` writes (``$GPUHIVE_RECORD_DIR`` or the build folder)."""
    base = os.environ.get("GPUHIVE_RECORD_DIR")
    path = Path(base) if base else book_root() / "_build" / "records" \
        / machine_file(machine)
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(notebook: str, values: dict[str, Any], *, machine: str, backend: str,
           budget: str, seed: int) -> Path:
    """Write a notebook's headline numbers as ``<notebook>.json``; return the path."""
    path = records_dir(machine) / f"{notebook}.json"
    payload = {"notebook": notebook, "machine": machine, "backend": backend,
               "budget": budget, "seed": seed,
               "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "values": values}
    return write_json_atomic(payload, path, indent=2, default=float)


# --------------------------------------------------------------------------
# The build: papermill, then Jupyter Book
#
# 1. every ``notebooks/m*.ipynb`` is executed by papermill with the four
#    parameters (machine, backend, budget, seed) into a staging copy of the book
#    under ``_build/book-src/`` -- the sources in ``notebooks/`` stay clean;
# 2. Jupyter Book 1.x builds ``_build/html`` from the staging copy with
#    ``execute_notebooks: "off"``, warnings treated as errors. No network.

class Table:
    """Rows shown as an HTML table that fits the page (it scrolls inside its
    own box when wider) in the book and JupyterLab, and as aligned text in a
    terminal. Numbers are formatted by ``formats`` (column -> format spec); a
    missing value (None, NaN) shows as a dash."""

    def __init__(self, rows: list[dict[str, Any]], columns: list[str] | None = None,
                 caption: str = "", formats: dict[str, str] | None = None):
        self.columns = columns or list(dict.fromkeys(k for r in rows for k in r))
        self.caption, self.formats = caption, formats or {}
        self.cells = [[self._cell(c, r.get(c, "")) for c in self.columns]
                      for r in rows]

    def _cell(self, column: str, value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "\u2014"
        spec = self.formats.get(column)
        if spec and isinstance(value, (int, float)):
            return format(value, spec)
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>"
                       for row in self.cells)
        cap = f"<caption>{esc(self.caption)}</caption>" if self.caption else ""
        return (f'<div class="gpuhive-table" style="overflow-x:auto">'
                f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
                "</table></div>")

    def __repr__(self) -> str:
        widths = [max([len(c)] + [len(row[i]) for row in self.cells])
                  for i, c in enumerate(self.columns)]
        lines = [self.caption] if self.caption else []
        lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths,
                                                           strict=True)))
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True))
                  for row in self.cells]
        return "\n".join(lines)


class Banner:
    """One line at the top of a page: the machine, backend and budget that
    built it, and whether its numbers are MEASURED or PREDICTED."""

    def __init__(self, machine: str, backend: str, budget: str, seed: int = 0):
        kind = "MEASURED" if backend != "model" else "PREDICTED"
        self.text = (f"This page was built on machine {machine} with the {backend} "
                     f"backend ({kind} times), budget {budget}, seed {seed}.")

    def _repr_markdown_(self) -> str:
        return f"*{self.text}*"

    def __repr__(self) -> str:
        return self.text


