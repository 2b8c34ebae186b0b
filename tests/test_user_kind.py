"""A sixth kind written by a user: registered once, it works with every
policy, Gate 1, the environment and the model, cpu, dask and (emulated) cuda
backends; a bad registration fails in one line and registers nothing."""

from __future__ import annotations

import numpy as np
import pytest

from lib.codegen.emulate import find_cxx
from lib.codegen.kinds import KindError, register_kind
from lib.contract import KIND_DIMS, KINDS, ContractError, Decision, TaskSpec
from lib.env import EnvConfig, SplitEnv
from lib.platform.machines import load_machine
from lib.platform.user_kinds import unregister_workload
from lib.platform.workloads import WORKLOADS, like_of, workload
from lib.policies.registry import POLICIES, make_policy
from lib.runtime import Agent
from lib.security import check_decision

SOFTMAX_CU = r"""
extern "C" __global__ void softmax_fp32(const float* x, float* out, long long rows,
                                        long long R, long long C) {
    (void)R;  // the task's row count; this shard has ``rows`` of them
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows;
         r += (long long)gridDim.x * blockDim.x) {
        const float* row = x + r * C;
        float m = row[0];
        for (long long c = 1; c < C; ++c) m = fmaxf(m, row[c]);
        float s = 0.0f;
        for (long long c = 0; c < C; ++c) s += expf(row[c] - m);
        for (long long c = 0; c < C; ++c) out[r * C + c] = expf(row[c] - m) / s;
    }
}
"""

DOT_CU = r"""
extern "C" __global__ void dot_fp32(const float* x, const float* y, float* out,
                                    long long rows, long long N) {
    (void)N;
    float acc = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < rows;
         i += (long long)gridDim.x * blockDim.x)
        acc += x[i] * y[i];
    atomicAdd(out, acc);
}
"""


def softmax_inputs(task, rng):
    r, c = task.dims["R"], task.dims["C"]
    return {"x": rng.standard_normal((r, c)).astype(np.float32)}


def softmax_reference(task, x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_work(task, rows):
    c = task.dims["C"]
    return {"flops": 5.0 * rows * c, "bytes_in": 4.0 * rows * c,
            "bytes_out": 4.0 * rows * c}


def dot_inputs(task, rng):
    n = task.dims["N"]
    return {"x": rng.uniform(0, 1, n).astype(np.float32),
            "y": rng.uniform(0, 1, n).astype(np.float32)}


def dot_reference(task, x, y):
    return np.array([np.dot(x.astype(np.float64), y.astype(np.float64))])


def dot_work(task, rows):
    return {"flops": 2.0 * rows, "bytes_in": 8.0 * rows, "bytes_out": 4.0}


def register_softmax(**over):
    args = dict(dims=("R", "C"), divisible="R", merge="concat",
                inputs=softmax_inputs, reference=softmax_reference,
                work=softmax_work, cuda_source=SOFTMAX_CU, like="elementwise")
    args.update(over)
    return register_kind("softmax", **args)


def register_dot():
    return register_kind("dot", dims=("N",), divisible="N", merge="sum",
                         inputs=dot_inputs, reference=dot_reference, work=dot_work,
                         cuda_source=DOT_CU, like="reduce", output_dtype="float32",
                         example={"N": 1000})


@pytest.fixture
def kinds():
    """softmax (concat) and dot (sum), forgotten after the test."""
    yield register_softmax(), register_dot()
    for name in ("softmax", "dot"):
        unregister_workload(name)
    assert set(KIND_DIMS) == set(KINDS) and set(WORKLOADS) == set(KINDS)



def softmax_task(rows=3000, cols=64):
    return TaskSpec("softmax", {"R": rows, "C": cols})


def test_a_registered_kind_is_a_task_kind_with_its_own_work_counts(kinds):
    task = softmax_task()
    assert task.split_name == "R" and task.merge == "concat"
    w = workload(task)
    assert w.work(task, 10).flops == 5.0 * 10 * 64
    assert like_of("softmax") == "elementwise" and like_of("matmul") == "matmul"
    with pytest.raises(ContractError, match="dims.K"):
        TaskSpec("softmax", {"R": 4, "C": 4, "K": 1})
    assert "softmax" not in KINDS  # the trained vocabulary is unchanged


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_decides_for_it_and_gate1_accepts(kinds, policy):
    m = load_machine("hetero-4")
    for task in (softmax_task(200_000, 256), TaskSpec("dot", {"N": 50_000_000})):
        d = make_policy(policy).decide(task, m, None).with_hash(task)
        verdict = check_decision(d, task, m)
        assert verdict.accepted, (policy, task.kind, verdict.summary())


def test_the_learned_policy_puts_more_on_faster_devices(kinds):
    m = load_machine("hetero-4")
    d = Agent(machine=m).optimize(softmax_task(400_000, 512))
    shares = dict(zip(d.gpus, d.shares, strict=True))
    # hetero-4: device 0 an H100, device 3 a T4 (the profile's peaks)
    assert shares[0] > shares.get(3, 0.0)


def test_the_environment_steps_on_its_tasks(kinds):
    env = SplitEnv(EnvConfig(machine="hetero-4", tasks=(softmax_task(),)))
    obs, _ = env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.action_space.sample())
    assert np.isfinite(reward) and terminated
    env.close()


@pytest.mark.serial
@pytest.mark.parametrize("machine,backend", [("hetero-4", "model"),
                                             ("local-cpu", "cpu"),
                                             ("dask-local:2", "dask")])
def test_it_runs_and_verifies_on_the_model_cpu_and_dask_backends(kinds, machine,
                                                                 backend):
    with Agent(machine=machine, backend=backend) as agent:
        for task in (softmax_task(), TaskSpec("dot", {"N": 200_001})):
            d = agent.optimize(task)
            r = agent.execute(task, d, verify=True)
            assert r.metrics.verified is True, (backend, task.kind)
            assert r.metrics.measured is (backend != "model")


@pytest.mark.serial
def test_an_uneven_split_on_the_cpu_workers_equals_the_reference(kinds):
    task = softmax_task(1001, 33)
    d = Decision(gpus=(0, 1), shares=(0.73, 0.27), chunk=1001, block=256,
                 mode="split", comm_path="host").with_hash(task)
    with Agent(machine="local-cpu", backend="cpu") as agent:
        out = agent.execute(task, d, verify=True).output
    w = workload(task)
    np.testing.assert_allclose(out, w.reference(task, w.make_inputs(task, 0)),
                               rtol=1e-6)


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler for emulated kernels")
@pytest.mark.parametrize("mode", ["split", "pipelined"])
def test_its_cuda_kernels_run_on_emulated_gpus_and_verify(kinds, hetero4, mode,
                                                          tmp_path, monkeypatch):
    import emulated_cupy as ec

    from lib.execution.cuda import CudaBackend

    try:  # the stand-in hands the backend's probe the real NVRTC
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"no NVRTC here ({type(exc).__name__}: {exc!s:.80})")
    builds = ec.session_builds(tmp_path)
    cp = ec.make_cupy(4, builds)
    ec.install(cp, monkeypatch)
    for task, gpus, shares in ((softmax_task(301, 17), (0, 1, 3), (0.5, 0.3, 0.2)),
                               (TaskSpec("dot", {"N": 1003}), (1, 2), (0.6, 0.4))):
        chunk = 50 if mode == "pipelined" else task.split_size
        d = Decision(gpus=gpus, shares=shares, chunk=chunk, block=32, mode=mode,
                     comm_path="host").with_hash(task)
        with CudaBackend(hetero4, warmup=0) as b:
            r = b.run(task, d, verify=True)
        assert r.metrics.verified is True, (task.kind, mode)
        assert set(r.metrics.per_device_seconds) == set(gpus)
    assert cp.gpus.races == []


def test_a_kernel_gate2a_refuses_refuses_the_kind_and_registers_nothing(kinds):
    evil = SOFTMAX_CU.replace("float s = 0.0f;", 'float s = 0.0f; system("id");')
    before = WORKLOADS["softmax"]
    with pytest.raises(KindError, match=r"^kind softmax: softmax_fp32 refused by "
                                        r"gate2a"):
        register_softmax(cuda_source=evil)
    assert WORKLOADS["softmax"] is before  # the earlier registration is kept


@pytest.mark.parametrize("over,message", [
    ({"cuda_source": SOFTMAX_CU.replace("softmax_fp32", "soft_fp32")},
     "has no extern \"C\" __global__ softmax_fp32"),
    ({"reference": lambda task, x: np.exp(x) / np.exp(x).sum()},
     "does not divide over the rows"),
    ({"work": lambda task, rows: {"flops": float(rows) ** 2, "bytes_in": 1.0,
                                  "bytes_out": 1.0}}, "flops .* not affine"),
    ({"work": lambda task, rows: {"flops": 1.0}}, "missing bytes_in, bytes_out"),
    ({"like": "softmax"}, "like 'softmax': expected a built-in kind"),
    ({"divisible": "K"}, "divisible 'K' is not one of its dims"),
    ({"merge": "max"}, "merge 'max'"),
    ({"dtypes": ("fp8",)}, "dtypes"),
    # a reference that centres its input in place: each shard would centre on
    # its own mean, and the check (reading the changed input) would agree
    ({"reference": lambda task, x: np.subtract(x, x.mean(), out=x)},
     "the reference writes into its inputs"),
    ({"output_dtype": "O"}, "output_dtype 'O': expected a numeric NumPy dtype"),
    ({"output_dtype": "U8"}, "output_dtype 'U8'"),
    ({"output_dtype": "int8", "reference": lambda task, x: x * 1000.0},
     "outside the output dtype int8"),
    ({"reference": lambda task, x: x * np.nan}, "NaN or inf"),
    ({"dims": "RC"}, "dims 'RC': expected a list or tuple"),
    ({"dtypes": "fp32"}, "dtypes 'fp32': expected a list or tuple"),
    ({"sliced": "x"}, "sliced 'x': expected a list or tuple"),
    ({"reference": None}, "reference: expected a function"),
    ({"cuda_source": 'extern "C" __global__ void softmax_fp32() {'},
     "kind softmax: "),
    ({"inputs": lambda task, rng: {"a/b": softmax_inputs(task, rng)["x"]}},
     "input name 'a/b': expected an identifier"),
])
def test_bad_registrations_fail_in_one_line_naming_the_kind(over, message):
    try:
        with pytest.raises(KindError, match=message) as err:
            register_softmax(**over)
        assert str(err.value).startswith("kind softmax") and "\n" not in str(err.value)
        assert "softmax" not in KIND_DIMS and "softmax" not in WORKLOADS
    finally:
        unregister_workload("softmax")


def test_a_kind_split_along_its_second_dimension_registers_and_runs():
    """The self-check splits the dimension the kind says it splits, not the
    first one."""
    try:
        register_kind("colscale", dims=("C", "R"), divisible="R", merge="concat",
                      inputs=lambda t, rng: {"x": rng.standard_normal(
                          (t.dims["R"], t.dims["C"])).astype(np.float32)},
                      reference=lambda t, x: 3 * x,
                      work=lambda t, r: {"flops": 1.0 * r, "bytes_in": 4.0 * r,
                                         "bytes_out": 4.0 * r},
                      output_shape=lambda t, r: (r, t.dims["C"]))
        task = TaskSpec("colscale", {"C": 8, "R": 1000}, divisible_dim=1)
        agent = Agent(machine="hetero-4")
        assert agent.execute(task, agent.optimize(task), verify=True).metrics.verified
        # a task of the kind splits the dimension it registered by default
        assert TaskSpec("colscale", {"C": 8, "R": 1000}) == task
        assert TaskSpec("colscale", {"C": 8, "R": 1000}, merge="concat") == task
        with pytest.raises(ContractError, match="cannot split C with merge"):
            TaskSpec("colscale", {"C": 8, "R": 1000}, divisible_dim=0)
    finally:
        unregister_workload("colscale")


def test_a_dtype_the_kind_does_not_support_is_refused(kinds):
    task = TaskSpec("softmax", {"R": 100, "C": 8}, "fp64")
    with pytest.raises(ValueError, match="dtype 'fp64' is not one it supports"):
        Agent(machine="hetero-4").optimize(task)


def test_a_built_in_name_cannot_be_registered():
    with pytest.raises(KindError, match="built-in"):
        register_kind("matmul", dims=("N",), divisible="N", merge="concat",
                      inputs=dot_inputs, reference=dot_reference, work=dot_work)
    assert KIND_DIMS["matmul"] == ("M", "N", "K")
