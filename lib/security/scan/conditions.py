"""Gate 2a, layer 2: the compilers a source is built by, and ``#if`` arithmetic.

A :class:`Configuration` is one compiler that will read the source: NVRTC for
one target architecture, or the host emulation build. It answers, for a name
the source itself does not define, whether that compiler has it defined and
with which value (:meth:`~Configuration.state`), from the tables in
:mod:`~lib.security.scan.rules`. Where it cannot know (a reserved name it has
no entry for, a version number that changes between releases) the answer is
*unknown*, and the preprocessor scans the source both ways.

:func:`evaluate` computes an ``#if`` expression, after ``defined`` and macro
expansion, the way the C++ preprocessor does: ``intmax_t``/``uintmax_t``
arithmetic with the usual conversions (``-1 < 0u`` is false), short-circuit
``&&``, ``||`` and ``?:``, ``true``/``false``, character literals, and
alternative tokens (``and``, ``not``...). A value is *unknown* where an
operand is; ``0 && unknown`` is still 0. :func:`is_constant_expression` checks
the shape of a ``#pragma unroll`` argument with the same grammar.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lib.security.scan.lexer import Tok
from lib.security.scan.rules import (
    HOST_DEFINED,
    HOST_UNDEFINED,
    NVRTC_DEFINED,
    NVRTC_MAYBE_RE,
    NVRTC_UNDEFINED,
)

#: What a configuration says of a name: defined with this value, defined with
#: a value not known (``DEFINED``), not defined (``UNDEFINED``), or not known
#: to be either (``UNKNOWN``).
DEFINED = "defined"
UNDEFINED = "undefined"
UNKNOWN = "unknown"

_RESERVED_RE = re.compile(r"__\w*|_[A-Z]\w*")


@dataclass(frozen=True)
class Configuration:
    """One compiler that reads the source, and the macros it starts with.

    ``defined`` maps a predefined name to its value (``None``: defined, value
    not assumed); ``undefined`` lists names known not to be defined; a
    reserved name in neither, or one matching ``maybe`` when given, is
    unknown; any other name is not defined (only the source itself, or a
    ``-D`` option, can define it, and the preprocessor knows those).
    """

    name: str
    defined: Mapping[str, int | None]
    undefined: frozenset[str]
    maybe: re.Pattern | None = None

    def state(self, name: str) -> int | str:
        """The value of predefined ``name``, or DEFINED, UNDEFINED, UNKNOWN."""
        if name in self.defined:
            value = self.defined[name]
            return DEFINED if value is None else value
        if name in self.undefined:
            return UNDEFINED
        if _RESERVED_RE.fullmatch(name) or (
                self.maybe is not None and self.maybe.fullmatch(name)):
            return UNKNOWN
        return UNDEFINED


def nvrtc(arch: int) -> Configuration:
    """NVRTC compiling for ``compute_<arch>``."""
    table = {**NVRTC_DEFINED, "__CUDA_ARCH__": 10 * arch,
             "__CUDA_ARCH_LIST__": 10 * arch}
    return Configuration(f"NVRTC sm_{arch}", table, NVRTC_UNDEFINED,
                         NVRTC_MAYBE_RE)


def host() -> Configuration:
    """The host emulation build (g++ or clang++)."""
    return Configuration("host build", HOST_DEFINED, HOST_UNDEFINED)


# ---- #if arithmetic ----------------------------------------------------------

_MASK = (1 << 64) - 1
_INT_RE = re.compile(
    r"(0[xX][0-9a-fA-F']+|0[bB][01']+|0[0-7']*|[1-9][0-9']*)([uUlLzZ]*)")
_SUFFIX_RE = re.compile(r"(?:[uU](?:ll|LL|l|L|z|Z)?|(?:ll|LL|l|L|z|Z)[uU]?)?")
_ESCAPES = {"n": 10, "t": 9, "r": 13, "0": 0, "\\": 92, "'": 39, '"': 34,
            "a": 7, "b": 8, "f": 12, "v": 11, "?": 63}
_ALT = {"and": "&&", "or": "||", "not": "!", "bitand": "&", "bitor": "|",
        "xor": "^", "compl": "~", "not_eq": "!=", "and_eq": "&=",
        "or_eq": "|=", "xor_eq": "^="}
_BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="),
           ("<", ">", "<=", ">="), ("<<", ">>"), ("+", "-"), ("*", "/", "%")]

#: A value: (integer, unsigned), or None when unknown.
Value = tuple[int, bool] | None


class ExpressionError(Exception):
    """The expression is malformed (the compiler would stop there)."""


def _norm(v: int, unsigned: bool) -> tuple[int, bool]:
    v &= _MASK
    if not unsigned and v >= 1 << 63:
        v -= 1 << 64
    return v, unsigned


def _number(text: str) -> tuple[int, bool]:
    m = _INT_RE.fullmatch(text)
    if m is None or not _SUFFIX_RE.fullmatch(m.group(2)):
        raise ExpressionError(f"not an integer literal: {text[:20]}")
    digits = m.group(1).replace("'", "")
    if digits.startswith(("0x", "0X")):
        v, decimal = int(digits[2:], 16), False
    elif digits.startswith(("0b", "0B")):
        v, decimal = int(digits[2:], 2), False
    elif digits.startswith("0") and len(digits) > 1:
        v, decimal = int(digits, 8), False
    else:
        v, decimal = int(digits), True
    if v > _MASK:
        raise ExpressionError("integer literal too large")
    unsigned = "u" in m.group(2).lower() or (not decimal and v >= 1 << 63)
    if decimal and not unsigned and v >= 1 << 63:
        unsigned = True  # "so large that it is unsigned"
    return _norm(v, unsigned)


def _char(text: str) -> Value:
    body = text[text.index("'") + 1:-1] if text.endswith("'") else None
    if not body:
        raise ExpressionError("malformed character literal")
    if len(body) == 1 and body != "\\":
        v = ord(body)
    elif len(body) == 2 and body[0] == "\\" and body[1] in _ESCAPES:
        v = _ESCAPES[body[1]]
    else:
        return None  # multi-character or numeric escapes: compilers differ
    return (v, False) if v < 128 else None


class _Parser:
    """Recursive descent over one expression; ``ident`` values a name."""

    def __init__(self, toks: list[Tok], ident: Callable[[str], Value] | None):
        self.toks = toks
        self.i = 0
        self.ident = ident  # None: syntax only, names are operands

    def peek(self) -> str | None:
        if self.i >= len(self.toks):
            return None
        t = self.toks[self.i]
        if t.kind == "id" and t.text in _ALT:
            return _ALT[t.text]
        return t.text if t.kind == "punct" else None

    def expression(self) -> Value:
        v = self.conditional()
        while self.peek() == ",":
            self.i += 1
            v = self.conditional()
        return v

    def conditional(self) -> Value:
        c = self.binary(0)
        if self.peek() != "?":
            return c
        self.i += 1
        a = self.expression()
        if self.peek() != ":":
            raise ExpressionError("'?' without ':'")
        self.i += 1
        b = self.conditional()
        if c is None:
            return a if a == b else None
        if a is None or b is None:
            return a if c[0] else b
        unsigned = a[1] or b[1]
        return _norm((a if c[0] else b)[0], unsigned)

    def binary(self, level: int) -> Value:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while (op := self.peek()) in _BINARY[level]:
            self.i += 1
            right = self.binary(level + 1)
            left = _apply(op, left, right)
        return left

    def unary(self) -> Value:
        op = self.peek()
        if op in ("+", "-", "!", "~"):
            self.i += 1
            v = self.unary()
            if v is None:
                return None
            if op == "+":
                return v
            if op == "-":
                return _norm(-v[0], v[1])
            if op == "!":
                return (0 if v[0] else 1, False)
            return _norm(~v[0], v[1])
        return self.primary()

    def primary(self) -> Value:
        if self.i >= len(self.toks):
            raise ExpressionError("expression ends early")
        t = self.toks[self.i]
        self.i += 1
        if t.kind == "punct" and t.text == "(":
            v = self.expression()
            if self.peek() != ")":
                raise ExpressionError("unbalanced '('")
            self.i += 1
            return v
        if t.kind == "num":
            return _number(t.text)
        if t.kind == "chr":
            return _char(t.text)
        if t.kind == "unknown":
            return None
        if t.kind == "id" and t.text in ("true", "false"):
            return (int(t.text == "true"), False)
        if t.kind == "id" and t.text not in _ALT:
            if self.peek() == "(":  # __has_builtin(x), an undefined F(x)...
                if self.ident is None:
                    raise ExpressionError("call in a constant expression")
                depth = 0
                while self.i < len(self.toks):
                    s = self.toks[self.i].text
                    depth += {"(": 1, ")": -1}.get(s, 0)
                    self.i += 1
                    if depth == 0:
                        break
                return None
            if self.ident is None:
                return (1, False)
            return self.ident(t.text)
        raise ExpressionError(f"unexpected '{t.raw[:20]}'")


def _apply(op: str, a: Value, b: Value) -> Value:
    if op == "&&":
        if (a is not None and not a[0]) or (b is not None and not b[0]):
            return (0, False)
        return None if a is None or b is None else (1, False)
    if op == "||":
        if (a is not None and a[0]) or (b is not None and b[0]):
            return (1, False)
        return None if a is None or b is None else (0, False)
    if a is None or b is None:
        if op in ("*", "&") and ((a is not None and not a[0])
                                 or (b is not None and not b[0])):
            return (0, False)
        return None
    if op in ("<<", ">>"):
        n = b[0]
        if n < 0 or n >= 64:
            return None  # undefined, compilers differ
        v = a[0] << n if op == "<<" else a[0] >> n
        return _norm(v, a[1])
    unsigned = a[1] or b[1]
    x, y = (a[0] & _MASK, b[0] & _MASK) if unsigned else (a[0], b[0])
    if op in ("==", "!=", "<", ">", "<=", ">="):
        r = {"==": x == y, "!=": x != y, "<": x < y, ">": x > y, "<=": x <= y,
             ">=": x >= y}[op]
        return (int(r), False)
    if op in ("/", "%"):
        if y == 0:
            return None  # an error in the compiler: neither branch is sure
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        return _norm(q if op == "/" else x - q * y, unsigned)
    r = {"+": x + y, "-": x - y, "*": x * y, "&": x & y, "|": x | y,
         "^": x ^ y}[op]
    return _norm(r, unsigned)


def evaluate(toks: list[Tok], ident: Callable[[str], Value]) -> bool | None:
    """The truth of an ``#if`` expression; None when it is not known.

    ``toks`` are macro-expanded, ``defined`` already replaced by ``num``
    tokens or tokens of kind ``"unknown"``; ``ident`` gives the value of a
    name left over (0 for a name no one defines). A malformed expression is
    unknown: the compiler stops there, and the scanner looks at both
    branches.
    """
    parser = _Parser(toks, ident)
    try:
        v = parser.expression()
        if parser.i != len(toks):
            raise ExpressionError("tokens after the expression")
    except (ExpressionError, RecursionError):
        return None
    return None if v is None else bool(v[0])


def is_constant_expression(toks: list[Tok]) -> bool:
    """``toks`` is one expression of numbers, names, parentheses and
    arithmetic, comparison and logical operators (no call, no comma)."""
    if not toks:
        return False
    parser = _Parser(toks, None)
    try:
        parser.conditional()
    except (ExpressionError, RecursionError):
        return False
    return parser.i == len(toks)
