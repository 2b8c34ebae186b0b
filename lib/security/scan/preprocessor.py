"""Gate 2a, layer 2: directives and macro expansion, over every branch.

:class:`Preprocessor` reads the tokens of one source. Its
:meth:`~Preprocessor.preprocess` checks each directive (``#include``
allowlist, ``#pragma``, ``#line``, reserved names...) and records each
``#define``/``#undef`` in a versioned macro table, without evaluating
``#if``: every branch is kept, and a macro defined differently in different
branches keeps every definition. :meth:`~Preprocessor.expand` then expands
macros the way the compiler would (Prosser's algorithm with hide sets, ``#``
and ``##``) with the last definition, and hands each use expanded with an
earlier, alternative definition to a callback, so the token checks see every
text the compiler could be made to read. Expansion is bounded: past the
token budget or the nesting limit it raises :class:`BudgetSpent`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass

from lib.security.scan.lexer import Tok, lex
from lib.security.scan.report import Report
from lib.security.scan.rules import ALLOWED_INCLUDES, KEYWORDS

#: Macro expansion may produce at most this many tokens plus
#: ``EXPANSION_PER_TOKEN`` per source token; beyond that the source is refused.
EXPANSION_BUDGET = 20_000
EXPANSION_PER_TOKEN = 8
#: Deepest nesting of macro invocations inside macro arguments.
MAX_NESTING = 64


@dataclass(frozen=True)
class Macro:
    """One ``#define``: its parameters (``None`` when object-like), its body
    tokens and the source line of the directive."""

    name: str
    params: tuple[str, ...] | None  # None: object-like
    variadic: bool
    body: tuple[Tok, ...]
    line: int

    def signature(self) -> tuple:
        """What makes two definitions the same definition."""
        return (self.params, self.variadic, tuple(t.text for t in self.body))


class BudgetSpent(Exception):
    """Raised inside expansion when the token budget is spent."""


def _stringize(arg: list[Tok], at: Tok) -> Tok:
    """``# arg``: the string literal spelling the argument tokens."""
    parts = []
    for k, a in enumerate(arg):
        if k and a.ws:
            parts.append(" ")
        raw = a.raw
        if a.kind in ("str", "chr", "raw"):
            raw = raw.replace("\\", "\\\\").replace('"', '\\"')
        parts.append(raw)
    text = '"' + "".join(parts) + '"'
    return Tok("str", text, text, at.pos, at.line, False, False, True)


def _paste(lhs: Tok, rhs: Tok) -> list[Tok]:
    """``lhs ## rhs``: re-lex the joined text; every piece is checked."""
    pasted = lex(lhs.raw + rhs.raw)
    for p in pasted:
        p.pos, p.line, p.ws = lhs.pos, lhs.line, lhs.ws
        p.hide = lhs.hide | rhs.hide
    return pasted


class Preprocessor:
    """The directives and the macro table of one source, and its expansion.

    Args:
        toks: every token of the source, as :func:`~lib.security.scan.lexer.lex`
            made them (their ``ver`` is set by :meth:`preprocess`).
        spliced: the text the tokens were lexed from (``#include <...>`` reads
            the header name from it).
        rep: where violations go.
        on_alternative: called with the tokens of one macro use expanded with
            an alternative definition, and a note naming that definition
            (``"; alternative definition of 'M' from line 3"``).
    """

    def __init__(self, toks: list[Tok], spliced: str, rep: Report,
                 on_alternative: Callable[[list[Tok], str], None]) -> None:
        self.rep = rep
        self.toks = toks
        self.spliced = spliced
        self.on_alternative = on_alternative
        # name -> (table versions, definitions in force from each version on)
        self.history: dict[str, tuple[list[int], list[tuple[Macro, ...]]]] = {}
        # while one alternative definition is expanded, it wins every lookup
        self.override: tuple[str, Macro] | None = None
        self.budget_total = EXPANSION_BUDGET + EXPANSION_PER_TOKEN * len(toks)
        self.budget = self.budget_total

    # ---- layer 2: directives -------------------------------------------------
    def preprocess(self) -> list[Tok]:
        """Handle directives (all branches); return the code tokens, in order."""
        code: list[Tok] = []
        toks, n = self.toks, len(self.toks)
        ver = depth = 0
        i = 0
        while i < n:
            t = toks[i]
            if t.kind == "punct" and t.text == "#" and t.nl_any:
                j = i + 1
                while j < n and not toks[j].nl and not (
                    toks[j].text == "#" and toks[j].nl_any and toks[j].kind == "punct"
                ):
                    j += 1
                ver, depth = self.directive(toks[i:j], ver, depth)
                i = j
                continue
            if t.kind == "punct" and t.text in ("#", "##"):
                self.rep.add("pp.stray_hash", f"'{t.raw}' outside a directive", t.line)
            t.ver = ver
            code.append(t)
            i += 1
        return code

    def directive(self, d: list[Tok], ver: int, depth: int) -> tuple[int, int]:
        """Check one directive ``d`` (from ``#`` to the end of its line).

        ``ver`` is the macro-table version and ``depth`` the ``#if`` nesting
        before it; returns both after it.
        """
        rep = self.rep
        if len(d) == 1:
            return ver, depth  # the null directive
        name_tok = d[1]
        name = name_tok.text
        line = d[0].line
        if name_tok.kind == "num":
            rep.add("pp.line", f"line marker '# {name}' is not allowed", line)
        elif name_tok.kind != "id":
            rep.add("pp.directive", f"malformed directive '#{name_tok.raw[:20]}'",
                    line)
        elif name == "include":
            self.include(d, line)
        elif name in ("include_next", "import", "embed"):
            rep.add("pp.include", f"'#{name}' is not allowed", line)
        elif name == "line":
            rep.add("pp.line", "'#line' is not allowed", line)
        elif name == "pragma":
            words = [t.text for t in d[2:]]
            ok = words == ["unroll"] or (
                len(words) == 2 and words[0] == "unroll"
                and re.fullmatch(r"[0-9]+|0[xX][0-9a-fA-F]+", words[1]) is not None
            )
            if not ok:
                shown = " ".join(t.raw for t in d[2:])[:60]
                rep.add("pp.pragma", f"'#pragma {shown}' is not allowed (only "
                        "'#pragma unroll' and '#pragma unroll N')", line)
        elif name == "define":
            ver = self.define(d, ver, depth)
        elif name == "undef":
            ver = self.undef(d, ver, depth)
        elif name in ("if", "ifdef", "ifndef"):
            depth += 1
        elif name == "endif":
            depth = max(0, depth - 1)
        elif name not in ("elif", "else", "elifdef", "elifndef", "error", "warning"):
            rep.add("pp.directive", f"directive '#{name[:30]}' is not allowed", line)
        return ver, depth

    def include(self, d: list[Tok], line: int) -> None:
        """``#include``: only a header on the allowlist, named literally."""
        if len(d) < 3:
            self.rep.add("pp.computed_include", "'#include' without a header",
                         line)
            return
        first = d[2]
        if first.kind == "str" and first.raw.startswith('"'):
            header = first.raw[1:-1]
        elif first.text == "<":
            stop = self.spliced.find("\n", first.pos)
            stop = len(self.spliced) if stop < 0 else stop
            close = self.spliced.find(">", first.pos, stop)
            header = self.spliced[first.pos + 1:close] if close >= 0 else None
        else:
            self.rep.add("pp.computed_include", f"'#include {first.raw[:40]}' "
                         "names no header (computed include)", line)
            return
        if header not in ALLOWED_INCLUDES:
            allowed = ", ".join(sorted(ALLOWED_INCLUDES))
            self.rep.add("pp.include", f"header {header!r} is not on the allowlist "
                         f"({allowed})", line)

    def _reserved(self, name: str, what: str, line: int) -> None:
        """Refuse ``#define``/``#undef`` (``what``) of a keyword or reserved name."""
        if name in KEYWORDS or name.startswith("__") or re.match("_[A-Z]", name):
            self.rep.add("pp.define_reserved", f"'#{what} {name[:40]}' redefines a "
                         "keyword or reserved name", line)

    def define(self, d: list[Tok], ver: int, depth: int) -> int:
        """Record ``#define``; returns the new table version.

        Inside an ``#if`` (``depth`` > 0) the definition is added to those
        already in force, since the scanner does not know which branch the
        compiler takes.
        """
        if len(d) < 3 or d[2].kind != "id":
            return ver
        name = d[2].text
        self._reserved(name, "define", d[0].line)
        params: tuple[str, ...] | None = None
        variadic = False
        k = 3
        if k < len(d) and d[k].text == "(" and not d[k].ws:
            plist: list[str] = []
            k += 1
            while k < len(d) and d[k].text != ")":
                if d[k].text == "...":
                    variadic = True
                    plist.append("__VA_ARGS__")
                elif d[k].kind == "id":
                    if k + 1 < len(d) and d[k + 1].text == "...":
                        variadic = True
                        k += 1
                    plist.append(d[k - 1].text if d[k].text == "..." else d[k].text)
                k += 1
            k += 1
            params = tuple(plist)
        macro = Macro(name, params, variadic, tuple(d[k:]), d[0].line)
        defs = self.lookup(name, ver)
        if depth == 0:
            new = (macro,)
        elif any(m.signature() == macro.signature() for m in defs):
            new = defs
        else:
            new = defs + (macro,)
        return self._push(name, ver + 1, new)

    def undef(self, d: list[Tok], ver: int, depth: int) -> int:
        """Record ``#undef``; returns the new table version."""
        if len(d) < 3 or d[2].kind != "id":
            return ver
        self._reserved(d[2].text, "undef", d[0].line)
        if depth:  # maybe undefined: the unexpanded text is scanned anyway
            return ver
        return self._push(d[2].text, ver + 1, ())

    def _push(self, name: str, ver: int, defs: tuple[Macro, ...]) -> int:
        vers, states = self.history.setdefault(name, ([], []))
        vers.append(ver)
        states.append(defs)
        return ver

    def lookup(self, name: str, ver: int) -> tuple[Macro, ...]:
        """The definitions of ``name`` in force at table version ``ver``."""
        if self.override is not None and self.override[0] == name:
            return (self.override[1],)
        entry = self.history.get(name)
        if entry is None:
            return ()
        k = bisect.bisect_right(entry[0], ver)
        return entry[1][k - 1] if k else ()

    # ---- layer 2b: macro expansion -------------------------------------------
    def spend(self, n: int) -> None:
        """Take ``n`` tokens from the budget; raise BudgetSpent when it is gone."""
        self.budget -= n
        if self.budget < 0:
            raise BudgetSpent

    def expand(self, toks: list[Tok], sides: bool, nesting: int = 0) -> list[Tok]:
        """Expand macros in ``toks`` (Prosser's algorithm, hide sets).

        With ``sides``, each use of a macro that has alternative definitions
        is also expanded with each of them and handed to ``on_alternative``.
        """
        if nesting > MAX_NESTING:
            raise BudgetSpent
        out: list[Tok] = []
        pending = toks[::-1]
        while pending:
            t = pending.pop()
            if t.kind != "id" or t.text in t.hide:
                out.append(t)
                continue
            defs = self.lookup(t.text, t.ver)
            if not defs:
                out.append(t)
                continue
            macro = defs[-1]
            if sides:
                for alt in defs[:-1]:
                    self.side(t, alt, pending)
            if macro.params is not None and (
                not pending or pending[-1].text != "(" or pending[-1].kind != "punct"
            ):
                out.append(t)
                continue
            repl = self.invoke(t, macro, pending, sides, nesting)
            self.spend(len(repl) + 1)
            pending.extend(reversed(repl))
        return out

    def invoke(
        self, t: Tok, m: Macro, pending: list[Tok], sides: bool, nesting: int
    ) -> list[Tok]:
        """Replace the use ``t`` of ``m``, taking its arguments off ``pending``."""
        hide = t.hide | {m.name}
        origin = t.origin or m.name
        args: list[list[Tok]] = []
        if m.params is not None:
            pending.pop()  # "("
            depth, cur = 1, []
            while pending:
                a = pending.pop()
                if a.kind == "punct" and a.text == "(":
                    depth += 1
                elif a.kind == "punct" and a.text == ")":
                    depth -= 1
                    if depth == 0:
                        break
                elif (a.kind == "punct" and a.text == "," and depth == 1
                      and not (m.variadic and len(args) >= len(m.params) - 1)):
                    args.append(cur)
                    cur = []
                    continue
                cur.append(a)
            args.append(cur)
            self.spend(sum(len(a) for a in args))
        params = {p: k for k, p in enumerate(m.params or ())}

        def arg(name: str) -> list[Tok]:
            k = params[name]
            return args[k] if k < len(args) else []

        body = m.body
        res: list[Tok | None] = []  # None is a placemarker
        i = 0
        while i < len(body):
            b = body[i]
            nxt = body[i + 1] if i + 1 < len(body) else None
            if b.text == "#" and b.kind == "punct" and nxt is not None \
                    and nxt.text in params:
                res.append(_stringize(arg(nxt.text), b))
                i += 2
                continue
            if b.text == "##" and b.kind == "punct" and res and nxt is not None:
                rhs = list(arg(nxt.text)) if nxt.text in params else [nxt]
                lhs = res.pop()
                if lhs is None:
                    res.extend(rhs or [None])
                elif not rhs:
                    res.append(lhs)
                else:
                    res.extend(_paste(lhs, rhs[0]))
                    res.extend(rhs[1:])
                i += 2
                continue
            if b.kind == "id" and b.text in params:
                raw = arg(b.text)
                if nxt is not None and nxt.text == "##":
                    res.extend(raw or [None])
                else:
                    res.extend(self.expand(raw, sides, nesting + 1))
                i += 1
                continue
            res.append(b)
            i += 1
        return [r.derive(t.line, hide | r.hide, origin, t.ver)
                for r in res if r is not None]

    def side(self, t: Tok, alt: Macro, pending: list[Tok]) -> None:
        """Expand one use of ``t`` with an alternative definition ``alt``."""
        take: list[Tok] = []
        depth, extra = 0, 8
        for a in reversed(pending):
            take.append(a)
            if len(take) > 4096:
                break
            if alt.params is not None and a.kind == "punct":
                depth += {"(": 1, ")": -1}.get(a.text, 0)
            if depth <= 0:
                extra -= 1
                if extra <= 0:
                    break
        self.spend(len(take) + 1)
        saved, self.override = self.override, (t.text, alt)
        try:
            out = self.expand([t] + take, False)
        finally:
            self.override = saved
        self.on_alternative(out, f"; alternative definition of '{t.text}' from "
                            f"line {alt.line}")

