"""The book reads offline: MathJax is served from the build, no page loads a
script from the network, and display equations cannot run off the page.

One test builds a tiny book (one page with equations and a citation) with the
project's own ``_config.yml`` through Jupyter Book, as ``make book`` does, and
inspects its HTML; another inspects ``_build/html`` where ``make book`` has
built it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lib import book

ROOT = Path(__file__).resolve().parents[1]
#: A <script> whose src is an absolute URL (or protocol-relative): the network.
EXTERNAL_SCRIPT = re.compile(r"""<script\b[^>]*\bsrc\s*=\s*["']?(?:https?:)?//""",
                             re.I)
MATHJAX = f"_static/{book.MATHJAX_DIR}/{book.MATHJAX_ENTRY}"

PAGE = """# Offline maths

Inline $T(d)$ and a display equation:

$$
\\begin{aligned}
T(d) &= \\max_{i \\in d} \\bigl[ t_\\text{launch} + t_{\\text{in},i} \\bigr]
       + t_\\text{merge}, \\\\
r &= \\log \\frac{T_\\text{equal}}{T_\\text{decision}}
\\end{aligned}
$$

The roofline model {cite}`williams2009roofline`.

```{bibliography}
```
"""


def external_scripts(html_dir: Path) -> dict[str, list[str]]:
    """Page -> the external ``<script src=...>`` tags it holds."""
    found = {}
    for page in sorted(html_dir.rglob("*.html")):
        hits = [m.group(0) for m in EXTERNAL_SCRIPT.finditer(page.read_text(
            errors="replace"))]
        if hits:
            found[str(page.relative_to(html_dir))] = hits
    return found


def test_config_serves_mathjax_from_the_build():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sphinx = config["sphinx"]
    assert "lib.book" in sphinx["extra_extensions"]
    path = sphinx["config"]["mathjax_path"]
    assert "//" not in path and path == f"{book.MATHJAX_DIR}/{book.MATHJAX_ENTRY}"
    for bib in config["bibtex_bibfiles"]:
        assert (ROOT / bib).is_file(), bib
    # the installed package has the files the build copies
    assert (book.mathjax_source() / book.MATHJAX_ENTRY).is_file()


def test_copy_mathjax_brings_the_entry_point_and_its_fonts(tmp_path):
    entry = book.copy_mathjax(tmp_path)
    assert entry == tmp_path / book.MATHJAX_DIR / book.MATHJAX_ENTRY
    assert entry.stat().st_size > 100_000
    fonts = list((tmp_path / book.MATHJAX_DIR / "output" / "chtml" / "fonts"
                  ).rglob("*.woff"))
    assert fonts, "MathJax's CHTML fonts were not copied"
    # TeX extensions the entry point may load on demand
    assert (tmp_path / book.MATHJAX_DIR / "input" / "tex" / "extensions").is_dir()


@pytest.mark.slow
def test_a_page_built_with_the_book_config_loads_no_external_script(tmp_path):
    src = tmp_path / "src"
    (src / "book").mkdir(parents=True)
    shutil.copy2(ROOT / "_config.yml", src / "_config.yml")
    shutil.copy2(ROOT / "book" / "references.bib", src / "book" / "references.bib")
    (src / "_toc.yml").write_text("format: jb-book\nroot: book/page\n")
    (src / "book" / "page.md").write_text(PAGE)
    jb = Path(sys.executable).with_name("jupyter-book")
    start = time.perf_counter()
    proc = subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build",
                           str(src), "--path-output", str(tmp_path), "-W", "-n",
                           "--keep-going"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    took = time.perf_counter() - start
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert took < 120, f"the tiny book took {took:.0f} s"
    html = tmp_path / "_build" / "html"
    page = (html / "book" / "page.html").read_text()
    assert external_scripts(html) == {}
    assert (html / MATHJAX).is_file(), "MathJax was not copied into the build"
    assert f'src="../{MATHJAX}"' in page, "the page does not load the local MathJax"
    assert "math notranslate" in page and "Williams" in page
    assert (html / "_static" / book.BOOK_CSS).is_file()
    assert book.BOOK_CSS in page


def test_the_built_book_loads_no_external_script():
    html = ROOT / "_build" / "html"
    if not (html / "index.html").is_file():
        pytest.skip("the book is not built here (make book builds it)")
    assert external_scripts(html) == {}
    assert (html / MATHJAX).is_file()
    pages_with_math = [p for p in html.rglob("*.html")
                       if "math notranslate" in p.read_text(errors="replace")]
    for page in pages_with_math:
        assert MATHJAX in page.read_text(), page.relative_to(html)


def test_page_problems_finds_paths_reprs_warnings_and_wide_lines(tmp_path):
    from lib.book import page_problems

    page = tmp_path / "notebooks" / "m01.html"
    page.parent.mkdir()
    clean = ('<div class="cell_output docutils container"><div class="output">'
             '<pre>speedup 1.23x PREDICTED</pre></div></div>'
             '<p>nothing is left in /tmp after make test</p>')  # prose: allowed
    page.write_text(clean)
    assert page_problems(tmp_path) == []
    table = ('<div class="cell_output docutils container"><table>'
             + "<tr><td>x</td></tr>" * 80 + "</table></div>")  # HTML: scrolls
    page.write_text(clean + table)
    assert page_problems(tmp_path) == []
    for bad, what in (("written to /root/.gpuhive/x.json", "an absolute path"),
                      ("PosixPath('_build/records')", "a path object's repr"),
                      ("TqdmWarning: IProgress not found", "a warning"),
                      ("x" * 120, "an output line of 120 characters")):
        page.write_text(clean + '<div class="cell_output docutils container">'
                        f"<pre>{bad}</pre></div>")
        got = page_problems(tmp_path)
        assert len(got) == 1 and what in got[0] and got[0].startswith(
            "notebooks/m01.html: "), got
    page.write_text('<div class="cell_output"><pre>at /srv/book/x</pre></div>')
    assert "the project's own path" in page_problems(tmp_path, "/srv/book")[0]


def test_the_built_book_shows_no_path_warning_or_wide_output():
    html = ROOT / "_build" / "html"
    if not (html / "index.html").is_file():
        pytest.skip("the book is not built here (make book builds it)")
    from lib.book import page_problems

    assert page_problems(html, ROOT) == []


def test_a_table_shows_a_missing_value_as_a_dash():
    """None and NaN (a bound a row does not have, a check that did not run)
    show as a dash in the book and the terminal, not as 'None' or 'nan'."""
    from lib.book import Table

    table = Table([{"what": "quiet", "error %": 7.8, "bound %": 10},
                   {"what": "all", "error %": float("nan"), "bound %": None}],
                  formats={"error %": ".1f"})
    assert table.cells == [["quiet", "7.8", "10"], ["all", "\u2014", "\u2014"]]
    assert "None" not in repr(table) and "nan" not in table._repr_html_()
