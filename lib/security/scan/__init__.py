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

The scan runs in layers, each in its own module:

==========================  ===================================================
module                      layer
==========================  ===================================================
:mod:`.lexer`               1a raw bytes (type, size, UTF-8); 1b characters
                            refused anywhere; trigraphs and line splices;
                            tokens; 1c characters outside comments and
                            literals
:mod:`.preprocessor`        2 directives, the macro table over every branch;
                            2b macro expansion, with every alternative
                            definition
:mod:`.token_checks`        3 forbidden names and constructs in each token
                            stream (as written, expanded, alternatives)
:mod:`.kernel`              3b the kernel's shape: one, named, ``extern "C"``
:mod:`.options`             4 compile options
:mod:`.rules`               the name tables the layers read (forbidden,
                            allowed, keywords)
:mod:`.scanner`             :func:`scan_source`, which runs layers 1-3b
:mod:`.report`              the collector of violations every layer writes to
==========================  ===================================================

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

from lib.security.scan.options import check_compile_options
from lib.security.scan.scanner import scan_source

__all__ = ["check_compile_options", "scan_source"]
