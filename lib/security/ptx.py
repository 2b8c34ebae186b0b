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
- ``ptx.fixed_address``: a load, store or atomic at an address made of
  constants and thread indices alone (``*(int*)0x1000 = 1``), which no
  buffer the kernel was given can be at: on a device it writes wherever
  that address happens to map, and, behind a condition the spot check's
  sizes never meet (``if (n == 7)``), it would run nowhere before. An
  address derived from a parameter, a symbol or a loaded value passes
  (pointer arithmetic that strays from its buffer is the spot check's and
  the sanitizers' to catch, where it runs).
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


_INSTRUCTION = re.compile(
    r"(?:@!?%\w+\s+)?([a-z][\w.]*)\s*([^;{}]*(?:\{[^}]*\}[^;]*)?);")
_OPERAND = re.compile(r"\{[^}]*\}|\[[^\]]*\]|[^,\s][^,]*")
_REGISTER = re.compile(r"%[\w$]+")
#: Special registers: thread and block indices and sizes, SM and warp ids,
#: clocks, counters: none is an address.
_SPECIAL = re.compile(r"%(?:tid|ntid|ctaid|nctaid|laneid|warpid|nwarpid|smid|"
                      r"nsmid|gridid|clusterid|nclusterid|cluster_ctaid|"
                      r"cluster_nctaid|cluster_ctarank|cluster_nctarank|"
                      r"lanemask_\w+|clock\w*|globaltimer\w*|pm\d+\w*|envreg\d+|"
                      r"total_smem_size|dynamic_smem_size|aggr_smem_size|"
                      r"reserved_smem_offset\w*)(?:\.[xyz])?$")
_NUMBER = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|0[fFdD][0-9a-fA-F]+|\d+)U?$")
_MEMORY = re.compile(r"(?:ld|ldu|st|atom|red|prefetch|prefetchu|cp\.async|"
                     r"multimem)\b")


def _fixed_addresses(body: str) -> list[str]:
    """The memory instructions of one function body whose address is a
    number, or a register computed only from numbers and special registers
    (flow-insensitively: a register any of whose definitions draws on a
    parameter, a symbol, a load or a register it never defines is taken as
    based on something given)."""
    defs: dict[str, list[tuple[str, list[str]]]] = {}
    memory: list[tuple[str, str]] = []
    for m in _INSTRUCTION.finditer(body):
        op, operands = m.group(1), _OPERAND.findall(m.group(2))
        if op.startswith(".") or not operands:
            continue
        if _MEMORY.match(op) and ".param" not in op:
            for operand in operands:
                if operand.startswith("["):
                    memory.append((m.group(0).strip(), operand[1:-1]))
                    break
        if op.startswith(("st.", "red.", "prefetch", "bra", "ret", "call", "bar",
                          "membar", "fence", "cp.async")):
            continue
        dests = _REGISTER.findall(operands[0])
        for d in dests:
            defs.setdefault(d, []).append((op, operands[1:]))
    based: set[str] = set()

    def is_based(operand: str) -> bool:
        regs = _REGISTER.findall(operand)
        if not regs:   # a number, or a symbol (a buffer the module holds)
            return not _NUMBER.match(operand.strip("[] "))
        return any(r in based or (r not in defs and not _SPECIAL.match(r))
                   for r in regs)

    changed = True
    while changed:
        changed = False
        for reg, forms in defs.items():
            if reg not in based and any(
                    op.startswith(("ld", "ldu", "atom")) or any(
                        is_based(x) for x in srcs) for op, srcs in forms):
                based.add(reg)
                changed = True
    out = []
    for line, address in memory:
        base = address.split("+")[0].strip()
        if _NUMBER.match(base) or (base in defs and base not in based):
            out.append(line[:60])
    return out


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
    for name, body in bodies.items():
        fixed = _fixed_addresses(body)
        if fixed:
            out.append(Violation("ptx.fixed_address", f"{name} reaches memory at "
                                 f"an address made of constants ({fixed[0]}): "
                                 "no buffer it was given"))
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
