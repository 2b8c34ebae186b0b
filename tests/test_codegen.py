"""The code-gen plane: templates, LLM providers through the real SDKs against a
local stub server, Gate 2 on every kernel, and the sealed cache.

No network: every SDK is pointed at :class:`llm_stub.LLMStub` on 127.0.0.1.
Tests that need NVRTC (cupy) skip with the reason where it cannot load; the
spot checks need a C++ compiler and skip without one.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_stub import LLMStub

from lib.cli.codegen import generate_for_cli
from lib.codegen import (
    CodeGenerator,
    CodegenError,
    KernelCache,
    extract_code,
    render_template,
    single_kernel,
    spotcheck,
)
from lib.codegen.emulate import find_cxx
from lib.codegen.llm import (
    AnthropicProvider,
    OpenAICompatibleProvider,
    OpenAIProvider,
    RecordedProvider,
    build_prompt,
)
from lib.codegen.nvrtc import compile_ptx, find_nvcc
from lib.codegen.specialise import KIND_DTYPES, entry_points, kernel_path
from lib.contract import Decision, TaskSpec
from lib.security import scan_source

try:
    from lib.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    NVRTC_REASON = ""
except Exception as exc:  # cupy or libnvrtc missing
    NVRTC_REASON = f"NVRTC not loadable ({type(exc).__name__})"

needs_nvrtc = pytest.mark.skipif(bool(NVRTC_REASON), reason=NVRTC_REASON)
needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")

DIMS = {"matmul": {"M": 100, "N": 70, "K": 90}, "reduce": {"N": 10000},
        "elementwise": {"N": 10000}, "stencil": {"H": 50, "W": 40, "T": 2},
        "histogram": {"N": 10000, "B": 100}}
ALL = [(k, d) for k, dtypes in KIND_DTYPES.items() for d in dtypes]


def _pair(kind: str = "elementwise", dtype: str = "fp32", block: int = 96):
    task = TaskSpec(kind, DIMS[kind], dtype)
    decision = Decision((0,), (1.0,), task.split_size, block, "single")
    return task, decision.with_hash(task)


@pytest.fixture
def gen(tmp_path):
    cache = KernelCache(tmp_path / "kernels", tmp_path / "keys" / "seal.key")
    return CodeGenerator(cache=cache, spot_runner="emulated",
                         measure_resources=False)


@pytest.fixture(scope="module")
def stub():
    with LLMStub() as server:
        yield server


# ---- templates -----------------------------------------------------------------

@needs_nvrtc
@pytest.mark.parametrize(("kind", "dtype"), ALL, ids=[f"{k}-{d}" for k, d in ALL])
def test_template_passes_gate2a_and_compiles_for_sm80(kind, dtype):
    task, decision = _pair(kind, dtype, block=256)
    source = render_template(task, decision)
    entry = f"{kind}_{dtype}"
    assert entry_points(source) == [entry]
    verdict = scan_source(source, entry)
    assert verdict.accepted, verdict.summary()
    ptx = compile_ptx(source, f"{entry}.cu", 80)
    assert re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M) == [entry]


def test_template_defines_the_decision_tunables():
    task, decision = _pair("matmul", "fp16", block=512)
    source = render_template(task, decision, {"MATMUL_TILE": 8})
    assert "#define MATMUL_MAX_THREADS 512\n" in source
    assert "#define MATMUL_TILE 8\n" in source
    # The logic is the kernel file's own text, not a copy of it.
    body = single_kernel(kernel_path("matmul").read_text(), "matmul_fp16")
    assert source.endswith(body)
    with pytest.raises(CodegenError, match="no tunable BOGUS"):
        render_template(task, decision, {"BOGUS": 1})


def test_single_kernel_names_what_is_there():
    text = kernel_path("stencil").read_text()
    assert entry_points(single_kernel(text, "stencil_fp64")) == ["stencil_fp64"]
    with pytest.raises(CodegenError, match="stencil_fp32, stencil_fp64"):
        single_kernel(text, "stencil_bf16")


@needs_cxx
@pytest.mark.parametrize("kind", ["matmul", "reduce", "histogram"])
def test_specialised_template_is_numerically_right(kind):
    """The tunables the decision sets (block 96) keep the answer right."""
    from lib.codegen.spotcheck import spot_check

    task, decision = _pair(kind, "fp32", block=96)
    result = spot_check(render_template(task, decision), task, decision, "emulated")
    assert result.passed, result


@needs_nvrtc
def test_cli_function_source_passes_scan_and_nvcc(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path / "home"))
    kernel, _ = generate_for_cli("matmul", {"M": 1024, "N": 1024, "K": 1024},
                                 provider="template")
    assert kernel.label == "TEMPLATE" and kernel.kernel_name == "matmul_fp32"
    assert scan_source(kernel.source, "matmul_fp32").accepted
    if find_nvcc() is None:
        pytest.skip("nvcc not on PATH")
    path = tmp_path / "k.cu"
    path.write_text(kernel.source)
    proc = subprocess.run(["nvcc", "-ptx", "-arch=sm_80", str(path), "-o",
                           str(tmp_path / "k.ptx")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert ".visible .entry matmul_fp32(" in (tmp_path / "k.ptx").read_text()


def test_cli_function_refuses_bad_input_by_name():
    with pytest.raises(ValueError, match="dims.Q"):
        generate_for_cli("matmul", {"M": 1, "N": 1, "Q": 1})


# ---- answers and prompts ---------------------------------------------------------

@pytest.mark.parametrize(("answer", "reason"), [
    ("", "empty"),
    ("no code here", "0 fenced code blocks"),
    ("```cuda\nA\n```\n```cuda\nB\n```\n", "2 fenced code blocks"),
    ("```python\nprint(1)\n```\n", "'python'"),
    ("```cuda\n\n```\n", "code block is empty"),
])
def test_extract_code_rejects_with_reason(answer, reason):
    code, why = extract_code(answer)
    assert code is None and reason in why


def test_extract_code_takes_the_one_block():
    assert extract_code("text\n```c++\nint x;\n```\nmore") == ("int x;\n", "")


def test_prompt_states_the_signature_from_the_kernel_file():
    task, decision = _pair("histogram", "fp32", block=128)
    prompt = build_prompt(task, decision)
    assert ('extern "C" __global__ void histogram_fp32(const float* x, '
            "unsigned int* counts, long long n, int B)") in prompt
    assert "#define HISTOGRAM_MAX_BINS 100" in prompt and "128 threads" in prompt


# ---- LLM providers through the real SDKs ------------------------------------------

def _openai(stub):
    return OpenAIProvider(model="stub-model", base_url=stub.base_url,
                          api_key="sk-test-not-a-key", timeout=1.0, max_retries=0)


PROVIDERS = {
    "openai": _openai,
    "anthropic": lambda s: AnthropicProvider(
        model="stub-model", base_url=s.base_url.removesuffix("/v1"),
        api_key="sk-test-not-a-key", timeout=1.0, max_retries=0),
    "openai-compatible": lambda s: OpenAICompatibleProvider(
        model="stub-model", base_url=s.base_url, api_key="sk-test-not-a-key",
        timeout=1.0, max_retries=0),
}


@needs_nvrtc
@needs_cxx
@pytest.mark.parametrize("name", list(PROVIDERS))
def test_good_answer_is_served_as_llm(stub, gen, name):
    stub.scenario = "good"
    task, decision = _pair()
    kernel = gen.generate(task, decision, PROVIDERS[name](stub))
    assert (kernel.label, kernel.provider) == ("LLM", name)
    assert not kernel.fell_back_from and kernel.spot.passed
    assert all(v.accepted for v in kernel.verdicts.values())
    path, body, headers = stub.requests[-1]
    assert path.endswith({"openai": "/responses", "anthropic": "/messages",
                          "openai-compatible": "/chat/completions"}[name])
    assert "elementwise_fp32(float a" in str(body)
    # The key went out as a header and nowhere else: not into the cache.
    cached = b"".join(p.read_bytes() for p in gen.cache.entries())
    assert b"sk-test-not-a-key" not in cached


@needs_nvrtc
@needs_cxx
@pytest.mark.parametrize(("scenario", "reason"), [
    ("injected", "[token.os_call]"),
    ("no_compile", "NVRTC"),
    ("wrong", "spot check failed"),
    ("http500", "InternalServerError"),
    ("timeout", "APITimeoutError"),
    ("empty", "empty"),
    ("two_blocks", "2 fenced code blocks"),
])
def test_bad_answer_falls_back_to_the_template(stub, gen, caplog, scenario, reason):
    stub.scenario = scenario
    task, decision = _pair()
    with caplog.at_level(logging.WARNING, logger="lib.codegen"):
        kernel = gen.generate(task, decision, _openai(stub))
    assert kernel.label == "TEMPLATE" and kernel.provider == "template"
    assert kernel.fell_back_from == ("openai",)
    assert reason in kernel.reasons[0], kernel.reasons
    assert any(reason in r.getMessage() for r in caplog.records)
    assert scan_source(kernel.source, "elementwise_fp32").accepted
    # Nothing of the rejected answer was cached: only the template's entry.
    assert len(gen.cache.entries()) == 1


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_a_trickled_answer_is_given_up_at_the_deadline(stub, name):
    """A server that sends its answer a byte every 0.1 s never lets a read
    wait the 1 s timeout; the whole request is held to its deadline."""
    stub.scenario = "trickle"
    provider = PROVIDERS[name](stub)
    provider.deadline = 1.5
    task, _ = _pair()
    t0 = time.monotonic()
    with pytest.raises(CodegenError, match=rf"^{name}: no whole answer within 1.5 s"):
        provider.ask("write the kernel", task)
    # the whole answer would take over a minute at this pace; the bound is
    # loose so that a busy machine cannot fail it
    assert time.monotonic() - t0 < 15.0


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_every_request_caps_the_answer_tokens(stub, name):
    stub.scenario = "good"
    provider = PROVIDERS[name](stub)
    provider.max_tokens = 1234
    task, _ = _pair()
    assert "elementwise_fp32" in provider.ask("write the kernel", task)
    _, body, _ = stub.requests[-1]
    field = "max_output_tokens" if name == "openai" else "max_tokens"
    assert body[field] == 1234


@needs_nvrtc
def test_http500_from_anthropic_and_compatible_fall_back(stub, gen):
    stub.scenario = "http500"
    task, decision = _pair()
    for name in ("anthropic", "openai-compatible"):
        kernel = gen.generate(task, decision, PROVIDERS[name](stub))
        assert kernel.fell_back_from == (name,) and kernel.label == "TEMPLATE"


def test_provider_without_model_names_the_variable(monkeypatch):
    monkeypatch.delenv("GPUHIVE_OPENAI_MODEL", raising=False)
    with pytest.raises(CodegenError, match=r"\$GPUHIVE_OPENAI_MODEL"):
        OpenAIProvider()


@needs_nvrtc
@needs_cxx
def test_recorded_answers_replay(gen):
    task, decision = _pair("reduce", "fp32")
    good = gen.generate(task, decision, "recorded")
    assert good.label == "RECORDED" and good.spot.passed
    task, decision = _pair("elementwise", "fp32")
    bad = gen.generate(task, decision,
                       RecordedProvider(answer_id="elementwise-fp32-injected"))
    assert bad.label == "TEMPLATE" and bad.fell_back_from == ("recorded",)
    assert "[token.os_call]" in bad.reasons[0]


# ---- the sealed cache ----------------------------------------------------------------

@needs_nvrtc
def test_hit_reverifies_the_seal(gen, monkeypatch):
    task, decision = _pair("matmul")
    miss = gen.generate(task, decision)
    calls = []
    load = gen.cache.seal.load
    monkeypatch.setattr(gen.cache.seal, "load",
                        lambda *a: calls.append(a) or load(*a))
    hit = gen.generate(task, decision)
    assert not miss.cached and hit.cached and len(calls) == 1
    assert hit.verdicts["gate2b"].accepted
    assert (hit.source, hit.ptx) == (miss.source, miss.ptx)


@needs_nvrtc
def test_tampered_entry_is_evicted_regenerated_and_logged(gen, caplog):
    task, decision = _pair("matmul")
    first = gen.generate(task, decision)
    path = gen.cache.path(first.cache_key)
    data = path.read_bytes()
    path.write_bytes(data.replace(b"matmul_tiled", b"matmul_tilex", 1))
    with caplog.at_level(logging.WARNING, logger="lib.codegen"):
        again = gen.generate(task, decision)
    assert not again.cached and again.source == first.source
    assert any("failed Gate 2b" in r.getMessage() and "seal.mac" in r.getMessage()
               for r in caplog.records)
    third = gen.generate(task, decision)
    assert third.cached and third.verdicts["gate2b"].accepted


@needs_nvrtc
@needs_cxx
def test_a_kernel_checked_in_emulation_is_checked_again_on_a_device(
        gen, monkeypatch):
    task, decision = _pair("reduce", "fp32")
    first = gen.generate(task, decision, "recorded")
    assert first.spot.runner == "emulated" and not first.cached
    assert gen.generate(task, decision, "recorded").cached
    # the same cache read by a host that spot-checks on its GPU: no hit for
    # the emulated check's entry; the answer is checked there (a stand-in
    # for the device run, which this computer cannot make) and sealed anew
    ran = []

    def on_device(source, task_, decision_, runner, **kw):
        ran.append(runner)
        return spotcheck.SpotResult(True, 0.0, "cuda", task_.describe(), 0.0)

    monkeypatch.setattr(spotcheck, "spot_check", on_device)
    device = CodeGenerator(cache=gen.cache, spot_runner="cuda",
                           measure_resources=False)
    again = device.generate(task, decision, "recorded")
    assert ran == ["cuda"] and not again.cached and again.spot.runner == "cuda"
    assert again.cache_key != first.cache_key and again.source == first.source
    assert device.generate(task, decision, "recorded").cached
    # and the host without a GPU still hits its own entry
    assert gen.generate(task, decision, "recorded").cache_key == first.cache_key


def _write_one(home: str, barrier) -> str:
    cache = KernelCache(Path(home) / "kernels", Path(home) / "keys" / "seal.key")
    gen = CodeGenerator(cache=cache, measure_resources=False)
    task, decision = _pair("matmul")
    barrier.wait()
    return gen.generate(task, decision).cache_key


@needs_nvrtc
def test_concurrent_writers_leave_one_valid_entry(tmp_path):
    ctx = mp.get_context("spawn")
    n = 4
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as pool:
            keys = pool.starmap(_write_one, [(str(tmp_path), barrier)] * n)
    assert len(set(keys)) == 1
    cache = KernelCache(tmp_path / "kernels", tmp_path / "keys" / "seal.key")
    files = list((tmp_path / "kernels").iterdir())
    assert files == [cache.path(keys[0])]
    entry, verdict = cache.get(keys[0])
    assert entry is not None and verdict.accepted


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@needs_nvrtc
@needs_cxx
def test_an_answer_cached_under_earlier_checks_is_checked_again(gen, monkeypatch):
    """The code of the checks an answer passed is part of its cache key: when
    Gate 2a, Gate 2c or the spot check changes, an answer sealed under the
    earlier code is a miss, and the new checks run on it before it is
    served. The template's entries are the project's own and keep theirs."""
    from lib.codegen import plane

    task, decision = _pair("reduce", "fp32")
    first = gen.generate(task, decision, "recorded")
    template = gen.generate(task, decision, "template")
    assert gen.generate(task, decision, "recorded").cached
    monkeypatch.setattr(plane, "checks_digest", lambda: "0123456789ab")
    again = gen.generate(task, decision, "recorded")
    assert not again.cached and again.cache_key != first.cache_key
    assert again.verdicts["gate2a"].accepted and again.spot.passed
    assert gen.generate(task, decision, "template").cache_key == template.cache_key
