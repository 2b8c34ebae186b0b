"""The book: the helpers its notebooks share, and the build that executes them.

- :mod:`lib.book.pages` -- what a notebook calls: where figures go, titles
  that say MEASURED or PREDICTED, the recorder of each notebook's headline
  numbers, :class:`Table` and :class:`Banner`;
- :mod:`lib.book.build` -- :func:`build_book` (what ``gpuhive book`` and
  ``make book`` run) and :func:`page_problems`, the check of the built pages;
- :mod:`lib.book.sphinx` -- the book's Sphinx extension (``_config.yml`` lists
  ``lib.book``): MathJax served from the build itself, so the equations render
  without a network, and the findings chapter's numbers from the evaluation
  chapter's record (:func:`findings_substitutions`).

Notebooks tell, ``lib`` does: a notebook calls these so that every figure is a
file under ``figures/<machine>/`` with a title that says MEASURED or PREDICTED,
and every notebook ends by recording its numbers as a small JSON that tests and
the book read without scraping output.
"""

from lib.book.build import (
    MAX_OUTPUT_CHARS,
    OUTPUT_PROBLEMS,
    BookError,
    build_book,
    execute_notebook,
    notebooks,
    page_problems,
)
from lib.book.pages import (
    HEADLINE,
    KERNEL_NAME,
    Banner,
    Table,
    book_root,
    figures_dir,
    label,
    record,
    records_dir,
    save_figure,
    save_headline,
)
from lib.book.sphinx import (
    BOOK_CSS,
    FINDINGS_RECORD,
    MATHJAX_DIR,
    MATHJAX_ENTRY,
    MISSING,
    MathJaxMissing,
    _findings_config,
    across_table,
    copy_mathjax,
    findings_record_path,
    findings_substitutions,
    mathjax_source,
    setup,
    states_table,
)

__all__ = [
    "BOOK_CSS", "FINDINGS_RECORD", "HEADLINE", "KERNEL_NAME", "MATHJAX_DIR",
    "MATHJAX_ENTRY", "MAX_OUTPUT_CHARS", "MISSING", "OUTPUT_PROBLEMS", "Banner",
    "BookError", "MathJaxMissing", "Table", "_findings_config", "across_table",
    "book_root", "build_book", "copy_mathjax", "execute_notebook", "figures_dir",
    "findings_record_path", "findings_substitutions", "label", "mathjax_source",
    "notebooks", "page_problems", "record", "records_dir", "save_figure",
    "save_headline", "setup", "states_table",
]
