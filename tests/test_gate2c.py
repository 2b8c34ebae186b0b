"""Gate 2c: the compiled PTX of an untrusted kernel (``lib.security.ptx``),
and what the plane does with ptxas's report of it."""

from __future__ import annotations

import pytest
from test_codegen import needs_nvrtc

from lib.codegen import CodeGenerator, KernelCache
from lib.codegen.llm import FixedAnswer
from lib.codegen.nvrtc import compile_ptx, find_nvcc
from lib.codegen.specialise import KIND_DTYPES, render_template
from lib.contract import Decision, TaskSpec
from lib.security.ptx import check_ptx

HEAD = """
.version 8.0
.target sm_75
.address_size 64
"""
ENTRY = """
.visible .entry k(
    .param .u64 k_param_0
)
{{
    .reg .b64 %rd<4>;
    .reg .b32 %r<4>;
{body}
    ret;
}}
"""


def entry(body: str, before: str = "") -> str:
    return HEAD + before + ENTRY.format(body=body)


@pytest.mark.parametrize("ptx, check", [
    (entry("    atom.global.add.u32 %r1, [calls], 1;",
           ".global .align 4 .u32 calls;\n"), "ptx.global_state"),
    (entry("    mov.u64 %rd1, table;\n    ld.global.u32 %r1, [%rd1];",
           ".global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n"),
     "ptx.global_state"),
    (entry("    st.global.u32 [flag], %r1;",
           ".visible .global .align 4 .u32 flag = 3;\n"), "ptx.global_state"),
    (entry("    mov.u64 %rd1, %globaltimer;"), "ptx.timer"),
    (entry("    mov.u32 %r1, %clock;"), "ptx.timer"),
    (entry("    nanosleep.u32 %r1;"), "ptx.sleep"),
    (entry("    trap;"), "ptx.trap"),
    (entry("    atom.sys.global.add.u32 %r1, [%rd1], 1;"), "ptx.system_scope"),
    (entry("    red.global.sys.add.u32 [%rd1], 1;"), "ptx.system_scope"),
    (entry("    sust.b.1d.b32.trap [%rd1, {%r1}], {%r2};"), "ptx.surface"),
    (entry("", ".extern .func (.param .b32 r) mkdir\n(\n    .param .b64 p\n);\n"),
     "ptx.extern_call"),
    (entry("    call (%r1), %rd2, (%rd1), proto;"), "ptx.indirect_call"),
    (entry("    mov.u64 %rd1, 4096;\n    st.volatile.u32 [%rd1], %r1;"),
     "ptx.fixed_address"),
    (entry("    st.global.u32 [4096], %r1;"), "ptx.fixed_address"),
    (entry("    mov.u32 %r1, %tid.x;\n    mul.wide.u32 %rd1, %r1, 4;\n"
           "    atom.global.add.u32 %r2, [%rd1+8], 1;"), "ptx.fixed_address"),
])
def test_each_check_fires_on_its_instruction(ptx, check):
    verdict = check_ptx(ptx, "k")
    assert verdict.checks == (check,), verdict.summary()
    assert verdict.gate == "gate2c"


def test_recursion_through_two_functions_is_a_cycle():
    funcs = """
.func (.param .b32 r) f(.param .b32 a)
{
    call.uni (retval0),
    g,
    (param0);
    ret;
}
.func (.param .b32 r) g(.param .b32 a)
{
    call.uni (retval0), f, (param0);
    ret;
}
"""
    verdict = check_ptx(entry("    call.uni (retval0), f, (param0);", funcs), "k")
    assert verdict.checks == ("ptx.recursion",)
    assert "f -> g -> f" in verdict.summary()


def test_a_constant_only_loaded_and_the_math_tables_pass():
    before = (".global .align 4 .b32 TILE = 16;\n"
              ".global .align 4 .b8 __cudart_i2opi_f[4] = {1, 2, 3, 4};\n"
              ".global .align 1 .b8 $str[2] = {47, 0};\n")
    body = ("    ld.global.u32 %r1, [TILE];\n"
            "    @%p1 ld.global.nc.u32 %r2, [TILE+4];\n"
            "    mov.u64 %rd1, __cudart_i2opi_f;")
    assert check_ptx(entry(body, before), "k").accepted


def test_addresses_from_a_parameter_a_symbol_or_a_load_pass():
    """Only an address of constants and thread indices is refused: one
    derived from a parameter (through cvta, arithmetic, a select with 0, a
    loop's redefinition), a shared array or a loaded pointer passes."""
    body = ("    ld.param.u64 %rd1, [k_param_0];\n"
            "    cvta.to.global.u64 %rd2, %rd1;\n"
            "    mov.u32 %r1, %tid.x;\n"
            "    mul.wide.u32 %rd3, %r1, 4;\n"
            "    add.s64 %rd2, %rd2, %rd3;\n"
            "    selp.b64 %rd3, %rd2, 0, %p1;\n"
            "    st.global.v2.f32 [%rd3+8], {%f1, %f2};\n"
            "    ld.global.u64 %rd3, [%rd2];\n"
            "    st.global.u32 [%rd3], %r1;\n"
            "    mov.u64 %rd3, stash;\n"
            "    st.shared.u32 [%rd3+4], %r1;\n"
            "    ld.shared.u32 %r2, [stash+8];")
    verdict = check_ptx(entry(body, ".shared .align 4 .b8 stash[64];\n"), "k")
    assert verdict.accepted, verdict.summary()


@needs_nvrtc
def test_a_store_to_a_fixed_address_behind_a_size_is_refused():
    """The store runs only for n == 7, which the spot check's sizes never
    meet; the PTX shows where it goes."""
    source = SAXPY % ("", "") + (
        'extern "C" __global__ void bomb(float* out, long long n) {\n'
        "    if (n == 7) *(volatile int*)0x1000 = 1;\n"
        "    if (threadIdx.x == 0) out[0] = 1.0f;\n}\n")
    verdict = check_ptx(compile_ptx(source, "k.cu", 75, []), "bomb")
    assert verdict.checks == ("ptx.fixed_address",), verdict.summary()
    assert "bomb reaches memory" in verdict.summary()


def test_launch_bounds_must_admit_the_block():
    bounded = (HEAD + ".visible .entry k(.param .u64 p)\n.maxntid 64, 1, 1\n"
               "{\n    ret;\n}\n")
    assert check_ptx(bounded, "k", 64).accepted
    assert check_ptx(bounded, "k", 128).checks == ("ptx.launch_bounds",)
    required = bounded.replace(".maxntid", ".reqntid")
    assert check_ptx(required, "k", 32).checks == ("ptx.launch_bounds",)


def test_a_missing_entry_is_named():
    assert check_ptx(entry(""), "other").checks == ("ptx.entry",)


@needs_nvrtc
@pytest.mark.parametrize("kind, dtype", sorted(
    (k, d) for k, ds in KIND_DTYPES.items() for d in ds))
def test_every_template_passes(kind, dtype):
    """No false positive on the project's own kernels, whose PTX has what
    sound kernels have (device helpers, math tables, shared memory)."""
    dims = {"matmul": {"M": 100, "N": 70, "K": 90}, "reduce": {"N": 10000},
            "elementwise": {"N": 10000}, "stencil": {"H": 50, "W": 40, "T": 2},
            "histogram": {"N": 10000, "B": 64}}[kind]
    task = TaskSpec(kind, dims, dtype)
    for mode, chunk in (("single", task.split_size), ("pipelined", 16)):
        decision = Decision((0,), (1.0,), chunk, 256, mode).with_hash(task)
        ptx = compile_ptx(render_template(task, decision), "k.cu", 75, [])
        assert check_ptx(ptx, None, 256).accepted, (kind, dtype, mode)


SAXPY = """extern "C" __global__ void elementwise_fp32(float a, const float* x,
    const float* y, float* out, long long n) {
    %s
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride)
        out[i] = a * x[i] + y[i]%s;
}
"""


@pytest.mark.skipif(find_nvcc() is None, reason="no nvcc: no ptxas report")
@needs_nvrtc
@pytest.mark.parametrize("setup, use, why", [
    ("__shared__ float stash[1 << 16]; stash[threadIdx.x] = a;",
     " + 0.0f * stash[threadIdx.x]", "ptxas: "),
    ("", " + 0.0f * deep(a, n)", "B stack"),
])
def test_ptxas_refusal_or_a_deep_frame_refuses_the_answer(tmp_path, setup, use,
                                                          why):
    """A module ptxas refuses (too much shared memory) could never load, and
    a device function's own stack frame counts as the entry's does."""
    helper = ("__device__ __noinline__ float deep(float v, long long n) {\n"
              "    volatile float big[4096];\n"
              "    for (int k = 0; k < 16; ++k) big[k] = v + k;\n"
              "    return big[n % 16];\n}\n") if "deep" in use else ""
    task = TaskSpec("elementwise", {"N": 4096})
    decision = Decision((0,), (1.0,), task.split_size, 128, "single").with_hash(task)
    gen = CodeGenerator(cache=KernelCache(tmp_path / "kernels",
                                          tmp_path / "keys" / "seal.key"),
                        spot_runner="emulated", measure_resources=False)
    kernel = gen.generate(task, decision,
                          FixedAnswer(helper + SAXPY % (setup, use), name="t"))
    assert kernel.refused_by == ("resources",), kernel.reasons
    assert why in kernel.reasons[0]
