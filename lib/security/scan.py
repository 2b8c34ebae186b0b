"""Gate 2a: a static scan of generated CUDA source before it is compiled.

:func:`scan_source` takes anything (``str``, ``bytes``, ``None``, a huge
string...), never raises, and returns a :class:`~lib.security.verdict.Verdict`
(gate ``"gate2a"``) listing every violated check, each with the 1-based source
line. It reads the source the way a compiler would (trigraphs, line splices,
comments, digraphs, directives, macro expansion with ``#`` and ``##``) and
refuses whatever the compiler could be made to see differently: every branch
of ``#if``/``#else`` is scanned, both as written and after macro expansion, and
a macro with several possible definitions is expanded with each of them.
:func:`check_compile_options` checks compiler options against an allowlist.

=============================  ================================================
check id                       what it refuses
=============================  ================================================
bytes.type                     a source that is neither ``str`` nor ``bytes``
bytes.size                     a source over ``max_bytes`` (UTF-8 bytes)
bytes.utf8                     bytes that are not valid UTF-8
bytes.control                  control characters (NUL, ESC, C1...) anywhere
bytes.bidi                     bidirectional controls anywhere, comments and
                               strings included (Trojan Source)
bytes.non_ascii                non-ASCII outside comments and literals
                               (homoglyphs such as a Cyrillic ``a``)
bytes.ucn                      ``\\uXXXX``/``\\UXXXXXXXX`` outside literals
pp.trigraph                    any trigraph (``??=``...); compilers disagree
                               on whether they are active
pp.splice_whitespace           a backslash followed by blanks, then newline
pp.include                     ``#include`` of a header not on the allowlist
                               (``cuda_fp16.h``, ``cuda_bf16.h``), and
                               ``#include_next``, ``#import``, ``#embed``,
                               ``__has_include``, ``__has_embed``
pp.computed_include            ``#include MACRO``
pp.line                        ``#line`` and ``# 12 "file"`` line markers
pp.pragma                      ``#pragma`` other than ``unroll [N]``
pp._Pragma                     ``_Pragma``/``__pragma``, also via macros
pp.directive                   a directive not on the list (``#ident``...)
pp.stray_hash                  ``#`` or ``##`` outside a directive
pp.define_reserved             ``#define``/``#undef`` of a keyword or a
                               reserved name (``__global__``, ``_X``...)
pp.macro_hides_forbidden       a macro whose expansion yields a forbidden
                               token (pasting, arguments, plain bodies)
pp.expansion_limit             macro expansion beyond the token budget
token.asm                      ``asm``, ``__asm__``, ``__asm`` (inline PTX)
token.os_call                  host/OS calls: ``system``, ``popen``,
                               ``exec*``, ``fork``, ``spawn*``, sockets,
                               ``dlopen``, ``mmap``, ``getenv``, ``kill(``...
token.file_io                  ``fopen``, ``fread``, ``fprintf``, ``FILE``,
                               ``open(``/``read(``/``write(``/``close(``...
token.printf                   ``printf``, ``vprintf``, ``puts``, ``cout``...
token.malloc                   ``malloc``, ``free(``, ``new``, ``delete``,
                               ``cudaMalloc``...
token.trap                     ``__trap``, ``__brkpt``, ``assert``...
token.function_pointer         ``( * name ) (``, function typedefs,
                               ``decltype(&f)``, ``&f``, ``std::function``,
                               ``virtual``, a lambda made a function
                               pointer by unary ``+``/``*``/``&``, function
                               types such as ``void(float*)``, ``.*``/``->*``
token.device_launch            ``<<<``, ``cudaLaunchKernel``,
                               ``cudaLaunchDevice``, ``cudaGraphLaunch``...
token.raw_string               raw string literals ``R"(...)"``
kernel.count                   not exactly one ``__global__`` kernel
kernel.name                    a kernel whose name is not ``kernel_name``
kernel.extern_c                a ``__global__`` without ``extern "C"``
scan.internal                  the scanner itself failed (fails closed)
options.type                   options that are not a sequence of strings
options.flag                   an option not on the allowlist
options.arch                   an architecture outside sm_75..sm_120
options.define                 ``-DNAME=VALUE`` with a bad name or value
=============================  ================================================

Names that merely contain a forbidden word (``system_load``, ``asm_count``)
pass, and so do comments and string literals that mention one.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lib.security.verdict import Verdict, Violation

GATE = "gate2a"
MAX_BYTES = 256 * 1024
ALLOWED_INCLUDES = frozenset({"cuda_fp16.h", "cuda_bf16.h"})
#: At most this many violations are listed per check id (plus one summary).
MAX_PER_CHECK = 20
#: Macro expansion may produce at most this many tokens plus
#: ``EXPANSION_PER_TOKEN`` per source token; beyond that the source is refused.
EXPANSION_BUDGET = 20_000
EXPANSION_PER_TOKEN = 8
#: Deepest nesting of macro invocations inside macro arguments.
MAX_NESTING = 64
#: Kernel markers (``__global__``...) looked at before giving up counting.
MAX_KERNEL_MARKERS = 64

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
_IDENT_FULL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char
char8_t char16_t char32_t class compl concept const consteval constexpr
constinit const_cast continue co_await co_return co_yield decltype default
defined delete do double dynamic_cast else enum explicit export extern false
float for friend goto if inline int long mutable namespace new noexcept not
not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef
typeid typename union unsigned using virtual void volatile wchar_t while xor
xor_eq
""".split())


def _names(check: str, what: str, words: str) -> dict[str, tuple[str, str]]:
    return {w: (check, what) for w in words.split()}


# Forbidden wherever the identifier appears (as a whole identifier).
_STRONG: dict[str, tuple[str, str]] = {
    **_names("token.asm", "inline assembly", "asm __asm__ __asm"),
    **_names("token.os_call", "host/OS call", """
        system popen pclose fork vfork clone posix_spawn posix_spawnp dlopen
        dlsym dlclose dlmopen mmap munmap mprotect getenv setenv putenv
        unsetenv secure_getenv ptrace syscall socket socketpair execveat
        fexecve gethostbyname getaddrinfo"""),
    **_names("token.file_io", "file I/O", """
        fopen freopen fdopen fread fwrite fprintf vfprintf fputs fputc fgets
        fgetc fscanf fclose fflush fseek ftell rewind tmpfile tmpnam mkstemp
        opendir readdir FILE stdin stdout stderr ifstream ofstream fstream"""),
    **_names("token.printf", "console output", """
        printf vprintf sprintf snprintf vsprintf vsnprintf puts putchar scanf
        sscanf cout cerr clog"""),
    **_names("token.malloc", "dynamic allocation", """
        malloc calloc realloc aligned_alloc memalign posix_memalign valloc
        alloca __builtin_alloca new cudaMalloc cudaMallocAsync cudaMallocManaged
        cudaMallocPitch cudaFree cudaFreeAsync __nv_aligned_device_malloc"""),
    **_names("token.trap", "trap or assertion", """
        __trap __brkpt assert __assert_fail __assertfail __builtin_trap
        __builtin_debugtrap abort"""),
    **_names("token.device_launch", "device-side launch", """
        cudaLaunchKernel cudaLaunchKernelEx cudaLaunchDevice
        cudaLaunchCooperativeKernel cudaGraphLaunch cudaGetParameterBuffer
        cudaGetParameterBufferV2 cudaDeviceSynchronize"""),
    **_names("token.function_pointer", "indirect call", "virtual"),
    **_names("pp._Pragma", "pragma operator", "_Pragma __pragma"),
    **_names("pp.include", "include probe",
             "__has_include __has_include_next __has_embed"),
}
# Forbidden only when followed by a call parenthesis (common words otherwise).
_WEAK: dict[str, tuple[str, str]] = {
    **_names("token.os_call", "host/OS call", """
        kill connect bind listen accept send recv sendto recvfrom sendmsg
        recvmsg exit _exit atexit chmod chown ioctl fcntl"""),
    **_names("token.file_io", "file I/O", """
        open openat creat read write close pread pwrite unlink remove rename
        dup dup2 pipe stat lstat fstat"""),
    **_names("token.malloc", "dynamic allocation", "free"),
}
_EXEC_RE = re.compile(r"_?(?:exec|spawn)(?:l|le|lp|lpe|v|ve|vp|vpe)")
_QUALIFIERS = frozenset({"const", "volatile", "__restrict__", "__restrict", "restrict"})
_ATTRIBUTE_WORDS = frozenset(
    {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "__align__",
     "__maxnreg__", "__cluster_dims__"}
)
_BUILTIN_TYPES = frozenset(
    {"void", "bool", "char", "char8_t", "char16_t", "char32_t", "wchar_t", "short",
     "int", "long", "float", "double", "signed", "unsigned"}
)
#: Keywords that end an operand (so an operator after them is binary).
_OPERAND_KEYWORDS = frozenset({"this", "true", "false", "nullptr"})
_NOT_FUNCTIONS = frozenset(
    {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
     "alignof", "static_assert"} | _ATTRIBUTE_WORDS
)


class _Tok:
    """One preprocessing token; ``text`` is canonical (digraphs, UCNs resolved)."""

    __slots__ = ("kind", "text", "raw", "pos", "line", "nl", "nl_any", "ws",
                 "hide", "origin", "ver")

    def __init__(self, kind, text, raw, pos, line, nl, nl_any, ws):
        self.kind = kind  # "id", "num", "str", "chr", "punct", "other"
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

    def derive(self, line, hide, origin, ver) -> _Tok:
        t = _Tok(self.kind, self.text, self.raw, self.pos, line, False, False,
                 self.ws)
        t.hide, t.origin, t.ver = hide, origin, ver
        return t


@dataclass(frozen=True)
class _Macro:
    name: str
    params: tuple[str, ...] | None  # None: object-like
    variadic: bool
    body: tuple[_Tok, ...]
    line: int

    def signature(self) -> tuple:
        return (self.params, self.variadic, tuple(t.text for t in self.body))


class _Budget(Exception):
    """Raised inside expansion when the token budget is spent."""


class _Report:
    """Collects violations: deduplicated, at most MAX_PER_CHECK per check id."""

    def __init__(self) -> None:
        self.found: list[Violation] = []
        self._seen: set[tuple] = set()
        self._count: dict[str, int] = {}

    def add(self, check: str, message: str, line: int | None) -> None:
        key = (check, message, line)
        if key in self._seen:
            return
        self._seen.add(key)
        n = self._count.get(check, 0) + 1
        self._count[check] = n
        if n <= MAX_PER_CHECK:
            self.found.append(Violation(check, message, line))

    def violations(self) -> tuple[Violation, ...]:
        more = [
            Violation(c, f"{n - MAX_PER_CHECK} more {c} violations not listed")
            for c, n in self._count.items()
            if n > MAX_PER_CHECK
        ]
        return tuple(self.found + more)


def _match_parens(toks: list[_Tok]) -> list[int]:
    """For each ``(``, the index of its ``)`` (-1 when unmatched); linear."""
    match = [-1] * len(toks)
    stack: list[int] = []
    for i, t in enumerate(toks):
        if t.kind != "punct":
            continue
        if t.text == "(":
            stack.append(i)
        elif t.text == ")" and stack:
            match[stack.pop()] = i
    return match


def _safe_repr(value: object, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not break the gate
        text = f"<{type(value).__name__}>"
    return text[:limit]


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _decode(source: object, max_bytes: int, rep: _Report) -> str | None:
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
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _raw_checks(text: str, rep: _Report) -> None:
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


def _translate(text: str, rep: _Report) -> tuple[str, list[int]]:
    """Phases 1-2: resolve trigraphs, splice lines.

    Returns the spliced text and the offsets (in it) where a newline was
    removed, so that :func:`_Lexer.line` can map back to source lines.
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


def _lex(text: str, splices: Sequence[int] = ()) -> list[_Tok]:
    """Phase 3: split spliced text into preprocessing tokens, dropping comments.

    One match of :data:`_TOKEN_RE` per token (with the blanks before it),
    comment or newline run, so the cost is linear in the length of the text.
    """
    toks: list[_Tok] = []
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
        append(_Tok(kind, canon, raw, start, line, nl, nl_any,
                    ws or start > m.start()))
        if kind == "raw":
            newlines += raw.count("\n")  # raw strings may span lines
        nl = nl_any = ws = False
    return toks


class _Scanner:
    """Layers 1c-3 over one decoded source."""

    def __init__(self, text: str, kernel_name: object, rep: _Report) -> None:
        self.rep = rep
        self.kernel_name = kernel_name
        self.spliced, self.splices = _translate(text, rep)
        self.toks = _lex(self.spliced, self.splices)
        self.history: dict[str, tuple[list[int], list[tuple[_Macro, ...]]]] = {}
        self.override: tuple[str, _Macro] | None = None
        self.budget_total = EXPANSION_BUDGET + EXPANSION_PER_TOKEN * len(self.toks)
        self.budget = self.budget_total
        self.fnames: frozenset[str] = frozenset()
        self._alias_done = 0

    # ---- layer 1c: characters outside comments and literals ------------------
    def lexical_checks(self) -> None:
        for t in self.toks:
            if t.kind in ("str", "chr"):
                continue
            if t.kind == "raw":
                self.rep.add("token.raw_string", "raw string literal "
                             f"{t.raw[:20]!r}", t.line)
                continue
            if not t.raw.isascii():
                bad = next(ch for ch in t.raw if not ch.isascii())
                self.rep.add("bytes.non_ascii", f"non-ASCII character U+{ord(bad):04X}"
                             f" in {t.raw[:40]!r} outside comments and literals",
                             t.line)
            if t.kind == "id" and "\\" in t.raw:
                self.rep.add("bytes.ucn", f"universal character name in identifier "
                             f"{t.raw[:40]!r} (reads as {t.text[:40]!r})", t.line)
            elif t.kind == "other" and t.raw == "\\":
                after = self.spliced[t.pos + 1:t.pos + 2]
                if after in ("u", "U"):
                    self.rep.add("bytes.ucn", "malformed universal character name",
                                 t.line)

    # ---- layer 2: directives -------------------------------------------------
    def preprocess(self) -> list[_Tok]:
        """Handle directives (all branches); return the code tokens, in order."""
        code: list[_Tok] = []
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

    def directive(self, d: list[_Tok], ver: int, depth: int) -> tuple[int, int]:
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

    def include(self, d: list[_Tok], line: int) -> None:
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
        if name in _KEYWORDS or name.startswith("__") or re.match("_[A-Z]", name):
            self.rep.add("pp.define_reserved", f"'#{what} {name[:40]}' redefines a "
                         "keyword or reserved name", line)

    def define(self, d: list[_Tok], ver: int, depth: int) -> int:
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
        macro = _Macro(name, params, variadic, tuple(d[k:]), d[0].line)
        defs = self.lookup(name, ver)
        if depth == 0:
            new = (macro,)
        elif any(m.signature() == macro.signature() for m in defs):
            new = defs
        else:
            new = defs + (macro,)
        return self._push(name, ver + 1, new)

    def undef(self, d: list[_Tok], ver: int, depth: int) -> int:
        if len(d) < 3 or d[2].kind != "id":
            return ver
        self._reserved(d[2].text, "undef", d[0].line)
        if depth:  # maybe undefined: the unexpanded text is scanned anyway
            return ver
        return self._push(d[2].text, ver + 1, ())

    def _push(self, name: str, ver: int, defs: tuple[_Macro, ...]) -> int:
        vers, states = self.history.setdefault(name, ([], []))
        vers.append(ver)
        states.append(defs)
        return ver

    def lookup(self, name: str, ver: int) -> tuple[_Macro, ...]:
        if self.override is not None and self.override[0] == name:
            return (self.override[1],)
        entry = self.history.get(name)
        if entry is None:
            return ()
        k = bisect.bisect_right(entry[0], ver)
        return entry[1][k - 1] if k else ()

    # ---- layer 2b: macro expansion -------------------------------------------
    def spend(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise _Budget

    def expand(self, toks: list[_Tok], sides: bool, nesting: int = 0) -> list[_Tok]:
        """Expand macros in ``toks`` (Prosser's algorithm, hide sets)."""
        if nesting > MAX_NESTING:
            raise _Budget
        out: list[_Tok] = []
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
        self, t: _Tok, m: _Macro, pending: list[_Tok], sides: bool, nesting: int
    ) -> list[_Tok]:
        hide = t.hide | {m.name}
        origin = t.origin or m.name
        args: list[list[_Tok]] = []
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

        def arg(name: str) -> list[_Tok]:
            k = params[name]
            return args[k] if k < len(args) else []

        body = m.body
        res: list[_Tok | None] = []  # None is a placemarker
        i = 0
        while i < len(body):
            b = body[i]
            nxt = body[i + 1] if i + 1 < len(body) else None
            if b.text == "#" and b.kind == "punct" and nxt is not None \
                    and nxt.text in params:
                res.append(self.stringize(arg(nxt.text), b))
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
                    res.extend(self.paste(lhs, rhs[0]))
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

    def stringize(self, arg: list[_Tok], at: _Tok) -> _Tok:
        parts = []
        for k, a in enumerate(arg):
            if k and a.ws:
                parts.append(" ")
            raw = a.raw
            if a.kind in ("str", "chr", "raw"):
                raw = raw.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(raw)
        text = '"' + "".join(parts) + '"'
        return _Tok("str", text, text, at.pos, at.line, False, False, True)

    def paste(self, lhs: _Tok, rhs: _Tok) -> list[_Tok]:
        """``lhs ## rhs``: re-lex the joined text; every piece is checked."""
        pasted = _lex(lhs.raw + rhs.raw)
        for p in pasted:
            p.pos, p.line, p.ws = lhs.pos, lhs.line, lhs.ws
            p.hide = lhs.hide | rhs.hide
        return pasted

    def side(self, t: _Tok, alt: _Macro, pending: list[_Tok]) -> None:
        """Expand one use of ``t`` with an alternative definition ``alt``."""
        take: list[_Tok] = []
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
        self.check_tokens(out, f"; alternative definition of '{t.text}' from line "
                          f"{alt.line}")

    # ---- layer 3: tokens -----------------------------------------------------
    def flag(self, check: str, message: str, tok: _Tok, note: str = "") -> None:
        if tok.origin is not None:
            self.rep.add(check, f"{message} (produced by macro '{tok.origin}'"
                         f"{note})", tok.line)
            self.rep.add("pp.macro_hides_forbidden", f"macro '{tok.origin}' "
                         f"expands to forbidden token '{tok.text[:40]}' ({check}"
                         f"{note})", tok.line)
        else:
            self.rep.add(check, message, tok.line)

    def check_tokens(self, toks: list[_Tok], note: str = "") -> None:
        n = len(toks)
        self._alias_done = 0
        fnames = self.fnames
        for i, t in enumerate(toks):
            nxt = toks[i + 1] if i + 1 < n else None
            prev = toks[i - 1] if i else None
            if t.kind == "id":
                name = t.text
                call = nxt is not None and nxt.text == "(" and nxt.kind == "punct"
                hit = _STRONG.get(name)
                if hit is None and call:
                    hit = _WEAK.get(name)
                if hit is None and _EXEC_RE.fullmatch(name):
                    hit = ("token.os_call", "host/OS call")
                if name == "delete" and not (prev is not None and prev.text == "="):
                    hit = ("token.malloc", "dynamic allocation")
                if name == "function" and prev is not None and prev.text == "::":
                    hit = ("token.function_pointer", "polymorphic function wrapper")
                if hit is not None:
                    self.flag(hit[0], f"{hit[1]} '{name}'", t, note)
                elif name in ("typedef", "using"):
                    self.check_type_alias(toks, i, note)
                elif name in _BUILTIN_TYPES and self._function_type(toks, i):
                    self.flag("token.function_pointer", f"function type "
                              f"'{name}(...)'", t, note)
                elif name == "decltype" and self._decltype_fn(toks, i):
                    self.flag("token.function_pointer", "decltype of a function "
                              "address", t, note)
                elif name in fnames and self._function_value(prev, nxt):
                    self.flag("token.function_pointer", f"function '{name}' used "
                              "as a value", t, note)
            elif t.kind == "punct":
                if t.text == "<<" and nxt is not None and nxt.text.startswith("<"):
                    self.flag("token.device_launch", "kernel launch '<<<'", t, note)
                elif t.text == "(" and self._fp_declarator(toks, i):
                    self.flag("token.function_pointer", "function pointer "
                              "declarator '( * name ) ('", toks[i + 1], note)
                elif t.text in ("+", "*", "&") and self._lambda_decay(toks, i):
                    self.flag("token.function_pointer", f"unary '{t.text}' on a "
                              "lambda (makes a function pointer)", t, note)
                elif t.text in (".*", "->*"):
                    self.flag("token.function_pointer", f"pointer-to-member "
                              f"access '{t.text}'", t, note)

    @staticmethod
    def _fp_declarator(toks: list[_Tok], i: int) -> bool:
        """``( * name ) (``, ``( & name ) (``, ``( C :: * name ) (``, ``(*)(``."""
        n = len(toks)
        k = i + 1
        while k + 1 < n and toks[k].kind == "id" and toks[k + 1].text == "::":
            k += 2
        if k >= n or toks[k].text not in ("*", "&", "&&") or toks[k].kind != "punct":
            return False
        k += 1
        while k < n and toks[k].kind == "id" and toks[k].text in _QUALIFIERS:
            k += 1
        if k < n and toks[k].kind == "id":
            k += 1
        while k < n and toks[k].text == "[":
            stop = min(n, k + 64)
            while k < stop and toks[k].text != "]":
                k += 1
            k += 1
        return k + 1 < n and toks[k].text == ")" and toks[k + 1].text == "("

    @staticmethod
    def _lambda_decay(toks: list[_Tok], i: int) -> bool:
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
        return not (prev.kind == "id" and (prev.text not in _KEYWORDS
                                           or prev.text in _OPERAND_KEYWORDS))

    @staticmethod
    def _function_type(toks: list[_Tok], i: int) -> bool:
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
                toks[k].text in _BUILTIN_TYPES or toks[k].text in _QUALIFIERS):
            k += 1
        return k > start and (k >= n or toks[k].text not in ("(", "{"))

    def check_type_alias(self, toks: list[_Tok], i: int, note: str) -> None:
        """``typedef R name(A)`` / ``using F = R(A)``: a function type."""
        depth = 0
        first = max(i + 1, self._alias_done)
        for k in range(first, min(len(toks) - 1, i + 256)):
            self._alias_done = k + 1  # each token is looked at once per stream
            t = toks[k]
            if t.text in (";", "{", "}"):
                return
            if t.text in ("(", "<"):
                depth += 1
            elif t.text in (")", ">"):
                depth -= 1
            if (depth == 0 and t.kind == "id" and t.text not in _NOT_FUNCTIONS
                    and toks[k + 1].text == "(" and t.text not in _QUALIFIERS):
                self.flag("token.function_pointer", f"function type alias near "
                          f"'{t.text[:40]}'", t, note)
                return

    def _decltype_fn(self, toks: list[_Tok], i: int) -> bool:
        window = [t.text for t in toks[i + 1:i + 5]]
        if window[:2] == ["(", "&"] and len(window) > 2:
            return window[2] in self.fnames
        return False

    @staticmethod
    def _function_value(prev: _Tok | None, nxt: _Tok | None) -> bool:
        if nxt is not None and nxt.text in ("(", "<", "::"):
            return False
        return prev is not None and prev.text in ("&", "=", ",", "(", "return", "?")

    def collect_functions(self, toks: list[_Tok]) -> None:
        """Names of functions defined here: ``name ( ... ) [qualifiers] {``."""
        names = set()
        n = len(toks)
        match = _match_parens(toks)
        for i, t in enumerate(toks):
            if t.kind != "id" or i + 1 >= n or toks[i + 1].text != "(":
                continue
            if t.text in _NOT_FUNCTIONS or t.text in _KEYWORDS:
                continue
            k = match[i + 1] + 1
            if k <= 0:
                continue
            while k < n and toks[k].kind == "id" and toks[k].text in (
                    "const", "noexcept", "override", "final"):
                k += 1
            if k < n and toks[k].text == "{":
                names.add(t.text)
        self.fnames = frozenset(names)

    # ---- layer 3b: the kernel ------------------------------------------------
    def check_kernels(self, toks: list[_Tok]) -> None:
        kernels: dict[str, list] = {}  # name -> [first line, extern "C" always]
        c_block: list[bool] = []
        pending_c = False
        n = len(toks)
        match = _match_parens(toks)
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
            if not self._is_kernel_marker(toks, i):
                continue
            markers += 1
            if markers > MAX_KERNEL_MARKERS:
                kernels.setdefault(f"<{markers}+ kernel markers>", [t.line, False])
                break
            extern_c = any(c_block) or self._extern_c_before(toks, i)
            name = self._kernel_name(toks, i, match)
            name = name or f"<unnamed kernel, line {t.line}>"
            entry = kernels.setdefault(name, [t.line, True])
            entry[1] = entry[1] and extern_c
        rep = self.rep
        if len(kernels) != 1:
            names = ", ".join(sorted(kernels))[:200] or "none"
            rep.add("kernel.count", f"expected exactly one extern \"C\" __global__ "
                    f"kernel, found {len(kernels)} ({names})",
                    min((v[0] for v in kernels.values()), default=None))
        for name, (line, extern_c) in kernels.items():
            if not extern_c:
                rep.add("kernel.extern_c", f"__global__ kernel '{name}' is not "
                        "declared extern \"C\"", line)
            if name != self.kernel_name:
                rep.add("kernel.name", f"kernel '{name}' is not the expected "
                        f"{self.kernel_name!r}", line)

    @staticmethod
    def _is_kernel_marker(toks: list[_Tok], i: int) -> bool:
        t = toks[i]
        if t.kind != "id":
            return False
        if t.text in ("__global__", "__location__"):
            return True
        if t.text in ("__attribute__", "__declspec"):
            inner = [x.text for x in toks[i + 1:i + 8]]
            return "global" in inner or "__global__" in inner
        return False

    @staticmethod
    def _extern_c_before(toks: list[_Tok], i: int) -> bool:
        for k in range(i - 1, max(-1, i - 64), -1):
            t = toks[k]
            if t.text in (";", "{", "}"):
                return False
            if t.raw == '"C"' and k and toks[k - 1].text == "extern":
                return True
        return False

    @staticmethod
    def _kernel_name(toks: list[_Tok], i: int, match: list[int]) -> str | None:
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
            if t.kind == "id" and t.text in _ATTRIBUTE_WORDS:
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

    # ---- driver --------------------------------------------------------------
    def run(self) -> None:
        self.lexical_checks()
        code = self.preprocess()
        try:
            expanded = self.expand(code, True)
        except _Budget:
            self.rep.add("pp.expansion_limit", "macro expansion exceeds the budget "
                         f"of {self.budget_total} tokens "
                         "(or nests too deep)", None)
            expanded = code
        self.collect_functions(expanded)
        self.check_tokens(self.toks)  # as written: every branch, every directive
        self.check_tokens(expanded)  # as the compiler reads it
        self.check_kernels(expanded)


def scan_source(
    source: str | bytes, kernel_name: str, *, max_bytes: int = MAX_BYTES
) -> Verdict:
    """Gate 2a: scan CUDA C++ source; never raises.

    Args:
        source: the ``.cu`` text, ``str`` or UTF-8 ``bytes``; anything else is
            refused with ``bytes.type``.
        kernel_name: the one ``extern "C" __global__`` kernel the source must
            define (a C identifier).
        max_bytes: size limit in bytes of the UTF-8 source (default 256 KiB).

    Returns:
        A ``Verdict`` (gate ``"gate2a"``) with every violated check and the
        wall time in seconds. A 64 KiB source scans in tens of milliseconds.
    """
    start = time.perf_counter()
    rep = _Report()
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
        text = _decode(source, max_bytes, rep)
        if text is not None:
            _raw_checks(text, rep)
            _Scanner(text, kernel_name, rep).run()
    except Exception as exc:  # fail closed: a scanner bug never accepts
        rep.add("scan.internal", f"scanner failed: {type(exc).__name__}: "
                f"{exc!s:.100}", None)
    return Verdict(GATE, rep.violations(), time.perf_counter() - start)


# ---- layer 4: compile options ------------------------------------------------
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
    rep = _Report()
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
