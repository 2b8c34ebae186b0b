"""Gate 2a, layer 3b: the shape of the kernel, on the expanded tokens.

:func:`check_kernels` requires exactly one ``__global__`` kernel (also
spelled ``__location__(global)``, ``__annotate__(global)``,
``__attribute__((..., global, ...))``, ``__declspec(__global__)`` or
``[[...global...]]``, wherever ``global`` stands in the list), named as
expected and declared ``extern "C"`` (on itself or by an enclosing
``extern "C" { ... }``) wherever it is declared, whatever attributes come
before or after the marker.

:func:`check_extern` refuses every ``extern`` but the kernel's own
``extern "C"`` (``token.extern``): ``extern char** environ``, ``extern
__shared__`` arrays (dynamic shared memory, which no launch here provides),
``extern "C"`` on anything but a kernel (a C-linkage function or variable
would take the place of the C library's in the host build), ``extern "C++"``
and ``extern template``. Pure functions of their arguments; findings go to
the :class:`~lib.security.scan.report.Report`.
"""

from __future__ import annotations

from lib.security.scan.lexer import Tok, match_brackets
from lib.security.scan.report import Report
from lib.security.scan.rules import ATTRIBUTE_WORDS
from lib.security.scan.token_checks import flag

#: Kernel markers (``__global__``...) looked at before giving up counting.
MAX_KERNEL_MARKERS = 64


def check_kernels(rep: Report, toks: list[Tok], kernel_name: str | None,
                  match: list[int] | None = None) -> None:
    """Check the kernels declared in ``toks`` against ``kernel_name``.

    ``kernel_name`` is ``None`` when the caller's name was not an identifier
    (already reported); then every kernel is reported under ``kernel.name``.
    ``match`` is :func:`~lib.security.scan.lexer.match_brackets` of ``toks``.
    """
    kernels: dict[str, list] = {}  # name -> [first line, extern "C" always]
    c_block: list[bool] = []
    pending_c = False
    n = len(toks)
    if match is None:
        match = match_brackets(toks)
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
        if not _is_kernel_marker(toks, i, match):
            continue
        markers += 1
        if markers > MAX_KERNEL_MARKERS:
            kernels.setdefault(f"<{markers}+ kernel markers>", [t.line, False])
            break
        extern_c = any(c_block) or _extern_c_before(toks, i)
        names = _kernel_names(toks, i, match) or [f"<unnamed kernel, line {t.line}>"]
        for name in names:
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


_MARKER_LISTS = frozenset({"__location__", "__annotate__", "__attribute__",
                           "__attribute", "__declspec"})
#: Tokens of an attribute list looked at for ``global``.
MAX_ATTRIBUTE_TOKENS = 512


def _is_kernel_marker(toks: list[Tok], i: int, match: list[int]) -> bool:
    """``toks[i]`` marks a kernel: ``__global__``, or an attribute list
    (``__attribute__((...))``, ``[[...]]``...) that names ``global``."""
    t = toks[i]
    if t.kind == "id" and t.text == "__global__":
        return True
    if t.kind == "id" and t.text in _MARKER_LISTS:
        k = i + 1
    elif t.text == "[" and i + 1 < len(toks) and toks[i + 1].text == "[":
        k = i
    else:
        return False
    if k >= len(toks) or match[k] <= k:
        return False
    stop = min(match[k], k + MAX_ATTRIBUTE_TOKENS)
    return any(x.kind == "id" and x.text in ("global", "__global__")
               for x in toks[k + 1:stop])


def _extern_c_before(toks: list[Tok], i: int) -> bool:
    """``extern "C"`` in the same declaration, before ``toks[i]``."""
    for k in range(i - 1, max(-1, i - 64), -1):
        t = toks[k]
        if t.text in (";", "{", "}"):
            return False
        if t.raw == '"C"' and k and toks[k - 1].text == "extern":
            return True
    return False


def _kernel_names(toks: list[Tok], i: int, match: list[int]) -> list[str]:
    """The names a kernel declaration declares, from its marker at ``toks[i]``:
    the first declarator's and those after it (``void k(...), k2(...);``)."""
    first, paren = _kernel_name(toks, i, match)
    if first is None:
        return []
    names = [first]
    k = match[paren] + 1 if paren >= 0 and match[paren] > paren else len(toks)
    while k < len(toks) and toks[k].text == "," and len(names) < 64:
        k += 1
        while k < len(toks) and toks[k].text in ("*", "&", "&&", "const"):
            k += 1
        if k + 1 < len(toks) and toks[k].kind == "id" and toks[k + 1].text == "(" \
                and match[k + 1] > k + 1:
            names.append(toks[k].text)
            k = match[k + 1] + 1
        else:
            break
    return names


def _kernel_name(toks: list[Tok], i: int, match: list[int]
                 ) -> tuple[str | None, int]:
    """The declarator name after a kernel marker at ``toks[i]``, and the
    index of its parameter list's ``(`` (-1 when there is none)."""
    n = len(toks)
    k = i + 1
    if k < n and toks[k].text in ("(", "[") and match[k] > k:  # the list
        k = match[k] + 1
    start = k
    while k < n and k < i + 512:
        t = toks[k]
        if t.text in (";", "{", "}"):
            return None, -1
        if t.kind == "id" and (t.text in ATTRIBUTE_WORDS or t.text in _MARKER_LISTS):
            k += 1
            if k < n and toks[k].text == "(" and match[k] > 0:
                k = match[k]
            k += 1
            continue
        if t.text == "[" and k + 1 < n and toks[k + 1].text == "[" and match[k] > k:
            k = match[k] + 1
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
            if prev.kind == "id" and back >= start:
                return prev.text, k
            return None, -1
        k += 1
    return None, -1


def check_extern(rep: Report, toks: list[Tok], match: list[int] | None = None
                 ) -> None:
    """Refuse every ``extern`` in ``toks`` but ``extern "C"`` on kernels.

    ``extern "C" <declaration>`` passes when the declaration marks a kernel;
    ``extern "C" { ... }`` when every declaration in the block does.
    """
    if match is None:
        match = match_brackets(toks)
    n = len(toks)
    for i, t in enumerate(toks):
        if t.kind != "id" or t.text != "extern":
            continue
        nxt = toks[i + 1] if i + 1 < n else None
        if nxt is None or nxt.kind != "str" or nxt.raw != '"C"':
            shown = nxt.raw[:20] if nxt is not None else ""
            flag(rep, "token.extern", f"'extern {shown}': only the kernel may be "
                 "declared extern, as extern \"C\"", t)
            continue
        k = i + 2
        if k < n and toks[k].text == "{":
            bad = _block_without_kernels(toks, k, match)
        else:
            end = _declaration_end(toks, k, match)
            bad = not _marks_kernel(toks, k, end, match)
        if bad:
            flag(rep, "token.extern", 'extern "C" on something other than the '
                 "kernel (C linkage would let it stand in for a C library "
                 "symbol in the host build)", t)


def _declaration_end(toks: list[Tok], k: int, match: list[int]) -> int:
    """The index of the ``;`` or body ``{`` ending the declaration at ``k``."""
    n = len(toks)
    while k < n and toks[k].text not in (";", "{", "}"):
        if toks[k].text in ("(", "[") and match[k] > k:
            k = match[k]
        k += 1
    return k


def _marks_kernel(toks: list[Tok], start: int, end: int, match: list[int]) -> bool:
    return any(_is_kernel_marker(toks, j, match) for j in range(start, end))


def _block_without_kernels(toks: list[Tok], brace: int, match: list[int]) -> bool:
    """``extern "C" {`` at ``brace`` holds a declaration that is no kernel."""
    close = match[brace]
    if close < 0:
        return True
    k = brace + 1
    while k < close:
        end = _declaration_end(toks, k, match)
        end = min(end, close)
        if end > k and not _marks_kernel(toks, k, end, match):
            return True
        if end < close and toks[end].text == "{":
            end = match[end] if match[end] > end else close
        k = end + 1
    return False
