"""Gate 2a: the static scan of CUDA source and the compile-option allowlist."""

from __future__ import annotations

import gc
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.security.scan import check_compile_options, scan_source

SAXPY = """\
// saxpy: y = a * x + y. The kernel must never call system() or printf().
#include <cuda_fp16.h>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(256)
saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y,
      float* total) {
    __shared__ float partial[32];
    int system_load = 0;  /* a name that merely contains "system" */
    int printf_count = 0, my_free_list = 0, asm_count = 0;
    const char* note = "asm, fopen and system() are only words here";
    int i = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll 4
    for (int k = 0; k < 4; ++k) {
        system_load += k;
    }
    float v = 0.0f;
    if (i < n) {
        v = a * x[i] + y[i];
        y[i] = v;
    }
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) {
        partial[threadIdx.x >> 5] = v + system_load * 0 + printf_count
                                    + my_free_list + asm_count + (note != 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(total, partial[0]);
    }
}
"""


def kernel(body: str, name: str = "k") -> str:
    """A one-kernel source whose body is ``body``."""
    return f'extern "C" __global__ void {name}(float* y) {{\n{body}\n}}\n'


def checks(source, name: str = "k", **kw) -> tuple[str, ...]:
    return scan_source(source, name, **kw).checks


# ---- benign --------------------------------------------------------------------------


def test_realistic_saxpy_is_accepted():
    verdict = scan_source(SAXPY, "saxpy")
    assert verdict.accepted, verdict.violations
    assert verdict.gate == "gate2a"
    assert verdict.seconds > 0


def test_saxpy_as_utf8_bytes_is_accepted():
    assert scan_source(SAXPY.encode(), "saxpy").accepted


@pytest.mark.parametrize(
    "source",
    [
        kernel("int read = 0; float open = 1.0f; int close_count = read;"),
        kernel('const char* s = "fork(); exec(); __trap();"; // asm("trap;")'),
        kernel("/* π ≈ 3.14159, é in a comment */ y[0] = 3.14159f;"),
        kernel('const char* s = "naïve ünïcode";'),
        kernel("struct S { S(const S&) = delete; }; y[0] = 1.0f;"),
        '#include "cuda_bf16.h"\n' + kernel("__nv_bfloat16 b;"),
        'extern "C" {\n__global__ void k(float* y) { y[0] = 0; }\n}\n',
        'extern "C" __global__ void k(float* y);\n' + kernel("y[0] = 1;"),
        "#define BLOCK 256\n#define SQ(x) ((x) * (x))\n" + kernel("y[0]=SQ(BLOCK);"),
        "#ifdef USE_DOUBLE\n#define T double\n#else\n#define T float\n#endif\n"
        + kernel("T v = 0; y[0] = v;"),
        kernel("float m = fmaxf(y[0], 0.0f); y[1] = m < 2 ? m : 2;"),
        "%:define ONE 1\n" + kernel("y<:0:> = ONE; if (1) <% y[1] = 2; %>"),
    ],
)
def test_benign_sources_are_accepted(source):
    verdict = scan_source(source, "k")
    assert verdict.accepted, verdict.violations


# ---- layer 1: bytes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "check"),
    [
        (kernel("y[0] = 1;") + "//" + "x" * 300, "bytes.size"),
        (b"\xff\xfe" + kernel("").encode(), "bytes.utf8"),
        (kernel("y[0] = 1;\x00"), "bytes.control"),
        (kernel("y[0] = 1; /* \x1b[2J */"), "bytes.control"),
        ("// harmless \u202e }; asm(\"trap;\") //\n" + kernel(""), "bytes.bidi"),
        (kernel('const char* s = "\u2066x\u2069";'), "bytes.bidi"),
        (kernel("int sc = 0; // \u200f"), "bytes.bidi"),
        (kernel("int \u0430 = 1;"), "bytes.non_ascii"),  # Cyrillic a
        (kernel("int a\u00a0= 1;"), "bytes.non_ascii"),  # no-break space
        (kernel("int \\u0061b = 1;"), "bytes.ucn"),
        (None, "bytes.type"),
        (12345, "bytes.type"),
    ],
)
def test_byte_layer(source, check):
    assert check in checks(source, max_bytes=256)


def test_size_limit_is_in_utf8_bytes():
    source = kernel("// " + "é" * 100)  # 2 bytes each in UTF-8
    limit = len(source) + 50
    assert len(source.encode()) > limit
    assert "bytes.size" in checks(source, max_bytes=limit)
    assert "bytes.size" not in checks(source, max_bytes=len(source.encode()))


def test_ucn_spelling_asm_is_caught_twice():
    found = checks(kernel('\\u0061sm("trap;");'))
    assert "bytes.ucn" in found
    assert "token.asm" in found


# ---- layer 2: preprocessor -----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "check"),
    [
        ("??=include <stdio.h>\n" + kernel(""), "pp.include"),
        ("??=include <stdio.h>\n" + kernel(""), "pp.trigraph"),
        ("%:include <stdio.h>\n" + kernel(""), "pp.include"),
        ("#include <stdio.h>\n" + kernel(""), "pp.include"),
        ('#include "../cuda_fp16.h"\n' + kernel(""), "pp.include"),
        ("#include_next <cuda_fp16.h>\n" + kernel(""), "pp.include"),
        ("#if __has_include(<unistd.h>)\n#endif\n" + kernel(""), "pp.include"),
        ('#if __has_embed("/etc/passwd")\n#endif\n' + kernel(""), "pp.include"),
        ("/*\n*/ #include <stdio.h>\n" + kernel(""), "pp.include"),
        ("#define H <stdio.h>\n#include H\n" + kernel(""), "pp.computed_include"),
        ('#line 1 "other.cu"\n' + kernel(""), "pp.line"),
        ('# 1 "other.cu"\n' + kernel(""), "pp.line"),
        ("#pragma once\n" + kernel(""), "pp.pragma"),
        (kernel("#pragma unroll 4 system\nfor (;;) {}"), "pp.pragma"),
        ("#define BAD 4 system\n" + kernel("#pragma unroll BAD\nfor (;;) {}"),
         "pp.pragma"),
        (kernel("#pragma unroll f(4)\nfor (;;) {}"), "pp.pragma"),
        (kernel("#pragma nv_diag_suppress 177"), "pp.pragma"),
        (kernel('_Pragma("unroll") for (;;) {}'), "pp._Pragma"),
        ('#define P(x) _Pragma(#x)\nP(message("hi"))\n' + kernel(""), "pp._Pragma"),
        ('#define P _Prag##ma\nP("once")\n' + kernel(""), "pp._Pragma"),
        ("#ident \"v1\"\n" + kernel(""), "pp.directive"),
        (kernel("int a = 1; # define X 2"), "pp.stray_hash"),
        ("#define __global__\n" + kernel(""), "pp.define_reserved"),
        ("#undef extern\n" + kernel(""), "pp.define_reserved"),
        (kernel("// the end \\ \nsystem(\"ls\");"), "pp.splice_whitespace"),
    ],
)
def test_preprocessor_layer(source, check):
    assert check in checks(source)


def test_line_continuation_splits_a_call():
    verdict = scan_source('\n' + kernel('sys\\\ntem("ls");'), "k")
    assert "token.os_call" in verdict.checks
    found = [v for v in verdict.violations if v.check == "token.os_call"]
    assert found[0].line == 3  # 'sys' starts on line 3 of the file


def test_continued_line_comment_hides_nothing():
    # The splice makes the second line part of the comment, for the compiler
    # too, so the scanner must agree and accept.
    assert scan_source(kernel('// note \\\nsystem("ls");'), "k").accepted
    assert "token.os_call" in checks(kernel('// note\nsystem("ls");'))


def test_trigraph_backslash_continues_a_comment_and_is_refused():
    found = checks(kernel('// note ??/\nsystem("ls");'))
    assert found == ("pp.trigraph",)


@pytest.mark.parametrize(
    ("source", "check"),
    [
        ('#define S sys##tem\n' + kernel('S("ls");'), "token.os_call"),
        ('#define CALL(f) f("x")\n' + kernel("CALL(read);"), "token.file_io"),
        ('#define X asm\n' + kernel('X("trap;");'), "token.asm"),
        ("#define J(a, b) a##b\n" + kernel('J(po, pen)("ls", "r");'), "token.os_call"),
        ("#define L <<\n" + kernel("k L<1, 1>>>(y);"), "token.device_launch"),
        ("#define F(x) x\n#define G F(pri##ntf)\n" + kernel('G("x");'),
         "token.printf"),
    ],
)
def test_macros_cannot_smuggle_a_token(source, check):
    found = checks(source)
    assert check in found
    assert "pp.macro_hides_forbidden" in found


def test_include_inside_a_dead_branch_is_refused():
    source = "#if 0\n#include <stdlib.h>\n#endif\n" + kernel("")
    assert checks(source) == ("pp.include",)


def test_pasting_through_an_indirection_is_caught():
    source = (
        "#define CAT(a, b) a##b\n#define XCAT(a, b) CAT(a, b)\n#define S sys\n"
        + kernel('XCAT(S, tem)("ls");')
    )
    assert "token.os_call" in checks(source)


def test_pasting_with_an_empty_argument_is_caught():
    source = "#define C(a, b, c) a##b##c\n" + kernel('C(sys, , tem)("ls");')
    assert "token.os_call" in checks(source)


def test_every_branch_of_a_conditional_is_scanned():
    source = "#if 0\n#else\n" + kernel('asm("trap;");') + "#endif\n"
    assert "token.asm" in checks(source)
    source = "#if 1\n" + kernel("") + "#else\nvoid f() { system(\"ls\"); }\n#endif\n"
    assert "token.os_call" in checks(source)


TEM = '__device__ int tem(const char* s) { return s[0]; }\n'


@pytest.mark.parametrize("order", ["device first", "host first"])
def test_each_configuration_expands_its_own_definition(order):
    # NVRTC defines __CUDA_ARCH__, the host build does not: each reads one
    # definition, and the pasting one is refused whichever comes first.
    pasting, plain = "#define F(x) sys##x\n", "#define F(x) x\n"
    first, second = (pasting, plain) if order == "device first" else (plain, pasting)
    source = (f"#ifdef __CUDA_ARCH__\n{first}#else\n{second}#endif\n"
              + TEM + kernel('F(tem)("ls");'))
    verdict = scan_source(source, "k")
    assert verdict.checks == ("token.os_call", "pp.macro_hides_forbidden")
    where = "NVRTC sm_75" if order == "device first" else "host build"
    assert all(where in v.message for v in verdict.violations)


def test_a_branch_no_compiler_takes_defines_nothing():
    # A is defined by no compiler (no -D option names it): F is 'x', as the
    # compiler reads it, and the pasting definition is never used.
    source = ("#ifdef A\n#define F(x) sys##x\n#else\n#define F(x) x\n#endif\n"
              + TEM + kernel('F(tem)("ls");'))
    assert scan_source(source, "k").accepted
    # Unless the compile options define A.
    found = scan_source(source, "k", options=["-arch=sm_80", "-DA=1"]).checks
    assert "token.os_call" in found


def test_undef_is_honoured_where_its_branch_is_taken():
    defined = "#define P(x) x(0)\n"
    assert "token.file_io" in checks(defined + kernel("P(read);"))
    # Undefined: 'P(read)' is a call of an unknown P, and read is not called.
    assert checks(defined + "#undef P\n" + kernel("P(read);")) == ("token.call",)
    never = defined + "#ifdef A\n#undef P\n#endif\n" + kernel("P(read);")
    assert "token.file_io" in checks(never)
    device_only = defined + "#ifdef __CUDACC__\n#undef P\n#endif\n"
    verdict = scan_source(device_only + kernel("P(read);"), "k")
    io = [v for v in verdict.violations if v.check == "token.file_io"]
    assert io and all(v.message.endswith("[host build]") for v in io)


def test_macro_bomb_is_refused_quickly():
    levels = "ABCDEFGHIJ"
    pairs = zip(levels[:-1], levels[1:], strict=True)
    defs = "".join(f"#define {a} {b} {b} {b} {b}\n" for a, b in pairs)
    source = defs + kernel("A A A A A A A A")
    verdict, seconds = _scan_seconds(source)
    assert "pp.expansion_limit" in verdict.checks
    assert seconds < 2.0


# ---- layer 3: tokens -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ('asm("trap;");', "token.asm"),
        ('asm volatile("membar.gl;");', "token.asm"),
        ('__asm__("exit;");', "token.asm"),
        ('system("ls");', "token.os_call"),
        ('popen("ls", "r");', "token.os_call"),
        ('execve("/bin/sh", 0, 0);', "token.os_call"),
        ('execlp("sh", "sh", 0);', "token.os_call"),
        ("fork();", "token.os_call"),
        ("posix_spawn(0, 0, 0, 0, 0, 0);", "token.os_call"),
        ("kill(1, 9);", "token.os_call"),
        ("socket(2, 1, 0);", "token.os_call"),
        ("connect(3, 0, 0);", "token.os_call"),
        ('dlopen("libc.so", 1);', "token.os_call"),
        ("dlsym(0, 0);", "token.os_call"),
        ("mmap(0, 4096, 3, 34, -1, 0);", "token.os_call"),
        ('getenv("HOME");', "token.os_call"),
        ('fopen("/etc/passwd", "r");', "token.file_io"),
        ("fread(y, 4, 1, 0);", "token.file_io"),
        ("fwrite(y, 4, 1, 0);", "token.file_io"),
        ('fprintf(0, "x");', "token.file_io"),
        ('fputs("x", 0);', "token.file_io"),
        ('open("/etc/passwd", 0);', "token.file_io"),
        ("read(0, y, 4);", "token.file_io"),
        ("write(1, y, 4);", "token.file_io"),
        ("close(0);", "token.file_io"),
        ('printf("%f", y[0]);', "token.printf"),
        ("float* p = (float*)malloc(64);", "token.malloc"),
        ("free(y);", "token.malloc"),
        ("float* p = new float[4];", "token.malloc"),
        ("delete y;", "token.malloc"),
        ("__trap();", "token.trap"),
        ("assert(y != 0);", "token.trap"),
        ("__brkpt();", "token.trap"),
        ("float (*f)(float) = 0;", "token.function_pointer"),
        ("typedef float (*unary)(float);", "token.function_pointer"),
        ("using unary = float(float);", "token.function_pointer"),
        ("nvstd::function<float(float)> f;", "token.function_pointer"),
        ("k<<<1, 1>>>(y);", "token.device_launch"),
        ("cudaLaunchKernel(0, 0, 0, 0, 0, 0);", "token.device_launch"),
        ("cudaLaunchDevice(0, 0, 0, 0, 0);", "token.device_launch"),
        ("cudaGraphLaunch(0, 0);", "token.device_launch"),
        ('const char* s = R"(raw)";', "token.raw_string"),
    ],
)
def test_token_layer(body, check):
    assert check in checks(kernel(body))


def test_function_addresses_are_refused():
    helper = "__device__ float sq(float x) { return x * x; }\n"
    assert "token.function_pointer" in checks(helper + kernel("auto p = &sq;"))
    assert "token.function_pointer" in checks(
        helper + kernel("decltype(&sq) p = 0;")
    )
    assert scan_source(helper + kernel("y[0] = sq(y[1]);"), "k").accepted


LAMBDA = "[](float* q) { q[0] = 1.0f; }"


@pytest.mark.parametrize(
    ("body", "head"),
    [
        (f"auto p = +{LAMBDA};\np(y);", ""),
        (f"auto& p = *{LAMBDA};\np(y);", ""),
        (f"(+{LAMBDA})(y);", ""),
        (f"auto g = [] {{ return +{LAMBDA}; }};\ng()(y);", ""),
        (f"auto p = true ? +{LAMBDA} : nullptr;\np(y);", ""),
        ("auto p = +<:](float* q) { q[0] = 1.0f; };\np(y);", ""),
        (f"auto p = POS{LAMBDA};\np(y);", "#define POS +\n"),
        (f"auto p = static_cast<void(*)(float*)>({LAMBDA});\np(y);", ""),
        (f"void (*p)(float*) = {LAMBDA};\np(y);", ""),
        (f"P<void(float*)>::type p = {LAMBDA};\np(y);",
         "template <class T> struct P { using type = T*; };\n"),
        ("P<void()>::type p = [] {};\np();",
         "template <class T> struct P { using type = T*; };\n"),
        ("S s;\nauto m = &S::f;\n(s.*m)(y);",
         "struct S { __device__ void f(float* y) { y[0] = 1; } };\n"),
    ],
)
def test_lambdas_made_function_pointers_are_refused(body, head):
    assert "token.function_pointer" in checks(head + kernel(body))


@pytest.mark.parametrize(
    "body",
    [
        "int i = threadIdx.x; float a = 2.0f, b[4] = {};\n"
        "y[i] = a + b[i] * b[+i] - b[-i] + (a) * b[i & 3] + float(i & 1);",
        "auto f = [&](int i) { return y[i] * 2.0f; };\n"
        "y[0] = f(0) + [](float v) { return v; }(1.0f);",
        "int* [[maybe_unused]] p = 0;\n[[maybe_unused]] int q = 0;",
        "const float& r = y[0]; float s = *&r; y[1] = s * float(int(s));",
        "int (r) = 1; (void)r; long long z = (long long)(r); y[0] = float(z);",
        "struct W { __device__ operator float() const { return 1.0f; } };\n"
        "y[0] = float(W());",
    ],
)
def test_lambdas_and_operators_that_make_no_pointer_pass(body):
    verdict = scan_source(kernel(body), "k")
    assert verdict.accepted, verdict.violations


def test_virtual_dispatch_is_refused():
    source = "struct B { virtual float f(); };\n" + kernel("")
    assert "token.function_pointer" in checks(source)


# ---- layer 3b: the kernel ------------------------------------------------------------


def test_two_kernels():
    assert "kernel.count" in checks(kernel("") + kernel("", name="k2"))


def test_no_kernel():
    assert "kernel.count" in checks("__device__ float f(float x) { return x; }\n")


def test_wrong_kernel_name():
    found = checks(kernel("", name="other"))
    assert found == ("kernel.name",)


def test_kernel_without_extern_c():
    assert checks("__global__ void k(float* y) {}\n") == ("kernel.extern_c",)


def test_kernel_hidden_behind_an_attribute_is_counted():
    source = kernel("") + "__attribute__((global)) void k3(float* y) {}\n"
    assert "kernel.count" in checks(source)


def test_kernel_defined_through_a_macro_is_counted():
    source = '#define K(n) extern "C" __global__ void n(float* y) {}\nK(k)\nK(k2)\n'
    assert "kernel.count" in checks(source)


def test_invalid_kernel_name_argument():
    assert "kernel.name" in checks(kernel(""), name="k; system")
    assert "kernel.name" in checks(kernel(""), name=None)


# ---- all at once ---------------------------------------------------------------------


def test_every_violated_check_is_listed_with_its_line():
    source = (
        "#include <stdio.h>\n"  # line 1
        + kernel('asm("trap;");\nprintf("x");', name="other")  # lines 2-5
    )
    verdict = scan_source(source, "k")
    assert set(verdict.checks) == {
        "pp.include", "token.asm", "token.printf", "kernel.name",
    }
    lines = {v.check: v.line for v in verdict.violations}
    assert lines == {
        "pp.include": 1, "token.asm": 3, "token.printf": 4, "kernel.name": 2,
    }


def test_violations_per_check_are_capped():
    verdict = scan_source(kernel('asm("x");\n' * 100), "k")
    asm = [v for v in verdict.violations if v.check == "token.asm"]
    assert len(asm) == 21  # 20 listed, one summary
    assert "80 more" in asm[-1].message


# ---- robustness and speed ------------------------------------------------------------


def _scan_seconds(source, name: str = "k"):
    """The scanner's own cost: the least CPU time of this thread over three
    scans with the garbage collector paused, so that neither the scheduler nor
    a collection of other tests' garbage is charged to it. Returns
    ``(verdict, seconds)``."""
    best = math.inf
    gc.disable()
    try:
        for _ in range(3):
            start = time.thread_time()
            verdict = scan_source(source, name)
            best = min(best, time.thread_time() - start)
    finally:
        gc.enable()
    return verdict, best


def _bound_seconds(source) -> float:
    size = len(source.encode("utf-8", "replace") if isinstance(source, str)
               else source)
    return 0.050 * size / 1024 + 0.050


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=4096))
def test_any_text_never_raises_and_is_fast(text):
    verdict, elapsed = _scan_seconds(text)
    assert verdict.gate == "gate2a"
    assert "scan.internal" not in verdict.checks
    assert elapsed < _bound_seconds(text)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_any_bytes_never_raise_and_are_fast(data):
    verdict, elapsed = _scan_seconds(data)
    assert "scan.internal" not in verdict.checks
    assert elapsed < _bound_seconds(data)


_C_PIECES = st.sampled_from([
    "#", "##", "%:", "??=", "??/", "\\", "\n", " ", "(", ")", ",", "<", "<<", ">",
    "*", "&", "{", "}", ";", '"', "'", "/*", "*/", "//", "define", "undef",
    "include", "if", "else", "endif", "pragma", "unroll", "F", "G", "x",
    "sys", "tem", "asm", "R", "u8", "extern", '"C"', "__global__", "void", "k",
    "1", "0x1f", "...", "__VA_ARGS__", "typedef", "using", "=", "\\u0061",
])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_C_PIECES, max_size=400))
def test_c_like_noise_never_raises_and_is_fast(pieces):
    text = " ".join(pieces)
    verdict, elapsed = _scan_seconds(text)
    assert "scan.internal" not in verdict.checks
    assert elapsed < _bound_seconds(text)


@pytest.mark.parametrize(
    "source",
    [
        "(" * 60_000,
        "a(" * 30_000,
        "(*x[" * 15_000,
        "/*" * 30_000,
        '"' * 60_000,
        'R"x(' * 15_000,
        "#define F(x) x\n" + "F(" * 20_000 + ")" * 20_000,
        "\u202e" * 20_000,
    ],
    ids=["parens", "calls", "fp", "comments", "quotes", "raw", "nesting", "bidi"],
)
def test_pathological_sources_scan_in_linear_time(source):
    verdict, seconds = _scan_seconds(source)
    assert not verdict.accepted
    assert seconds < _bound_seconds(source)


def test_64_kib_source_scan_time():
    body = "".join(
        f"// helper {i}: never call system() here\n"
        f"__device__ float helper_{i}(float v) {{\n"
        "#pragma unroll\n"
        "    for (int o = 16; o > 0; o >>= 1) "
        "v += __shfl_down_sync(0xffffffffu, v, o);\n"
        f"    return v * {i}.0f; /* comment */\n}}\n"
        for i in range(600)
    )
    source = "#include <cuda_fp16.h>\n" + body[: 64 * 1024 - 200]
    source = source[: source.rfind("}\n") + 2] + kernel("y[0] = helper_1(1.0f);")
    assert 60 * 1024 < len(source) <= 64 * 1024
    scan_source(source, "k")  # warm up
    best = min(scan_source(source, "k").seconds for _ in range(3))
    print(f"64 KiB scan: {best * 1000:.1f} ms")
    assert scan_source(source, "k").accepted
    assert best < 0.5  # target is under 0.1 s; generous for a loaded machine


# ---- layer 4: compile options --------------------------------------------------------


def test_allowed_options_are_accepted():
    options = [
        "-arch=sm_80", "--gpu-architecture=compute_90", "--gpu-architecture=sm_75",
        "-arch=sm_120", "-std=c++17", "--std=c++17", "-O3", "-O2",
        "--use_fast_math", "-use_fast_math", "-lineinfo", "-DBLOCK=256",
        "-DT=__half", "-DACC=float", "-DN_ITEMS=-1", "-DMASK=0xff",
        "-DT2=__nv_bfloat16", "-DT3=double", "--fmad=true", "--fmad=false",
    ]
    verdict = check_compile_options(options)
    assert verdict.accepted, verdict.violations
    assert verdict.gate == "gate2a"


@pytest.mark.parametrize(
    ("option", "check"),
    [
        ("-I/etc", "options.flag"),
        ("--include-path=/etc", "options.flag"),
        ("-include", "options.flag"),
        ("--pre-include=/etc/passwd", "options.flag"),
        ("-Xcompiler", "options.flag"),
        ("-ccbin=/tmp/evil", "options.flag"),
        ("-O3 -I/etc", "options.flag"),
        ("-arch=sm_70", "options.arch"),
        ("-arch=sm_121", "options.arch"),
        ("-arch=sm_90a", "options.flag"),
        ("-DX=system", "options.define"),
        ("-Dlower=1", "options.define"),
        ("-D_X=1", "options.define"),
        ("-DX", "options.define"),
        ("-D", "options.define"),
        ("-DX=1;rm", "options.define"),
        ('-DX="a"', "options.define"),
    ],
)
def test_refused_options_name_the_option(option, check):
    verdict = check_compile_options(["-O3", option])
    assert verdict.checks == (check,)
    assert option[:20] in verdict.violations[0].message


@pytest.mark.parametrize("options", ["-O3", None, 3, ["-O3", None], [b"-O3"]])
def test_options_of_the_wrong_type(options):
    assert "options.type" in check_compile_options(options).checks


# ---- layer 2: each compiler's reading of the conditionals -----------------------
#
# Each case: an id, the payload, and the check that must catch it. The second
# kernel 'k2' is hidden from a reader that decides a conditional wrongly.

K2 = 'extern "C" __global__ void k2(float* y) { y[0] = 2.0f; }'
HELPER = "__device__ void helper(float* p) { p[0] = 0.0f; }\n"
HIDE_IF = "#define HIDE(x) x\n#if {cond}\n#define HIDE(x)\n#endif\nHIDE(" + K2 + ")\n"
KEEP_IF = ("#if {cond}\n#define KEEP(x)\n#else\n#define KEEP(x) x\n#endif\nKEEP("
           + K2 + ")\n")


def _hidden(template: str, cond: str) -> str:
    return template.replace("{cond}", cond) + kernel("y[0] = 1.0f;")


CONDITIONAL_ATTACKS = [
    ("dead_define", _hidden(HIDE_IF, "0"), "kernel.count"),
    ("dead_undef", "#define H(x) x\n#ifdef NEVER_SET\n#undef H\n#define H(x)\n"
     "#endif\nH(" + K2 + ")\n" + kernel("y[0] = 1;"), "kernel.count"),
    ("gnuc_not_nvrtc", _hidden(KEEP_IF, "defined(__GNUC__)"), "kernel.count"),
    ("clang_not_nvrtc", _hidden(KEEP_IF, "defined(__clang__)"), "kernel.count"),
    ("x86_linux_not_nvrtc",
     _hidden(KEEP_IF, "defined(__x86_64__) || defined(__linux__)"), "kernel.count"),
    ("unsigned_compare", _hidden(HIDE_IF, "-1 < 0u"), "kernel.count"),
    ("comment_continues_if", _hidden(HIDE_IF, "1 /* a remark\n*/ && 0"),
     "kernel.count"),
    ("splice_continues_if", _hidden(HIDE_IF, "1 \\\n&& 0"), "kernel.count"),
    ("crlf", _hidden(HIDE_IF, "0").replace("\n", "\r\n"), "kernel.count"),
    ("comment_in_define", "#define KEEP(x) /* spans\n*/ x\nKEEP(" + K2 + ")\n"
     + kernel("y[0] = 1;"), "kernel.count"),
    ("dead_define_hides_helper", "#define DEF(x) x\n#if 0\n#define DEF(x)\n#endif\n"
     "DEF(" + HELPER.strip() + ")\n" + kernel("auto f = helper;\nf(y);"),
     "token.function_pointer"),
    ("sm89_only", "#if __CUDA_ARCH__ == 890\n#define PICK(a, b) a##b\n#else\n"
     "#define PICK(a, b) b\n#endif\n" + TEM + kernel('PICK(sys, tem)("id");'),
     "token.os_call"),
    ("sm75_elif", "#if __CUDA_ARCH__ >= 800\n#define PICK(a, b) b\n#elif "
     "__CUDA_ARCH__ >= 750\n#define PICK(a, b) a##b\n#else\n#define PICK(a, b) b\n"
     "#endif\n" + TEM + kernel('PICK(po, pen)("id", "r");'), "token.os_call"),
    ("host_build_only", "#ifndef __CUDA_ARCH__\n#define GO(a, b) a##b\n#else\n"
     "#define GO(a, b) b\n#endif\n" + TEM + kernel('GO(sys, tem)("id");'),
     "token.os_call"),
    ("rtc_twice", "#ifdef __CUDACC_RTC__\n#define GO(a, b) a##b\n#else\n"
     "#define GO(a, b) b\n#endif\n#ifndef __CUDACC_RTC__\n#undef GO\n"
     "#define GO(a, b) b\n#endif\n" + TEM + kernel('GO(po, pen)("id", "r");'),
     "token.os_call"),
    ("defined_made_by_macro", "#define D defined(__CUDACC__)\n"
     + _hidden(HIDE_IF, "D"), "kernel.count"),
    ("unknown_reserved_name", _hidden(HIDE_IF, "defined(__NV_SOMETHING__)"),
     "kernel.count"),
    ("version_minor", _hidden(HIDE_IF, "__CUDACC_VER_MINOR__ >= 4"), "kernel.count"),
    ("has_attribute", _hidden(HIDE_IF, "__has_attribute(noinline)"), "kernel.count"),
    ("unbalanced", "#if 1\n" + kernel("y[0] = 1;"), "pp.conditional"),
    ("else_twice", "#if 1\n#else\n#else\n#endif\n" + kernel("y[0] = 1;"),
     "pp.conditional"),
    ("too_many_configurations", "".join(
        f"#ifdef __UNKNOWN_{i}__\n#define M{i} 1\n#endif\n" for i in range(12))
     + kernel("y[0] = 1;"), "pp.conditional"),
]


@pytest.mark.parametrize(("source", "check"),
                         [c[1:] for c in CONDITIONAL_ATTACKS],
                         ids=[c[0] for c in CONDITIONAL_ATTACKS])
def test_conditionals_are_decided_as_each_compiler_does(source, check):
    assert check in checks(source)


CONDITIONAL_BENIGN = [
    ("dead_define_unused", "#if 0\n#define NOTE(x) x\n#endif\n"
     + kernel("y[0] = 1.0f;")),
    ("device_and_host_paths", "#ifdef __CUDA_ARCH__\n#define LOAD(p) __ldg(p)\n"
     "#else\n#define LOAD(p) (*(p))\n#endif\n" + kernel("y[0] = LOAD(y + 1);")),
    ("arch_versions", "#if __CUDA_ARCH__ >= 800\n#define FAST 1\n#else\n"
     "#define FAST 0\n#endif\n#if defined(__CUDACC__) && !defined(__GNUC__)\n"
     "#define RT 1\n#else\n#define RT 0\n#endif\n" + kernel("y[0] = FAST + RT;")),
    ("gnu_restrict", "#if defined(__GNUC__) || defined(__clang__)\n"
     "#define RESTRICT __restrict__\n#else\n#define RESTRICT __restrict__\n"
     "#endif\n" + kernel("float* RESTRICT p = y; p[0] = 1;")),
    ("arch_dependent_code", kernel(
        "#if __CUDA_ARCH__ >= 800\n"
        "y[0] = __half2float(__hmax(__float2half(1.0f), __float2half(2.0f)));\n"
        "#else\ny[0] = 2.0f;\n#endif")),
    ("arch_in_code", kernel("y[0] = __CUDA_ARCH__ / 10;")),
    ("version_checks", "#if __CUDACC_VER_MAJOR__ >= 12 && __CUDACC_VER_MINOR__ >= 2"
     "\n#define NEW 1\n#else\n#define NEW 0\n#endif\n" + kernel("y[0] = NEW;")),
    ("has_builtin_probe", "#if defined(__has_builtin)\n#define X 1\n#else\n"
     "#define X 0\n#endif\n" + kernel("y[0] = X;")),
    ("tunable_default", "#ifndef TILE\n#define TILE 16\n#endif\n"
     + kernel("float t[TILE]; t[0] = 0; y[0] = t[0];")),
    ("crlf_conditionals", ("#ifdef __CUDACC__\n#define ONE 1\n#else\n#define ONE 1\n"
                           "#endif\n" + kernel("y[0] = ONE;")).replace("\n", "\r\n")),
]


@pytest.mark.parametrize("source", [c[1] for c in CONDITIONAL_BENIGN],
                         ids=[c[0] for c in CONDITIONAL_BENIGN])
def test_conditional_code_that_compiles_cleanly_is_accepted(source):
    verdict = scan_source(source, "k")
    assert verdict.accepted, verdict.violations


def test_a_finding_names_the_configurations_that_make_it():
    source = ("#if __CUDA_ARCH__ == 890\n#define PICK(a, b) a##b\n#else\n"
              "#define PICK(a, b) b\n#endif\n" + TEM + kernel('PICK(sys, tem)("id");'))
    found = [v for v in scan_source(source, "k").violations
             if v.check == "token.os_call"]
    assert found and all(v.message.endswith("[NVRTC sm_89]") for v in found)


def test_compile_options_decide_conditionals_and_add_architectures():
    source = ("#ifndef TILE\n#define TILE 16\n#endif\n#if TILE > 16\n"
              "#define GO(a, b) a##b\n#else\n#define GO(a, b) b\n#endif\n"
              + TEM + kernel('GO(sys, tem)("id");'))
    assert scan_source(source, "k").accepted
    assert scan_source(source, "k", options=["-DTILE=8"]).accepted
    assert "token.os_call" in scan_source(source, "k", options=["-DTILE=32"]).checks
    arch = ("#if __CUDA_ARCH__ == 1200\n#define GO(a, b) a##b\n#else\n"
            "#define GO(a, b) b\n#endif\n" + TEM + kernel('GO(sys, tem)("id");'))
    assert scan_source(arch, "k").accepted
    assert "token.os_call" in scan_source(arch, "k", options=["-arch=sm_120"]).checks


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("-1 < 0u", False), ("0x10 == 16 && 020 == 16 && 0b11 == 3", True),
        ("1'000 == 1000", True), ("'A' == 65", True), ("1 || 1 / 0", True),
        ("0 && 1 / 0", False), ("-7 / 2 == -3 && -7 % 2 == -1", True),
        ("1 ? 2 : 0", True), ("(0, 1)", True), ("true && not false", True),
        ("18446744073709551615 == -1", True), ("~0u == 18446744073709551615u", True),
        ("1 / 0", None), ("__UNKNOWN__ > 1", None), ("0 && __UNKNOWN__", False),
        ("__UNKNOWN__ || 1", True), ("1 +", None), ("((1)", None),
        ("1.5 > 1", None),
    ],
)
def test_if_arithmetic_is_the_preprocessors(expression, value):
    from lib.security.scan.conditions import evaluate
    from lib.security.scan.lexer import lex

    def ident(name):
        return None if name == "__UNKNOWN__" else (0, False)

    assert evaluate(lex(expression), ident) is value


# ---- layer 3c: what a kernel may call, qualify, attribute and declare extern ------

CALL_ATTACKS = [
    ("builtin", kernel("y[0] = (float)(long)__builtin_frame_address(0);"),
     "token.call"),
    ("builtin_expect", kernel("if (__builtin_expect(y[0] > 0, 1)) y[0] = 1;"),
     "token.call"),
    ("builtin_pasted", "#define B(x) __built##in_##x\n"
     + kernel("y[0] = (float)(long)B(frame_address)(0);"), "token.call"),
    ("sync_builtin", kernel("__sync_fetch_and_add((int*)y, 1);"), "token.call"),
    ("std_ofstream", kernel('std::basic_ofstream<char> f("/tmp/x");'),
     "token.namespace"),
    ("global_std", kernel('::std::rename("/tmp/a", "/tmp/b");'), "token.namespace"),
    ("std_alias", "namespace s = std;\n" + kernel('s::quick_exit(0);'),
     "token.namespace"),
    ("using_namespace", "using namespace std;\n" + kernel("y[0] = 1;"),
     "token.namespace"),
    ("undeclared_namespace", kernel('gh_emu::fail("x");'), "token.namespace"),
    ("quick_exit", kernel("quick_exit(0);"), "token.call"),
    ("raise", kernel("raise(9);"), "token.call"),
    ("undefined_prototype", "int truncate(const char*, long);\n"
     + kernel('truncate("/tmp/x", 0);'), "token.call"),
    ("parenthesised_name", kernel('(quick_exit)(0);'), "token.call"),
    ("through_variable", kernel("auto p = quick_exit;\np(0);"), "token.call"),
    ("through_result", "__device__ void (*get())(int);\n" + kernel("get()(0);"),
     "token.call"),
    ("through_element", kernel("fns[0](y);"), "token.call"),
    ("through_braced", "template <class F> __device__ void go() { F{abort}(); }\n"
     + kernel("y[0] = 1;"), "token.call"),
    ("through_member", "template <class F> struct H { F f; };\n"
     + kernel('H<decltype(quick_exit)*> h{quick_exit};\nh.f(0);'), "token.call"),
    ("through_template_parameter",
     "template <class F> __device__ void run(F f) { f(0); }\n"
     + kernel("run(quick_exit);"), "token.call"),
    ("empty_macro_before_call", kernel("CUDARTAPI quick_exit(0);"), "token.call"),
    ("bitwise_not_of_call", kernel("y[0] = ~quick_exit(0);"), "token.call"),
    ("unknown_template_call", kernel("y[0] = convert<float>(y[1]);"), "token.call"),
    ("own_function_named_like_libc",
     "__device__ int atoi(const void* p) { return 0; }\n"
     + kernel('y[0] = atoi("12");'), "token.call"),
    ("own_class_named_like_libc",
     "struct getline { __device__ getline(const char*) {} };\n"
     + kernel('getline("x");'), "token.call"),
    ("attribute_constructor", "__attribute__((constructor)) __device__ void init() {}\n"
     + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_destructor", "__attribute__((destructor)) __device__ void fini() {}\n"
     + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_alias", '__device__ int sys(const char*) '
     '__attribute__((alias("system")));\n' + kernel("y[0] = 1;"),
     "token.attribute"),
    ("attribute_weakref", 'static __device__ int s(const char*) '
     '__attribute__((weakref("popen")));\n' + kernel("y[0] = 1;"),
     "token.attribute"),
    ("attribute_ifunc", '__device__ int f() __attribute__((ifunc("resolve")));\n'
     + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_section", '__attribute__((section(".init_array"))) __device__ '
     "int x = 1;\n" + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_cleanup", HELPER + kernel("__attribute__((cleanup(helper))) "
                                          "float v = 0;"), "token.attribute"),
    ("attribute_visibility", '__attribute__((visibility("default"))) __device__ '
     "int x;\n" + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_cpp11", "[[gnu::constructor]] __device__ void init() {}\n"
     + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_using_prefix", "[[using gnu: constructor]] __device__ void i() {}\n"
     + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_short_spelling", "__attribute((constructor)) __device__ void i() {}\n"
     + kernel("y[0] = 1;"), "token.attribute"),
    ("attribute_by_macro", "#define CTOR __attribute__((constructor))\n"
     "CTOR __device__ void i() {}\n" + kernel("y[0] = 1;"), "token.attribute"),
    ("extern_environ", "extern char** environ;\n" + kernel("y[0] = environ != 0;"),
     "token.extern"),
    ("extern_c_variable", 'extern "C" { __device__ char** envp; }\n'
     + kernel("y[0] = 1;"), "token.extern"),
    ("extern_c_function", 'extern "C" __device__ int getpid() { return 0; }\n'
     + kernel("y[0] = 1;"), "token.extern"),
    ("extern_shared", kernel("extern __shared__ float dyn[];\ny[0] = dyn[0];"),
     "token.extern"),
    ("extern_cpp", 'extern "C++" __device__ int f();\n' + kernel("y[0] = 1;"),
     "token.extern"),
    ("extern_template", "template <class T> struct S {};\n"
     "extern template struct S<int>;\n" + kernel("y[0] = 1;"), "token.extern"),
    ("extern_by_macro", "#define EXT extern\nEXT __device__ int x;\n"
     + kernel("y[0] = 1;"), "token.extern"),
    ("printf_refused", kernel('printf("%f", y[0]);'), "token.printf"),
    ("asm_refused", kernel('asm("exit;");'), "token.asm"),
]


@pytest.mark.parametrize(("source", "check"), [c[1:] for c in CALL_ATTACKS],
                         ids=[c[0] for c in CALL_ATTACKS])
def test_only_allowed_calls_names_and_attributes_pass(source, check):
    assert check in checks(source)


INTRINSICS = """
    unsigned m = __activemask();
    float v = __ldg(y) + __shfl_xor_sync(0xffffffffu, y[1], 1)
              + __shfl_down_sync(m, y[2], 2) + __shfl_sync(m, y[3], 0);
    v = fmaxf(sqrtf(v), expf(-v)) + __fmaf_rn(v, 2.0f, 1.0f) + __expf(v)
        + rsqrtf(v) + fminf(v, 1.0f) + tanhf(v) + __fdividef(v, 3.0f);
    __half h = __float2half(v);
    h = __hadd(h, __float2half_rn(1.0f));
    v += __half2float(h) + __half2float(__hmul(h, h));
    __half2 h2 = __floats2half2_rn(v, v);
    v += __low2float(h2) + __high2float(__hmul2(h2, h2));
    __nv_bfloat16 b = __float2bfloat16(v);
    v += __bfloat162float(b) + __bfloat162float(__hadd(b, b));
    atomicAdd(y, v); atomicMax((int*)y, 3); atomicCAS((unsigned int*)y, 0u, 1u);
    atomicExch(y + 1, 0.0f); atomicAdd_block(y + 2, 1.0f);
    int c = __popc(m) + __clz(m) + __ffs(m) + min(3, 4) + max(1, 2)
            + __ballot_sync(m, v > 0) + __any_sync(m, 1);
    __syncthreads(); __syncwarp(); __threadfence();
    y[0] = v + c + __int_as_float(__float_as_int(v)) + __saturatef(v);
    double d = sqrt((double)v) + fma(1.0, 2.0, 3.0) + __dadd_rn(1.0, 2.0);
    y[1] = (float)d + static_cast<float>(c) + float(c) + __uint2float_rn(m);
    float4 q = make_float4(v, v, v, v);
    y[2] = q.x + (float)clock64() * 0.0f;"""

OWN_CODE = """struct Acc {
    float s;
    __device__ Acc(float v) : s(v) {}
    __device__ float get() const { return s; }
};
template <typename T> __device__ __forceinline__ T twice(T v) { return v + v; }
__device__ float helper(float v) noexcept { return v * 2.0f; }
__device__ auto trailing(float v) -> float { return v; }
struct Pair { float a, b; };
typedef struct { int n; } Info;
using Real = float;
enum class Mode { Fast, Slow };
template <int N> struct Tile { static constexpr int size = N; };
"""

CALL_BENIGN = [
    ("intrinsics", "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
     + kernel(INTRINSICS)),
    ("own_code", OWN_CODE + kernel(
        "Acc a(1.0f);\nAcc b = Acc(2.0f);\nPair p{1.0f, 2.0f};\nInfo info{3};\n"
        "auto sq = [](float v) { return v * v; };\n"
        "auto add = [&](int i) { return y[i] + 1.0f; };\nMode m = Mode::Fast;\n"
        "y[0] = a.get() + b.get() + twice<float>(p.a) + twice(p.b) + helper(1.0f)\n"
        "     + trailing(2.0f) + sq(3.0f) + add(0) + Real(info.n)\n"
        "     + [](float v) { return v; }(1.0f) + (m == Mode::Fast)\n"
        "     + Tile<4>::size + sizeof(Tile<2>);\n"
        "y[1] = (float)(int)(y[2]) + reinterpret_cast<float*>(y)[0] + (Real)(1);\n"
        "if (y[0] < y[1] && y[1] > (y[2])) y[3] = 0;")),
    ("attributes", "struct __align__(16) V { float x[4]; };\n"
     "struct alignas(16) W { float x[4]; };\n"
     "__device__ __noinline__ float slow(float v) { return v; }\n"
     "__device__ __attribute__((noinline)) float fast(float v) { return v; }\n"
     "[[nodiscard]] __device__ inline float keep(float v) { return v; }\n"
     'extern "C" __global__ void __launch_bounds__(256, 2) k(float* __restrict__ y) {\n'
     "    [[maybe_unused]] int unused = 0;\n"
     "    __attribute__((aligned(16))) float buf[4] = {};\n"
     "    y[0] = slow(1.0f) + fast(buf[0]) + keep(2.0f);\n"
     "    if (y[0] > 0) [[likely]] { y[1] = 0; }\n}\n"),
    ("extern_c_block", 'extern "C" {\n__global__ void k(float* y) { y[0] = 0; }\n}\n'),
    ("extern_c_prototype", 'extern "C" __global__ void k(float* y);\n'
     + kernel("y[0] = 1;")),
]


@pytest.mark.parametrize("source", [c[1] for c in CALL_BENIGN],
                         ids=[c[0] for c in CALL_BENIGN])
def test_cuda_intrinsics_and_the_sources_own_code_pass(source):
    verdict = scan_source(source, "k")
    assert verdict.accepted, verdict.violations


# ---- layer 3: function pointers, kernels and launches in every spelling ----------

POINTER_ATTACKS = [
    ("trailing_return_type", HELPER + "__device__ auto get() -> void(*)(float*) "
     "{ return helper; }\n" + kernel("get()(y);"), "token.function_pointer"),
    ("noexcept_definition", "__device__ void helper(float* p) noexcept(true) "
     "{ p[0] = 0; }\n" + kernel("auto f = helper;\nf(y);"),
     "token.function_pointer"),
    ("trailing_definition", "__device__ auto helper(float* p) -> void "
     "{ p[0] = 0; }\n" + kernel("auto f = helper;\nf(y);"),
     "token.function_pointer"),
    ("decltype_of_any_address", kernel("decltype(&quick_exit) f = quick_exit;"),
     "token.function_pointer"),
    ("decltype_of_function", HELPER + kernel("decltype(helper)* f = helper;"),
     "token.function_pointer"),
    ("template_deduction", HELPER + "template <class F> __device__ void run(F f, "
     "float* y) { F g = f; g(y); }\n" + kernel("run(helper, y);"),
     "token.function_pointer"),
    ("template_argument", HELPER + "template <auto F> __device__ void run(float* y)"
     " { F(y); }\n" + kernel("run<helper>(y);"), "token.function_pointer"),
    ("ternary", HELPER + "__device__ void other(float* p) { p[0] = 1; }\n"
     + kernel("auto f = y[0] > 0 ? helper : other;\nf(y);"),
     "token.function_pointer"),
    ("braced", HELPER + "struct S { void (&f)(float*); };\n"
     + kernel("S s{helper};"), "token.function_pointer"),
    ("kernel_attribute_list", kernel("y[0] = 1;") + 'extern "C" __attribute__(('
     "noinline, aligned(16), unused, used, noinline, global)) void k2(float* y) "
     "{ y[0] = 2; }\n", "kernel.count"),
    ("kernel_annotate", kernel("y[0] = 1;") + 'extern "C" __annotate__(global) '
     "void k2(float* y) { y[0] = 2; }\n", "kernel.count"),
    ("kernel_attributes_first", kernel("y[0] = 1;") + 'extern "C" [[nodiscard]] '
     "__launch_bounds__(64) __global__ void k2(float* y) { y[0] = 2; }\n",
     "kernel.count"),
    ("kernel_second_declarator", 'extern "C" __global__ void k(float* y), '
     "k2(float* y);\n" + kernel("y[0] = 1;"), "kernel.count"),
    ("launch_device_v2", kernel("cudaLaunchDeviceV2(0, 0);"), "token.device_launch"),
    ("parameter_buffer", kernel("void* b = cudaGetParameterBufferV3(0, 0, 0);"),
     "token.device_launch"),
    ("runtime_call", kernel("int d; cudaGetDevice(&d);"), "token.device_launch"),
    ("runtime_type", kernel("cudaStream_t s;"), "token.device_launch"),
    ("runtime_internal", kernel("__cudaPushCallConfiguration(1, 1);"),
     "token.device_launch"),
    ("chevrons", "__global__ void c(float* y);\n" + kernel("c<<<1, 1>>>(y);"),
     "token.device_launch"),
]


@pytest.mark.parametrize(("source", "check"), [c[1:] for c in POINTER_ATTACKS],
                         ids=[c[0] for c in POINTER_ATTACKS])
def test_function_pointers_kernels_and_launches_in_every_spelling(source, check):
    assert check in checks(source)


# ---- layer 2b: the cost of one macro use is bounded -------------------------------


def amplification() -> str:
    """An 8 KB source whose macro uses its argument at every position of its
    body, with a long argument: 1800 x 2000 tokens from one use."""
    body = " ".join(["x"] * 1800)
    arg = " ".join(["1"] * 2000)
    return f"#define F(x) {body}\n" + kernel(f"F({arg});")


def _peak_bytes(source) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        scan_source(source, "k")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "source",
    [
        amplification(),
        # Every argument a macro use, each expanded at every parameter use.
        "#define F(x) " + " ".join(["x"] * 30) + "\n"
        + kernel(" ".join("F(F(F(F(1))))" for _ in range(300))),
        # The same in every configuration (the arch makes each run differ).
        amplification().replace("F(1 1", "F(__CUDA_ARCH__ 1"),
    ],
    ids=["one_use", "nested_uses", "every_configuration"],
)
def test_argument_amplification_is_refused_quickly_and_small(source):
    assert len(source.encode()) <= 8 * 1024
    verdict, seconds = _scan_seconds(source)
    assert "pp.expansion_limit" in verdict.checks
    assert seconds < 0.25
    assert _peak_bytes(source) < 8 * 1024 * 1024


def test_many_undecided_conditionals_stay_cheap():
    source = "".join(f"#ifdef __UNKNOWN_{i}__\n#define M{i} 1\n#endif\n"
                     for i in range(2000)) + kernel("y[0] = 1;")
    verdict, seconds = _scan_seconds(source)
    assert "pp.conditional" in verdict.checks
    assert seconds < 0.5
    assert _peak_bytes(source) < 32 * 1024 * 1024


# ---- what normal CUDA writes stays accepted --------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "#define UNROLL 4\n" + kernel(
            "#pragma unroll UNROLL\nfor (int i = 0; i < 8; ++i) y[i] = i;"),
        "#define TILE 16\n" + kernel(
            "#pragma unroll (TILE/4)\nfor (int i = 0; i < 8; ++i) y[i] = i;\n"
            "#pragma unroll (TILE / 4 + 1)\nfor (int i = 0; i < 8; ++i) y[i] += i;"),
        "constexpr int kUnroll = 2;\n" + kernel(
            "#pragma unroll kUnroll\nfor (int i = 0; i < 8; ++i) y[i] = i;"),
        "\ufeff" + SAXPY.replace("saxpy", "k"),
        ("\ufeff" + SAXPY.replace("saxpy", "k")).encode(),
        SAXPY.replace("saxpy", "k").replace("\n", "\r\n"),
        SAXPY.replace("saxpy", "k").replace("\n", "\r\n").encode(),
    ],
    ids=["unroll_macro", "unroll_parenthesised", "unroll_constexpr", "bom",
         "bom_bytes", "crlf", "crlf_bytes"],
)
def test_normal_cuda_forms_are_accepted(source):
    verdict = scan_source(source, "k")
    assert verdict.accepted, verdict.violations


def test_a_lone_carriage_return_is_refused():
    # g++ ends a line at a lone CR, NVRTC does not: they would read different
    # directives and comments.
    source = kernel("// a remark\r    y[0] = 1;")
    assert checks(source) == ("bytes.control",)


def test_every_template_render_of_the_projects_kernels_is_accepted():
    from lib.codegen.specialise import KIND_DTYPES, render_template
    from lib.contract import Decision, TaskSpec

    dims = {"matmul": {"M": 100, "N": 70, "K": 90}, "reduce": {"N": 10000},
            "elementwise": {"N": 10000}, "stencil": {"H": 50, "W": 40, "T": 2},
            "histogram": {"N": 10000, "B": 100}}
    for kind, dtypes in KIND_DTYPES.items():
        for dtype in dtypes:
            task = TaskSpec(kind, dims[kind], dtype)
            decision = Decision((0,), (1.0,), task.split_size, 256, "single")
            source = render_template(task, decision.with_hash(task))
            verdict = scan_source(source, f"{kind}_{dtype}")
            assert verdict.accepted, (kind, dtype, verdict.violations)
