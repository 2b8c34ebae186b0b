"""The book: the helpers its notebooks share, and the build that executes them.

Helpers: where figures go, how titles are labelled, and the recorder that
writes each notebook's headline numbers. Build: :func:`build_book` (what
``gpuhive book`` and ``make book`` run). This module is also the book's Sphinx
extension (``_config.yml`` lists it): it serves MathJax from the build itself,
so the equations render without a network, and it gives the findings chapter
its numbers from the evaluation chapter's record (:func:`findings_substitutions`).

Notebooks tell, ``lib`` does: a notebook calls these so that every figure is a
file under ``figures/<machine>/`` with a title that says MEASURED or PREDICTED,
and every notebook ends by recording its numbers as a small JSON that tests and
the book read without scraping output.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from lib.budgets import check_budget
from lib.platform.machines import load_machine
from lib.storage import write_json_atomic

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
    terminal. Numbers are formatted by ``formats`` (column -> format spec)."""

    def __init__(self, rows: list[dict[str, Any]], columns: list[str] | None = None,
                 caption: str = "", formats: dict[str, str] | None = None):
        self.columns = columns or list(dict.fromkeys(k for r in rows for k in r))
        self.caption, self.formats = caption, formats or {}
        self.cells = [[self._cell(c, r.get(c, "")) for c in self.columns]
                      for r in rows]

    def _cell(self, column: str, value: Any) -> str:
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


class BookError(RuntimeError):
    """A notebook failed or the HTML build reported warnings."""


def notebooks(root: Path) -> list[Path]:
    """The milestone notebooks, in order."""
    return sorted((root / "notebooks").glob("m*.ipynb"))


def execute_notebook(source: Path, output: Path, *, machine: str, backend: str,
                     budget: str, seed: int, cwd: Path,
                     timeout: int = 1800) -> float:
    """Run one notebook with papermill; return the seconds it took."""
    import papermill

    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(source), str(output),
            parameters={"machine": machine, "backend": backend, "budget": budget,
                        "seed": seed},
            cwd=str(cwd), kernel_name=KERNEL_NAME, progress_bar=False,
            execution_timeout=timeout,
        )
    except papermill.PapermillExecutionError as exc:
        raise BookError(f"notebook {source.name} failed in cell "
                        f"{exc.exec_count}: {exc.ename}: {exc.evalue}") from None
    _show_parameters_once(output)
    return time.perf_counter() - start


def _show_parameters_once(path: Path) -> None:
    """Drop the notebook's own ``parameters`` cell from an executed copy when
    papermill injected the values it ran with right after it: a reader sees
    the values once, the ones that built the page."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in nb.cells]
    if any("injected-parameters" in t for t in tags):
        nb.cells = [c for c, t in zip(nb.cells, tags, strict=True)
                    if "parameters" not in t or "injected-parameters" in t]
        nbformat.write(nb, path)


def build_book(machine: str = "hetero-4", backend: str = "model",
               budget: str = "quick", seed: int = 0, html: bool = True,
               root: Path | None = None) -> Path:
    """Execute every notebook and build the HTML; return ``_build/html``."""
    check_budget(budget)
    load_machine(machine)  # an unknown machine fails here, in one line
    root = root or book_root()
    if not (root / "_config.yml").is_file() or not (root / "notebooks").is_dir():
        raise BookError(f"no book here: {root} has no _config.yml and notebooks/; "
                        "run gpuhive book (or make book) in the project's folder")
    stage = root / "_build" / "book-src"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, stage / name)
    shutil.copytree(root / "book", stage / "book")
    # chapters show real code with literalinclude ../lib/...
    shutil.copytree(root / "lib", stage / "lib",
                    ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    os.environ.setdefault("GPUHIVE_RECORD_DIR",
                          str(root / "_build" / "records" / machine))
    # the build keeps what it measures and seals in a home of its own, so it
    # never touches the user's ~/.gpuhive (set GPUHIVE_HOME to share one)
    os.environ.setdefault("GPUHIVE_HOME", str(root / "_build" / "home"))
    found = notebooks(root)
    for i, nb in enumerate(found, 1):
        print(f"[{i}/{len(found)}] executing {nb.name} (machine={machine}, "
              f"backend={backend}, budget={budget}) ...", flush=True)
        secs = execute_notebook(nb, stage / "notebooks" / nb.name, machine=machine,
                                backend=backend, budget=budget, seed=seed, cwd=root)
        print(f"      done in {secs:.1f} s", flush=True)
    if not html:
        return stage
    print("building HTML with Jupyter Book ...", flush=True)
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(stage),
           "--path-output", str(root), "-W", "-n", "--keep-going"]
    # the findings chapter reads this machine's evaluation record
    env = {**os.environ, "GPUHIVE_BOOK_MACHINE": machine}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise BookError(f"jupyter-book build failed:\n{tail}")
    out = root / "_build" / "html"
    problems = page_problems(out, root)
    if problems:
        raise BookError(f"{len(problems)} page output(s) a reader should not see "
                        "(the first ones):\n" + "\n".join(problems[:20]))
    print(f"book: {out / 'index.html'}")
    return out


#: What no cell output on a page may show: an absolute path of this computer,
#: a Python object's repr of a path, or a warning (a reader cannot act on it).
OUTPUT_PROBLEMS = (
    (re.compile(r"(?<![\w.])/(?:tmp|root|home|work|var|Users)/[\w.-]"),
     "an absolute path"),
    (re.compile(r"PosixPath\(|WindowsPath\("), "a path object's repr"),
    (re.compile(r"\b\w*Warning\b[:(]|\bWARNING\b"), "a warning"),
)
#: Output lines longer than this run off the content column (plain-text
#: outputs; tables are HTML and scroll inside their box).
MAX_OUTPUT_CHARS = 100


class _Outputs(HTMLParser):
    """The text of every cell output (``div.cell_output``) of a page, and
    apart from it the text of its ``pre`` blocks (plain-text outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0          # div nesting inside the current cell output
        self.pre = 0            # pre nesting inside it
        self.texts: list[str] = []
        self.plain: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if self.depth:
            self.depth += tag == "div"
            if tag == "pre":
                self.pre += 1
                self.plain.append("")
        elif tag == "div" and "cell_output" in classes:
            self.depth, self.pre = 1, 0
            self.texts.append("")

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "div":
            self.depth -= 1
        elif self.pre and tag == "pre":
            self.pre -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.texts[-1] += data
            if self.pre:
                self.plain[-1] += data


def page_problems(html_dir: Path, root: Path | None = None) -> list[str]:
    """``page: what`` for every cell output of the built book that shows an
    absolute path, a path object, a warning (:data:`OUTPUT_PROBLEMS`), or a
    text line wider than :data:`MAX_OUTPUT_CHARS`; empty when the pages are
    clean. ``root``: the project folder, whose own path counts too."""
    found = []
    for page in sorted(Path(html_dir).rglob("*.html")):
        if "_static" in page.parts or "_sources" in page.parts:
            continue
        parser = _Outputs()
        parser.feed(page.read_text(errors="replace"))
        name = page.relative_to(html_dir).as_posix()
        for text in parser.texts:
            for pattern, what in OUTPUT_PROBLEMS:
                hit = pattern.search(text)
                if hit:
                    near = text[max(0, hit.start() - 30):hit.end() + 40]
                    found.append(f"{name}: {what}: {near!r}")
            if root is not None and str(root) in text:
                found.append(f"{name}: the project's own path in an output")
        for text in parser.plain:
            wide = [line for line in text.splitlines() if len(line) > MAX_OUTPUT_CHARS]
            if wide:
                found.append(f"{name}: an output line of {len(wide[0])} characters: "
                             f"{wide[0][:60]!r}...")
    return found


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


def _slug(text: str) -> str:
    return "_".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


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
        subs[f"{short}_gap_pct"] = _num(None if ratio is None else
                                        100 * (ratio - 1), ".1f")
        subs[f"{short}_p50_us"] = _num(row.get("decide_p50_us"), ".0f")
    latency = values.get("latency", {}) or {}
    subs["latency_p50_us"] = _num(latency.get("p50_us"), ".0f")
    subs["latency_p99_us"] = _num(latency.get("p99_us"), ".0f")
    for a in values.get("ablations", []) or []:
        subs[f"ablation_{_slug(a.get('variant', ''))}_ratio"] = \
            _num(a.get("ratio_to_optimum"), ".3f")
    for name in ("full", "no telemetry features", "no topology features"):
        subs.setdefault(f"ablation_{_slug(name)}_ratio", MISSING)
    zero = [x for x in values.get("transfer", []) or [] if x.get("when") == "zero-shot"]
    subs["transfer_machines"] = str(len(zero)) if zero else MISSING
    subs["transfer_worst_ratio"] = _num(max((x.get("ratio_to_optimum", 0.0)
                                             for x in zero), default=None), ".3f")
    across = values.get("across", []) or []
    subs["across_table"] = across_table(across)
    gaps = [r["rl_over_opt"] for r in across if isinstance(r.get("rl_over_opt"), float)]
    subs["across_worst_gap_pct"] = _num(100 * (max(gaps) - 1) if gaps else None, ".1f")
    return subs


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
        path = folder / "_build" / "records" / machine / name
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
