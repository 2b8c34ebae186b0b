"""Gate 2a, layer 3c: what a kernel may call, qualify and attribute.

What a kernel may call is an allowlist, checked on each configuration's
expanded tokens by :func:`check_calls`:

- ``token.call``: a call to a name that is neither a CUDA device function
  (:data:`~lib.security.scan.rules.ALLOWED_CALLS`, ``ALLOWED_CALL_RE``: warp
  and block primitives, atomics, math, the half and bfloat16 functions), nor
  a function, type or lambda the source defines, nor a type
  (``float(x)``, ``__half(x)``, ``size_t(i)``). Calling through anything that
  is not a name is refused too: a variable (``p(y)``), a parenthesised
  expression (``(remove)("f")``), the result of a call or cast
  (``get()(y)``, ``static_cast<F>(p)(y)``), an array element, a braced
  temporary (``F{g}(y)``); a lambda called where it is written
  (``[]{...}()``) is fine. So is a source's own function or class whose name
  a C library function of the host build also has
  (:data:`~lib.security.scan.rules.HOST_LIBRARY_NAMES`): there the host
  build would call the library.
- ``token.namespace``: a name qualified by a namespace or class the source
  does not declare (``std::``, ``::std::``, ``cuda::``...), any use of
  ``std``, and ``using namespace`` of one.
- ``token.attribute``: an attribute not on
  :data:`~lib.security.scan.rules.ALLOWED_ATTRIBUTES`, in any spelling
  (``__attribute__((...))``, ``[[...]]``, ``__declspec(...)``,
  ``__annotate__(...)``): ``alias``, ``weakref``, ``ifunc``, ``constructor``,
  ``destructor``, ``section``, ``cleanup``...

:func:`declarations` collects what the source declares; everything here is
a function of its arguments.

Why one module: the allowlist is only as good as the parser that decides what
a call is (a name, a cast, a lambda, a type used as a function, a declaration);
the declarations it collects and the call sites it judges must agree on every
spelling, so both sides live here, the tables of names in ``rules``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lib.security.scan.lexer import Tok
from lib.security.scan.report import Report
from lib.security.scan.rules import (
    ALLOWED_ATTRIBUTES,
    ALLOWED_CALL_RE,
    ALLOWED_CALLS,
    ATTRIBUTE_WORDS,
    BUILTIN_TYPES,
    CUDA_TYPE_RE,
    EXPRESSION_KEYWORDS,
    HOST_DEFINED,
    HOST_LIBRARY_NAMES,
    KEYWORDS,
    NOT_FUNCTIONS,
    NVRTC_DEFINED,
    NVRTC_MAYBE_RE,
    QUALIFIERS,
)
from lib.security.scan.token_checks import collect_functions, flag, forbidden

_CASTS = frozenset({"static_cast", "reinterpret_cast", "const_cast", "dynamic_cast"})
# Words before ``(`` whose parentheses are not a call (a condition, an
# operand of sizeof, a type, an attribute's arguments...).
_NOT_CALLS = NOT_FUNCTIONS | {"operator", "template", "typename"}
_ATTRIBUTE_LISTS = frozenset({"__attribute__", "__attribute", "__declspec",
                              "__annotate__", "__location__"})
_RESERVED_RE = re.compile(r"_[A-Z]\w*")
_TYPE_WORDS = BUILTIN_TYPES | QUALIFIERS | {"struct", "class", "union", "enum",
                                            "typename", "auto"}


@dataclass(frozen=True)
class Declared:
    """What one token stream declares: functions defined (with a body),
    types (classes, enums, aliases, template type parameters), class and
    enum names alone, namespaces (and aliases), and lambda variables
    (``auto f = [...](...) {...};``)."""

    functions: frozenset[str]
    types: frozenset[str]
    class_names: frozenset[str]
    namespaces: frozenset[str]
    lambdas: frozenset[str]


def declarations(toks: list[Tok], match: list[int]) -> Declared:
    """What ``toks`` declares; ``match`` is their bracket matching."""
    types: set[str] = set()
    classes: set[str] = set()
    namespaces: set[str] = set()
    lambdas: set[str] = set()
    n = len(toks)
    for i, t in enumerate(toks):
        if t.kind != "id":
            continue
        word = t.text
        if word in ("struct", "class", "union", "enum"):
            k = _skip_attributes(toks, i + 1, match)
            if k < n and toks[k].text in ("class", "struct"):  # enum class
                k = _skip_attributes(toks, k + 1, match)
            if k < n and toks[k].kind == "id" and toks[k].text not in KEYWORDS:
                types.add(toks[k].text)
                classes.add(toks[k].text)
        elif word == "typedef":
            types.update(_typedef_names(toks, i, match))
        elif word == "using" and i + 2 < n and toks[i + 1].kind == "id" \
                and toks[i + 2].text == "=":
            types.add(toks[i + 1].text)
        elif word == "namespace":
            k = i + 1
            while k < n and (toks[k].kind == "id" or toks[k].text == "::"):
                if toks[k].kind == "id":
                    namespaces.add(toks[k].text)
                k += 1
        elif word == "template" and i + 1 < n and toks[i + 1].text == "<":
            types.update(_type_parameters(toks, i + 1, match))
        elif i + 2 < n and toks[i + 1].text == "=" \
                and _is_lambda_variable(toks, i, match):
            lambdas.add(word)
    return Declared(collect_functions(toks, match), frozenset(types),
                    frozenset(classes), frozenset(namespaces), frozenset(lambdas))


def _skip_attributes(toks: list[Tok], k: int, match: list[int]) -> int:
    """The first index from ``k`` past attributes (``[[...]]``,
    ``alignas(16)``, ``__align__(16)``, ``__attribute__((...))``)."""
    n = len(toks)
    while k < n:
        t = toks[k]
        if t.text == "[" and k + 1 < n and toks[k + 1].text == "[" and match[k] > k:
            k = match[k] + 1
        elif t.kind == "id" and (t.text in ATTRIBUTE_WORDS or t.text in (
                "alignas", "__annotate__", "__location__")):
            k += 1
            if k < n and toks[k].text == "(" and match[k] > k:
                k = match[k] + 1
        else:
            return k
    return k


def _typedef_names(toks: list[Tok], i: int, match: list[int]) -> list[str]:
    """The names a ``typedef`` at ``toks[i]`` declares."""
    names: list[str] = []
    last = None
    k = i + 1
    for _ in range(512):
        if k >= len(toks):
            break
        t = toks[k]
        if t.text in (";", ",") and t.kind == "punct":
            if last is not None:
                names.append(last)
            last = None
            if t.text == ";":
                break
        elif t.text in ("{", "[") and match[k] > k:
            k = match[k]
        elif t.text == "(" and match[k] > k:
            inner = [x for x in toks[k + 1:match[k]] if x.kind == "id"]
            if inner:
                last = inner[-1].text  # typedef float (*name)(float)
            k = match[k]
        elif t.kind == "id" and t.text not in KEYWORDS:
            last = t.text
        k += 1
    return names


def _type_parameters(toks: list[Tok], lt: int, match: list[int]) -> list[str]:
    """Type parameters of ``template < ... >`` opening at ``toks[lt]``."""
    names: list[str] = []
    depth = 0
    k = lt
    start = lt + 1
    for _ in range(512):
        if k >= len(toks):
            break
        t = toks[k]
        if t.text == "<":
            depth += 1
        elif t.text in (">", ">>"):
            depth -= len(t.text)
        elif t.text in ("(", "[", "{") and match[k] > k:
            k = match[k]
        elif t.text in (";", "{", "}"):
            break
        if (t.text == "," and depth == 1) or depth <= 0:
            param = toks[start:k]
            for j, p in enumerate(param[:-1]):
                if p.text in ("typename", "class"):
                    nxt = param[j + 1]
                    if nxt.text == "...":
                        nxt = param[j + 2] if j + 2 < len(param) else nxt
                    if nxt.kind == "id":
                        names.append(nxt.text)
            start = k + 1
            if depth <= 0:
                break
        k += 1
    return names


def _is_lambda_variable(toks: list[Tok], i: int, match: list[int]) -> bool:
    """``auto name = [...] ... { ... };`` with ``name`` at ``toks[i]``: the
    variable holds exactly one lambda of the source, or the pointer that a
    unary ``+`` or ``*`` made of it (refused as a function pointer), not what
    calling one returned."""
    k = i - 1
    while k >= 0 and toks[k].text in ("&", "&&", "const", "constexpr", "static"):
        k -= 1
    if k < 0 or toks[k].text != "auto":
        return False
    opener = i + 2
    if opener < len(toks) and toks[opener].text in ("+", "*"):
        opener += 1
    if opener + 1 >= len(toks) or toks[opener].text != "[" \
            or toks[opener + 1].text == "[":
        return False
    close = match[opener]
    if close < 0:
        return False
    k = close + 1
    for _ in range(64):
        if k >= len(toks):
            return False
        t = toks[k]
        if t.text == "{":
            end = match[k]
            return end > 0 and end + 1 < len(toks) and toks[end + 1].text in (";", ",")
        if t.text in (";", "}", "=") and t.kind == "punct":
            return False
        if t.text in ("(", "[") and match[k] > k:
            k = match[k]
        k += 1
    return False


def _lambda_introducer(toks: list[Tok], k: int) -> bool:
    """``toks[k]`` is a ``[`` that opens a lambda, not a subscript or an
    attribute: nothing that ends an operand stands before it."""
    if k + 1 < len(toks) and toks[k + 1].text == "[":
        return False
    if k == 0:
        return True
    prev = toks[k - 1]
    if prev.kind in ("num", "str", "chr", "raw") or prev.text in (")", "]"):
        return False
    return not (prev.kind == "id" and (prev.text not in KEYWORDS
                                       or prev.text in ("this",)))


class _Checker:
    """The call, namespace and attribute checks over one stream."""

    def __init__(self, rep: Report, toks: list[Tok], decl: Declared,
                 match: list[int], note: str) -> None:
        self.rep, self.toks, self.decl, self.match, self.note = (
            rep, toks, decl, match, note)

    def flag(self, check: str, message: str, tok: Tok) -> None:
        flag(self.rep, check, message, tok, self.note)

    def callable(self, name: str) -> bool:
        """``name`` may be called: allowlisted, a type, or the source's own."""
        d = self.decl
        return (name in ALLOWED_CALLS or ALLOWED_CALL_RE.fullmatch(name) is not None
                or name in d.functions or name in d.types or name in d.lambdas
                or name in BUILTIN_TYPES or CUDA_TYPE_RE.fullmatch(name) is not None)

    def declares(self, word: str) -> bool:
        """A name ``word`` right before ``name (`` makes it a declarator: a
        type, a qualifier, or a name the compilers do not define. A reserved
        or predefined name may be a macro that expands to nothing (NVRTC's
        ``CUDARTAPI``), and an expression keyword (``return``) starts an
        expression: after those, ``name (`` is a call."""
        if word in EXPRESSION_KEYWORDS or word == "operator":
            return False
        if (word in KEYWORDS or word in QUALIFIERS or word in self.decl.types
                or CUDA_TYPE_RE.fullmatch(word) is not None):
            return True
        return not (word.startswith("__") or _RESERVED_RE.fullmatch(word)
                    or word in NVRTC_DEFINED or word in HOST_DEFINED
                    or NVRTC_MAYBE_RE.fullmatch(word))

    def is_type(self, toks: list[Tok]) -> bool:
        """``toks`` spell a type (the inside of a C-style cast)."""
        d = self.decl
        return bool(toks) and all(
            t.text in _TYPE_WORDS or t.text in d.types
            or CUDA_TYPE_RE.fullmatch(t.text) is not None
            or t.text in ("*", "&", "&&", "::", "<", ">", ",") or t.kind == "num"
            for t in toks)

    def run(self) -> None:
        toks, n, match = self.toks, len(self.toks), self.match
        i = 0
        while i < n:
            t = toks[i]
            nxt = toks[i + 1] if i + 1 < n else None
            if t.kind == "id" and t.text in _ATTRIBUTE_LISTS and nxt is not None \
                    and nxt.text == "(" and match[i + 1] > i + 1:
                first, last = i + 2, match[i + 1] - 1
                if t.text.startswith("__attribute") and toks[first].text == "(" \
                        and match[first] > first:
                    first, last = first + 1, match[first] - 1
                self.attributes(first, last)
                i = match[i + 1] + 1  # an attribute's arguments call nothing
                continue
            if t.kind == "punct" and t.text == "[" and nxt is not None \
                    and nxt.text == "[" and match[i] > i:
                self.attributes(i + 2, match[i] - 1)
                i = match[i] + 1
                continue
            if t.kind == "id":
                self.name(i, t, nxt)
            elif t.kind == "punct" and nxt is not None and nxt.text == "(":
                if t.text == ")":
                    self.call_on_parens(i)
                elif t.text == "]":
                    self.call_on_bracket(i)
                elif t.text == "}":
                    self.call_on_brace(i)
                elif t.text in (">", ">>"):
                    self.template_call(i)
            i += 1
        for name in sorted((self.decl.functions | self.decl.class_names)
                           & HOST_LIBRARY_NAMES):
            tok = next(x for x in toks if x.text == name)
            self.flag("token.call", f"'{name}' is also a C library function the "
                      "host build declares, which it would call instead", tok)

    def name(self, i: int, t: Tok, nxt: Tok | None) -> None:
        toks, d = self.toks, self.decl
        word = t.text
        prev = toks[i - 1] if i else None
        if word == "std":
            self.flag("token.namespace", "the standard library namespace 'std'", t)
            return
        if nxt is not None and nxt.text == "::" and word not in d.namespaces \
                and word not in d.types and word not in ("template", "typename"):
            self.flag("token.namespace", f"'{word}::', a namespace or class this "
                      "source does not declare", t)
        if word == "namespace" and prev is not None and prev.text == "using":
            target = nxt.text if nxt is not None else ""
            if target not in d.namespaces:
                self.flag("token.namespace", f"'using namespace {target[:40]}'", t)
        if nxt is None or nxt.text != "(" or word in KEYWORDS or word in _NOT_CALLS:
            return
        if forbidden(word, True) is not None:
            return  # refused under its own check
        if prev is not None and prev.text == "template" and i > 1:
            prev = toks[i - 2]
        if prev is not None and prev.text in (".", "->"):
            if word not in d.functions:
                self.flag("token.call", f"call to member '{word[:40]}', which is "
                          "no function this source defines", t)
            return
        if prev is not None and prev.kind == "id" and self.declares(prev.text):
            return  # a declarator: 'float v(1.0f)', 'void f(int)', 'S s(1)'
        if prev is not None and prev.text == "~" and word in d.types:
            return  # a destructor (a '~' before anything else is an operator)
        if prev is not None and prev.text in (":", ",") and self.initialiser(i):
            return  # a constructor's member initialiser: v(a)
        if not self.callable(word):
            self.flag("token.call", f"call to '{word[:40]}', which is neither a "
                      "CUDA device function nor defined in this source", t)

    def initialiser(self, i: int) -> bool:
        """``toks[i]`` names a member in a constructor's initialiser list
        (``S(float v) : a(v), b{v} {``): back over the initialisers before it,
        the ``:`` follows the parameters of a function named like a class."""
        toks, match = self.toks, self.match
        k = i - 1
        for _ in range(64):
            if k < 1:
                return False
            if toks[k].text == ":":
                close = k - 1
                while close > 0 and toks[close].kind == "id":
                    close -= 1  # noexcept, const...
                opener = match[close] if toks[close].text == ")" else -1
                return opener > 0 and toks[opener - 1].text in self.decl.types
            if toks[k].text != ",":
                return False
            end = k - 1
            if end < 0 or toks[end].text not in (")", "}") or match[end] < 1:
                return False
            k = match[end] - 2  # before the initialised member's name
        return False

    def call_on_parens(self, i: int) -> None:
        """``( ... ) (``: a call through what the parentheses hold."""
        toks = self.toks
        p = self.match[i]
        if p < 0:
            return
        content = toks[p + 1:i]
        if content and content[0].text in ("*", "&", "&&", "^"):
            return  # a declarator or dereference: the pointer checks see it
        before = toks[p - 1] if p else None
        if before is not None and before.kind == "id" and before.text not in \
                KEYWORDS:
            if before.text in _NOT_CALLS:
                return
            self.flag("token.call", f"call through the result of "
                      f"'{before.text[:40]}(...)'", toks[i + 1])
            return
        if before is not None and before.text in (">", ">>", "]"):
            if before.text == "]" and self._is_lambda_bracket(p - 1):
                return
            self.flag("token.call", "call through the result of a call, a "
                      "cast or an element", toks[i + 1])
            return
        if before is not None and before.kind == "id" and before.text in \
                _NOT_CALLS:
            return  # if (...), sizeof(...), decltype(...), operator()(...)
        if self.is_type(content):
            return  # a cast
        if len(content) == 1 and content[0].kind == "id" \
                and self.callable(content[0].text):
            return
        shown = " ".join(x.text for x in content)[:40]
        self.flag("token.call", f"call through the parenthesised expression "
                  f"'({shown})'", toks[i + 1])

    def _is_lambda_bracket(self, close: int) -> bool:
        opener = self.match[close]
        return opener >= 0 and _lambda_introducer(self.toks, opener)

    def call_on_bracket(self, i: int) -> None:
        """``] (``: a lambda's parameters, or a call through an element."""
        if self._is_lambda_bracket(i):
            return
        opener = self.match[i]
        if opener > 0 and self.toks[opener - 1].text == "[":
            return  # [[attribute]] (
        if opener > 0 and self.toks[opener - 1].text == "operator":
            return  # operator[](
        self.flag("token.call", "call through an array element", self.toks[i + 1])

    def call_on_brace(self, i: int) -> None:
        """``} (``: a lambda called where it is written, or a call through a
        braced temporary (``F{g}(y)``)."""
        toks = self.toks
        opener = self.match[i]
        k = opener - 1
        for _ in range(64):
            if k < 0:
                break
            t = toks[k]
            if t.text == "]" and self._is_lambda_bracket(k):
                return
            if t.text in (";", "{", "}") or (t.kind == "punct" and t.text == "="):
                break
            if t.text == ")" and self.match[k] >= 0:
                k = self.match[k]
            k -= 1
        self.flag("token.call", "call through a braced temporary", toks[i + 1])

    def template_call(self, i: int) -> None:
        """``name < ... > (``: a call of ``name`` with template arguments."""
        toks = self.toks
        depth = len(toks[i].text)
        k = i - 1
        for _ in range(128):
            if k < 0:
                return
            t = toks[k]
            if t.text in (">", ">>"):
                depth += len(t.text)
            elif t.text == "<":
                depth -= 1
                if depth == 0:
                    break
            elif t.text in (";", "{", "}", "&&", "||", "?", "=", "!"):
                return  # not template arguments: a comparison
            elif t.text == ")" and self.match[k] >= 0:
                k = self.match[k]
            k -= 1
        else:
            return
        if k < 1 or toks[k - 1].kind != "id":
            return
        word = toks[k - 1].text
        if word in _CASTS or word in KEYWORDS or word in _NOT_CALLS:
            return
        prev = toks[k - 2] if k >= 2 else None
        if prev is not None and prev.text == "template" and k >= 3:
            prev = toks[k - 3]
        member = prev is not None and prev.text in (".", "->")
        if (member and word in self.decl.functions) or (
                not member and self.callable(word)):
            return
        self.flag("token.call", f"call to '{word[:40]}<...>', which is neither "
                  "a CUDA device function nor defined in this source", toks[k - 1])

    def attributes(self, first: int, last: int) -> None:
        """Each attribute named in ``toks[first:last + 1]`` is allowed."""
        toks = self.toks
        depth = 0
        k = first
        while k <= last:
            t = toks[k]
            if t.text == "(":
                depth += 1
            elif t.text == ")":
                depth -= 1
            elif depth == 0 and t.kind == "id":
                nxt = toks[k + 1] if k + 1 <= last else None
                if t.text == "using" or (nxt is not None and nxt.text in ("::", ":")):
                    k += 2 if t.text == "using" else 1
                    continue
                name = t.text.removeprefix("__").removesuffix("__")
                if name not in ALLOWED_ATTRIBUTES:
                    self.flag("token.attribute", f"attribute '{t.text[:40]}' "
                              "is not allowed", t)
            k += 1


def check_calls(rep: Report, toks: list[Tok], decl: Declared, match: list[int],
                note: str = "") -> None:
    """Run the call, namespace and attribute checks on one stream ``toks``.

    ``decl`` is :func:`declarations` of the stream and ``match`` its bracket
    matching; ``note`` goes with every finding on a token that a macro
    produced.
    """
    _Checker(rep, toks, decl, match, note).run()
