"""Untrusted kernels through the whole code-generation plane: one canonical text
for every compiler, and nothing of theirs runs on the host outside the sandbox.

The attacks are pushed through ``CodeGenerator.generate`` as an LLM's answer.
Where the test needs the boundary itself (not the scanner) to hold, Gate 2a is
replaced by one that accepts everything: the sandbox must stop the payload on
its own. A marker file the payload would write must never appear.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from lib.codegen import CodeGenerator, KernelCache, isolation, plane
from lib.codegen.emulate import find_cxx
from lib.codegen.llm import FixedAnswer
from lib.codegen.nvrtc import nvrtc_version
from lib.contract import Decision, TaskSpec
from lib.security import sandbox
from lib.security.verdict import Verdict


def _nvrtc_ok() -> bool:
    try:
        nvrtc_version()
        return True
    except Exception:
        return False


pytestmark = [
    pytest.mark.skipif(sandbox.available() is not None,
                       reason=f"no sandbox here: {sandbox.available()}"),
    pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC is not available"),
    pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler"),
]

KERNEL = """
#include <cuda_fp16.h>
extern "C" __global__ void elementwise_fp32(float a, const float* x,
                                            const float* y, float* out,
                                            long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        out[i] = a * x[i] + y[i];
}
"""


def _task() -> tuple[TaskSpec, Decision]:
    task = TaskSpec("elementwise", {"N": 1 << 16}, "fp32")
    return task, Decision((0,), (1.0,), task.split_size, 128, "single").with_hash(
        task)


@pytest.fixture
def gen(tmp_path):
    cache = KernelCache(tmp_path / "kernels", tmp_path / "keys" / "seal.key")
    return CodeGenerator(cache=cache, spot_runner="emulated",
                         measure_resources=False)


@pytest.fixture
def blind_scanner(monkeypatch):
    """Gate 2a accepts everything: the boundary must hold without it."""
    monkeypatch.setattr(plane, "scan_source",
                        lambda source, entry=None, **kw: Verdict("gate2a", []))


def test_a_benign_answer_is_served_from_its_canonical_text(gen):
    task, decision = _task()
    code = KERNEL.replace("out[i] = a * x[i] + y[i];",
                          "#pragma unroll STEP\n        out[i] = a * x[i] + y[i];")
    kernel = gen.generate(task, decision, FixedAnswer("#define STEP 1\n" + code))
    assert kernel.label == "LLM" and kernel.spot.passed, kernel.reasons
    assert kernel.source.startswith("#include <cuda_fp16.h>")
    assert "#pragma unroll 1" in kernel.source and "#define" not in kernel.source


def test_common_legal_cuda_that_only_draws_warnings_is_served(gen):
    """An int compared with blockDim.x, a size_t loop against the long long
    n and an unused local: NVRTC compiles them without a word, and the host
    build of the spot check used to refuse them (-Werror)."""
    task, decision = _task()
    code = KERNEL.replace(
        "    const long long stride",
        "    int tid = threadIdx.x;\n    int unused = 3;\n    const long long stride",
    ).replace(
        "out[i] = a * x[i] + y[i];",
        "if (tid < blockDim.x) out[i] = a * x[i] + y[i];\n"
        "    for (size_t j = 0; j < n && j < 1; ++j) (void)j;")
    kernel = gen.generate(task, decision, FixedAnswer(code))
    assert kernel.label == "LLM" and kernel.spot.passed, kernel.reasons


def test_an_fp16_answer_in_half_arithmetic_is_served(gen):
    """__half operators, __hfma and __half2 pairs: the API of cuda_fp16.h
    that NVRTC compiles; the host build of the spot check used to know only
    the two conversions and refused such an answer."""
    task = TaskSpec("elementwise", {"N": 1 << 16}, "fp16")
    decision = Decision((0,), (1.0,), task.split_size, 128, "single").with_hash(task)
    code = """
#include <cuda_fp16.h>
extern "C" __global__ void elementwise_fp16(float a, const __half* x,
                                            const __half* y, __half* out,
                                            long long n) {
    const __half2* x2 = reinterpret_cast<const __half2*>(x);
    const __half2* y2 = reinterpret_cast<const __half2*>(y);
    __half2* o2 = reinterpret_cast<__half2*>(out);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n / 2;
         i += stride) {
        const float2 xf = __half22float2(x2[i]), yf = __half22float2(y2[i]);
        o2[i] = __floats2half2_rn(a * xf.x + yf.x, a * xf.y + yf.y);
    }
    if ((n & 1) && blockIdx.x == 0 && threadIdx.x == 0) {
        const __half ha = __float2half_rn(a);
        out[n - 1] = __hfma(ha, x[n - 1], y[n - 1]) + __half(0.0f);
    }
}
"""
    kernel = gen.generate(task, decision, FixedAnswer(code))
    assert kernel.label == "LLM" and kernel.spot.passed, kernel.reasons


def test_an_answer_calling_device_intrinsics_is_served(gen):
    """isnan, __fmaf_rn, rsqrtf, __float_as_uint and a make_float2 pair: the
    device API Gate 2a allows, which the host build of the spot check did
    not have (each refused the answer)."""
    task, decision = _task()
    code = KERNEL.replace(
        "out[i] = a * x[i] + y[i];",
        "{ const float2 p = make_float2(x[i], y[i]);\n"
        "        const float one = rsqrtf(1.0f)\n"
        "            * __uint_as_float(__float_as_uint(1.0f));\n"
        "        out[i] = isnan(p.x) ? p.x : __fmaf_rn(a * one, p.x, p.y); }")
    kernel = gen.generate(task, decision, FixedAnswer(code))
    assert kernel.label == "LLM" and kernel.spot.passed, kernel.reasons


def test_an_answer_with_a_constant_memory_table_is_served(gen):
    """A __constant__ table indexed at run time, as kernels/README.md tells a
    kernel to keep one; the host build of the spot check did not know
    __constant__."""
    task, decision = _task()
    code = ("__constant__ float kW[3] = {0.25f, 0.5f, 0.25f};\n" + KERNEL).replace(
        "out[i] = a * x[i] + y[i];",
        "out[i] = a * x[i] * (kW[i % 3] + kW[(i + 1) % 3] + kW[(i + 2) % 3])"
        " + y[i];")
    kernel = gen.generate(task, decision, FixedAnswer(code))
    assert kernel.label == "LLM" and kernel.spot.passed, kernel.reasons


def test_the_projects_own_matmul_as_an_answer_is_served(gen):
    """The template's own tiled matmul, sent as an LLM's answer: 64 blocks of
    256 threads meeting at barriers, which the emulator runs as the host's
    threads. With a K of 128 in the large spot task it ran past the
    sandbox's limit on two cores and was refused."""
    from lib.codegen import render_template
    task = TaskSpec("matmul", {"M": 512, "N": 512, "K": 512})
    decision = Decision((0,), (1.0,), task.split_size, 256, "single").with_hash(task)
    kernel = gen.generate(task, decision,
                          FixedAnswer(render_template(task, decision)))
    assert kernel.label == "LLM" and kernel.spot.passed, kernel.reasons


def test_an_answer_that_spins_is_refused_by_its_cpu_limit(gen, blind_scanner):
    """A kernel that never ends burns CPU: the sandbox's CPU limit ends it, and
    the reason says so; the wall clock has more slack (a busy machine
    stretches a sound answer's wall time, not its CPU time)."""
    from lib.codegen.emulate import WALL_SLACK

    assert WALL_SLACK > 1.0
    task, decision = _task()
    code = KERNEL.replace("out[i] = a * x[i] + y[i];",
                          "{ volatile int k = 0; while (k == 0) { } "
                          "out[i] = a * x[i] + y[i]; }")
    kernel = gen.generate(task, decision, FixedAnswer(code))
    assert kernel.label == "TEMPLATE"
    assert any("s of CPU time (sandboxed)" in r for r in kernel.reasons), \
        kernel.reasons


def test_the_spot_checks_limit_grows_with_the_block():
    from lib.codegen.spotcheck import UNTRUSTED_TIMEOUT_S, untrusted_timeout
    assert untrusted_timeout(128) == untrusted_timeout(256) == UNTRUSTED_TIMEOUT_S
    assert untrusted_timeout(1024) == 4 * UNTRUSTED_TIMEOUT_S


def test_a_write_far_before_the_output_at_a_real_size_is_refused(gen):
    """An answer that computes the right result and, at a launch's size,
    writes 16 MiB before its output: past every redzone, so without the
    emulated buffers' guards it landed in other live memory and was served."""
    task, decision = _task()
    code = KERNEL.replace(
        "out[i] = a * x[i] + y[i];",
        "{ out[i] = a * x[i] + y[i];\n"
        "          if (n >= 100000 && i == n - 1) out[i - 4000000LL] = 0.0f; }")
    kernel = gen.generate(task, decision, FixedAnswer(code))
    assert kernel.label != "LLM"
    why = " ".join(kernel.reasons)
    assert "AddressSanitizer: SEGV" in why, why


def test_a_payload_hidden_from_nvrtc_is_gone_from_what_the_host_builds(
        gen, tmp_path, blind_scanner):
    marker = tmp_path / "host-marker"
    payload = f"""
#ifndef __CUDACC_RTC__
#include <cstdlib>
static int pwned = std::system("touch {marker}");
#endif
"""
    task, decision = _task()
    kernel = gen.generate(task, decision, FixedAnswer(payload + KERNEL))
    assert not marker.exists()
    # the host emulation built the program NVRTC compiled: no payload in it
    assert "system" not in kernel.source and kernel.spot is not None


def test_a_payload_that_both_compilers_take_cannot_touch_the_host(
        gen, tmp_path, blind_scanner, monkeypatch):
    """Code that survives canonicalisation runs, but only in the sandbox: it
    can neither start a program nor write outside its scratch folder."""
    marker = tmp_path / "host-marker"
    # NVRTC would refuse host code; the spot check's host build is the target
    monkeypatch.setattr(isolation, "compile_ptx_isolated",
                        lambda *a, **k: "// ptx")
    payload = f"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void payload() {{
    std::system("touch {marker}");
    if (FILE* f = std::fopen("{marker}", "w")) std::fclose(f);
}}
"""
    task, decision = _task()
    gen.generate(task, decision, FixedAnswer(payload + KERNEL))
    assert not marker.exists()


def test_no_sandbox_means_the_template_and_a_reason(gen, monkeypatch):
    monkeypatch.setattr(sandbox, "available", lambda: "bwrap is missing")
    task, decision = _task()
    kernel = gen.generate(task, decision, FixedAnswer(KERNEL))
    assert kernel.label == "TEMPLATE" and kernel.fell_back_from == ("fixed",)
    assert "no sandbox" in kernel.reasons[0] and "never run bare" in kernel.reasons[0]


def test_an_nvrtc_compile_past_its_limits_is_refused(gen, monkeypatch):
    monkeypatch.setattr(isolation, "NVRTC_LIMITS",
                        sandbox.SandboxLimits(cpu_seconds=1, wall_seconds=0.02))
    task, decision = _task()
    kernel = gen.generate(task, decision, FixedAnswer(KERNEL))
    assert kernel.label == "TEMPLATE"
    assert "NVRTC" in kernel.reasons[0] and "limit" in kernel.reasons[0]


def test_runaway_macro_expansion_stops_at_the_preprocessor_limit():
    amplify = "#define A(x) x x x x x x x x\n" + "".join(
        f"#define B{i}(x) A(B{i - 1}(x))\n" for i in range(1, 12)).replace(
        "B0(x)", "x") + "int v[] = { B11(1) };\n"
    with pytest.raises(isolation.IsolationError, match="limit"):
        isolation.canonicalise(amplify, 80)


@pytest.mark.parametrize("spelling", [
    '#include "/etc/hostname"\n',
    '#define H "/etc/hostname"\n#include H\n',
    '%:include "/etc/hostname"\n',
    '#inc\\\nlude "/etc/hostname"\n',
])
def test_only_the_two_cuda_headers_may_be_included(spelling):
    with pytest.raises(isolation.IsolationError, match="includes '/etc/hostname'"):
        isolation.canonicalise(spelling + KERNEL, 80)


def test_device_macros_decide_conditionals_as_nvrtc_does():
    text = isolation.canonicalise(
        "#if defined(__GNUC__) || defined(__linux__)\nint host_only;\n#endif\n"
        "#if __CUDA_ARCH__ == 900 && defined(__CUDACC_RTC__)\nint device;\n#endif\n",
        90)
    assert "host_only" not in text and "int device;" in text


def test_the_seal_key_is_hidden_from_sandboxed_steps(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True)
    (home / "keys" / "seal.key").write_text("secret")
    monkeypatch.setenv("GPUHIVE_HOME", str(home))
    assert home in isolation.secret_dirs()
    result = sandbox.run(["cat", str(home / "keys" / "seal.key")],
                         scratch=Path(tmp_path), allow_exec=True,
                         hide=isolation.secret_dirs())
    assert result.returncode != 0 and b"secret" not in result.stdout


def test_a_checkout_under_tmp_is_exposed_to_sandboxed_steps(tmp_path):
    """The sandbox's /tmp is fresh, so a clone or a virtual environment under
    the host's /tmp is bound back read-only when a step names it."""
    src = Path(tempfile.mkdtemp(prefix="gh_expose_"))
    try:
        (src / "data.txt").write_text("visible")
        hidden = sandbox.run(["cat", str(src / "data.txt")], scratch=tmp_path,
                             allow_exec=True)
        shown = sandbox.run(["cat", str(src / "data.txt")], scratch=tmp_path,
                            allow_exec=True, expose=[src])
        assert hidden.returncode != 0 and shown.stdout == b"visible"
        write = sandbox.run(["sh", "-c", f"echo x > {src}/new.txt"],
                            scratch=tmp_path, allow_exec=True, expose=[src])
        assert write.returncode != 0 and not (src / "new.txt").exists()
    finally:
        shutil.rmtree(src)
