"""The gpuhive command: the walking skeleton's acceptance commands, for real."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lib.contract import ContractError


def gpuhive(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lib.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_explain_gives_the_t4_less_than_the_h100():
    p = gpuhive("explain", "--kind", "matmul", "--dim", "M=8192", "--dim", "N=8192",
                "--dim", "K=8192", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["policy"] == "rl-ppo"
    shares = dict(zip(out["decision"]["gpus"], out["decision"]["shares"],
                      strict=True))
    assert shares.get(3, 0.0) < shares[0]
    assert out["prediction"]["label"] == "PREDICTED"
    assert len(out["prediction"]["devices"]) == len(out["decision"]["gpus"])


def test_explain_with_proportional_to_peak_splits_over_all_four():
    p = gpuhive("explain", "--kind", "matmul", "--dim", "M=8192", "--dim", "N=8192",
                "--dim", "K=8192", "--policy", "proportional-peak", "--json")
    out = json.loads(p.stdout)
    shares = dict(zip(out["decision"]["gpus"], out["decision"]["shares"],
                      strict=True))
    assert set(shares) == {0, 1, 2, 3} and shares[3] < shares[0]


def test_explain_text_prints_the_breakdown():
    p = gpuhive("explain", "--kind", "matmul", "--dim", "M=8192", "--dim", "N=8192",
                "--dim", "K=8192")
    assert p.returncode == 0
    assert "PREDICTED breakdown" in p.stdout and "0:H100 SXM" in p.stdout
    assert "PREDICTED total" in p.stdout and "exhaustive optimum" in p.stdout


def test_explain_shows_every_term_of_the_total():
    """On the cores the host's serial work for each shard is part of the
    total, and the breakdown prints it: the slowest device, the merge and
    the host's work add up to the total."""
    from lib.contract import Decision, TaskSpec
    from lib.costmodel import predict
    from lib.platform.machines import load_machine

    p = gpuhive("explain", "--kind", "reduce", "--dim", "N=1000000",
                "--machine", "local-cpu", "--telemetry", "none", "--json")
    shown = json.loads(p.stdout)
    task = TaskSpec.from_json(shown["task"])
    pred = predict(task, Decision.from_json(shown["decision"]),
                   load_machine("local-cpu"))
    assert pred.t_host > 0
    text = gpuhive("explain", "--kind", "reduce", "--dim", "N=1000000",
                   "--machine", "local-cpu", "--telemetry", "none").stdout
    assert "host's serial work for the shards" in text
    assert max(d.total for d in pred.devices) + pred.t_merge + pred.t_host \
        == pytest.approx(pred.total)


def test_run_on_local_cpu_measures_and_verifies():
    p = gpuhive("run", "--kind", "reduce", "--dim", "N=4194304", "--machine",
                "local-cpu", "--backend", "cpu", "--verify")
    assert p.returncode == 0, p.stderr
    assert "verified true" in p.stdout
    device_lines = [x for x in p.stdout.splitlines() if "CPU core" in x]
    assert device_lines and all(x.rstrip().endswith("MEASURED") for x in device_lines)


def test_run_warms_the_workers_up_before_it_times_by_default():
    task = ["run", "--kind", "reduce", "--dim", "N=65536", "--machine", "local-cpu",
            "--backend", "cpu"]
    p = gpuhive(*task, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["warmup"] == 1 and out["metrics"]["repeats"] == 1
    p = gpuhive(*task, "--warmup", "0", "--repeats", "3")
    assert p.returncode == 0, p.stderr
    assert "(cpu backend, no warm-up, median of 3)" in p.stdout
    p = gpuhive(*task[:-2], "--backend", "model", "--json")
    assert json.loads(p.stdout)["warmup"] == 0  # a prediction warms nothing up


@pytest.mark.parametrize("backend", ["cpu", "cuda", "dask"])
def test_run_hands_repeats_and_warmups_to_every_measuring_backend(backend):
    from lib.cli import build_parser
    from lib.cli.run import backend_options

    args = build_parser().parse_args(["run", "--backend", backend, "--repeats", "5",
                                      "--warmup", "2", "--seed", "7"])
    assert backend_options(args) == {"seed": 7, "repeats": 5, "warmup": 2}
    args = build_parser().parse_args(["run", "--backend", "model"])
    assert backend_options(args) == {"seed": 0}


@pytest.mark.parametrize("args, needle", [
    (["run", "--kind", "matmul", "--dim", "M=-1", "--dim", "N=4", "--dim", "K=4"],
     "dims.M"),
    (["run", "--kind", "matmul", "--dim", "M=4"], "dims.N: missing"),
    (["run", "--kind", "reduce", "--dim", "N=abc"], "not an integer"),
    (["explain", "--kind", "reduce", "--dim", "N=8", "--machine", "mars"],
     "unknown machine 'mars'"),
    (["run", "--kind", "reduce", "--dim", "N=8", "--backend", "cuda"], "cuda"),
    (["run", "--kind", "fft"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    p = gpuhive(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("content, needle", [
    ('{"gpus": [0], "shares": [1.0], "chunk": 1.5, "block": 256, "mode": "single",'
     ' "comm_path": "host"}', "chunk"),
    ('{"gpus": [0], "shares": [NaN]', "json"),
    ("not json at all", "json"),
])
def test_malformed_decision_file_is_one_line_and_exit_2(tmp_path, content, needle):
    f = tmp_path / "decision.json"
    f.write_text(content)
    p = gpuhive("run", "--kind", "reduce", "--dim", "N=100", "--decision", str(f))
    assert p.returncode == 2 and needle in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_hand_written_decision_runs_with_rehash(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"gpus": [3, 0], "shares": [0.9, 0.1], "chunk": 1024,
                             "block": 128, "mode": "split", "comm_path": "host"}))
    p = gpuhive("run", "--kind", "reduce", "--dim", "N=1024", "--decision", str(f))
    assert p.returncode == 2 and "integrity.missing_hash" in p.stderr
    p = gpuhive("run", "--kind", "reduce", "--dim", "N=1024", "--decision", str(f),
                "--rehash", "--verify", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"]["verified"] is True


def test_validate_exit_codes(tmp_path):
    task = tmp_path / "t.json"
    task.write_text(json.dumps({"kind": "reduce", "dims": {"N": 1000},
                                "dtype": "fp32", "divisible_dim": 0,
                                "merge": "sum"}))
    dec = tmp_path / "d.json"
    dec.write_text(json.dumps({"gpus": [0, 0], "shares": [0.5, 0.6], "chunk": 1000,
                               "block": 256, "mode": "split", "comm_path": "host"}))
    p = gpuhive("validate", str(dec), "--task", str(task), "--json")
    assert p.returncode == 1
    checks = {v["check"] for v in json.loads(p.stdout)["violations"]}
    assert {"contract.duplicate_device", "contract.share_sum"} <= checks
    p = gpuhive("validate", str(tmp_path / "missing.json"), "--task", str(task))
    assert p.returncode == 2


def test_what_decide_printed_runs_and_validates_as_a_decision_file(tmp_path):
    """``gpuhive decide > d.json`` feeds ``run --decision`` and ``validate``:
    its task and machine come with it, and another task or machine is refused
    by name; a tampered decision in it is Gate 1's to reject."""
    out = tmp_path / "d.json"
    decided = gpuhive("decide", "--kind", "reduce", "--dim", "N=100000",
                      "--machine", "uni-server-1gpu")
    assert decided.returncode == 0, decided.stderr
    out.write_text(decided.stdout)
    p = gpuhive("run", "--decision", str(out), "--machine", "uni-server-1gpu",
                "--verify", "--json")
    assert p.returncode == 0, p.stderr
    ran = json.loads(p.stdout)
    assert ran["decision"] == json.loads(decided.stdout)["decision"]
    assert ran["task"]["dims"] == {"N": 100000} and ran["metrics"]["verified"]
    p = gpuhive("validate", str(out), "--machine", "uni-server-1gpu")
    assert p.returncode == 0 and "accepted" in p.stdout, p.stderr
    for argv, says in (
            (["run", "--decision", str(out)],
             "decided for machine uni-server-1gpu, not hetero-4 "
             "(give --machine uni-server-1gpu)"),
            (["run", "--decision", str(out), "--machine", "uni-server-1gpu",
              "--kind", "reduce", "--dim", "N=5"],
             "decided for reduce[N=100000] fp32, not reduce[N=5] fp32"),
            (["validate", str(out)], "not hetero-4")):
        p = gpuhive(*argv)
        assert p.returncode == 2 and says in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    # what explain --json prints carries the same three fields, and more
    explained = gpuhive("explain", "--kind", "reduce", "--dim", "N=100000",
                        "--machine", "uni-server-1gpu", "--json")
    out.write_text(explained.stdout)
    p = gpuhive("validate", str(out), "--machine", "uni-server-1gpu")
    assert p.returncode == 0 and "accepted" in p.stdout, p.stderr
    tampered = json.loads(decided.stdout)
    tampered["decision"]["block"] = 512 if tampered["decision"]["block"] != 512 else 256
    out.write_text(json.dumps(tampered))
    p = gpuhive("validate", str(out), "--machine", "uni-server-1gpu")
    assert p.returncode == 1 and "integrity" in p.stdout, p.stdout
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads(decided.stdout)["decision"]))
    p = gpuhive("validate", str(bare), "--machine", "uni-server-1gpu")
    assert p.returncode == 2 and "give --task TASK.json" in p.stderr
    p = gpuhive("run", "--decision", str(bare), "--machine", "uni-server-1gpu")
    assert p.returncode == 2 and "holds a decision alone" in p.stderr


def test_doctor_reports_backends():
    p = gpuhive("doctor", "--json")
    assert p.returncode == 0
    out = json.loads(p.stdout)
    assert out["backends"]["cpu"]["real"] is True
    assert out["backends"]["model"]["real"] is False
    assert "hetero-4" in out["machines"]
    if not out["backends"]["cuda"]["real"]:
        assert out["cuda_reasons"] and out["missing"]["driver"]
    assert out["backends"]["dask"]["real"] is True   # a dependency of the project
    # what the runtime would read before a decision on the cpu backend, now
    assert out["telemetry"]["cpu"].startswith("MEASURED local-cpu: capacity ")
    # what a run may use here: memory, CPUs, the folders of shared buffers
    assert "GB available, of which a run plans on 90%" in out["limits"]["memory"]
    assert "core(s) this process may run on" in out["limits"]["cpus"]
    assert "GB free" in out["limits"]["shm"]


def test_doctor_names_a_containers_limits(monkeypatch):
    """In a container the control group's limits are the ones that bind."""
    from lib.cli import doctor
    from lib.execution import shm
    from lib.platform import hostinfo
    monkeypatch.setattr(hostinfo, "cgroup_memory_limit", lambda: 2e9)
    monkeypatch.setattr(hostinfo, "cpu_quota", lambda: 1.5)
    monkeypatch.setattr(shm, "free_bytes", lambda root: 64e6)
    limits = doctor._limits()
    assert "a control group's limit of 2.0 GB" in limits["memory"]
    assert "a control group's quota of 1.5 CPUs" in limits["cpus"]
    assert "(0.06 GB free)" in limits["shm"]


def test_doctor_checks_a_profile_of_ones_own(tmp_path):
    path = tmp_path / "rack.json"
    path.write_text(json.dumps({"name": "rack", "devices": [
        {"catalog": "T4"}, {"catalog": "L4", "scale": 0.5}]}))
    p = gpuhive("doctor", "--machine", str(path))
    assert p.returncode == 0, p.stderr
    assert "rack (simulated): 2 device(s)" in p.stdout
    assert "1:L4" in p.stdout
    out = json.loads(gpuhive("doctor", "--machine", str(path), "--json").stdout)
    assert out["machines"]["rack"]["checked"] and out["machines"]["rack"][
        "devices"] == 2


def test_help_lists_the_commands():
    p = gpuhive("--help")
    assert p.returncode == 0
    for cmd in ("doctor", "explain", "run", "validate", "book"):
        assert cmd in p.stdout


SAXPY = """// never call system() here
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def test_scan_exit_codes(tmp_path):
    good = tmp_path / "k.cu"
    good.write_text(SAXPY)
    assert gpuhive("scan", str(good), "--kernel", "saxpy").returncode == 0
    bad = tmp_path / "bad.cu"
    bad.write_text(SAXPY.replace("y[i] = a", "asm(\"trap;\"); y[i] = a"))
    p = gpuhive("scan", str(bad), "--kernel", "saxpy", "--json")
    assert p.returncode == 1
    assert "token.asm" in {v["check"] for v in json.loads(p.stdout)["violations"]}
    p = gpuhive("scan", str(good), "--kernel", "saxpy", "--option=-Xcompiler")
    assert p.returncode == 1 and "options.flag" in p.stdout
    p = gpuhive("scan", str(tmp_path / "missing.cu"), "--kernel", "x")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_bench_prints_the_optimum_search_time():
    p = gpuhive("bench", "--repeats", "2", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [r["devices"] for r in out["optimum"]] == [2, 4, 8]
    assert all(r["median_ms"] > 0 for r in out["optimum"])
    assert out["cache_hit"]["p50_ms"] > 0 and out["ppo_update_s"] > 0
    assert out["env"]["single_steps_per_s"] > 0
    assert out["decision_latency"]["p50_us"] > 0


def test_security_audit_reports_and_exits_by_its_scores():
    p = gpuhive("security-audit", "--repeats", "1", "--json")
    out = json.loads(p.stdout)
    for key in ("recall", "false_positive_rate", "intended_accuracy", "families",
                "confusion", "latency"):
        assert key in out
    perfect = (out["recall"] == 1.0 and out["intended_accuracy"] == 1.0
               and out["false_positive_rate"] == 0.0)
    assert p.returncode == (0 if perfect else 1)
    assert out["counts"]["adversarial"] >= 60 and out["counts"]["benign"] >= 20


def test_codegen_show_prints_a_kernel_that_scans_and_compiles(tmp_path):
    import shutil

    p = gpuhive("codegen", "--kind", "matmul", "--dim", "M=1024", "--dim", "N=1024",
                "--dim", "K=1024", "--provider", "template", "--show")
    assert p.returncode == 0, p.stderr
    src = tmp_path / "mm.cu"
    src.write_text(p.stdout)
    assert p.stdout.count('extern "C" __global__') == 1
    assert gpuhive("scan", str(src), "--kernel", "matmul_fp32").returncode == 0
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    done = subprocess.run(["nvcc", "-ptx", "-arch=sm_80", str(src), "-o",
                           str(tmp_path / "mm.ptx")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_codegen_specialises_to_the_decision_decide_gives(tmp_path):
    """The kernel is specialised to the policy's decision, as ``gpuhive
    decide`` gives it (the learned policy by default), and says which."""
    task = ["--kind", "reduce", "--dim", "N=100000"]
    for policy in ([], ["--policy", "heft"]):
        made = gpuhive("codegen", *task, *policy, "--json")
        assert made.returncode == 0, made.stderr
        decided = gpuhive("decide", *task, *policy)
        assert json.loads(made.stdout)["decision"] == \
            json.loads(decided.stdout)["decision"]
    text = gpuhive("codegen", *task, "--policy", "single-best").stdout
    assert text.startswith("decision single gpus=[0] shares=[1.000]")


def test_codegen_without_a_model_is_one_line_and_exit_2():
    p = gpuhive("codegen", "--kind", "reduce", "--dim", "N=1000", "--provider",
                "openai")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_book_and_evaluate_refuse_bad_input_in_one_line(tmp_path):
    p = gpuhive("book", "--machine", "nope", "--no-html")
    assert p.returncode == 2 and "unknown machine 'nope'" in p.stderr
    p = subprocess.run([sys.executable, "-m", "lib.cli", "book", "--no-html"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1 and "no book here" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = gpuhive("evaluate", "--policy", str(tmp_path / "none.npz"))
    assert p.returncode == 2 and "No such file or directory" in p.stderr


def test_version_prints_the_package_version():
    import lib

    p = gpuhive("--version")
    assert p.returncode == 0 and p.stdout == f"gpuhive {lib.__version__}\n"


def _subcommands() -> dict:
    import argparse

    from lib.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions
               if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_command_has_a_description_and_help_on_every_option():
    commands = _subcommands()
    assert list(commands) == [
        "doctor", "explain", "decide", "run", "validate", "characterise",
        "calibrate", "history", "codegen", "scan", "security-audit", "sweep",
        "train", "evaluate", "bench", "book", "server-setup"]
    for name, p in commands.items():
        assert p.description, name
        for action in p._actions:
            assert action.help, f"{name} {action.option_strings or action.dest}"


def test_choices_come_from_the_vocabularies():
    from lib.budgets import BUDGETS, DEFAULT_BUDGET
    from lib.codegen import PROVIDERS
    from lib.contract import DTYPES, KINDS
    from lib.execution import BACKENDS
    from lib.training import LEARNERS

    seen = set()
    for name, p in _subcommands().items():
        for action in p._actions:
            option = action.option_strings[-1] if action.option_strings else None
            if option == "--budget":
                assert tuple(action.choices) == BUDGETS, name
                assert action.default == DEFAULT_BUDGET, name
            elif option == "--kind":
                assert tuple(action.choices) == KINDS, name
            elif option == "--dtype":
                assert tuple(action.choices) == DTYPES, name
            elif option == "--backend":
                assert set(action.choices) <= set(BACKENDS), name
            elif option == "--provider":
                assert tuple(action.choices) == PROVIDERS, name
            elif option == "--learner":
                assert tuple(action.choices) == LEARNERS, name
            elif option == "--policy":
                # a name or the path of a policy file: no fixed choices
                assert action.choices is None, name
            else:
                continue
            seen.add(option)
    assert seen == {"--budget", "--kind", "--dtype", "--backend", "--provider",
                    "--learner", "--policy"}


def test_building_the_parser_leaves_training_unloaded():
    # gpuhive --help and every other command stay fast without the training stack
    code = ("import sys; from lib.cli import build_parser; build_parser(); "
            "print('lib.training' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


@pytest.mark.parametrize("args, needle", [
    (["explain", "--kind", "reduce", "--dim", "N=8", "--policy", "bogus"],
     "unknown policy 'bogus'"),
    (["calibrate", "--machine", ".."], "cannot name a file"),
    # a name with a slash is a profile's path, as on every command
    (["calibrate", "--machine", "../x"], "profile ../x: cannot read it"),
])
def test_unknown_policy_and_unnamable_machine_are_bad_input(args, needle):
    p = gpuhive(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_decide_prints_only_a_hashed_accepted_decision():
    from lib.contract import Decision, TaskSpec, config_hash

    p = gpuhive("decide", "--kind", "histogram", "--dim", "N=1000000",
                "--dim", "B=64", "--policy", "equal")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc) == {"task", "machine", "policy", "decision"}
    task = TaskSpec.from_json(doc["task"])
    decision = Decision.from_json(doc["decision"])
    assert decision.config_hash == config_hash(task, decision)
    assert doc["policy"] == "equal" and len(decision.gpus) == 4


def test_train_takes_step_counts_and_the_finetune_backend_and_says_where_it_saved(
        tmp_path):
    out = tmp_path / "run"
    p = gpuhive("train", "--machine", "local-cpu", "--budget", "smoke",
                "--pretrain-steps", "300", "--finetune-steps", "4",
                "--finetune-backend", "cpu", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert f"policy saved to {out / 'policy.npz'}" in p.stdout
    assert (out / "policy.npz").is_file()
    assert "stage measured: 1 iterations, 4 steps" in p.stdout
    assert "(MEASURED (cpu))" in p.stdout
    bad = gpuhive("train", "--machine", "local-cpu", "--finetune-steps", "-1")
    assert bad.returncode == 2 and "--finetune-steps" in bad.stderr


#: Modules a command that decides, runs or generates nothing has no use for:
#: Numba, the execution backends, the runtime, the learned policy and the
#: optimum, the code-generation and security planes, the training pipeline.
HEAVY = ("numba", "lib.execution", "lib.runtime", "lib.policies.learned",
         "lib.policies.oracle", "lib.codegen", "lib.security", "lib.training")


def test_the_parser_and_every_commands_help_load_no_heavy_module(fresh_python):
    # A fresh interpreter: this one has loaded everything already. A
    # command's help may load a module only to list the choices it reads
    # from there on first use (LazyChoices); those helps are left out.
    code = ("import sys\n"
            "from lib.cli import build_parser\n"
            "from lib.cli.common import LazyChoices\n"
            "parser = build_parser()\n"
            "parser.format_help()\n"
            "subs = parser._subparsers._group_actions[0].choices\n"
            "lazy = {name for name, sub in subs.items() if any(\n"
            "    isinstance(a.choices, LazyChoices) for a in sub._actions)}\n"
            "for name, sub in subs.items():\n"
            "    if name not in lazy:\n"
            "        sub.format_help()\n"
            "print(len(subs), len(lazy))\n"
            f"print(' '.join(m for m in sys.modules if m.startswith({HEAVY!r})))\n")
    counts, loaded = (fresh_python(code).splitlines() + [""])[:2]
    commands, lazy = map(int, counts.split())
    assert commands >= 17 and commands - lazy >= 15
    assert loaded == "", f"building the parser loaded {loaded}"


def test_help_still_lists_the_choices_read_on_first_use():
    p = gpuhive("train", "--help")
    assert p.returncode == 0, p.stderr
    assert "no-telemetry" in p.stdout and "ppo" in p.stdout
    p = gpuhive("codegen", "--help")
    assert p.returncode == 0, p.stderr
    assert "template" in p.stdout and "recorded" in p.stdout
    p = gpuhive("train", "--features", "nonsense")
    assert p.returncode == 2
    assert "invalid choice: 'nonsense'" in p.stderr and "no-topology" in p.stderr


def test_the_error_classes_are_named_where_they_are_defined():
    import importlib

    from lib.cli import BAD_INPUT, EXECUTION_FAILED

    for module, name in BAD_INPUT + EXECUTION_FAILED:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, Exception) and cls.__module__ == module, (module, name)


def test_errors_are_told_apart_by_their_classes(fresh_python):
    from lib.cli import BAD_INPUT, EXECUTION_FAILED, _is_one_of
    from lib.execution.base import BackendUnavailable, ExecutionError
    from lib.runtime import DecisionRejected
    from lib.security.verdict import Verdict, Violation

    assert _is_one_of(BackendUnavailable("no GPU"), BAD_INPUT)
    refused = Verdict("gate1", (Violation("form.shares", "a negative share"),))
    assert _is_one_of(DecisionRejected(refused), BAD_INPUT)
    assert not _is_one_of(ExecutionError("worker died"), BAD_INPUT)
    assert _is_one_of(ExecutionError("worker died"), EXECUTION_FAILED)
    assert not _is_one_of(ValueError("a bug"), BAD_INPUT + EXECUTION_FAILED)
    # telling them apart imports nothing: a module not loaded is not looked in
    code = ("import sys\n"
            "from lib.cli import BAD_INPUT, EXECUTION_FAILED, _is_one_of\n"
            "print(_is_one_of(ValueError('x'), BAD_INPUT + EXECUTION_FAILED),\n"
            "      'lib.runtime' in sys.modules, 'lib.execution' in sys.modules)\n")
    assert fresh_python(code).split() == ["False", "False", "False"]


@pytest.mark.parametrize("raised, says, status", [
    (KeyboardInterrupt(), "gpuhive: interrupted\n", 130),
    (ContractError("dims.N", "must be positive"), "gpuhive: error: dims.N", 2)])
def test_a_command_cut_short_says_why_on_a_line_of_its_own(capsys, tmp_path,
                                                           monkeypatch, raised,
                                                           says, status):
    """Not glued to the progress bar it cut short (``...it/s]gpuhive: ...``)."""
    import argparse

    from tqdm.auto import tqdm

    import lib.cli as cli

    monkeypatch.setenv("GPUHIVE_HOME", str(tmp_path))

    def run(args):
        bar = tqdm(total=10, desc="work", leave=False)
        bar.update(3)
        raise raised

    assert cli._run(argparse.Namespace(run=run)) == status
    err = capsys.readouterr().err
    at = err.index(says)
    assert at > 0 and err[at - 1] in "\r\n", repr(err[-120:])


def test_telemetry_is_read_where_asked_and_said_in_the_output():
    """run on the model backend decides without telemetry unless asked
    (--telemetry auto reads the devices only where the task runs on them);
    live on local-cpu reads this computer's cores and says what it read;
    live on a simulated machine is one line, exit 2."""
    task = ("--kind", "reduce", "--dim", "N=4096", "--machine", "local-cpu")
    p = gpuhive("run", *task, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["telemetry"] is None
    p = gpuhive("run", *task, "--telemetry", "live", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["telemetry"].startswith(
        "MEASURED local-cpu: capacity ")
    p = gpuhive("decide", *task, "--telemetry", "live")
    assert p.returncode == 0, p.stderr
    assert "capacity" in json.loads(p.stdout)["telemetry"]
    assert "telemetry" not in json.loads(gpuhive("decide", *task).stdout)
    p = gpuhive("explain", "--kind", "reduce", "--dim", "N=4096",
                "--telemetry", "live")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "gpuhive: error: telemetry 'live': machine hetero-4 is simulated; it "
        "has no devices to read"]
