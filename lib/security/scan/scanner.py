"""Gate 2a on one source: the layers of the scan, run in order.

:func:`scan_source` checks its arguments, then runs each layer over the
source and collects every finding in one
:class:`~lib.security.verdict.Verdict`. The layers that read the source as
written run once; those that read it as a compiler does run once per distinct
run of the preprocessor (each NVRTC target architecture, the host build, and
both ways of any conditional the scanner cannot decide). A finding that some
runs make and others do not names the runs it comes from.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from lib.security.scan import conditions
from lib.security.scan.calls import check_calls, declarations
from lib.security.scan.conditions import is_constant_expression
from lib.security.scan.kernel import check_extern, check_kernels
from lib.security.scan.lexer import (
    check_characters,
    decode,
    lex,
    match_brackets,
    raw_checks,
    translate,
)
from lib.security.scan.options import allowed_settings
from lib.security.scan.preprocessor import BudgetSpent, Macro, Preprocessor, Run
from lib.security.scan.report import GATE, Report
from lib.security.scan.rules import TARGET_ARCHS
from lib.security.scan.token_checks import check_tokens
from lib.security.verdict import Verdict

MAX_BYTES = 256 * 1024
_IDENT_FULL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Runs named in a finding that not every run makes.
MAX_NAMED_RUNS = 3


def _safe_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, whatever ``value`` does."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not break the gate
        text = f"<{type(value).__name__}>"
    return text[:limit]


def configurations(options: Sequence[str]) -> tuple[
        list[conditions.Configuration], dict[str, Macro]]:
    """The compilers that read a source built with ``options``: NVRTC for
    each target architecture (and any the options name), then the host build;
    and the macros the options define."""
    values, archs = allowed_settings(options)
    defines = {name: Macro(name, None, False, tuple(lex(value)), 0)
               for name, value in values.items()}
    configs = [conditions.nvrtc(a) for a in dict.fromkeys((*TARGET_ARCHS, *archs))]
    configs.append(conditions.host())
    return configs, defines


def _scan_run(pre: Preprocessor, run: Run, kernel_name: str | None,
              rep: Report) -> None:
    """The checks on one run's tokens, as that compiler reads them."""
    failed = run.over_budget
    expanded = run.code
    if failed is None:
        try:
            expanded = pre.expand(run.code)
        except BudgetSpent as exc:
            failed = str(exc)
    pre.checked_left -= len(expanded)
    match = match_brackets(expanded)
    decl = declarations(expanded, match)
    # A constructor has its class's name; the class is no function value.
    functions = decl.functions - decl.types
    check_tokens(rep, expanded, functions)
    check_kernels(rep, expanded, kernel_name, match)
    if failed is not None:
        rep.add("pp.expansion_limit", f"{failed}; the rest of the scan reads the "
                "source unexpanded", None)
        return
    check_calls(rep, expanded, decl, match)
    check_extern(rep, expanded, match)
    try:
        pragmas = pre.pragma_arguments(run)
    except BudgetSpent as exc:
        rep.add("pp.expansion_limit", str(exc), None)
        pragmas = []
    for line, args in pragmas:
        if not is_constant_expression(args):
            shown = " ".join(t.raw for t in args)[:60]
            rep.add("pp.pragma", f"'#pragma unroll' argument expands to "
                    f"'{shown}', not a constant expression", line)
        check_tokens(rep, args, functions)


def _scan_text(text: str, kernel_name: str | None, options: Sequence[str],
               rep: Report) -> None:
    """Layers 1b-3c over one decoded source; findings go to ``rep``."""
    raw_checks(text, rep)
    spliced, splices = translate(text, rep)
    toks = lex(spliced, splices)
    check_characters(toks, spliced, rep)
    configs, defines = configurations(options)
    pre = Preprocessor(toks, spliced, rep, defines)
    pre.scan_directives()
    found: dict[tuple, list[str]] = {}  # finding -> the runs that made it
    labels: list[str] = []
    for run in pre.runs(configs):
        sub = Report(limit=None)
        _scan_run(pre, run, kernel_name, sub)
        labels.append(run.label)
        for v in sub.violations():
            found.setdefault((v.check, v.message, v.line), []).append(run.label)
    # As written: every branch and every directive, taken or not. Whether a
    # name is a function used as a value is known only after expansion (a
    # macro's argument looks like one), so each run checks that.
    check_tokens(rep, toks, frozenset())
    for (check, message, line), where in found.items():
        if len(where) < len(labels):
            named = ", ".join(where[:MAX_NAMED_RUNS])
            more = len(where) - MAX_NAMED_RUNS
            message += f" [{named}{f' and {more} more' if more > 0 else ''}]"
        rep.add(check, message, line)


def scan_source(
    source: str | bytes, kernel_name: str, *, max_bytes: int = MAX_BYTES,
    options: Sequence[str] = (),
) -> Verdict:
    """Gate 2a: scan CUDA C++ source; never raises.

    Args:
        source: the ``.cu`` text, ``str`` or UTF-8 ``bytes``; anything else is
            refused with ``bytes.type``.
        kernel_name: the one ``extern "C" __global__`` kernel the source must
            define (a C identifier).
        max_bytes: size limit in bytes of the UTF-8 source (default 256 KiB).
        options: the compile options the source will be built with (as for
            :func:`~lib.security.scan.check_compile_options`, which checks
            them): their ``-DNAME=VALUE`` macros are defined in every
            configuration, and an architecture they name is scanned too.

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
            _scan_text(text, kernel_name, options, rep)
    except Exception as exc:  # fail closed: a scanner bug never accepts
        rep.add("scan.internal", f"scanner failed: {type(exc).__name__}: "
                f"{exc!s:.100}", None)
    return Verdict(GATE, rep.violations(), time.perf_counter() - start)
