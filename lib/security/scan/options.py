"""Gate 2a, layer 4: the compiler options a kernel is built with.

:func:`check_compile_options` checks each option against an allowlist: the
fixed flags in :data:`_FIXED_OPTIONS`, an architecture in
:data:`ARCH_RANGE`, and ``-DNAME=VALUE`` with a plain name and an integer or
one of :data:`DEFINE_TYPES`. Anything else could change what the compiler
reads (``-include``, ``-Xcompiler``, ``-I``...), so it is refused.
:func:`allowed_settings` reads, from the options this allowlist accepts, what
the source scan needs: the macros they define and the architectures they name.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from lib.security.scan.report import GATE, Report
from lib.security.verdict import Verdict

_FIXED_OPTIONS = frozenset({
    "-std=c++17", "--std=c++17", "-O3", "-O2", "--use_fast_math",
    "-use_fast_math", "-lineinfo", "--fmad=true", "--fmad=false",
})
_ARCH_RE = re.compile(r"(?:-arch=sm_|--gpu-architecture=(?:compute|sm)_)([0-9]{2,3})")
_DEFINE_RE = re.compile(r"-D([A-Z][A-Z0-9_]{0,63})=(.{1,32})", re.DOTALL)
_DEFINE_VALUE_RE = re.compile(r"-?[0-9]{1,20}|0[xX][0-9a-fA-F]{1,16}")
DEFINE_TYPES = frozenset({"float", "__half", "__nv_bfloat16", "double"})
ARCH_RANGE = (75, 120)


def check_compile_options(options: Sequence[str]) -> Verdict:
    """Gate 2a, layer 4: every compiler option must be on the allowlist.

    Allowed: ``-arch=sm_XX``, ``--gpu-architecture=compute_XX|sm_XX`` (XX in
    75..120), ``-std=c++17``, ``--std=c++17``, ``-O2``, ``-O3``,
    ``--use_fast_math``, ``-use_fast_math``, ``-lineinfo``,
    ``--fmad=true|false`` and ``-DNAME=VALUE`` with NAME ``[A-Z][A-Z0-9_]*``
    and VALUE an integer literal or one of ``float``, ``__half``,
    ``__nv_bfloat16``, ``double``. Never raises.

    Args:
        options: a list or tuple of option strings (one option per string).

    Returns:
        A ``Verdict`` (gate ``"gate2a"``), one violation per refused option.
    """
    start = time.perf_counter()
    rep = Report()
    if isinstance(options, str | bytes) or not isinstance(options, Sequence):
        rep.add("options.type", f"options must be a list of strings, got "
                f"{type(options).__name__}", None)
        return Verdict(GATE, rep.violations(), time.perf_counter() - start)
    try:
        items = list(options)
    except Exception as exc:  # a hostile sequence must not break the gate
        rep.add("options.type", f"options cannot be read: {type(exc).__name__}",
                None)
        items = []
    for k, opt in enumerate(items):
        if not isinstance(opt, str):
            rep.add("options.type", f"option {k} is {type(opt).__name__}, not str",
                    None)
            continue
        shown = repr(opt[:80])
        if opt in _FIXED_OPTIONS:
            continue
        if (m := _ARCH_RE.fullmatch(opt)) is not None:
            lo, hi = ARCH_RANGE
            if not lo <= int(m.group(1)) <= hi:
                rep.add("options.arch", f"option {shown}: architecture "
                        f"{m.group(1)} outside {lo}..{hi}", None)
            continue
        if opt.startswith("-D"):
            m = _DEFINE_RE.fullmatch(opt)
            if m is None:
                rep.add("options.define", f"option {shown}: expected "
                        "-DNAME=VALUE with NAME matching [A-Z][A-Z0-9_]*", None)
            elif not (_DEFINE_VALUE_RE.fullmatch(m.group(2))
                      or m.group(2) in DEFINE_TYPES):
                rep.add("options.define", f"option {shown}: value "
                        f"{m.group(2)!r} is neither an integer literal nor one of "
                        f"{', '.join(sorted(DEFINE_TYPES))}", None)
            continue
        rep.add("options.flag", f"option {shown} is not on the allowlist", None)
    return Verdict(GATE, rep.violations(), time.perf_counter() - start)


def allowed_settings(options: object) -> tuple[dict[str, str], tuple[int, ...]]:
    """The ``-DNAME=VALUE`` macros and the architectures among ``options``.

    Only options :func:`check_compile_options` accepts count; anything else
    (the wrong type included) is left out, for that check reports it.
    """
    defines: dict[str, str] = {}
    archs: list[int] = []
    if isinstance(options, str | bytes) or not isinstance(options, Sequence):
        return defines, ()
    try:
        items = list(options)
    except Exception:  # a hostile sequence: check_compile_options reports it
        return defines, ()
    lo, hi = ARCH_RANGE
    for opt in items:
        if not isinstance(opt, str):
            continue
        if (m := _ARCH_RE.fullmatch(opt)) is not None and lo <= int(m.group(1)) <= hi:
            archs.append(int(m.group(1)))
        elif (m := _DEFINE_RE.fullmatch(opt)) is not None and (
                _DEFINE_VALUE_RE.fullmatch(m.group(2)) or m.group(2) in DEFINE_TYPES):
            defines[m.group(1)] = m.group(2)
    return defines, tuple(archs)
