"""Gate 2c: what the compiled PTX of an untrusted kernel may not contain.

Gate 2a reads the source; this reads what NVRTC made of it, where no macro,
template or spelling can hide anything. A kernel that splits one task has no
use for:

- ``ptx.global_state``: a variable in global memory the source declared
  (``__device__ int calls;``, ``__managed__``) that the kernel writes, or
  whose address it takes (which a store could then use): it outlives the
  launch, so a kernel could count its launches and misbehave after the spot
  check's one. A namespace-scope constant NVRTC emits as ``.global`` (a
  ``constexpr int``) passes while it is only ever loaded directly
  (``ld.global [name]``); the CUDA math library's read-only tables
  (``__cudart_*``) and string literals (``$str``) always pass. (A constant
  table indexed at run time takes its address, so it is refused: use
  ``__constant__``.)
- ``ptx.timer``: the clocks (``%clock``, ``%clock64``, ``%globaltimer``): a
  result that depends on time (or on running on a GPU rather than the
  emulator, whose ``clock()`` is the C library's) is not a result.
- ``ptx.sleep`` and ``ptx.trap``: ``nanosleep``, ``trap``, ``brkpt``.
- ``ptx.surface``: surface stores (``sust``), memory the kernel was not
  given.
- ``ptx.system_scope``: atomics at system scope (``atom``/``red`` ``.sys``),
  which reach host memory mapped into the device.
- ``ptx.extern_call``: a function NVRTC left unresolved (``.extern .func``):
  a libc prototype declared by hand links against the host's libc in the
  emulation build.
- ``ptx.indirect_call``: a call through a register (a function pointer).
- ``ptx.recursion``: a cycle in the call graph: its stack depth is not known
  when the kernel is compiled, so ptxas cannot bound it.
- ``ptx.launch_bounds``: an entry whose ``.maxntid`` or ``.reqntid`` (from
  ``__launch_bounds__``) does not admit the decision's block: every launch
  would fail on a device, while the emulator ignores the bound.

:func:`check_ptx` never raises on bad input; it returns a
:class:`~lib.security.verdict.Verdict` of gate ``gate2c``.
"""

from __future__ import annotations

import math
import re
import time

from lib.security.verdict import Verdict, Violation

#: ``.global`` data the CUDA headers emit themselves (read-only tables of
#: the math library, string literals).
ALLOWED_GLOBAL = re.compile(r"__cudart_\w+|\$str(?:\$\d+)?")

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL_VAR = re.compile(
    r"^[ \t]*(?:\.(?:visible|extern|weak|common)\s+)*\.global\s+"
    r"(?:\.(?:align\s+\d+|attribute\s*\([^)]*\)|v\d|[a-z]\d+)\s+)*"
    r"([\w$]+)", re.M)
_FUNC = re.compile(r"^[ \t]*(?:\.(?:visible|weak|extern)\s+)*\.(func|entry)\s+"
                   r"(?:\([^)]*\)\s*)?([\w$]+)", re.M)
_LOAD = re.compile(r"\s*(?:@!?%\w+\s+)?ld\.")
_EXTERN_FUNC = re.compile(r"^[ \t]*\.extern\s+\.func\s+(?:\([^)]*\)\s*)?([\w$]+)",
                          re.M)
_TIMER = re.compile(r"%(clock64|clock|globaltimer(?:_lo|_hi)?)\b")
_SLEEP = re.compile(r"\bnanosleep(?:\.\w+)*\b")
_TRAP = re.compile(r"(?<![\w.$%])(trap|brkpt)\s*;")
_SURFACE = re.compile(r"\bsust(?:\.\w+)*")
_SYSTEM = re.compile(r"\b(?:atom|red)(?:\.\w+)*?\.sys\b")
_BOUNDS = re.compile(r"\.(maxntid|reqntid)\s+([\d\s,]+)")
_CALL = re.compile(r"\bcall(?:\.uni)?\s+([^;]*);", re.S)


def _bodies(ptx: str) -> dict[str, str]:
    """Function or entry name -> its body text (between its braces); a
    prototype (``...;`` after the parameters) has none."""
    out: dict[str, str] = {}
    for m in _FUNC.finditer(ptx):
        i, depth = m.end(), 0
        while i < len(ptx) and not (depth == 0 and ptx[i] in "{;"):
            depth += {"(": 1, ")": -1}.get(ptx[i], 0)
            i += 1
        if i >= len(ptx) or ptx[i] == ";":
            continue
        start = i
        while i < len(ptx):
            depth += {"{": 1, "}": -1}.get(ptx[i], 0)
            if depth == 0:
                break
            i += 1
        out[m.group(2)] = ptx[start + 1:i]
    return out


def _callees(body: str, known: set[str]) -> tuple[set[str], bool]:
    """The functions ``body`` calls by name, and whether it calls through a
    register."""
    names, indirect = set(), False
    for m in _CALL.finditer(body):
        parts = [p.strip() for p in re.split(r",(?![^()]*\))", m.group(1))]
        # call [(ret),] target, [(args)] [, prototype]
        target = next((p for p in parts if p and not p.startswith("(")), "")
        if target.startswith("%"):
            indirect = True
        elif target in known:
            names.add(target)
    return names, indirect


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def check_ptx(ptx: str, entry: str | None = None,
              block: int | None = None) -> Verdict:
    """Gate 2c on the PTX text of one module (see the module docstring).

    Args:
        ptx: what NVRTC produced.
        entry: the kernel's name, for the messages.
        block: threads per block of the launch, to check launch bounds.
    """
    start = time.perf_counter()
    text = _COMMENT.sub("", ptx if isinstance(ptx, str) else "")
    out: list[Violation] = []
    for m in _GLOBAL_VAR.finditer(text):
        name = m.group(1)
        if ALLOWED_GLOBAL.fullmatch(name):
            continue
        use = re.compile(rf"(?<![\w$]){re.escape(name)}(?![\w$])")
        for line in text[m.end():].splitlines():
            if use.search(line) and not _LOAD.match(line):
                out.append(Violation(
                    "ptx.global_state", f"global variable {name!r} is written "
                    f"or its address taken ({line.strip()[:60]}): state that "
                    "outlives the launch"))
                break
    for m in _EXTERN_FUNC.finditer(text):
        out.append(Violation("ptx.extern_call", f"calls {m.group(1)!r}, a "
                             "function the kernel does not define"))
    for check, pattern, what in (
            ("ptx.timer", _TIMER, "reads a clock"),
            ("ptx.sleep", _SLEEP, "sleeps"),
            ("ptx.trap", _TRAP, "traps"),
            ("ptx.surface", _SURFACE, "writes a surface"),
            ("ptx.system_scope", _SYSTEM, "uses a system-scope atomic")):
        m = pattern.search(text)
        if m:
            out.append(Violation(check, f"{what} ({m.group(0).strip()})"))
    bodies = _bodies(text)
    graph: dict[str, set[str]] = {}
    for name, body in bodies.items():
        graph[name], indirect = _callees(body, set(bodies))
        if indirect:
            out.append(Violation("ptx.indirect_call", f"{name} calls through a "
                                 "function pointer"))
    cycle = _cycle(graph)
    if cycle:
        out.append(Violation("ptx.recursion", "recursion: " + " -> ".join(cycle)))
    if block is not None:
        for m in _BOUNDS.finditer(text):
            dims = [int(v) for v in re.findall(r"\d+", m.group(2))]
            most = math.prod(dims) if dims else 0
            if (m.group(1) == "maxntid" and most < block) or \
                    (m.group(1) == "reqntid" and most != block):
                out.append(Violation("ptx.launch_bounds", f".{m.group(1)} "
                                     f"{m.group(2).strip()} does not admit a "
                                     f"block of {block} threads"))
    if entry is not None and bodies and entry not in bodies:
        out.append(Violation("ptx.entry", f"no entry {entry!r} in the PTX"))
    return Verdict("gate2c", tuple(out), time.perf_counter() - start)
