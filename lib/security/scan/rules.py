"""The data of Gate 2a: which names the scanner refuses, allows or must know.

Plain constants, no logic: the token checks (:mod:`.token_checks`), the
kernel-shape checks (:mod:`.kernel`) and the preprocessor
(:mod:`.preprocessor`) read them. Each forbidden-name table maps an
identifier to ``(check id, what it is)``; the check id is the one reported.
"""

from __future__ import annotations

import re

# The only headers a kernel may include: half and bfloat16 types, nothing that
# reaches the host or the file system.
ALLOWED_INCLUDES = frozenset({"cuda_fp16.h", "cuda_bf16.h"})

# C++ keywords: a macro may not redefine one (the source would read one way to
# the scanner and another to the compiler), a keyword is never a function's
# name, and an operator right after one (``return +[]...``) is unary.
KEYWORDS = frozenset("""
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


# Forbidden wherever the identifier appears (as a whole identifier): these
# names have no harmless use in a kernel, so even a mention is refused.
STRONG: dict[str, tuple[str, str]] = {
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
# Forbidden only when followed by a call parenthesis: these are common words
# (``read``, ``open``, ``free``) that a kernel may use as variable names.
WEAK: dict[str, tuple[str, str]] = {
    **_names("token.os_call", "host/OS call", """
        kill connect bind listen accept send recv sendto recvfrom sendmsg
        recvmsg exit _exit atexit chmod chown ioctl fcntl"""),
    **_names("token.file_io", "file I/O", """
        open openat creat read write close pread pwrite unlink remove rename
        dup dup2 pipe stat lstat fstat"""),
    **_names("token.malloc", "dynamic allocation", "free"),
}
# ``exec*`` and ``spawn*`` come in many suffixed forms (execl, _spawnvpe...);
# a pattern covers them all.
EXEC_RE = re.compile(r"_?(?:exec|spawn)(?:l|le|lp|lpe|v|ve|vp|vpe)")
# Qualifiers a declarator may carry between ``*`` and the name, or before a
# parameter type; skipped when looking for a function pointer or type.
QUALIFIERS = frozenset({"const", "volatile", "__restrict__", "__restrict", "restrict"})
# Attribute words that may stand between ``__global__`` and the kernel's name,
# each possibly with a parenthesised argument list.
ATTRIBUTE_WORDS = frozenset(
    {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "__align__",
     "__maxnreg__", "__cluster_dims__"}
)
# Built-in types: ``R(A...)`` with one of these as ``R`` spells a function type.
BUILTIN_TYPES = frozenset(
    {"void", "bool", "char", "char8_t", "char16_t", "char32_t", "wchar_t", "short",
     "int", "long", "float", "double", "signed", "unsigned"}
)
# Keywords that end an operand, so an operator after them is binary (``this +
# [...]`` is not a unary ``+`` on a lambda).
OPERAND_KEYWORDS = frozenset({"this", "true", "false", "nullptr"})
# Words followed by ``(`` that are not function calls or definitions, so they
# are never taken for a function's name.
NOT_FUNCTIONS = frozenset(
    {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
     "alignof", "static_assert"} | ATTRIBUTE_WORDS
)
