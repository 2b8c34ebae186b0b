"""Gate 2a, layer 1: raw characters and tokens, the way a compiler reads them.

- :func:`decode` (layer 1a) checks the type, size and encoding of a source and
  returns its text with ``\\n`` newlines, without a leading byte-order mark.
- :func:`raw_checks` (layer 1b) refuses characters that are wrong anywhere,
  comments and strings included: bidirectional and control characters, and
  trigraphs.
- :func:`translate` resolves trigraphs and line splices (translation phases
  1-2); :func:`lex` splits the result into preprocessing tokens (:class:`Tok`,
  phase 3), resolving digraphs and universal character names and dropping
  comments.
- :func:`check_characters` (layer 1c) refuses non-ASCII characters, universal
  character names and raw strings outside comments and literals.

Every function here is linear in the length of the source.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from lib.security.scan.report import MAX_PER_CHECK, Report

_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_BIDI_RE = re.compile(f"[{_BIDI}]")
_CONTROL_RE = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|",
              "<": "{", ">": "}", "-": "~"}
_TRIGRAPH_RE = re.compile(r"\?\?[=/'()!<>\-]")
_SPLICE_RE = re.compile(r"\\([ \t\f\v]*)\n")
_UCN = r"\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8}"
_IDENT_RE = re.compile(
    rf"(?:[A-Za-z_$]|[^\x00-\x7f]|{_UCN})(?:[A-Za-z0-9_$]|[^\x00-\x7f]|{_UCN})*+"
)
_UCN_RE = re.compile(r"\\u([0-9A-Fa-f]{4})|\\U([0-9A-Fa-f]{8})")
_NUM_RE = re.compile(r"\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*+")
_PUNCTS = (
    "%:%:", "...", "<<=", ">>=", "->*", "<=>", "##", "%:", "<:", ":>", "<%", "%>",
    "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=",
    "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".*",
)
_PUNCT_RE = re.compile(
    "|".join(re.escape(p) for p in _PUNCTS) + r"|[{}\[\]#()<>%:;.?*+\-/^&|~!=,]"
)
_DIGRAPHS = {"<:": "[", ":>": "]", "<%": "{", "%>": "}", "%:": "#", "%:%:": "##"}


class Tok:
    """One preprocessing token; ``text`` is canonical (digraphs, UCNs resolved)."""

    __slots__ = ("kind", "text", "raw", "pos", "line", "nl", "nl_any", "ws",
                 "hide", "origin", "ver")

    def __init__(self, kind, text, raw, pos, line, nl, nl_any, ws):
        self.kind = kind  # "id", "num", "str", "chr", "raw", "punct", "other"
        self.text = text
        self.raw = raw
        self.pos = pos
        self.line = line
        self.nl = nl  # a newline (outside comments) precedes it
        self.nl_any = nl_any  # a newline, in whitespace or a comment, precedes
        self.ws = ws  # whitespace or a comment precedes it
        self.hide: frozenset[str] = frozenset()
        self.origin: str | None = None  # outermost macro that produced it
        self.ver = 0  # macro-table version in force where it was written

    def derive(self, line, hide, origin, ver) -> Tok:
        """A copy placed by macro expansion at ``line``, with a new hide set."""
        t = Tok(self.kind, self.text, self.raw, self.pos, line, False, False,
                self.ws)
        t.hide, t.origin, t.ver = hide, origin, ver
        return t


_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = frozenset(_OPENERS.values())
_LONE_CR_RE = re.compile(r"\r(?!\n)")


def match_brackets(toks: Sequence[Tok]) -> list[int]:
    """For each ``(``, ``[`` and ``{``, the index of its closer, and for each
    closer the index of its opener (-1 when unmatched); linear.

    A closer that does not match the innermost opener is left unmatched.
    """
    match = [-1] * len(toks)
    stack: list[int] = []
    for i, t in enumerate(toks):
        if t.kind != "punct":
            continue
        if t.text in _OPENERS:
            stack.append(i)
        elif t.text in _CLOSERS and stack and _OPENERS[toks[stack[-1]].text] == t.text:
            j = stack.pop()
            match[j], match[i] = i, j
    return match


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def decode(source: object, max_bytes: int, rep: Report) -> str | None:
    """Layer 1a: type, size and encoding. Returns text with ``\\n`` newlines."""
    if isinstance(source, bytearray | memoryview):
        source = bytes(source)
    if isinstance(source, str):
        if len(source) > max_bytes:  # every character is at least one byte
            size = len(source)
        else:
            size = len(source.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            rep.add("bytes.size", f"source is {size} bytes or more, limit "
                    f"{max_bytes} bytes", None)
            return None
        try:
            source.encode("utf-8")
        except UnicodeEncodeError as exc:
            rep.add("bytes.utf8", f"source holds an unpaired surrogate "
                    f"U+{ord(source[exc.start]):04X}", _line_at(source, exc.start))
            source = source.encode("utf-8", "replace").decode("utf-8")
        text = source
    elif isinstance(source, bytes):
        if len(source) > max_bytes:
            rep.add("bytes.size", f"source is {len(source)} bytes, limit "
                    f"{max_bytes} bytes", None)
            return None
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = source.count(b"\n", 0, exc.start) + 1
            rep.add("bytes.utf8", f"byte 0x{source[exc.start]:02x} at offset "
                    f"{exc.start} is not valid UTF-8", line)
            text = source.decode("utf-8", "replace")
    else:
        rep.add("bytes.type", f"source must be str or bytes, got "
                f"{type(source).__name__}", None)
        return None
    # A byte-order mark opens many editors' UTF-8 files; it is not text.
    text = text.removeprefix("\ufeff")
    for n, m in enumerate(_LONE_CR_RE.finditer(text)):
        if n >= MAX_PER_CHECK:
            break
        # g++ ends a line at a lone CR, NVRTC does not: the two would read
        # different directives and comments.
        rep.add("bytes.control", "carriage return not followed by a line feed "
                "(g++ ends a line there, NVRTC does not)",
                _line_at(text, m.start()) + n)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def raw_checks(text: str, rep: Report) -> None:
    """Layer 1b: characters refused anywhere, comments and strings included."""
    for check, pattern, what in (
        ("bytes.bidi", _BIDI_RE, "bidirectional control character"),
        ("bytes.control", _CONTROL_RE, "control character"),
        ("pp.trigraph", _TRIGRAPH_RE, "trigraph"),
    ):
        line, last = 1, 0
        for n, m in enumerate(pattern.finditer(text)):
            if n > MAX_PER_CHECK:
                rep.add(check, f"more {what}s follow", None)
                break
            line += text.count("\n", last, m.start())
            last = m.start()
            shown = m.group() if check == "pp.trigraph" else f"U+{ord(m.group()):04X}"
            rep.add(check, f"{what} {shown}", line)


def translate(text: str, rep: Report) -> tuple[str, list[int]]:
    """Phases 1-2: resolve trigraphs, splice lines.

    Returns the spliced text and the offsets (in it) where a newline was
    removed, so that :func:`lex` can map tokens back to source lines.
    """
    text = _TRIGRAPH_RE.sub(lambda m: _TRIGRAPHS[m.group()[2]], text)
    out: list[str] = []
    splices: list[int] = []
    last = length = 0
    for m in _SPLICE_RE.finditer(text):
        out.append(text[last:m.start()])
        length += m.start() - last
        splices.append(length)
        if m.group(1):
            rep.add("pp.splice_whitespace", "backslash followed by blanks before "
                    "the newline", text.count("\n", 0, m.start()) + 1)
        last = m.end()
    out.append(text[last:])
    return "".join(out), splices


def _decode_ucn(raw: str) -> str:
    """``raw`` with each well-formed universal character name replaced."""

    def one(m: re.Match) -> str:
        try:
            return chr(int(m.group(1) or m.group(2), 16))
        except (ValueError, OverflowError):
            return m.group()

    return _UCN_RE.sub(one, raw)


_TOKEN_RE = re.compile(
    r"[ \t\f\v]*+(?:"  # blanks before a token are taken with it
    r"(?P<ws>\n[ \t\f\v\n]*+)"
    r"|(?P<lc>//[^\n]*+)"
    r"|(?P<bc>/\*(?s:.)*?(?:\*/|\Z))"
    r'|(?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^ ()\\\t\v\f\n"]{0,16})\('
    r'(?s:.)*?(?:\)(?P=delim)"|\Z))'
    r'|(?P<str>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*+"?)'
    r"|(?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*+'?)"
    rf"|(?P<id>{_IDENT_RE.pattern})"
    rf"|(?P<num>{_NUM_RE.pattern})"
    r"|(?P<lt><(?=::(?![:>])))"
    rf"|(?P<punct>{_PUNCT_RE.pattern})"
    r"|(?P<other>(?s:.))"
    r"|\Z)"
)


def lex(text: str, splices: Sequence[int] = ()) -> list[Tok]:
    """Phase 3: split spliced text into preprocessing tokens, dropping comments.

    One match of :data:`_TOKEN_RE` per token (with the blanks before it),
    comment or newline run, so the cost is linear in the length of the text.
    """
    toks: list[Tok] = []
    append = toks.append
    bisect_right = bisect.bisect_right
    newlines = 0  # newlines before the current match
    nl = nl_any = True
    ws = False
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        if kind is None:  # trailing blanks
            break
        start, end = m.span(kind)
        if kind == "ws" or kind == "bc" or kind == "lc":
            if kind != "lc" and (k := text.count("\n", start, end)):
                newlines += k
                nl_any = True
                if kind == "ws":
                    nl = True
            ws = True
            continue
        raw = canon = text[start:end]
        if kind == "id":
            if "\\" in raw:
                canon = _decode_ucn(raw)
        elif kind == "punct":
            canon = _DIGRAPHS.get(raw, raw)
        elif kind == "lt":
            kind = "punct"
        line = newlines + 1
        if splices:
            line += bisect_right(splices, start)
        append(Tok(kind, canon, raw, start, line, nl, nl_any,
                   ws or start > m.start()))
        if kind == "raw":
            newlines += raw.count("\n")  # raw strings may span lines
        nl = nl_any = ws = False
    return toks


def check_characters(toks: Sequence[Tok], spliced: str, rep: Report) -> None:
    """Layer 1c: characters refused outside comments and literals.

    Args:
        toks: the tokens :func:`lex` made of ``spliced``.
        spliced: the text after :func:`translate`.
        rep: where violations go.
    """
    for t in toks:
        if t.kind in ("str", "chr"):
            continue
        if t.kind == "raw":
            rep.add("token.raw_string", "raw string literal "
                    f"{t.raw[:20]!r}", t.line)
            continue
        if not t.raw.isascii():
            bad = next(ch for ch in t.raw if not ch.isascii())
            rep.add("bytes.non_ascii", f"non-ASCII character U+{ord(bad):04X}"
                    f" in {t.raw[:40]!r} outside comments and literals", t.line)
        if t.kind == "id" and "\\" in t.raw:
            rep.add("bytes.ucn", f"universal character name in identifier "
                    f"{t.raw[:40]!r} (reads as {t.text[:40]!r})", t.line)
        elif t.kind == "other" and t.raw == "\\":
            after = spliced[t.pos + 1:t.pos + 2]
            if after in ("u", "U"):
                rep.add("bytes.ucn", "malformed universal character name", t.line)
