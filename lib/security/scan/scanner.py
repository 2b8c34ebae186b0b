"""Gate 2a on one source: the layers of the scan, run in order.

:func:`scan_source` checks its arguments, then runs each layer over the
source and collects every finding in one
:class:`~lib.security.verdict.Verdict`. The order of the layers is the order
of the violations in the verdict.
"""

from __future__ import annotations

import re
import time

from lib.security.scan.kernel import check_kernels
from lib.security.scan.lexer import (
    Tok,
    check_characters,
    decode,
    lex,
    raw_checks,
    translate,
)
from lib.security.scan.preprocessor import BudgetSpent, Preprocessor
from lib.security.scan.report import GATE, Report
from lib.security.scan.token_checks import check_tokens, collect_functions
from lib.security.verdict import Verdict

MAX_BYTES = 256 * 1024
_IDENT_FULL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _safe_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, whatever ``value`` does."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not break the gate
        text = f"<{type(value).__name__}>"
    return text[:limit]


def _scan_text(text: str, kernel_name: str | None, rep: Report) -> None:
    """Layers 1b-3b over one decoded source; findings go to ``rep``."""
    raw_checks(text, rep)
    spliced, splices = translate(text, rep)
    toks = lex(spliced, splices)

    def check_alternative(out: list[Tok], note: str) -> None:
        # Function names are collected from the expanded stream, which is
        # not known yet while expanding, so none are known here.
        check_tokens(rep, out, frozenset(), note)

    pre = Preprocessor(toks, spliced, rep, check_alternative)
    check_characters(toks, spliced, rep)
    code = pre.preprocess()
    try:
        expanded = pre.expand(code, True)
    except BudgetSpent:
        rep.add("pp.expansion_limit", "macro expansion exceeds the budget "
                f"of {pre.budget_total} tokens "
                "(or nests too deep)", None)
        expanded = code
    fnames = collect_functions(expanded)
    check_tokens(rep, toks, fnames)  # as written: every branch, every directive
    check_tokens(rep, expanded, fnames)  # as the compiler reads it
    check_kernels(rep, expanded, kernel_name)


def scan_source(
    source: str | bytes, kernel_name: str, *, max_bytes: int = MAX_BYTES
) -> Verdict:
    """Gate 2a: scan CUDA C++ source; never raises.

    Args:
        source: the ``.cu`` text, ``str`` or UTF-8 ``bytes``; anything else is
            refused with ``bytes.type``.
        kernel_name: the one ``extern "C" __global__`` kernel the source must
            define (a C identifier).
        max_bytes: size limit in bytes of the UTF-8 source (default 256 KiB).

    Returns:
        A ``Verdict`` (gate ``"gate2a"``) with every violated check and the
        wall time in seconds. A 64 KiB source scans in tens of milliseconds.
    """
    start = time.perf_counter()
    rep = Report()
    try:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) \
                or max_bytes < 0:
            rep.add("bytes.size", f"max_bytes must be a non-negative int, got "
                    f"{_safe_repr(max_bytes)}", None)
            max_bytes = MAX_BYTES
        if not isinstance(kernel_name, str) or not _IDENT_FULL_RE.fullmatch(
                kernel_name):
            rep.add("kernel.name", f"kernel_name {_safe_repr(kernel_name)} is not "
                    "a C identifier", None)
            kernel_name = None
        text = decode(source, max_bytes, rep)
        if text is not None:
            _scan_text(text, kernel_name, rep)
    except Exception as exc:  # fail closed: a scanner bug never accepts
        rep.add("scan.internal", f"scanner failed: {type(exc).__name__}: "
                f"{exc!s:.100}", None)
    return Verdict(GATE, rep.violations(), time.perf_counter() - start)
