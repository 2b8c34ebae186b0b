"""Every kernel source compiles for every target GPU, and uses what it should.

* The sources keep to the allowed subset of CUDA C (two includes, ``unroll``
  pragmas, no printf/malloc/asm/...) and define exactly the expected entry
  points, tunables behind ``#ifndef``.
* ``nvcc -ptx`` succeeds for sm_75, sm_80 and sm_90 and the PTX holds every
  entry point; ``ptxas`` then reports registers and static shared memory per
  entry point and architecture, which are written to ``resources.json`` in a
  pytest temporary folder and printed (run with ``-s`` to see the table).
* NVRTC (through ``cupy.cuda.nvrtc``, no driver needed) compiles the same
  sources with the fp16/bf16 headers found by ``kernel_harness``.

Tests that need nvcc or cupy skip with the reason when it is absent.
"""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import kernel_harness as kh
import pytest

EXPECTED_ENTRIES = {
    "matmul": ["matmul_fp32", "matmul_fp16", "matmul_bf16"],
    "reduce": ["reduce_fp32", "reduce_fp16", "reduce_bf16"],
    "elementwise": ["elementwise_fp32", "elementwise_fp16", "elementwise_bf16"],
    "stencil": ["stencil_fp32", "stencil_fp64"],
    "histogram": ["histogram_fp32"],
}

TUNABLES = {
    "matmul": ["MATMUL_TILE", "MATMUL_MAX_THREADS"],
    "reduce": ["REDUCE_MAX_THREADS"],
    "elementwise": [],
    "stencil": [],
    "histogram": ["HISTOGRAM_MAX_BINS"],
}

ALLOWED_INCLUDES = {"cuda_fp16.h", "cuda_bf16.h"}

FORBIDDEN = {
    "printf": r"\bprintf\b",
    "malloc": r"\bmalloc\b",
    "free": r"\bfree\s*\(",
    "assert": r"\bassert\s*\(",
    "__trap": r"__trap\b",
    "inline asm": r"\basm\b|__asm__",
    "#line": r"^\s*#\s*line\b",
    "_Pragma": r"_Pragma",
    "device-side launch": r"<<<",
    "function pointer": r"\(\s*\*\s*\w*\s*\)\s*\(",
    "extern __shared__": r"extern\s+__shared__",
}

needs_nvcc = pytest.mark.skipif(kh.find_nvcc() is None, reason="nvcc not on PATH")


def _code(kind: str) -> str:
    """The source with comments removed (they may name forbidden things)."""
    text = kh.kernel_source(kind).read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


# ------------------------------------------------------------------ sources --


@pytest.mark.parametrize("kind", kh.KINDS)
def test_entry_points_are_the_expected_ones(kind):
    assert kh.entry_points(kind) == EXPECTED_ENTRIES[kind]
    # Every __global__ function is one of them (no stray kernels).
    assert _code(kind).count("__global__") == len(EXPECTED_ENTRIES[kind])


@pytest.mark.parametrize("kind", kh.KINDS)
def test_source_keeps_to_the_allowed_subset(kind):
    code = _code(kind)
    includes = set(re.findall(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", code, re.M))
    assert includes <= ALLOWED_INCLUDES, f"{kind}.cu includes {includes}"
    pragmas = re.findall(r"^\s*#\s*pragma\s+(.*)$", code, re.M)
    assert all(re.fullmatch(r"unroll(\s+\d+)?\s*", p) for p in pragmas), pragmas
    found = [name for name, rx in FORBIDDEN.items() if re.search(rx, code, re.M)]
    assert not found, f"{kind}.cu uses {found}"


@pytest.mark.parametrize("kind", kh.KINDS)
def test_tunables_are_overridable_macros(kind):
    code = _code(kind)
    for name in TUNABLES[kind]:
        assert re.search(rf"#ifndef {name}\n#define {name} \d+\n#endif", code), name
        assert kh.macro_default(kind, name) > 0


@pytest.mark.parametrize("kind", kh.KINDS)
def test_every_dtype_shares_one_template(kind):
    """Entry points only forward to one templated implementation each."""
    bodies = re.findall(
        r'extern "C" __global__[^{]*\{([^}]*)\}', _code(kind), flags=re.S
    )
    assert len(bodies) == len(EXPECTED_ENTRIES[kind])
    callees = {re.match(r"\s*(\w+)<", b).group(1) for b in bodies}
    assert len(callees) == 1, callees
    assert all(b.count(";") == 1 for b in bodies)


# --------------------------------------------------------------------- nvcc --


@pytest.fixture(scope="session")
def ptx_files(tmp_path_factory):
    """``{(kind, arch): Path or the RuntimeError}`` from ``nvcc -ptx``."""
    if kh.find_nvcc() is None:
        pytest.skip("nvcc not on PATH")
    out = tmp_path_factory.mktemp("ptx")
    jobs = [(kind, arch) for kind in kh.KINDS for arch in kh.ARCHS]

    def compile_one(job):
        try:
            return kh.nvcc_ptx(*job, out)
        except RuntimeError as err:
            return err

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(compile_one, jobs), strict=True))


@needs_nvcc
@pytest.mark.parametrize("arch", kh.ARCHS)
@pytest.mark.parametrize("kind", kh.KINDS)
def test_nvcc_compiles_to_ptx(ptx_files, kind, arch):
    result = ptx_files[kind, arch]
    assert not isinstance(result, Exception), str(result)
    ptx = result.read_text()
    assert re.search(rf"^\.target sm_{arch}\b", ptx, re.M)
    entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M)
    assert sorted(entries) == sorted(EXPECTED_ENTRIES[kind])


@pytest.fixture(scope="session")
def resources(ptx_files, tmp_path_factory):
    """``{arch: {entry: usage}}`` from ptxas, also written to resources.json."""
    jobs = [(kind, arch) for kind in kh.KINDS for arch in kh.ARCHS]
    if any(isinstance(ptx_files[j], Exception) for j in jobs):
        pytest.skip("some kernel did not compile to PTX (see test_nvcc_compiles)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        usages = list(
            pool.map(lambda j: kh.nvcc_resource_usage(ptx_files[j], j[1]), jobs)
        )
    table: dict[str, dict[str, dict[str, int]]] = {}
    for (_, arch), usage in zip(jobs, usages, strict=True):
        table.setdefault(f"sm_{arch}", {}).update(usage)
    path = tmp_path_factory.mktemp("kernels") / "resources.json"
    path.write_text(json.dumps(table, indent=2, sort_keys=True))
    print(f"\nkernel resource usage -> {path}")
    print(f"{'entry':18} {'arch':6} {'regs':>5} {'smem B':>7} {'spill B':>8}")
    for arch, entries in table.items():
        for entry, u in sorted(entries.items()):
            spill = u.get("spill_store_bytes", 0) + u.get("spill_load_bytes", 0)
            print(
                f"{entry:18} {arch:6} {u['registers']:5d} {u['shared_bytes']:7d} "
                f"{spill:8d}"
            )
    return table


@needs_nvcc
def test_resource_usage_is_as_designed(resources):
    tile = kh.macro_default("matmul", "MATMUL_TILE")
    max_threads = kh.macro_default("matmul", "MATMUL_MAX_THREADS")
    static_smem = {
        "matmul": 2 * tile * tile * 4,
        "reduce": kh.macro_default("reduce", "REDUCE_MAX_THREADS") * 4,
        "elementwise": 0,
        "stencil": 0,
        "histogram": kh.macro_default("histogram", "HISTOGRAM_MAX_BINS") * 4,
    }
    for arch in kh.ARCHS:
        usage = resources[f"sm_{arch}"]
        for kind, entries in EXPECTED_ENTRIES.items():
            for entry in entries:
                u = usage[entry]
                assert u["registers"] > 0, (entry, arch)
                assert u["shared_bytes"] == static_smem[kind], (entry, arch, u)
                assert u["spill_store_bytes"] == 0, (entry, arch, u)
            if kind == "matmul":
                # __launch_bounds__ keeps a block of MATMUL_MAX_THREADS launchable
                # on a 64K-register SM.
                assert all(
                    usage[e]["registers"] * max_threads <= 65536 for e in entries
                )


def test_ptxas_output_parser():
    text = """ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 54 registers, used 1 barriers, 2048 bytes smem, 388 bytes cmem[0]
ptxas info    : Function properties for j
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 392 bytes cmem[0]
"""
    assert kh.parse_ptxas_usage(text) == {
        "k": {
            "registers": 54,
            "shared_bytes": 2048,
            "barriers": 1,
            "stack_bytes": 8,
            "spill_store_bytes": 4,
            "spill_load_bytes": 12,
        },
        "j": {
            "registers": 10,
            "shared_bytes": 0,
            "barriers": 0,
            "stack_bytes": 0,
            "spill_store_bytes": 0,
            "spill_load_bytes": 0,
        },
    }


# -------------------------------------------------------------------- NVRTC --


@pytest.fixture(scope="session")
def nvrtc_headers():
    """The include folder for NVRTC; skips when NVRTC cannot load or has none."""
    pytest.importorskip("cupy", reason="cupy (the gpu extra) not installed")
    try:
        version = kh.nvrtc_version()
    except Exception as err:  # cupy raises its own types when libnvrtc is missing
        pytest.skip(
            f"NVRTC library not loadable ({err}); install nvidia-cuda-nvrtc-cu12"
        )
    include = kh.nvrtc_include_dir()
    if include is None:
        pytest.skip(
            "no cuda_fp16.h/cuda_bf16.h found: install "
            "nvidia-cuda-runtime-cu12 or a CUDA toolkit"
        )
    print(f"\nNVRTC {version[0]}.{version[1]} with headers from {include}")
    return include


@pytest.mark.parametrize("arch", kh.ARCHS)
@pytest.mark.parametrize("kind", kh.KINDS)
def test_nvrtc_compiles_to_ptx(nvrtc_headers, kind, arch):
    ptx = kh.nvrtc_ptx(kind, arch, nvrtc_headers)
    assert re.search(rf"^\.target sm_{arch}\b", ptx, re.M)
    entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M)
    assert sorted(entries) == sorted(EXPECTED_ENTRIES[kind])


def test_header_search_finds_the_toolkit_headers():
    """Where nvcc is installed, its own include folder is among the candidates."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    nvcc_dirs = [d for d in kh.nvcc_include_dirs() if (d / "cuda_fp16.h").is_file()]
    assert nvcc_dirs, "nvcc -dryrun named no include folder with cuda_fp16.h"
    assert set(nvcc_dirs) <= set(kh.header_include_dirs())
