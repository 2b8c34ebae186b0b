"""Gate 2a: a static scan of generated CUDA source before it is compiled.

:func:`scan_source` takes anything (``str``, ``bytes``, ``None``, a huge
string...), never raises, and returns a :class:`~lib.security.verdict.Verdict`
(gate ``"gate2a"``) listing every violated check, each with the 1-based source
line. It reads the source the way each compiler that will build it does
(trigraphs, line splices, comments, digraphs, directives, macro expansion with
``#`` and ``##``): NVRTC for every target architecture (sm_75, 80, 86, 89, 90
and any the compile options name) and the host emulation build, each with its
own predefined macros, so that ``#if``/``#ifdef``/``#elif`` are decided as
that compiler decides them and a ``#define`` counts only where its branch is
taken. A conditional the scanner cannot decide is read both ways. A payload
in a branch any configuration takes is refused; forbidden names are refused
in every branch, taken or not. What a kernel may call is an allowlist.
:func:`check_compile_options` checks compiler options against an allowlist.

The scan is a filter in front of the sandbox, not the boundary itself. The
scan runs in layers, each in its own module:

==========================  ===================================================
module                      layer
==========================  ===================================================
:mod:`.lexer`               1a raw bytes (type, size, UTF-8, byte-order mark,
                            lone CR); 1b characters refused anywhere;
                            trigraphs and line splices; tokens; 1c characters
                            outside comments and literals
:mod:`.preprocessor`        2 directives as written; one run per compiler
                            configuration (and undecided branch); 2b macro
                            expansion with its cost bounded per use
:mod:`.conditions`          2 the configurations' predefined macros and
                            ``#if`` arithmetic
:mod:`.token_checks`        3 forbidden names and constructs in each token
                            stream (as written, each run expanded)
:mod:`.kernel`              3b the kernel's shape: one, named, ``extern "C"``;
                            no other ``extern``
:mod:`.calls`               3c the call allowlist, qualified names, attributes
:mod:`.options`             4 compile options
:mod:`.rules`               the name tables the layers read (forbidden,
                            allowed, keywords, predefined macros)
:mod:`.scanner`             :func:`scan_source`, which runs layers 1-3c
:mod:`.report`              the collector of violations every layer writes to
==========================  ===================================================

A finding that some configurations make and others do not ends with the ones
that make it (``[NVRTC sm_89]``, ``[host build]``).

=============================  ================================================
check id                       what it refuses
=============================  ================================================
bytes.type                     a source that is neither ``str`` nor ``bytes``
bytes.size                     a source over ``max_bytes`` (UTF-8 bytes)
bytes.utf8                     bytes that are not valid UTF-8
bytes.control                  control characters (NUL, ESC, C1...) anywhere,
                               and a CR not followed by LF (g++ ends a line
                               there, NVRTC does not)
bytes.bidi                     bidirectional controls anywhere, comments and
                               strings included (Trojan Source)
bytes.non_ascii                non-ASCII outside comments and literals
                               (homoglyphs such as a Cyrillic ``a``); a
                               leading byte-order mark is dropped, not refused
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
pp.pragma                      ``#pragma`` other than ``unroll`` alone or with
                               one constant expression (``4``, ``UNROLL``,
                               ``(TILE / 4)``), also once macros are expanded
pp._Pragma                     ``_Pragma``/``__pragma``, also via macros
pp.directive                   a directive not on the list (``#ident``...)
pp.stray_hash                  ``#`` or ``##`` outside a directive
pp.define_reserved             ``#define``/``#undef`` of a keyword or a
                               reserved name (``__global__``, ``_X``...)
pp.conditional                 unbalanced ``#if``/``#else``/``#endif``, or
                               more configurations (undecided conditionals
                               times architectures) than the scan reads
pp.macro_hides_forbidden       a macro whose expansion yields a forbidden
                               token (pasting, arguments, plain bodies), or
                               whose body, in any branch, holds one
pp.expansion_limit             macro expansion beyond the token budget, one
                               use beyond 8192 tokens, or nesting too deep
token.asm                      ``asm``, ``__asm__``, ``__asm`` (inline PTX)
token.os_call                  host/OS calls: ``system``, ``popen``,
                               ``exec*``, ``fork``, ``spawn*``, sockets,
                               ``dlopen``, ``mmap``, ``getenv``, ``environ``,
                               ``kill(``...
token.file_io                  ``fopen``, ``fread``, ``fprintf``, ``FILE``,
                               ``open(``/``read(``/``write(``/``close(``...
token.printf                   ``printf``, ``vprintf``, ``puts``, ``cout``...;
                               device ``printf`` is legal CUDA, but what it
                               prints goes to the host's console, which
                               nothing here reads
token.malloc                   ``malloc``, ``free(``, ``new``, ``delete``,
                               ``cudaMalloc``...
token.trap                     ``__trap``, ``__brkpt``, ``assert``...
token.function_pointer         ``( * name ) (``, function typedefs,
                               ``decltype(&x)``, a function of the source used
                               as a value (assigned, passed, returned, braced,
                               a template argument, either side of ``?:``),
                               ``std::function``, ``virtual``, a lambda made a
                               function pointer by unary ``+``/``*``/``&``,
                               function types such as ``void(float*)``,
                               ``.*``/``->*``
token.device_launch            ``<<<``, and any name of the CUDA runtime API
                               (``cuda*``: ``cudaLaunchDevice*``,
                               ``cudaGetParameterBuffer*``,
                               ``cudaGraphLaunch``, ``cudaStream_t``...)
token.raw_string               raw string literals ``R"(...)"``
token.call                     a call to anything but a CUDA device function
                               on the allowlist (warp and block primitives,
                               atomics, math, ``__half``/``__nv_bfloat16``
                               functions, ``min``/``max``), a function or
                               lambda the source defines, or a type; compiler
                               builtins (``__builtin_*``, ``__sync_*``...)
                               anywhere; calls through a variable, a
                               parenthesised expression, a call's result, an
                               element or a braced temporary; an own function
                               or class named like a C library function of
                               the host build
token.namespace                ``std`` and any qualifier the source does not
                               declare (``std::``, ``::std::``, ``gh_emu::``),
                               ``using namespace`` of one
token.attribute                an attribute not on the allowlist, in any
                               spelling: ``alias``, ``weakref``, ``ifunc``,
                               ``constructor``, ``destructor``, ``section``,
                               ``cleanup``, ``visibility``...
token.extern                   ``extern`` other than ``extern "C"`` on the
                               kernel: ``extern char** environ``, ``extern
                               __shared__`` (no launch here gives dynamic
                               shared memory), ``extern "C"`` on a helper or
                               variable, ``extern "C++"``, ``extern template``
kernel.count                   not exactly one ``__global__`` kernel, however
                               marked (``__attribute__((..., global))``,
                               ``__annotate__(global)``...) and whatever
                               attributes stand before it, every declarator
                               of a declaration counted
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

from lib.security.scan.options import check_compile_options
from lib.security.scan.scanner import scan_source

__all__ = ["check_compile_options", "scan_source"]
