"""Gate 2a, layer 3b: the shape of the kernel, on the expanded tokens.

:func:`check_kernels` requires exactly one ``__global__`` kernel (also
spelled ``__location__(global)``, ``__attribute__((global))`` or
``__declspec(__global__)``), named as expected and declared ``extern "C"``
(on itself or by an enclosing ``extern "C" { ... }``) wherever it is
declared. A pure function of its arguments; findings go to the
:class:`~lib.security.scan.report.Report`.
"""

from __future__ import annotations

from lib.security.scan.lexer import Tok, match_parens
from lib.security.scan.report import Report
from lib.security.scan.rules import ATTRIBUTE_WORDS

#: Kernel markers (``__global__``...) looked at before giving up counting.
MAX_KERNEL_MARKERS = 64


def check_kernels(rep: Report, toks: list[Tok], kernel_name: str | None) -> None:
    """Check the kernels declared in ``toks`` against ``kernel_name``.

    ``kernel_name`` is ``None`` when the caller's name was not an identifier
    (already reported); then every kernel is reported under ``kernel.name``.
    """
    kernels: dict[str, list] = {}  # name -> [first line, extern "C" always]
    c_block: list[bool] = []
    pending_c = False
    n = len(toks)
    match = match_parens(toks)
    markers = 0
    for i, t in enumerate(toks):
        if t.kind == "punct" and t.text == "{":
            c_block.append(pending_c)
            pending_c = False
        elif t.kind == "punct" and t.text == "}":
            if c_block:
                c_block.pop()
        elif t.kind == "id" and t.text == "extern" and i + 2 < n \
                and toks[i + 1].raw == '"C"' and toks[i + 2].text == "{":
            pending_c = True
        if not _is_kernel_marker(toks, i):
            continue
        markers += 1
        if markers > MAX_KERNEL_MARKERS:
            kernels.setdefault(f"<{markers}+ kernel markers>", [t.line, False])
            break
        extern_c = any(c_block) or _extern_c_before(toks, i)
        name = _kernel_name(toks, i, match)
        name = name or f"<unnamed kernel, line {t.line}>"
        entry = kernels.setdefault(name, [t.line, True])
        entry[1] = entry[1] and extern_c
    if len(kernels) != 1:
        names = ", ".join(sorted(kernels))[:200] or "none"
        rep.add("kernel.count", f"expected exactly one extern \"C\" __global__ "
                f"kernel, found {len(kernels)} ({names})",
                min((v[0] for v in kernels.values()), default=None))
    for name, (line, extern_c) in kernels.items():
        if not extern_c:
            rep.add("kernel.extern_c", f"__global__ kernel '{name}' is not "
                    "declared extern \"C\"", line)
        if name != kernel_name:
            rep.add("kernel.name", f"kernel '{name}' is not the expected "
                    f"{kernel_name!r}", line)


def _is_kernel_marker(toks: list[Tok], i: int) -> bool:
    """``toks[i]`` marks a kernel: ``__global__`` or one of its other spellings."""
    t = toks[i]
    if t.kind != "id":
        return False
    if t.text in ("__global__", "__location__"):
        return True
    if t.text in ("__attribute__", "__declspec"):
        inner = [x.text for x in toks[i + 1:i + 8]]
        return "global" in inner or "__global__" in inner
    return False


def _extern_c_before(toks: list[Tok], i: int) -> bool:
    """``extern "C"`` in the same declaration, before ``toks[i]``."""
    for k in range(i - 1, max(-1, i - 64), -1):
        t = toks[k]
        if t.text in (";", "{", "}"):
            return False
        if t.raw == '"C"' and k and toks[k - 1].text == "extern":
            return True
    return False


def _kernel_name(toks: list[Tok], i: int, match: list[int]) -> str | None:
    """The declarator name after a kernel marker at ``toks[i]``."""
    n = len(toks)
    k = i + 1
    if k < n and toks[k].text == "(" and match[k] > 0:  # __attribute__((..))
        k = match[k] + 1
    start = k
    while k < n and k < i + 512:
        t = toks[k]
        if t.text in (";", "{", "}"):
            return None
        if t.kind == "id" and t.text in ATTRIBUTE_WORDS:
            k += 1
            if k < n and toks[k].text == "(" and match[k] > 0:
                k = match[k]
            k += 1
            continue
        if t.text == "(":
            back = k - 1
            if toks[back].text == ">":  # explicit specialisation
                depth = 0
                while back > i:
                    depth += {">": 1, "<": -1}.get(toks[back].text, 0)
                    if depth == 0:
                        break
                    back -= 1
                back -= 1
            prev = toks[back]
            return prev.text if prev.kind == "id" and back >= start else None
        k += 1
    return None
