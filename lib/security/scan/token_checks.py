"""Gate 2a, layer 3: the checks on each token of a stream.

:func:`check_tokens` refuses forbidden names (the tables and patterns in
:mod:`~lib.security.scan.rules`: host calls, compiler builtins, the CUDA
runtime API), kernel launches (``<<<``) and every way of making or calling
through a function pointer: declarators ``( * name ) (``, function types and
type aliases, ``decltype(&x)``, a function of the source used as a value
(assigned, passed, returned, a template argument), unary ``+``/``*``/``&`` on
a lambda, ``.*`` and ``->*``. A token that macro expansion produced, or that
stands in a macro's body, is reported twice: under its own check and as
``pp.macro_hides_forbidden`` naming the macro.

The scanner runs these checks on the tokens as written (every branch, every
directive) and on the expanded stream of each configuration. Everything here
is a function of its arguments; findings go to the
:class:`~lib.security.scan.report.Report`.
"""

from __future__ import annotations

from lib.security.scan.lexer import Tok, match_brackets
from lib.security.scan.report import Report
from lib.security.scan.rules import (
    BUILTIN_TYPES,
    EXEC_RE,
    KEYWORDS,
    NOT_FUNCTIONS,
    OPERAND_KEYWORDS,
    PATTERNS,
    QUALIFIERS,
    STRONG,
    WEAK,
)


def flag(rep: Report, check: str, message: str, tok: Tok, note: str = "") -> None:
    """Report ``check`` at ``tok``; also name the macro that produced it, if any.

    ``note`` is appended to the macro's mention (it names an alternative
    definition when the token came from one).
    """
    if tok.origin is not None:
        rep.add(check, f"{message} (produced by macro '{tok.origin}'"
                f"{note})", tok.line)
        rep.add("pp.macro_hides_forbidden", f"macro '{tok.origin}' "
                f"expands to forbidden token '{tok.text[:40]}' ({check}"
                f"{note})", tok.line)
    else:
        rep.add(check, message, tok.line)


def forbidden(name: str, call: bool) -> tuple[str, str] | None:
    """The ``(check id, what)`` that refuses identifier ``name`` (``call``:
    followed by a call parenthesis), or None."""
    hit = STRONG.get(name)
    if hit is None and call:
        hit = WEAK.get(name)
    if hit is None and EXEC_RE.fullmatch(name):
        hit = ("token.os_call", "host/OS call")
    if hit is None and name[0] in "_c":
        hit = next((h for p, h in PATTERNS if p.fullmatch(name)), None)
    return hit


def check_tokens(
    rep: Report, toks: list[Tok], fnames: frozenset[str], note: str = ""
) -> None:
    """Run the token checks on one stream ``toks``.

    ``fnames`` holds the functions defined in the source (a name among them
    used as a value makes a function pointer); ``note`` goes with every
    finding on a token that a macro produced.
    """
    n = len(toks)
    alias_done = 0
    for i, t in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < n else None
        prev = toks[i - 1] if i else None
        if t.kind == "id":
            name = t.text
            call = nxt is not None and nxt.text == "(" and nxt.kind == "punct"
            hit = forbidden(name, call)
            if name == "delete" and not (prev is not None and prev.text == "="):
                hit = ("token.malloc", "dynamic allocation")
            if name == "function" and prev is not None and prev.text == "::":
                hit = ("token.function_pointer", "polymorphic function wrapper")
            if hit is not None:
                flag(rep, hit[0], f"{hit[1]} '{name}'", t, note)
            elif name in ("typedef", "using"):
                alias_done, fn = _function_type_alias(toks, i, alias_done)
                if fn is not None:
                    flag(rep, "token.function_pointer", f"function type alias "
                         f"near '{fn.text[:40]}'", fn, note)
            elif name in BUILTIN_TYPES and _function_type(toks, i):
                flag(rep, "token.function_pointer", f"function type "
                     f"'{name}(...)'", t, note)
            elif name == "decltype" and _decltype_fn(toks, i, fnames):
                flag(rep, "token.function_pointer", "decltype of a function "
                     "address", t, note)
            elif name in fnames and _function_value(prev, nxt):
                flag(rep, "token.function_pointer", f"function '{name}' used "
                     "as a value", t, note)
        elif t.kind == "punct":
            if t.text == "<<" and nxt is not None and nxt.text.startswith("<"):
                flag(rep, "token.device_launch", "kernel launch '<<<'", t, note)
            elif t.text == "(" and _fp_declarator(toks, i):
                flag(rep, "token.function_pointer", "function pointer "
                     "declarator '( * name ) ('", toks[i + 1], note)
            elif t.text in ("+", "*", "&") and _lambda_decay(toks, i):
                flag(rep, "token.function_pointer", f"unary '{t.text}' on a "
                     "lambda (makes a function pointer)", t, note)
            elif t.text in (".*", "->*"):
                flag(rep, "token.function_pointer", f"pointer-to-member "
                     f"access '{t.text}'", t, note)


def _fp_declarator(toks: list[Tok], i: int) -> bool:
    """``( * name ) (``, ``( & name ) (``, ``( C :: * name ) (``, ``(*)(``."""
    n = len(toks)
    k = i + 1
    while k + 1 < n and toks[k].kind == "id" and toks[k + 1].text == "::":
        k += 2
    if k >= n or toks[k].text not in ("*", "&", "&&") or toks[k].kind != "punct":
        return False
    k += 1
    while k < n and toks[k].kind == "id" and toks[k].text in QUALIFIERS:
        k += 1
    if k < n and toks[k].kind == "id":
        k += 1
    while k < n and toks[k].text == "[":
        stop = min(n, k + 64)
        while k < stop and toks[k].text != "]":
            k += 1
        k += 1
    return k + 1 < n and toks[k].text == ")" and toks[k + 1].text == "("


def _lambda_decay(toks: list[Tok], i: int) -> bool:
    """Unary ``+``, ``*`` or ``&`` at ``toks[i]`` applied to a lambda.

    ``+[](float* q) {...}`` converts a captureless lambda to a plain
    function pointer (``*`` to a function reference). A ``[`` right after
    an operator can only open a lambda (``[[`` is an attribute, as in
    ``int* [[attr]] p``). The operator is unary unless an operand (a
    name, literal, ``)`` or ``]``) ends just before it, as in ``f(0) +
    [](float v) { return v; }(1.0f)``. A cast ``(F) +[]...`` needs a
    function pointer type ``F``, refused where it is spelled.
    """
    n = len(toks)
    if i + 1 >= n or toks[i + 1].text != "[" or toks[i + 1].kind != "punct":
        return False
    if i + 2 < n and toks[i + 2].text == "[":
        return False
    if i == 0:
        return True
    prev = toks[i - 1]
    if prev.kind in ("num", "str", "chr", "raw") or prev.text in ("]", ")"):
        return False
    return not (prev.kind == "id" and (prev.text not in KEYWORDS
                                       or prev.text in OPERAND_KEYWORDS))


def _function_type(toks: list[Tok], i: int) -> bool:
    """A function type ``R(A...)`` with built-in ``R`` at ``toks[i]``.

    ``P<void(float*)>::type p = lambda;`` spells a function pointer type
    without a declarator or an alias. The parentheses hold a parameter
    list when they open on a built-in type not itself called or braced
    (``float(int*)``, ``void(const float&)``, ``int(void)``), or are
    empty after ``void``. Functional casts (``float(i)``,
    ``float(int(x))``) and parenthesised declarators (``int (x)``) pass.
    """
    n = len(toks)
    if i + 2 >= n or toks[i + 1].text != "(" or toks[i + 1].kind != "punct":
        return False
    if i and toks[i - 1].text == "operator":
        return False  # a conversion function, e.g. operator float()
    k = i + 2
    if toks[k].text == ")":
        return toks[i].text == "void"
    start = k
    while k < n and toks[k].kind == "id" and (
            toks[k].text in BUILTIN_TYPES or toks[k].text in QUALIFIERS):
        k += 1
    return k > start and (k >= n or toks[k].text not in ("(", "{"))


def _function_type_alias(
    toks: list[Tok], i: int, done: int
) -> tuple[int, Tok | None]:
    """``typedef R name(A)`` / ``using F = R(A)`` at ``toks[i]``: a function type.

    ``done`` is the first token not yet looked at by an earlier alias in the
    same stream. Returns the new ``done`` and the name that makes the alias a
    function type, or ``None``.
    """
    depth = 0
    for k in range(max(i + 1, done), min(len(toks) - 1, i + 256)):
        done = k + 1  # each token is looked at once per stream
        t = toks[k]
        if t.text in (";", "{", "}"):
            return done, None
        if t.text in ("(", "<"):
            depth += 1
        elif t.text in (")", ">"):
            depth -= 1
        if (depth == 0 and t.kind == "id" and t.text not in NOT_FUNCTIONS
                and toks[k + 1].text == "(" and t.text not in QUALIFIERS):
            return done, t
    return done, None


def _decltype_fn(toks: list[Tok], i: int, fnames: frozenset[str]) -> bool:
    """``decltype ( & x`` at ``toks[i]`` (the type of an address: of a
    function, whichever it is, a pointer to it), or ``decltype ( f )`` with
    ``f`` a function defined here (a function type)."""
    window = [t.text for t in toks[i + 1:i + 4]]
    if window[:2] == ["(", "&"]:
        return True
    return len(window) == 3 and window[0] == "(" and window[2] == ")" \
        and window[1] in fnames


def _function_value(prev: Tok | None, nxt: Tok | None) -> bool:
    """A function name between ``prev`` and ``nxt`` is used as a value
    (its address taken, assigned, passed, returned, braced or given as a
    template argument), not called."""
    if nxt is not None and nxt.text in ("(", "<", "::"):
        return False
    return prev is not None and prev.text in (
        "&", "=", ",", "(", "return", "?", ":", "<", "{")


def collect_functions(toks: list[Tok], match: list[int] | None = None
                      ) -> frozenset[str]:
    """Names of functions defined here: ``name ( ... ) ... {``.

    Between the parameters and the body may stand qualifiers, ``noexcept``
    and ``noexcept(...)``, a trailing return type (``-> void(*)()``),
    attributes and a constructor's initialisers (``: v(a), w{b}``), whose
    names are not functions. ``match`` is :func:`match_brackets` of ``toks``.
    """
    names = set()
    n = len(toks)
    if match is None:
        match = match_brackets(toks)
    for i, t in enumerate(toks):
        if t.kind != "id" or i + 1 >= n or toks[i + 1].text != "(":
            continue
        if t.text in NOT_FUNCTIONS or t.text in KEYWORDS:
            continue
        if i and toks[i - 1].text in (":", ",", ".", "->"):
            continue  # an initialiser or a member call
        k = match[i + 1] + 1
        if k <= 0:
            continue
        initialisers = False
        angles = 0
        for _ in range(256):
            if k >= n:
                break
            x = toks[k]
            text = x.text
            if x.kind == "punct" and text == "{":
                if not initialisers or toks[k - 1].text in (")", "}"):
                    names.add(t.text)
                    break
                k = match[k] if match[k] > k else k  # a member's {initialiser}
            elif x.kind == "punct" and text not in _DEFINITION_PUNCTS:
                break  # an operator: an expression, not a definition
            elif text == "," and not initialisers and angles <= 0:
                break
            elif text == "[" and not (k + 1 < n and toks[k + 1].text == "["):
                break  # a subscript or a lambda, not an attribute
            elif text == ":":
                initialisers = True
            elif text in ("<", ">", ">>"):
                angles += 1 if text == "<" else -len(text)
            if text in ("(", "[") and match[k] > k:
                k = match[k]
            k += 1
    return frozenset(names)


# What may stand between a function's parameters and its body: qualifiers
# and attributes (names), a trailing return type (->, ::, *, &, <...>),
# noexcept(...) and constructor initialisers (: v(a), w{b}).
_DEFINITION_PUNCTS = frozenset({"->", "::", "*", "&", "&&", "<", ">", ">>", ":",
                                ",", "(", "[", "...", "{"})
