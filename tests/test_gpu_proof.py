"""The GPU proof (``python -m lib.execution.gpu_proof``) without a GPU.

Its command line (``--dry-run`` lists the plan; the real mode refuses here with
one line and exit 2, also with jinja2 missing), its supervisor (a case that
hangs is killed at its budget, a worker that dies mid-case costs only that
case), its summaries, the kernel sources it falls back to, and its cases
themselves, run small on the CuPy stand-in.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import emulated_cupy as ec
import pytest

from lib.codegen.emulate import find_cxx
from lib.codegen.nvrtc import compile_ptx
from lib.codegen.specialise import KIND_DTYPES
from lib.contract import TaskSpec
from lib.execution import cuda as cuda_mod
from lib.execution import gpu_proof as gp
from lib.platform.cudastack import probe
from lib.platform.machines import catalog_device

ROOT = Path(__file__).resolve().parents[1]


def proof(*args: str, block_jinja2: bool = False) -> subprocess.CompletedProcess:
    """``python -m lib.execution.gpu_proof ARGS`` (jinja2 made unimportable when
    asked, as on a GPU host without the project's other dependencies)."""
    code = textwrap.dedent(f"""
        import runpy, sys
        if {block_jinja2}:
            sys.modules["jinja2"] = None
        sys.argv = ["gpu_proof", *{list(args)!r}]
        runpy.run_module("lib.execution.gpu_proof", run_name="__main__")
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


# -- the command line ---------------------------------------------------------------


@pytest.mark.parametrize("block_jinja2", [False, True], ids=["full", "no-jinja2"])
def test_dry_run_lists_every_case_and_exits_0(tmp_path, block_jinja2):
    done = proof("--out", str(tmp_path / "out"), "--dry-run",
                 block_jinja2=block_jinja2)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for kind, dtypes in gp.KIND_DTYPES.items():
        for dt in dtypes:
            for mode in ("single", "pipelined"):
                assert any(f"kinds/{kind}-{dt}-{mode} " in ln for ln in lines)
    text = done.stdout
    for group in ("one-gpu-shards/", "replan/", "multi-gpu/", "limits/matmul-",
                  "limits/reduce-fp16-2147483647", "pytest:", "compute-sanitizer:"):
        assert group in text
    assert ("jinja2" in text) == block_jinja2
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


@pytest.mark.skipif(probe().usable, reason="a GPU is here: the real mode would run")
@pytest.mark.parametrize("block_jinja2", [False, True], ids=["full", "no-jinja2"])
def test_the_real_mode_without_a_gpu_refuses_in_one_line(tmp_path, block_jinja2):
    done = proof("--out", str(tmp_path / "out"), "--timeout-s", "30",
                 block_jinja2=block_jinja2)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("gpu_proof: no usable GPU here")
    assert not (tmp_path / "out").exists()


def test_the_plan_agrees_with_the_kernels():
    assert gp.KIND_DTYPES == KIND_DTYPES
    names = [c.name for c in gp.plan()]
    assert len(names) == len(set(names))
    assert names[-2:] == ["limits/matmul-1052657-rows",
                          "limits/reduce-fp16-2147483647"]  # the heavy ones last
    big = TaskSpec("matmul", gp.BIG_MATMUL)
    assert len(cuda_mod.launch_plan(big, big.dims["M"], 256)) == 2
    assert gp.gpu_test_files(ROOT / "tests") == ["tests/test_cuda_backend.py",
                                                 "tests/test_telemetry.py"]


@pytest.mark.parametrize(("kind", "dtype"), [(k, d) for k, ds in KIND_DTYPES.items()
                                             for d in ds])
def test_the_shipped_sources_compile_with_their_options(kind, dtype):
    """The fallback without the code-gen plane: kernels/<kind>.cu as shipped,
    tunables as -D options; NVRTC must accept it and define the entry point."""
    task = TaskSpec(kind, gp.SANITIZER_SIZES[kind], dtype=dtype)
    source, name, options = gp.shipped_source_provider(task, gp.decision(task, (0,)))
    try:
        ptx = compile_ptx(source, f"{kind}.cu", 80, options)
    except Exception as exc:
        if "NVRTC" in str(exc) or "nvrtc" in type(exc).__module__:
            raise
        pytest.skip(f"NVRTC unavailable here ({type(exc).__name__})")
    assert f".entry {name}(" in ptx


# -- summaries ---------------------------------------------------------------------


def test_pytest_and_sanitizer_summaries_are_read():
    assert gp.pytest_summary("....\n3 passed, 2 skipped, 1 error in 4.2s\n") == {
        "passed": 3, "skipped": 2, "error": 1}
    assert gp.pytest_summary("no tests ran in 0.1s") == {}
    assert gp.sanitizer_summary("========= ERROR SUMMARY: 0 errors") == {"errors": 0}
    assert gp.sanitizer_summary("========= RACECHECK SUMMARY: 2 hazards displayed "
                                "(1 error, 1 warning)") == {
        "hazards": 2, "errors": 1, "warnings": 1}
    assert gp.sanitizer_summary("it crashed") is None


def test_the_summary_counts_what_ran():
    report = {"cases": [
        {"name": "a", "verified": True, "error": None, "seconds": 1.0,
         "per_device_seconds": {"0": 0.5}, "total_seconds": 0.8,
         "merge_path": "nccl", "overlap": {"0": True}},
        {"name": "b", "verified": False, "error": "boom", "seconds": 2.0},
        {"name": "c", "skipped": "needs 2 GPUs, 1 here"},
    ], "pytest": {"rc": 0, "counts": {"passed": 4}},
        "sanitizer": {"memcheck": {"rc": 0}, "racecheck": {"rc": 99}}}
    s = gp.summarise(report)
    assert (s["passed"], s["failed"], s["skipped"]) == (1, 1, 1)
    assert s["failures"] == ["b"] and s["per_device_seconds"] == {"0": 0.5}
    assert s["nccl_ran"] and s["pieces_overlapped"] and s["pytest_ok"]
    assert not s["sanitizer_clean"] and not s["all_passed"]


# -- the supervisor ------------------------------------------------------------------

FAKE_WORKER = """
import json, sys, time
out = sys.argv[1]
def line(**obj):
    with open(out, "a") as fh:
        fh.write(json.dumps(obj) + "\\n")
line(event="start", name="fine")
line(event="case", name="fine", verified=True, error=None, seconds=0.1)
line(event="start", name={second!r})
{then}
"""


@pytest.mark.parametrize(("second", "then", "says"), [
    ("hangs", "time.sleep(60)", "killed after"),
    ("dies", "sys.exit(-9)", "exited with status"),
], ids=["hang", "crash"])
def test_the_supervisor_settles_a_hanging_or_dying_case(tmp_path, second, then,
                                                        says):
    script = tmp_path / "worker.py"
    results = tmp_path / "cases.jsonl"
    script.write_text(FAKE_WORKER.format(second=second, then=then))
    results.write_text("")

    def case(name: str) -> gp.Case:
        return gp.Case(name, 1, name, 1.0, lambda ctx: {})

    p = gp.Proof(tmp_path, 60.0, 1)
    start = time.time()
    done = p.watch([sys.executable, str(script), str(results)], results,
                   {"fine": case("fine"), second: case(second)}, time.time() + 30)
    assert done == {"fine", second} and time.time() - start < 10
    by_name = {c["name"]: c for c in p.report["cases"]}
    assert by_name["fine"]["verified"] is True
    assert says in by_name[second]["error"] and by_name[second]["verified"] is False
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["summary"]["failures"] == [second]


# -- the cases, small, on the stand-in ---------------------------------------------

SMALL = {
    "elementwise": TaskSpec("elementwise", {"N": 3001}),
    "reduce": TaskSpec("reduce", {"N": 5003}),
    "histogram": TaskSpec("histogram", {"N": 4099, "B": 37}),
    "matmul": TaskSpec("matmul", {"M": 37, "N": 29, "K": 45}),
}


@pytest.fixture
def stand_in(tmp_path_factory, monkeypatch):
    """A four-GPU stand-in installed as ``cupy`` and a proof context over it."""
    if find_cxx() is None:
        pytest.skip("no C++ compiler (g++ or clang++) for emulated kernels")

    def make(**options):
        builds = ec.session_builds(tmp_path_factory.mktemp("emulated_cupy"))
        cp = ec.make_cupy(4, builds, **options)
        ec.install(cp, monkeypatch)
        return cp, gp.Context(4, None, catalog_device(0, "H100 SXM"))

    return make


@pytest.mark.parametrize("case", [
    gp.kind_case(SMALL["elementwise"], "pipelined"),
    gp.shared_case(SMALL["elementwise"], "split", "host"),
    gp.shared_case(SMALL["histogram"], "split", "p2p"),
    gp.shared_case(SMALL["reduce"], "pipelined", "nccl"),
    gp.replan_case(SMALL["elementwise"]),
    gp.multi_case(SMALL["reduce"], "split", "nccl"),
    gp.replan_case(SMALL["elementwise"], multi=True),
], ids=lambda c: c.name)
def test_proof_cases_pass_on_the_stand_in(stand_in, case):
    cp, ctx = stand_in()
    out = case.run(ctx)
    assert out["verified"] is True and cp.gpus.races == []
    if "replan" in case.name:
        assert out["replanned"]["failed_device"] == 1
        assert "out of memory" in out["replanned"]["reason"]
    if case.name.startswith("one-gpu-shards/"):
        assert set(out["device_map"].values()) == {0}


def test_the_grid_case_runs_in_row_blocks_on_the_stand_in(stand_in, monkeypatch):
    monkeypatch.setattr(cuda_mod, "MAX_GRID_Y", 2)
    cp, ctx = stand_in(max_grid_yz=2)
    out = gp.grid_case(SMALL["matmul"]).run(ctx)
    assert out["verified"] is True and out["launches"] == 2
    assert len([e for e in cp.gpus.log if e[0] == "launch"]) == 2


def test_a_case_that_does_not_run_as_asked_fails(stand_in):
    """nccl asked over real GPUs must run as nccl: without the library it fails."""
    _, ctx = stand_in(nccl=False)
    with pytest.raises(AssertionError, match="merge_path is 'p2p', expected 'nccl'"):
        gp.multi_case(SMALL["reduce"], "split", "nccl").run(ctx)


def test_the_worker_writes_a_line_per_case_and_survives_a_failing_one(
        stand_in, tmp_path, monkeypatch):
    stand_in()

    def broken(ctx):
        raise RuntimeError("this case fails")

    cases = [gp.kind_case(SMALL["elementwise"], "single"),
             gp.Case("broken/case", 1, "fails", 10.0, broken),
             gp.shared_case(SMALL["histogram"], "split", "p2p")]
    monkeypatch.setattr(gp, "plan", lambda: cases)
    results = tmp_path / "cases.jsonl"
    rc = gp.worker([c.name for c in cases], results, time.time() + 120, True)
    events = [json.loads(line) for line in results.read_text().splitlines()]
    assert rc == 0 and events[0]["event"] == "environment"
    assert events[0]["environment"]["python"] and "devices" in events[0]["environment"]
    done = {e["name"]: e for e in events if e["event"] == "case"}
    assert list(done) == [c.name for c in cases]
    assert done["broken/case"]["error"] == "RuntimeError: this case fails"
    assert all(done[c.name]["verified"] is True for c in (cases[0], cases[2]))
    assert done[cases[2].name]["merge_path"] == "p2p"


def test_the_sanitizer_workload_runs_every_kernel(stand_in, monkeypatch, capsys):
    stand_in()
    monkeypatch.setattr(gp, "SANITIZER_SIZES", {
        "matmul": {"M": 37, "N": 29, "K": 45}, "reduce": {"N": 5003},
        "elementwise": {"N": 3001}, "stencil": {"H": 19, "W": 23, "T": 2},
        "histogram": {"N": 4099, "B": 37}})
    assert gp.sanitizer_workload() == 0
    printed = capsys.readouterr().out
    assert printed.count("verified=True") == 7 and "verified=False" not in printed
