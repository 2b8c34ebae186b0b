"""Gate 2a, layer 2: directives and macro expansion, per compiler configuration.

:class:`Preprocessor` reads the tokens of one source in two ways.

- :meth:`~Preprocessor.scan_directives` checks every directive as written, in
  every branch, taken or not (``#include`` allowlist, ``#pragma``, ``#line``,
  reserved names, the nesting of conditionals), and records them.
- :meth:`~Preprocessor.runs` then reads the source once per
  :class:`~lib.security.scan.conditions.Configuration` (NVRTC for each target
  architecture, the host build) the way that compiler will: ``#if``,
  ``#ifdef``, ``#elif``... are decided under its predefined macros, and a
  ``#define`` or ``#undef`` counts only in a branch it takes. A conditional
  the scanner cannot decide (a reserved name it does not know, a version
  number, ``__has_builtin``) is read both ways, each a separate run. Runs
  that take the same branches are read once. Each :class:`Run` holds the
  code tokens that compiler sees and the macro table in force at each.

:meth:`~Preprocessor.expand` expands macros the way the compiler does
(Prosser's algorithm with hide sets, ``#`` and ``##``). Its cost is bounded
before it is paid: each argument is expanded once per use of the macro,
every token is charged to the run's budget before it is built, and one use
may produce at most :data:`MAX_USE_TOKENS`; past either limit, or the nesting
limit, it raises :class:`BudgetSpent`.

Why one module: directives, conditional runs and expansion share one state per
configuration (the macro table in force at each token, the hide sets, the
expansion budget), and the compiler's behaviour that an attacker exploits
lives in how they interleave (a ``#define`` inside a branch, an expansion
that produces ``defined``); a reviewer follows one token through all three.
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from lib.security.scan.conditions import (
    UNDEFINED,
    UNKNOWN,
    Configuration,
    evaluate,
    is_constant_expression,
)
from lib.security.scan.lexer import Tok, lex
from lib.security.scan.report import Report
from lib.security.scan.rules import ALLOWED_INCLUDES, KEYWORDS

#: A run's macro expansion may produce at most this many tokens plus
#: ``EXPANSION_PER_TOKEN`` per source token; beyond that the source is refused.
EXPANSION_BUDGET = 20_000
EXPANSION_PER_TOKEN = 8
#: All runs together may spend this many runs' budgets.
TOTAL_BUDGET_RUNS = 4
#: The most tokens one macro use may produce.
MAX_USE_TOKENS = 8_192
#: Deepest nesting of macro invocations inside macro arguments.
MAX_NESTING = 64
#: The most distinct runs scanned, and walks through the directives made,
#: before the source is refused for having too many configurations.
MAX_RUNS = 32
MAX_WALKS = 64
#: The most tokens (source items walked, expanded tokens checked) all runs
#: together may cost, so that many runs of a large source stay fast.
MAX_WALKED_ITEMS = 2_000_000
MAX_CHECKED_TOKENS = 600_000

_CONDITIONALS = frozenset({"if", "ifdef", "ifndef", "elif", "elifdef", "elifndef",
                           "else", "endif"})
_MISSING = object()  # no entry in the macro table: the configuration decides


@dataclass(frozen=True)
class Macro:
    """One ``#define`` (or ``-D`` option): its parameters (``None`` when
    object-like), its body tokens and the source line of the directive."""

    name: str
    params: tuple[str, ...] | None  # None: object-like
    variadic: bool
    body: tuple[Tok, ...]
    line: int


class BudgetSpent(Exception):
    """Raised inside expansion when a limit is reached; the message says which."""


@dataclass
class Directive:
    """One directive: its kind (``define``, ``if``...; ``other`` for the
    rest), its tokens from ``#`` to the end of the line, its line, and what
    was read from it (the macro of a ``#define``, the name of an ``#undef``
    or ``#ifdef``)."""

    kind: str
    toks: list[Tok]
    line: int
    macro: Macro | None = None
    name: str | None = None


@dataclass
class Run:
    """One reading of the source by one configuration.

    ``forks`` are the choices made at conditionals the scanner could not
    decide (``True``: taken), ``fork_lines`` their lines; ``decisions`` the
    outcome of every conditional evaluated, in order; ``code`` the tokens in
    the branches taken; ``pragmas`` the ``#pragma`` directives taken, with
    the macro-table version at each.
    """

    config: Configuration
    prefix: tuple[bool, ...]
    forks: list[bool] = field(default_factory=list)
    fork_lines: list[int] = field(default_factory=list)
    decisions: list[bool] = field(default_factory=list)
    code: list[Tok] = field(default_factory=list)
    pragmas: list[tuple[Directive, int]] = field(default_factory=list)
    history: dict = field(default_factory=dict)
    over_budget: str | None = None

    def choose(self, line: int) -> bool:
        """The branch taken at an undecided conditional on ``line``."""
        k = len(self.forks)
        choice = self.prefix[k] if k < len(self.prefix) else False
        self.forks.append(choice)
        self.fork_lines.append(line)
        return choice

    @property
    def label(self) -> str:
        """The configuration, and the undecided conditionals' branches."""
        if not self.forks:
            return self.config.name
        taken = ", ".join(f"line {n} {'taken' if c else 'not taken'}"
                          for n, c in zip(self.fork_lines, self.forks, strict=True))
        return f"{self.config.name} with #if at {taken}"


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


def parse_define(d: Sequence[Tok]) -> Macro | None:
    """The macro of the directive tokens ``# define NAME ...``, or None."""
    if len(d) < 3 or d[2].kind != "id":
        return None
    name = d[2].text
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
    return Macro(name, params, variadic, tuple(d[k:]), d[0].line)


class Preprocessor:
    """The directives of one source, its runs, and their macro expansion.

    Args:
        toks: every token of the source, as :func:`~lib.security.scan.lexer.lex`
            made them.
        spliced: the text the tokens were lexed from (``#include <...>`` reads
            the header name from it).
        rep: where violations found as written go.
        defines: macros the compile options define (``-DNAME=VALUE``).
    """

    def __init__(self, toks: list[Tok], spliced: str, rep: Report,
                 defines: Mapping[str, Macro] | None = None) -> None:
        self.rep = rep
        self.toks = toks
        self.spliced = spliced
        self.defines = dict(defines or {})
        self.items: list[Tok | Directive] = []
        self.macros: list[Macro] = []  # every #define, in every branch
        self.run_budget = EXPANSION_BUDGET + EXPANSION_PER_TOKEN * len(toks)
        self.total_left = TOTAL_BUDGET_RUNS * self.run_budget
        self.budget = self._start_budget = self.run_budget
        #: Tokens the checks of later runs may still read (the scanner
        #: subtracts each run's expanded length).
        self.checked_left = MAX_CHECKED_TOKENS
        self.config: Configuration | None = None
        self.history: dict[str, tuple[list[int], list[Macro | None]]] = {}

    # ---- layer 2: directives, as written -----------------------------------
    def scan_directives(self) -> None:
        """Check every directive in every branch; record directives and code."""
        toks, n = self.toks, len(self.toks)
        open_ifs: list[list] = []  # [line, seen #else]
        i = 0
        while i < n:
            t = toks[i]
            # A directive starts with '#' first on a line: only blanks and
            # comments without a newline may precede it on that line.
            if t.kind == "punct" and t.text == "#" and t.nl:
                j = i + 1
                while j < n and not toks[j].nl:
                    j += 1
                d = self.directive(toks[i:j])
                if d is not None:
                    self._structure(d, open_ifs)
                    self.items.append(d)
                i = j
                continue
            if t.kind == "punct" and t.text in ("#", "##"):
                self.rep.add("pp.stray_hash", f"'{t.raw}' outside a directive",
                             t.line)
            self.items.append(t)
            i += 1
        for line, _ in open_ifs:
            self.rep.add("pp.conditional", f"conditional opened on line {line} "
                         "has no #endif", line)

    def _structure(self, d: Directive, open_ifs: list[list]) -> None:
        """Check the nesting of conditional directives."""
        if d.kind in ("if", "ifdef", "ifndef"):
            open_ifs.append([d.line, False])
        elif d.kind in ("elif", "elifdef", "elifndef", "else", "endif"):
            if not open_ifs:
                self.rep.add("pp.conditional", f"#{d.kind} without #if", d.line)
            elif d.kind == "endif":
                open_ifs.pop()
            elif open_ifs[-1][1]:
                self.rep.add("pp.conditional", f"#{d.kind} after #else", d.line)
            elif d.kind == "else":
                open_ifs[-1][1] = True

    def directive(self, d: list[Tok]) -> Directive | None:
        """Check one directive ``d`` (from ``#`` to the end of its line)."""
        rep = self.rep
        if len(d) == 1:
            return None  # the null directive
        name_tok = d[1]
        name = name_tok.text
        line = d[0].line
        kind = name if name_tok.kind == "id" and name in _CONDITIONALS else "other"
        out = Directive(kind, d, line)
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
            out.kind = "pragma"
            self.pragma(d, line)
        elif name == "define":
            macro = parse_define(d)
            if macro is not None:
                self._reserved(macro.name, "define", line)
                # A forbidden name in a body is the macro's, in every branch.
                for b in macro.body:
                    b.origin = macro.name
                self.macros.append(macro)
                out.kind, out.macro = "define", macro
        elif name == "undef":
            if len(d) >= 3 and d[2].kind == "id":
                self._reserved(d[2].text, "undef", line)
                out.kind, out.name = "undef", d[2].text
        elif kind in ("ifdef", "ifndef", "elifdef", "elifndef"):
            out.name = d[2].text if len(d) > 2 and d[2].kind == "id" else None
        elif kind == "other" and name not in ("error", "warning"):
            rep.add("pp.directive", f"directive '#{name[:30]}' is not allowed", line)
        return out

    def pragma(self, d: list[Tok], line: int) -> None:
        """``#pragma``: only ``unroll``, alone or with one constant expression
        (``#pragma unroll 4``, ``#pragma unroll UNROLL``, ``#pragma unroll
        (TILE / 4)``); what a macro argument expands to is checked per run."""
        args = d[3:]
        if len(d) > 2 and d[2].text == "unroll" and (
                not args or is_constant_expression(args)):
            return
        shown = " ".join(t.raw for t in d[2:])[:60]
        self.rep.add("pp.pragma", f"'#pragma {shown}' is not allowed (only "
                     "'#pragma unroll' and '#pragma unroll N', N a constant "
                     "expression)", line)

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

    # ---- layer 2: runs, one per configuration and undecided branch ---------
    def runs(self, configs: Sequence[Configuration]) -> Iterator[Run]:
        """Each distinct reading of the source by ``configs``.

        A run is yielded before the next walk, and the macro table and budget
        are the run's until then (:meth:`expand` works on them). More than
        :data:`MAX_RUNS` distinct runs, :data:`MAX_WALKS` walks, or more work
        than :data:`MAX_WALKED_ITEMS` and :data:`MAX_CHECKED_TOKENS` allow,
        are refused with ``pp.conditional``.
        """
        names = {t.text for t in self.items if type(t) is Tok and t.kind == "id"}
        names.update(b.text for m in self.macros for b in m.body if b.kind == "id")
        relevant = sorted(n for n in names if any(n in c.defined for c in configs))
        queue = deque((c, ()) for c in configs)
        seen: set[tuple] = set()
        walks = 0
        overflow = False
        while queue or overflow:
            if (overflow or walks >= MAX_WALKS or len(seen) >= MAX_RUNS
                    or (walks + 1) * len(self.items) > MAX_WALKED_ITEMS
                    or self.checked_left <= 0):
                self.rep.add("pp.conditional", "the conditionals give more "
                             f"configurations than the scan reads ({len(seen)} "
                             f"runs, {walks} walks); it stopped there", None)
                return
            config, prefix = queue.popleft()
            walks += 1
            run = self.walk(config, prefix)
            for k in range(len(prefix), len(run.forks)):
                if walks + len(queue) >= MAX_WALKS:
                    overflow = True  # more than can be walked: refused
                    break
                queue.append((config, tuple(run.forks[:k]) + (True,)))
            values = tuple(config.state(n) for n in relevant)
            key = (tuple(run.decisions), values)
            if key not in seen:
                seen.add(key)
                yield run
            spent = self._start_budget - self.budget
            self.total_left -= max(0, spent)

    def walk(self, config: Configuration, prefix: tuple[bool, ...]) -> Run:
        """Read the directives as ``config`` does, with ``prefix`` the choices
        at the first undecided conditionals."""
        run = Run(config, prefix)
        self.config = config
        self.history = run.history
        self.budget = self._start_budget = max(0, min(self.run_budget,
                                                      self.total_left))
        for name, m in self.defines.items():
            self._push(name, 0, m)
        ver = 0
        stack: list[list[bool]] = []  # [enclosing branch active, one taken]
        active = True
        code = run.code
        for item in self.items:
            if type(item) is Tok:
                if active:
                    item.ver = ver
                    code.append(item)
                continue
            kind = item.kind
            if kind in ("if", "ifdef", "ifndef"):
                taken = active and self._decide(item, ver, run)
                stack.append([active, taken])
                active = taken
            elif kind in ("elif", "elifdef", "elifndef"):
                if not stack:
                    continue
                parent, done = stack[-1]
                taken = parent and not done and self._decide(item, ver, run)
                stack[-1][1] = done or taken
                active = taken
            elif kind == "else":
                if stack:
                    parent, done = stack[-1]
                    active = parent and not done
                    stack[-1][1] = True
            elif kind == "endif":
                if stack:
                    active = stack.pop()[0]
            elif not active:
                continue
            elif kind == "define":
                ver += 1
                self._push(item.macro.name, ver, item.macro)
            elif kind == "undef":
                ver += 1
                self._push(item.name, ver, None)
            elif kind == "pragma":
                run.pragmas.append((item, ver))
        return run

    def _decide(self, d: Directive, ver: int, run: Run) -> bool:
        """Whether the branch of conditional ``d`` is taken in ``run``."""
        if d.kind in ("if", "elif"):
            try:
                value = self.condition(d.toks[2:], ver)
            except BudgetSpent as exc:
                run.over_budget = str(exc)
                value = False
        else:
            value = self.defined(d.name, ver) if d.name is not None else None
            if value is not None and d.kind in ("ifndef", "elifndef"):
                value = not value
        if value is None:
            value = run.choose(d.line)
        run.decisions.append(value)
        return value

    def defined(self, name: str, ver: int) -> bool | None:
        """Whether macro ``name`` is defined at table version ``ver``."""
        entry = self.lookup(name, ver)
        if entry is not _MISSING:
            return entry is not None
        state = self.config.state(name)
        return None if state == UNKNOWN else state != UNDEFINED

    def condition(self, toks: list[Tok], ver: int) -> bool | None:
        """The value of an ``#if``/``#elif`` expression; None if unknown."""
        out: list[Tok] = []
        i, n = 0, len(toks)
        while i < n:
            t = toks[i]
            if t.kind == "id" and t.text == "defined":
                j = i + 1
                paren = j < n and toks[j].text == "("
                j += paren
                if j >= n or toks[j].kind != "id":
                    return None
                value = self.defined(toks[j].text, ver)
                j += 1
                if paren:
                    if j >= n or toks[j].text != ")":
                        return None
                    j += 1
                kind, text = ("unknown", "?") if value is None else (
                    "num", "1" if value else "0")
                out.append(Tok(kind, text, text, t.pos, t.line, False, False, True))
                i = j
                continue
            t.ver = ver
            out.append(t)
            i += 1
        expanded = self.expand(out)
        if any(t.kind == "id" and t.text == "defined" for t in expanded):
            return None  # 'defined' made by a macro: compilers differ

        def ident(name: str):
            if self.lookup(name, ver) is not _MISSING:
                return (0, False)  # a function-like macro not invoked
            state = self.config.state(name)
            if type(state) is int:
                return (state, False)
            return (0, False) if state == UNDEFINED else None

        return evaluate(expanded, ident)

    def _push(self, name: str, ver: int, macro: Macro | None) -> None:
        vers, states = self.history.setdefault(name, ([], []))
        vers.append(ver)
        states.append(macro)

    def lookup(self, name: str, ver: int):
        """The macro ``name`` at table version ``ver``: a Macro, None when
        ``#undef``'d, or _MISSING when the source never touched it."""
        entry = self.history.get(name)
        if entry is None:
            return _MISSING
        k = bisect.bisect_right(entry[0], ver)
        return entry[1][k - 1] if k else _MISSING

    def pragma_arguments(self, run: Run) -> list[tuple[int, list[Tok]]]:
        """The expanded arguments of each ``#pragma unroll`` that ``run``
        takes, with its line (uses the run's table: call right after the run
        is yielded)."""
        found = []
        for d, ver in run.pragmas:
            args = d.toks[3:]
            if not args or d.toks[2].text != "unroll":
                continue
            for a in args:
                a.ver = ver
            found.append((d.line, self.expand(args)))
        return found

    # ---- layer 2b: macro expansion -------------------------------------------
    def spend(self, n: int) -> None:
        """Take ``n`` tokens from the budget; raise BudgetSpent when it is gone."""
        self.budget -= n
        if self.budget < 0:
            raise BudgetSpent(f"macro expansion exceeds the budget of "
                              f"{self.run_budget} tokens")

    def expand(self, toks: list[Tok], nesting: int = 0) -> list[Tok]:
        """Expand macros in ``toks`` (Prosser's algorithm, hide sets) with the
        current run's macro table; predefined integer macros of the run's
        configuration (``__CUDA_ARCH__``...) become their value."""
        if nesting > MAX_NESTING:
            raise BudgetSpent(f"macro arguments nest deeper than {MAX_NESTING}")
        out: list[Tok] = []
        pending = toks[::-1]
        defined = self.config.defined if self.config is not None else {}
        while pending:
            t = pending.pop()
            if t.kind != "id" or t.text in t.hide:
                out.append(t)
                continue
            macro = self.lookup(t.text, t.ver)
            if macro is _MISSING:
                value = defined.get(t.text)
                if t.text == "__LINE__" and t.text in defined:
                    value = t.line
                if type(value) is int:
                    text = str(value)
                    num = Tok("num", text, text, t.pos, t.line, False, False, t.ws)
                    num.hide, num.origin, num.ver = t.hide, t.origin, t.ver
                    out.append(num)
                else:
                    out.append(t)
                continue
            if macro is None or (macro.params is not None and (
                    not pending or pending[-1].text != "("
                    or pending[-1].kind != "punct")):
                out.append(t)
                continue
            repl = self.invoke(t, macro, pending, nesting)
            pending.extend(reversed(repl))
        return out

    def invoke(self, t: Tok, m: Macro, pending: list[Tok], nesting: int) -> list[Tok]:
        """Replace the use ``t`` of ``m``, taking its arguments off ``pending``.

        Every token of the replacement is charged to the budget before it is
        added, so a macro that repeats a large argument is stopped at the
        first use that reaches :data:`MAX_USE_TOKENS` or the budget.
        """
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
        expanded: dict[int, list[Tok]] = {}
        res: list[Tok | None] = []  # None is a placemarker
        # Copying a token copies its hide set: charge for large ones too.
        weight = 1 + len(hide) // 32

        def add(pieces: Sequence[Tok | None], cost: int | None = None) -> None:
            n = len(pieces) if cost is None else cost
            if len(res) + n > MAX_USE_TOKENS:
                raise BudgetSpent(f"one use of macro '{m.name[:40]}' expands to "
                                  f"more than {MAX_USE_TOKENS} tokens")
            self.spend(n * weight)
            res.extend(pieces)

        def arg(name: str) -> list[Tok]:
            k = params[name]
            return args[k] if k < len(args) else []

        def full(name: str) -> list[Tok]:
            k = params[name]
            if k not in expanded:
                expanded[k] = self.expand(arg(name), nesting + 1)
            return expanded[k]

        body = m.body
        i = 0
        while i < len(body):
            b = body[i]
            nxt = body[i + 1] if i + 1 < len(body) else None
            if b.text == "#" and b.kind == "punct" and nxt is not None \
                    and nxt.text in params:
                a = arg(nxt.text)
                self.spend(len(a))
                add([_stringize(a, b)])
                i += 2
                continue
            if b.text == "##" and b.kind == "punct" and res and nxt is not None:
                rhs = list(arg(nxt.text)) if nxt.text in params else [nxt]
                lhs = res.pop()
                if lhs is None:
                    add(rhs or [None])
                elif not rhs:
                    res.append(lhs)
                else:
                    add(_paste(lhs, rhs[0]) + rhs[1:])
                i += 2
                continue
            if b.kind == "id" and b.text in params:
                if nxt is not None and nxt.text == "##":
                    add(arg(b.text) or [None])
                else:
                    add(full(b.text))
                i += 1
                continue
            add([b])
            i += 1
        return [r.derive(t.line, hide | r.hide, origin, t.ver)
                for r in res if r is not None]
