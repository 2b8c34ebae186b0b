"""Bad input to the gpuhive command: exit status 2 and one line naming the
thing, never an internal error, never a hang; a closed stdout; and stored
LLM answers replayed through the code-gen plane.

The bad inputs are built in a temporary folder and run through
``lib.cli.main`` in one Python process (a process per case would spend the
test's time starting Python); the pipe and the replays run the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lib.codegen.emulate import find_cxx
from lib.codegen.llm import RECORDED_PATH

TASK = {"kind": "reduce", "dims": {"N": 100}, "dtype": "fp32",
        "divisible_dim": 0, "merge": "sum"}
DECISION = {"gpus": [0], "shares": [1.0], "chunk": 100, "block": 256,
            "mode": "single", "comm_path": "host"}
RUN = ["run", "--kind", "reduce", "--dim", "N=100"]
EXPLAIN = ["explain", "--kind", "reduce", "--dim", "N=100"]
CODEGEN = ["codegen", "--kind", "elementwise", "--dim", "N=1000"]
HUGE = ["explain", "--kind", "matmul", "--dim", "M=1000", "--dim", "N=200000",
        "--dim", "K=200000"]
RECORDED = [*CODEGEN, "--provider", "recorded"]

#: case -> (arguments, environment, what the one line must say). In the
#: arguments and the environment, {d} is the folder of the built inputs.
CASES: dict[str, tuple[list[str], dict[str, str], str]] = {
    # files that are not UTF-8 text
    "task utf-16": (["explain", "--task", "{d}/task16.json"], {},
                    "task file {d}/task16.json: UTF-16"),
    "task utf-16 without bom": (["explain", "--task", "{d}/task16le.json"], {},
                                "task file {d}/task16le.json: holds NUL bytes"),
    "task latin-1": (["explain", "--task", "{d}/task-latin1.json"], {},
                     "task file {d}/task-latin1.json: not UTF-8 text (byte 0xe9"),
    "decision utf-16": ([*RUN, "--decision", "{d}/decision16.json"], {},
                        "decision file {d}/decision16.json: UTF-16"),
    "validate decision latin-1": (
        ["validate", "{d}/decision-latin1.json", "--task", "{d}/task.json"], {},
        "decision file {d}/decision-latin1.json: not UTF-8"),
    "validate task utf-16": (
        ["validate", "{d}/decision.json", "--task", "{d}/task16.json"], {},
        "task file {d}/task16.json: UTF-16"),
    "characterisation utf-16": (
        ["calibrate", "--characterisation", "{d}/task16.json"], {},
        "characterisation file {d}/task16.json: UTF-16"),
    "stored calibration utf-16": (
        EXPLAIN, {"GPUHIVE_HOME": "{d}/home-cal16"},
        "calibration file {d}/home-cal16/calibration/hetero-4.json: UTF-16"),
    "stored calibration truncated": (
        RUN, {"GPUHIVE_HOME": "{d}/home-cal-cut"},
        "calibration file {d}/home-cal-cut/calibration/hetero-4.json: not valid "
        "JSON"),
    "stored calibration of another schema": (
        EXPLAIN, {"GPUHIVE_HOME": "{d}/home-cal-schema"},
        "{d}/home-cal-schema/calibration/hetero-4.json: not a "
        "gpuhive.calibration/1 file; not used: write it again with gpuhive "
        "calibrate --machine hetero-4, or move it aside"),
    "answers utf-16": ([*RECORDED, "--answers", "{d}/task16.json"], {},
                       "answers file {d}/task16.json: UTF-16"),
    # integers past Python's int-string limit
    "task 5000 digits": (["explain", "--task", "{d}/task-digits.json"], {},
                         "task file {d}/task-digits.json: not valid JSON"),
    "decision 5000 digits": ([*RUN, "--decision", "{d}/decision-digits.json"], {},
                             "decision file {d}/decision-digits.json: not valid"),
    "answers 5000 digits": ([*RECORDED, "--answers", "{d}/decision-digits.json"],
                            {}, "answers file {d}/decision-digits.json: not valid"),
    # not regular files, or too large: refused before any read
    "task fifo": (["explain", "--task", "{d}/fifo"], {},
                  "task file {d}/fifo: not a regular file (a FIFO)"),
    "task /dev/zero": (["explain", "--task", "/dev/zero"], {},
                       "task file /dev/zero: not a regular file"),
    "source fifo": (["scan", "{d}/fifo", "--kernel", "k"], {},
                    "source file {d}/fifo: not a regular file (a FIFO)"),
    "source /dev/zero": (["scan", "/dev/zero", "--kernel", "k"], {},
                         "source file /dev/zero: not a regular file"),
    "decision folder": (["validate", "{d}", "--task", "{d}/task.json"], {},
                        "decision file {d}: not a regular file (a folder)"),
    "decision fifo": ([*RUN, "--decision", "{d}/fifo"], {},
                      "decision file {d}/fifo: not a regular file (a FIFO)"),
    "characterisation fifo": (["calibrate", "--characterisation", "{d}/fifo"], {},
                              "characterisation file {d}/fifo: not a regular"),
    "answers fifo": ([*RECORDED, "--answers", "{d}/fifo"], {},
                     "answers file {d}/fifo: not a regular file (a FIFO)"),
    "policy fifo": ([*EXPLAIN, "--policy", "{d}/fifo"], {},
                    "policy file {d}/fifo: not a regular file (a FIFO)"),
    "task over 16 MiB": (["explain", "--task", "{d}/huge.json"], {},
                         "task file {d}/huge.json: larger than 16 MiB"),
    # numbers out of range
    "run repeats 0": ([*RUN, "--repeats", "0"], {},
                      "argument --repeats: expected an integer >= 1, got 0"),
    "run repeats -2": ([*RUN, "--repeats", "-2"], {}, "argument --repeats"),
    "run warmup -1": ([*RUN, "--warmup", "-1"], {},
                      "argument --warmup: expected an integer >= 0, got -1"),
    "bench repeats 0": (["bench", "--repeats", "0"], {}, "argument --repeats"),
    "audit repeats -1": (["security-audit", "--repeats", "-1"], {},
                         "argument --repeats"),
    "sweep repeats 0": (["sweep", "--repeats", "0"], {}, "argument --repeats"),
    "sweep scale nan": (["sweep", "--scale", "nan"], {},
                        "argument --scale: expected a finite number > 0"),
    "sweep scale inf": (["sweep", "--scale", "inf"], {}, "argument --scale"),
    "sweep scale 0": (["sweep", "--scale", "0"], {}, "argument --scale"),
    "holdout nan": (["calibrate", "--holdout", "nan"], {}, "argument --holdout"),
    "seed -1": ([*RUN, "--seed", "-1"], {}, "argument --seed"),
    "dim 5000 digits": (["run", "--kind", "reduce", "--dim", "N=" + "9" * 5000],
                        {}, "is not an integer"),
    "duplicate dim": ([*EXPLAIN, "--dim", "N=200"], {},
                      "--dim N given twice (N=100 and N=200)"),
    "duplicate dim codegen": ([*CODEGEN, "--dim", "N=5"], {},
                              "--dim N given twice"),
    # the home folder and the seal key
    "home is a file": (EXPLAIN, {"GPUHIVE_HOME": "{d}/task.json"},
                       "GPUHIVE_HOME {d}/task.json is not a folder"),
    "home below a file": (["codegen", "--kind", "reduce", "--dim", "N=1000"],
                          {"GPUHIVE_HOME": "{d}/task.json/home"},
                          "GPUHIVE_HOME {d}/task.json/home is not a folder"),
    "seal key mode 0644": (["codegen", "--kind", "reduce", "--dim", "N=1000"],
                           {"GPUHIVE_HOME": "{d}/home-0644"},
                           "seal.key has mode 0644"),
    # policy files
    "evaluate policy missing": (["evaluate", "--policy", "{d}/none.npz"], {},
                                "policy file {d}/none.npz: No such file"),
    "evaluate policy garbage": (["evaluate", "--policy", "{d}/garbage.npz"], {},
                                "--policy: {d}/garbage.npz: not a readable"),
    "evaluate policy not a policy": (["evaluate", "--policy", "{d}/arrays.npz"],
                                     {}, "--policy: {d}/arrays.npz"),
    "evaluate policy folder": (["evaluate", "--policy", "{d}"], {},
                               "policy file {d}: not a regular file (a folder)"),
    # recorded answers
    "answers missing": ([*RECORDED, "--answers", "{d}/none.json"], {},
                        "answers file {d}/none.json: No such file"),
    "answers bad json": ([*RECORDED, "--answers", "{d}/bad.json"], {},
                         "answers file {d}/bad.json: not valid JSON"),
    "answers not answers": ([*RECORDED, "--answers", "{d}/task.json"], {},
                            'answers file {d}/task.json: expected {{"answers"'),
    "answers unknown id": (
        [*RECORDED, "--answers", "{d}/answers.json", "--answer-id", "nope"], {},
        "no recorded answer 'nope' in {d}/answers.json; its ids: good, refused"),
    "answers for another kind": (
        ["codegen", "--kind", "reduce", "--dim", "N=100", "--provider", "recorded",
         "--answers", "{d}/answers.json"], {},
        "holds no answer for reduce fp32; its answers: good (elementwise fp32)"),
    "answer id without recorded": ([*CODEGEN, "--answer-id", "good"], {},
                                   "--answers and --answer-id need --provider"),
    # a task no device can hold a row of, whichever policy decides
    "task too big for the learned policy": (
        [*HUGE], {}, "no feasible decision for matmul[M=1000,N=200000,K=200000]"
                     " fp32 on hetero-4: no healthy device can hold even one row"),
    "task too big for the optimum": (
        [*HUGE, "--policy", "oracle"], {},
        "no subset of devices can hold it"),
    "task too big for equal split": (
        [*HUGE, "--policy", "equal"], {}, "[feasibility.memory]"),
    # machine profiles of one's own
    "profile nan scale": ([*EXPLAIN, "--machine", "{d}/nan.json"], {},
                          "profile {d}/nan.json: profile nan device 0 scale: "
                          "expected a finite positive number, got nan"),
    "doctor bad profile": (["doctor", "--machine", "{d}/nan.json"], {},
                           "profile {d}/nan.json: profile nan device 0 scale"),
    "profile no devices": ([*EXPLAIN, "--machine", "{d}/empty.json"], {},
                           "profile {d}/empty.json: profile empty: no devices"),
    "profile shipped name": ([*EXPLAIN, "--machine", "{d}/shadow.json"], {},
                             "name 'hetero-4' is a shipped profile's"),
    "profile unknown field": ([*EXPLAIN, "--machine", "{d}/typo.json"], {},
                              "unknown field 'memory'"),
    "profile decision over a link without p2p": (
        ["run", "--task", "{d}/task.json", "--decision", "{d}/p2p.json",
         "--rehash", "--machine", "{d}/nop2p.json"], {},
        "the pcie3 link does not copy peer to peer between devices 0 and 1"),
}

# The driver: every case through lib.cli.main in this one process, stdout
# dropped, stderr and the exit status kept.
DRIVER = """
import contextlib, io, json, os, sys
from lib.cli import main
results = {}
for name, (args, env) in json.load(sys.stdin).items():
    saved = dict(os.environ)
    os.environ.update(env)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), \\
                contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main(args)
            except SystemExit as exc:
                status = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    results[name] = [status, err.getvalue()]
print(json.dumps(results))
"""


def build_inputs(d: Path) -> None:
    """Every bad input of :data:`CASES`, and the good files they sit beside."""
    import numpy as np

    task = json.dumps(TASK)
    (d / "task.json").write_text(task)
    (d / "decision.json").write_text(json.dumps(DECISION))
    (d / "task16.json").write_bytes(task.encode("utf-16"))
    (d / "task16le.json").write_bytes(task.encode("utf-16-le"))
    (d / "task-latin1.json").write_bytes(
        json.dumps({**TASK, "merge": "sumé"}, ensure_ascii=False).encode("latin-1"))
    (d / "decision16.json").write_bytes(json.dumps(DECISION).encode("utf-16"))
    (d / "decision-latin1.json").write_bytes(b'{"mode": "s\xe9"}')
    (d / "task-digits.json").write_text(task.replace("100", "9" * 5000))
    (d / "decision-digits.json").write_text(
        json.dumps(DECISION).replace('"chunk": 100', '"chunk": ' + "7" * 5000))
    os.mkfifo(d / "fifo")
    with open(d / "huge.json", "wb") as fh:  # sparse: no 16 MiB written
        fh.truncate((16 << 20) + 1)
    cal = d / "home-cal16" / "calibration"
    cal.mkdir(parents=True)
    (cal / "hetero-4.json").write_bytes('{"schema": 1}'.encode("utf-16"))
    for home, text in (("home-cal-cut", '{"schema": "gpuhive.calibration/1", '),
                       ("home-cal-schema", '{"schema": "gpuhive.history/1"}')):
        (d / home / "calibration").mkdir(parents=True)
        (d / home / "calibration" / "hetero-4.json").write_text(text)
    keys = d / "home-0644" / "keys"
    keys.mkdir(parents=True)
    (keys / "seal.key").write_bytes(os.urandom(32))
    (keys / "seal.key").chmod(0o644)
    (d / "garbage.npz").write_bytes(b"not a zip archive")
    np.savez(d / "arrays.npz", w=np.zeros(3))
    (d / "bad.json").write_text('{"answers": [')
    t4 = {"catalog": "T4"}
    for name, profile in {
            "nan": {"devices": [{"catalog": "T4", "scale": float("nan")}]},
            "empty": {"devices": []},
            "shadow": {"name": "hetero-4", "devices": [t4]},
            "typo": {"devices": [{"catalog": "T4", "memory": 1e6}]},
            "nop2p": {"devices": [t4, t4], "peers": [
                {"a": 0, "b": 1, "kind": "pcie3", "p2p": False}]}}.items():
        (d / f"{name}.json").write_text(json.dumps(profile))
    (d / "p2p.json").write_text(json.dumps({
        "gpus": [0, 1], "shares": [0.5, 0.5], "chunk": 100, "block": 256,
        "mode": "split", "comm_path": "p2p", "config_hash": "not a hash"}))
    write_answers(d / "answers.json")


def write_answers(path: Path) -> None:
    """An answers file of two answers for elementwise fp32: the shipped good
    one (``good``) and one with a ``system()`` call that Gate 2a refuses
    (``refused``)."""
    shipped = {a["id"]: a for a in json.loads(RECORDED_PATH.read_text())["answers"]}
    good = shipped["elementwise-fp32-good"]["answer"]
    bad = good.replace("out[i] = a * x[i] + y[i];",
                       'out[i] = a * x[i] + y[i];\n        system("id");')
    assert bad != good
    path.write_text(json.dumps({"answers": [
        {"id": "good", "kind": "elementwise", "dtype": "fp32", "answer": good},
        {"id": "refused", "kind": "elementwise", "dtype": "fp32", "answer": bad},
    ]}))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-input")
    build_inputs(d)
    cases = {name: ([a.format(d=d) for a in args],
                    {k: v.format(d=d) for k, v in env.items()})
             for name, (args, env, _) in CASES.items()}
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return d, json.loads(done.stdout)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_naming_it_and_exit_2(results, case):
    d, found = results
    status, stderr = found[case]
    lines = stderr.splitlines()
    assert status == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("gpuhive: error: "), stderr
    assert CASES[case][2].format(d=d) in lines[0]


def gpuhive(*args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lib.cli", *args],
                          capture_output=True, text=True, timeout=300, **options)


def test_a_closed_stdout_ends_the_command_quietly_with_141():
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "lib.cli", "explain", "--kind", "reduce",
             "--dim", "N=100"], stdout=write, stderr=subprocess.PIPE, text=True,
            timeout=300)
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == ""


try:
    from lib.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    NVRTC_REASON = ""
except Exception as exc:  # cupy or libnvrtc missing
    NVRTC_REASON = f"NVRTC not loadable ({type(exc).__name__})"


@pytest.mark.skipif(bool(NVRTC_REASON) or find_cxx() is None,
                    reason=NVRTC_REASON or "no C++ compiler (spot check)")
def test_codegen_replays_a_stored_answer_and_names_the_check_that_refused(tmp_path):
    answers = tmp_path / "answers.json"
    write_answers(answers)
    env = {**os.environ, "GPUHIVE_HOME": str(tmp_path / "home")}
    done = gpuhive(*RECORDED, "--answers", str(answers), "--answer-id", "good",
                   "--json", env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["used"] == "answer" and out["provider"] == "recorded"
    assert out["label"] == "RECORDED" and out["answer_id"] == "good"
    assert out["answers"] == str(answers) and out["refused"] == []

    done = gpuhive(*RECORDED, "--answers", str(answers), "--answer-id", "refused",
                   env=env)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last == ("used     the template, as the recorded answer 'refused' was "
                    "refused by Gate 2a")
    assert "[TEMPLATE] provider=template" in done.stdout
    assert "fallback recorded rejected: Gate 2a:" in done.stdout
    assert "[token.os_call]" in done.stdout


@pytest.mark.parametrize("command", [
    ("characterise", "--machine", "local-cpu", "--budget", "smoke",
     "--out", "{f}/x.json"),
    ("sweep", "--machine", "local-cpu", "--out", "{f}/x.json"),
    ("evaluate", "--budget", "smoke", "--markdown", "{f}/x.md"),
    ("train", "--budget", "smoke", "--out", "{f}"),
    ("train", "--budget", "smoke", "--out", "{f}/run"),
    ("server-setup", "--out", "{f}/report"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
        tmp_path, command):
    """What a command writes when it ends is checked before it starts: a
    characterisation or an evaluation of minutes was measured and then lost
    to a traceback when its --out could not be written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    home = tmp_path / "home"
    p = gpuhive(*(a.format(f=blocker) for a in command),
                env={**os.environ, "GPUHIVE_HOME": str(home)})
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    option = next(command[i - 1] for i, a in enumerate(command) if "{f}" in a)
    assert lines[0].startswith(f"gpuhive: error: {option} {blocker}"), p.stderr
    assert blocker.read_text() == "not a folder"
    assert not (home / "characterisation").exists()   # nothing was measured
